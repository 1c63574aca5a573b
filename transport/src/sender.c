/*
 * sender.c - the prefill side of the KV transfer (flx/transport.h): one connection to a node's
 * listener, sends queued from the caller's thread to a progress thread, heartbeats, the node's
 * WELCOME and STATUS replies; and the chunk planner.
 *
 * DESIGN
 * The worker is single-threaded and owned by the sender's progress thread, like the node's: API
 * calls build the header (and hash the payload) on the caller's thread, queue it and wake the
 * thread, which posts it to UCX. The caller keeps producing (a prefill computing its next layer)
 * while UCX moves the bytes, and heartbeats go out on time even while the caller computes for
 * seconds. Every message carries UCP_AM_SEND_FLAG_REPLY so the node can tell which connection it
 * came from. Eager messages go as one-entry IOVs (tp_am_send: tp_ucx.h says why).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flx/log.h"
#include "flx/transport.h"
#include "flx/util.h"
#include "tp_ucx.h"

#define MOD "transport"

typedef struct send_cmd {
    void *next;                 /* tp_fifo link */
    struct flx_tp_sender *s;
    uint8_t hdr[FLX_TP_HDR_BYTES];
    const void *payload;
    uint64_t len;
    uint8_t *owned;             /* payload owned by the command (statistics) */
    uint32_t flags;             /* FLX_TP_SEND_RNDV / EAGER */
    ucp_dt_iov_t iov;           /* tp_am_send's storage */
    flx_tp_sent_fn done;
    void *ctx;
} send_cmd_t;

typedef struct sess_ent {
    struct sess_ent *next;
    flx_kv_session_id_t sid;
    int have_welcome;
    flx_tp_welcome_t welcome;
    flx_kv_state_t state;       /* last STATUS; RESERVED = none */
    int refused;                /* the last STATUS answered a refused message */
    uint64_t n_status;
    char reason[FLX_TP_STATUS_MAX + 1];
} sess_ent_t;

struct flx_tp_sender {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    tp_loop_t loop;
    flx_tp_err_mode_t err_mode;
    uint32_t connect_timeout_ms;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    tp_fifo_t cmds;
    uint8_t hb_hdr[FLX_TP_HDR_BYTES];
    ucp_dt_iov_t hb_iov;
    int hb_inflight;            /* progress thread only */
    uint32_t rndv_window;       /* immutable after create */
    uint32_t rndv_inflight;     /* progress thread only: rendezvous sends posted, not completed */
    send_cmd_t *held;           /* progress thread only: the queue's head, waiting for the window */

    pthread_mutex_t lock;
    pthread_cond_t cv;
    /* guarded by lock */
    uint64_t n_posted, n_done, bytes_posted, bytes_done;
    int peer_failed;
    char error[FLX_TP_STATUS_MAX];
    sess_ent_t *sessions;
    uint32_t heartbeat_ms;      /* 0 until a WELCOME */
};

static void note_error_locked(struct flx_tp_sender *s, const char *what)
{
    if (!s->error[0]) snprintf(s->error, sizeof s->error, "%s", what);
}

static sess_ent_t *sess_get_locked(struct flx_tp_sender *s, flx_kv_session_id_t sid, int create)
{
    for (sess_ent_t *e = s->sessions; e; e = e->next)
        if (e->sid == sid) return e;
    if (!create) return NULL;
    sess_ent_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->sid = sid;
    e->next = s->sessions;
    s->sessions = e;
    return e;
}

/* ---- progress thread ---- */

static void cmd_finish(send_cmd_t *c, flx_status_t st, const char *why)
{
    struct flx_tp_sender *s = c->s;
    pthread_mutex_lock(&s->lock);
    s->n_done++;
    if (st == FLX_OK) s->bytes_done += c->len;
    else note_error_locked(s, why);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    if (c->done) c->done(c->ctx, st);
    free(c->owned);
    free(c);
}

static void sent(void *req, ucs_status_t status, void *user_data)
{
    send_cmd_t *c = user_data;
    if (c->flags & FLX_TP_SEND_RNDV) c->s->rndv_inflight--; /* runs on the progress thread */
    char why[96];
    snprintf(why, sizeof why, "send: %s", ucs_status_string(status));
    cmd_finish(c, tp_status_from_ucs(status), why);
    ucp_request_free(req);
}

