/*
 * Internal: the elementwise and row kernels of the GPU forward pass (forward_gpu.cu), called by
 * forward_gpu.c. Each launcher queues one kernel on stream and returns the launch status
 * (FLX_CUDA_CALL(cudaGetLastError()): file, line and the kernel named on failure); the caller has
 * checked every argument. All pointers are device pointers.
 *
 * PAIRED ROWS. The input of every cuBLAS product is an activation of n rows split into two bf16
 * halves, hi rows [0, n) and lo rows [n, 2n) of one (2n, width) matrix (x = hi + lo to ~2^-17);
 * the product's output (2n, out) fp32 then holds W hi in rows [0, n) and W lo in rows [n, 2n), and
 * the kernel that consumes it adds row i and row n + i. "pair (2n, K)" below means that layout.
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

/* x (n, H) = bf16 rows tokens[i] of emb (vocab, H). */
flx_status_t flx_gk_embed(const flx_bf16_t *emb, const int32_t *tokens, uint32_t n, uint32_t H, float *x,
                          flx_cuda_stream_t stream);

/* cs, sn (n, half): cos / sin of pos_i * inv_freq[j] taken in double, pos_i = pos[i] (pos != NULL)
 * or p0 + i. */
flx_status_t flx_gk_rope_table(const uint32_t *pos, uint32_t p0, uint32_t n, const float *inv_freq, uint32_t half,
                               float *cs, float *sn, flx_cuda_stream_t stream);

/* Per row i < n of x (n, H): when y (pair (2n, H)) is not NULL, x_i += y_i + y_{n+i}; then, when
 * gain is not NULL, out (pair (2n, H)) = split(x_i / rms(x_i) * gain) with rms = sqrt(mean(x^2) +
 * eps) (sum of squares in double, as the CPU forward). */
flx_status_t flx_gk_add_norm_split(float *x, const float *y, uint32_t n, uint32_t H, const float *gain, float eps,
                                   flx_bf16_t *out, flx_cuda_stream_t stream);

/* out (pair (2n, K)) = split(in (n, K)). */
flx_status_t flx_gk_split(const float *in, uint32_t n, uint32_t K, flx_bf16_t *out, flx_cuda_stream_t stream);

/* From y (pair (2n, Hq D + 2 Hkv D)) of the q|k|v product: sum the halves, add bias (same width, or
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

/* From y (pair (2n, 2F)) of the gate|up product: out (pair (2n, F)) = split(silu(g) * u) with g, u
 * the summed halves of columns [0, F) and [F, 2F). */
flx_status_t flx_gk_silu_mul_split(const float *y, uint32_t n, uint32_t F, flx_bf16_t *out, flx_cuda_stream_t stream);

/* out (n, W) = y_i + y_{n+i} of y (pair (2n, W)). */
flx_status_t flx_gk_sum_halves(const float *y, uint32_t n, uint32_t W, float *out, flx_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
