/*
 * test_engine_gpu - the decode loop's GPU path (flx/engine.h, use_gpu) against its CPU path, greedy
 * decoding on the same prompts (label gpu; 77 where no CUDA device is usable):
 *   test_engine_gpu          random models (Llama G4 D64; Qwen2 G8 D128 with biases), prompts of
 *                            700-1000 tokens (a non-empty host segment behind sink 64 + local 256):
 *     (a) prefill on the device into a store with device windows (flx_engine_prefill_gpu) and on the
 *         CPU into a host-window store: first logits agree, both sessions READY;
 *     (b) FULL, FIXED (16, 0) (the window alone: the device partial merged with an empty host
 *         part), FIXED (128, 1), FLUXION (a constant predictor, every head retrieval at budget 1;
 *         statistics pushed by the GPU prefill), and FIXED (16, 0.05): the GPU engine's tokens
 *         equal the CPU engine's and its step logits are within 5e-3 RMS + 1e-3 relative;
 *     (c) continuous batching on the GPU path (FULL): three sequences, max_batch 2, joining at
 *         different steps, each gets the tokens the CPU path gives it;
 *     (d) the GPU engine reports its window time, host tasks and host bytes.
 *   test_engine_gpu model    the same comparison (a, b without FLUXION) on SmolLM2-135M-Instruct from
 *                            the setup cache (labels gpu and model; 77 when the file is absent).
 *
 * Tolerances: the two paths differ by fp32 summation order, and by the few K/V values within fp32
 * rounding of a bf16 midpoint that each side rounds its own way (test_forward_gpu holds the GPU
 * forward to a reference that takes its choices; here the CPU path is the reference): logits
 * within 5e-3 RMS + 1e-3 relative. A token may differ only where the CPU logits' top two are
 * closer than that; such a step is reported and the comparison of that sequence stops there (its
 * later tokens follow other inputs). FIXED (16, 0.05) selects blocks by their Quest scores of q,
 * and the two paths' q differ by ~1e-6 relative: where two blocks' scores are that close at the
 * top-k boundary, the paths may read a different block, both correctly; so that mode is held to
 * 3e-2 RMS. A misplaced or missing window, merge or host part moves logits by O(0.1 .. 1) RMS.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/cuda_rt.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/forward_gpu.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/tokenizer.h"
#include "flx_test.h"
#include "engine_testutil.h"

enum { NGEN = 8, MAXP = 1100 };
#define TOL 5e-3   /* x RMS(logits): GPU path vs CPU path, selection-free modes */
/* The real model: 30 layers over an 891-token prompt, where the two paths' different rounding (the
 * GPU's products take bf16 hi/lo pairs, its kernels sum in another order) compounds. On an H100
 * (2026-11-25) the prefill's first logits differed by 0.0235 at worst, 0.008 RMS: 1.5x TOL. An
 * error of a whole layer or position is of the order of the RMS itself and still fails. */
#define TOL_REAL 2e-2

static flx_rng_t rng;

typedef struct rec {
    int32_t tok[NGEN];
    float *first;         /* (vocab) the prefill's logits (token 0) */
    float *logits;        /* (NGEN - 1, vocab) step logits */
    uint32_t n, n_logits, vocab;
    int done;
} rec_t;

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    rec_t *r = ctx;
    CHECK(!r->done);
    if (token >= 0 && r->n < NGEN) r->tok[r->n++] = token;
    if (is_last) r->done = 1;
}

static void on_logits(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab)
{
    rec_t *r = ctx;
    CHECK(r->n_logits < NGEN - 1);
    memcpy(r->logits + (size_t)r->n_logits++ * vocab, logits, vocab * sizeof *logits);
}

/* Both sides of the comparison: a model, its device copy, prefill workspaces, two stores. */
typedef struct side {
    flx_model_t *m;
    flx_gpu_model_h gm;
    void *cmem, *dmem, *hmem;
    flx_fwd_ws_t *cws;
    flx_gpu_fwd_ws_h gws;
    flx_cuda_stream_t stream;
} side_t;