static void post(struct flx_tp_sender *s, send_cmd_t *c)
{
    const uint32_t flags = UCP_AM_SEND_FLAG_REPLY | (c->flags & FLX_TP_SEND_RNDV ? UCP_AM_SEND_FLAG_RNDV : 0) |
                           (c->flags & FLX_TP_SEND_EAGER ? UCP_AM_SEND_FLAG_EAGER : 0);
    void *req = tp_am_send(s->ep, c->hdr, c->payload, c->len, flags, sent, c, &c->iov);
    if (UCS_PTR_IS_PTR(req)) {
        if (c->flags & FLX_TP_SEND_RNDV) s->rndv_inflight++;
        return;
    }
    char why[96];
    snprintf(why, sizeof why, "send: %s", ucs_status_string(UCS_PTR_STATUS(req)));
    cmd_finish(c, tp_status_from_ucs(UCS_PTR_STATUS(req)), why);
}

static void hb_sent(void *req, ucs_status_t status, void *user_data)
{
    struct flx_tp_sender *s = user_data;
    s->hb_inflight = 0;
    ucp_request_free(req);
}

static void heartbeat(struct flx_tp_sender *s)
{
    if (s->hb_inflight) return; /* the last one has not left yet: no use queueing more */
    void *req = tp_am_send(s->ep, s->hb_hdr, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER, hb_sent, s,
                           &s->hb_iov);
    s->hb_inflight = UCS_PTR_IS_PTR(req);
}

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    struct flx_tp_sender *s = arg;
    flx_tp_hdr_t h;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK; /* nodes send nothing large */
    if (flx_tp_hdr_parse(header, header_length, length, &h) != FLX_OK) {
        flx_log_warn(MOD, "from the node: %s", flx_error_msg());
        return UCS_OK;
    }
    flx_tp_welcome_t w;
    if (h.kind == FLX_TP_WELCOME && flx_tp_welcome_parse(data, length, &w) != FLX_OK) {
        flx_log_warn(MOD, "from the node: %s", flx_error_msg());
        return UCS_OK;
    }
    if (h.kind != FLX_TP_WELCOME && h.kind != FLX_TP_STATUS) return UCS_OK;
    pthread_mutex_lock(&s->lock);
    sess_ent_t *e = sess_get_locked(s, h.sid, 1);
    if (e && h.kind == FLX_TP_WELCOME) {
        e->welcome = w;
        e->have_welcome = 1;
        if (!s->heartbeat_ms || w.heartbeat_ms < s->heartbeat_ms) {
            s->heartbeat_ms = w.heartbeat_ms;
            /* the progress loop may be about to sleep without a timeout (it had no pace before this
             * WELCOME): make it look again, or no heartbeat leaves until the caller sends something */
            tp_loop_wake(&s->loop);
        }
    } else if (e) {
        e->state = (flx_kv_state_t)h.arg0;
        e->refused = (int)h.arg1;
        e->n_status++;
        memcpy(e->reason, data, length);
        e->reason[length] = 0;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    return UCS_OK;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct flx_tp_sender *s = arg;
    char why[96];
    snprintf(why, sizeof why, "connection to the node failed: %s", ucs_status_string(status));
    pthread_mutex_lock(&s->lock);
    s->peer_failed = 1;
    note_error_locked(s, why);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
}

