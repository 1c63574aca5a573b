/*
 * test_rpc.c - the gRPC core server and client of flx/rpc.h over a real loopback port.
 *
 * Methods of the test service:
 *   /t.T/Echo     unary: the request back
 *   /t.T/Fail     unary: request = int32 flx_status_t; finishes with it ("fail <st>")
 *   /t.T/Count    streaming: request = uint32 n; n messages (uint32 i), then OK
 *   /t.T/Hold     the call is kept by an owner thread until it is cancelled (client cancel,
 *                 deadline, or server destroy), then finished; records that on_cancel ran
 * Checks: round trips of several sizes, the status mapping end to end, UNIMPLEMENTED for an
 * unknown method, RESOURCE_EXHAUSTED for a request over max_recv_bytes, stream order, client
 * cancellation and deadline expiry reaching the owner, concurrent callers, destroy with a held
 * call, a busy port refused.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/rpc.h"
#include "flx/util.h"
#include "flx_test.h"

typedef struct held {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    flx_rpc_call_h call;
    int cancel_seen;          /* on_cancel ran */
    int n_finished;
    uint64_t deadline_ns;
    int stop;
} held_t;

static held_t g_held = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0};

static void h_echo(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_rpc_reply(call, req, len);
}

static void h_fail(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    int32_t st = 0;
    if (len != 4) {
        flx_rpc_finish(call, FLX_ERR_INVALID, "request of %zu bytes, want 4", len);
        return;
    }
    memcpy(&st, req, 4);
    flx_rpc_finish(call, st, "fail %d", st);
}

static void h_count(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    uint32_t n = 0;
    if (len == 4) memcpy(&n, req, 4);
    for (uint32_t i = 0; i < n; i++) CHECK_OK(flx_rpc_send(call, &i, sizeof i));
    flx_rpc_finish(call, FLX_OK, NULL);
}

static void on_cancel(void *ctx)
{
    held_t *h = ctx;
    pthread_mutex_lock(&h->mu);
    h->cancel_seen = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void h_hold(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    held_t *h = ctx;
    pthread_mutex_lock(&h->mu);
    CHECK(h->call == NULL);
    h->call = call;
    h->deadline_ns = flx_rpc_call_deadline_ns(call);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (flx_rpc_call_on_cancel(call, on_cancel, h))
        on_cancel(h);
}

/* The owner of held calls: finishes each once it was cancelled. */
static void *owner_thread(void *arg)
{
    held_t *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        if (h->call && h->cancel_seen) {
            flx_rpc_call_h c = h->call;
            h->call = NULL;
            h->cancel_seen = 0;
            h->n_finished++;
            pthread_mutex_unlock(&h->mu);
            CHECK(flx_rpc_call_cancelled(c));
            CHECK_ST(flx_rpc_send(c, "x", 1), FLX_ERR_CANCELED);
            flx_rpc_finish(c, FLX_ERR_CANCELED, "held call cancelled");
            pthread_mutex_lock(&h->mu);
            pthread_cond_broadcast(&h->cv);
            continue;
        }
        pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static int wait_finished(held_t *h, int n)
{
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < 500 && h->n_finished < n; i++) {
        pthread_mutex_unlock(&h->mu);
        usleep(10000);
        pthread_mutex_lock(&h->mu);
    }
    int ok = h->n_finished >= n;
    pthread_mutex_unlock(&h->mu);
    return ok;
}

/* Calls the owner has finished so far (it counts them under the lock, from its own thread). */
static int n_finished(held_t *h)
{
    pthread_mutex_lock(&h->mu);
    const int n = h->n_finished;
    pthread_mutex_unlock(&h->mu);
    return n;
}

static flx_rpc_server_h start_server(size_t max_recv)
{
    static const flx_rpc_method_t methods[] = {
        {"/t.T/Echo", h_echo, NULL}, {"/t.T/Fail", h_fail, NULL},
        {"/t.T/Count", h_count, NULL}, {"/t.T/Hold", h_hold, &g_held},
    };
    flx_rpc_server_params_t p = {
        .field_mask = FLX_RPC_SERVER_FIELD_LISTEN | FLX_RPC_SERVER_FIELD_METHODS | FLX_RPC_SERVER_FIELD_MAX_RECV |
                      FLX_RPC_SERVER_FIELD_THREADS,
        .listen = "127.0.0.1:0", .methods = methods, .n_methods = 4, .max_recv_bytes = max_recv, .n_threads = 2};
    flx_rpc_server_h s;
    CHECK_OK(flx_rpc_server_create(&p, &s));
    CHECK(flx_rpc_server_port(s) > 0);
    return s;
}

static void unary(flx_rpc_client_h c, const char *m, const void *req, size_t len, uint32_t timeout_ms,
                  flx_rpc_result_t *res, void **resp, size_t *rlen)
{
    void *r = NULL;
    size_t n = 0;
    CHECK_OK(flx_rpc_unary(c, m, req, len, timeout_ms, &r, &n, res));
    if (resp) {
        *resp = r;
        *rlen = n;
    } else {
        free(r);
    }
}

static void test_echo_sizes(flx_rpc_client_h c)
{
    size_t sizes[] = {0, 1, 1000, 300000};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(sizes); i++) {
        uint8_t *buf = malloc(sizes[i] + 1);
        for (size_t j = 0; j < sizes[i]; j++) buf[j] = (uint8_t)(j * 131 + i);
        flx_rpc_result_t res;
        void *resp;
        size_t rlen;
        unary(c, "/t.T/Echo", buf, sizes[i], 60000, &res, &resp, &rlen);
        if (res.code != FLX_RPC_OK) fprintf(stderr, "echo of %zu bytes: %s %s\n", sizes[i], flx_rpc_code_name(res.code), res.msg);
        CHECK(res.code == FLX_RPC_OK);
        CHECK(rlen == sizes[i]);
        CHECK(memcmp(resp, buf, sizes[i]) == 0);
        free(resp);
        free(buf);
    }
}

