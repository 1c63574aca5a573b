/*
 * test_engine_fluxion - the FLUXION attention mode of the decode loop, end to end on a small random
 * model (Llama, 2 layers, 4 query heads over 2 kv heads, head_dim 64) with the real forward pass,
 * prefill statistics (flx_engine_prefill_with_stats) and the real predictor and selector.
 *
 * Predictors with known outputs make the mode checkable against the other modes (an MLP whose
 * weights are zero outputs its biases for every head):
 *   - every head retrieval with bgt0 = 1, k = 0: each group reads every host token, so the greedy
 *     tokens equal FULL's and no group is skipped;
 *   - every head streaming: every group keeps its window partial, reads nothing on the host, and
 *     the tokens equal FIXED with bgt 0 (window only); host bytes 0;
 *   - retrieval with bgt0 = 0.1, k = 0: budgets 0.1 at every blk, so Eq. 3's metadata term decides
 *     and the selector picks blk 128: tokens and host bytes equal FIXED (128, 0.1).
 * Also: a session without statistics is refused by flx_engine_add in FLUXION mode, and the
 * prefill statistics pass the store's checks (the session becomes READY). And with a predictor of
 * random weights (budgets and streaming decisions differing from head to head, tasks ordered by
 * priority), a batch of 2 sampled sequences gives the same tokens and logit bits on pools of 1, 2,
 * 3 and 7 workers, prefill statistics included (label concurrency: TSan runs it). In every run the
 * sequence's per-step statistics (flx_engine_last_seq_stats) add up to the engine's and count
 * what each case implies (streaming heads, skipped groups, blk of the host tasks).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx/predictor.h"
#include "flx_test.h"
#include "engine_testutil.h"

enum { NGEN = 8, PROMPT = 400 };

static flx_model_t *g_m;
static flx_fwd_ws_t *g_pws;
static uint32_t V;
static flx_pool_h g_pool;   /* 2 workers */

typedef flx_test_rec_t rec_t;

static uint32_t c_layers(void)
{
    return g_m->cfg.n_layers;
}

/* Host tasks of a run by blk: want[j] tasks at blk 16 << j. */
static void check_blk(const rec_t *r, uint32_t w16, uint32_t w32, uint32_t w64, uint32_t w128)
{
    const uint32_t want[4] = {w16, w32, w64, w128};
    for (int j = 0; j < 4; j++)
        if (r->sum.groups_by_blk[j] != want[j]) {
            fprintf(stderr, "host tasks at blk %d: %u, want %u\n", 16 << j, r->sum.groups_by_blk[j], want[j]);
            CHECK(0);
        }
}

static flx_kv_store_h make_store(void)
{
    flx_kv_store_params_t p = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                             FLX_KV_STORE_FIELD_WINDOW,
                               .capacity_bytes = (size_t)64 << 20, .n_layers = g_m->cfg.n_layers,
                               .n_kv_heads = g_m->cfg.n_kv_heads, .n_q_heads = g_m->cfg.n_heads,
                               .head_dim = g_m->cfg.head_dim, .sink = 16, .local = 64};
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

