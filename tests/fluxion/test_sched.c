/*
 * test_sched - the heterogeneous scheduler (flx/sched.h) on CPU workers (labels unit, concurrency:
 * TSan runs it with up to 7 threads on the 2-core machine):
 *  - one layer of a batch of sessions with skewed, mixed prompt lengths (a few hundred to several
 *    thousand host tokens in one batch), tasks mixing FULL, FIXED and SPARSE (budgets 0 and 1);
 *  - every policy (priority, no-parallel, uniform, length) on pools of 1, 2, 3 and 7 workers and
 *    every window mode gives the same output bits as running each task directly
 *    (flx_attn_group_run / flx_attn_host_run + flx_attn_merge on one workspace), and writes no row
 *    outside the tasks' (chunks of one task spread over workers, merged in chunk order);
 *  - the orders: priority = V descending with ties in the given order (and a lone worker takes
 *    them in that order), no-parallel = the given order, uniform = equal contiguous shares run by
 *    one worker each, length = balanced shares of host tokens (longest-first greedy bound);
 *  - the statistics: every task ran once, on a worker in range, start <= end <= wall, busy times;
 *  - the last task of a layer is shared: a second worker that finds the queue empty waits for the
 *    chunks of a task still being begun and takes some;
 *  - refusals: bad parameters, bad tasks and layers, a GPU asked for where none exists; a failing
 *    task reports the lowest failing task's error.
 */
#include <math.h>
#include <string.h>

#include "sched_testutil.h"

static flx_rng_t rng;

static void check_order(const st_batch_t *bt, flx_sched_h s, flx_sched_policy_t pol, uint32_t workers)
{
    const uint32_t *order, *lane_end, n = bt->n_tasks;
    uint32_t n_lanes;
    flx_sched_last_order(s, &order, &lane_end, &n_lanes);
    uint8_t *seen = calloc(n, 1);
    for (uint32_t i = 0; i < n; i++) {
        CHECK(order[i] < n && !seen[order[i]]);
        seen[order[i]] = 1;
    }
    free(seen);
    const flx_sched_task_t *t = bt->tasks;
    if (pol == FLX_SCHED_PRIORITY) {
        CHECK(n_lanes == 1);
        for (uint32_t i = 1; i < n; i++) {
            const flx_sched_task_t *a = &t[order[i - 1]], *b = &t[order[i]];
            CHECK(a->priority > b->priority || (a->priority == b->priority && order[i - 1] < order[i]));
        }
    } else if (pol == FLX_SCHED_NO_PARALLEL) {
        for (uint32_t i = 0; i < n; i++) CHECK(order[i] == i);
    } else {
        CHECK(n_lanes == workers);
        uint32_t lo = 0;
        uint64_t ld_min = UINT64_MAX, ld_max = 0, longest = 0;
        for (uint32_t l = 0; l < n_lanes; l++) {
            const uint32_t hi = lane_end[l];
            CHECK(hi >= lo && hi <= n);
            uint64_t load = 0;
            for (uint32_t i = lo; i < hi; i++) {
                CHECK(t[order[i]].worker == t[order[lo]].worker);   /* a static share runs on one worker */
                load += t[order[i]].l_cpu ? t[order[i]].l_cpu : 1;
                longest = FLX_MAX(longest, (uint64_t)t[order[i]].l_cpu);
                if (pol == FLX_SCHED_UNIFORM) CHECK(order[i] == i);
            }
            if (pol == FLX_SCHED_UNIFORM) CHECK(hi - lo == n / n_lanes || hi - lo == n / n_lanes + 1);
            ld_min = FLX_MIN(ld_min, load), ld_max = FLX_MAX(ld_max, load);
            lo = hi;
        }
        CHECK(lo == n);
        if (pol == FLX_SCHED_LENGTH) CHECK(ld_max - ld_min <= longest);   /* the greedy's bound */
    }
}

