/*
 * attn_cpu.c - the fast attention kernels: AVX-512 BF16, AVX2+FMA and scalar inner loops behind one
 * OpenMP driver per kernel, chosen per call from flx_isa_active().
 *
 * DESIGN
 * Decode attention over host KV is bandwidth-bound, so every driver reads each byte once:
 *  - scoring walks metadata entries split by thread index; each entry (min row | max row, 2D bf16)
 *    is dotted with [min(q,0) | max(q,0)] of every head while it is in L1 (this equals
 *    sum_d max(q_d min_d, q_d max_d) because max >= min);
 *  - sparse attention first ORs the heads' selections into a per-block head mask, then threads
 *    take equal slices of the ascending union list; a 16-token physical block is loaded once and
 *    used by every head in its mask, with a per-head online softmax (m, l, acc[D]) per thread;
 *    the per-thread states are merged by LSE at the end (fixed order: deterministic for a fixed
 *    thread count).
 * q is prepared once per call in the workspace: scaled by 1/sqrt(D) for attention, and for the
 * AVX-512 path split into bf16 hi + lo so _mm512_dpbf16_ps keeps ~16 mantissa bits of q.
 * No kernel reads a row at or past l_cpu / n_win: the last block is handled with ntok < 16.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_internal.h"
#include "attn_simd.h"
#include "flx/util.h"

#define PART_STRIDE(D) ATTN_PART_STRIDE(D)   /* per (thread, head): m, l, pad..., acc at +16 */

/* ---------------- thread helpers ---------------- */

static int attn_threads(const flx_attn_ws_t *ws)
{
#ifdef FLX_TSAN
    (void)ws;
    return 1;
#else
    return (int)ws->shape.n_threads;
#endif
}

static void thread_ids(int *tid, int *nth)
{
#ifdef _OPENMP
    *tid = omp_get_thread_num();
    *nth = omp_get_num_threads();
#else
    *tid = 0;
    *nth = 1;
#endif
}

/* ---------------- q preparation ---------------- */

static void prep_split(flx_attn_ws_t *ws, uint32_t G, uint32_t W)
{
    for (size_t i = 0; i < (size_t)G * W; i++) {
        flx_bf16_t hi = flx_f32_to_bf16(ws->q_f32[i]);
        ws->q_hi[i] = hi;
        ws->q_lo[i] = flx_f32_to_bf16(ws->q_f32[i] - flx_bf16_to_f32(hi));
    }
}

/* The AVX2 path widens bf16 with two ops per 16 values (shift for even, mask for odd elements), so it
 * works in "even/odd" order within each 16-value chunk: position j < 8 holds element 2j, position
 * 8 + j holds element 2j + 1. q is stored permuted for it and outputs are permuted back. */
static void perm_eo(float *x, size_t n)
{
    float t[16];
    for (size_t c = 0; c < n; c += 16) {
        for (int j = 0; j < 8; j++) {
            t[j] = x[c + 2 * j];
            t[8 + j] = x[c + 2 * j + 1];
        }
        memcpy(x + c, t, sizeof t);
    }
}

static void unperm_eo(float *x, size_t n)
{
    float t[16];
    for (size_t c = 0; c < n; c += 16) {
        for (int j = 0; j < 8; j++) {
            t[2 * j] = x[c + j];
            t[2 * j + 1] = x[c + 8 + j];
        }
        memcpy(x + c, t, sizeof t);
    }
}

/* AVX-512: [16 even | 16 odd] within each full 32-value chunk of each W-wide row; a final 16 stay. */
static void perm_eo32(float *x, size_t rows, uint32_t W)
{
    float t[32];
    for (size_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c + 32 <= W; c += 32) {
            float *y = x + r * W + c;
            for (int j = 0; j < 16; j++) {
                t[j] = y[2 * j];
                t[16 + j] = y[2 * j + 1];
            }
            memcpy(y, t, sizeof t);
        }
}

static void unperm_eo32(float *y, uint32_t W)
{
    float t[32];
    for (uint32_t c = 0; c + 32 <= W; c += 32) {
        for (int j = 0; j < 16; j++) {
            t[2 * j] = y[c + j];
            t[2 * j + 1] = y[c + 16 + j];
        }
        memcpy(y + c, t, sizeof t);
    }
}

