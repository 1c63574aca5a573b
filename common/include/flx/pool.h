/*
 * flx/pool.h - the persistent worker pool that runs a whole decode step (and the prefill and the
 * tools), and the CPU budget it is sized from.
 *
 * OVERVIEW
 * A pool is n_workers workers: worker 0 is whichever thread drives a run (it works too), workers
 * 1 .. n_workers - 1 are threads started at create and kept until destroy. A run hands every
 * worker one body and returns when all of it is done:
 *   flx_pool_for    a range of n items cut into fixed chunks of `chunk` items; each worker claims
 *                   the next chunk with one atomic add, runs it, and claims again until none is
 *                   left (dynamic claiming: a worker that is descheduled, or shares its core with
 *                   another process, simply claims fewer chunks);
 *   flx_pool_pull   an ordered task list (flx_pool_queue_t); each worker pops the next item until
 *                   the list is empty: the priority-queue pull of the heterogeneous scheduler. The
 *                   list is sorted by priority, so a free worker always takes the most urgent task
 *                   left; a thread outside the pool (the scheduler's GPU worker) may pop from the
 *                   same list at the same time with flx_pool_queue_pop.
 * Plan/run: everything (threads, per-worker scratch, error slots) is made at create; a run
 * allocates nothing, so a decode step that runs its layers through the pool allocates nothing.
 *
 * DETERMINISM
 * Chunk boundaries are fixed by (n, chunk) alone, never by the number of workers or by who ran
 * what. A body that computes each output element inside one chunk, in a fixed order, and reduces
 * across chunks only after the run in chunk order (as every kernel of this project does), gives
 * bitwise identical results for any worker count, including 1, and for any interleaving.
 *
 * WAITING
 * An idle worker, and a driver waiting for chunks that others still run, pause for 10 us, then
 * yield the CPU between checks until spin_ns, then block on a futex: a descheduled or competing
 * thread never makes the others burn the core it needs (a thread sharing the core runs while one
 * waits), and a core that goes idle lets the kernel move a preempted worker there. A run wakes only
 * as many sleeping workers as it has chunks for; a run of one chunk runs on the caller alone.
 *
 * WORKER COUNT (flx_pool_params_t.n_workers, else the environment's FLX_THREADS, else the budget)
 * The CPU budget (flx_cpu_budget_detect) is what the process may actually use: the CPUs of its
 * affinity mask (sched_getaffinity), capped by its cgroup CPU quota rounded up (cgroup v2 cpu.max
 * of the process's cgroup and its ancestors, found through /proc/self/cgroup and
 * /proc/self/mountinfo; cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us), so a container limited to
 * 2 CPUs on a 64-core host starts 2 workers, not 64. Bound to a NUMA node, the budget counts that
 * node's CPUs of the mask only. reserve_cpus are taken off. flx_pool_describe() says what was
 * chosen and why ("workers 2: affinity 2 CPUs, cgroup quota none"); the tools print that line. An
 * explicit count may exceed the budget (tests oversubscribe on purpose); the line says so.
 *
 * NUMA
 * numa_node >= 0 runs every worker, the driving thread included, on that node's CPUs (those in
 * the affinity mask) and makes it prefer that node's memory: the node of the KV the workers read
 * (the engine passes its kvstore's node). Workers are not pinned to single CPUs, so the kernel can
 * still move a preempted one to a CPU of the node that went idle. numa_node -1 binds nothing. The
 * workers' scratch of a bound pool comes from that node (numa_alloc_onnode). A host with several
 * nodes runs one pool per node to keep each node's workers next to its KV.
 *
 * DEDICATED CPUS
 * reserve_cpus keeps CPUs of the budget out of the pool for threads with a dedicated role (the
 * heterogeneous scheduler's GPU driver). With a concrete CPU set (no quota below it) the reserved
 * CPUs are the highest-numbered ones of the workers' set, the workers' (and driving thread's)
 * affinity excludes them, and flx_pool_bind_reserved() moves a dedicated thread onto them; under
 * a CPU quota no CPU can be set apart, so the pool is only that much smaller.
 *
 * ERRORS
 * A body returns a status. On an error the worker copies flx_error_msg() (thread-local) into its
 * error slot and the run stops handing out chunks (a pull closes its queue); the run returns the
 * error of the lowest failing chunk (or item) on the driving thread, message restored there with
 * flx_error_set. Every chunk below the first failure was claimed before it and ran, so which error
 * is reported does not depend on timing either.
 *
 * NESTING AND SHARING
 * A body may call flx_pool_for / flx_pool_pull on the same pool: the nested run executes inline on
 * the calling worker, chunk by chunk, with that worker's identity (results are the same by the
 * determinism rule). A pool is driven by one run at a time: a second thread that starts a run
 * while another is in progress waits for it (two engines may share a pool; they take turns). A
 * NULL pool, or one of one worker, runs everything on the caller.
 *
 * LIBRARY
 * flx_pool (common/src/pool.c and cpus.c), apart from flx_common so that flx_common stays free of
 * libnuma and threads; a module that runs on a pool links flx_pool.
 *
 * THREAD MODE
 * create / destroy: one thread, with no run in progress. flx_pool_reserve_scratch: any thread but
 * never from a body (it waits for a run in progress to end). Runs: any thread, one at a time (see
 * above). flx_pool_queue_pop: any thread. Info accessors: any thread.
 */
