/*
 * attn_host.cu - the GPU worker's kernels (flx/attn_gpu.h, HOST PART ON THE DEVICE): Quest scoring
 * and top-k over the metadata pyramid, sparse attention over the selected KV blocks, both read in
 * place from pinned host memory (UVA), and the LSE merge.
 *
 * CPU REFERENCES: flx_attn_score_ref, flx_topk (and flx_topk_ref), flx_attn_sparse_ref,
 * flx_attn_merge, flx_attn_host_run (fluxion/src/attn_ref.c, attn_task.c). tests/fluxion/
 * test_attn_gpu_host.c holds every kernel and the whole task to them with atol + rtol * |ref|, NaN
 * never passing, the worst element printed; the top-k indices must be flx_topk's exactly.
 *
 * DESIGN
 * The bytes read over the bus decide the time, so each is read once. Scoring: one warp per metadata
 * entry (min row | max row, 2D bf16, read as 16-byte words, coalesced), dotted with
 * [min(q, 0) | max(q, 0)] of every head of the group (q stays in L1), so an entry is read once for
 * all G heads. Top-k: one block per head; the scores are mapped to order-preserving 32-bit keys
 * (NaN -> -inf, -0 -> +0, as flx_topk ranks them), a 4-pass radix select finds the k-th largest key
 * tau and how many keys exceed it (each pass: a 256-bin histogram with one shared atomic per
 * distinct digit of a warp, then the bin holding the rank found by one block scan, a thread per
 * bin; with one thread walking the bins instead, the kernel took 31 us at 32K on an H100, 22 now),
 * and two ordered compactions (ballot + popc scans, no atomics in the output path) write the
 * indices above tau, then the lowest indices equal to it: flx_topk's set and order, deterministic.
 * Sparse attention: the heads' selections are OR-ed into one head mask per logical block and
 * compacted into the ascending union (one block), so a block several heads chose is read once; the
 * union is cut into as many slices as there are logical blocks at that level, up to the workspace's
 * max_splits, one thread block per (slice, group of 8 heads); inside, the four warps take the
 * slice's 16-token physical blocks in turn with the window kernel's online softmax
 * (attn_gpu_common.cuh), heads outside a block's mask seeing none of its keys, and the warps'
 * states merge into the slice's (o, lse). A warp first copies its block's K and V (64 D contiguous
 * bytes through the block table) into its own shared-memory stage, every lane issuing all of its
 * 16-byte loads before it stores any: over the bus a load costs a round trip of microseconds, and
 * reading the rows where the online softmax uses them (a K row per lane, 32 bytes a step; a V row a
 * step) paid one per step, which held a task to 6-10 GB/s on an H100. K rows are staged D + 8
 * elements apart so that the lanes' 16-byte row reads fall in distinct banks. The merge kernel
 * combines the slices (and the window partial) by LSE with flx_attn_merge's formula: o = sum_i
 * (w_i / W) o_i, w_i = e^(lse_i - m), parts at -inf dropped. The slice count depends only on the
 * level's block count, so the result is the same bits whatever the selection's order or the
 * machine's load.
 */
#include <cuda_runtime.h>

#include "attn_gpu_common.cuh"
#include "attn_gpu_internal.h"