static void side_open(side_t *s, flx_model_t *m)
{
    s->m = m;
    flx_fwd_shape_t cs = {.max_prompt = MAXP, .max_batch = 1, .pool = NULL};   /* the CPU side on this thread */
    size_t b, db, hb;
    CHECK_OK(flx_fwd_plan(m, &cs, &b));
    s->cmem = flx_aligned_alloc(64, b);
    CHECK(s->cmem);
    CHECK_OK(flx_fwd_ws_init(m, &cs, s->cmem, b, &s->cws));
    CHECK_OK(flx_gpu_model_create(m, 0, &s->gm));
    flx_gpu_fwd_shape_t gs = {.max_prompt = MAXP, .max_batch = 1};
    CHECK_OK(flx_gpu_fwd_plan(m, &gs, &db, &hb));
    CHECK_OK(flx_cuda_malloc(0, db, &s->dmem));
    CHECK_OK(flx_cuda_host_alloc(hb, &s->hmem));
    CHECK_OK(flx_gpu_fwd_ws_create(s->gm, &gs, s->dmem, db, s->hmem, hb, &s->gws));
    CHECK_OK(flx_cuda_stream_create(0, &s->stream));
}

static void side_close(side_t *s)
{
    flx_cuda_stream_destroy(0, s->stream);
    flx_gpu_fwd_ws_destroy(s->gws);
    CHECK_OK(flx_cuda_free(0, s->dmem));
    flx_cuda_host_free(s->hmem);
    flx_gpu_model_destroy(s->gm);
    flx_aligned_free(s->cmem);
}

static flx_kv_store_h make_store(const flx_model_config_t *c, int device_windows)
{
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                              FLX_KV_STORE_FIELD_FLAGS,
                                .capacity_bytes = (size_t)512 << 20, .n_layers = c->n_layers,
                                .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads, .head_dim = c->head_dim,
                                .flags = FLX_KV_STORE_HUGEPAGES |
                                         (device_windows ? FLX_KV_STORE_WINDOW_DEVICE | FLX_KV_STORE_PIN_CUDA : 0u)};
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&kp, &s));
    flx_kv_store_info_t si;
    flx_kv_store_info(s, &si);
    CHECK(si.window_on_device == device_windows);
    return s;
}

static double rms(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s / (double)n);
}

/* GPU tokens and logits vs CPU ones (see the header: a token may differ only at a near tie). */
static void compare(const char *label, const rec_t *g, const rec_t *c, uint32_t V, double tol)
{
    CHECK(g->n == c->n && g->n >= 1);
    for (uint32_t i = 0; i < c->n; i++) {
        /* token 0 comes from the prefill logits, token i > 0 from decode step i */
        const float *lc = i ? c->logits + (size_t)(i - 1) * V : c->first;
        const float *lg = i ? g->logits + (size_t)(i - 1) * V : g->first;
        const double atol = tol * rms(lc, V), rtol = 1e-3;
        char l2[160];
        snprintf(l2, sizeof l2, "%s logits of token %u", label, i);
        CHECK_CLOSE(l2, lg, lc, V, atol, rtol);
        if (g->tok[i] != c->tok[i]) {
            const double gap = fabs((double)lc[g->tok[i]] - lc[c->tok[i]]);
            fprintf(stderr, "%s: token %u is %d on the GPU, %d on the CPU; CPU logit gap %.3g\n", label, i, g->tok[i],
                    c->tok[i], gap);
            CHECK(gap <= 2 * (atol + rtol * fabs((double)lc[c->tok[i]])));
            return;
        }
    }
}