#ifndef FLX_POOL_H
#define FLX_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_POOL_MAX_WORKERS 1024u
#define FLX_POOL_MAX_CHUNKS ((1u << 20) - 2 * FLX_POOL_MAX_WORKERS) /* larger ranges get bigger chunks */

/* ---- the CPU budget ---- */

typedef struct flx_cpu_budget {
    uint32_t n_affinity;        /* CPUs in the process's affinity mask */
    uint32_t quota_mcpu;        /* cgroup CPU quota in thousandths of a CPU (rounded up); 0: no quota */
    int quota_version;          /* 2: cgroup v2 cpu.max, 1: cgroup v1 cfs quota, 0: no quota found */
    char quota_file[256];       /* the file whose limit is the tightest ("" without a quota) */
    uint32_t n_cpus;            /* the budget: min(n_affinity, ceil(quota)), >= 1 */
} flx_cpu_budget_t;

/* The budget of this process: sched_getaffinity and the cgroup files under "/". Missing cgroup
 * files mean "no quota"; malformed ones are refused (FLX_ERR_FORMAT naming the file and what is
 * wrong), as is an empty affinity mask. */
flx_status_t flx_cpu_budget_detect(flx_cpu_budget_t *budget_p);

/* The same from files under root ("<root>/proc/self/cgroup", "<root>/proc/self/mountinfo" and the
 * mount points they name, prefixed with root) and an affinity count given by the caller: tests
 * point it at fixture trees. root NULL or "" is "/". */
flx_status_t flx_cpu_budget_read(const char *root, uint32_t n_affinity, flx_cpu_budget_t *budget_p);

/* "affinity 2 CPUs, cgroup quota none" / "affinity 64 CPUs, cgroup quota 2.5 CPUs (v2 <file>)". */
void flx_cpu_budget_format(const flx_cpu_budget_t *b, char *buf, size_t cap);

/* FLX_OK when NUMA node exists and has memory (libnuma; without NUMA support only node 0 exists),
 * else FLX_ERR_INVALID naming it. The one check the pool and the kvstore share. */
flx_status_t flx_numa_node_check(int node);

/* ---- the pool ---- */

typedef struct flx_pool *flx_pool_h;

enum {
    FLX_POOL_FIELD_N_WORKERS = 1u << 0,
    FLX_POOL_FIELD_NUMA_NODE = 1u << 1,
    FLX_POOL_FIELD_RESERVE = 1u << 2,
    FLX_POOL_FIELD_SPIN = 1u << 3,
    FLX_POOL_FIELD_SCRATCH = 1u << 4,
};

typedef struct flx_pool_params {
    uint64_t field_mask;      /* FLX_POOL_FIELD_*: which fields below are set */
    uint32_t n_workers;       /* N_WORKERS: 1..FLX_POOL_MAX_WORKERS, the driving thread included (a
                                 tool's --threads); 0 or absent: FLX_THREADS from the environment
                                 (validated), else the CPU budget less reserve_cpus */
    int numa_node;            /* NUMA_NODE: bind the workers to this node (see NUMA); -1 or absent: none */
    uint32_t reserve_cpus;    /* RESERVE: CPUs kept out of the pool for dedicated threads; default 0 */
    uint32_t spin_ns;         /* SPIN: spin before blocking, in ns, <= 10^8; default FLX_POOL_SPIN_NS */
    size_t scratch_bytes;     /* SCRATCH: per-worker scratch bytes (node-local); default 0 */
} flx_pool_params_t;

