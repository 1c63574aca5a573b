/*
 * proc_util.h - child processes for the multi-process transport tests: flx-prefill started with
 * a session's address, id and token, its stderr kept in a file, waited for with a timeout.
 */
#ifndef PROC_UTIL_H
#define PROC_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flx/transport.h"
#include "flx/util.h"
#include "flx_test.h"

typedef struct proc {
    pid_t pid;
    char log[1024];              /* the child's stdout + stderr */
} proc_t;

/* Starts argv[0] with argv (NULL-terminated); output to log. The log is emptied here, before the
 * fork: the tests' folders outlive a run, and a caller polling proc_output for a line (a session id,
 * "stalled after") must not find the last run's while the child has yet to open the file (seen
 * under TSan with ctest --repeat: test_node_ucx took an old session id and drained the node before
 * that flx-prefill process had even connected). */
static inline proc_t proc_start(const char *log, char *const argv[])
{
    proc_t p = {0};
    snprintf(p.log, sizeof p.log, "%s", log);
    const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fprintf(stderr, "proc_start: %s: %s\n", log, strerror(errno));
    CHECK(fd >= 0);
    fflush(NULL);
    p.pid = fork();
    CHECK(p.pid >= 0);
    if (p.pid == 0) {
        dup2(fd, 1);   /* dup2 clears close-on-exec on 1 and 2 */
        dup2(fd, 2);
        /* The parent's UCX sockets and event fds are not inherited (UCX does not mark them
         * close-on-exec): a child holding the node's descriptors would change what the node sees. */
        for (int i = 3; i < 1024; i++) close(i);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s failed\n", argv[0]);
        _exit(127);
    }
    close(fd);
    return p;
}

/* Polls waitpid(flags | WNOHANG) up to timeout_ms; 1 with *status when the child changed state, 0
 * when the time ran out. */
static inline int proc_poll(proc_t *p, int flags, uint32_t timeout_ms, int *status)
{
    const uint64_t until = flx_now_ns() + (uint64_t)timeout_ms * 1000000;
    for (;;) {
        pid_t r = waitpid(p->pid, status, flags | WNOHANG);
        CHECK(r >= 0);
        if (r == p->pid) return 1;
        if (flx_now_ns() > until) return 0;
        usleep(2000);
    }
}

/* Waits up to timeout_ms; returns the exit status, 128 + signal when killed, -1 on timeout (the child
 * is then killed). */
static inline int proc_wait(proc_t *p, uint32_t timeout_ms)
{
    int status;
    if (proc_poll(p, 0, timeout_ms, &status))
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    return -1;
}

/* Waits up to timeout_ms for the child to be stopped (SIGSTOP; it is not reaped); 1 when it is. */
static inline int proc_wait_stopped(proc_t *p, uint32_t timeout_ms)
{
    int status;
    return proc_poll(p, WUNTRACED, timeout_ms, &status) && WIFSTOPPED(status);
}

/* The child's output (a static buffer, overwritten by the next call). */
static inline const char *proc_output(const proc_t *p)
{
    static char buf[1 << 16];
    FILE *f = fopen(p->log, "r");
    if (!f) return "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* flx-prefill for a session: the address, id and token of d, then the extra arguments (NULL-ended). */
static inline proc_t prefill_start(const char *tool, const char *log, const flx_tp_session_desc_t *d,
                                   flx_tp_err_mode_t em, ...)
{
    static char node[FLX_TP_HOST_MAX + 8], sid[32], tok[2 * FLX_TP_TOKEN_BYTES + 1];
    snprintf(node, sizeof node, "%s:%u", d->host, d->port);
    snprintf(sid, sizeof sid, "%#" PRIx64, d->sid);
    for (uint32_t i = 0; i < FLX_TP_TOKEN_BYTES; i++) sprintf(tok + 2 * i, "%02x", d->token[i]);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)tool;
    argv[n++] = "--node", argv[n++] = node;
    argv[n++] = "--session", argv[n++] = sid;
    argv[n++] = "--token", argv[n++] = tok;
    argv[n++] = "--err-mode", argv[n++] = em == FLX_TP_ERR_NONE ? "none" : "peer";
    va_list ap;
    va_start(ap, em);
    const char *a;
    while ((a = va_arg(ap, const char *)) && n < 63) argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return proc_start(log, argv);
}

#endif
