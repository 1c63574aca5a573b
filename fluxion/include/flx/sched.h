/*
 * flx/sched.h - Fluxion's heterogeneous scheduler (paper §7.2): the attention tasks of one decode
 * layer, one shared priority queue, CPU workers and a GPU worker that each take the next task only
 * when they are free; the paper's scheduling and placement baselines; per-layer instrumentation.
 *
 * OVERVIEW
 * A task is the host part of one (sequence, layer, KV group) with at least one retrieval head:
 * Quest scoring + top-k at its block size blk and sparse attention with its per-head budgets (or
 * all host tokens for FULL), merged with the group's window partial. Its priority is V(blk)
 * (Eq. 3, flx/selector.h), the host rows it will read. Streaming-only groups are not tasks (their
 * output is the window partial). A layer is run by
 *     flx_sched_run(sched, &layer, &stats)
 * which orders or assigns the tasks (POLICIES), wakes the GPU worker, runs the CPU workers on the
 * worker pool (flx/pool.h), waits for both, and fills the layer's statistics. Every task writes only
 * its own rows of the layer's outputs, so the result does not depend on who ran what: CPU schedules
 * give the same bits (a task's chunks are fixed by its data and merged in chunk order, flx/attn.h
 * CHUNKS), and a task the GPU ran agrees with its CPU run within the kernels' tolerance
 * (flx/attn_gpu.h).
 *
 * WORKERS
 *   CPU workers  the workers of the pool (params.pool, borrowed; NULL: the calling thread alone).
 *                A CPU worker takes a task from the queue (the pop is the claim), begins it
 *                (scoring, top-k, its chunk plan: flx_attn_task_begin on the task's own workspace)
 *                and publishes its chunks; a free CPU worker first helps with the chunks of the
 *                tasks already begun (in queue order), then takes the next task. The worker that
 *                finishes a task's last chunk merges it. So a long task is shared by every free
 *                worker, a descheduled worker holds up at most one chunk, and the queue's order is
 *                the order in which work starts.
 *   GPU worker   with use_gpu, a thread of the scheduler's own (made at create, asleep between
 *                layers: the one core that drives the GPU). It keeps up to gpu_streams tasks in
 *                flight, one per stream with its own device workspace (flx_attn_host_gpu: metadata
 *                and selected KV read in place from the pinned store through UVA), and takes the
 *                next task whenever a stream is free. A task whose session has no device addresses
 *                (memory that could not be pinned) runs on that thread with the CPU kernels
 *                instead (task.worker is then the pool's worker count). Its device busy time comes
 *                from CUDA events around each task.
 *   BALANCE      with a GPU worker on the shared queue (PRIORITY, HYBRID): a free CPU worker takes
 *                the next task only if the CPU side would finish it no later than the GPU side,
 *                by each side's outstanding bytes (the CPU's: of popped tasks no worker has
 *                started yet; the GPU's: of the tasks on its streams) and its rate measured on
 *                earlier runs of this scheduler (a task's bytes estimated from its priority, V
 *                in host rows); otherwise it waits for the GPU worker to take it. A CPU side with no
 *                backlog always takes it. Without it the CPU workers, all free at a
 *                layer's start, take most tasks of a small batch at once and the GPU idles at the
 *                end. The first run that puts tasks on both sides measures the rates.
 *
 * POLICIES (scheduling: paper §8's ablation; the same tasks, the same results, only who runs what
 * and when differs)
 *   PRIORITY     the tasks sorted by V, largest first (ties: lower index first), in one shared
 *                queue; CPU workers and the GPU worker pop the next one with one atomic add.
 *   NO_PARALLEL  no CPU-GPU parallelism: the GPU worker takes no task; the CPU workers pop the
 *                tasks in their given (sequence, group) order.
 *   UNIFORM      static split by heads: the tasks in their given order cut into equal contiguous
 *                shares (every task has G heads), one per worker (the GPU worker is one more);
 *                a share's tasks run one after another, all their chunks on the worker that took
 *                the share (no helping).
 *   LENGTH       static split by input length: longest l_cpu first, each task to the worker whose
 *                share has the fewest host tokens so far (ties: lowest worker, the GPU last).
 * PLACEMENTS (where the host part runs; the paper's comparisons)
 *   HYBRID       the CPU workers (and the GPU worker, by the policy). With FIXED tasks this is the
 *                paper's "w/o Fluxion (blk, bgt)" hybrid baseline, with FULL ones the exact one.
 *   GPU_ONLY     every task on the GPU worker: top-k on the GPU, selected KV over UVA; needs
 *                use_gpu.
 *
 * THE WINDOW PARTIAL (flx_sched_layer_t.window)
 *   GIVEN     the caller computed every group's window partial (o_win, lse_win): each task merges
 *             its host part with it (flx_attn_merge on the CPU, the merge kernel on the GPU).
 *   COMPUTE   each task computes its group's window partial on the CPU (the host window): the
 *             window's chunks are the task's first ones, merged with the host part at its end; a
 *             GPU task gets its window partial computed on the GPU worker's thread, then as GIVEN.
 *   NONE      tasks write the host part alone (o, lse): the caller merges (the window is being
 *             computed elsewhere meanwhile, for example on the device).
 *
 * INSTRUMENTATION (flx_sched_layer_stats_t, per layer)
 * Host times are CLOCK_MONOTONIC nanoseconds from the start of flx_sched_run. Each task records
 * the worker that ran it and its start and end; each CPU worker its busy time (inside tasks). The
 * GPU's busy time is the union of the device intervals of its tasks and of any span the caller
 * marked (flx_sched_gpu_span, e.g. the layer's window kernel), read from CUDA events on the
 * device's clock; idle = wall - busy, and the idle ratio idle / wall is the paper's Table 5 figure.
 *
 * THREAD MODE
 * One thread drives a scheduler (create, run, span, destroy); runs use the pool's workers.
 * Distinct schedulers are independent (sharing a pool, they take turns on it). No allocation after
 * create: a layer runs in the memory planned for max_tasks tasks (one attention workspace each).
 *
 * ERRORS
 * flx_sched_create and flx_sched_run refuse bad arguments with FLX_ERR_INVALID naming the field
 * (an unknown policy or placement, GPU_ONLY without use_gpu, a task with a batch
 * row, layer or group out of range, a blk that is not 16..128 or a budget outside [0, 1], more
 * tasks than max_tasks, window GIVEN without o_win); use_gpu without a device is FLX_ERR_NO_DEVICE.
 * A task that fails stops the others from taking new tasks; the run returns the failure that comes
 * first in the policy's order (with one shared queue, the queue's first failing task whatever the
 * timing), its message naming the layer, task, batch row and group.
 */
