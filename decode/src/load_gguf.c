/*
 * load_gguf.c - GGUF checkpoint -> flx_model_t (matrices as bf16 or in block formats, fp32 vectors).
 *
 * DESIGN
 * The runtime's weights are bf16 values (flx/model.h), so a GGUF file is converted once at load and
 * the mapping is dropped: F32, F16 and BF16 matrices become bf16; Q4_0 and Q4_1 ones FLX_WFMT_Q4 and
 * Q8_0 ones FLX_WFMT_Q8, their blocks copied with the scales widened to fp32, which hold the same
 * bf16 values in 0.75 and 1.125 bytes each (a decode step reads 2.4 times fewer bytes of the Q4_1
 * SmolLM2); flx_model_load_gguf_as(.., FLX_WEIGHTS_BF16) dequantizes those to bf16 too, the
 * reference they are tested against. The per-block formulas below are the scalar definitions from ggml-quants.c
 * and double as the reference the tests compare against:
 *
 *   Q8_0  34 bytes / 32 values:  f16 d, i8 q[32];           x[j] = d * q[j]
 *   Q4_0  18 bytes / 32 values:  f16 d, u8 qs[16];          x[j] = d * ((qs[j] & 15) - 8),
 *                                                          x[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  20 bytes / 32 values:  f16 d, f16 m, u8 qs[16];   x[j] = d * (qs[j] & 15) + m,
 *                                                          x[j + 16] = d * (qs[j] >> 4) + m
 *
 * RoPE: llama.cpp's convert_hf_to_gguf.py permutes Llama Q/K rows with
 * w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2), so GGUF row h*hd + 2j + t holds Hugging Face row
 * h*hd + t*hd/2 + j (j < hd/2, t in {0, 1}); K uses n_kv_heads. We write each GGUF row to its HF
 * row. Qwen2 is converted without the permutation (llama.cpp runs it with NEOX rope).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/bf16.h"
#include "flx/gguf.h"
#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/progress.h"
#include "flx/util.h"
#include "model_internal.h"

typedef struct {
    flx_gguf_h g;
    const char *path;
    const char *arch;        /* "llama" | "qwen2" */
    flx_model_t *m;
    flx_pool_h pool;         /* dequantizes rows in parallel; NULL: the caller alone */
    int bf16_only;           /* every matrix to bf16, quantized ones too */
} gctx_t;

static int type_supported(uint32_t t)
{
    return t == FLX_GGML_F32 || t == FLX_GGML_F16 || t == FLX_GGML_BF16 || t == FLX_GGML_Q8_0 ||
           t == FLX_GGML_Q4_0 || t == FLX_GGML_Q4_1;
}

static inline uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* n values of one row (n a multiple of the type's block) to fp32. */
static void dequant_row(uint32_t type, const uint8_t *src, size_t n, float *dst)
{
    switch (type) {
    case FLX_GGML_F32:
        memcpy(dst, src, n * 4);
        break;
    case FLX_GGML_F16:
        for (size_t i = 0; i < n; i++) dst[i] = flx_f16_to_f32(rd16(src + 2 * i));
        break;
    case FLX_GGML_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = flx_bf16_to_f32(rd16(src + 2 * i));
        break;
    case FLX_GGML_Q8_0:
        for (size_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
            const float d = flx_f16_to_f32(rd16(src));
            for (int j = 0; j < 32; j++) dst[j] = d * (float)(int8_t)src[2 + j];
        }
        break;
    case FLX_GGML_Q4_0:
        for (size_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
            const float d = flx_f16_to_f32(rd16(src));
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)((src[2 + j] & 15) - 8);
                dst[j + 16] = d * (float)((src[2 + j] >> 4) - 8);
            }
        }
        break;
    case FLX_GGML_Q4_1:
        for (size_t b = 0; b < n / 32; b++, src += 20, dst += 32) {
            const float d = flx_f16_to_f32(rd16(src)), mn = flx_f16_to_f32(rd16(src + 2));
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)(src[4 + j] & 15) + mn;
                dst[j + 16] = d * (float)(src[4 + j] >> 4) + mn;
            }
        }
        break;
    default:
        break; /* unreachable: callers check type_supported */
    }
}

