/*
 * attn_testutil.h - hand-built KV views for the attention tests, and brute-force oracles that read
 * the raw fp32 copies of K and V (never the view), so they check the references independently.
 *
 * The view uses a random permutation as block table, and fills every row past l_cpu (last block)
 * and past n_win (window) with NaN: a kernel that reads past n produces NaN and fails the test.
 */
#ifndef ATTN_TESTUTIL_H
#define ATTN_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/util.h"
#include "flx_test.h"

typedef struct tkv {
    uint32_t D, l_cpu, n_win;
    uint8_t *pool;            /* (n_phys, 64 D) bytes */
    uint32_t *table;          /* (n_blocks) */
    flx_bf16_t *meta[FLX_KV_META_LEVELS];
    flx_bf16_t *win_k, *win_v;/* (n_win + 3, D) */
    float *k, *v;             /* (l_cpu, D) bf16-exact fp32 copies */
    float *wk, *wv;           /* (n_win, D) */
    flx_kv_head_view_t view;
} tkv_t;

static inline float tkv_rnd_bf16(flx_rng_t *r, float mu, float sd)
{
    return flx_bf16_to_f32(flx_f32_to_bf16(mu + sd * (float)flx_rng_normal(r)));
}

static inline void tkv_make(tkv_t *t, flx_rng_t *r, uint32_t D, uint32_t l_cpu, uint32_t n_win)
{
    memset(t, 0, sizeof *t);
    t->D = D;
    t->l_cpu = l_cpu;
    t->n_win = n_win;
    uint32_t nb = (l_cpu + 15) / 16, nphys = nb + 3;
    size_t bb = (size_t)64 * D;
    t->pool = malloc(nphys * bb);
    t->table = malloc((nb + 1) * sizeof *t->table);
    t->k = malloc(((size_t)l_cpu * D + 1) * sizeof(float));
    t->v = malloc(((size_t)l_cpu * D + 1) * sizeof(float));
    CHECK(t->pool && t->table && t->k && t->v);
    flx_bf16_t *pool16 = (flx_bf16_t *)t->pool;
    for (size_t i = 0; i < nphys * bb / 2; i++) pool16[i] = 0x7fc0;   /* NaN everywhere unused */
    uint32_t *perm = malloc((nphys + 1) * sizeof *perm);
    for (uint32_t i = 0; i < nphys; i++) perm[i] = i;
    for (uint32_t i = nphys; i > 1; i--) {
        uint32_t j = (uint32_t)flx_rng_below(r, i), x = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = x;
    }
    for (uint32_t b = 0; b < nb; b++) t->table[b] = perm[b];
    free(perm);
    /* Block-structured K: a per-128-token offset so some blocks clearly score higher. */
    for (uint32_t i = 0; i < l_cpu; i++) {
        float off = (float)((i / 128) % 5) * 0.3f;
        flx_bf16_t *kb = (flx_bf16_t *)(t->pool + (size_t)t->table[i / 16] * bb);
        flx_bf16_t *vb = kb + 16 * D;
        for (uint32_t d = 0; d < D; d++) {
            float kv = tkv_rnd_bf16(r, d % 3 == 0 ? off : 0.0f, 1.0f), vv = tkv_rnd_bf16(r, 0.0f, 1.0f);
            t->k[(size_t)i * D + d] = kv;
            t->v[(size_t)i * D + d] = vv;
            kb[(size_t)(i % 16) * D + d] = flx_f32_to_bf16(kv);
            vb[(size_t)(i % 16) * D + d] = flx_f32_to_bf16(vv);
        }
    }
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        uint32_t blk = 16u << j, n = flx_kv_meta_count(l_cpu, j);
        t->meta[j] = malloc(((size_t)n * 2 * D + 1) * sizeof(flx_bf16_t));
        for (uint32_t b = 0; b < n; b++)
            for (uint32_t d = 0; d < D; d++) {
                float mn = INFINITY, mx = -INFINITY;
                for (uint32_t i = b * blk; i < (b + 1) * blk && i < l_cpu; i++) {
                    float x = t->k[(size_t)i * D + d];
                    mn = x < mn ? x : mn;
                    mx = x > mx ? x : mx;
                }
                t->meta[j][(size_t)b * 2 * D + d] = flx_f32_to_bf16(mn);
                t->meta[j][(size_t)b * 2 * D + D + d] = flx_f32_to_bf16(mx);
            }
        t->view.meta[j] = t->meta[j];
        t->view.meta_n[j] = n;
    }
    uint32_t cap = n_win + 3;
    t->win_k = malloc((size_t)cap * D * sizeof(flx_bf16_t));
    t->win_v = malloc((size_t)cap * D * sizeof(flx_bf16_t));
    t->wk = malloc(((size_t)n_win * D + 1) * sizeof(float));
    t->wv = malloc(((size_t)n_win * D + 1) * sizeof(float));
    for (size_t i = 0; i < (size_t)cap * D; i++) t->win_k[i] = t->win_v[i] = 0x7fc0;
    for (size_t i = 0; i < (size_t)n_win * D; i++) {
        t->wk[i] = tkv_rnd_bf16(r, 0.2f, 1.0f);
        t->wv[i] = tkv_rnd_bf16(r, 0.0f, 1.0f);
        t->win_k[i] = flx_f32_to_bf16(t->wk[i]);
        t->win_v[i] = flx_f32_to_bf16(t->wv[i]);
    }
    t->view.head_dim = D;
    t->view.l_cpu = l_cpu;
    t->view.n_blocks = nb;
    t->view.block_table = t->table;
    t->view.pool_base = t->pool;
    t->view.block_bytes = bb;
    t->view.win_k = t->win_k;
    t->view.win_v = t->win_v;
    t->view.n_win = n_win;
    t->view.win_cap = cap;
    t->view.numa_node = 0;
    t->view.win_k_dev = t->view.win_v_dev = NULL;   /* host-only window */
    t->view.win_device = -1;
}

