/*
 * test_pool - the persistent worker pool (flx/pool.h): every chunk and item runs exactly once at
 * 1, 2, 3 and 7 workers; chunk boundaries are fixed; the driving thread is worker 0; the lowest
 * failing chunk's error reaches the driver with its message; nested runs and two drivers; a pull
 * shared with a thread outside the pool; scratch; many tiny runs with and without spinning (a lost
 * wake-up of the driver hangs, and the alarm fails the test); sleeping workers are woken (runs whose
 * chunks wait for each other cannot finish on the driver alone); idle workers block; the
 * FLX_THREADS override and refusals; the binding calls on a fake two-node topology (pool_internal.h)
 * and the real binding on this machine's node.
 * Label concurrency: TSan runs it.
 */
#define _GNU_SOURCE
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "flx/pool.h"
#include "flx_test.h"
#include "pool_internal.h"

static const uint32_t WORKERS[] = {1, 2, 3, 7};

static flx_pool_h make_pool(uint32_t n, uint32_t spin_ns)
{
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_N_WORKERS | FLX_POOL_FIELD_SPIN, .n_workers = n,
                            .spin_ns = spin_ns};
    flx_pool_h p;
    CHECK_OK(flx_pool_create(&pp, &p));
    CHECK(flx_pool_size(p) == n);
    return p;
}

/* ---- coverage: every item once, chunk boundaries fixed ---- */

typedef struct cover {
    _Atomic uint32_t *hits;     /* (n) */
    uint64_t n, chunk;
    _Atomic uint32_t bad;       /* a chunk with wrong boundaries or a worker index out of range */
    uint32_t n_workers;
    pthread_t driver;
    _Atomic uint32_t by_driver, wrong_driver;
} cover_t;

static flx_status_t cover_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    cover_t *c = ctx;
    if (b % c->chunk || (e != b + c->chunk && e != c->n) || e > c->n || w->index >= c->n_workers) c->bad = 1;
    if ((w->index == 0) != pthread_equal(pthread_self(), c->driver)) c->wrong_driver = 1;
    if (w->index == 0) c->by_driver++;
    for (uint64_t i = b; i < e; i++) c->hits[i]++;
    return FLX_OK;
}

static void test_for_coverage(void)
{
    const uint64_t ns[] = {1, 5, 64, 1000, 12345};
    const uint64_t chunks[] = {1, 3, 64, 100000};
    for (size_t wi = 0; wi < FLX_ARRAY_SIZE(WORKERS); wi++) {
        flx_pool_h p = make_pool(WORKERS[wi], FLX_POOL_SPIN_NS);
        for (size_t a = 0; a < FLX_ARRAY_SIZE(ns); a++)
            for (size_t k = 0; k < FLX_ARRAY_SIZE(chunks); k++) {
                cover_t c = {.n = ns[a], .chunk = chunks[k], .n_workers = WORKERS[wi], .driver = pthread_self()};
                c.hits = calloc(ns[a], sizeof *c.hits);
                CHECK_OK(flx_pool_for(p, c.n, c.chunk, cover_body, &c));
                for (uint64_t i = 0; i < c.n; i++) CHECK(c.hits[i] == 1);
                CHECK(!c.bad && !c.wrong_driver);
                free(c.hits);
            }
        /* chunk 0 means 1; n 0 runs nothing */
        cover_t c = {.n = 10, .chunk = 1, .n_workers = WORKERS[wi], .driver = pthread_self()};
        c.hits = calloc(10, sizeof *c.hits);
        CHECK_OK(flx_pool_for(p, 10, 0, cover_body, &c));
        for (int i = 0; i < 10; i++) CHECK(c.hits[i] == 1);
        CHECK_OK(flx_pool_for(p, 0, 4, cover_body, &c));
        for (int i = 0; i < 10; i++) CHECK(c.hits[i] == 1);
        free(c.hits);
        flx_pool_destroy(p);
    }
    /* a NULL pool runs on the caller as worker 0 */
    cover_t c = {.n = 100, .chunk = 7, .n_workers = 1, .driver = pthread_self()};
    c.hits = calloc(100, sizeof *c.hits);
    CHECK_OK(flx_pool_for(NULL, 100, 7, cover_body, &c));
    for (int i = 0; i < 100; i++) CHECK(c.hits[i] == 1);
    CHECK(c.by_driver == 15 && !c.bad);
    free(c.hits);
    CHECK(flx_pool_size(NULL) == 1);
    CHECK(strstr(flx_pool_describe(NULL), "workers 1") != NULL);
    flx_pool_destroy(NULL);
}

