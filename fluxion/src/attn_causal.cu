/*
 * attn_causal.cu - causal attention over a prompt on the device (flx/attn_gpu.h), the attention of
 * the GPU prefill (flx/forward_gpu.h).
 *
 * CPU REFERENCE: the prefill attention of decode/src/forward.c (blocked online softmax over the
 * same bf16 K, V); tests/fluxion/test_attn_gpu.c holds this kernel to a double-precision dense
 * causal softmax written in the test (atol + rtol * |ref|, NaN/Inf never pass, worst element
 * reported), and tests/decode/test_forward_gpu.c holds the whole GPU prefill to the CPU one.
 *
 * DESIGN
 * The rows of one kv head g are the (token, query head) pairs of its group, flattened token-major
 * (row f = token t0 + f / G, head g * G + f % G), so a block of 4 warps x 8 rows serves up to 32
 * rows of one group whatever G is, and every K/V tile it stages in shared memory is used by all 32
 * rows. A block walks key tiles 0 .. its last row's token; each row masks keys past its own token
 * (vis), so the diagonal tiles need no special case. Blocks are issued in reverse order: the ones
 * holding late tokens (the most keys) start first, which evens out the tail of a launch.
 *
 * Shared memory: Q (32, D) fp32 + K tile (32, D + 8) bf16 (the 16-byte pad makes the lanes'
 * 16-byte row reads hit distinct banks) + V tile (32, D) bf16 = 256 D + 512 bytes: 64.5 KiB at
 * D = 256, so the launcher opts in to more than 48 KiB when needed (sm_80 and sm_90 allow it).
 */
#include <cuda_runtime.h>

#include "attn_gpu_common.cuh"
#include "attn_gpu_internal.h"

namespace {

using namespace flx_ag;

#define FLX_AC_ROWS (FLX_AG_WARPS * FLX_AG_RW)   /* 32 rows per block */

template <int ND>
__global__ void __launch_bounds__(FLX_AG_WARPS * 32)
    causal_kernel(const float *__restrict__ q, size_t q_stride, const uint16_t *__restrict__ k,
                  const uint16_t *__restrict__ v, uint32_t kv_stride, uint32_t t0, uint32_t nq, uint32_t G,
                  uint32_t D, float scale, float *__restrict__ o, size_t o_stride)
{
    extern __shared__ __align__(16) float smem[];
    const uint32_t KP = D + 8;                                             /* K tile row stride */
    float *Qs = smem;                                                      /* (32, D) */
    uint16_t *Ks = reinterpret_cast<uint16_t *>(Qs + (size_t)FLX_AC_ROWS * D);   /* (32, D + 8) */
    uint16_t *Vs = Ks + (size_t)FLX_AG_BK * KP;                            /* (32, D) */
    const uint32_t g = blockIdx.y;
    const uint32_t n_rows = nq * G;
    const uint32_t row0 = (gridDim.x - 1 - blockIdx.x) * FLX_AC_ROWS;    /* late tokens first */
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;

    for (uint32_t i = threadIdx.x; i < FLX_AC_ROWS * D; i += blockDim.x) {
        const uint32_t r = i / D, d = i % D, f = row0 + r;
        float x = 0.0f;
        if (f < n_rows) x = q[(size_t)(t0 + f / G) * q_stride + (size_t)(g * G + f % G) * D + d] * scale;
        Qs[i] = x;
    }
    const uint32_t f_last = row0 + FLX_AC_ROWS - 1 < n_rows ? row0 + FLX_AC_ROWS - 1 : n_rows - 1;
    const uint32_t n_keys = t0 + f_last / G + 1;
    uint32_t tok[FLX_AG_RW];   /* token of each of this warp's rows; UINT32_MAX for rows past n_rows */
#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) {
        const uint32_t f = row0 + warp * FLX_AG_RW + (uint32_t)r;
        tok[r] = f < n_rows ? t0 + f / G : UINT32_MAX;
    }

