/*
 * flx/node.h - the decode node: sessions a router opens, KV that arrives for them, and the one
 * decode thread that batches every READY session into the engine's steps.
 *
 * OVERVIEW
 * A node loads a model (and its tokenizer and Fluxion predictor when there are ones), creates the
 * NUMA-aware KV store and starts its decode thread. Its API is what the gRPC control service
 * (flx/node_service.h) calls, in plain C types:
 *
 *   flx_node_open      checks the request against the node (model, shape, lengths, mode) and
 *                      reserves the session's host memory; the KV then arrives from a prefill node
 *                      (PREFILL MODES) and the session goes OPEN -> RECEIVING -> READY | FAILED
 *   flx_node_wait      READY / FAILED / CLOSED now, or a callback when it happens (or the deadline)
 *   flx_node_info      the session's state and figures
 *   flx_node_generate  claims a READY session for decoding; its tokens reach a sink, one call per
 *                      token, then one end call; the session is closed when it ends
 *   flx_node_close     gives the session's memory back, in any state
 *   flx_node_status    capacity, sessions by state, counters
 *
 * PREFILL MODES (flx/node_config.h)
 *   ucx    the product: prefill nodes push each session's KV over UCX into the store (the
 *          transport receiver of flx/transport.h, docs/transfer.md), listening on the config's
 *          ucx-listen. flx_node_open opens the transfer session (flx_tp_session_open: the memory,
 *          the 128-bit token, the deadline) and hands out its id, which is the transport's session
 *          id (what the prefill node's HELLO names), the token and the receiver's address. The
 *          store tells the node when a session leaves RECEIVING; the node then takes READY (with
 *          the committed first token, the prefill node's) or FAILED (with the transport's reason:
 *          deadline, corrupt or duplicate chunk, dead or stalled peer...). A failed session's
 *          memory is back in the pool at once; its id stays known (FAILED, the reason) until
 *          CloseSession. Only READY sessions are ever decoded.
 *   local  a single machine without a prefill node (development, benchmarks of the decode side):
 *          OpenSession carries the prompt's token ids and the node prefills them itself on its
 *          prefill thread, with the same in-process prefill flx-generate uses (flx/engine.h), and
 *          samples the first token greedily as a prefill node would. A prefill node never uses
 *          this mode; requests with local tokens are refused in ucx mode and vice versa.
 *
 * DECODE THREAD
 * One thread owns the engines (one per attention configuration: FULL, FIXED (blk, bgt), FLUXION;
 * engines are created on first use, at most FLX_NODE_MAX_ENGINES; a call whose configuration would be
 * one more waits, first in line, until an engine has no live sequence) and, in a loop: admits new
 * Generate calls into their engine; ends those whose client cancelled, whose deadline passed or
 * that a drain stops (each frees its batch slot before the next step); expires leases and waits;
 * runs one step of every engine with live sequences; hands each sequence's token to its sink with
 * the step's timing and the sequence's statistics (flx_engine_last_seq_stats). Sequences of all
 * clients share the steps of their engine. It sleeps on a condition variable when there is
 * nothing to do (no polling while idle).
 *
 * SINKS AND CANCELLATION
 * on_token runs on the decode thread for each token; on_end exactly once, last (after it the
 * node never touches ctx or the cancel flag). Neither may call back into the node. A caller
 * cancels a Generate or a wait by setting the flag it passed (any thread, e.g. a gRPC
 * cancellation callback) and calling flx_node_wake: the flag is the caller's memory, so nothing of
 * the node is touched from outside, whenever the node ends the call.
 *
 * DRAIN
 * flx_node_drain(timeout_ms): new sessions and new Generate calls are refused with
 * FLX_ERR_UNAVAILABLE; running Generate calls go on until they end or timeout_ms passes, then end
 * with FLX_ERR_UNAVAILABLE; sessions not yet READY fail ("node draining") and their waits end
 * UNAVAILABLE. Nothing half-received is ever decoded. A later call can shorten the timeout (0:
 * end everything at the next step). flx_node_n_generating tells when no Generate is left.
 *
 * THREAD MODE
 * Every function is thread-safe; create / destroy from one thread.
 */
#ifndef FLX_NODE_H
#define FLX_NODE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "flx/engine.h"
#include "flx/node_config.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_node *flx_node_h;

#define FLX_NODE_MAX_ENGINES 8
#define FLX_NODE_TOKEN_BYTES 16
#define FLX_NODE_MAX_STOP 16
#define FLX_NODE_REASON_MAX 160

