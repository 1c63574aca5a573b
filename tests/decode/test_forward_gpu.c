/*
 * test_forward_gpu - the GPU forward pass (flx/forward_gpu.h) against the CPU forward (flx/forward.h)
 * on random models (flx_model_init_random) of both families: Llama, and Qwen2 with QKV biases;
 * head_dim 64 and 128; GQA groups 1, 4 and 8; tied and untied heads; llama3 RoPE scaling. Label
 * gpu: exits 77 where no CUDA device is usable (including binaries built without CUDA).
 *  (a) prefill, in chunks smaller than the prompt (and not dividing it) and more rows than one
 *      LM-head pass: every layer's K, V and q' handed to the sink, q_all, logits_all and
 *      logits_last; and logits_last alone (the one-row head path);
 *  (b) decode of batch 1, step by step after a prefill, through a dense bf16 KV cache (the test's
 *      attention callback, on the host q, k, v the forward hands over), each side feeding its own
 *      cache; the callback also checks that the device q, k, v equal the host ones, byte for byte;
 *  (c) decode of batch 3 at different positions;
 *  (d) refusals and errors: bad batch, token ids, NULL callback, prompt longer than planned, a
 *      workspace of another model, an error from the callback or the sink (returned as is, the
 *      workspace usable afterwards).
 *
 * Two references for (a) - (c):
 *  - the double-precision forward of ref_forward.h, taking the GPU's own rounding of the few K/V
 *    values that lie within fp32 rounding of a bf16 midpoint (see there): the GPU's logits within
 *    5e-5 x RMS(logits) + 1e-4 relative (prefill; decode 1e-4 RMS), its K, V exactly, q within
 *    1e-4, as test_forward holds the CPU forward;
 *  - the CPU forward itself: logits and queries within 5e-3 x RMS + 1e-3 relative, layer 0's K
 *    and V within one bf16 step (2^-7 relative), later layers' within 1e-2 RMS. Looser, because
 *    the two sides round those near-midpoint K/V values independently (about one value in 20000
 *    goes the other way; one on a large V that a head attends to moved logits by ~2e-3 RMS in the
 *    CPU simulation of the kernels) and later layers inherit it.
 * A wrong kernel (mask, head, RoPE, bias, norm, layout) moves logits by O(0.1 .. 1) RMS.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cuda_rt.h"
#include "flx/forward.h"
#include "flx/forward_gpu.h"
#include "flx/model.h"
#include "flx_test.h"
#include "ref_forward.h"

#define TOL 1e-3           /* relative, vs the CPU forward */
#define CPU_ATOL 5e-3      /* x RMS: logits vs the CPU forward */
#define REF_ATOL 5e-5      /* x RMS: prefill logits vs the reference */
#define REF_DEC_ATOL 1e-4  /* x RMS: decode logits vs the reference */
#define REF_RTOL 1e-4

static flx_rng_t rng;
static flx_cuda_stream_t g_stream;


/* ---- both forwards on one model ---- */

typedef struct fx {
    flx_model_t *m;
    void *cmem;
    flx_fwd_ws_t *cws;          /* CPU */
    flx_gpu_model_h gm;
    void *dmem, *hmem;
    flx_gpu_fwd_ws_h gws;       /* GPU */
} fx_t;

static void fx_open(fx_t *f, const flx_model_config_t *c, uint32_t max_prompt, uint32_t max_batch, uint32_t chunk)
{
    CHECK_OK(flx_model_init_random(c, flx_rng_u64(&rng), &f->m));
    flx_fwd_shape_t cs = {max_prompt, max_batch, NULL};   /* the CPU side on this thread */
    size_t b;
    CHECK_OK(flx_fwd_plan(f->m, &cs, &b));
    f->cmem = flx_aligned_alloc(64, b);
    CHECK(f->cmem);
    CHECK_OK(flx_fwd_ws_init(f->m, &cs, f->cmem, b, &f->cws));
    CHECK_OK(flx_gpu_model_create(f->m, 0, &f->gm));
    flx_gpu_fwd_shape_t gs = {.max_prompt = max_prompt, .max_batch = max_batch, .prefill_chunk = chunk};
    size_t db, hb;
    CHECK_OK(flx_gpu_fwd_plan(f->m, &gs, &db, &hb));
    CHECK_OK(flx_cuda_malloc(0, db, &f->dmem));
    CHECK_OK(flx_cuda_host_alloc(hb, &f->hmem));
    CHECK_OK(flx_gpu_fwd_ws_create(f->gm, &gs, f->dmem, db, f->hmem, hb, &f->gws));
}

