/*
 * pool.c - the persistent worker pool (flx/pool.h).
 *
 * DESIGN
 * One 64-bit word publishes a run and hands out its chunks: generation (24 bits) | chunk count
 * (20 bits) | next chunk (20 bits). The driver stores a fresh word (next generation, n chunks,
 * next 0); a worker claims with one fetch_add and owns chunk `next` when it is below the count. A
 * worker that slept through several runs and adds to a newer word simply claims a chunk of the
 * newer run: the word it got back says which run that is, and that run cannot end (nor its
 * description change) before the claimed chunk is done, so the claim is always valid. Past the
 * end the adds are harmless (at most one per worker per run; FLX_POOL_MAX_CHUNKS leaves room).
 * `done` counts finished chunks; the driver waits for it to reach the count.
 *
 * Sleeping: an idle worker spins on the word for spin_ns (pausing for the first 10 us, which covers
 * the gaps between the runs of a decode step, then yielding the CPU between checks, so a thread
 * that shares its core, the driver, the holder of the last chunk or another process, runs instead:
 * measured on a loaded 2-CPU machine, pausing all along made the median step 1.8x slower), then
 * announces itself in n_sleeping and blocks on the futex `wake`, which the driver bumps after publishing (waking at most as many
 * sleepers as the run has chunks besides its own). The driver, once no chunk is left, spins on
 * `done`, then sets driver_sleeping and blocks on `done`; the worker whose chunk completes the run
 * wakes it. Both handshakes are store-then-load on two seq_cst variables, so one side always sees
 * the other and no wake-up is lost; the futex value check closes the remaining window.
 *
 * A pull (flx_pool_pull) is a run whose chunks are "tickets": a worker with a ticket pops items
 * from the caller's queue until it is empty. Tickets left over once the queue is empty finish at
 * once, so the driver drains them itself if nobody else took them.
 *
 * Errors: fail_at holds the lowest failing chunk (or item) so far; a chunk runs only when it is
 * below it, so every chunk below the final lowest failure ran, and the reported error (the lowest)
 * does not depend on timing. Each worker keeps its own error slot (status, index, message copy,
 * since flx_error_msg is thread-local); the driver reads them after the run.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "flx/log.h"
#include "flx/util.h"
#include "pool_internal.h"

#define GEN_SHIFT 40
#define N_SHIFT 20
#define FIELD_MASK ((1ull << 20) - 1)
#define GEN_MASK ((1ull << 24) - 1)

enum { JOB_RANGE = 0, JOB_PULL = 1 };

typedef struct worker {
    flx_pool_worker_t pub;         /* the identity handed to bodies */
    struct flx_pool *pool;
    pthread_t thread;
    int started;
    int numa_scratch;              /* scratch from numa_alloc_onnode (else flx_aligned_alloc) */
    /* error slot: written by this worker during a run, read by the driver after it */
    flx_status_t err;
    uint64_t err_at;
    char msg[FLX_ERROR_MSG_MAX];
} __attribute__((aligned(FLX_CACHELINE))) worker_t;

struct flx_pool {
    _Alignas(FLX_CACHELINE) _Atomic uint64_t claim;   /* gen | count | next */
    _Alignas(FLX_CACHELINE) _Atomic uint32_t done;    /* chunks finished in this run; futex */
    _Atomic uint32_t driver_sleeping;
    _Alignas(FLX_CACHELINE) _Atomic uint32_t wake;    /* futex of idle workers */
    _Atomic uint32_t n_sleeping;
    _Atomic uint32_t stop;
    _Alignas(FLX_CACHELINE) _Atomic uint64_t fail_at; /* lowest failing chunk / item, UINT64_MAX: none */
    /* the run: written by the driver before the word is published, read by claimers */
    _Alignas(FLX_CACHELINE) int kind;
    uint64_t n, chunk;
    flx_pool_range_fn range_fn;
    flx_pool_item_fn item_fn;
    flx_pool_queue_t *queue;
    void *ctx;
    /* fixed at create */
    uint32_t n_workers, spin_ns, pause_ns;
    worker_t *w;                   /* (n_workers); w[0] is the identity of whoever drives a run */
    pthread_mutex_t run_lock;      /* one run at a time */
    pool_sys_t sys;
    pool_place_t place;
    int node;                      /* bound node, -1 */
    uint32_t reserve;
    flx_cpu_budget_t budget;
    char reason[512];
    /* start-up handshake */
    pthread_mutex_t start_mu;
    pthread_cond_t start_cv;
    uint32_t n_ready;
};

