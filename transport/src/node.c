/*
 * node.c - the decode node's UCX receiver (flx/transport.h): listener, connections, active-message
 * handler, receives straight into the store, progress and completion threads.
 *
 * DESIGN
 * Threads. One progress thread owns the workers (created single-threaded): it accepts connections,
 * runs the active-message handler (tp_core_ingest: every check before memory is touched), posts
 * the receives, sends replies, and does the periodic work (expiry, liveness, cancelling receives of
 * failed sessions). It sleeps in poll() on the workers' event fds and an eventfd (tp_loop_wait_set),
 * with a timeout set by the next due time, and sleeps without timeout when it has no session and no
 * connection. Completed receives go to completion threads through a FIFO: hashing a payload and
 * building a layer's pyramid there overlaps the transfer of the next chunks instead of stalling the
 * worker. API calls (open, info, wait, close) go to the core and the store directly (both are
 * thread-safe) and wake the progress thread when its senders must hear something.
 *
 * Workers. The listener has a worker of its own, and every accepted connection gets a worker too,
 * destroyed with it. Over shared memory a worker's receive FIFO is written by its peers: a sender
 * claims an element, then fills it, and the receiver reads the elements in order. A peer stopped or
 * killed between the two (SIGSTOP, a cgroup freeze, a debugger, the OOM killer) leaves an element
 * that is never finished, and every message behind it waits for ever. One worker per connection
 * keeps that to the peer that did it: its connection goes silent and is dropped, and the others go
 * on (test_prefill_procs: frozen-mid-send). The price is a worker's transports per connection
 * (docs/transfer.md has the memory and descriptors it costs).
 *
 * Receives. A KV chunk whose claim is one contiguous range is received with a contiguous datatype:
 * UCX then runs its zero-copy rendezvous (CMA get over shared memory, put over TCP, RDMA read), the
 * bytes landing in the store's blocks. Otherwise the claim's list goes to UCP as an IOV datatype
 * (flx_kv_iov_t and ucp_dt_iov_t are laid out alike); UCX 1.13 moves such data as active-message
 * fragments and unpacks them in place. Eager data (small chunks, statistics) is copied from UCX's
 * buffer into the destinations inside the handler. Nothing is staged in node memory.
 *
 * Connections. A connection exists from the listener's request to the completion of its close.
 * It is taken for dead when UCX says so (error callback) or when it feeds a session and has been
 * silent for liveness_ms, and dropped when it sent a message refused before its token matched;
 * either way the sessions it fed fail with the reason and its messages are ignored from then on.
 * In PEER mode it is then closed forcibly, which cancels its receives. In NONE mode UCX 1.13 can
 * neither cancel a receive nor tell a stale endpoint from a live one (messages name the receiving
 * endpoint by its address), so the endpoint stays open, inert, until UCX reports its peer gone;
 * the worker's destruction takes what is left at shutdown. A connection is freed only when its
 * close completed and no receive of it is in flight, so completion callbacks never see freed
 * memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/transport.h"
#include "flx/util.h"
#include "tp_core.h"
#include "tp_ucx.h"

#define MOD "transport"
#define SPIN_NS 30000u              /* progress without sleeping while receives are in flight */
#define SHUTDOWN_WAIT_NS 5000000000ull

_Static_assert(sizeof(flx_kv_iov_t) == sizeof(ucp_dt_iov_t) && offsetof(flx_kv_iov_t, dst) == offsetof(ucp_dt_iov_t, buffer) &&
                   offsetof(flx_kv_iov_t, len) == offsetof(ucp_dt_iov_t, length),
               "a claim's list is handed to UCP as is");

typedef struct conn {
    struct conn *next;
    struct flx_tp_node *node;
    uint64_t id;
    ucp_worker_h worker;      /* the connection's own: its peer writes into no one else's FIFO */
    int worker_fd;
    ucp_ep_h ep;
    char peer[64];
    uint64_t last_seen;       /* flx_now_ns of the last message */
    uint32_t inflight;        /* receives posted and not completed */
    int failed;               /* dead (UCX error, silence) or dropped (refused message) */
    int lost;                 /* failed because its peer went (UCX error) or fell silent, not by the node */
    int flush_close;          /* dropped: flush the reply before closing */
    char why[128];
    int handled;              /* its sessions were failed */
    int peer_gone;            /* UCX reported the endpoint failed: the peer can send nothing more */
    ucs_status_t gone_status; /* what UCX reported */
    int closing, closed;
    void *close_req;
} conn_t;

