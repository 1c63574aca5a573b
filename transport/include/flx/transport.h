/*
 * flx/transport.h - KV over UCX: the decode node's receiver (flx_tp_node) and the prefill side's
 * sender (flx_tp_sender). Wire format: flx/tp_wire.h and docs/transfer.md.
 *
 * OVERVIEW
 *   decode node (owns a kvstore)                         prefill node (another process or machine)
 *   flx_tp_node_create(store, listen host:port)
 *   flx_tp_session_open(shape, prompt_len, ...) -> desc: session id, 128-bit token, the node's UCX
 *        address (listener host:port, worker address), deadline ──(router, command line)──▶
 *                                                         flx_tp_sender_create(node host:port)
 *        WELCOME (shape, window segments, heartbeat) ◀──▶ flx_tp_sender_hello(sid, token)
 *        KV chunks land in their final place         ◀─── flx_tp_send_kv      } layer by layer, as the
 *        statistics, validated, stored               ◀─── flx_tp_send_stats   } prefill computes them
 *        a layer's pyramid built when it completes
 *        READY once every byte + statistics + commit ◀─── flx_tp_send_commit(first token, totals)
 *        STATUS (READY / FAILED + reason)             ───▶ flx_tp_sender_status
 *   flx_tp_session_wait(sid) -> READY
 *   flx_engine_add(engine, sid, info.kv.first_token, ...): READY -> DECODING, the decode's claim
 *   decode ...; flx_tp_session_close(sid)
 *
 * SESSIONS
 * A session is a kvstore session (flx/kvstore.h) opened with FLX_KV_SESSION_COMMIT, a deadline and a
 * lease, plus what the transport keeps beside it: the token, the connections that presented it,
 * receives in flight, refused messages. Its state is the store's: OPEN = RESERVED, then RECEIVING,
 * READY | FAILED (with the reason), DECODING once claimed, CLOSED. Nothing that is not READY can be
 * claimed: flx_engine_add refuses any other state, atomically with the READY -> DECODING move.
 *
 * WHAT IS CHECKED (every message, before it touches memory)
 * the header field by field (flx_tp_hdr_parse); the session exists; the token, compared in constant
 * time; the session is RESERVED/RECEIVING; a KV chunk's layer, kv heads and tokens lie inside the
 * reservation and were not sent before (the store's claim); a STATS payload's shape is the model's;
 * the payload hash once the bytes have landed and before they count. A message with a bad header,
 * an unknown session or a wrong token is dropped without naming or touching any session, and the
 * connection that sent it is closed (a peer that sends it is broken or hostile); it never fails a
 * session, so nobody can kill another's session by guessing its id. A bad chunk, bad statistics,
 * a duplicate or a bad commit from a peer holding the right token fails that session with the
 * reason. Duplicates are failures, not retransmissions: UCX delivers reliably, so a second copy means
 * a broken sender, and neither copy can be trusted to be the right one.
 *
 * FAULTS
 * deadline        the session must be READY by open + timeout_ms, else FAILED ("deadline passed ...")
 * lease           a READY session not claimed within lease_ms (renewable) is FAILED and reclaimed
 * peer death      with FLX_TP_ERR_PEER, UCX reports a dead peer (TCP, RDMA: ms); in any mode a
 *                 connection silent for liveness_ms (no data, no heartbeat) is taken for dead: the
 *                 sessions it was feeding are FAILED ("peer ... silent ..."). UCX 1.13 cannot report a
 *                 dead peer over shared memory, so there the heartbeat check and the deadline do.
 * bad chunk       FAILED with the store's or the checksum's reason.
 * A session's memory goes back to the pool when it fails, but never while a receive is still in
 * flight into it: the store keeps it until the receive completes or is cancelled. A failed
 * session's receives that have not completed after cancel_grace_ms are cancelled by closing the
 * connections carrying them, where UCX can (FLX_TP_ERR_PEER); with FLX_TP_ERR_NONE UCX 1.13 cannot
 * cancel a receive, which then ends when its peer finishes or dies (docs/transfer.md).
 *
 * PROGRESS AND THREADS
 * A node runs one progress thread that owns its UCX worker: it sleeps in poll() on the worker's
 * event fd (ucp_worker_arm) and a wake-up fd, with a timeout set by the next deadline, lease or
 * liveness check, and never spins while idle. Active-message handlers (header checks, claims,
 * posting receives) run there. Completed receives go to n_completion_threads completion threads,
 * which check payload hashes and complete claims (each chunk builds the pyramid's level 0 of the
 * blocks it landed, while they are in cache; the chunk completing a layer builds the rest), so
 * hashing and pyramids overlap the next receives. Two by default: with one, a 512 MiB session
 * ended with a backlog of hashing and pyramid work behind its last byte (41 ms per GB to READY on
 * the 2-CPU VM, 25 with two). A sender runs one progress thread too (sends,
 * heartbeats, the node's replies); its API calls queue work to it.
 *
 * TRANSPORTS
 * Nothing here names a transport: UCX_TLS / UCX_NET_DEVICES decide (shared memory, TCP, RDMA
 * verbs). Listener connections need tcp in UCX_TLS (UCX_TLS=sm,tcp for shared-memory data).
 * A KV chunk whose destination is one contiguous range (the host-resident part of a layer, cut on
 * the WELCOME's segments; flx_tp_plan_layer does that) is received with one contiguous rendezvous
 * receive: zero-copy (CMA get over shared memory, put over TCP, RDMA read). Any other chunk is
 * received with UCP's IOV datatype straight into its places; UCX 1.13 moves IOV rendezvous data as
 * active-message fragments (one copy, done by UCX), or it arrives eagerly.
 *
 * THREAD MODE AND OWNERSHIP
 * flx_tp_node_h: every function is thread-safe (gRPC handler threads, the decode loop and tests
 * call them concurrently); the store is borrowed and must outlive the node. flx_tp_sender_h: one
 * thread at a time calls its functions (the prefill's); its callbacks run on the sender's own
 * progress thread. Structures returned by value are the caller's; pointers inside them say how
 * long they live.
 */
