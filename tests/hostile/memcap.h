/*
 * memcap.h - run a piece of a test in a forked child whose address space is capped (RLIMIT_AS), so
 * a loader that allocates by what a hostile file claims fails the test instead of eating the
 * machine. The child's status comes back; a crash in the child (a signal) is reported as one.
 *
 * The cap is not enforced in ASan/TSan builds: their runtimes reserve terabytes of address space
 * (shadow memory, allocator regions), which RLIMIT_AS cannot tell from the loader's allocations.
 * There the child runs uncapped and the checks of status and message still apply; libFuzzer's
 * -rss_limit_mb / -malloc_limit_mb bound allocations in the sanitizer-built fuzz targets.
 */
#ifndef FLX_MEMCAP_H
#define FLX_MEMCAP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flx_test.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEMCAP_ENFORCED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define MEMCAP_ENFORCED 0
#endif
#endif
#ifndef MEMCAP_ENFORCED
#define MEMCAP_ENFORCED 1
#endif

#define MEMCAP_MIB ((size_t)1 << 20)

typedef struct {
    int code;       /* exit code, or -1 when the child died of a signal */
    int sig;        /* the signal, or 0 */
    long max_rss_kb; /* the child's peak resident set */
} memcap_result_t;

/* Bytes of address space this process holds now (/proc/self/statm, first field). */
static inline size_t memcap_vm_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    CHECK(f && fscanf(f, "%lu", &pages) == 1);
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* In the child: caps the address space at what it holds now plus cap bytes (absolute: at cap). */
static inline void memcap_limit(size_t cap, int absolute)
{
    if (!MEMCAP_ENFORCED) return;
    size_t lim = absolute ? cap : memcap_vm_now() + cap;
    struct rlimit rl = {lim, lim};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        perror("setrlimit");
        _exit(99);
    }
}

static inline memcap_result_t memcap_wait(pid_t pid)
{
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    CHECK(wait4(pid, &status, 0, &ru) == pid);
    memcap_result_t r = {.code = -1, .sig = 0, .max_rss_kb = ru.ru_maxrss};
    if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) r.sig = WTERMSIG(status);
    return r;
}

/* Runs fn(arg) in a child that may map at most cap bytes more than it holds at the fork. */
static inline memcap_result_t memcap_run(size_t cap, int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        memcap_limit(cap, 0);
        int rc = fn(arg);
        fflush(NULL);
        _exit(rc);
    }
    return memcap_wait(pid);
}

/* Runs argv[0] with its stderr to errfile (stdout to /dev/null) in an address space of at most cap
 * bytes in all. */
static inline memcap_result_t memcap_exec(size_t cap, char *const argv[], const char *errfile)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(errfile, "w", stderr)) _exit(98);
        memcap_limit(cap, 1);
        execv(argv[0], argv);
        perror("execv");
        _exit(97);
    }
    return memcap_wait(pid);
}

#endif
