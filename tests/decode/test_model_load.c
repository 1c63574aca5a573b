/*
 * test_model_load.c - model loaders: Hugging Face round trips through flx_model_save_hf and the
 * flx-gen-ckpt tool, GGUF round trips through flx_model_save_gguf (weights, config and its
 * byte-level tokenizer), GGUF files built here byte by byte (dequantization against the scalar
 * formulas, llama rope un-permute, metadata getters), and refusals of broken inputs, each checked
 * for its status and for naming the culprit.
 *
 * usage: test_model_load PATH_TO_FLX_GEN_CKPT
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flx/bf16.h"
#include "flx/cpu.h"
#include "flx/forward.h"
#include "flx/gguf.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/safetensors.h"
#include "flx/tokenizer.h"
#include "flx_test.h"
#include "gguf_build.h"

static char g_tmp[256];
static uint64_t g_seed;

/* The last error message must contain each of the given substrings. */
#define CHECK_MSG(s)                                                                                 \
    do {                                                                                             \
        if (!strstr(flx_error_msg(), (s))) {                                                         \
            fprintf(stderr, "%s:%d: error message '%s' does not name '%s'\n", __FILE__, __LINE__,    \
                    flx_error_msg(), (s));                                                           \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void cleanup(void)
{
    if (g_tmp[0]) nftw(g_tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates g_tmp/name; the path stays valid for the next three calls. */
static char *subdir(const char *name)
{
    static char ring[4][512];
    static int next;
    char *p = ring[next++ % 4];
    snprintf(p, sizeof ring[0], "%s/%s", g_tmp, name);
    CHECK(mkdir(p, 0755) == 0);
    return p;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    CHECK(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face round trips
 * ------------------------------------------------------------------------------------------- */

/* What a bf16 value becomes after being stored as dtype and loaded back to bf16. */
static flx_bf16_t through_mat(flx_bf16_t x, flx_dtype_t dt)
{
    if (dt != FLX_DT_F16) return x;
    return flx_f32_to_bf16(flx_f16_to_f32(flx_f32_to_f16(flx_bf16_to_f32(x))));
}

/* What an fp32 norm/bias becomes after being stored as dtype and loaded back to fp32. */
static float through_vec(float x, flx_dtype_t dt)
{
    if (dt == FLX_DT_BF16) return flx_bf16_to_f32(flx_f32_to_bf16(x));
    if (dt == FLX_DT_F16) return flx_f16_to_f32(flx_f32_to_f16(x));
    return x;
}

static void cmp_mat(const char *what, uint32_t l, flx_wmat_t gotm, flx_wmat_t refm, size_t n, flx_dtype_t dt)
{
    CHECK(gotm.fmt == FLX_WFMT_BF16 && refm.fmt == FLX_WFMT_BF16);   /* Hugging Face matrices are bf16 */
    const flx_bf16_t *got = gotm.p, *ref = refm.p;
    CHECK(got && ref);
    for (size_t i = 0; i < n; i++)
        if (got[i] != through_mat(ref[i], dt)) {
            fprintf(stderr, "layer %u %s[%zu]: got 0x%04x want 0x%04x (ref 0x%04x)\n", l, what, i, got[i],
                    through_mat(ref[i], dt), ref[i]);
            exit(1);
        }
}

static void cmp_vec(const char *what, uint32_t l, const float *got, const float *ref, size_t n, flx_dtype_t dt)
{
    CHECK(got && ref);
    for (size_t i = 0; i < n; i++) {
        float w = through_vec(ref[i], dt);
        if (memcmp(&got[i], &w, 4) != 0) {
            fprintf(stderr, "layer %u %s[%zu]: got %.9g want %.9g\n", l, what, i, (double)got[i], (double)w);
            exit(1);
        }
    }
}

/* Matrices as stored as dt, norms and biases as stored as vdt. */
static void cmp_models_as(const flx_model_t *got, const flx_model_t *ref, flx_dtype_t dt, flx_dtype_t vdt)
{
    const flx_model_config_t *a = &got->cfg, *b = &ref->cfg;
    CHECK(a->arch == b->arch && a->n_layers == b->n_layers && a->hidden == b->hidden);
    CHECK(a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim);
    CHECK(a->ffn == b->ffn && a->vocab == b->vocab && a->max_ctx == b->max_ctx);
    CHECK(a->rms_eps == b->rms_eps && a->rope_theta == b->rope_theta && a->rope_scaling == b->rope_scaling);
    CHECK(a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor);
    CHECK(a->rope_high_freq_factor == b->rope_high_freq_factor && a->rope_orig_ctx == b->rope_orig_ctx);
    CHECK(a->tied_embeddings == b->tied_embeddings && a->qkv_bias == b->qkv_bias);
    CHECK(!strcmp(a->name, b->name));
    const size_t H = a->hidden, qd = (size_t)a->n_heads * a->head_dim, kvd = (size_t)a->n_kv_heads * a->head_dim;
    const size_t F = a->ffn, V = a->vocab;
    cmp_mat("tok_embd", 0, got->tok_embd, ref->tok_embd, V * H, dt);
    cmp_mat("lm_head", 0, got->lm_head, ref->lm_head, V * H, dt);
    if (a->tied_embeddings) CHECK(got->lm_head.p == got->tok_embd.p);
    else CHECK(got->lm_head.p != got->tok_embd.p);
    cmp_vec("out_norm", 0, got->out_norm, ref->out_norm, H, vdt);
    for (uint32_t l = 0; l < a->n_layers; l++) {
        const flx_layer_weights_t *x = &got->layers[l], *y = &ref->layers[l];
        cmp_vec("attn_norm", l, x->attn_norm, y->attn_norm, H, vdt);
        cmp_vec("ffn_norm", l, x->ffn_norm, y->ffn_norm, H, vdt);
        cmp_mat("wq", l, x->wq, y->wq, qd * H, dt);
        cmp_mat("wk", l, x->wk, y->wk, kvd * H, dt);
        cmp_mat("wv", l, x->wv, y->wv, kvd * H, dt);
        cmp_mat("wo", l, x->wo, y->wo, H * qd, dt);
        cmp_mat("w_gate", l, x->w_gate, y->w_gate, F * H, dt);
        cmp_mat("w_up", l, x->w_up, y->w_up, F * H, dt);
        cmp_mat("w_down", l, x->w_down, y->w_down, H * F, dt);
        if (a->qkv_bias) {
            cmp_vec("bq", l, x->bq, y->bq, qd, vdt);
            cmp_vec("bk", l, x->bk, y->bk, kvd, vdt);
            cmp_vec("bv", l, x->bv, y->bv, kvd, vdt);
        } else {
            CHECK(!x->bq && !x->bk && !x->bv);
        }
    }
}

static void cmp_models(const flx_model_t *got, const flx_model_t *ref, flx_dtype_t dt)
{
    cmp_models_as(got, ref, dt, dt);
}

/* Whether p lies in a mapping of a file whose path contains name (per /proc/self/maps). */
static int in_file_mapping(const void *p, const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
            found = strstr(line, name) != NULL;
    }
    fclose(f);
    return found;
}

typedef struct {
    const char *label;
    flx_arch_t arch;
    uint32_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    int tied;
    uint32_t shards;
    flx_dtype_t dtype;
    int llama3;
} hf_case_t;

static flx_model_config_t case_cfg(const hf_case_t *k)
{
    flx_model_config_t c = {.arch = k->arch, .n_layers = k->layers, .hidden = k->hidden, .n_heads = k->heads,
                            .n_kv_heads = k->kv_heads, .head_dim = k->head_dim, .ffn = k->ffn, .vocab = k->vocab,
                            .max_ctx = 2048, .rms_eps = 1e-6f, .rope_theta = 500000.0f, .tied_embeddings = k->tied,
                            .qkv_bias = k->arch == FLX_ARCH_QWEN2};
    if (k->llama3)
        c.rope_scaling = FLX_ROPE_LLAMA3, c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4,
        c.rope_orig_ctx = 8192;
    snprintf(c.name, sizeof c.name, "test-%s", k->label);
    return c;
}

static void test_hf_roundtrips(void)
{
    static const hf_case_t cases[] = {
        {"llama-hd64-gqa1-tied-1-bf16", FLX_ARCH_LLAMA, 2, 128, 2, 2, 64, 96, 67, 1, 1, FLX_DT_BF16, 0},
        {"qwen2-hd128-gqa4-untied-3-f16", FLX_ARCH_QWEN2, 2, 128, 8, 2, 128, 64, 51, 0, 3, FLX_DT_F16, 0},
        {"llama-hd64-gqa8-untied-3-f32-llama3", FLX_ARCH_LLAMA, 3, 256, 8, 1, 64, 128, 50, 0, 3, FLX_DT_F32, 1},
        {"qwen2-hd64-gqa8-tied-1-f32", FLX_ARCH_QWEN2, 1, 64, 8, 1, 64, 48, 40, 1, 1, FLX_DT_F32, 0},
        {"llama-hd128-gqa4-tied-3-bf16", FLX_ARCH_LLAMA, 2, 128, 4, 1, 128, 64, 33, 1, 3, FLX_DT_BF16, 0},
        {"qwen2-hd128-gqa1-untied-1-bf16", FLX_ARCH_QWEN2, 1, 128, 2, 2, 128, 32, 29, 0, 1, FLX_DT_BF16, 0},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        const hf_case_t *k = &cases[i];
        flx_model_config_t cfg = case_cfg(k);
        flx_model_t *ref, *got = NULL, *got2 = NULL;
        CHECK_OK(flx_model_init_random(&cfg, g_seed + i, &ref));
        char *dir = subdir(k->label);
        CHECK_OK(flx_model_save_hf(ref, dir, k->dtype, k->shards));
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        CHECK((access(p, F_OK) == 0) == (k->shards > 1));
        CHECK_OK(flx_model_load_hf(dir, &got));
        cmp_models(got, ref, k->dtype);
        /* BF16 matrices are used in place (zero copy); other dtypes are converted into the heap. */
        int mapped = in_file_mapping(got->layers[0].wq.p, ".safetensors");
        CHECK(mapped == (k->dtype == FLX_DT_BF16));
        CHECK(in_file_mapping(got->layers[0].attn_norm, ".safetensors") == 0);
        CHECK_OK(flx_model_load(dir, &got2)); /* dispatch: a directory is a HF checkpoint */
        cmp_models(got2, ref, k->dtype);
        fprintf(stderr, "hf round trip %s: every weight matches\n", k->label);
        flx_model_destroy(got2);
        flx_model_destroy(got);
        flx_model_destroy(ref);
    }
}

/* flx_model_save_gguf then flx_model_load_gguf gives the weights back (Llama q/k rows permuted on
 * the way out, un-permuted on the way in), and its tokenizer encodes one token per byte. */
static void test_gguf_save_roundtrips(void)
{
    static const hf_case_t cases[] = {
        {"gguf-llama-hd32-gqa2-untied-bf16", FLX_ARCH_LLAMA, 2, 128, 4, 2, 32, 96, 300, 0, 1, FLX_DT_BF16, 0},
        {"gguf-qwen2-hd64-gqa4-tied-f16", FLX_ARCH_QWEN2, 1, 128, 4, 1, 64, 64, 257, 1, 1, FLX_DT_F16, 0},
        {"gguf-llama-hd16-gqa1-tied-f32", FLX_ARCH_LLAMA, 1, 64, 2, 2, 16, 32, 400, 1, 1, FLX_DT_F32, 0},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        const hf_case_t *k = &cases[i];
        flx_model_config_t cfg = case_cfg(k);
        flx_model_t *ref, *got = NULL;
        CHECK_OK(flx_model_init_random(&cfg, g_seed + i, &ref));
        char p[600];
        snprintf(p, sizeof p, "%s/%s.gguf", g_tmp, k->label);
        CHECK_OK(flx_model_save_gguf(ref, p, k->dtype));
        CHECK_OK(flx_model_load(p, &got));
        /* norms and biases are F32 in the file: they come back exactly */
        cmp_models_as(got, ref, k->dtype, FLX_DT_F32);
        flx_tok_h tok;
        CHECK_OK(flx_tok_load(p, &tok));
        CHECK(flx_tok_vocab_size(tok) == cfg.vocab && flx_tok_eos(tok) == 256 && flx_tok_is_eog(tok, 256));
        const char text[] = "caf\xc3\xa9 \x01\xff <|end|>\n";
        int32_t ids[64];
        size_t n = 0;
        CHECK_OK(flx_tok_encode(tok, text, sizeof text - 1, 0, ids, 64, &n));
        CHECK(n == sizeof text - 1);
        for (size_t j = 0; j < n; j++) CHECK(ids[j] >= 0 && ids[j] < 256);
        char back[64];
        size_t blen = 0;
        CHECK_OK(flx_tok_decode(tok, ids, n, 0, back, sizeof back, &blen));
        CHECK(blen == n && !memcmp(back, text, n));
        CHECK_OK(flx_tok_encode(tok, "<|endoftext|>", 13, 0, ids, 64, &n));   /* a control token, matched whole */
        CHECK(n == 1 && ids[0] == 256);
        int32_t pad = (int32_t)cfg.vocab - 1;   /* the padding ids are control tokens: skipped */
        CHECK_OK(flx_tok_decode(tok, &pad, 1, FLX_TOK_SKIP_SPECIAL, back, sizeof back, &blen));
        CHECK(blen == 0 || pad == 256);
        flx_tok_destroy(tok);
        fprintf(stderr,
                "gguf save round trip %s: every weight matches, %zu bytes -> as many tokens -> the same bytes\n",
                k->label, sizeof text - 1);
        flx_model_destroy(got);
        flx_model_destroy(ref);
    }
    /* refusals: a vocabulary too small for the byte tokens, llama3 scaling */
    hf_case_t small = {"gguf-small", FLX_ARCH_LLAMA, 1, 64, 2, 2, 32, 32, 256, 0, 1, FLX_DT_BF16, 0};
    flx_model_config_t cfg = case_cfg(&small);
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(&cfg, g_seed, &m));
    char p[600];
    snprintf(p, sizeof p, "%s/refused.gguf", g_tmp);
    CHECK_ST(flx_model_save_gguf(m, p, FLX_DT_BF16), FLX_ERR_INVALID);
    CHECK_MSG("vocab 256");
    flx_model_destroy(m);
    small.vocab = 300, small.llama3 = 1;
    cfg = case_cfg(&small);
    CHECK_OK(flx_model_init_random(&cfg, g_seed, &m));
    CHECK_ST(flx_model_save_gguf(m, p, FLX_DT_BF16), FLX_ERR_UNSUPPORTED);
    CHECK_MSG("llama3");
    CHECK(access(p, F_OK) != 0);
    flx_model_destroy(m);
}

/* The tool's output equals flx_model_init_random(seed) stored as the dtype. */
static void test_gen_tool(const char *tool)
{
    char cmd[1024], *dir = subdir("tool");
    snprintf(cmd, sizeof cmd,
             "%s --family qwen2 --layers 2 --hidden 64 --heads 4 --kv-heads 1 --head-dim 32 --ffn 48 --vocab 37 "
             "--shards 3 --dtype f16 --seed 4242 --max-ctx 1024 %s > /dev/null", tool, dir);
    CHECK(system(cmd) == 0);
    flx_model_t *got;
    CHECK_OK(flx_model_load(dir, &got));
    flx_model_config_t cfg = got->cfg;
    CHECK(cfg.arch == FLX_ARCH_QWEN2 && cfg.n_layers == 2 && cfg.hidden == 64 && cfg.n_heads == 4);
    CHECK(cfg.n_kv_heads == 1 && cfg.head_dim == 32 && cfg.ffn == 48 && cfg.vocab == 37 && cfg.max_ctx == 1024);
    CHECK(!cfg.tied_embeddings && cfg.qkv_bias);
    flx_model_t *ref;
    CHECK_OK(flx_model_init_random(&cfg, 4242, &ref));
    cmp_models(got, ref, FLX_DT_F16);
    flx_model_destroy(ref);
    flx_model_destroy(got);
    /* --format gguf: one file, the same weights */
    char gg[600];
    snprintf(gg, sizeof gg, "%s/tool.gguf", g_tmp);
    snprintf(cmd, sizeof cmd,
             "%s --family llama --layers 1 --hidden 64 --heads 4 --kv-heads 2 --ffn 64 --vocab 260 --seed 7 "
             "--max-ctx 256 --format gguf %s > /dev/null", tool, gg);
    CHECK(system(cmd) == 0);
    CHECK_OK(flx_model_load(gg, &got));
    cfg = got->cfg;
    CHECK(cfg.arch == FLX_ARCH_LLAMA && cfg.max_ctx == 256 && cfg.vocab == 260 && cfg.n_kv_heads == 2);
    CHECK_OK(flx_model_init_random(&cfg, 7, &ref));
    cmp_models_as(got, ref, FLX_DT_BF16, FLX_DT_F32);
    flx_model_destroy(ref);
    flx_model_destroy(got);
    /* Flag validation: each bad invocation exits 2 and writes nothing. */
    static const char *const bad[] = {
        "--family gpt2 --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 10",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32",
        "--family llama --layers x --hidden 64 --heads 4 --ffn 32 --vocab 10",
        "--family llama --layers 1 --hidden 64 --heads 4 --kv-heads 3 --ffn 32 --vocab 10",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 10 --dtype f8",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 10 --shards 0",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 300 --format gguf --shards 2",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 100 --format gguf",
        "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 300 --format safetensors",
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        snprintf(cmd, sizeof cmd, "%s %s %s/bad%zu 2>/dev/null", tool, bad[i], g_tmp, i);
        int rc = system(cmd);
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
        snprintf(cmd, sizeof cmd, "%s/bad%zu", g_tmp, i);
        CHECK(access(cmd, F_OK) != 0);
    }
}

static void gen_small(const char *dir, flx_arch_t arch, uint32_t shards, flx_dtype_t dt)
{
    hf_case_t k = {"small", arch, 2, 64, 4, 2, 16, 32, 20, 0, shards, dt, 0};
    flx_model_config_t cfg = case_cfg(&k);
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(&cfg, g_seed, &m));
    CHECK_OK(flx_model_save_hf(m, dir, dt, shards));
    flx_model_destroy(m);
}

/* Loads dir expecting st and a message naming each of the (up to two) culprits. */
static void expect_hf_fail(const char *dir, flx_status_t st, const char *name1, const char *name2)
{
    flx_model_t *m = (flx_model_t *)(uintptr_t)0x1;
    CHECK_ST(flx_model_load_hf(dir, &m), st);
    CHECK(m == (flx_model_t *)(uintptr_t)0x1); /* out-param untouched on failure */
    CHECK_MSG(name1);
    if (name2) CHECK_MSG(name2);
    fprintf(stderr, "refused as expected: %s\n", flx_error_msg());
}

static void edit_config(const char *dir, const char *field, cJSON *value /* NULL deletes */)
{
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *txt = read_all(p);
    cJSON *j = cJSON_Parse(txt);
    CHECK(j);
    if (value && !cJSON_ReplaceItemInObjectCaseSensitive(j, field, value)) CHECK(cJSON_AddItemToObject(j, field, value));
    else if (!value) cJSON_DeleteItemFromObjectCaseSensitive(j, field);
    char *out = cJSON_Print(j);
    write_all(p, out, strlen(out));
    free(out);
    cJSON_Delete(j);
    free(txt);
}

/* The model's name comes from its files: valid UTF-8 whatever they hold (a byte that starts no
 * character becomes U+FFFD), and cut at a character boundary where it is longer than the field;
 * the node's default model id is this name, and proto strings must be UTF-8. */
static void test_hf_names(void)
{
    static const struct { const char *in, *want; } cases[] = {
        {"org/SmolLM2-135M", "SmolLM2-135M"},
        {"org/bad\xff\xfename", "bad\xef\xbf\xbd\xef\xbf\xbdname"},
        /* 13 bytes a word: 62 bytes fit, the next 2-byte character would end past the 63 kept */
        {"org/Модель-Модель-Модель-Модель-Модель-Модель-", NULL},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        char dn[32];
        snprintf(dn, sizeof dn, "names%zu", i);
        char *d = subdir(dn);
        gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
        edit_config(d, "_name_or_path", cJSON_CreateString(cases[i].in));
        flx_model_t *m;
        CHECK_OK(flx_model_load_hf(d, &m));
        const char *name = m->cfg.name;
        char fixed[256];
        CHECK(flx_utf8_repair(name, strlen(name), fixed, sizeof fixed) == strlen(name) && !strcmp(fixed, name));
        if (cases[i].want) {
            CHECK(!strcmp(name, cases[i].want));
        } else {   /* cut: a prefix of the original, whole characters only, within the field */
            const char *orig = strchr(cases[i].in, '/') + 1;
            CHECK(strlen(name) == 62);
            CHECK(!strncmp(name, orig, strlen(name)) && strlen(orig) > strlen(name));
        }
        fprintf(stderr, "model name '%s' -> '%s'\n", cases[i].in, name);
        flx_model_destroy(m);
    }
}

static void test_hf_refusals(void)
{
    char p[600];
    /* Truncated shard: the reader sees data offsets past the end. */
    char *d = subdir("trunc");
    gen_small(d, FLX_ARCH_LLAMA, 3, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", d);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size - 100) == 0);
    expect_hf_fail(d, FLX_ERR_FORMAT, "model-00002-of-00003.safetensors", NULL);

    /* The index names a shard that does not exist. */
    d = subdir("missing_shard");
    gen_small(d, FLX_ARCH_QWEN2, 3, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    char *txt = read_all(p), *at = strstr(txt, "model-00003-of-00003");
    CHECK(at);
    memcpy(at, "model-00007-of-00003", 20);
    write_all(p, txt, strlen(txt));
    free(txt);
    expect_hf_fail(d, FLX_ERR_NOT_FOUND, "model-00007-of-00003.safetensors", "model.safetensors.index.json");

    /* An index entry that escapes the checkpoint directory. */
    d = subdir("escape");
    gen_small(d, FLX_ARCH_LLAMA, 3, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    txt = read_all(p);
    at = strstr(txt, "\"model-00001-of-00003.safetensors\"");
    CHECK(at);
    memcpy(at, "\"../../../../etc/passwd0000000000\"", 34);
    write_all(p, txt, strlen(txt));
    free(txt);
    expect_hf_fail(d, FLX_ERR_FORMAT, "../../../../etc/passwd", NULL);

    /* config.json without num_attention_heads. */
    d = subdir("no_heads");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    edit_config(d, "num_attention_heads", NULL);
    expect_hf_fail(d, FLX_ERR_NOT_FOUND, "num_attention_heads", "config.json");

    /* An unsupported model type. */
    d = subdir("mistral");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    edit_config(d, "model_type", cJSON_CreateString("mistral"));
    expect_hf_fail(d, FLX_ERR_UNSUPPORTED, "mistral", NULL);

    /* Llama with attention biases, and a non-SwiGLU activation: refused, not silently ignored. */
    d = subdir("attn_bias");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    edit_config(d, "attention_bias", cJSON_CreateTrue());
    expect_hf_fail(d, FLX_ERR_UNSUPPORTED, "attention_bias", NULL);
    d = subdir("gelu");
    gen_small(d, FLX_ARCH_QWEN2, 1, FLX_DT_BF16);
    edit_config(d, "hidden_act", cJSON_CreateString("gelu"));
    expect_hf_fail(d, FLX_ERR_UNSUPPORTED, "hidden_act", "gelu");

    /* Qwen2's sliding window (this runtime attends to every token) and a rope factor past a float. */
    d = subdir("sliding");
    gen_small(d, FLX_ARCH_QWEN2, 1, FLX_DT_BF16);
    edit_config(d, "use_sliding_window", cJSON_CreateTrue());
    expect_hf_fail(d, FLX_ERR_UNSUPPORTED, "use_sliding_window", NULL);
    d = subdir("rope_inf");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "rope_type", "llama3");
    cJSON_AddNumberToObject(rs, "factor", 1e39);
    cJSON_AddNumberToObject(rs, "low_freq_factor", 1);
    cJSON_AddNumberToObject(rs, "high_freq_factor", 4);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    edit_config(d, "rope_scaling", rs);
    expect_hf_fail(d, FLX_ERR_FORMAT, "'factor' is 1e+39", "beyond the range of a float");

    /* A config whose ffn disagrees with the tensors: the first mis-shaped tensor is named. */
    d = subdir("bad_shape");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_F16);
    edit_config(d, "intermediate_size", cJSON_CreateNumber(48));
    expect_hf_fail(d, FLX_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight", "[32, 64], expected [48, 64]");

    /* Issue 14: an index naming a tensor twice (which copy a reader keeps would decide the weights),
     * a context above what the engine sizes workspaces for, a config.json above its 1 MiB cap. */
    d = subdir("dup_index");
    gen_small(d, FLX_ARCH_LLAMA, 3, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    txt = read_all(p);
    cJSON *idx = cJSON_Parse(txt);
    free(txt);
    CHECK(cJSON_AddStringToObject(cJSON_GetObjectItem(idx, "weight_map"), "model.norm.weight",
                                  "model-00001-of-00003.safetensors"));
    txt = cJSON_Print(idx);
    write_all(p, txt, strlen(txt));
    free(txt);
    cJSON_Delete(idx);
    expect_hf_fail(d, FLX_ERR_FORMAT, "weight_map names tensor 'model.norm.weight' twice", NULL);
    d = subdir("long_ctx");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    edit_config(d, "max_position_embeddings", cJSON_CreateNumber(16777217));
    expect_hf_fail(d, FLX_ERR_UNSUPPORTED, "max_ctx 16777217", "config.json");
    d = subdir("big_config");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    char *pad = malloc((1u << 20) + 1);
    CHECK(pad);
    memset(pad, 'x', 1u << 20);
    pad[1u << 20] = 0;
    edit_config(d, "_name_or_path", cJSON_CreateString(pad));
    free(pad);
    expect_hf_fail(d, FLX_ERR_FORMAT, "config.json", "above the 1048576");

    /* A tensor of the wrong dtype (I16 in place of a bf16 matrix) and a missing tensor. */
    d = subdir("bad_dtype");
    char *src = subdir("bad_dtype_src");
    gen_small(src, FLX_ARCH_QWEN2, 1, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    flx_st_reader_h r;
    CHECK_OK(flx_st_open(p, &r));
    flx_st_writer_h w, w2;
    CHECK_OK(flx_st_writer_create(&w));
    CHECK_OK(flx_st_writer_create(&w2));
    for (size_t i = 0; i < flx_st_count(r); i++) {
        const flx_st_tensor_t *t = flx_st_at(r, i);
        int is_wv = !strcmp(t->name, "model.layers.1.self_attn.v_proj.weight");
        CHECK_OK(flx_st_writer_add(w, t->name, is_wv ? FLX_DT_I16 : t->dtype, t->n_dims, t->shape, t->data));
        if (strcmp(t->name, "model.layers.0.self_attn.k_proj.bias") != 0)
            CHECK_OK(flx_st_writer_add(w2, t->name, t->dtype, t->n_dims, t->shape, t->data));
    }
    flx_st_close(r);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_OK(flx_st_writer_save(w, p));
    flx_st_writer_destroy(w);
    snprintf(p, sizeof p, "cp %s/config.json %s/", src, d);
    CHECK(system(p) == 0);
    expect_hf_fail(d, FLX_ERR_FORMAT, "model.layers.1.self_attn.v_proj.weight", "I16");
    d = subdir("missing_tensor");
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_OK(flx_st_writer_save(w2, p));
    flx_st_writer_destroy(w2);
    snprintf(p, sizeof p, "cp %s/config.json %s/", src, d);
    CHECK(system(p) == 0);
    expect_hf_fail(d, FLX_ERR_NOT_FOUND, "model.layers.0.self_attn.k_proj.bias", NULL);

    /* No weights at all; a path that is neither a directory nor a gguf file. */
    d = subdir("empty");
    gen_small(d, FLX_ARCH_LLAMA, 1, FLX_DT_BF16);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK(unlink(p) == 0);
    expect_hf_fail(d, FLX_ERR_NOT_FOUND, "model.safetensors", NULL);
    flx_model_t *m;
    snprintf(p, sizeof p, "%s/config.json", d);
    CHECK_ST(flx_model_load(p, &m), FLX_ERR_UNSUPPORTED);
    CHECK_MSG("config.json");
    snprintf(p, sizeof p, "%s/nonexistent", d);
    CHECK_ST(flx_model_load(p, &m), FLX_ERR_NOT_FOUND);
}

/* ---------------------------------------------------------------------------------------------
 * GGUF files built byte by byte
 * ------------------------------------------------------------------------------------------- */

/* Reference dequantization of one row of n values (the ggml scalar formulas, written out again). */
static void ref_dequant(uint32_t type, const uint8_t *p, size_t n, float *x)
{
    uint16_t d16, m16;
    switch (type) {
    case FLX_GGML_F32:
        memcpy(x, p, 4 * n);
        return;
    case FLX_GGML_F16:
    case FLX_GGML_BF16:
        for (size_t i = 0; i < n; i++) {
            memcpy(&d16, p + 2 * i, 2);
            x[i] = type == FLX_GGML_F16 ? flx_f16_to_f32(d16) : flx_bf16_to_f32(d16);
        }
        return;
    default:
        break;
    }
    for (size_t b = 0; b < n / 32; b++) {
        switch (type) {
        case FLX_GGML_Q8_0:
            memcpy(&d16, p + 34 * b, 2);
            for (int i = 0; i < 32; i++) x[32 * b + i] = flx_f16_to_f32(d16) * (int8_t)p[34 * b + 2 + i];
            break;
        case FLX_GGML_Q4_0:
            memcpy(&d16, p + 18 * b, 2);
            for (int i = 0; i < 32; i++) {
                uint8_t q = p[18 * b + 2 + i % 16];
                int v = i < 16 ? (q & 0xf) : (q >> 4);
                x[32 * b + i] = flx_f16_to_f32(d16) * (float)(v - 8);
            }
            break;
        case FLX_GGML_Q4_1:
            memcpy(&d16, p + 20 * b, 2), memcpy(&m16, p + 20 * b + 2, 2);
            for (int i = 0; i < 32; i++) {
                uint8_t q = p[20 * b + 4 + i % 16];
                int v = i < 16 ? (q & 0xf) : (q >> 4);
                x[32 * b + i] = flx_f16_to_f32(d16) * (float)v + flx_f16_to_f32(m16);
            }
            break;
        default: CHECK(0);
        }
    }
}

/* Random bytes of a type, with sane f16 scales so values stay finite and O(0.1). */
static uint8_t *rand_data(flx_rng_t *rng, uint32_t type, size_t n)
{
    size_t nb = type_bytes(type, n);
    uint8_t *p = malloc(nb);
    CHECK(p);
    for (size_t i = 0; i < nb; i++) p[i] = (uint8_t)flx_rng_u64(rng);
    for (size_t i = 0; i < n; i++) {
        float v = (float)(flx_rng_normal(rng) * 0.1);
        uint16_t h;
        if (type == FLX_GGML_F32) memcpy(p + 4 * i, &v, 4);
        if (type == FLX_GGML_F16) h = flx_f32_to_f16(v), memcpy(p + 2 * i, &h, 2);
        if (type == FLX_GGML_BF16) h = flx_f32_to_bf16(v), memcpy(p + 2 * i, &h, 2);
    }
    size_t bsz = type == FLX_GGML_Q8_0 ? 34 : type == FLX_GGML_Q4_0 ? 18 : type == FLX_GGML_Q4_1 ? 20 : 0;
    for (size_t b = 0; bsz && b < n / 32; b++) {
        uint16_t d = flx_f32_to_f16((float)(0.002 + 0.02 * flx_rng_uniform(rng)));
        uint16_t m = flx_f32_to_f16((float)(0.2 * flx_rng_uniform(rng) - 0.1));
        memcpy(p + b * bsz, &d, 2);
        if (type == FLX_GGML_Q4_1) memcpy(p + b * bsz + 2, &m, 2);
    }
    return p;
}

/* The tiny shape used by every GGUF test. */
enum { G_H = 64, G_HEADS = 2, G_KV = 1, G_HD = 32, G_FFN = 64, G_V = 40, G_CTX = 320 };

typedef struct {
    uint32_t type;
    const char *name;
    uint32_t rows, cols;      /* HF (out, in); GGUF ne = [cols, rows] */
    int permuted;             /* llama Q/K: heads of G_HD rows */
    uint8_t *data;            /* GGUF bytes */
} gt_t;

/* HF row r of a permuted matrix lives in GGUF row h*hd + 2j + t, where r = h*hd + t*hd/2 + j: the
 * effect of convert_hf_to_gguf.py's reshape(n_head, 2, hd/2, in).swapaxes(1, 2). */
static uint32_t gguf_row_of_hf_row(uint32_t r, uint32_t hd)
{
    uint32_t h = r / hd, i = r % hd, t = i / (hd / 2), j = i % (hd / 2);
    return h * hd + 2 * j + t;
}

/* The format a GGUF matrix of this type is kept in (flx/model_load.h). */
static flx_wfmt_t fmt_of(uint32_t type)
{
    return type == FLX_GGML_Q4_0 || type == FLX_GGML_Q4_1 ? FLX_WFMT_Q4 : type == FLX_GGML_Q8_0 ? FLX_WFMT_Q8 : FLX_WFMT_BF16;
}

static void check_mat(const gt_t *t, const flx_wmat_t *got, int permute)
{
    const size_t rb = type_bytes(t->type, t->cols);
    float *ref = malloc((size_t)t->rows * t->cols * 4), *x = malloc((size_t)t->rows * t->cols * 4);
    CHECK(ref && x && got->p);
    CHECK(got->fmt == fmt_of(t->type));
    for (uint32_t r = 0; r < t->rows; r++) {
        uint32_t g = permute ? gguf_row_of_hf_row(r, G_HD) : r;
        ref_dequant(t->type, t->data + (size_t)g * rb, t->cols, ref + (size_t)r * t->cols);
        flx_wmat_row_f32(got, t->cols, r, 0, t->cols, x + (size_t)r * t->cols);
    }
    char label[96];
    snprintf(label, sizeof label, "gguf %s (%s%s)", t->name, flx_ggml_type_name(t->type), permute ? ", un-permuted" : "");
    /* bf16 keeps 8 significant bits: rounding to nearest errs by at most 2^-8 relative. */
    CHECK_CLOSE(label, x, ref, (size_t)t->rows * t->cols, 1e-30, 1.0 / 256);
    free(ref);
    free(x);
}

static void check_vec(const float *got, const uint8_t *data, uint32_t type, uint32_t n)
{
    float ref[1024];
    CHECK(got && n <= 1024);
    ref_dequant(type, data, n, ref);
    CHECK(memcmp(got, ref, 4 * n) == 0);
}

typedef struct {
    gguf_b_t g;
    gt_t mats[16];
    int n_mats;
    uint8_t *vecs[16];
    uint32_t vec_type[16], vec_len[16];
    const char *vec_name[16];
    int n_vecs;
} gmodel_t;

static void gm_mat(gmodel_t *gm, flx_rng_t *rng, const char *name, uint32_t type, uint32_t rows, uint32_t cols,
                   int permuted)
{
    gt_t *t = &gm->mats[gm->n_mats++];
    *t = (gt_t){type, name, rows, cols, permuted, rand_data(rng, type, (size_t)rows * cols)};
    add_t(&gm->g, name, type, 2, cols, rows, t->data);
}

static void gm_vec(gmodel_t *gm, flx_rng_t *rng, const char *name, uint32_t type, uint32_t n)
{
    int i = gm->n_vecs++;
    gm->vecs[i] = rand_data(rng, type, n), gm->vec_type[i] = type, gm->vec_len[i] = n, gm->vec_name[i] = name;
    add_t(&gm->g, name, type, 1, n, 1, gm->vecs[i]);
}

static void gm_free(gmodel_t *gm)
{
    for (int i = 0; i < gm->n_mats; i++) free(gm->mats[i].data);
    for (int i = 0; i < gm->n_vecs; i++) free(gm->vecs[i]);
    gguf_free(&gm->g);
}

/* A one-layer model of the given arch; skip names a tensor to leave out (or NULL). */
static void gm_build(gmodel_t *gm, flx_rng_t *rng, const char *arch, int tied, const char *skip)
{
    memset(gm, 0, sizeof *gm);
    gguf_b_t *g = &gm->g;
    char k[96];
    int llama = !strcmp(arch, "llama");
    kv_str(g, "general.architecture", arch);
    kv_str(g, "general.name", llama ? "tiny llama" : "tiny qwen2");
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    kv_u32(g, AK("block_count"), 1);
    kv_u32(g, AK("context_length"), G_CTX);
    kv_u32(g, AK("embedding_length"), G_H);
    kv_u32(g, AK("feed_forward_length"), G_FFN);
    kv_u32(g, AK("attention.head_count"), G_HEADS);
    kv_u32(g, AK("attention.head_count_kv"), G_KV);
    kv_f32(g, AK("attention.layer_norm_rms_epsilon"), 1e-6f);
    kv_f32(g, AK("rope.freq_base"), 1e6f);
    if (llama) {
        /* vocab from the tokens array (no llama.vocab_size), as many real files do */
        put_str(&g->kv, "tokenizer.ggml.tokens"), put_u32(&g->kv, FLX_GGUF_ARRAY), put_u32(&g->kv, FLX_GGUF_STRING);
        put_u64(&g->kv, G_V);
        for (int i = 0; i < G_V; i++) {
            char tok[16];
            snprintf(tok, sizeof tok, "tok%d", i);
            put_str(&g->kv, tok);
        }
        g->n_kv++;
    } else {
        kv_u32(g, AK("vocab_size"), G_V);
    }
#undef AK
    const uint32_t qd = G_HEADS * G_HD, kvd = G_KV * G_HD;
    struct { const char *n; uint32_t type, rows, cols; int perm; } mats[] = {
        {"token_embd.weight", FLX_GGML_Q8_0, G_V, G_H, 0},
        {"output.weight", FLX_GGML_F16, G_V, G_H, 0},
        {"blk.0.attn_q.weight", llama ? FLX_GGML_F32 : FLX_GGML_Q4_0, qd, G_H, llama},
        {"blk.0.attn_k.weight", FLX_GGML_Q4_1, kvd, G_H, llama},
        {"blk.0.attn_v.weight", FLX_GGML_F32, kvd, G_H, 0},
        {"blk.0.attn_output.weight", FLX_GGML_BF16, G_H, qd, 0},
        {"blk.0.ffn_gate.weight", FLX_GGML_Q8_0, G_FFN, G_H, 0},
        {"blk.0.ffn_up.weight", FLX_GGML_Q4_1, G_FFN, G_H, 0},
        {"blk.0.ffn_down.weight", FLX_GGML_Q4_0, G_H, G_FFN, 0},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(mats); i++) {
        if ((tied && i == 1) || (skip && !strcmp(skip, mats[i].n))) continue;
        gm_mat(gm, rng, mats[i].n, mats[i].type, mats[i].rows, mats[i].cols, mats[i].perm);
    }
    struct { const char *n; uint32_t type, len; } vecs[] = {
        {"output_norm.weight", FLX_GGML_F32, G_H},  {"blk.0.attn_norm.weight", FLX_GGML_F32, G_H},
        {"blk.0.ffn_norm.weight", FLX_GGML_F16, G_H}, {"blk.0.attn_q.bias", FLX_GGML_F32, qd},
        {"blk.0.attn_k.bias", FLX_GGML_F32, kvd},   {"blk.0.attn_v.bias", FLX_GGML_F16, kvd},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(vecs); i++) {
        if ((llama && i >= 3) || (skip && !strcmp(skip, vecs[i].n))) continue;
        gm_vec(gm, rng, vecs[i].n, vecs[i].type, vecs[i].len);
    }
}

static const gt_t *gm_find(const gmodel_t *gm, const char *name)
{
    for (int i = 0; i < gm->n_mats; i++)
        if (!strcmp(gm->mats[i].name, name)) return &gm->mats[i];
    CHECK(0);
    return NULL;
}

static const float *vec_of(const flx_model_t *m, const char *name)
{
    if (!strcmp(name, "output_norm.weight")) return m->out_norm;
    if (!strcmp(name, "blk.0.attn_norm.weight")) return m->layers[0].attn_norm;
    if (!strcmp(name, "blk.0.ffn_norm.weight")) return m->layers[0].ffn_norm;
    if (!strcmp(name, "blk.0.attn_q.bias")) return m->layers[0].bq;
    if (!strcmp(name, "blk.0.attn_k.bias")) return m->layers[0].bk;
    if (!strcmp(name, "blk.0.attn_v.bias")) return m->layers[0].bv;
    CHECK(0);
    return NULL;
}

/* Every matrix of a and b holds the same values (whatever their formats); returns how many of a's
 * are stored in a block format. */
static int same_values(const flx_model_t *a, const flx_model_t *b)
{
    const flx_model_config_t *c = &a->cfg;
    const size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t F = c->ffn;
    const flx_wmat_t *x[9], *y[9];
    size_t rows[9], cols[9];
    int n = 0, blocks = 0;
#define M(f, r, k) (x[n] = &a->f, y[n] = &b->f, rows[n] = (r), cols[n] = (k), n++)
    M(tok_embd, c->vocab, H);
    M(lm_head, c->vocab, H);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        n = 2;
        M(layers[l].wq, qd, H);
        M(layers[l].wk, kvd, H);
        M(layers[l].wv, kvd, H);
        M(layers[l].wo, H, qd);
        M(layers[l].w_gate, F, H);
        M(layers[l].w_up, F, H);
        M(layers[l].w_down, H, F);
        for (int i = l ? 2 : 0; i < n; i++) {
            flx_bf16_t *ra = malloc(cols[i] * 2), *rb = malloc(cols[i] * 2);
            for (size_t r = 0; r < rows[i]; r++) {
                flx_wmat_row_bf16(x[i], cols[i], r, 0, cols[i], ra);
                flx_wmat_row_bf16(y[i], cols[i], r, 0, cols[i], rb);
                CHECK(!memcmp(ra, rb, cols[i] * 2));
            }
            blocks += x[i]->fmt != FLX_WFMT_BF16;
            free(ra), free(rb);
        }
    }
#undef M
    return blocks;
}

/* Teacher-forced logits of a prompt of n tokens (n > 4 takes the GEMM path) on a pool of 2. */
static float *prompt_logits(const flx_model_t *m, const int32_t *tok, uint32_t n, flx_pool_h pool)
{
    flx_fwd_shape_t sh = {.max_prompt = n, .max_batch = 1, .pool = pool};
    size_t bytes;
    CHECK_OK(flx_fwd_plan(m, &sh, &bytes));
    void *mem = flx_aligned_alloc(64, bytes);
    float *lg = malloc((size_t)n * m->cfg.vocab * 4);
    flx_fwd_ws_t *ws;
    CHECK(mem && lg);
    CHECK_OK(flx_fwd_ws_init(m, &sh, mem, bytes, &ws));
    flx_prefill_args_t a = {.tokens = tok, .n_tokens = n, .logits_all = lg};
    CHECK_OK(flx_model_prefill(m, ws, &a));
    flx_aligned_free(mem);
    return lg;
}

/* A quantized GGUF loaded with its blocks kept (FLX_WFMT_Q4 / Q8) and loaded as bf16: the same
 * values in every matrix, and the same logits bit for bit, at every kernel level, through the GEMV
 * (3 tokens) and the GEMM (40). */
static void check_compact_vs_bf16(const char *path, int expect_blocks)
{
    flx_model_t *q, *b;
    CHECK_OK(flx_model_load_gguf_as(path, NULL, FLX_WEIGHTS_COMPACT, &q));
    CHECK_OK(flx_model_load_gguf_as(path, NULL, FLX_WEIGHTS_BF16, &b));
    CHECK(same_values(b, q) == 0);
    const int blocks = same_values(q, b);
    CHECK(expect_blocks ? blocks > 0 : blocks == 0);
    CHECK(flx_model_weight_bytes(q) <= flx_model_weight_bytes(b));
    flx_pool_h pool = flx_test_pool(2);
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)((i * 7919u + 13) % q->cfg.vocab);
    static const flx_isa_t isas[] = {FLX_ISA_SCALAR, FLX_ISA_AVX2, FLX_ISA_AVX512};
    for (size_t li = 0; li < FLX_ARRAY_SIZE(isas); li++) {
        flx_isa_force(isas[li]);
        if (flx_isa_active() != isas[li]) continue;
        const uint32_t ns[2] = {3, 40};
        for (int k = 0; k < 2; k++) {
            float *lq = prompt_logits(q, tok, ns[k], pool), *lb = prompt_logits(b, tok, ns[k], pool);
            char label[96];
            snprintf(label, sizeof label, "logits of %u tokens, %d block matrices vs bf16, isa %s", ns[k], blocks,
                     flx_isa_name(isas[li]));
            CHECK_SAME(label, lq, lb, (size_t)ns[k] * q->cfg.vocab);
            free(lq), free(lb);
        }
    }
    flx_isa_force(flx_isa_best());
    fprintf(stderr, "%s: %d matrices kept in block formats (%zu weight bytes a step against %zu as bf16): the same "
            "values and logits as all bf16\n", path, blocks, flx_model_weight_bytes(q), flx_model_weight_bytes(b));
    flx_pool_destroy(pool);
    flx_model_destroy(q);
    flx_model_destroy(b);
}

/* A quantized block whose scale or minimum is not finite is refused, naming the tensor, row and
 * block, whether the blocks are kept or dequantized to bf16. */
static void test_gguf_bad_scales(flx_rng_t *rng)
{
    static const struct { const char *tensor; uint32_t bb, row, block, at; uint16_t f16; } cases[] = {
        {"blk.0.ffn_up.weight", 20, 2, 1, 0, 0x7c00},     /* Q4_1 d = +inf */
        {"blk.0.ffn_up.weight", 20, 0, 0, 2, 0x7e00},     /* Q4_1 m = NaN */
        {"blk.0.ffn_down.weight", 18, 5, 1, 0, 0xfc00},   /* Q4_0 d = -inf */
        {"token_embd.weight", 34, 7, 0, 0, 0x7e01},       /* Q8_0 d = NaN */
    };
    for (size_t c = 0; c < FLX_ARRAY_SIZE(cases); c++) {
        gmodel_t gm;
        gm_build(&gm, rng, "llama", 1, NULL);
        const gt_t *t = gm_find(&gm, cases[c].tensor);
        CHECK(cases[c].block < t->cols / 32 && cases[c].row < t->rows);
        const size_t off = (size_t)cases[c].row * (t->cols / 32) * cases[c].bb + (size_t)cases[c].block * cases[c].bb;
        int hit = 0;
        for (int i = 0; i < gm.g.n_t; i++)   /* the file's copy of the tensor */
            if (!strcmp(gm.g.t[i].name, cases[c].tensor)) {
                memcpy((uint8_t *)gm.g.t[i].data + off + cases[c].at, &cases[c].f16, 2);
                hit = 1;
            }
        CHECK(hit);
        char p[600], want[160];
        snprintf(p, sizeof p, "%s/bad-scale-%zu.gguf", g_tmp, c);
        gguf_save(&gm.g, p, "GGUF", 3);
        snprintf(want, sizeof want, "tensor '%s' row %u block %u", cases[c].tensor, cases[c].row, cases[c].block);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            flx_model_t *m = NULL;
            CHECK(flx_model_load_gguf_as(p, NULL, bf16 ? FLX_WEIGHTS_BF16 : FLX_WEIGHTS_COMPACT, &m) == FLX_ERR_FORMAT && !m);
            CHECK_MSG(want);
            CHECK_MSG("must be finite");
        }
        fprintf(stderr, "refused as expected: %s\n", flx_error_msg());
        gm_free(&gm);
    }
}

static void test_gguf_models(flx_rng_t *rng)
{
    static const struct { const char *arch; int tied; } cases[] = {{"llama", 0}, {"llama", 1}, {"qwen2", 1}, {"qwen2", 0}};
    for (size_t c = 0; c < FLX_ARRAY_SIZE(cases); c++) {
        gmodel_t gm;
        int llama = !strcmp(cases[c].arch, "llama");
        gm_build(&gm, rng, cases[c].arch, cases[c].tied, NULL);
        char p[600];
        snprintf(p, sizeof p, "%s/%s-%d.gguf", g_tmp, cases[c].arch, cases[c].tied);
        gguf_save(&gm.g, p, "GGUF", c == 3 ? 2 : 3);
        flx_model_t *m;
        CHECK_OK(flx_model_load(p, &m)); /* dispatch by extension */
        const flx_model_config_t *cfg = &m->cfg;
        CHECK(cfg->arch == (llama ? FLX_ARCH_LLAMA : FLX_ARCH_QWEN2) && cfg->qkv_bias == !llama);
        CHECK(cfg->n_layers == 1 && cfg->hidden == G_H && cfg->n_heads == G_HEADS && cfg->n_kv_heads == G_KV);
        CHECK(cfg->head_dim == G_HD && cfg->ffn == G_FFN && cfg->vocab == G_V && cfg->max_ctx == G_CTX);
        CHECK(cfg->rms_eps == 1e-6f && cfg->rope_theta == 1e6f && cfg->rope_scaling == FLX_ROPE_NONE);
        CHECK(cfg->tied_embeddings == cases[c].tied);
        CHECK(!strcmp(cfg->name, llama ? "tiny llama" : "tiny qwen2"));
        const flx_layer_weights_t *w = &m->layers[0];
        check_mat(gm_find(&gm, "token_embd.weight"), &m->tok_embd, 0);
        if (cases[c].tied) CHECK(m->lm_head.p == m->tok_embd.p);
        else check_mat(gm_find(&gm, "output.weight"), &m->lm_head, 0);
        check_mat(gm_find(&gm, "blk.0.attn_q.weight"), &w->wq, llama);
        check_mat(gm_find(&gm, "blk.0.attn_k.weight"), &w->wk, llama);
        check_mat(gm_find(&gm, "blk.0.attn_v.weight"), &w->wv, 0);
        check_mat(gm_find(&gm, "blk.0.attn_output.weight"), &w->wo, 0);
        check_mat(gm_find(&gm, "blk.0.ffn_gate.weight"), &w->w_gate, 0);
        check_mat(gm_find(&gm, "blk.0.ffn_up.weight"), &w->w_up, 0);
        check_mat(gm_find(&gm, "blk.0.ffn_down.weight"), &w->w_down, 0);
        for (int i = 0; i < gm.n_vecs; i++) check_vec(vec_of(m, gm.vec_name[i]), gm.vecs[i], gm.vec_type[i], gm.vec_len[i]);
        if (llama) CHECK(!w->bq && !w->bk && !w->bv);
        if (llama) {
            /* The un-permute on its own, element by element: an F32 attn_q is exact in bf16 only up
             * to rounding, so compare with the bf16 of the GGUF value at the permuted row. */
            const gt_t *q = gm_find(&gm, "blk.0.attn_q.weight");
            for (uint32_t h = 0; h < G_HEADS; h++)
                for (uint32_t t = 0; t < 2; t++)
                    for (uint32_t j = 0; j < G_HD / 2; j++) {
                        uint32_t hf = h * G_HD + t * (G_HD / 2) + j, gg = h * G_HD + 2 * j + t;
                        float v;
                        memcpy(&v, q->data + ((size_t)gg * G_H + 5) * 4, 4);
                        flx_bf16_t got;
                        flx_wmat_row_bf16(&w->wq, G_H, hf, 5, 1, &got);
                        CHECK(got == flx_f32_to_bf16(v));
                    }
        }
        if (c == 0) {
            /* Dispatch by magic when the name does not say .gguf. */
            snprintf(p, sizeof p, "%s/weights.bin", g_tmp);
            gguf_save(&gm.g, p, "GGUF", 3);
            flx_model_t *m2;
            CHECK_OK(flx_model_load(p, &m2));
            CHECK(m2->cfg.n_layers == 1 && m2->layers[0].wq.fmt == m->layers[0].wq.fmt &&
                  !memcmp(m2->layers[0].wq.p, m->layers[0].wq.p,
                          (size_t)G_HEADS * G_HD * flx_wmat_row_bytes(m->layers[0].wq.fmt, G_H)));
            flx_model_destroy(m2);
        }
        check_compact_vs_bf16(p, 1);
        fprintf(stderr, "gguf %s %s v%d: config and every tensor match\n", cases[c].arch,
                cases[c].tied ? "tied" : "untied", c == 3 ? 2 : 3);
        flx_model_destroy(m);
        gm_free(&gm);
    }
}

/* Llama 3.1 files carry rope_freqs.weight: per-frequency divisors computed by convert_hf_to_gguf.py
 * from config.json's llama3 rope_scaling; written here the way the converter computes them. */
static void test_gguf_rope_freqs(flx_rng_t *rng)
{
    const double base = 1e6, factor = 8, low = 1, high = 4, old_ctx = 8192;
    float rf[G_HD / 2];
    for (int i = 0; i < G_HD / 2; i++) {
        double freq = 1.0 / pow(base, (2.0 * i) / G_HD), wl = 2 * M_PI / freq;
        if (wl < old_ctx / high) rf[i] = 1;
        else if (wl > old_ctx / low) rf[i] = (float)factor;
        else {
            double smooth = (old_ctx / wl - low) / (high - low);
            rf[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    char p[600];
    snprintf(p, sizeof p, "%s/rope_freqs.gguf", g_tmp);
    gmodel_t gm;
    gm_build(&gm, rng, "llama", 1, NULL);
    add_t(&gm.g, "rope_freqs.weight", FLX_GGML_F32, 1, G_HD / 2, 1, rf);
    gguf_save(&gm.g, p, "GGUF", 3);
    flx_model_t *m;
    CHECK_OK(flx_model_load_gguf(p, &m));
    CHECK(m->cfg.rope_scaling == FLX_ROPE_LLAMA3 && m->cfg.rope_factor == 8 && m->cfg.rope_orig_ctx == 8192);
    CHECK(m->cfg.rope_low_freq_factor == 1 && m->cfg.rope_high_freq_factor == 4);
    flx_model_destroy(m);
    gm_free(&gm);
    /* Divisors that no llama3 parameters produce (a low_freq_factor of 2, say) are refused. */
    rf[0] = 2;
    gm_build(&gm, rng, "llama", 1, NULL);
    add_t(&gm.g, "rope_freqs.weight", FLX_GGML_F32, 1, G_HD / 2, 1, rf);
    gguf_save(&gm.g, p, "GGUF", 3);
    CHECK_ST(flx_model_load_gguf(p, &m), FLX_ERR_UNSUPPORTED);
    CHECK_MSG("rope_freqs.weight");
    gm_free(&gm);

    /* Issue 14: head_dim (attention.key_length) is checked before rope_freqs.weight, whose head_dim/2
     * divisors are copied into arrays of FLX_MODEL_MAX_HEAD_DIM/2: a key_length of 512 overflowed
     * them (the committed bad input 01), one of 8192 crashed a release build. */
    CHECK_ST(flx_model_load(FLX_TEST_DATA "/bad-inputs/01-gguf-rope-freqs-stack-overflow.gguf", &m),
             FLX_ERR_UNSUPPORTED);
    CHECK_MSG("key 'llama.attention.key_length' = 512");
    static float big[4096];
    for (int i = 0; i < 4096; i++) big[i] = 8;
    gm_build(&gm, rng, "llama", 1, NULL);
    kv_u32(&gm.g, "llama.attention.key_length", 8192);
    kv_u32(&gm.g, "llama.attention.value_length", 8192);
    kv_u32(&gm.g, "llama.rope.dimension_count", 8192);
    add_t(&gm.g, "rope_freqs.weight", FLX_GGML_F32, 1, 4096, 1, big);
    gguf_save(&gm.g, p, "GGUF", 3);
    CHECK_ST(flx_model_load(p, &m), FLX_ERR_UNSUPPORTED);
    CHECK_MSG("key 'llama.attention.key_length' = 8192");
    gm_free(&gm);
    /* A key given twice is refused (lookups would otherwise depend on which copy they find). */
    gm_build(&gm, rng, "llama", 1, NULL);
    kv_u32(&gm.g, "llama.attention.head_count", 1);
    gguf_save(&gm.g, p, "GGUF", 3);
    CHECK_ST(flx_model_load(p, &m), FLX_ERR_FORMAT);
    CHECK_MSG("key 'llama.attention.head_count' appears twice");
    gm_free(&gm);
    fprintf(stderr, "gguf rope_freqs: llama3 scaling recognised, a mismatch refused, head_dim checked first\n");
}

/* Loads a GGUF model expecting st and a message naming the culprits. */
static void expect_gguf_fail(const char *path, flx_status_t st, const char *name1, const char *name2)
{
    flx_model_t *m = (flx_model_t *)(uintptr_t)0x1;
    CHECK_ST(flx_model_load_gguf(path, &m), st);
    CHECK(m == (flx_model_t *)(uintptr_t)0x1);
    CHECK_MSG(name1);
    if (name2) CHECK_MSG(name2);
    fprintf(stderr, "refused as expected: %s\n", flx_error_msg());
}

static void test_gguf_refusals(flx_rng_t *rng)
{
    char p[600];
    gmodel_t gm;
    snprintf(p, sizeof p, "%s/bad.gguf", g_tmp);

    gm_build(&gm, rng, "llama", 0, NULL);
    gguf_save(&gm.g, p, "GGUX", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "magic", "bad.gguf");
    gguf_save(&gm.g, p, "GGUF", 1);
    expect_gguf_fail(p, FLX_ERR_UNSUPPORTED, "version 1", NULL);
    gguf_save(&gm.g, p, "GGUF", 0x03000000); /* a big-endian file */
    expect_gguf_fail(p, FLX_ERR_FORMAT, "big-endian", NULL);

    /* Truncation anywhere in the header or the data is refused. */
    gguf_save(&gm.g, p, "GGUF", 3);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    const off_t cuts[] = {30, 200, 700, sb.st_size - 1};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cuts); i++) {
        gguf_save(&gm.g, p, "GGUF", 3);
        CHECK(truncate(p, cuts[i]) == 0);
        expect_gguf_fail(p, FLX_ERR_FORMAT, "bad.gguf", NULL);
    }
    /* Every cut inside the header, and random byte corruption of the header: refused or loaded,
     * never a crash or an out-of-bounds read (the sanitizer build runs this). */
    gguf_save(&gm.g, p, "GGUF", 3);
    char *good = read_all(p);
    flx_gguf_h gh;
    CHECK_OK(flx_gguf_open(p, &gh));
    const size_t hdr = flx_gguf_data_offset(gh);
    flx_gguf_close(gh);
    for (size_t cut = 24; cut < hdr; cut += 11) {
        write_all(p, good, cut);
        flx_model_t *m;
        CHECK_ST(flx_model_load_gguf(p, &m), FLX_ERR_FORMAT);
    }
    int n_ok = 0;
    for (int it = 0; it < 300; it++) {
        char *bad = malloc((size_t)sb.st_size);
        CHECK(bad);
        memcpy(bad, good, (size_t)sb.st_size);
        for (int f = 0; f < 3; f++) bad[4 + flx_rng_below(rng, hdr - 4)] ^= (char)(1u << flx_rng_below(rng, 8));
        write_all(p, bad, (size_t)sb.st_size);
        free(bad);
        flx_model_t *m = NULL;
        flx_status_t st = flx_model_load_gguf(p, &m);
        CHECK(st == FLX_OK || (st < 0 && flx_error_msg()[0]));
        n_ok += st == FLX_OK;
        flx_model_destroy(m);
    }
    fprintf(stderr, "gguf header corruption: %d of 300 corrupted files still loaded, the rest refused\n", n_ok);
    free(good);

    /* The last tensor's data runs past the end: named. */
    gguf_save(&gm.g, p, "GGUF", 3);
    CHECK(truncate(p, sb.st_size - 1) == 0);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[gm.g.n_t - 1].name, "past the end");

    /* A tensor offset past the end of the file. */
    gm.g.t[3].force_offset = (int64_t)1 << 40;
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[3].name, "past the end");
    /* Misaligned, and overlapping another tensor. */
    gm.g.t[3].force_offset = 16;
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[3].name, "alignment");
    gm.g.t[3].force_offset = 0;
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[3].name, "overlap");
    gm.g.t[3].force_offset = -1;

    /* An unknown ggml type, and a known one the loader does not dequantize. */
    uint32_t keep = gm.g.t[4].type;
    gm.g.t[4].type = 200;
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[4].name, "unknown ggml type 200");
    gm.g.t[4].type = 4; /* removed from ggml (Q4_2) */
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, gm.g.t[4].name, "unknown ggml type 4");
    gm.g.t[4].type = keep;
    gm_free(&gm);

    /* Q5_0 (22-byte blocks) in place of the F32 attn_v: well-formed, unsupported. */
    gm_build(&gm, rng, "llama", 1, "blk.0.attn_v.weight");
    uint8_t *q5 = rand_data(rng, FLX_GGML_Q5_0, G_KV * G_HD * G_H);
    add_t(&gm.g, "blk.0.attn_v.weight", FLX_GGML_Q5_0, 2, G_H, G_KV * G_HD, q5);
    free(q5);
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_UNSUPPORTED, "blk.0.attn_v.weight", "Q5_0");
    gm_free(&gm);

    /* Wrong dims: attn_q of (kv_dim, hidden) rows instead of (q_dim, hidden). */
    gm_build(&gm, rng, "qwen2", 1, "blk.0.attn_q.weight");
    float *wrong = calloc(G_KV * G_HD * G_H, 4);
    add_t(&gm.g, "blk.0.attn_q.weight", FLX_GGML_F32, 2, G_H, G_KV * G_HD, wrong);
    free(wrong);
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "blk.0.attn_q.weight", "expected [64, 64]");
    gm_free(&gm);

    /* A missing tensor, a missing bias (qwen2), a missing config key, an unsupported architecture. */
    gm_build(&gm, rng, "llama", 1, "blk.0.ffn_up.weight");
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_NOT_FOUND, "blk.0.ffn_up.weight", NULL);
    gm_free(&gm);
    gm_build(&gm, rng, "llama", 1, NULL);
    float bias[G_HEADS * G_HD] = {0};
    add_t(&gm.g, "blk.0.attn_q.bias", FLX_GGML_F32, 1, G_HEADS * G_HD, 1, bias);
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_UNSUPPORTED, "blk.0.attn_q.bias", NULL);
    gm_free(&gm);
    gm_build(&gm, rng, "qwen2", 1, "blk.0.attn_k.bias");
    gguf_save(&gm.g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_NOT_FOUND, "blk.0.attn_k.bias", NULL);
    gm_free(&gm);

    gguf_b_t g = {0};
    kv_str(&g, "general.architecture", "llama");
    kv_u32(&g, "llama.block_count", 1);
    gguf_save(&g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_NOT_FOUND, "llama.embedding_length", NULL);
    gguf_free(&g);
    kv_str(&g, "general.architecture", "gpt2");
    gguf_save(&g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_UNSUPPORTED, "gpt2", NULL);
    gguf_free(&g);
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "general.architecture", "qwen2");
    gguf_save(&g, p, "GGUF", 3);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "general.architecture", "twice");
    gguf_free(&g);

    /* Absurd counts are refused before anything is allocated. */
    buf_t b = {0};
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 1);
    put_str(&b, "tokenizer.ggml.tokens"), put_u32(&b, FLX_GGUF_ARRAY), put_u32(&b, FLX_GGUF_STRING);
    put_u64(&b, UINT64_C(1) << 60);
    write_all(p, b.b, b.n);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "tokenizer.ggml.tokens", "array count");
    b.n = 0;
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 1);
    put_str(&b, "general.name"), put_u32(&b, FLX_GGUF_STRING), put_u64(&b, UINT64_MAX - 3);
    write_all(p, b.b, b.n);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "general.name", "string length");
    b.n = 0;
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, UINT64_C(1) << 50), put_u64(&b, 0);
    write_all(p, b.b, b.n);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "cannot fit", NULL);
    b.n = 0;
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 1);
    put_str(&b, "x.type"), put_u32(&b, 13), put_u32(&b, 0);
    write_all(p, b.b, b.n);
    expect_gguf_fail(p, FLX_ERR_FORMAT, "x.type", "unknown value type");
    free(b.b);
}

