/*
 * flx/attn_layer.h - the attention of one decode layer for a batch of sessions: the one route every
 * mode takes (the decode loop, the benchmarks, the tools).
 *
 * OVERVIEW
 * Given the layer's queries of B sequences (acquired kvstore sessions) it writes o (B, Hq, D):
 *   FULL     every (sequence, KV group) is a task over all host tokens (the exact reference);
 *   FIXED    every group a task at one (blk, bgt) for every head (the paper's "w/o Fluxion");
 *   FLUXION  the 41 features of every (sequence, query head) from the window and the prefill
 *            statistics (flx/features.h; they also give the window partials), the predictor over
 *            all of them at once (flx/predictor.h), the selector per group (flx/selector.h: blk,
 *            budgets, priority V, with the ablations of flx_select_opts_t); streaming-only groups
 *            take their window partial as output, the others become tasks;
 * then the tasks run on the heterogeneous scheduler (flx/sched.h: its policy and placement, the
 * worker pool's CPU workers, the GPU worker when there is one), each merged
 * with its group's window partial by the one LSE merge (flx_attn_merge; on the device its twin).
 * FULL and FIXED tasks carry priority V (Eq. 3) too, so every mode is scheduled alike.
 *
 * THE WINDOW PARTIALS (flx_attn_layer_args_t.window)
 *   COMPUTE   on the CPU: FULL / FIXED tasks compute their window themselves; FLUXION's features do.
 *   DEFERRED  FULL / FIXED only: the caller computes them elsewhere at the same time (the engine's
 *             GPU path: one device launch for the layer) into o_win / lse_win; the tasks run the
 *             host parts alone, then win_wait(win_ctx) is called and every group is merged. The
 *             host work overlaps the device's window.
 *
 * COST OF FLUXION'S DECISIONS (stats.predict_ns, the features + predictor + selector time)
 * Features run per (sequence, KV group) on the pool's workers (they are the window attention too,
 * one pass over the window's sink, local and generated segments), the predictor in register tiles
 * (flx_predictor_tile_rows) in the same pool run, each tile as soon as its sequences' features are
 * in (SIMD; the hidden layers in bf16 where the CPU has AVX-512 BF16; the scratch planned at
 * create), the selector per group on the calling thread; nothing allocates. stats.decide_ns is
 * that run's wall time, feat_cpu_ns and mlp_cpu_ns the thread time its two kinds of items took.
 *
 * THREAD MODE
 * One thread drives a layer object (create, run, destroy); runs use the pool's workers. Results do
 * not depend on the number of workers or the policy (bitwise on the CPU; within the kernels'
 * tolerance for tasks the GPU ran).
 */
#ifndef FLX_ATTN_LAYER_H
#define FLX_ATTN_LAYER_H

#include <stdint.h>

#include "flx/attn.h"
#include "flx/kvstore.h"
#include "flx/predictor.h"
#include "flx/sched.h"
#include "flx/selector.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_attn_layer *flx_attn_layer_h;

typedef enum {
    FLX_LAYER_FULL = 0,
    FLX_LAYER_FIXED = 1,
    FLX_LAYER_FLUXION = 2,
} flx_layer_mode_t;

enum {
    FLX_ATTN_LAYER_FIELD_SELECT = 1u << 0,   /* select (else the predictor's calibrated point) */
    FLX_ATTN_LAYER_FIELD_OPTS = 1u << 1,     /* opts (else {0, 0}) */
};

typedef struct flx_attn_layer_params {
    uint64_t field_mask;
    uint32_t n_q_heads, n_kv_heads, head_dim;   /* the model's */
    uint32_t max_batch;                         /* >= 1 */
    uint32_t max_l_cpu;                         /* the most host tokens of a session, >= 1 */
    flx_layer_mode_t mode;
    uint32_t blk;                               /* FIXED: 16, 32, 64 or 128 */
    float bgt;                                  /* FIXED: in [0, 1] (fraction of l_cpu, flx/attn.h) */
    flx_predictor_h predictor;                  /* FLUXION: borrowed, outlives the object */
    flx_select_params_t select;                 /* FLUXION, SELECT: the operating point */
    flx_select_opts_t opts;                     /* FLUXION, OPTS: streaming skipping, fixed granularity */
    flx_sched_params_t sched;                   /* pool (the workers, borrowed), policy, placement,
                                                 * GPU; its shape and max_tasks are set from the
                                                 * fields above */
} flx_attn_layer_params_t;

