/*
 * test_attn_layer - one decode layer's attention for a batch (flx/attn_layer.h), the route every
 * mode takes, on sessions replayed from the synthetic workload with their prefill statistics
 * (mixed prompt lengths in one batch):
 *  - FULL and FIXED equal each group's flx_attn_group_run bit for bit; DEFERRED window partials
 *    (computed by the caller with the same window kernel) give the same bits as COMPUTE;
 *  - FLUXION equals its definition rebuilt here from the same functions (features, predictor,
 *    selector, host part, merge; streaming-only groups their window partial), bit for bit, with the
 *    shipped synthetic predictor; the ablations (no streaming skipping: every group a task; a fixed
 *    blk: every task at it) and a predictor that calls every head streaming (no task at all);
 *  - every result is the same bits whatever the number of CPU workers (1, 2, 3) and the policy;
 *  - refusals; with a CUDA device, a refused run drops the GPU spans its caller marked.
 * argv[1]: the synthetic predictor's weights file.
 */
#include <string.h>

#include "flx/attn_layer.h"
#include "flx/cuda_rt.h"
#include "flx/features.h"
#include "replay.h"
#include "sched_testutil.h"

enum { HQ = 8, HKV = 2, G = 4, D = 64, B = 4 };

static const char *g_weights;
static flx_pool_h g_pools[4];   /* [n]: a pool of n workers (NULL for 1) */

typedef struct batch {
    flx_replay_t *rp[B];
    flx_kvsrc_h src[B];
    flx_kv_session_h sess[B];
    float q[B * HQ * D];
    uint32_t max_l_cpu;
} batch_t;

static void batch_make(batch_t *bt, flx_rng_t *rng)
{
    const uint32_t lens[B] = {900, 3100, 720, 1800};
    memset(bt, 0, sizeof *bt);
    for (uint32_t b = 0; b < B; b++) {
        char spec[96];
        snprintf(spec, sizeof spec, "synth:1,%d,%d,%d,%u,2,%llu", HQ, HKV, D, lens[b],
                 (unsigned long long)flx_rng_u64(rng) % 100000 + 1);
        CHECK_OK(flx_replay_open_source(spec, &bt->src[b]));
        CHECK_OK(flx_replay_create(bt->src[b], 0.1f, &bt->rp[b]));
        CHECK_OK(flx_replay_load_layer(bt->rp[b], 0));
        CHECK_OK(flx_replay_step(bt->rp[b], 1));
        bt->sess[b] = bt->rp[b]->sess;
        memcpy(bt->q + (size_t)b * HQ * D, bt->rp[b]->q_step, HQ * D * sizeof(float));
        bt->max_l_cpu = FLX_MAX(bt->max_l_cpu, bt->rp[b]->info.l_cpu);
    }
}

static void batch_free(batch_t *bt)
{
    for (uint32_t b = 0; b < B; b++) {
        flx_replay_destroy(bt->rp[b]);
        flx_kvsrc_close(bt->src[b]);
    }
}

static flx_attn_layer_h make_layer(const batch_t *bt, flx_layer_mode_t mode, flx_predictor_h pred, uint32_t workers,
                                   flx_sched_policy_t pol, const flx_select_opts_t *opts)
{
    flx_attn_layer_params_t p;
    memset(&p, 0, sizeof p);
    p.n_q_heads = HQ, p.n_kv_heads = HKV, p.head_dim = D, p.max_batch = B, p.max_l_cpu = bt->max_l_cpu;
    p.mode = mode, p.blk = 32, p.bgt = 0.07f, p.predictor = pred;
    if (opts) p.field_mask |= FLX_ATTN_LAYER_FIELD_OPTS, p.opts = *opts;
    p.sched.field_mask = FLX_SCHED_FIELD_POLICY;
    p.sched.pool = g_pools[workers], p.sched.policy = pol;
    flx_attn_layer_h L;
    CHECK_OK(flx_attn_layer_create(&p, &L));
    return L;
}

static void run_layer(flx_attn_layer_h L, const batch_t *bt, uint32_t workers, float *o, flx_attn_layer_stats_t *st)
{
    (void)workers;
    flx_attn_layer_args_t a = {.layer = 0, .batch = B, .sess = bt->sess, .q = bt->q, .o = o,
                               .window = FLX_LAYER_WIN_COMPUTE};
    for (size_t i = 0; i < (size_t)B * HQ * D; i++) o[i] = NAN;
    CHECK_OK(flx_attn_layer_run(L, &a, st));
}