/* The reader's metadata API: coercion, arrays of every kind, nested arrays, bools. */
static void test_gguf_metadata(void)
{
    gguf_b_t g = {0};
    buf_t *k = &g.kv;
    put_str(k, "u8"), put_u32(k, FLX_GGUF_U8), put(k, "\xfa", 1), g.n_kv++;
    put_str(k, "i16neg"), put_u32(k, FLX_GGUF_I16), put(k, "\xfe\xff", 2), g.n_kv++;
    put_str(k, "u64big"), put_u32(k, FLX_GGUF_U64), put_u64(k, UINT64_C(1) << 40), g.n_kv++;
    put_str(k, "f64"), put_u32(k, FLX_GGUF_F64), put(k, &(double){2.5}, 8), g.n_kv++;
    put_str(k, "flag"), put_u32(k, FLX_GGUF_BOOL), put(k, "\x01", 1), g.n_kv++;
    put_str(k, "general.alignment"), put_u32(k, FLX_GGUF_U32), put_u32(k, 64), g.n_kv++;
    kv_str(&g, "s", "hello");
    put_str(k, "ints"), put_u32(k, FLX_GGUF_ARRAY), put_u32(k, FLX_GGUF_I32), put_u64(k, 3);
    put_u32(k, 7), put_u32(k, (uint32_t)-9), put_u32(k, 11), g.n_kv++;
    put_str(k, "strs"), put_u32(k, FLX_GGUF_ARRAY), put_u32(k, FLX_GGUF_STRING), put_u64(k, 3);
    put_str(k, "a"), put_str(k, ""), put_str(k, "\xc4\xa0the"), g.n_kv++;
    put_str(k, "nested"), put_u32(k, FLX_GGUF_ARRAY), put_u32(k, FLX_GGUF_ARRAY), put_u64(k, 2);
    put_u32(k, FLX_GGUF_STRING), put_u64(k, 2), put_str(k, "x y"), put_str(k, "z w");
    put_u32(k, FLX_GGUF_F32), put_u64(k, 1), put(k, &(float){0.25f}, 4), g.n_kv++;
    float one[32];
    for (int i = 0; i < 32; i++) one[i] = (float)i;
    add_t(&g, "t", FLX_GGML_F32, 1, 32, 1, one);
    char p[600];
    snprintf(p, sizeof p, "%s/meta.gguf", g_tmp);
    buf_t b = {0};
    /* gguf_save aligns to 32; write with 64 by hand: header, kv, one tensor info, pad to 64, data. */
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, 1), put_u64(&b, g.n_kv), put(&b, g.kv.b, g.kv.n);
    put_str(&b, "t"), put_u32(&b, 1), put_u64(&b, 32), put_u32(&b, FLX_GGML_F32), put_u64(&b, 0);
    static const uint8_t zeros[64];
    put(&b, zeros, FLX_ALIGN_UP(b.n, 64) - b.n);
    size_t data_at = b.n;
    put(&b, one, sizeof one);
    write_all(p, b.b, b.n);
    free(b.b);
    gguf_free(&g);

    flx_gguf_h h;
    CHECK_OK(flx_gguf_open(p, &h));
    CHECK(flx_gguf_version(h) == 3 && flx_gguf_alignment(h) == 64 && flx_gguf_data_offset(h) == data_at);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    int bl;
    const char *s;
    CHECK_OK(flx_gguf_get_u32(h, "u8", &u32));
    CHECK(u32 == 250);
    CHECK_OK(flx_gguf_get_i32(h, "i16neg", &i32));
    CHECK(i32 == -2);
    CHECK_ST(flx_gguf_get_u32(h, "i16neg", &u32), FLX_ERR_FORMAT);
    CHECK_MSG("i16neg");
    CHECK_ST(flx_gguf_get_u32(h, "u64big", &u32), FLX_ERR_FORMAT);
    CHECK_MSG("u64big");
    CHECK_OK(flx_gguf_get_u64(h, "u64big", &u64));
    CHECK(u64 == UINT64_C(1) << 40);
    CHECK_OK(flx_gguf_get_f32(h, "f64", &f));
    CHECK(f == 2.5f);
    CHECK_OK(flx_gguf_get_f32(h, "u8", &f));
    CHECK(f == 250.0f);
    CHECK_OK(flx_gguf_get_bool(h, "flag", &bl));
    CHECK(bl == 1);
    CHECK_ST(flx_gguf_get_bool(h, "u8", &bl), FLX_ERR_FORMAT);
    CHECK_OK(flx_gguf_get_str(h, "s", &s));
    CHECK(!strcmp(s, "hello"));
    CHECK_ST(flx_gguf_get_str(h, "missing.key", &s), FLX_ERR_NOT_FOUND);
    CHECK_MSG("missing.key");
    CHECK_ST(flx_gguf_get_u32(h, "s", &u32), FLX_ERR_FORMAT);
    CHECK_MSG("'s' has type string");
    const flx_gguf_array_t *a;
    int64_t iv;
    CHECK_OK(flx_gguf_get_arr(h, "ints", &a));
    CHECK(a->elem == FLX_GGUF_I32 && a->n == 3);
    CHECK_OK(flx_gguf_arr_int(a, 1, &iv));
    CHECK(iv == -9);
    CHECK_OK(flx_gguf_arr_int(a, 2, &iv));
    CHECK(iv == 11);
    CHECK_ST(flx_gguf_arr_int(a, 3, &iv), FLX_ERR_INVALID);
    const char *sp;
    size_t sl;
    CHECK_OK(flx_gguf_get_arr(h, "strs", &a));
    CHECK(a->elem == FLX_GGUF_STRING && a->n == 3);
    CHECK_OK(flx_gguf_arr_str(a, 1, &sp, &sl));
    CHECK(sl == 0);
    CHECK_OK(flx_gguf_arr_str(a, 2, &sp, &sl));
    CHECK(sl == 5 && !memcmp(sp, "\xc4\xa0the", 5));
    CHECK_ST(flx_gguf_arr_int(a, 0, &iv), FLX_ERR_INVALID);
    CHECK_OK(flx_gguf_get_arr(h, "nested", &a));
    CHECK(a->elem == FLX_GGUF_ARRAY && a->n == 2);
    const flx_gguf_array_t *s0 = flx_gguf_arr_sub(a, 0), *s1 = flx_gguf_arr_sub(a, 1);
    CHECK(s0 && s1 && !flx_gguf_arr_sub(a, 2));
    CHECK_OK(flx_gguf_arr_str(s0, 1, &sp, &sl));
    CHECK(sl == 3 && !memcmp(sp, "z w", 3));
    CHECK_OK(flx_gguf_arr_f32(s1, 0, &f));
    CHECK(f == 0.25f);
    const flx_gguf_tensor_t *t = flx_gguf_find_tensor(h, "t");
    CHECK(t && t->type == FLX_GGML_F32 && t->n_dims == 1 && t->ne[0] == 32 && t->ne[1] == 1 && t->nbytes == 128);
    CHECK(memcmp(t->data, one, sizeof one) == 0);
    CHECK(!flx_gguf_find_tensor(h, "u"));
    flx_gguf_close(h);
    flx_gguf_close(NULL);
}

