/*
 * model.c - model config checks, backing memory, random initialisation, RoPE frequencies.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "flx/log.h"
#include "flx/tokenizer.h"
#include "flx/util.h"
#include "model_internal.h"

flx_status_t flx_model_config_check(const flx_model_config_t *c)
{
    if (!c) return flx_error_set(FLX_ERR_INVALID, "model config is NULL");
    if (c->arch != FLX_ARCH_LLAMA && c->arch != FLX_ARCH_QWEN2)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: unknown architecture %d", (int)c->arch);
    if (c->n_layers == 0 || c->n_layers > FLX_MODEL_MAX_LAYERS)
        return flx_error_set(FLX_ERR_INVALID, "model config: n_layers %u not in 1..%d", c->n_layers,
                             FLX_MODEL_MAX_LAYERS);
    if (c->n_heads == 0 || c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads != 0 || c->n_heads > 1024)
        return flx_error_set(FLX_ERR_INVALID, "model config: n_heads %u is not a multiple of n_kv_heads %u",
                             c->n_heads, c->n_kv_heads);
    if (c->n_heads / c->n_kv_heads > 64)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: GQA group %u above 64", c->n_heads / c->n_kv_heads);
    if (c->head_dim == 0 || c->head_dim % 16 != 0 || c->head_dim > FLX_MODEL_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: head_dim %u not a multiple of 16 in 16..%d",
                             c->head_dim, FLX_MODEL_MAX_HEAD_DIM);
    if (c->hidden == 0 || c->hidden % 16 != 0 || c->hidden > (1u << 16))
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: hidden %u not a multiple of 16 up to 65536", c->hidden);
    if (c->ffn == 0 || c->ffn % 16 != 0 || c->ffn > (1u << 18))
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: ffn %u not a multiple of 16 up to 262144", c->ffn);
    if (c->max_ctx == 0)
        return flx_error_set(FLX_ERR_INVALID, "model config: max_ctx (context length) is 0");
    if (c->vocab == 0 || c->vocab > (1u << 22))
        return flx_error_set(FLX_ERR_INVALID, "model config: vocab %u out of range", c->vocab);
    if (c->max_ctx > FLX_MODEL_MAX_CTX)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: max_ctx %u above %u", c->max_ctx, FLX_MODEL_MAX_CTX);
    if (!(c->rms_eps > 0 && c->rms_eps < 1))
        return flx_error_set(FLX_ERR_INVALID, "model config: rms_eps %g not in (0, 1)", (double)c->rms_eps);
    if (!(c->rope_theta > 1 && c->rope_theta < 1e12f))
        return flx_error_set(FLX_ERR_INVALID, "model config: rope_theta %g out of range", (double)c->rope_theta);
    if (c->rope_scaling == FLX_ROPE_LLAMA3) {
        if (!(c->rope_factor >= 1) || !(c->rope_low_freq_factor > 0) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_orig_ctx == 0 ||
            !isfinite(c->rope_factor) || !isfinite(c->rope_high_freq_factor))
            return flx_error_set(FLX_ERR_INVALID,
                                 "model config: llama3 rope scaling factor %g low %g high %g original ctx %u invalid",
                                 (double)c->rope_factor, (double)c->rope_low_freq_factor,
                                 (double)c->rope_high_freq_factor, c->rope_orig_ctx);
    } else if (c->rope_scaling != FLX_ROPE_NONE) {
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: rope scaling %d", (int)c->rope_scaling);
    }
    if (c->qkv_bias && c->arch != FLX_ARCH_QWEN2)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "model config: QKV biases are only supported for Qwen2");
    return FLX_OK;
}

flx_status_t flx_model_mem_add(flx_model_t *m, void *p, size_t len, flx_mem_kind_t kind)
{
    struct flx_model_mem *mm = m->mem;
    if (mm->n == mm->cap) {
        size_t nc = mm->cap ? 2 * mm->cap : 16;
        flx_mem_region_t *nr = realloc(mm->r, nc * sizeof *nr);
        if (!nr) return flx_error_set(FLX_ERR_NOMEM, "model memory list");
        mm->r = nr;
        mm->cap = nc;
    }
    mm->r[mm->n++] = (flx_mem_region_t){p, len, kind, NULL};
    return FLX_OK;
}

flx_status_t flx_model_mem_add_release(flx_model_t *m, void *p, void (*release)(void *p))
{
    flx_status_t st = flx_model_mem_add(m, p, 0, FLX_MEM_RELEASE);
    if (st == FLX_OK) m->mem->r[m->mem->n - 1].release = release;
    return st;
}

flx_status_t flx_model_mem_reserve(flx_model_t *m, size_t bytes)
{
    if (bytes == 0 || m->mem->arena) return FLX_OK;
    void *p = flx_stream_alloc(bytes);
    if (!p) return flx_error_set(FLX_ERR_NOMEM, "model: %zu bytes of weights", bytes);
    if (flx_model_mem_add(m, p, bytes, FLX_MEM_HEAP) != FLX_OK) {
        flx_aligned_free(p);
        return FLX_ERR_NOMEM;
    }
    m->mem->arena = p, m->mem->arena_len = bytes, m->mem->arena_used = 0;
    return FLX_OK;
}

void *flx_model_mem_alloc(flx_model_t *m, size_t bytes)
{
    struct flx_model_mem *mm = m->mem;
    const size_t need = FLX_DIV_UP(bytes, 64) * 64;
    if (mm->arena && need >= bytes && need <= mm->arena_len - mm->arena_used) {
        void *q = mm->arena + mm->arena_used;
        mm->arena_used += need;
        return q;
    }
    void *p = flx_stream_alloc(bytes);   /* read every step: huge pages from 1 MiB up */
    if (!p) {
        flx_error_set(FLX_ERR_NOMEM, "model: %zu bytes of weights", bytes);
        return NULL;
    }
    if (flx_model_mem_add(m, p, bytes, FLX_MEM_HEAP) != FLX_OK) {
        flx_aligned_free(p);
        return NULL;
    }
    return p;
}