/* The pool this thread works for (worker threads: always; a driver: during its run), and as whom. */
static _Thread_local struct flx_pool *tl_pool;
static _Thread_local worker_t *tl_self;

static const flx_pool_worker_t solo = {.index = 0, .numa_node = -1, .scratch = NULL, .scratch_bytes = 0};

/* Spin pacing of a waiter: pause for SPIN_PAUSE_NS, then yield between checks until spin_ns, then
 * tell the caller to block. */
#define SPIN_PAUSE_NS 10000u

typedef struct spin {
    uint64_t t0;
    unsigned n;
    int yielding;
} spin_t;

static int spin_more(const struct flx_pool *p, spin_t *s);

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* ---------------- the queue ---------------- */

void flx_pool_queue_init(flx_pool_queue_t *q, uint32_t n)
{
    q->n = n;
    __atomic_store_n(&q->next, 0, __ATOMIC_RELAXED);
}

int flx_pool_queue_pop(flx_pool_queue_t *q, uint32_t *item_p)
{
    uint32_t i = __atomic_fetch_add(&q->next, 1, __ATOMIC_RELAXED);
    if (i >= q->n) return 0;
    *item_p = i;
    return 1;
}

void flx_pool_queue_close(flx_pool_queue_t *q)
{
    __atomic_store_n(&q->next, q->n, __ATOMIC_RELAXED);
}

/* ---------------- running chunks ---------------- */

static void fail(struct flx_pool *p, worker_t *me, flx_status_t st, uint64_t at)
{
    if (!me->err || at < me->err_at) {
        me->err = st;
        me->err_at = at;
        snprintf(me->msg, sizeof me->msg, "%s", flx_error_msg());
    }
    uint64_t cur = atomic_load_explicit(&p->fail_at, memory_order_relaxed);
    while (at < cur && !atomic_compare_exchange_weak_explicit(&p->fail_at, &cur, at, memory_order_relaxed,
                                                              memory_order_relaxed)) {
    }
    if (p->kind == JOB_PULL) flx_pool_queue_close(p->queue);
}

static int may_run(struct flx_pool *p, uint64_t at)
{
    return at < atomic_load_explicit(&p->fail_at, memory_order_relaxed);
}

static void run_chunk(struct flx_pool *p, worker_t *me, uint64_t c)
{
    if (p->kind == JOB_RANGE) {
        if (!may_run(p, c)) return;
        const uint64_t b = c * p->chunk, e = b + p->chunk < p->n ? b + p->chunk : p->n;
        flx_status_t st = p->range_fn(p->ctx, &me->pub, b, e);
        if (st) fail(p, me, st, c);
        return;
    }
    uint32_t item;
    while (flx_pool_queue_pop(p->queue, &item)) {
        if (!may_run(p, item)) continue;
        flx_status_t st = p->item_fn(p->ctx, &me->pub, item);
        if (st) fail(p, me, st, item);
    }
}

/* Claims and runs chunks until none is left; *gen_p = the generation that ran out. */
static void work(struct flx_pool *p, worker_t *me, uint64_t *gen_p)
{
    for (;;) {
        const uint64_t w = atomic_fetch_add_explicit(&p->claim, 1, memory_order_acq_rel);
        const uint32_t idx = (uint32_t)(w & FIELD_MASK), n = (uint32_t)((w >> N_SHIFT) & FIELD_MASK);
        if (idx >= n) {
            *gen_p = w >> GEN_SHIFT;
            return;
        }
        run_chunk(p, me, idx);
        const uint32_t d = atomic_fetch_add_explicit(&p->done, 1, memory_order_seq_cst) + 1;
        if (d == n && atomic_load_explicit(&p->driver_sleeping, memory_order_seq_cst)) futex_wake(&p->done, 1);
    }
}