static void fx_close(fx_t *f)
{
    flx_gpu_fwd_ws_destroy(f->gws);
    CHECK_OK(flx_cuda_free(0, f->dmem));
    flx_cuda_host_free(f->hmem);
    flx_gpu_model_destroy(f->gm);
    flx_aligned_free(f->cmem);
    flx_model_destroy(f->m);
}

/* ---- the prefill sink: capture K, V (as floats) and q' of every layer, and fill a dense cache ---- */

typedef struct kvcache {
    uint32_t L, Hkv, D, cap;
    flx_bf16_t *k, *v;    /* (L, Hkv, cap, D) */
} kvcache_t;

static void kv_init(kvcache_t *kv, const flx_model_config_t *c, uint32_t cap)
{
    kv->L = c->n_layers, kv->Hkv = c->n_kv_heads, kv->D = c->head_dim, kv->cap = cap;
    kv->k = calloc((size_t)kv->L * kv->Hkv * cap * kv->D, 2);
    kv->v = calloc((size_t)kv->L * kv->Hkv * cap * kv->D, 2);
    CHECK(kv->k && kv->v);
}

static void kv_free(kvcache_t *kv)
{
    free(kv->k), free(kv->v);
}

typedef struct sink {
    kvcache_t *kv;          /* or NULL */
    float *cap_k, *cap_v;   /* (L, Hkv, n, D) or NULL */
    float *cap_q;           /* (L, Hq, D) */
    uint32_t Hq;
    uint32_t calls;
    uint32_t fail_at;       /* layer that returns an error, or UINT32_MAX */
} sink_t;

static flx_status_t on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                             const float *q_last)
{
    sink_t *s = ctx;
    CHECK(layer == s->calls);
    s->calls++;
    if (layer == s->fail_at) return flx_error_set(FLX_ERR_CAPACITY, "sink full at layer %u", layer);
    if (s->kv) {
        kvcache_t *kv = s->kv;
        const size_t per = (size_t)n * kv->D;
        for (uint32_t h = 0; h < kv->Hkv; h++) {
            const size_t base = ((size_t)layer * kv->Hkv + h) * kv->cap * kv->D;
            memcpy(kv->k + base, k + h * per, per * 2);
            memcpy(kv->v + base, v + h * per, per * 2);
        }
    }
    if (s->cap_k) {
        const size_t cnt = (size_t)s->kv->Hkv * n * s->kv->D;
        for (size_t i = 0; i < cnt; i++) {
            s->cap_k[layer * cnt + i] = flx_bf16_to_f32(k[i]);
            s->cap_v[layer * cnt + i] = flx_bf16_to_f32(v[i]);
        }
        memcpy(s->cap_q + (size_t)layer * s->Hq * s->kv->D, q_last, (size_t)s->Hq * s->kv->D * 4);
    }
    return FLX_OK;
}

/* ---- the decode attention: dense softmax over the cache, for the CPU and the GPU callbacks ---- */

typedef struct attn_ctx {
    kvcache_t **seq;       /* (batch) */
    const uint32_t *pos;   /* (batch) */
    uint32_t Hq;
    uint32_t fail_at;      /* layer that returns an error, or UINT32_MAX */
    int checked_dev;       /* GPU callbacks whose device q, k, v were compared */
} attn_ctx_t;

