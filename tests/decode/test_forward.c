/*
 * test_forward - the forward pass (flx/forward.h) and its kernels (decode/src/gemv.h).
 *
 *  (a) every fast kernel against its _ref (double accumulation) at each level: scalar, AVX2,
 *      AVX-512F (where the CPU has it), on shapes with row, column, token and panel tails;
 *  (b) flx_model_prefill against a scalar double-precision forward written here, for both
 *      families (llama; qwen2 with QKV bias), head_dim 48/64/128, GQA groups 1/4/8, tied and
 *      untied embeddings, llama3 RoPE scaling, odd token counts that cross the attention blocks;
 *      the on_layer K/V (Hkv, n, D) and q' are checked against the reference too;
 *  (c) prefill n tokens, then decode m more one step at a time through a dense bf16 KV cache
 *      implemented here: each step's logits match the teacher-forced prefill of all n + m tokens
 *      and give the same greedy token;
 *  (d) a decode batch of 3 sequences at different positions equals decoding each alone;
 *  (e) bad arguments are refused with messages that name the value;
 *  (f) kernels, prefill (logits, on_layer K/V and q') and decode batches give the same bits on pools of
 *      1, 2, 3 and 7 workers (`test_forward workers` runs only these, under TSan too).
 * Inputs are fresh random values each run (seed printed; FLX_SEED replays).
 *
 * `test_forward bench [N | prefill N]` (not run by ctest) prints decode GEMV bandwidth against a
 * STREAM-like read of a 1 GiB buffer measured in the same run, batched decode cost per token, and
 * optionally a SmolLM2-135M-shaped prefill time.
 *
 * Tolerances. Weights are bf16 in the model and in the reference alike, so they add no error; what
 * differs is fp32 vs double accumulation (~1e-6 relative per dot product) and, for the few K/V
 * values within that distance of a bf16 rounding midpoint, which neighbour they round to (one bf16
 * ulp, 2^-8 relative; it moves logits by up to ~3e-4 of their RMS). The reference takes the model's
 * choice for exactly those values (round_kv), so prefill is held to 5e-5 RMS + 1e-4 relative
 * (observed worst ~0.03 of that); decode-vs-prefill cannot do the same (the decode step's k comes
 * from the GEMV, the prefill's from the GEMM) and is held to 1e-3 RMS + 1e-3 relative. A real
 * defect (a wrong head, position, mask, layout or bias) moves logits by O(0.1..1) RMS.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include <stdatomic.h>

#include "../../bench/common/bench_read.h"
#include "flx/cpu.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx_test.h"
#include "gemv.h"
#include "ref_forward.h"

/* Logit tolerances, atol in units of the RMS of the reference logits (tied heads give logits ~10x
 * larger than untied ones): prefill vs the double reference (near-midpoint K/V roundings taken
 * from the model, so only accumulation order differs), and decode vs prefill (the decode step's
 * k, v come from the GEMV, the prefill's from the GEMM; one of a few hundred values may round to
 * the neighbouring bf16, which moves logits by up to ~3e-4 RMS). */
#define PREFILL_ATOL 5e-5
#define PREFILL_RTOL 1e-4
#define DECODE_ATOL 1e-3
#define DECODE_RTOL 1e-3

#define BF16M(ptr) ((flx_wmat_t){(ptr), FLX_WFMT_BF16})

static flx_rng_t rng;
static int g_threads = 2;
static flx_pool_h g_pool;          /* g_threads workers */
static flx_pool_h g_pools[4];      /* FLX_TEST_WORKERS */

static void rand_f(float *x, size_t n, double s)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(flx_rng_normal(&rng) * s);
}

static void rand_bf16(flx_bf16_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
}

/* ================= (a) kernels ================= */

static void test_gemv(void)
{
    const uint32_t shapes[][2] = {{37, 64}, {100, 72}, {5, 50}, {257, 576}, {16, 16}, {3, 7}};
    for (size_t si = 0; si < FLX_ARRAY_SIZE(shapes); si++) {
        uint32_t rows = shapes[si][0], cols = shapes[si][1];
        for (uint32_t n = 1; n <= 17; n += (n < 9 ? 1 : 8)) {   /* 1..9 and 17: every width of a pass; 2 and 3 passes */
            flx_bf16_t *w[3];
            float *y[3], *yr[3], *x = malloc((size_t)n * cols * 4);
            uint32_t r3[3] = {rows, rows / 2 + 1, 17};
            flx_gemv_mat_t mats[3];
            rand_f(x, (size_t)n * cols, 1.0);
            for (int i = 0; i < 3; i++) {
                w[i] = malloc((size_t)r3[i] * cols * 2);
                y[i] = malloc((size_t)n * r3[i] * 4);
                yr[i] = malloc((size_t)n * r3[i] * 4);
                rand_bf16(w[i], (size_t)r3[i] * cols);
                flx_matmul_bf16_ref(w[i], r3[i], cols, x, n, yr[i]);
                mats[i] = (flx_gemv_mat_t){BF16M(w[i]), r3[i], y[i]};
            }
            flx_gemv_bf16(mats, 3, cols, x, n, g_pool);
            char label[96];
            for (int i = 0; i < 3; i++) {
                snprintf(label, sizeof label, "gemv %ux%u n=%u mat %d", r3[i], cols, n, i);
                CHECK_CLOSE(label, y[i], yr[i], (size_t)n * r3[i], 1e-4 * sqrt(cols), 1e-5);
            }
            for (int wi = 0; wi < 4; wi++) {   /* the same bits at 1, 2, 3, 7 workers */
                flx_gemv_mat_t mw[3];
                float *yw[3];
                for (int i = 0; i < 3; i++) yw[i] = malloc((size_t)n * r3[i] * 4), mw[i] = (flx_gemv_mat_t){BF16M(w[i]), r3[i], yw[i]};
                flx_gemv_bf16(mw, 3, cols, x, n, g_pools[wi]);
                for (int i = 0; i < 3; i++) {
                    snprintf(label, sizeof label, "gemv %ux%u n=%u mat %d workers %u", r3[i], cols, n, i,
                             FLX_TEST_WORKERS[wi]);
                    CHECK_SAME(label, yw[i], y[i], (size_t)n * r3[i]);
                    free(yw[i]);
                }
            }
            /* each vector's result is the one it gets alone: the batch around it changes no bit */
            for (uint32_t j = 0; j < n; j++) {
                flx_gemv_mat_t m1[3];
                float *y1[3];
                for (int i = 0; i < 3; i++) y1[i] = malloc((size_t)r3[i] * 4), m1[i] = (flx_gemv_mat_t){BF16M(w[i]), r3[i], y1[i]};
                flx_gemv_bf16(m1, 3, cols, x + (size_t)j * cols, 1, g_pool);
                for (int i = 0; i < 3; i++) {
                    snprintf(label, sizeof label, "gemv %ux%u vector %u of %u vs alone, mat %d", r3[i], cols, j, n, i);
                    CHECK_SAME(label, y1[i], y[i] + (size_t)j * r3[i], r3[i]);
                    free(y1[i]);
                }
            }
            for (int i = 0; i < 3; i++) free(w[i]), free(y[i]), free(yr[i]);
            free(x);
        }
    }
}