static flx_status_t find_tensor(gctx_t *c, const char *name, const flx_gguf_tensor_t **t_p)
{
    const flx_gguf_tensor_t *t = flx_gguf_find_tensor(c->g, name);
    if (!t) return flx_error_set(FLX_ERR_NOT_FOUND, "file %s: tensor '%s' is missing", c->path, name);
    if (!type_supported(t->type))
        return flx_error_set(FLX_ERR_UNSUPPORTED,
                             "file %s: tensor '%s' has ggml type %s (%u); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1",
                             c->path, name, flx_ggml_type_name(t->type), t->type);
    *t_p = t;
    return FLX_OK;
}

typedef struct dequant_job {
    const char *path, *name;
    const uint8_t *src;
    size_t row_bytes, out_bytes;   /* a source row; a row of the model's matrix */
    uint32_t type, cols, head_dim;
    flx_wfmt_t fmt;
    uint8_t *dst;
} dequant_job_t;

static inline void wrf(uint8_t *p, float v)
{
    memcpy(p, &v, 4);
}

/* A quantized row's block scales (and Q4_1's minima) must be finite: the row would be NaN or
 * infinite, and the kernels' bf16 rounding is defined for finite values. Refused the same whether
 * the blocks are kept or dequantized. */
static flx_status_t check_scales(const dequant_job_t *j, uint64_t r, const uint8_t *src)
{
    if (j->type != FLX_GGML_Q8_0 && j->type != FLX_GGML_Q4_0 && j->type != FLX_GGML_Q4_1) return FLX_OK;
    const size_t bb = j->type == FLX_GGML_Q8_0 ? 34 : j->type == FLX_GGML_Q4_0 ? 18 : 20;
    for (size_t b = 0; b < j->cols / 32; b++) {
        const float d = flx_f16_to_f32(rd16(src + bb * b));
        const float m = j->type == FLX_GGML_Q4_1 ? flx_f16_to_f32(rd16(src + bb * b + 2)) : 0;
        if (!isfinite(d) || !isfinite(m))
            return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s' row %llu block %zu: scale %g, min %g (must be "
                                 "finite)", j->path, j->name, (unsigned long long)r, b, (double)d, (double)m);
    }
    return FLX_OK;
}

/* One source row to the model's format: bf16 (dequantized and rounded), or its blocks re-laid as
 * FLX_WFMT_Q4 / Q8 with the fp16 scales widened (flx/model.h; Q4_0's m is -8 d, exact). */
static void convert_row(const dequant_job_t *j, const uint8_t *src, uint8_t *dst, float *tmp)
{
    if (j->fmt == FLX_WFMT_BF16) {
        dequant_row(j->type, src, j->cols, tmp);
        flx_f32_to_bf16_row(tmp, (flx_bf16_t *)dst, j->cols);
        return;
    }
    for (size_t b = 0; b < j->cols / 32; b++) {
        if (j->type == FLX_GGML_Q8_0) {
            const uint8_t *s = src + 34 * b;
            memcpy(dst + FLX_WFMT_Q8_BYTES * b, s + 2, 32);
            wrf(dst + FLX_WFMT_Q8_BYTES * b + 32, flx_f16_to_f32(rd16(s)));
        } else {
            const int q41 = j->type == FLX_GGML_Q4_1;
            const uint8_t *s = src + (q41 ? 20 : 18) * b;
            const float d = flx_f16_to_f32(rd16(s));
            memcpy(dst + FLX_WFMT_Q4_BYTES * b, s + (q41 ? 4 : 2), 16);
            wrf(dst + FLX_WFMT_Q4_BYTES * b + 16, d);
            wrf(dst + FLX_WFMT_Q4_BYTES * b + 20, q41 ? flx_f16_to_f32(rd16(s + 2)) : -8.0f * d);
        }
    }
}

