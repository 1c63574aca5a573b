/*
 * rpc_server.c - the gRPC core server of flx/rpc.h.
 *
 * DESIGN
 * gRPC core delivers everything as tagged completions on one queue; each call carries a small tag
 * per kind of batch it can have outstanding (request, receive, close, send, status), so a polling
 * thread knows from the tag alone which call and which step completed. A call is reference
 * counted: one reference per batch in flight plus one for its owner (the server until the handler
 * runs, the handler's side after). The owner's reference goes at reply / finish; the call is freed
 * when the last batch completes, so no completion ever names freed memory, whatever order
 * cancellation, sends and the status come in.
 *
 * Sends are queued per call and started one at a time (gRPC core allows one send batch in flight
 * per call); the status goes after the last queued message, so a stream's tokens always precede
 * its end. A unary reply goes as one batch (metadata, message, status): one wakeup per call.
 *
 * Unregistered calls (grpc_server_request_call + dispatch on details.method) rather than
 * registered methods: the method table is plain data, unknown paths get a real UNIMPLEMENTED, and
 * the request is read with the same receive batch for every method.
 *
 * Shutdown follows gRPC core's order: shutdown_and_notify (no new calls; the pending
 * request_calls complete with success 0), wait for the calls to end (cancel_all_calls after the
 * grace period), wait for the notify tag, shut the queue down, drain it, destroy.
 */
#include "flx/rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flx/log.h"
#include "flx/util.h"
#include "rpc_internal.h"

#define N_REQUESTS 4          /* request_calls kept outstanding */

typedef enum { T_NEW, T_RECV, T_CLOSE, T_SEND, T_STATUS, T_SHUTDOWN } tag_kind_t;

typedef struct rpc_tag {
    tag_kind_t kind;
    struct flx_rpc_call *call;  /* NULL for T_SHUTDOWN */
} rpc_tag_t;

struct flx_rpc_call {
    flx_rpc_server_h srv;
    grpc_call *gc;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv_buf;
    int close_cancelled;          /* written by gRPC when the close batch completes */
    rpc_tag_t t_new, t_recv, t_close, t_send, t_status;
    const flx_rpc_method_t *method;
    char path[128];
    uint64_t deadline_ns;
    atomic_int cancelled;

    pthread_mutex_t mu;           /* guards everything below */
    pthread_cond_t cv;
    int refs;                     /* batches in flight + 1 while owned */
    int owned;
    int in_cancel_cb;
    void (*on_cancel)(void *);
    void *cancel_ctx;
    grpc_byte_buffer **q;         /* (q_cap) queued messages, ring from q_head */
    uint32_t q_head, q_n, q_cap;
    grpc_byte_buffer *inflight;   /* the message of the send batch in flight */
    grpc_byte_buffer *final_msg;  /* a unary reply's message, sent with the status */
    int md_sent, send_inflight, status_pending, status_started, broken;
    int status_code;
    char status_msg[FLX_ERROR_MSG_MAX];
};

struct flx_rpc_server {
    grpc_server *srv;
    grpc_completion_queue *cq;
    flx_rpc_method_t *methods;    /* (n_methods), paths copied */
    uint32_t n_methods;
    size_t max_send;
    pthread_t *thr;               /* (n_threads) */
    uint32_t n_threads;
    int port;
    rpc_tag_t t_shutdown;

    pthread_mutex_t mu;           /* guards the fields below */
    pthread_cond_t cv;
    uint32_t n_calls;             /* accepted, not yet freed */
    int shutting_down, shutdown_done;
};

/* ---- status codes ---- */

int flx_rpc_status_code(flx_status_t st)
{
    switch (st) {
    case FLX_OK: return GRPC_STATUS_OK;
    case FLX_ERR_INVALID:
    case FLX_ERR_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case FLX_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case FLX_ERR_CAPACITY:
    case FLX_ERR_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case FLX_ERR_STATE:
    case FLX_ERR_NO_DEVICE: return GRPC_STATUS_FAILED_PRECONDITION;
    case FLX_ERR_DUPLICATE: return GRPC_STATUS_ALREADY_EXISTS;
    case FLX_ERR_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case FLX_ERR_CANCELED: return GRPC_STATUS_CANCELLED;
    case FLX_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case FLX_ERR_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    default: return GRPC_STATUS_INTERNAL;
    }
}