static void test_status_mapping(flx_rpc_client_h c)
{
    static const struct { flx_status_t st; int code; } want[] = {
        {FLX_ERR_INVALID, FLX_RPC_INVALID_ARGUMENT}, {FLX_ERR_FORMAT, FLX_RPC_INVALID_ARGUMENT},
        {FLX_ERR_NOT_FOUND, FLX_RPC_NOT_FOUND}, {FLX_ERR_CAPACITY, FLX_RPC_RESOURCE_EXHAUSTED},
        {FLX_ERR_NOMEM, FLX_RPC_RESOURCE_EXHAUSTED}, {FLX_ERR_STATE, FLX_RPC_FAILED_PRECONDITION},
        {FLX_ERR_TIMEOUT, FLX_RPC_DEADLINE_EXCEEDED}, {FLX_ERR_UNAVAILABLE, FLX_RPC_UNAVAILABLE},
        {FLX_ERR_CANCELED, FLX_RPC_CANCELLED}, {FLX_ERR_DUPLICATE, FLX_RPC_ALREADY_EXISTS},
        {FLX_ERR_UNSUPPORTED, FLX_RPC_UNIMPLEMENTED}, {FLX_ERR_INTERNAL, FLX_RPC_INTERNAL},
        {FLX_ERR_IO, FLX_RPC_INTERNAL}, {FLX_ERR_NO_DEVICE, FLX_RPC_FAILED_PRECONDITION},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(want); i++) {
        CHECK(flx_rpc_status_code(want[i].st) == want[i].code);
        int32_t st = want[i].st;
        flx_rpc_result_t res;
        unary(c, "/t.T/Fail", &st, 4, 5000, &res, NULL, NULL);
        char expect[64];
        snprintf(expect, sizeof expect, "%s: fail %d", flx_status_name(st), st);
        if (res.code != want[i].code || strcmp(res.msg, expect)) {
            fprintf(stderr, "status %s: got %s '%s', want %s '%s'\n", flx_status_name(st), flx_rpc_code_name(res.code),
                    res.msg, flx_rpc_code_name(want[i].code), expect);
            exit(1);
        }
    }
    int32_t ok = FLX_OK;
    flx_rpc_result_t res;
    unary(c, "/t.T/Fail", &ok, 4, 5000, &res, NULL, NULL);
    CHECK(res.code == FLX_RPC_OK);
    unary(c, "/t.T/Fail", "abc", 3, 5000, &res, NULL, NULL);
    CHECK(res.code == FLX_RPC_INVALID_ARGUMENT && strstr(res.msg, "3 bytes"));
}

