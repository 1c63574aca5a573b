/*
 * forward.c - prefill and decode forward passes of a flx_model_t (flx/forward.h).
 *
 * DESIGN
 * Activations are token-major fp32 matrices (n, width) in a workspace carved once at plan time;
 * every projection is one call into gemv.c (GEMM for prompts, fused GEMV for decode batches, where
 * q|k|v and gate|up each share one pass so every weight row is read once per step).
 *
 * Prefill attention is causal over the prompt itself, blocked and streamed: one work item is (KV
 * head, block of query tokens); its rows are the G query heads of the group for each token of the
 * block (so each K/V block is used by the whole group while in cache), and it walks key blocks
 * with an online softmax (running max m, sum l, output acc per row), so memory is O(block) and an
 * 8K-token prompt needs no n^2 buffer. K and V are rounded to bf16 once, the rounded values feed
 * both the layer's own attention and the on_layer sink, so a prefill and the decode steps that
 * continue it see identical KV. K is repacked once per layer into the micro-kernel's panel layout
 * (keys as columns); V is used in place as (keys, D). Items are taken dynamically, longest first,
 * because causal items differ in cost.
 *
 * Workspace per prompt token: x, xn, q, o, k, v in fp32 plus rounded K, V (bf16 and fp32 copies
 * for the sink and the micro-kernel), about 4 (2 hidden + 2 Hq D + 5 Hkv D) bytes; the FFN runs in
 * chunks of FFN_CHUNK tokens so its (tokens, ffn) buffers stay small (SmolLM2-135M at 8K tokens:
 * ~110 MB in all).
 *
 * Every parallel part is a run of the workspace's pool (flx/pool.h): GEMV row chunks, GEMM (token
 * block, row group) items, attention items, row-wise norms and RoPE. Each output element is
 * computed inside one chunk in a fixed order, so results are bitwise the same for any number of
 * workers. Decode: a step's cost is the weight bytes; per layer it runs four pool runs (q|k|v,
 * the output projection, gate|up, down: as few as the data dependencies allow), the small
 * row-wise steps of a decode batch on the driving thread, and the caller's attention between the
 * QKV and output projections, timed separately. The prefill's projections are fused the same way
 * (q|k|v one run, gate|up one run, per FFN chunk).
 *
 * RoPE angles are pos * inv_freq[i] in double (positions up to 2^20 keep full fp32 accuracy).
 */
#include <math.h>
#include <string.h>

#include "flx/cpu.h"
#include "flx/forward.h"
#include "flx/progress.h"
#include "flx/util.h"
#include "gemv.h"

#define ATT_ROWS 128   /* query rows (tokens x group heads) per attention item */
#define ATT_KB 128     /* keys per block: a multiple of every panel width */
#define FFN_CHUNK 512  /* prefill tokens per FFN pass: bounds the (tokens, ffn) gate/up buffers */

struct flx_fwd_ws {
    flx_fwd_shape_t shape;
    flx_model_config_t cfg;       /* the model it was planned for (shape check) */
    uint32_t n_act;               /* max(max_prompt, max_batch): rows of the activation buffers */
    float *x, *xn;                /* (n_act, hidden) residual stream, normed / projection output */
    float *q;                     /* (n_act, Hq * D) */
    float *k, *v;                 /* (n_act, Hkv * D) */
    float *o;                     /* (n_act, Hq * D) attention output */
    float *gate, *up;             /* (max(max_batch, min(max_prompt, FFN_CHUNK)), ffn) */
    flx_bf16_t *kb, *vb;          /* (Hkv, n, D) rounded K, V of a prefill (n = its token count) */
    float *kp;                    /* (Hkv, n_pad / NP, D, NP) rounded K in micro-kernel panels */
    float *vf;                    /* (Hkv, n, D) rounded V as fp32 */
    float *pack;                  /* (n_workers, flx_gemm_pack_floats()) per-worker GEMM panels */
    float *att;                   /* (n_workers, att_floats) per-worker attention scratch */
    size_t att_floats;
    float *inv_freq;              /* (D / 2) */
    flx_fwd_timing_t timing;      /* of the last decode step */
};