/* A range bigger than FLX_POOL_MAX_CHUNKS chunks gets a multiple of the chunk. */
typedef struct big {
    _Atomic uint64_t sum, n_chunks;
    uint64_t chunk;
    _Atomic uint32_t misaligned;
} big_t;

static flx_status_t big_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    (void)w;
    big_t *g = ctx;
    if (b % g->chunk) g->misaligned = 1;
    g->sum += e - b;
    g->n_chunks++;
    return FLX_OK;
}

static void test_for_many_chunks(void)
{
    flx_pool_h p = make_pool(2, FLX_POOL_SPIN_NS);
    big_t g = {.chunk = 2};
    const uint64_t n = (uint64_t)FLX_POOL_MAX_CHUNKS * 5 + 3;
    CHECK_OK(flx_pool_for(p, n, 2, big_body, &g));
    CHECK(g.sum == n && !g.misaligned && g.n_chunks <= FLX_POOL_MAX_CHUNKS);
    flx_pool_destroy(p);
}

/* ---- pull: items once, in order per puller; an outside thread pulls from the same queue ---- */

typedef struct pull {
    _Atomic uint32_t *hits;
    uint32_t n;
    uint32_t last[8];           /* per worker: last item taken (+1) */
    _Atomic uint32_t out_of_order;
    _Atomic uint32_t spin;      /* items burn a little time so the outside thread gets some */
} pull_t;

static flx_status_t pull_body(void *ctx, const flx_pool_worker_t *w, uint32_t item)
{
    pull_t *c = ctx;
    c->hits[item]++;
    if (item + 1 <= c->last[w->index]) c->out_of_order = 1;
    c->last[w->index] = item + 1;
    for (volatile uint32_t i = 0; i < c->spin; i++) {
    }
    return FLX_OK;
}

typedef struct outside {
    flx_pool_queue_t *q;
    pull_t *c;
    _Atomic uint32_t taken;
    _Atomic int go;
} outside_t;

static void *outside_main(void *arg)
{
    outside_t *o = arg;
    while (!o->go) sched_yield();
    uint32_t item;
    while (flx_pool_queue_pop(o->q, &item)) {
        o->c->hits[item]++;
        o->taken++;
    }
    return NULL;
}

static void test_pull(void)
{
    for (size_t wi = 0; wi < FLX_ARRAY_SIZE(WORKERS); wi++) {
        flx_pool_h p = make_pool(WORKERS[wi], FLX_POOL_SPIN_NS);
        for (uint32_t n = 0; n < 300; n += 37) {
            pull_t c = {.n = n};
            c.hits = calloc(n + 1, sizeof *c.hits);
            flx_pool_queue_t q;
            flx_pool_queue_init(&q, n);
            CHECK_OK(flx_pool_pull(p, &q, pull_body, &c));
            for (uint32_t i = 0; i < n; i++) CHECK(c.hits[i] == 1);
            CHECK(!c.out_of_order);
            uint32_t item;
            CHECK(flx_pool_queue_pop(&q, &item) == 0);
            free(c.hits);
        }
        /* the scheduler's GPU worker stand-in pops from the same list while the pool pulls */
        pull_t c = {.n = 2000, .spin = 2000};
        c.hits = calloc(c.n, sizeof *c.hits);
        flx_pool_queue_t q;
        flx_pool_queue_init(&q, c.n);
        outside_t o = {.q = &q, .c = &c};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, outside_main, &o) == 0);
        o.go = 1;
        CHECK_OK(flx_pool_pull(p, &q, pull_body, &c));
        pthread_join(t, NULL);
        for (uint32_t i = 0; i < c.n; i++) CHECK(c.hits[i] == 1);
        CHECK(!c.out_of_order);
        fprintf(stderr, "pull with %u workers and an outside puller: outside took %u of %u\n", WORKERS[wi],
                (unsigned)o.taken, c.n);
        free(c.hits);
        flx_pool_destroy(p);
    }
}