static void *progress_main(void *arg)
{
    struct flx_tp_sender *s = arg;
    uint64_t next_hb = 0;
    for (;;) {
        /* In queue order; a rendezvous send waits (and everything behind it) while the window is full. */
        for (;;) {
            send_cmd_t *c = s->held ? s->held : tp_fifo_pop(&s->cmds);
            s->held = NULL;
            if (!c) break;
            if ((c->flags & FLX_TP_SEND_RNDV) && s->rndv_inflight >= s->rndv_window) {
                s->held = c;
                break;
            }
            post(s, c);
        }
        if (atomic_load(&s->stop)) break;
        pthread_mutex_lock(&s->lock);
        const uint32_t hb = s->heartbeat_ms;
        const uint64_t inflight = s->n_posted - s->n_done;
        pthread_mutex_unlock(&s->lock);
        int timeout = -1;
        if (hb) {
            const uint64_t now = flx_now_ns();
            if (now >= next_hb) {
                heartbeat(s);
                next_hb = now + (uint64_t)hb * 1000000;
            }
            timeout = (int)((next_hb - now + 999999) / 1000000);
        }
        tp_loop_wait(&s->loop, timeout, inflight ? 30000 : 0);
    }
    /* Closing: FORCE cancels what is in flight (PEER mode; NONE flushes). A flush towards a node
     * that is gone can only fail (UCX logs it as an ERROR on stdout): that endpoint goes with the
     * worker instead. */
    pthread_mutex_lock(&s->lock);
    const int gone = s->peer_failed;
    pthread_mutex_unlock(&s->lock);
    ucp_request_param_t cp = {.op_attr_mask = s->err_mode == FLX_TP_ERR_PEER ? UCP_OP_ATTR_FIELD_FLAGS : 0,
                              .flags = s->err_mode == FLX_TP_ERR_PEER ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = gone && s->err_mode != FLX_TP_ERR_PEER ? NULL : ucp_ep_close_nbx(s->ep, &cp);
    const uint64_t until = flx_now_ns() + 2000000000ull;
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && flx_now_ns() < until) ucp_worker_progress(s->worker);
        ucp_request_free(req);
    }
    s->ep = NULL;
    send_cmd_t *c;
    if (s->held) cmd_finish(s->held, FLX_ERR_CANCELED, "send: sender destroyed");
    s->held = NULL;
    while ((c = tp_fifo_pop(&s->cmds))) cmd_finish(c, FLX_ERR_CANCELED, "send: sender destroyed");
    return NULL;
}

/* ---- API ---- */

flx_status_t flx_tp_sender_create(const flx_tp_sender_params_t *p, flx_tp_sender_h *sender_p)
{
    if (!p || !sender_p || !p->host || !p->port)
        return flx_error_set(FLX_ERR_INVALID, "transport sender: host and port are required");
    const flx_tp_err_mode_t em = (p->field_mask & FLX_TP_SENDER_FIELD_ERR_MODE) ? p->err_mode : FLX_TP_ERR_PEER;
    if (em != FLX_TP_ERR_PEER && em != FLX_TP_ERR_NONE)
        return flx_error_set(FLX_ERR_INVALID, "transport sender: err_mode %d unknown", (int)em);
    struct sockaddr_storage ss;
    socklen_t sl;
    flx_status_t st = tp_resolve(p->host, p->port, &ss, &sl);
    if (st) return st;
    if ((p->field_mask & FLX_TP_SENDER_FIELD_WINDOW) && (p->rndv_window < 1 || p->rndv_window > 1024))
        return flx_error_set(FLX_ERR_INVALID, "transport sender: rndv_window %u outside [1, 1024]", p->rndv_window);
    struct flx_tp_sender *s = calloc(1, sizeof *s);
    if (!s) return flx_error_set(FLX_ERR_NOMEM, "transport sender");
    s->err_mode = em;
    s->connect_timeout_ms = (p->field_mask & FLX_TP_SENDER_FIELD_TIMEOUT) && p->connect_timeout_ms
                                ? p->connect_timeout_ms : 10000;
    s->rndv_window = (p->field_mask & FLX_TP_SENDER_FIELD_WINDOW) ? p->rndv_window : 4;
    s->loop.wake_fd = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    tp_fifo_init(&s->cmds);
    flx_tp_hdr_t hb = {.kind = FLX_TP_HEARTBEAT};
    flx_tp_hdr_encode(&hb, s->hb_hdr);
    if ((st = tp_ucx_open("flx-prefill", &s->ctx, &s->worker))) goto err;
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                 .id = FLX_TP_AM_ID, .cb = am_handler, .arg = s, .flags = UCP_AM_FLAG_WHOLE_MSG};
    ucs_status_t us = ucp_worker_set_am_recv_handler(s->worker, &hp);
    if (us != UCS_OK) {
        st = tp_ucs_error(us, "transport sender: active-message handler");
        goto err;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sl},
                          .err_mode = tp_err_mode(em), .err_handler = {.cb = ep_error, .arg = s}};
    if ((us = ucp_ep_create(s->worker, &ep, &s->ep)) != UCS_OK) {
        char what[FLX_TP_HOST_MAX + 48];
        snprintf(what, sizeof what, "transport sender: connecting to %s:%u", p->host, p->port);
        st = tp_ucs_error(us, what);
        s->ep = NULL;
        goto err;
    }
    if ((st = tp_loop_init(&s->loop, s->worker))) goto err;
    if (pthread_create(&s->thread, NULL, progress_main, s) != 0) {
        st = flx_error_set(FLX_ERR_NOMEM, "transport sender: progress thread");
        goto err;
    }
    s->thread_started = 1;
    *sender_p = s;
    return FLX_OK;
