/*
 * Internal: the elementwise and row kernels of the GPU forward pass (forward_gpu.cu), called by
 * forward_gpu.c. Each launcher queues one kernel on stream and returns the launch status
 * (FLX_CUDA_CALL(cudaGetLastError()): file, line and the kernel named on failure); the caller has
 * checked every argument. All pointers are device pointers.
 *
 * SPLIT ROWS. The input of every cuBLAS product is an activation of n rows split into
 * FLX_GPU_SPLIT bf16 parts, part p in rows [p n, (p + 1) n) of one (S n, width) matrix
 * (b0 = bf16(x), b1 = bf16(x - b0), b2 = bf16(x - b0 - b1): x = b0 + b1 + b2 to ~2^-26, below
 * fp32's own rounding); the product's output (S n, out) fp32 then holds W b_p in rows
 * [p n, (p + 1) n), and the kernel that consumes it adds rows i, n + i, 2n + i (smallest parts
 * first). "split (S n, K)" below means that layout.
 */
#ifndef FLX_FORWARD_GPU_INTERNAL_H
#define FLX_FORWARD_GPU_INTERNAL_H

#include <stdint.h>

#include "flx/bf16.h"
#include "flx/cuda_rt.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bf16 parts per activation row. Two (~2^-17) make bf16 K / V rounding flip one value in a few
 * hundred against the CPU forward, which moves logits by ~1e-3 of their RMS; three reach fp32. */
#define FLX_GPU_SPLIT 3

/* x (n, H) = bf16 rows tokens[i] of emb (vocab, H). */
flx_status_t flx_gk_embed(const flx_bf16_t *emb, const int32_t *tokens, uint32_t n, uint32_t H, float *x,
                          flx_cuda_stream_t stream);

/* cs, sn (n, half): cos / sin of pos_i * inv_freq[j] taken in double, pos_i = pos[i] (pos != NULL)
 * or p0 + i. */
flx_status_t flx_gk_rope_table(const uint32_t *pos, uint32_t p0, uint32_t n, const float *inv_freq, uint32_t half,
                               float *cs, float *sn, flx_cuda_stream_t stream);

/* Per row i < n of x (n, H): when y (split (S n, H)) is not NULL, x_i += the sum of y's parts of
 * row i; then, when gain is not NULL, out (split (S n, H)) = split(x_i / rms(x_i) * gain) with
 * rms = sqrt(mean(x^2) + eps) (sum of squares in double, as the CPU forward). */
flx_status_t flx_gk_add_norm_split(float *x, const float *y, uint32_t n, uint32_t H, const float *gain, float eps,
                                   flx_bf16_t *out, flx_cuda_stream_t stream);

/* out (split (S n, K)) = split(in (n, K)). */
flx_status_t flx_gk_split(const float *in, uint32_t n, uint32_t K, flx_bf16_t *out, flx_cuda_stream_t stream);

/* From y (split (S n, Hq D + 2 Hkv D)) of the q|k|v product: sum the parts, add bias (same width, or
 * NULL), rotate q and k heads with the table rows cs, sn (n, D / 2) (rotate-half layout). q goes
 * to q_out (row i at q_out + i * q_stride). k, v go either to k_f32, v_f32 (n, Hkv D) (decode) or,
 * when those are NULL, rounded to bf16 into kb, vb (Hkv, kv_stride, D) at token tok0 + i
 * (prefill). */
typedef struct flx_gk_qkv_args {
    const float *y;
    uint32_t n;
    const float *bias;
    const float *cs, *sn;
    uint32_t n_heads, n_kv_heads, head_dim;
    float *q_out;
    uint32_t q_stride;
    float *k_f32, *v_f32;
    flx_bf16_t *kb, *vb;
    uint32_t kv_stride, tok0;
} flx_gk_qkv_args_t;

flx_status_t flx_gk_qkv_finish(const flx_gk_qkv_args_t *a, flx_cuda_stream_t stream);

/* From y (split (S n, 2F)) of the gate|up product: out (split (S n, F)) = split(silu(g) * u) with
 * g, u the summed parts of columns [0, F) and [F, 2F). */
flx_status_t flx_gk_silu_mul_split(const float *y, uint32_t n, uint32_t F, flx_bf16_t *out, flx_cuda_stream_t stream);

/* out (n, W) = the sum of the parts of each row of y (split (S n, W)). */
flx_status_t flx_gk_sum_parts(const float *y, uint32_t n, uint32_t W, float *out, flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