struct flx_tp_node {
    tp_core_t core;
    flx_tp_err_mode_t err_mode;
    uint32_t liveness_ms, n_completers;
    char host[FLX_TP_HOST_MAX];
    uint16_t port;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    tp_loop_t loop;
    uint8_t *waddr;
    size_t waddr_len;
    pthread_t progress;
    int progress_started;
    pthread_t completers[16];
    tp_fifo_t done_q;
    int done_stop;
    atomic_int stop;
    atomic_int replan;        /* a deadline or lease changed: the periodic work is due now */

    /* progress thread only */
    conn_t *conns;
    uint64_t next_conn_id;
    ucp_worker_h *wset;       /* (FLX_TP_NODE_MAX_CONNS) the connections' workers and their fds, */
    int *wfds;                /* poll()'s entries (+ 2): wait_all's; never reallocated, as a */
    struct pollfd *pfds;      /* connection accepted inside it adds to the list it walks */

    /* read by info from any thread */
    atomic_uint_fast64_t conns_accepted, conns_failed, conns_left, inflight, contig, iov, eager;
    atomic_uint n_conns;
};

/* ---- replies ---- */

typedef struct out_msg {
    uint8_t hdr[FLX_TP_HDR_BYTES];
    uint8_t payload[FLX_TP_STATUS_MAX];
    ucp_dt_iov_t iov;         /* tp_am_send's storage */
} out_msg_t;

static void reply_sent(void *req, ucs_status_t status, void *user_data)
{
    free(user_data);
    ucp_request_free(req);
}

static void send_reply(struct flx_tp_node *n, conn_t *c, const tp_reply_t *r)
{
    if (c->closing || !c->ep) return;
    out_msg_t *m = malloc(sizeof *m);
    if (!m) return;
    flx_tp_hdr_t h = {.kind = r->kind, .sid = r->sid, .payload_len = r->len};
    if (r->kind == FLX_TP_STATUS) {
        h.arg0 = r->state;
        h.arg1 = r->refused;
    }
    flx_tp_hdr_encode(&h, m->hdr);
    memcpy(m->payload, r->payload, r->len);
    void *req = tp_am_send(c->ep, m->hdr, m->payload, r->len, UCP_AM_SEND_FLAG_EAGER, reply_sent, m, &m->iov);
    if (!UCS_PTR_IS_PTR(req)) free(m); /* done at once, or refused (a dead peer): nothing to wait for */
    (void)n;
}

/* ---- connections ---- */

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    conn_t *c = arg;
    c->peer_gone = 1;
    c->gone_status = status;
    if (c->failed) return;
    c->failed = 1;
    c->lost = 1;
    snprintf(c->why, sizeof c->why, "failed: %s (UCX)", ucs_status_string(status));
}

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param);

/* A connection's worker with the handler of its messages (arg: the connection). */
static flx_status_t conn_worker(struct flx_tp_node *n, conn_t *c)
{
    flx_status_t st = tp_worker_open(n->ctx, "connection worker", &c->worker);
    if (st) return st;
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                 .id = FLX_TP_AM_ID, .cb = am_handler, .arg = c, .flags = UCP_AM_FLAG_WHOLE_MSG};
    ucs_status_t us = ucp_worker_set_am_recv_handler(c->worker, &hp);
    if (us == UCS_OK) us = ucp_worker_get_efd(c->worker, &c->worker_fd);
    if (us == UCS_OK) return FLX_OK;
    ucp_worker_destroy(c->worker);
    c->worker = NULL;
    return tp_ucs_error(us, "connection worker");
}

static void conn_request(ucp_conn_request_h req, void *arg)
{
    struct flx_tp_node *n = arg;
    if (atomic_load(&n->stop)) {
        ucp_listener_reject(n->listener, req);
        return;
    }
    if (atomic_load(&n->n_conns) >= FLX_TP_NODE_MAX_CONNS) {
        flx_log_warn(MOD, "connection refused: %u connections open, the most a node keeps", FLX_TP_NODE_MAX_CONNS);
        ucp_listener_reject(n->listener, req);
        return;
    }
    conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        flx_log_warn(MOD, "connection refused: out of memory");
        ucp_listener_reject(n->listener, req);
        return;
    }
    c->node = n;
    c->id = ++n->next_conn_id;
    snprintf(c->peer, sizeof c->peer, "?");
    ucp_conn_request_attr_t ra = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(req, &ra) == UCS_OK) tp_sockaddr_str(&ra.client_address, c->peer, sizeof c->peer);
    if (conn_worker(n, c)) {
        flx_log_warn(MOD, "connection from %s refused: %s (%u connections open, each with a UCX worker of its own: "
                          "out of file descriptors or memory?)",
                     c->peer, flx_error_msg(), atomic_load(&n->n_conns));
        ucp_listener_reject(n->listener, req);
        free(c);
        return;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .conn_request = req, .err_mode = tp_err_mode(n->err_mode),
                          .err_handler = {.cb = ep_error, .arg = c}};
    ucs_status_t us = ucp_ep_create(c->worker, &ep, &c->ep);
    if (us != UCS_OK) {
        flx_log_warn(MOD, "connection from %s: endpoint: %s", c->peer, ucs_status_string(us));
        ucp_worker_destroy(c->worker);
        free(c);
        return;
    }
    c->last_seen = flx_now_ns();
    c->next = n->conns;
    n->conns = c;
    atomic_fetch_add(&n->conns_accepted, 1);
    atomic_fetch_add(&n->n_conns, 1);
    flx_log_info(MOD, "connection %llu from %s", (unsigned long long)c->id, c->peer);
}

