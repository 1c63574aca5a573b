/*
 * flx/attn.h - Fluxion's CPU attention core: window attention, Quest block scoring, top-k, sparse
 * attention over host-resident KV, LSE merge, and the per-(sequence, layer, kv group) task.
 *
 * OVERVIEW
 * One call works on one GQA group: the G query heads that share kv head (layer, kv_head), whose KV
 * is described by a flx_kv_head_view_t (flx/kvstore.h). Definitions, for query head h with query
 * q_h (fp32, D):
 *   scale        1 / sqrt(D)
 *   s_i          scale * <q_h, k_i>  (fp32 accumulation; bf16 K)
 *   partial      over a token set S: o = sum_i softmax(s)_i v_i, lse = log sum_{i in S} exp(s_i)
 *                (natural log). An empty S gives o = 0 and lse = -inf.
 *   window       the view's win_k/win_v rows [0, n_win)
 *   host         the l_cpu host-resident tokens, 16-token physical blocks via block_table
 *   blk          logical block size in {16, 32, 64, 128} = metadata pyramid level j (blk = 16 << j);
 *                logical block b covers host tokens [b*blk, min((b+1)*blk, l_cpu)), n = meta_n[j]
 *   Quest score  of logical block b for head h: sum_d max(q_d * min_d, q_d * max_d) over the
 *                block's per-channel K min/max (unscaled; an upper bound of <q, k_i> in the block)
 *   BUDGET       bgt_h in [0, 1] is the fraction of the l_cpu host-resident tokens head h reads in
 *                addition to its window. It maps to k_h = ceil(bgt_h * l_cpu / blk) logical blocks,
 *                capped at n. bgt 0 reads no host token (window only); bgt 1 reads all of them
 *                (equal to full attention). Blocks are whole: a head reads up to blk - 1 tokens
 *                more than bgt * l_cpu, or fewer when the short last block (l_cpu % blk tokens)
 *                is among its k.
 *   top-k        the k blocks with the highest score; ties (equal scores) go to the lower block
 *                index; NaN scores rank below everything. The selected SET is deterministic; the
 *                order of the returned indices is deterministic but unspecified.
 *   merge        o = (e^{lse_a} o_a + e^{lse_b} o_b) / (e^{lse_a} + e^{lse_b}), lse = log(e^{lse_a}
 *                + e^{lse_b}), computed relative to max(lse_a, lse_b); parts with lse = -inf drop out.
 *
 * MODES of the task (flx_attn_group_run): SPARSE (Fluxion: blk + per-head budgets), FIXED (one
 * (blk, bgt) for every head, the paper's "w/o Fluxion (16, 0.05)" baselines) and FULL (window + all
 * host tokens). All run window attention, then the host part, then the merge, through the same
 * kernels. flx_attn_host_run is the host part alone (the scheduler's CPU task when a GPU did the
 * window).
 *
 * CHUNKS AND DETERMINISM
 * Every reduction over tokens is cut into fixed chunks whose boundaries depend only on the data:
 * the window into at most FLX_ATTN_WIN_CHUNKS slices of at least 256 rows, the host blocks into at
 * most FLX_ATTN_HOST_CHUNKS slices of a fixed number of 16-token blocks set by l_cpu alone (so FULL
 * and FIXED with budget 1 cut the same tokens at any blk). Each chunk keeps its own online-softmax
 * state (m, l, acc) in the workspace; the states are merged in chunk order at the end. So a result
 * is bitwise the same whether the chunks ran on one thread or on many, in any order. The staged
 * form (flx_attn_task_begin / _chunk / _end) hands the chunks to a scheduler: the decode loop
 * spreads the chunks of all (sequence, kv group) tasks of a layer over its pool's workers, and a
 * stalled worker's share is taken by the others.
 *
 * SHAPES
 *   q        fp32 (G, D), row h = query head h of the group
 *   o        fp32 (G, D);   lse fp32 (G)
 *   scores   fp32 (G, n)    row stride n
 *   sel      uint32 (G, sel_stride): head h's k[h] selected logical block indices, distinct, < n
 *   G <= FLX_ATTN_MAX_GROUP; D a multiple of 16 in [16, 256] (as the kvstore requires).
 *
 * KERNELS IN THREES
 * Every kernel has a _ref twin (scalar, double accumulation, allocates freely: the test oracle,
 * never the hot path) and a fast version (same name without _ref) that runs AVX-512 BF16
 * (_mm512_dpbf16_ps), AVX2+FMA or scalar code chosen per call from flx_isa_active(), in chunks
 * run on the workspace's pool (CHUNKS below). All accumulate in fp32. The AVX-512 path feeds q to dpbf16 as a
 * bf16 hi + lo pair (about 16 mantissa bits); AVX2 and scalar use fp32 q. Fast versions agree with
 * the references to ~1e-5 relative, well inside bf16 tolerances.
 *
 * WORKSPACE
 * flx_attn_plan() is the size-only pass: it returns the bytes a workspace for a shape needs
 * (G, D, max_l_cpu). The caller allocates them once (any allocator; 64-byte alignment is used if
 * given, otherwise the start is aligned up inside) and flx_attn_ws_init() carves them. The fast
 * kernels and the task then allocate nothing.
 *
 * THREAD MODE
 * A workspace serves one task at a time. A call runs its chunks on shape.pool (flx/pool.h; the
 * caller drives the run, and a call made from inside a run of that pool runs inline); a NULL pool
 * runs them on the caller. Between flx_attn_task_begin and _end, distinct chunks of the task may
 * run on different threads at once. The kernels never bind threads: the pool does (its numa_node,
 * the node of the KV the workers read). Results do not depend on the pool (CHUNKS above).
 *
 * ERRORS
 * FLX_ERR_INVALID (with flx_error_msg() naming the argument and value) for: NULL pointers, blk not
 * in {16,32,64,128}, a budget outside [0, 1] or NaN, a view whose head_dim differs from the
 * workspace's D, l_cpu above the planned max_l_cpu, k above n, a selected index >= n or repeated,
 * an unknown mode, G or D out of range. Output arrays are written only on success.
 */
