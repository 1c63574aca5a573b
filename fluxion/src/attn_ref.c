/*
 * attn_ref.c - scalar references of the attention kernels: the test oracles.
 *
 * DESIGN
 * Obviously right over fast: each head is done on its own, token by token, with two-pass softmax
 * in double precision; memory is allocated freely. The fast kernels in attn_cpu.c are held to
 * these by the tests, and these are held to a dense brute-force softmax over the raw K/V arrays.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "flx/util.h"

/* Attention of one head over tokens given as (k row, v row) pointer pairs. */
static void attend_rows(const float *q, uint32_t D, size_t n, const flx_bf16_t *const *krow,
                        const flx_bf16_t *const *vrow, float *o, float *lse)
{
    if (n == 0) {
        memset(o, 0, D * sizeof *o);
        *lse = -INFINITY;
        return;
    }
    double scale = 1.0 / sqrt((double)D);
    double *s = malloc(n * sizeof *s);
    double *acc = calloc(D, sizeof *acc);
    FLX_CORRUPTION(!s || !acc);
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double dot = 0;
        for (uint32_t d = 0; d < D; d++)
            dot += (double)q[d] * flx_bf16_to_f32(krow[i][d]);
        s[i] = dot * scale;
        if (s[i] > m) m = s[i];
    }
    double l = 0;
    for (size_t i = 0; i < n; i++) {
        double p = exp(s[i] - m);
        l += p;
        for (uint32_t d = 0; d < D; d++)
            acc[d] += p * flx_bf16_to_f32(vrow[i][d]);
    }
    for (uint32_t d = 0; d < D; d++)
        o[d] = (float)(acc[d] / l);
    *lse = (float)(m + log(l));
    free(s);
    free(acc);
}

flx_status_t flx_attn_window_ref(const flx_kv_head_view_t *view, uint32_t G, const float *q, float *o, float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "window_ref");
    if (st) return st;
    if (!q || !o || !lse || G == 0 || G > FLX_ATTN_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "window_ref: bad arguments (G %u)", G);
    uint32_t D = view->head_dim, n = view->n_win;
    if (n && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "window_ref: n_win %u but no window arrays", n);
    const flx_bf16_t **kr = malloc((n + 1) * sizeof *kr), **vr = malloc((n + 1) * sizeof *vr);
    FLX_CORRUPTION(!kr || !vr);
    for (uint32_t i = 0; i < n; i++) {
        kr[i] = view->win_k + (size_t)i * D;
        vr[i] = view->win_v + (size_t)i * D;
    }
    for (uint32_t h = 0; h < G; h++)
        attend_rows(q + (size_t)h * D, D, n, kr, vr, o + (size_t)h * D, lse + h);
    free(kr);
    free(vr);
    return FLX_OK;
}

flx_status_t flx_attn_score_ref(const flx_kv_head_view_t *view, int level, uint32_t G, const float *q,
                                float *scores)
{
    flx_status_t st = flx_attn_check_view(view, "score_ref");
    if (st) return st;
    if (level < 0 || level >= FLX_KV_META_LEVELS || !q || !scores || G == 0 || G > FLX_ATTN_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "score_ref: bad arguments (level %d, G %u)", level, G);
    uint32_t D = view->head_dim, n = view->meta_n[level];
    const flx_bf16_t *meta = view->meta[level];
    for (uint32_t h = 0; h < G; h++)
        for (uint32_t b = 0; b < n; b++) {
            const flx_bf16_t *mn = meta + (size_t)b * 2 * D, *mx = mn + D;
            double sum = 0;
            for (uint32_t d = 0; d < D; d++) {
                double a = (double)q[(size_t)h * D + d] * flx_bf16_to_f32(mn[d]);
                double c = (double)q[(size_t)h * D + d] * flx_bf16_to_f32(mx[d]);
                sum += a > c ? a : c;
            }
            scores[(size_t)h * n + b] = (float)sum;
        }
    return FLX_OK;
}

static const float *g_ref_scores;

static float rank_key(float s)
{
    return isnan(s) ? -INFINITY : s;
}

static int cmp_rank(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float si = rank_key(g_ref_scores[i]), sj = rank_key(g_ref_scores[j]);
    if (si != sj) return si > sj ? -1 : 1;
    return i < j ? -1 : (i > j);
}

flx_status_t flx_topk_ref(const float *scores, uint32_t n, uint32_t k, uint32_t *idx)
{
    if ((!scores && n) || (!idx && k) || k > n)
        return flx_error_set(FLX_ERR_INVALID, "topk_ref: k %u of n %u", k, n);
    uint32_t *all = malloc(((size_t)n + 1) * sizeof *all);
    FLX_CORRUPTION(!all);
    for (uint32_t i = 0; i < n; i++) all[i] = i;
    g_ref_scores = scores;   /* the reference is single-threaded by contract */
    qsort(all, n, sizeof *all, cmp_rank);
    memcpy(idx, all, (size_t)k * sizeof *idx);
    free(all);
    return FLX_OK;
}

flx_status_t flx_attn_sparse_ref(const flx_kv_head_view_t *view, int level, uint32_t G, const float *q,
                                 const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "sparse_ref");
    if (st) return st;
    if (!q || !o || !lse || G == 0 || G > FLX_ATTN_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "sparse_ref: bad arguments (G %u)", G);
    if ((st = flx_attn_check_sel(view, level, G, sel, sel_stride, k, "sparse_ref"))) return st;
    uint32_t D = view->head_dim, blk = 16u << level, l = view->l_cpu;
    const flx_bf16_t **kr = malloc(((size_t)l + 1) * sizeof *kr), **vr = malloc(((size_t)l + 1) * sizeof *vr);
    FLX_CORRUPTION(!kr || !vr);
    for (uint32_t h = 0; h < G; h++) {
        size_t n = 0;
        for (uint32_t i = 0; i < k[h]; i++) {
            uint32_t b = sel[(size_t)h * sel_stride + i];
            uint32_t t1 = (b + 1) * blk < l ? (b + 1) * blk : l;
            for (uint32_t t = b * blk; t < t1; t++) {
                kr[n] = flx_kv_block_k(view, t / 16) + (size_t)(t % 16) * D;
                vr[n] = flx_kv_block_v(view, t / 16) + (size_t)(t % 16) * D;
                n++;
            }
        }
        attend_rows(q + (size_t)h * D, D, n, kr, vr, o + (size_t)h * D, lse + h);
    }
    free(kr);
    free(vr);
    return FLX_OK;
}