/* One workspace for the references. */
static flx_attn_ws_t *ref_ws(const batch_t *bt)
{
    static flx_attn_ws_t ws;
    static void *mem;
    flx_attn_shape_t sh = {.group = G, .head_dim = D, .max_l_cpu = bt->max_l_cpu, .pool = NULL};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&sh, &bytes));
    free(mem);
    mem = malloc(bytes);
    CHECK_OK(flx_attn_ws_init(&ws, &sh, mem, bytes));
    return &ws;
}

static void test_full_fixed(const batch_t *bt)
{
    flx_attn_ws_t *ws = ref_ws(bt);
    float *o = malloc(sizeof(float) * B * HQ * D), *want = malloc(sizeof(float) * B * HQ * D), lse[G];
    for (int m = 0; m < 2; m++) {
        flx_attn_cfg_t cfg = {.mode = m ? FLX_ATTN_FIXED : FLX_ATTN_FULL, .blk = 32, .budget = 0.07f};
        for (uint32_t b = 0; b < B; b++)
            for (uint32_t g = 0; g < HKV; g++) {
                const size_t r0 = (size_t)b * HQ + g * G;
                CHECK_OK(flx_attn_session_run(ws, bt->sess[b], 0, g, bt->q + r0 * D, &cfg, want + r0 * D, lse, NULL));
            }
        for (uint32_t w = 1; w <= 3; w++) {
            flx_attn_layer_h L = make_layer(bt, m ? FLX_LAYER_FIXED : FLX_LAYER_FULL, NULL, w, FLX_SCHED_PRIORITY, NULL);
            flx_attn_layer_stats_t st;
            run_layer(L, bt, w, o, &st);
            CHECK_SAME(m ? "fixed" : "full", o, want, (size_t)B * HQ * D);
            CHECK(st.n_groups == B * HKV && st.n_tasks == B * HKV && st.predict_ns == 0);
            uint32_t n;
            const flx_sched_task_t *t = flx_attn_layer_tasks(L, &n);
            CHECK(n == B * HKV);
            for (uint32_t i = 0; i + 1 < n; i++) CHECK(t[i].priority > 0.0f || t[i].l_cpu == 0);
            flx_attn_layer_destroy(L);
        }
    }
    free(o), free(want);
    fprintf(stderr, "full, fixed (32, 0.07): bitwise the groups' own runs, 1-3 workers -> ok\n");
}

static int g_waits;
static flx_status_t count_wait(void *ctx)
{
    (void)ctx;
    g_waits++;
    return FLX_OK;
}

static void test_deferred(const batch_t *bt)
{
    flx_attn_ws_t *ws = ref_ws(bt);
    float *o = malloc(sizeof(float) * B * HQ * D), *want = malloc(sizeof(float) * B * HQ * D);
    float *ow = malloc(sizeof(float) * B * HQ * D), lw[B * HQ];
    flx_attn_layer_h L = make_layer(bt, FLX_LAYER_FIXED, NULL, 2, FLX_SCHED_LENGTH, NULL);
    run_layer(L, bt, 2, want, NULL);
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t g = 0; g < HKV; g++) {
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(bt->sess[b], 0, g, &v));
            const size_t r0 = (size_t)b * HQ + g * G;
            CHECK_OK(flx_attn_window(ws, &v, bt->q + r0 * D, ow + r0 * D, lw + r0));
        }
    g_waits = 0;
    flx_attn_layer_args_t a = {.layer = 0, .batch = B, .sess = bt->sess, .q = bt->q, .o = o,
                               .window = FLX_LAYER_WIN_DEFERRED, .o_win = ow, .lse_win = lw, .win_wait = count_wait};
    flx_attn_layer_stats_t st;
    CHECK_OK(flx_attn_layer_run(L, &a, &st));
    CHECK(g_waits == 1);
    CHECK_SAME("deferred vs compute", o, want, (size_t)B * HQ * D);
    flx_attn_layer_destroy(L);
    free(o), free(want), free(ow);
    fprintf(stderr, "deferred window partials: the same bits as computed ones -> ok\n");
}

