/*
 * node_testutil.h - running a real fluxion-decoded process and talking to it over gRPC with
 * protobuf-c messages (test_node_grpc.c, bench/node).
 */
#ifndef FLX_NODE_TESTUTIL_H
#define FLX_NODE_TESTUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flx/rpc.h"
#include "flx_test.h"
#include "fluxion/decode/v1/decode.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

typedef struct daemon_proc {
    pid_t pid;
    int grpc_port, metrics_port;
    char target[64];
    char err_path[512];   /* its stderr */
} daemon_proc_t;

/* Starts DAEMON with argv (NULL-terminated, argv[0] ignored), stderr to err_path; waits up to
 * 60 s for its "serving" line. Returns 0 and fills d, or -1 with the daemon's exit status in
 * *exit_code (it exited before serving). */
static int daemon_start(const char *exe, const char *const *args, const char *err_path, daemon_proc_t *d,
                        int *exit_code)
{
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a test that fails half way leaves no daemon behind */
        dup2(pfd[1], STDOUT_FILENO);
        int efd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (efd >= 0) dup2(efd, STDERR_FILENO);
        close(pfd[0]);
        size_t n = 0;
        while (args[n]) n++;
        char **argv = calloc(n + 2, sizeof *argv);
        argv[0] = (char *)exe;
        for (size_t i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
        execv(exe, argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[512];
    size_t len = 0;
    int ok = 0;
    for (int waited = 0; waited < 60000 && len < sizeof line - 1;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r == 0) {
            waited += 100;
            continue;
        }
        ssize_t k = read(pfd[0], line + len, 1);
        if (k <= 0) break;
        len++;
        if (line[len - 1] == '\n') {
            ok = 1;
            break;
        }
    }
    line[len] = '\0';
    close(pfd[0]);
    if (!ok) {
        int status = 0;
        waitpid(pid, &status, 0);
        *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return -1;
    }
    memset(d, 0, sizeof *d);
    d->pid = pid;
    snprintf(d->err_path, sizeof d->err_path, "%s", err_path);
    const char *g = strstr(line, "grpc="), *m = strstr(line, "metrics=");
    CHECK(g && m);
    const char *gc = strchr(g, ' ');
    CHECK(gc);
    const char *colon = gc;
    while (colon > g && *colon != ':') colon--;
    d->grpc_port = atoi(colon + 1);
    const char *mc = strchr(m, ' ');
    colon = mc ? mc : m + strlen(m);
    while (colon > m && *colon != ':') colon--;
    d->metrics_port = *colon == ':' ? atoi(colon + 1) : 0;
    snprintf(d->target, sizeof d->target, "127.0.0.1:%d", d->grpc_port);
    return 0;
}

/* Sends sig and waits up to timeout_ms for the exit; returns its exit code (or 128 + signal), -1 if
 * it did not exit (it is then killed). */
static int daemon_stop(daemon_proc_t *d, int sig, int timeout_ms)
{
    if (sig) kill(d->pid, sig);
    for (int t = 0; t < timeout_ms; t += 10) {
        int status;
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(10000);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    return -1;
}

/* Packs m into a malloc'd buffer. */
static uint8_t *pb_pack(const ProtobufCMessage *m, size_t *len)
{
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*len ? *len : 1);
    CHECK(b);
    protobuf_c_message_pack(m, b);
    return b;
}

/* A unary call of DecodeNode's method with message req; returns the response bytes (free()) or
 * NULL, with the status in res. */
static void *node_call(flx_rpc_client_h c, const char *method, const ProtobufCMessage *req, uint32_t timeout_ms,
                       size_t *len, flx_rpc_result_t *res)
{
    char path[128];
    snprintf(path, sizeof path, "/fluxion.decode.v1.DecodeNode/%s", method);
    size_t n;
    uint8_t *b = pb_pack(req, &n);
    void *resp = NULL;
    CHECK_OK(flx_rpc_unary(c, path, b, n, timeout_ms, &resp, len, res));
    free(b);
    if (res->code != FLX_RPC_OK) {
        free(resp);
        return NULL;
    }
    return resp;
}

/* OpenSession: the status code; *sid on OK. */
static inline int open_session(flx_rpc_client_h c, const Fluxion__Decode__V1__OpenSessionRequest *r, uint64_t *sid,
                        flx_rpc_result_t *res)
{
    size_t len;
    void *b = node_call(c, "OpenSession", &r->base, 10000, &len, res);
    if (!b) return res->code;
    Fluxion__Decode__V1__OpenSessionResponse *o = fluxion__decode__v1__open_session_response__unpack(NULL, len, b);
    CHECK(o && o->session_id && o->transfer_token.len == 16 && o->reserved_bytes > 0);
    *sid = o->session_id;
    fluxion__decode__v1__open_session_response__free_unpacked(o, NULL);
    free(b);
    return FLX_RPC_OK;
}

static inline Fluxion__Decode__V1__SessionInfo *session_call(flx_rpc_client_h c, const char *method, uint64_t sid,
                                                      uint32_t timeout_ms, flx_rpc_result_t *res)
{
    size_t len;
    void *b;
    if (!strcmp(method, "WaitReady")) {
        Fluxion__Decode__V1__WaitReadyRequest w = FLUXION__DECODE__V1__WAIT_READY_REQUEST__INIT;
        w.session_id = sid;
        w.timeout_ms = timeout_ms;
        b = node_call(c, method, &w.base, 0, &len, res);
    } else {
        Fluxion__Decode__V1__GetSessionRequest g = FLUXION__DECODE__V1__GET_SESSION_REQUEST__INIT;
        g.session_id = sid;
        b = node_call(c, method, &g.base, 10000, &len, res);
    }
    if (!b) return NULL;
    Fluxion__Decode__V1__SessionInfo *i = fluxion__decode__v1__session_info__unpack(NULL, len, b);
    free(b);
    CHECK(i);
    return i;
}

typedef struct gen_out {
    int32_t tok[4096];
    uint32_t n;
    int finish;                  /* finish_reason of the last message */
    flx_rpc_result_t res;
    uint64_t host_bytes;         /* summed over the stream */
    uint32_t stream_heads, heads, blk128;
} gen_out_t;

/* CloseSession on sid; the call must succeed. */
static inline void close_session(flx_rpc_client_h c, uint64_t sid)
{
    Fluxion__Decode__V1__CloseSessionRequest cq = FLUXION__DECODE__V1__CLOSE_SESSION_REQUEST__INIT;
    cq.session_id = sid;
    size_t len;
    flx_rpc_result_t res;
    void *b = node_call(c, "CloseSession", &cq.base, 5000, &len, &res);
    CHECK(b);
    free(b);
}

/* A Generate stream on sid for max_new tokens (timeout_ms 0: no deadline). */
static inline flx_rpc_stream_h generate_open(flx_rpc_client_h c, uint64_t sid, uint32_t max_new, uint32_t timeout_ms)
{
    Fluxion__Decode__V1__GenerateRequest g = FLUXION__DECODE__V1__GENERATE_REQUEST__INIT;
    Fluxion__Decode__V1__StopConditions stop = FLUXION__DECODE__V1__STOP_CONDITIONS__INIT;
    stop.max_new_tokens = max_new;
    g.session_id = sid;
    g.stop = &stop;
    size_t len;
    uint8_t *b = pb_pack(&g.base, &len);
    flx_rpc_stream_h s;
    CHECK_OK(flx_rpc_stream_open(c, "/fluxion.decode.v1.DecodeNode/Generate", b, len, timeout_ms, &s));
    free(b);
    return s;
}

/* Generate on sid; reads cancel_after messages then cancels (0: all). */
static inline void generate(flx_rpc_client_h c, uint64_t sid, uint32_t max_new, uint32_t timeout_ms, uint32_t cancel_after,
                     gen_out_t *o)
{
    memset(o, 0, sizeof *o);
    flx_rpc_stream_h s = generate_open(c, sid, max_new, timeout_ms);
    for (;;) {
        void *m;
        size_t ml;
        flx_status_t st = flx_rpc_stream_next(s, &m, &ml, &o->res);
        CHECK(st >= 0);
        if (st == 0) break;
        Fluxion__Decode__V1__GenerateResponse *r = fluxion__decode__v1__generate_response__unpack(NULL, ml, m);
        free(m);
        CHECK(r && r->index == o->n && o->n < FLX_ARRAY_SIZE(o->tok));
        CHECK(r->timing && r->stats && r->stats->n_groups_by_blk == 4);
        if (r->index > 0) CHECK(r->timing->step_us > 0 && r->timing->batch_size >= 1 && r->stats->heads > 0);
        o->tok[o->n++] = r->token_id;
        o->finish = r->finish_reason;
        o->host_bytes += r->stats->host_bytes;
        o->stream_heads += r->stats->streaming_heads;
        o->heads += r->stats->heads;
        o->blk128 += r->stats->groups_by_blk[3];
        fluxion__decode__v1__generate_response__free_unpacked(r, NULL);
        if (cancel_after && o->n == cancel_after) flx_rpc_stream_cancel(s);
    }
    flx_rpc_stream_close(s);
}

static inline void expect_code(const char *what, flx_rpc_result_t *res, int code, const char *needle)
{
    if (res->code != code || (needle && !strstr(res->msg, needle))) {
        fprintf(stderr, "%s: got %s '%s', want %s containing '%s'\n", what, flx_rpc_code_name(res->code), res->msg,
                flx_rpc_code_name(code), needle ? needle : "");
        exit(1);
    }
    fprintf(stderr, "%s: %s '%s'\n", what, flx_rpc_code_name(res->code), res->msg);
}

static inline void same_tokens(const char *what, const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
    if (na != nb) {
        fprintf(stderr, "%s: %u tokens, want %u\n", what, na, nb);
        exit(1);
    }
    for (uint32_t i = 0; i < na; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "%s: token %u is %d, want %d\n", what, i, a[i], b[i]);
            exit(1);
        }
}

