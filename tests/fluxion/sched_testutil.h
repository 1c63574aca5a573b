/*
 * sched_testutil.h - a batch for the scheduler tests: sessions of mixed prompt lengths in a real
 * kvstore (pinned or not), queries, the tasks of a layer with a mix of FULL, FIXED and SPARSE
 * configurations and Eq. 3 priorities, window partials.
 */
#ifndef SCHED_TESTUTIL_H
#define SCHED_TESTUTIL_H

#include <string.h>

#include "flx/attn.h"
#include "flx/sched.h"
#include "flx_test.h"
#include "kvstore/kv_testutil.h"

#define ST_LAYERS 2
#define ST_HKV 2

typedef struct st_batch {
    uint32_t B, G, D, Hq;
    flx_kv_store_h store;
    flx_kv_session_id_t *sid;
    flx_kv_session_h *sess;
    uint32_t *l_cpu;            /* (B) */
    uint32_t max_l_cpu;
    float *q;                   /* (B, Hq, D) */
    float *o_win, *lse_win;     /* (B, Hq, D), (B, Hq) the CPU window partials of layer `layer` */
    float *budgets;             /* (B * HKV, G) */
    flx_sched_task_t *tasks;    /* (B * HKV) */
    uint32_t n_tasks;
    uint32_t layer;
} st_batch_t;

/* B sessions with prompt lengths lens[b] pushed into a store with flags; queries; tasks for every
 * (sequence, group) with a random mode, FULL / FIXED / SPARSE (budgets 0 and 1 among them). K and q
 * take the values -1, 0, 1: every Quest score is an integer, exact in fp32 whatever the summation
 * order, so CPU and GPU select the same blocks (ties as one rule orders them) and their outputs
 * can be compared element by element; scores tie often, which the top-k rule must settle. */
static inline void st_batch_make(st_batch_t *bt, flx_rng_t *rng, uint32_t G, uint32_t D, const uint32_t *lens,
                                 uint32_t B, uint32_t store_flags)
{
    memset(bt, 0, sizeof *bt);
    bt->B = B, bt->G = G, bt->D = D, bt->Hq = ST_HKV * G, bt->layer = 1;
    bt->store = kv_make_store_flags(ST_LAYERS, ST_HKV, bt->Hq, D, 64, 256, 512u << 20, store_flags);
    bt->sid = calloc(B, sizeof *bt->sid);
    bt->sess = calloc(B, sizeof *bt->sess);
    bt->l_cpu = calloc(B, sizeof *bt->l_cpu);
    CHECK(bt->sid && bt->sess && bt->l_cpu);
    for (uint32_t b = 0; b < B; b++) {
        flx_kv_session_params_t sp = {.prompt_len = lens[b], .max_new_tokens = 8, .flags = FLX_KV_SESSION_NO_STATS};
        CHECK_OK(flx_kv_session_open(bt->store, &sp, &bt->sid[b]));
        kv_prompt_t pr;
        kv_prompt_random(&pr, ST_LAYERS, ST_HKV, D, lens[b], rng);
        for (size_t i = 0; i < (size_t)ST_LAYERS * ST_HKV * lens[b] * D; i++)
            pr.k[i] = flx_f32_to_bf16((float)flx_rng_below(rng, 3) - 1.0f);
        kv_push_random(bt->store, bt->sid[b], &pr, rng);
        kv_prompt_free(&pr);
        CHECK_OK(flx_kv_session_acquire(bt->store, bt->sid[b], &bt->sess[b]));
        flx_kv_session_info_t info;
        CHECK_OK(flx_kv_session_info(bt->store, bt->sid[b], &info));
        bt->l_cpu[b] = info.l_cpu;
        bt->max_l_cpu = FLX_MAX(bt->max_l_cpu, info.l_cpu);
    }
    if (bt->max_l_cpu == 0) bt->max_l_cpu = 1;
    const size_t rows = (size_t)B * bt->Hq;
    bt->q = malloc(rows * D * sizeof(float));
    bt->o_win = malloc(rows * D * sizeof(float));
    bt->lse_win = malloc(rows * sizeof(float));
    bt->budgets = malloc((size_t)B * ST_HKV * G * sizeof(float));
    bt->tasks = calloc((size_t)B * ST_HKV, sizeof *bt->tasks);
    CHECK(bt->q && bt->o_win && bt->lse_win && bt->budgets && bt->tasks);
    for (size_t i = 0; i < rows * D; i++) bt->q[i] = (float)flx_rng_below(rng, 3) - 1.0f;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t g = 0; g < ST_HKV; g++) {
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(bt->sess[b], bt->layer, g, &v));
            const size_t r0 = (size_t)b * bt->Hq + (size_t)g * G;
            CHECK_OK(flx_attn_window_ref(&v, G, bt->q + r0 * D, bt->o_win + r0 * D, bt->lse_win + r0));
        }
    const uint32_t blks[4] = {16, 32, 64, 128};
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t g = 0; g < ST_HKV; g++) {
            const uint32_t i = b * ST_HKV + g;
            flx_sched_task_t *t = &bt->tasks[i];
            t->seq = b, t->kv_group = g, t->l_cpu = bt->l_cpu[b];
            float *bud = bt->budgets + (size_t)i * G;
            const uint32_t kind = (uint32_t)flx_rng_below(rng, 5);
            double rows_read = 0;
            if (kind == 0) {
                t->blk = 0;   /* FULL */
                rows_read = 2.0 * t->l_cpu * G;
            } else if (kind == 1) {
                t->blk = 16, t->budget = 0.05f;
                rows_read = 2.0 * t->l_cpu / 16 + 2.0 * t->l_cpu * G * 0.05;
            } else {
                t->blk = blks[flx_rng_below(rng, 4)];
                t->budgets = bud;
                for (uint32_t h = 0; h < G; h++) {
                    const uint64_t r = flx_rng_below(rng, 6);
                    bud[h] = r == 0 ? 0.0f : r == 1 ? 1.0f : (float)(flx_rng_uniform(rng) * 0.2);
                    rows_read += 2.0 * t->l_cpu * bud[h];
                }
                rows_read += 2.0 * t->l_cpu / t->blk;
            }
            t->priority = (float)rows_read;
        }
    bt->n_tasks = B * ST_HKV;
    bt->tasks[bt->n_tasks - 1].priority = bt->tasks[0].priority;   /* a tie: the earlier task first */
}

