/*
 * tp_core.h - the receiver's logic without UCX: sessions (token, connections, receives in flight),
 * the checks every message goes through before it touches memory, and what happens when its data
 * has landed. node.c drives it from UCX; the fuzz target drives it from bytes, through the same
 * functions.
 *
 * A message flows as: tp_core_ingest (header, session, token, state, chunk claim) -> the caller
 * receives data_len bytes into the recv's destinations (UCX rendezvous, or a copy of eager data)
 * -> tp_core_recv_done (payload hash, claim completion or statistics write). Connections are
 * opaque ids (0 is none); the core only remembers which fed which session.
 *
 * THREAD MODE: every function is thread-safe (one lock, never held across store calls that build a
 * pyramid or copy KV).
 */
#ifndef FLX_TP_CORE_H
#define FLX_TP_CORE_H

#include <pthread.h>
#include <stdint.h>

#include "flx/kvstore.h"
#include "flx/status.h"
#include "flx/tp_wire.h"
#include "flx/transport.h"

#define TP_MAX_SESSION_CONNS 4

typedef struct tp_sess tp_sess_t;

typedef struct tp_core {
    flx_kv_store_h store;
    flx_kv_store_info_t si;      /* the store's shape (immutable parts) */
    uint32_t liveness_ms, default_timeout_ms, default_lease_ms, cancel_grace_ms;
    int require_hash;

    pthread_mutex_t lock;
    /* guarded by lock */
    tp_sess_t **map;             /* open addressing on sid, (map_cap) */
    uint32_t map_cap, map_n;
    uint64_t msgs, msgs_refused, kv_bytes;
    uint64_t *changed;           /* sids whose state may have changed and whose senders should hear */
    uint32_t n_changed, cap_changed;
} tp_core_t;

typedef struct tp_core_params {
    flx_kv_store_h store;
    uint32_t liveness_ms, default_timeout_ms, default_lease_ms, cancel_grace_ms;
    int require_hash;
} tp_core_params_t;

flx_status_t tp_core_init(tp_core_t *c, const tp_core_params_t *p);
void tp_core_fini(tp_core_t *c);

flx_status_t tp_core_open(tp_core_t *c, const flx_tp_open_params_t *p, flx_tp_session_desc_t *desc_p);
flx_status_t tp_core_close(tp_core_t *c, flx_kv_session_id_t sid);
flx_status_t tp_core_info(tp_core_t *c, flx_kv_session_id_t sid, flx_tp_session_info_t *info_p);

/* A message whose data is being received. */
typedef struct tp_recv {
    void *next;                  /* tp_fifo link (first field) */
    flx_tp_hdr_t hdr;
    uint64_t conn;
    flx_kv_claim_t *claim;       /* KV: where the data lands */
    uint8_t *buf;                /* STATS: the payload (hdr.payload_len bytes) */
    flx_status_t status;         /* of the transfer, set by the caller */
    char why[64];                /* the transport's reason when status is an error */
    uint64_t t_done_ns;          /* when the transfer completed */
    void *user;                  /* the caller's (node.c: the connection) */
} tp_recv_t;

/* Where a recv's data goes: n entries of (dst, len) in payload order. */
static inline uint32_t tp_recv_iov(const tp_recv_t *r, const flx_kv_iov_t **iov_p, flx_kv_iov_t *one)
{
    if (r->claim) {
        *iov_p = r->claim->iov;
        return r->claim->n_iov;
    }
    one->dst = r->buf;
    one->len = r->hdr.payload_len;
    *iov_p = one;
    return 1;
}

/* What the node sends back on the connection (kind 0: nothing). */
typedef struct tp_reply {
    uint32_t kind;               /* FLX_TP_WELCOME or FLX_TP_STATUS */
    flx_kv_session_id_t sid;
    uint32_t state, refused;     /* STATUS: flx_kv_state_t; 1 when it answers a refused message */
    uint32_t len;
    uint8_t payload[FLX_TP_STATUS_MAX];
} tp_reply_t;

/* Checks one message (header bytes, data_len bytes of data) from connection conn ("ip:port" peer).
 * FLX_OK: accepted; *recv_p is non-NULL when data must be received into its destinations
 * (tp_recv_iov) before tp_core_recv_done. An error: refused, nothing touched; *drop_conn tells
 * whether the connection must be closed (a malformed header, an unknown session or a wrong token:
 * the peer is broken or hostile). *reply is what to send back either way. */
flx_status_t tp_core_ingest(tp_core_t *c, uint64_t conn, const char *peer, const void *hdr, size_t hdr_len,
                            uint64_t data_len, tp_recv_t **recv_p, tp_reply_t *reply, int *drop_conn);

/* The data of r has landed (r->status FLX_OK) or its transfer failed: checks the payload hash,
 * completes the claim or writes the statistics, updates the session, frees r. */
void tp_core_recv_done(tp_core_t *c, tp_recv_t *r);

/* Connection conn died or was found silent: fails the RESERVED/RECEIVING sessions it fed with
 * "peer <peer> <why>". Returns how many; *n_failed_p (when not NULL) is how many of the sessions it
 * fed had FAILED already. */
uint32_t tp_core_conn_failed(tp_core_t *c, uint64_t conn, const char *peer, const char *why, uint32_t *n_failed_p);
/* 1 when conn feeds a RESERVED/RECEIVING session (its silence matters). */
int tp_core_conn_active(tp_core_t *c, uint64_t conn);

/* Periodic work at now: expires deadlines and leases in the store, drops records of sessions the
 * store no longer has (closed elsewhere) once nothing is in flight into them, and lists connections
 * carrying receives of sessions that ended more than cancel_grace_ms ago (to be closed so UCX
 * cancels them; up to cap in conns_out, *n_conns_p). Returns the ns until the next due expiry
 * (UINT64_MAX: none). */
uint64_t tp_core_sweep(tp_core_t *c, uint64_t now, uint64_t *conns_out, uint32_t cap, uint32_t *n_conns_p);

/* Sessions whose state changed since last asked: for each that is READY, DECODING, FAILED or closed
 * and was not reported yet, fills a STATUS reply and the connections to send it to; returns how
 * many replies (up to cap). When it returns cap, the sessions it did not get to stay changed: call
 * again until it returns fewer. */
typedef struct tp_notice {
    tp_reply_t reply;
    uint64_t conns[TP_MAX_SESSION_CONNS];
    uint32_t n_conns;
} tp_notice_t;
uint32_t tp_core_notices(tp_core_t *c, tp_notice_t *out, uint32_t cap);

/* Fails session sid (RESERVED/RECEIVING) with reason; FLX_ERR_NOT_FOUND when unknown or closed. */
flx_status_t tp_core_fail(tp_core_t *c, flx_kv_session_id_t sid, const char *reason);
/* Fails every RESERVED/RECEIVING session of the core with reason (node shutting down). */
void tp_core_fail_all(tp_core_t *c, const char *reason);

/* Counters; session records kept (open, or closed with receives in flight). */
void tp_core_counters(tp_core_t *c, uint64_t *msgs, uint64_t *refused, uint64_t *kv_bytes);
uint32_t tp_core_n_sessions(tp_core_t *c);

#endif