namespace {

using namespace flx_ag;

constexpr uint32_t SCAN_THREADS = 256;   /* top-k: a thread per radix bin */
static_assert(SCAN_THREADS == 256, "top-k's digit search gives each of the 256 bins a thread");
constexpr uint32_t UNION_THREADS = 1024;
constexpr uint32_t MERGE_THREADS = 512;   /* merge: 16 warps over the parts */
constexpr uint32_t MERGE_COLS = 256;      /* merge: columns a pass (8 per lane) */
constexpr uint32_t MERGE_PARTS = 256;     /* merge: weights staged at a time */

/* ---- scoring ---- */

/* Each warp scores entries b = gwarp, gwarp + nwarps, ... for all G heads. Lane l holds elements
 * [256 j + 8 l, + 8) of the entry (j < 2: 2D <= 512); 8 consecutive elements lie on one side (min
 * or max) because D is a multiple of 16. */
__global__ void __launch_bounds__(128)
    score_kernel(flx_attn_gpu_view_t gv, int level, uint32_t G, const float *__restrict__ q, float *scores,
                 uint32_t ld)
{
    const uint32_t n = gv.meta_n[level], D = gv.head_dim, W = 2 * D;
    const uint16_t *meta = reinterpret_cast<const uint16_t *>(gv.meta[level]);
    const uint32_t lane = threadIdx.x & 31u, warps = blockDim.x >> 5;
    const uint32_t nwarps = gridDim.x * warps;
    for (uint32_t b = blockIdx.x * warps + (threadIdx.x >> 5); b < n; b += nwarps) {
        const uint16_t *e = meta + (size_t)b * W;
        float kv[2][8];
        uint32_t c0[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            c0[j] = 256u * (uint32_t)j + 8u * lane;
            if (c0[j] < W) {
                const uint4 w4 = *reinterpret_cast<const uint4 *>(e + c0[j]);
                const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    kv[j][2 * i] = bf16_lo(w[i]);
                    kv[j][2 * i + 1] = bf16_hi(w[i]);
                }
            }
        }
        for (uint32_t h = 0; h < G; h++) {
            const float *qh = q + (size_t)h * D;
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (c0[j] >= W) continue;
                const bool is_min = c0[j] < D;
                const uint32_t d0 = is_min ? c0[j] : c0[j] - D;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float x = qh[d0 + i];
                    acc = fmaf(is_min ? fminf(x, 0.0f) : fmaxf(x, 0.0f), kv[j][i], acc);
                }
            }
            acc = warp_sum(acc);
            if (lane == 0) scores[(size_t)h * ld + b] = acc;
        }
    }
}

/* ---- top-k ---- */