static flx_status_t dense_attn(void *ctx, uint32_t layer, uint32_t batch, const float *q, const float *k,
                               const float *v, float *o)
{
    attn_ctx_t *a = ctx;
    if (layer == a->fail_at) return flx_error_set(FLX_ERR_STATE, "attention refused at layer %u", layer);
    for (uint32_t b = 0; b < batch; b++) {
        kvcache_t *kv = a->seq[b];
        const uint32_t D = kv->D, Hkv = kv->Hkv, pos = a->pos[b];
        CHECK(pos < kv->cap);
        ref_dense_step(kv->k, kv->v, kv->cap, Hkv, a->Hq, D, layer, pos, q + (size_t)b * a->Hq * D,
                       k + (size_t)b * Hkv * D, v + (size_t)b * Hkv * D, o + (size_t)b * a->Hq * D);
    }
    return FLX_OK;
}

static void check_dev_equals_host(const float *dev, const float *host, size_t n)
{
    float *back = malloc(n * sizeof *back);
    CHECK(back);
    CHECK_OK(flx_cuda_copy_dtoh(0, back, dev, n * sizeof *back));
    CHECK(memcmp(back, host, n * sizeof *back) == 0);
    free(back);
}

static flx_status_t gpu_attn(void *ctx, const flx_gpu_attn_args_t *g)
{
    attn_ctx_t *a = ctx;
    const uint32_t D = a->seq[0]->D, Hkv = a->seq[0]->Hkv;
    CHECK(g->stream == g_stream && g->device == 0);
    CHECK(flx_cuda_host_is_pinned(g->q) && flx_cuda_host_is_pinned(g->o));
    check_dev_equals_host(g->q_dev, g->q, (size_t)g->batch * a->Hq * D);
    check_dev_equals_host(g->k_dev, g->k, (size_t)g->batch * Hkv * D);
    check_dev_equals_host(g->v_dev, g->v, (size_t)g->batch * Hkv * D);
    a->checked_dev++;
    return dense_attn(ctx, g->layer, g->batch, g->q, g->k, g->v, g->o);
}

/* ---- checks ---- */

static double rms(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s / (double)n);
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
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

/* rows x V logits within atol_rms x RMS(ref) + rtol |ref|, and the same greedy tokens. */
static void check_logits(const char *label, const float *got, const float *ref, size_t rows, uint32_t V,
                         double atol_rms, double rtol)
{
    const double atol = atol_rms * rms(ref, rows * V);
    CHECK_CLOSE(label, got, ref, rows * V, atol, rtol);
    for (size_t r = 0; r < rows; r++) check_argmax(got + r * V, ref + r * V, V, atol, rtol);
}

/* ---- (a) prefill ---- */