static int spin_more(const struct flx_pool *p, spin_t *s)
{
    if (!p->spin_ns) return 0;
    if (s->yielding) {
        if (flx_now_ns() - s->t0 >= p->spin_ns) return 0;
        sched_yield();
        return 1;
    }
    if ((s->n++ & 15) == 0) {
        const uint64_t now = flx_now_ns();
        if (!s->t0) s->t0 = now;
        else if (now - s->t0 >= p->pause_ns) s->yielding = 1;
    }
    flx_cpu_relax();
    return 1;
}

/* Spins (spin_more), then blocks; 1 when a run newer than gen is published, 0 on stop. */
static int wait_job(struct flx_pool *p, uint64_t gen)
{
    spin_t sp = {0};
    for (;;) {
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return 0;
        if ((atomic_load_explicit(&p->claim, memory_order_acquire) >> GEN_SHIFT) != gen) return 1;
        if (spin_more(p, &sp)) continue;
        const uint32_t v = atomic_load_explicit(&p->wake, memory_order_seq_cst);
        atomic_fetch_add_explicit(&p->n_sleeping, 1, memory_order_seq_cst);
        if ((atomic_load_explicit(&p->claim, memory_order_seq_cst) >> GEN_SHIFT) == gen &&
            !atomic_load_explicit(&p->stop, memory_order_seq_cst))
            futex_wait(&p->wake, v);
        atomic_fetch_sub_explicit(&p->n_sleeping, 1, memory_order_seq_cst);
    }
}

static void wait_done(struct flx_pool *p, uint32_t n)
{
    spin_t sp = {0};
    do {
        if (atomic_load_explicit(&p->done, memory_order_acquire) == n) return;
    } while (spin_more(p, &sp));
    for (;;) {
        atomic_store_explicit(&p->driver_sleeping, 1, memory_order_seq_cst);
        const uint32_t d = atomic_load_explicit(&p->done, memory_order_seq_cst);
        if (d == n) break;
        futex_wait(&p->done, d);
    }
    atomic_store_explicit(&p->driver_sleeping, 0, memory_order_relaxed);
}

static void *worker_main(void *arg)
{
    worker_t *me = arg;
    struct flx_pool *p = me->pool;
    tl_pool = p;
    tl_self = me;
    const pool_place_t *pl = &p->place;
    if (pl->bind || p->node >= 0) {
        flx_status_t st = p->sys.bind(p->sys.ctx, me->pub.index, pl->bind ? pl->cpus : NULL, pl->bind ? pl->n_cpus : 0,
                                      p->node);
        if (st) {   /* reported by create, which then destroys the pool */
            me->err = st;
            snprintf(me->msg, sizeof me->msg, "%s", flx_error_msg());
        }
    }
    pthread_mutex_lock(&p->start_mu);
    p->n_ready++;
    pthread_cond_signal(&p->start_cv);
    pthread_mutex_unlock(&p->start_mu);
    uint64_t gen = 0;
    while (wait_job(p, gen)) work(p, me, &gen);
    return NULL;
}

/* ---------------- runs ---------------- */

/* Runs on the caller, chunk by chunk in order, as `who`. */
static flx_status_t run_inline(const flx_pool_worker_t *who, uint64_t n, uint64_t chunk, flx_pool_range_fn fn,
                               void *ctx)
{
    for (uint64_t b = 0; b < n; b += chunk) {
        flx_status_t st = fn(ctx, who, b, b + chunk < n ? b + chunk : n);
        if (st) return st;
    }
    return FLX_OK;
}

static flx_status_t pull_inline(const flx_pool_worker_t *who, flx_pool_queue_t *q, flx_pool_item_fn fn, void *ctx)
{
    uint32_t item;
    while (flx_pool_queue_pop(q, &item)) {
        flx_status_t st = fn(ctx, who, item);
        if (st) {
            flx_pool_queue_close(q);
            return st;
        }
    }
    return FLX_OK;
}

/* Publishes the run set up in p, works on it, waits for it, returns its lowest error. */
static flx_status_t drive(struct flx_pool *p, uint32_t n_chunks)
{
    struct flx_pool *prev_pool = tl_pool;
    worker_t *prev_self = tl_self;
    tl_pool = p;
    tl_self = &p->w[0];
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint64_t gen = ((atomic_load_explicit(&p->claim, memory_order_relaxed) >> GEN_SHIFT) + 1) & GEN_MASK;
    atomic_store_explicit(&p->claim, gen << GEN_SHIFT | (uint64_t)n_chunks << N_SHIFT, memory_order_seq_cst);
    atomic_fetch_add_explicit(&p->wake, 1, memory_order_seq_cst);
    const uint32_t sleeping = atomic_load_explicit(&p->n_sleeping, memory_order_seq_cst);
    if (sleeping) futex_wake(&p->wake, (int)(sleeping < n_chunks - 1 ? sleeping : n_chunks - 1));
    uint64_t g;
    work(p, &p->w[0], &g);
    wait_done(p, n_chunks);
    tl_pool = prev_pool;
    tl_self = prev_self;
    if (atomic_load_explicit(&p->fail_at, memory_order_acquire) == UINT64_MAX) return FLX_OK;
    worker_t *first = NULL;
    for (uint32_t i = 0; i < p->n_workers; i++)
        if (p->w[i].err && (!first || p->w[i].err_at < first->err_at)) first = &p->w[i];
    flx_status_t st = FLX_ERR_INTERNAL;
    char msg[FLX_ERROR_MSG_MAX] = "pool: a run failed without an error slot";
    if (first) {
        st = first->err;
        memcpy(msg, first->msg, sizeof msg);
    }
    for (uint32_t i = 0; i < p->n_workers; i++) p->w[i].err = FLX_OK;
    atomic_store_explicit(&p->fail_at, UINT64_MAX, memory_order_relaxed);
    return flx_error_set(st, "%s", msg);
}

flx_status_t flx_pool_for(flx_pool_h p, uint64_t n, uint64_t chunk, flx_pool_range_fn fn, void *ctx)
{
    if (!fn) return flx_error_set(FLX_ERR_INVALID, "pool for: fn is NULL");
    if (n == 0) return FLX_OK;
    if (chunk == 0) chunk = 1;
    uint64_t nc = (n - 1) / chunk + 1;
    if (nc > FLX_POOL_MAX_CHUNKS) {
        chunk *= (nc - 1) / FLX_POOL_MAX_CHUNKS + 1;
        nc = (n - 1) / chunk + 1;
    }
    if (!p) return run_inline(&solo, n, chunk, fn, ctx);
    if (tl_pool == p) return run_inline(&tl_self->pub, n, chunk, fn, ctx);   /* nested */
    pthread_mutex_lock(&p->run_lock);
    flx_status_t st;
    if (p->n_workers == 1 || nc == 1) {
        struct flx_pool *prev_pool = tl_pool;
        worker_t *prev_self = tl_self;
        tl_pool = p, tl_self = &p->w[0];
        st = run_inline(&p->w[0].pub, n, chunk, fn, ctx);
        tl_pool = prev_pool, tl_self = prev_self;
    } else {
        p->kind = JOB_RANGE;
        p->n = n, p->chunk = chunk, p->range_fn = fn, p->ctx = ctx;
        st = drive(p, (uint32_t)nc);
    }
    pthread_mutex_unlock(&p->run_lock);
    return st;
}

flx_status_t flx_pool_pull(flx_pool_h p, flx_pool_queue_t *q, flx_pool_item_fn fn, void *ctx)
{
    if (!fn || !q) return flx_error_set(FLX_ERR_INVALID, "pool pull: fn or queue is NULL");
    if (!p) return pull_inline(&solo, q, fn, ctx);
    if (tl_pool == p) return pull_inline(&tl_self->pub, q, fn, ctx);
    pthread_mutex_lock(&p->run_lock);
    const uint32_t next = __atomic_load_n(&q->next, __ATOMIC_RELAXED), left = next < q->n ? q->n - next : 0;
    const uint32_t tickets = left < p->n_workers ? left : p->n_workers;
    flx_status_t st;
    if (tickets <= 1) {
        struct flx_pool *prev_pool = tl_pool;
        worker_t *prev_self = tl_self;
        tl_pool = p, tl_self = &p->w[0];
        st = pull_inline(&p->w[0].pub, q, fn, ctx);
        tl_pool = prev_pool, tl_self = prev_self;
    } else {
        p->kind = JOB_PULL;
        p->queue = q, p->item_fn = fn, p->ctx = ctx;
        st = drive(p, tickets);
    }
    pthread_mutex_unlock(&p->run_lock);
    return st;
}

/* ---------------- create / destroy ---------------- */

uint32_t flx_pool_size(flx_pool_h p)
{
    return p ? p->n_workers : 1;
}

const char *flx_pool_describe(flx_pool_h p)
{
    return p ? p->reason : "workers 1: no pool";
}

void flx_pool_info(flx_pool_h p, flx_pool_info_t *info_p)
{
    if (!info_p) return;
    flx_pool_info_t x = {.n_workers = 1, .numa_node = -1};
    if (p) {
        x.n_workers = p->n_workers;
        x.numa_node = p->node;
        x.reserve_cpus = p->reserve;
        x.n_reserved_cpus = p->place.n_reserved;
        x.budget = p->budget;
    }
    *info_p = x;
}

uint32_t flx_pool_reserved_cpus(flx_pool_h p, int *cpus, uint32_t max)
{
    if (!p) return 0;
    for (uint32_t i = 0; i < p->place.n_reserved && i < max; i++) cpus[i] = p->place.reserved[i];
    return p->place.n_reserved;
}

flx_status_t flx_pool_bind_reserved(flx_pool_h p)
{
    if (!p || !p->place.n_reserved)
        return flx_error_set(FLX_ERR_STATE, "pool: no CPU is reserved (reserve_cpus %u%s)", p ? p->reserve : 0,
                             p && p->reserve ? ", under a CPU quota" : "");
    return p->sys.bind(p->sys.ctx, UINT32_MAX, p->place.reserved, p->place.n_reserved, p->node);
}

static void scratch_free(worker_t *w)
{
    if (!w->pub.scratch) return;
    if (w->numa_scratch) numa_free(w->pub.scratch, w->pub.scratch_bytes);
    else flx_aligned_free(w->pub.scratch);
    w->pub.scratch = NULL;
    w->pub.scratch_bytes = 0;
}

flx_status_t flx_pool_reserve_scratch(flx_pool_h p, size_t bytes)
{
    if (!p) return flx_error_set(FLX_ERR_INVALID, "pool reserve scratch: pool is NULL");
    if (tl_pool == p) return flx_error_set(FLX_ERR_STATE, "pool reserve scratch: called from a run of the pool");
    if (bytes > ((size_t)1 << 40))
        return flx_error_set(FLX_ERR_INVALID, "pool reserve scratch: %zu bytes per worker is too many", bytes);
    bytes = FLX_ALIGN_UP(bytes, FLX_CACHELINE);
    const int numa = p->sys.topo == flx_pool_sys_real.topo && p->node >= 0 && numa_available() >= 0;
    flx_status_t st = FLX_OK;
    pthread_mutex_lock(&p->run_lock);   /* no run uses the scratch while it moves */
    for (uint32_t i = 0; i < p->n_workers && !st; i++) {
        worker_t *w = &p->w[i];
        if (w->pub.scratch_bytes >= bytes) continue;
        scratch_free(w);
        void *m = numa ? numa_alloc_onnode(bytes, p->node) : flx_aligned_alloc(FLX_CACHELINE, bytes);
        if (!m) {
            st = flx_error_set(FLX_ERR_NOMEM, "pool: scratch of %zu bytes for worker %u", bytes, i);
            break;
        }
        w->pub.scratch = m;
        w->pub.scratch_bytes = bytes;
        w->numa_scratch = numa;
    }
    pthread_mutex_unlock(&p->run_lock);
    return st;
}

void flx_pool_destroy(flx_pool_h p)
{
    if (!p) return;
    atomic_store_explicit(&p->stop, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&p->wake, 1, memory_order_seq_cst);
    futex_wake(&p->wake, INT_MAX);
    for (uint32_t i = 1; i < p->n_workers; i++)
        if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
    for (uint32_t i = 0; i < p->n_workers; i++) scratch_free(&p->w[i]);
    pool_place_free(&p->place);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->start_mu);
    pthread_cond_destroy(&p->start_cv);
    flx_aligned_free(p->w);
    flx_aligned_free(p);
}

static flx_status_t check_params(const flx_pool_params_t *pp)
{
    if (pp->field_mask & ~(uint64_t)(FLX_POOL_FIELD_N_WORKERS | FLX_POOL_FIELD_NUMA_NODE | FLX_POOL_FIELD_RESERVE |
                                     FLX_POOL_FIELD_SPIN | FLX_POOL_FIELD_SCRATCH))
        return flx_error_set(FLX_ERR_INVALID, "pool params: field_mask %#llx has unknown bits",
                             (unsigned long long)pp->field_mask);
    if ((pp->field_mask & FLX_POOL_FIELD_N_WORKERS) && pp->n_workers > FLX_POOL_MAX_WORKERS)
        return flx_error_set(FLX_ERR_INVALID, "pool params: n_workers %u above %u", pp->n_workers,
                             FLX_POOL_MAX_WORKERS);
    if ((pp->field_mask & FLX_POOL_FIELD_NUMA_NODE) && pp->numa_node < -1)
        return flx_error_set(FLX_ERR_INVALID, "pool params: numa_node %d must be -1 or a node", pp->numa_node);
    if ((pp->field_mask & FLX_POOL_FIELD_RESERVE) && pp->reserve_cpus >= FLX_POOL_MAX_WORKERS)
        return flx_error_set(FLX_ERR_INVALID, "pool params: reserve_cpus %u above %u", pp->reserve_cpus,
                             FLX_POOL_MAX_WORKERS - 1);
    if ((pp->field_mask & FLX_POOL_FIELD_SPIN) && pp->spin_ns > 100000000u)
        return flx_error_set(FLX_ERR_INVALID, "pool params: spin_ns %u above 10^8", pp->spin_ns);
    return FLX_OK;
}