static inline void tkv_free(tkv_t *t)
{
    free(t->pool);
    free(t->table);
    free(t->k);
    free(t->v);
    free(t->wk);
    free(t->wv);
    free(t->win_k);
    free(t->win_v);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) free(t->meta[j]);
}

/* Dense softmax of one head over an explicit token list: host tokens tok[0..n) (index < l_cpu) and,
 * if with_window, all window rows. Double precision; lse = -inf and o = 0 when empty. */
static inline void oracle_attend(const tkv_t *t, const float *q, const uint32_t *tok, size_t n, int with_window,
                                 float *o, float *lse)
{
    uint32_t D = t->D;
    size_t nw = with_window ? t->n_win : 0, tot = n + nw;
    if (tot == 0) {
        for (uint32_t d = 0; d < D; d++) o[d] = 0;
        *lse = -INFINITY;
        return;
    }
    double *s = malloc(tot * sizeof *s), m = -INFINITY, l = 0;
    for (size_t i = 0; i < tot; i++) {
        const float *kr = i < n ? t->k + (size_t)tok[i] * D : t->wk + (i - n) * D;
        double dot = 0;
        for (uint32_t d = 0; d < D; d++) dot += (double)q[d] * kr[d];
        s[i] = dot / sqrt((double)D);
        m = s[i] > m ? s[i] : m;
    }
    for (uint32_t d = 0; d < D; d++) o[d] = 0;
    double *acc = calloc(D, sizeof *acc);
    for (size_t i = 0; i < tot; i++) {
        const float *vr = i < n ? t->v + (size_t)tok[i] * D : t->wv + (i - n) * D;
        double p = exp(s[i] - m);
        l += p;
        for (uint32_t d = 0; d < D; d++) acc[d] += p * vr[d];
    }
    for (uint32_t d = 0; d < D; d++) o[d] = (float)(acc[d] / l);
    *lse = (float)(m + log(l));
    free(s);
    free(acc);
}

/* Tokens of logical blocks sel[0..k) at blk; returns the count written to tok (room l_cpu). */
static inline size_t blocks_to_tokens(const tkv_t *t, uint32_t blk, const uint32_t *sel, uint32_t k, uint32_t *tok)
{
    size_t n = 0;
    for (uint32_t i = 0; i < k; i++)
        for (uint32_t x = sel[i] * blk; x < (sel[i] + 1) * blk && x < t->l_cpu; x++) tok[n++] = x;
    return n;
}

/* Compares lse arrays that may hold -inf: both -inf, or both finite and close. */
static inline int lse_close(const char *label, const float *x, const float *ref, uint32_t n, double atol, double rtol)
{
    float xa[FLX_ATTN_MAX_GROUP], ra[FLX_ATTN_MAX_GROUP];
    for (uint32_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && ref[i] < 0) {
            if (!(isinf(x[i]) && x[i] < 0)) {
                fprintf(stderr, "%s: element %u got %g, ref -inf\n", label, i, (double)x[i]);
                return 0;
            }
            xa[i] = ra[i] = 0;
        } else {
            xa[i] = x[i];
            ra[i] = ref[i];
        }
    }
    return flx_test_allclose(label, xa, ra, n, atol, rtol);
}

#endif