#ifndef FLX_TRANSPORT_H
#define FLX_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flx/kvstore.h"
#include "flx/status.h"
#include "flx/tp_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_TP_ERR_PEER = 0,  /* UCX peer-failure detection (UCP_ERR_HANDLING_MODE_PEER): TCP, RDMA */
    FLX_TP_ERR_NONE = 1,  /* none (UCP_ERR_HANDLING_MODE_NONE): what UCX 1.13 shared memory needs */
} flx_tp_err_mode_t;

/* Parses "peer" or "none"; FLX_ERR_INVALID naming the string otherwise. */
flx_status_t flx_tp_err_mode_parse(const char *s, flx_tp_err_mode_t *mode_p);

/* ---- node ---- */

typedef struct flx_tp_node *flx_tp_node_h;

enum {
    FLX_TP_NODE_FIELD_LISTEN = 1u << 0,        /* listen_host, listen_port */
    FLX_TP_NODE_FIELD_ADVERTISE = 1u << 1,     /* advertise_host */
    FLX_TP_NODE_FIELD_ERR_MODE = 1u << 2,
    FLX_TP_NODE_FIELD_LIVENESS = 1u << 3,      /* liveness_ms */
    FLX_TP_NODE_FIELD_TIMEOUTS = 1u << 4,      /* default_timeout_ms, default_lease_ms */
    FLX_TP_NODE_FIELD_CHECKSUM = 1u << 5,      /* require_payload_hash */
    FLX_TP_NODE_FIELD_THREADS = 1u << 6,       /* n_completion_threads */
    FLX_TP_NODE_FIELD_GRACE = 1u << 7,         /* cancel_grace_ms */
};