flx_status_t flx_model_alloc(const flx_model_config_t *cfg, flx_model_t **model_p)
{
    flx_status_t st = flx_model_config_check(cfg);
    if (st != FLX_OK) return st;
    flx_model_t *m = calloc(1, sizeof *m);
    struct flx_model_mem *mm = calloc(1, sizeof *mm);
    flx_layer_weights_t *layers = calloc(cfg->n_layers, sizeof *layers);
    if (!m || !mm || !layers) {
        free(m), free(mm), free(layers);
        return flx_error_set(FLX_ERR_NOMEM, "model of %u layers", cfg->n_layers);
    }
    m->cfg = *cfg;
    m->mem = mm;
    m->layers = layers;
    *model_p = m;
    return FLX_OK;
}

void flx_model_destroy(flx_model_t *m)
{
    if (!m) return;
    if (m->mem) {
        for (size_t i = m->mem->n; i-- > 0;) {
            flx_mem_region_t *r = &m->mem->r[i];
            if (r->kind == FLX_MEM_MMAP) munmap(r->p, r->len);
            else if (r->kind == FLX_MEM_RELEASE) r->release(r->p);
            else flx_aligned_free(r->p);
        }
        free(m->mem->r);
        free(m->mem);
    }
    free(m->layers);
    free(m);
}

/* Bytes a decode step reads, the matrices in their formats or (bf16) all as bf16. */
static size_t weight_bytes(const flx_model_t *m, int bf16)
{
    const flx_model_config_t *c = &m->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim, H = c->hidden;
    const size_t F = c->ffn;
    size_t total = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
#define RB(mat, k) flx_wmat_row_bytes(bf16 ? FLX_WFMT_BF16 : (mat).fmt, (k))
        total += qd * RB(w->wq, H) + kvd * RB(w->wk, H) + kvd * RB(w->wv, H) + H * RB(w->wo, qd) +
                 F * RB(w->w_gate, H) + F * RB(w->w_up, H) + H * RB(w->w_down, F) + 4 * 2 * H;
        if (c->qkv_bias) total += 4 * (qd + 2 * kvd);
    }
    /* A decode step reads the lm_head once (the embedding rows it reads are negligible). */
    return total + c->vocab * RB(m->lm_head, H) + 4 * H;
#undef RB
}

size_t flx_model_weight_bytes(const flx_model_t *m)
{
    return weight_bytes(m, 0);
}

size_t flx_model_weight_bytes_bf16(const flx_model_t *m)
{
    return weight_bytes(m, 1);
}

flx_status_t flx_model_check_bf16(const flx_model_t *m, const char *what)
{
    const flx_wmat_t *top[2] = {&m->tok_embd, &m->lm_head};
    for (int i = 0; i < 2; i++)
        if (top[i]->fmt != FLX_WFMT_BF16)
            return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: %s is stored as %s; only bf16 matrices are written (load "
                                 "the GGUF with FLX_WEIGHTS_BF16)", what,
                                 i ? "lm_head" : "tok_embd", flx_wfmt_name(top[i]->fmt));
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        const flx_wmat_t *mats[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        static const char *const names[7] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};
        for (int i = 0; i < 7; i++)
            if (mats[i]->fmt != FLX_WFMT_BF16)
                return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: layer %u %s is stored as %s; only bf16 matrices are "
                                     "written (load the GGUF with FLX_WEIGHTS_BF16)", what, l,
                                     names[i], flx_wfmt_name(mats[i]->fmt));
    }
    return FLX_OK;
}

void flx_rope_inv_freq(const flx_model_config_t *c, float *inv_freq)
{
    const uint32_t half = c->head_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / (double)c->head_dim);
        if (c->rope_scaling == FLX_ROPE_LLAMA3) {
            /* Llama-3.1: long wavelengths are slowed by factor, short ones kept, a smooth blend between. */
            double low_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
            double high_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
            double wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f = f / c->rope_factor;
            } else if (wl >= high_wl) {
                double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

/* Fills n bf16 values ~ N(0, std). */
static void fill_bf16(flx_rng_t *rng, flx_bf16_t *w, size_t n, double std)
{
    for (size_t i = 0; i < n; i++) w[i] = flx_f32_to_bf16((float)(flx_rng_normal(rng) * std));
}

static void fill_gain(flx_rng_t *rng, float *g, size_t n)
{
    for (size_t i = 0; i < n; i++) g[i] = (float)(1.0 + 0.1 * flx_rng_normal(rng));
}

flx_status_t flx_model_init_random(const flx_model_config_t *cfg, uint64_t seed, flx_model_t **model_p)
{
    flx_model_t *m;
    flx_status_t st = flx_model_alloc(cfg, &m);
    if (st != FLX_OK) return st;
    const flx_model_config_t *c = &m->cfg;
    const size_t H = c->hidden, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t F = c->ffn, V = c->vocab;
    flx_rng_t rng;
    flx_rng_seed(&rng, seed);
    flx_bf16_t *emb = flx_model_mem_alloc(m, V * H * 2);
    float *onorm = flx_model_mem_alloc(m, H * 4);
    if (!emb || !onorm) goto nomem;
    fill_bf16(&rng, emb, V * H, 1.0);   /* RMSNorm follows: the scale is immaterial */
    fill_gain(&rng, onorm, H);
    m->tok_embd = (flx_wmat_t){emb, FLX_WFMT_BF16};
    m->out_norm = onorm;
    if (c->tied_embeddings) {
        m->lm_head = m->tok_embd;
    } else {
        flx_bf16_t *head = flx_model_mem_alloc(m, V * H * 2);
        if (!head) goto nomem;
        fill_bf16(&rng, head, V * H, 1.0 / sqrt((double)H));
        m->lm_head = (flx_wmat_t){head, FLX_WFMT_BF16};
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        flx_layer_weights_t *w = &m->layers[l];
        flx_bf16_t *wq = flx_model_mem_alloc(m, qd * H * 2), *wk = flx_model_mem_alloc(m, kvd * H * 2);
        flx_bf16_t *wv = flx_model_mem_alloc(m, kvd * H * 2), *wo = flx_model_mem_alloc(m, H * qd * 2);
        flx_bf16_t *wg = flx_model_mem_alloc(m, F * H * 2), *wu = flx_model_mem_alloc(m, F * H * 2);
        flx_bf16_t *wd = flx_model_mem_alloc(m, H * F * 2);
        float *an = flx_model_mem_alloc(m, H * 4), *fn = flx_model_mem_alloc(m, H * 4);
        if (!wq || !wk || !wv || !wo || !wg || !wu || !wd || !an || !fn) goto nomem;
        /* Scales keep activations O(1) through depth, so attention is neither flat nor one-hot. */
        fill_bf16(&rng, wq, qd * H, 1.5 / sqrt((double)H));
        fill_bf16(&rng, wk, kvd * H, 1.5 / sqrt((double)H));
        fill_bf16(&rng, wv, kvd * H, 1.0 / sqrt((double)H));
        fill_bf16(&rng, wo, H * qd, 0.5 / sqrt((double)qd));
        fill_bf16(&rng, wg, F * H, 1.0 / sqrt((double)H));
        fill_bf16(&rng, wu, F * H, 1.0 / sqrt((double)H));
        fill_bf16(&rng, wd, H * F, 0.5 / sqrt((double)F));
        fill_gain(&rng, an, H);
        fill_gain(&rng, fn, H);
#define BF(p) ((flx_wmat_t){(p), FLX_WFMT_BF16})
        *w = (flx_layer_weights_t){.attn_norm = an, .wq = BF(wq), .wk = BF(wk), .wv = BF(wv), .wo = BF(wo),
                                   .ffn_norm = fn, .w_gate = BF(wg), .w_up = BF(wu), .w_down = BF(wd)};
#undef BF
        if (c->qkv_bias) {
            float *bq = flx_model_mem_alloc(m, qd * 4), *bk = flx_model_mem_alloc(m, kvd * 4);
            float *bv = flx_model_mem_alloc(m, kvd * 4);
            if (!bq || !bk || !bv) goto nomem;
            for (size_t i = 0; i < qd; i++) bq[i] = (float)(0.1 * flx_rng_normal(&rng));
            for (size_t i = 0; i < kvd; i++) bk[i] = (float)(0.1 * flx_rng_normal(&rng));
            for (size_t i = 0; i < kvd; i++) bv[i] = (float)(0.1 * flx_rng_normal(&rng));
            w->bq = bq, w->bk = bk, w->bv = bv;
        }
    }
    *model_p = m;
    return FLX_OK;
nomem:
    st = FLX_ERR_NOMEM; /* message set by flx_model_mem_alloc */
    flx_model_destroy(m);
    return st;
}

void flx_model_name_set(flx_model_config_t *cfg, const char *name, size_t len)
{
    const size_t n = flx_utf8_repair(name, len, cfg->name, sizeof cfg->name);
    if (n != len || memcmp(cfg->name, name, n) != 0)
        flx_log_warn("model", "model name '%.*s' (%zu bytes) is not valid UTF-8 or longer than the %zu bytes kept: "
                     "named '%s' (set model-id to choose the id clients name)",
                     (int)FLX_MIN(len, 512), name, len, sizeof cfg->name - 1, cfg->name);
}
