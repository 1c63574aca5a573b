/*
 * engine_testutil.h - helpers shared by the engine tests (test_engine.c, test_engine_fluxion.c,
 * test_engine_gpu.c, test_engine_sched.c).
 */
#ifndef FLX_ENGINE_TESTUTIL_H
#define FLX_ENGINE_TESTUTIL_H

#include <stdlib.h>
#include <string.h>

#include "flx/engine.h"
#include "flx/predictor.h"
#include "flx_test.h"

enum { FLX_TEST_REC_MAX = 64 };

/* One sequence's generation as its callbacks saw it: the first FLX_TEST_REC_MAX tokens, how many
 * logits rows came (n_logits) and, where logits is set, the first logits_cap of them as (., vocab)
 * rows there; sum: the sequence's statistics summed over its steps (for tests that add them). */
typedef struct flx_test_rec {
    int32_t tok[FLX_TEST_REC_MAX];
    uint32_t n, n_logits, logits_cap;
    float *logits;
    flx_engine_seq_stats_t sum;
} flx_test_rec_t;

static inline void flx_test_rec_on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last,
                                         flx_engine_finish_t why)
{
    (void)seq, (void)is_last, (void)why;
    flx_test_rec_t *r = ctx;
    if (token >= 0 && r->n < FLX_TEST_REC_MAX) r->tok[r->n++] = token;
}

static inline void flx_test_rec_on_logits(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab)
{
    (void)seq;
    flx_test_rec_t *r = ctx;
    if (r->logits && r->n_logits < r->logits_cap) memcpy(r->logits + (size_t)r->n_logits * vocab, logits, vocab * sizeof *logits);
    r->n_logits++;
}

/* Adds a prefilled session to e as a sampled sequence of ngen tokens recorded in r (reset here):
 * its first token is the argmax of first_logits (vocab), the next ngen - 1 logits rows land in
 * logits (ngen - 1, vocab). */
static inline void flx_test_add_rec(flx_engine_h e, flx_kv_session_id_t sid, const float *first_logits, uint32_t vocab,
                                    flx_sampling_params_t sp, uint32_t ngen, flx_test_rec_t *r, float *logits)
{
    flx_gen_params_t gp = {.max_new_tokens = ngen, .eos_id = -1, .sampling = sp, .on_token = flx_test_rec_on_token,
                           .on_logits = flx_test_rec_on_logits, .ctx = r};
    memset(r, 0, sizeof *r);
    r->logits = logits, r->logits_cap = ngen - 1;
    flx_engine_seq_id_t id;
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(first_logits, vocab), &gp, &id));
}

/* A predictor whose every head predicts (bgt0, k) and the streaming logit stream_logit: zero
 * weights, the targets' means and the s output's bias set. */
static inline flx_predictor_h constant_predictor(float bgt0, float k, float stream_logit)
{
    flx_mlp_t m;
    CHECK_OK(flx_mlp_alloc(&m));
    m.target_mean[0] = bgt0;
    m.target_mean[1] = k;
    m.b4[2] = stream_logit;
    flx_predictor_h p;
    CHECK_OK(flx_predictor_create(&m, &p));
    flx_mlp_free(&m);
    return p;
}

/* A predictor of random weights (fan-in scaled) whose outputs differ from head to head: budgets
 * around 0.2, the streaming logit shifted by s_bias; features scaled by 50 so none saturates. */
static inline flx_predictor_h random_predictor(uint64_t seed, float s_bias)
{
    flx_mlp_t m;
    CHECK_OK(flx_mlp_alloc(&m));
    flx_rng_t r;
    flx_rng_seed(&r, seed);
    for (int i = 0; i < FLX_PRED_IN; i++) m.feature_std[i] = 50.0f;
    const struct { float *w; size_t n, fan; } layers[4] = {
        {m.w1, (size_t)FLX_PRED_H1 * FLX_PRED_IN, FLX_PRED_IN}, {m.w2, (size_t)FLX_PRED_H2 * FLX_PRED_H1, FLX_PRED_H1},
        {m.w3, (size_t)FLX_PRED_H3 * FLX_PRED_H2, FLX_PRED_H2}, {m.w4, (size_t)FLX_PRED_OUT * FLX_PRED_H3, FLX_PRED_H3}};
    for (int l = 0; l < 4; l++)
        for (size_t i = 0; i < layers[l].n; i++)
            layers[l].w[i] = (float)(flx_rng_normal(&r) * 2.0 / sqrt((double)layers[l].fan));
    m.target_mean[0] = 0.2f, m.target_std[0] = 0.1f;
    m.target_mean[1] = 0.02f, m.target_std[1] = 0.01f;
    m.b4[2] = s_bias;
    flx_predictor_h p;
    CHECK_OK(flx_predictor_create(&m, &p));
    flx_mlp_free(&m);
    return p;
}

/* One prompt's prefill as its sink received it (flx_engine_prefill_run): every layer's K, V and,
 * when computed, statistics, and the last position's logits. A test that decodes the same prompt in
 * many runs prefills it once and lands it into each run's store (flx_test_prefilled_land) through
 * the in-process sink's own body, flx_engine_store_layer; under TSan a prefill costs seconds. */