#ifndef FLX_ATTN_H
#define FLX_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "flx/cpu.h"
#include "flx/kvstore.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_ATTN_MAX_GROUP 64
#define FLX_ATTN_MAX_HEAD_DIM 256
#define FLX_ATTN_WIN_CHUNKS 16     /* most chunks of a window */
#define FLX_ATTN_WIN_SEGMENTS 4    /* most segments of flx_attn_window_segments */
#define FLX_ATTN_HOST_CHUNKS 64    /* most chunks of a task's host blocks */
#define FLX_ATTN_MAX_CHUNKS (FLX_ATTN_WIN_CHUNKS + FLX_ATTN_HOST_CHUNKS)

/* blk (16, 32, 64, 128) -> pyramid level 0..3, or -1 when blk is not one of them. */
int flx_attn_blk_level(uint32_t blk);

/* k = ceil(bgt * l_cpu / blk) capped at ceil(l_cpu / blk); bgt must be in [0, 1]. A product within
 * a relative 1e-6 above a whole number is that number (the float's error: 0.05f of 3200 tokens at
 * blk 16 is 10 blocks). */
uint32_t flx_attn_budget_blocks(float bgt, uint32_t l_cpu, uint32_t blk);

/* ---- plan and workspace ---- */

typedef struct flx_attn_shape {
    uint32_t group;      /* G query heads per kv head, 1..FLX_ATTN_MAX_GROUP */
    uint32_t head_dim;   /* D, multiple of 16, 16..256 */
    uint32_t max_l_cpu;  /* the most host tokens a view given to this workspace may have */
    flx_pool_h pool;     /* the workers a call's chunks run on (borrowed); NULL: the caller alone */
} flx_attn_shape_t;

/* Size-only pass: bytes of a workspace for shape. */
flx_status_t flx_attn_plan(const flx_attn_shape_t *shape, size_t *ws_bytes_p);

/* A workspace carved from caller memory. Fields are internal; the memory stays the caller's and
 * must outlive the workspace (no destroy needed). */