/* Values equal fluxion.decode.v1.SessionState. */
typedef enum {
    FLX_NODE_OPEN = 1,
    FLX_NODE_RECEIVING = 2,
    FLX_NODE_READY = 3,
    FLX_NODE_DECODING = 4,
    FLX_NODE_FAILED = 5,
    FLX_NODE_CLOSED = 6,
} flx_node_state_t;

const char *flx_node_state_name(flx_node_state_t s);

typedef struct flx_node_attn {
    flx_engine_attn_mode_t mode;
    uint32_t blk;      /* FIXED: 16, 32, 64, 128 */
    float bgt;         /* FIXED: [0, 1] */
    float tau;         /* FLUXION: (0, 1), the prefill statistics' threshold */
} flx_node_attn_t;

/* What requests are checked against (flx/node_service.h validates with it). */
typedef struct flx_node_limits {
    char model_id[FLX_NODE_ID_MAX];
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
    uint32_t vocab;
    uint32_t max_prompt_len;
    uint32_t max_new_tokens;
    uint32_t max_stop_ids;          /* stop ids a Generate may add to the model's end tokens */
    uint32_t max_timeout_ms;        /* transfer timeout and lease, at most */
    flx_node_prefill_t prefill;
    int has_predictor;              /* FLUXION sessions are accepted */
} flx_node_limits_t;

typedef struct flx_node_open_params {
    uint32_t prompt_len;
    uint32_t max_new_tokens;
    flx_node_attn_t attn;
    uint32_t transfer_timeout_ms;   /* 0: the node's default */
    uint32_t lease_ms;              /* 0: the node's default */
    const int32_t *local_tokens;    /* LOCAL mode: (prompt_len) token ids, copied; NULL otherwise */
} flx_node_open_params_t;

typedef struct flx_node_open_result {
    uint64_t id;
    uint8_t token[FLX_NODE_TOKEN_BYTES];
    int64_t transfer_deadline_unix_ms;
    uint64_t reserved_bytes;
    /* UCX endpoint of the receiver (empty in LOCAL mode) */
    char ucx_host[256];
    uint32_t ucx_port;
    uint8_t ucx_worker_address[4096]; /* empty when the worker's address is longer (the listener serves) */
    uint32_t ucx_worker_address_len;
} flx_node_open_result_t;

typedef struct flx_node_session_info {
    uint64_t id;
    flx_node_state_t state;
    char fail_reason[FLX_NODE_REASON_MAX];
    uint32_t prompt_len, max_new_tokens;
    flx_node_attn_t attn;
    uint64_t bytes_expected, bytes_received, reserved_bytes;
    int64_t transfer_deadline_unix_ms;
    uint64_t time_to_ready_ns;      /* open -> READY; 0 before */
    double transfer_gbps;           /* 0 before READY */
    uint32_t tokens_generated;
} flx_node_session_info_t;

typedef struct flx_node_status {
    flx_node_limits_t limits;
    int draining;
    uint64_t pool_capacity_bytes, pool_used_bytes;
    uint32_t max_sessions, max_batch, decode_threads;
    uint32_t by_state[7];           /* sessions now, indexed by flx_node_state_t (CLOSED: kept records) */
    uint64_t sessions_opened_total, sessions_failed_total, generate_calls_total, tokens_generated_total;
    uint64_t transfer_bytes_total;
} flx_node_status_t;

/* ---- lifecycle ---- */

/* Loads cfg->model (and its tokenizer: without one, tokens stream without text pieces), the
 * predictor when cfg->predictor is set, creates the store and starts the threads. */
flx_status_t flx_node_create(const flx_node_config_t *cfg, flx_node_h *node_p);
/* Drains with timeout 0 (everything still running ends UNAVAILABLE), stops the threads, frees.
 * Accepts NULL. */
void flx_node_destroy(flx_node_h node);

void flx_node_limits(flx_node_h node, flx_node_limits_t *limits_p);

/* ---- sessions ---- */

/* Refusals: FLX_ERR_INVALID (a value the node cannot take: prompt_len above the node's limit, a
 * FLUXION session on a node without predictor, local tokens in ucx mode or none in local mode);
 * FLX_ERR_CAPACITY (no memory or session slot left); FLX_ERR_UNAVAILABLE (draining). */