enum { FLX_TEST_MAX_LAYERS = 8 };

typedef struct flx_test_prefilled {
    const flx_model_config_t *cfg;
    uint32_t n;
    flx_bf16_t *k[FLX_TEST_MAX_LAYERS], *v[FLX_TEST_MAX_LAYERS];
    flx_head_stats_t *stats[FLX_TEST_MAX_LAYERS];   /* NULL without statistics */
    float *mean_k[FLX_TEST_MAX_LAYERS], *q_anchor[FLX_TEST_MAX_LAYERS], *logits;
} flx_test_prefilled_t;

static inline void *flx_test_dup(const void *p, size_t bytes)
{
    void *d = malloc(bytes);
    CHECK(d);
    memcpy(d, p, bytes);
    return d;
}

static inline flx_status_t flx_test_prefilled_keep(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k,
                                                   const flx_bf16_t *v, const flx_head_stats_t *stats,
                                                   const float *mean_k, const float *q_anchor)
{
    flx_test_prefilled_t *pf = ctx;
    const size_t kv = (size_t)pf->cfg->n_kv_heads * n * pf->cfg->head_dim * sizeof *k;
    const size_t qd = (size_t)pf->cfg->n_heads * pf->cfg->head_dim * sizeof(float);
    CHECK(layer < FLX_TEST_MAX_LAYERS);
    pf->n = n;
    pf->k[layer] = flx_test_dup(k, kv), pf->v[layer] = flx_test_dup(v, kv);
    if (stats) {
        pf->stats[layer] = flx_test_dup(stats, pf->cfg->n_heads * sizeof *stats);
        pf->mean_k[layer] = flx_test_dup(mean_k, qd), pf->q_anchor[layer] = flx_test_dup(q_anchor, qd);
    }
    return FLX_OK;
}

/* tokens[0, n) prefilled with ws into *pf (zeroed here): tau < 0 without statistics, else with them
 * for a store of window sink / local (flx_prefill_out_t). */
static inline void flx_test_prefill_keep(const flx_model_t *m, flx_fwd_ws_t *ws, const int32_t *tokens, uint32_t n,
                                         float tau, uint32_t sink, uint32_t local, flx_test_prefilled_t *pf)
{
    CHECK(m->cfg.n_layers <= FLX_TEST_MAX_LAYERS);
    memset(pf, 0, sizeof *pf);
    pf->cfg = &m->cfg;
    pf->logits = malloc(m->cfg.vocab * sizeof(float));
    CHECK(pf->logits);
    flx_prefill_out_t out = {.on_layer = flx_test_prefilled_keep, .ctx = pf, .tau = tau, .sink = sink, .local = local};
    CHECK_OK(flx_engine_prefill_run(m, ws, tokens, n, &out, pf->logits));
    CHECK(pf->n == n);
}

/* *pf into a new session of store (room for max_new tokens), READY; its logits into lg (vocab). */
static inline flx_kv_session_id_t flx_test_prefilled_land(flx_kv_store_h store, const flx_test_prefilled_t *pf,
                                                          uint32_t max_new, float *lg)
{
    flx_kv_session_params_t sp = {.prompt_len = pf->n, .max_new_tokens = max_new,
                                  .flags = pf->stats[0] ? 0 : FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(store, &sp, &sid));
    for (uint32_t l = 0; l < pf->cfg->n_layers; l++)
        CHECK_OK(flx_engine_store_layer(store, sid, l, pf->n, pf->k[l], pf->v[l], pf->stats[l], pf->mean_k[l],
                                        pf->q_anchor[l]));
    flx_kv_session_info_t info;
    CHECK_OK(flx_kv_session_info(store, sid, &info));
    CHECK(info.state == FLX_KV_READY);
    memcpy(lg, pf->logits, pf->cfg->vocab * sizeof *lg);
    return sid;
}

/* 1 when a and b (prefills of the same prompt) hold the same K, V and logits bits. */
static inline int flx_test_prefilled_same(const flx_test_prefilled_t *a, const flx_test_prefilled_t *b)
{
    if (a->n != b->n || memcmp(a->logits, b->logits, a->cfg->vocab * sizeof(float))) return 0;
    const size_t kv = (size_t)a->cfg->n_kv_heads * a->n * a->cfg->head_dim * sizeof(flx_bf16_t);
    for (uint32_t l = 0; l < a->cfg->n_layers; l++)
        if (memcmp(a->k[l], b->k[l], kv) || memcmp(a->v[l], b->v[l], kv)) return 0;
    return 1;
}

static inline void flx_test_prefilled_free(flx_test_prefilled_t *pf)
{
    for (uint32_t l = 0; l < FLX_TEST_MAX_LAYERS; l++) {
        free(pf->k[l]), free(pf->v[l]), free(pf->stats[l]);
        free(pf->mean_k[l]), free(pf->q_anchor[l]);
    }
    free(pf->logits);
    memset(pf, 0, sizeof *pf);
}

#endif
