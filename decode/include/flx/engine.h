/*
 * flx/engine.h - the decode loop: continuous batching of READY kvstore sessions, one token per
 * sequence per step, attention through the kvstore window and Fluxion's attention task.
 *
 * OVERVIEW
 * An engine borrows a model (flx/model.h) and a kvstore (flx/kvstore.h) of the model's shape and
 * owns everything a decode step needs, sized at create time: the forward workspace (max_batch
 * sequences), one attention workspace per thread, the logits and the sampling scratch. A step
 * allocates nothing.
 *
 *   prefill (a prefill node over UCX, or flx_engine_prefill_into_store in-process)
 *       -> kvstore session READY, first token sampled from the prefill logits
 *   flx_engine_add(session, first token, gen params)       -> sequence id (session now DECODING)
 *   loop: flx_engine_step()                                 -> one token for every active sequence
 *       tokens reach the caller through the sequence's on_token callback, in order, the last one
 *       flagged is_last with the reason it ended (on_logits, if set, sees each step's logits)
 *
 * SEQUENCES AND TOKENS
 * The first token (from the prefill logits) counts as generated token 1: it is delivered through
 * on_token at the start of the next step, and then fed to the model. A token is delivered before
 * the next one is computed, so a gRPC stream can forward it at once. Generated token i (i = 0 for
 * the first) has position prompt_len + i. A sequence ends when:
 *   MAX_NEW    it has delivered max_new_tokens tokens;
 *   STOP / EOS it delivered a stop id or the eos id (the token is delivered, flagged is_last;
 *              whether to render it is the caller's choice);
 *   CAPACITY   its kvstore window is full: the session was opened with max_new_tokens W, so at
 *              most W tokens can be fed and W + 1 delivered; the token that cannot be fed is
 *              delivered flagged is_last with reason CAPACITY. Other sequences continue.
 *   CANCELED   flx_engine_cancel; on_token gets token -1, is_last 1.
 *   ERROR      a step failed (for example a kvstore refusal): every sequence of that step's batch
 *              ends with token -1, is_last 1, reason ERROR, and the step returns the error; the
 *              engine stays usable for the others. Logits that cannot be sampled (NaN, +inf) end
 *              only their own sequence with ERROR.
 * A sequence is retired right after its last callback: its id is no longer known to the engine,
 * its view of the session is released, and its kvstore session is closed when the engine was
 * created with close_sessions = 1 (otherwise the caller closes it, e.g. on a CloseSession RPC).
 *
 * CONTINUOUS BATCHING
 * Sequences may be added between any two steps. A step decodes up to max_batch live sequences, the
 * earliest added first; the others (up to max_seqs in all) wait. Finished sequences leave at the
 * end of the step that finishes them. Each sequence's tokens depend only on its own session, its
 * tokens and its sampler seed, never on what else shares its batch (the forward pass is
 * row-independent and attention runs per (sequence, kv group)).
 *
 * ATTENTION (the one entry point: the model's flx_attn_layer_fn for every layer of a step)
 *   1. the batch's new k, v are rounded to bf16 and appended to each session's window;
 *   2. flx_attn_layer_run (flx/attn_layer.h), the one route of every mode: the mode becomes tasks
 *      (one per (sequence, KV group) with a retrieval head, priority V of Eq. 3) that the
 *      heterogeneous scheduler (flx/sched.h) runs on the engine's pool and, with a GPU, its GPU
 *      worker, each merged with its group's window partial by flx_attn_merge.
 * Modes: FULL (window + every host token), FIXED (blk, bgt for every head; bgt = fraction of the
 * l_cpu host-resident tokens read in addition to the window), FLUXION (the paper's method): per
 * layer, the 41 features of every (sequence, query head) from the window and the session's
 * prefill statistics (flx/features.h; they also give each head's window partial), the predictor
 * over all of them at once (flx/predictor.h), the selector per group (flx/selector.h: blk, per-head
 * budgets, priority V, at the operating point params.select or the predictor's calibrated one;
 * streaming-only groups read nothing on the host and keep the window partial). Sessions must carry
 * prefill statistics (flx_engine_prefill_into_store with a tau, or a prefill node that sends them).
 * The paper's comparisons are parameters of the same engine: sched_policy (priority, no-parallel,
 * uniform, length), placement (hybrid, gpu-only), and for FLUXION keep_streaming and fixed_blk.
 *
 * GPU PATH (params.use_gpu)
 * The dense part of every step runs on a CUDA device (flx/forward_gpu.h: weights uploaded once,
 * cuBLAS products, one stream the engine owns), and the scheduler gets a GPU worker: a thread on
 * the pool's reserved core that keeps tasks in flight on their own streams, reading the metadata and
 * the selected KV in place from the pinned store (UVA, flx/attn_gpu.h), taking the next task of the
 * queue whenever a stream is free, as the CPU workers do. Per layer: the new k, v appended to each
 * session's window (the kvstore mirrors the row into its device window); in FULL and FIXED, one
 * launch of window attention for every (sequence, kv group) over the device windows while the
 * tasks run their host parts, then a wait for the device and the LSE merges; FLUXION computes its
 * window partials with its features on the CPU (they need the window's segments apart) and the
 * tasks merge them. The store must keep device windows on cuda_device (FLX_KV_STORE_WINDOW_DEVICE)
 * and pin its arena for the device (FLX_KV_STORE_PIN_CUDA), so one store serves any mode.
 * Tokens equal the CPU path's up to fp32 rounding order (the tests compare them). The GPU path is
 * compiled in every build but has never run on a device yet (no GPU on the development machines).
 *
 * WORKERS
 * One persistent pool (flx/pool.h) runs the whole step: the forward pass, the features and the
 * predictor, the attention chunks and the sampling; the driving thread is its worker 0. The engine
 * creates its own (n_threads workers, 0 = FLX_THREADS or the process's CPU budget; bind_numa: on
 * the store's NUMA node) or borrows params.pool (then n_threads and bind_numa must be 0; create
 * reserves the sampling scratch in that pool's workers). Tokens and logits are bitwise the same for
 * any number of workers.
 *
 * THREAD MODE
 * An engine is driven by one thread at a time (add, step, cancel, stats). Callbacks run on the
 * driving thread, inside flx_engine_step / flx_engine_cancel; they must not call back into the
 * engine. Distinct engines are independent (they may share a model and a store: both are
 * thread-safe for this use; engines sharing a pool take turns on it).
 */