/* A random fp16 value of magnitude 2^-9 .. 2^3 (either sign), as fp32: a block scale or minimum. */
static float rand_f16_val(void)
{
    const uint32_t e = 6 + (uint32_t)flx_rng_below(&rng, 13), mant = (uint32_t)flx_rng_below(&rng, 1024);
    return flx_f16_to_f32((uint16_t)(((uint32_t)flx_rng_below(&rng, 2) << 15) | (e << 10) | mant));
}

/* A (rows, cols) matrix in block format fmt with random quants and fp16 scales, and its values as a
 * bf16 matrix (the formats' scalar definition, flx_wmat_row_bf16). */
static void rand_blocks(flx_wfmt_t fmt, uint32_t rows, uint32_t cols, uint8_t **q_p, flx_bf16_t **b_p)
{
    const size_t rb = flx_wmat_row_bytes(fmt, cols), bb = fmt == FLX_WFMT_Q4 ? FLX_WFMT_Q4_BYTES : FLX_WFMT_Q8_BYTES;
    uint8_t *q = malloc((size_t)rows * rb);
    flx_bf16_t *b = malloc((size_t)rows * cols * 2);
    for (size_t i = 0; i < (size_t)rows * rb; i += bb) {
        for (int k = 0; k < (fmt == FLX_WFMT_Q4 ? 16 : 32); k++) q[i + k] = (uint8_t)flx_rng_below(&rng, 256);
        const float d = rand_f16_val(), m = rand_f16_val();
        memcpy(q + i + (fmt == FLX_WFMT_Q4 ? 16 : 32), &d, 4);
        if (fmt == FLX_WFMT_Q4) memcpy(q + i + 20, &m, 4);
    }
    const flx_wmat_t w = {q, fmt};
    for (uint32_t r = 0; r < rows; r++) flx_wmat_row_bf16(&w, cols, r, 0, cols, b + (size_t)r * cols);
    *q_p = q, *b_p = b;
}

/* Block-format matrices (flx/model.h WEIGHT FORMATS) give the bits of the same values stored as
 * bf16, in the GEMV (every batch width, fused with matrices of other formats, at 1..7 workers) and
 * in the GEMM (whose panels expand rows). */
static void test_gemv_blocks(void)
{
    static const uint32_t shapes[][2] = {{37, 64}, {100, 576}, {17, 1536}, {5, 32}, {33, 96}};
    static const flx_wfmt_t fmts[3] = {FLX_WFMT_Q4, FLX_WFMT_Q8, FLX_WFMT_Q4};
    for (size_t si = 0; si < FLX_ARRAY_SIZE(shapes); si++) {
        const uint32_t rows = shapes[si][0], cols = shapes[si][1], r3[3] = {rows, rows / 2 + 1, 19};
        uint8_t *q[3];
        flx_bf16_t *b[3];
        for (int i = 0; i < 3; i++) rand_blocks(fmts[i], r3[i], cols, &q[i], &b[i]);
        char label[112];
        for (uint32_t n = 1; n <= 17; n += (n < 9 ? 1 : 8)) {
            float *x = malloc((size_t)n * cols * 4), *yq[3], *yb[3];
            rand_f(x, (size_t)n * cols, 1.0);
            flx_gemv_mat_t mq[3], mb[3];
            for (int i = 0; i < 3; i++) {
                yq[i] = malloc((size_t)n * r3[i] * 4), yb[i] = malloc((size_t)n * r3[i] * 4);
                mq[i] = (flx_gemv_mat_t){{q[i], fmts[i]}, r3[i], yq[i]};
                mb[i] = (flx_gemv_mat_t){BF16M(b[i]), r3[i], yb[i]};
            }
            flx_gemv_bf16(mb, 3, cols, x, n, g_pool);
            for (int wi = 0; wi < 4; wi++) {
                flx_gemv_bf16(mq, 3, cols, x, n, g_pools[wi]);
                for (int i = 0; i < 3; i++) {
                    snprintf(label, sizeof label, "gemv %s %ux%u n=%u workers %u = bf16", flx_wfmt_name(fmts[i]), r3[i],
                             cols, n, FLX_TEST_WORKERS[wi]);
                    CHECK_SAME(label, yq[i], yb[i], (size_t)n * r3[i]);
                }
            }
            /* one matrix of each format fused with a bf16 one: each gives its bits alone */
            flx_gemv_mat_t mix[2] = {mq[1], mb[0]};
            float *y2 = malloc((size_t)n * rows * 4), *y1 = malloc((size_t)n * r3[1] * 4);
            mix[0].y = y1, mix[1].y = y2;
            flx_gemv_bf16(mix, 2, cols, x, n, g_pool);
            CHECK_SAME("gemv q8 fused with bf16", y1, yb[1], (size_t)n * r3[1]);
            CHECK_SAME("gemv bf16 fused with q8", y2, yb[0], (size_t)n * rows);
            free(y1), free(y2);
            for (int i = 0; i < 3; i++) free(yq[i]), free(yb[i]);
            free(x);
        }
        const uint32_t ns[2] = {5, 300};   /* the GEMV path and the packed-panel path */
        float *pack = flx_aligned_alloc(64, (size_t)7 * flx_gemm_pack_floats() * 4);
        for (int k = 0; k < 2; k++) {
            const uint32_t n = ns[k];
            float *x = malloc((size_t)n * cols * 4), *yq = malloc((size_t)n * rows * 4), *yb = malloc((size_t)n * rows * 4);
            rand_f(x, (size_t)n * cols, 1.0);
            for (int i = 0; i < 2; i++) {
                flx_gemv_mat_t mq = {{q[i], fmts[i]}, r3[i], yq}, mb = {BF16M(b[i]), r3[i], yb};
                flx_gemm_bf16(&mb, 1, cols, x, n, g_pool, pack);
                flx_gemm_bf16(&mq, 1, cols, x, n, g_pools[3], pack);
                snprintf(label, sizeof label, "gemm %s %ux%u n=%u = bf16", flx_wfmt_name(fmts[i]), r3[i], cols, n);
                CHECK_SAME(label, yq, yb, (size_t)n * r3[i]);
            }
            free(x), free(yq), free(yb);
        }
        flx_aligned_free(pack);
        for (int i = 0; i < 3; i++) free(q[i]), free(b[i]);
    }
}