/* ---- errors ---- */

typedef struct failing {
    uint64_t fail_from;         /* chunks >= this fail ... */
    uint64_t fail_every;        /* ... when index % fail_every == 0 */
    _Atomic uint32_t ran;
} failing_t;

static flx_status_t failing_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    failing_t *f = ctx;
    (void)e;
    f->ran++;
    if (b >= f->fail_from && b % f->fail_every == 0)
        return flx_error_set(FLX_ERR_CAPACITY, "chunk %llu failed on worker %u", (unsigned long long)b, w->index);
    return FLX_OK;
}

static flx_status_t failing_item(void *ctx, const flx_pool_worker_t *w, uint32_t item)
{
    return failing_body(ctx, w, item, item + 1);
}

static void test_errors(void)
{
    for (size_t wi = 0; wi < FLX_ARRAY_SIZE(WORKERS); wi++) {
        flx_pool_h p = make_pool(WORKERS[wi], FLX_POOL_SPIN_NS);
        for (int rep = 0; rep < 20; rep++) {
            failing_t f = {.fail_from = 37, .fail_every = 3};
            flx_error_clear();
            CHECK_ST(flx_pool_for(p, 200, 1, failing_body, &f), FLX_ERR_CAPACITY);
            /* the lowest failing chunk is 39, whoever ran it */
            CHECK(strncmp(flx_error_msg(), "chunk 39 failed on worker ", 26) == 0);
            CHECK(f.ran >= 40);
            failing_t g = {.fail_from = 17, .fail_every = 1};
            flx_pool_queue_t q;
            flx_pool_queue_init(&q, 100);
            CHECK_ST(flx_pool_pull(p, &q, failing_item, &g), FLX_ERR_CAPACITY);
            CHECK(strncmp(flx_error_msg(), "chunk 17 failed", 15) == 0);
            uint32_t item;
            CHECK(flx_pool_queue_pop(&q, &item) == 0);   /* the failure closed the queue */
            /* the pool is usable again */
            cover_t c = {.n = 50, .chunk = 1, .n_workers = WORKERS[wi], .driver = pthread_self()};
            c.hits = calloc(50, sizeof *c.hits);
            CHECK_OK(flx_pool_for(p, 50, 1, cover_body, &c));
            for (int i = 0; i < 50; i++) CHECK(c.hits[i] == 1);
            free(c.hits);
        }
        flx_pool_destroy(p);
    }
    CHECK_ST(flx_pool_for(NULL, 10, 1, NULL, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_pool_pull(NULL, NULL, failing_item, NULL), FLX_ERR_INVALID);
}

/* ---- nesting and two drivers ---- */

typedef struct nest {
    flx_pool_h pool;
    _Atomic uint64_t total;
    _Atomic uint32_t bad;
} nest_t;

typedef struct inner {
    uint32_t outer_index;
    uint64_t sum;
    nest_t *n;
} inner_t;

static flx_status_t inner_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    inner_t *in = ctx;
    if (w->index != in->outer_index) in->n->bad = 1;   /* inline on the same worker */
    for (uint64_t i = b; i < e; i++) in->sum += i;
    return FLX_OK;
}