    rows_t<ND> st;
    rows_init(st);
    uint32_t vis[FLX_AG_RW];
    const uint16_t *kg = k + (size_t)g * kv_stride * D, *vg = v + (size_t)g * kv_stride * D;
    const uint32_t c16 = D / 8;   /* 16-byte chunks per row */
    for (uint32_t k0 = 0; k0 < n_keys; k0 += FLX_AG_BK) {
        const uint32_t nk = n_keys - k0 < FLX_AG_BK ? n_keys - k0 : FLX_AG_BK;
        __syncthreads();   /* Q written (first tile), previous tile consumed */
        for (uint32_t i = threadIdx.x; i < nk * c16; i += blockDim.x) {
            const uint32_t j = i / c16, c = i % c16;
            *reinterpret_cast<uint4 *>(Ks + (size_t)j * KP + c * 8) =
                *reinterpret_cast<const uint4 *>(kg + (size_t)(k0 + j) * D + c * 8);
            *reinterpret_cast<uint4 *>(Vs + (size_t)j * D + c * 8) =
                *reinterpret_cast<const uint4 *>(vg + (size_t)(k0 + j) * D + c * 8);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < FLX_AG_RW; r++) {
            const uint32_t t = tok[r];
            vis[r] = (t == UINT32_MAX || t < k0) ? 0u : (t - k0 + 1 < nk ? t - k0 + 1 : nk);
        }
        tile_update<ND>(Qs + (size_t)warp * FLX_AG_RW * D, D, Ks, KP, Vs, D, nk, vis, st);
    }

#pragma unroll
    for (int r = 0; r < FLX_AG_RW; r++) {
        if (tok[r] == UINT32_MAX) continue;
        const uint32_t f = row0 + warp * FLX_AG_RW + (uint32_t)r;
        float *orow = o + (size_t)(tok[r] - t0) * o_stride + (size_t)(g * G + f % G) * D;
        const float inv = 1.0f / st.l[r];   /* l >= 1: every row sees its own key */
#pragma unroll
        for (int i = 0; i < ND; i++) {
            const uint32_t d = lane + 32u * (uint32_t)i;
            if (d < D) orow[d] = st.acc[r][i] * inv;
        }
    }
}

size_t causal_smem_bytes(uint32_t D)
{
    return (size_t)FLX_AC_ROWS * D * sizeof(float) + (size_t)FLX_AG_BK * (D + 8) * sizeof(uint16_t) +
           (size_t)FLX_AG_BK * D * sizeof(uint16_t);
}

}  // namespace

extern "C" flx_status_t flx_attn_causal_gpu_launch(const flx_attn_causal_gpu_args_t *a, flx_cuda_stream_t stream)
{
    const uint32_t D = a->head_dim, G = a->n_heads / a->n_kv_heads;
    const uint32_t n_blocks = (uint32_t)(((uint64_t)a->nq * G + FLX_AC_ROWS - 1) / FLX_AC_ROWS);
    const dim3 grid(n_blocks, a->n_kv_heads), block(FLX_AG_WARPS * 32);
    const size_t smem = causal_smem_bytes(D);
    const float scale = 1.0f / sqrtf((float)D);
    const uint16_t *k = reinterpret_cast<const uint16_t *>(a->k), *v = reinterpret_cast<const uint16_t *>(a->v);
    flx_status_t st = FLX_OK;
#define FLX_CAUSAL_LAUNCH(ND)                                                                                   \
    do {                                                                                                      \
        if ((st = smem_opt_in(causal_kernel<ND>, smem)) != FLX_OK) return st; \
        causal_kernel<ND><<<grid, block, smem, stream>>>(a->q, a->q_stride, k, v, a->kv_stride, a->t0, a->nq, G, D, \
                                                         scale, a->o, a->o_stride);                           \
    } while (0)
    FLX_AG_DISPATCH_ND(D, FLX_CAUSAL_LAUNCH)
#undef FLX_CAUSAL_LAUNCH
    return FLX_CUDA_CALL(cudaGetLastError());
}
