/*
 * test_sched_gpu - the scheduler with its GPU worker (label gpu; exits 77 where no CUDA device is
 * usable): a batch of mixed prompt lengths in a store pinned with FLX_KV_STORE_PIN_CUDA, every
 * window mode, and
 *   priority (hybrid: 2 CPU workers and the GPU worker on one queue), gpu-only, uniform and length
 *   (the GPU worker with a share of its own), no-parallel (the GPU takes nothing);
 * each gives the CPU result (the tasks run directly, sched_testutil.h) within the kernels'
 * tolerance, o 3e-5 + 2e-4 |ref|, lse 1e-4 + 1e-5 |ref| (-inf where nothing was read), the worst
 * element printed. K and q are small integers, so Quest scores are exact and the GPU selects the
 * CPU's blocks (test_attn_gpu_host holds the top-k to flx_topk on arbitrary scores). Also: who ran
 * what (gpu-only: all on the device; no-parallel: none), device busy time and the idle ratio from
 * CUDA events, a caller's span counted as busy (and dropped with flx_sched_gpu_spans_drop), and a
 * session of an unpinned store in the same batch running on the GPU worker's thread with the CPU
 * kernels.
 */
#include <math.h>
#include <string.h>

#include "attn_testutil.h"
#include "flx/cuda_rt.h"
#include "sched_testutil.h"

#define O_ATOL 3e-5
#define O_RTOL 2e-4
#define L_ATOL 1e-4
#define L_RTOL 1e-5

static flx_rng_t rng;

static void check_close(const char *lab, const st_batch_t *bt, const float *o, const float *lse, const float *o_want,
                        const float *lse_want)
{
    const size_t rows = (size_t)bt->B * bt->Hq;
    char l2[160];
    snprintf(l2, sizeof l2, "%s: o", lab);
    CHECK_CLOSE(l2, o, o_want, rows * bt->D, O_ATOL, O_RTOL);
    for (size_t r = 0; r < rows; r += bt->G) {
        snprintf(l2, sizeof l2, "%s: lse rows %zu..", lab, r);
        if (!lse_close(l2, lse + r, lse_want + r, bt->G, L_ATOL, L_RTOL)) CHECK(0);
    }
}

typedef struct cfgx {
    flx_sched_policy_t pol;
    flx_sched_placement_t place;
    uint32_t workers;
} cfgx_t;

