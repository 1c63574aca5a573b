/*
 * bench_stats.h - the small helpers the benchmarks share: the median of a sample (sorted in place)
 * and the kernel's MemAvailable, checked before a point that needs gigabytes.
 */
#ifndef FLX_BENCH_STATS_H
#define FLX_BENCH_STATS_H

#include <stdio.h>
#include <stdlib.h>

static inline int flx_bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (n >= 1); sorts v. */
static inline double flx_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, flx_bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* /proc/meminfo's MemAvailable in KiB, or -1 where it cannot be read. */
static inline long flx_bench_mem_available_kb(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

#endif