flx_status_t flx_pool_create_sys(const flx_pool_params_t *pp, const pool_sys_t *sys, flx_pool_h *pool_p)
{
    if (!pp || !sys || !pool_p) return flx_error_set(FLX_ERR_INVALID, "pool create: NULL argument");
    flx_status_t st = check_params(pp);
    if (st) return st;
    const uint64_t fm = pp->field_mask;
    const uint32_t requested = fm & FLX_POOL_FIELD_N_WORKERS ? pp->n_workers : 0;
    const int node = fm & FLX_POOL_FIELD_NUMA_NODE ? pp->numa_node : -1;
    const uint32_t reserve = fm & FLX_POOL_FIELD_RESERVE ? pp->reserve_cpus : 0;
    const char *env = requested ? NULL : getenv("FLX_THREADS");
    if (node >= 0 && (st = sys->check_node(sys->ctx, node))) return st;

    flx_cpu_budget_t budget;
    memset(&budget, 0, sizeof budget);
    if ((st = sys->budget(sys->ctx, &budget))) {
        if (!requested && !env) return st;   /* the count depends on it */
        flx_log_warn("pool", "cpu budget not read (%s); using the requested worker count", flx_error_msg());
        memset(&budget, 0, sizeof budget);
    }
    pool_topo_t topo = {0};
    if ((st = sys->topo(sys->ctx, &topo))) return st;
    uint32_t on_node = 0;
    for (uint32_t i = 0; i < topo.n; i++) on_node += node < 0 || topo.node[i] == node;
    /* CPUs can be set apart only when no quota below the CPU set makes them time-shared */
    const int concrete = budget.n_cpus >= on_node;
    pool_place_t place;
    st = pool_place(&topo, node, reserve, concrete, &place);
    int uniform = topo.n > 0;
    for (uint32_t i = 1; i < topo.n; i++) uniform &= topo.node[i] == topo.node[0];
    const int only_node = uniform ? topo.node[0] : -1;
    pool_topo_free(&topo);
    if (st) return st;

    char reason[512];
    uint32_t n;
    if ((st = pool_resolve_workers(requested, env, &budget, on_node, reserve, node, &n, reason, sizeof reason))) {
        pool_place_free(&place);
        return st;
    }
    struct flx_pool *p = flx_aligned_alloc(FLX_CACHELINE, sizeof *p);
    worker_t *w = flx_aligned_alloc(FLX_CACHELINE, n * sizeof *w);
    if (!p || !w) {
        flx_aligned_free(p);
        flx_aligned_free(w);
        pool_place_free(&place);
        return flx_error_set(FLX_ERR_NOMEM, "pool create: %u workers", n);
    }
    memset(p, 0, sizeof *p);
    memset(w, 0, n * sizeof *w);
    atomic_init(&p->fail_at, UINT64_MAX);
    p->n_workers = n;
    p->spin_ns = fm & FLX_POOL_FIELD_SPIN ? pp->spin_ns : FLX_POOL_SPIN_NS;
    p->pause_ns = SPIN_PAUSE_NS < p->spin_ns ? SPIN_PAUSE_NS : p->spin_ns;
    p->w = w;
    p->sys = *sys;
    p->place = place;
    p->node = node;
    p->reserve = reserve;
    p->budget = budget;
    snprintf(p->reason, sizeof p->reason, "%s", reason);
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->start_mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    for (uint32_t i = 0; i < n; i++) {
        w[i].pool = p;
        w[i].pub.index = i;
        w[i].pub.numa_node = node >= 0 ? node : only_node;
    }
    if ((fm & FLX_POOL_FIELD_SCRATCH) && pp->scratch_bytes && (st = flx_pool_reserve_scratch(p, pp->scratch_bytes)))
        goto fail;
    /* the driving thread is worker 0: it runs where the workers run */
    if ((place.bind || node >= 0) &&
        (st = sys->bind(sys->ctx, 0, place.bind ? place.cpus : NULL, place.bind ? place.n_cpus : 0, node)))
        goto fail;
    for (uint32_t i = 1; i < n; i++) {
        int rc = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
        if (rc) {
            st = flx_error_set(flx_status_from_errno(rc), "pool create: thread %u of %u: %s", i, n, strerror(rc));
            goto fail;
        }
        w[i].started = 1;
    }
    pthread_mutex_lock(&p->start_mu);
    while (p->n_ready < n - 1) pthread_cond_wait(&p->start_cv, &p->start_mu);
    pthread_mutex_unlock(&p->start_mu);
    for (uint32_t i = 1; i < n; i++)
        if (w[i].err) {
            st = flx_error_set(w[i].err, "pool create: binding worker %u: %s", i, w[i].msg);
            goto fail;
        }
    flx_log_info("pool", "%s", p->reason);
    *pool_p = p;
    return FLX_OK;
fail:
    flx_pool_destroy(p);
    return st;
}

flx_status_t flx_pool_create(const flx_pool_params_t *params, flx_pool_h *pool_p)
{
    return flx_pool_create_sys(params, &flx_pool_sys_real, pool_p);
}