static void conn_close(struct flx_tp_node *n, conn_t *c)
{
    if (c->closing) return;
    c->closing = 1;
    /* FORCE cancels what is in flight (PEER mode only: UCX 1.13 refuses it otherwise); a dropped
     * connection is flushed so its last reply reaches the peer. */
    int force = n->err_mode == FLX_TP_ERR_PEER && !c->flush_close;
    if (c->peer_gone && !force) {
        /* Without FORCE a close flushes, and a flush towards a peer that is gone can only fail (UCX
         * 1.13 logs each failed lane as an ERROR on stdout). Nothing can reach that peer, so nothing
         * is flushed: the endpoint goes with the connection's worker. */
        c->closed = 1;
        return;
    }
    ucp_request_param_t cp = {.op_attr_mask = force ? UCP_OP_ATTR_FIELD_FLAGS : 0,
                              .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(c->ep, &cp);
    if (UCS_PTR_IS_PTR(req)) {
        c->close_req = req;
    } else {
        if (UCS_PTR_IS_ERR(req)) /* a peer already gone: nothing left to close */
            flx_log_info(MOD, "closing connection from %s: %s", c->peer, ucs_status_string(UCS_PTR_STATUS(req)));
        c->closed = 1;
    }
}

/* Failed connections fail their sessions and close; closed ones with nothing in flight go. */
static void conns_tend(struct flx_tp_node *n)
{
    for (conn_t **pp = &n->conns; *pp;) {
        conn_t *c = *pp;
        if (c->failed && !c->handled) {
            c->handled = 1;
            uint32_t was_failed = 0, k = tp_core_conn_failed(&n->core, c->id, c->peer, c->why, &was_failed);
            /* A peer that goes once its sessions are READY (or closed) is a prefill node leaving, the
             * normal end of a connection: counted apart from the connections lost with a session
             * that failed (now, or just before by the same loss: a receive error of the dead peer),
             * which an operator alerts on. */
            const int left = !k && !was_failed;
            if (c->lost) atomic_fetch_add(left ? &n->conns_left : &n->conns_failed, 1);
            if (c->lost && left)
                flx_log_info(MOD, "connection %llu from %s: the peer went (%s) with none of its sessions receiving",
                             (unsigned long long)c->id, c->peer,
                             c->peer_gone ? ucs_status_string(c->gone_status) : c->why);
            else
                flx_log_write(k ? FLX_LOG_WARN : FLX_LOG_INFO, MOD, "connection %llu from %s %s: %u session(s) failed",
                              (unsigned long long)c->id, c->peer, c->why, k);
        }
        /* Without peer error handling UCX 1.13 names the receiving endpoint by its address in every
         * message (no indirect ids): closing it while its peer may still send would let the next
         * message dereference a freed endpoint. Such a connection stays open, inert (its messages
         * are dropped), until UCX reports the peer gone. */
        /* A connection dropped for a refused message closes flushing (its last reply must reach the
         * peer) only once no receive is in flight into it: a flushing close cancels nothing, so with a
         * frozen peer those receives, and the session's memory, would be held for ever. Until then it
         * stays inert; if its session ends first, the grace period closes it with FORCE (periodic). */
        const int wait_receives = c->flush_close && c->inflight && !c->peer_gone;
        if (c->failed && !c->closing && !wait_receives && (n->err_mode == FLX_TP_ERR_PEER || c->peer_gone))
            conn_close(n, c);
        if (c->close_req && ucp_request_check_status(c->close_req) != UCS_INPROGRESS) {
            ucp_request_free(c->close_req);
            c->close_req = NULL;
            c->closed = 1;
        }
        if (c->closed && !c->inflight) {
            *pp = c->next;
            atomic_fetch_sub(&n->n_conns, 1);
            ucp_worker_destroy(c->worker); /* its callbacks name c: before the free */
            free(c);
            continue;
        }
        pp = &c->next;
    }
}

static conn_t *conn_by_id(struct flx_tp_node *n, uint64_t id)
{
    for (conn_t *c = n->conns; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

/* ---- data ---- */

static void recv_done_ucx(void *req, ucs_status_t status, size_t length, void *user_data)
{
    tp_recv_t *r = user_data;
    conn_t *c = r->user;
    struct flx_tp_node *n = c->node;
    r->status = status != UCS_OK ? tp_status_from_ucs(status)
                : length != r->hdr.payload_len ? FLX_ERR_FORMAT : FLX_OK;
    if (status != UCS_OK) snprintf(r->why, sizeof r->why, "%s (UCX)", ucs_status_string(status));
    else if (r->status) snprintf(r->why, sizeof r->why, "%zu bytes landed of %llu", length,
                                 (unsigned long long)r->hdr.payload_len);
    r->t_done_ns = flx_now_ns();
    c->inflight--;
    atomic_fetch_sub(&n->inflight, 1);
    tp_fifo_push(&n->done_q, r);
    ucp_request_free(req);
}

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    conn_t *c = arg;
    struct flx_tp_node *n = c->node;
    const int ours = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep == c->ep;
    if (!ours || c->failed || c->closing) {
        /* Not from the endpoint this node accepted (senders set UCP_AM_SEND_FLAG_REPLY), or from one
         * being torn down: dropped (for rendezvous data, UCX acknowledges it unreceived). */
        flx_log_debug(MOD, "message of %zu bytes from an unknown or closing endpoint dropped", length);
        return UCS_OK;
    }
    c->last_seen = flx_now_ns();
    flx_log_debug(MOD, "message of %zu + %zu bytes on connection %llu%s", header_length, length,
                  (unsigned long long)c->id, param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV ? " (rendezvous)" : "");
    tp_recv_t *r;
    tp_reply_t reply;
    int drop;
    flx_status_t st = tp_core_ingest(&n->core, c->id, c->peer, header, header_length, length, &r, &reply, &drop);
    if (reply.kind) send_reply(n, c, &reply);
    if (st != FLX_OK) flx_log_info(MOD, "from %s: %s", c->peer, flx_error_msg());
    if (drop) {
        c->failed = 1;
        c->flush_close = 1;
        snprintf(c->why, sizeof c->why, "sent a message that was refused (%s): connection closed", flx_status_name(st));
        return UCS_OK;
    }
    if (!r) return UCS_OK;
    r->user = c;
    const flx_kv_iov_t *iov;
    flx_kv_iov_t one;
    const uint32_t niov = tp_recv_iov(r, &iov, &one);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        const uint8_t *src = data;
        for (uint32_t i = 0; i < niov; i++) {
            memcpy(iov[i].dst, src, iov[i].len);
            src += iov[i].len;
        }
        r->status = FLX_OK;
        r->t_done_ns = flx_now_ns();
        if (r->claim) atomic_fetch_add(&n->eager, 1);
        tp_fifo_push(&n->done_q, r);
        return UCS_OK;
    }
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_DATATYPE,
                              .cb.recv_am = recv_done_ucx, .user_data = r};
    void *buf;
    size_t count;
    if (niov == 1) {
        rp.datatype = ucp_dt_make_contig(1);
        buf = iov[0].dst;
        count = iov[0].len;
        if (r->claim) atomic_fetch_add(&n->contig, 1);
    } else {
        rp.datatype = ucp_dt_make_iov();
        buf = (void *)iov;
        count = niov;
        atomic_fetch_add(&n->iov, 1);
    }
    c->inflight++;
    atomic_fetch_add(&n->inflight, 1);
    void *req = ucp_am_recv_data_nbx(c->worker, data, buf, count, &rp);
    if (UCS_PTR_IS_PTR(req)) return UCS_INPROGRESS;
    c->inflight--;
    atomic_fetch_sub(&n->inflight, 1);
    r->status = UCS_PTR_IS_ERR(req) ? tp_status_from_ucs(UCS_PTR_STATUS(req)) : FLX_OK;
    if (UCS_PTR_IS_ERR(req)) snprintf(r->why, sizeof r->why, "%s (UCX)", ucs_status_string(UCS_PTR_STATUS(req)));
    r->t_done_ns = flx_now_ns();
    tp_fifo_push(&n->done_q, r);
    return UCS_OK;
}