typedef struct flx_attn_ws {
    flx_attn_shape_t shape;
    uint32_t n_max;             /* ceil(max_l_cpu / 16) + 1: most logical blocks at any level */
    float *q_f32;               /* (G, 2D) prepared q (scaled q, or [min(q,0) | max(q,0)]) */
    flx_bf16_t *q_hi, *q_lo;    /* (G, 2D) bf16 split of q_f32 */
    float *scores;              /* (G, n_max) */
    uint32_t *sel;              /* (G, n_max) selection / top-k working array */
    uint32_t *k;                /* (G) */
    uint64_t *mask;             /* (n_max) per logical block: bit h = selected by head h */
    uint32_t *list;             /* (n_max) union of selected logical blocks, ascending */
    float *part;                /* (FLX_ATTN_MAX_CHUNKS, G, D + 16): per-chunk online-softmax states */
    uint64_t *chunk_ns;         /* (FLX_ATTN_MAX_CHUNKS) time each chunk took */
    float *o_win, *lse_win;     /* (G, D), (G) window partials of the task */
    float *o_seg, *lse_seg;     /* (FLX_ATTN_WIN_SEGMENTS, G, D), (.., G) room for window segments' partials */
    /* the task in progress (flx_attn_task_begin .. _end) */
    flx_kv_head_view_t view;
    int isa, level, with_window;
    uint32_t n_list;            /* host: distinct logical blocks read (ws->list) */
    uint32_t win_rows, n_win_chunks;      /* window chunks: [0, n_win_chunks) of win_rows rows */
    uint32_t host_entries, n_host_chunks; /* host chunks: host_entries list entries each */
    uint64_t score_ns, topk_ns, score_bytes, attn_bytes;
} flx_attn_ws_t;

flx_status_t flx_attn_ws_init(flx_attn_ws_t *ws, const flx_attn_shape_t *shape, void *mem, size_t bytes);

/* ---- kernels ---- */

/* (1) Window attention of G heads over view->win_k/win_v rows [0, n_win). */
flx_status_t flx_attn_window_ref(const flx_kv_head_view_t *view, uint32_t G, const float *q, float *o, float *lse);
flx_status_t flx_attn_window(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                             float *lse);
/* The window cut into n_seg consecutive segments of seg_rows[s] rows (summing to view->n_win;
 * at most FLX_ATTN_WIN_SEGMENTS): one pass over the rows gives every segment's partial, o_seg
 * (n_seg, G, D) and lse_seg (n_seg, G) (an empty segment: o = 0, lse = -inf; ws->o_seg and
 * ws->lse_seg have room for them), and the whole
 * window's, o and lse, merged from the same chunk states (the features' sink / local / generated
 * partials and the window partial the attention reuses). Chunks never cross a segment boundary;
 * they run on the calling thread (the features run one call per worker). */
flx_status_t flx_attn_window_segments(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                      uint32_t n_seg, const uint32_t *seg_rows, float *o_seg, float *lse_seg,
                                      float *o, float *lse);

/* (2) Quest scores of all n = meta_n[level] logical blocks at blk = 16 << level for G heads:
 * scores (G, n). The fast version reads each metadata entry once for all G heads. */
flx_status_t flx_attn_score_ref(const flx_kv_head_view_t *view, int level, uint32_t G, const float *q,
                                float *scores);
flx_status_t flx_attn_score(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                            float *scores);

/* (3) Top-k of scores[0..n): writes k distinct indices to idx[0..k). _ref sorts (O(n log n));
 * flx_topk finds the k-th largest value with a quickselect (deterministic pseudo-random pivot,
 * expected O(n); 16-lane passes with AVX-512) using idx itself as scratch, so idx must hold n
 * entries, then takes the indices above it and the lowest indices equal to it, in ascending
 * index order within each part (the GPU's top-k writes the same order). Both select the same set
 * (ties -> lower index, NaN lowest, -0 equal to +0). */
flx_status_t flx_topk_ref(const float *scores, uint32_t n, uint32_t k, uint32_t *idx);
flx_status_t flx_topk(const float *scores, uint32_t n, uint32_t k, uint32_t *idx);

/* (4) Sparse attention of G heads over their selected logical blocks at blk = 16 << level:
 * head h reads blocks sel[h * sel_stride + i], i < k[h]. The fast version iterates the union of
 * the heads' blocks once, each with its head mask, so a shared block is read once. */
flx_status_t flx_attn_sparse_ref(const flx_kv_head_view_t *view, int level, uint32_t G, const float *q,
                                 const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse);
flx_status_t flx_attn_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                             const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse);