/* GET path from 127.0.0.1:port (a test client, not a server): the body, malloc'd; *code the HTTP status. */
static inline char *http_get(int port, const char *path, int *code)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    CHECK(write(fd, req, (size_t)n) == n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *code = atoi(buf + 9);
    char *body = strstr(buf, "\r\n\r\n");
    CHECK(body);
    return buf;
}

/* The value of the sample line starting with name (exact, labels included). */
static inline double metric(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += nl)
        if ((p == text || p[-1] == '\n') && p[nl] == ' ') return atof(p + nl + 1);
    fprintf(stderr, "metric %s missing\n", name);
    exit(1);
}

/* Runs cmd (a tool that prints text into ofile: flx-generate) and checks the text, less its final
 * newline, equals got. */
static inline void same_text_as(const char *cmd, const char *ofile, const char *got)
{
    CHECK(system(cmd) == 0);
    FILE *f = fopen(ofile, "r");
    CHECK(f);
    char want[8192];
    size_t wl = fread(want, 1, sizeof want - 1, f);
    fclose(f);
    want[wl] = '\0';
    if (wl && want[wl - 1] == '\n') want[wl - 1] = '\0';
    if (strcmp(want, got)) {
        fprintf(stderr, "the tool printed '%s'\nthe node streamed '%s'\n", want, got);
        exit(1);
    }
}

#endif
