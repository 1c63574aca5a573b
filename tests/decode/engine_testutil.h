/*
 * engine_testutil.h - helpers shared by the engine tests (test_engine_fluxion.c, test_engine_gpu.c,
 * test_engine_sched.c).
 */
#ifndef FLX_ENGINE_TESTUTIL_H
#define FLX_ENGINE_TESTUTIL_H

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

#endif
