/*
 * gpusim's cuda_runtime.h: what the project's .cu files need from CUDA, for a host C++ compiler.
 * The runtime API types and declarations are the real toolkit's (cuda_runtime_api.h, so the
 * simulated runtime in sim_rt.cpp is ABI-compatible with objects compiled against it); the device
 * built-ins (threadIdx, __syncthreads, warp shuffles, __uint_as_float) map onto sim_rt.cpp's
 * thread pool. Found before the toolkit's own header by include order; see run.sh.
 */
#pragma once
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static   /* one block runs at a time: a static is the block's shared variable */
#define __launch_bounds__(x)

extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local char *sim_dyn_smem;   /* the launch's dynamic shared memory (transform.py) */

void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int m);
double __shfl_xor_sync(unsigned mask, double v, int m);
float __shfl_sync(unsigned mask, float v, int src);
inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* kernel<<<grid, block, smem, stream>>>(args) becomes sim_launch(kernel, grid, block, smem, stream,
 * [&] { kernel(args); }) */
void sim_launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body);

/* The runtime's C++ overload for a kernel pointer. */
template <class T>
cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}
