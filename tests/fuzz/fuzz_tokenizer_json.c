/*
 * fuzz_tokenizer_json - a Hugging Face folder's tokenizer.json, and optionally its
 * tokenizer_config.json, through flx_tok_load (what flx-generate runs on a checkpoint folder). The
 * input is the tokenizer.json, or the tokenizer.json, the line "#tokenizer_config.json" and the
 * config. A vocabulary that loads encodes and decodes a fixed text of every pre-tokenizer's cases
 * and renders a chat; every token string is found again by lookup.
 */
#include "fuzz_util.h"

#include "flx/tokenizer.h"

FUZZ_QUIET_INIT

static const char k_sep[] = "\n#tokenizer_config.json\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir();
    const uint8_t *sep = memmem(data, size, k_sep, sizeof k_sep - 1);
    size_t json_len = sep ? (size_t)(sep - data) : size;
    fuzz_write_file(dir, "tokenizer.json", data, json_len);
    char conf[256];
    snprintf(conf, sizeof conf, "%s/tokenizer_config.json", dir);
    if (sep) {
        const size_t skip = json_len + sizeof k_sep - 1;
        fuzz_write_file(dir, "tokenizer_config.json", data + skip, size - skip);
    } else {
        unlink(conf);
    }
    flx_tok_h tok = NULL;
    if (flx_tok_load(dir, &tok) != FLX_OK) return 0;
    static const char text[] = "What is 2+2? <|im_start|>café 12345 it's  \n\n x\xff\xc3(";
    int32_t ids[256];
    size_t n = 0, len = 0;
    char out[2048];
    if (flx_tok_encode(tok, text, sizeof text - 1, flx_tok_bos(tok) >= 0, ids, 256, &n) == FLX_OK) {
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < flx_tok_vocab_size(tok));
        (void)flx_tok_decode(tok, ids, n, FLX_TOK_SKIP_SPECIAL, out, sizeof out, &len);
    }
    flx_tok_msg_t msg = {.role = "user", .content = "hi"};
    (void)flx_tok_chat(tok, &msg, 1, 1, out, sizeof out, &len);
    for (uint32_t i = 0; i < flx_tok_vocab_size(tok) && i < 4096; i++) {
        const char *s = flx_tok_token_str(tok, (int32_t)i);
        FUZZ_CHECK(s != NULL);
        if (s[0]) FUZZ_CHECK(flx_tok_find(tok, s) >= 0);
    }
    flx_tok_destroy(tok);
    return 0;
}