static void test_schedules(uint32_t G, uint32_t D, const uint32_t *lens, uint32_t B)
{
    st_batch_t bt;
    st_batch_make(&bt, &rng, G, D, lens, B, FLX_KV_STORE_HUGEPAGES);
    const size_t rows = (size_t)B * bt.Hq;
    float *o = malloc(rows * D * sizeof *o), *lse = malloc(rows * sizeof *lse);
    float *o_want = malloc(rows * D * sizeof *o), *lse_want = malloc(rows * sizeof *lse);
    const flx_sched_window_t wins[3] = {FLX_SCHED_WIN_GIVEN, FLX_SCHED_WIN_COMPUTE, FLX_SCHED_WIN_NONE};
    const uint32_t workers[4] = {1, 2, 3, 7};
    for (int wi = 0; wi < 3; wi++) {
        st_expected(&bt, wins[wi], o_want, lse_want);
        for (int pol = 0; pol < 4; pol++)
            for (int k = 0; k < 4; k++) {
                flx_pool_h pool = flx_test_pool(workers[k]);
                flx_sched_h s = st_sched(&bt, pool, (flx_sched_policy_t)pol, FLX_SCHED_HYBRID, 0);
                flx_sched_layer_t L;
                st_layer(&bt, &L, wins[wi], o, lse);
                flx_sched_layer_stats_t stx;
                const uint64_t t0 = flx_now_ns();
                CHECK_OK(flx_sched_run(s, &L, &stx));
                const uint64_t wall = flx_now_ns() - t0;
                char lab[128];
                snprintf(lab, sizeof lab, "G %u D %u B %u window %d %s %u workers", G, D, B, wi,
                         flx_sched_policy_name((flx_sched_policy_t)pol), workers[k]);
                CHECK_SAME(lab, o, o_want, rows * D);
                CHECK_SAME(lab, lse, lse_want, rows);
                CHECK(stx.n_tasks == bt.n_tasks && stx.n_cpu_tasks == bt.n_tasks && stx.n_gpu_tasks == 0);
                CHECK(!stx.has_gpu && stx.gpu_idle_ratio == 0.0);
                CHECK(stx.n_cpu_workers == workers[k]);
                CHECK(stx.wall_ns <= wall && stx.cpu_busy_ns <= (uint64_t)workers[k] * stx.wall_ns);
                CHECK(stx.cpu_busy_max_ns <= stx.cpu_busy_ns && stx.cpu_busy_max_ns > 0 && stx.n_chunks > 0);
                CHECK(stx.attn.attn_bytes > 0);
                for (uint32_t i = 0; i < bt.n_tasks; i++) {
                    const flx_sched_task_t *t = &bt.tasks[i];
                    CHECK(t->worker >= 0 && t->worker < (int32_t)workers[k]);
                    CHECK(t->start_ns <= t->end_ns && t->end_ns <= stx.wall_ns);
                }
                check_order(&bt, s, (flx_sched_policy_t)pol, workers[k]);
                if (workers[k] == 1 && pol == FLX_SCHED_PRIORITY) {   /* a lone worker does them in order */
                    const uint32_t *order;
                    flx_sched_last_order(s, &order, NULL, NULL);
                    for (uint32_t i = 1; i < bt.n_tasks; i++)
                        CHECK(bt.tasks[order[i - 1]].end_ns <= bt.tasks[order[i]].start_ns);
                }
                flx_sched_destroy(s);
                flx_pool_destroy(pool);
            }
    }
    fprintf(stderr, "schedules G %u D %u B %u (%u tasks, l_cpu up to %u): 3 windows x 4 policies x {1,2,3,7} workers "
                    "bitwise equal -> ok\n", G, D, B, bt.n_tasks, bt.max_l_cpu);
    free(o), free(lse), free(o_want), free(lse_want);
    st_batch_free(&bt);
}

static void test_refusals(void)
{
    const uint32_t lens[2] = {600, 1500};
    st_batch_t bt;
    st_batch_make(&bt, &rng, 4, 32, lens, 2, FLX_KV_STORE_HUGEPAGES);
    flx_pool_h pool = flx_test_pool(2);
    flx_sched_params_t p = {.pool = pool, .n_q_heads = bt.Hq, .n_kv_heads = ST_HKV, .head_dim = 32,
                            .max_l_cpu = bt.max_l_cpu, .max_tasks = bt.n_tasks};
    flx_sched_h s = NULL;
    flx_sched_params_t x = p;
    x.head_dim = 40;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    x = p, x.n_q_heads = 7;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    x = p, x.max_tasks = 0;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    x = p, x.field_mask = FLX_SCHED_FIELD_POLICY, x.policy = (flx_sched_policy_t)9;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "policy 9"));
    x = p, x.field_mask = FLX_SCHED_FIELD_PLACEMENT, x.placement = FLX_SCHED_GPU_ONLY;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "gpu-only"));
    x = p, x.field_mask = FLX_SCHED_FIELD_GPU, x.use_gpu = 1, x.gpu_streams = 9;
    CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_INVALID);
    if (flx_cuda_device_count() == 0) {
        x = p, x.field_mask = FLX_SCHED_FIELD_GPU, x.use_gpu = 1, x.gpu_streams = 2;
        CHECK_ST(flx_sched_create(&x, &s), FLX_ERR_NO_DEVICE);
    }
    CHECK(s == NULL);
    flx_sched_policy_t pol;
    flx_sched_placement_t pl;
    CHECK_ST(flx_sched_policy_parse("fastest", &pol), FLX_ERR_INVALID);
    CHECK_OK(flx_sched_policy_parse("length", &pol));
    CHECK(pol == FLX_SCHED_LENGTH);
    CHECK_ST(flx_sched_placement_parse("cpu-only", &pl), FLX_ERR_INVALID);
    CHECK_OK(flx_sched_placement_parse("gpu-only", &pl));

    CHECK_OK(flx_sched_create(&p, &s));
    const size_t rows = (size_t)bt.B * bt.Hq;
    float *o = malloc(rows * 32 * sizeof *o), *lse = malloc(rows * sizeof *lse);
    flx_sched_layer_t L;
    st_layer(&bt, &L, FLX_SCHED_WIN_GIVEN, o, lse);
    flx_sched_task_t keep = bt.tasks[1];
    bt.tasks[1].blk = 24;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "task 1 blk 24"));
    bt.tasks[1] = keep;
    bt.tasks[1].blk = 32, bt.tasks[1].budgets = NULL, bt.tasks[1].budget = 1.5f;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    bt.tasks[1] = keep;
    bt.tasks[2].seq = 5;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    bt.tasks[2].seq = 1;
    L.o_win = NULL;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    L.o_win = bt.o_win, L.window = FLX_SCHED_WIN_NONE, L.lse = NULL;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    L.lse = lse, L.n_tasks = bt.n_tasks + 1;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    L.n_tasks = bt.n_tasks;
    CHECK_ST(flx_sched_gpu_span(s, NULL, 1), FLX_ERR_INVALID);   /* no GPU worker */
    /* failing tasks (their layer has no such view): the queue's first one is reported, others stop */
    L.layer = ST_LAYERS;
    CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
    const uint32_t *order;
    flx_sched_last_order(s, &order, NULL, NULL);
    char want[64];
    snprintf(want, sizeof want, "task %u (batch row", order[0]);
    CHECK(strstr(flx_error_msg(), want));
    L.layer = bt.layer;
    CHECK_OK(flx_sched_run(s, &L, NULL));   /* still usable */
    flx_sched_destroy(s);
    /* a task taken before another fails still finishes: session 0's tasks (FULL, first in the
     * queue) fit the workspaces, session 1's (l_cpu above max_l_cpu) fail when begun */
    {
        flx_sched_params_t q = p;
        q.max_l_cpu = bt.l_cpu[0];
        CHECK(bt.l_cpu[1] > q.max_l_cpu);
        CHECK_OK(flx_sched_create(&q, &s));
        flx_sched_task_t saved[2 * ST_HKV];
        memcpy(saved, bt.tasks, sizeof saved);
        for (uint32_t i = 0; i < bt.n_tasks; i++) {
            bt.tasks[i].blk = 0, bt.tasks[i].budgets = NULL;   /* FULL */
            bt.tasks[i].priority = bt.tasks[i].seq == 0 ? 2.0f : 1.0f;
        }
        for (int rep = 0; rep < 20; rep++) {
            st_layer(&bt, &L, FLX_SCHED_WIN_GIVEN, o, lse);
            for (size_t r = 0; r < rows; r++) lse[r] = NAN;
            CHECK_ST(flx_sched_run(s, &L, NULL), FLX_ERR_INVALID);
            CHECK(strstr(flx_error_msg(), "max_l_cpu"));
            uint32_t taken = 0;
            for (uint32_t i = 0; i < bt.n_tasks; i++)
                if (bt.tasks[i].seq == 0 && bt.tasks[i].worker >= 0) {
                    taken++;
                    CHECK(bt.tasks[i].end_ns > 0 && bt.tasks[i].end_ns >= bt.tasks[i].start_ns);
                    const size_t r0 = (size_t)bt.tasks[i].kv_group * bt.G;
                    for (uint32_t r = 0; r < bt.G; r++) CHECK(isfinite(lse[r0 + r]));
                }
            CHECK(taken >= 1);   /* the queue's first task was popped before anything failed */
        }
        memcpy(bt.tasks, saved, sizeof saved);
        flx_sched_destroy(s);
    }
    flx_sched_destroy(NULL);
    flx_pool_destroy(pool);
    free(o), free(lse);
    st_batch_free(&bt);
    fprintf(stderr, "refusals: ok\n");
}