/* Rows [r0, r1), each to its un-permuted place (rows are independent). */
static flx_status_t dequant_rows(void *ctx, const flx_pool_worker_t *w, uint64_t r0, uint64_t r1)
{
    (void)w;
    const dequant_job_t *j = ctx;
    float *tmp = j->fmt == FLX_WFMT_BF16 ? malloc((size_t)j->cols * sizeof *tmp) : NULL;
    if (j->fmt == FLX_WFMT_BF16 && !tmp)
        return flx_error_set(FLX_ERR_NOMEM, "file %s: tensor '%s': row buffer", j->path, j->name);
    flx_status_t st = FLX_OK;
    for (uint64_t r = r0; r < r1 && st == FLX_OK; r++) {
        size_t out = r;
        if (j->head_dim) {
            uint32_t h = (uint32_t)r / j->head_dim, i = (uint32_t)r % j->head_dim, jj = i / 2, tt = i % 2;
            out = (size_t)h * j->head_dim + (size_t)tt * (j->head_dim / 2) + jj;
        }
        const uint8_t *src = j->src + r * j->row_bytes;
        if ((st = check_scales(j, r, src)) == FLX_OK) convert_row(j, src, j->dst + out * j->out_bytes, tmp);
    }
    free(tmp);
    return st;   /* the pool returns the lowest failing chunk's, its message restored on the caller */
}

/* The format a tensor of this ggml type is kept in: the compact block format of its quantization,
 * bf16 for float types or when the caller asked for bf16 everywhere. */
static flx_wfmt_t keep_fmt(const gctx_t *c, uint32_t type)
{
    if (c->bf16_only) return FLX_WFMT_BF16;
    if (type == FLX_GGML_Q4_0 || type == FLX_GGML_Q4_1) return FLX_WFMT_Q4;
    if (type == FLX_GGML_Q8_0) return FLX_WFMT_Q8;
    return FLX_WFMT_BF16;
}

/* A (rows, cols) matrix, GGUF ne = [cols, rows]. head_dim > 0 un-permutes rows per head. */
static flx_status_t load_mat(gctx_t *c, const char *name, uint32_t rows, uint32_t cols, uint32_t head_dim,
                             flx_wmat_t *dst_p)
{
    const flx_gguf_tensor_t *t;
    flx_status_t st = find_tensor(c, name, &t);
    if (st != FLX_OK) return st;
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return flx_error_set(FLX_ERR_FORMAT,
                             "file %s: tensor '%s' has %u dims [%llu, %llu], expected [%u, %u] (ne[0] = in = %u, "
                             "ne[1] = out = %u)", c->path, name, t->n_dims, (unsigned long long)t->ne[0],
                             (unsigned long long)t->ne[1], cols, rows, cols, rows);
    const flx_wfmt_t fmt = keep_fmt(c, t->type);
    const size_t out_bytes = flx_wmat_row_bytes(fmt, cols);
    size_t n;
    if (flx_mul_size((size_t)rows, out_bytes, &n) != FLX_OK)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s' too large", c->path, name);
    uint8_t *dst = flx_model_mem_alloc(c->m, n);
    if (!dst) return FLX_ERR_NOMEM;
    dequant_job_t j = {.path = c->path, .name = name, .src = t->data, .row_bytes = t->nbytes / rows,
                       .out_bytes = out_bytes, .type = t->type, .cols = cols, .head_dim = head_dim, .fmt = fmt,
                       .dst = dst};
    if ((st = flx_pool_for((size_t)rows * cols >= (1u << 16) ? c->pool : NULL, rows, 64, dequant_rows, &j)) != FLX_OK)
        return st;
    *dst_p = (flx_wmat_t){dst, fmt};
    return FLX_OK;
}

