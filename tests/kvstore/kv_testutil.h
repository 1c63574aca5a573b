/*
 * kv_testutil.h - helpers shared by the kvstore tests: a store of a given shape, random prompt KV,
 * pushing it in chunks of random shapes and order, and checking where every row landed.
 */
#ifndef KV_TESTUTIL_H
#define KV_TESTUTIL_H

#include <math.h>
#include <string.h>

#include "flx/kvstore.h"
#include "flx_test.h"

typedef struct kv_prompt {
    uint32_t n_layers, n_kv, D, L;
    flx_bf16_t *k, *v; /* (n_layers, n_kv, L, D) */
} kv_prompt_t;

/* flags: FLX_KV_STORE_* (for example WINDOW_DEVICE); kv_make_store keeps the store's defaults. */
static inline flx_kv_store_h kv_make_store_flags(uint32_t layers, uint32_t n_kv, uint32_t n_q, uint32_t D,
                                                 uint32_t sink, uint32_t local, size_t capacity, uint32_t flags)
{
    flx_kv_store_params_t p = {0};
    p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_WINDOW |
                   FLX_KV_STORE_FIELD_FLAGS;
    p.capacity_bytes = capacity;
    p.n_layers = layers;
    p.n_kv_heads = n_kv;
    p.n_q_heads = n_q;
    p.head_dim = D;
    p.sink = sink;
    p.local = local;
    p.flags = flags;
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

static inline flx_kv_store_h kv_make_store(uint32_t layers, uint32_t n_kv, uint32_t n_q, uint32_t D, uint32_t sink,
                                           uint32_t local, size_t capacity)
{
    flx_kv_store_params_t p = {0};
    p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_WINDOW;
    p.capacity_bytes = capacity;
    p.n_layers = layers;
    p.n_kv_heads = n_kv;
    p.n_q_heads = n_q;
    p.head_dim = D;
    p.sink = sink;
    p.local = local;
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

static inline void kv_prompt_random(kv_prompt_t *pr, uint32_t layers, uint32_t n_kv, uint32_t D, uint32_t L,
                                    flx_rng_t *rng)
{
    pr->n_layers = layers;
    pr->n_kv = n_kv;
    pr->D = D;
    pr->L = L;
    size_t n = (size_t)layers * n_kv * L * D;
    pr->k = malloc(n * sizeof *pr->k);
    pr->v = malloc(n * sizeof *pr->v);
    CHECK(pr->k && pr->v);
    for (size_t i = 0; i < n; i++) {
        pr->k[i] = flx_f32_to_bf16((float)flx_rng_normal(rng));
        pr->v[i] = flx_f32_to_bf16((float)flx_rng_normal(rng));
    }
}

static inline void kv_prompt_free(kv_prompt_t *pr)
{
    free(pr->k);
    free(pr->v);
}

static inline const flx_bf16_t *kv_row(const kv_prompt_t *pr, const flx_bf16_t *base, uint32_t l, uint32_t h,
                                       uint32_t t)
{
    return base + (((size_t)l * pr->n_kv + h) * pr->L + t) * pr->D;
}

/* Payload of a chunk: (heads, tokens, D) for K and V. */
static inline flx_status_t kv_push_chunk(flx_kv_store_h s, flx_kv_session_id_t sid, const kv_prompt_t *pr,
                                         uint32_t layer, uint32_t h0, uint32_t h1, uint32_t t0, uint32_t t1)
{
    size_t nt = t1 - t0, n = (size_t)(h1 - h0) * nt * pr->D;
    flx_bf16_t *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    CHECK(k && v);
    for (uint32_t h = h0; h < h1; h++) {
        memcpy(k + (size_t)(h - h0) * nt * pr->D, kv_row(pr, pr->k, layer, h, t0), nt * pr->D * sizeof *k);
        memcpy(v + (size_t)(h - h0) * nt * pr->D, kv_row(pr, pr->v, layer, h, t0), nt * pr->D * sizeof *v);
    }
    flx_kv_chunk_t c = {layer, h0, h1, t0, t1, FLX_DT_BF16, pr->D, FLX_KV_ORDER_SPLIT};
    flx_status_t st = flx_kv_chunk_write(s, sid, &c, k, v);
    free(k);
    free(v);
    return st;
}

/* The payload of a chunk in GRANULE order (flx/kvstore.h): per head, per 16-token granule, K rows
 * then V rows. Caller frees. */
static inline flx_bf16_t *kv_granule_payload(const kv_prompt_t *pr, uint32_t layer, uint32_t h0, uint32_t h1,
                                             uint32_t t0, uint32_t t1)
{
    flx_bf16_t *buf = malloc(2 * (size_t)(h1 - h0) * (t1 - t0) * pr->D * sizeof *buf), *p = buf;
    CHECK(buf);
    for (uint32_t h = h0; h < h1; h++)
        for (uint32_t g = t0; g < t1; g += 16) {
            uint32_t n = (t1 - g < 16 ? t1 - g : 16);
            memcpy(p, kv_row(pr, pr->k, layer, h, g), (size_t)n * pr->D * sizeof *p);
            p += (size_t)n * pr->D;
            memcpy(p, kv_row(pr, pr->v, layer, h, g), (size_t)n * pr->D * sizeof *p);
            p += (size_t)n * pr->D;
        }
    return buf;
}

static inline flx_status_t kv_push_chunk_granule(flx_kv_store_h s, flx_kv_session_id_t sid, const kv_prompt_t *pr,
                                                 uint32_t layer, uint32_t h0, uint32_t h1, uint32_t t0, uint32_t t1)
{
    flx_bf16_t *buf = kv_granule_payload(pr, layer, h0, h1, t0, t1);
    flx_kv_chunk_t c = {.layer = layer, .head_begin = h0, .head_end = h1, .tok_begin = t0, .tok_end = t1,
                        .dtype = FLX_DT_BF16, .head_dim = pr->D, .order = FLX_KV_ORDER_GRANULE};
    flx_status_t st = flx_kv_chunk_write(s, sid, &c, buf, NULL);
    free(buf);
    return st;
}

/* Pushes the whole prompt as chunks of random token spans (multiples of 16) and head ranges, in a
 * random order, each in SPLIT or GRANULE payload order at random. */
static inline void kv_push_random(flx_kv_store_h s, flx_kv_session_id_t sid, const kv_prompt_t *pr, flx_rng_t *rng)
{
    typedef struct { uint32_t l, h0, h1, t0, t1; } ch_t;
    size_t cap = (size_t)pr->n_layers * pr->n_kv * (pr->L / 16 + 1), n = 0;
    ch_t *cs = malloc(cap * sizeof *cs);
    for (uint32_t l = 0; l < pr->n_layers; l++)
        for (uint32_t h0 = 0; h0 < pr->n_kv;) {
            uint32_t h1 = h0 + 1 + (uint32_t)flx_rng_below(rng, pr->n_kv - h0);
            for (uint32_t t0 = 0; t0 < pr->L;) {
                uint32_t t1 = t0 + 16 * (1 + (uint32_t)flx_rng_below(rng, 24));
                if (t1 > pr->L) t1 = pr->L;
                cs[n++] = (ch_t){l, h0, h1, t0, t1};
                t0 = t1;
            }
            h0 = h1;
        }
    for (size_t i = n; i > 1; i--) {
        size_t j = flx_rng_below(rng, i);
        ch_t t = cs[i - 1];
        cs[i - 1] = cs[j];
        cs[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        CHECK_OK((flx_rng_below(rng, 2) ? kv_push_chunk_granule : kv_push_chunk)(s, sid, pr, cs[i].l, cs[i].h0,
                                                                                cs[i].h1, cs[i].t0, cs[i].t1));
    free(cs);
}

/* Every prompt row is where the layout says, bit for bit; rows past l_cpu of the last block are 0. */
static inline void kv_check_placement(flx_kv_session_h sess, const flx_kv_session_info_t *info, const kv_prompt_t *pr)
{
    const size_t row = pr->D * sizeof(flx_bf16_t);
    for (uint32_t l = 0; l < pr->n_layers; l++)
        for (uint32_t h = 0; h < pr->n_kv; h++) {
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(sess, l, h, &v));
            CHECK(v.l_cpu == info->l_cpu && v.n_blocks == (info->l_cpu + 15) / 16);
            for (uint32_t p = 0; p < pr->L; p++) {
                const flx_bf16_t *k, *vv;
                if (p < info->n_sink) {
                    k = v.win_k + (size_t)p * pr->D;
                    vv = v.win_v + (size_t)p * pr->D;
                } else if (p >= info->n_sink + info->l_cpu) {
                    uint32_t w = info->n_sink + (p - info->n_sink - info->l_cpu);
                    k = v.win_k + (size_t)w * pr->D;
                    vv = v.win_v + (size_t)w * pr->D;
                } else {
                    uint32_t i = p - info->n_sink;
                    k = flx_kv_block_k(&v, i / 16) + (size_t)(i % 16) * pr->D;
                    vv = flx_kv_block_v(&v, i / 16) + (size_t)(i % 16) * pr->D;
                }
                CHECK(memcmp(k, kv_row(pr, pr->k, l, h, p), row) == 0);
                CHECK(memcmp(vv, kv_row(pr, pr->v, l, h, p), row) == 0);
            }
            for (uint32_t r = info->l_cpu % 16; r && r < 16; r++)
                for (uint32_t d = 0; d < pr->D; d++) {
                    CHECK(flx_kv_block_k(&v, v.n_blocks - 1)[(size_t)r * pr->D + d] == 0);
                    CHECK(flx_kv_block_v(&v, v.n_blocks - 1)[(size_t)r * pr->D + d] == 0);
                }
        }
}

/* Valid prefill statistics of H query heads (head_dim D) that pass flx_kv_stats_write's checks:
 * stats (H), mean_k and q_anchor (H, D) random. */
static inline void kv_fill_stats(flx_head_stats_t *st, float *mk, float *qa, uint32_t H, uint32_t D, flx_rng_t *rng)
{
    for (uint32_t h = 0; h < H; h++) {
        flx_head_stats_t *x = &st[h];
        memset(x, 0, sizeof *x);
        x->version = FLX_HEAD_STATS_VERSION;
        x->k_sink_norm = 3, x->v_sink_norm = 0.5f, x->k_cpu_mean_norm = 1, x->v_cpu_mean_norm = 1;
        x->k_cpu_norm_mom[0] = 8, x->k_cpu_norm_mom[1] = 1, x->k_cpu_norm_mom[3] = 3;
        x->v_cpu_norm_mom[0] = 8, x->v_cpu_norm_mom[1] = 1, x->v_cpu_norm_mom[3] = 3;
        x->z_anchor_mom[1] = 1, x->z_anchor_mom[3] = 3;
        x->lse_anchor[0] = 2, x->lse_anchor[1] = 6, x->lse_anchor[2] = 4;
        x->onorm_anchor[0] = 1, x->onorm_anchor[1] = 1, x->onorm_anchor[2] = 1;
        x->bgt_star[0] = 0.01f, x->bgt_star[1] = 0.02f, x->bgt_star[2] = 0.04f, x->bgt_star[3] = 0.08f;
        x->max_onorm_gpu_anchor = 2;
        double n2 = 0;
        for (uint32_t d = 0; d < D; d++) {
            qa[h * D + d] = (float)flx_rng_normal(rng);
            mk[h * D + d] = (float)flx_rng_normal(rng);
            n2 += (double)qa[h * D + d] * qa[h * D + d];
        }
        x->q_anchor_norm = (float)sqrt(n2);
    }
}

#endif
