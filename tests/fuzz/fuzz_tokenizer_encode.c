/*
 * fuzz_tokenizer_encode - arbitrary bytes through the tokenizer's encoder (flx_tok_encode, what
 * flx-generate runs on a prompt and the node will run on request text), on the small vocabulary of
 * fuzz_seeds.h built once per pre-tokenizer (GPT-2, SmolLM2, Llama-3, Qwen2 with NFC). The first
 * input byte picks the pre-tokenizer (bits 0-1) and add_bos (bit 2); the rest is the text.
 * Properties: every id is in the vocabulary; without NFC, decoding gives the text back byte for byte
 * (the vocabulary holds all 256 byte tokens, so byte-level BPE loses nothing); with NFC, encoding
 * the decoded text gives the same ids (NFC is idempotent). The text is also rendered as a chat.
 */
#include "fuzz_util.h"

#include "flx/tokenizer.h"
#include "fuzz_seeds.h"

static fuzz_vocab_t g_v;
static flx_tok_h g_tok[4];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    fuzz_vocab(&g_v);
    for (int p = 0; p < 4; p++) {
        flx_tok_vocab_t parts = fuzz_tok_parts(&g_v, (flx_tok_pre_t)p);
        FUZZ_CHECK(flx_tok_create(&parts, &g_tok[p]) == FLX_OK);
    }
    return 0;
}

/* ids of text, allocated; n_p = count */
static int32_t *encode(flx_tok_h tok, const char *text, size_t len, int add_bos, size_t *n_p)
{
    size_t n = 0;
    flx_status_t st = flx_tok_encode(tok, text, len, add_bos, NULL, 0, &n);
    FUZZ_CHECK(st == FLX_OK || st == FLX_ERR_CAPACITY);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    FUZZ_CHECK(ids != NULL);
    size_t n2 = 0;
    FUZZ_CHECK(flx_tok_encode(tok, text, len, add_bos, ids, n, &n2) == FLX_OK && n2 == n);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < flx_tok_vocab_size(tok));
    *n_p = n;
    return ids;
}

/* decoded bytes of ids, allocated, NUL-terminated; len_p = count */
static char *decode(flx_tok_h tok, const int32_t *ids, size_t n, size_t *len_p)
{
    size_t len = 0;
    flx_status_t st = flx_tok_decode(tok, ids, n, 0, NULL, 0, &len);
    FUZZ_CHECK(st == FLX_OK || st == FLX_ERR_CAPACITY);
    char *out = malloc(len + 1);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(flx_tok_decode(tok, ids, n, 0, out, len + 1, len_p) == FLX_OK && *len_p == len);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    const int pre = data[0] & 3, add_bos = (data[0] >> 2) & 1;
    flx_tok_h tok = g_tok[pre];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    size_t n = 0, dlen = 0;
    int32_t *ids = encode(tok, text, len, add_bos, &n);
    FUZZ_CHECK(!add_bos || (n >= 1 && ids[0] == flx_tok_bos(tok)));
    char *back = decode(tok, ids + add_bos, n - (size_t)add_bos, &dlen);
    if (pre != FLX_TOK_PRE_QWEN2) {
        FUZZ_CHECK(dlen == len && memcmp(back, text, len) == 0);
    } else {
        size_t n2 = 0;
        int32_t *ids2 = encode(tok, back, dlen, 0, &n2);
        FUZZ_CHECK(n2 == n - (size_t)add_bos && memcmp(ids2, ids + add_bos, n2 * sizeof *ids2) == 0);
        free(ids2);
    }
    free(back);
    free(ids);

    char *content = malloc(len + 1);
    FUZZ_CHECK(content != NULL);
    memcpy(content, text, len);
    content[len] = '\0';
    flx_tok_msg_t msgs[2] = {{.role = "system", .content = "be brief"}, {.role = "user", .content = content}};
    size_t need = 0;
    flx_status_t st = flx_tok_chat(tok, msgs + (data[0] >> 3 & 1), 2 - (data[0] >> 3 & 1), 1, NULL, 0, &need);
    FUZZ_CHECK(st == FLX_OK || st == FLX_ERR_CAPACITY);
    char *chat = malloc(need + 1);
    FUZZ_CHECK(chat != NULL);
    size_t got = 0;
    FUZZ_CHECK(flx_tok_chat(tok, msgs + (data[0] >> 3 & 1), 2 - (data[0] >> 3 & 1), 1, chat, need + 1, &got) ==
                   FLX_OK && got == need);
    free(chat);
    free(content);
    return 0;
}