err:
    flx_tp_sender_destroy(s);
    return st;
}

void flx_tp_sender_destroy(flx_tp_sender_h s)
{
    if (!s) return;
    atomic_store(&s->stop, 1);
    if (s->thread_started) {
        tp_loop_wake(&s->loop);
        pthread_join(s->thread, NULL);
    } else if (s->ep) {
        ucp_request_param_t cp = {.op_attr_mask = 0};
        void *req = ucp_ep_close_nbx(s->ep, &cp);
        if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    tp_loop_fini(&s->loop);
    tp_ucx_close(s->ctx, s->worker);
    for (sess_ent_t *e = s->sessions, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    tp_fifo_fini(&s->cmds);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Whether messages for session sid are still worth sending: not when the connection failed or a
 * send on it did (the node cannot complete a session missing those bytes), nor when the node said
 * the session ended. A prefill node that sends on computes its next layers for nothing; this is
 * how it hears, at its next send, instead of at its commit. */
static flx_status_t sendable(struct flx_tp_sender *s, flx_kv_session_id_t sid)
{
    flx_status_t st = FLX_OK;
    pthread_mutex_lock(&s->lock);
    const sess_ent_t *e = sess_get_locked(s, sid, 0);
    if (s->peer_failed || s->error[0])
        st = flx_error_set(FLX_ERR_IO, "send: %s", s->error[0] ? s->error : "the connection to the node failed");
    else if (e && (e->state == FLX_KV_FAILED || e->state == FLX_KV_CLOSED))
        st = flx_error_set(FLX_ERR_STATE, "send: the node says session %#llx is %s: %s", (unsigned long long)sid,
                           flx_kv_state_name(e->state), e->reason);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static flx_status_t enqueue(struct flx_tp_sender *s, send_cmd_t *c)
{
    c->s = s;
    pthread_mutex_lock(&s->lock);
    s->n_posted++;
    s->bytes_posted += c->len;
    pthread_mutex_unlock(&s->lock);
    tp_fifo_push(&s->cmds, c);
    tp_loop_wake(&s->loop);
    return FLX_OK;
}

static send_cmd_t *cmd_new(const flx_tp_hdr_t *h, const void *payload, uint64_t len, uint32_t flags,
                           flx_tp_sent_fn done, void *ctx)
{
    send_cmd_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    flx_tp_hdr_encode(h, c->hdr);
    c->payload = payload;
    c->len = len;
    c->flags = flags;
    c->done = done;
    c->ctx = ctx;
    return c;
}

/* Waits on the sender's condition until pred or the deadline (absolute flx_now_ns). */
static int wait_until(struct flx_tp_sender *s, uint64_t until)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = flx_now_ns(), left = until > now ? until - now : 0;
    uint64_t ns = (uint64_t)ts.tv_nsec + FLX_MIN(left, 50000000ull); /* re-check at least every 50 ms */
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_cond_timedwait(&s->cv, &s->lock, &ts);
    return flx_now_ns() < until;
}

flx_status_t flx_tp_sender_hello(flx_tp_sender_h s, const flx_tp_ref_t *ref, flx_tp_welcome_t *welcome_p)
{
    if (!s || !ref || !welcome_p) return flx_error_set(FLX_ERR_INVALID, "hello: NULL argument");
    pthread_mutex_lock(&s->lock);
    sess_ent_t *e = sess_get_locked(s, ref->sid, 1);
    const uint64_t seen = e ? e->n_status : 0;
    pthread_mutex_unlock(&s->lock);
    if (!e) return flx_error_set(FLX_ERR_NOMEM, "hello");
    flx_tp_hdr_t h = {.kind = FLX_TP_HELLO, .sid = ref->sid};
    memcpy(h.token, ref->token, FLX_TP_TOKEN_BYTES);
    send_cmd_t *c = cmd_new(&h, NULL, 0, FLX_TP_SEND_EAGER, NULL, NULL);
    if (!c) return flx_error_set(FLX_ERR_NOMEM, "hello");
    enqueue(s, c);
    const uint64_t until = flx_now_ns() + (uint64_t)s->connect_timeout_ms * 1000000;
    flx_status_t st = FLX_OK;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (e->have_welcome) {
            *welcome_p = e->welcome;
            break;
        }
        if (e->n_status != seen) {
            st = flx_error_set(FLX_ERR_STATE, "the node refused session %#llx: %s", (unsigned long long)ref->sid,
                               e->reason);
            break;
        }
        if (s->peer_failed) {
            st = flx_error_set(FLX_ERR_IO, "%s", s->error);
            break;
        }
        if (!wait_until(s, until)) {
            st = flx_error_set(FLX_ERR_TIMEOUT, "no answer from the node within %u ms (is it listening, and do both "
                                                "sides use the same error mode?)",
                               s->connect_timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* A KV chunk's header and send; hash NULL: computed here (or none with FLX_TP_SEND_NO_HASH). */
static flx_status_t send_kv(flx_tp_sender_h s, const flx_tp_ref_t *ref, const flx_kv_chunk_t *ch, const void *payload,
                            const uint64_t *hash, uint32_t flags, flx_tp_sent_fn done, void *ctx)
{
    if (!s || !ref || !ch || !payload) return flx_error_set(FLX_ERR_INVALID, "send kv: NULL argument");
    flx_status_t st = sendable(s, ref->sid);
    if (st) return st;
    flx_tp_hdr_t h = {.kind = FLX_TP_KV, .sid = ref->sid, .layer = ch->layer, .head_begin = ch->head_begin,
                      .head_end = ch->head_end, .tok_begin = ch->tok_begin, .tok_end = ch->tok_end,
                      .arg0 = ch->head_dim};
    memcpy(h.token, ref->token, FLX_TP_TOKEN_BYTES);
    const uint64_t len = flx_tp_kv_bytes(&h);
    if (!len) return flx_error_set(FLX_ERR_INVALID, "send kv: empty chunk (heads [%u, %u), tokens [%u, %u))",
                                   ch->head_begin, ch->head_end, ch->tok_begin, ch->tok_end);
    if (hash) {
        h.payload_len = len;
        h.flags |= FLX_TP_FLAG_PAYLOAD_XXH3;
        h.payload_xxh3 = *hash;
    } else {
        flx_tp_hdr_set_payload(&h, payload, len, !(flags & FLX_TP_SEND_NO_HASH));
    }
    send_cmd_t *c = cmd_new(&h, payload, len, flags, done, ctx);
    if (!c) return flx_error_set(FLX_ERR_NOMEM, "send kv");
    return enqueue(s, c);
}

flx_status_t flx_tp_send_kv(flx_tp_sender_h s, const flx_tp_ref_t *ref, const flx_kv_chunk_t *ch, const void *payload,
                            uint32_t flags, flx_tp_sent_fn done, void *ctx)
{
    return send_kv(s, ref, ch, payload, NULL, flags, done, ctx);
}

flx_status_t flx_tp_send_kv_hashed(flx_tp_sender_h s, const flx_tp_ref_t *ref, const flx_kv_chunk_t *ch,
                                   const void *payload, uint64_t payload_xxh3, uint32_t flags, flx_tp_sent_fn done,
                                   void *ctx)
{
    if (flags & FLX_TP_SEND_NO_HASH) return flx_error_set(FLX_ERR_INVALID, "send kv hashed: FLX_TP_SEND_NO_HASH");
    return send_kv(s, ref, ch, payload, &payload_xxh3, flags, done, ctx);
}

flx_status_t flx_tp_send_stats(flx_tp_sender_h s, const flx_tp_ref_t *ref, uint32_t layer, uint32_t hq, uint32_t d,
                               const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor,
                               uint32_t flags)
{
    if (!s || !ref || !stats || !mean_k || !q_anchor) return flx_error_set(FLX_ERR_INVALID, "send stats: NULL argument");
    flx_status_t st = sendable(s, ref->sid);
    if (st) return st;
    if (hq == 0 || hq > FLX_TP_MAX_Q_HEADS || d == 0 || d > 256)
        return flx_error_set(FLX_ERR_INVALID, "send stats: %u heads of %u", hq, d);
    const uint64_t len = flx_tp_stats_bytes(hq, d);
    uint8_t *buf = malloc(len);
    if (!buf) return flx_error_set(FLX_ERR_NOMEM, "send stats: %llu bytes", (unsigned long long)len);
    flx_tp_stats_encode(hq, d, stats, mean_k, q_anchor, buf);
    flx_tp_hdr_t h = {.kind = FLX_TP_STATS, .sid = ref->sid, .layer = layer, .arg0 = d, .arg1 = hq};
    memcpy(h.token, ref->token, FLX_TP_TOKEN_BYTES);
    flx_tp_hdr_set_payload(&h, buf, len, !(flags & FLX_TP_SEND_NO_HASH));
    send_cmd_t *c = cmd_new(&h, buf, len, flags & (FLX_TP_SEND_RNDV | FLX_TP_SEND_EAGER), NULL, NULL);
    if (!c) {
        free(buf);
        return flx_error_set(FLX_ERR_NOMEM, "send stats");
    }
    c->owned = buf;
    return enqueue(s, c);
}

flx_status_t flx_tp_send_commit(flx_tp_sender_h s, const flx_tp_ref_t *ref, const flx_kv_commit_t *cm)
{
    if (!s || !ref || !cm) return flx_error_set(FLX_ERR_INVALID, "send commit: NULL argument");
    if (cm->first_token < 0) return flx_error_set(FLX_ERR_INVALID, "send commit: first token %d", cm->first_token);
    flx_status_t st = sendable(s, ref->sid);
    if (st) return st;
    flx_tp_hdr_t h = {.kind = FLX_TP_COMMIT, .sid = ref->sid, .arg0 = (uint32_t)cm->first_token,
                      .arg1 = cm->n_stats_layers, .value = cm->kv_bytes};
    memcpy(h.token, ref->token, FLX_TP_TOKEN_BYTES);
    send_cmd_t *c = cmd_new(&h, NULL, 0, FLX_TP_SEND_EAGER, NULL, NULL);
    if (!c) return flx_error_set(FLX_ERR_NOMEM, "send commit");
    return enqueue(s, c);
}

flx_status_t flx_tp_send_raw(flx_tp_sender_h s, const uint8_t hdr[FLX_TP_HDR_BYTES], const void *payload, uint64_t len,
                             uint32_t flags, flx_tp_sent_fn done, void *ctx)
{
    if (!s || !hdr || (len && !payload)) return flx_error_set(FLX_ERR_INVALID, "send raw: NULL argument");
    send_cmd_t *c = calloc(1, sizeof *c);
    if (!c) return flx_error_set(FLX_ERR_NOMEM, "send raw");
    memcpy(c->hdr, hdr, FLX_TP_HDR_BYTES);
    c->payload = payload;
    c->len = len;
    c->flags = flags;
    c->done = done;
    c->ctx = ctx;
    return enqueue(s, c);
}

flx_status_t flx_tp_sender_flush(flx_tp_sender_h s, uint32_t timeout_ms)
{
    const uint64_t until = flx_now_ns() + (uint64_t)timeout_ms * 1000000;
    flx_status_t st = FLX_OK;
    pthread_mutex_lock(&s->lock);
    while (s->n_done < s->n_posted)
        if (!wait_until(s, until)) {
            st = flx_error_set(FLX_ERR_TIMEOUT, "%llu send(s) still in flight after %u ms",
                               (unsigned long long)(s->n_posted - s->n_done), timeout_ms);
            break;
        }
    if (st == FLX_OK && s->error[0]) st = flx_error_set(FLX_ERR_IO, "%s", s->error);
    pthread_mutex_unlock(&s->lock);
    return st;
}

flx_status_t flx_tp_sender_status(flx_tp_sender_h s, flx_kv_session_id_t sid, uint32_t timeout_ms,
                                  flx_kv_state_t *state_p, char *reason, size_t reason_cap)
{
    if (!s || !state_p) return flx_error_set(FLX_ERR_INVALID, "sender status: NULL argument");
    const uint64_t until = flx_now_ns() + (uint64_t)timeout_ms * 1000000;
    pthread_mutex_lock(&s->lock);
    sess_ent_t *e;
    for (;;) {
        e = sess_get_locked(s, sid, 0);
        /* READY, FAILED, CLOSED are final whether they came as a notice or with a refusal */
        int final = e && (e->state == FLX_KV_READY || e->state == FLX_KV_FAILED || e->state == FLX_KV_CLOSED);
        if (final || !timeout_ms || s->peer_failed || !wait_until(s, until)) break;
    }
    *state_p = e ? e->state : FLX_KV_RESERVED;
    if (reason && reason_cap) snprintf(reason, reason_cap, "%s", e ? e->reason : "");
    pthread_mutex_unlock(&s->lock);
    return FLX_OK;
}

void flx_tp_sender_info(flx_tp_sender_h s, flx_tp_sender_info_t *info)
{
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&s->lock);
    info->bytes_posted = s->bytes_posted;
    info->bytes_done = s->bytes_done;
    info->sends_inflight = (uint32_t)(s->n_posted - s->n_done);
    info->peer_failed = s->peer_failed;
    memcpy(info->error, s->error, sizeof info->error);
    pthread_mutex_unlock(&s->lock);
}

/* ---- planning ---- */

uint32_t flx_tp_plan_layer(const flx_tp_welcome_t *w, uint32_t layer, uint64_t max_chunk_bytes,
                           flx_tp_plan_chunk_t *out, uint32_t cap)
{
    const uint32_t L = w->prompt_len, H = w->n_kv_heads;
    const uint64_t row = 4ull * w->head_dim; /* K and V bytes of one token of one head */
    const uint32_t host_b = w->n_sink, host_e = (L - w->n_local) & ~15u; /* whole host granules */
    uint32_t n = 0;
#define EMIT(h0, h1, t0, t1, fl)                                                                                \
    do {                                                                                                      \
        if (n < cap)                                                                                          \
            out[n] = (flx_tp_plan_chunk_t){.chunk = {.layer = layer, .head_begin = (h0), .head_end = (h1),    \
                                                     .tok_begin = (t0), .tok_end = (t1), .dtype = FLX_DT_BF16, \
                                                     .head_dim = w->head_dim, .order = FLX_KV_ORDER_GRANULE}, \
                                           .send_flags = (fl)};                                               \
        n++;                                                                                                  \
    } while (0)
    if (host_e <= host_b || host_b % 16) {
        EMIT(0, H, 0, L, FLX_TP_SEND_EAGER); /* a short prompt: all of it is window */
        return n;
    }
    const uint64_t per_head = (uint64_t)(host_e - host_b) * row;
    /* Heads are adjacent in the store only when each one's host part ends on a whole block. */
    const int heads_adjacent = host_e == L - w->n_local;
    if (heads_adjacent && per_head * H <= max_chunk_bytes) {
        EMIT(0, H, host_b, host_e, FLX_TP_SEND_RNDV);
    } else if (per_head <= max_chunk_bytes) {
        const uint32_t k = heads_adjacent ? (uint32_t)(max_chunk_bytes / per_head) : 1;
        for (uint32_t h = 0; h < H; h += k) EMIT(h, FLX_MIN(h + k, H), host_b, host_e, FLX_TP_SEND_RNDV);
    } else {
        uint32_t tok = (uint32_t)FLX_MIN(max_chunk_bytes / row, (uint64_t)UINT32_MAX) & ~15u;
        if (tok < 16) tok = 16;
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t t = host_b; t < host_e; t += tok) EMIT(h, h + 1, t, FLX_MIN(t + tok, host_e), FLX_TP_SEND_RNDV);
    }
    if (host_b) EMIT(0, H, 0, host_b, FLX_TP_SEND_EAGER);
    if (host_e < L) EMIT(0, H, host_e, L, FLX_TP_SEND_EAGER);
#undef EMIT
    return n;
}
