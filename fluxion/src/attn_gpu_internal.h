/* Internal: the CUDA launchers behind flx/attn_gpu.h (attn_window.cu, attn_causal.cu). attn_gpu.c
 * validates every argument and checks for a device before calling them; they only queue work. */
#ifndef FLX_ATTN_GPU_INTERNAL_H
#define FLX_ATTN_GPU_INTERNAL_H

#ifdef __cplusplus
/* The C headers name a struct and its function alike (flx_kv_head_view): legal C, a C++ -Wshadow
 * warning in the .cu files that include them. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#include "flx/attn_gpu.h"
#ifdef __cplusplus
#pragma GCC diagnostic pop
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Queues the upload of ws->items_host[0, n_items) to ws->items_dev and the window kernel. */
flx_status_t flx_attn_window_gpu_launch(const flx_attn_gpu_ws_t *ws, uint32_t n_items, flx_cuda_stream_t stream);
/* Queues the causal kernel. */
flx_status_t flx_attn_causal_gpu_launch(const flx_attn_causal_gpu_args_t *args, flx_cuda_stream_t stream);

/* attn_host.cu: the host part's kernels (attn_gpu.c checks their arguments). */
flx_status_t flx_attn_score_gpu_launch(const flx_attn_gpu_view_t *gv, int level, uint32_t G, const float *q,
                                       float *scores, uint32_t ld, flx_cuda_stream_t stream);
flx_status_t flx_topk_gpu_launch(const float *scores, uint32_t ld, uint32_t n, uint32_t G, const uint32_t *k,
                                 uint32_t *idx, flx_cuda_stream_t stream);
/* rows partials: n_parts of them at po + i * po_stride (floats) / pl + i * pl_stride, and the extra
 * partial (xo, xl) when xo is not NULL. */
flx_status_t flx_attn_merge_gpu_launch(uint32_t rows, uint32_t D, uint32_t n_parts, const float *po, size_t po_stride,
                                       const float *pl, size_t pl_stride, const float *xo, const float *xl, float *o,
                                       float *lse, flx_cuda_stream_t stream);
/* Union (sel NULL: every block for every head), slices, then the merge of the slices and, when
 * o_win is not NULL, the window partial, into (o, lse); scratch in ws. */
flx_status_t flx_attn_sparse_gpu_launch(const flx_attn_host_gpu_ws_t *ws, const flx_attn_gpu_view_t *gv, int level,
                                        const float *q, const uint32_t *sel, uint32_t ld, const uint32_t *k,
                                        const float *o_win, const float *lse_win, float *o, float *lse,
                                        flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