static flx_status_t load_vec(gctx_t *c, const char *name, uint32_t len, const float **dst_p)
{
    const flx_gguf_tensor_t *t;
    flx_status_t st = find_tensor(c, name, &t);
    if (st != FLX_OK) return st;
    if (t->n_dims != 1 || t->ne[0] != len)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s' has %u dims, ne[0] = %llu, expected 1 dim of %u",
                             c->path, name, t->n_dims, (unsigned long long)t->ne[0], len);
    if (t->type != FLX_GGML_F32 && t->type != FLX_GGML_F16 && t->type != FLX_GGML_BF16)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: tensor '%s' has ggml type %s; vectors must be F32/F16/BF16",
                             c->path, name, flx_ggml_type_name(t->type));
    float *dst = flx_model_mem_alloc(c->m, (size_t)len * 4);
    if (!dst) return FLX_ERR_NOMEM;
    dequant_row(t->type, t->data, len, dst);
    *dst_p = dst;
    return FLX_OK;
}

static flx_status_t key_name(gctx_t *c, char *buf, size_t cap, const char *suffix)
{
    int n = snprintf(buf, cap, "%s.%s", c->arch, suffix);
    if (n < 0 || (size_t)n >= cap) return flx_error_set(FLX_ERR_INTERNAL, "key name %s.%s", c->arch, suffix);
    return FLX_OK;
}

/* <arch>.suffix as u32; when absent, dflt if have_dflt else FLX_ERR_NOT_FOUND (naming the key). */
static flx_status_t arch_u32(gctx_t *c, const char *suffix, int have_dflt, uint32_t dflt, uint32_t *out)
{
    char k[128];
    flx_status_t st = key_name(c, k, sizeof k, suffix);
    if (st != FLX_OK) return st;
    if (!flx_gguf_find(c->g, k) && have_dflt) {
        *out = dflt;
        return FLX_OK;
    }
    return flx_gguf_get_u32(c->g, k, out);
}

static flx_status_t arch_f32(gctx_t *c, const char *suffix, int have_dflt, float dflt, float *out)
{
    char k[128];
    flx_status_t st = key_name(c, k, sizeof k, suffix);
    if (st != FLX_OK) return st;
    if (!flx_gguf_find(c->g, k) && have_dflt) {
        *out = dflt;
        return FLX_OK;
    }
    return flx_gguf_get_f32(c->g, k, out);
}

/*
 * RoPE scaling. GGUF files spell it two ways: "<arch>.rope.scaling.type" (none/linear/yarn/...),
 * and, for Llama 3.1, a tensor rope_freqs.weight of head_dim/2 per-frequency divisors computed by
 * the converter from config.json's llama3 parameters. Those parameters are not stored, so we take
 * Llama 3.1's (low 1, high 4, original ctx from metadata or 8192, factor = the largest divisor),
 * recompute the divisors and accept only a match.
 */
