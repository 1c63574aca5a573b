/*
 * flx/forward_gpu.h - the forward pass of a flx_model_t on a CUDA device: the dense part of a
 * decode step (with attention handed to the caller per layer, as flx/forward.h does) and a whole
 * prefill.
 *
 * OVERVIEW
 * flx_gpu_model_create() uploads a loaded model once: every bf16 matrix and fp32 vector into one
 * device allocation (q|k|v rows and gate|up rows concatenated so each pair or triple is one
 * product; a tied LM head shares the embedding). A workspace is planned for (max prompt, max batch,
 * prefill chunk) in a size-only pass and carved from caller-owned memory: a device part and a
 * page-locked host part (the staging of every transfer). Decode and prefill then allocate nothing.
 * Everything a call does is queued on one CUDA stream the caller passes; each call returns when its
 * results are on the host.
 *
 *   decode step (batch of B sequences, one token each), per layer:
 *     RMSNorm -> [q|k|v] = W_qkv x (+ Qwen2 bias) -> RoPE -> q, k, v copied to page-locked host
 *     memory -> attention callback (host q, k, v AND the device q; returns o on the host) -> o
 *     uploaded -> W_o -> residual -> RMSNorm -> [gate|up] -> SwiGLU -> W_down -> residual;
 *     then the final RMSNorm and the LM head; logits copied to the caller.
 *   prefill (n tokens): per layer, chunk by chunk, RMSNorm + QKV + RoPE into the layer's K, V
 *     (bf16, (Hkv, n, D)) and q; K, V and q' (the last token's query) are copied to the host and
 *     handed to the same flx_prefill_layer_fn sink as the CPU path while the device runs the
 *     layer's second half: causal attention (flx/attn_gpu.h), W_o, residual, FFN, residual.
 *
 * NUMERICS. Weights bf16, activations fp32, every product accumulated in fp32 by cuBLAS
 * (cublasGemmEx, bf16 inputs, CUBLAS_COMPUTE_32F). cuBLAS takes no fp32 x bf16 product, and
 * rounding activations to bf16 would cost ~1e-3 relative per projection; so each activation enters
 * as three bf16 parts (b0 = bf16(x), b1 = bf16(x - b0), b2 = bf16(x - b0 - b1): they sum to x
 * within fp32's own rounding) stacked as 3N columns of one product, and the consumer adds the
 * parts. A decode step still reads each weight once (the product is memory-bound at these
 * widths); a prefill does three times the arithmetic of a bf16 product. Two parts (~2^-17) were
 * not enough: against the CPU forward they flipped the bf16 rounding of one K / V value in a few
 * hundred, moving logits by ~1e-3 of their RMS. With three, the GPU forward differs from the CPU
 * one (flx/forward.h) by fp32 summation order only; K and V are rounded to bf16 exactly as there. RoPE angles pos * inv_freq[i] are taken in double on the
 * device (flx_rope_inv_freq's frequencies, llama3 scaling included).
 *
 * SHAPES (D = head_dim, Hq = n_heads, Hkv = n_kv_heads), as flx/forward.h:
 *   decode callback  q fp32 (B, Hq, D); k, v fp32 (B, Hkv, D); o fp32 (B, Hq, D)
 *   prefill sink     K, V bf16 (Hkv, n, D); q' fp32 (Hq, D)
 *   logits           fp32 (B, vocab) / (vocab) / (n, vocab)
 *
 * THREAD MODE
 * A device model is immutable after create: any number of workspaces may run on it at once, each
 * from one thread at a time (a workspace holds its own cuBLAS handle). Calls switch the calling
 * thread to the model's device for their duration and restore the previous one.
 *
 * ERRORS
 * FLX_ERR_NO_DEVICE where there is no usable device (no GPU, no driver, or a binary built without
 * CUDA: the functions exist in every build); FLX_ERR_CAPACITY when the weights do not fit the
 * device's free memory; FLX_ERR_NOMEM when a device or page-locked allocation fails;
 * FLX_ERR_INVALID for bad arguments (named in the message, as flx/forward.h names them); a failed
 * CUDA or cuBLAS call returns its translated status with file, line and the call in the message.
 * After an error the stream has been synchronised: the workspace can be reused.
 *
 * STATUS: compiled, never run on a device yet (no GPU on the development machines); the tests
 * labelled `gpu` compare it with the CPU forward where a device exists.
 */
#ifndef FLX_FORWARD_GPU_H
#define FLX_FORWARD_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "flx/cuda_rt.h"
#include "flx/forward.h"
#include "flx/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the device model ---- */

typedef struct flx_gpu_model *flx_gpu_model_h;

/* Uploads m's weights to device (an ordinal < flx_cuda_device_count()). m is only read during the
 * call (the device model keeps a copy of its config, not a reference). Refusals: FLX_ERR_NO_DEVICE
 * (no device), FLX_ERR_INVALID (bad config, device out of range), FLX_ERR_CAPACITY (the weights
 * exceed the device's free memory), FLX_ERR_NOMEM (the allocation failed). *gm_p written only on
 * success. */