static void test_prefill(fx_t *f, uint32_t n)
{
    const flx_model_config_t *c = &f->m->cfg;
    const uint32_t L = c->n_layers, V = c->vocab, D = c->head_dim;
    const size_t qd = (size_t)c->n_heads * D, kvn = (size_t)L * c->n_kv_heads * n * D;
    int32_t *tok = malloc(n * sizeof *tok);
    for (uint32_t i = 0; i < n; i++) tok[i] = (int32_t)flx_rng_below(&rng, V);
    float *buf[2][6];   /* per side: logits_all, logits_last, q_all, K, V, q' */
    kvcache_t kv[2];
    sink_t sk[2];
    for (int s = 0; s < 2; s++) {
        buf[s][0] = malloc((size_t)n * V * 4), buf[s][1] = malloc(V * 4), buf[s][2] = malloc((size_t)L * n * qd * 4);
        buf[s][3] = malloc(kvn * 4), buf[s][4] = malloc(kvn * 4), buf[s][5] = malloc((size_t)L * qd * 4);
        kv_init(&kv[s], c, n);
        sink_t x = {&kv[s], buf[s][3], buf[s][4], buf[s][5], c->n_heads, 0, UINT32_MAX};
        sk[s] = x;
    }
    flx_prefill_args_t pc = {tok, n, on_layer, &sk[0], buf[0][1], buf[0][0], buf[0][2]};
    flx_prefill_args_t pg = {tok, n, on_layer, &sk[1], buf[1][1], buf[1][0], buf[1][2]};
    CHECK_OK(flx_model_prefill(f->m, f->cws, &pc));
    CHECK_OK(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pg));
    CHECK(sk[0].calls == L && sk[1].calls == L);
    char label[160];
    /* against the double reference, with the GPU's roundings of near-midpoint K/V values */
    ref_out_t ref = {malloc((size_t)n * V * 4), malloc(kvn * 4), malloc(kvn * 4), malloc((size_t)L * n * qd * 4), 0};
    ref_forward(f->m, tok, n, buf[1][3], buf[1][4], &ref);
    snprintf(label, sizeof label, "%s GPU prefill n=%u logits_all vs reference (%d K/V ties)", c->name, n, ref.ties);
    check_logits(label, buf[1][0], ref.logits, n, V, REF_ATOL, REF_RTOL);
    snprintf(label, sizeof label, "%s GPU prefill sink K vs reference", c->name);
    CHECK_CLOSE(label, buf[1][3], ref.k, kvn, 1e-30, 0);
    snprintf(label, sizeof label, "%s GPU prefill sink V vs reference", c->name);
    CHECK_CLOSE(label, buf[1][4], ref.v, kvn, 1e-30, 0);
    snprintf(label, sizeof label, "%s GPU prefill q_all vs reference", c->name);
    CHECK_CLOSE(label, buf[1][2], ref.q, (size_t)L * n * qd, 1e-4, 1e-4);
    /* against the CPU forward */
    snprintf(label, sizeof label, "%s prefill n=%u logits_all vs CPU", c->name, n);
    check_logits(label, buf[1][0], buf[0][0], n, V, CPU_ATOL, TOL);
    CHECK(memcmp(buf[1][1], buf[1][0] + (size_t)(n - 1) * V, V * 4) == 0);
    /* layer 0's K, V come from the same inputs on both sides: within one bf16 step; later layers
     * inherit the other side's earlier near-midpoint roundings, so only a loose bound there */
    const size_t kv0 = kvn / L;
    const double krms = rms(buf[0][3], kvn), vrms = rms(buf[0][4], kvn);
    snprintf(label, sizeof label, "%s prefill sink K layer 0 vs CPU", c->name);
    CHECK_CLOSE(label, buf[1][3], buf[0][3], kv0, 1e-5 * krms, 1.0 / 128);
    snprintf(label, sizeof label, "%s prefill sink V layer 0 vs CPU", c->name);
    CHECK_CLOSE(label, buf[1][4], buf[0][4], kv0, 1e-5 * vrms, 1.0 / 128);
    snprintf(label, sizeof label, "%s prefill sink K vs CPU", c->name);
    CHECK_CLOSE(label, buf[1][3], buf[0][3], kvn, 1e-2 * krms, 1.0 / 128);
    snprintf(label, sizeof label, "%s prefill sink V vs CPU", c->name);
    CHECK_CLOSE(label, buf[1][4], buf[0][4], kvn, 1e-2 * vrms, 1.0 / 128);
    snprintf(label, sizeof label, "%s prefill sink q'", c->name);
    CHECK_CLOSE(label, buf[1][5], buf[0][5], (size_t)L * qd, CPU_ATOL * rms(buf[0][5], (size_t)L * qd), TOL);
    snprintf(label, sizeof label, "%s prefill q_all", c->name);
    CHECK_CLOSE(label, buf[1][2], buf[0][2], (size_t)L * n * qd, CPU_ATOL * rms(buf[0][2], (size_t)L * n * qd), TOL);
    for (uint32_t l = 0; l < L; l++)   /* q' is the last row of the layer's q_all */
        CHECK(memcmp(buf[1][5] + (size_t)l * qd, buf[1][2] + ((size_t)l * n + n - 1) * qd, qd * 4) == 0);
    /* logits_last alone: the one-row head pass, no sink */
    float *last = malloc(V * 4);
    flx_prefill_args_t pl = {tok, n, NULL, NULL, last, NULL, NULL};
    CHECK_OK(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pl));
    snprintf(label, sizeof label, "%s GPU prefill logits_last only vs reference", c->name);
    check_logits(label, last, ref.logits + (size_t)(n - 1) * V, 1, V, REF_ATOL, REF_RTOL);
    free(last);
    free(ref.logits), free(ref.k), free(ref.v), free(ref.q);
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 6; i++) free(buf[s][i]);
        kv_free(&kv[s]);
    }
    free(tok);
}