/* Greedy tokens of the prompt under params; returns total stats in *st_p. */
static void run(const int32_t *prompt, flx_engine_params_t ep, int with_stats, rec_t *r, flx_engine_stats_t *st_p)
{
    flx_kv_store_h store = make_store();
    flx_engine_h e;
    ep.n_threads = 2;
    ep.max_batch = 1;
    CHECK_OK(flx_engine_create(g_m, store, &ep, &e));
    float *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t sid;
    if (with_stats) CHECK_OK(flx_engine_prefill_with_stats(g_m, g_pws, store, prompt, PROMPT, 64, 0.1f, &sid, lg));
    else CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, PROMPT, 64, &sid, lg));
    flx_kv_session_info_t si;
    CHECK_OK(flx_kv_session_info(store, sid, &si));
    CHECK(si.state == FLX_KV_READY && si.l_cpu > 0);
    memset(r, 0, sizeof *r);
    flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy(),
                           .on_token = flx_test_rec_on_token, .ctx = r};
    flx_engine_seq_id_t id;
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, V), &gp, &id));
    flx_engine_seq_stats_t ss;
    CHECK_ST(flx_engine_last_seq_stats(e, id, &ss), FLX_ERR_NOT_FOUND);   /* no step yet */
    flx_status_t st;
    int guard = 0;
    do {
        st = flx_engine_step(e);
        CHECK(++guard < 100);
        CHECK_OK(flx_engine_last_seq_stats(e, id, &ss));   /* also in the step it retired */
        flx_engine_stats_t last;
        flx_engine_last_stats(e, &last);
        CHECK(ss.seq == id && ss.host_bytes == last.host_bytes);   /* batch of one */
        CHECK(ss.heads == c_layers() * g_m->cfg.n_heads && ss.groups == c_layers() * g_m->cfg.n_kv_heads);
        CHECK(ss.skipped_groups == last.n_skipped);
        r->sum.host_bytes += ss.host_bytes;
        r->sum.heads += ss.heads;
        r->sum.streaming_heads += ss.streaming_heads;
        r->sum.groups += ss.groups;
        r->sum.skipped_groups += ss.skipped_groups;
        for (int j = 0; j < 4; j++) r->sum.groups_by_blk[j] += ss.groups_by_blk[j];
    } while (st == FLX_INPROGRESS);
    CHECK_OK(st);
    CHECK(r->n == NGEN);
    flx_engine_total_stats(e, st_p);
    CHECK(r->sum.host_bytes == st_p->host_bytes);
    flx_engine_destroy(e);
    flx_kv_store_destroy(store);
    free(lg);
}

/* Two sequences (prompt and its second half) with statistics, FLUXION on pool, sampled: tokens
 * (2, NGEN) and logits (2, NGEN - 1, V); the stats of the run in *st_p. */
static void run_pool(const int32_t *prompt, flx_predictor_h pred, flx_pool_h pool, int32_t *tok, float *logits,
                     flx_engine_stats_t *st_p)
{
    flx_kv_store_h store = make_store();
    flx_fwd_shape_t fs = {.max_prompt = PROMPT, .max_batch = 1, .pool = pool};
    size_t b;
    CHECK_OK(flx_fwd_plan(g_m, &fs, &b));
    void *mem = flx_aligned_alloc(64, b);
    flx_fwd_ws_t *ws;
    CHECK_OK(flx_fwd_ws_init(g_m, &fs, mem, b, &ws));
    flx_engine_params_t ep = flx_engine_params_default();
    ep.mode = FLX_ENGINE_ATTN_FLUXION, ep.predictor = pred, ep.max_batch = 2, ep.pool = pool;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(g_m, store, &ep, &e));
    float *lg = malloc(V * sizeof *lg);
    rec_t r[2];
    for (int i = 0; i < 2; i++) {
        flx_kv_session_id_t sid;
        const uint32_t n = i ? PROMPT / 2 + 37 : PROMPT;
        CHECK_OK(flx_engine_prefill_with_stats(g_m, ws, store, prompt + (PROMPT - n), n, 64, 0.1f, &sid, lg));
        flx_sampling_params_t sp = {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 11 + (uint64_t)i};
        flx_test_add_rec(e, sid, lg, V, sp, NGEN, &r[i], logits + (size_t)i * (NGEN - 1) * V);
    }
    flx_status_t st;
    int guard = 0;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) CHECK(++guard < 100);
    CHECK_OK(st);
    for (int i = 0; i < 2; i++) {
        CHECK(r[i].n == NGEN && r[i].n_logits == NGEN - 1);
        memcpy(tok + i * NGEN, r[i].tok, NGEN * sizeof r[i].tok[0]);
    }
    flx_engine_total_stats(e, st_p);
    flx_engine_destroy(e);
    flx_kv_store_destroy(store);
    flx_aligned_free(mem);
    free(lg);
}