/* Messages to the listener's worker: no connection of this node sends there (each has a worker of
 * its own); whatever comes (a peer that used the advertised worker address) is dropped. */
static ucs_status_t am_stray(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)param;
    flx_log_debug(MOD, "message of %zu bytes to the listener's worker dropped", length);
    return UCS_OK;
}

/* ---- threads ---- */

/* tp_loop_wait_set over the listener's worker and every connection's. */
static void wait_all(struct flx_tp_node *n, int timeout_ms, uint64_t spin_ns)
{
    size_t i = 0;
    for (conn_t *c = n->conns; c && i < FLX_TP_NODE_MAX_CONNS; c = c->next, i++) {
        n->wset[i] = c->worker;
        n->wfds[i] = c->worker_fd;
    }
    tp_loop_wait_set(&n->loop, n->wset, n->wfds, i, n->pfds, timeout_ms, spin_ns);
}

static void *completer_main(void *arg)
{
    struct flx_tp_node *n = arg;
    tp_recv_t *r;
    while ((r = tp_fifo_pop_wait(&n->done_q, &n->done_stop))) {
        tp_core_recv_done(&n->core, r);
        tp_loop_wake(&n->loop); /* its senders may have to hear how the session ended */
    }
    return NULL;
}

static void send_notices(struct flx_tp_node *n)
{
    tp_notice_t no[32];
    uint32_t k;
    while ((k = tp_core_notices(&n->core, no, FLX_ARRAY_SIZE(no))) > 0) {
        for (uint32_t i = 0; i < k; i++)
            for (uint32_t j = 0; j < no[i].n_conns; j++) {
                conn_t *c = conn_by_id(n, no[i].conns[j]);
                /* a dropped connection still open (NONE mode, or waiting for its receives) is told
                 * too: its sender hears how its session ended instead of waiting for its timeout */
                if (c && !c->peer_gone) send_reply(n, c, &no[i].reply);
            }
        if (k < FLX_ARRAY_SIZE(no)) break;
    }
}