/* Runs the prompts through one engine (sequence s joins before step join[s]); recs get the tokens. */
static void run_engine(side_t *sd, flx_kv_store_h store, int gpu, flx_engine_params_t ep, const int32_t *const *prompts,
                       const uint32_t *lens, const uint32_t *join, uint32_t n_seq, float tau, rec_t *recs,
                       flx_engine_stats_t *stats)
{
    const uint32_t V = sd->m->cfg.vocab;
    ep.use_gpu = gpu;
    ep.gpu_model = gpu ? sd->gm : NULL;
    ep.n_threads = 2;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(sd->m, store, &ep, &e));
    uint32_t added = 0;
    for (uint32_t step = 0; added < n_seq || flx_engine_n_live(e); step++) {
        CHECK(step < 100);
        for (uint32_t s = 0; s < n_seq; s++) {
            if (join[s] != step) continue;
            rec_t *r = &recs[s];
            float *first = r->first, *keep = r->logits;
            memset(r, 0, sizeof *r);
            r->first = first, r->logits = keep, r->vocab = V;
            flx_kv_session_id_t sid;
            if (gpu)
                CHECK_OK(flx_engine_prefill_gpu(sd->gm, sd->gws, sd->stream, store, prompts[s], lens[s], NGEN, tau,
                                                &sid, first));
            else if (tau > 0)
                CHECK_OK(flx_engine_prefill_with_stats(sd->m, sd->cws, store, prompts[s], lens[s], NGEN, tau, &sid,
                                                       first));
            else
                CHECK_OK(flx_engine_prefill_into_store(sd->m, sd->cws, store, prompts[s], lens[s], NGEN, &sid, first));
            flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy(),
                                   .on_token = on_token, .on_logits = on_logits, .ctx = r};
            flx_engine_seq_id_t id;
            CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(first, V), &gp, &id));
            added++;
        }
        flx_status_t st = flx_engine_step(e);
        CHECK(st == FLX_OK || st == FLX_INPROGRESS);
    }
    for (uint32_t s = 0; s < n_seq; s++) CHECK(recs[s].done && recs[s].n == NGEN);
    flx_engine_total_stats(e, stats);
    flx_engine_destroy(e);
}

/* (a) */
static void check_prefill(side_t *sd, const int32_t *prompt, uint32_t n, double tol)
{
    const uint32_t V = sd->m->cfg.vocab;
    flx_kv_store_h sc = make_store(&sd->m->cfg, 0), sg = make_store(&sd->m->cfg, 1);
    float *lc = malloc(V * sizeof *lc), *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t a, b;
    CHECK_OK(flx_engine_prefill_into_store(sd->m, sd->cws, sc, prompt, n, 4, &a, lc));
    CHECK_OK(flx_engine_prefill_gpu(sd->gm, sd->gws, sd->stream, sg, prompt, n, 4, 0.1f, &b, lg));
    flx_kv_session_info_t ia, ib;
    CHECK_OK(flx_kv_session_info(sc, a, &ia));
    CHECK_OK(flx_kv_session_info(sg, b, &ib));
    CHECK(ia.state == FLX_KV_READY && ib.state == FLX_KV_READY && ib.device_bytes > 0 && ia.l_cpu == ib.l_cpu);
    CHECK_CLOSE("gpu prefill into store: first logits", lg, lc, V, tol * rms(lc, V), 1e-3);
    free(lc), free(lg);
    flx_kv_store_destroy(sc);
    flx_kv_store_destroy(sg);
}