static void test_workers(const int32_t *prompt, uint64_t seed)
{
    const size_t nl = (size_t)2 * (NGEN - 1) * V;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    int32_t tok_ref[2 * NGEN], tok[2 * NGEN];
    flx_engine_stats_t st_ref, st;
    /* a predictor (weights, streaming-logit shift) that leaves both kinds of group, some reading the
     * host and some not: bisection of the shift between all-streaming and none (the logits' spread
     * over heads can be narrow); weights that leave no retrieval head at any shift: the next ones */
    flx_predictor_h pred = NULL;
    int found = 0;
    for (uint64_t k = 0; k < 8 && !found; k++) {
        float lo = -16.0f, hi = 16.0f;   /* lo: every group reads the host; hi: none does */
        for (int it = 0; it < 40; it++) {
            const float shift = it == 0 ? 0.0f : 0.5f * (lo + hi);
            flx_predictor_destroy(pred);
            pred = random_predictor(seed + k * 0x9E3779B97F4A7C15ull, shift);
            run_pool(prompt, pred, NULL, tok_ref, ref, &st_ref);
            if (st_ref.n_tasks > 0 && st_ref.n_skipped > 0) {
                found = 1;
                break;
            }
            if (st_ref.n_skipped == 0) lo = shift;
            else hi = shift;
        }
    }
    CHECK(found);
    for (int wi = 0; wi < 4; wi++) {
        flx_pool_h pool = flx_test_pool(FLX_TEST_WORKERS[wi]);
        run_pool(prompt, pred, pool, wi ? tok : tok_ref, wi ? got : ref, wi ? &st : &st_ref);
        flx_pool_destroy(pool);
        if (!wi) continue;
        char label[96];
        snprintf(label, sizeof label, "fluxion (random predictor) on %u workers vs 1", FLX_TEST_WORKERS[wi]);
        CHECK(memcmp(tok, tok_ref, sizeof tok) == 0);
        CHECK_SAME(label, got, ref, nl);
        CHECK(st.host_bytes == st_ref.host_bytes && st.n_skipped == st_ref.n_skipped && st.n_tasks == st_ref.n_tasks);
    }
    fprintf(stderr, "fluxion, random predictor: %llu tasks, %llu streaming-only groups, the same tokens and logits at "
            "1, 2, 3 and 7 workers\n", (unsigned long long)st_ref.n_tasks, (unsigned long long)st_ref.n_skipped);
    CHECK(st_ref.n_tasks > 0 && st_ref.n_skipped > 0);   /* both kinds of group were exercised */
    free(ref), free(got);
    flx_predictor_destroy(pred);
}

/* A sequence whose session's window values are out of range (every value of layer 0's window at
 * bf16's largest, 3.4e38: a prefill peer's bytes are hashed, not judged) gets features that are not
 * finite (the window output's norm overflows, whatever the query): that sequence alone ends with an
 * error at the first step, the other one of the batch runs to its end, and its logits of the failing
 * step are bit for bit those of the same batch without the bad values. Before, the layer failed and
 * the engine ended both. (A NaN key is no test of this: the kernels give a NaN score no weight.) */
typedef struct end_rec {
    flx_test_rec_t r;
    flx_engine_finish_t why;
} end_rec_t;

static void end_on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    end_rec_t *x = ctx;
    flx_test_rec_on_token(&x->r, seq, token, is_last, why);
    if (is_last) x->why = why;
}

static void end_on_logits(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab)
{
    flx_test_rec_on_logits(&((end_rec_t *)ctx)->r, seq, logits, vocab);
}

static void run_two_poisoned(const int32_t *prompt, flx_predictor_h pred, int poison, end_rec_t *x, float *logits)
{
    flx_kv_store_h store = make_store();
    flx_engine_params_t ep = flx_engine_params_default();
    ep.mode = FLX_ENGINE_ATTN_FLUXION, ep.predictor = pred, ep.max_batch = 2, ep.n_threads = 2;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(g_m, store, &ep, &e));
    float *lg = malloc(V * sizeof *lg);
    for (int i = 0; i < 2; i++) {
        flx_kv_session_id_t sid;
        const uint32_t n = i ? PROMPT / 2 + 37 : PROMPT;
        CHECK_OK(flx_engine_prefill_with_stats(g_m, g_pws, store, prompt + (PROMPT - n), n, 64, 0.1f, &sid, lg));
        if (poison && i == 0) {
            flx_kv_session_h h;
            CHECK_OK(flx_kv_session_acquire(store, sid, &h));
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(h, 0, 0, &v));
            CHECK(v.n_win > 0);
            for (size_t j = 0; j < (size_t)v.n_win * v.head_dim; j++) v.win_v[j] = 0x7f7f;   /* 3.4e38 */
            flx_kv_session_release(h);
        }
        memset(&x[i], 0, sizeof x[i]);
        x[i].r.logits = logits + (size_t)i * (NGEN - 1) * V, x[i].r.logits_cap = NGEN - 1;
        flx_sampling_params_t sp = {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 11 + (uint64_t)i};
        flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = sp, .on_token = end_on_token,
                               .on_logits = end_on_logits, .ctx = &x[i]};
        flx_engine_seq_id_t id;
        CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, V), &gp, &id));
    }
    flx_status_t st;
    int guard = 0;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) CHECK(++guard < 100);
    CHECK_OK(st);   /* no step failed */
    flx_engine_destroy(e);
    flx_kv_store_destroy(store);
    free(lg);
}

