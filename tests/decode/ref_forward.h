/*
 * ref_forward.h - the double-precision reference forward pass of a flx_model_t, the oracle of the
 * CPU forward's test (test_forward.c) and the GPU forward's (test_forward_gpu.c): per token, in
 * double, RMSNorm, projections with biases, rotate-half RoPE with flx_rope_inv_freq, K and V
 * rounded to bf16, dense causal softmax, SwiGLU, the LM head.
 *
 * Rounding K and V to bf16 is where two correct forward passes may part: a value within fp32
 * rounding of the midpoint of two bf16 neighbours can go either way. The reference takes the
 * tested model's choice for exactly those values (round_kv), so a pass is held to the reference
 * with fp32-accumulation tolerances however its K/V roundings went.
 */
#ifndef FLX_REF_FORWARD_H
#define FLX_REF_FORWARD_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "flx/model.h"

/* A two-layer test model config of an architecture and shape (the reference's shapes: GQA group
 * heads / kv, head dim D, tied or separate LM head; Qwen2 brings the QKV bias and its RoPE base). */
static flx_model_config_t ref_cfg_make(flx_arch_t arch, uint32_t hidden, uint32_t heads, uint32_t kv, uint32_t D,
                                       uint32_t ffn, uint32_t vocab, int tied)
{
    flx_model_config_t c = {0};
    c.arch = arch;
    c.n_layers = 2;
    c.hidden = hidden;
    c.n_heads = heads;
    c.n_kv_heads = kv;
    c.head_dim = D;
    c.ffn = ffn;
    c.vocab = vocab;
    c.max_ctx = 4096;
    c.rms_eps = 1e-5f;
    c.rope_theta = arch == FLX_ARCH_QWEN2 ? 1e6f : 1e4f;
    c.tied_embeddings = tied;
    c.qkv_bias = arch == FLX_ARCH_QWEN2;
    snprintf(c.name, sizeof c.name, "test-%s-G%u-D%u-%s", arch == FLX_ARCH_QWEN2 ? "qwen2" : "llama", heads / kv, D,
             tied ? "tied" : "untied");
    return c;
}

typedef struct {
    float *logits;    /* (n, vocab) */
    float *k, *v;     /* (L, Hkv, n, D) the bf16-rounded K, V as floats */
    float *q;         /* (L, n, Hq, D) */
    int ties;         /* K/V elements where the model's rounding of a near-midpoint value was taken */
} ref_out_t;

/* W in any format: its values from the formats' scalar definition (flx_wmat_row_f32). */
static void ref_matvec(const flx_wmat_t *w, const float *b, size_t rows, size_t cols, const double *x, double *y)
{
    float *row = malloc(cols * sizeof *row);
    for (size_t r = 0; r < rows; r++) {
        double s = b ? b[r] : 0.0;
        flx_wmat_row_f32(w, cols, r, 0, cols, row);
        for (size_t c = 0; c < cols; c++) s += (double)row[c] * x[c];
        y[r] = s;
    }
    free(row);
}

static void ref_rmsnorm(const double *x, const float *g, double eps, size_t H, double *y)
{
    double ss = 0;
    for (size_t i = 0; i < H; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / H + eps);
    for (size_t i = 0; i < H; i++) y[i] = x[i] * r * g[i];
}

static void ref_rope(double *x, const float *inv_freq, uint32_t D, uint32_t pos)
{
    for (uint32_t i = 0; i < D / 2; i++) {
        double a = x[i], b = x[i + D / 2], ang = (double)pos * inv_freq[i];
        x[i] = a * cos(ang) - b * sin(ang);
        x[i + D / 2] = b * cos(ang) + a * sin(ang);
    }
}

/* x rounded to bf16. Where x lies so close to the midpoint of two bf16 values that fp32
 * accumulation may land on the other side (within 1e-5, far below the 2^-9 relative half-ulp), the
 * model's choice mv is taken: both roundings are right, and taking the same one keeps the
 * comparison free of one-ulp K/V differences that would otherwise dominate the logit error. */
static double round_kv(double x, float mv, int *ties)
{
    double r = flx_bf16_to_f32(flx_f32_to_bf16((float)x));
    if (!isnan(mv) && mv != r && fabs(mv - x) <= fabs(r - x) + 1e-5 * (1 + fabs(x))) {
        (*ties)++;
        return mv;
    }
    return r;
}

