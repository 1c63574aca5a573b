/*
 * bench_read.h - the read bandwidth every benchmark holds its kernels to: a STREAM-like read of a
 * buffer on the same worker pool the kernels run on (flx/pool.h), in chunks claimed the way the
 * GEMV's are (about 8 per worker, at least 64 KiB), so "fraction of bandwidth" compares like with
 * like in one binary and one run. It prefetches into L2 as far ahead as the GEMV does
 * (flx_cpu_stream_prefetch: 6 KiB on Intel CPUs, none elsewhere): a reference the kernels' own
 * prefetch beat would overstate every fraction (the VM's plain read gave 20 to 27 GB/s where the
 * GEMV read 31).
 */
#ifndef FLX_BENCH_READ_H
#define FLX_BENCH_READ_H

#include <immintrin.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "flx/cpu.h"
#include "flx/pool.h"
#include "flx/util.h"

typedef struct flx_bench_read {
    const uint8_t *buf;
    size_t pf;   /* flx_cpu_stream_prefetch() */
    _Atomic uint64_t sum;
} flx_bench_read_t;

__attribute__((target("avx2"))) static flx_status_t flx_bench_read_chunks(void *ctx, const flx_pool_worker_t *w,
                                                                          uint64_t c0, uint64_t c1)
{
    (void)w;
    flx_bench_read_t *r = ctx;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (uint64_t c = c0; c < c1; c++) {
        const __m256i *p = (const __m256i *)(r->buf + c * 128);
        if (r->pf) {
            _mm_prefetch((const char *)p + r->pf, _MM_HINT_T1);
            _mm_prefetch((const char *)p + r->pf + 64, _MM_HINT_T1);
        }
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(p));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + 3));
    }
    uint64_t x[4];
    _mm256_storeu_si256((__m256i *)x, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    atomic_fetch_add_explicit(&r->sum, x[0] + x[1] + x[2] + x[3], memory_order_relaxed);
    return FLX_OK;
}

/* Best GB/s of reps passes over bytes (a multiple of 128) at buf (32-byte aligned). */
static inline double flx_bench_read_bw(flx_pool_h pool, const uint8_t *buf, size_t bytes, int reps)
{
    static volatile uint64_t sink;
    double best = 0;
    for (int i = 0; i < reps; i++) {
        flx_bench_read_t r = {buf, flx_cpu_stream_prefetch(), 0};
        const uint64_t t0 = flx_now_ns();
        const uint64_t lines = bytes / 128, per = lines / (8 * flx_pool_size(pool));
        (void)flx_pool_for(pool, lines, per > 512 ? per : 512, flx_bench_read_chunks, &r);
        const double s = (flx_now_ns() - t0) * 1e-9;
        sink += r.sum;
        if (bytes / s / 1e9 > best) best = bytes / s / 1e9;
    }
    return best;
}

/* A reference buffer for flx_bench_read_bw, allocated as weights are (flx_stream_alloc: like with
 * like) and faulted in, so no timed read pays a page fault: *bytes rounded down to a multiple of 128.
 * NULL when it cannot be allocated; free with flx_aligned_free. */
static inline uint8_t *flx_bench_read_buf(size_t *bytes)
{
    *bytes &= ~(size_t)127;
    uint8_t *b = flx_stream_alloc(*bytes);
    if (b) memset(b, 1, *bytes);
    return b;
}

#endif