static void test_poisoned_session_ends_alone(const int32_t *prompt)
{
    flx_predictor_h pred = random_predictor(0x5eed, 0.0f);
    const size_t nl = (size_t)2 * (NGEN - 1) * V;
    float *ref = malloc(nl * sizeof(float)), *got = malloc(nl * sizeof(float));
    end_rec_t a[2], b[2];
    run_two_poisoned(prompt, pred, 0, a, ref);
    run_two_poisoned(prompt, pred, 1, b, got);
    CHECK(a[0].r.n == NGEN && a[1].r.n == NGEN && a[0].why == FLX_FINISH_MAX_NEW);
    /* the bad one: its first token (the prefill's), then the error of the first step */
    if (!(b[0].why == FLX_FINISH_ERROR && b[0].r.n == 1 && b[0].r.n_logits == 0))
        fprintf(stderr, "bad sequence: finish %d after %u tokens, %u logits rows\n", (int)b[0].why, b[0].r.n,
                b[0].r.n_logits);
    CHECK(b[0].why == FLX_FINISH_ERROR && b[0].r.n == 1 && b[0].r.n_logits == 0);
    /* the other: to its end; the failing step's logits as without the bad values (rows are independent) */
    CHECK(b[1].why == FLX_FINISH_MAX_NEW && b[1].r.n == NGEN);
    CHECK_SAME("the other sequence's logits of the failing step", got + (size_t)(NGEN - 1) * V,
               ref + (size_t)(NGEN - 1) * V, V);
    fprintf(stderr, "a session with window values out of range ends alone (error after %u token), the other runs its "
            "%u tokens\n", b[0].r.n, b[1].r.n);
    free(ref), free(got);
    flx_predictor_destroy(pred);
}

