/*
 * flx/attn_gpu.h - attention kernels on a CUDA device: window attention of a whole decode layer
 * over the kvstore's device windows, and causal attention over a prompt (the GPU prefill).
 *
 * OVERVIEW
 * Window attention (step 1 of the decode-time algorithm, ARCHITECTURE.md): one launch covers every
 * (sequence, kv group) item of a layer of a batch. An item names its kv head's device window
 * (flx_kv_head_view_t win_k_dev / win_v_dev, rows [0, n_win)) and the G query heads of its group;
 * it gets each head's partial output o_w (G, D) and log-sum-exp lse_w (G) with exactly the
 * definitions of flx/attn.h: scale 1 / sqrt(D), natural log, an empty window gives o = 0 and
 * lse = -inf. The CPU reference is flx_attn_window_ref (fluxion/src/attn_ref.c); the partials
 * merge with a host part through flx_attn_merge.
 *
 * Causal attention: query tokens [t0, t0 + nq) of a prompt attend to keys [0, t] each (t the
 * token's own position), K and V bf16 head-major as a prefill hands them to its sink. It is what
 * the GPU forward pass (flx/forward_gpu.h) runs per prompt chunk; its CPU counterpart is the
 * prefill attention of decode/src/forward.c, and the test holds it to a double-precision dense
 * softmax.
 *
 * NUMERICS. K and V are bf16, q and every accumulation fp32; softmax is online (running max,
 * running sum, rescaled accumulator), so no score matrix is ever stored and any number of keys
 * fits. Exponentials use expf (not the fast intrinsic): agreement with the references is ~1e-6
 * relative.
 *
 * SHAPES (D head dim, a multiple of 16 in [16, 256]; G query heads per kv head, 1..64)
 *   window item   k, v  device bf16 (>= n_win, D), row stride D, 16-byte aligned (kvstore views
 *                       are: D is a multiple of 16 and windows start on row boundaries)
 *                 q     device fp32 (G, D);   o device fp32 (G, D);   lse device fp32 (G)
 *   causal        q     device fp32, token t's row at q + t * q_stride, query head h at + h * D
 *                 k, v  device bf16 (Hkv, kv_stride, D): key j of kv head g at (g * kv_stride + j) * D
 *                 o     device fp32, row of token t0 + i at o + i * o_stride, head h at + h * D
 *
 * WORKSPACE (window attention: plan / run split)
 * flx_attn_window_gpu_plan() sizes, for (G, D, max_items), a device part (the item table the
 * kernel reads) and a page-locked host part (its staging); the caller allocates both once and
 * flx_attn_window_gpu_ws_init() carves them. flx_attn_window_gpu() then allocates nothing: it
 * copies the items into the staging, queues their upload and the kernel on the caller's stream and
 * returns. The causal kernel needs no workspace.
 *
 * THREAD MODE AND ORDERING
 * Launchers queue work on the given stream and return without waiting; results are in place when
 * the stream gets past it (synchronise the stream, or order later work after it). A window
 * workspace serves one launch at a time: its staging is rewritten by the next launch, so the
 * caller synchronises the stream (or an event recorded after the launch) before launching on the
 * same workspace again. Different workspaces are independent. The calling thread's current device
 * must be the one holding the pointers (the launchers do not switch devices).
 *
 * ERRORS
 * FLX_ERR_INVALID names a bad argument (a NULL pointer, G or D out of range, too many items, a
 * misaligned window, t0 + nq past kv_stride); FLX_ERR_NO_DEVICE when there is no device or the
 * binary was built without CUDA (the functions exist in every build); a failed launch returns the
 * translated CUDA error naming file and line (flx_status_from_cuda_at). Kernel faults surface at
 * the next synchronisation of the stream.
 *
 * STATUS: compiled, never run on a device yet (no GPU on the development machines); the tests
 * labelled `gpu` exercise all of it against the CPU references where a device exists.
 */
#ifndef FLX_ATTN_GPU_H
#define FLX_ATTN_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "flx/bf16.h"
#include "flx/cuda_rt.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One (sequence, kv group) of a window launch; every pointer is a device pointer. */
typedef struct flx_attn_gpu_item {
    const flx_bf16_t *k;     /* device (>= n_win, D) window K rows (a view's win_k_dev) */
    const flx_bf16_t *v;     /* device (>= n_win, D) window V rows (win_v_dev) */
    uint32_t n_win;          /* rows to attend to; 0 gives o = 0, lse = -inf */
    uint32_t reserved;       /* 0 */
    const float *q;          /* device (G, D) the group's queries, RoPE applied */
    float *o;                /* device (G, D) partial outputs */
    float *lse;              /* device (G) natural-log LSE of scale * <q, k> */
} flx_attn_gpu_item_t;

typedef struct flx_attn_gpu_shape {
    uint32_t group;          /* G, 1..64 */
    uint32_t head_dim;       /* D, multiple of 16, 16..256 */
    uint32_t max_items;      /* most items one launch takes, 1..1 << 20 */
} flx_attn_gpu_shape_t;

/* Size-only pass: device bytes (item table) and page-locked host bytes (its staging). */
flx_status_t flx_attn_window_gpu_plan(const flx_attn_gpu_shape_t *shape, size_t *dev_bytes_p, size_t *host_bytes_p);

/* Carved from caller memory: dev_mem device memory, host_mem page-locked host memory
 * (flx_cuda_host_alloc), at least the planned bytes each. The memory stays the caller's and must
 * outlive the workspace; nothing to destroy. */
typedef struct flx_attn_gpu_ws {
    flx_attn_gpu_shape_t shape;
    flx_attn_gpu_item_t *items_dev;   /* device (max_items) */
    flx_attn_gpu_item_t *items_host;  /* page-locked (max_items) staging */
} flx_attn_gpu_ws_t;

flx_status_t flx_attn_window_gpu_ws_init(flx_attn_gpu_ws_t *ws, const flx_attn_gpu_shape_t *shape, void *dev_mem,
                                         size_t dev_bytes, void *host_mem, size_t host_bytes);

/* Window attention of n_items items (1..max_items) in one launch on stream. items is read before
 * the call returns (copied into the staging). */
flx_status_t flx_attn_window_gpu(flx_attn_gpu_ws_t *ws, const flx_attn_gpu_item_t *items, uint32_t n_items,
                                 flx_cuda_stream_t stream);

/* Causal attention of query tokens [t0, t0 + nq) (nq >= 1) over keys [0, t] each, for Hq query
 * heads in groups of G = Hq / Hkv; see SHAPES. Requires t0 + nq <= kv_stride,
 * q_stride >= Hq * D, o_stride >= Hq * D. */
typedef struct flx_attn_causal_gpu_args {
    const float *q;          /* device */
    size_t q_stride;         /* floats between token rows of q */
    const flx_bf16_t *k, *v; /* device (Hkv, kv_stride, D), 16-byte aligned */
    uint32_t kv_stride;      /* tokens per kv head in k and v */
    uint32_t t0, nq;
    uint32_t n_heads, n_kv_heads, head_dim;
    float *o;                /* device */
    size_t o_stride;         /* floats between token rows of o */
} flx_attn_causal_gpu_args_t;

flx_status_t flx_attn_causal_gpu(const flx_attn_causal_gpu_args_t *args, flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