/* FLUXION rebuilt from its parts. */
static uint32_t fluxion_want(const batch_t *bt, flx_predictor_h pred, const flx_select_opts_t *opts, float *want,
                             uint32_t *n_tasks_p)
{
    flx_attn_ws_t *ws = ref_ws(bt);
    float feat[B * HQ * FLX_FEAT_COUNT], ow[B * HQ * D], lw[B * HQ], bud[B * HQ], lse[G];
    flx_head_pred_t hp[B * HQ];
    for (uint32_t b = 0; b < B; b++) {
        const flx_bf16_t *wk[HKV], *wv[HKV];
        flx_feat_layer_t in;
        CHECK_OK(flx_features_layer_from_session(bt->sess[b], 0, bt->q + (size_t)b * HQ * D, wk, wv, &in));
        in.ws = ws;
        CHECK_OK(flx_features_decode(&in, feat + (size_t)b * HQ * FLX_FEAT_COUNT, ow + (size_t)b * HQ * D, lw + b * HQ));
    }
    size_t sb = flx_predictor_scratch_bytes(B * HQ);
    void *scr = malloc(sb + 64);
    CHECK_OK(flx_predictor_run(pred, feat, B * HQ, hp, scr, sb + 64, NULL));
    free(scr);
    const flx_select_params_t sp = flx_predictor_select_params(pred);
    uint32_t n = 0;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t g = 0; g < HKV; g++) {
            const size_t r0 = (size_t)b * HQ + g * G;
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(bt->sess[b], 0, g, &v));
            flx_selection_t sel;
            CHECK_OK(flx_select_group_opts(hp + r0, G, v.l_cpu, &sp, opts, bud + r0, &sel));
            if (sel.skip) {
                memcpy(want + r0 * D, ow + r0 * D, G * D * sizeof(float));
                continue;
            }
            n++;
            flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = sel.blk, .budgets = bud + r0};
            CHECK_OK(flx_attn_host_run(ws, &v, bt->q + r0 * D, &cfg, want + r0 * D, lse, NULL));
            flx_attn_merge(G, D, ow + r0 * D, lw + r0, want + r0 * D, lse, want + r0 * D, lse);
        }
    *n_tasks_p = n;
    return n;
}

static void test_fluxion(const batch_t *bt)
{
    flx_predictor_h pred;
    CHECK_OK(flx_predictor_load(g_weights, &pred));
    float *o = malloc(sizeof(float) * B * HQ * D), *want = malloc(sizeof(float) * B * HQ * D);
    const flx_select_opts_t dyn = {0, 0}, keep = {1, 0}, fix = {0, 64};
    const flx_select_opts_t *optv[3] = {&dyn, &keep, &fix};
    for (int k = 0; k < 3; k++) {
        uint32_t n_want;
        fluxion_want(bt, pred, optv[k], want, &n_want);
        for (uint32_t w = 1; w <= 3; w++)
            for (int pol = 0; pol < 4; pol += 3) {
                flx_attn_layer_h L = make_layer(bt, FLX_LAYER_FLUXION, pred, w, (flx_sched_policy_t)pol, optv[k]);
                flx_attn_layer_stats_t st;
                run_layer(L, bt, w, o, &st);
                char lab[96];
                snprintf(lab, sizeof lab, "fluxion opts {%d, %u} %u workers %s", optv[k]->keep_streaming,
                         optv[k]->fixed_blk, w, flx_sched_policy_name((flx_sched_policy_t)pol));
                CHECK_SAME(lab, o, want, (size_t)B * HQ * D);
                CHECK(st.n_tasks == n_want && st.n_groups == B * HKV && st.predict_ns > 0);
                uint32_t n;
                const flx_sched_task_t *t = flx_attn_layer_tasks(L, &n);
                if (optv[k]->keep_streaming) CHECK(n == B * HKV - 1 || n == B * HKV);   /* l_cpu 0 may skip */
                for (uint32_t i = 0; i < n; i++) {
                    CHECK(t[i].budgets && t[i].priority > 0.0f);
                    if (optv[k]->fixed_blk) CHECK(t[i].blk == optv[k]->fixed_blk);
                }
                flx_attn_layer_destroy(L);
            }
        fprintf(stderr, "fluxion opts {%d, %u}: %u of %u groups are tasks; bitwise its definition, 1-3 workers -> ok\n",
                optv[k]->keep_streaming, optv[k]->fixed_blk, n_want, B * HKV);
    }
    flx_predictor_destroy(pred);
    /* every head streaming: no task, the window partials are the output */
    flx_mlp_t m;
    CHECK_OK(flx_mlp_alloc(&m));
    m.b4[2] = 20.0f;
    CHECK_OK(flx_predictor_create(&m, &pred));
    flx_mlp_free(&m);
    uint32_t n_want;
    fluxion_want(bt, pred, NULL, want, &n_want);
    CHECK(n_want == 0);
    flx_attn_layer_h L = make_layer(bt, FLX_LAYER_FLUXION, pred, 2, FLX_SCHED_PRIORITY, NULL);
    flx_attn_layer_stats_t st;
    run_layer(L, bt, 2, o, &st);
    CHECK_SAME("fluxion all streaming", o, want, (size_t)B * HQ * D);
    CHECK(st.n_tasks == 0 && st.sched.n_tasks == 0);
    flx_attn_layer_destroy(L);
    flx_predictor_destroy(pred);
    free(o), free(want);
}

