/*
 * flx/attn_gpu.h - attention kernels on a CUDA device: window attention of a whole decode layer
 * over the kvstore's device windows, causal attention over a prompt (the GPU prefill), and the GPU
 * worker's host-part task: Quest scoring and top-k over the metadata pyramid and sparse attention
 * over the selected KV blocks, all read in place from the pinned host arena (UVA), and the LSE
 * merge.
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
 * HOST PART ON THE DEVICE (the scheduler's GPU worker; paper §7.2, "GPU execution after KV
 * transfer" read in place instead of copied)
 * One task = the host part of one (sequence, layer, kv group), exactly flx_attn_host_run's
 * (flx/attn.h: the same modes, budgets, blocks, top-k rule and definitions), optionally merged with
 * a window partial: flx_attn_host_gpu() queues, on the caller's stream,
 *   1. one upload of the task's inputs (q, the per-head block counts k, the window partial) from the
 *      workspace's page-locked staging;
 *   2. Quest scoring of every logical block at blk (flx_attn_score_gpu): the metadata is read over
 *      the bus from the pinned store (the view's meta_dev), never copied to device memory;
 *   3. top-k per head (flx_topk_gpu): a radix select of the k-th largest score, then an ordered
 *      compaction, so the indices are flx_topk's to the element (same set, same order);
 *   4. sparse attention (flx_attn_sparse_gpu): the heads' selections OR-ed into a per-block head
 *      mask and compacted into the ascending union, split into slices over thread blocks; each
 *      physical block of a slice is read once over the bus (pool_base_dev, block_table_dev) for
 *      every head that selected it, with the online softmax of the window kernel;
 *   5. the LSE merge of the slices' partials and the window partial (flx_attn_merge_gpu is its
 *      two-operand form, the device twin of flx_attn_merge);
 *   6. one download of (o, lse) and the bytes read into the staging.
 * flx_attn_host_gpu_finish(), called once the stream is past the task (an event recorded after
 * it, or a stream synchronisation), copies the result to the caller. FULL reads every block
 * (no scoring); budgets 0 read nothing (lse -inf). CPU references: flx_attn_score_ref,
 * flx_topk / flx_topk_ref, flx_attn_sparse_ref, flx_attn_merge, flx_attn_host_run
 * (fluxion/src/attn_ref.c, attn_task.c); test_attn_gpu_host holds every kernel and the task to them.
 * The view must come from a store pinned with FLX_KV_STORE_PIN_CUDA (or carry device addresses of
 * page-locked memory): a view without them is refused, so a task never reads pageable memory.
 * One workspace serves one task at a time (its staging is rewritten by the next launch); the GPU
 * worker keeps one per stream.
 *
 * STATUS: compiled, never run on a device yet (no GPU on the development machines); the tests
 * labelled `gpu` exercise all of it against the CPU references where a device exists.
 */
#ifndef FLX_ATTN_GPU_H
#define FLX_ATTN_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "flx/attn.h"
#include "flx/bf16.h"
#include "flx/cuda_rt.h"
#include "flx/kvstore.h"
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

/* ---- the host part on the device (HOST PART ON THE DEVICE above) ---- */

/* A view's host-resident part as the device reads it: the UVA device addresses of a pinned store's
 * view (flx_kv_head_view_t pool_base_dev, block_table_dev, meta_dev), by value into kernels. */
typedef struct flx_attn_gpu_view {
    const uint8_t *pool;                          /* device address of the block pool */
    const uint32_t *table;                        /* device (n_blocks) physical block indices */
    const flx_bf16_t *meta[FLX_KV_META_LEVELS];   /* device (meta_n[j], 2, D) min / max rows */
    uint32_t meta_n[FLX_KV_META_LEVELS];
    size_t block_bytes;                           /* 64 D */
    uint32_t l_cpu, n_blocks, head_dim;
    int device;                                   /* the ordinal the addresses are valid on */
} flx_attn_gpu_view_t;

/* Checks view (flx_attn_check_view's rules) and takes its device addresses; FLX_ERR_INVALID when the
 * view has none (a store without FLX_KV_STORE_PIN_CUDA, or a session whose memory could not be
 * pinned) or a level's are missing. *gv_p written only on success. */
flx_status_t flx_attn_gpu_view(const flx_kv_head_view_t *view, flx_attn_gpu_view_t *gv_p);

typedef struct flx_attn_host_gpu_shape {
    uint32_t group;          /* G, 1..64 */
    uint32_t head_dim;       /* D, multiple of 16, 16..256 */
    uint32_t max_l_cpu;      /* the most host tokens of a view given to it, 1..1 << 26 */
} flx_attn_host_gpu_shape_t;

/* Size-only pass: device bytes and page-locked host bytes of one task's workspace. */
flx_status_t flx_attn_host_gpu_plan(const flx_attn_host_gpu_shape_t *shape, size_t *dev_bytes_p,
                                    size_t *host_bytes_p);