static void test_unknown_and_oversized(flx_rpc_client_h c)
{
    flx_rpc_result_t res;
    unary(c, "/t.T/Nope", "a", 1, 5000, &res, NULL, NULL);
    CHECK(res.code == FLX_RPC_UNIMPLEMENTED);
    CHECK(strstr(res.msg, "/t.T/Nope") != NULL);
    size_t big = 8192;   /* the server's max_recv_bytes is 4096 */
    uint8_t *buf = calloc(1, big);
    unary(c, "/t.T/Echo", buf, big, 5000, &res, NULL, NULL);
    fprintf(stderr, "oversized request: %s '%s'\n", flx_rpc_code_name(res.code), res.msg);
    CHECK(res.code == FLX_RPC_RESOURCE_EXHAUSTED);
    free(buf);
    /* the server still serves */
    unary(c, "/t.T/Echo", "ok", 2, 5000, &res, NULL, NULL);
    CHECK(res.code == FLX_RPC_OK);
}

static void test_stream(flx_rpc_client_h c)
{
    uint32_t n = 1000;
    flx_rpc_stream_h s;
    CHECK_OK(flx_rpc_stream_open(c, "/t.T/Count", &n, 4, 10000, &s));
    flx_rpc_result_t res;
    for (uint32_t i = 0;; i++) {
        void *m;
        size_t len;
        flx_status_t st = flx_rpc_stream_next(s, &m, &len, &res);
        CHECK(st >= 0);
        if (st == 0) {
            CHECK(i == n);
            break;
        }
        uint32_t v;
        CHECK(len == 4);
        memcpy(&v, m, 4);
        free(m);
        CHECK(v == i);
    }
    CHECK(res.code == FLX_RPC_OK);
    flx_rpc_stream_close(s);
}

static void test_cancel(flx_rpc_client_h c, flx_rpc_server_h srv)
{
    int before = n_finished(&g_held);
    flx_rpc_stream_h s;
    CHECK_OK(flx_rpc_stream_open(c, "/t.T/Hold", "h", 1, 0, &s));
    pthread_mutex_lock(&g_held.mu);
    while (!g_held.call) pthread_cond_wait(&g_held.cv, &g_held.mu);
    CHECK(g_held.deadline_ns == UINT64_MAX);
    pthread_mutex_unlock(&g_held.mu);
    CHECK(flx_rpc_server_n_calls(srv) >= 1);
    flx_rpc_stream_cancel(s);
    void *m;
    size_t len;
    flx_rpc_result_t res;
    CHECK(flx_rpc_stream_next(s, &m, &len, &res) == 0);
    CHECK(res.code == FLX_RPC_CANCELLED);
    flx_rpc_stream_close(s);
    CHECK(wait_finished(&g_held, before + 1));
}

static void test_deadline(flx_rpc_client_h c)
{
    int before = n_finished(&g_held);
    uint64_t t0 = flx_now_ns();
    flx_rpc_result_t res;
    unary(c, "/t.T/Hold", "h", 1, 300, &res, NULL, NULL);
    uint64_t dt = flx_now_ns() - t0;
    fprintf(stderr, "deadline: %s after %.0f ms\n", flx_rpc_code_name(res.code), dt / 1e6);
    CHECK(res.code == FLX_RPC_DEADLINE_EXCEEDED);
    CHECK(dt >= 250000000ull);
    CHECK(wait_finished(&g_held, before + 1));   /* the server saw the deadline as a cancellation */
    /* the server saw the deadline (within scheduling slack of the client's 300 ms) */
    pthread_mutex_lock(&g_held.mu);
    const uint64_t dl = g_held.deadline_ns;
    pthread_mutex_unlock(&g_held.mu);
    CHECK(dl != UINT64_MAX && dl > t0 && dl < t0 + 2000000000ull);
}

typedef struct conc_arg {
    flx_rpc_client_h c;
    int id;
} conc_arg_t;