static void test_gpu_schedules(uint32_t G, uint32_t D, const uint32_t *lens, uint32_t B)
{
    st_batch_t bt;
    st_batch_make(&bt, &rng, G, D, lens, B, FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PIN_CUDA);
    const size_t rows = (size_t)B * bt.Hq;
    float *o = malloc(rows * D * sizeof *o), *lse = malloc(rows * sizeof *lse);
    float *o_want = malloc(rows * D * sizeof *o), *lse_want = malloc(rows * sizeof *lse);
    const flx_sched_window_t wins[3] = {FLX_SCHED_WIN_GIVEN, FLX_SCHED_WIN_COMPUTE, FLX_SCHED_WIN_NONE};
    const cfgx_t cf[5] = {{FLX_SCHED_PRIORITY, FLX_SCHED_HYBRID, 2}, {FLX_SCHED_PRIORITY, FLX_SCHED_GPU_ONLY, 1},
                          {FLX_SCHED_UNIFORM, FLX_SCHED_HYBRID, 2}, {FLX_SCHED_LENGTH, FLX_SCHED_HYBRID, 1},
                          {FLX_SCHED_NO_PARALLEL, FLX_SCHED_HYBRID, 2}};
    for (int wi = 0; wi < 3; wi++) {
        st_expected(&bt, wins[wi], o_want, lse_want);
        for (int c = 0; c < 5; c++) {
            flx_pool_h pool = flx_test_pool(cf[c].workers);
            flx_sched_h s = st_sched(&bt, pool, cf[c].pol, cf[c].place, 1);
            flx_sched_layer_t L;
            st_layer(&bt, &L, wins[wi], o, lse);
            flx_sched_layer_stats_t x;
            CHECK_OK(flx_sched_run(s, &L, &x));
            CHECK(!x.balanced);   /* nothing measured before the first run */
            char lab[128];
            snprintf(lab, sizeof lab, "window %d %s %s %u cpu workers", wi, flx_sched_policy_name(cf[c].pol),
                     flx_sched_placement_name(cf[c].place), cf[c].workers);
            check_close(lab, &bt, o, lse, o_want, lse_want);
            CHECK(x.has_gpu && x.n_tasks == bt.n_tasks && x.n_gpu_fallback == 0);
            CHECK(x.n_cpu_tasks + x.n_gpu_tasks == bt.n_tasks);
            if (cf[c].place == FLX_SCHED_GPU_ONLY) CHECK(x.n_gpu_tasks == bt.n_tasks && x.n_cpu_tasks == 0);
            if (cf[c].pol == FLX_SCHED_NO_PARALLEL) CHECK(x.n_gpu_tasks == 0);
            if (cf[c].pol == FLX_SCHED_UNIFORM) {   /* the GPU's share is the last third */
                const uint32_t *order, *lane_end;
                uint32_t n_lanes;
                flx_sched_last_order(s, &order, &lane_end, &n_lanes);
                CHECK(n_lanes == 3);
                for (uint32_t i = lane_end[1]; i < lane_end[2]; i++) CHECK(bt.tasks[order[i]].worker == FLX_SCHED_GPU);
            }
            if (x.n_gpu_tasks) CHECK(x.gpu_busy_ns > 0);
            CHECK(x.gpu_idle_ratio >= 0.0 && x.gpu_idle_ratio <= 1.0);
            CHECK(x.gpu_busy_ns + x.gpu_idle_ns >= x.wall_ns || x.gpu_idle_ns == 0);
            fprintf(stderr, "%s: %u on the GPU, %u on the CPU; gpu busy %.3f ms idle ratio %.3f (simulated clock)\n",
                    lab, x.n_gpu_tasks, x.n_cpu_tasks, (double)x.gpu_busy_ns * 1e-6, x.gpu_idle_ratio);
            /* the same layer again on the same scheduler: once both sides have run tasks, the CPU
             * workers balance against the GPU worker by the measured rates; the results stay */
            for (int r = 0; r < 4 && cf[c].pol == FLX_SCHED_PRIORITY && cf[c].place == FLX_SCHED_HYBRID; r++) {
                const int both = x.cpu_rate > 0 && x.gpu_rate > 0;
                st_layer(&bt, &L, wins[wi], o, lse);
                CHECK_OK(flx_sched_run(s, &L, &x));
                CHECK(x.balanced == both);
                check_close(lab, &bt, o, lse, o_want, lse_want);
                CHECK(x.n_cpu_tasks + x.n_gpu_tasks == bt.n_tasks);
                fprintf(stderr, "%s, run %d: balanced %d (rates cpu %.3g gpu %.3g B/ns), %u on the GPU\n", lab, r + 2,
                        x.balanced, x.cpu_rate, x.gpu_rate, x.n_gpu_tasks);
            }
            flx_sched_destroy(s);
            flx_pool_destroy(pool);
        }
    }
    free(o), free(lse), free(o_want), free(lse_want);
    st_batch_free(&bt);
}

/* A span the caller marks counts as device busy time; an unpinned session's task runs on the GPU
 * worker's thread on the CPU (worker index: the pool's size, here 1). */