/* flx_topk's ranking as an unsigned order: NaN ranks as -inf, -0 equals +0. */
__device__ __forceinline__ uint32_t rank_key(float f)
{
    if (f != f) f = -INFINITY;
    if (f == 0.0f) f = 0.0f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive prefix of flag over the block (SCAN_THREADS threads) in thread order; *total_p gets the
 * block's count. wsum: shared (SCAN_THREADS / 32). Every thread calls it. */
__device__ __forceinline__ uint32_t block_scan(int flag, uint32_t *wsum, uint32_t *total_p)
{
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const uint32_t bal = __ballot_sync(FLX_AG_FULL, flag);
    const uint32_t pre = __popc(bal & ((1u << lane) - 1u));
    if (lane == 0) wsum[warp] = __popc(bal);
    __syncthreads();
    uint32_t off = 0, tot = 0;
    for (uint32_t w = 0; w < nw; w++) {
        off += w < warp ? wsum[w] : 0u;
        tot += wsum[w];
    }
    __syncthreads();   /* wsum is reused by the next call */
    *total_p = tot;
    return off + pre;
}

/* Inclusive prefix sum of v over the block (SCAN_THREADS threads) in thread order. wsum: shared
 * (SCAN_THREADS / 32). Every thread calls it. */
__device__ __forceinline__ uint32_t block_incl_scan(uint32_t v, uint32_t *wsum)
{
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
#pragma unroll
    for (uint32_t d = 1; d < 32; d <<= 1) {
        const uint32_t u = __shfl_up_sync(FLX_AG_FULL, v, d);
        if (lane >= d) v += u;
    }
    if (lane == 31) wsum[warp] = v;
    __syncthreads();
    for (uint32_t w = 0; w < warp; w++) v += wsum[w];
    __syncthreads();   /* wsum is reused by the next call */
    return v;
}

__global__ void __launch_bounds__(SCAN_THREADS)
    topk_kernel(const float *__restrict__ scores, uint32_t ld, uint32_t n, const uint32_t *__restrict__ k, uint32_t *idx)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t wsum[SCAN_THREADS / 32];
    __shared__ uint32_t sh_prefix, sh_rank;
    const uint32_t h = blockIdx.x, kk = k[h], lane = threadIdx.x & 31u;
    const float *s = scores + (size_t)h * ld;
    uint32_t *out = idx + (size_t)h * ld;
    if (kk == 0) return;
    if (kk >= n) {   /* every block, ascending (flx_topk's k == n case) */
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = i;
        return;
    }
    uint32_t prefix = 0, pmask = 0, rank = kk;   /* rank: which of the keys matching prefix, from the top */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (uint32_t i0 = 0; i0 < n; i0 += blockDim.x) {   /* the whole warp in every round (the match) */
            const uint32_t i = i0 + threadIdx.x;
            const uint32_t key = i < n ? rank_key(s[i]) : 0u;
            const bool in = i < n && (key & pmask) == prefix;
            const uint32_t dig = (key >> shift) & 255u;
            /* one shared atomic per distinct digit of the warp: the keys of a pass mostly share a
             * few digits (the exponent byte first), and same-address atomics serialise */
            const uint32_t peers = __match_any_sync(FLX_AG_FULL, in ? dig : 256u);
            if (in && lane == (uint32_t)(__ffs(peers) - 1)) atomicAdd(&hist[dig], (uint32_t)__popc(peers));
        }
        __syncthreads();
        /* the digit holding rank, every bin at once: thread t has bin 255 - t; the inclusive scan
         * in thread order counts the keys in that bin and above */
        const uint32_t c = hist[255u - threadIdx.x];
        const uint32_t incl = block_incl_scan(c, wsum);
        if (incl >= rank && incl - c < rank) {   /* exactly one bin: rank <= the keys under prefix */
            sh_prefix = prefix | ((255u - threadIdx.x) << shift);
            sh_rank = rank - (incl - c);
        }
        __syncthreads();
        prefix = sh_prefix;
        rank = sh_rank;
        pmask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t tau = prefix, n_gt = kk - rank;   /* rank: how many keys equal to tau to take */
    uint32_t base = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += blockDim.x) {   /* indices above tau, ascending */
        const uint32_t i = i0 + threadIdx.x;
        const int f = i < n && rank_key(s[i]) > tau;
        uint32_t tot;
        const uint32_t pos = base + block_scan(f, wsum, &tot);
        if (f) out[pos] = i;
        base += tot;
    }
    base = 0;
    for (uint32_t i0 = 0; i0 < n && base < rank; i0 += blockDim.x) {   /* then the lowest equal ones */
        const uint32_t i = i0 + threadIdx.x;
        const int f = i < n && rank_key(s[i]) == tau;
        uint32_t tot;
        const uint32_t pos = base + block_scan(f, wsum, &tot);
        if (f && pos < rank) out[n_gt + pos] = i;
        base += tot;
    }
}

/* ---- sparse attention ---- */

/* The union of the heads' selections: mask[b] bit h when head h selected b (sel NULL: every head
 * every block), list = the ascending blocks with a bit, count = {blocks, their host tokens}. One
 * block of UNION_THREADS threads. */