static flx_status_t outer_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    nest_t *n = ctx;
    for (uint64_t i = b; i < e; i++) {
        inner_t in = {.outer_index = w->index, .n = n};
        flx_status_t st = flx_pool_for(n->pool, 100, 7, inner_body, &in);
        if (st) return st;
        n->total += in.sum;
    }
    return FLX_OK;
}

typedef struct driver_arg {
    flx_pool_h pool;
    int rounds;
    _Atomic uint32_t *fails;
} driver_arg_t;

static void *second_driver(void *arg)
{
    driver_arg_t *d = arg;
    for (int r = 0; r < d->rounds; r++) {
        cover_t c = {.n = 300, .chunk = 2, .n_workers = flx_pool_size(d->pool), .driver = pthread_self()};
        c.hits = calloc(300, sizeof *c.hits);
        if (flx_pool_for(d->pool, 300, 2, cover_body, &c)) (*d->fails)++;
        for (int i = 0; i < 300; i++)
            if (c.hits[i] != 1) (*d->fails)++;
        if (c.bad || c.wrong_driver) (*d->fails)++;
        free(c.hits);
    }
    return NULL;
}

static void test_nesting_and_sharing(void)
{
    flx_pool_h p = make_pool(3, FLX_POOL_SPIN_NS);
    nest_t n = {.pool = p};
    CHECK_OK(flx_pool_for(p, 40, 1, outer_body, &n));
    CHECK(n.total == 40ull * 4950 && !n.bad);
    _Atomic uint32_t fails = 0;
    driver_arg_t d = {.pool = p, .rounds = 200, .fails = &fails};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, second_driver, &d) == 0);
    second_driver(&d);
    pthread_join(t, NULL);
    CHECK(fails == 0);
    flx_pool_destroy(p);
}

/* ---- scratch ---- */

typedef struct scr {
    void *seen[8];
    size_t bytes;
    _Atomic uint32_t bad;
} scr_t;

static flx_status_t scratch_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    scr_t *s = ctx;
    (void)b, (void)e;
    if (!w->scratch || w->scratch_bytes < s->bytes || ((uintptr_t)w->scratch & 63)) s->bad = 1;
    else memset(w->scratch, (int)w->index, s->bytes);   /* a shared scratch shows under TSan */
    s->seen[w->index] = w->scratch;
    return FLX_OK;
}

static flx_status_t reserve_in_run_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    (void)w, (void)b, (void)e;
    return flx_pool_reserve_scratch(ctx, 4096);   /* refused, not a deadlock on the run lock */
}

static void test_scratch(void)
{
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_N_WORKERS | FLX_POOL_FIELD_SCRATCH, .n_workers = 3,
                            .scratch_bytes = 1000};
    flx_pool_h p;
    CHECK_OK(flx_pool_create(&pp, &p));
    scr_t s = {.bytes = 1000};
    CHECK_OK(flx_pool_for(p, 64, 1, scratch_body, &s));
    CHECK(!s.bad);
    CHECK_OK(flx_pool_reserve_scratch(p, 100000));
    s.bytes = 100000;
    CHECK_OK(flx_pool_for(p, 64, 1, scratch_body, &s));
    CHECK(!s.bad);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < i; j++) CHECK(!s.seen[i] || s.seen[i] != s.seen[j]);
    CHECK_ST(flx_pool_reserve_scratch(p, (size_t)1 << 41), FLX_ERR_INVALID);
    CHECK_ST(flx_pool_for(p, 8, 1, reserve_in_run_body, p), FLX_ERR_STATE);
    flx_pool_destroy(p);
}

/* ---- many tiny runs: a lost wake-up hangs (the alarm fails the test) ---- */

static flx_status_t tiny_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    (void)w;
    _Atomic uint64_t *sum = ctx;
    for (uint64_t i = b; i < e; i++) *sum += i;
    return FLX_OK;
}