static uint32_t att_qb(const flx_model_config_t *c)
{
    uint32_t G = c->n_heads / c->n_kv_heads;
    return G >= ATT_ROWS ? 1 : ATT_ROWS / G;
}

/* Carves (base != NULL) or sizes (base == NULL) everything; returns the struct or NULL. */
static flx_fwd_ws_t *ws_carve(flx_arena_t *a, const flx_model_t *m, const flx_fwd_shape_t *shape, uint32_t n_workers)
{
    const flx_model_config_t *c = &m->cfg;
    const size_t H = c->hidden, D = c->head_dim, qd = (size_t)c->n_heads * D, kvd = (size_t)c->n_kv_heads * D;
    const size_t N = FLX_MAX(shape->max_prompt, shape->max_batch), P = shape->max_prompt;
    const size_t P_pad = FLX_DIV_UP(P, FLX_GEMM_PANEL_MAX) * FLX_GEMM_PANEL_MAX;
    const size_t R = (size_t)att_qb(c) * (c->n_heads / c->n_kv_heads);
    flx_fwd_ws_t *ws = flx_arena_alloc(a, sizeof *ws);
    float *x = flx_arena_alloc(a, N * H * 4), *xn = flx_arena_alloc(a, N * H * 4);
    float *q = flx_arena_alloc(a, N * qd * 4), *k = flx_arena_alloc(a, N * kvd * 4);
    float *v = flx_arena_alloc(a, N * kvd * 4), *o = flx_arena_alloc(a, N * qd * 4);
    const size_t NF = FLX_MAX(shape->max_batch, FLX_MIN(P, FFN_CHUNK));
    float *gate = flx_arena_alloc(a, NF * c->ffn * 4), *up = flx_arena_alloc(a, NF * c->ffn * 4);
    flx_bf16_t *kb = flx_arena_alloc(a, P * kvd * 2), *vb = flx_arena_alloc(a, P * kvd * 2);
    float *kp = flx_arena_alloc(a, P_pad * kvd * 4), *vf = flx_arena_alloc(a, P * kvd * 4);
    float *pack = flx_arena_alloc(a, n_workers * flx_gemm_pack_floats() * 4);
    /* qbuf (R, D) | S (R, ATT_KB) | acc (R, D) | m (R) | l (R), each 16-float aligned */
    size_t att_floats = FLX_ALIGN_UP(R * D, 16) * 2 + FLX_ALIGN_UP(R * ATT_KB, 16) + 2 * FLX_ALIGN_UP(R, 16);
    float *att = flx_arena_alloc(a, n_workers * att_floats * 4);
    float *inv_freq = flx_arena_alloc(a, D / 2 * 4);
    if (!ws) return NULL;
    if (!x || !xn || !q || !k || !v || !o || !gate || !up || !kb || !vb || !kp || !vf || !pack || !att || !inv_freq)
        return NULL;
    memset(ws, 0, sizeof *ws);
    ws->shape = *shape;
    ws->cfg = *c;
    ws->n_act = (uint32_t)N;
    ws->x = x, ws->xn = xn, ws->q = q, ws->k = k, ws->v = v, ws->o = o, ws->gate = gate, ws->up = up;
    ws->kb = kb, ws->vb = vb, ws->kp = kp, ws->vf = vf, ws->pack = pack, ws->att = att;
    ws->att_floats = att_floats;
    ws->inv_freq = inv_freq;
    flx_rope_inv_freq(c, inv_freq);
    return ws;
}

static flx_status_t shape_check(const flx_model_t *m, const flx_fwd_shape_t *shape, uint32_t *nth_p)
{
    if (!m || !shape) return flx_error_set(FLX_ERR_INVALID, "forward plan: model or shape is NULL");
    flx_status_t st = flx_model_config_check(&m->cfg);
    if (st != FLX_OK) return st;
    if (shape->max_prompt == 0 || shape->max_prompt > (1u << 22))
        return flx_error_set(FLX_ERR_INVALID, "forward plan: max_prompt %u not in 1..%u", shape->max_prompt, 1u << 22);
    if (shape->max_prompt > m->cfg.max_ctx)
        return flx_error_set(FLX_ERR_INVALID, "forward plan: max_prompt %u tokens is longer than the model's context "
                             "of %u tokens", shape->max_prompt, m->cfg.max_ctx);
    if (shape->max_batch == 0 || shape->max_batch > 4096)
        return flx_error_set(FLX_ERR_INVALID, "forward plan: max_batch %u not in 1..4096", shape->max_batch);
    *nth_p = flx_pool_size(shape->pool);
    return FLX_OK;
}

