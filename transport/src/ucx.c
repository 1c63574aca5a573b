/*
 * ucx.c - UCX plumbing shared by the node and the sender (tp_ucx.h).
 *
 * DESIGN
 * Each side drives its workers from one thread (the sender has one, the node one for its listener
 * and one per connection), so workers are created single-threaded and nothing here locks around
 * UCX. Waiting follows UCX's wake-up protocol: progress until they report nothing, ucp_worker_arm
 * each (BUSY means events raced in: progress again), then poll() on the workers' fds together with
 * an eventfd other threads use to hand work over. While receives are in flight the loop may keep
 * progressing for a few microseconds before arming: a rendezvous moved as active-message fragments
 * (IOV receives, eager fragments) otherwise costs a poll() wake-up per fragment; when nothing is in
 * flight it never spins.
 */
#define _GNU_SOURCE
#include "tp_ucx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "flx/util.h"

flx_status_t tp_status_from_ucs(ucs_status_t st)
{
    switch (st) {
    case UCS_OK: return FLX_OK;
    case UCS_INPROGRESS: return FLX_INPROGRESS;
    case UCS_ERR_NO_MEMORY: return FLX_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR: return FLX_ERR_INVALID;
    case UCS_ERR_UNSUPPORTED: return FLX_ERR_UNSUPPORTED;
    case UCS_ERR_CANCELED: return FLX_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT: return FLX_ERR_TIMEOUT;
    case UCS_ERR_BUSY:
    case UCS_ERR_NO_RESOURCE: return FLX_ERR_CAPACITY;
    case UCS_ERR_MESSAGE_TRUNCATED: return FLX_ERR_FORMAT;
    case UCS_ERR_REJECTED: return FLX_ERR_STATE;
    default: return FLX_ERR_IO; /* unreachable, endpoint timeout, connection reset, I/O error, ... */
    }
}

flx_status_t tp_ucs_error(ucs_status_t st, const char *what)
{
    return flx_error_set(tp_status_from_ucs(st), "%s: %s", what, ucs_status_string(st));
}

ucp_err_handling_mode_t tp_err_mode(flx_tp_err_mode_t m)
{
    return m == FLX_TP_ERR_NONE ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
}

flx_status_t flx_tp_err_mode_parse(const char *s, flx_tp_err_mode_t *mode_p)
{
    if (s && !strcmp(s, "peer")) *mode_p = FLX_TP_ERR_PEER;
    else if (s && !strcmp(s, "none")) *mode_p = FLX_TP_ERR_NONE;
    else return flx_error_set(FLX_ERR_INVALID, "error mode '%s': expected peer or none", s ? s : "(null)");
    return FLX_OK;
}

flx_status_t tp_worker_open(ucp_context_h ctx, const char *who, ucp_worker_h *worker_p)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_status_t us = ucp_worker_create(ctx, &wp, worker_p);
    return us == UCS_OK ? FLX_OK : tp_ucs_error(us, who);
}

flx_status_t tp_ucx_open(const char *who, ucp_context_h *ctx_p, ucp_worker_h *worker_p)
{
    ucp_config_t *cfg;
    ucs_status_t us = ucp_config_read(NULL, NULL, &cfg); /* UCX_* environment: UCX_TLS decides */
    if (us != UCS_OK) return tp_ucs_error(us, who);
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                       .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                       .name = who};
    ucp_context_h ctx;
    us = ucp_init(&pp, cfg, &ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK) return tp_ucs_error(us, who);
    flx_status_t st = tp_worker_open(ctx, who, worker_p);
    if (st) {
        ucp_cleanup(ctx);
        return st;
    }
    *ctx_p = ctx;
    return FLX_OK;
}

void tp_ucx_close(ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker) ucp_worker_destroy(worker);
    if (ctx) ucp_cleanup(ctx);
}

flx_status_t tp_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || !res)
        return flx_error_set(FLX_ERR_INVALID, "address %s:%u: %s", host, port, rc ? gai_strerror(rc) : "no address");
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return FLX_OK;
}

void tp_sockaddr_str(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
    }
    snprintf(out, cap, "%s:%u", ip, port);
}

flx_status_t tp_loop_init(tp_loop_t *l, ucp_worker_h worker)
{
    l->worker = worker;
    l->wake_fd = -1;
    ucs_status_t us = ucp_worker_get_efd(worker, &l->worker_fd);
    if (us != UCS_OK) return tp_ucs_error(us, "worker event fd");
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0) return flx_error_set(flx_status_from_errno(errno), "eventfd: %s", strerror(errno));
    return FLX_OK;
}