const char *flx_rpc_code_name(int code)
{
    static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                  "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                  "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)FLX_ARRAY_SIZE(names) ? names[code] : "UNKNOWN_CODE";
}

/* ---- time ---- */

uint64_t flx_rpc_deadline_to_ns(gpr_timespec deadline)
{
    if (deadline.tv_sec == INT64_MAX || deadline.clock_type == GPR_TIMESPAN)
        return UINT64_MAX;
    gpr_timespec now = gpr_now(deadline.clock_type);
    int64_t left = (int64_t)(deadline.tv_sec - now.tv_sec) * 1000000000 + (deadline.tv_nsec - now.tv_nsec);
    uint64_t t = flx_now_ns();
    return left <= 0 ? t : t + (uint64_t)left;
}

gpr_timespec flx_rpc_ms_from_now(uint32_t ms)
{
    if (ms == 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

flx_status_t flx_rpc_bb_read(grpc_byte_buffer *bb, void **data_p, size_t *len_p)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return flx_error_set(FLX_ERR_FORMAT, "message cannot be read (decompression failed)");
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    void *p = malloc(n ? n : 1);
    if (!p) {
        grpc_slice_unref(s);
        return flx_error_set(FLX_ERR_NOMEM, "message of %zu bytes", n);
    }
    memcpy(p, GRPC_SLICE_START_PTR(s), n);
    grpc_slice_unref(s);
    *data_p = p;
    *len_p = n;
    return FLX_OK;
}

grpc_byte_buffer *flx_rpc_bb_make(const void *msg, size_t len)
{
    grpc_slice s = grpc_slice_from_copied_buffer(msg, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* ---- calls ---- */

static void call_free(struct flx_rpc_call *c)
{
    flx_rpc_server_h srv = c->srv;
    int counted = c->gc != NULL;
    if (c->gc)
        grpc_call_unref(c->gc);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    for (uint32_t i = 0; i < c->q_n; i++) grpc_byte_buffer_destroy(c->q[(c->q_head + i) % c->q_cap]);
    free(c->q);
    if (c->final_msg)
        grpc_byte_buffer_destroy(c->final_msg);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    if (counted) {
        pthread_mutex_lock(&srv->mu);
        srv->n_calls--;
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
    }
}

/* Drops one reference; the caller holds c->mu, which this releases. */
static void call_unref_unlock(struct flx_rpc_call *c)
{
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (last)
        call_free(c);
}

static void request_one(flx_rpc_server_h srv)
{
    struct flx_rpc_call *c = calloc(1, sizeof *c);
    if (!c) {
        flx_log_error("rpc", "out of memory requesting a call; the server accepts fewer calls at once");
        return;
    }
    c->srv = srv;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (rpc_tag_t){T_NEW, c};
    c->t_recv = (rpc_tag_t){T_RECV, c};
    c->t_close = (rpc_tag_t){T_CLOSE, c};
    c->t_send = (rpc_tag_t){T_SEND, c};
    c->t_status = (rpc_tag_t){T_STATUS, c};
    c->refs = 1;   /* the request */
    FLX_TSAN_RELEASE(&c->t_new);
    grpc_call_error e = grpc_server_request_call(srv->srv, &c->gc, &c->details, &c->md, srv->cq, srv->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        flx_log_error("rpc", "grpc_server_request_call: %s", grpc_call_error_to_string(e));
        c->gc = NULL;
        call_free(c);
    }
}

/* The ops every send batch starts with: the initial metadata (once per call), then msg if any.
 * Returns how many ops it wrote into ops (room for 2). */
static size_t ops_begin_locked(struct flx_rpc_call *c, grpc_op *ops, grpc_byte_buffer *msg)
{
    size_t n = 0;
    if (!c->md_sent) {
        memset(&ops[n], 0, sizeof ops[n]);
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = 1;
    }
    if (msg) {
        memset(&ops[n], 0, sizeof ops[n]);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = msg;
    }
    return n;
}

/* Starts a batch tagged tag, counting its reference; 0, or -1 (logged, reference dropped) when
 * gRPC refuses it. c->mu held. */
static int start_batch_locked(struct flx_rpc_call *c, const grpc_op *ops, size_t n, rpc_tag_t *tag)
{
    c->refs++;
    FLX_TSAN_RELEASE(tag);
    grpc_call_error e = grpc_call_start_batch(c->gc, ops, n, tag, NULL);
    if (e == GRPC_CALL_OK)
        return 0;
    flx_log_error("rpc", "%s: batch refused: %s", c->path, grpc_call_error_to_string(e));
    c->refs--;
    return -1;
}

/* Starts the status batch (with a unary reply's message); c->mu held. */
static void start_status_locked(struct flx_rpc_call *c)
{
    grpc_op ops[3];
    size_t n = ops_begin_locked(c, ops, c->final_msg);
    grpc_slice details = grpc_slice_from_copied_string(c->status_msg);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->status_code;
    ops[n++].data.send_status_from_server.status_details = c->status_code ? &details : NULL;
    c->status_pending = 0;
    c->status_started = 1;
    start_batch_locked(c, ops, n, &c->t_status);
    grpc_slice_unref(details);
}

/* Starts the next queued message; c->mu held, no send in flight. */
static void start_send_locked(struct flx_rpc_call *c)
{
    grpc_op ops[2];
    c->inflight = c->q[c->q_head];
    c->q_head = (c->q_head + 1) % c->q_cap;
    c->q_n--;
    size_t n = ops_begin_locked(c, ops, c->inflight);
    c->send_inflight = 1;
    if (start_batch_locked(c, ops, n, &c->t_send)) {
        c->send_inflight = 0;
        grpc_byte_buffer_destroy(c->inflight);
        c->inflight = NULL;
        c->broken = 1;
    }
}

static void drop_queue_locked(struct flx_rpc_call *c)
{
    for (uint32_t i = 0; i < c->q_n; i++) grpc_byte_buffer_destroy(c->q[(c->q_head + i) % c->q_cap]);
    c->q_n = 0;
}

flx_status_t flx_rpc_send(flx_rpc_call_h c, const void *msg, size_t len)
{
    if (!c || (!msg && len))
        return flx_error_set(FLX_ERR_INVALID, "rpc send: NULL argument");
    if (len > c->srv->max_send)
        return flx_error_set(FLX_ERR_INVALID, "%s: response of %zu bytes exceeds max_send_bytes %zu", c->path, len,
                             c->srv->max_send);
    pthread_mutex_lock(&c->mu);
    flx_status_t st = FLX_OK;
    if (!c->owned || c->status_pending || c->status_started || c->final_msg) {
        st = flx_error_set(FLX_ERR_STATE, "%s: send after the call was ended", c->path);
    } else if (atomic_load(&c->cancelled) || c->broken) {
        st = flx_error_set(FLX_ERR_CANCELED, "%s: the call was cancelled or broke", c->path);
    } else {
        if (c->q_n == c->q_cap) {
            uint32_t cap = c->q_cap ? c->q_cap * 2 : 16;
            grpc_byte_buffer **nq = malloc(cap * sizeof *nq);
            if (!nq) {
                st = flx_error_set(FLX_ERR_NOMEM, "%s: send queue of %u messages", c->path, cap);
                goto out;
            }
            for (uint32_t i = 0; i < c->q_n; i++) nq[i] = c->q[(c->q_head + i) % c->q_cap];
            free(c->q);
            c->q = nq;
            c->q_head = 0;
            c->q_cap = cap;
        }
        c->q[(c->q_head + c->q_n) % c->q_cap] = flx_rpc_bb_make(msg, len);
        c->q_n++;
        if (!c->send_inflight)
            start_send_locked(c);
    }
out:
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Ends the owner's part: records the status (and a unary reply), starts it when nothing is in
 * flight, drops the owner's reference. */
static void end_call(struct flx_rpc_call *c, int code, const char *msg, grpc_byte_buffer *reply)
{
    pthread_mutex_lock(&c->mu);
    while (c->in_cancel_cb) pthread_cond_wait(&c->cv, &c->mu);
    if (FLX_NEVER(!c->owned)) {
        pthread_mutex_unlock(&c->mu);
        if (reply)
            grpc_byte_buffer_destroy(reply);
        return;
    }
    c->owned = 0;
    c->status_code = code;
    snprintf(c->status_msg, sizeof c->status_msg, "%s", msg ? msg : "");
    c->final_msg = reply;
    if (c->broken)
        drop_queue_locked(c);
    if (c->send_inflight || c->q_n)
        c->status_pending = 1;
    else
        start_status_locked(c);
    call_unref_unlock(c);
}

flx_status_t flx_rpc_reply(flx_rpc_call_h c, const void *msg, size_t len)
{
    if (!c || (!msg && len))
        return flx_error_set(FLX_ERR_INVALID, "rpc reply: NULL argument");
    if (len > c->srv->max_send) {
        flx_status_t st = flx_error_set(FLX_ERR_INTERNAL, "response of %zu bytes exceeds max_send_bytes %zu", len,
                                        c->srv->max_send);
        flx_rpc_finish(c, st, "%s", flx_error_msg());
        return st;
    }
    end_call(c, GRPC_STATUS_OK, NULL, flx_rpc_bb_make(msg, len));
    return FLX_OK;
}

flx_status_t flx_rpc_finish(flx_rpc_call_h c, flx_status_t st, const char *fmt, ...)
{
    if (!c)
        return flx_error_set(FLX_ERR_INVALID, "rpc finish: NULL call");
    char text[FLX_ERROR_MSG_MAX], msg[FLX_ERROR_MSG_MAX + 32];
    text[0] = '\0';
    if (st != FLX_OK && fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
    }
    snprintf(msg, sizeof msg, "%s: %s", flx_status_name(st), text);
    int code = flx_rpc_status_code(st);
    if (code != GRPC_STATUS_OK)
        flx_log_info("rpc", "%s ends %s: %s", c->path, flx_rpc_code_name(code), msg);
    end_call(c, code, code == GRPC_STATUS_OK ? NULL : msg, NULL);
    return FLX_OK;
}

int flx_rpc_call_cancelled(flx_rpc_call_h c)
{
    return c ? atomic_load(&c->cancelled) : 1;
}

uint64_t flx_rpc_call_deadline_ns(flx_rpc_call_h c)
{
    return c ? c->deadline_ns : 0;
}

const char *flx_rpc_call_method(flx_rpc_call_h c)
{
    return c ? c->path : "";
}

void flx_rpc_call_peer(flx_rpc_call_h c, char *buf, size_t cap)
{
    if (!cap)
        return;
    char *p = c && c->gc ? grpc_call_get_peer(c->gc) : NULL;
    snprintf(buf, cap, "%s", p ? p : "?");
    if (p)
        gpr_free(p);
}

int flx_rpc_call_on_cancel(flx_rpc_call_h c, void (*fn)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&c->mu);
    int already = atomic_load(&c->cancelled);
    if (!already) {
        c->on_cancel = fn;
        c->cancel_ctx = ctx;
    }
    pthread_mutex_unlock(&c->mu);
    return already;
}

/* ---- completions ---- */

static const flx_rpc_method_t *find_method(flx_rpc_server_h srv, const char *path)
{
    for (uint32_t i = 0; i < srv->n_methods; i++)
        if (!strcmp(srv->methods[i].path, path))
            return &srv->methods[i];
    return NULL;
}

static void on_new(struct flx_rpc_call *c, int ok)
{
    flx_rpc_server_h srv = c->srv;
    if (!ok) {   /* the server is shutting down: no call was received */
        c->gc = NULL;
        call_free(c);
        return;
    }
    pthread_mutex_lock(&srv->mu);
    srv->n_calls++;
    int again = !srv->shutting_down;
    pthread_mutex_unlock(&srv->mu);
    if (again)
        request_one(srv);

    size_t mlen = GRPC_SLICE_LENGTH(c->details.method);
    if (mlen >= sizeof c->path)
        mlen = sizeof c->path - 1;
    memcpy(c->path, GRPC_SLICE_START_PTR(c->details.method), mlen);
    c->path[mlen] = '\0';
    c->deadline_ns = flx_rpc_deadline_to_ns(c->details.deadline);
    c->method = find_method(srv, c->path);

    pthread_mutex_lock(&c->mu);
    c->owned = 1;   /* the request's reference becomes the owner's */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    start_batch_locked(c, &op, 1, &c->t_close);
    if (!c->method) {
        pthread_mutex_unlock(&c->mu);
        flx_rpc_finish(c, FLX_ERR_UNSUPPORTED, "method %s is not served here", c->path);
        return;
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    if (start_batch_locked(c, &op, 1, &c->t_recv)) {
        pthread_mutex_unlock(&c->mu);
        flx_rpc_finish(c, FLX_ERR_INTERNAL, "the request could not be read (receive batch refused)");
        return;
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_recv(struct flx_rpc_call *c, int ok)
{
    void *data = NULL;
    size_t len = 0;
    flx_status_t st = FLX_OK;
    if (!ok || !c->recv_buf)
        st = flx_error_set(atomic_load(&c->cancelled) ? FLX_ERR_CANCELED : FLX_ERR_INVALID,
                           "no request message arrived");
    else
        st = flx_rpc_bb_read(c->recv_buf, &data, &len);
    if (c->recv_buf) {
        grpc_byte_buffer_destroy(c->recv_buf);
        c->recv_buf = NULL;
    }
    /* the receive batch's reference; the owner's keeps the call alive */
    pthread_mutex_lock(&c->mu);
    call_unref_unlock(c);
    if (st) {
        flx_rpc_finish(c, st, "%s", flx_error_msg());
        return;
    }
    flx_error_clear();
    c->method->handler(c->method->ctx, c, data, len);
    free(data);
}

static void on_close(struct flx_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->close_cancelled) {
        atomic_store(&c->cancelled, 1);
        void (*fn)(void *) = c->owned ? c->on_cancel : NULL;
        if (fn) {
            c->in_cancel_cb = 1;
            pthread_mutex_unlock(&c->mu);
            fn(c->cancel_ctx);
            pthread_mutex_lock(&c->mu);
            c->in_cancel_cb = 0;
            pthread_cond_broadcast(&c->cv);
        }
    }
    call_unref_unlock(c);
}

static void on_send(struct flx_rpc_call *c, int ok)
{
    pthread_mutex_lock(&c->mu);
    grpc_byte_buffer_destroy(c->inflight);
    c->inflight = NULL;
    c->send_inflight = 0;
    if (!ok) {
        c->broken = 1;
        drop_queue_locked(c);
    }
    if (c->q_n)
        start_send_locked(c);
    if (!c->send_inflight && c->status_pending)
        start_status_locked(c);
    call_unref_unlock(c);
}

static void on_status(struct flx_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->final_msg) {
        grpc_byte_buffer_destroy(c->final_msg);
        c->final_msg = NULL;
    }
    call_unref_unlock(c);
}

static void dispatch(flx_rpc_server_h srv, grpc_event ev)
{
    if (ev.type != GRPC_OP_COMPLETE)
        return;
    FLX_TSAN_ACQUIRE(ev.tag);
    rpc_tag_t *t = ev.tag;
    switch (t->kind) {
    case T_NEW: on_new(t->call, ev.success); break;
    case T_RECV: on_recv(t->call, ev.success); break;
    case T_CLOSE: on_close(t->call); break;
    case T_SEND: on_send(t->call, ev.success); break;
    case T_STATUS: on_status(t->call); break;
    case T_SHUTDOWN:
        pthread_mutex_lock(&srv->mu);
        srv->shutdown_done = 1;
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        break;
    }
}

static void *poll_thread(void *arg)
{
    flx_rpc_server_h srv = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        dispatch(srv, ev);
    }
    return NULL;
}

/* ---- server ---- */

/* The server's own memory (gRPC's objects are gone or were never made). */
static void server_free(struct flx_rpc_server *s)
{
    for (uint32_t i = 0; i < s->n_methods; i++) free((char *)s->methods[i].path);
    free(s->methods);
    free(s->thr);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

flx_status_t flx_rpc_server_create(const flx_rpc_server_params_t *p, flx_rpc_server_h *server_p)
{
    if (!p || !server_p)
        return flx_error_set(FLX_ERR_INVALID, "rpc server create: NULL argument");
    const uint64_t need = FLX_RPC_SERVER_FIELD_LISTEN | FLX_RPC_SERVER_FIELD_METHODS;
    if ((p->field_mask & need) != need || !p->listen || !*p->listen)
        return flx_error_set(FLX_ERR_INVALID, "rpc server: listen and methods are required");
    if (p->n_methods == 0 || !p->methods)
        return flx_error_set(FLX_ERR_INVALID, "rpc server: n_methods 0");
    size_t max_recv = p->field_mask & FLX_RPC_SERVER_FIELD_MAX_RECV ? p->max_recv_bytes : 4u << 20;
    size_t max_send = p->field_mask & FLX_RPC_SERVER_FIELD_MAX_SEND ? p->max_send_bytes : 4u << 20;
    uint32_t n_threads = p->field_mask & FLX_RPC_SERVER_FIELD_THREADS ? p->n_threads : 2;
    if (max_recv < 64 || max_recv > INT32_MAX)
        return flx_error_set(FLX_ERR_INVALID, "rpc server: max_recv_bytes %zu outside [64, %d]", max_recv, INT32_MAX);
    if (max_send < 64 || max_send > INT32_MAX)
        return flx_error_set(FLX_ERR_INVALID, "rpc server: max_send_bytes %zu outside [64, %d]", max_send, INT32_MAX);
    if (n_threads < 1 || n_threads > 64)
        return flx_error_set(FLX_ERR_INVALID, "rpc server: n_threads %u outside [1, 64]", n_threads);
    for (uint32_t i = 0; i < p->n_methods; i++)
        if (!p->methods[i].path || p->methods[i].path[0] != '/' || !p->methods[i].handler)
            return flx_error_set(FLX_ERR_INVALID, "rpc server: method %u needs a path starting with '/' and a handler",
                                 i);

    flx_status_t st = FLX_OK;
    struct flx_rpc_server *s = calloc(1, sizeof *s);
    if (!s)
        return flx_error_set(FLX_ERR_NOMEM, "rpc server");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->max_send = max_send;
    s->t_shutdown = (rpc_tag_t){T_SHUTDOWN, NULL};
    s->methods = calloc(p->n_methods, sizeof *s->methods);
    s->thr = calloc(n_threads, sizeof *s->thr);
    if (!s->methods || !s->thr) {
        st = flx_error_set(FLX_ERR_NOMEM, "rpc server tables");
        goto fail_mem;
    }
    for (uint32_t i = 0; i < p->n_methods; i++) {
        s->methods[i] = p->methods[i];
        s->methods[i].path = strdup(p->methods[i].path);
        s->n_methods = i + 1;
        if (!s->methods[i].path) {
            st = flx_error_set(FLX_ERR_NOMEM, "rpc server method path");
            goto fail_mem;
        }
    }

    grpc_init();
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)max_recv;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)max_send;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ALLOW_REUSEPORT;   /* a second server on a busy port must fail, not share it */
    args[2].value.integer = 0;
    grpc_channel_args cargs = {.num_args = 3, .args = args};
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->srv = grpc_server_create(&cargs, NULL);
    grpc_server_register_completion_queue(s->srv, s->cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    s->port = grpc_server_add_http2_port(s->srv, p->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        st = flx_error_set(FLX_ERR_IO, "cannot listen on %s (address in use or invalid)", p->listen);
        grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);   /* never started: completes at once */
        grpc_server_cancel_all_calls(s->srv);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->t_shutdown)
                break;
        }
        grpc_server_destroy(s->srv);
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->cq);
        grpc_shutdown();
        goto fail_mem;
    }
    grpc_server_start(s->srv);
    for (int i = 0; i < N_REQUESTS; i++) request_one(s);
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&s->thr[i], NULL, poll_thread, s)) {
            /* the threads already started serve the queue; fewer than asked is not fatal */
            flx_log_warn("rpc", "started %u of %u completion-queue threads", i, n_threads);
            if (i == 0) {
                s->n_threads = 0;
                flx_rpc_server_destroy(s, 0);
                return flx_error_set(FLX_ERR_NOMEM, "rpc server: no completion-queue thread could start");
            }
            break;
        }
        s->n_threads = i + 1;
    }
    flx_log_info("rpc", "serving %u methods on %s (port %d), %u threads, messages up to %zu bytes in, %zu out",
                 s->n_methods, p->listen, s->port, s->n_threads, max_recv, max_send);
    *server_p = s;
    return FLX_OK;

