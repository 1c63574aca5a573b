/* Internal: the CUDA launchers behind flx/attn_gpu.h (attn_window.cu, attn_causal.cu). attn_gpu.c
 * validates every argument and checks for a device before calling them; they only queue work. */
#ifndef FLX_ATTN_GPU_INTERNAL_H
#define FLX_ATTN_GPU_INTERNAL_H

#include "flx/attn_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Queues the upload of ws->items_host[0, n_items) to ws->items_dev and the window kernel. */
flx_status_t flx_attn_window_gpu_launch(const flx_attn_gpu_ws_t *ws, uint32_t n_items, flx_cuda_stream_t stream);
/* Queues the causal kernel. */
flx_status_t flx_attn_causal_gpu_launch(const flx_attn_causal_gpu_args_t *args, flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