#ifndef FLX_SCHED_H
#define FLX_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "flx/attn.h"
#include "flx/cuda_rt.h"
#include "flx/kvstore.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_sched *flx_sched_h;

typedef enum {
    FLX_SCHED_PRIORITY = 0,
    FLX_SCHED_NO_PARALLEL = 1,
    FLX_SCHED_UNIFORM = 2,
    FLX_SCHED_LENGTH = 3,
} flx_sched_policy_t;

typedef enum {
    FLX_SCHED_HYBRID = 0,
    FLX_SCHED_GPU_ONLY = 1,
} flx_sched_placement_t;

/* "priority", "no-parallel", "uniform", "length" / "hybrid", "gpu-only"; FLX_ERR_INVALID naming the
 * string otherwise. */
flx_status_t flx_sched_policy_parse(const char *s, flx_sched_policy_t *p);
const char *flx_sched_policy_name(flx_sched_policy_t p);
flx_status_t flx_sched_placement_parse(const char *s, flx_sched_placement_t *p);
const char *flx_sched_placement_name(flx_sched_placement_t p);

#define FLX_SCHED_GPU (-1)       /* flx_sched_task_t.worker: the GPU ran it */
#define FLX_SCHED_NOT_RUN (-2)   /* flx_sched_task_t.worker: not run (the layer failed first) */