fail_mem:
    server_free(s);
    return st;
}

int flx_rpc_server_port(flx_rpc_server_h s)
{
    return s ? s->port : 0;
}

uint32_t flx_rpc_server_n_calls(flx_rpc_server_h s)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    uint32_t n = s->n_calls;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void flx_rpc_server_shutdown(flx_rpc_server_h s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    int first = !s->shutting_down;
    s->shutting_down = 1;
    pthread_mutex_unlock(&s->mu);
    if (first) {
        FLX_TSAN_RELEASE(&s->t_shutdown);
        grpc_server_shutdown_and_notify(s->srv, s->cq, &s->t_shutdown);
    }
}

/* Waits until every call is freed and the shutdown tag came, or the absolute CLOCK_REALTIME
 * deadline dl passes (NULL: forever). Returns 1 when idle. */
static int wait_idle(flx_rpc_server_h s, const struct timespec *dl)
{
    pthread_mutex_lock(&s->mu);
    int r = 0;
    while (!(s->n_calls == 0 && s->shutdown_done) && r == 0)
        r = dl ? pthread_cond_timedwait(&s->cv, &s->mu, dl) : pthread_cond_wait(&s->cv, &s->mu);
    int idle = s->n_calls == 0 && s->shutdown_done;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void flx_rpc_server_destroy(flx_rpc_server_h s, uint32_t grace_ms)
{
    if (!s)
        return;
    flx_rpc_server_shutdown(s);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += grace_ms / 1000;
    dl.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    if (!s->n_threads) {   /* no polling thread ever started: poll here */
        grpc_server_cancel_all_calls(s->srv);
        while (!(s->shutdown_done && s->n_calls == 0))
            dispatch(s, grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL));
    }
    if (!wait_idle(s, &dl)) {
        flx_log_warn("rpc", "%u calls still open after %u ms of grace: cancelling them", flx_rpc_server_n_calls(s),
                     grace_ms);
        grpc_server_cancel_all_calls(s->srv);
        wait_idle(s, NULL);
    }
    grpc_completion_queue_shutdown(s->cq);
    for (uint32_t i = 0; i < s->n_threads; i++) pthread_join(s->thr[i], NULL);
    if (!s->n_threads)
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
        }
    grpc_server_destroy(s->srv);
    grpc_completion_queue_destroy(s->cq);
    grpc_shutdown();
    server_free(s);
}