#ifndef FLX_ENGINE_H
#define FLX_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "flx/forward.h"
#include "flx/forward_gpu.h"
#include "flx/kvstore.h"
#include "flx/model.h"
#include "flx/pool.h"
#include "flx/attn_layer.h"
#include "flx/predictor.h"
#include "flx/sampling.h"
#include "flx/sched.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_engine *flx_engine_h;
typedef uint64_t flx_engine_seq_id_t;   /* never 0; not reused by an engine */

typedef enum {
    FLX_ENGINE_ATTN_FULL = 0,     /* window + all host tokens: the exact reference */
    FLX_ENGINE_ATTN_FIXED = 1,    /* one (blk, bgt) for every head: the paper's "w/o Fluxion" baselines */
    FLX_ENGINE_ATTN_FLUXION = 2,  /* features + predictor + selector, per-head budgets (needs predictor) */
} flx_engine_attn_mode_t;

/* Parses "full", "fixed", "fluxion"; FLX_ERR_INVALID naming the string otherwise. */
flx_status_t flx_engine_attn_mode_parse(const char *s, flx_engine_attn_mode_t *mode_p);
const char *flx_engine_attn_mode_name(flx_engine_attn_mode_t mode);

typedef struct flx_engine_params {
    uint32_t max_batch;      /* sequences decoded per step, >= 1 */
    uint32_t max_seqs;       /* live sequences (decoding + waiting) at once; 0 = max_batch */
    uint32_t n_threads;      /* workers of the engine's own pool (WORKERS), driving thread included;
                                0 = FLX_THREADS, else the process's CPU budget; 0 with params.pool */
    uint32_t max_l_cpu;      /* most host-resident tokens of an added session; 0 = the model's max_ctx */
    flx_engine_attn_mode_t mode;
    uint32_t blk;            /* FIXED: 16, 32, 64 or 128 */
    float bgt;               /* FIXED: in [0, 1], fraction of l_cpu read besides the window */
    int close_sessions;      /* 1: a retired sequence's kvstore session is closed by the engine */
    int bind_numa;           /* 1: the engine's own pool runs on the store's NUMA node (the calling
                                thread, its worker 0, included), so attention reads host KV locally;
                                0 with params.pool */
    flx_predictor_h predictor; /* FLUXION: borrowed, must outlive the engine; NULL otherwise */
    const flx_select_params_t *select; /* FLUXION: the selector's operating point (copied at create);
                                          NULL = the one the predictor's weights carry */
    int use_gpu;             /* 1: the GPU path (GPU PATH above); 0: everything on CPU threads */
    int cuda_device;         /* use_gpu: the device ordinal; must hold the store's device windows */
    flx_gpu_model_h gpu_model; /* use_gpu: a device copy of the model on cuda_device (borrowed, must
                                * outlive the engine), or NULL for the engine to upload its own */
    flx_pool_h pool;         /* the pool that runs the steps (borrowed, must outlive the engine), or
                                NULL for the engine's own (WORKERS; with use_gpu it keeps one CPU
                                for the GPU worker's thread) */
    flx_sched_policy_t sched_policy;   /* PRIORITY (Fluxion's), NO_PARALLEL, UNIFORM, LENGTH (flx/sched.h) */
    flx_sched_placement_t placement;   /* HYBRID, or GPU_ONLY (use_gpu: every task on the GPU worker) */
    int keep_streaming;      /* FLUXION: 0 streaming-only groups read nothing (the paper's method);
                                1 every head a retrieval head (its ablation without skipping) */
    uint32_t fixed_blk;      /* FLUXION: 0 argmin V per group; 16, 32, 64, 128 that blk for every group */
    uint32_t gpu_streams;    /* use_gpu: tasks the GPU worker keeps in flight, 1..8; 0: 2 */
} flx_engine_params_t;

