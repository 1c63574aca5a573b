/*
 * flx_test.h - the small harness every C test uses.
 *
 * A test program exits 0 when every check passed, 1 on the first failed check (after printing
 * file, line and the values), 77 when it must be skipped (no GPU). Numeric comparisons follow
 * the project rule: |x - ref| <= atol + rtol * |ref| for every element, any NaN or Inf in x or ref
 * fails, and the worst element is printed either way.
 */
#ifndef FLX_TEST_H
#define FLX_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flx/pool.h"
#include "flx/status.h"
#include "flx/util.h"

#define FLX_TEST_SKIP 77

/* The worker counts the determinism checks force: results must be bitwise the same at each. */
static const uint32_t FLX_TEST_WORKERS[4] = {1, 2, 3, 7};

/* A pool of exactly n workers (the caller destroys it); exits the test on failure. */
static inline flx_pool_h flx_test_pool(uint32_t n)
{
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_N_WORKERS, .n_workers = n};
    flx_pool_h p = NULL;
    if (flx_pool_create(&pp, &p) != FLX_OK) {
        fprintf(stderr, "flx_test_pool(%u): %s\n", n, flx_error_msg());
        exit(1);
    }
    return p;
}

/* 1 when the n floats are the same bits; else prints the first difference and returns 0. */
static inline int flx_test_same_bits(const char *label, const float *x, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &x[i], 4);
        memcpy(&b, &ref[i], 4);
        if (a != b) {
            fprintf(stderr, "%s: element %zu differs: %.9g (0x%08x) vs %.9g (0x%08x)\n", label, i, (double)x[i], a,
                    (double)ref[i], b);
            return 0;
        }
    }
    return 1;
}
#define CHECK_SAME(label, x, ref, n) CHECK(flx_test_same_bits(label, x, ref, n))

/* The real model file the model tests use: $FLX_CACHE (or ~/.cache/fluxion, as scripts/setup.sh
 * fetches it) / SmolLM2-135M-Instruct.Q4_1.gguf into path. Returns 1 when it is readable, else
 * prints "<who>: <path> not found: skipped" and returns 0 (the caller exits FLX_TEST_SKIP). */
static inline int flx_test_model_path(const char *who, char *path, size_t cap)
{
    const char *cache = getenv("FLX_CACHE"), *home = getenv("HOME");
    if (cache && *cache) snprintf(path, cap, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else snprintf(path, cap, "%s/.cache/fluxion/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    if (access(path, R_OK) == 0) return 1;
    fprintf(stderr, "%s: %s not found: skipped\n", who, path);
    return 0;
}

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

/* Expects a status; prints the thread's error message on mismatch. */
#define CHECK_ST(expr, want)                                                                          \
    do {                                                                                              \
        flx_status_t st_ = (expr);                                                                    \
        if (st_ != (want)) {                                                                          \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s); last error: %s\n", __FILE__, \
                    __LINE__, #expr, st_, flx_status_name(st_), (int)(want), flx_status_name(want),   \
                    flx_error_msg());                                                                 \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)
#define CHECK_OK(expr) CHECK_ST(expr, FLX_OK)

/* Returns 1 if all n elements are within atol + rtol*|ref| (+ extra[i] when extra is not NULL: an
 * error bound of each element's own) and finite; prints the worst element with the label. */
static inline int flx_test_allclose_extra(const char *label, const float *x, const float *ref, size_t n, double atol,
                                          double rtol, const double *extra)
{
    double worst = -1.0;
    size_t wi = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double a = x[i], r = ref[i];
        if (!isfinite(a) || !isfinite(r)) {
            fprintf(stderr, "%s: non-finite at %zu: got %g ref %g\n", label, i, a, r);
            return 0;
        }
        double excess = fabs(a - r) / (atol + rtol * fabs(r) + (extra ? extra[i] : 0.0));
        if (excess > worst) {
            worst = excess;
            wi = i;
        }
        if (excess > 1.0) ok = 0;
    }
    if (n)
        fprintf(stderr, "%s: worst element %zu: got %.8g ref %.8g |err| %.3g (%.3f of tolerance) -> %s\n", label, wi,
                (double)x[wi], (double)ref[wi], fabs((double)x[wi] - ref[wi]), worst, ok ? "ok" : "FAIL");
    return ok;
}

static inline int flx_test_allclose(const char *label, const float *x, const float *ref, size_t n, double atol,
                                    double rtol)
{
    return flx_test_allclose_extra(label, x, ref, n, atol, rtol, NULL);
}

#define CHECK_CLOSE(label, x, ref, n, atol, rtol) CHECK(flx_test_allclose(label, x, ref, n, atol, rtol))

/* Seed for this run: FLX_SEED or the clock; printed so a failure replays. */
static inline uint64_t flx_test_seed(const char *test)
{
    uint64_t s = flx_seed_from_env();
    fprintf(stderr, "%s: seed %llu (replay with FLX_SEED=%llu)\n", test, (unsigned long long)s,
            (unsigned long long)s);
    return s;
}

/* Runs cmd with /bin/sh (the tool tests run tools as a user types them); returns its exit status.
 * A command that did not exit (killed by a signal) fails the test. */
static inline int flx_test_sh(const char *cmd)
{
    int r = system(cmd);
    CHECK(r != -1 && WIFEXITED(r));
    return WEXITSTATUS(r);
}

/* Sends what this process writes to fd (1 or 2: its own output, a library's log lines) into path,
 * truncated, until flx_test_capture_end; flx_test_slurp reads it back. Returns the saved fd. */
static inline int flx_test_capture_begin(int fd, const char *path)
{
    fflush(NULL);
    int saved = dup(fd), f = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    CHECK(saved >= 0 && f >= 0 && dup2(f, fd) == fd);
    close(f);
    return saved;
}

static inline void flx_test_capture_end(int fd, int saved)
{
    fflush(NULL);
    CHECK(dup2(saved, fd) == fd);
    close(saved);
}

/* The first 64 KiB of path as a string (a tool's captured stdout or stderr), in one of two static
 * buffers used in turn: the result stays valid through the next call. The file must exist. */
static inline const char *flx_test_slurp(const char *path)
{
    static char buf[2][1 << 16];
    static int which;
    char *b = buf[which ^= 1];
    FILE *f = fopen(path, "rb");
    CHECK(f);
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    fclose(f);
    b[n] = 0;
    return b;
}

#endif
