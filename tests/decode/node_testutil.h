/*
 * node_testutil.h - running a real fluxion-decoded process and talking to it over gRPC with
 * protobuf-c messages (test_node_grpc.c, bench/node).
 */
#ifndef FLX_NODE_TESTUTIL_H
#define FLX_NODE_TESTUTIL_H

#include <errno.h>
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

#endif