/* One task (filled by the caller; worker, start_ns, end_ns written by flx_sched_run). */
typedef struct flx_sched_task {
    uint32_t seq;           /* batch row of the layer (flx_sched_layer_t.sess[seq]) */
    uint32_t kv_group;      /* KV head: query heads kv_group * G .. + G - 1 */
    uint32_t blk;           /* 16, 32, 64 or 128; 0: FULL (every host token) */
    const float *budgets;   /* (G) per-head budgets in [0, 1] (fraction of l_cpu, flx/attn.h), or NULL */
    float budget;           /* every head's budget when budgets is NULL */
    float priority;         /* V(blk), Eq. 3 (host rows); PRIORITY pops larger first */
    uint32_t l_cpu;         /* host tokens of the sequence (LENGTH's key) */
    int32_t worker;         /* out: the CPU worker (pool index) that took it, n_workers for the GPU
                               worker's thread, FLX_SCHED_GPU, or FLX_SCHED_NOT_RUN */
    uint64_t start_ns;      /* out: host time the worker took it (from the run's start) */
    uint64_t end_ns;        /* out: host time its result was in place */
    uint64_t host_bytes;    /* out: host-resident bytes it read (Quest metadata + K/V blocks) */
} flx_sched_task_t;

typedef enum {
    FLX_SCHED_WIN_GIVEN = 0,
    FLX_SCHED_WIN_COMPUTE = 1,
    FLX_SCHED_WIN_NONE = 2,
} flx_sched_window_t;

/* One layer of a batch. Rows are (batch, Hq) query heads; a task writes rows seq * Hq + kv_group * G
 * .. + G - 1 of o (and lse when not NULL) and nothing else. */
typedef struct flx_sched_layer {
    uint32_t layer;
    uint32_t batch;
    flx_kv_session_h const *sess;   /* (batch) acquired sessions of the model's shape */
    const float *q;                 /* (batch, Hq, D) queries, RoPE applied */
    float *o;                       /* (batch, Hq, D) out: task rows */
    float *lse;                     /* (batch, Hq) out: task rows' LSE; may be NULL unless window NONE */
    flx_sched_window_t window;
    const float *o_win;             /* GIVEN: (batch, Hq, D) window partials */
    const float *lse_win;           /* GIVEN: (batch, Hq) */
    flx_sched_task_t *tasks;        /* (n_tasks), n_tasks <= max_tasks */
    uint32_t n_tasks;
} flx_sched_layer_t;

/* Per-layer figures. */
typedef struct flx_sched_layer_stats {
    uint64_t wall_ns;               /* flx_sched_run from start to end */
    uint32_t n_tasks, n_cpu_tasks, n_gpu_tasks;
    uint32_t n_gpu_fallback;        /* tasks the GPU worker's thread ran on the CPU (no UVA) */
    uint32_t n_chunks;              /* CPU chunks run (window and host slices) */
    uint64_t cpu_busy_ns;           /* sum over CPU workers of their time inside tasks (begins, chunks,
                                       ends) */
    uint64_t cpu_busy_max_ns;       /* the busiest CPU worker's */
    uint32_t n_cpu_workers;         /* the CPU workers of the run: cpu_busy_ns / (n_cpu_workers wall_ns)
                                       is the share of the run they spent in tasks */
    int has_gpu;                    /* a GPU worker ran (use_gpu) */
    uint64_t gpu_busy_ns;           /* union of the device intervals (CUDA events) */
    uint64_t gpu_span_ns;           /* device time of the caller's spans (flx_sched_gpu_span), summed */
    uint64_t gpu_idle_ns;           /* wall - busy (0 when busy >= wall) */
    double gpu_idle_ratio;          /* idle / wall; 0 without a GPU */
    int balanced;                   /* the CPU workers left tasks to the GPU worker by the estimated
                                       finish times (BALANCE below); needs both rates */
    double cpu_rate, gpu_rate;      /* BALANCE's estimates after this run, host bytes per ns (0: not
                                       measured yet) */
    flx_attn_timing_t attn;         /* sums of the tasks' CPU kernel times and bytes; GPU tasks add
                                       their bytes, and their device time to attn_ns */
} flx_sched_layer_stats_t;