static void test_many_runs(void)
{
    const uint32_t spins[] = {0, 2000, FLX_POOL_SPIN_NS};
    for (size_t s = 0; s < FLX_ARRAY_SIZE(spins); s++)
        for (size_t wi = 1; wi < FLX_ARRAY_SIZE(WORKERS); wi++) {
            flx_pool_h p = make_pool(WORKERS[wi], spins[s]);
            const int runs = 3000;
            for (int r = 0; r < runs; r++) {
                _Atomic uint64_t sum = 0;
                const uint64_t n = 2 + (uint64_t)(r % 13);
                CHECK_OK(flx_pool_for(p, n, 1, tiny_body, &sum));
                CHECK(sum == n * (n - 1) / 2);
                if (r % 500 == 0) {   /* let the workers fall asleep now and then */
                    struct timespec ts = {0, 300000};
                    nanosleep(&ts, NULL);
                }
            }
            flx_pool_destroy(p);
        }
}

/* ---- sleeping workers are woken: each chunk waits until all of the run's chunks have started ---- */

typedef struct meet {
    _Atomic uint32_t started;
    uint32_t n;
    _Atomic int timed_out;
} meet_t;

static flx_status_t meet_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    (void)w, (void)b, (void)e;
    meet_t *m = ctx;
    m->started++;
    const uint64_t t0 = flx_now_ns();
    while (m->started < m->n)
        if (flx_now_ns() - t0 > 5000000000ull) {
            m->timed_out = 1;
            break;
        }
    return FLX_OK;
}

static void test_wakeup(void)
{
    const uint32_t spins[] = {0, 5000};
    for (size_t s = 0; s < FLX_ARRAY_SIZE(spins); s++) {
        flx_pool_h p = make_pool(3, spins[s]);
        for (int r = 0; r < 100; r++) {
            meet_t m = {.n = 3};
            if (r % 10 == 0) {   /* long enough for every worker to be asleep */
                struct timespec ts = {0, 2000000};
                nanosleep(&ts, NULL);
            }
            CHECK_OK(flx_pool_for(p, 3, 1, meet_body, &m));
            CHECK(!m.timed_out);
        }
        flx_pool_destroy(p);
    }
}

/* ---- idle workers block: little CPU while nothing runs ---- */

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_idle_blocks(void)
{
    flx_pool_h p = make_pool(3, 20000);
    _Atomic uint64_t sum = 0;
    CHECK_OK(flx_pool_for(p, 100, 1, tiny_body, &sum));
    double c0 = cpu_seconds();
    struct timespec ts = {0, 300 * 1000000};
    nanosleep(&ts, NULL);
    double used = cpu_seconds() - c0;
    fprintf(stderr, "idle 300 ms with 3 workers (spin 20 us): %.1f ms of CPU\n", used * 1e3);
    CHECK(used < 0.05);   /* spinning workers would take ~600 ms */
    flx_pool_destroy(p);
}

/* ---- worker count: FLX_THREADS, describe line, refusals ---- */

static void test_count_and_refusals(void)
{
    flx_pool_params_t pp = {0};
    flx_pool_h p;
    unsetenv("FLX_THREADS");
    CHECK_OK(flx_pool_create(&pp, &p));
    flx_cpu_budget_t b;
    CHECK_OK(flx_cpu_budget_detect(&b));
    CHECK(flx_pool_size(p) == b.n_cpus);
    char want[64];
    snprintf(want, sizeof want, "workers %u: affinity %u CPUs, cgroup quota ", b.n_cpus, b.n_affinity);
    fprintf(stderr, "default: %s\n", flx_pool_describe(p));
    CHECK(strncmp(flx_pool_describe(p), want, strlen(want)) == 0);
    flx_pool_destroy(p);

    setenv("FLX_THREADS", "3", 1);
    CHECK_OK(flx_pool_create(&pp, &p));
    CHECK(flx_pool_size(p) == 3);
    CHECK(strncmp(flx_pool_describe(p), "workers 3: FLX_THREADS=3 (", 26) == 0);
    flx_pool_destroy(p);
    /* an explicit count wins over the environment */
    pp.field_mask = FLX_POOL_FIELD_N_WORKERS, pp.n_workers = 2;
    CHECK_OK(flx_pool_create(&pp, &p));
    CHECK(flx_pool_size(p) == 2 && strncmp(flx_pool_describe(p), "workers 2: requested (", 22) == 0);
    flx_pool_destroy(p);
    pp.field_mask = 0;
    const char *bad[] = {"0", "abc", "2000", "3x", "-1", "", " 2"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        setenv("FLX_THREADS", bad[i], 1);
        CHECK_ST(flx_pool_create(&pp, &p), FLX_ERR_INVALID);
        CHECK(strstr(flx_error_msg(), "FLX_THREADS") != NULL);
    }
    unsetenv("FLX_THREADS");

    flx_pool_params_t q = {.field_mask = 1u << 9};
    CHECK_ST(flx_pool_create(&q, &p), FLX_ERR_INVALID);
    q = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_N_WORKERS, .n_workers = 5000};
    CHECK_ST(flx_pool_create(&q, &p), FLX_ERR_INVALID);
    q = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_NUMA_NODE, .numa_node = -3};
    CHECK_ST(flx_pool_create(&q, &p), FLX_ERR_INVALID);
    q = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_SPIN, .spin_ns = 200000000};
    CHECK_ST(flx_pool_create(&q, &p), FLX_ERR_INVALID);
    CHECK_ST(flx_pool_create(NULL, &p), FLX_ERR_INVALID);
}

/* ---- binding: a fake two-node topology records the calls ---- */

typedef struct fake {
    int n_cpus;
    int cpu[16], node[16];
    uint32_t quota_mcpu;
    pthread_mutex_t mu;
    int n_binds;
    struct {
        uint32_t worker;
        int cpus[16];
        uint32_t n;
        int node;
        pthread_t thread;
    } binds[32];
} fake_t;

static flx_status_t fake_topo(void *ctx, pool_topo_t *t)
{
    fake_t *f = ctx;
    t->n = (uint32_t)f->n_cpus;
    t->cpu = malloc(16 * sizeof(int));
    t->node = malloc(16 * sizeof(int));
    memcpy(t->cpu, f->cpu, sizeof f->cpu);
    memcpy(t->node, f->node, sizeof f->node);
    return FLX_OK;
}

static flx_status_t fake_check_node(void *ctx, int node)
{
    (void)ctx;
    return node <= 1 ? FLX_OK : flx_error_set(FLX_ERR_INVALID, "numa node %d does not exist", node);
}

static flx_status_t fake_budget(void *ctx, flx_cpu_budget_t *b)
{
    fake_t *f = ctx;
    memset(b, 0, sizeof *b);
    b->n_affinity = (uint32_t)f->n_cpus;
    b->quota_mcpu = f->quota_mcpu;
    b->quota_version = f->quota_mcpu ? 2 : 0;
    b->n_cpus = f->quota_mcpu && (f->quota_mcpu + 999) / 1000 < (uint32_t)f->n_cpus ? (f->quota_mcpu + 999) / 1000
                                                                                     : (uint32_t)f->n_cpus;
    return FLX_OK;
}

static flx_status_t fake_bind(void *ctx, uint32_t worker, const int *cpus, uint32_t n, int node)
{
    fake_t *f = ctx;
    pthread_mutex_lock(&f->mu);
    int i = f->n_binds++;
    f->binds[i].worker = worker;
    f->binds[i].n = n;
    memcpy(f->binds[i].cpus, cpus, n * sizeof *cpus);
    f->binds[i].node = node;
    f->binds[i].thread = pthread_self();
    pthread_mutex_unlock(&f->mu);
    return FLX_OK;
}

static fake_t *fake_two_nodes(void)
{
    /* CPUs 2..9 in the mask: 2, 3 on node 0; 4..9 on node 1 */
    fake_t *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->n_cpus = 8;
    for (int i = 0; i < 8; i++) {
        f->cpu[i] = 2 + i;
        f->node[i] = i < 2 ? 0 : 1;
    }
    return f;
}

