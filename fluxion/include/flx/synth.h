/*
 * flx/synth.h - the structured synthetic workload: KV, anchor query and decode-query trajectories
 * for any model shape and prompt length, with the head behaviour of real long-context models and
 * its ground truth exposed. Used by tests, benchmarks, predictor training and the prefill stub.
 *
 * OUTPUT: per layer, the arrays of flx/kvsource.h (k, v (Hkv, T, D) bf16 with RoPE applied, T =
 * prompt_len + n_steps; q (Hq, n_steps + 1, D) fp32, row 0 = anchor q'). Any layer can be generated
 * alone: every random stream is seeded from (seed, layer, head, purpose), so a layer's arrays do not
 * depend on which other layers were generated, nor on the thread count.
 *
 * STRUCTURE (see docs/synthetic.md for the model, the knobs, the citations and the calibration
 * against SmolLM2-135M)
 *   sinks        the first n_sink_tokens tokens of every head get keys that every query matches
 *                strongly (large scores) and small value norms (paper §4.1.1)
 *   kinds        each query head is STREAMING or RETRIEVAL; retrieval_share of the heads of a layer
 *                (rounded, spread over groups) are retrieval; heads of one GQA group may differ
 *   streaming    queries put their mass on the sinks and the most recent tokens
 *   retrieval    queries additionally match "needles": a few spans of host-region tokens whose keys
 *                carry a head-specific direction; the active needles move every move_every steps
 *                and differ between the heads of a group; spans start at multiples of needle_len
 *                from host_begin (block-aligned in the store's host region with the defaults)
 *   values       value norms grow with depth (value_norm_base * (1 + value_norm_growth * l / (n_layers-1)))
 *   z-scores     the bulk of <q, k_i> / (||q|| sqrt(D)) over host keys is roughly normal
 */
#ifndef FLX_SYNTH_H
#define FLX_SYNTH_H

#include <stdint.h>

#include "flx/bf16.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FLX_SYNTH_STREAMING = 0, FLX_SYNTH_RETRIEVAL = 1 } flx_synth_kind_t;

typedef struct flx_synth_params {
    /* shape */
    uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    uint32_t prompt_len, n_steps;
    uint64_t seed;
    float rope_theta;            /* RoPE base (500000, Llama-3.1) */
    /* structure knobs (flx_synth_defaults sets the documented profile) */
    float retrieval_share;       /* share of retrieval heads, default 0.5 (DuoAttention) */
    uint32_t n_sink_tokens;      /* tokens that carry the sink */
    float sink_strength;         /* score of token 0 for a query (units of <q,k>/sqrt(D)) */
    float sink_tail;             /* sink tokens 1..n_sink_tokens-1 carry this share of the sink key */
    float sink_value_scale;      /* sink value norm relative to others */
    uint32_t recent_span;        /* tokens before the query that streaming mass favours */
    float recent_strength;       /* score bonus at distance 0, decaying over ~recent_span (RoPE kernel) */
    uint32_t needle_sites;       /* needle spans per retrieval head in the host region */
    uint32_t needle_len;         /* tokens per needle span */
    uint32_t needles_active;     /* active needles per step */
    uint32_t move_every;         /* steps between needle moves */
    float needle_strength;       /* score of an active needle token for its head */
    float needle_value_coherence;/* share of a needle token's value along its site's common direction */
    float head_jitter;           /* per-head spread (std, score units) of the sink/recency/needle strengths */
    float value_norm_base, value_norm_growth;
    float noise;                 /* key/query isotropic noise (sets the z-score spread) */
    uint32_t host_begin;         /* needles are placed in prompt positions [host_begin, prompt_len - host_end_margin) */
    uint32_t host_end_margin;    /* defaults: the store's sink 64 and local 256 */
} flx_synth_params_t;

/* The default profile for a shape and length (documented in docs/synthetic.md). */
void flx_synth_defaults(flx_synth_params_t *p, uint32_t n_layers, uint32_t n_q_heads, uint32_t n_kv_heads,
                        uint32_t head_dim, uint32_t prompt_len, uint32_t n_steps, uint64_t seed);

typedef struct flx_synth flx_synth_t;

/* Checks every knob (names the bad one) and prepares the generator. */
flx_status_t flx_synth_create(const flx_synth_params_t *p, flx_synth_t **syn_p);
void flx_synth_destroy(flx_synth_t *syn);
const flx_synth_params_t *flx_synth_params(const flx_synth_t *syn);

/* Layer l arrays (flx/kvsource.h layouts), kv groups on pool's workers (NULL: the caller alone);
 * the arrays do not depend on the pool (every random stream is keyed by seed, layer, head). */
flx_status_t flx_synth_layer(const flx_synth_t *syn, uint32_t layer, flx_bf16_t *k, flx_bf16_t *v, float *q,
                             flx_pool_h pool);

/* Mean value norm of layer l's non-sink tokens: value_norm_base * (1 + growth * l / (n_layers - 1)). */
float flx_synth_value_norm(const flx_synth_t *syn, uint32_t layer);

/* Ground truth. */
flx_synth_kind_t flx_synth_head_kind(const flx_synth_t *syn, uint32_t layer, uint32_t q_head);
/* Active needle spans of (layer, q_head) at decode step `step` (0-based; step -1 = the anchor q'):
 * writes up to max spans [begin[i], end[i]) in prompt positions, returns how many (0 for streaming). */
uint32_t flx_synth_needles(const flx_synth_t *syn, uint32_t layer, uint32_t q_head, int32_t step, uint32_t *begin,
                           uint32_t *end, uint32_t max);

#ifdef __cplusplus
}
#endif
#endif
