/*
 * flx/model.h - the model runtime: a Llama 3.x / Qwen2.x decoder-only transformer held in host
 * memory as bf16 weights (stored as bf16 or, from quantized GGUF files, in compact block formats
 * that hold the same bf16 values), loaded from GGUF or Hugging Face checkpoints, and its forward
 * pass.
 *
 * OVERVIEW
 * A model is a flx_model_t: a config and pointers to its weights. Loaders (flx/model_load.h) fill
 * it from files; flx_model_init_random() fills it with seeded random weights for tests of shapes
 * the real model does not cover. Everything after loading reads only this struct.
 *
 * WEIGHT LAYOUT (all row-major, "out" rows of "in" columns, y = W x; "mat" is a flx_wmat_t)
 *   tok_embd   mat (vocab, hidden)
 *   per layer:
 *     attn_norm  fp32 (hidden)                RMSNorm gain
 *     wq         mat  (n_heads * head_dim, hidden)
 *     wk, wv     mat  (n_kv_heads * head_dim, hidden)
 *     bq         fp32 (n_heads * head_dim)     Qwen2 only (qkv_bias), else NULL
 *     bk, bv     fp32 (n_kv_heads * head_dim)  Qwen2 only, else NULL
 *     wo         mat  (hidden, n_heads * head_dim)
 *     ffn_norm   fp32 (hidden)
 *     w_gate     mat  (ffn, hidden)
 *     w_up       mat  (ffn, hidden)
 *     w_down     mat  (hidden, ffn)
 *   out_norm   fp32 (hidden)
 *   lm_head    mat  (vocab, hidden); equals tok_embd when tied_embeddings
 *
 * ROPE LAYOUT. Q and K rows are in the Hugging Face ("rotate half") layout: within a head, dim i
 * (i < head_dim / 2) rotates with dim i + head_dim / 2 by angle pos * inv_freq[i], inv_freq[i] =
 * rope_theta^(-2i / head_dim) (adjusted by the llama3 scaling when rope_scaling is
 * FLX_ROPE_LLAMA3). GGUF files of Llama-family models store wq/wk rows permuted for llama.cpp's
 * interleaved layout (pairs 2i, 2i+1); the GGUF loader un-permutes them, so K in the kvstore, KV
 * dumps and PyTorch checkpoints all share one layout.
 *
 * WEIGHT FORMATS. Every matrix holds bf16 values; flx_wmat_t says how they are stored:
 *   FLX_WFMT_BF16  flx_bf16_t (rows, cols), row-major
 *   FLX_WFMT_Q4    per row cols / 32 blocks of 24 bytes: u8 qs[16], float d, float m; value j of a
 *                  block is bf16(d * (qs[j] & 15) + m) and value j + 16 is bf16(d * (qs[j] >> 4) + m)
 *                  (GGUF Q4_1; Q4_0 with m = -8 d)
 *   FLX_WFMT_Q8    per row cols / 32 blocks of 36 bytes: i8 q[32], float d; value j = bf16(d * q[j])
 *                  (GGUF Q8_0)
 * bf16(x) rounds to nearest even. d and m are fp16 values (stored as fp32 so the kernels load them
 * as they are), so d * q is exact in fp32 (11 significant bits times at most 8) and each value has
 * one rounding before bf16's, fused or not: a Q4 or Q8 matrix holds exactly the values
 * the GGUF loader once dequantized to bf16 (and the GPU forward still uploads), in 0.75 or 1.125
 * bytes a value instead of 2. The decode GEMV expands blocks in registers (flx_model's gemv.c).
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

typedef enum {
    FLX_WFMT_BF16 = 0,
    FLX_WFMT_Q4 = 1,
    FLX_WFMT_Q8 = 2,
} flx_wfmt_t;

#define FLX_WFMT_BLOCK 32        /* values per block of FLX_WFMT_Q4 / Q8 (cols must be a multiple) */
#define FLX_WFMT_Q4_BYTES 24     /* bytes per block */
#define FLX_WFMT_Q8_BYTES 36

/* A weight matrix: its bytes and how they are stored (WEIGHT FORMATS above). p == NULL: absent. */
typedef struct flx_wmat {
    const void *p;
    flx_wfmt_t fmt;
} flx_wmat_t;

typedef struct flx_layer_weights {
    const float *attn_norm;       /* (hidden) */
    flx_wmat_t wq;                /* (n_heads * head_dim, hidden) */
    flx_wmat_t wk;                /* (n_kv_heads * head_dim, hidden) */
    flx_wmat_t wv;                /* (n_kv_heads * head_dim, hidden) */
    const float *bq, *bk, *bv;    /* qkv_bias only, else NULL */
    flx_wmat_t wo;                /* (hidden, n_heads * head_dim) */
    const float *ffn_norm;        /* (hidden) */
    flx_wmat_t w_gate;            /* (ffn, hidden) */
    flx_wmat_t w_up;              /* (ffn, hidden) */
    flx_wmat_t w_down;            /* (hidden, ffn) */
} flx_layer_weights_t;

struct flx_model_mem;             /* loader-private backing memory (mappings, arenas) */

typedef struct flx_model {
    flx_model_config_t cfg;
    flx_wmat_t tok_embd;          /* (vocab, hidden) */
    const float *out_norm;        /* (hidden) */
    flx_wmat_t lm_head;           /* (vocab, hidden) */
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

/* Bytes of weights (matrices in their formats + fp32 vectors) the forward pass reads per decode step. */
size_t flx_model_weight_bytes(const flx_model_t *model);
/* The same with every matrix as bf16: what the GPU forward (flx/forward_gpu.h) reads a step. */
size_t flx_model_weight_bytes_bf16(const flx_model_t *model);

/* "bf16", "q4", "q8"; "?" for other values. */
const char *flx_wfmt_name(flx_wfmt_t fmt);
/* Bytes of one row of cols values in fmt (cols a multiple of FLX_WFMT_BLOCK for Q4 / Q8). */
size_t flx_wmat_row_bytes(flx_wfmt_t fmt, size_t cols);
/* Values [c0, c0 + n) of row `row` of w (cols columns) as fp32 (exact: they are bf16 values) or as
 * bf16. The scalar definition of the formats: the kernels are tested against it. */
void flx_wmat_row_f32(const flx_wmat_t *w, size_t cols, size_t row, size_t c0, size_t n, float *out);
void flx_wmat_row_bf16(const flx_wmat_t *w, size_t cols, size_t row, size_t c0, size_t n, flx_bf16_t *out);

/* inv_freq (head_dim / 2) of cfg's RoPE, llama3 scaling applied: the single definition that the
 * forward pass, the prefill statistics and the tests share. */
void flx_rope_inv_freq(const flx_model_config_t *cfg, float *inv_freq);

#ifdef __cplusplus
}
#endif
#endif