/* ---- (b) + (c) decode ---- */

static void test_decode(fx_t *f, uint32_t batch, const uint32_t *lens, uint32_t steps)
{
    const flx_model_config_t *c = &f->m->cfg;
    const uint32_t V = c->vocab, cap = 64;
    kvcache_t kc[3], kg[3];
    int32_t tok[3][64];
    uint32_t pos[3];
    for (uint32_t s = 0; s < batch; s++) {
        CHECK(lens[s] + steps <= cap);
        for (uint32_t i = 0; i < cap; i++) tok[s][i] = (int32_t)flx_rng_below(&rng, V);
        kv_init(&kc[s], c, cap);
        kv_init(&kg[s], c, cap);
        sink_t sc = {&kc[s], NULL, NULL, NULL, c->n_heads, 0, UINT32_MAX};
        sink_t sg = {&kg[s], NULL, NULL, NULL, c->n_heads, 0, UINT32_MAX};
        flx_prefill_args_t pc = {tok[s], lens[s], on_layer, &sc, NULL, NULL, NULL};
        flx_prefill_args_t pg = {tok[s], lens[s], on_layer, &sg, NULL, NULL, NULL};
        CHECK_OK(flx_model_prefill(f->m, f->cws, &pc));
        CHECK_OK(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pg));
    }
    float *lc = malloc((size_t)batch * V * 4), *lg = malloc((size_t)batch * V * 4);
    float *lg_all = malloc((size_t)steps * batch * V * 4);   /* (steps, batch, V) GPU logits */
    for (uint32_t st = 0; st < steps; st++) {
        int32_t tb[3];
        kvcache_t *sc[3], *sg[3];
        for (uint32_t s = 0; s < batch; s++) pos[s] = lens[s] + st, tb[s] = tok[s][pos[s]], sc[s] = &kc[s], sg[s] = &kg[s];
        attn_ctx_t ac = {sc, pos, c->n_heads, UINT32_MAX, 0}, ag = {sg, pos, c->n_heads, UINT32_MAX, 0};
        flx_decode_args_t dc = {batch, tb, pos, dense_attn, &ac, lc};
        flx_gpu_decode_args_t dg = {batch, tb, pos, gpu_attn, &ag, lg};
        CHECK_OK(flx_model_decode(f->m, f->cws, &dc));
        CHECK_OK(flx_gpu_model_decode(f->gm, f->gws, g_stream, &dg));
        CHECK(ag.checked_dev == (int)c->n_layers);
        flx_fwd_timing_t tm;
        flx_gpu_fwd_timing_get(f->gws, &tm);
        CHECK(tm.dense_bytes == flx_model_weight_bytes_bf16(f->m) && tm.dense_ns > 0 && tm.attn_ns > 0);
        char label[160];
        snprintf(label, sizeof label, "%s decode batch %u step %u vs CPU", c->name, batch, st);
        check_logits(label, lg, lc, batch, V, CPU_ATOL, TOL);
        memcpy(lg_all + (size_t)st * batch * V, lg, (size_t)batch * V * 4);
    }
    /* each sequence against the reference over prompt + fed tokens, with the K/V the GPU side
     * produced (its prefill and its decode steps, as its cache holds them) */
    const uint32_t L = c->n_layers, Hkv = c->n_kv_heads, D = c->head_dim;
    for (uint32_t s = 0; s < batch; s++) {
        const uint32_t N = lens[s] + steps;
        const size_t kvn = (size_t)L * Hkv * N * D;
        float *mk = malloc(kvn * 4), *mv = malloc(kvn * 4);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < Hkv; h++)
                for (uint32_t t = 0; t < N; t++)
                    for (uint32_t d = 0; d < D; d++) {
                        const size_t src = (((size_t)l * Hkv + h) * cap + t) * D + d;
                        const size_t dst = (((size_t)l * Hkv + h) * N + t) * D + d;
                        mk[dst] = flx_bf16_to_f32(kg[s].k[src]);
                        mv[dst] = flx_bf16_to_f32(kg[s].v[src]);
                    }
        ref_out_t ref = {malloc((size_t)N * V * 4), malloc(kvn * 4), malloc(kvn * 4),
                         malloc((size_t)L * N * c->n_heads * D * 4), 0};
        ref_forward(f->m, tok[s], N, mk, mv, &ref);
        CHECK_CLOSE("GPU decode cache K vs reference", mk, ref.k, kvn, 1e-30, 0);
        CHECK_CLOSE("GPU decode cache V vs reference", mv, ref.v, kvn, 1e-30, 0);
        for (uint32_t st = 0; st < steps; st++) {
            char label[160];
            snprintf(label, sizeof label, "%s GPU decode batch %u seq %u pos %u vs reference", c->name, batch, s,
                     lens[s] + st);
            check_logits(label, lg_all + ((size_t)st * batch + s) * V, ref.logits + (size_t)(lens[s] + st) * V, 1, V,
                         REF_DEC_ATOL, REF_RTOL);
        }
        free(ref.logits), free(ref.k), free(ref.v), free(ref.q), free(mk), free(mv);
    }
    for (uint32_t s = 0; s < batch; s++) kv_free(&kc[s]), kv_free(&kg[s]);
    free(lc), free(lg), free(lg_all);
}

