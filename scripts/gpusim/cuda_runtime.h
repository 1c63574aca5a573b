/*
 * gpusim's cuda_runtime.h: what the project's .cu files need from CUDA, for a host C++ compiler.
 * The runtime API types and declarations are the real toolkit's (cuda_runtime_api.h, so the
 * simulated runtime in sim_rt.cpp is ABI-compatible with objects compiled against it); the device
 * built-ins (threadIdx, __syncthreads, warp shuffles and votes, atomics, __uint_as_float) map onto
 * sim_rt.cpp's thread pool. Found before the toolkit's own header by include order; see run.sh.
 */
#pragma once
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#undef __global__
#undef __host__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __host__
#define __device__
#define __forceinline__ inline
#define __shared__ static   /* one block runs at a time: a static is the block's shared variable */
#define __launch_bounds__(x)

extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local char *sim_dyn_smem;   /* the launch's dynamic shared memory (transform.py) */

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int m);
double __shfl_xor_sync(unsigned mask, double v, int m);
unsigned __shfl_xor_sync(unsigned mask, unsigned v, int m);
float __shfl_sync(unsigned mask, float v, int src);
unsigned __shfl_sync(unsigned mask, unsigned v, int src);
unsigned __shfl_up_sync(unsigned mask, unsigned v, unsigned delta);
unsigned __ballot_sync(unsigned mask, int pred);
unsigned __match_any_sync(unsigned mask, unsigned v);
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
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
/* Device atomics: the block's threads are host threads, so these are real atomic operations. */
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

/* kernel<<<grid, block, smem, stream>>>(args) becomes sim_launch_k(grid, block, smem, stream, kernel,
 * args) (transform.py): the arguments are converted to the kernel's parameter types and copied at
 * the launch, as CUDA copies them into the launch's parameter buffer, and the kernel runs when the
 * stream reaches it. */
void sim_launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body);

template <class... P, class... A>
inline void sim_launch_k(dim3 grid, dim3 block, size_t smem, cudaStream_t s, void (*k)(P...), A &&...a)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    std::tuple<std::decay_t<P>...> args(static_cast<std::decay_t<P>>(a)...);
    sim_launch((const void *)k, grid, block, smem, s, [k, args]() { std::apply(k, args); });
}

/* The runtime's C++ overload for a kernel pointer. */
template <class T>
cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}