/* Expiry, cancelling receives of ended sessions, liveness. Returns ms until it is due again (-1:
 * nothing will be). */
static int periodic(struct flx_tp_node *n, uint64_t now)
{
    uint64_t grace_conns[64];
    uint32_t n_grace = 0;
    uint64_t due = tp_core_sweep(&n->core, now, grace_conns, FLX_ARRAY_SIZE(grace_conns), &n_grace);
    for (uint32_t i = 0; i < n_grace; i++) {
        conn_t *c = conn_by_id(n, grace_conns[i]);
        if (c && !c->closing) {
            flx_log_warn(MOD, "connection from %s: closing it to cancel receives into a failed session", c->peer);
            c->flush_close = 0;   /* what is in flight is cancelled (FORCE), not waited for */
            if (!c->failed) {
                c->failed = 1;
                snprintf(c->why, sizeof c->why, "closed: receives into a failed session were still in flight");
            }
        }
    }
    const uint64_t live_ns = (uint64_t)n->liveness_ms * 1000000;
    int any_conn = 0;
    for (conn_t *c = n->conns; c; c = c->next) {
        if (c->failed || c->closing) continue;
        any_conn = 1;
        if (now - c->last_seen > live_ns && tp_core_conn_active(&n->core, c->id)) {
            c->failed = 1;
            c->lost = 1;
            snprintf(c->why, sizeof c->why, "silent for %.0f ms (no data, no heartbeat: dead or stalled)",
                     (double)(now - c->last_seen) / 1e6);
        }
    }
    uint64_t next = due;
    if (any_conn) next = FLX_MIN(next, live_ns / 4);
    if (tp_core_n_sessions(&n->core)) next = FLX_MIN(next, 1000000000ull); /* records to collect, grace timers */
    if (next == UINT64_MAX) return -1;
    return (int)FLX_MIN((next + 999999) / 1000000, 3600000ull);
}