static void test_gemm(void)
{
    const uint32_t shapes[][3] = {{100, 320, 5}, {33, 64, 300}, {576, 48, 9}, {40, 16, 261}};
    for (size_t si = 0; si < FLX_ARRAY_SIZE(shapes); si++) {
        uint32_t rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        flx_bf16_t *w = malloc((size_t)rows * cols * 2);
        float *x = malloc((size_t)n * cols * 4), *y = malloc((size_t)n * rows * 4), *yr = malloc((size_t)n * rows * 4);
        float *pack = flx_aligned_alloc(64, (size_t)7 * flx_gemm_pack_floats() * 4);
        rand_bf16(w, (size_t)rows * cols);
        rand_f(x, (size_t)n * cols, 1.0);
        flx_matmul_bf16_ref(w, rows, cols, x, n, yr);
        flx_gemv_mat_t mat = {BF16M(w), rows, y};
        flx_gemm_bf16(&mat, 1, cols, x, n, g_pool, pack);
        char label[96];
        snprintf(label, sizeof label, "gemm %ux%u n=%u", rows, cols, n);
        CHECK_CLOSE(label, y, yr, (size_t)n * rows, 1e-4 * sqrt(cols), 1e-5);
        for (int wi = 0; wi < 4; wi++) {   /* the same bits at 1, 2, 3, 7 workers */
            mat.y = yr;
            flx_gemm_bf16(&mat, 1, cols, x, n, g_pools[wi], pack);
            snprintf(label, sizeof label, "gemm %ux%u n=%u workers %u", rows, cols, n, FLX_TEST_WORKERS[wi]);
            CHECK_SAME(label, yr, y, (size_t)n * rows);
        }
        /* fused: three matrices in one run give each matrix's bits alone (W, the first rows of W,
         * W again), at every worker count */
        const uint32_t r3[3] = {rows, rows / 2 + 1, rows};
        float *y3[3];
        for (int wi = 0; wi < 4; wi++) {
            flx_gemv_mat_t m3[3];
            for (int i = 0; i < 3; i++) y3[i] = malloc((size_t)n * r3[i] * 4), m3[i] = (flx_gemv_mat_t){BF16M(w), r3[i], y3[i]};
            flx_gemm_bf16(m3, 3, cols, x, n, g_pools[wi], pack);
            for (int i = 0; i < 3; i++) {
                snprintf(label, sizeof label, "gemm fused %ux%u n=%u mat %d workers %u", r3[i], cols, n, i,
                         FLX_TEST_WORKERS[wi]);
                if (r3[i] == rows) {
                    CHECK_SAME(label, y3[i], y, (size_t)n * rows);
                } else {
                    mat = (flx_gemv_mat_t){BF16M(w), r3[i], yr};
                    flx_gemm_bf16(&mat, 1, cols, x, n, NULL, pack);
                    CHECK_SAME(label, y3[i], yr, (size_t)n * r3[i]);
                }
                free(y3[i]);
            }
        }
        free(w), free(x), free(y), free(yr), flx_aligned_free(pack);
    }
}

static void test_panels(flx_gemv_level_t lv)
{
    const uint32_t np = flx_gemm_panel(lv);
    for (int rep = 0; rep < 6; rep++) {
        uint32_t m = 1 + (uint32_t)flx_rng_below(&rng, 40), nr = 1 + (uint32_t)flx_rng_below(&rng, 100);
        uint32_t K = 1 + (uint32_t)flx_rng_below(&rng, 150);
        int acc = rep & 1;
        /* both layouts of forward.c: packed panels (ldp = np, pstride = K * np) and a plain row-major
         * (K, ldp) matrix cut into panels in place (pstride = np), with ldp a multiple of 16 >= nr */
        uint32_t npan = FLX_DIV_UP(nr, np), ld = FLX_DIV_UP(nr, 16) * 16;
        float *pp = calloc((size_t)npan * K * np, 4), *pr = calloc((size_t)K * ld + 16, 4);
        float *x = malloc((size_t)m * K * 4), *y0 = malloc((size_t)m * nr * 4);
        float *y = malloc((size_t)m * nr * 4), *yr = malloc((size_t)m * nr * 4);
        rand_f(x, (size_t)m * K, 1.0);
        rand_f(y0, (size_t)m * nr, 1.0);
        for (uint32_t k = 0; k < K; k++)
            for (uint32_t j = 0; j < nr; j++) {
                float val = (float)flx_rng_normal(&rng);
                pp[((size_t)(j / np) * K + k) * np + j % np] = val;
                pr[(size_t)k * ld + j] = val;
            }
        char label[96];
        for (int layout = 0; layout < 2; layout++) {
            const float *p = layout ? pr : pp;
            size_t pstride = layout ? np : (size_t)K * np, ldp = layout ? ld : np;
            memcpy(y, y0, (size_t)m * nr * 4);
            memcpy(yr, y0, (size_t)m * nr * 4);
            flx_gemm_panels(lv, m, nr, K, x, K, p, pstride, ldp, y, nr, acc);
            flx_gemm_panels_ref(m, nr, K, x, K, p, pstride, ldp, np, yr, nr, acc);
            snprintf(label, sizeof label, "panels m=%u nr=%u K=%u acc=%d layout=%d", m, nr, K, acc, layout);
            CHECK_CLOSE(label, y, yr, (size_t)m * nr, 1e-4 * sqrt(K), 1e-5);
        }
        free(pp), free(pr), free(x), free(y0), free(y), free(yr);
    }
}

static void test_rows(flx_gemv_level_t lv)
{
    for (uint32_t n = 1; n < 80; n += 13) {
        float *s = malloc(n * 4), *s2 = malloc(n * 4), *u = malloc(n * 4);
        rand_f(s, n, 4.0);
        rand_f(u, n, 1.0);
        memcpy(s2, s, n * 4);
        float mx = flx_max_row(lv, s, n), mr = flx_max_row_ref(s, n);
        CHECK(mx == mr);
        float sum = flx_exp_row(lv, s, n, mx), sr = flx_exp_row_ref(s2, n, mr);
        CHECK_CLOSE("exp_row", s, s2, n, 1e-7, 2e-6);
        CHECK_CLOSE("exp_row sum", &sum, &sr, 1, 1e-6, 2e-6);
        rand_f(s, n, 6.0);
        s[0] = 95.0f;   /* far tails: no overflow, no NaN */
        if (n > 1) s[1] = -95.0f;
        memcpy(s2, s, n * 4);
        flx_silu_mul(lv, s, u, n);
        flx_silu_mul_ref(s2, u, n);
        CHECK_CLOSE("silu_mul", s, s2, n, 1e-7, 2e-6);
        free(s), free(s2), free(u);
    }
}