static void test_span_and_fallback(void)
{
    const uint32_t lens_p[2] = {900, 400}, lens_u[1] = {1300};
    st_batch_t bp, bu;
    st_batch_make(&bp, &rng, 4, 64, lens_p, 2, FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PIN_CUDA);
    st_batch_make(&bu, &rng, 4, 64, lens_u, 1, FLX_KV_STORE_HUGEPAGES);
    /* one batch of 3 rows: the pinned store's two sessions, then the unpinned one */
    st_batch_t bt = bp;
    flx_kv_session_h sess[3] = {bp.sess[0], bp.sess[1], bu.sess[0]};
    const size_t rows = 3 * (size_t)bp.Hq, D = 64;
    float *q = malloc(rows * D * 4), *ow = malloc(rows * D * 4), *lw = malloc(rows * 4);
    memcpy(q, bp.q, 2 * bp.Hq * D * 4), memcpy(q + 2 * bp.Hq * D, bu.q, bp.Hq * D * 4);
    memcpy(ow, bp.o_win, 2 * bp.Hq * D * 4), memcpy(ow + 2 * bp.Hq * D, bu.o_win, bp.Hq * D * 4);
    memcpy(lw, bp.lse_win, 2 * bp.Hq * 4), memcpy(lw + 2 * bp.Hq, bu.lse_win, bp.Hq * 4);
    flx_sched_task_t tasks[6];
    memcpy(tasks, bp.tasks, 4 * sizeof *tasks);
    memcpy(tasks + 4, bu.tasks, 2 * sizeof *tasks);
    tasks[4].seq = tasks[5].seq = 2;
    bt.B = 3, bt.sess = sess, bt.q = q, bt.o_win = ow, bt.lse_win = lw, bt.tasks = tasks, bt.n_tasks = 6;
    bt.max_l_cpu = FLX_MAX(bp.max_l_cpu, bu.max_l_cpu);
    float *o = malloc(rows * D * 4), *lse = malloc(rows * 4), *o_want = malloc(rows * D * 4), *l_want = malloc(rows * 4);
    st_expected(&bt, FLX_SCHED_WIN_GIVEN, o_want, l_want);

    flx_sched_h s = st_sched(&bt, NULL, FLX_SCHED_PRIORITY, FLX_SCHED_GPU_ONLY, 1);
    flx_cuda_stream_t us;
    CHECK_OK(flx_cuda_stream_create(0, &us));
    void *dbuf;
    CHECK_OK(flx_cuda_malloc(0, 64u << 20, &dbuf));
    CHECK_ST(flx_sched_gpu_span(s, us, 0), FLX_ERR_INVALID);   /* an end without a begin */
    CHECK_OK(flx_sched_gpu_span(s, us, 1));
    CHECK_OK(flx_cuda_memset_async(0, dbuf, 0, 64u << 20, us));   /* the caller's device work */
    CHECK_OK(flx_sched_gpu_span(s, us, 0));
    flx_sched_layer_t L;
    st_layer(&bt, &L, FLX_SCHED_WIN_GIVEN, o, lse);
    flx_sched_layer_stats_t x;
    CHECK_OK(flx_sched_run(s, &L, &x));
    check_close("pinned + unpinned sessions, gpu-only", &bt, o, lse, o_want, l_want);
    CHECK(x.n_gpu_tasks == 4 && x.n_gpu_fallback == 2);
    CHECK(tasks[4].worker == 1 && tasks[5].worker == 1);
    CHECK(x.gpu_span_ns > 0 && x.gpu_busy_ns >= x.gpu_span_ns);   /* the memset is inside the busy time */
    fprintf(stderr, "span + fallback: %u on the device, %u on the GPU worker's thread; busy %.3f ms (span %.3f) "
            "-> ok\n",
            x.n_gpu_tasks, x.n_gpu_fallback, (double)x.gpu_busy_ns * 1e-6, (double)x.gpu_span_ns * 1e-6);
    /* Spans of a layer the caller gave up before its run are dropped: four left behind refused
     * every later begin, and a layer's spans never count in the next. */
    for (int i = 0; i < 4; i++) {
        CHECK_OK(flx_sched_gpu_span(s, us, 1));
        CHECK_OK(flx_sched_gpu_span(s, us, 0));
    }
    CHECK_ST(flx_sched_gpu_span(s, us, 1), FLX_ERR_INVALID);   /* a fifth */
    flx_sched_gpu_spans_drop(s);
    CHECK_OK(flx_sched_gpu_span(s, us, 1));   /* an open one goes too */
    flx_sched_gpu_spans_drop(s);
    CHECK_OK(flx_sched_run(s, &L, &x));
    CHECK(x.gpu_span_ns == 0);
    check_close("after dropped spans", &bt, o, lse, o_want, l_want);
    flx_sched_gpu_spans_drop(NULL);
    CHECK_OK(flx_cuda_free(0, dbuf));
    flx_cuda_stream_destroy(0, us);
    flx_sched_destroy(s);
    free(q), free(ow), free(lw), free(o), free(lse), free(o_want), free(l_want);
    st_batch_free(&bu);
    st_batch_free(&bp);
}

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_sched_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_sched_gpu"));
    test_span_and_fallback();
    const uint32_t lens[5] = {300, 1100, 600, 1500, 90};
    test_gpu_schedules(4, 64, lens, 5);
    fprintf(stderr, "test_sched_gpu: ok\n");
    return 0;
}