void tp_loop_fini(tp_loop_t *l)
{
    if (l->wake_fd >= 0) close(l->wake_fd);
    l->wake_fd = -1;
}

void tp_loop_wake(tp_loop_t *l)
{
    uint64_t one = 1;
    ssize_t r = write(l->wake_fd, &one, sizeof one);
    (void)r; /* EAGAIN: the counter is already non-zero, the thread will wake anyway */
}

/* One pass over the loop's worker and the others; 1 if any of them ran something. */
static int progress_once(tp_loop_t *l, ucp_worker_h const *more, size_t n_more)
{
    int ran = ucp_worker_progress(l->worker) != 0;
    for (size_t i = 0; i < n_more; i++) ran |= ucp_worker_progress(more[i]) != 0;
    return ran;
}

int tp_loop_wait_set(tp_loop_t *l, ucp_worker_h const *more, const int *more_fds, size_t n_more,
                     struct pollfd *fds, int timeout_ms, uint64_t spin_ns)
{
    int progressed = 0;
    while (progress_once(l, more, n_more)) progressed = 1; /* round robin: one busy worker starves none */
    if (progressed) return 0; /* completions ran: the caller may have work they made possible */
    if (spin_ns) {
        uint64_t end = flx_now_ns() + spin_ns;
        while (flx_now_ns() < end)
            if (progress_once(l, more, n_more)) return 0; /* something happened: let the caller look */
    }
    if (ucp_worker_arm(l->worker) == UCS_ERR_BUSY) return 0;
    for (size_t i = 0; i < n_more; i++)
        if (ucp_worker_arm(more[i]) == UCS_ERR_BUSY) return 0;
    fds[0] = (struct pollfd){.fd = l->wake_fd, .events = POLLIN};
    fds[1] = (struct pollfd){.fd = l->worker_fd, .events = POLLIN};
    for (size_t i = 0; i < n_more; i++) fds[2 + i] = (struct pollfd){.fd = more_fds[i], .events = POLLIN};
    int n = poll(fds, (nfds_t)(n_more + 2), timeout_ms);
    if (n > 0 && (fds[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = read(l->wake_fd, &v, sizeof v);
        (void)r;
        return 1;
    }
    return 0;
}

int tp_loop_wait(tp_loop_t *l, int timeout_ms, uint64_t spin_ns)
{
    struct pollfd fds[2];
    return tp_loop_wait_set(l, NULL, NULL, 0, fds, timeout_ms, spin_ns);
}

void *tp_am_send(ucp_ep_h ep, const void *hdr, const void *payload, size_t len, uint32_t flags, ucp_send_nbx_callback_t cb,
                 void *user_data, ucp_dt_iov_t *iov_storage)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE,
                              .cb.send = cb, .user_data = user_data, .flags = flags,
                              .datatype = ucp_dt_make_contig(1)};
    const void *buf = payload;
    size_t count = len;
    if (!(flags & UCP_AM_SEND_FLAG_RNDV)) {
        iov_storage->buffer = (void *)payload;
        iov_storage->length = len;
        rp.datatype = ucp_dt_make_iov();
        buf = iov_storage;
        count = len ? 1 : 0;
    }
    return ucp_am_send_nbx(ep, FLX_TP_AM_ID, hdr, FLX_TP_HDR_BYTES, buf, count, &rp);
}

void tp_fifo_init(tp_fifo_t *q)
{
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
    q->n = 0;
}

void tp_fifo_fini(tp_fifo_t *q)
{
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cv);
}

void tp_fifo_push(tp_fifo_t *q, void *item)
{
    *(void **)item = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->tail) *(void **)q->tail = item;
    else q->head = item;
    q->tail = item;
    q->n++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->lock);
}

static void *pop_locked(tp_fifo_t *q)
{
    void *it = q->head;
    if (it) {
        q->head = *(void **)it;
        if (!q->head) q->tail = NULL;
        q->n--;
    }
    return it;
}

void *tp_fifo_pop(tp_fifo_t *q)
{
    pthread_mutex_lock(&q->lock);
    void *it = pop_locked(q);
    pthread_mutex_unlock(&q->lock);
    return it;
}

void *tp_fifo_pop_wait(tp_fifo_t *q, const int *stop)
{
    pthread_mutex_lock(&q->lock);
    while (!q->head && !*stop) pthread_cond_wait(&q->cv, &q->lock);
    void *it = pop_locked(q);
    pthread_mutex_unlock(&q->lock);
    return it;
}

void tp_fifo_stop(tp_fifo_t *q, int *stop)
{
    pthread_mutex_lock(&q->lock);
    *stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lock);
}