/* The double reference forward (ref_forward, ref_out_t) and the test configs (ref_cfg_make) are in
 * ref_forward.h, shared with the GPU test. */

typedef struct {
    flx_model_t *m;
    flx_fwd_ws_t *ws;
    void *mem;
} fwd_t;

static void fwd_ws(const flx_model_config_t *c, uint32_t max_prompt, uint32_t max_batch, flx_pool_h pool, fwd_t *f)
{
    flx_fwd_shape_t shape = {max_prompt, max_batch, pool};
    size_t bytes;
    CHECK_OK(flx_fwd_plan(f->m, &shape, &bytes));
    f->mem = flx_aligned_alloc(64, bytes);
    CHECK(f->mem);
    CHECK_ST(flx_fwd_ws_init(f->m, &shape, f->mem, bytes - 64, &f->ws), FLX_ERR_INVALID);
    CHECK_OK(flx_fwd_ws_init(f->m, &shape, f->mem, bytes, &f->ws));
    CHECK(flx_fwd_ws_pool(f->ws) == pool);
    (void)c;
}

static void fwd_open(const flx_model_config_t *c, uint32_t max_prompt, uint32_t max_batch, fwd_t *f)
{
    CHECK_OK(flx_model_init_random(c, flx_rng_u64(&rng), &f->m));
    fwd_ws(c, max_prompt, max_batch, g_pool, f);
}

static void fwd_close(fwd_t *f)
{
    flx_model_destroy(f->m);
    flx_aligned_free(f->mem);
}

/* ================= dense KV cache (the test's attention callback) ================= */

typedef struct {
    uint32_t L, Hkv, D, cap, len;
    flx_bf16_t *k, *v;    /* (L, Hkv, cap, D) */
} kvcache_t;

static void kv_init(kvcache_t *kv, const flx_model_config_t *c, uint32_t cap)
{
    kv->L = c->n_layers, kv->Hkv = c->n_kv_heads, kv->D = c->head_dim, kv->cap = cap, kv->len = 0;
    kv->k = calloc((size_t)kv->L * kv->Hkv * cap * kv->D, 2);
    kv->v = calloc((size_t)kv->L * kv->Hkv * cap * kv->D, 2);
}

static void kv_free(kvcache_t *kv)
{
    free(kv->k), free(kv->v);
}

static void kv_copy(kvcache_t *dst, const kvcache_t *src)
{
    *dst = *src;
    size_t bytes = (size_t)src->L * src->Hkv * src->cap * src->D * 2;
    dst->k = malloc(bytes), dst->v = malloc(bytes);
    memcpy(dst->k, src->k, bytes), memcpy(dst->v, src->v, bytes);
}

typedef struct {
    kvcache_t *kv;
    float *cap_k, *cap_v, *cap_q;   /* capture: K, V (L, Hkv, n, D) as floats, q' (L, Hq, D), or NULL */
    uint32_t Hq;
    int calls;
} sink_t;

static flx_status_t on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                             const float *q_last)
{
    sink_t *s = ctx;
    kvcache_t *kv = s->kv;
    const size_t D = kv->D, per = (size_t)n * D;
    CHECK(layer == (uint32_t)s->calls);
    s->calls++;
    for (uint32_t h = 0; h < kv->Hkv; h++) {
        size_t base = ((size_t)layer * kv->Hkv + h) * kv->cap * D;
        memcpy(kv->k + base, k + h * per, per * 2);
        memcpy(kv->v + base, v + h * per, per * 2);
    }
    kv->len = n;
    if (s->cap_k) {
        size_t cnt = (size_t)kv->Hkv * per;
        for (size_t i = 0; i < cnt; i++) {
            s->cap_k[layer * cnt + i] = flx_bf16_to_f32(k[i]);
            s->cap_v[layer * cnt + i] = flx_bf16_to_f32(v[i]);
        }
        memcpy(s->cap_q + (size_t)layer * s->Hq * D, q_last, (size_t)s->Hq * D * 4);
    }
    return FLX_OK;
}

typedef struct {
    kvcache_t **seq;      /* (batch) cache of each sequence */
    const uint32_t *pos;  /* (batch) */
    uint32_t Hq;
} attn_ctx_t;

static flx_status_t dense_attn(void *ctx, uint32_t layer, uint32_t batch, const float *q, const float *k,
                               const float *v, float *o)
{
    attn_ctx_t *a = ctx;
    for (uint32_t b = 0; b < batch; b++) {
        kvcache_t *kv = a->seq[b];
        const uint32_t D = kv->D, Hkv = kv->Hkv, pos = a->pos[b];
        CHECK(pos < kv->cap);
        ref_dense_step(kv->k, kv->v, kv->cap, Hkv, a->Hq, D, layer, pos, q + (size_t)b * a->Hq * D,
                       k + (size_t)b * Hkv * D, v + (size_t)b * Hkv * D, o + (size_t)b * a->Hq * D);
    }
    return FLX_OK;
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static double rms(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s / n);
}

/* Greedy tokens agree, unless the reference's top two are closer than the tolerance. */
static void check_argmax(const float *got, const float *ref, uint32_t V, double atol, double rtol)
{
    uint32_t a = argmax(got, V), b = argmax(ref, V);
    if (a == b) return;
    double gap = fabs((double)ref[a] - ref[b]);
    fprintf(stderr, "argmax %u vs reference %u, reference gap %.3g\n", a, b, gap);
    CHECK(gap <= 2 * (atol + rtol * fabs(ref[b])));
}

/* ================= (b) + (c) ================= */