static void test_random(const flx_model_config_t *c)
{
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(c, flx_rng_u64(&rng), &m));
    side_t sd;
    side_open(&sd, m);
    const uint32_t V = c->vocab;
    int32_t *prompts[3];
    uint32_t lens[3];
    for (int s = 0; s < 3; s++) {
        lens[s] = 700 + (uint32_t)flx_rng_below(&rng, 300);
        prompts[s] = malloc(lens[s] * sizeof **prompts);
        for (uint32_t i = 0; i < lens[s]; i++) prompts[s][i] = (int32_t)flx_rng_below(&rng, V);
    }
    check_prefill(&sd, prompts[0], lens[0], TOL);

    rec_t rc[3], rg[3];
    for (int s = 0; s < 3; s++) {
        rc[s].logits = malloc((size_t)(NGEN - 1) * V * sizeof(float));
        rg[s].logits = malloc((size_t)(NGEN - 1) * V * sizeof(float));
        rc[s].first = malloc(V * sizeof(float));
        rg[s].first = malloc(V * sizeof(float));
    }
    flx_predictor_h all = constant_predictor(1.0f, 0.0f, -20.0f);
    struct { flx_engine_attn_mode_t mode; uint32_t blk; float bgt; double tol; } modes[] = {
        {FLX_ENGINE_ATTN_FULL, 16, 1.0f, TOL},    {FLX_ENGINE_ATTN_FIXED, 16, 0.0f, TOL},
        {FLX_ENGINE_ATTN_FIXED, 128, 1.0f, TOL},  {FLX_ENGINE_ATTN_FLUXION, 16, 1.0f, TOL},
        {FLX_ENGINE_ATTN_FIXED, 16, 0.05f, 3e-2},
    };
    const uint32_t join0[1] = {0};
    for (size_t mi = 0; mi < FLX_ARRAY_SIZE(modes); mi++) {
        flx_engine_params_t ep = flx_engine_params_default();
        ep.mode = modes[mi].mode, ep.blk = modes[mi].blk, ep.bgt = modes[mi].bgt, ep.max_batch = 1;
        const int fluxion = modes[mi].mode == FLX_ENGINE_ATTN_FLUXION;
        if (fluxion) ep.predictor = all;
        const float tau = fluxion ? 0.1f : -1.0f;
        flx_kv_store_h sc = make_store(c, 0), sg = make_store(c, 1);
        flx_engine_stats_t tc, tg;
        run_engine(&sd, sc, 0, ep, (const int32_t *const *)prompts, lens, join0, 1, tau, rc, &tc);
        run_engine(&sd, sg, 1, ep, (const int32_t *const *)prompts, lens, join0, 1, tau, rg, &tg);
        char label[160];
        snprintf(label, sizeof label, "%s %s(%u, %g)", c->name, flx_engine_attn_mode_name(modes[mi].mode),
                 modes[mi].blk, (double)modes[mi].bgt);
        compare(label, &rg[0], &rc[0], V, modes[mi].tol);
        /* (d) */
        CHECK(tg.n_steps == tc.n_steps && tg.n_tasks == tc.n_tasks && tg.n_tasks > 0);
        CHECK(modes[mi].bgt == 0.0f ? tg.host_bytes == 0 : tg.host_bytes > 0);
        if (!fluxion) CHECK(tg.window_ns > 0);
        fprintf(stderr, "%s: tokens ok; per step: GPU %.2f ms (dense %.2f, attention %.2f), CPU %.2f ms\n", label,
                tg.step_ns / 1e6 / tg.n_steps, tg.dense_ns / 1e6 / tg.n_steps, tg.attn_ns / 1e6 / tg.n_steps,
                tc.step_ns / 1e6 / tc.n_steps);
        flx_kv_store_destroy(sc);
        flx_kv_store_destroy(sg);
    }
    /* (c) continuous batching: three sequences, max_batch 2, joining at steps 0, 0 and 2 */
    {
        flx_engine_params_t ep = flx_engine_params_default();
        ep.mode = FLX_ENGINE_ATTN_FULL, ep.max_batch = 2, ep.max_seqs = 3;
        const uint32_t join[3] = {0, 0, 2};
        flx_kv_store_h sc = make_store(c, 0), sg = make_store(c, 1);
        flx_engine_stats_t tc, tg;
        run_engine(&sd, sc, 0, ep, (const int32_t *const *)prompts, lens, join, 3, -1.0f, rc, &tc);
        run_engine(&sd, sg, 1, ep, (const int32_t *const *)prompts, lens, join, 3, -1.0f, rg, &tg);
        for (int s = 0; s < 3; s++) {
            char label[160];
            snprintf(label, sizeof label, "%s batching sequence %d", c->name, s);
            compare(label, &rg[s], &rc[s], V, TOL);
        }
        flx_kv_store_destroy(sc);
        flx_kv_store_destroy(sg);
    }
    flx_predictor_destroy(all);
    for (int s = 0; s < 3; s++) free(rc[s].logits), free(rg[s].logits), free(rc[s].first), free(rg[s].first);
    for (int s = 0; s < 3; s++) free(prompts[s]);
    side_close(&sd);
    flx_model_destroy(m);
}

