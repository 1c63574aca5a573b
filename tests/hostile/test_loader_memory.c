/*
 * test_loader_memory - what a file can make a loader allocate. Each load runs in a forked child
 * whose address space is capped (memcap.h):
 *   - tiny hostile files, each claiming a huge count, id or shape, must be refused (status and the
 *     field named) within a few MiB: the sparse tokenizer id once took 10 GB, the GGUF head_dim
 *     once overflowed the stack;
 *   - worst-case files of 1 MiB built to maximise what the reader keeps per byte must load within
 *     the bound the reader's header states (flx/gguf.h: 16 x the file + 64 KiB; flx/safetensors.h:
 *     64 x the header + 1 MiB; flx/tokenizer.h: the id space bounded by the tokens held).
 * The cap's own check: a child that allocates past it must fail. In sanitizer builds the cap is not
 * enforced and only statuses and messages are checked.
 *
 * usage: test_loader_memory SCRATCH_DIR
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/gguf.h"
#include "flx/kvsource.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/safetensors.h"
#include "flx/tokenizer.h"
#include "flx_test.h"
#include "fuzz/fuzz_seeds.h"
#include "gguf_build.h"
#include "memcap.h"

static char g_dir[512];

/* ---- the loads, as children ---- */

typedef enum { L_GGUF, L_MODEL, L_TOK, L_ST, L_KVDUMP, L_DATASET, L_PRED } loader_t;

typedef struct {
    loader_t loader;
    const char *path;
    flx_status_t want;   /* expected status */
    const char *msg;     /* substring of the message, or NULL */
} load_t;

static flx_status_t run_loader(loader_t l, const char *path)
{
    flx_status_t st;
    switch (l) {
    case L_GGUF: {
        flx_gguf_h h = NULL;
        st = flx_gguf_open(path, &h);
        flx_gguf_close(h);
        return st;
    }
    case L_MODEL: {
        flx_model_t *m = NULL;
        st = flx_model_load(path, &m);
        if (st == FLX_OK) flx_model_destroy(m);
        return st;
    }
    case L_TOK: {
        flx_tok_h t = NULL;
        st = flx_tok_load(path, &t);
        flx_tok_destroy(t);
        return st;
    }
    case L_ST: {
        flx_st_reader_h r = NULL;
        st = flx_st_open(path, &r);
        if (st == FLX_OK) flx_st_close(r);
        return st;
    }
    case L_KVDUMP: {
        flx_kvsrc_h s = NULL;
        st = flx_kvsrc_open_dump(path, &s);
        flx_kvsrc_close(s);
        return st;
    }
    case L_DATASET: {
        flx_dataset_t d = {0};
        st = flx_dataset_load_append(&d, path);
        flx_dataset_free(&d);
        return st;
    }
    case L_PRED: {
        flx_predictor_h p = NULL;
        st = flx_predictor_load(path, &p);
        flx_predictor_destroy(p);
        return st;
    }
    }
    return FLX_ERR_INTERNAL;
}

/* Child: 0 when the load ended with the wanted status and message, 1 otherwise. */
static int load_child(void *arg)
{
    const load_t *a = arg;
    flx_status_t st = run_loader(a->loader, a->path);
    if (st != a->want || (a->msg && !strstr(flx_error_msg(), a->msg))) {
        fprintf(stderr, "  got %d (%s) '%s', want %d (%s) naming '%s'\n", st, flx_status_name(st), flx_error_msg(),
                a->want, flx_status_name(a->want), a->msg ? a->msg : "");
        return 1;
    }
    return 0;
}

static void expect_capped(const char *label, size_t cap, loader_t l, const char *path, flx_status_t want,
                          const char *msg)
{
    load_t a = {l, path, want, msg};
    memcap_result_t r = memcap_run(cap, load_child, &a);
    fprintf(stderr, "%-40s cap %6.1f MiB: exit %d signal %d, peak rss %ld KiB\n", label, (double)cap / MEMCAP_MIB,
            r.code, r.sig, r.max_rss_kb);
    CHECK(r.sig == 0 && r.code == 0);
}

