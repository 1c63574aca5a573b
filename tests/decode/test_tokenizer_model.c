/*
 * test_tokenizer_model.c - the tokenizer of the real model against Hugging Face `tokenizers`.
 *
 *   test_tokenizer_model PYTHON TOK_REF_PY
 *
 * Writes a set of real texts (licences, Python sources, a Unicode-heavy table from the system, and
 * hand-written accents/CJK/emoji/whitespace/digit strings) into a work folder, runs tok_ref.py
 * with the project's Python to get HF's ids for four pre-tokenizer configurations over the GGUF's
 * vocabulary, then encodes every text with
 *   - the GGUF's own tokenizer (flx_tok_load_gguf: SmolLM2's pre-tokenizer), and
 *   - the four tokenizer.json files tok_ref.py wrote (flx_tok_load: the JSON path),
 * and requires the same ids token for token and decode(encode(x)) == x for every text.
 * Skips (77) without the model file or without a Python that has `tokenizers`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/tokenizer.h"
#include "flx_test.h"

static const char *k_files[] = {
    "/usr/share/common-licenses/GPL-3",   "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0", "/usr/share/common-licenses/LGPL-2.1",
    "/usr/lib/python3.11/textwrap.py",    "/usr/lib/python3.11/difflib.py",
    "/usr/lib/python3.11/json/decoder.py", "/usr/lib/python3.11/shlex.py",
    "/usr/lib/python3.11/statistics.py",  "/usr/share/zoneinfo/iso3166.tab",
    "/usr/share/zoneinfo/zone1970.tab",
};

static const char *k_inline[] = {
    "Hello, world! I'm here; you're there. We'll see, they've gone, she'd know, it's ok.",
    "SHOUTING DON'T WON'T I'M YOU'RE WE'LL  'S 'T 'Re",
    "Café naïve façade résumé coöperate Ångström Æsir øre Straße İstanbul",
    "日本語のテキスト、漢字とかなを含む。中文文本：你好，世界！한국어 텍스트입니다.",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨ and symbols ©®™ ½ ¾ ∞ ≤ ≥ ≠ → ← ∑ ∫",
    "Numbers 1234567890 3.14159 -42 1,000,000 0x1F 1e-9 ١٢٣ ४५६ ½ Ⅻ ² 3rd 22nd",
    "Whitespace:  two  spaces,\ttab,\t\ttwo tabs,\nnewline\n\nblank\r\nCRLF   \n  \n\t \nend   ",
    "   leading spaces and trailing spaces   ",
    "\n\n\nonly newlines first\n",
    "Привет, мир! Ελληνικά γράμματα. العربية مرحبا. עברית שלום. हिन्दी नमस्ते. ไทย สวัสดี",
    "Combining: e\xcc\x81 a\xcc\x8a n\xcc\x83; zero width\xe2\x80\x8bspace; nbsp\xc2\xa0here; em\xe2\x80\x83space; "
    "ideographic\xe3\x80\x80space; line\xe2\x80\xa8sep",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\nIt's 4.<|im_end|>\n",
    "a<|im_end|>b<|endoftext|><|im_start|><|im_start|>x <|im_end|>",
    "x",
    "!!!???...,,,;;;::: ((([[[{{{}}}]]]))) <<<>>> ''' \"\"\" ``` ~~~ ___ --- +++ === |||",
    "https://example.com/path?query=1&b=2#frag user@example.org C:\\Windows\\System32",
    "'s's 'll've're 'd'm't '",
};

static char g_work[] = "/tmp/flx_tok_model_XXXXXX";

static void write_text(int k, const char *text, size_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/text_%03d.txt", g_work, k);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(text, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *buf = malloc((size_t)n + 1);
    CHECK(buf != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n);
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

typedef struct text {
    char *s;
    size_t len;
} text_t;

/* Compares tok's ids for every text with line k of ref_path; returns tokens compared. */
static size_t compare(const flx_tok_t *tok, const char *label, const text_t *texts, int n_texts, const char *ref_path)
{
    FILE *f = fopen(ref_path, "r");
    CHECK(f != NULL);
    size_t total = 0;
    char *line = NULL;
    size_t line_cap = 0;
    for (int k = 0; k < n_texts; k++) {
        CHECK(getline(&line, &line_cap, f) >= 0);
        size_t cap = texts[k].len + 16, n = 0;
        int32_t *ids = malloc(cap * sizeof(int32_t));
        CHECK(ids != NULL);
        CHECK_OK(flx_tok_encode(tok, texts[k].s, texts[k].len, 0, ids, cap, &n));
        size_t i = 0;
        char *p = line, *end;
        for (long v = strtol(p, &end, 10); end != p; p = end, v = strtol(p, &end, 10), i++) {
            if (i >= n || ids[i] != v) {
                fprintf(stderr, "%s: text %d differs at token %zu: got %d '%s', reference %ld '%s'\n", label, k, i,
                        i < n ? ids[i] : -1, i < n ? flx_tok_token_str(tok, ids[i]) : "(end)", v,
                        flx_tok_token_str(tok, (int32_t)v));
                for (size_t j = i > 5 ? i - 5 : 0; j < i; j++) fprintf(stderr, "  before: '%s'\n",
                                                                       flx_tok_token_str(tok, ids[j]));
                CHECK(0);
            }
        }
        if (i != n) fprintf(stderr, "%s: text %d: %zu ids, reference %zu\n", label, k, n, i);
        CHECK(i == n);
        total += n;
        /* decode(encode(x)) == x */
        char *back = malloc(texts[k].len + 1);
        size_t blen = 0;
        CHECK(back != NULL);
        CHECK_OK(flx_tok_decode(tok, ids, n, 0, back, texts[k].len + 1, &blen));
        CHECK(blen == texts[k].len && memcmp(back, texts[k].s, blen) == 0);
        free(back);
        free(ids);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "%s: %d texts, %zu tokens identical to HF tokenizers, all round-trip\n", label, n_texts, total);
    return total;
}