#define FLX_POOL_SPIN_NS 50000u

flx_status_t flx_pool_create(const flx_pool_params_t *params, flx_pool_h *pool_p);
/* Stops and joins the threads, frees everything. Accepts NULL. */
void flx_pool_destroy(flx_pool_h pool);

/* Workers, the driving thread included; 1 for NULL. */
uint32_t flx_pool_size(flx_pool_h pool);

/* The line the tools print: "workers N: <why>", e.g. "workers 2: affinity 2 CPUs, cgroup quota
 * none" or "workers 7: requested (oversubscribed: affinity 2 CPUs, cgroup quota none)". Valid
 * while the pool lives; "workers 1: no pool" for NULL. */
const char *flx_pool_describe(flx_pool_h pool);

typedef struct flx_pool_info {
    uint32_t n_workers;
    int numa_node;                 /* the node the workers are bound to, -1 when unbound */
    uint32_t reserve_cpus;         /* CPUs kept out (RESERVE) */
    uint32_t n_reserved_cpus;      /* how many concrete CPUs are set apart (0 under a quota) */
    flx_cpu_budget_t budget;       /* what detection found (n_cpus 0 when an explicit count made it
                                      unnecessary and it could not be read) */
} flx_pool_info_t;
void flx_pool_info(flx_pool_h pool, flx_pool_info_t *info_p);

/* The reserved CPUs (ascending) into cpus[0 .. max); returns how many there are. */
uint32_t flx_pool_reserved_cpus(flx_pool_h pool, int *cpus, uint32_t max);
/* Binds the calling thread (not a pool worker) to the reserved CPUs and the pool's node.
 * FLX_ERR_STATE when no concrete CPU is reserved. */
flx_status_t flx_pool_bind_reserved(flx_pool_h pool);

/* Grows every worker's scratch to at least bytes (node-local, 64-byte aligned); plan time (an
 * engine's create), never from a body: it waits for a run in progress. */
flx_status_t flx_pool_reserve_scratch(flx_pool_h pool, size_t bytes);

/* Who runs a body. Valid during the body's call. */
typedef struct flx_pool_worker {
    uint32_t index;           /* 0: the driving thread; 1 .. n_workers - 1: the pool's threads */
    int numa_node;            /* its node: the pool's bound node, else the one node of the affinity
                                 mask; -1 when the mask spans several and nothing is bound */
    void *scratch;            /* this worker's scratch (NULL when scratch_bytes is 0) */
    size_t scratch_bytes;
} flx_pool_worker_t;

/* Items [begin, end) of a flx_pool_for range: one chunk. */
typedef flx_status_t (*flx_pool_range_fn)(void *ctx, const flx_pool_worker_t *w, uint64_t begin, uint64_t end);
/* One item of a flx_pool_pull list. */
typedef flx_status_t (*flx_pool_item_fn)(void *ctx, const flx_pool_worker_t *w, uint32_t item);

/* Runs fn over [0, n) in chunks [c * chunk, min(n, (c + 1) * chunk)). chunk 0 means 1; a range of
 * more than FLX_POOL_MAX_CHUNKS chunks gets chunk multiplied by the least integer that fits it (a
 * multiple of the asked chunk, so alignments hold). n 0 runs nothing. */
flx_status_t flx_pool_for(flx_pool_h pool, uint64_t n, uint64_t chunk, flx_pool_range_fn fn, void *ctx);

/* An ordered list of n items for flx_pool_pull: items are handed out as 0, 1, .., n - 1. Set up by
 * the thread that starts the pull, before it starts; popped by any thread. */
typedef struct flx_pool_queue {
    uint32_t n;
    uint32_t next;            /* accessed atomically */
} flx_pool_queue_t;

void flx_pool_queue_init(flx_pool_queue_t *q, uint32_t n);
/* The next item: returns 1 and sets *item_p, or 0 when the list is exhausted (or closed). */
int flx_pool_queue_pop(flx_pool_queue_t *q, uint32_t *item_p);
/* No item is handed out after this (a failed pull closes its queue so other pullers stop). */
void flx_pool_queue_close(flx_pool_queue_t *q);

/* Every worker pops items of q and runs fn on each until q is exhausted; returns when every item a
 * pool worker popped is done (items popped by threads outside the pool are theirs to wait for). */
flx_status_t flx_pool_pull(flx_pool_h pool, flx_pool_queue_t *q, flx_pool_item_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