enum {
    FLX_SCHED_FIELD_POLICY = 1u << 0,
    FLX_SCHED_FIELD_PLACEMENT = 1u << 1,
    FLX_SCHED_FIELD_GPU = 1u << 2,         /* use_gpu, cuda_device, gpu_streams */
};

typedef struct flx_sched_params {
    uint64_t field_mask;            /* FLX_SCHED_FIELD_*: which optional fields below are set */
    flx_pool_h pool;                /* the CPU workers (borrowed, outlives the scheduler); NULL: the
                                       calling thread alone. With a GPU worker, a pool made with
                                       reserve_cpus >= 1 lends it its dedicated core */
    uint32_t n_q_heads, n_kv_heads; /* required: the model's (G = n_q_heads / n_kv_heads <= 64) */
    uint32_t head_dim;              /* required: D, a multiple of 16 in 16..256 */
    uint32_t max_l_cpu;             /* required: the most host tokens of a task's session, >= 1 */
    uint32_t max_tasks;             /* required: the most tasks of a layer, >= 1 */
    flx_sched_policy_t policy;      /* POLICY; default PRIORITY */
    flx_sched_placement_t placement;/* PLACEMENT; default HYBRID */
    int use_gpu;                    /* GPU: 1 for a GPU worker; default 0 */
    int cuda_device;                /* GPU: its device; default 0 */
    uint32_t gpu_streams;           /* GPU: tasks in flight on the device, 1..8; default 2 */
} flx_sched_params_t;

flx_status_t flx_sched_create(const flx_sched_params_t *params, flx_sched_h *sched_p);
/* Stops the GPU worker's thread, frees everything. Accepts NULL. */
void flx_sched_destroy(flx_sched_h sched);

/* Runs one layer's tasks (see OVERVIEW). stats may be NULL. On return every task has run (or, on
 * an error, every task some worker had taken); task.worker says who. */
flx_status_t flx_sched_run(flx_sched_h sched, flx_sched_layer_t *layer, flx_sched_layer_stats_t *stats);

/* Device work the caller queues on stream for the next flx_sched_run (the layer's window kernel)
 * counted as GPU busy time of that layer: call with begin 1 right before queuing it and with begin
 * 0 right after. Needs use_gpu; at most 4 spans per layer. A caller whose queuing failed after a
 * begin ends the span all the same (or its next run is refused); a run that is refused drops the
 * layer's spans, and so does flx_sched_gpu_spans_drop. */
flx_status_t flx_sched_gpu_span(flx_sched_h sched, flx_cuda_stream_t stream, int begin);

/* The layer the spans were marked for will not run (the caller failed before flx_sched_run): they
 * are dropped, an open one too, so that none is counted in a later layer or blocks its spans.
 * Accepts NULL and a scheduler without a GPU worker (nothing to drop). */
void flx_sched_gpu_spans_drop(flx_sched_h sched);

/* The policy's order of the tasks of the last flx_sched_run (for tests and reports): order[i] is
 * the index of the i-th task of the shared queue (PRIORITY, NO_PARALLEL) or of the lanes one after
 * another (UNIFORM, LENGTH); lane_end[w] ends worker w's share (the GPU's last). Valid until the
 * next run. */
void flx_sched_last_order(flx_sched_h sched, const uint32_t **order_p, const uint32_t **lane_end_p,
                          uint32_t *n_lanes_p);

#ifdef __cplusplus
}
#endif
#endif
