/*
 * flx/forward.h - the forward pass of a flx_model_t: prefill (a prompt) and decode (a batch of
 * sequences, one token each).
 *
 * OVERVIEW
 * The model knows nothing about where KV lives. Prefill hands each layer's K, V (RoPE applied) and
 * last query q' to a caller-supplied sink as soon as the layer is done, so a decode node can push
 * them into its kvstore (or a prefill node over UCX) while later layers run. A decode step calls a
 * caller-supplied attention function once per layer with the batch's new q, k, v (RoPE applied);
 * the decode loop implements it with the kvstore window and Fluxion's attention modes; tests
 * implement it with a plain dense KV cache. Everything else (embeddings, RMSNorm, projections,
 * SwiGLU, the LM head) runs here: bf16 weights, fp32 activations and accumulation, AVX-512 /
 * AVX2 / scalar kernels chosen at run time (flx/cpu.h), spread over the workers of a pool
 * (flx/pool.h), with results bitwise independent of how many workers there are.
 *
 * Positions: prompt token t has position t; the i-th generated token of a sequence has position
 * prompt_len + i (the decode step passes it).
 *
 * SHAPES (D = head_dim, Hq = n_heads, Hkv = n_kv_heads)
 *   prefill K, V   bf16 (Hkv, n, D) per layer (head-major: a kvstore chunk's payload layout)
 *   prefill q'     fp32 (Hq, D) per layer: the query of the last prompt token
 *   decode q       fp32 (batch, Hq, D); k, v fp32 (batch, Hkv, D); o fp32 (batch, Hq, D)
 *   logits         fp32 (vocab) per sequence
 *
 * WORKSPACES
 * flx_fwd_plan() sizes a workspace for (model, max prefill tokens, max batch) in a size-only pass;
 * the caller allocates it once. Neither prefill nor decode allocates on its own after that.
 *
 * THREAD MODE
 * One workspace serves one call at a time. Calls run on the workspace's pool (its driving thread
 * is the caller); a NULL pool runs everything on the caller.
 */
#ifndef FLX_FORWARD_H
#define FLX_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "flx/model.h"
#include "flx/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_fwd_shape {
    uint32_t max_prompt;   /* most tokens one prefill call takes, 1..min(2^22, the model's max_ctx) */
    uint32_t max_batch;    /* most sequences one decode step takes */
    flx_pool_h pool;       /* the workers the passes run on (borrowed: outlives the workspace; its
                              size sizes the per-worker scratch); NULL: the calling thread alone */
} flx_fwd_shape_t;

flx_status_t flx_fwd_plan(const flx_model_t *m, const flx_fwd_shape_t *shape, size_t *ws_bytes_p);

typedef struct flx_fwd_ws flx_fwd_ws_t;   /* carved from caller memory; opaque */

/* Carves a workspace from mem (bytes >= the plan). The memory stays the caller's and must outlive
 * the workspace; *ws_p points into it. */
flx_status_t flx_fwd_ws_init(const flx_model_t *m, const flx_fwd_shape_t *shape, void *mem, size_t bytes,
                             flx_fwd_ws_t **ws_p);

/* Per-layer output of a prefill. Pointers are valid only during the call. Returning an error stops
 * the prefill with that status. */
typedef flx_status_t (*flx_prefill_layer_fn)(void *ctx, uint32_t layer, uint32_t n_tokens, const flx_bf16_t *k,
                                             const flx_bf16_t *v, const float *q_last);

typedef struct flx_prefill_args {
    const int32_t *tokens;       /* (n_tokens), each < vocab (checked) */
    uint32_t n_tokens;           /* 1..max_prompt; never above the model's max_ctx */
    flx_prefill_layer_fn on_layer;  /* may be NULL */
    void *ctx;
    float *logits_last;          /* (vocab) logits after the last token, or NULL */
    float *logits_all;           /* (n_tokens, vocab) teacher-forced logits of every position, or NULL */
    float *q_all;                /* (n_layers, n_tokens, Hq, D) every query (KV dumps), or NULL */
} flx_prefill_args_t;

/* Refuses (FLX_ERR_INVALID, nothing computed) a prompt longer than the model's context (max_ctx)
 * or the workspace's max_prompt, and token ids outside the vocabulary. Reports its progress per
 * layer to the calling thread's observer (flx/progress.h, stage "prefill"). */
flx_status_t flx_model_prefill(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_prefill_args_t *args);

/* Attention of one layer for a decode batch: given the batch's q, and its new k, v (already RoPE'd;
 * the callee appends them to its KV), writes o. Returning an error aborts the step. */
typedef flx_status_t (*flx_attn_layer_fn)(void *ctx, uint32_t layer, uint32_t batch, const float *q, const float *k,
                                          const float *v, float *o);

typedef struct flx_decode_args {
    uint32_t batch;              /* 1..max_batch */
    const int32_t *tokens;       /* (batch) the tokens to feed */
    const uint32_t *pos;         /* (batch) their positions */
    flx_attn_layer_fn attn;
    void *ctx;
    float *logits;               /* (batch, vocab) */
} flx_decode_args_t;

/* Time split of the last decode step of a workspace (nanoseconds). */
typedef struct flx_fwd_timing {
    uint64_t dense_ns;           /* projections, FFN, LM head, norms, RoPE */
    uint64_t attn_ns;            /* inside the attention callbacks */
    uint64_t dense_bytes;        /* weight bytes the dense part read */
} flx_fwd_timing_t;

flx_status_t flx_model_decode(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_decode_args_t *args);
void flx_fwd_timing_get(const flx_fwd_ws_t *ws, flx_fwd_timing_t *timing_p);
/* The pool the workspace was planned with (NULL: none). */
flx_pool_h flx_fwd_ws_pool(const flx_fwd_ws_t *ws);

#ifdef __cplusplus
}
#endif
#endif