static void test_model(const flx_model_config_t *c, uint32_t n, uint32_t m_dec)
{
    const uint32_t N = n + m_dec, V = c->vocab, D = c->head_dim;
    const size_t qd = (size_t)c->n_heads * D, kvd = (size_t)c->n_kv_heads * D;
    fwd_t f;
    fwd_open(c, N, 4, &f);
    int32_t *tok = malloc(N * 4);
    for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)flx_rng_below(&rng, V);
    const size_t kvn = (size_t)c->n_layers * N * kvd;
    ref_out_t ref = {malloc((size_t)N * V * 4), malloc(kvn * 4), malloc(kvn * 4), malloc((size_t)c->n_layers * N * qd * 4), 0};

    /* (b) teacher-forced prefill of all N tokens vs the reference */
    float *all = malloc((size_t)N * V * 4), *last = malloc(V * 4), *q_all = malloc((size_t)c->n_layers * N * qd * 4);
    float *mk = malloc(kvn * 4), *mv = malloc(kvn * 4), *mq = malloc((size_t)c->n_layers * qd * 4);
    kvcache_t kv;
    kv_init(&kv, c, N);
    sink_t sink = {&kv, mk, mv, mq, c->n_heads, 0};
    flx_prefill_args_t pa = {tok, N, on_layer, &sink, last, all, q_all};
    CHECK_OK(flx_model_prefill(f.m, f.ws, &pa));
    CHECK(sink.calls == (int)c->n_layers);
    ref_forward(f.m, tok, N, mk, mv, &ref);
    fprintf(stderr, "%s: %d near-midpoint K/V roundings taken from the model\n", c->name, ref.ties);
    char label[128];
    const double scale = rms(ref.logits, (size_t)N * V), p_atol = PREFILL_ATOL * scale, d_atol = DECODE_ATOL * scale;
    snprintf(label, sizeof label, "%s prefill n=%u logits_all", c->name, N);
    CHECK_CLOSE(label, all, ref.logits, (size_t)N * V, p_atol, PREFILL_RTOL);
    CHECK(memcmp(last, all + (size_t)(N - 1) * V, V * 4) == 0);
    CHECK_CLOSE("on_layer K", mk, ref.k, kvn, 1e-30, 0);
    CHECK_CLOSE("on_layer V", mv, ref.v, kvn, 1e-30, 0);
    CHECK_CLOSE("q_all", q_all, ref.q, (size_t)c->n_layers * N * qd, 1e-4, 1e-4);
    for (uint32_t l = 0; l < c->n_layers; l++)
        CHECK(memcmp(mq + (size_t)l * qd, q_all + ((size_t)l * N + N - 1) * qd, qd * 4) == 0);
    for (uint32_t t = 0; t < N; t++)
        check_argmax(all + (size_t)t * V, ref.logits + (size_t)t * V, V, p_atol, PREFILL_RTOL);
    /* logits_last alone takes the GEMV path for the head */
    float *last2 = malloc(V * 4);
    flx_prefill_args_t pl = {tok, N, NULL, NULL, last2, NULL, NULL};
    CHECK_OK(flx_model_prefill(f.m, f.ws, &pl));
    CHECK_CLOSE("logits_last only", last2, ref.logits + (size_t)(N - 1) * V, V, p_atol, PREFILL_RTOL);

    /* (c) prefill n, then decode m_dec tokens one at a time through the dense cache */
    kv_free(&kv);
    kv_init(&kv, c, N);
    sink_t sink2 = {&kv, NULL, NULL, NULL, c->n_heads, 0};
    flx_prefill_args_t pn = {tok, n, on_layer, &sink2, last, NULL, NULL};
    CHECK_OK(flx_model_prefill(f.m, f.ws, &pn));
    snprintf(label, sizeof label, "%s prefill n=%u logits_last", c->name, n);
    CHECK_CLOSE(label, last, all + (size_t)(n - 1) * V, V, p_atol, PREFILL_RTOL);
    float *lg = malloc(V * 4);
    for (uint32_t i = 0; i < m_dec; i++) {
        uint32_t pos = n + i;
        kvcache_t *seq[1] = {&kv};
        attn_ctx_t actx = {seq, &pos, c->n_heads};
        flx_decode_args_t da = {1, &tok[pos], &pos, dense_attn, &actx, lg};
        CHECK_OK(flx_model_decode(f.m, f.ws, &da));
        snprintf(label, sizeof label, "%s decode pos %u vs prefill", c->name, pos);
        CHECK_CLOSE(label, lg, all + (size_t)pos * V, V, d_atol, DECODE_RTOL);
        check_argmax(lg, all + (size_t)pos * V, V, d_atol, DECODE_RTOL);
        flx_fwd_timing_t tm;
        flx_fwd_timing_get(f.ws, &tm);
        CHECK(tm.dense_bytes == flx_model_weight_bytes(f.m) && tm.dense_ns > 0);
    }
    kv_free(&kv);
    free(tok), free(ref.logits), free(ref.k), free(ref.v), free(ref.q), free(all), free(last), free(last2);
    free(q_all), free(lg), free(mk), free(mv), free(mq);
    fwd_close(&f);
}

/* ================= (d) batch == singles ================= */

static void test_batch(const flx_model_config_t *c)
{
    const uint32_t V = c->vocab, lens[3] = {5, 23, 12}, steps = 2;
    fwd_t f;
    fwd_open(c, 32, 3, &f);
    kvcache_t kv[3], kv1[3];
    int32_t tok[3][32];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 32; i++) tok[s][i] = (int32_t)flx_rng_below(&rng, V);
        kv_init(&kv[s], c, 32);
        sink_t sink = {&kv[s], NULL, NULL, NULL, c->n_heads, 0};
        flx_prefill_args_t pa = {tok[s], lens[s], on_layer, &sink, NULL, NULL, NULL};
        CHECK_OK(flx_model_prefill(f.m, f.ws, &pa));
        kv_copy(&kv1[s], &kv[s]);
    }
    float *lb = malloc(3 * V * 4), *l1 = malloc(V * 4);
    for (uint32_t st = 0; st < steps; st++) {
        uint32_t pos[3];
        int32_t tb[3];
        kvcache_t *seq[3];
        for (int s = 0; s < 3; s++) pos[s] = lens[s] + st, tb[s] = tok[s][pos[s]], seq[s] = &kv[s];
        attn_ctx_t actx = {seq, pos, c->n_heads};
        flx_decode_args_t da = {3, tb, pos, dense_attn, &actx, lb};
        CHECK_OK(flx_model_decode(f.m, f.ws, &da));
        for (int s = 0; s < 3; s++) {
            kvcache_t *one[1] = {&kv1[s]};
            attn_ctx_t a1 = {one, &pos[s], c->n_heads};
            flx_decode_args_t d1 = {1, &tb[s], &pos[s], dense_attn, &a1, l1};
            CHECK_OK(flx_model_decode(f.m, f.ws, &d1));
            char label[96];
            snprintf(label, sizeof label, "batch seq %d pos %u vs alone", s, pos[s]);
            CHECK_CLOSE(label, lb + (size_t)s * V, l1, V, 1e-5, 1e-5);
        }
    }
    for (int s = 0; s < 3; s++) kv_free(&kv[s]), kv_free(&kv1[s]);
    free(lb), free(l1);
    fwd_close(&f);
}

