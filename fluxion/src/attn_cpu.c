/*
 * attn_cpu.c - the fast attention kernels: AVX-512 BF16, AVX2+FMA and scalar inner loops behind
 * chunked drivers, chosen per call from flx_isa_active().
 *
 * DESIGN
 * Decode attention over host KV is bandwidth-bound, so every driver reads each byte once:
 *  - scoring walks metadata entries in fixed 256-entry chunks (claimed by the pool's workers);
 *    each entry (min row | max row, 2D bf16) is dotted with [min(q,0) | max(q,0)] of every head
 *    while it is in L1 (this equals sum_d max(q_d min_d, q_d max_d) because max >= min); a score
 *    depends on nothing but its entry, so any split gives the same scores;
 *  - sparse attention first ORs the heads' selections into a per-block head mask, then cuts the
 *    ascending union list into chunks of a fixed number of 16-token blocks (attn.h, CHUNKS); a
 *    block is loaded once and used by every head in its mask, with a per-head online softmax
 *    (m, l, acc[D]) per chunk; the chunks' states are merged by LSE in chunk order at the end,
 *    each chunk's weight e^(m - M) computed once per head. Chunk boundaries depend on the data
 *    alone, so the result is bitwise the same for any number of workers and any schedule. The
 *    blocks are scattered, so the driver prefetches: the next block into L1, the fourth one ahead
 *    into L2 (HOST_L2_AHEAD), which keeps enough misses in flight to read near memory speed.
 * q is prepared once per call in the workspace: scaled by 1/sqrt(D) for attention, and for the
 * AVX-512 path split into bf16 hi + lo so _mm512_dpbf16_ps keeps ~16 mantissa bits of q.
 * AMX: at FLX_ISA_AMX these kernels run their AVX-512 fp32 versions. Tile versions of the scoring
 * dots and of QK were written and measured on the AMX Xeon (2026-12-01, not kept): scoring from L2
 * ran at 58 to 65 GB/s on one core against 28 to 30, but from DRAM on two workers it was no faster
 * (attn_bench, 32K batch 4, runs alternated: 19 to 25 GB/s against 20 to 26: both near the 27 GB/s
 * the binary read), and a 16-token block's QK is a chain of tile products whose result the
 * softmax waits for, which out-of-order execution does not hide: sparse attention fell from 18 to
 * 21 GB/s to 14 to 15. The AVX-512 BF16 kernels are slower still there (scoring 14.2 GB/s).
 * No kernel reads a row at or past l_cpu / n_win: the last block is handled with ntok < 16.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "attn_internal.h"
#include "attn_simd.h"
#include "flx/util.h"

#define PART_STRIDE(D) ATTN_PART_STRIDE(D)   /* per (thread, head): m, l, pad..., acc at +16 */

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
    else if (isa == FLX_ISA_AVX512 || isa == FLX_ISA_AMX) perm_eo32(ws->q_f32, G, W);
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
    case FLX_ISA_AMX:   /* the fp32 kernels: see AMX in the DESIGN above */
    case FLX_ISA_AVX512: return attn_dots_avx512;
    case FLX_ISA_AVX2: return attn_dots_avx2;
    default: return dots_scalar;
    }
}