static flx_status_t rope_scaling(gctx_t *c, flx_model_config_t *cfg)
{
    char k[128];
    flx_status_t st = key_name(c, k, sizeof k, "rope.scaling.type");
    if (st != FLX_OK) return st;
    const char *type = NULL;
    if (flx_gguf_find(c->g, k) && (st = flx_gguf_get_str(c->g, k, &type)) != FLX_OK) return st;
    if (type && strcmp(type, "none") != 0)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: key '%s' = '%s': only llama3 scaling (via rope_freqs) "
                             "is supported", c->path, k, type);
    const flx_gguf_tensor_t *rf = flx_gguf_find_tensor(c->g, "rope_freqs.weight");
    if (!rf) return FLX_OK;
    const uint32_t half = cfg->head_dim / 2;
    if (FLX_NEVER(half > FLX_MODEL_MAX_HEAD_DIM / 2))
        return flx_error_set(FLX_ERR_INTERNAL, "file %s: head_dim %u unchecked before rope scaling", c->path,
                             cfg->head_dim);
    if (rf->type != FLX_GGML_F32 || rf->n_dims != 1 || rf->ne[0] != half)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor 'rope_freqs.weight' is %s with ne[0] = %llu, expected "
                             "F32 of %u", c->path, flx_ggml_type_name(rf->type), (unsigned long long)rf->ne[0], half);
    float div[FLX_MODEL_MAX_HEAD_DIM / 2], plain[FLX_MODEL_MAX_HEAD_DIM / 2], scaled[FLX_MODEL_MAX_HEAD_DIM / 2];
    memcpy(div, rf->data, half * 4);
    float fmax = 1;
    for (uint32_t i = 0; i < half; i++) fmax = div[i] > fmax ? div[i] : fmax;
    if (!(fmax > 1) || !isfinite(fmax)) return FLX_OK; /* all ones: no scaling */
    uint32_t orig;
    if ((st = arch_u32(c, "rope.scaling.original_context_length", 1, 8192, &orig)) != FLX_OK) return st;
    flx_model_config_t t = *cfg;
    t.rope_scaling = FLX_ROPE_NONE;
    flx_rope_inv_freq(&t, plain);
    t.rope_scaling = FLX_ROPE_LLAMA3;
    t.rope_factor = fmax;
    t.rope_low_freq_factor = 1;
    t.rope_high_freq_factor = 4;
    t.rope_orig_ctx = orig;
    flx_rope_inv_freq(&t, scaled);
    for (uint32_t i = 0; i < half; i++) {
        float want = plain[i] / scaled[i];
        if (!(fabsf(div[i] - want) <= 1e-3f * want))
            return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: tensor 'rope_freqs.weight'[%u] = %g does not match "
                                 "llama3 scaling (factor %g, low 1, high 4, original ctx %u gives %g)", c->path, i,
                                 (double)div[i], (double)fmax, orig, (double)want);
    }
    cfg->rope_scaling = FLX_ROPE_LLAMA3;
    cfg->rope_factor = fmax;
    cfg->rope_low_freq_factor = 1;
    cfg->rope_high_freq_factor = 4;
    cfg->rope_orig_ctx = orig;
    return FLX_OK;
}

