/*
 * test_tokenizer_model.c - the tokenizer of the real model against Hugging Face `tokenizers`.
 *
 *   test_tokenizer_model PYTHON TOK_REF_PY
 *
 * Writes a set of real texts (licences, Python sources, an HTML document, a Unicode-heavy table from
 * the system, hand-written accents/CJK/emoji/whitespace/digit strings, random Unicode) into a work
 * folder, runs tok_ref.py (which adds the sources of a few man pages)
 * with the project's Python to get HF's ids for four pre-tokenizer configurations over the GGUF's
 * vocabulary, then encodes every text with
 *   - the GGUF's own tokenizer (flx_tok_load_gguf: SmolLM2's pre-tokenizer), and
 *   - the four tokenizer.json files tok_ref.py wrote (flx_tok_load: the JSON path),
 * and requires the same ids token for token and decode(encode(x)) == x for every text (NFC(x) for
 * the qwen2 file, whose normalizer is NFC as in Qwen2's own tokenizer.json).
 * Skips (77) without the model file or without a Python that has `tokenizers`.
 */
#include <glob.h>
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
    "/usr/share/zoneinfo/zone1970.tab",   "/usr/share/doc/debian-policy/README.html",
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
    "Not NFC: e\xcc\x81te\xcc\x81 A\xcc\x8a \xe2\x84\xab \xe1\xb8\x8b\xcc\xa3 q\xcc\x87\xcc\xa3 \xe2\x84\xa6 \xe2\x84\xaa "
    "\xc3\x85\xcc\x81 jamo \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab \xea\xb0\x80\xe1\x86\xa8 "
    "a\xcc\x81\xcc\x81\xcc\xa3 \xe0\xa4\xa8\xe0\xa4\xbc \xef\xac\xaf \xe0\xb7\x99\xe0\xb7\x8f\xe0\xb7\x8a",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\nIt's 4.<|im_end|>\n",
    "a<|im_end|>b<|endoftext|><|im_start|><|im_start|>x <|im_end|>",
    "x",
    "!!!???...,,,;;;::: ((([[[{{{}}}]]]))) <<<>>> ''' \"\"\" ``` ~~~ ___ --- +++ === |||",
    "https://example.com/path?query=1&b=2#frag user@example.org C:\\Windows\\System32",
    "'s's 'll've're 'd'm't '",
};

/* Random valid UTF-8: mostly words and spaces, with code points drawn from planes 0-3 (surrogates
 * left out), unusual spaces, digits of many scripts, emoji, combining marks and Hangul jamo, so the
 * class tables, the matchers and NFC meet what they rarely see in prose. */