typedef struct flx_tp_node_params {
    uint64_t field_mask;          /* FLX_TP_NODE_FIELD_*: which fields below are set */
    flx_kv_store_h store;         /* required; borrowed, must outlive the node */
    const char *listen_host;      /* address to listen on (copied); default "127.0.0.1" */
    uint16_t listen_port;         /* default 0: a free port (flx_tp_node_info says which) */
    const char *advertise_host;   /* host the descriptors name (copied); default listen_host, required
                                     when that is a wildcard (0.0.0.0, ::) */
    flx_tp_err_mode_t err_mode;   /* of the node's endpoints; default FLX_TP_ERR_PEER; a sender must use
                                     the same */
    uint32_t liveness_ms;         /* a connection feeding a session and silent this long is dead;
                                     default 10000; senders are asked to beat every liveness_ms / 4 (a
                                     shorter one finds frozen peers sooner, and takes a prefill node
                                     whose progress thread a busy host starves for a dead one) */
    uint32_t default_timeout_ms;  /* open's timeout_ms when 0; default 60000 */
    uint32_t default_lease_ms;    /* open's lease_ms when 0; default 60000 */
    int require_payload_hash;     /* 1 (default): KV and STATS payloads must carry payload_xxh3 */
    uint32_t n_completion_threads;/* default 2, at most 16 */
    uint32_t cancel_grace_ms;     /* receives of a failed session still in flight after this are
                                     cancelled (PEER mode); default 1000 */
} flx_tp_node_params_t;

/* Creates the UCX context and worker (UCX_* environment), the listener and the threads. Refusals:
 * FLX_ERR_INVALID naming a bad parameter; FLX_ERR_IO with UCX's reason when UCX cannot start or
 * the address cannot be listened on. */
flx_status_t flx_tp_node_create(const flx_tp_node_params_t *params, flx_tp_node_h *node_p);
/* Stops accepting, fails the node's RESERVED/RECEIVING sessions ("node shutting down"), cancels
 * their receives, waits for every receive to end, stops the threads, releases UCX. READY and later
 * sessions stay in the store. Accepts NULL. */
void flx_tp_node_destroy(flx_tp_node_h node);

#define FLX_TP_HOST_MAX 256

/* Connections a node keeps open at once; more are refused (logged) until some close. Each has a UCX
 * worker of its own (a peer stopped in the middle of a message blocks no one else's). */
#define FLX_TP_NODE_MAX_CONNS 1024

typedef struct flx_tp_node_info {
    char host[FLX_TP_HOST_MAX];       /* advertised listener host */
    uint16_t port;                    /* listener port */
    const uint8_t *worker_address;    /* packed UCP worker address; owned by the node, valid until destroy */
    size_t worker_address_len;
    flx_tp_err_mode_t err_mode;
    uint32_t liveness_ms;
    uint32_t n_conns;                 /* connections open now */
    uint64_t conns_accepted;
    uint64_t conns_failed;            /* lost (peer gone, or silent past liveness_ms) with a session of theirs
                                         that failed (by the loss or before it) */
    uint64_t conns_left;              /* peer gone with no session of it still receiving: the normal end */
    uint64_t msgs, msgs_refused;      /* messages handled / refused (bad header, token, session, chunk) */
    uint64_t kv_bytes;                /* KV payload bytes landed */
    uint64_t receives_inflight;       /* receives posted and not completed */
    uint64_t contig_receives, iov_receives, eager_receives; /* how KV chunks arrived */
} flx_tp_node_info_t;

void flx_tp_node_info(flx_tp_node_h node, flx_tp_node_info_t *info_p);

enum {
    FLX_TP_OPEN_FIELD_NO_STATS = 1u << 0,   /* with_stats */
    FLX_TP_OPEN_FIELD_TIMEOUT = 1u << 1,    /* timeout_ms */
    FLX_TP_OPEN_FIELD_LEASE = 1u << 2,      /* lease_ms */
};