/* A row whose features overflow (here its query: what a peer's statistics or window KV out of
 * range do too) fails alone: the run succeeds, flx_attn_layer_row_failed names the row, its outputs
 * are NaN, and every other row is bit for bit what the batch gives without the bad row. Before, the
 * predictor refused the layer and the engine ended every sequence of the step. */
static void test_row_fails_alone(const batch_t *bt)
{
    flx_predictor_h pred;
    CHECK_OK(flx_predictor_load(g_weights, &pred));
    float *o = malloc(sizeof(float) * B * HQ * D), *want = malloc(sizeof(float) * B * HQ * D);
    uint32_t n_want;
    fluxion_want(bt, pred, NULL, want, &n_want);
    batch_t bad = *bt;
    const uint32_t row = 1;
    for (uint32_t i = 0; i < HQ * D; i++) bad.q[(size_t)row * HQ * D + i] = 3e37f;
    for (uint32_t w = 1; w <= 3; w++) {
        flx_attn_layer_h L = make_layer(bt, FLX_LAYER_FLUXION, pred, w, FLX_SCHED_PRIORITY, NULL);
        flx_attn_layer_stats_t st;
        run_layer(L, &bad, w, o, &st);
        const char *why = flx_attn_layer_row_failed(L, row);
        if (w == 1) fprintf(stderr, "row fails alone: '%s'\n", why ? why : "(not failed)");
        CHECK(why && strstr(why, "batch row 1"));
        for (uint32_t b = 0; b < B; b++) {
            if (b == row) continue;
            CHECK(!flx_attn_layer_row_failed(L, b));
            CHECK_SAME("the other rows", o + (size_t)b * HQ * D, want + (size_t)b * HQ * D, (size_t)HQ * D);
        }
        for (uint32_t i = 0; i < HQ * D; i++) CHECK(isnan(o[(size_t)row * HQ * D + i]));
        uint32_t n;
        const flx_sched_task_t *t = flx_attn_layer_tasks(L, &n);
        for (uint32_t i = 0; i < n; i++) CHECK(t[i].seq != row);
        /* the next run is whole again */
        run_layer(L, bt, w, o, &st);
        CHECK(!flx_attn_layer_row_failed(L, row));
        CHECK_SAME("the run after", o, want, (size_t)B * HQ * D);
        flx_attn_layer_destroy(L);
    }
    fprintf(stderr, "row fails alone: 1-3 workers -> ok\n");
    flx_predictor_destroy(pred);
    free(o), free(want);
}