static void prep_finish(flx_attn_ws_t *ws, flx_isa_t isa, uint32_t W, attn_q_t *q)
{
    uint32_t G = ws->shape.group;
    if (isa == FLX_ISA_AVX512BF16) prep_split(ws, G, W);
    else if (isa == FLX_ISA_AVX512) perm_eo32(ws->q_f32, G, W);
    else if (isa == FLX_ISA_AVX2) perm_eo(ws->q_f32, (size_t)G * W);
    q->f32 = ws->q_f32;
    q->hi = ws->q_hi;
    q->lo = ws->q_lo;
    q->W = W;
}

/* Attention: q scaled by 1/sqrt(D). */
static void prep_q_attn(flx_attn_ws_t *ws, const float *qin, flx_isa_t isa, attn_q_t *q)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    float scale = 1.0f / sqrtf((float)D);
    for (size_t i = 0; i < (size_t)G * D; i++) ws->q_f32[i] = qin[i] * scale;
    prep_finish(ws, isa, D, q);
}

/* Quest scoring: [min(q, 0) | max(q, 0)] against an entry [min row | max row] gives
 * sum_d max(q_d min_d, q_d max_d) as one dot product of width 2D (max >= min). */
static void prep_q_score(flx_attn_ws_t *ws, const float *qin, flx_isa_t isa, attn_q_t *q)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    for (uint32_t h = 0; h < G; h++)
        for (uint32_t d = 0; d < D; d++) {
            float x = qin[(size_t)h * D + d];
            ws->q_f32[(size_t)h * 2 * D + d] = x < 0 ? x : 0.0f;
            ws->q_f32[(size_t)h * 2 * D + D + d] = x > 0 ? x : 0.0f;
        }
    prep_finish(ws, isa, 2 * D, q);
}

/* ---------------- scalar inner loops (the fast kernels' scalar level) ---------------- */

static void dots_scalar(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                        const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf)
{
    (void)pf;
    for (uint32_t r = 0; r < nrows; r++) {
        const flx_bf16_t *m = rows + (size_t)r * rstride;
        for (uint32_t i = 0; i < nh; i++) {
            const float *qs = q->f32 + (size_t)heads[i] * q->W;
            float s = 0;
            for (uint32_t d = 0; d < q->W; d++) s += qs[d] * flx_bf16_to_f32(m[d]);
            out[(size_t)i * out_stride + r] = s;
        }
    }
}

static void block_scalar(const flx_bf16_t *kp, const flx_bf16_t *vp, uint32_t ntok, uint32_t D, const attn_q_t *q,
                         const uint8_t *heads, uint32_t nh, float *part, const flx_bf16_t *next_k,
                         const flx_bf16_t *next_v)
{
    (void)next_k, (void)next_v;
    float S[64 * 16];
    dots_scalar(kp, D, ntok, q, heads, nh, S, 16, NULL);
    for (uint32_t i = 0; i < nh; i++) {
        float *st = part + heads[i] * ATTN_PART_STRIDE(D), *acc = st + 16, *s = S + 16 * i, mb = -INFINITY;
        for (uint32_t t = 0; t < ntok; t++) mb = s[t] > mb ? s[t] : mb;
        float mn = st[0] > mb ? st[0] : mb;
        float alpha = expf(st[0] - mn), l = st[1] * alpha;
        for (uint32_t d = 0; d < D; d++) acc[d] *= alpha;
        for (uint32_t t = 0; t < ntok; t++) {
            float p = expf(s[t] - mn);
            l += p;
            for (uint32_t d = 0; d < D; d++) acc[d] += p * flx_bf16_to_f32(vp[(size_t)t * D + d]);
        }
        st[0] = mn;
        st[1] = l;
    }
}

static attn_dots_fn pick_dots(flx_isa_t isa)
{
    switch (isa) {
    case FLX_ISA_AVX512BF16: return attn_dots_avx512bf16;
    case FLX_ISA_AVX512: return attn_dots_avx512;
    case FLX_ISA_AVX2: return attn_dots_avx2;
    default: return dots_scalar;
    }
}