/* ---- files ---- */

static const char *tmp_path(const char *name)
{
    static char ring[8][700];
    static int next;
    char *p = ring[next++ % 8];
    snprintf(p, sizeof ring[0], "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

/* A safetensors file with the given header and data bytes of zeros. */
static void write_st(const char *path, const char *hdr, size_t hlen, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    uint64_t hl = hlen;
    CHECK(f && fwrite(&hl, 8, 1, f) == 1 && fwrite(hdr, 1, hlen, f) == hlen);
    for (size_t i = 0; i < data_len; i++) CHECK(fputc(0, f) != EOF);
    CHECK(fclose(f) == 0);
}

/* A growing text buffer. */
typedef struct {
    char *s;
    size_t n, cap;
} text_t;

static void tput(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tput(text_t *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        CHECK(k >= 0);
        if (t->s && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        }
        t->cap = (t->cap + (size_t)k + 1) * 2;
        CHECK((t->s = realloc(t->s, t->cap)));
    }
}

/* ---- the cases ---- */

static int alloc_past_cap(void *arg)
{
    size_t n = *(size_t *)arg;
    char *p = malloc(n);
    if (!p) return 3;
    memset(p, 1, n);
    free(p);
    return 0;
}

static void test_cap_bites(void)
{
    if (!MEMCAP_ENFORCED) return;
    size_t n = 64 * MEMCAP_MIB;
    memcap_result_t r = memcap_run(8 * MEMCAP_MIB, alloc_past_cap, &n);
    CHECK(r.code == 3);
    n = 4 * MEMCAP_MIB;
    r = memcap_run(8 * MEMCAP_MIB, alloc_past_cap, &n);
    CHECK(r.code == 0);
    fprintf(stderr, "cap check: 64 MiB refused under an 8 MiB cap, 4 MiB allowed\n");
}

/* Tiny files that claim a lot: refused, naming the field, within 8 MiB. */
static void test_tiny_hostile(void)
{
    const size_t cap = 8 * MEMCAP_MIB;
    const char *bi = FLX_TEST_DATA "/bad-inputs/";
    char p[600];

    snprintf(p, sizeof p, "%s01-gguf-rope-freqs-stack-overflow.gguf", bi);
    expect_capped("bad input 01 (gguf head_dim 512)", cap, L_MODEL, p, FLX_ERR_UNSUPPORTED,
                  "'llama.attention.key_length' = 512");
    snprintf(p, sizeof p, "%s02-safetensors-duplicate-metadata.safetensors", bi);
    expect_capped("bad input 02 (two __metadata__)", cap, L_ST, p, FLX_ERR_FORMAT, "'__metadata__' appears twice");
    snprintf(p, sizeof p, "%s03-fluxion-attn-misaligned-bf16.safetensors", bi);
    expect_capped("bad input 03 (odd data offsets: legal)", cap, L_ST, p, FLX_OK, NULL);
    snprintf(p, sizeof p, "%s04-tokenizer-sparse-vocab-1G.json", bi);
    expect_capped("bad input 04 (vocab id 2^30)", cap, L_TOK, p, FLX_ERR_FORMAT, "model.vocab id 1073741822");

    const char *added = "{\"added_tokens\":[{\"id\":1000000000,\"content\":\"<x>\"}],\"model\":{\"type\":\"BPE\","
                        "\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
    const char *tp = tmp_path("added.json");
    write_bytes(tp, added, strlen(added));
    expect_capped("added_tokens id 10^9", cap, L_TOK, tp, FLX_ERR_FORMAT, "added_tokens id 1000000000");

    /* GGUF: counts of 2^40 keys and tensors in a 64-byte file */
    gguf_b_t g = {0};
    kv_u32(&g, "k", 1);
    const char *gp = tmp_path("counts.gguf");
    gguf_save(&g, gp, "GGUF", 3);
    gguf_free(&g);
    FILE *f = fopen(gp, "r+b");
    uint64_t big = UINT64_C(1) << 40;
    CHECK(f && fseek(f, 8, SEEK_SET) == 0 && fwrite(&big, 8, 1, f) == 1 && fwrite(&big, 8, 1, f) == 1);
    fclose(f);
    expect_capped("gguf claiming 2^40 keys and tensors", cap, L_GGUF, gp, FLX_ERR_FORMAT, "cannot fit");
    /* GGUF: an array of 2^40 strings */
    memset(&g, 0, sizeof g);
    put_str(&g.kv, "tokenizer.ggml.tokens"), put_u32(&g.kv, FLX_GGUF_ARRAY), put_u32(&g.kv, FLX_GGUF_STRING);
    put_u64(&g.kv, big), g.n_kv++;
    gguf_save(&g, gp, "GGUF", 3);
    gguf_free(&g);
    expect_capped("gguf array of 2^40 strings", cap, L_GGUF, gp, FLX_ERR_FORMAT, "array count");

    /* safetensors: a shape of 2^40 x 2^40 elements in 8 bytes of data */
    const char *sp = tmp_path("shape.safetensors");
    const char *hdr = "{\"t\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}";
    write_st(sp, hdr, strlen(hdr), 8);
    expect_capped("safetensors shape 2^80", cap, L_ST, sp, FLX_ERR_FORMAT, "shape overflows");

    /* kv dump: metadata claiming 2^32 - 1 layers of 4096 heads of 2^20 dims, no tensors */
    const char *kp = tmp_path("dump.safetensors");
    hdr = "{\"__metadata__\":{\"format\":\"fluxion-kv-dump\",\"version\":\"1\",\"n_layers\":\"4294967295\","
          "\"n_q_heads\":\"4096\",\"n_kv_heads\":\"4096\",\"head_dim\":\"1048576\",\"prompt_len\":\"1000000\","
          "\"n_steps\":\"1000000\"}}";
    write_st(kp, hdr, strlen(hdr), 0);
    expect_capped("kv dump claiming 2^32 layers", cap, L_KVDUMP, kp, FLX_ERR_NOT_FOUND, "layers.0.k");

    /* dataset: 2^40 rows claimed by the shape, 8 bytes of data */
    const char *dp = tmp_path("dataset.safetensors");
    hdr = "{\"__metadata__\":{\"format\":\"fluxion-dataset\",\"version\":\"1\",\"tau\":\"0.1\",\"criterion\":\"x\","
          "\"source\":\"y\"},\"features\":{\"dtype\":\"F32\",\"shape\":[1099511627776,41],\"data_offsets\":[0,8]}}";
    write_st(dp, hdr, strlen(hdr), 8);
    expect_capped("dataset claiming 2^40 rows", cap, L_DATASET, dp, FLX_ERR_FORMAT, "features");

    /* Hugging Face: config.json declaring the largest shape the runtime accepts over a tiny
     * checkpoint: refused at the first tensor, before anything is allocated by the shape. */
    char hf[600];
    snprintf(hf, sizeof hf, "%s/hf", g_dir);
    CHECK(mkdir(hf, 0755) == 0);
    CHECK(fuzz_tiny_checkpoint(hf, 1) == 0);
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", hf);
    const char *big_cfg = "{\"model_type\":\"llama\",\"hidden_size\":65536,\"intermediate_size\":262144,"
                          "\"num_hidden_layers\":256,\"num_attention_heads\":256,\"num_key_value_heads\":4,"
                          "\"head_dim\":256,\"rms_norm_eps\":1e-5,\"max_position_embeddings\":16777216,"
                          "\"vocab_size\":4194304}";
    write_bytes(cfg, big_cfg, strlen(big_cfg));
    expect_capped("hf config of the largest shape", cap, L_MODEL, hf, FLX_ERR_FORMAT, "model.embed_tokens.weight");
}

/* 1 MiB files written to maximise what a reader keeps per byte: within the stated bounds. */
static void test_worst_case_bounds(void)
{
    const size_t MiB = MEMCAP_MIB, file = MiB;
    text_t t = {0};
    char key[32];

    /* GGUF: minimal u8 key/values (8 + 6-byte key + 4 + 1 = 19 bytes each), then string values and
     * arrays of empty strings and of empty sub-arrays */
    const char *gp = tmp_path("worst.gguf");
    const char *kinds[3] = {"u8 keys", "empty string values", "arrays of empty arrays"};
    for (int kind = 0; kind < 3; kind++) {
        gguf_b_t g = {0};
        for (uint32_t i = 0; g.kv.n < file; i++) {
            snprintf(key, sizeof key, "%06x", i);
            put_str(&g.kv, key);
            if (kind == 0) {
                put_u32(&g.kv, FLX_GGUF_U8), put(&g.kv, "\x01", 1);
            } else if (kind == 1) {
                put_u32(&g.kv, FLX_GGUF_STRING), put_str(&g.kv, "");
            } else {
                put_u32(&g.kv, FLX_GGUF_ARRAY), put_u32(&g.kv, FLX_GGUF_ARRAY), put_u64(&g.kv, 4096);
                for (int k = 0; k < 4096; k++) put_u32(&g.kv, FLX_GGUF_U8), put_u64(&g.kv, 0);
            }
            g.n_kv++;
        }
        gguf_save(&g, gp, "GGUF", 3);
        size_t n = g.kv.n + 24;
        gguf_free(&g);
        char label[96];
        snprintf(label, sizeof label, "gguf 1 MiB of %s", kinds[kind]);
        /* the bound, plus the file's mapping and 1 MiB for the allocator's own slack */
        expect_capped(label, 16 * n + 64 * 1024 + n + MiB, L_GGUF, gp, FLX_OK, NULL);
    }

    /* safetensors: a header of metadata pairs, of tiny tensors, of one long array */
    const char *sp = tmp_path("worst.safetensors");
    const char *skinds[3] = {"metadata pairs", "zero-size tensors", "a long array"};
    for (int kind = 0; kind < 3; kind++) {
        t.n = 0;
        if (kind == 0) {
            tput(&t, "{\"__metadata__\":{");
            for (uint32_t i = 0; t.n < file; i++) tput(&t, "%s\"%x\":\"\"", i ? "," : "", i);
            tput(&t, "}}");
        } else if (kind == 1) {
            tput(&t, "{");
            for (uint32_t i = 0; t.n < file; i++)
                tput(&t, "%s\"%x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}", i ? "," : "", i);
            tput(&t, "}");
        } else {
            tput(&t, "{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":[0");
            while (t.n < file) tput(&t, ",0");
            tput(&t, "]}}");
        }
        write_st(sp, t.s, t.n, 0);
        char label[96];
        snprintf(label, sizeof label, "safetensors 1 MiB header of %s", skinds[kind]);
        expect_capped(label, 64 * t.n + MiB + t.n + MiB, L_ST, sp, FLX_OK, NULL);
    }

    /* tokenizer.json: 1 MiB of distinct one-id tokens (the id space equals the tokens held) */
    t.n = 0;
    tput(&t, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (uint32_t i = 0; t.n < file; i++) tput(&t, "%s\"%x\":%u", i ? "," : "", i, i);
    tput(&t, "},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    const char *tp = tmp_path("worst.json");
    write_bytes(tp, t.s, t.n);
    expect_capped("tokenizer.json 1 MiB of tokens", 64 * t.n + MiB, L_TOK, tp, FLX_OK, NULL);
    free(t.s);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_loader_memory SCRATCH_DIR\n");
        return 2;
    }
    snprintf(g_dir, sizeof g_dir, "%s/loader_memory.XXXXXX", argv[1]);
    CHECK(mkdtemp(g_dir));
    if (!MEMCAP_ENFORCED) fprintf(stderr, "test_loader_memory: sanitizer build, caps not enforced\n");
    test_cap_bites();
    test_tiny_hostile();
    test_worst_case_bounds();
    nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    fprintf(stderr, "test_loader_memory: ok\n");
    return 0;
}