static inline void st_batch_free(st_batch_t *bt)
{
    for (uint32_t b = 0; b < bt->B; b++) flx_kv_session_release(bt->sess[b]);
    flx_kv_store_destroy(bt->store);
    free(bt->sid), free(bt->sess), free(bt->l_cpu), free(bt->q), free(bt->o_win), free(bt->lse_win);
    free(bt->budgets), free(bt->tasks);
}

/* Output rows of the tasks only: o (B, Hq, D) starts as NaN, so a row no task wrote shows. */
static inline void st_layer(const st_batch_t *bt, flx_sched_layer_t *L, flx_sched_window_t win, float *o, float *lse)
{
    const size_t rows = (size_t)bt->B * bt->Hq;
    for (size_t i = 0; i < rows * bt->D; i++) o[i] = NAN;
    for (size_t i = 0; i < rows; i++) lse[i] = NAN;
    memset(L, 0, sizeof *L);
    L->layer = bt->layer, L->batch = bt->B, L->sess = bt->sess, L->q = bt->q, L->o = o, L->lse = lse;
    L->window = win, L->o_win = bt->o_win, L->lse_win = bt->lse_win;
    L->tasks = bt->tasks, L->n_tasks = bt->n_tasks;
}

/* The expected output: each task run directly on one workspace. */
static inline void st_expected(const st_batch_t *bt, flx_sched_window_t win, float *o, float *lse)
{
    const uint32_t G = bt->G, D = bt->D;
    flx_attn_shape_t sh = {.group = G, .head_dim = D, .max_l_cpu = bt->max_l_cpu, .pool = NULL};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&sh, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_OK(flx_attn_ws_init(&ws, &sh, mem, bytes));
    const size_t rows = (size_t)bt->B * bt->Hq;
    for (size_t i = 0; i < rows * D; i++) o[i] = NAN;
    for (size_t i = 0; i < rows; i++) lse[i] = NAN;
    for (uint32_t i = 0; i < bt->n_tasks; i++) {
        const flx_sched_task_t *t = &bt->tasks[i];
        flx_attn_cfg_t cfg = {.mode = t->blk == 0 ? FLX_ATTN_FULL : t->budgets ? FLX_ATTN_SPARSE : FLX_ATTN_FIXED,
                              .blk = t->blk, .budgets = t->budgets, .budget = t->budget};
        flx_kv_head_view_t v;
        CHECK_OK(flx_kv_head_view(bt->sess[t->seq], bt->layer, t->kv_group, &v));
        const size_t r0 = (size_t)t->seq * bt->Hq + (size_t)t->kv_group * G;
        if (win == FLX_SCHED_WIN_COMPUTE) {
            CHECK_OK(flx_attn_group_run(&ws, &v, bt->q + r0 * D, &cfg, o + r0 * D, lse + r0, NULL));
        } else {
            CHECK_OK(flx_attn_host_run(&ws, &v, bt->q + r0 * D, &cfg, o + r0 * D, lse + r0, NULL));
            if (win == FLX_SCHED_WIN_GIVEN)
                flx_attn_merge(G, D, bt->o_win + r0 * D, bt->lse_win + r0, o + r0 * D, lse + r0, o + r0 * D, lse + r0);
        }
    }
    free(mem);
}

static inline flx_sched_h st_sched(const st_batch_t *bt, flx_pool_h pool, flx_sched_policy_t pol,
                                   flx_sched_placement_t place, int gpu)
{
    flx_sched_params_t p = {.field_mask = FLX_SCHED_FIELD_POLICY | FLX_SCHED_FIELD_PLACEMENT | FLX_SCHED_FIELD_GPU,
                            .pool = pool, .n_q_heads = bt->Hq, .n_kv_heads = ST_HKV, .head_dim = bt->D,
                            .max_l_cpu = bt->max_l_cpu, .max_tasks = bt->n_tasks, .policy = pol, .placement = place,
                            .use_gpu = gpu, .cuda_device = 0, .gpu_streams = 2};
    flx_sched_h s;
    CHECK_OK(flx_sched_create(&p, &s));
    return s;
}

#endif