static int test_real_model(void)
{
    char path[1024];
    if (!flx_test_model_path("test_engine_gpu model", path, sizeof path)) return FLX_TEST_SKIP;
    flx_model_t *m;
    flx_tok_h tok;
    CHECK_OK(flx_model_load(path, &m));
    CHECK_OK(flx_tok_load(path, &tok));
    const uint32_t V = m->cfg.vocab;
    char text[4096];
    size_t len = 0;
    for (int i = 1; i <= 200; i++) len += (size_t)snprintf(text + len, sizeof text - len, "%d, ", i);
    text[--len] = 0;
    size_t n_ids;
    int32_t *ids = malloc(MAXP * sizeof *ids);
    CHECK_OK(flx_tok_encode(tok, text, len, 0, ids, MAXP, &n_ids));
    uint32_t n = (uint32_t)n_ids;
    side_t sd;
    side_open(&sd, m);
    check_prefill(&sd, ids, n, TOL_REAL);
    rec_t rc, rg;
    rc.logits = malloc((size_t)(NGEN - 1) * V * sizeof(float));
    rg.logits = malloc((size_t)(NGEN - 1) * V * sizeof(float));
    rc.first = malloc(V * sizeof(float));
    rg.first = malloc(V * sizeof(float));
    /* fixed (16, 0.05): the random models' 3e-2 for the selection, plus TOL_REAL */
    struct { flx_engine_attn_mode_t mode; float bgt; double tol; } modes[] = {{FLX_ENGINE_ATTN_FULL, 1.0f, TOL_REAL},
                                                                              {FLX_ENGINE_ATTN_FIXED, 0.05f, 5e-2}};
    const uint32_t join0[1] = {0};
    const int32_t *pp[1] = {ids};
    for (size_t mi = 0; mi < FLX_ARRAY_SIZE(modes); mi++) {
        flx_engine_params_t ep = flx_engine_params_default();
        ep.mode = modes[mi].mode, ep.blk = 16, ep.bgt = modes[mi].bgt, ep.max_batch = 1;
        flx_kv_store_h sc = make_store(&m->cfg, 0), sg = make_store(&m->cfg, 1);
        flx_engine_stats_t tc, tg;
        run_engine(&sd, sc, 0, ep, pp, &n, join0, 1, -1.0f, &rc, &tc);
        run_engine(&sd, sg, 1, ep, pp, &n, join0, 1, -1.0f, &rg, &tg);
        char out[512], label[96];
        size_t ol;
        CHECK_OK(flx_tok_decode(tok, rg.tok, NGEN, FLX_TOK_SKIP_SPECIAL, out, sizeof out, &ol));
        snprintf(label, sizeof label, "SmolLM2 %s(16, %g)", flx_engine_attn_mode_name(modes[mi].mode),
                 (double)modes[mi].bgt);
        fprintf(stderr, "%s on the GPU: \"...200,\" -> \"%s\"; TPOT GPU %.2f ms, CPU %.2f ms\n", label, out,
                tg.step_ns / 1e6 / tg.n_steps, tc.step_ns / 1e6 / tc.n_steps);
        compare(label, &rg, &rc, V, modes[mi].tol);
        flx_kv_store_destroy(sc);
        flx_kv_store_destroy(sg);
    }
    free(rc.logits), free(rg.logits), free(rc.first), free(rg.first), free(ids);
    side_close(&sd);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    fprintf(stderr, "test_engine_gpu model: ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_engine_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_engine_gpu"));
    if (argc > 1 && strcmp(argv[1], "model") == 0) return test_real_model();
    flx_model_config_t c1 = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 256, .n_heads = 8, .n_kv_heads = 2,
                             .head_dim = 64, .ffn = 512, .vocab = 512, .max_ctx = 4096, .rms_eps = 1e-5f,
                             .rope_theta = 10000.0f};
    snprintf(c1.name, sizeof c1.name, "llama-G4-D64");
    flx_model_config_t c2 = {.arch = FLX_ARCH_QWEN2, .n_layers = 2, .hidden = 256, .n_heads = 8, .n_kv_heads = 1,
                             .head_dim = 128, .ffn = 384, .vocab = 400, .max_ctx = 4096, .rms_eps = 1e-6f,
                             .rope_theta = 1e6f, .qkv_bias = 1, .tied_embeddings = 1};
    snprintf(c2.name, sizeof c2.name, "qwen2-G8-D128");
    test_random(&c1);
    test_random(&c2);
    fprintf(stderr, "test_engine_gpu: ok\n");
    return 0;
}