flx_status_t flx_node_open(flx_node_h node, const flx_node_open_params_t *params, flx_node_open_result_t *res_p);
/* FLX_ERR_NOT_FOUND for an unknown id (or a closed one whose record expired). */
flx_status_t flx_node_info(flx_node_h node, uint64_t id, flx_node_session_info_t *info_p);
/* Closes in any state (a DECODING session's Generate ends with FLX_ERR_CANCELED); CLOSED again
 * is fine. *prev_p (may be NULL) gets the state before. */
flx_status_t flx_node_close(flx_node_h node, uint64_t id, flx_node_state_t *prev_p);

/* Called once when a waited session leaves OPEN / RECEIVING, or at the deadline (st
 * FLX_ERR_TIMEOUT), or when *cancelled became non-zero (FLX_ERR_CANCELED) or the node drains
 * (FLX_ERR_UNAVAILABLE); info is the session's state then (valid during the call). On the decode
 * thread. */
typedef void (*flx_node_wait_fn)(void *ctx, flx_status_t st, const flx_node_session_info_t *info);

/* FLX_OK with *info_p set when the session is already READY, DECODING, FAILED or CLOSED;
 * FLX_INPROGRESS when fn will be called (deadline_ns on flx_now_ns()'s clock, UINT64_MAX: the
 * session's own transfer deadline only); an error when it is unknown. cancelled (may be NULL)
 * must stay valid until fn returned. */
flx_status_t flx_node_wait(flx_node_h node, uint64_t id, uint64_t deadline_ns, flx_node_wait_fn fn, void *ctx,
                           const atomic_int *cancelled, flx_node_session_info_t *info_p);

/* Wakes the decode thread to look at cancel flags. Any thread. */
void flx_node_wake(flx_node_h node);

/* ---- generation ---- */

typedef struct flx_node_token {
    uint32_t index;                 /* 0 for the first generated token */
    int32_t token;
    const char *text;               /* UTF-8 piece (valid during the call); "" while incomplete */
    size_t text_len;
    uint64_t since_request_ns;
    uint64_t interval_ns;           /* since the previous token, or TTFT for the first */
    uint64_t step_ns;               /* 0 for the first */
    uint32_t batch;                 /* 0 for the first */
    flx_engine_seq_stats_t stats;   /* zero for the first */
    flx_engine_finish_t finish;     /* FLX_FINISH_NONE unless this is the last token */
} flx_node_token_t;

typedef struct flx_node_sink {
    void (*on_token)(void *ctx, const flx_node_token_t *tok);
    /* FLX_OK after the last token; else why the stream stopped (CANCELED, TIMEOUT, UNAVAILABLE,
     * an engine error...), msg says it (valid during the call). */
    void (*on_end)(void *ctx, flx_status_t st, const char *msg);
    void *ctx;
} flx_node_sink_t;

typedef struct flx_node_gen_params {
    uint64_t session;
    flx_sampling_params_t sampling;
    uint32_t max_new_tokens;        /* 0: the session's max_new_tokens */
    const int32_t *stop_ids;        /* (n_stop) copied */
    uint32_t n_stop;
    int ignore_eos;                 /* 1: the model's end tokens do not end the stream */
    int skip_text;
    uint64_t deadline_ns;           /* flx_now_ns() clock; UINT64_MAX: none */
    const atomic_int *cancelled;    /* may be NULL; non-zero ends the call (CANCELED) at the next
                                       step; valid until on_end returned */
} flx_node_gen_params_t;

/* Claims the READY session (-> DECODING) and queues the call for the decode thread. Refusals
 * (nothing changes, the sink is not called): FLX_ERR_NOT_FOUND, FLX_ERR_STATE (not READY: the
 * message names its state and a FAILED session's reason), FLX_ERR_INVALID, FLX_ERR_UNAVAILABLE.
 * On FLX_OK the sink gets its calls. */
flx_status_t flx_node_generate(flx_node_h node, const flx_node_gen_params_t *params, const flx_node_sink_t *sink);

/* ---- node ---- */

void flx_node_status(flx_node_h node, flx_node_status_t *status_p);
void flx_node_drain(flx_node_h node, uint32_t timeout_ms);
int flx_node_draining(flx_node_h node);
/* Generate calls not yet ended. */
uint32_t flx_node_n_generating(flx_node_h node);

/* The Prometheus text exposition of the node's metrics (format 0.0.4), malloc'd, NUL-terminated. */
flx_status_t flx_node_metrics_text(flx_node_h node, char **text_p, size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif
