/*
 * flx/model.h - the model runtime: a Llama 3.x / Qwen2.x decoder-only transformer held in host
 * memory as bf16 weights, loaded from GGUF or Hugging Face checkpoints, and its forward pass.
 *
 * OVERVIEW
 * A model is a flx_model_t: a config and pointers to its weights. Loaders (flx/model_load.h) fill
 * it from files; flx_model_init_random() fills it with seeded random weights for tests of shapes
 * the real model does not cover. Everything after loading reads only this struct.
 *
 * WEIGHT LAYOUT (all row-major, "out" rows of "in" columns, y = W x)
 *   tok_embd   bf16 (vocab, hidden)
 *   per layer:
 *     attn_norm  fp32 (hidden)                RMSNorm gain
 *     wq         bf16 (n_heads * head_dim, hidden)
 *     wk, wv     bf16 (n_kv_heads * head_dim, hidden)
 *     bq         fp32 (n_heads * head_dim)     Qwen2 only (qkv_bias), else NULL
 *     bk, bv     fp32 (n_kv_heads * head_dim)  Qwen2 only, else NULL
 *     wo         bf16 (hidden, n_heads * head_dim)
 *     ffn_norm   fp32 (hidden)
 *     w_gate     bf16 (ffn, hidden)
 *     w_up       bf16 (ffn, hidden)
 *     w_down     bf16 (hidden, ffn)
 *   out_norm   fp32 (hidden)
 *   lm_head    bf16 (vocab, hidden); equals tok_embd when tied_embeddings
 *
 * ROPE LAYOUT. Q and K rows are in the Hugging Face ("rotate half") layout: within a head, dim i
 * (i < head_dim / 2) rotates with dim i + head_dim / 2 by angle pos * inv_freq[i], inv_freq[i] =
 * rope_theta^(-2i / head_dim) (adjusted by the llama3 scaling when rope_scaling is
 * FLX_ROPE_LLAMA3). GGUF files of Llama-family models store wq/wk rows permuted for llama.cpp's
 * interleaved layout (pairs 2i, 2i+1); the GGUF loader un-permutes them, so K in the kvstore, KV
 * dumps and PyTorch checkpoints all share one layout.
 *
 * Numerics: bf16 weights and KV, fp32 activations and accumulation.
 *
 * Thread mode: a loaded model is immutable; any number of forward passes may read it at once,
 * each with its own workspace.
 */
#ifndef FLX_MODEL_H
#define FLX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "flx/bf16.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_ARCH_LLAMA = 0,  /* Llama 2/3.x, SmolLM2: no QKV bias */
    FLX_ARCH_QWEN2 = 1,  /* Qwen2/2.5: QKV biases */
} flx_arch_t;

typedef enum {
    FLX_ROPE_NONE = 0,   /* plain RoPE */
    FLX_ROPE_LLAMA3 = 1, /* Llama-3.1 frequency scaling (factor, low/high_freq_factor, original ctx) */
} flx_rope_scaling_t;

#define FLX_MODEL_MAX_LAYERS 256
#define FLX_MODEL_MAX_HEAD_DIM 256
/* Context lengths above this are refused: the engine sizes its attention workspaces by max_ctx. */
#define FLX_MODEL_MAX_CTX (1u << 24)

typedef struct flx_model_config {
    flx_arch_t arch;
    uint32_t n_layers;
    uint32_t hidden;          /* model width */
    uint32_t n_heads;         /* query heads */
    uint32_t n_kv_heads;      /* n_heads % n_kv_heads == 0 */
    uint32_t head_dim;        /* multiple of 16, <= FLX_MODEL_MAX_HEAD_DIM */
    uint32_t ffn;             /* SwiGLU intermediate size */
    uint32_t vocab;
    uint32_t max_ctx;         /* trained context length (tokens, 1 .. FLX_MODEL_MAX_CTX), from the
                                 file's metadata: no prefill takes a longer prompt */
    float rms_eps;
    float rope_theta;
    flx_rope_scaling_t rope_scaling;
    float rope_factor;             /* FLX_ROPE_LLAMA3 only */
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    uint32_t rope_orig_ctx;
    int tied_embeddings;      /* lm_head == tok_embd */
    int qkv_bias;             /* bq/bk/bv present (Qwen2) */
    char name[64];            /* human-readable, e.g. "SmolLM2-135M-Instruct"; valid UTF-8 */
} flx_model_config_t;

typedef struct flx_layer_weights {
    const float *attn_norm;       /* (hidden) */
    const flx_bf16_t *wq;         /* (n_heads * head_dim, hidden) */
    const flx_bf16_t *wk;         /* (n_kv_heads * head_dim, hidden) */
    const flx_bf16_t *wv;         /* (n_kv_heads * head_dim, hidden) */
    const float *bq, *bk, *bv;    /* qkv_bias only, else NULL */
    const flx_bf16_t *wo;         /* (hidden, n_heads * head_dim) */
    const float *ffn_norm;        /* (hidden) */
    const flx_bf16_t *w_gate;     /* (ffn, hidden) */
    const flx_bf16_t *w_up;       /* (ffn, hidden) */
    const flx_bf16_t *w_down;     /* (hidden, ffn) */
} flx_layer_weights_t;

struct flx_model_mem;             /* loader-private backing memory (mappings, arenas) */

typedef struct flx_model {
    flx_model_config_t cfg;
    const flx_bf16_t *tok_embd;   /* (vocab, hidden) */
    const float *out_norm;        /* (hidden) */
    const flx_bf16_t *lm_head;    /* (vocab, hidden) */
    flx_layer_weights_t *layers;  /* (n_layers) */
    struct flx_model_mem *mem;    /* owned; freed by flx_model_destroy */
} flx_model_t;

/* Checks a config for internal consistency (shapes, ranges, divisibility); names the field. */
flx_status_t flx_model_config_check(const flx_model_config_t *cfg);

/* Allocates a model of cfg's shape with seeded random weights (normal, std 0.02 for matrices,
 * 1 + small noise for norm gains, small biases when qkv_bias): for tests of shapes and families
 * the real model does not cover, and for the test-checkpoint generator. */
flx_status_t flx_model_init_random(const flx_model_config_t *cfg, uint64_t seed, flx_model_t **model_p);

/* Frees a model from any constructor. Accepts NULL. */
void flx_model_destroy(flx_model_t *model);

/* Bytes of weights (bf16 matrices + fp32 vectors) the forward pass reads per decode step. */
size_t flx_model_weight_bytes(const flx_model_t *model);

/* inv_freq (head_dim / 2) of cfg's RoPE, llama3 scaling applied: the single definition that the
 * forward pass, the prefill statistics and the tests share. */
void flx_rope_inv_freq(const flx_model_config_t *cfg, float *inv_freq);

#ifdef __cplusplus
}
#endif
#endif
