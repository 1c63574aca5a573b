/*
 * attn_window.cu - window attention of a decode layer on the device (flx/attn_gpu.h).
 *
 * CPU REFERENCE: flx_attn_window_ref (fluxion/src/attn_ref.c: per head, two-pass softmax in double
 * over the window rows). tests/fluxion/test_attn_gpu.c holds this kernel to it with
 * atol + rtol * |ref| on o and lse, NaN/Inf never passing, the worst element reported.
 *
 * DESIGN
 * One block (4 warps) per (item, group of up to 8 query heads): the rows are few (G per item) and
 * the keys many, so the warps split the keys, not the rows. Warp w takes key tiles w, w + 4, ...
 * of the window straight from global memory (each lane reads whole 32-byte sectors of its key row;
 * a V row is read by the whole warp, coalesced), runs the shared online-softmax step
 * (attn_gpu_common.cuh) for all the block's heads, and the four partial states are merged through
 * shared memory like any LSE partials (warps_merge_store). Only the final o and lse are written.
 *
 * Shared memory: Q (8, D) + per-warp states (4, 8, D + 2) fp32 = 160 D + 256 bytes, 40 KiB at
 * D = 256: under the 48 KiB every device gives without opting in.
 */
#include <cuda_runtime.h>

#include "attn_gpu_common.cuh"
#include "attn_gpu_internal.h"

namespace {

using namespace flx_ag;

template <int ND>
__global__ void __launch_bounds__(FLX_AG_WARPS * 32)
    window_kernel(const flx_attn_gpu_item_t *__restrict__ items, uint32_t G, uint32_t D, uint32_t row_groups,
                  float scale)
{
    extern __shared__ __align__(16) float smem[];
    float *Qs = smem;                                    /* (RW, D), then the warps' states */
    const flx_attn_gpu_item_t it = items[blockIdx.x / row_groups];
    const uint32_t h0 = (blockIdx.x % row_groups) * FLX_AG_RW;
    const uint32_t nr = G - h0 < FLX_AG_RW ? G - h0 : FLX_AG_RW;
    const uint32_t warp = threadIdx.x >> 5;

    load_rows_scaled(Qs, it.q + (size_t)h0 * D, nr, D, scale);

    rows_t<ND> st;
    rows_init(st);
    uint32_t vis[FLX_AG_RW];
    for (uint32_t k0 = warp * FLX_AG_BK; k0 < it.n_win; k0 += FLX_AG_WARPS * FLX_AG_BK) {
        const uint32_t nk = it.n_win - k0 < FLX_AG_BK ? it.n_win - k0 : FLX_AG_BK;
#pragma unroll
        for (int r = 0; r < FLX_AG_RW; r++) vis[r] = (uint32_t)r < nr ? nk : 0u;
        const uint16_t *kt = reinterpret_cast<const uint16_t *>(it.k) + (size_t)k0 * D;
        const uint16_t *vt = reinterpret_cast<const uint16_t *>(it.v) + (size_t)k0 * D;
        tile_update<ND>(Qs, D, kt, D, vt, D, nk, vis, st);
    }

    warps_merge_store<ND>(st, smem, nr, D, it.o + (size_t)h0 * D, it.lse + h0);
}

size_t window_smem_bytes(uint32_t D)
{
    return split_smem_floats(D) * sizeof(float);
}

}  // namespace

extern "C" flx_status_t flx_attn_window_gpu_launch(const flx_attn_gpu_ws_t *ws, uint32_t n_items,
                                                   flx_cuda_stream_t stream)
{
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    flx_status_t st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->items_dev, ws->items_host, (size_t)n_items * sizeof *ws->items_host,
                                                    cudaMemcpyHostToDevice, stream));
    if (st != FLX_OK) return st;
    const uint32_t row_groups = (G + FLX_AG_RW - 1) / FLX_AG_RW;
    const dim3 grid(n_items * row_groups), block(FLX_AG_WARPS * 32);
    const size_t smem = window_smem_bytes(D);
    const float scale = 1.0f / sqrtf((float)D);
#define FLX_WINDOW_LAUNCH(ND)                                                                                    \
    do {                                                                                                       \
        if ((st = smem_opt_in(window_kernel<ND>, smem)) != FLX_OK) return st; \
        window_kernel<ND><<<grid, block, smem, stream>>>(ws->items_dev, G, D, row_groups, scale);             \
    } while (0)
    FLX_AG_DISPATCH_ND(D, FLX_WINDOW_LAUNCH)
#undef FLX_WINDOW_LAUNCH
    return FLX_CUDA_CALL(cudaGetLastError());
}