__global__ void __launch_bounds__(UNION_THREADS)
    union_kernel(uint32_t n, uint32_t G, const uint32_t *__restrict__ sel, uint32_t ld, const uint32_t *__restrict__ k,
                 uint32_t blk, uint32_t l_cpu, uint64_t *mask, uint32_t *list, uint32_t *count)
{
    __shared__ uint32_t wsum[UNION_THREADS / 32];
    __shared__ uint32_t tokens;
    const uint64_t all = G == 64 ? ~0ull : ((1ull << G) - 1ull);
    if (threadIdx.x == 0) tokens = 0;
    for (uint32_t b = threadIdx.x; b < n; b += blockDim.x) mask[b] = sel ? 0ull : all;
    __syncthreads();
    if (sel) {
        for (uint32_t h = 0; h < G; h++)
            for (uint32_t i = threadIdx.x; i < k[h]; i += blockDim.x) {
                const uint32_t b = sel[(size_t)h * ld + i];
                if (b < n) atomicOr(reinterpret_cast<unsigned long long *>(&mask[b]), 1ull << h);
            }
        __syncthreads();
    }
    uint32_t base = 0, mytok = 0;
    for (uint32_t b0 = 0; b0 < n; b0 += blockDim.x) {
        const uint32_t b = b0 + threadIdx.x;
        const int f = b < n && mask[b] != 0ull;
        uint32_t tot;
        const uint32_t pos = base + block_scan(f, wsum, &tot);
        if (f) {
            list[pos] = b;
            mytok += b * blk + blk <= l_cpu ? blk : l_cpu - b * blk;
        }
        base += tot;
    }
    atomicAdd(&tokens, mytok);   /* an integer sum: the same whatever the order */
    __syncthreads();
    if (threadIdx.x == 0) {
        count[0] = base;
        count[1] = tokens;
    }
}

/* A staged block: K rows KS_PAD elements apart, then V rows D apart (bf16 elements). */
constexpr uint32_t KS_PAD = 8;
constexpr uint32_t STAGE_LOADS = 16;   /* 16-byte loads a lane has in flight: a D = 128 block at once */

__host__ __device__ inline size_t stage_elems(uint32_t D) { return 16u * (D + KS_PAD) + 16u * D; }

/* Copies the physical block at src (K 16 x D, then V 16 x D, contiguous) into the warp's stage,
 * each lane holding STAGE_LOADS loads in flight before it stores. Called by the 32 lanes. */
__device__ __forceinline__ void stage_block(uint16_t *stage, const uint16_t *src, uint32_t D)
{
    const uint32_t lane = threadIdx.x & 31u, rw = D / 8u, n = 4u * D;   /* uint4 words: row width, total */
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
    for (uint32_t i0 = 0; i0 < n; i0 += 32u * STAGE_LOADS) {
        uint4 w[STAGE_LOADS];
#pragma unroll
        for (uint32_t j = 0; j < STAGE_LOADS; j++) {
            const uint32_t i = i0 + j * 32u + lane;
            if (i < n) w[j] = s4[i];
        }
#pragma unroll
        for (uint32_t j = 0; j < STAGE_LOADS; j++) {
            const uint32_t i = i0 + j * 32u + lane;
            if (i >= n) continue;
            const uint32_t row = i / rw, col = i - row * rw;   /* rows 0..15 K, 16..31 V */
            const size_t dst = row < 16u ? (size_t)row * (D + KS_PAD) + 8u * col
                                         : 16u * (size_t)(D + KS_PAD) + (size_t)(row - 16u) * D + 8u * col;
            *reinterpret_cast<uint4 *>(stage + dst) = w[j];
        }
    }
}

/* Slice s of the union, rows [h0, h0 + 8) of the group: (o, lse) into part (S, G, D), (S, G).
 * Shared memory: split_smem_floats(D) floats, then FLX_AG_WARPS stages of stage_elems(D). */
