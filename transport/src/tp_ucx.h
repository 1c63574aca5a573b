/*
 * tp_ucx.h - what the node and the sender share about UCX: the one ucs_status_t translation, the
 * context and worker they both create, the event-driven wait, host:port resolution, and a small
 * FIFO that API threads use to hand work to a progress thread.
 */
#ifndef FLX_TP_UCX_H
#define FLX_TP_UCX_H

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include "flx/kvstore.h"
#include "flx/status.h"
#include "flx/transport.h"

/* ucs_status_t -> flx_status_t: the one place (STYLE.md). */
flx_status_t tp_status_from_ucs(ucs_status_t st);

/* Records "what: <ucx reason>" with the translated status and returns it. */
flx_status_t tp_ucs_error(ucs_status_t st, const char *what);

/* A context with active messages and wake-ups, and one worker driven by one thread
 * (UCS_THREAD_MODE_SINGLE: only the owner's progress thread touches it after create). */
flx_status_t tp_ucx_open(const char *who, ucp_context_h *ctx_p, ucp_worker_h *worker_p);
/* One more single-threaded worker of ctx. */
flx_status_t tp_worker_open(ucp_context_h ctx, const char *who, ucp_worker_h *worker_p);
void tp_ucx_close(ucp_context_h ctx, ucp_worker_h worker);

ucp_err_handling_mode_t tp_err_mode(flx_tp_err_mode_t m);

/* host:port -> sockaddr (numeric or resolvable host). */
flx_status_t tp_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len_p);
/* "ip:port" of a sockaddr. */
void tp_sockaddr_str(const struct sockaddr_storage *ss, char *out, size_t cap);

/* Sends one message of the wire format (FLX_TP_AM_ID, a FLX_TP_HDR_BYTES header): with
 * UCP_AM_SEND_FLAG_RNDV the payload goes as a contiguous buffer (a zero-copy rendezvous); otherwise
 * as a one-entry IOV (iov_storage, which must live as long as the request). Why not contiguous:
 * UCX 1.13 picks a message's protocol when it is posted, from the endpoint's configuration at that
 * moment, and replays it unchanged once a client-server endpoint is wired; a small message posted
 * during wire-up was started as "short" under the first configuration and then refused by the
 * shared-memory lane ("Invalid am_short_iov length: 120 (expected: <= 100)") and lost. UCX never
 * picks "short" for an IOV datatype, so eager messages go as buffered copies on every lane. */
void *tp_am_send(ucp_ep_h ep, const void *hdr, const void *payload, size_t len, uint32_t flags,
                 ucp_send_nbx_callback_t cb, void *user_data, ucp_dt_iov_t *iov_storage);

/* Event-driven progress: the worker's event fd and an eventfd other threads write to wake the
 * progress thread. */
typedef struct tp_loop {
    ucp_worker_h worker;
    int worker_fd;
    int wake_fd;
} tp_loop_t;

flx_status_t tp_loop_init(tp_loop_t *l, ucp_worker_h worker);
void tp_loop_fini(tp_loop_t *l);
void tp_loop_wake(tp_loop_t *l);
/* Progresses until UCX has nothing to do and returns 0 if that ran anything (its callbacks may have
 * made work possible: a send window with room); otherwise spins at most spin_ns more progressing
 * (0: none; used only while transfers are in flight, never when idle), arms the worker and sleeps
 * in poll() up to timeout_ms (-1: no limit) until UCX or a waker has something. Returns 1 when
 * woken by tp_loop_wake. */
int tp_loop_wait(tp_loop_t *l, int timeout_ms, uint64_t spin_ns);
/* The same over the loop's worker and n_more others (more_fds: their event fds), progressed round
 * robin; fds is room for n_more + 2 entries. */
int tp_loop_wait_set(tp_loop_t *l, ucp_worker_h const *more, const int *more_fds, size_t n_more,
                     struct pollfd *fds, int timeout_ms, uint64_t spin_ns);

/* A FIFO of nodes linked through their first field (a `void *next` at offset 0). */
typedef struct tp_fifo {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    void *head, *tail;
    uint64_t n;
} tp_fifo_t;

void tp_fifo_init(tp_fifo_t *q);
void tp_fifo_fini(tp_fifo_t *q);
void tp_fifo_push(tp_fifo_t *q, void *item);
/* Takes the first item or NULL when empty. */
void *tp_fifo_pop(tp_fifo_t *q);
/* Waits for an item; NULL when *stop became true (checked under the lock, broadcast by
 * tp_fifo_stop). */
void *tp_fifo_pop_wait(tp_fifo_t *q, const int *stop);
void tp_fifo_stop(tp_fifo_t *q, int *stop);

#endif
