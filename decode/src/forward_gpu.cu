/*
 * forward_gpu.cu - the elementwise and row kernels of the GPU forward pass (forward_gpu_internal.h);
 * the products are cuBLAS calls and the orchestration is forward_gpu.c.
 *
 * CPU REFERENCES (the same operations, in decode/src/forward.c and gemv.c): embed (bf16 row ->
 * fp32), rmsnorm (sum of squares in double, 1 / sqrt(ss / H + eps), x * r * g), bias_rope (bias
 * then rotate-half RoPE with cos / sin of pos * inv_freq taken in double), kv_round
 * (flx_f32_to_bf16: round to nearest even, NaN kept quiet), flx_silu_mul_ref (g / (1 + e^-g) * u)
 * and the residual adds. tests/decode/test_forward_gpu.c holds whole GPU decode steps and
 * prefills to the CPU forward (logits, K, V, q') with atol + rtol * |ref|, NaN/Inf never passing,
 * the worst element reported; a wrong kernel moves logits by O(0.1 .. 1) RMS, far outside.
 *
 * DESIGN
 * Row kernels (norm, q|k|v finish, embedding) take one block per token row; elementwise ones use
 * grid-stride loops. Each writes its result in the layout the next product or the host wants, so
 * no kernel exists only to move data: the split of an activation into bf16 parts (see
 * forward_gpu_internal.h) is fused into the kernel that produces it, and the sum of a product's
 * parts into the kernel that consumes it.
 */
#include <cuda_runtime.h>

#include "forward_gpu_internal.h"

namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* flx_f32_to_bf16, bit for bit. */
__device__ __forceinline__ uint16_t f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The FLX_GPU_SPLIT bf16 parts of v at out, out + ps, out + 2 ps: b0 = bf16(v), b1 = bf16(v - b0),
 * ...; each remainder is exact in fp32 (it has at most 16 significant bits left), so the parts sum
 * to v within 2^-9 of the last remainder. */
__device__ __forceinline__ void split_store(float v, uint16_t *out, size_t ps)
{
#pragma unroll
    for (int p = 0; p < FLX_GPU_SPLIT; p++) {
        const uint16_t b = f2bf(v);
        out[p * ps] = b;
        v -= bf2f(b);
    }
}

/* Sum of the parts y[0], y[ps], y[2 ps], ...: smallest first. */
__device__ __forceinline__ float sum_parts(const float *y, size_t ps)
{
    float acc = y[(FLX_GPU_SPLIT - 1) * ps];
#pragma unroll
    for (int p = FLX_GPU_SPLIT - 2; p >= 0; p--) acc = y[p * ps] + acc;
    return acc;
}

unsigned grid_for(size_t total)
{
    size_t g = (total + kThreads - 1) / kThreads;
    return (unsigned)(g < 1 ? 1 : g > 65535u * 8u ? 65535u * 8u : g);
}

__global__ void embed_kernel(const uint16_t *__restrict__ emb, const int32_t *__restrict__ tokens, uint32_t H,
                             float *__restrict__ x)
{
    const uint16_t *row = emb + (size_t)tokens[blockIdx.x] * H;
    float *xr = x + (size_t)blockIdx.x * H;
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) xr[i] = bf2f(row[i]);
}

__global__ void rope_table_kernel(const uint32_t *__restrict__ pos, uint32_t p0, uint32_t n,
                                  const float *__restrict__ inv_freq, uint32_t half, float *__restrict__ cs,
                                  float *__restrict__ sn)
{
    const size_t total = (size_t)n * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(idx / half), j = (uint32_t)(idx % half);
        const double p = pos ? (double)pos[i] : (double)p0 + (double)i;
        double s, c;
        sincos(p * (double)inv_freq[j], &s, &c);
        cs[idx] = (float)c;
        sn[idx] = (float)s;
    }
}

/* Block sum of a double, result valid in every thread. blockDim.x is kThreads. */
__device__ double block_sum(double v)
{
    __shared__ double part[kThreads / 32];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (unsigned w = 0; w < kThreads / 32; w++) t += part[w];
    return t;
}

__global__ void __launch_bounds__(kThreads)
    add_norm_split_kernel(float *__restrict__ x, const float *__restrict__ y, uint32_t n, uint32_t H,
                          const float *__restrict__ gain, float eps, uint16_t *__restrict__ out)
{
    const uint32_t t = blockIdx.x;
    const size_t ps = (size_t)n * H;   /* elements between parts */
    float *xr = x + (size_t)t * H;
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
        float v = xr[i];
        if (y) {
            v += sum_parts(y + (size_t)t * H + i, ps);
            xr[i] = v;
        }
        ss += (double)v * v;
    }
    if (!gain) return;   /* uniform over the block */
    ss = block_sum(ss);
    const float r = (float)(1.0 / sqrt(ss / H + (double)eps));
    /* each thread reads back only the x elements it wrote itself above */
    for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) split_store(xr[i] * r * gain[i], out + (size_t)t * H + i, ps);
}

__global__ void split_kernel(const float *__restrict__ in, size_t total, uint16_t *__restrict__ out)
{
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x)
        split_store(in[idx], out + idx, total);
}