template <int ND>
__global__ void __launch_bounds__(FLX_AG_WARPS * 32)
    sparse_kernel(flx_attn_gpu_view_t gv, int level, uint32_t G, const float *__restrict__ q,
                  const uint64_t *__restrict__ mask, const uint32_t *__restrict__ list,
                  const uint32_t *__restrict__ count, uint32_t S, uint32_t row_groups, float scale, float *part_o,
                  float *part_lse)
{
    extern __shared__ __align__(16) float smem[];
    const uint32_t D = gv.head_dim, s = blockIdx.x / row_groups, h0 = (blockIdx.x % row_groups) * FLX_AG_RW;
    const uint32_t nr = G - h0 < FLX_AG_RW ? G - h0 : FLX_AG_RW;
    const uint32_t warp = threadIdx.x >> 5;
    uint16_t *stage = reinterpret_cast<uint16_t *>(smem + split_smem_floats(D)) + (size_t)warp * stage_elems(D);
    load_rows_scaled(smem, q + (size_t)h0 * D, nr, D, scale);

    const uint32_t n_list = count[0], per = (n_list + S - 1) / S;
    const uint32_t u0 = s * per < n_list ? s * per : n_list, u1 = u0 + per < n_list ? u0 + per : n_list;
    const uint32_t ppb = 1u << level;
    rows_t<ND> st;
    rows_init(st);
    uint32_t vis[FLX_AG_RW], j = 0;
    for (uint32_t u = u0; u < u1; u++) {
        const uint32_t b = list[u];
        const uint64_t mb = mask[b] >> h0;
        const uint32_t p1 = (b + 1) * ppb < gv.n_blocks ? (b + 1) * ppb : gv.n_blocks;
        for (uint32_t pb = b * ppb; pb < p1; pb++, j++) {
            if ((j & (FLX_AG_WARPS - 1)) != warp) continue;   /* the warps take the physical blocks in turn */
            const uint32_t ntok = gv.l_cpu - pb * 16u < 16u ? gv.l_cpu - pb * 16u : 16u;
            uint32_t any = 0;
#pragma unroll
            for (int r = 0; r < FLX_AG_RW; r++) {
                vis[r] = (uint32_t)r < nr && ((mb >> r) & 1ull) ? ntok : 0u;
                any |= vis[r];
            }
            if (!any) continue;
            stage_block(stage, reinterpret_cast<const uint16_t *>(gv.pool + (size_t)gv.table[pb] * gv.block_bytes), D);
            __syncwarp();
            tile_update<ND>(smem, D, stage, D + KS_PAD, stage + 16u * (D + KS_PAD), D, ntok, vis, st);
            __syncwarp();   /* the stage is overwritten by the warp's next block */
        }
    }
    warps_merge_store<ND>(st, smem, nr, D, part_o + ((size_t)s * G + h0) * D, part_lse + (size_t)s * G + h0);
}

/* ---- merge ---- */

/* Block-wide max (MAX) or sum over MERGE_THREADS threads (red: shared, one slot per warp); every
 * thread gets the result. The warps' values combine in warp order: the same bits on every run. */
template <bool MAX>
__device__ __forceinline__ float block_reduce(float x, float *red)
{
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = MAX ? warp_max(x) : warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float v = MAX ? -INFINITY : 0.0f;
    for (uint32_t w = 0; w < nw; w++) v = MAX ? fmaxf(v, red[w]) : v + red[w];
    __syncthreads();   /* red is reused by the next call */
    return v;
}

/* A partial's unnormalised weight e^(l - m) against the maximum m; 0 for a part at -inf (and when
 * every part is). */
__device__ __forceinline__ float lse_weight(float l, float m)
{
    return l == -INFINITY || m == -INFINITY ? 0.0f : expf(l - m);
}

/* Row r (one block per row): the LSE merge of n_parts partials (o at po + r D + i po_stride, lse at
 * pl + r + i pl_stride) and, when xo is not NULL, (xo + r D, xl[r]), written to o + r D, lse[r].
 * The block first finds m = max lse and W = sum e^(lse_i - m), then stages the weights c_i =
 * e^(lse_i - m) / W in shared memory (0 for a part at -inf, whose o is never used), so that summing
 * a part is only loads and FMAs: warp w takes parts w, w + warps, ..., a lane a column per slot,
 * MERGE_COLS columns a pass, and the warps' sums add up in warp order (the same bits on every run).
 * The earlier form, a thread per column walking all parts with the part's lse, its exponential and
 * then its o in one dependent chain, took 69 us for 256 parts of 4 rows on an H100 (15.5 now). o
 * may alias the first part or the extra one: a pass reads all of its columns before it writes any;
 * lse is written after the last read. */