static void *progress_main(void *arg)
{
    struct flx_tp_node *n = arg;
    uint64_t next_periodic = 0, stop_at = 0;
    int timeout = 0;
    for (;;) {
        conns_tend(n);
        send_notices(n);
        const uint64_t now = flx_now_ns();
        if (now >= next_periodic || atomic_exchange(&n->replan, 0)) {
            timeout = periodic(n, now);
            next_periodic = timeout < 0 ? UINT64_MAX : now + (uint64_t)timeout * 1000000;
            conns_tend(n);
            send_notices(n);
        } else {
            timeout = (int)FLX_MIN((next_periodic - now + 999999) / 1000000, 3600000ull);
        }
        if (atomic_load(&n->stop)) {
            if (!stop_at) {
                stop_at = now;
                if (n->listener) ucp_listener_destroy(n->listener);
                n->listener = NULL;
                tp_core_fail_all(&n->core, "node shutting down");
                send_notices(n);
                for (conn_t *c = n->conns; c; c = c->next) {
                    if (!c->failed) {
                        c->failed = 1;
                        snprintf(c->why, sizeof c->why, "closed: node shutting down");
                    }
                    if (c->inflight) c->flush_close = 0;   /* a dropped one's receives: cancelled now */
                }
                conns_tend(n);
            }
            /* PEER mode closed every endpoint above; NONE mode leaves them to the worker's destruction
             * (conns_tend says why), so it waits for the receives only. */
            if (!atomic_load(&n->inflight) && (n->err_mode == FLX_TP_ERR_NONE || !n->conns)) break;
            if (now - stop_at > SHUTDOWN_WAIT_NS) {
                flx_log_warn(MOD, "shutdown: %llu receive(s) still in flight after %.0f s (UCX cannot cancel them "
                                  "in this error mode); releasing the worker",
                             (unsigned long long)atomic_load(&n->inflight), SHUTDOWN_WAIT_NS / 1e9);
                break;
            }
            timeout = 10;
        }
        wait_all(n, timeout, atomic_load(&n->inflight) ? SPIN_NS : 0);
    }
    return NULL;
}

/* ---- API ---- */