static void *conc_thread(void *arg)
{
    conc_arg_t *a = arg;
    for (int i = 0; i < 40; i++) {
        char req[32];
        int n = snprintf(req, sizeof req, "t%d-%d", a->id, i);
        flx_rpc_result_t res;
        void *resp;
        size_t rlen;
        unary(a->c, "/t.T/Echo", req, (size_t)n, 10000, &res, &resp, &rlen);
        CHECK(res.code == FLX_RPC_OK && rlen == (size_t)n && !memcmp(resp, req, rlen));
        free(resp);
    }
    return NULL;
}

static void test_concurrent(flx_rpc_client_h c)
{
    pthread_t t[4];
    conc_arg_t a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (conc_arg_t){c, i};
        CHECK(pthread_create(&t[i], NULL, conc_thread, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
}

typedef struct bg_arg {
    flx_rpc_client_h c;
    flx_rpc_result_t res;
} bg_arg_t;

static void *bg_hold(void *arg)
{
    bg_arg_t *a = arg;
    unary(a->c, "/t.T/Hold", "h", 1, 0, &a->res, NULL, NULL);
    return NULL;
}

int main(void)
{
    pthread_t owner;
    CHECK(pthread_create(&owner, NULL, owner_thread, &g_held) == 0);
    flx_rpc_server_h srv = start_server(4096);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", flx_rpc_server_port(srv));
    flx_rpc_client_h c;
    CHECK_OK(flx_rpc_client_create(target, 8u << 20, &c));

    /* A second server on the same port is refused. */
    {
        flx_rpc_method_t m = {"/t.T/Echo", h_echo, NULL};
        flx_rpc_server_params_t p = {.field_mask = FLX_RPC_SERVER_FIELD_LISTEN | FLX_RPC_SERVER_FIELD_METHODS,
                                     .listen = target, .methods = &m, .n_methods = 1};
        flx_rpc_server_h s2;
        CHECK_ST(flx_rpc_server_create(&p, &s2), FLX_ERR_IO);
        fprintf(stderr, "busy port: %s\n", flx_error_msg());
        p.n_methods = 0;
        CHECK_ST(flx_rpc_server_create(&p, &s2), FLX_ERR_INVALID);
    }

    flx_rpc_server_h big = start_server(1u << 20);   /* the 300 KB echo needs a larger limit */
    {
        char t2[64];
        snprintf(t2, sizeof t2, "127.0.0.1:%d", flx_rpc_server_port(big));
        flx_rpc_client_h c2;
        CHECK_OK(flx_rpc_client_create(t2, 8u << 20, &c2));
        test_echo_sizes(c2);
        flx_rpc_client_destroy(c2);
        flx_rpc_server_destroy(big, 1000);
    }
    test_status_mapping(c);
    test_unknown_and_oversized(c);
    test_stream(c);
    test_cancel(c, srv);
    test_deadline(c);
    test_concurrent(c);

    /* Destroy with a call held by its owner: after the grace period the server cancels it, the owner
     * finishes it, destroy returns and the client sees the call end. */
    bg_arg_t bg = {.c = c};
    pthread_t t;
    int before = n_finished(&g_held);
    CHECK(pthread_create(&t, NULL, bg_hold, &bg) == 0);
    pthread_mutex_lock(&g_held.mu);
    while (!g_held.call) pthread_cond_wait(&g_held.cv, &g_held.mu);
    pthread_mutex_unlock(&g_held.mu);
    flx_rpc_server_destroy(srv, 200);
    pthread_join(t, NULL);
    CHECK(n_finished(&g_held) == before + 1);
    fprintf(stderr, "held call at destroy: %s '%s'\n", flx_rpc_code_name(bg.res.code), bg.res.msg);
    CHECK(bg.res.code != FLX_RPC_OK);
    flx_rpc_client_destroy(c);

    pthread_mutex_lock(&g_held.mu);
    g_held.stop = 1;
    pthread_cond_broadcast(&g_held.cv);
    pthread_mutex_unlock(&g_held.mu);
    pthread_join(owner, NULL);
    fprintf(stderr, "test_rpc: ok\n");
    return 0;
}
