/*
 * attn_gpu_common.cuh - the warp-level online-softmax step shared by the window kernel
 * (attn_window.cu) and the causal prefill kernel (attn_causal.cu).
 *
 * DESIGN
 * A warp owns RW query rows (fp32, pre-scaled by 1/sqrt(D), in shared memory) and walks key tiles
 * of 32 keys, lane j scoring key j of the tile against all RW rows (16 dims at a time from one
 * 32-byte read of the key row, so each K byte is read once per warp and tile). The rows' running
 * max m, running sum l and accumulators acc (lane owns dims lane, lane + 32, ...) live in
 * registers. Per tile: the max over the tile's visible keys, rescale by exp(m_old - m_new), the
 * tile's probabilities p, then P.V with p broadcast by shuffles, each V row read once for all rows.
 * A row that sees no key of a tile is left untouched (its m, l, acc keep their values). Finishing
 * (o = acc / l, lse = m + log l) is the caller's: the window and sparse kernels first merge the
 * warps that split their keys (warps_merge_store).
 *
 * K and V may live in shared memory (prefill: a tile staged for 4 warps) or global memory (window:
 * each warp streams its own tiles): generic pointers, row strides in elements. Key rows must be
 * 16-byte aligned (uint4 loads).
 */
#ifndef FLX_ATTN_GPU_COMMON_CUH
#define FLX_ATTN_GPU_COMMON_CUH

#include <stdint.h>

#include "flx/cuda_rt.h"

#define FLX_AG_RW 8        /* query rows per warp */
#define FLX_AG_WARPS 4     /* warps per block */
#define FLX_AG_BK 32       /* keys per tile: one per lane */
#define FLX_AG_FULL 0xffffffffu

namespace flx_ag {

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_at(const uint16_t *p) { return __uint_as_float((uint32_t)*p << 16); }

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) x = fmaxf(x, __shfl_xor_sync(FLX_AG_FULL, x, s));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) x += __shfl_xor_sync(FLX_AG_FULL, x, s);
    return x;
}

/* Online-softmax state of a warp's RW rows; ND = ceil(D / 32) accumulator slots per lane. */
template <int ND>
struct rows_t {
    float m[FLX_AG_RW];
    float l[FLX_AG_RW];
    float acc[FLX_AG_RW][ND];
};

template <int ND>
__device__ __forceinline__ void rows_init(rows_t<ND> &st)
{
#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) {
        st.m[r] = -INFINITY;
        st.l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < ND; i++) st.acc[r][i] = 0.0f;
    }
}

/*
 * One tile for the warp's rows. Qs: (RW, D) fp32 rows, pre-scaled. Key j (< nk <= 32) at
 * kt + j * k_stride, its value row at vt + j * v_stride (bf16 elements). Row r sees keys
 * j < vis[r] (vis[r] <= nk; 0 = none). Must be called by all 32 lanes with identical nk, vis.
 */
template <int ND>
__device__ __forceinline__ void tile_update(const float *__restrict__ Qs, uint32_t D, const uint16_t *kt,
                                            uint32_t k_stride, const uint16_t *vt, uint32_t v_stride, uint32_t nk,
                                            const uint32_t (&vis)[FLX_AG_RW], rows_t<ND> &st)
{
    const uint32_t lane = threadIdx.x & 31u;
    float s[FLX_AG_RW];
#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) s[r] = 0.0f;
    if (lane < nk) {
        const uint16_t *kr = kt + (size_t)lane * k_stride;
        for (uint32_t d0 = 0; d0 < D; d0 += 16) {
            const uint4 a = *reinterpret_cast<const uint4 *>(kr + d0);
            const uint4 b = *reinterpret_cast<const uint4 *>(kr + d0 + 8);
            const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float kf[16];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                kf[2 * i] = bf16_lo(w[i]);       /* the lower address holds the lower half */
                kf[2 * i + 1] = bf16_hi(w[i]);
            }
#pragma unroll
            for (int r = 0; r < FLX_AG_RW; r++) {
                const float4 *q4 = reinterpret_cast<const float4 *>(Qs + (size_t)r * D + d0);
                float acc = s[r];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 qv = q4[i];
                    acc = fmaf(qv.x, kf[4 * i], acc);
                    acc = fmaf(qv.y, kf[4 * i + 1], acc);
                    acc = fmaf(qv.z, kf[4 * i + 2], acc);
                    acc = fmaf(qv.w, kf[4 * i + 3], acc);
                }
                s[r] = acc;
            }
        }
    }
    /* Softmax update per row; p[r] is this lane's probability of key `lane` for row r. */
    float p[FLX_AG_RW];
    uint32_t nv = 0;   /* keys any row sees: the P.V loop bound */
#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) {
        p[r] = 0.0f;
        if (vis[r] == 0) continue;   /* warp-uniform */
        nv = vis[r] > nv ? vis[r] : nv;
        const bool ok = lane < vis[r];
        const float sc = ok ? s[r] : -INFINITY;
        const float mx = warp_max(sc);
        const float mn = fmaxf(st.m[r], mx);
        const float alpha = expf(st.m[r] - mn);   /* 0 on the row's first tile (m = -inf) */
        const float pr = ok ? expf(sc - mn) : 0.0f;
        st.l[r] = st.l[r] * alpha + warp_sum(pr);
        st.m[r] = mn;