__global__ void __launch_bounds__(MERGE_THREADS)
    merge_kernel(uint32_t D, uint32_t n_parts, const float *po, size_t po_stride, const float *pl, size_t pl_stride,
                 const float *xo, const float *xl, float *o, float *lse)
{
    __shared__ float red[MERGE_THREADS / 32];
    __shared__ float cw[MERGE_PARTS];                       /* weights of parts [p0, p0 + MERGE_PARTS) */
    __shared__ float sums[MERGE_THREADS / 32][MERGE_COLS];  /* each warp's column sums */
    const uint32_t r = blockIdx.x, t = threadIdx.x, lane = t & 31u, warp = t >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY;
    for (uint32_t i = t; i < n_parts; i += blockDim.x) m = fmaxf(m, pl[r + i * pl_stride]);
    const float lx = xo ? xl[r] : -INFINITY;
    m = block_reduce<true>(fmaxf(m, lx), red);
    float w = 0.0f;
    for (uint32_t i = t; i < n_parts; i += blockDim.x) w += lse_weight(pl[r + i * pl_stride], m);
    if (t == 0) w += lse_weight(lx, m);
    w = block_reduce<false>(w, red);
    const float inv = m == -INFINITY ? 0.0f : 1.0f / w;
    const float cx = lse_weight(lx, m) * inv;
    for (uint32_t c0 = 0; c0 < D; c0 += MERGE_COLS) {
        float acc[MERGE_COLS / 32];
#pragma unroll
        for (uint32_t j = 0; j < MERGE_COLS / 32; j++) acc[j] = 0.0f;
        for (uint32_t p0 = 0; p0 < n_parts; p0 += MERGE_PARTS) {
            const uint32_t np = n_parts - p0 < MERGE_PARTS ? n_parts - p0 : MERGE_PARTS;
            __syncthreads();   /* the last chunk's weights are read */
            for (uint32_t i = t; i < np; i += blockDim.x) cw[i] = lse_weight(pl[r + (p0 + i) * pl_stride], m) * inv;
            __syncthreads();
#pragma unroll 4
            for (uint32_t i = warp; i < np; i += nw) {
                const float c = cw[i];
                const float *pi = po + (size_t)r * D + (size_t)(p0 + i) * po_stride;
#pragma unroll
                for (uint32_t j = 0; j < MERGE_COLS / 32; j++) {
                    const uint32_t d = c0 + lane + 32u * j;
                    const float x = d < D ? pi[d] : 0.0f;
                    acc[j] = c == 0.0f ? acc[j] : fmaf(c, x, acc[j]);   /* a dropped part's o may be anything */
                }
            }
        }
        if (warp == 0 && cx != 0.0f) {
#pragma unroll
            for (uint32_t j = 0; j < MERGE_COLS / 32; j++) {
                const uint32_t d = c0 + lane + 32u * j;
                if (d < D) acc[j] = fmaf(cx, xo[(size_t)r * D + d], acc[j]);
            }
        }
#pragma unroll
        for (uint32_t j = 0; j < MERGE_COLS / 32; j++) sums[warp][lane + 32u * j] = acc[j];
        __syncthreads();
        for (uint32_t j = t; j < MERGE_COLS && c0 + j < D; j += blockDim.x) {
            float s = 0.0f;
            for (uint32_t v = 0; v < nw; v++) s += sums[v][j];
            o[(size_t)r * D + c0 + j] = s;
        }
        __syncthreads();   /* sums is rewritten by the next chunk */
    }
    if (t == 0) lse[r] = m == -INFINITY ? -INFINITY : m + logf(w);
}

size_t sparse_smem_bytes(uint32_t D)
{
    return split_smem_floats(D) * sizeof(float) + (size_t)FLX_AG_WARPS * stage_elems(D) * sizeof(uint16_t);
}

}  // namespace