static attn_block_fn pick_block(flx_isa_t isa)
{
    switch (isa) {
    case FLX_ISA_AVX512BF16: return attn_block_avx512bf16;
    case FLX_ISA_AMX:
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

/* ---------------- chunk plans and states ---------------- */

/* Window rows per chunk: at least 256, at most FLX_ATTN_WIN_CHUNKS chunks. */
static uint32_t win_rows_per_chunk(uint32_t n)
{
    uint32_t r = (uint32_t)FLX_ALIGN_UP(FLX_DIV_UP(n, FLX_ATTN_WIN_CHUNKS), 16);
    return r < 256 ? 256 : r;
}

/* Host 16-token blocks per chunk, from the number of host blocks alone: a multiple of 8 (so a
 * whole number of logical blocks at every blk), at least 32, at most FLX_ATTN_HOST_CHUNKS chunks
 * (ceil(ceil(n / ppb) / (c / ppb)) = ceil(n / c) <= 64). */
static uint32_t host_blocks_per_chunk(uint32_t n_blocks)
{
    uint32_t c = (uint32_t)FLX_ALIGN_UP(FLX_DIV_UP(n_blocks, FLX_ATTN_HOST_CHUNKS), 8);
    return c < 32 ? 32 : c;
}

float *flx_attn_slot(const flx_attn_ws_t *ws, uint32_t c)
{
    return ws->part + (size_t)c * ws->shape.group * PART_STRIDE(ws->shape.head_dim);
}

static attn_q_t task_q(const flx_attn_ws_t *ws)
{
    attn_q_t q = {ws->q_f32, ws->q_hi, ws->q_lo, ws->shape.head_dim};
    return q;
}

void flx_attn_prep_attn_q(flx_attn_ws_t *ws, const float *q)
{
    attn_q_t pq;
    ws->isa = (int)flx_isa_active();
    prep_q_attn(ws, q, (flx_isa_t)ws->isa, &pq);
}

uint32_t flx_attn_plan_window(flx_attn_ws_t *ws, uint32_t n_win)
{
    ws->win_rows = win_rows_per_chunk(n_win);
    return ws->n_win_chunks = FLX_DIV_UP(n_win, ws->win_rows);
}

uint32_t flx_attn_plan_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, uint32_t n_list)
{
    ws->level = level;
    ws->n_list = n_list;
    ws->host_entries = host_blocks_per_chunk(view->n_blocks) >> level;
    return ws->n_host_chunks = FLX_DIV_UP(n_list, ws->host_entries);
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

void flx_attn_window_chunk(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t c, float *part)
{
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim, n = view->n_win;
    const attn_q_t pq = task_q(ws);
    attn_block_fn fn = pick_block((flx_isa_t)ws->isa);
    uint8_t heads[FLX_ATTN_MAX_GROUP];
    const uint32_t nh = mask_heads(G == 64 ? ~0ull : ((1ull << G) - 1), heads);
    part_reset(part, G, D);
    const uint32_t r0 = c * ws->win_rows, r1 = r0 + ws->win_rows < n ? r0 + ws->win_rows : n;
    for (uint32_t r = r0; r < r1; r += 16) {
        const uint32_t ntok = r1 - r < 16 ? r1 - r : 16;
        const flx_bf16_t *nk = NULL, *nv = NULL;   /* the window is contiguous: rows go on in order */
        if (r + 32 <= r1) nk = view->win_k + (size_t)(r + 16) * D, nv = view->win_v + (size_t)(r + 16) * D;
        fn(view->win_k + (size_t)r * D, view->win_v + (size_t)r * D, ntok, D, &pq, heads, nh, part, nk, nv);
    }
}

/* A position in a host chunk's read order: logical block ws->list[u] (u < u1, else past the end),
 * its physical block pb in [list[u] * ppb, p1). */
typedef struct blk_cursor {
    uint32_t u, pb, p1;
} blk_cursor_t;

static void cursor_at(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t ppb, uint32_t u, uint32_t u1,
                      blk_cursor_t *k)
{
    k->u = u, k->pb = k->p1 = 0;
    if (u >= u1) return;
    const uint32_t b = ws->list[u];
    k->pb = b * ppb;
    k->p1 = (b + 1) * ppb < view->n_blocks ? (b + 1) * ppb : view->n_blocks;
}

static void cursor_next(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t ppb, uint32_t u1,
                        blk_cursor_t *k)
{
    if (k->u >= u1) return;
    if (++k->pb >= k->p1) cursor_at(ws, view, ppb, k->u + 1, u1, k);
}

/* Physical blocks ahead of the one being read whose K and V go to L2 (prefetcht1). A gathered
 * selection defeats the hardware streamer, and prefetching only the next block into L1 left the
 * kernel at the few misses L1 keeps in flight: 17 to 21 GB/s of K and V on two cores here against
 * 23 to 33 with this (attn_bench before and after, interleaved; fixed (16, *) at 32K and 128K);
 * 2 ahead measured about the same as 4. */
#define HOST_L2_AHEAD 4

void flx_attn_host_chunk(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t c, float *part)
{
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim, ppb = 1u << ws->level, l_cpu = view->l_cpu;
    const attn_q_t pq = task_q(ws);
    attn_block_fn fn = pick_block((flx_isa_t)ws->isa);
    part_reset(part, G, D);
    const uint32_t u0 = c * ws->host_entries, u1 = u0 + ws->host_entries < ws->n_list ? u0 + ws->host_entries : ws->n_list;
    /* One walk of the chunk's physical blocks, three cursors on it: the block read (cur), the next
     * one, whose K and V the kernel prefetches into L1 while it computes (nxt; not a partial last
     * block), and the one HOST_L2_AHEAD on, sent to L2 here (ahead). */
    blk_cursor_t cur, nxt, ahead;
    cursor_at(ws, view, ppb, u0, u1, &cur);
    nxt = cur;
    cursor_next(ws, view, ppb, u1, &nxt);
    ahead = nxt;
    for (int i = 1; i < HOST_L2_AHEAD; i++) cursor_next(ws, view, ppb, u1, &ahead);
    uint8_t heads[FLX_ATTN_MAX_GROUP];
    uint32_t nh = 0, heads_u = UINT32_MAX;
    for (; cur.u < u1; cur = nxt, cursor_next(ws, view, ppb, u1, &nxt)) {
        if (cur.u != heads_u) heads_u = cur.u, nh = mask_heads(ws->mask[ws->list[cur.u]], heads);
        if (ahead.u < u1) {   /* K then V of one block: block_bytes from its K */
            const char *a = (const char *)flx_kv_block_k(view, ahead.pb);
            for (size_t off = 0; off < view->block_bytes; off += 64) _mm_prefetch(a + off, _MM_HINT_T1);
            cursor_next(ws, view, ppb, u1, &ahead);
        }
        const uint32_t ntok = l_cpu - cur.pb * 16 < 16 ? l_cpu - cur.pb * 16 : 16;
        const flx_bf16_t *nk = NULL, *nv = NULL;
        if (nxt.u < u1 && l_cpu - nxt.pb * 16 >= 16)
            nk = flx_kv_block_k(view, nxt.pb), nv = flx_kv_block_v(view, nxt.pb);
        fn(flx_kv_block_k(view, cur.pb), flx_kv_block_v(view, cur.pb), ntok, D, &pq, heads, nh, part, nk, nv);
    }
}

/* a[d] += acc[d] * w and o[d] = (float)(a[d] * inv), d < D (a multiple of 16): products and sums
 * rounded one by one as the scalar loops round them, eight doubles at a time. */
__attribute__((target("avx512f"))) static void acc_add_512(double *a, const float *acc, double w, uint32_t D)
{
    const __m512d wv = _mm512_set1_pd(w);
    for (uint32_t d = 0; d < D; d += 8)
        _mm512_storeu_pd(a + d, _mm512_add_pd(_mm512_loadu_pd(a + d),
                                              _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(acc + d)), wv)));
}