static void check_bound(const fake_t *f, uint32_t n_workers, const int *cpus, uint32_t n, int node)
{
    CHECK(f->n_binds == (int)n_workers);
    uint32_t seen = 0;
    for (int i = 0; i < f->n_binds; i++) {
        CHECK(f->binds[i].worker < n_workers && f->binds[i].n == n && f->binds[i].node == node);
        CHECK(!(seen & (1u << f->binds[i].worker)));
        seen |= 1u << f->binds[i].worker;
        CHECK((f->binds[i].worker == 0) == pthread_equal(f->binds[i].thread, pthread_self()));
        for (uint32_t j = 0; j < n; j++) CHECK(f->binds[i].cpus[j] == cpus[j]);
    }
}

typedef struct node_seen {
    _Atomic int bad;
    int want;
} node_seen_t;

static flx_status_t node_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    node_seen_t *s = ctx;
    (void)b, (void)e;
    if (w->numa_node != s->want) s->bad = 1;
    return FLX_OK;
}

static void test_fake_topology(void)
{
    flx_pool_h p;
    /* node 1: its 6 CPUs; the budget (8 CPUs, no quota) counts those 6 */
    fake_t *f = fake_two_nodes();
    pool_sys_t sys = {fake_topo, fake_check_node, fake_budget, fake_bind, f};
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_NUMA_NODE, .numa_node = 1};
    CHECK_OK(flx_pool_create_sys(&pp, &sys, &p));
    CHECK(flx_pool_size(p) == 6);
    fprintf(stderr, "fake node 1: %s\n", flx_pool_describe(p));
    CHECK(strstr(flx_pool_describe(p), "numa node 1: 6 CPUs") != NULL);
    const int node1[] = {4, 5, 6, 7, 8, 9};
    check_bound(f, 6, node1, 6, 1);
    node_seen_t ns = {.want = 1};
    CHECK_OK(flx_pool_for(p, 100, 1, node_body, &ns));
    CHECK(!ns.bad);
    CHECK_ST(flx_pool_bind_reserved(p), FLX_ERR_STATE);
    flx_pool_destroy(p);
    free(f);

    /* node 1 with one CPU reserved: the highest one is set apart, the workers get the others */
    f = fake_two_nodes();
    sys.ctx = f;
    pp.field_mask |= FLX_POOL_FIELD_RESERVE, pp.reserve_cpus = 1;
    CHECK_OK(flx_pool_create_sys(&pp, &sys, &p));
    CHECK(flx_pool_size(p) == 5);
    check_bound(f, 5, node1, 5, 1);
    int res[4];
    CHECK(flx_pool_reserved_cpus(p, res, 4) == 1 && res[0] == 9);
    CHECK_OK(flx_pool_bind_reserved(p));
    CHECK(f->n_binds == 6 && f->binds[5].worker == UINT32_MAX && f->binds[5].n == 1 && f->binds[5].cpus[0] == 9);
    flx_pool_info_t info;
    flx_pool_info(p, &info);
    CHECK(info.numa_node == 1 && info.reserve_cpus == 1 && info.n_reserved_cpus == 1 && info.n_workers == 5);
    flx_pool_destroy(p);
    free(f);

    /* unbound, one CPU reserved: all 8 minus the highest; no preferred node */
    f = fake_two_nodes();
    sys.ctx = f;
    pp = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_RESERVE, .reserve_cpus = 1};
    CHECK_OK(flx_pool_create_sys(&pp, &sys, &p));
    const int all7[] = {2, 3, 4, 5, 6, 7, 8};
    CHECK(flx_pool_size(p) == 7);
    check_bound(f, 7, all7, 7, -1);
    ns.want = -1;   /* the mask spans two nodes */
    CHECK_OK(flx_pool_for(p, 100, 1, node_body, &ns));
    CHECK(!ns.bad);
    flx_pool_destroy(p);
    free(f);

    /* a quota of 2.5 CPUs on node 1 (6 CPUs): 3 CPUs of time, one of them reserved; no concrete CPU
     * can be set apart (the quota time-shares all six) */
    f = fake_two_nodes();
    f->quota_mcpu = 2500;
    sys.ctx = f;
    pp = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_RESERVE | FLX_POOL_FIELD_NUMA_NODE, .reserve_cpus = 1,
                             .numa_node = 1};
    CHECK_OK(flx_pool_create_sys(&pp, &sys, &p));
    fprintf(stderr, "fake quota: %s\n", flx_pool_describe(p));
    CHECK(flx_pool_size(p) == 2);
    CHECK(strstr(flx_pool_describe(p), "cgroup quota 2.5 CPUs") != NULL);
    CHECK(flx_pool_reserved_cpus(p, res, 4) == 0);
    CHECK_ST(flx_pool_bind_reserved(p), FLX_ERR_STATE);
    check_bound(f, 2, node1, 6, 1);
    flx_pool_destroy(p);
    free(f);

    /* refusals: a node without CPUs of the mask, a node that does not exist, nothing left */
    f = fake_two_nodes();
    f->node[0] = f->node[1] = 1;   /* node 0 has none of the mask's CPUs */
    sys.ctx = f;
    pp = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_NUMA_NODE, .numa_node = 0};
    CHECK_ST(flx_pool_create_sys(&pp, &sys, &p), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "numa node 0 has none") != NULL);
    pp.numa_node = 2;
    CHECK_ST(flx_pool_create_sys(&pp, &sys, &p), FLX_ERR_INVALID);
    pp = (flx_pool_params_t){.field_mask = FLX_POOL_FIELD_RESERVE, .reserve_cpus = 8};
    CHECK_ST(flx_pool_create_sys(&pp, &sys, &p), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "reserve_cpus 8 leaves no CPU") != NULL);
    CHECK(f->n_binds == 0);
    free(f);
}