typedef struct flx_tp_open_params {
    uint64_t field_mask;       /* FLX_TP_OPEN_FIELD_*; the fields without one are required */
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim; /* the prefill's model shape: must be the store's */
    uint32_t vocab;            /* the model's vocabulary: the committed first token must be below it */
    uint32_t prompt_len;       /* tokens whose KV is pushed, >= 1 */
    uint32_t max_new_tokens;   /* window room for generated tokens */
    int with_stats;            /* default 1: the predictor's statistics of every layer are expected
                                  (the Fluxion mode needs them); 0 for full / fixed */
    uint32_t timeout_ms;       /* READY must come within this; default the node's */
    uint32_t lease_ms;         /* a READY session must be claimed within this; default the node's */
} flx_tp_open_params_t;

/* What the router hands to a prefill node. */
typedef struct flx_tp_session_desc {
    flx_kv_session_id_t sid;
    uint8_t token[FLX_TP_TOKEN_BYTES];   /* from getrandom(2); every message for the session carries it */
    char host[FLX_TP_HOST_MAX];          /* the node's listener */
    uint16_t port;
    const uint8_t *worker_address;       /* the node's packed worker address; owned by the node, valid
                                            until flx_tp_node_destroy */
    size_t worker_address_len;
    uint64_t deadline_ns;                /* flx_now_ns() clock */
    int64_t deadline_unix_ms;            /* the same moment on the wall clock (for the router) */
    size_t reserved_bytes;               /* host memory reserved for the session */
} flx_tp_session_desc_t;

/* Checks the shape against the store (FLX_ERR_INVALID naming the field), reserves the memory
 * (FLX_ERR_CAPACITY when it does not fit, nothing kept), draws the token, starts the deadline.
 * *desc_p written only on success. */
flx_status_t flx_tp_session_open(flx_tp_node_h node, const flx_tp_open_params_t *params,
                                 flx_tp_session_desc_t *desc_p);

typedef struct flx_tp_session_info {
    flx_kv_session_info_t kv;    /* state, bytes, fail reason, times, first token (flx/kvstore.h) */
    uint32_t receives_inflight;  /* receives posted into its memory and not completed */
    uint32_t n_conns;            /* connections that presented its token */
    char peer[64];               /* the first of them, "ip:port"; empty before any */
    uint64_t msgs_refused;       /* messages naming it that were refused */
    char last_refusal[FLX_TP_STATUS_MAX]; /* why the last was */
    uint64_t t_last_data_ns;     /* when the last receive into it completed (the last byte) */
} flx_tp_session_info_t;

/* FLX_ERR_NOT_FOUND once closed or for a session this node did not open. */
flx_status_t flx_tp_session_info(flx_tp_node_h node, flx_kv_session_id_t sid, flx_tp_session_info_t *info_p);
/* Blocks (no spinning) until the session is READY, DECODING or FAILED, or timeout_ms passed
 * (FLX_ERR_TIMEOUT); then fills *info_p (may be NULL). FLX_ERR_NOT_FOUND once closed. */
flx_status_t flx_tp_session_wait(flx_tp_node_h node, flx_kv_session_id_t sid, uint32_t timeout_ms,
                                 flx_tp_session_info_t *info_p);
/* Sets the lease to lease_ms from now (READY) or from READY (before); FLX_ERR_STATE afterwards. */
flx_status_t flx_tp_session_renew(flx_tp_node_h node, flx_kv_session_id_t sid, uint32_t lease_ms);
/* Fails a RESERVED/RECEIVING session with reason (the owner's decision: a drain, a deadline of its
 * own): its memory goes back to the pool once no receive holds it, and the senders feeding it are
 * told (STATUS FAILED with the reason). FLX_ERR_STATE (unchanged) in any other state,
 * FLX_ERR_NOT_FOUND once closed. */
flx_status_t flx_tp_session_fail(flx_tp_node_h node, flx_kv_session_id_t sid, const char *reason);
/* Closes the session in the store (any state); the id is dead at once; its memory returns when no
 * receive or view holds it; the senders feeding it are told (STATUS CLOSED). */
flx_status_t flx_tp_session_close(flx_tp_node_h node, flx_kv_session_id_t sid);

/* ---- sender (prefill side) ---- */

typedef struct flx_tp_sender *flx_tp_sender_h;