#pragma unroll
        for (int i = 0; i < ND; i++) st.acc[r][i] *= alpha;
        p[r] = pr;
    }
    for (uint32_t j = 0; j < nv; j++) {
        const uint16_t *vr = vt + (size_t)j * v_stride;
        float vv[ND];
#pragma unroll
        for (int i = 0; i < ND; i++) {
            const uint32_t d = lane + 32u * (uint32_t)i;
            vv[i] = d < D ? bf16_at(vr + d) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < FLX_AG_RW; r++) {
            const float pj = __shfl_sync(FLX_AG_FULL, p[r], (int)j);
#pragma unroll
            for (int i = 0; i < ND; i++) st.acc[r][i] = fmaf(pj, vv[i], st.acc[r][i]);
        }
    }
}

/* Qs (RW, D) = the nr rows at q (row stride D) times scale, zero past nr; then a block barrier. */
__device__ __forceinline__ void load_rows_scaled(float *Qs, const float *q, uint32_t nr, uint32_t D, float scale)
{
    for (uint32_t i = threadIdx.x; i < FLX_AG_RW * D; i += blockDim.x) {
        const uint32_t r = i / D;
        Qs[i] = r < nr ? q[i] * scale : 0.0f;
    }
    __syncthreads();
}

/* Shared memory of a block whose FLX_AG_WARPS warps split the keys of FLX_AG_RW rows: the rows'
 * scaled queries Qs (RW, D), then each warp's m, l (WARPS, RW) and acc (WARPS, RW, D), in floats. */
__host__ __device__ inline size_t split_smem_floats(uint32_t D)
{
    return (size_t)FLX_AG_RW * D + 2u * FLX_AG_WARPS * FLX_AG_RW + (size_t)FLX_AG_WARPS * FLX_AG_RW * D;
}

/*
 * The block's warps each hold a state of the same nr rows over different keys: merges them through
 * shared memory (smem as split_smem_floats lays it out) like any LSE partials, m = max m_w,
 * l = sum l_w e^(m_w - m), o = sum acc_w e^(m_w - m) / l, and writes row r's o to o + r * D and its
 * lse to lse[r]; a row no warp saw gets o = 0, lse = -inf. Called by every thread of the block.
 */
template <int ND>
__device__ __forceinline__ void warps_merge_store(const rows_t<ND> &st, float *smem, uint32_t nr, uint32_t D,
                                                  float *o, float *lse)
{
    float *Ms = smem + (size_t)FLX_AG_RW * D;             /* (WARPS, RW) */
    float *Ls = Ms + FLX_AG_WARPS * FLX_AG_RW;            /* (WARPS, RW) */
    float *Os = Ls + FLX_AG_WARPS * FLX_AG_RW;            /* (WARPS, RW, D) */
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) {
        const uint32_t w = warp * FLX_AG_RW + (uint32_t)r;
        if (lane == 0) {
            Ms[w] = st.m[r];
            Ls[w] = st.l[r];
        }
#pragma unroll
        for (int i = 0; i < ND; i++) {
            const uint32_t d = lane + 32u * (uint32_t)i;
            if (d < D) Os[(size_t)w * D + d] = st.acc[r][i];
        }
    }
    __syncthreads();
    for (uint32_t r = warp; r < nr; r += FLX_AG_WARPS) {
        float m = -INFINITY;
        for (uint32_t w = 0; w < FLX_AG_WARPS; w++) m = fmaxf(m, Ms[w * FLX_AG_RW + r]);
        float *orow = o + (size_t)r * D;
        if (m == -INFINITY) {   /* no key */
            for (uint32_t d = lane; d < D; d += 32) orow[d] = 0.0f;
            if (lane == 0) lse[r] = -INFINITY;
            continue;
        }
        float c[FLX_AG_WARPS], l = 0.0f;
#pragma unroll
        for (uint32_t w = 0; w < FLX_AG_WARPS; w++) {
            const float mw = Ms[w * FLX_AG_RW + r];
            c[w] = mw == -INFINITY ? 0.0f : expf(mw - m);
            l += c[w] * Ls[w * FLX_AG_RW + r];
        }
        const float inv = 1.0f / l;
        for (uint32_t d = lane; d < D; d += 32) {
            float acc = 0.0f;
#pragma unroll
            for (uint32_t w = 0; w < FLX_AG_WARPS; w++) acc = fmaf(c[w], Os[(size_t)(w * FLX_AG_RW + r) * D + d], acc);
            orow[d] = acc * inv;
        }
        if (lane == 0) lse[r] = m + logf(l);
    }
}

/* Lets kernel use smem bytes of dynamic shared memory: above the 48 KiB every device gives without
 * asking, the kernel must opt in (once per kernel would do; the call is cheap and keeps launchers
 * stateless). */
template <class K>
inline flx_status_t smem_opt_in(K *kernel, size_t smem)
{
    if (smem <= 48u * 1024u) return FLX_OK;
    return FLX_CUDA_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

/* Dispatches a kernel template on ND = ceil(D / 32) (D <= 256). */
#define FLX_AG_DISPATCH_ND(D, MACRO) \
    switch (((D) + 31u) / 32u) {     \
    case 1: MACRO(1); break;         \
    case 2: MACRO(2); break;         \
    case 3: MACRO(3); break;         \
    case 4: MACRO(4); break;         \
    case 5: MACRO(5); break;         \
    case 6: MACRO(6); break;         \
    case 7: MACRO(7); break;         \
    default: MACRO(8); break;        \
    }

}  // namespace flx_ag

#endif