extern "C" flx_status_t flx_attn_score_gpu_launch(const flx_attn_gpu_view_t *gv, int level, uint32_t G, const float *q,
                                                  float *scores, uint32_t ld, flx_cuda_stream_t stream)
{
    const uint32_t n = gv->meta_n[level];
    if (n == 0) return FLX_OK;
    const uint32_t warps = 4, blocks = (n + warps - 1) / warps < 4096u ? (n + warps - 1) / warps : 4096u;
    score_kernel<<<dim3(blocks), dim3(warps * 32), 0, stream>>>(*gv, level, G, q, scores, ld);
    return FLX_CUDA_CALL(cudaGetLastError());
}

extern "C" flx_status_t flx_topk_gpu_launch(const float *scores, uint32_t ld, uint32_t n, uint32_t G, const uint32_t *k,
                                            uint32_t *idx, flx_cuda_stream_t stream)
{
    topk_kernel<<<dim3(G), dim3(SCAN_THREADS), 0, stream>>>(scores, ld, n, k, idx);
    return FLX_CUDA_CALL(cudaGetLastError());
}

extern "C" flx_status_t flx_attn_merge_gpu_launch(uint32_t rows, uint32_t D, uint32_t n_parts, const float *po,
                                                  size_t po_stride, const float *pl, size_t pl_stride, const float *xo,
                                                  const float *xl, float *o, float *lse, flx_cuda_stream_t stream)
{
    merge_kernel<<<dim3(rows), dim3(MERGE_THREADS), 0, stream>>>(D, n_parts, po, po_stride, pl, pl_stride, xo, xl, o,
                                                                  lse);
    return FLX_CUDA_CALL(cudaGetLastError());
}

extern "C" flx_status_t flx_attn_sparse_gpu_launch(const flx_attn_host_gpu_ws_t *ws, const flx_attn_gpu_view_t *gv,
                                                   int level, const float *q, const uint32_t *sel, uint32_t ld,
                                                   const uint32_t *k, const float *o_win, const float *lse_win,
                                                   float *o, float *lse, flx_cuda_stream_t stream)
{
    const uint32_t G = ws->shape.group, D = gv->head_dim, n = gv->meta_n[level], blk = 16u << level;
    union_kernel<<<dim3(1), dim3(UNION_THREADS), 0, stream>>>(n, G, sel, ld, k, blk, gv->l_cpu, ws->mask, ws->list,
                                                               ws->count);
    flx_status_t st = FLX_CUDA_CALL(cudaGetLastError());
    if (st != FLX_OK) return st;
    const uint32_t S = n == 0 ? 1u : n < ws->max_splits ? n : ws->max_splits;
    const uint32_t row_groups = (G + FLX_AG_RW - 1) / FLX_AG_RW;
    const dim3 grid(S * row_groups), block(FLX_AG_WARPS * 32);
    const size_t smem = sparse_smem_bytes(D);
    const float scale = 1.0f / sqrtf((float)D);
#define FLX_SPARSE_LAUNCH(ND)                                                                                      \
    do {                                                                                                         \
        if ((st = smem_opt_in(sparse_kernel<ND>, smem)) != FLX_OK) return st; \
        sparse_kernel<ND><<<grid, block, smem, stream>>>(*gv, level, G, q, ws->mask, ws->list, ws->count, S,       \
                                                         row_groups, scale, ws->part_o, ws->part_lse);           \
    } while (0)
    FLX_AG_DISPATCH_ND(D, FLX_SPARSE_LAUNCH)
#undef FLX_SPARSE_LAUNCH
    if ((st = FLX_CUDA_CALL(cudaGetLastError())) != FLX_OK) return st;
    return flx_attn_merge_gpu_launch(G, D, S, ws->part_o, (size_t)G * D, ws->part_lse, G, o_win, lse_win, o, lse,
                                     stream);
}