/* ---- (d) refusals and errors ---- */

static void check_msg(const char *want)
{
    if (!strstr(flx_error_msg(), want)) {
        fprintf(stderr, "message '%s' does not name '%s'\n", flx_error_msg(), want);
        CHECK(0);
    }
}

static void test_errors(fx_t *f, fx_t *other)
{
    const flx_model_config_t *c = &f->m->cfg;
    const uint32_t V = c->vocab;
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = i % (int)V;
    float *lg = malloc((size_t)4 * V * 4);
    kvcache_t kv[3];
    for (int s = 0; s < 3; s++) kv_init(&kv[s], c, 64);
    kvcache_t *seq[3] = {&kv[0], &kv[1], &kv[2]};
    uint32_t pos[3] = {0, 0, 0};
    attn_ctx_t ac = {seq, pos, c->n_heads, UINT32_MAX, 0};
    flx_gpu_decode_args_t da = {4, tok, pos, gpu_attn, &ac, lg};
    CHECK_ST(flx_gpu_model_decode(f->gm, f->gws, g_stream, &da), FLX_ERR_INVALID);
    check_msg("batch 4");
    da.batch = 2;
    tok[1] = (int32_t)V;
    CHECK_ST(flx_gpu_model_decode(f->gm, f->gws, g_stream, &da), FLX_ERR_INVALID);
    check_msg("of sequence 1");
    tok[1] = 1;
    da.attn = NULL;
    CHECK_ST(flx_gpu_model_decode(f->gm, f->gws, g_stream, &da), FLX_ERR_INVALID);
    da.attn = gpu_attn;
    CHECK_ST(flx_gpu_model_decode(other->gm, f->gws, g_stream, &da), FLX_ERR_INVALID);
    check_msg("another model");
    ac.fail_at = 1;   /* the callback's error comes back as is */
    CHECK_ST(flx_gpu_model_decode(f->gm, f->gws, g_stream, &da), FLX_ERR_STATE);
    check_msg("attention refused at layer 1");
    ac.fail_at = UINT32_MAX;
    CHECK_OK(flx_gpu_model_decode(f->gm, f->gws, g_stream, &da));   /* usable afterwards */

    flx_prefill_args_t pa = {tok, 33, NULL, NULL, lg, NULL, NULL};
    CHECK_ST(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pa), FLX_ERR_INVALID);
    check_msg("n_tokens 33");
    pa.n_tokens = 0;
    CHECK_ST(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pa), FLX_ERR_INVALID);
    pa.n_tokens = 20;
    tok[7] = -3;
    CHECK_ST(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pa), FLX_ERR_INVALID);
    check_msg("token id -3 at position 7");
    tok[7] = 7;
    sink_t sk = {NULL, NULL, NULL, NULL, c->n_heads, 0, 1};
    pa.on_layer = on_layer, pa.ctx = &sk;
    CHECK_ST(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pa), FLX_ERR_CAPACITY);
    check_msg("sink full at layer 1");
    pa.on_layer = NULL;
    CHECK_OK(flx_gpu_model_prefill(f->gm, f->gws, g_stream, &pa));

    /* a decode-only workspace refuses prefills */
    flx_gpu_fwd_shape_t gs = {.max_prompt = 0, .max_batch = 1};
    size_t db, hb;
    CHECK_OK(flx_gpu_fwd_plan(f->m, &gs, &db, &hb));
    void *dm, *hm;
    CHECK_OK(flx_cuda_malloc(0, db, &dm));
    CHECK_OK(flx_cuda_host_alloc(hb, &hm));
    flx_gpu_fwd_ws_h ws;
    CHECK_OK(flx_gpu_fwd_ws_create(f->gm, &gs, dm, db, hm, hb, &ws));
    CHECK_ST(flx_gpu_model_prefill(f->gm, ws, g_stream, &pa), FLX_ERR_INVALID);
    check_msg("decode only");
    flx_gpu_fwd_ws_destroy(ws);
    CHECK_OK(flx_cuda_free(0, dm));
    flx_cuda_host_free(hm);
    for (int s = 0; s < 3; s++) kv_free(&kv[s]);
    free(lg);
}

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_forward_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_forward_gpu"));
    CHECK_OK(flx_cuda_stream_create(0, &g_stream));

    flx_model_config_t cfgs[] = {
        ref_cfg_make(FLX_ARCH_LLAMA, 128, 4, 1, 64, 256, 301, 1),     /* G4 D64 tied */
        ref_cfg_make(FLX_ARCH_QWEN2, 128, 8, 1, 128, 192, 257, 0),    /* G8 D128 bias untied */
        ref_cfg_make(FLX_ARCH_LLAMA, 64, 2, 2, 128, 96, 199, 0),      /* G1 D128 llama3 untied */
        ref_cfg_make(FLX_ARCH_QWEN2, 256, 8, 2, 64, 512, 520, 1),     /* G4 D64 bias tied, 2 kv heads */
        ref_cfg_make(FLX_ARCH_LLAMA, 256, 16, 2, 64, 320, 333, 0),    /* G8 D64 untied */
    };
    cfgs[2].rope_scaling = FLX_ROPE_LLAMA3;
    cfgs[2].rope_theta = 5e5f;
    cfgs[2].rope_factor = 8, cfgs[2].rope_low_freq_factor = 1, cfgs[2].rope_high_freq_factor = 4;
    cfgs[2].rope_orig_ctx = 64;
    const uint32_t lens1[1] = {23}, lens3[3] = {5, 29, 12};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cfgs); i++) {
        fx_t f;
        fx_open(&f, &cfgs[i], 80, 3, 16);   /* chunks of 16 tokens: 70 = 4 x 16 + 6 */
        test_prefill(&f, 70);
        test_prefill(&f, 1);
        test_decode(&f, 1, lens1, 4);
        test_decode(&f, 3, lens3, 3);
        fx_close(&f);
    }
    /* the default chunk (256) with a prompt longer than one chunk and one LM-head pass */
    {
        fx_t f;
        flx_model_config_t c = ref_cfg_make(FLX_ARCH_LLAMA, 64, 4, 2, 64, 128, 97, 0);
        fx_open(&f, &c, 300, 1, 0);
        test_prefill(&f, 300);
        fx_close(&f);
    }
    {
        fx_t f, g;
        fx_open(&f, &cfgs[0], 32, 3, 8);
        fx_open(&g, &cfgs[3], 8, 1, 0);
        test_errors(&f, &g);
        fx_close(&f);
        fx_close(&g);
    }
    flx_cuda_stream_destroy(0, g_stream);
    fprintf(stderr, "test_forward_gpu: ok\n");
    return 0;
}
