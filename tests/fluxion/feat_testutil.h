/* feat_testutil.h - raw-array KV for the features and budget tests: (Hkv, T, D) bf16 K and V with
 * structure (a few "retrieval" tokens aligned with the queries, so attention is peaky and budgets
 * spread), queries, and views laid out by flx_attn_layout_build. */
#ifndef FEAT_TESTUTIL_H
#define FEAT_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn_layout.h"
#include "flx/util.h"
#include "flx_test.h"

typedef struct fkv {
    uint32_t Hq, Hkv, D, L, T;   /* T = L + n_new tokens per kv head */
    flx_bf16_t *k, *v;           /* (Hkv, T, D) */
    float *qa, *q;               /* (Hq, D): anchor and current query */
} fkv_t;

static inline void fkv_make(fkv_t *f, flx_rng_t *r, uint32_t Hq, uint32_t Hkv, uint32_t D, uint32_t L,
                            uint32_t n_new, float peak)
{
    f->Hq = Hq, f->Hkv = Hkv, f->D = D, f->L = L, f->T = L + n_new;
    f->k = malloc((size_t)Hkv * f->T * D * sizeof(flx_bf16_t));
    f->v = malloc((size_t)Hkv * f->T * D * sizeof(flx_bf16_t));
    f->qa = malloc((size_t)Hq * D * sizeof(float));
    f->q = malloc((size_t)Hq * D * sizeof(float));
    CHECK(f->k && f->v && f->qa && f->q);
    for (uint32_t h = 0; h < Hq; h++)
        for (uint32_t d = 0; d < D; d++) {
            f->qa[(size_t)h * D + d] = (float)flx_rng_normal(r);
            f->q[(size_t)h * D + d] = 0.6f * f->qa[(size_t)h * D + d] + 0.8f * (float)flx_rng_normal(r);
        }
    uint32_t G = Hq / Hkv;
    for (uint32_t g = 0; g < Hkv; g++)
        for (uint32_t i = 0; i < f->T; i++) {
            /* every 7th-ish token leans towards one of the group's anchor queries */
            int hot = flx_rng_below(r, 9) == 0;
            const float *qa = f->qa + (size_t)(g * G + flx_rng_below(r, G)) * D;
            float sc = (float)(0.5 + flx_rng_uniform(r));
            for (uint32_t d = 0; d < D; d++) {
                float kk = sc * (float)flx_rng_normal(r) + (hot ? peak * qa[d] / sqrtf((float)D) : 0.0f);
                f->k[((size_t)g * f->T + i) * D + d] = flx_f32_to_bf16(kk);
                f->v[((size_t)g * f->T + i) * D + d] = flx_f32_to_bf16((float)flx_rng_normal(r) + 0.3f);
            }
        }
}

static inline void fkv_free(fkv_t *f)
{
    free(f->k);
    free(f->v);
    free(f->qa);
    free(f->q);
}

typedef struct fkv_row {
    const fkv_t *f;
    uint32_t g;
} fkv_row_t;

static inline void fkv_row(void *ctx, uint32_t i, flx_bf16_t *k, flx_bf16_t *v)
{
    const fkv_row_t *c = ctx;
    size_t off = ((size_t)c->g * c->f->T + i) * c->f->D;
    memcpy(k, c->f->k + off, c->f->D * sizeof *k);
    memcpy(v, c->f->v + off, c->f->D * sizeof *v);
}

#endif