/* model_k, model_v: (L, Hkv, n, D) the model's rounded K, V (tie-breakers, see round_kv), or NULL. */
static void ref_forward(const flx_model_t *m, const int32_t *tok, uint32_t n, const float *model_k,
                        const float *model_v, ref_out_t *out)
{
    const flx_model_config_t *c = &m->cfg;
    const size_t H = c->hidden, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads, G = Hq / Hkv;
    const size_t qd = Hq * D, kvd = Hkv * D, F = c->ffn, V = c->vocab;
    double *x = malloc(n * H * 8), *xn = malloc(H * 8), *q = malloc(n * qd * 8), *k = malloc(n * kvd * 8);
    double *v = malloc(n * kvd * 8), *o = malloc(qd * 8), *t1 = malloc(FLX_MAX(F, H) * 8), *g = malloc(F * 8);
    double *u = malloc(F * 8), *p = malloc(n * 8);
    float inv_freq[FLX_MODEL_MAX_HEAD_DIM / 2];
    flx_rope_inv_freq(c, inv_freq);
    float *erow = malloc(H * sizeof *erow);
    for (size_t t = 0; t < n; t++) {
        flx_wmat_row_f32(&m->tok_embd, H, (size_t)tok[t], 0, H, erow);
        for (size_t i = 0; i < H; i++) x[t * H + i] = erow[i];
    }
    free(erow);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        for (size_t t = 0; t < n; t++) {
            ref_rmsnorm(x + t * H, w->attn_norm, c->rms_eps, H, xn);
            ref_matvec(&w->wq, w->bq, qd, H, xn, q + t * qd);
            ref_matvec(&w->wk, w->bk, kvd, H, xn, k + t * kvd);
            ref_matvec(&w->wv, w->bv, kvd, H, xn, v + t * kvd);
            for (size_t h = 0; h < Hq; h++) ref_rope(q + t * qd + h * D, inv_freq, (uint32_t)D, (uint32_t)t);
            for (size_t h = 0; h < Hkv; h++) ref_rope(k + t * kvd + h * D, inv_freq, (uint32_t)D, (uint32_t)t);
            for (size_t h = 0; h < Hkv; h++)
                for (size_t d = 0; d < D; d++) {
                    size_t i = h * D + d, at = ((l * Hkv + h) * n + t) * D + d;
                    k[t * kvd + i] = round_kv(k[t * kvd + i], model_k ? model_k[at] : NAN, &out->ties);
                    v[t * kvd + i] = round_kv(v[t * kvd + i], model_v ? model_v[at] : NAN, &out->ties);
                }
            for (size_t h = 0; h < Hkv; h++)
                for (size_t d = 0; d < D; d++) {
                    out->k[((l * Hkv + h) * n + t) * D + d] = (float)k[t * kvd + h * D + d];
                    out->v[((l * Hkv + h) * n + t) * D + d] = (float)v[t * kvd + h * D + d];
                }
            for (size_t i = 0; i < qd; i++) out->q[(l * n + t) * qd + i] = (float)q[t * qd + i];
        }
        for (size_t t = 0; t < n; t++) {
            for (size_t h = 0; h < Hq; h++) {
                const double *qh = q + t * qd + h * D;
                const size_t kh = h / G;
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j <= t; j++) {
                    double s = 0;
                    for (size_t d = 0; d < D; d++) s += qh[d] * k[j * kvd + kh * D + d];
                    p[j] = s / sqrt((double)D);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (size_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (size_t d = 0; d < D; d++) {
                    double a = 0;
                    for (size_t j = 0; j <= t; j++) a += p[j] * v[j * kvd + kh * D + d];
                    o[h * D + d] = a / sum;
                }
            }
            ref_matvec(&w->wo, NULL, H, qd, o, t1);
            for (size_t i = 0; i < H; i++) x[t * H + i] += t1[i];
            ref_rmsnorm(x + t * H, w->ffn_norm, c->rms_eps, H, xn);
            ref_matvec(&w->w_gate, NULL, F, H, xn, g);
            ref_matvec(&w->w_up, NULL, F, H, xn, u);
            for (size_t i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(&w->w_down, NULL, H, F, g, t1);
            for (size_t i = 0; i < H; i++) x[t * H + i] += t1[i];
        }
    }
    double *lg = malloc(V * 8);
    for (size_t t = 0; t < n; t++) {
        ref_rmsnorm(x + t * H, m->out_norm, c->rms_eps, H, xn);
        ref_matvec(&m->lm_head, NULL, V, H, xn, lg);
        for (size_t i = 0; i < V; i++) out->logits[t * V + i] = (float)lg[i];
    }
    free(lg), free(x), free(xn), free(q), free(k), free(v), free(o), free(t1), free(g), free(u), free(p);
}

/* One decode step of one sequence over a dense cache kc, vc (L, Hkv, cap, D): the new k, v (Hkv, D)
 * rounded to bf16 at position pos of layer, then every query head of q (Hq, D) attends over
 * positions [0, pos] in double; o (Hq, D). The attention callback of the forward tests. */
static void ref_dense_step(flx_bf16_t *kc, flx_bf16_t *vc, uint32_t cap, uint32_t Hkv, uint32_t Hq, uint32_t D,
                           uint32_t layer, uint32_t pos, const float *q, const float *k, const float *v, float *o)
{
    const uint32_t G = Hq / Hkv;
    for (uint32_t h = 0; h < Hkv; h++)
        for (uint32_t d = 0; d < D; d++) {
            size_t at = (((size_t)layer * Hkv + h) * cap + pos) * D + d;
            kc[at] = flx_f32_to_bf16(k[(size_t)h * D + d]);
            vc[at] = flx_f32_to_bf16(v[(size_t)h * D + d]);
        }
    double *p = malloc((pos + 1) * sizeof(double));
    for (uint32_t hq = 0; hq < Hq; hq++) {
        const float *qh = q + (size_t)hq * D;
        const flx_bf16_t *kh = kc + ((size_t)layer * Hkv + hq / G) * cap * D;
        const flx_bf16_t *vh = vc + ((size_t)layer * Hkv + hq / G) * cap * D;
        double mx = -INFINITY, sum = 0;
        for (uint32_t j = 0; j <= pos; j++) {
            double s = 0;
            for (uint32_t d = 0; d < D; d++) s += (double)qh[d] * flx_bf16_to_f32(kh[(size_t)j * D + d]);
            p[j] = s / sqrt((double)D);
            mx = p[j] > mx ? p[j] : mx;
        }
        for (uint32_t j = 0; j <= pos; j++) sum += (p[j] = exp(p[j] - mx));
        for (uint32_t d = 0; d < D; d++) {
            double acc = 0;
            for (uint32_t j = 0; j <= pos; j++) acc += p[j] * flx_bf16_to_f32(vh[(size_t)j * D + d]);
            o[(size_t)hq * D + d] = (float)(acc / sum);
        }
    }
    free(p);
}

#endif