/* Row r of a GGUF matrix, dequantized by the reference formulas. */
static void gguf_row(const flx_gguf_tensor_t *t, uint64_t r, float *x)
{
    ref_dequant(t->type, (const uint8_t *)t->data + r * (t->nbytes / t->ne[1]), t->ne[0], x);
}

static void check_row(const char *label, const flx_wmat_t *w, size_t row, const float *ref, size_t n)
{
    float x[2048];
    CHECK(n <= 2048);
    flx_wmat_row_f32(w, n, row, 0, n, x);
    CHECK_CLOSE(label, x, ref, n, 1e-30, 1.0 / 256);
}

/* The real SmolLM2-135M-Instruct Q4_1 GGUF from the setup cache. */
static int test_real_model(void)
{
    char path[1024];
    if (!flx_test_model_path("test_model_load --real", path, sizeof path)) return FLX_TEST_SKIP;
    flx_gguf_h g;
    CHECK_OK(flx_gguf_open(path, &g));
    uint32_t ctx;
    CHECK_OK(flx_gguf_get_u32(g, "llama.context_length", &ctx));
    fprintf(stderr, "%s: context length %u (llama.context_length)\n", path, ctx);
    flx_model_t *m;
    uint64_t t0 = flx_now_ns();
    CHECK_OK(flx_model_load(path, &m));
    fprintf(stderr, "loaded in %.2f s\n", (double)(flx_now_ns() - t0) * 1e-9);
    const flx_model_config_t *c = &m->cfg;
    fprintf(stderr, "%s: %u layers, hidden %u, heads %u/%u of %u, ffn %u, vocab %u, rms_eps %g, theta %g, %s\n",
            c->name, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn, c->vocab,
            (double)c->rms_eps, (double)c->rope_theta, c->tied_embeddings ? "tied" : "untied");
    CHECK(c->arch == FLX_ARCH_LLAMA && !c->qkv_bias);
    CHECK(c->n_layers == 30 && c->hidden == 576 && c->n_heads == 9 && c->n_kv_heads == 3 && c->head_dim == 64);
    CHECK(c->ffn == 1536 && c->vocab == 49152 && c->max_ctx == ctx);
    CHECK(c->tied_embeddings == (flx_gguf_find_tensor(g, "output.weight") == NULL));
    CHECK(c->rope_scaling == FLX_ROPE_NONE && c->rope_theta == 100000.0f && c->rms_eps == 1e-5f);
    /* Spot checks against the reference formulas on the file's own bytes: an embedding row (Q8_0),
     * Q and K rows through the un-permute (Q4_1), a down-projection row. */
    float ref[2048];
    const flx_gguf_tensor_t *t = flx_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == FLX_GGML_Q8_0);
    for (uint64_t r = 0; r < c->vocab; r += 4099) {
        gguf_row(t, r, ref);
        check_row("token_embd row", &m->tok_embd, r, ref, c->hidden);
    }
    const uint32_t hd = c->head_dim;
    for (uint32_t l = 0; l < c->n_layers; l += 29) {
        char n[64];
        snprintf(n, sizeof n, "blk.%u.attn_q.weight", l);
        t = flx_gguf_find_tensor(g, n);
        CHECK(t);
        for (uint32_t r = 0; r < c->n_heads * hd; r += 37) {
            gguf_row(t, gguf_row_of_hf_row(r, hd), ref);
            check_row(n, &m->layers[l].wq, r, ref, c->hidden);
        }
        snprintf(n, sizeof n, "blk.%u.attn_k.weight", l);
        t = flx_gguf_find_tensor(g, n);
        CHECK(t);
        for (uint32_t r = 0; r < c->n_kv_heads * hd; r += 13) {
            gguf_row(t, gguf_row_of_hf_row(r, hd), ref);
            check_row(n, &m->layers[l].wk, r, ref, c->hidden);
        }
        snprintf(n, sizeof n, "blk.%u.ffn_down.weight", l);
        t = flx_gguf_find_tensor(g, n);
        CHECK(t);
        gguf_row(t, 100, ref);
        check_row(n, &m->layers[l].w_down, 100, ref, c->ffn);
    }
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (uint32_t i = 0; i < c->hidden; i++)
            CHECK(isfinite(m->layers[l].attn_norm[i]) && isfinite(m->layers[l].ffn_norm[i]));
    CHECK(m->tok_embd.fmt == FLX_WFMT_Q8 && m->layers[0].wq.fmt == FLX_WFMT_Q4);
    flx_model_destroy(m);
    flx_gguf_close(g);
    check_compact_vs_bf16(path, 1);
    fprintf(stderr, "test_model_load --real: ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--real")) return test_real_model();
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH_TO_FLX_GEN_CKPT\n", argv[0]);
        return 1;
    }
    g_seed = flx_test_seed("test_model_load");
    const char *tmpdir = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/flx_model_load.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    CHECK(mkdtemp(g_tmp));
    atexit(cleanup);
    flx_rng_t rng;
    flx_rng_seed(&rng, g_seed);
    test_gguf_metadata();
    test_gguf_models(&rng);
    test_gguf_bad_scales(&rng);
    test_gguf_rope_freqs(&rng);
    test_gguf_refusals(&rng);
    test_hf_roundtrips();
    test_gguf_save_roundtrips();
    test_gen_tool(argv[1]);
    test_hf_names();
    test_hf_refusals();
    fprintf(stderr, "test_model_load: ok\n");
    return 0;
}
