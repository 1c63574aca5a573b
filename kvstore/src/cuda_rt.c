/*
 * cuda_rt.c - device discovery and pinning (see flx/cuda_rt.h). Compiled with or without CUDA.
 */
#include "flx/cuda_rt.h"

#include <stdatomic.h>

#ifdef FLX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

flx_status_t flx_status_from_cuda(int cuda_err, const char *what)
{
#ifdef FLX_HAVE_CUDA
    cudaError_t e = (cudaError_t)cuda_err;
    if (e == cudaSuccess) return FLX_OK;
    flx_status_t st = (e == cudaErrorMemoryAllocation)  ? FLX_ERR_NOMEM
                      : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? FLX_ERR_NO_DEVICE
                      : (e == cudaErrorInvalidValue) ? FLX_ERR_INVALID
                                                     : FLX_ERR_DEVICE;
    return flx_error_set(st, "%s: cuda error %d (%s)", what, (int)e, cudaGetErrorString(e));
#else
    if (cuda_err == 0) return FLX_OK;
    return flx_error_set(FLX_ERR_NO_DEVICE, "%s: built without CUDA", what);
#endif
}

static atomic_int g_count = -1;

int flx_cuda_device_count(void)
{
    int c = atomic_load(&g_count);
    if (c >= 0) return c;
#ifdef FLX_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky error: "no GPU" is a normal outcome */
        n = 0;
    }
    c = n;
#else
    c = 0;
#endif
    atomic_store(&g_count, c);
    return c;
}

flx_status_t flx_cuda_host_register(void *p, size_t len)
{
    if (flx_cuda_device_count() == 0) return flx_error_set(FLX_ERR_NO_DEVICE, "pinning %zu bytes: no CUDA device", len);
#ifdef FLX_HAVE_CUDA
    return flx_status_from_cuda(cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable),
                                "cudaHostRegister");
#else
    (void)p;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_cuda_host_unregister(void *p)
{
#ifdef FLX_HAVE_CUDA
    if (flx_cuda_device_count() == 0) return FLX_ERR_NO_DEVICE;
    return flx_status_from_cuda(cudaHostUnregister(p), "cudaHostUnregister");
#else
    (void)p;
    return FLX_ERR_NO_DEVICE;
#endif
}
