/*
 * flx/sampling.h - choosing the next token from fp32 logits: greedy, temperature, top-k, top-p.
 *
 * OVERVIEW
 * A flx_sampler_t is the per-sequence sampling state: validated parameters and a seeded RNG
 * (flx/util.h, xoshiro256**), so a sequence's draws depend only on its own seed and logits, never
 * on which other sequences share its decode batch. flx_sample() draws one token:
 *
 *   temperature == 0   greedy: argmax of the logits (ties -> the lowest token id); top_k, top_p
 *                      and the RNG are not used. So is a temperature whose 1 / T overflows a
 *                      float (below about 3e-39), greedy's limit.
 *   temperature  > 0   candidates = every token, or the top_k highest logits when top_k > 0
 *                      (ties -> lower id); p_i = softmax(logit_i / temperature) over the
 *                      candidates; when top_p < 1 the candidates shrink to the NUCLEUS: the
 *                      smallest set of the most probable candidates whose probability sums to at
 *                      least top_p (ties -> lower id); the token is drawn from p renormalised over
 *                      what is left. One uniform draw per call.
 *
 * Selection is by expected-linear three-way quickselect (deterministic pivots), not a full sort,
 * so a 150K vocabulary costs a few passes over the logits.
 *
 * SCRATCH. No allocation per call: the caller sizes scratch once with flx_sample_scratch_bytes
 * (vocab) and passes it to every call (one scratch per thread; sequences may share one when they
 * are sampled one after another).
 *
 * THREAD MODE. A sampler is used by one thread at a time. flx_sample_argmax is pure.
 */
#ifndef FLX_SAMPLING_H
#define FLX_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"
#include "flx/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_sampling_params {
    float temperature;  /* >= 0; 0 = greedy */
    uint32_t top_k;     /* 0 = off; else keep the top_k most likely tokens (capped at vocab) */
    float top_p;        /* (0, 1]; 1 = off */
    uint64_t seed;      /* seeds the sequence's RNG */
} flx_sampling_params_t;

/* Greedy parameters: temperature 0, top_k 0, top_p 1, seed 0. */
flx_sampling_params_t flx_sampling_greedy(void);

/* FLX_ERR_INVALID naming the field for temperature < 0 or not finite, top_p outside (0, 1] or NaN. */
flx_status_t flx_sampling_check(const flx_sampling_params_t *p);

typedef struct flx_sampler {
    flx_sampling_params_t p;   /* validated copy */
    uint32_t vocab;
    flx_rng_t rng;
} flx_sampler_t;

/* Validates p and seeds the RNG; vocab >= 1. *s is written only on success. */
flx_status_t flx_sampler_init(flx_sampler_t *s, const flx_sampling_params_t *p, uint32_t vocab);

/* Bytes of scratch flx_sample needs for a vocabulary (indices + probabilities). */
size_t flx_sample_scratch_bytes(uint32_t vocab);

/* Draws one token from logits (s->vocab). FLX_ERR_INVALID when scratch is too small or when the
 * logits hold NaN or no finite value (a broken forward pass must not turn into a token). The RNG
 * advances only on non-greedy draws. *token_p written only on success. */
flx_status_t flx_sample(flx_sampler_t *s, const float *logits, void *scratch, size_t scratch_bytes, int32_t *token_p);

/* Index of the largest of x[0..n) (ties -> lowest index; NaN never wins unless all are NaN, then 0). */
uint32_t flx_sample_argmax(const float *x, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif
