/*
 * gen_corpus.c (flx-fuzz-seeds) - writes the seed corpus of every fuzz target with the project's
 * own writers: flx_model_save_hf (what flx-gen-ckpt runs) for Hugging Face checkpoints, the test
 * GGUF builder (tests/gguf_build.h) for GGUF models and vocabularies, flx_st_writer for
 * fluxion-attn's input, flx_mlp_save, flx_dataset_save and the KV dump writer over the synthetic
 * workload, cJSON for tokenizer.json files of the fuzz vocabulary (fuzz_seeds.h), token id files
 * as llama_ref --tokens-out writes them, and command lines for fuzz_cli. Every file seed is then
 * loaded back through the loader its target fuzzes, so a seed that stopped being valid fails here
 * (command lines are not: a refused line is as good a seed as an accepted one). Seeded: the same
 * build writes the same bytes. The other targets' seeds come from the writers beside their tests
 * (make_corpus.sh runs them all).
 *
 * usage: flx-fuzz-seeds OUT_DIR     (writes OUT_DIR/<target>/<seed>; tests/fuzz/make_corpus.sh)
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/bf16.h"
#include "flx/cli.h"
#include "flx/gguf.h"
#include "flx/kvsource.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/safetensors.h"
#include "flx/synth.h"
#include "flx/tokenizer.h"
#include "flx_test.h"
#include "fuzz_seeds.h"
#include "gguf_build.h"

static char g_out[512];
static flx_rng_t g_rng;

static const char *out_path(const char *target, const char *name)
{
    static char ring[4][1024];
    static int next;
    char *p = ring[next++ % 4];
    snprintf(p, sizeof ring[0], "%s/%s", g_out, target);
    mkdir(p, 0755);
    snprintf(p, sizeof ring[0], "%s/%s/%s", g_out, target, name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK(f);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *b = malloc((size_t)n + 1);
    CHECK(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

/* A scratch folder (under OUT_DIR, removed by make_corpus.sh). */
static const char *scratch(const char *name)
{
    static char p[700];
    snprintf(p, sizeof p, "%s/.scratch-%s", g_out, name);
    mkdir(p, 0755);
    return p;
}

/* ---- GGUF ---- */

/* n values of ggml type t: finite floats, quantized blocks with a small scale and random codes */
static void *gguf_data(uint32_t type, size_t n)
{
    size_t bytes = type_bytes(type, n);
    uint8_t *p = malloc(bytes);
    CHECK(p);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)flx_rng_below(&g_rng, 256);
    const uint16_t d = flx_f32_to_f16(0.01f);
    switch (type) {
    case FLX_GGML_F32:
        for (size_t i = 0; i < n; i++) ((float *)p)[i] = (float)(0.05 * flx_rng_normal(&g_rng));
        break;
    case FLX_GGML_F16:
        for (size_t i = 0; i < n; i++) ((uint16_t *)p)[i] = flx_f32_to_f16((float)(0.05 * flx_rng_normal(&g_rng)));
        break;
    case FLX_GGML_BF16:
        for (size_t i = 0; i < n; i++) ((uint16_t *)p)[i] = flx_f32_to_bf16((float)(0.05 * flx_rng_normal(&g_rng)));
        break;
    case FLX_GGML_Q8_0: for (size_t b = 0; b < n / 32; b++) memcpy(p + 34 * b, &d, 2); break;
    case FLX_GGML_Q4_0: for (size_t b = 0; b < n / 32; b++) memcpy(p + 18 * b, &d, 2); break;
    case FLX_GGML_Q4_1:
        for (size_t b = 0; b < n / 32; b++) memcpy(p + 20 * b, &d, 2), memcpy(p + 20 * b + 2, &d, 2);
        break;
    default: CHECK(0);
    }
    return p;
}

static void gguf_tensor(gguf_b_t *g, const char *name, uint32_t type, uint32_t cols, uint32_t rows)
{
    void *p = gguf_data(type, (size_t)cols * rows);
    add_t(g, name, type, rows > 1 ? 2 : 1, cols, rows > 1 ? rows : 1, p);
    free(p);
}

/* The tiny model of fuzz_seeds.h as GGUF: every weight type the loader dequantizes. */
static void gguf_model(const char *name, flx_arch_t arch, int tied, int rope_freqs)
{
    flx_model_config_t c = fuzz_tiny_cfg(arch, tied);
    const char *a = arch == FLX_ARCH_LLAMA ? "llama" : "qwen2";
    gguf_b_t g = {0};
    char k[96];
    kv_str(&g, "general.architecture", a);
    kv_str(&g, "general.name", c.name);
#define AK(s) (snprintf(k, sizeof k, "%s.%s", a, s), k)
    kv_u32(&g, AK("block_count"), c.n_layers);
    kv_u32(&g, AK("context_length"), c.max_ctx);
    kv_u32(&g, AK("embedding_length"), c.hidden);
    kv_u32(&g, AK("feed_forward_length"), c.ffn);
    kv_u32(&g, AK("attention.head_count"), c.n_heads);
    kv_u32(&g, AK("attention.head_count_kv"), c.n_kv_heads);
    kv_u32(&g, AK("attention.key_length"), c.head_dim);
    kv_f32(&g, AK("attention.layer_norm_rms_epsilon"), c.rms_eps);
    kv_f32(&g, AK("rope.freq_base"), rope_freqs ? 500000.0f : c.rope_theta);
    if (arch == FLX_ARCH_QWEN2) kv_u32(&g, AK("vocab_size"), c.vocab);
#undef AK
    const uint32_t H = c.hidden, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim, F = c.ffn;
    gguf_tensor(&g, "token_embd.weight", FLX_GGML_Q8_0, H, c.vocab);
    if (!tied) gguf_tensor(&g, "output.weight", FLX_GGML_Q4_0, H, c.vocab);
    gguf_tensor(&g, "output_norm.weight", FLX_GGML_F32, H, 1);
    gguf_tensor(&g, "blk.0.attn_norm.weight", FLX_GGML_F16, H, 1);
    gguf_tensor(&g, "blk.0.attn_q.weight", FLX_GGML_Q4_1, H, qd);
    gguf_tensor(&g, "blk.0.attn_k.weight", FLX_GGML_F16, H, kvd);
    gguf_tensor(&g, "blk.0.attn_v.weight", FLX_GGML_BF16, H, kvd);
    gguf_tensor(&g, "blk.0.attn_output.weight", FLX_GGML_Q8_0, qd, H);
    gguf_tensor(&g, "blk.0.ffn_norm.weight", FLX_GGML_BF16, H, 1);
    gguf_tensor(&g, "blk.0.ffn_gate.weight", FLX_GGML_F32, H, F);
    gguf_tensor(&g, "blk.0.ffn_up.weight", FLX_GGML_Q4_0, H, F);
    gguf_tensor(&g, "blk.0.ffn_down.weight", FLX_GGML_Q4_1, F, H);
    if (arch == FLX_ARCH_QWEN2) {
        gguf_tensor(&g, "blk.0.attn_q.bias", FLX_GGML_F32, qd, 1);
        gguf_tensor(&g, "blk.0.attn_k.bias", FLX_GGML_F16, kvd, 1);
        gguf_tensor(&g, "blk.0.attn_v.bias", FLX_GGML_F32, kvd, 1);
    }
    if (rope_freqs) { /* Llama-3.1's divisors (factor 8, low 1, high 4, original context 8192) */
        float rf[FLX_MODEL_MAX_HEAD_DIM / 2];
        const double base = 500000, factor = 8, low = 1, high = 4, old_ctx = 8192;
        for (uint32_t i = 0; i < c.head_dim / 2; i++) {
            double freq = 1.0 / pow(base, (2.0 * i) / c.head_dim), wl = 2 * M_PI / freq;
            if (wl < old_ctx / high) rf[i] = 1;
            else if (wl > old_ctx / low) rf[i] = (float)factor;
            else {
                double smooth = (old_ctx / wl - low) / (high - low);
                rf[i] = (float)(1 / ((1 - smooth) / factor + smooth));
            }
        }
        add_t(&g, "rope_freqs.weight", FLX_GGML_F32, 1, c.head_dim / 2, 1, rf);
    }
    const char *p = out_path("gguf", name);
    gguf_save(&g, p, "GGUF", 3);
    gguf_free(&g);
    flx_model_t *m;
    CHECK_OK(flx_model_load(p, &m));
    CHECK(m->cfg.rope_scaling == (rope_freqs ? FLX_ROPE_LLAMA3 : FLX_ROPE_NONE));
    flx_model_destroy(m);
}

/* The fuzz vocabulary as a GGUF (no tensors). */
static void gguf_vocab(const char *name, const char *pre)
{
    fuzz_vocab_t v;
    fuzz_vocab(&v);
    int32_t types[FUZZ_N_TOKENS];
    for (size_t i = 0; i < FUZZ_N_TOKENS; i++)
        types[i] = v.attrs[i] & FLX_TOK_ATTR_SPECIAL ? 3 : v.attrs[i] & FLX_TOK_ATTR_ADDED ? 4 : 1;
    gguf_b_t g = {0};
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", v.tokens, FUZZ_N_TOKENS);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, FUZZ_N_TOKENS);
    kv_strs(&g, "tokenizer.ggml.merges", fuzz_merges, FUZZ_N_MERGES);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", (uint32_t)FUZZ_ID_IM_START);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", (uint32_t)FUZZ_ID_IM_END);
    kv_u32(&g, "tokenizer.ggml.eot_token_id", (uint32_t)FUZZ_ID_IM_END);
    kv_bool(&g, "tokenizer.ggml.add_bos_token", 0);
    kv_str(&g, "tokenizer.chat_template", fuzz_chatml);
    const char *p = out_path("gguf", name);
    gguf_save(&g, p, "GGUF", 3);
    gguf_free(&g);
    flx_tok_h t;
    CHECK_OK(flx_tok_load(p, &t));
    CHECK(flx_tok_vocab_size(t) == FUZZ_N_TOKENS);
    flx_tok_destroy(t);
}

/* ---- Hugging Face ---- */

static void save_tiny(const char *dir, flx_model_config_t c, uint32_t shards)
{
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(&c, 1, &m));
    CHECK_OK(flx_model_save_hf(m, dir, FLX_DT_BF16, shards));
    flx_model_destroy(m);
}

/* config.json seeds, each loaded over the fuzz target's checkpoint (the Qwen2 untied one). */
static void hf_configs(void)
{
    const char *weights = scratch("hf-weights"), *cfgdir = scratch("hf-config");
    CHECK(fuzz_tiny_checkpoint(weights, 1) == 0);
    struct {
        const char *name;
        flx_arch_t arch;
        int tied, llama3;
    } seeds[] = {{"qwen2.json", FLX_ARCH_QWEN2, 0, 0},
                 {"llama.json", FLX_ARCH_LLAMA, 0, 0},
                 {"llama-tied.json", FLX_ARCH_LLAMA, 1, 0},
                 {"llama3-rope-scaling.json", FLX_ARCH_LLAMA, 0, 1}};
    char p[1024];
    for (size_t i = 0; i < FLX_ARRAY_SIZE(seeds); i++) {
        flx_model_config_t c = fuzz_tiny_cfg(seeds[i].arch, seeds[i].tied);
        if (seeds[i].llama3)
            c.rope_scaling = FLX_ROPE_LLAMA3, c.rope_factor = 8, c.rope_low_freq_factor = 1,
            c.rope_high_freq_factor = 4, c.rope_orig_ctx = 128;
        save_tiny(cfgdir, c, 1);
        snprintf(p, sizeof p, "%s/config.json", cfgdir);
        char *txt = read_text(p);
        write_text(out_path("hf_config", seeds[i].name), txt);
        snprintf(p, sizeof p, "%s/config.json", weights);
        write_text(p, txt);
        free(txt);
        flx_model_t *m;
        CHECK_OK(flx_model_load_hf(weights, &m));
        flx_model_destroy(m);
    }
}

/* The shard index of the fuzz target's three-shard checkpoint. */
static void hf_index(void)
{
    const char *dir = scratch("hf-index");
    CHECK(fuzz_tiny_checkpoint(dir, 3) == 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *txt = read_text(p);
    write_text(out_path("hf_index", "three-shards.json"), txt);
    free(txt);
    flx_model_t *m;
    CHECK_OK(flx_model_load_hf(dir, &m));
    flx_model_destroy(m);
}

/* ---- safetensors ---- */

static void st_seeds(void)
{
    /* fluxion-attn's input: q (H, D), k, v (H_kv, L, D), budgets (H), metadata */
    enum { H = 2, HKV = 1, L = 20, D = 16 };
    float q[H * D], v[HKV * L * D], bud[H] = {0.25f, 1.0f};
    flx_bf16_t k[HKV * L * D];
    for (int i = 0; i < H * D; i++) q[i] = (float)flx_rng_normal(&g_rng);
    for (int i = 0; i < HKV * L * D; i++) {
        k[i] = flx_f32_to_bf16((float)flx_rng_normal(&g_rng));
        v[i] = (float)flx_rng_normal(&g_rng);
    }
    flx_st_writer_h w;
    const int64_t sq[2] = {H, D}, skv[3] = {HKV, L, D}, sb[1] = {H};
    CHECK_OK(flx_st_writer_create(&w));
    CHECK_OK(flx_st_writer_add(w, "q", FLX_DT_F32, 2, sq, q));
    CHECK_OK(flx_st_writer_add(w, "k", FLX_DT_BF16, 3, skv, k));
    CHECK_OK(flx_st_writer_add(w, "v", FLX_DT_F32, 3, skv, v));
    CHECK_OK(flx_st_writer_add(w, "budgets", FLX_DT_F32, 1, sb, bud));
    CHECK_OK(flx_st_writer_set_metadata(w, "mode", "sparse"));
    CHECK_OK(flx_st_writer_set_metadata(w, "blk", "16"));
    CHECK_OK(flx_st_writer_set_metadata(w, "sink", "4"));
    CHECK_OK(flx_st_writer_set_metadata(w, "local", "8"));
    const char *p = out_path("safetensors", "attn-input.safetensors");
    CHECK_OK(flx_st_writer_save(w, p));
    flx_st_writer_destroy(w);
    flx_st_reader_h r;
    CHECK_OK(flx_st_open(p, &r));
    flx_st_close(r);
    /* a checkpoint shard (F16, tied) */
    const char *dir = scratch("st-model");
    flx_model_config_t c = fuzz_tiny_cfg(FLX_ARCH_LLAMA, 1);
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(&c, 2, &m));
    CHECK_OK(flx_model_save_hf(m, dir, FLX_DT_F16, 1));
    flx_model_destroy(m);
    char src[1024];
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    p = out_path("safetensors", "model-f16.safetensors");
    CHECK(rename(src, p) == 0);
    CHECK_OK(flx_st_open(p, &r));
    flx_st_close(r);
}

/* ---- tokenizer.json ---- */

static const char k_pat_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_pat_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static cJSON *pre_tok(const char *type, int use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    if (!strcmp(type, "ByteLevel")) {
        cJSON_AddBoolToObject(o, "add_prefix_space", 0);
        cJSON_AddBoolToObject(o, "trim_offsets", 1);
        cJSON_AddBoolToObject(o, "use_regex", use_regex);
    } else if (!strcmp(type, "Digits")) {
        cJSON_AddBoolToObject(o, "individual_digits", 1);
    }
    return o;
}

static cJSON *split(const char *pattern)
{
    cJSON *o = cJSON_CreateObject(), *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", pattern);
    cJSON_AddItemToObject(o, "pattern", pat);
    cJSON_AddStringToObject(o, "behavior", "Isolated");
    cJSON_AddBoolToObject(o, "invert", 0);
    return o;
}

static cJSON *sequence(cJSON *a, cJSON *b)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "type", "Sequence");
    cJSON_AddItemToArray(arr, a);
    cJSON_AddItemToArray(arr, b);
    cJSON_AddItemToObject(o, "pretokenizers", arr);
    return o;
}

/* The fuzz vocabulary as a tokenizer.json of the given flavour; config (or NULL) is appended as the
 * tokenizer_config.json part of the input (fuzz_tokenizer_json.c). */
static void tok_json(const char *name, flx_tok_pre_t pre, int pair_merges, int added_in_vocab, const char *config)
{
    fuzz_vocab_t v;
    fuzz_vocab(&v);
    cJSON *root = cJSON_CreateObject(), *added = cJSON_CreateArray(), *model = cJSON_CreateObject();
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    for (size_t i = 0; i < FUZZ_N_TOKENS; i++) {
        if (v.attrs[i] & FLX_TOK_ATTR_ADDED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", v.tokens[i]);
            cJSON_AddBoolToObject(a, "single_word", 0);
            cJSON_AddBoolToObject(a, "lstrip", 0);
            cJSON_AddBoolToObject(a, "rstrip", 0);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddBoolToObject(a, "special", (v.attrs[i] & FLX_TOK_ATTR_SPECIAL) != 0);
            cJSON_AddItemToArray(added, a);
            if (!added_in_vocab) continue;
        }
        cJSON_AddNumberToObject(vocab, v.tokens[i], (double)i);
    }
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (pre == FLX_TOK_PRE_QWEN2) {
        cJSON *nfc = cJSON_CreateObject();
        cJSON_AddStringToObject(nfc, "type", "NFC");
        cJSON_AddItemToObject(root, "normalizer", nfc);
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON *pt = pre == FLX_TOK_PRE_GPT2     ? pre_tok("ByteLevel", 1)
                : pre == FLX_TOK_PRE_SMOLLM ? sequence(pre_tok("Digits", 0), pre_tok("ByteLevel", 1))
                : pre == FLX_TOK_PRE_LLAMA3 ? sequence(split(k_pat_llama3), pre_tok("ByteLevel", 0))
                                            : sequence(split(k_pat_qwen2), pre_tok("ByteLevel", 0));
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    if (pre == FLX_TOK_PRE_LLAMA3) { /* BOS added by a template, as Llama-3's file does */
        cJSON *pp = cJSON_CreateObject(), *single = cJSON_CreateArray(), *first = cJSON_CreateObject();
        cJSON *spec = cJSON_CreateObject(), *seq = cJSON_CreateObject();
        cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
        cJSON_AddStringToObject(spec, "id", "<|im_start|>");
        cJSON_AddNumberToObject(spec, "type_id", 0);
        cJSON_AddItemToObject(first, "SpecialToken", spec);
        cJSON_AddItemToArray(single, first);
        cJSON_AddStringToObject(seq, "id", "A");
        cJSON_AddNumberToObject(seq, "type_id", 0);
        cJSON *second = cJSON_CreateObject();
        cJSON_AddItemToObject(second, "Sequence", seq);
        cJSON_AddItemToArray(single, second);
        cJSON_AddItemToObject(pp, "single", single);
        cJSON_AddItemToObject(root, "post_processor", pp);
    } else {
        cJSON_AddNullToObject(root, "post_processor");
    }
    cJSON *dec = cJSON_CreateObject();
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", pre == FLX_TOK_PRE_LLAMA3);
    cJSON_AddItemToObject(model, "vocab", vocab);
    for (size_t i = 0; i < FUZZ_N_MERGES; i++) {
        if (!pair_merges) {
            cJSON_AddItemToArray(merges, cJSON_CreateString(fuzz_merges[i]));
            continue;
        }
        const char *m = fuzz_merges[i], *sp = strchr(m, ' ');
        char left[32];
        snprintf(left, sizeof left, "%.*s", (int)(sp - m), m);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(left));
        cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1));
        cJSON_AddItemToArray(merges, pair);
    }
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    char *txt = cJSON_PrintUnformatted(root);
    CHECK(txt);
    const char *dir = scratch("tok");
    char jp[1024], cp[1024];
    snprintf(jp, sizeof jp, "%s/tokenizer.json", dir);
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    write_text(jp, txt);
    remove(cp);
    if (config) write_text(cp, config);
    flx_tok_h t;
    CHECK_OK(flx_tok_load(dir, &t));
    CHECK(flx_tok_pre(t) == pre && flx_tok_vocab_size(t) == FUZZ_N_TOKENS);
    CHECK(flx_tok_bos(t) == (config || pre == FLX_TOK_PRE_LLAMA3 ? FUZZ_ID_IM_START : -1));
    CHECK(!config || (flx_tok_eos(t) == FUZZ_ID_IM_END && flx_tok_chat_template(t)));
    flx_tok_destroy(t);
    FILE *f = fopen(out_path("tokenizer_json", name), "wb");
    CHECK(f && fputs(txt, f) >= 0);
    if (config) CHECK(fputs("\n#tokenizer_config.json\n", f) >= 0 && fputs(config, f) >= 0);
    CHECK(fclose(f) == 0);
    free(txt);
    cJSON_Delete(root);
}

/* tokenizer_config.json: bos/eos as strings or {"content"}, the chat template as a string or a
 * named list. */
static const char k_conf_smollm[] =
    "{\"add_bos_token\": false, \"bos_token\": \"<|im_start|>\", \"eos_token\": \"<|im_end|>\", "
    "\"chat_template\": \"{% for message in messages %}<|im_start|>{{ message['role'] }}\\n{{ message['content'] }}"
    "<|im_end|>\\n{% endfor %}\"}";
static const char k_conf_llama3[] =
    "{\"bos_token\": {\"content\": \"<|im_start|>\", \"special\": true}, \"eos_token\": {\"content\": "
    "\"<|im_end|>\"}, \"add_bos_token\": true, \"chat_template\": [{\"name\": \"tool_use\", \"template\": "
    "\"<|im_start|>tools\"}, {\"name\": \"default\", \"template\": \"{{ '<|im_start|>' + message['role'] }}\"}]}";

/* Texts for the encoder: first byte = pre-tokenizer (bits 0-1), add_bos (bit 2), system message
 * (bit 3); see fuzz_tokenizer_encode.c. */
static void encode_seeds(void)
{
    static const struct {
        const char *name;
        const char *bytes;
    } texts[] = {
        {"gpt2-question", "\x00What is 2+2? The answer is 4."},
        {"smollm-digits", "\x01" "caf\xc3\xa9 12345 it's we'll THE'S"},
        {"llama3-chat", "\x06<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
        {"qwen2-nfc", "\x03" "Cafe\xcc\x81 \xef\xbc\xa3 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xf0\x9f\x98\x80 e\xcc\x81\xcc\xa3"},
        {"gpt2-spaces", "\x08   \n\n\t x  \r\n y<extra>z"},
        {"smollm-invalid-utf8", "\x05\xff\xfe\xc3(\xe2\x82 \xed\xa0\x80 end<|endoftext|>"},
        {"llama3-numbers", "\x02 1234567 89 x1y2 'LL 'Re\n\n\n  tail"},
        {"qwen2-mixed", "\x07\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe4\xbd\xa0\xe5\xa5\xbd 123 \xc3\x80\xc3\x89"},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(texts); i++) {
        FILE *f = fopen(out_path("tokenizer_encode", texts[i].name), "wb");
        size_t n = 1 + strlen(texts[i].bytes + 1);
        CHECK(f && fwrite(texts[i].bytes, 1, n, f) == n && fclose(f) == 0);
    }
}

/* ---- predictor weights, datasets, KV dumps ---- */

static void predictor_seed(void)
{
    flx_mlp_t m;
    CHECK_OK(flx_mlp_alloc(&m));
    float *arr[8] = {m.w1, m.b1, m.w2, m.b2, m.w3, m.b3, m.w4, m.b4};
    const size_t n[8] = {(size_t)FLX_PRED_H1 * FLX_PRED_IN, FLX_PRED_H1, (size_t)FLX_PRED_H2 * FLX_PRED_H1,
                         FLX_PRED_H2, (size_t)FLX_PRED_H3 * FLX_PRED_H2, FLX_PRED_H3, (size_t)FLX_PRED_OUT * FLX_PRED_H3,
                         FLX_PRED_OUT};
    for (int a = 0; a < 8; a++)
        for (size_t i = 0; i < n[a]; i++) arr[a][i] = (float)(0.05 * flx_rng_normal(&g_rng));
    const char *p = out_path("predictor", "weights.safetensors");
    CHECK_OK(flx_mlp_save(&m, p, "fuzz seed", "fluxion", 0.1f));
    flx_mlp_free(&m);
    flx_predictor_h pr;
    CHECK_OK(flx_predictor_load(p, &pr));
    flx_predictor_destroy(pr);
}

static void dataset_seed(const char *name, uint32_t rows, uint32_t hq, uint32_t hkv)
{
    flx_dataset_t d = {0};
    d.n = rows, d.n_q_heads = hq, d.n_kv_heads = hkv, d.tau = 0.1f;
    d.features = malloc((size_t)rows * FLX_PRED_IN * 4);
    d.labels = malloc((size_t)rows * 3 * 4);
    d.bgt = malloc((size_t)rows * 5 * 4);
    d.where = malloc((size_t)rows * 3 * 4);
    CHECK(d.features && d.labels && d.bgt && d.where);
    for (size_t i = 0; i < (size_t)rows * FLX_PRED_IN; i++) d.features[i] = (float)flx_rng_normal(&g_rng);
    for (uint32_t r = 0; r < rows; r++) {
        d.labels[3 * r] = 0.05f, d.labels[3 * r + 1] = 0.01f, d.labels[3 * r + 2] = (float)(r % 2);
        for (int j = 0; j < 5; j++) d.bgt[5 * r + j] = 0.01f * (float)(j + 1);
        d.where[3 * r] = r, d.where[3 * r + 1] = r % 4, d.where[3 * r + 2] = 7;
    }
    snprintf(d.criterion, sizeof d.criterion, "fluxion");
    snprintf(d.source, sizeof d.source, "fuzz seed");
    const char *p = out_path("dataset", name);
    CHECK_OK(flx_dataset_save(&d, p));
    flx_dataset_free(&d);
    flx_dataset_t back = {0};
    CHECK_OK(flx_dataset_load_append(&back, p));
    CHECK(back.n == rows);
    flx_dataset_free(&back);
}

static void kvdump_seed(void)
{
    flx_synth_params_t sp;
    flx_synth_defaults(&sp, 2, 2, 1, 16, 32, 2, 7);
    /* the default profile is made for the store's segments (sink 64, local 256): a short one */
    sp.n_sink_tokens = 2, sp.recent_span = 8, sp.host_begin = 4, sp.host_end_margin = 8;
    sp.needle_sites = 2, sp.needle_len = 2, sp.needles_active = 1;
    flx_synth_t *syn;
    CHECK_OK(flx_synth_create(&sp, &syn));
    flx_kvsrc_h src;
    CHECK_OK(flx_kvsrc_from_synth(syn, &src));
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    const size_t T = (size_t)sh.prompt_len + sh.n_steps;
    flx_bf16_t *k = malloc(sh.n_kv_heads * T * sh.head_dim * 2), *v = malloc(sh.n_kv_heads * T * sh.head_dim * 2);
    float *q = malloc((size_t)sh.n_q_heads * (sh.n_steps + 1) * sh.head_dim * 4);
    CHECK(k && v && q);
    flx_kvdump_writer_h w;
    CHECK_OK(flx_kvdump_writer_create(&sh, "synthetic", "fuzz seed", &w));
    for (uint32_t l = 0; l < sh.n_layers; l++) {
        CHECK_OK(flx_kvsrc_layer(src, l, k, v, q, NULL));
        CHECK_OK(flx_kvdump_writer_layer(w, l, k, v, q));
    }
    const char *p = out_path("kvdump", "synth-2-layers.safetensors");
    CHECK_OK(flx_kvdump_writer_save(w, p));
    flx_kvdump_writer_destroy(w);
    flx_kvsrc_close(src);
    free(k), free(v), free(q);
    CHECK_OK(flx_kvsrc_open_dump(p, &src));
    flx_kvsrc_close(src);
}

/* ---- command lines (fuzz_cli: words separated by NUL bytes) ---- */

static void cli_seeds(void)
{
    /* words separated by '|', for the table of fuzz_cli.c: every kind of option, spellings
     * (--opt=value, -xVALUE, "--"), help and version, and values for the list parsers */
    static const char *const lines[] = {
        "-m|M|-p|What|IN",
        "--model=M|--prompt-file|F|--mode|fixed|IN|OUT",
        "-mM|-n12|-pHello|--gpu|3|IN",
        "-m|M|--gpu|IN|--top-p|0.5|--temp|-1.5",
        "-m|M|-d|a|-d|b|--data|c|IN|--|--chat",
        "--mod|M|IN",
        "-m|M|--top-p|nan|IN",
        "-m|M|-n|18446744073709551616|IN",
        "-h",
        "--version",
        "-m|M|--chat=1|IN",
        "-m|M|--gpu=2|7|IN|OUT|extra",
        "2048,4096|1,,2|-m|M|IN|--progress",
        "-m|M|IN|16384-32768,1024-2048|shm,tcp|tcp,tcp|4096-2048",
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(lines); i++) {
        char name[16];
        snprintf(name, sizeof name, "%02zu", i + 1);
        FILE *f = fopen(out_path("cli", name), "wb");
        CHECK(f);
        for (const char *c = lines[i]; *c; c++) CHECK(fputc(*c == '|' ? 0 : *c, f) != EOF);
        CHECK(fclose(f) == 0);
    }
}

/* ---- token id files (fuzz_token_ids: flx_tok_ids_parse) ---- */

/* ids as llama_ref --tokens-out writes them (one per line), read back through the parser */
static void ids_text(const char *name, const int32_t *ids, size_t n)
{
    const char *p = out_path("token_ids", name);
    FILE *f = fopen(p, "wb");
    CHECK(f);
    for (size_t i = 0; i < n; i++) CHECK(fprintf(f, "%d\n", ids[i]) > 0);
    CHECK(fclose(f) == 0);
    int32_t *back;
    size_t nb;
    CHECK_OK(flx_tok_ids_read(p, &back, &nb));
    CHECK(nb == n && (n == 0 || !memcmp(back, ids, n * sizeof *ids)));
    free(back);
}

static void token_id_seeds(void)
{
    int32_t ids[100];
    for (int i = 0; i < 43; i++) ids[i] = 7 * i;
    ids_text("text", ids, 43);
    for (int i = 0; i < 100; i++) ids[i] = (7 * (i + 1)) % 256;
    ids_text("ids-file", ids, 100);
    const int32_t limits[] = {12, -3, INT32_MAX, INT32_MIN};
    ids_text("text-limits", limits, 4);
    const int32_t raw[] = {1, 2, 300, 49151, -1, 7, 0, 65536};   /* raw little-endian i32 (x86) */
    const char *p = out_path("token_ids", "raw");
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(raw, sizeof raw, 1, f) == 1 && fclose(f) == 0);
    int32_t *back;
    size_t nb;
    CHECK_OK(flx_tok_ids_read(p, &back, &nb));
    CHECK(nb == FLX_ARRAY_SIZE(raw) && !memcmp(back, raw, sizeof raw));
    free(back);
}

int main(int argc, char **argv)
{
    const char *out = NULL;
    flx_cli_pos_t pos[] = {FLX_CLI_ARG("OUT_DIR", &out, "folder that receives OUT_DIR/<target>/<seed> (created)")};
    flx_cli_t cli = {.prog = "flx-fuzz-seeds", .summary = "Writes the seed corpus of the fuzz targets with the "
                     "project's own writers and loads every file seed back (tests/fuzz/make_corpus.sh).",
                     .pos = pos, .n_pos = 1};
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (strlen(out) >= sizeof g_out - 64) return flx_cli_usage_error(&cli, "OUT_DIR is longer than %zu bytes",
                                                                     sizeof g_out - 64);
    snprintf(g_out, sizeof g_out, "%s", out);
    if (mkdir(g_out, 0755) && errno != EEXIST) return flx_cli_fail(&cli, "cannot create %s: %s", g_out, strerror(errno));
    flx_rng_seed(&g_rng, 14);
    gguf_model("llama-llama3-rope.gguf", FLX_ARCH_LLAMA, 0, 1);
    gguf_model("qwen2-tied.gguf", FLX_ARCH_QWEN2, 1, 0);
    gguf_vocab("vocab-smollm.gguf", "smollm");
    gguf_vocab("vocab-llama-bpe.gguf", "llama-bpe");
    st_seeds();
    hf_configs();
    hf_index();
    tok_json("gpt2.json", FLX_TOK_PRE_GPT2, 0, 0, NULL);
    tok_json("smollm.json", FLX_TOK_PRE_SMOLLM, 1, 1, NULL);
    tok_json("smollm-config.json", FLX_TOK_PRE_SMOLLM, 0, 1, k_conf_smollm);
    tok_json("llama3.json", FLX_TOK_PRE_LLAMA3, 1, 0, NULL);
    tok_json("llama3-config.json", FLX_TOK_PRE_LLAMA3, 1, 0, k_conf_llama3);
    tok_json("qwen2-nfc.json", FLX_TOK_PRE_QWEN2, 0, 0, NULL);
    encode_seeds();
    predictor_seed();
    dataset_seed("rows-8.safetensors", 8, 4, 2);
    dataset_seed("rows-3-no-shape.safetensors", 3, 0, 0);
    kvdump_seed();
    cli_seeds();
    token_id_seeds();
    fprintf(stderr, "flx-fuzz-seeds: seeds written to %s and loaded back\n", g_out);
    return 0;
}