static attn_block_fn pick_block(flx_isa_t isa)
{
    switch (isa) {
    case FLX_ISA_AVX512BF16: return attn_block_avx512bf16;
    case FLX_ISA_AVX512: return attn_block_avx512;
    case FLX_ISA_AVX2: return attn_block_avx2;
    default: return block_scalar;
    }
}

/* Head indices of the set bits of mask, ascending; returns their count. */
static uint32_t mask_heads(uint64_t mask, uint8_t *heads)
{
    uint32_t n = 0;
    while (mask) {
        heads[n++] = (uint8_t)__builtin_ctzll(mask);
        mask &= mask - 1;
    }
    return n;
}

/* ---------------- scoring ---------------- */

flx_status_t flx_attn_score(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                            float *scores)
{
    flx_status_t st = flx_attn_check_view(view, "score");
    if (st) return st;
    if (!ws || !q || !scores || level < 0 || level >= FLX_KV_META_LEVELS)
        return flx_error_set(FLX_ERR_INVALID, "score: bad arguments (level %d)", level);
    if (view->head_dim != ws->shape.head_dim || view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "score: view head_dim %u l_cpu %u vs workspace D %u max_l_cpu %u",
                             view->head_dim, view->l_cpu, ws->shape.head_dim, ws->shape.max_l_cpu);
    uint32_t n = view->meta_n[level];
    if (n == 0) return FLX_OK;
    if (!view->meta[level])
        return flx_error_set(FLX_ERR_INVALID, "score: metadata level %d missing", level);
    flx_isa_t isa = flx_isa_active();
    attn_q_t pq;
    prep_q_score(ws, q, isa, &pq);
    attn_dots_fn dots = pick_dots(isa);
    uint8_t heads[FLX_ATTN_MAX_GROUP];
    uint32_t G = ws->shape.group;
    for (uint32_t h = 0; h < G; h++) heads[h] = (uint8_t)h;
    const flx_bf16_t *meta = view->meta[level];
    const size_t W = pq.W;
    int nt = attn_threads(ws);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        uint32_t e0 = (uint32_t)((uint64_t)n * tid / nth), e1 = (uint32_t)((uint64_t)n * (tid + 1) / nth);
        /* the metadata is one sequential stream: prefetch SCORE_AHEAD entries ahead as it is consumed
         * (a prefetch past the end never faults and is never read) */
        enum { SCORE_AHEAD = 16 };
        if (e1 > e0) dots(meta + e0 * W, W, e1 - e0, &pq, heads, G, scores + e0, n, meta + (e0 + SCORE_AHEAD) * W);
    }
    return FLX_OK;
}

static void part_reset(float *part, uint32_t G, uint32_t D)
{
    for (uint32_t h = 0; h < G; h++) {
        float *st = part + h * PART_STRIDE(D);
        st[0] = -INFINITY;
        st[1] = 0;
        memset(st + 16, 0, D * sizeof(float));
    }
}

/* Merges the per-thread states of heads in mask into o, lse (thread order fixed). */
static void part_finish(const flx_attn_ws_t *ws, int nth, flx_isa_t isa, float *o, float *lse)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    for (uint32_t h = 0; h < G; h++) {
        float M = -INFINITY;
        for (int t = 0; t < nth; t++) {
            const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
            if (st[1] > 0 && st[0] > M) M = st[0];
        }
        float *oh = o + (size_t)h * D;
        if (M == -INFINITY) {
            memset(oh, 0, D * sizeof *oh);
            lse[h] = -INFINITY;
            continue;
        }
        double L = 0;
        for (int t = 0; t < nth; t++) {
            const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
            if (st[1] > 0) L += st[1] * exp((double)st[0] - M);
        }
        for (uint32_t d = 0; d < D; d++) {
            double a = 0;
            for (int t = 0; t < nth; t++) {
                const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
                if (st[1] > 0) a += st[16 + d] * exp((double)st[0] - M);
            }
            oh[d] = (float)(a / L);
        }
        lse[h] = (float)(M + log(L));
        if (isa == FLX_ISA_AVX2) unperm_eo(oh, D);
        else if (isa >= FLX_ISA_AVX512) unperm_eo32(oh, D);
    }
}