/* ================= (e) bad arguments ================= */

static void check_msg(const char *want)
{
    if (!strstr(flx_error_msg(), want)) {
        fprintf(stderr, "message '%s' does not name '%s'\n", flx_error_msg(), want);
        CHECK(0);
    }
}

static flx_status_t no_attn(void *ctx, uint32_t layer, uint32_t batch, const float *q, const float *k, const float *v,
                            float *o)
{
    memset(o, 0, (size_t)batch * *(uint32_t *)ctx * 4);
    return FLX_OK;
}

static flx_status_t fail_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                               const float *q_last)
{
    return layer == 1 ? flx_error_set(FLX_ERR_CAPACITY, "sink full") : FLX_OK;
}

static void test_bad_args(void)
{
    flx_model_config_t c = ref_cfg_make(FLX_ARCH_LLAMA, 64, 4, 2, 16, 64, 50, 1);
    fwd_t f;
    fwd_open(&c, 8, 2, &f);
    int32_t tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float logits[2 * 50];
    flx_prefill_args_t pa = {tok, 9, NULL, NULL, logits, NULL, NULL};
    CHECK_ST(flx_model_prefill(f.m, f.ws, &pa), FLX_ERR_INVALID);
    check_msg("n_tokens 9");
    pa.n_tokens = 0;
    CHECK_ST(flx_model_prefill(f.m, f.ws, &pa), FLX_ERR_INVALID);
    check_msg("n_tokens 0");
    pa.n_tokens = 5;
    tok[3] = 50;
    CHECK_ST(flx_model_prefill(f.m, f.ws, &pa), FLX_ERR_INVALID);
    check_msg("token id 50 at position 3");
    tok[3] = -2;
    CHECK_ST(flx_model_prefill(f.m, f.ws, &pa), FLX_ERR_INVALID);
    check_msg("token id -2 at position 3");
    tok[3] = 4;
    pa.on_layer = fail_layer;
    CHECK_ST(flx_model_prefill(f.m, f.ws, &pa), FLX_ERR_CAPACITY);
    pa.on_layer = NULL;
    CHECK_OK(flx_model_prefill(f.m, f.ws, &pa));

    uint32_t qd = c.n_heads * c.head_dim, pos[3] = {5, 6, 7};
    flx_decode_args_t da = {3, tok, pos, no_attn, &qd, logits};
    CHECK_ST(flx_model_decode(f.m, f.ws, &da), FLX_ERR_INVALID);
    check_msg("batch 3");
    da.batch = 0;
    CHECK_ST(flx_model_decode(f.m, f.ws, &da), FLX_ERR_INVALID);
    check_msg("batch 0");
    da.batch = 2;
    tok[1] = 77;
    CHECK_ST(flx_model_decode(f.m, f.ws, &da), FLX_ERR_INVALID);
    check_msg("token id 77 of sequence 1");
    tok[1] = 2;
    da.attn = NULL;
    CHECK_ST(flx_model_decode(f.m, f.ws, &da), FLX_ERR_INVALID);
    da.attn = no_attn;
    CHECK_OK(flx_model_decode(f.m, f.ws, &da));

    /* a workspace planned for another shape is refused */
    flx_model_config_t c2 = c;
    c2.hidden = 80;
    flx_model_t *m2;
    CHECK_OK(flx_model_init_random(&c2, 1, &m2));
    CHECK_ST(flx_model_decode(m2, f.ws, &da), FLX_ERR_INVALID);
    check_msg("hidden 64");
    flx_model_destroy(m2);
    c2 = c;
    c2.rope_theta = 5e5f;   /* same shapes, other RoPE: the workspace's frequencies would be wrong */
    CHECK_OK(flx_model_init_random(&c2, 1, &m2));
    CHECK_ST(flx_model_decode(m2, f.ws, &da), FLX_ERR_INVALID);
    check_msg("rope_theta 500000");
    flx_model_destroy(m2);
    flx_fwd_shape_t bad = {0, 1, NULL};
    size_t bytes;
    CHECK_ST(flx_fwd_plan(f.m, &bad, &bytes), FLX_ERR_INVALID);
    check_msg("max_prompt 0");
    fwd_close(&f);
}

/* ================= (f) the same bits at any worker count ================= */

/* Prefill of n tokens (all logits, K/V and q' of every layer) and two decode steps of a batch of
 * 3, on a pool of FLX_TEST_WORKERS[wi] workers; out receives everything, in a fixed order. */
static size_t run_workers(const flx_model_t *m, const int32_t *tok, uint32_t n, flx_pool_h pool, float *out)
{
    const flx_model_config_t *c = &m->cfg;
    const uint32_t V = c->vocab, N = n + 2;
    fwd_t f = {.m = (flx_model_t *)m};
    fwd_ws(c, N, 3, pool, &f);
    const size_t kvd = (size_t)c->n_kv_heads * c->head_dim, kvn = (size_t)c->n_layers * n * kvd;
    kvcache_t kv[3];
    size_t at = 0;
    for (int s = 0; s < 3; s++) {   /* three sequences at different positions; the first one captured */
        kv_init(&kv[s], c, N);
        const size_t nv = (size_t)n * V;
        sink_t sink = {&kv[s], s ? NULL : out + at + nv, s ? NULL : out + at + nv + kvn,
                       s ? NULL : out + at + nv + 2 * kvn, c->n_heads, 0};
        flx_prefill_args_t pa = {tok, n - 7 * (uint32_t)s, on_layer, &sink, NULL, s ? NULL : out + at, NULL};
        CHECK_OK(flx_model_prefill(m, f.ws, &pa));
        if (s == 0) at += nv + 2 * kvn + (size_t)c->n_layers * c->n_heads * c->head_dim;
    }
    for (uint32_t st = 0; st < 2; st++) {
        uint32_t pos[3];
        int32_t tb[3];
        kvcache_t *seq[3];
        for (int s = 0; s < 3; s++) pos[s] = n - 7 * (uint32_t)s + st, tb[s] = tok[pos[s]], seq[s] = &kv[s];
        attn_ctx_t actx = {seq, pos, c->n_heads};
        flx_decode_args_t da = {3, tb, pos, dense_attn, &actx, out + at};
        CHECK_OK(flx_model_decode(m, f.ws, &da));
        at += (size_t)3 * V;
    }
    for (int s = 0; s < 3; s++) kv_free(&kv[s]);
    flx_aligned_free(f.mem);
    return at;
}