/* max_batch 8, max_seqs 0, n_threads 0, max_l_cpu 0, FULL, blk 16, bgt 0.05, close_sessions 1,
 * bind_numa 0, predictor NULL, select NULL, use_gpu 0, cuda_device 0, gpu_model NULL, pool NULL,
 * PRIORITY, HYBRID, keep_streaming 0, fixed_blk 0, gpu_streams 2. Every field added since the
 * first version is 0 in its default, so a zeroed struct asks for what it did before. */
flx_engine_params_t flx_engine_params_default(void);

/* Checks params (ranges, mode; FLUXION needs a predictor) and that the store's shape (layers,
 * kv heads, query heads, head_dim) is the model's. model and store are borrowed and must outlive
 * the engine. With use_gpu: FLX_ERR_NO_DEVICE when the machine has no usable CUDA device (the
 * engine does not fall back to the CPU: the caller asked for the device and decides what to do,
 * typically create it again with use_gpu 0); FLX_ERR_INVALID when the store keeps its windows in
 * host memory only or on another device, or when gpu_model is on another device or of another
 * shape; device allocation failures as flx/forward_gpu.h reports them. */
flx_status_t flx_engine_create(const flx_model_t *model, flx_kv_store_h store, const flx_engine_params_t *params,
                               flx_engine_h *engine_p);
/* Retires every live sequence without callbacks (releasing views; closing sessions when
 * close_sessions). Accepts NULL. */
void flx_engine_destroy(flx_engine_h engine);

/* The pool that runs the engine's steps (its own or the lent one); flx_pool_describe() says how
 * many workers it has and why. */
flx_pool_h flx_engine_pool(flx_engine_h engine);

typedef enum {
    FLX_FINISH_NONE = 0,     /* still running */
    FLX_FINISH_MAX_NEW,
    FLX_FINISH_STOP,
    FLX_FINISH_EOS,
    FLX_FINISH_CAPACITY,
    FLX_FINISH_CANCELED,
    FLX_FINISH_ERROR,
} flx_engine_finish_t;

const char *flx_engine_finish_name(flx_engine_finish_t why);