static flx_status_t read_config(gctx_t *c, flx_model_config_t *cfg)
{
    flx_status_t st;
    memset(cfg, 0, sizeof *cfg);
    if ((st = flx_gguf_get_str(c->g, "general.architecture", &c->arch)) != FLX_OK) return st;
    if (!strcmp(c->arch, "llama")) {
        cfg->arch = FLX_ARCH_LLAMA;
    } else if (!strcmp(c->arch, "qwen2")) {
        cfg->arch = FLX_ARCH_QWEN2;
        cfg->qkv_bias = 1;
    } else {
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: key 'general.architecture' = '%s': supported are llama, "
                             "qwen2", c->path, c->arch);
    }
    uint32_t key_len, val_len, rope_dims;
    if ((st = arch_u32(c, "block_count", 0, 0, &cfg->n_layers)) != FLX_OK ||
        (st = arch_u32(c, "embedding_length", 0, 0, &cfg->hidden)) != FLX_OK ||
        (st = arch_u32(c, "feed_forward_length", 0, 0, &cfg->ffn)) != FLX_OK ||
        (st = arch_u32(c, "attention.head_count", 0, 0, &cfg->n_heads)) != FLX_OK ||
        (st = arch_u32(c, "attention.head_count_kv", 1, cfg->n_heads, &cfg->n_kv_heads)) != FLX_OK ||
        (st = arch_f32(c, "attention.layer_norm_rms_epsilon", 0, 0, &cfg->rms_eps)) != FLX_OK ||
        (st = arch_f32(c, "rope.freq_base", 1, 10000.0f, &cfg->rope_theta)) != FLX_OK ||
        (st = arch_u32(c, "context_length", 0, 0, &cfg->max_ctx)) != FLX_OK)
        return st;
    if (cfg->n_heads == 0 || cfg->hidden % cfg->n_heads != 0)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: %s.embedding_length %u is not a multiple of "
                             "%s.attention.head_count %u", c->path, c->arch, cfg->hidden, c->arch, cfg->n_heads);
    if ((st = arch_u32(c, "attention.key_length", 1, cfg->hidden / cfg->n_heads, &key_len)) != FLX_OK ||
        (st = arch_u32(c, "attention.value_length", 1, key_len, &val_len)) != FLX_OK ||
        (st = arch_u32(c, "rope.dimension_count", 1, key_len, &rope_dims)) != FLX_OK)
        return st;
    if (val_len != key_len || rope_dims != key_len)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: %s.attention.key_length %u, value_length %u and "
                             "rope.dimension_count %u differ", c->path, c->arch, key_len, val_len, rope_dims);
    /* head_dim sizes the RoPE tables read below: checked here, before its first use. */
    if (key_len == 0 || key_len % 16 != 0 || key_len > FLX_MODEL_MAX_HEAD_DIM) {
        char k[128];
        if ((st = key_name(c, k, sizeof k, "attention.key_length")) != FLX_OK) return st;
        if (flx_gguf_find(c->g, k))
            return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: key '%s' = %u: head_dim must be a multiple of 16 "
                                 "in 16..%d", c->path, k, key_len, FLX_MODEL_MAX_HEAD_DIM);
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: %s.embedding_length / %s.attention.head_count = %u: "
                             "head_dim must be a multiple of 16 in 16..%d", c->path, c->arch, c->arch, key_len,
                             FLX_MODEL_MAX_HEAD_DIM);
    }
    cfg->head_dim = key_len;

    const flx_gguf_tensor_t *emb = flx_gguf_find_tensor(c->g, "token_embd.weight");
    if (!emb) return flx_error_set(FLX_ERR_NOT_FOUND, "file %s: tensor 'token_embd.weight' is missing", c->path);
    const flx_gguf_array_t *toks;
    char k[128];
    if ((st = key_name(c, k, sizeof k, "vocab_size")) != FLX_OK) return st;
    if (flx_gguf_find(c->g, k)) {
        if ((st = flx_gguf_get_u32(c->g, k, &cfg->vocab)) != FLX_OK) return st;
    } else if (flx_gguf_get_arr(c->g, "tokenizer.ggml.tokens", &toks) == FLX_OK) {
        if (toks->n > UINT32_MAX)
            return flx_error_set(FLX_ERR_FORMAT, "file %s: tokenizer.ggml.tokens has %llu entries", c->path,
                                 (unsigned long long)toks->n);
        cfg->vocab = (uint32_t)toks->n;
    } else {
        if (emb->n_dims != 2 || emb->ne[1] > UINT32_MAX)
            return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor 'token_embd.weight' has %u dims", c->path,
                                 emb->n_dims);
        cfg->vocab = (uint32_t)emb->ne[1];
    }
    flx_error_clear();
    cfg->tied_embeddings = flx_gguf_find_tensor(c->g, "output.weight") == NULL;
    const char *name = NULL;
    if (flx_gguf_find(c->g, "general.name") && flx_gguf_get_str(c->g, "general.name", &name) == FLX_OK) {
        flx_model_name_set(cfg, name, strlen(name));
    } else {
        const char *slash = strrchr(c->path, '/');
        name = slash ? slash + 1 : c->path;
        flx_model_name_set(cfg, name, strlen(name));
    }
    if ((st = rope_scaling(c, cfg)) != FLX_OK) return st;
    if ((st = flx_model_config_check(cfg)) != FLX_OK) {
        char why[FLX_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", flx_error_msg());
        return flx_error_set(st, "file %s: %s", c->path, why);
    }
    return FLX_OK;
}

/* A layer's tensors, "blk.<l>." + suffix, in load_layer's order; layer_shape gives each one's shape. */
#define LAYER_TENSORS 12
static const char *const LAYER_SFX[LAYER_TENSORS] = {
    "attn_norm.weight", "attn_q.weight",   "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
    "ffn_gate.weight",  "ffn_up.weight",   "ffn_down.weight", "attn_q.bias", "attn_k.bias",        "attn_v.bias"};