enum {
    FLX_TP_SENDER_FIELD_ERR_MODE = 1u << 0,
    FLX_TP_SENDER_FIELD_TIMEOUT = 1u << 1,    /* connect_timeout_ms */
    FLX_TP_SENDER_FIELD_WINDOW = 1u << 2,     /* rndv_window */
};

typedef struct flx_tp_sender_params {
    uint64_t field_mask;
    const char *host;             /* the node's listener (required; copied) */
    uint16_t port;                /* required */
    flx_tp_err_mode_t err_mode;   /* default FLX_TP_ERR_PEER; must be the node's */
    uint32_t connect_timeout_ms;  /* HELLO's answer must come within this; default 10000 */
    uint32_t rndv_window;         /* rendezvous sends in flight at once, 1..1024; default 4. The rest
                                     wait in order (so does what was queued after them): over TCP UCX
                                     interleaves every rendezvous in flight, so with all of a
                                     session's chunks posted at once they all landed together at the
                                     end, and the node's hashing and pyramid work queued behind the
                                     last byte (41 ms per GB to READY); a window lands them one after
                                     the other, each verified while the next ones move */
} flx_tp_sender_params_t;

/* Connects to the node (asynchronously: flx_tp_sender_hello is the first round trip) and starts the
 * sender's progress thread. FLX_ERR_IO with UCX's reason when UCX refuses. */
flx_status_t flx_tp_sender_create(const flx_tp_sender_params_t *params, flx_tp_sender_h *sender_p);
/* Flushes nothing: sends in flight are cancelled (their callbacks run with an error). Accepts NULL. */
void flx_tp_sender_destroy(flx_tp_sender_h sender);

typedef struct flx_tp_ref {
    flx_kv_session_id_t sid;
    uint8_t token[FLX_TP_TOKEN_BYTES];
} flx_tp_ref_t;

/* HELLO -> WELCOME: the session's shape and segments, and how often to beat. Starts heartbeats at the
 * node's pace. FLX_ERR_TIMEOUT without an answer within connect_timeout_ms; FLX_ERR_STATE with the
 * node's reason when it refuses (wrong token, unknown or ended session). */
flx_status_t flx_tp_sender_hello(flx_tp_sender_h sender, const flx_tp_ref_t *ref, flx_tp_welcome_t *welcome_p);

/* Called on the sender's progress thread when a send completes: st FLX_OK (the node has the bytes)
 * or the error (peer gone, cancelled). */
typedef void (*flx_tp_sent_fn)(void *ctx, flx_status_t st);

/* The typed sends below (KV, statistics, commit) queue their message and return; done, where given,
 * runs once it completes. They refuse at once, queuing nothing and never running done, when the
 * message cannot help its session any more: FLX_ERR_IO once the connection failed or any send on it
 * did (the error is the first one), FLX_ERR_STATE with the node's reason once it said the session is
 * FAILED or CLOSED. A prefill node then stops computing that session at its next layer instead of
 * at its commit. flx_tp_send_raw refuses nothing (a test must be able to send what a broken peer
 * sends). */
enum {
    FLX_TP_SEND_RNDV = 1u << 0,    /* force rendezvous (zero-copy for a contiguous destination) */
    FLX_TP_SEND_EAGER = 1u << 1,   /* force eager (the data travels with the message) */
    FLX_TP_SEND_NO_HASH = 1u << 2, /* no payload_xxh3 (a node that requires it refuses the chunk) */
};

/* A KV chunk in GRANULE order (flx/kvstore.h): payload is bf16 of (head_end - head_begin) heads x
 * (tok_end - tok_begin) tokens x head_dim x (K, V), borrowed until done runs. The payload hash is
 * computed here, on the caller's thread. */
flx_status_t flx_tp_send_kv(flx_tp_sender_h sender, const flx_tp_ref_t *ref, const flx_kv_chunk_t *chunk,
                            const void *payload, uint32_t flags, flx_tp_sent_fn done, void *ctx);