/* Carved from caller memory as the window workspace is (device memory and page-locked host memory,
 * at least the planned bytes each; they stay the caller's and outlive the workspace; nothing to
 * destroy). The device arrays are named so that the kernels below can be run alone on them. */
typedef struct flx_attn_host_gpu_ws {
    flx_attn_host_gpu_shape_t shape;
    uint32_t n_max;          /* ceil(max_l_cpu / 16): most logical blocks at any level */
    uint32_t max_splits;     /* most slices a sparse launch splits the union into */
    int device;              /* the current device at init: launches must run with it current */
    /* device */
    float *q;                /* (G, D) */
    uint32_t *k;             /* (G) blocks per head */
    float *o_win, *lse_win;  /* (G, D), (G) window partial to merge with */
    float *scores;           /* (G, n_max) */
    uint32_t *sel;           /* (G, n_max) */
    uint64_t *mask;          /* (n_max) bit h: block selected by head h */
    uint32_t *list;          /* (n_max) ascending union of selected blocks */
    uint32_t *count;         /* (2): union blocks, their host tokens */
    float *part_o, *part_lse;/* (max_splits, G, D), (max_splits, G) partials of the slices */
    float *o, *lse;          /* (G, D), (G) the task's result */
    /* page-locked host staging */
    uint8_t *in_host;        /* q, k, o_win, lse_win as laid out at q on the device */
    uint8_t *out_host;       /* o, lse, count as laid out at o on the device */
    size_t in_bytes, out_bytes;
    /* the task in flight (set by flx_attn_host_gpu, read by _finish) */
    uint32_t pending;        /* 1 between a launch and its finish */
    uint32_t blk;            /* 0: FULL */
    uint64_t score_bytes;
} flx_attn_host_gpu_ws_t;

flx_status_t flx_attn_host_gpu_ws_init(flx_attn_host_gpu_ws_t *ws, const flx_attn_host_gpu_shape_t *shape,
                                       void *dev_mem, size_t dev_bytes, void *host_mem, size_t host_bytes);

/* Queues the host part of one group on stream (see HOST PART ON THE DEVICE): view with device
 * addresses, q host (G, D), cfg as flx_attn_host_run's, and optionally the window partial o_win
 * (G, D), lse_win (G) in host memory to merge with (both NULL: the result is the host part alone,
 * lse -inf for heads that read nothing). The inputs are copied before the call returns. Refusals
 * as flx_attn_host_run's, plus FLX_ERR_INVALID for a view without device addresses, a view on
 * another device, a workspace with a task not yet finished; FLX_ERR_NO_DEVICE without a device. */
flx_status_t flx_attn_host_gpu(flx_attn_host_gpu_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                               const flx_attn_cfg_t *cfg, const float *o_win, const float *lse_win,
                               flx_cuda_stream_t stream);

/* After the stream is past the task: o (G, D), lse (G) from the staging; timing (may be NULL) gets
 * score_bytes and attn_bytes (its times are the caller's: device time comes from its events). */
flx_status_t flx_attn_host_gpu_finish(flx_attn_host_gpu_ws_t *ws, float *o, float *lse, flx_attn_timing_t *timing);

/* The kernels one by one, on device arrays (what the task queues; tests hold each to its CPU
 * reference). Every pointer is device-readable (device memory or UVA); nothing is checked on the
 * device side, so sel must hold k[h] distinct indices below n per head, as flx_topk_gpu makes them.
 *   score   scores (G, ld): the Quest score of logical block b of level for head h at h * ld + b,
 *           q (G, D) unscaled (flx_attn_score_ref); n = gv->meta_n[level] <= ld.
 *   topk    per head h < G: idx + h * ld gets flx_topk(scores + h * ld, n, k[h]) exactly; k (G) on
 *           the device, k[h] <= n.
 *   sparse  (o, lse) (G, D), (G) of each head over its k[h] selected blocks sel + h * ld
 *           (flx_attn_sparse_ref), in the workspace's scratch (one launch at a time per
 *           workspace); k and sel on the device.
 *   merge   rows (o, lse) = LSE merge of (o_a, lse_a) and (o_b, lse_b), row length D, in place
 *           allowed (flx_attn_merge). */
flx_status_t flx_attn_score_gpu(const flx_attn_gpu_view_t *gv, int level, uint32_t G, const float *q, float *scores,
                                uint32_t ld, flx_cuda_stream_t stream);
flx_status_t flx_topk_gpu(const float *scores, uint32_t ld, uint32_t n, uint32_t G, const uint32_t *k, uint32_t *idx,
                          flx_cuda_stream_t stream);
flx_status_t flx_attn_sparse_gpu(flx_attn_host_gpu_ws_t *ws, const flx_attn_gpu_view_t *gv, int level,
                                 const float *q, const uint32_t *sel, uint32_t ld, const uint32_t *k, float *o,
                                 float *lse, flx_cuda_stream_t stream);
flx_status_t flx_attn_merge_gpu(uint32_t rows, uint32_t D, const float *o_a, const float *lse_a, const float *o_b,
                                const float *lse_b, float *o, float *lse, flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