flx_status_t flx_attn_window(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                             float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "window");
    if (st) return st;
    if (!ws || !q || !o || !lse)
        return flx_error_set(FLX_ERR_INVALID, "window: NULL argument");
    if (view->head_dim != ws->shape.head_dim)
        return flx_error_set(FLX_ERR_INVALID, "window: view head_dim %u vs workspace %u", view->head_dim,
                             ws->shape.head_dim);
    uint32_t n = view->n_win, G = ws->shape.group, D = ws->shape.head_dim;
    if (n && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "window: n_win %u but no window arrays", n);
    flx_isa_t isa = flx_isa_active();
    attn_q_t pq;
    prep_q_attn(ws, q, isa, &pq);
    attn_block_fn fn = pick_block(isa);
    uint8_t heads[FLX_ATTN_MAX_GROUP];
    const uint32_t nh = mask_heads(G == 64 ? ~0ull : ((1ull << G) - 1), heads);
    uint32_t nchunk = (n + 15) / 16;
    int used = 1, nt = attn_threads(ws);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        if (tid == 0) used = nth;
        float *part = ws->part + (size_t)tid * G * PART_STRIDE(D);
        part_reset(part, G, D);
        uint32_t c0 = (uint32_t)((uint64_t)nchunk * tid / nth), c1 = (uint32_t)((uint64_t)nchunk * (tid + 1) / nth);
        for (uint32_t c = c0; c < c1; c++) {
            uint32_t ntok = n - c * 16 < 16 ? n - c * 16 : 16;
            const flx_bf16_t *nk = NULL, *nv = NULL;   /* the window is contiguous: rows go on in order */
            if (c + 1 < c1 && n - (c + 1) * 16 >= 16)
                nk = view->win_k + (size_t)(c + 1) * 16 * D, nv = view->win_v + (size_t)(c + 1) * 16 * D;
            fn(view->win_k + (size_t)c * 16 * D, view->win_v + (size_t)c * 16 * D, ntok, D, &pq, heads, nh, part, nk,
               nv);
        }
    }
    part_finish(ws, used, isa, o, lse);
    return FLX_OK;
}

/* Union of the heads' selections -> ws->mask / ws->list; returns the list length or an error. */
static flx_status_t build_union(flx_attn_ws_t *ws, uint32_t n, const uint32_t *sel, uint32_t sel_stride,
                                const uint32_t *k, uint32_t *n_list_p)
{
    uint32_t G = ws->shape.group;
    memset(ws->mask, 0, (size_t)n * sizeof *ws->mask);
    for (uint32_t h = 0; h < G; h++) {
        if (k[h] > n)
            return flx_error_set(FLX_ERR_INVALID, "sparse: k[%u] = %u exceeds %u blocks", h, k[h], n);
        const uint32_t *sh = sel + (size_t)h * sel_stride;
        uint64_t bit = 1ull << h;
        for (uint32_t i = 0; i < k[h]; i++) {
            uint32_t b = sh[i];
            if (b >= n)
                return flx_error_set(FLX_ERR_INVALID, "sparse: head %u block index %u out of range (n %u)", h, b, n);
            if (ws->mask[b] & bit)
                return flx_error_set(FLX_ERR_INVALID, "sparse: head %u selects block %u twice", h, b);
            ws->mask[b] |= bit;
        }
    }
    uint32_t m = 0;
    for (uint32_t b = 0; b < n; b++)
        if (ws->mask[b]) ws->list[m++] = b;
    *n_list_p = m;
    return FLX_OK;
}