static void test_workers(const flx_model_config_t *c, uint32_t n)
{
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(c, flx_rng_u64(&rng), &m));
    const uint32_t V = c->vocab, N = n + 2;
    const size_t kvn = (size_t)c->n_layers * n * c->n_kv_heads * c->head_dim;
    const size_t total = (size_t)n * V + 2 * kvn + (size_t)c->n_layers * c->n_heads * c->head_dim + (size_t)6 * V;
    int32_t *tok = malloc(N * 4);
    for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)flx_rng_below(&rng, V);
    float *ref = malloc(total * 4), *got = malloc(total * 4);
    CHECK(run_workers(m, tok, n, NULL, ref) == total);
    for (int wi = 0; wi < 4; wi++) {
        memset(got, 0, total * 4);
        run_workers(m, tok, n, g_pools[wi], got);
        char label[128];
        snprintf(label, sizeof label, "%s prefill %u + decode batch 3 on %u workers vs the caller alone", c->name, n,
                 FLX_TEST_WORKERS[wi]);
        CHECK_SAME(label, got, ref, total);
    }
    fprintf(stderr, "%s: prefill %u tokens and decode steps: the same bits at 1, 2, 3 and 7 workers\n", c->name, n);
    free(tok), free(ref), free(got);
    flx_model_destroy(m);
}

/* ================= benchmark (not a test) ================= */

static double best_of(int reps, double (*fn)(void *), void *arg)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = fn(arg);
        best = t < best ? t : best;
    }
    return best;
}

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    flx_pool_h pool;
    const flx_gemv_mat_t *mats;
    uint32_t cols, n;
} bench_arg_t;


static double time_read(void *p)
{
    bench_arg_t *a = p;
    return a->bytes / (flx_bench_read_bw(a->pool, a->buf, a->bytes, 1) * 1e9);
}

static double time_gemv(void *p)
{
    bench_arg_t *a = p;
    uint64_t t0 = flx_now_ns();
    flx_gemv_bf16(a->mats, 1, a->cols, (const float *)a->buf, a->n, a->pool);
    return (flx_now_ns() - t0) * 1e-9;
}

static void bench_gemv(void)
{
    const size_t GiB = (size_t)1 << 30;
    uint8_t *buf = flx_aligned_alloc(64, GiB);
    CHECK(buf);
    memset(buf, 1, GiB);
    /* GEMV: one 512 MiB bf16 matrix, far larger than any cache */
    const uint32_t rows = 65536 * 4, cols = 1024;   /* cols as in real models: n vectors stay in L1 */
    flx_bf16_t *w = flx_aligned_alloc(64, (size_t)rows * cols * 2);
    float *x = malloc((size_t)8 * cols * 4), *y = malloc((size_t)8 * rows * 4);
    CHECK(w && x && y);
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = (flx_bf16_t)(0x3f80 + (i & 63));
    rand_f(x, (size_t)8 * cols, 1.0);
    printf("level %s, %d workers max\n", flx_gemv_level_name(flx_gemv_level()), g_threads);
    for (int nth = 1; nth <= g_threads; nth++) {
        flx_pool_h pool = flx_test_pool((uint32_t)nth);
        bench_arg_t ra = {buf, GiB, pool, NULL, 0, 0};
        double tr = best_of(5, time_read, &ra), bw_read = GiB / tr * 1e-9;
        for (uint32_t n = 1; n <= 8; n *= 2) {
            flx_gemv_mat_t mat = {BF16M(w), rows, y};
            bench_arg_t ga = {(const uint8_t *)x, 0, pool, &mat, cols, n};
            double tg = best_of(5, time_gemv, &ga), bw = (double)rows * cols * 2 / tg * 1e-9;
            printf("workers %d: read %.2f GB/s | gemv batch %u: %.2f GB/s = %.2f of read, %.3f ms per token\n", nth,
                   bw_read, n, bw, bw / bw_read, tg * 1e3 / n);
        }
        flx_pool_destroy(pool);
    }
    flx_aligned_free(w), free(x), free(y), flx_aligned_free(buf);
}

/* `bench` runs the GEMV and decode parts, `bench N` adds a prefill of N tokens, `bench prefill N`
 * runs only that prefill. */