flx_status_t flx_fwd_plan(const flx_model_t *m, const flx_fwd_shape_t *shape, size_t *ws_bytes_p)
{
    uint32_t nth;
    flx_status_t st = shape_check(m, shape, &nth);
    if (st != FLX_OK) return st;
    flx_arena_t a;
    flx_arena_init(&a, NULL, 0);
    ws_carve(&a, m, shape, nth);
    *ws_bytes_p = a.used;
    return FLX_OK;
}

flx_status_t flx_fwd_ws_init(const flx_model_t *m, const flx_fwd_shape_t *shape, void *mem, size_t bytes,
                             flx_fwd_ws_t **ws_p)
{
    uint32_t nth;
    flx_status_t st = shape_check(m, shape, &nth);
    if (st != FLX_OK) return st;
    if (!mem) return flx_error_set(FLX_ERR_INVALID, "forward workspace: memory is NULL");
    flx_arena_t a;
    flx_arena_init(&a, mem, bytes);
    flx_fwd_ws_t *ws = ws_carve(&a, m, shape, nth);
    if (!ws)
        return flx_error_set(FLX_ERR_INVALID, "forward workspace: %zu bytes given, %zu needed", bytes, a.used);
    *ws_p = ws;
    return FLX_OK;
}

void flx_fwd_timing_get(const flx_fwd_ws_t *ws, flx_fwd_timing_t *timing_p)
{
    *timing_p = ws->timing;
}

flx_pool_h flx_fwd_ws_pool(const flx_fwd_ws_t *ws)
{
    return ws ? ws->shape.pool : NULL;
}

static flx_status_t ws_check(const flx_model_t *m, const flx_fwd_ws_t *ws)
{
    if (!m || !ws) return flx_error_set(FLX_ERR_INVALID, "forward: model or workspace is NULL");
    const flx_model_config_t *a = &m->cfg, *b = &ws->cfg;
    if (a->hidden != b->hidden || a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads ||
        a->head_dim != b->head_dim || a->ffn != b->ffn || a->vocab != b->vocab || a->n_layers != b->n_layers ||
        a->rope_theta != b->rope_theta || a->rope_scaling != b->rope_scaling || a->rope_factor != b->rope_factor)
        return flx_error_set(FLX_ERR_INVALID,
                             "forward: workspace planned for hidden %u heads %u/%u head_dim %u ffn %u vocab %u "
                             "layers %u rope_theta %g, the model has hidden %u heads %u/%u head_dim %u ffn %u vocab %u "
                             "layers %u rope_theta %g",
                             b->hidden, b->n_heads, b->n_kv_heads, b->head_dim, b->ffn, b->vocab, b->n_layers,
                             (double)b->rope_theta, a->hidden, a->n_heads, a->n_kv_heads, a->head_dim, a->ffn, a->vocab,
                             a->n_layers, (double)a->rope_theta);
    return FLX_OK;
}

/* ================= elementwise pieces ================= */

static void embed(const flx_model_t *m, const int32_t *tokens, uint32_t n, float *x)
{
    const size_t H = m->cfg.hidden;
    for (uint32_t t = 0; t < n; t++) flx_wmat_row_f32(&m->tok_embd, H, tokens[t], 0, H, x + t * H);
}

typedef struct rows_job {
    const float *x, *g;
    float eps;
    uint32_t H;
    float *y;
} rows_job_t;