flx_status_t flx_tp_node_create(const flx_tp_node_params_t *p, flx_tp_node_h *node_p)
{
    if (!p || !node_p || !p->store) return flx_error_set(FLX_ERR_INVALID, "transport node: store is required");
    const uint64_t m = p->field_mask;
    const char *lhost = (m & FLX_TP_NODE_FIELD_LISTEN) && p->listen_host ? p->listen_host : "127.0.0.1";
    const uint16_t lport = (m & FLX_TP_NODE_FIELD_LISTEN) ? p->listen_port : 0;
    const char *ahost = (m & FLX_TP_NODE_FIELD_ADVERTISE) && p->advertise_host ? p->advertise_host : lhost;
    if (!strcmp(ahost, "0.0.0.0") || !strcmp(ahost, "::"))
        return flx_error_set(FLX_ERR_INVALID, "transport node: listening on %s needs an advertise_host", ahost);
    if (strlen(ahost) >= FLX_TP_HOST_MAX)
        return flx_error_set(FLX_ERR_INVALID, "transport node: advertise_host longer than %u bytes", FLX_TP_HOST_MAX - 1);
    const flx_tp_err_mode_t em = (m & FLX_TP_NODE_FIELD_ERR_MODE) ? p->err_mode : FLX_TP_ERR_PEER;
    if (em != FLX_TP_ERR_PEER && em != FLX_TP_ERR_NONE)
        return flx_error_set(FLX_ERR_INVALID, "transport node: err_mode %d unknown", (int)em);
    tp_core_params_t cp = {.store = p->store,
                           .liveness_ms = (m & FLX_TP_NODE_FIELD_LIVENESS) ? p->liveness_ms : 10000,
                           .default_timeout_ms = (m & FLX_TP_NODE_FIELD_TIMEOUTS) ? p->default_timeout_ms : 60000,
                           .default_lease_ms = (m & FLX_TP_NODE_FIELD_TIMEOUTS) ? p->default_lease_ms : 60000,
                           .cancel_grace_ms = (m & FLX_TP_NODE_FIELD_GRACE) ? p->cancel_grace_ms : 1000,
                           .require_hash = (m & FLX_TP_NODE_FIELD_CHECKSUM) ? p->require_payload_hash != 0 : 1};
    if (cp.liveness_ms < 4 || cp.liveness_ms > 3600000)
        return flx_error_set(FLX_ERR_INVALID, "transport node: liveness_ms %u outside [4, 3600000]", cp.liveness_ms);
    if (cp.default_timeout_ms == 0 || cp.default_lease_ms == 0)
        return flx_error_set(FLX_ERR_INVALID, "transport node: default timeout %u ms and lease %u ms must be > 0",
                             cp.default_timeout_ms, cp.default_lease_ms);
    const uint32_t nc = (m & FLX_TP_NODE_FIELD_THREADS) ? p->n_completion_threads : 2;
    if (nc == 0 || nc > 16) return flx_error_set(FLX_ERR_INVALID, "transport node: n_completion_threads %u outside [1, 16]", nc);

    struct flx_tp_node *n = calloc(1, sizeof *n);
    if (!n) return flx_error_set(FLX_ERR_NOMEM, "transport node");
    flx_status_t st;
    n->err_mode = em;
    n->liveness_ms = cp.liveness_ms;
    n->loop.wake_fd = -1;
    snprintf(n->host, sizeof n->host, "%s", ahost);
    tp_fifo_init(&n->done_q);
    if ((st = tp_core_init(&n->core, &cp))) {
        tp_fifo_fini(&n->done_q);
        free(n);
        return st;
    }
    n->wset = malloc(FLX_TP_NODE_MAX_CONNS * sizeof *n->wset);
    n->wfds = malloc(FLX_TP_NODE_MAX_CONNS * sizeof *n->wfds);
    n->pfds = malloc((FLX_TP_NODE_MAX_CONNS + 2) * sizeof *n->pfds);
    if (!n->wset || !n->wfds || !n->pfds) {
        st = flx_error_set(FLX_ERR_NOMEM, "transport node");
        goto err;
    }
    if ((st = tp_ucx_open("flx-node", &n->ctx, &n->worker))) goto err;
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                 .id = FLX_TP_AM_ID, .cb = am_stray, .arg = n, .flags = UCP_AM_FLAG_WHOLE_MSG};
    ucs_status_t us = ucp_worker_set_am_recv_handler(n->worker, &hp);
    if (us != UCS_OK) {
        st = tp_ucs_error(us, "transport node: active-message handler");
        goto err;
    }
    ucp_address_t *wa;
    size_t wal;
    if ((us = ucp_worker_get_address(n->worker, &wa, &wal)) != UCS_OK) {
        st = tp_ucs_error(us, "transport node: worker address");
        goto err;
    }
    n->waddr = malloc(wal);
    if (n->waddr) memcpy(n->waddr, wa, wal);
    n->waddr_len = wal;
    ucp_worker_release_address(n->worker, wa);
    if (!n->waddr) {
        st = flx_error_set(FLX_ERR_NOMEM, "worker address");
        goto err;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    if ((st = tp_resolve(lhost, lport, &ss, &sl))) goto err;
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sl},
                                .conn_handler = {.cb = conn_request, .arg = n}};
    if ((us = ucp_listener_create(n->worker, &lp, &n->listener)) != UCS_OK) {
        char what[FLX_TP_HOST_MAX + 64];
        snprintf(what, sizeof what, "transport node: listening on %s:%u (UCX_TLS must include tcp)", lhost, lport);
        st = tp_ucs_error(us, what);
        n->listener = NULL;
        goto err;
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if ((us = ucp_listener_query(n->listener, &la)) != UCS_OK) {
        st = tp_ucs_error(us, "transport node: listener address");
        goto err;
    }
    n->port = ntohs(la.sockaddr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&la.sockaddr)->sin6_port
                                                      : ((struct sockaddr_in *)&la.sockaddr)->sin_port);
    if ((st = tp_loop_init(&n->loop, n->worker))) goto err;
    for (uint32_t i = 0; i < nc; i++) {
        if (pthread_create(&n->completers[i], NULL, completer_main, n) != 0) {
            st = flx_error_set(FLX_ERR_NOMEM, "transport node: completion thread %u", i);
            goto err;
        }
        n->n_completers = i + 1;
    }
    if (pthread_create(&n->progress, NULL, progress_main, n) != 0) {
        st = flx_error_set(FLX_ERR_NOMEM, "transport node: progress thread");
        goto err;
    }
    n->progress_started = 1;
    flx_log_info(MOD, "node listening on %s:%u (advertised %s), error mode %s, liveness %u ms", lhost, n->port, n->host,
                 em == FLX_TP_ERR_PEER ? "peer" : "none", n->liveness_ms);
    *node_p = n;
    return FLX_OK;
err:
    flx_tp_node_destroy(n);
    return st;
}

void flx_tp_node_destroy(flx_tp_node_h n)
{
    if (!n) return;
    atomic_store(&n->stop, 1);
    if (n->progress_started) {
        tp_loop_wake(&n->loop);
        pthread_join(n->progress, NULL);
    } else if (n->listener) {
        ucp_listener_destroy(n->listener);
    }
    tp_fifo_stop(&n->done_q, &n->done_stop);
    for (uint32_t i = 0; i < n->n_completers; i++) pthread_join(n->completers[i], NULL);
    /* Whatever UCX still owed (receives it could not cancel, endpoints left open) ends with each
     * connection's worker; the connection, which its callbacks name, goes after it. */
    for (conn_t *c = n->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->close_req) ucp_request_free(c->close_req);
        ucp_worker_destroy(c->worker);
        free(c);
    }
    tp_loop_fini(&n->loop);
    tp_ucx_close(n->ctx, n->worker);
    free(n->wset);
    free(n->wfds);
    free(n->pfds);
    tp_recv_t *r;
    while ((r = tp_fifo_pop(&n->done_q))) tp_core_recv_done(&n->core, r);
    tp_core_fini(&n->core);
    tp_fifo_fini(&n->done_q);
    free(n->waddr);
    free(n);
}