/* The last task of a layer is shared too: one long FIXED (16, 1.0) task (the only one, so the
 * second worker finds the queue empty while the first is still scoring it) on two workers. The
 * second must wait for its chunks to be published and take some, rather than leave: over 20 runs,
 * both workers did work in at least 8 (each run's output bitwise equal to the task run directly).
 * The chunks take a few ms, so a second worker the OS lets in late still finds some under ctest
 * -j2. Measured on the 2-core VM: 17 to 20 of 20 beside the engine tests, 20 alone; a worker that
 * leaves when the queue is empty shares only when it comes late, 2 to 3 of 20 alone. */
static void test_last_task_shared(void)
{
    const uint32_t lens[1] = {120000};
    st_batch_t bt;
    st_batch_make(&bt, &rng, 4, 64, lens, 1, FLX_KV_STORE_HUGEPAGES);
    bt.n_tasks = 1;
    flx_sched_task_t *t = &bt.tasks[0];
    t->blk = 16, t->budget = 1.0f, t->budgets = NULL;
    const size_t rows = bt.Hq;
    float *o = malloc(rows * bt.D * sizeof *o), *lse = malloc(rows * sizeof *lse);
    float *o_want = malloc(rows * bt.D * sizeof *o), *lse_want = malloc(rows * sizeof *lse);
    st_expected(&bt, FLX_SCHED_WIN_GIVEN, o_want, lse_want);
    flx_pool_h pool = flx_test_pool(2);
    flx_sched_h s = st_sched(&bt, pool, FLX_SCHED_PRIORITY, FLX_SCHED_HYBRID, 0);
    uint32_t shared = 0;
    for (int run = 0; run < 20; run++) {
        flx_sched_layer_t L;
        st_layer(&bt, &L, FLX_SCHED_WIN_GIVEN, o, lse);
        flx_sched_layer_stats_t stx;
        CHECK_OK(flx_sched_run(s, &L, &stx));
        CHECK_SAME("last task shared", o, o_want, (size_t)bt.G * bt.D);   /* the task's rows: group 0 */
        CHECK_SAME("last task shared", lse, lse_want, bt.G);
        CHECK(stx.n_chunks >= 2);
        shared += stx.cpu_busy_max_ns < stx.cpu_busy_ns;
    }
    fprintf(stderr, "last task: l_cpu %u, both workers ran chunks in %u of 20 runs\n", bt.l_cpu[0], shared);
    CHECK(shared >= 8);
    flx_sched_destroy(s);
    flx_pool_destroy(pool);
    free(o), free(lse), free(o_want), free(lse_want);
    st_batch_free(&bt);
}

int main(void)
{
    flx_rng_seed(&rng, flx_test_seed("test_sched"));
    test_refusals();
    test_last_task_shared();
    const uint32_t skewed[5] = {330, 6000, 700, 2400, 4100};   /* l_cpu 10 .. 5680: skewed task sizes */
    test_schedules(4, 64, skewed, 5);
    const uint32_t mixed[8] = {1200, 350, 900, 3000, 64, 2000, 500, 1700};   /* one session all window */
    test_schedules(8, 32, mixed, 8);
    fprintf(stderr, "test_sched: ok\n");
    return 0;
}