flx_status_t flx_gpu_model_create(const flx_model_t *m, int device, flx_gpu_model_h *gm_p);
/* Frees the device copy. Accepts NULL. Workspaces must be destroyed first. */
void flx_gpu_model_destroy(flx_gpu_model_h gm);

typedef struct flx_gpu_model_info {
    int device;
    size_t weight_bytes;        /* device bytes of weights and vectors (flx_model_weight_bytes + padding) */
    const flx_model_config_t *cfg;   /* the model's config; valid while gm lives */
} flx_gpu_model_info_t;

void flx_gpu_model_info(flx_gpu_model_h gm, flx_gpu_model_info_t *info_p);

/* ---- workspaces: plan, then carve ---- */

typedef struct flx_gpu_fwd_shape {
    uint32_t max_prompt;     /* most tokens one prefill takes (<= the model's max_ctx); 0 = decode only */
    uint32_t max_batch;      /* most sequences one decode step takes, 1..4096 */
    uint32_t prefill_chunk;  /* prompt tokens per pass of the projections and FFN; 0 = 256. Bounds the
                              * (tokens, ffn) buffers; K, V, q and the residual stream stay whole */
} flx_gpu_fwd_shape_t;

/* Size-only pass: device bytes and page-locked host bytes of a workspace of shape for m. */
flx_status_t flx_gpu_fwd_plan(const flx_model_t *m, const flx_gpu_fwd_shape_t *shape, size_t *dev_bytes_p,
                              size_t *host_bytes_p);

typedef struct flx_gpu_fwd_ws *flx_gpu_fwd_ws_h;

/* A workspace over caller memory: dev_mem on gm's device (flx_cuda_malloc), host_mem page-locked
 * (flx_cuda_host_alloc), at least the planned bytes each; the memory stays the caller's and must
 * outlive the workspace. Create also makes the workspace's cuBLAS handle and an event (the only
 * runtime objects it owns); destroy releases them. shape must be the planned one for gm's model. */
flx_status_t flx_gpu_fwd_ws_create(flx_gpu_model_h gm, const flx_gpu_fwd_shape_t *shape, void *dev_mem,
                                   size_t dev_bytes, void *host_mem, size_t host_bytes, flx_gpu_fwd_ws_h *ws_p);
/* Accepts NULL. */
void flx_gpu_fwd_ws_destroy(flx_gpu_fwd_ws_h ws);

/* ---- decode ---- */

/*
 * Attention of one layer of a GPU decode step. When it is called, stream has completed the layer's
 * projections: the host arrays hold q (B, Hq, D), k, v (B, Hkv, D) (RoPE applied, fp32, page-
 * locked) and the device arrays hold the same q, k, v. The callee appends k, v to its KV, may
 * queue device work on stream that reads q_dev / k_dev / v_dev (window attention), and must write
 * o (B, Hq, D) on the host before it returns (waiting for whatever it queued); the forward then
 * uploads o. Device pointers stay valid until the callback returns; the host ones too. Returning an
 * error aborts the step.
 */
typedef struct flx_gpu_attn_args {
    uint32_t layer;
    uint32_t batch;
    const float *q, *k, *v;             /* host, page-locked */
    const float *q_dev, *k_dev, *v_dev; /* device, same shapes */
    flx_cuda_stream_t stream;           /* the forward's stream */
    int device;                         /* the forward's device (current on the calling thread) */
    float *o;                           /* host, page-locked (B, Hq, D): the callee's output */
} flx_gpu_attn_args_t;

typedef flx_status_t (*flx_gpu_attn_fn)(void *ctx, const flx_gpu_attn_args_t *args);

typedef struct flx_gpu_decode_args {
    uint32_t batch;              /* 1..max_batch */
    const int32_t *tokens;       /* (batch) each < vocab (checked) */
    const uint32_t *pos;         /* (batch) positions */
    flx_gpu_attn_fn attn;
    void *ctx;
    float *logits;               /* host (batch, vocab), any memory */
} flx_gpu_decode_args_t;

flx_status_t flx_gpu_model_decode(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                  const flx_gpu_decode_args_t *args);

/* ---- prefill ---- */

/* The CPU prefill's contract (flx/forward.h flx_prefill_args_t, every field): n_tokens <=
 * max_prompt; on_layer gets K, V and q' in host memory valid during the call (it runs on the
 * calling thread while the device computes the rest of the layer); logits_last, logits_all, q_all
 * are written when not NULL. */
flx_status_t flx_gpu_model_prefill(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                   const flx_prefill_args_t *args);

/* Time split of the last decode step of ws: wall time inside the attention callbacks vs the rest
 * (device work and its waits); dense_bytes = the weight bytes a step reads. */
void flx_gpu_fwd_timing_get(flx_gpu_fwd_ws_h ws, flx_fwd_timing_t *timing_p);

#ifdef __cplusplus
}
#endif
#endif