void flx_tp_node_info(flx_tp_node_h n, flx_tp_node_info_t *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->host, sizeof info->host, "%s", n->host);
    info->port = n->port;
    info->worker_address = n->waddr;
    info->worker_address_len = n->waddr_len;
    info->err_mode = n->err_mode;
    info->liveness_ms = n->liveness_ms;
    info->n_conns = atomic_load(&n->n_conns);
    info->conns_accepted = atomic_load(&n->conns_accepted);
    info->conns_failed = atomic_load(&n->conns_failed);
    info->conns_left = atomic_load(&n->conns_left);
    info->receives_inflight = atomic_load(&n->inflight);
    info->contig_receives = atomic_load(&n->contig);
    info->iov_receives = atomic_load(&n->iov);
    info->eager_receives = atomic_load(&n->eager);
    tp_core_counters(&n->core, &info->msgs, &info->msgs_refused, &info->kv_bytes);
}

flx_status_t flx_tp_session_open(flx_tp_node_h n, const flx_tp_open_params_t *p, flx_tp_session_desc_t *desc_p)
{
    if (!n || !p || !desc_p) return flx_error_set(FLX_ERR_INVALID, "session open: NULL argument");
    flx_tp_session_desc_t d;
    flx_status_t st = tp_core_open(&n->core, p, &d);
    if (st) return st;
    snprintf(d.host, sizeof d.host, "%s", n->host);
    d.port = n->port;
    d.worker_address = n->waddr;
    d.worker_address_len = n->waddr_len;
    *desc_p = d;
    atomic_store(&n->replan, 1); /* its deadline may be the next thing due */
    tp_loop_wake(&n->loop);
    return FLX_OK;
}

flx_status_t flx_tp_session_info(flx_tp_node_h n, flx_kv_session_id_t sid, flx_tp_session_info_t *info_p)
{
    if (!n || !info_p) return flx_error_set(FLX_ERR_INVALID, "session info: NULL argument");
    return tp_core_info(&n->core, sid, info_p);
}

flx_status_t flx_tp_session_wait(flx_tp_node_h n, flx_kv_session_id_t sid, uint32_t timeout_ms,
                                 flx_tp_session_info_t *info_p)
{
    if (!n) return flx_error_set(FLX_ERR_INVALID, "session wait: NULL node");
    flx_tp_session_info_t info;
    flx_status_t st = tp_core_info(&n->core, sid, &info); /* only this node's sessions */
    if (st) return st;
    flx_kv_state_t state;
    if ((st = flx_kv_session_wait(n->core.store, sid, (uint64_t)timeout_ms * 1000000, &state))) return st;
    if (info_p && (st = tp_core_info(&n->core, sid, info_p))) return st;
    return FLX_OK;
}

flx_status_t flx_tp_session_renew(flx_tp_node_h n, flx_kv_session_id_t sid, uint32_t lease_ms)
{
    flx_tp_session_info_t info;
    flx_status_t st = tp_core_info(&n->core, sid, &info);
    if (st) return st;
    if (lease_ms == 0) return flx_error_set(FLX_ERR_INVALID, "lease_ms is 0");
    if ((st = flx_kv_session_renew(n->core.store, sid, (uint64_t)lease_ms * 1000000))) return st;
    atomic_store(&n->replan, 1);
    tp_loop_wake(&n->loop);
    return FLX_OK;
}

flx_status_t flx_tp_session_fail(flx_tp_node_h n, flx_kv_session_id_t sid, const char *reason)
{
    if (!n || !reason) return flx_error_set(FLX_ERR_INVALID, "session fail: NULL argument");
    flx_status_t st = tp_core_fail(&n->core, sid, reason);
    tp_loop_wake(&n->loop); /* its senders hear it */
    return st;
}

flx_status_t flx_tp_session_close(flx_tp_node_h n, flx_kv_session_id_t sid)
{
    if (!n) return flx_error_set(FLX_ERR_INVALID, "session close: NULL node");
    flx_status_t st = tp_core_close(&n->core, sid);
    tp_loop_wake(&n->loop);
    return st;
}
