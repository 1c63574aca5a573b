/*
 * bench_cli.h - the list-valued options of the benchmark binaries ("--lens 2048,8192"): a comma list
 * checked in full by flx_cli_u64_list, into the uint32 arrays the benchmarks size their points with.
 */
#ifndef FLX_BENCH_CLI_H
#define FLX_BENCH_CLI_H

#include <stdint.h>

#include "flx/cli.h"

/* s (NULL: not given, v and *n_p keep their defaults) into v[0..*n_p), at most cap <= 64 items in
 * [lo, hi] (hi <= UINT32_MAX). Returns FLX_CLI_PROCEED, or FLX_EXIT_USAGE after printing the usage
 * error that names opt and the bad item; v and *n_p are written only on success. */
static inline int flx_bench_u32_list(const flx_cli_t *cli, const char *opt, const char *s, uint64_t lo, uint64_t hi,
                                     uint32_t *v, uint32_t cap, uint32_t *n_p)
{
    uint64_t x[64];
    uint32_t n;
    if (!s) return FLX_CLI_PROCEED;
    if (cap > 64 || hi > UINT32_MAX) return flx_cli_usage_error(cli, "--%s: list declared wrong", opt);
    if (flx_cli_u64_list(opt, s, lo, hi, x, cap, &n)) return flx_cli_usage_error(cli, NULL);
    for (uint32_t i = 0; i < n; i++) v[i] = (uint32_t)x[i];
    *n_p = n;
    return FLX_CLI_PROCEED;
}

#endif