/* Tensor i of LAYER_SFX: (rows, cols) of a matrix, or rows 0 and the length of a vector. */
static void layer_shape(const flx_model_config_t *cfg, int i, uint32_t *rows, uint32_t *cols)
{
    const uint32_t H = cfg->hidden, qd = cfg->n_heads * cfg->head_dim, kvd = cfg->n_kv_heads * cfg->head_dim;
    const uint32_t F = cfg->ffn;
    static const int8_t rsel[LAYER_TENSORS] = {0, 2, 3, 3, 1, 0, 4, 4, 1, 0, 0, 0};   /* 0: a vector */
    static const int8_t csel[LAYER_TENSORS] = {1, 1, 1, 1, 2, 1, 1, 1, 4, 2, 3, 3};
    const uint32_t dim[5] = {0, H, qd, kvd, F};
    *rows = dim[rsel[i]], *cols = dim[csel[i]];
}

static flx_status_t load_layer(gctx_t *c, uint32_t l)
{
    const flx_model_config_t *cfg = &c->m->cfg;
    flx_layer_weights_t *w = &c->m->layers[l];
    const uint32_t H = cfg->hidden, qd = cfg->n_heads * cfg->head_dim, kvd = cfg->n_kv_heads * cfg->head_dim;
    const uint32_t perm = cfg->arch == FLX_ARCH_LLAMA ? cfg->head_dim : 0;
    char n[LAYER_TENSORS][96];
    for (int i = 0; i < LAYER_TENSORS; i++) snprintf(n[i], sizeof n[i], "blk.%u.%s", l, LAYER_SFX[i]);
    flx_status_t st;
    if ((st = load_vec(c, n[0], H, &w->attn_norm)) != FLX_OK || (st = load_mat(c, n[1], qd, H, perm, &w->wq)) != FLX_OK ||
        (st = load_mat(c, n[2], kvd, H, perm, &w->wk)) != FLX_OK || (st = load_mat(c, n[3], kvd, H, 0, &w->wv)) != FLX_OK ||
        (st = load_mat(c, n[4], H, qd, 0, &w->wo)) != FLX_OK || (st = load_vec(c, n[5], H, &w->ffn_norm)) != FLX_OK ||
        (st = load_mat(c, n[6], cfg->ffn, H, 0, &w->w_gate)) != FLX_OK ||
        (st = load_mat(c, n[7], cfg->ffn, H, 0, &w->w_up)) != FLX_OK ||
        (st = load_mat(c, n[8], H, cfg->ffn, 0, &w->w_down)) != FLX_OK)
        return st;
    if (!cfg->qkv_bias && flx_gguf_find_tensor(c->g, n[9]))
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: tensor '%s': QKV biases are not supported for %s", c->path,
                             n[9], c->arch);
    if (cfg->qkv_bias &&
        ((st = load_vec(c, n[9], qd, &w->bq)) != FLX_OK || (st = load_vec(c, n[10], kvd, &w->bk)) != FLX_OK ||
         (st = load_vec(c, n[11], kvd, &w->bv)) != FLX_OK))
        return st;
    return FLX_OK;
}

/* The bytes the model's weights take (matrices in their formats, norm gains and biases as fp32),
 * over the tensors the file holds in the shape the config asks (others are refused by load_mat /
 * load_vec, after the fact), each rounded up to 64: reserved at once so that the weights lie on
 * huge pages, one after another (flx_model_mem_reserve). Like the loads, it counts only what the
 * file holds: a file cannot make it reserve for tensors it merely declares. */
