/*
 * llama_ref.c - the independent reference for the model-runtime benchmark.
 *
 * DESIGN
 * Our runtime (decode/) is checked against an implementation nobody here wrote: llama.cpp, which
 * reads the SmolLM2 GGUF natively. This program links libllama (built into the cache by
 * bench/model/build_llamacpp.sh from PyPI's llama-cpp-python sdist; never committed), takes a
 * token sequence and runs ONE teacher-forced pass over it (causal, positions 0..n-1, chunks of
 * --ubatch tokens through the KV cache), then writes each position's next-token prediction.
 *
 * Comparability: the runtime is fed token ids, so the comparison must be on identical ids. The ids
 * come either from llama.cpp's own tokenizer (--text; --tokens-out writes that tokenization, all
 * of the text, so the runtime can consume exactly llama.cpp's ids) or from a file (--tokens).
 * compare_logits refuses two dumps whose ids differ.
 *
 * Output file ("FLXL" v1, little-endian, no padding; flx-model-dump writes the same format):
 *
 *   offset            size                 field
 *   0                 4                    magic "FLXL"
 *   4                 4                    version (u32) = 1
 *   8                 4                    n_tokens n (u32): positions in the pass
 *   12                4                    n_vocab V (u32): logits per row
 *   16                4                    n_full F (u32), F <= n: positions 0..F-1 carry full rows
 *   20                4                    flags (u32): bit 0 = ids from llama.cpp's tokenizer,
 *                                          bit 1 = ids start with BOS added by the tokenizer
 *   24                8                    producer, NUL-padded ASCII ("llamacpp", "fluxion")
 *   32                4 n                  token ids (i32); row t predicts token t+1
 *   32 + 4 n          16 n                 per position t: top1 id (i32), top2 id (i32),
 *                                          top1 logit (f32), top2 logit (f32); argmax over the
 *                                          full row, ties -> lowest id; NaN is never a maximum
 *   32 + 20 n         4 F V                logits (f32), row-major (F, V): raw, before softmax
 *
 *   total size = 32 + 20 n + 4 F V bytes.  F = n gives everything; F = 0 only the top-2 table.
 *
 * usage: llama_ref --help.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/cli.h"
#include "flx/util.h"
#include "llama.h"

#define FLXL_VERSION 1u
#define FLXL_FLAG_LLAMA_TOKENIZER 1u
#define FLXL_FLAG_BOS 2u

static int g_verbose;

static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static char *read_all(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llama_ref: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "llama_ref: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len_p = n;
    return buf;
}

/* Reads ids as text (one per line / whitespace separated) or raw i32. Returns count or -1. */
static long read_tokens(const char *path, int32_t **ids_p, int n_vocab)
{
    size_t len = 0;
    char *buf = read_all(path, &len);
    if (!buf) return -1;
    int is_text = len > 0;
    for (size_t i = 0; i < len && is_text; i++) {
        char c = buf[i];
        if (!((c >= '0' && c <= '9') || c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r'))
            is_text = 0;
    }
    int32_t *ids = NULL;
    long n = 0;
    if (is_text) {
        ids = malloc(sizeof *ids * (len / 2 + 1));
        char *p = buf;
        while (ids) {
            while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
            if (!*p) break;
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < INT32_MIN || v > INT32_MAX) {
                fprintf(stderr, "llama_ref: %s: bad token id near byte %ld\n", path, (long)(p - buf));
                free(ids);
                free(buf);
                return -1;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
    } else {
        if (len % 4 != 0) {
            fprintf(stderr, "llama_ref: %s: %zu bytes is neither text ids nor a whole number of i32\n", path, len);
            free(buf);
            return -1;
        }
        n = (long)(len / 4);
        ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
        if (ids) memcpy(ids, buf, len);
    }
    free(buf);
    if (!ids) {
        fprintf(stderr, "llama_ref: out of memory reading %s\n", path);
        return -1;
    }
    for (long i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            fprintf(stderr, "llama_ref: %s: id %d at index %ld outside the vocabulary [0, %d)\n", path, ids[i], i,
                    n_vocab);
            free(ids);
            return -1;
        }
    }
    *ids_p = ids;
    return n;
}

static int write_tokens(const char *path, const int32_t *ids, long n)
{
    size_t pl = strlen(path);
    int binary = (pl > 4 && strcmp(path + pl - 4, ".bin") == 0) || (pl > 4 && strcmp(path + pl - 4, ".i32") == 0);
    FILE *f = fopen(path, binary ? "wb" : "w");
    if (!f) {
        fprintf(stderr, "llama_ref: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (binary)
        fwrite(ids, sizeof *ids, (size_t)n, f);
    else
        for (long i = 0; i < n; i++) fprintf(f, "%d\n", ids[i]);
    if (fclose(f) != 0) {
        fprintf(stderr, "llama_ref: error writing %s\n", path);
        return -1;
    }
    return 0;
}

/* Token text for display: control characters escaped, at most ~24 bytes. */
static const char *piece(const struct llama_vocab *vocab, llama_token t, char *out, size_t cap)
{
    char raw[128];
    int n = llama_token_to_piece(vocab, t, raw, sizeof raw - 1, 0, true);
    if (n < 0) n = 0;
    raw[n] = '\0';
    size_t o = 0;
    out[o++] = '\'';
    for (int i = 0; i < n && o + 6 < cap; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (c == '\t') { out[o++] = '\\'; out[o++] = 't'; }
        else if (c == '\'') { out[o++] = '\\'; out[o++] = '\''; }
        else if (c < 0x20) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o++] = '\'';
    out[o] = '\0';
    return out;
}

typedef struct {
    int32_t top1, top2;
    float l1, l2;
} flxl_top_t;

static flxl_top_t row_top2(const float *row, int n_vocab, long *n_nonfinite_p)
{
    flxl_top_t r = {-1, -1, -INFINITY, -INFINITY};
    for (int v = 0; v < n_vocab; v++) {
        float x = row[v];
        if (!isfinite(x)) {
            (*n_nonfinite_p)++;
            if (isnan(x)) continue;
        }
        if (r.top1 < 0 || x > r.l1) {
            r.top2 = r.top1;
            r.l2 = r.l1;
            r.top1 = v;
            r.l1 = x;
        } else if (r.top2 < 0 || x > r.l2) {
            r.top2 = v;
            r.l2 = x;
        }
    }
    return r;
}

int main(int argc, char **argv)
{
    static const char *const kvs[] = {"f32", "f16", NULL}, *const fas[] = {"off", "on", "auto", NULL};
    static const int fa_of[] = {LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                LLAMA_FLASH_ATTN_TYPE_AUTO};
    const char *model_path = NULL, *text_path = NULL, *tok_path = NULL, *tok_out = NULL, *out_path = NULL,
               *full_s = NULL;
    uint64_t n_u = 0, ubatch_u = 512, show_u = 12, threads_u = (uint64_t)sysconf(_SC_NPROCESSORS_ONLN);
    int no_bos = 0, kv_i = 0, fa_i = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL.gguf", &model_path, FLX_CLI_REQUIRED, "the GGUF file"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, 0,
                     "tokenize FILE with llama.cpp (BOS as the GGUF says, no special-token parsing)"),
        FLX_CLI_PATH(0, "tokens", "FILE", &tok_path, 0, "read token ids instead: one per line (text) or raw i32 "
                     "little-endian\n(a file of only digits, '-' and whitespace is text)"),
        FLX_CLI_PATH(0, "tokens-out", "FILE", &tok_out, 0,
                     "write the tokenization of the whole --text (one id per line; .bin / .i32: raw i32)"),
        FLX_CLI_UINT('n', "positions", "N", &n_u, 0, INT32_MAX, 0,
                     "positions in the pass (default: all tokens; 0 = tokenize only, no model pass)"),
        FLX_CLI_STR(0, "full", "K|all", &full_s, 0, "full logit rows for the first K positions (default 16)"),
        FLX_CLI_PATH('o', "out", "OUT", &out_path, 0, "write the FLXL dump (format in the header of llama_ref.c)"),
        FLX_CLI_FLAG(0, "no-bos", &no_bos, "never add BOS when tokenizing"),
        FLX_CLI_ENUM(0, "kv", &kv_i, kvs, 0, "KV-cache type (default f32: the reference should not round K/V)"),
        FLX_CLI_ENUM(0, "fa", &fa_i, fas, 0, "llama.cpp flash attention (default off: its CPU kernel rounds to f16\n"
                     "internally; off = plain f32 KQ, softmax, KQV)"),
        FLX_CLI_UINT(0, "ubatch", "U", &ubatch_u, 1, 1u << 20, 0, "tokens per llama_decode call (default 512)"),
        FLX_CLI_UINT('t', "threads", "N", &threads_u, 1, 1024, 0, "threads (default: online CPUs)"),
        FLX_CLI_UINT(0, "show", "K", &show_u, 0, 1u << 20, 0,
                     "print the first K positions: context token, actual next, argmax (default 12)"),
        FLX_CLI_FLAG('v', "verbose", &g_verbose, "llama.cpp's own log on stderr"),
    };
    flx_cli_t cli = FLX_CLI_INIT("llama_ref", "llama.cpp's teacher-forced pass over a token sequence, written as an "
                                 "FLXL dump: the independent reference of bench/model.", opts);
    cli.synopsis = "-m MODEL.gguf (--text FILE | --tokens FILE) [options]";
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_exclusive(&cli, "text", "tokens", 1) ||
        flx_cli_applies(&cli, text_path != NULL, "with --tokens (only with --text)", "tokens-out", "no-bos", NULL))
        return flx_cli_usage_error(&cli, NULL);
    long n_want = flx_cli_given(&cli, "positions") ? (long)n_u : -1, n_full = 16;
    int full_all = full_s && !strcmp(full_s, "all");
    uint64_t full_u;
    if (full_s && !full_all) {
        if (flx_parse_u64(full_s, 0, INT32_MAX, &full_u))
            return flx_cli_usage_error(&cli, "--full '%s' is not 'all' or an integer in 0..%d", full_s, INT32_MAX);
        n_full = (long)full_u;
    }
    const int add_bos = !no_bos, kv_f32 = kv_i == 0, fa = fa_of[fa_i], threads = (int)threads_u;
    int ubatch = (int)ubatch_u, show = (int)show_u;

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "llama_ref: cannot load %s\n", model_path);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    char desc[128];
    llama_model_desc(model, desc, sizeof desc);

    int32_t *toks = NULL;
    long n_tok = 0;
    uint32_t flags = 0;
    if (text_path) {
        size_t len = 0;
        char *text = read_all(text_path, &len);
        if (!text) return 1;
        if (len > INT32_MAX / 2) {
            fprintf(stderr, "llama_ref: %s is too large (%zu bytes)\n", text_path, len);
            return 1;
        }
        int bos = add_bos && llama_vocab_get_add_bos(vocab);
        int cap = (int)len + 16;
        toks = malloc(sizeof *toks * (size_t)cap);
        int r = toks ? llama_tokenize(vocab, text, (int32_t)len, toks, cap, add_bos, false) : -1;
        if (r < 0) {
            fprintf(stderr, "llama_ref: tokenizing %s failed (%d)\n", text_path, r);
            return 1;
        }
        n_tok = r;
        flags |= FLXL_FLAG_LLAMA_TOKENIZER;
        if (bos && n_tok > 0 && toks[0] == llama_vocab_bos(vocab)) flags |= FLXL_FLAG_BOS;
        fprintf(stderr, "llama_ref: %s: %zu bytes -> %ld tokens (llama.cpp tokenizer, BOS %s)\n", text_path, len,
                n_tok, (flags & FLXL_FLAG_BOS) ? "added" : "not added");
        {
            /* the ids must reproduce the text: llama.cpp's detokenizer on them, special tokens removed */
            int cap2 = (int)len + 64;
            char *back = malloc((size_t)cap2);
            int nb = back ? llama_detokenize(vocab, toks, (int32_t)n_tok, back, cap2, true, false) : -1;
            int same = nb == (int)len && memcmp(back, text, len) == 0;
            fprintf(stderr, "llama_ref: detokenized ids %s the text (%d bytes back)\n",
                    same ? "reproduce" : "DO NOT reproduce", nb);
            free(back);
        }
        free(text);
        if (tok_out) {
            if (write_tokens(tok_out, toks, n_tok) != 0) return 1;
            fprintf(stderr, "llama_ref: tokenization -> %s\n", tok_out);
        }
    } else {
        n_tok = read_tokens(tok_path, &toks, n_vocab);
        if (n_tok < 0) return 1;
        fprintf(stderr, "llama_ref: %s: %ld token ids\n", tok_path, n_tok);
    }
    if (n_want < 0) n_want = n_tok;
    if (n_want == 0) {
        free(toks);
        llama_model_free(model);
        llama_backend_free();
        return 0;
    }
    if (n_tok < n_want) {
        fprintf(stderr, "llama_ref: only %ld tokens, %ld wanted\n", n_tok, n_want);
        return 1;
    }
    if (full_all || n_full > n_want) n_full = n_want;
    int n_ctx_train = llama_model_n_ctx_train(model);
    if (n_want > n_ctx_train)
        fprintf(stderr, "llama_ref: warning: %ld positions exceed the model's training context %d\n", n_want,
                n_ctx_train);

    struct llama_context_params cp = llama_context_default_params();
    if (ubatch > n_want) ubatch = (int)n_want;
    cp.n_ctx = (uint32_t)n_want;
    cp.n_batch = (uint32_t)ubatch;
    cp.n_ubatch = (uint32_t)ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    cp.flash_attn_type = (enum llama_flash_attn_type)fa;
    if (kv_f32) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_ref: cannot create a context of %ld tokens (kv %s)\n", n_want, kv_f32 ? "f32" : "f16");
        return 1;
    }
    fprintf(stderr, "llama_ref: model %s, vocab %d, n_ctx_train %d; pass of %ld positions, ubatch %d, %d threads, kv %s, flash attn %s\n",
            desc, n_vocab, n_ctx_train, n_want, ubatch, threads, kv_f32 ? "f32" : "f16",
            fa == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off" : fa == LLAMA_FLASH_ATTN_TYPE_ENABLED ? "on" : "auto");

    flxl_top_t *top = calloc((size_t)n_want, sizeof *top);
    float *full = malloc(sizeof(float) * (size_t)n_vocab * (size_t)(n_full ? n_full : 1));
    struct llama_batch b = llama_batch_init(ubatch, 0, 1);
    if (!top || !full) {
        fprintf(stderr, "llama_ref: out of memory for %ld full rows\n", n_full);
        return 1;
    }
    long n_nonfinite = 0, n_hit = 0;
    double nll = 0.0;
    for (long s = 0; s < n_want; s += ubatch) {
        int m = (int)(n_want - s < ubatch ? n_want - s : ubatch);
        for (int i = 0; i < m; i++) {
            b.token[i] = toks[s + i];
            b.pos[i] = (llama_pos)(s + i);
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = m;
        int r = llama_decode(ctx, b);
        if (r != 0) {
            fprintf(stderr, "llama_ref: llama_decode failed (%d) at positions %ld..%ld\n", r, s, s + m - 1);
            return 1;
        }
        for (int i = 0; i < m; i++) {
            long t = s + i;
            const float *row = llama_get_logits_ith(ctx, i);
            if (!row) {
                fprintf(stderr, "llama_ref: no logits for position %ld\n", t);
                return 1;
            }
            top[t] = row_top2(row, n_vocab, &n_nonfinite);
            if (t < n_full) memcpy(full + (size_t)t * (size_t)n_vocab, row, sizeof(float) * (size_t)n_vocab);
            if (t + 1 < n_tok) {
                /* teacher-forced sanity: does the argmax name the real next token, and how surprised is it */
                double mx = top[t].l1, z = 0.0;
                for (int v = 0; v < n_vocab; v++) z += exp((double)row[v] - mx);
                nll += mx + log(z) - (double)row[toks[t + 1]];
                n_hit += top[t].top1 == toks[t + 1];
            }
        }
    }
    long n_scored = n_want < n_tok ? n_want : n_tok - 1;

    fprintf(stderr, "llama_ref: sanity: non-finite logits %ld; argmax == actual next token at %ld / %ld positions (%.3f); "
                    "perplexity %.2f\n",
            n_nonfinite, n_hit, n_scored, n_scored ? (double)n_hit / (double)n_scored : 0.0,
            n_scored ? exp(nll / (double)n_scored) : 0.0);
    if (show > n_want) show = (int)n_want;
    if (show > 0) fprintf(stderr, "  %5s  %-18s %-18s %-18s %8s %7s\n", "pos", "token", "actual next", "argmax", "logit",
                          "margin");
    for (int t = 0; t < show; t++) {
        char p0[64], p1[64], p2[64];
        fprintf(stderr, "  %5d  %-18s %-18s %-18s %8.3f %7.3f\n", t, piece(vocab, toks[t], p0, sizeof p0),
                t + 1 < n_tok ? piece(vocab, toks[t + 1], p1, sizeof p1) : "-", piece(vocab, top[t].top1, p2, sizeof p2),
                top[t].l1, top[t].l1 - top[t].l2);
    }

    rc = 0;
    if (out_path) {
        FILE *out = fopen(out_path, "wb");
        if (!out) {
            fprintf(stderr, "llama_ref: cannot write %s: %s\n", out_path, strerror(errno));
            return 1;
        }
        uint32_t hdr[6];
        memcpy(&hdr[0], "FLXL", 4);
        hdr[1] = FLXL_VERSION;
        hdr[2] = (uint32_t)n_want;
        hdr[3] = (uint32_t)n_vocab;
        hdr[4] = (uint32_t)n_full;
        hdr[5] = flags;
        char producer[8] = "llamacpp";
        fwrite(hdr, sizeof hdr, 1, out);
        fwrite(producer, 1, sizeof producer, out);
        fwrite(toks, sizeof *toks, (size_t)n_want, out);
        fwrite(top, sizeof *top, (size_t)n_want, out);
        fwrite(full, sizeof(float) * (size_t)n_vocab, (size_t)n_full, out);
        if (ferror(out) | (fclose(out) != 0)) {
            fprintf(stderr, "llama_ref: error writing %s\n", out_path);
            rc = 1;
        } else {
            fprintf(stderr, "llama_ref: %ld positions (%ld with full logits), vocab %d -> %s\n", n_want, n_full, n_vocab,
                    out_path);
        }
    }
    if (n_nonfinite) rc = 1;
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(full);
    free(top);
    free(toks);
    return rc;
}