static void same(const rec_t *a, const rec_t *b, const char *what)
{
    for (uint32_t i = 0; i < NGEN; i++)
        if (a->tok[i] != b->tok[i]) {
            fprintf(stderr, "%s: token %u differs: %d vs %d\n", what, i, a->tok[i], b->tok[i]);
            CHECK(a->tok[i] == b->tok[i]);
        }
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_engine_fluxion"));
    flx_model_config_t c = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 256, .n_heads = 4, .n_kv_heads = 2,
                            .head_dim = 64, .ffn = 512, .vocab = 512, .max_ctx = 4096, .rms_eps = 1e-5f,
                            .rope_theta = 10000.0f};
    snprintf(c.name, sizeof c.name, "llama-2x256-d64-g2");
    CHECK_OK(flx_model_init_random(&c, flx_rng_u64(&rng), &g_m));
    V = c.vocab;
    g_pool = flx_test_pool(2);
    flx_fwd_shape_t s = {.max_prompt = PROMPT, .max_batch = 1, .pool = g_pool};
    size_t b;
    CHECK_OK(flx_fwd_plan(g_m, &s, &b));
    void *pmem = flx_aligned_alloc(64, b);
    CHECK(pmem);
    CHECK_OK(flx_fwd_ws_init(g_m, &s, pmem, b, &g_pws));
    int32_t prompt[PROMPT];
    for (uint32_t i = 0; i < PROMPT; i++) prompt[i] = (int32_t)flx_rng_below(&rng, V);

    flx_engine_stats_t st_full, st_flx, st_win, st_fix, st_x;
    rec_t full, flx, win, fix, x;
    flx_engine_params_t ep = flx_engine_params_default();
    ep.mode = FLX_ENGINE_ATTN_FULL;
    run(prompt, ep, 0, &full, &st_full);

    flx_predictor_h all = constant_predictor(1.0f, 0.0f, -20.0f);
    ep.mode = FLX_ENGINE_ATTN_FLUXION;
    ep.predictor = all;
    run(prompt, ep, 1, &flx, &st_flx);
    same(&flx, &full, "fluxion with budget 1 vs full");
    const uint32_t groups = (uint32_t)st_full.n_steps * c.n_layers * c.n_kv_heads;
    check_blk(&full, 0, 0, 0, 0);   /* FULL reads every block: no blk is chosen */
    CHECK(full.sum.streaming_heads == 0 && full.sum.skipped_groups == 0 && full.sum.groups == groups);
    CHECK(flx.sum.streaming_heads == 0 && flx.sum.skipped_groups == 0);
    CHECK(flx.sum.groups_by_blk[0] + flx.sum.groups_by_blk[1] + flx.sum.groups_by_blk[2] +
          flx.sum.groups_by_blk[3] == groups);
    CHECK(st_flx.n_skipped == 0 && st_flx.n_tasks == st_flx.n_steps * c.n_layers * c.n_kv_heads);
    CHECK(st_flx.host_bytes > 0 && st_flx.predict_ns > 0);
    /* Every task's merge with its window partial is timed; the window itself is the features' work. */
    CHECK(st_flx.merge_ns > 0 && st_flx.window_ns == 0);

    /* A session without statistics is refused in FLUXION mode, the message says why. */
    {
        flx_kv_store_h store = make_store();
        flx_engine_h e;
        CHECK_OK(flx_engine_create(g_m, store, &ep, &e));
        float *lg = malloc(V * sizeof *lg);
        flx_kv_session_id_t sid;
        CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, PROMPT, 16, &sid, lg));
        flx_gen_params_t gp = {.max_new_tokens = 2, .eos_id = -1, .sampling = flx_sampling_greedy()};
        flx_engine_seq_id_t id = 0;
        CHECK_ST(flx_engine_add(e, sid, 0, &gp, &id), FLX_ERR_STATE);
        CHECK(strstr(flx_error_msg(), "statistics") && id == 0);
        CHECK_ST(flx_engine_prefill_with_stats(g_m, g_pws, store, prompt, PROMPT, 16, 1.5f, &sid, lg), FLX_ERR_INVALID);
        free(lg);
        flx_engine_destroy(e);
        flx_kv_store_destroy(store);
    }

    flx_predictor_h stream = constant_predictor(0.5f, 0.0f, 20.0f);
    ep.predictor = stream;
    run(prompt, ep, 1, &win, &st_win);
    CHECK(st_win.host_bytes == 0 && st_win.n_tasks == 0);
    CHECK(st_win.n_skipped == (uint64_t)st_win.n_steps * c.n_layers * c.n_kv_heads);
    CHECK(win.sum.skipped_groups == groups && win.sum.streaming_heads == win.sum.heads);
    check_blk(&win, 0, 0, 0, 0);
    ep = flx_engine_params_default();
    ep.mode = FLX_ENGINE_ATTN_FIXED;
    ep.blk = 16;
    ep.bgt = 0.0f;
    run(prompt, ep, 0, &fix, &st_fix);
    same(&win, &fix, "fluxion all-streaming vs fixed bgt 0");

    flx_predictor_h tenth = constant_predictor(0.1f, 0.0f, -20.0f);
    ep.mode = FLX_ENGINE_ATTN_FLUXION;
    ep.predictor = tenth;
    run(prompt, ep, 1, &x, &st_x);
    ep.mode = FLX_ENGINE_ATTN_FIXED;
    ep.blk = 128;
    ep.bgt = 0.1f;
    ep.predictor = NULL;
    run(prompt, ep, 0, &fix, &st_fix);
    same(&x, &fix, "fluxion bgt 0.1 vs fixed (128, 0.1)");
    CHECK(st_x.host_bytes == st_fix.host_bytes);
    check_blk(&x, 0, 0, 0, groups);
    check_blk(&fix, 0, 0, 0, groups);
    CHECK(x.sum.streaming_heads == 0 && x.sum.host_bytes == fix.sum.host_bytes);

    flx_predictor_destroy(all);
    flx_predictor_destroy(stream);
    flx_predictor_destroy(tenth);
    test_workers(prompt, flx_rng_u64(&rng));
    test_poisoned_session_ends_alone(prompt);
    flx_aligned_free(pmem);
    flx_model_destroy(g_m);
    flx_pool_destroy(g_pool);
    fprintf(stderr, "test_engine_fluxion: ok\n");
    return 0;
}