/* (5) LSE merge of G partials, in place allowed (o may equal o_a or o_b, lse likewise). */
void flx_attn_merge(uint32_t G, uint32_t D, const float *o_a, const float *lse_a, const float *o_b,
                    const float *lse_b, float *o, float *lse);

/* ---- the task ---- */

typedef enum {
    FLX_ATTN_SPARSE = 0,  /* blk + budgets[G] */
    FLX_ATTN_FIXED = 1,   /* blk + one budget for every head */
    FLX_ATTN_FULL = 2,    /* window + every host token */
} flx_attn_mode_t;

typedef struct flx_attn_cfg {
    flx_attn_mode_t mode;
    uint32_t blk;             /* SPARSE, FIXED: 16, 32, 64 or 128 */
    const float *budgets;     /* SPARSE: (G), each in [0, 1] */
    float budget;             /* FIXED: in [0, 1] */
} flx_attn_cfg_t;

/* Time split of one call (nanoseconds), for benchmarks; any call may pass NULL. window_ns and
 * attn_ns sum the times of their chunks (thread time when chunks ran in parallel). */
typedef struct flx_attn_timing {
    uint64_t window_ns;
    uint64_t score_ns;        /* Quest scoring */
    uint64_t topk_ns;         /* top-k selection */
    uint64_t attn_ns;         /* host sparse / full attention */
    uint64_t merge_ns;
    uint64_t score_bytes;     /* metadata bytes read by scoring */
    uint64_t attn_bytes;      /* K+V bytes of the distinct blocks read (union over heads) */
} flx_attn_timing_t;

/* a += b, every field. */
static inline void flx_attn_timing_add(flx_attn_timing_t *a, const flx_attn_timing_t *b)
{
    a->window_ns += b->window_ns;
    a->score_ns += b->score_ns;
    a->topk_ns += b->topk_ns;
    a->attn_ns += b->attn_ns;
    a->merge_ns += b->merge_ns;
    a->score_bytes += b->score_bytes;
    a->attn_bytes += b->attn_bytes;
}

/* Host part only: scoring + top-k + sparse attention (or all blocks for FULL) -> (o, lse) per head.
 * lse = -inf and o = 0 for heads that read nothing. */
flx_status_t flx_attn_host_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                               const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing);

/* Window + host + merge for one group: the decode loop's entry point per (sequence, layer, group). */
flx_status_t flx_attn_group_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing);

/* The task in stages, for a scheduler that spreads one group's work over several workers:
 *   begin  checks, per-head block counts, scoring + top-k + the union of the selection (SPARSE,
 *          FIXED; scoring and top-k on shape.pool), the chunk plan; *n_chunks_p = window chunks
 *          (with_window) + host chunks
 *   chunk  chunk c in [0, *n_chunks_p): a slice of the window (the first ones) or of the host
 *          blocks, into its own state; distinct chunks may run concurrently on different threads
 *   end    merges the states in chunk order: the window partial and the host partial, then both
 *          (with_window) -> o, lse; timing gets the chunks' times summed
 * flx_attn_group_run (with_window 1) and flx_attn_host_run (0) are begin, every chunk on
 * shape.pool, end: a staged run gives bitwise their result. The view and q must stay valid and
 * unchanged from begin to end. */
flx_status_t flx_attn_task_begin(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                 const flx_attn_cfg_t *cfg, int with_window, uint32_t *n_chunks_p);
flx_status_t flx_attn_task_chunk(flx_attn_ws_t *ws, uint32_t chunk);
flx_status_t flx_attn_task_end(flx_attn_ws_t *ws, float *o, float *lse, flx_attn_timing_t *timing);

/* The task by its names: (session, layer, kv group = kv_head, cfg with blk and per-head budgets) ->
 * per-head (o, lse) of the group's G query heads (q (G, D): query heads kv_head * G .. + G - 1).
 * Looks the (layer, kv_head) view up in the acquired session and runs flx_attn_group_run. In
 * flx_fluxion only (needs the kvstore library). */
flx_status_t flx_attn_session_run(flx_attn_ws_t *ws, flx_kv_session_h sess, uint32_t layer, uint32_t kv_head,
                                  const float *q, const flx_attn_cfg_t *cfg, float *o, float *lse,
                                  flx_attn_timing_t *timing);

#ifdef __cplusplus
}
#endif
#endif