static void test_refusals(const batch_t *bt)
{
    flx_attn_layer_params_t p;
    memset(&p, 0, sizeof p);
    p.n_q_heads = HQ, p.n_kv_heads = HKV, p.head_dim = D, p.max_batch = B, p.max_l_cpu = bt->max_l_cpu;
    flx_attn_layer_h L = NULL;
    p.mode = FLX_LAYER_FLUXION;
    CHECK_ST(flx_attn_layer_create(&p, &L), FLX_ERR_INVALID);   /* no predictor */
    p.mode = FLX_LAYER_FIXED, p.blk = 24, p.bgt = 0.1f;
    CHECK_ST(flx_attn_layer_create(&p, &L), FLX_ERR_INVALID);
    p.blk = 16, p.bgt = 1.5f;
    CHECK_ST(flx_attn_layer_create(&p, &L), FLX_ERR_INVALID);
    p.bgt = 0.1f, p.max_batch = 0;
    CHECK_ST(flx_attn_layer_create(&p, &L), FLX_ERR_INVALID);
    p.max_batch = B, p.sched.field_mask = FLX_SCHED_FIELD_POLICY, p.sched.policy = (flx_sched_policy_t)7;
    CHECK_ST(flx_attn_layer_create(&p, &L), FLX_ERR_INVALID);   /* the scheduler's own refusal */
    p.sched.field_mask = 0, p.max_l_cpu = 100;
    CHECK_OK(flx_attn_layer_create(&p, &L));
    float o[B * HQ * D];
    flx_attn_layer_args_t a = {.layer = 0, .batch = B, .sess = bt->sess, .q = bt->q, .o = o};
    CHECK_ST(flx_attn_layer_run(L, &a, NULL), FLX_ERR_INVALID);   /* sessions above max_l_cpu */
    CHECK(strstr(flx_error_msg(), "max_l_cpu 100"));
    a.batch = B + 1;
    CHECK_ST(flx_attn_layer_run(L, &a, NULL), FLX_ERR_INVALID);
    a.batch = B, a.window = FLX_LAYER_WIN_DEFERRED;
    CHECK_ST(flx_attn_layer_run(L, &a, NULL), FLX_ERR_INVALID);   /* no o_win / win_wait */
    flx_attn_layer_destroy(L);
    flx_attn_layer_destroy(NULL);
    fprintf(stderr, "refusals: ok\n");
}

/* With a GPU worker: a run refused after its caller marked the window launch (flx_sched_gpu_span)
 * drops the span. Before, six refused runs left four spans behind and every later begin was refused,
 * which stopped an engine's every GPU layer for good. Needs a CUDA device. */
static void test_refused_run_drops_spans(const batch_t *bt)
{
    if (flx_cuda_device_count() <= 0) {
        fprintf(stderr, "spans of refused runs: no CUDA device, skipped\n");
        return;
    }
    flx_attn_layer_params_t p;
    memset(&p, 0, sizeof p);
    p.n_q_heads = HQ, p.n_kv_heads = HKV, p.head_dim = D, p.max_batch = B, p.max_l_cpu = bt->max_l_cpu;
    p.mode = FLX_LAYER_FIXED, p.blk = 32, p.bgt = 0.07f;
    p.sched.field_mask = FLX_SCHED_FIELD_GPU, p.sched.use_gpu = 1, p.sched.gpu_streams = 2;
    p.sched.pool = g_pools[2];
    flx_attn_layer_h L;
    CHECK_OK(flx_attn_layer_create(&p, &L));
    flx_sched_h s = flx_attn_layer_sched(L);
    flx_cuda_stream_t us;
    CHECK_OK(flx_cuda_stream_create(0, &us));
    float *o = malloc((size_t)B * HQ * D * sizeof(float));
    flx_attn_layer_args_t a = {.layer = 0, .batch = B + 1, .sess = bt->sess, .q = bt->q, .o = o,
                               .window = FLX_LAYER_WIN_COMPUTE};
    for (int i = 0; i < 6; i++) {
        CHECK_OK(flx_sched_gpu_span(s, us, 1));
        CHECK_OK(flx_sched_gpu_span(s, us, 0));
        CHECK_ST(flx_attn_layer_run(L, &a, NULL), FLX_ERR_INVALID);
    }
    a.batch = B;
    flx_attn_layer_stats_t st;
    CHECK_OK(flx_attn_layer_run(L, &a, &st));
    CHECK(st.sched.gpu_span_ns == 0);   /* none of the refused runs' spans counted here */
    CHECK_OK(flx_cuda_stream_sync(0, us));
    flx_cuda_stream_destroy(0, us);
    free(o);
    flx_attn_layer_destroy(L);
    fprintf(stderr, "spans of refused runs: dropped, ok\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_attn_layer WEIGHTS.safetensors\n");
        return 2;
    }
    g_weights = argv[1];
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_attn_layer"));
    for (uint32_t n = 2; n <= 3; n++) g_pools[n] = flx_test_pool(n);
    batch_t bt;
    batch_make(&bt, &rng);
    test_row_fails_alone(&bt);
    test_refusals(&bt);
    test_refused_run_drops_spans(&bt);
    test_full_fixed(&bt);
    test_deferred(&bt);
    test_fluxion(&bt);
    batch_free(&bt);
    for (uint32_t n = 2; n <= 3; n++) flx_pool_destroy(g_pools[n]);
    fprintf(stderr, "test_attn_layer: ok\n");
    return 0;
}