static int bench(int argc, char **argv)
{
    const int only_prefill = argc > 2 && strcmp(argv[2], "prefill") == 0;
    const char *n_s = only_prefill ? (argc > 3 ? argv[3] : "") : argc > 2 ? argv[2] : "0";
    uint64_t n_u;
    if (argc > 3 + only_prefill || flx_parse_u64(n_s, only_prefill, 1u << 20, &n_u)) {
        fprintf(stderr, "test_forward: bench: '%s' is not N (usage: test_forward bench [N | prefill N], N prefill "
                "tokens in %d..1048576)\n", argc > 3 + only_prefill ? argv[argc - 1] : n_s, only_prefill);
        return 2;
    }
    const uint32_t n_prefill = (uint32_t)n_u;
    if (!only_prefill) bench_gemv();
    /* SmolLM2-135M shape, random weights: decode step dense part, and optionally a prefill */
    flx_model_config_t c = ref_cfg_make(FLX_ARCH_LLAMA, 576, 9, 3, 64, 1536, 49152, 1);
    c.n_layers = 30;
    c.rope_theta = 1e5f;
    fwd_t f;
    fwd_open(&c, n_prefill ? n_prefill : 16, 8, &f);
    uint32_t qd = c.n_heads * c.head_dim;
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t pos[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    float *lg = malloc((size_t)8 * c.vocab * 4);
    /* The same read over exactly the bytes a decode step reads (the model's matrices, each its own
     * allocation): the 1 GiB buffer above reads slower than these on this VM at 2 threads. */
    double wread = 0;
    if (!only_prefill) {
        double best = 1e30;
        size_t bytes = 0;
        for (int rep = 0; rep < 5; rep++) {
            uint64_t t0 = flx_now_ns();
            bytes = 0;
            for (uint32_t l = 0; l < c.n_layers; l++) {
                const flx_layer_weights_t *lw = &f.m->layers[l];
                const void *mats[7] = {lw->wq.p, lw->wk.p, lw->wv.p, lw->wo.p, lw->w_gate.p, lw->w_up.p, lw->w_down.p};
                size_t qd_ = (size_t)c.n_heads * c.head_dim, kvd_ = (size_t)c.n_kv_heads * c.head_dim;
                size_t sz[7] = {qd_ * c.hidden, kvd_ * c.hidden, kvd_ * c.hidden, qd_ * c.hidden,
                                (size_t)c.ffn * c.hidden, (size_t)c.ffn * c.hidden, (size_t)c.ffn * c.hidden};
                for (int i = 0; i < 7; i++) {
                    (void)flx_bench_read_bw(g_pool, (const uint8_t *)mats[i], sz[i] * 2 / 128 * 128, 1);
                    bytes += sz[i] * 2 / 128 * 128;
                }
            }
            const size_t head = (size_t)c.vocab * c.hidden * 2 / 128 * 128;
            (void)flx_bench_read_bw(g_pool, (const uint8_t *)f.m->lm_head.p, head, 1);
            bytes += head;
            double t = (flx_now_ns() - t0) * 1e-9;
            best = t < best ? t : best;
        }
        wread = bytes / best * 1e-9;
        printf("read of the model's weight matrices (%.0f MB), %d workers: %.2f GB/s\n", bytes * 1e-6, g_threads,
               wread);
    }
    for (uint32_t b = 1; b <= 8 && !only_prefill; b *= 2) {
        flx_decode_args_t da = {b, tok, pos, no_attn, &qd, lg};
        flx_fwd_timing_t tm, best = {UINT64_MAX, 0, 0};
        for (int i = 0; i < 6; i++) {
            CHECK_OK(flx_model_decode(f.m, f.ws, &da));
            flx_fwd_timing_get(f.ws, &tm);
            if (tm.dense_ns < best.dense_ns) best = tm;
        }
        double gbs = best.dense_bytes / (double)best.dense_ns;
        printf("SmolLM2-135M shape decode batch %u, %d workers: dense %.2f ms (%.2f GB/s of weights = %.2f of the "
               "weight read), %.3f ms per token\n", b, g_threads, best.dense_ns * 1e-6, gbs, gbs / wread,
               best.dense_ns * 1e-6 / b);
    }
    if (n_prefill) {
        int32_t *pt = malloc(n_prefill * 4);
        for (uint32_t i = 0; i < n_prefill; i++) pt[i] = (int32_t)flx_rng_below(&rng, c.vocab);
        flx_prefill_args_t pa = {pt, n_prefill, NULL, NULL, lg, NULL, NULL};
        uint64_t t0 = flx_now_ns();
        CHECK_OK(flx_model_prefill(f.m, f.ws, &pa));
        printf("SmolLM2-135M shape prefill %u tokens: %.2f s\n", n_prefill, (flx_now_ns() - t0) * 1e-9);
        free(pt);
    }
    free(lg);
    fwd_close(&f);
    return 0;
}

/* ================= main ================= */

int main(int argc, char **argv)
{
    flx_rng_seed(&rng, flx_test_seed("test_forward"));
    if (getenv("FLX_THREADS")) g_threads = atoi(getenv("FLX_THREADS")) > 0 ? atoi(getenv("FLX_THREADS")) : 1;
    g_pool = flx_test_pool((uint32_t)g_threads);
    for (int i = 0; i < 4; i++) g_pools[i] = flx_test_pool(FLX_TEST_WORKERS[i]);
    if (argc > 1 && strcmp(argv[1], "bench") == 0) return bench(argc, argv);
    if (argc > 1 && strcmp(argv[1], "workers") == 0) {   /* (f) alone, at the best level (the TSan run) */
        flx_model_config_t cw = ref_cfg_make(FLX_ARCH_QWEN2, 80, 6, 2, 48, 112, 97, 0);   /* G3 D48 bias */
        test_gemv();
        test_gemv_blocks();
        test_gemm();
        test_workers(&cw, 40);
        for (int i = 0; i < 4; i++) flx_pool_destroy(g_pools[i]);
        flx_pool_destroy(g_pool);
        fprintf(stderr, "test_forward workers: ok\n");
        return 0;
    }

    const flx_gemv_level_t levels[] = {FLX_GEMV_SCALAR, FLX_GEMV_AVX2, FLX_GEMV_AVX512};
    for (size_t li = 0; li < FLX_ARRAY_SIZE(levels); li++) {
        static const flx_isa_t isa_of[] = {FLX_ISA_SCALAR, FLX_ISA_AVX2, FLX_ISA_AVX512};
        flx_isa_force(isa_of[levels[li]]);
        if (flx_gemv_level() != levels[li]) {
            fprintf(stderr, "level %s: not supported by this CPU, skipped\n", flx_gemv_level_name(levels[li]));
            continue;
        }
        fprintf(stderr, "=== level %s ===\n", flx_gemv_level_name(levels[li]));
        test_gemv();
        test_gemv_blocks();
        test_gemm();
        test_panels(levels[li]);
        test_rows(levels[li]);

        flx_model_config_t c1 = ref_cfg_make(FLX_ARCH_LLAMA, 128, 4, 1, 64, 256, 301, 1);      /* G4 D64 tied */
        flx_model_config_t c2 = ref_cfg_make(FLX_ARCH_QWEN2, 128, 8, 1, 128, 192, 257, 0);     /* G8 D128 bias */
        flx_model_config_t c3 = ref_cfg_make(FLX_ARCH_LLAMA, 64, 2, 2, 128, 96, 199, 0);       /* G1 D128 llama3 */
        c3.rope_scaling = FLX_ROPE_LLAMA3;
        c3.rope_theta = 5e5f;
        c3.rope_factor = 8, c3.rope_low_freq_factor = 1, c3.rope_high_freq_factor = 4, c3.rope_orig_ctx = 64;
        flx_model_config_t c4 = ref_cfg_make(FLX_ARCH_QWEN2, 80, 3, 3, 48, 112, 97, 1);        /* G1 D48 tails */
        test_model(&c1, 131, 3);
        test_model(&c2, 37, 5);
        test_model(&c3, 45, 4);
        test_model(&c4, 19, 3);
        test_model(&c4, 1, 2);    /* one-token prompt */
        if (levels[li] != FLX_GEMV_SCALAR) {  /* a long prompt: several FFN chunks and attention blocks */
            flx_model_config_t c5 = ref_cfg_make(FLX_ARCH_LLAMA, 64, 4, 2, 16, 64, 64, 0);
            test_model(&c5, 521, 2);
        }
        test_batch(&c1);
        test_batch(&c2);
        test_bad_args();
        test_workers(&c1, 300);
        test_workers(&c4, 77);
    }
    flx_isa_force(flx_isa_best());   /* back to the best level */
    flx_pool_destroy(g_pool);
    for (int i = 0; i < 4; i++) flx_pool_destroy(g_pools[i]);
    fprintf(stderr, "test_forward: ok\n");
    return 0;
}
