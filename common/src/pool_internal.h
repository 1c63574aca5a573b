/*
 * pool_internal.h - what flx/pool.h is built from, open to the tests and the fuzz target:
 * the cgroup / mountinfo parsers (cpus.c), the CPU topology and the worker placement (pure
 * functions), and the system calls the pool makes, behind a table that tests replace with a fake
 * topology to check the binding calls.
 */
#ifndef FLX_POOL_INTERNAL_H
#define FLX_POOL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "flx/pool.h"

/* ---- cgroup CPU quota (cpus.c) ---- */

/* Reads the whole file at path (an absolute path as the cgroup files name it) into *data_p (malloc,
 * NUL-terminated, the caller frees) and *len_p. FLX_ERR_NOT_FOUND when it does not exist. */
typedef flx_status_t (*flx_cg_read_fn)(void *ctx, const char *path, char **data_p, size_t *len_p);

typedef struct flx_cg_quota {
    uint32_t mcpu;          /* tightest quota in thousandths of a CPU, rounded up; 0: none */
    int version;            /* 2, 1, or 0 when no quota was found */
    char file[256];         /* the file that set it */
} flx_cg_quota_t;

/* The process's CPU quota from the text of /proc/self/cgroup and /proc/self/mountinfo: the cgroup
 * v2 directory (the cgroup2 mount + the "0::" path) and the v1 cpu controller's directory, each
 * walked up to its mount point, reading cpu.max (v2) and cpu.cfs_quota_us / cpu.cfs_period_us (v1)
 * through rd. Every line and value is validated: FLX_ERR_FORMAT names the file and the fault. This
 * is the function flx_cpu_budget_read calls and the fuzz target drives. */
flx_status_t flx_cg_quota_parse(const char *cgroup, size_t cgroup_len, const char *mountinfo, size_t mountinfo_len,
                                flx_cg_read_fn rd, void *ctx, flx_cg_quota_t *out);

/* One cpu.max text ("max 100000" or "<quota> <period>", one optional newline): *mcpu_p = 0 for max. */
flx_status_t flx_cg_parse_cpu_max(const char *text, size_t len, const char *file, uint32_t *mcpu_p);

/* ---- topology and placement ---- */

typedef struct pool_topo {
    uint32_t n;              /* CPUs in the affinity mask */
    int *cpu;                /* (n) CPU numbers, ascending (malloc) */
    int *node;               /* (n) NUMA node of each (0 without NUMA support) (malloc) */
} pool_topo_t;

void pool_topo_free(pool_topo_t *t);

typedef struct pool_place {
    uint32_t n_cpus;         /* CPUs the workers run on (bound) or may run on */
    int *cpus;               /* (n_cpus) ascending (malloc) */
    uint32_t n_reserved;     /* CPUs set apart for dedicated threads */
    int *reserved;           /* (n_reserved) ascending (malloc) */
    int bind;                /* 1: the workers' affinity must be set to cpus */
} pool_place_t;

/* Where the workers go: node >= 0 takes that node's CPUs of the mask (FLX_ERR_INVALID when it has
 * none), -1 all of them; reserve concrete CPUs (the highest-numbered) are set apart when
 * concrete is 1 (no quota below the CPU set), leaving at least one. */
flx_status_t pool_place(const pool_topo_t *t, int node, uint32_t reserve, int concrete, pool_place_t *out);
void pool_place_free(pool_place_t *p);

/* The worker count and the line that explains it. requested > 0 wins, else env (FLX_THREADS's
 * value, NULL when unset) when set, else min(budget, place_cpus) - reserve, at least 1. budget may
 * have n_cpus 0 (unreadable while an explicit count did not need it). FLX_ERR_INVALID names a bad
 * FLX_THREADS. */
flx_status_t pool_resolve_workers(uint32_t requested, const char *env, const flx_cpu_budget_t *budget,
                                  uint32_t place_cpus, uint32_t reserve, int node, uint32_t *n_p, char *reason,
                                  size_t cap);

/* ---- the system calls ---- */

typedef struct pool_sys {
    flx_status_t (*topo)(void *ctx, pool_topo_t *t);          /* affinity mask and nodes */
    flx_status_t (*check_node)(void *ctx, int node);          /* FLX_OK when node exists */
    flx_status_t (*budget)(void *ctx, flx_cpu_budget_t *b);   /* flx_cpu_budget_detect */
    /* binds the calling thread (worker index, or UINT32_MAX for a dedicated thread): affinity to
     * cpus[0 .. n) when n > 0, preferred memory node when node >= 0 */
    flx_status_t (*bind)(void *ctx, uint32_t worker, const int *cpus, uint32_t n, int node);
    void *ctx;
} pool_sys_t;

extern const pool_sys_t flx_pool_sys_real;

flx_status_t flx_pool_create_sys(const flx_pool_params_t *params, const pool_sys_t *sys, flx_pool_h *pool_p);

#endif