static size_t random_text(flx_rng_t *rng, char *out, size_t n_chars)
{
    static const uint32_t special[] = {0x20, 0x20, 0x20, 0x0A, 0x09, 0x0D, 0x0B, 0x0C, 0x85, 0xA0, 0x1680, 0x2000,
                                       0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0x200B, 0x1C, 0x1F, 0x27,
                                       0x27, 0x0660, 0x0966, 0x0BE7, 0xFF10, 0x2160, 0x00B2, 0x00BD, 0x1F600,
                                       0x1F44D, 0x1F3FD, 0x200D, 0xFE0F, 0x0301, 0x017F, 0x212A, 0xFFFD, 0x10FFFF};
    size_t len = 0;
    for (size_t i = 0; i < n_chars; i++) {
        uint32_t cp, r = (uint32_t)flx_rng_below(rng, 100);
        if (r < 45)
            cp = (uint32_t)(r < 30 ? 'a' + flx_rng_below(rng, 26) : 'A' + flx_rng_below(rng, 26));
        else if (r < 55)
            cp = (uint32_t)('0' + flx_rng_below(rng, 10));
        else if (r < 65)
            cp = (uint32_t)(33 + flx_rng_below(rng, 94));
        else if (r < 75)
            cp = special[flx_rng_below(rng, FLX_ARRAY_SIZE(special))];
        else if (r < 80) /* combining marks and Hangul jamo: NFC reorders and composes them */
            cp = (uint32_t)(flx_rng_below(rng, 2) ? 0x300 + flx_rng_below(rng, 0x70) : 0x1100 + flx_rng_below(rng, 0x100));
        else if (r < 92)
            cp = (uint32_t)(0x80 + flx_rng_below(rng, 0x10000 - 0x80));
        else
            cp = (uint32_t)(0x10000 + flx_rng_below(rng, 0x40000 - 0x10000));
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0) cp = ' ';
        if (cp < 0x80) {
            out[len++] = (char)cp;
        } else if (cp < 0x800) {
            out[len++] = (char)(0xC0 | (cp >> 6));
            out[len++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[len++] = (char)(0xE0 | (cp >> 12));
            out[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[len++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[len++] = (char)(0xF0 | (cp >> 18));
            out[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[len++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[len] = 0;
    return len;
}

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
static size_t compare(flx_tok_h tok, const char *label, const text_t *texts, const text_t *decoded, int n_texts,
                      const char *ref_path)
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
        const text_t *want = decoded ? &decoded[k] : &texts[k];
        char *back = malloc(want->len + 1);
        size_t blen = 0;
        CHECK(back != NULL);
        CHECK_OK(flx_tok_decode(tok, ids, n, 0, back, want->len + 1, &blen));
        if (blen != want->len || memcmp(back, want->s, blen) != 0) fprintf(stderr, "%s: text %d: decode differs\n", label, k);
        CHECK(blen == want->len && memcmp(back, want->s, blen) == 0);
        free(back);
        free(ids);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "%s: %d texts, %zu tokens identical to HF tokenizers, all decode back%s\n", label, n_texts, total,
            decoded ? " (to their NFC form)" : "");
    return total;
}

int main(int argc, char **argv)
{
    char model[1024], cmd[4096], path[1024];
    if (!flx_test_model_path("test_tokenizer_model", model, sizeof model)) return FLX_TEST_SKIP;
    CHECK(argc == 3);
    snprintf(cmd, sizeof(cmd), "'%s' -c 'import tokenizers' 2>/dev/null", argv[1]);
    if (system(cmd) != 0) {
        fprintf(stderr, "skip: %s cannot import tokenizers (run scripts/setup.sh)\n", argv[1]);
        return FLX_TEST_SKIP;
    }

    /* the GGUF's own tokenizer */
    flx_tok_h gg = NULL;
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
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_tokenizer_model"));
    for (int i = 0; i < 8; i++) {
        char *s = malloc(4 * 3000 + 1);
        CHECK(s != NULL);
        size_t len = random_text(&rng, s, 3000);
        texts[n_texts] = (text_t){s, len};
        write_text(n_texts++, s, len);
    }
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' '%s'", argv[1], argv[2], model, g_work);
    t0 = flx_now_ns();
    CHECK(system(cmd) == 0);
    fprintf(stderr, "reference ids written in %.1f s\n", (double)(flx_now_ns() - t0) / 1e9);

    {
        size_t cap = texts[0].len + 16, nn = 0;
        int32_t *tmp = malloc(cap * sizeof(int32_t));
        CHECK(tmp != NULL);
        t0 = flx_now_ns();
        CHECK_OK(flx_tok_encode(gg, texts[0].s, texts[0].len, 0, tmp, cap, &nn));
        double s = (double)(flx_now_ns() - t0) / 1e9;
        fprintf(stderr, "encode speed: %zu bytes -> %zu tokens in %.1f ms (%.1f MB/s)\n", texts[0].len, nn, s * 1e3,
                (double)texts[0].len / s / 1e6);
        free(tmp);
    }
    /* the text set is every text_*.txt in name order, the man pages tok_ref.py added included */
    for (int k = 0; k < n_texts; k++) free(texts[k].s);
    n_texts = 0;
    glob_t gl;
    snprintf(path, sizeof(path), "%s/text_*.txt", g_work);
    CHECK(glob(path, 0, NULL, &gl) == 0 && gl.gl_pathc <= FLX_ARRAY_SIZE(texts));
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        texts[n_texts].s = slurp(gl.gl_pathv[i], &texts[n_texts].len);
        CHECK(texts[n_texts++].s != NULL);
    }
    globfree(&gl);
    /* their NFC forms, from HF's normalizer */
    text_t nfc_texts[FLX_ARRAY_SIZE(texts)];
    snprintf(path, sizeof(path), "%s/nfc_text_*.txt", g_work);
    CHECK(glob(path, 0, NULL, &gl) == 0 && gl.gl_pathc == (size_t)n_texts);
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        nfc_texts[i].s = slurp(gl.gl_pathv[i], &nfc_texts[i].len);
        CHECK(nfc_texts[i].s != NULL);
    }
    globfree(&gl);
    snprintf(path, sizeof(path), "%s/smollm.ref", g_work);
    size_t total = compare(gg, "gguf (smollm)", texts, NULL, n_texts, path);
    CHECK(total > 20000); /* the licences alone are tens of thousands of tokens */

    static const struct {
        const char *name;
        flx_tok_pre_t pre;
    } pres[] = {{"smollm", FLX_TOK_PRE_SMOLLM}, {"gpt2", FLX_TOK_PRE_GPT2}, {"llama3", FLX_TOK_PRE_LLAMA3},
                {"qwen2", FLX_TOK_PRE_QWEN2}};
    for (size_t p = 0; p < FLX_ARRAY_SIZE(pres); p++) {
        flx_tok_h jt = NULL;
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
        total += compare(jt, label, texts, pres[p].pre == FLX_TOK_PRE_QWEN2 ? nfc_texts : NULL, n_texts, path);
        flx_tok_destroy(jt);
    }
    fprintf(stderr, "test_tokenizer_model: %d texts x 5 tokenizers, %zu tokens compared, all identical\n", n_texts,
            total);

    for (int k = 0; k < n_texts; k++) {
        free(texts[k].s);
        free(nfc_texts[k].s);
    }
    flx_tok_destroy(gg);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_work);
    CHECK(system(cmd) == 0);
    return 0;
}