/* Attention over ws->list[0..n_list) (masks in ws->mask) at blk = 16 << level; q already prepared. */
static void sparse_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, uint32_t n_list,
                       flx_isa_t isa, const attn_q_t *pq, float *o, float *lse)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim, ppb = 1u << level, l_cpu = view->l_cpu;
    attn_block_fn fn = pick_block(isa);
    int used = 1, nt = attn_threads(ws);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        if (tid == 0) used = nth;
        float *part = ws->part + (size_t)tid * G * PART_STRIDE(D);
        part_reset(part, G, D);
        uint32_t u0 = (uint32_t)((uint64_t)n_list * tid / nth), u1 = (uint32_t)((uint64_t)n_list * (tid + 1) / nth);
        /* Each block hands the kernel the next one of this thread's slice, whose K and V are
         * prefetched while it computes (a gathered selection defeats the hardware streamer). */
        uint8_t heads[FLX_ATTN_MAX_GROUP];
        for (uint32_t u = u0; u < u1; u++) {
            uint32_t b = ws->list[u];
            const uint32_t nh = mask_heads(ws->mask[b], heads);
            uint32_t p1 = (b + 1) * ppb < view->n_blocks ? (b + 1) * ppb : view->n_blocks;
            for (uint32_t pb = b * ppb; pb < p1; pb++) {
                uint32_t ntok = l_cpu - pb * 16 < 16 ? l_cpu - pb * 16 : 16;
                uint32_t nb = pb + 1 < p1 ? pb + 1 : u + 1 < u1 ? ws->list[u + 1] * ppb : UINT32_MAX;
                const flx_bf16_t *nk = NULL, *nv = NULL;
                if (nb < view->n_blocks && l_cpu - nb * 16 >= 16) nk = flx_kv_block_k(view, nb), nv = flx_kv_block_v(view, nb);
                fn(flx_kv_block_k(view, pb), flx_kv_block_v(view, pb), ntok, D, pq, heads, nh, part, nk, nv);
            }
        }
    }
    part_finish(ws, used, isa, o, lse);
}

/* Union of the heads' selections, then attention over it; *n_list_p = distinct logical blocks. */
static flx_status_t union_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                              const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse,
                              uint32_t *n_list_p)
{
    flx_status_t st = build_union(ws, flx_kv_meta_count(view->l_cpu, level), sel, sel_stride, k, n_list_p);
    if (st) return st;
    flx_isa_t isa = flx_isa_active();
    attn_q_t pq;
    prep_q_attn(ws, q, isa, &pq);
    sparse_run(ws, view, level, *n_list_p, isa, &pq, o, lse);
    return FLX_OK;
}

flx_status_t flx_attn_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                             const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "sparse");
    if (st) return st;
    if (!ws || !q || !o || !lse || !k || level < 0 || level >= FLX_KV_META_LEVELS)
        return flx_error_set(FLX_ERR_INVALID, "sparse: bad arguments (level %d)", level);
    if (view->head_dim != ws->shape.head_dim || view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "sparse: view head_dim %u l_cpu %u vs workspace D %u max_l_cpu %u",
                             view->head_dim, view->l_cpu, ws->shape.head_dim, ws->shape.max_l_cpu);
    if (!sel && flx_kv_meta_count(view->l_cpu, level)) {
        for (uint32_t h = 0; h < ws->shape.group; h++)
            if (k[h]) return flx_error_set(FLX_ERR_INVALID, "sparse: sel is NULL but k[%u] = %u", h, k[h]);
    }
    uint32_t n_list;
    return union_run(ws, view, level, q, sel, sel_stride, k, o, lse, &n_list);
}

flx_status_t flx_attn_task_full_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                                     float *lse, uint64_t *bytes_p)
{
    uint32_t G = ws->shape.group, n = view->n_blocks;
    uint64_t all = G == 64 ? ~0ull : ((1ull << G) - 1);
    for (uint32_t b = 0; b < n; b++) {
        ws->mask[b] = all;
        ws->list[b] = b;
    }
    flx_isa_t isa = flx_isa_active();
    attn_q_t pq;
    prep_q_attn(ws, q, isa, &pq);
    sparse_run(ws, view, 0, n, isa, &pq, o, lse);
    *bytes_p = (uint64_t)view->l_cpu * view->head_dim * 4;
    return FLX_OK;
}

flx_status_t flx_attn_task_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                  float *o, float *lse, uint64_t *bytes_p)
{
    uint32_t n_list;
    flx_status_t st = union_run(ws, view, level, q, ws->sel, ws->n_max, ws->k, o, lse, &n_list);
    if (st) return st;
    /* K+V bytes of the distinct blocks read (the last block holds only the tokens up to l_cpu) */
    uint64_t tok = 0;
    const uint32_t blk = 16u << level;
    for (uint32_t u = 0; u < n_list; u++) {
        uint32_t b = ws->list[u], t1 = (b + 1) * blk < view->l_cpu ? (b + 1) * blk : view->l_cpu;
        tok += t1 - b * blk;
    }
    *bytes_p = tok * view->head_dim * 4;
    return FLX_OK;
}