/* ---- the real binding on this machine ---- */

typedef struct aff {
    _Atomic int bad;
    cpu_set_t want;
} aff_t;

static flx_status_t aff_body(void *ctx, const flx_pool_worker_t *w, uint64_t b, uint64_t e)
{
    aff_t *a = ctx;
    (void)b, (void)e;
    cpu_set_t got;
    if (pthread_getaffinity_np(pthread_self(), sizeof got, &got) || !CPU_EQUAL(&got, &a->want) || w->numa_node != 0)
        a->bad = 1;
    return FLX_OK;
}

static void test_real_binding(void)
{
    cpu_set_t before;
    CHECK(sched_getaffinity(0, sizeof before, &before) == 0);
    aff_t a = {0};
    CPU_ZERO(&a.want);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &before) && (numa_available() < 0 || numa_node_of_cpu(c) == 0)) CPU_SET(c, &a.want);
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_NUMA_NODE | FLX_POOL_FIELD_N_WORKERS, .numa_node = 0,
                            .n_workers = 3};
    flx_pool_h p;
    CHECK_OK(flx_pool_create(&pp, &p));
    CHECK_OK(flx_pool_for(p, 64, 1, aff_body, &a));
    CHECK(!a.bad);
    flx_pool_destroy(p);
    CHECK(sched_setaffinity(0, sizeof before, &before) == 0);
    pp.numa_node = numa_available() < 0 ? 1 : numa_max_node() + 1;
    CHECK_ST(flx_pool_create(&pp, &p), FLX_ERR_INVALID);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "test_pool: timed out (a lost wake-up?)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(480);
    test_for_coverage();
    test_for_many_chunks();
    test_pull();
    test_errors();
    test_nesting_and_sharing();
    test_scratch();
    test_many_runs();
    test_wakeup();
    test_idle_blocks();
    test_count_and_refusals();
    test_fake_topology();
    test_real_binding();
    fprintf(stderr, "test_pool: ok\n");
    return 0;
}