flx_status_t flx_attn_layer_create(const flx_attn_layer_params_t *params, flx_attn_layer_h *layer_p);
void flx_attn_layer_destroy(flx_attn_layer_h layer);

typedef enum {
    FLX_LAYER_WIN_COMPUTE = 0,
    FLX_LAYER_WIN_DEFERRED = 1,
} flx_layer_window_t;

typedef struct flx_attn_layer_args {
    uint32_t layer, batch;
    flx_kv_session_h const *sess;     /* (batch) acquired; FLUXION: with prefill statistics */
    const float *q;                   /* (batch, Hq, D), RoPE applied */
    float *o;                         /* (batch, Hq, D) out */
    flx_layer_window_t window;
    float *o_win, *lse_win;           /* DEFERRED: (batch, Hq, D), (batch, Hq), valid after win_wait */
    flx_status_t (*win_wait)(void *ctx);   /* DEFERRED: returns once o_win / lse_win are in place */
    void *win_ctx;
} flx_attn_layer_args_t;

typedef struct flx_attn_layer_stats {
    flx_sched_layer_stats_t sched;    /* the scheduler's figures of the layer's tasks */
    uint64_t wall_ns;                 /* the whole call */
    uint64_t predict_ns;              /* FLUXION: features + predictor + selector, of which: */
    uint64_t decide_ns;               /*   the one pool run of the features and the predictor */
    uint64_t select_ns;               /*   the selector and the task list, on the calling thread */
    uint64_t feat_cpu_ns, mlp_cpu_ns; /* FLUXION: thread time of that run in the features (with the
                                         window partials they give) and in the predictor's network */
    uint64_t merge_ns;                /* DEFERRED: the merges after win_wait */
    uint32_t n_groups;                /* (sequence, KV group)s of the batch */
    uint32_t n_tasks;                 /* of them tasks (the rest streaming-only) */
} flx_attn_layer_stats_t;

/* Runs the layer (OVERVIEW). stats may be NULL. FLX_ERR_INVALID names a bad argument (batch 0 or
 * above max_batch, a NULL session, DEFERRED in FLUXION mode or without o_win / win_wait, a session
 * with more than max_l_cpu host tokens, FLUXION sessions without statistics). */
flx_status_t flx_attn_layer_run(flx_attn_layer_h layer, const flx_attn_layer_args_t *args,
                                flx_attn_layer_stats_t *stats);

/* The tasks of the last run (who ran each, when): valid until the next run. */
const flx_sched_task_t *flx_attn_layer_tasks(flx_attn_layer_h layer, uint32_t *n_p);

/* Batch row `row` of the last run: its query heads the selector left window-only and its KV groups
 * with no host task (FLUXION; 0 in the other modes, and for a row beyond the last batch). */
void flx_attn_layer_row_stats(flx_attn_layer_h layer, uint32_t row, uint32_t *streaming_heads,
                              uint32_t *skipped_groups);

/* FLUXION: why batch row `row` of the last run failed, or NULL. A row whose features fail or
 * overflow (its session's prefill statistics or window KV out of range) fails alone: no task, its
 * outputs NaN, the rest of the batch computed as usual; valid until the next run. */
const char *flx_attn_layer_row_failed(flx_attn_layer_h layer, uint32_t row);

/* Its scheduler: the caller marks its device window launch with flx_sched_gpu_span on it. */
flx_sched_h flx_attn_layer_sched(flx_attn_layer_h layer);

#ifdef __cplusplus
}
#endif
#endif