/* The same with the payload's hash computed by the producer (flx_tp_hash of the packed bytes), where
 * it writes them and they are in cache, instead of here; the hash is sent as given (one that does not
 * match the bytes fails the session on the node). FLX_TP_SEND_NO_HASH is refused here. */
flx_status_t flx_tp_send_kv_hashed(flx_tp_sender_h sender, const flx_tp_ref_t *ref, const flx_kv_chunk_t *chunk,
                                   const void *payload, uint64_t payload_xxh3, uint32_t flags, flx_tp_sent_fn done,
                                   void *ctx);
/* Statistics of one layer: stats (n_q_heads), mean_k and q_anchor (n_q_heads, head_dim) f32; copied. */
flx_status_t flx_tp_send_stats(flx_tp_sender_h sender, const flx_tp_ref_t *ref, uint32_t layer, uint32_t n_q_heads,
                               uint32_t head_dim, const flx_head_stats_t *stats, const float *mean_k,
                               const float *q_anchor, uint32_t flags);
/* The end of a session's stream: the first token and what was sent (flx_kv_commit_t). */
flx_status_t flx_tp_send_commit(flx_tp_sender_h sender, const flx_tp_ref_t *ref, const flx_kv_commit_t *commit);
/* Any header, as encoded by the caller (flx_tp_hdr_encode), with its payload (borrowed until done):
 * for tests and fault injection, which must be able to send what a broken peer sends. */
flx_status_t flx_tp_send_raw(flx_tp_sender_h sender, const uint8_t hdr[FLX_TP_HDR_BYTES], const void *payload,
                             uint64_t len, uint32_t flags, flx_tp_sent_fn done, void *ctx);

/* Waits until every send posted so far completed (FLX_ERR_TIMEOUT after timeout_ms); returns the
 * first send error since create, if any. */
flx_status_t flx_tp_sender_flush(flx_tp_sender_h sender, uint32_t timeout_ms);

/* The last STATUS the node sent for sid: *state_p (FLX_KV_RESERVED = none yet) and the reason
 * (reason_cap bytes, NUL-terminated; may be NULL). With timeout_ms > 0, waits that long for a
 * READY, FAILED or CLOSED one. */
flx_status_t flx_tp_sender_status(flx_tp_sender_h sender, flx_kv_session_id_t sid, uint32_t timeout_ms,
                                  flx_kv_state_t *state_p, char *reason, size_t reason_cap);

typedef struct flx_tp_sender_info {
    uint64_t bytes_posted;       /* payload bytes handed to UCX */
    uint64_t bytes_done;         /* payload bytes whose send completed successfully */
    uint32_t sends_inflight;
    int peer_failed;             /* UCX reported the connection failed */
    char error[FLX_TP_STATUS_MAX];/* the first send or connection error, else empty */
} flx_tp_sender_info_t;

void flx_tp_sender_info(flx_tp_sender_h sender, flx_tp_sender_info_t *info_p);

/* ---- chunk planning (prefill side) ---- */

typedef struct flx_tp_plan_chunk {
    flx_kv_chunk_t chunk;          /* GRANULE order */
    uint32_t send_flags;           /* FLX_TP_SEND_RNDV for contiguous destinations, EAGER otherwise */
} flx_tp_plan_chunk_t;

/* Cuts one layer of a session described by w into chunks: the host-resident tokens (16-aligned
 * granules inside [n_sink, prompt_len - n_local)) of as many whole heads as fit max_chunk_bytes
 * (or token ranges of one head when a head alone is larger), sent rendezvous; the window tokens
 * (sink, and the local tail with the granule that straddles it) as one or two chunks of all heads,
 * sent eagerly. Writes up to cap chunks; returns how many the layer needs (call with cap 0 to size). */
uint32_t flx_tp_plan_layer(const flx_tp_welcome_t *w, uint32_t layer, uint64_t max_chunk_bytes,
                           flx_tp_plan_chunk_t *out, uint32_t cap);

#ifdef __cplusplus
}
#endif
#endif