/* One delivered token (or token -1 for CANCELED / ERROR endings). why is FLX_FINISH_NONE unless
 * is_last. Runs on the thread driving the engine. */
typedef void (*flx_engine_token_fn)(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last,
                                    flx_engine_finish_t why);

/* The logits (vocab) a decode step computed for seq, before sampling (log-probabilities for a
 * server, checks for tests); valid only during the call. Not called for the first token (its
 * logits come from the prefill). Runs on the thread driving the engine. */
typedef void (*flx_engine_logits_fn)(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab);

#define FLX_ENGINE_MAX_STOP 16

typedef struct flx_gen_params {
    uint32_t max_new_tokens;       /* >= 1; tokens delivered, the first one included */
    const int32_t *stop_ids;       /* (n_stop) token ids that end the sequence; copied at add */
    uint32_t n_stop;               /* <= FLX_ENGINE_MAX_STOP */
    int32_t eos_id;                /* the model's end-of-sequence token, or -1 for none */
    int ignore_eos;                /* 1: eos_id does not end the sequence */
    flx_sampling_params_t sampling;
    flx_engine_token_fn on_token;  /* may be NULL (then poll with flx_engine_seq_info) */
    flx_engine_logits_fn on_logits; /* may be NULL: sees each decode step's logits before sampling */
    void *ctx;                     /* passed to on_token and on_logits */
} flx_gen_params_t;

/* Adds the READY kvstore session sid as a new sequence whose first token is first_token (sampled
 * by the caller from the prefill logits). Moves the session READY -> DECODING and holds a view of
 * it until the sequence retires. Refusals (nothing changes): FLX_ERR_INVALID for bad gen params
 * (max_new_tokens 0, too many stop ids, a token id outside the vocabulary, bad sampling params);
 * FLX_ERR_STATE when the session is not READY; FLX_ERR_NOT_FOUND for an unknown session;
 * FLX_ERR_CAPACITY when max_seqs sequences are live or the session has more host tokens than
 * max_l_cpu; FLX_ERR_INVALID when the session's prompt is longer than the model's context. */
flx_status_t flx_engine_add(flx_engine_h engine, flx_kv_session_id_t sid, int32_t first_token,
                            const flx_gen_params_t *gen, flx_engine_seq_id_t *seq_p);

/* One decode step for up to max_batch live sequences. Returns FLX_INPROGRESS when live sequences
 * remain afterwards, FLX_OK when none do (also when there was nothing to do), or an error (see
 * ERROR above). */
flx_status_t flx_engine_step(flx_engine_h engine);

/* Ends a live sequence now: on_token(-1, is_last 1, CANCELED), then retires it. FLX_ERR_NOT_FOUND
 * when seq is not live. */
flx_status_t flx_engine_cancel(flx_engine_h engine, flx_engine_seq_id_t seq);

typedef struct flx_engine_seq_info {
    flx_kv_session_id_t sid;
    uint32_t prompt_len;
    uint32_t l_cpu;          /* host-resident tokens of its session */
    uint32_t n_generated;    /* tokens delivered so far */
    int32_t last_token;      /* the last delivered token, -1 before the first */
    uint64_t decode_ns;      /* sum of the wall times of the steps it took part in */
    uint32_t n_steps;
} flx_engine_seq_info_t;

/* Info of a live sequence; FLX_ERR_NOT_FOUND once it retired. */
flx_status_t flx_engine_seq_info(flx_engine_h engine, flx_engine_seq_id_t seq, flx_engine_seq_info_t *info_p);

/* Live sequences (decoding or waiting). */
uint32_t flx_engine_n_live(flx_engine_h engine);

/* Timing and attention statistics of a step (or summed over steps). Times are nanoseconds;
 * attention kernel times are summed over tasks (thread time, not wall time). */
typedef struct flx_engine_stats {
    uint64_t n_steps;
    uint64_t n_tokens;        /* tokens computed by decode steps (first tokens excluded) */
    uint64_t step_ns;         /* wall time of the steps: the TPOT of each sequence in a step */
    uint64_t dense_ns;        /* forward pass outside attention (flx_fwd_timing_t) */
    uint64_t attn_ns;         /* wall time inside the attention entry point */
    uint64_t append_ns;       /* bf16 rounding + window appends */
    uint64_t sample_ns;       /* sampling + callbacks */
    uint64_t n_tasks;         /* (sequence, layer, kv group) attention tasks */
    uint64_t window_ns, score_ns, topk_ns, host_attn_ns, merge_ns;  /* flx_attn_timing_t sums (the GPU path's
                                                                       window: its kernel's device time) */
    uint64_t host_bytes;      /* host-resident bytes read: Quest metadata + K/V blocks */
    uint64_t host_meta_bytes; /*   of those, the Quest metadata scored */
    uint64_t dense_bytes;     /* weight bytes the dense part read */
    uint64_t predict_ns;      /* FLUXION: features + predictor + selector, wall time, of which: */
    uint64_t decide_ns;       /*   the pool runs of the features and the predictor */
    uint64_t select_ns;       /*   the selector */
    uint64_t feat_cpu_ns;     /* FLUXION: thread time in the features (they give the window partials) */
    uint64_t mlp_cpu_ns;      /* FLUXION: thread time in the predictor's network */
    uint64_t n_skipped;       /* FLUXION: (sequence, layer, kv group)s that were streaming-only (no host task) */
    /* the scheduler (flx/sched.h), summed over layers */
    uint64_t cpu_busy_ns;     /* CPU workers' time inside tasks */
    uint64_t n_gpu_tasks;     /* tasks the GPU worker ran on the device */
    uint64_t gpu_busy_ns;     /* device time of the GPU worker's tasks and the window launches (CUDA events) */
    uint64_t gpu_idle_ns;     /* the attention layers' wall time the device was not busy */
    uint64_t sched_wall_ns;   /* the attention layers' wall time the two above are shares of */
} flx_engine_stats_t;

/* Stats of the last step that ran, and the sums since create. */
void flx_engine_last_stats(flx_engine_h engine, flx_engine_stats_t *stats_p);
void flx_engine_total_stats(flx_engine_h engine, flx_engine_stats_t *stats_p);
/* a += b, field by field (sums of several engines, for a server's totals). */
void flx_engine_stats_add(flx_engine_stats_t *a, const flx_engine_stats_t *b);

/* One sequence's share of a step, summed over the layers: what a server streams with the token
 * the step computed. */
typedef struct flx_engine_seq_stats {
    flx_engine_seq_id_t seq;
    uint64_t host_bytes;        /* host-resident bytes its attention read: Quest metadata + K/V blocks */
    uint32_t heads;             /* (layer, query head)s: n_layers * n_q_heads */
    uint32_t streaming_heads;   /* FLUXION: of those, heads the selector left window-only */
    uint32_t groups;            /* (layer, kv group)s: n_layers * n_kv_heads */
    uint32_t skipped_groups;    /* FLUXION: of those, groups with no host task (every head streaming) */
    uint32_t groups_by_blk[4];  /* host tasks at logical block 16, 32, 64, 128 (FIXED: its blk;
                                   FLUXION: the selector's choice; FULL: none counted) */
} flx_engine_seq_stats_t;

/* The statistics of seq in the last step, also when seq retired in it (its last token); valid
 * until the next step. FLX_ERR_NOT_FOUND when seq was not in the last step's batch (a first token
 * is delivered before any step computes for it). Driving thread only, outside callbacks. */
flx_status_t flx_engine_last_seq_stats(flx_engine_h engine, flx_engine_seq_id_t seq, flx_engine_seq_stats_t *stats_p);

/* Per-layer figures of the last step (GPU busy / idle and idle ratio, CPU busy, where tasks ran,
 * the decisions' time): layer < n_layers. FLX_ERR_INVALID for a layer out of range. */
flx_status_t flx_engine_layer_stats(flx_engine_h engine, uint32_t layer, flx_attn_layer_stats_t *stats_p);

/*
 * Prefill with a per-layer sink: the one prefill behind both the in-process path below and a
 * prefill node (flx-prefill pushes each layer over UCX from its sink). Runs flx_model_prefill of
 * tokens[0, n) (ws planned for at least n prompt tokens) and hands every layer to out->on_layer as
 * soon as it is computed: K, V bf16 (n_kv_heads, n, head_dim) (flx/forward.h's layout) and, when
 * out->tau >= 0, the layer's predictor statistics computed by flx_prefill_stats with Eq. 2
 * threshold tau over the segments of a store with out->sink / out->local: stats (n_q_heads),
 * mean_k and q_anchor (n_q_heads, head_dim); NULL without statistics. Pointers are valid during the
 * call only; an error from the sink stops the prefill with it. first_logits (vocab) gets the last
 * position's logits.
 */
typedef flx_status_t (*flx_prefill_sink_fn)(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k,
                                            const flx_bf16_t *v, const flx_head_stats_t *stats, const float *mean_k,
                                            const float *q_anchor);

typedef struct flx_prefill_out {
    flx_prefill_sink_fn on_layer;
    void *ctx;
    float tau;                /* < 0: no statistics; else in (0, 1) */
    uint32_t sink, local;     /* the decode store's window (flx_kv_store_info_t), for the statistics */
} flx_prefill_out_t;

flx_status_t flx_engine_prefill_run(const flx_model_t *model, flx_fwd_ws_t *ws, const int32_t *tokens, uint32_t n,
                                    const flx_prefill_out_t *out, float *first_logits);

/* The in-process sink's body, for callers with their own sink (one prefill into several stores):
 * one layer's K, V (flx_prefill_sink_fn's layout, every kv head, tokens [0, n)) and, when stats is
 * not NULL, its statistics into session sid of store, as the UCX receiver would land them. */
flx_status_t flx_engine_store_layer(flx_kv_store_h store, flx_kv_session_id_t sid, uint32_t layer, uint32_t n,
                                    const flx_bf16_t *k, const flx_bf16_t *v, const flx_head_stats_t *stats,
                                    const float *mean_k, const float *q_anchor);

/*
 * In-process prefill (what a prefill node does, without the network): runs flx_model_prefill of
 * tokens[0, n) with ws (planned for at least n prompt tokens and by the caller), pushes each
 * layer's K/V into a freshly opened session of store (prompt_len n, window room max_new_tokens,
 * no predictor statistics: FULL and FIXED need none) with flx_kv_chunk_write as soon as the layer is
 * done, and writes the last position's logits to first_logits (vocab). On success the session is
 * READY and *sid_p is set; on failure the session is closed, *sid_p is not written and
 * first_logits holds nothing meaningful. A prompt longer than the model's context (max_ctx) is
 * refused with FLX_ERR_INVALID naming both lengths before a session is opened or a layer runs; one
 * the store cannot hold is refused by flx_kv_session_open (FLX_ERR_CAPACITY), also before any layer.
 */
flx_status_t flx_engine_prefill_into_store(const flx_model_t *model, flx_fwd_ws_t *ws, flx_kv_store_h store,
                                           const int32_t *tokens, uint32_t n, uint32_t max_new_tokens,
                                           flx_kv_session_id_t *sid_p, float *first_logits);
/* The same, and the session also gets the predictor's prefill statistics of every layer
 * (flx_prefill_stats with Eq. 2 threshold tau, from the layer's K, V and last query), which the
 * FLUXION mode needs. */
flx_status_t flx_engine_prefill_with_stats(const flx_model_t *model, flx_fwd_ws_t *ws, flx_kv_store_h store,
                                           const int32_t *tokens, uint32_t n, uint32_t max_new_tokens, float tau,
                                           flx_kv_session_id_t *sid_p, float *first_logits);
/* The same on a CUDA device (flx_gpu_model_prefill with ws, planned for at least n prompt tokens,
 * on stream): tau < 0 pushes no statistics (as flx_engine_prefill_into_store), tau in (0, 1) adds
 * them (as flx_engine_prefill_with_stats). The sink runs on the calling thread while the device
 * computes each layer's second half. */
flx_status_t flx_engine_prefill_gpu(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                    flx_kv_store_h store, const int32_t *tokens, uint32_t n, uint32_t max_new_tokens,
                                    float tau, flx_kv_session_id_t *sid_p, float *first_logits);

#ifdef __cplusplus
}
#endif
#endif