__attribute__((target("avx512f"))) static void scale_out_512(float *o, const double *a, double inv, uint32_t D)
{
    const __m512d iv = _mm512_set1_pd(inv);
    for (uint32_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(o + d, _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_loadu_pd(a + d), iv)));
}

/* Merges the states of chunks [first, first + n) in order into o, lse (outputs back in natural
 * order); no chunk, or no token in any: o = 0, lse = -inf. */
void flx_attn_part_finish(const flx_attn_ws_t *ws, uint32_t first, uint32_t n, float *o, float *lse)
{
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    const flx_isa_t isa = (flx_isa_t)ws->isa;
    double w[FLX_ATTN_MAX_CHUNKS];
    for (uint32_t h = 0; h < G; h++) {
        float M = -INFINITY;
        for (uint32_t t = 0; t < n; t++) {
            const float *st = flx_attn_slot(ws, first + t) + h * PART_STRIDE(D);
            if (st[1] > 0 && st[0] > M) M = st[0];
        }
        float *oh = o + (size_t)h * D;
        if (M == -INFINITY) {
            memset(oh, 0, D * sizeof *oh);
            lse[h] = -INFINITY;
            continue;
        }
        double L = 0;
        for (uint32_t t = 0; t < n; t++) {
            const float *st = flx_attn_slot(ws, first + t) + h * PART_STRIDE(D);
            w[t] = st[1] > 0 ? exp((double)st[0] - M) : 0.0;
            L += st[1] * w[t];
        }
        /* per d the chunks in order, as a sum over t of the d-th terms: t outer keeps that order
         * and lets the d loop run in vectors */
        double a[FLX_ATTN_MAX_HEAD_DIM];
        for (uint32_t d = 0; d < D; d++) a[d] = 0;
        for (uint32_t t = 0; t < n; t++) {
            if (w[t] == 0.0) continue;
            const float *acc = flx_attn_slot(ws, first + t) + h * PART_STRIDE(D) + 16;
            const double wt = w[t];
            if (isa >= FLX_ISA_AVX512) acc_add_512(a, acc, wt, D);
            else
                for (uint32_t d = 0; d < D; d++) a[d] += acc[d] * wt;
        }
        const double inv = 1.0 / L;   /* one division a head: D of them were a quarter of a window's time */
        if (isa >= FLX_ISA_AVX512) scale_out_512(oh, a, inv, D);
        else
            for (uint32_t d = 0; d < D; d++) oh[d] = (float)(a[d] * inv);
        lse[h] = (float)(M + log(L));
        if (isa == FLX_ISA_AVX2) unperm_eo(oh, D);
        else if (isa >= FLX_ISA_AVX512) unperm_eo32(oh, D);
    }
}

/* ---------------- runs of chunks on the workspace's pool ---------------- */

typedef struct chunk_job {
    const flx_attn_ws_t *ws;
    const flx_kv_head_view_t *view;
    int host;                   /* 0: window chunks, 1: host chunks */
} chunk_job_t;

static flx_status_t chunk_run(void *ctx, const flx_pool_worker_t *w, uint64_t c0, uint64_t c1)
{
    (void)w;
    const chunk_job_t *j = ctx;
    for (uint64_t c = c0; c < c1; c++) {
        if (j->host) flx_attn_host_chunk(j->ws, j->view, (uint32_t)c, flx_attn_slot(j->ws, (uint32_t)c));
        else flx_attn_window_chunk(j->ws, j->view, (uint32_t)c, flx_attn_slot(j->ws, (uint32_t)c));
    }
    return FLX_OK;
}

/* ---------------- scoring ---------------- */

typedef struct score_job {
    const flx_bf16_t *meta;
    attn_dots_fn dots;
    const attn_q_t *pq;
    const uint8_t *heads;
    uint32_t G, n;
    float *scores;
} score_job_t;

#define SCORE_CHUNK 256   /* entries per chunk: a multiple of the 4-row tiles */

static flx_status_t score_run(void *ctx, const flx_pool_worker_t *w, uint64_t e0, uint64_t e1)
{
    (void)w;
    const score_job_t *j = ctx;
    const size_t W = j->pq->W;
    /* the metadata is one sequential stream: prefetch SCORE_AHEAD entries ahead as it is consumed
     * (a prefetch past the end never faults and is never read) */
    enum { SCORE_AHEAD = 16 };
    j->dots(j->meta + e0 * W, W, (uint32_t)(e1 - e0), j->pq, j->heads, j->G, j->scores + e0, j->n,
            j->meta + (e0 + SCORE_AHEAD) * W);
    return FLX_OK;
}

flx_status_t flx_attn_score(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                            float *scores)
{
    if (!ws) return flx_error_set(FLX_ERR_INVALID, "score: workspace is NULL");
    uint8_t heads[FLX_ATTN_MAX_GROUP];
    for (uint32_t h = 0; h < ws->shape.group; h++) heads[h] = (uint8_t)h;
    return flx_attn_score_heads(ws, view, level, q, heads, ws->shape.group, scores);
}

flx_status_t flx_attn_score_heads(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                  const uint8_t *heads, uint32_t nh, float *scores)
{
    flx_status_t st = flx_attn_check_view(view, "score");
    if (st) return st;
    if (!ws || !q || !scores || !heads || level < 0 || level >= FLX_KV_META_LEVELS || nh == 0 ||
        nh > ws->shape.group)
        return flx_error_set(FLX_ERR_INVALID, "score: bad arguments (level %d, %u heads)", level, nh);
    for (uint32_t i = 0; i < nh; i++)
        if (heads[i] >= ws->shape.group || (i && heads[i] <= heads[i - 1]))
            return flx_error_set(FLX_ERR_INVALID, "score: head list entry %u (%u) not ascending below %u", i,
                                 heads[i], ws->shape.group);
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
    score_job_t j = {view->meta[level], pick_dots(isa), &pq, heads, nh, n, scores};
    return flx_pool_for(ws->shape.pool, n, SCORE_CHUNK, score_run, &j);
}

/* ---------------- window and sparse kernels ---------------- */