int main(int argc, char **argv)
{
    char model[1024], cmd[4096], path[1024];
    const char *cache = getenv("FLX_CACHE");
    const char *home = getenv("HOME");
    if (cache)
        snprintf(model, sizeof(model), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(model, sizeof(model), "%s/.cache/fluxion/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    if (access(model, R_OK) != 0) {
        fprintf(stderr, "skip: no model file %s\n", model);
        return FLX_TEST_SKIP;
    }
    CHECK(argc == 3);
    snprintf(cmd, sizeof(cmd), "'%s' -c 'import tokenizers' 2>/dev/null", argv[1]);
    if (system(cmd) != 0) {
        fprintf(stderr, "skip: %s cannot import tokenizers (run scripts/setup.sh)\n", argv[1]);
        return FLX_TEST_SKIP;
    }

    /* the GGUF's own tokenizer */
    flx_tok_t *gg = NULL;
    uint64_t t0 = flx_now_ns();
    CHECK_OK(flx_tok_load(model, &gg));
    fprintf(stderr, "gguf tokenizer: %u tokens, loaded in %.1f ms\n", flx_tok_vocab_size(gg),
            (double)(flx_now_ns() - t0) / 1e6);
    CHECK(flx_tok_vocab_size(gg) == 49152 && flx_tok_pre(gg) == FLX_TOK_PRE_SMOLLM);
    CHECK(flx_tok_bos(gg) == 1 && flx_tok_eos(gg) == 2 && !flx_tok_add_bos_default(gg));
    CHECK(flx_tok_is_eog(gg, flx_tok_find(gg, "<|im_end|>")) && flx_tok_is_eog(gg, flx_tok_find(gg, "<|endoftext|>")));
    CHECK(!flx_tok_is_eog(gg, flx_tok_find(gg, "<|im_start|>")));
    CHECK(flx_tok_attrs(gg, 1) & FLX_TOK_ATTR_SPECIAL);

    /* its chat template: ChatML with SmolLM2's default system prompt */
    const flx_tok_msg_t msgs[] = {{"user", "What is the capital of France?"}};
    char chat[1024];
    size_t clen = 0;
    CHECK_OK(flx_tok_chat(gg, msgs, 1, 1, chat, sizeof(chat), &clen));
    CHECK(strcmp(chat, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                       "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n") == 0);
    int32_t ids[256];
    size_t n = 0;
    CHECK_OK(flx_tok_encode(gg, chat, clen, 0, ids, 256, &n));
    CHECK(ids[0] == 1 && ids[n - 1] != 1 && flx_tok_find(gg, "<|im_start|>") == 1);

    /* texts */
    CHECK(mkdtemp(g_work) != NULL);
    text_t texts[64];
    int n_texts = 0;
    for (size_t i = 0; i < FLX_ARRAY_SIZE(k_files); i++) {
        size_t len;
        char *s = slurp(k_files[i], &len);
        if (!s) {
            fprintf(stderr, "note: %s missing, not compared\n", k_files[i]);
            continue;
        }
        texts[n_texts] = (text_t){s, len};
        write_text(n_texts++, s, len);
    }
    for (size_t i = 0; i < FLX_ARRAY_SIZE(k_inline); i++) {
        size_t len = strlen(k_inline[i]);
        texts[n_texts] = (text_t){strdup(k_inline[i]), len};
        write_text(n_texts++, k_inline[i], len);
    }
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' '%s'", argv[1], argv[2], model, g_work);
    t0 = flx_now_ns();
    CHECK(system(cmd) == 0);
    fprintf(stderr, "reference ids written in %.1f s\n", (double)(flx_now_ns() - t0) / 1e9);

    snprintf(path, sizeof(path), "%s/smollm.ref", g_work);
    size_t total = compare(gg, "gguf (smollm)", texts, n_texts, path);
    CHECK(total > 20000); /* the licences alone are tens of thousands of tokens */

    static const struct {
        const char *name;
        flx_tok_pre_t pre;
    } pres[] = {{"smollm", FLX_TOK_PRE_SMOLLM}, {"gpt2", FLX_TOK_PRE_GPT2}, {"llama3", FLX_TOK_PRE_LLAMA3},
                {"qwen2", FLX_TOK_PRE_QWEN2}};
    for (size_t p = 0; p < FLX_ARRAY_SIZE(pres); p++) {
        flx_tok_t *jt = NULL;
        snprintf(path, sizeof(path), "%s/%s/tokenizer.json", g_work, pres[p].name);
        t0 = flx_now_ns();
        CHECK_OK(flx_tok_load(path, &jt));
        fprintf(stderr, "%s tokenizer.json: loaded in %.1f ms\n", pres[p].name, (double)(flx_now_ns() - t0) / 1e6);
        CHECK(flx_tok_pre(jt) == pres[p].pre && flx_tok_vocab_size(jt) == flx_tok_vocab_size(gg));
        for (uint32_t id = 0; id < flx_tok_vocab_size(gg); id++) {
            CHECK(strcmp(flx_tok_token_str(jt, (int32_t)id), flx_tok_token_str(gg, (int32_t)id)) == 0);
            CHECK(flx_tok_attrs(jt, (int32_t)id) == flx_tok_attrs(gg, (int32_t)id) ||
                  /* EOG comes from the GGUF's eos id, which tokenizer.json alone does not name */
                  (flx_tok_attrs(jt, (int32_t)id) | FLX_TOK_ATTR_EOG) == flx_tok_attrs(gg, (int32_t)id));
        }
        snprintf(path, sizeof(path), "%s/%s.ref", g_work, pres[p].name);
        char label[64];
        snprintf(label, sizeof(label), "tokenizer.json (%s)", pres[p].name);
        total += compare(jt, label, texts, n_texts, path);
        flx_tok_destroy(jt);
    }
    fprintf(stderr, "test_tokenizer_model: %d texts x 5 tokenizers, %zu tokens compared, all identical\n", n_texts,
            total);

    for (int k = 0; k < n_texts; k++) free(texts[k].s);
    flx_tok_destroy(gg);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_work);
    CHECK(system(cmd) == 0);
    return 0;
}