static flx_status_t rmsnorm_rows(void *ctx, const flx_pool_worker_t *w, uint64_t t0, uint64_t t1)
{
    (void)w;
    const rows_job_t *j = ctx;
    for (uint64_t t = t0; t < t1; t++) {
        const float *xt = j->x + t * j->H;
        float *yt = j->y + t * j->H;
        double ss = 0;
        for (uint32_t i = 0; i < j->H; i++) ss += (double)xt[i] * xt[i];
        float r = (float)(1.0 / sqrt(ss / j->H + j->eps));
        for (uint32_t i = 0; i < j->H; i++) yt[i] = xt[i] * r * j->g[i];
    }
    return FLX_OK;
}

/* Row-wise: a row is one chunk's, so the result does not depend on the pool. Decode batches of a
 * few rows run on the caller (a run costs more than they do). */
static void rmsnorm(const float *x, const float *g, float eps, uint32_t n, uint32_t H, float *y, flx_pool_h pool)
{
    rows_job_t j = {x, g, eps, H, y};
    (void)flx_pool_for(n > 16 ? pool : NULL, n, 16, rmsnorm_rows, &j);
}

typedef struct vec_job {
    float *x;
    const float *y;
    flx_gemv_level_t lv;
} vec_job_t;

static flx_status_t add_range(void *ctx, const flx_pool_worker_t *w, uint64_t i0, uint64_t i1)
{
    (void)w;
    const vec_job_t *j = ctx;
    for (uint64_t i = i0; i < i1; i++) j->x[i] += j->y[i];
    return FLX_OK;
}

static void add_inplace(float *x, const float *y, size_t n, flx_pool_h pool)
{
    vec_job_t j = {x, y, FLX_GEMV_SCALAR};
    (void)flx_pool_for(n > 65536 ? pool : NULL, n, 16384, add_range, &j);
}

static flx_status_t silu_range(void *ctx, const flx_pool_worker_t *w, uint64_t i0, uint64_t i1)
{
    (void)w;
    const vec_job_t *j = ctx;
    flx_silu_mul(j->lv, j->x + i0, j->y + i0, i1 - i0);
    return FLX_OK;
}

/* g = silu(g) * u elementwise, in 4096-element chunks (16-aligned: the vector kernels treat every
 * element alike, so the split changes nothing). */
static void silu_mul(float *g, const float *u, size_t n, flx_pool_h pool)
{
    vec_job_t j = {g, u, flx_gemv_level()};
    (void)flx_pool_for(n > 16384 ? pool : NULL, n, 4096, silu_range, &j);
}