static size_t weight_bytes_held(gctx_t *c, const flx_model_config_t *cfg)
{
    size_t total = 0;
    for (int64_t i = -3; i < (int64_t)cfg->n_layers * LAYER_TENSORS; i++) {
        char name[96];
        uint32_t r = cfg->vocab, k = cfg->hidden;
        if (i == -3) snprintf(name, sizeof name, "token_embd.weight");
        else if (i == -2 && cfg->tied_embeddings) continue;
        else if (i == -2) snprintf(name, sizeof name, "output.weight");
        else if (i == -1) snprintf(name, sizeof name, "output_norm.weight"), r = 0;
        else
            snprintf(name, sizeof name, "blk.%u.%s", (uint32_t)(i / LAYER_TENSORS), LAYER_SFX[i % LAYER_TENSORS]),
                layer_shape(cfg, (int)(i % LAYER_TENSORS), &r, &k);
        const flx_gguf_tensor_t *t = flx_gguf_find_tensor(c->g, name);
        size_t b;
        if (!t) continue;
        if (r == 0) {   /* a vector: fp32 */
            if (t->n_dims != 1 || t->ne[0] != k ||
                (t->type != FLX_GGML_F32 && t->type != FLX_GGML_F16 && t->type != FLX_GGML_BF16))
                continue;
            b = (size_t)k * 4;
        } else if (!type_supported(t->type) || t->n_dims != 2 || t->ne[0] != k || t->ne[1] != r ||
                   flx_mul_size((size_t)r, flx_wmat_row_bytes(keep_fmt(c, t->type), k), &b) != FLX_OK) {
            continue;
        }
        if (b > SIZE_MAX / 4 || total > SIZE_MAX / 4) return 0;   /* nothing reserved: each load sizes itself */
        total += FLX_DIV_UP(b, 64) * 64;
    }
    return total;
}

flx_status_t flx_model_load_gguf(const char *path, flx_model_t **model_p)
{
    return flx_model_load_gguf_pool(path, NULL, model_p);
}

flx_status_t flx_model_load_gguf_pool(const char *path, flx_pool_h pool, flx_model_t **model_p)
{
    return flx_model_load_gguf_as(path, pool, FLX_WEIGHTS_COMPACT, model_p);
}

flx_status_t flx_model_load_gguf_as(const char *path, flx_pool_h pool, flx_weights_t w, flx_model_t **model_p)
{
    if (w != FLX_WEIGHTS_COMPACT && w != FLX_WEIGHTS_BF16)
        return flx_error_set(FLX_ERR_INVALID, "file %s: weights %d is neither compact nor bf16", path, (int)w);
    gctx_t c = {.path = path, .pool = pool, .bf16_only = w == FLX_WEIGHTS_BF16};
    flx_model_config_t cfg;
    flx_status_t st = flx_gguf_open(path, &c.g);
    if (st != FLX_OK) return st;
    if ((st = read_config(&c, &cfg)) != FLX_OK) goto out;
    if ((st = flx_model_alloc(&cfg, &c.m)) != FLX_OK) goto out;
    if ((st = flx_model_mem_reserve(c.m, weight_bytes_held(&c, &cfg))) != FLX_OK) goto out;
    flx_model_t *m = c.m;
    if ((st = load_mat(&c, "token_embd.weight", cfg.vocab, cfg.hidden, 0, &m->tok_embd)) != FLX_OK) goto out;
    if ((st = load_vec(&c, "output_norm.weight", cfg.hidden, &m->out_norm)) != FLX_OK) goto out;
    if (cfg.tied_embeddings) m->lm_head = m->tok_embd;
    else if ((st = load_mat(&c, "output.weight", cfg.vocab, cfg.hidden, 0, &m->lm_head)) != FLX_OK) goto out;
    for (uint32_t l = 0; l < cfg.n_layers; l++) {
        if ((st = load_layer(&c, l)) != FLX_OK) goto out;
        flx_progress_report("loading model", l + 1, cfg.n_layers, "layers");
    }
    flx_log_info("model", "loaded %s (%s, %u layers, hidden %u, %u/%u heads of %u) from %s", cfg.name, c.arch,
                 cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, path);
    *model_p = m;
    c.m = NULL;
out:
    flx_model_destroy(c.m);
    flx_gguf_close(c.g);
    return st;
}