__global__ void qkv_finish_kernel(flx_gk_qkv_args_t a)
{
    const uint32_t i = blockIdx.x, D = a.head_dim, half = D / 2;
    const uint32_t qd = a.n_heads * D, kvd = a.n_kv_heads * D, W = qd + 2 * kvd;
    const float *y0 = a.y + (size_t)i * W;
    const size_t ps = (size_t)a.n * W;
    const float *c = a.cs + (size_t)i * half, *s = a.sn + (size_t)i * half;
    uint16_t *kb = reinterpret_cast<uint16_t *>(a.kb), *vb = reinterpret_cast<uint16_t *>(a.vb);
    /* rotation pairs of the q heads then the k heads: column h * D + j (k heads follow q's qd columns) */
    const uint32_t pairs = (a.n_heads + a.n_kv_heads) * half;
    for (uint32_t p = threadIdx.x; p < pairs; p += blockDim.x) {
        const uint32_t h = p / half, j = p % half, ca = h * D + j, cb = ca + half;
        float xa = sum_parts(y0 + ca, ps), xb = sum_parts(y0 + cb, ps);
        if (a.bias) {
            xa += a.bias[ca];
            xb += a.bias[cb];
        }
        const float ra = xa * c[j] - xb * s[j], rb = xb * c[j] + xa * s[j];
        if (h < a.n_heads) {
            a.q_out[(size_t)i * a.q_stride + ca] = ra;
            a.q_out[(size_t)i * a.q_stride + cb] = rb;
        } else {
            const uint32_t hk = h - a.n_heads;
            if (a.k_f32) {
                a.k_f32[(size_t)i * kvd + hk * D + j] = ra;
                a.k_f32[(size_t)i * kvd + hk * D + j + half] = rb;
            } else {
                const size_t row = ((size_t)hk * a.kv_stride + a.tok0 + i) * D;
                kb[row + j] = f2bf(ra);
                kb[row + j + half] = f2bf(rb);
            }
        }
    }
    for (uint32_t e = threadIdx.x; e < kvd; e += blockDim.x) {
        const uint32_t col = qd + kvd + e;
        float x = sum_parts(y0 + col, ps);
        if (a.bias) x += a.bias[col];
        if (a.v_f32)
            a.v_f32[(size_t)i * kvd + e] = x;
        else
            vb[((size_t)(e / D) * a.kv_stride + a.tok0 + i) * D + e % D] = f2bf(x);
    }
}

__global__ void silu_mul_split_kernel(const float *__restrict__ y, uint32_t n, uint32_t F, uint16_t *__restrict__ out)
{
    const size_t total = (size_t)n * F, W = 2 * (size_t)F, ps = (size_t)n * W;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t i = idx / F, j = idx % F;
        const float g = sum_parts(y + i * W + j, ps);
        const float u = sum_parts(y + i * W + F + j, ps);
        split_store(g / (1.0f + expf(-g)) * u, out + idx, total);
    }
}

__global__ void sum_parts_kernel(const float *__restrict__ y, size_t total, float *__restrict__ out)
{
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x)
        out[idx] = sum_parts(y + idx, total);
}

}  // namespace

extern "C" {

flx_status_t flx_gk_embed(const flx_bf16_t *emb, const int32_t *tokens, uint32_t n, uint32_t H, float *x,
                          flx_cuda_stream_t stream)
{
    embed_kernel<<<n, kThreads, 0, stream>>>(reinterpret_cast<const uint16_t *>(emb), tokens, H, x);
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_rope_table(const uint32_t *pos, uint32_t p0, uint32_t n, const float *inv_freq, uint32_t half,
                               float *cs, float *sn, flx_cuda_stream_t stream)
{
    rope_table_kernel<<<grid_for((size_t)n * half), kThreads, 0, stream>>>(pos, p0, n, inv_freq, half, cs, sn);
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_add_norm_split(float *x, const float *y, uint32_t n, uint32_t H, const float *gain, float eps,
                                   flx_bf16_t *out, flx_cuda_stream_t stream)
{
    add_norm_split_kernel<<<n, kThreads, 0, stream>>>(x, y, n, H, gain, eps, reinterpret_cast<uint16_t *>(out));
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_split(const float *in, uint32_t n, uint32_t K, flx_bf16_t *out, flx_cuda_stream_t stream)
{
    const size_t total = (size_t)n * K;
    split_kernel<<<grid_for(total), kThreads, 0, stream>>>(in, total, reinterpret_cast<uint16_t *>(out));
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_qkv_finish(const flx_gk_qkv_args_t *a, flx_cuda_stream_t stream)
{
    qkv_finish_kernel<<<a->n, 128, 0, stream>>>(*a);
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_silu_mul_split(const float *y, uint32_t n, uint32_t F, flx_bf16_t *out, flx_cuda_stream_t stream)
{
    silu_mul_split_kernel<<<grid_for((size_t)n * F), kThreads, 0, stream>>>(y, n, F, reinterpret_cast<uint16_t *>(out));
    return FLX_CUDA_CALL(cudaGetLastError());
}

flx_status_t flx_gk_sum_parts(const float *y, uint32_t n, uint32_t W, float *out, flx_cuda_stream_t stream)
{
    const size_t total = (size_t)n * W;
    sum_parts_kernel<<<grid_for(total), kThreads, 0, stream>>>(y, total, out);
    return FLX_CUDA_CALL(cudaGetLastError());
}

}  // extern "C"