static void rope_head(float *x, const float *cs, const float *sn, uint32_t half)
{
    for (uint32_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

typedef struct rope_job {
    const flx_model_t *m;
    const flx_layer_weights_t *w;
    const float *inv_freq;
    const uint32_t *pos;         /* NULL: pos = t */
    float *q, *k, *v;
} rope_job_t;

static flx_status_t rope_rows(void *ctx, const flx_pool_worker_t *wk, uint64_t t0, uint64_t t1)
{
    (void)wk;
    const rope_job_t *j = ctx;
    const flx_model_config_t *c = &j->m->cfg;
    const flx_layer_weights_t *w = j->w;
    const uint32_t D = c->head_dim, half = D / 2, qd = c->n_heads * D, kvd = c->n_kv_heads * D;
    for (uint64_t t = t0; t < t1; t++) {
        float cs[FLX_MODEL_MAX_HEAD_DIM / 2], sn[FLX_MODEL_MAX_HEAD_DIM / 2];
        double p = j->pos ? j->pos[t] : (double)t;
        for (uint32_t i = 0; i < half; i++) {
            double ang = p * j->inv_freq[i];
            cs[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
        float *qt = j->q + (size_t)t * qd, *kt = j->k + (size_t)t * kvd, *vt = j->v + (size_t)t * kvd;
        if (w->bq) {
            for (uint32_t i = 0; i < qd; i++) qt[i] += w->bq[i];
            for (uint32_t i = 0; i < kvd; i++) kt[i] += w->bk[i];
            for (uint32_t i = 0; i < kvd; i++) vt[i] += w->bv[i];
        }
        for (uint32_t h = 0; h < c->n_heads; h++) rope_head(qt + (size_t)h * D, cs, sn, half);
        for (uint32_t h = 0; h < c->n_kv_heads; h++) rope_head(kt + (size_t)h * D, cs, sn, half);
    }
    return FLX_OK;
}

/* Biases and RoPE for token rows [0, n) of q (n, Hq*D) and k (n, Hkv*D), v biases. */
static void bias_rope(const flx_model_t *m, const flx_layer_weights_t *w, const float *inv_freq, uint32_t n,
                      const uint32_t *pos /* NULL: pos = t */, float *q, float *k, float *v, flx_pool_h pool)
{
    rope_job_t j = {m, w, inv_freq, pos, q, k, v};
    (void)flx_pool_for(n > 8 ? pool : NULL, n, 8, rope_rows, &j);
}

/* ================= prefill attention ================= */

typedef struct round_job {
    const flx_fwd_ws_t *ws;
    uint32_t n, np;
    size_t npan;
} round_job_t;

/* Items (kv head, panel of np keys). */
static flx_status_t round_panels(void *ctx, const flx_pool_worker_t *wk, uint64_t i0, uint64_t i1)
{
    (void)wk;
    const round_job_t *j = ctx;
    const flx_fwd_ws_t *ws = j->ws;
    const uint32_t D = ws->cfg.head_dim, kvd = ws->cfg.n_kv_heads * D, np = j->np, n = j->n;
    for (uint64_t it = i0; it < i1; it++) {
        const uint32_t h = (uint32_t)(it / j->npan);
        const size_t pn = it % j->npan;
        float *kpp = ws->kp + ((size_t)h * j->npan + pn) * D * np;
        for (uint32_t jj = 0; jj < np; jj++) {
            size_t t = pn * np + jj;
            if (t >= n) {
                for (uint32_t d = 0; d < D; d++) kpp[(size_t)d * np + jj] = 0.0f;
                continue;
            }
            const float *kt = ws->k + t * kvd + (size_t)h * D, *vt = ws->v + t * kvd + (size_t)h * D;
            flx_bf16_t *kbt = ws->kb + ((size_t)h * n + t) * D, *vbt = ws->vb + ((size_t)h * n + t) * D;
            float *vft = ws->vf + ((size_t)h * n + t) * D;
            for (uint32_t d = 0; d < D; d++) {
                kbt[d] = flx_f32_to_bf16(kt[d]);
                vbt[d] = flx_f32_to_bf16(vt[d]);
                kpp[(size_t)d * np + jj] = flx_bf16_to_f32(kbt[d]);
                vft[d] = flx_bf16_to_f32(vbt[d]);
            }
        }
    }
    return FLX_OK;
}

/* Rounds k, v (n, Hkv*D) to bf16 into kb, vb (Hkv, n, D); the rounded values also go to vf (same
 * layout, fp32) and to kp (panels of np keys: (Hkv, n_pad/np, D, np), zero past n). */
static void kv_round(const flx_fwd_ws_t *ws, uint32_t n, uint32_t np)
{
    round_job_t j = {ws, n, np, FLX_DIV_UP(n, np)};
    (void)flx_pool_for(ws->shape.pool, (uint64_t)ws->cfg.n_kv_heads * j.npan, 4, round_panels, &j);
}

/* One item: KV head h, query tokens [t0, t1). Writes ws->o rows. */
static void attn_item(const flx_fwd_ws_t *ws, flx_gemv_level_t lv, uint32_t np, uint32_t n, uint32_t h, uint32_t t0,
                      uint32_t t1, float *scratch)
{
    const flx_model_config_t *c = &ws->cfg;
    const uint32_t D = c->head_dim, G = c->n_heads / c->n_kv_heads, qd = c->n_heads * D;
    const uint32_t R = (t1 - t0) * G, Rmax = att_qb(c) * G;
    const size_t npan = FLX_DIV_UP(n, np);
    float *qbuf = scratch, *acc = qbuf + FLX_ALIGN_UP((size_t)Rmax * D, 16);
    float *S = acc + FLX_ALIGN_UP((size_t)Rmax * D, 16), *mrow = S + FLX_ALIGN_UP((size_t)Rmax * ATT_KB, 16);
    float *lrow = mrow + FLX_ALIGN_UP(Rmax, 16);
    const float scale = 1.0f / sqrtf((float)D);
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t g = 0; g < G; g++) {
            const float *src = ws->q + (size_t)t * qd + (size_t)(h * G + g) * D;
            float *dst = qbuf + ((size_t)(t - t0) * G + g) * D;
            for (uint32_t d = 0; d < D; d++) dst[d] = src[d] * scale;
        }
    memset(acc, 0, (size_t)R * D * sizeof(float));
    for (uint32_t i = 0; i < R; i++) mrow[i] = -INFINITY, lrow[i] = 0.0f;
    const float *kp_h = ws->kp + (size_t)h * npan * D * np, *vf_h = ws->vf + (size_t)h * n * D;
    for (uint32_t k0 = 0; k0 < t1; k0 += ATT_KB) {
        const uint32_t nk = FLX_MIN(ATT_KB, t1 - k0);
        flx_gemm_panels(lv, R, nk, D, qbuf, D, kp_h + (size_t)(k0 / np) * D * np, (size_t)D * np, np, S, ATT_KB, 0);
        for (uint32_t i = 0; i < R; i++) {
            const uint32_t t = t0 + i / G;
            float *si = S + (size_t)i * ATT_KB;
            const uint32_t valid = t < k0 ? 0 : FLX_MIN(nk, t - k0 + 1);
            if (valid == 0) {
                memset(si, 0, nk * sizeof(float));
                continue;
            }
            const float mx = flx_max_row(lv, si, valid), mn = mx > mrow[i] ? mx : mrow[i];
            const float alpha = expf(mrow[i] - mn);   /* 0 on the first block (m = -inf) */
            const float sum = flx_exp_row(lv, si, valid, mn);
            if (valid < nk) memset(si + valid, 0, (nk - valid) * sizeof(float));
            lrow[i] = lrow[i] * alpha + sum;
            mrow[i] = mn;
            if (alpha != 1.0f) {
                float *ai = acc + (size_t)i * D;
                for (uint32_t d = 0; d < D; d++) ai[d] *= alpha;
            }
        }
        flx_gemm_panels(lv, R, D, nk, S, ATT_KB, vf_h + (size_t)k0 * D, np, D, acc, D, 1);
    }
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t g = 0; g < G; g++) {
            const uint32_t i = (t - t0) * G + g;
            const float inv = 1.0f / lrow[i];
            const float *ai = acc + (size_t)i * D;
            float *dst = ws->o + (size_t)t * qd + (size_t)(h * G + g) * D;
            for (uint32_t d = 0; d < D; d++) dst[d] = ai[d] * inv;
        }
}

typedef struct prefill_attn_job {
    const flx_fwd_ws_t *ws;
    flx_gemv_level_t lv;
    uint32_t np, n, qb, nqb, Hkv;
} prefill_attn_job_t;

/* Items longest first (causal items differ in cost), each on its worker's scratch. */
static flx_status_t prefill_attn_items(void *ctx, const flx_pool_worker_t *wk, uint64_t i0, uint64_t i1)
{
    const prefill_attn_job_t *j = ctx;
    float *scratch = j->ws->att + (size_t)wk->index * j->ws->att_floats;
    for (uint64_t it = i0; it < i1; it++) {
        const uint32_t b = j->nqb - 1 - (uint32_t)(it / j->Hkv), h = (uint32_t)(it % j->Hkv);
        attn_item(j->ws, j->lv, j->np, j->n, h, b * j->qb, FLX_MIN(j->n, (b + 1) * j->qb), scratch);
    }
    return FLX_OK;
}

static void attn_prefill(flx_fwd_ws_t *ws, uint32_t n)
{
    prefill_attn_job_t j = {.ws = ws, .lv = flx_gemv_level(), .n = n, .qb = att_qb(&ws->cfg),
                            .Hkv = ws->cfg.n_kv_heads};
    j.np = flx_gemm_panel(j.lv);
    kv_round(ws, n, j.np);
    j.nqb = FLX_DIV_UP(n, j.qb);
    (void)flx_pool_for(ws->shape.pool, (uint64_t)j.nqb * j.Hkv, 1, prefill_attn_items, &j);
}

/* ================= prefill ================= */

static flx_status_t prefill_check(const flx_model_t *m, const flx_fwd_ws_t *ws, const flx_prefill_args_t *a)
{
    flx_status_t st = ws_check(m, ws);
    if (st != FLX_OK) return st;
    if (!a || !a->tokens) return flx_error_set(FLX_ERR_INVALID, "prefill: args or tokens is NULL");
    if (a->n_tokens > m->cfg.max_ctx)
        return flx_error_set(FLX_ERR_INVALID, "prefill: a prompt of %u tokens is longer than the model's context of %u "
                             "tokens", a->n_tokens, m->cfg.max_ctx);
    if (a->n_tokens == 0 || a->n_tokens > ws->shape.max_prompt)
        return flx_error_set(FLX_ERR_INVALID, "prefill: n_tokens %u not in 1..%u (max_prompt)", a->n_tokens,
                             ws->shape.max_prompt);
    for (uint32_t t = 0; t < a->n_tokens; t++)
        if (a->tokens[t] < 0 || (uint32_t)a->tokens[t] >= m->cfg.vocab)
            return flx_error_set(FLX_ERR_INVALID, "prefill: token id %d at position %u not in 0..%u", a->tokens[t], t,
                                 m->cfg.vocab - 1);
    return FLX_OK;
}

flx_status_t flx_model_prefill(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_prefill_args_t *args)
{
    flx_status_t st = prefill_check(m, ws, args);
    if (st != FLX_OK) return st;
    const flx_model_config_t *c = &m->cfg;
    const uint32_t n = args->n_tokens, H = c->hidden, F = c->ffn, D = c->head_dim;
    const uint32_t qd = c->n_heads * D, kvd = c->n_kv_heads * D;
    flx_pool_h pool = ws->shape.pool;
    float *pack = ws->pack;
    embed(m, args->tokens, n, ws->x);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        rmsnorm(ws->x, w->attn_norm, c->rms_eps, n, H, ws->xn, pool);
        flx_gemv_mat_t qkv[3] = {{w->wq, qd, ws->q}, {w->wk, kvd, ws->k}, {w->wv, kvd, ws->v}};
        flx_gemm_bf16(qkv, 3, H, ws->xn, n, pool, pack);
        bias_rope(m, w, ws->inv_freq, n, NULL, ws->q, ws->k, ws->v, pool);
        if (args->q_all) memcpy(args->q_all + (size_t)l * n * qd, ws->q, (size_t)n * qd * sizeof(float));
        attn_prefill(ws, n);
        if (args->on_layer) {
            st = args->on_layer(args->ctx, l, n, ws->kb, ws->vb, ws->q + (size_t)(n - 1) * qd);
            if (st != FLX_OK) return st;
        }
        flx_progress_report("prefill", l + 1, c->n_layers, "layers");
        flx_gemv_mat_t wo = {w->wo, H, ws->xn};
        flx_gemm_bf16(&wo, 1, qd, ws->o, n, pool, pack);
        add_inplace(ws->x, ws->xn, (size_t)n * H, pool);
        rmsnorm(ws->x, w->ffn_norm, c->rms_eps, n, H, ws->xn, pool);
        for (uint32_t t0 = 0; t0 < n; t0 += FFN_CHUNK) {
            const uint32_t tn = FLX_MIN(FFN_CHUNK, n - t0);
            float *xn = ws->xn + (size_t)t0 * H;
            flx_gemv_mat_t gu[2] = {{w->w_gate, F, ws->gate}, {w->w_up, F, ws->up}}, wd = {w->w_down, H, xn};
            flx_gemm_bf16(gu, 2, H, xn, tn, pool, pack);
            silu_mul(ws->gate, ws->up, (size_t)tn * F, pool);
            flx_gemm_bf16(&wd, 1, F, ws->gate, tn, pool, pack);   /* xn rows of this chunk are done */
        }
        add_inplace(ws->x, ws->xn, (size_t)n * H, pool);
    }
    if (args->logits_all) {
        rmsnorm(ws->x, m->out_norm, c->rms_eps, n, H, ws->xn, pool);
        flx_gemv_mat_t head = {m->lm_head, c->vocab, args->logits_all};
        flx_gemm_bf16(&head, 1, H, ws->xn, n, pool, pack);
        if (args->logits_last)
            memcpy(args->logits_last, args->logits_all + (size_t)(n - 1) * c->vocab, c->vocab * sizeof(float));
    } else if (args->logits_last) {
        rmsnorm(ws->x + (size_t)(n - 1) * H, m->out_norm, c->rms_eps, 1, H, ws->xn, pool);
        flx_gemv_mat_t mat = {m->lm_head, c->vocab, args->logits_last};
        flx_gemv_bf16(&mat, 1, H, ws->xn, 1, pool);
    }
    return FLX_OK;
}

/* ================= decode ================= */

flx_status_t flx_model_decode(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_decode_args_t *a)
{
    flx_status_t st = ws_check(m, ws);
    if (st != FLX_OK) return st;
    if (!a || !a->tokens || !a->pos || !a->attn || !a->logits)
        return flx_error_set(FLX_ERR_INVALID, "decode: args, tokens, pos, attn or logits is NULL");
    if (a->batch == 0 || a->batch > ws->shape.max_batch)
        return flx_error_set(FLX_ERR_INVALID, "decode: batch %u not in 1..%u (max_batch)", a->batch,
                             ws->shape.max_batch);
    for (uint32_t b = 0; b < a->batch; b++)
        if (a->tokens[b] < 0 || (uint32_t)a->tokens[b] >= m->cfg.vocab)
            return flx_error_set(FLX_ERR_INVALID, "decode: token id %d of sequence %u not in 0..%u", a->tokens[b], b,
                                 m->cfg.vocab - 1);
    const flx_model_config_t *c = &m->cfg;
    const uint32_t B = a->batch, H = c->hidden, F = c->ffn, D = c->head_dim;
    const uint32_t qd = c->n_heads * D, kvd = c->n_kv_heads * D;
    flx_pool_h pool = ws->shape.pool;
    uint64_t t_start = flx_now_ns(), attn_ns = 0;
    embed(m, a->tokens, B, ws->x);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        rmsnorm(ws->x, w->attn_norm, c->rms_eps, B, H, ws->xn, pool);
        flx_gemv_mat_t qkv[3] = {{w->wq, qd, ws->q}, {w->wk, kvd, ws->k}, {w->wv, kvd, ws->v}};
        flx_gemv_bf16(qkv, 3, H, ws->xn, B, pool);
        bias_rope(m, w, ws->inv_freq, B, a->pos, ws->q, ws->k, ws->v, pool);
        uint64_t t0 = flx_now_ns();
        st = a->attn(a->ctx, l, B, ws->q, ws->k, ws->v, ws->o);
        attn_ns += flx_now_ns() - t0;
        if (st != FLX_OK) return st;
        flx_gemv_mat_t wo = {w->wo, H, ws->xn};
        flx_gemv_bf16(&wo, 1, qd, ws->o, B, pool);
        add_inplace(ws->x, ws->xn, (size_t)B * H, pool);
        rmsnorm(ws->x, w->ffn_norm, c->rms_eps, B, H, ws->xn, pool);
        flx_gemv_mat_t gu[2] = {{w->w_gate, F, ws->gate}, {w->w_up, F, ws->up}};
        flx_gemv_bf16(gu, 2, H, ws->xn, B, pool);
        silu_mul(ws->gate, ws->up, (size_t)B * F, pool);
        flx_gemv_mat_t wd = {w->w_down, H, ws->xn};
        flx_gemv_bf16(&wd, 1, F, ws->gate, B, pool);
        add_inplace(ws->x, ws->xn, (size_t)B * H, pool);
    }
    rmsnorm(ws->x, m->out_norm, c->rms_eps, B, H, ws->xn, pool);
    flx_gemv_mat_t head = {m->lm_head, c->vocab, a->logits};
    flx_gemv_bf16(&head, 1, H, ws->xn, B, pool);
    uint64_t total = flx_now_ns() - t_start;
    ws->timing.attn_ns = attn_ns;
    ws->timing.dense_ns = total - attn_ns;
    ws->timing.dense_bytes = flx_model_weight_bytes(m);
    return FLX_OK;
}