/* The arguments every window entry point takes; `who` names it in the error. */
static flx_status_t check_window(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                 const float *o, const float *lse, const char *who)
{
    flx_status_t st = flx_attn_check_view(view, who);
    if (st) return st;
    if (!ws || !q || !o || !lse) return flx_error_set(FLX_ERR_INVALID, "%s: NULL argument", who);
    if (view->head_dim != ws->shape.head_dim)
        return flx_error_set(FLX_ERR_INVALID, "%s: view head_dim %u vs workspace %u", who, view->head_dim,
                             ws->shape.head_dim);
    if (view->n_win && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "%s: n_win %u but no window arrays", who, view->n_win);
    return FLX_OK;
}

flx_status_t flx_attn_window(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                             float *lse)
{
    flx_status_t st = check_window(ws, view, q, o, lse, "window");
    if (st) return st;
    flx_attn_prep_attn_q(ws, q);
    const uint32_t nc = flx_attn_plan_window(ws, view->n_win);
    chunk_job_t j = {ws, view, 0};
    if ((st = flx_pool_for(ws->shape.pool, nc, 1, chunk_run, &j))) return st;
    flx_attn_part_finish(ws, 0, nc, o, lse);
    return FLX_OK;
}

flx_status_t flx_attn_window_segments(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                      uint32_t n_seg, const uint32_t *seg_rows, float *o_seg, float *lse_seg,
                                      float *o, float *lse)
{
    flx_status_t st = check_window(ws, view, q, o, lse, "window segments");
    if (st) return st;
    if (!seg_rows || !o_seg || !lse_seg || n_seg == 0 || n_seg > FLX_ATTN_WIN_SEGMENTS)
        return flx_error_set(FLX_ERR_INVALID, "window segments: NULL argument or %u segments (1..%d)", n_seg,
                             FLX_ATTN_WIN_SEGMENTS);
    uint64_t total = 0;
    for (uint32_t s = 0; s < n_seg; s++) total += seg_rows[s];
    if (total != view->n_win)
        return flx_error_set(FLX_ERR_INVALID, "window segments: %llu rows in segments, the window has %u",
                             (unsigned long long)total, view->n_win);
    _Static_assert(FLX_ATTN_WIN_SEGMENTS * FLX_ATTN_WIN_CHUNKS <= FLX_ATTN_MAX_CHUNKS, "window segments' slots");
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    flx_attn_prep_attn_q(ws, q);
    uint32_t slot = 0, row = 0;
    for (uint32_t s = 0; s < n_seg; s++) {
        /* the segment as a window of its own, its chunks in the slots after the previous segment's
         * (<= FLX_ATTN_WIN_CHUNKS each, FLX_ATTN_WIN_SEGMENTS * that within FLX_ATTN_MAX_CHUNKS) */
        flx_kv_head_view_t sv = *view;
        sv.win_k = view->win_k + (size_t)row * D, sv.win_v = view->win_v + (size_t)row * D;
        sv.n_win = sv.win_cap = seg_rows[s];
        const uint32_t nc = seg_rows[s] ? flx_attn_plan_window(ws, seg_rows[s]) : 0;
        for (uint32_t c = 0; c < nc; c++) flx_attn_window_chunk(ws, &sv, c, flx_attn_slot(ws, slot + c));
        flx_attn_part_finish(ws, slot, nc, o_seg + (size_t)s * G * D, lse_seg + (size_t)s * G);
        slot += nc, row += seg_rows[s];
    }
    flx_attn_part_finish(ws, 0, slot, o, lse);
    return FLX_OK;
}

flx_status_t flx_attn_build_union(flx_attn_ws_t *ws, uint32_t n, const uint32_t *sel, uint32_t sel_stride,
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

/* Host chunks of the union already in ws (list, mask, level, n_list planned) on the pool, merged
 * into o, lse. */
static flx_status_t host_all(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, float *o, float *lse)
{
    chunk_job_t j = {ws, view, 1};
    flx_status_t st = flx_pool_for(ws->shape.pool, ws->n_host_chunks, 1, chunk_run, &j);
    if (st) return st;
    flx_attn_part_finish(ws, 0, ws->n_host_chunks, o, lse);
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
    if ((st = flx_attn_build_union(ws, flx_kv_meta_count(view->l_cpu, level), sel, sel_stride, k, &n_list))) return st;
    flx_attn_prep_attn_q(ws, q);
    flx_attn_plan_host(ws, view, level, n_list);
    return host_all(ws, view, o, lse);
}
