/*
 * flx/cuda_rt.h - the project's only contact with the CUDA runtime outside kernels: device
 * discovery, host-memory pinning for UVA, device memory and copies, and the one translation of
 * cudaError_t to flx_status_t.
 *
 * Built without CUDA (FLX_HAVE_CUDA off) these report "no device" (0 devices, FLX_ERR_NO_DEVICE
 * with a message naming the call), which is the truth for that binary. Built with CUDA they link
 * the static runtime only (CUDA::cudart_static, never libcuda, so the binary starts on a machine
 * without a driver); any error from device discovery (for example "insufficient driver" on a
 * machine without a GPU) also means no device, so one binary runs everywhere.
 *
 * DEVICE MEMORY AND COPIES
 * Every call names its device ordinal and leaves the calling thread's current device as it found
 * it (it switches for the call and back), so receiver threads and the decode thread can share one
 * store whatever device they work on. Copies are SYNCHRONOUS at this stage: a host-to-device copy
 * returns once the bytes are on the device (cudaMemcpy followed by a synchronisation of the legacy
 * default stream, because a copy from pageable memory may return before its DMA has landed), so
 * a kernel launched afterwards on any stream reads them, and the host buffer may be reused at
 * once. A device-to-host copy returns once the host bytes are written. Asynchronous copies on the
 * decode loop's stream come with the GPU worker.
 *
 * THREAD MODE: all functions are thread-safe (the CUDA runtime is).
 */
#ifndef FLX_CUDA_RT_H
#define FLX_CUDA_RT_H

#include <stddef.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Usable CUDA devices (0 when built without CUDA or when discovery fails). Cached after the first call. */
int flx_cuda_device_count(void);
/* Page-locks [p, p + len) and maps it for device access (cudaHostRegisterMapped | Portable). */
flx_status_t flx_cuda_host_register(void *p, size_t len);
flx_status_t flx_cuda_host_unregister(void *p);
/* cudaError_t (as int) -> status; the single translation point. */
flx_status_t flx_status_from_cuda(int cuda_err, const char *what);

/* Free and total bytes of device memory (cudaMemGetInfo). Creates the device's context on first use. */
flx_status_t flx_cuda_mem_info(int device, size_t *free_p, size_t *total_p);
/* len > 0 bytes of device memory; *dev_p written only on success. An out-of-memory device gives
 * FLX_ERR_NOMEM. The memory is owned by the caller until flx_cuda_free. */
flx_status_t flx_cuda_malloc(int device, size_t len, void **dev_p);
/* Accepts NULL. cudaFree synchronises the device: keep it off the decode hot path. */
flx_status_t flx_cuda_free(int device, void *dev);
/* Synchronous copies (see DEVICE MEMORY AND COPIES). len 0 is a no-op. */
flx_status_t flx_cuda_copy_htod(int device, void *dst_dev, const void *src, size_t len);
flx_status_t flx_cuda_copy_dtoh(int device, void *dst, const void *src_dev, size_t len);
/* height rows of width bytes: row r from src + r * src_pitch to dst_dev + r * dst_pitch. */
flx_status_t flx_cuda_copy_htod_2d(int device, void *dst_dev, size_t dst_pitch, const void *src, size_t src_pitch,
                                   size_t width, size_t height);

/* Test hook: the next n calls of flx_cuda_malloc and the copies fail with FLX_ERR_DEVICE (message
 * "injected fault") without reaching the runtime, so tests on a GPU machine can check what a
 * failed cudaMalloc or copy does to a session. Process-wide; n <= 0 disarms it. Never used by
 * library code. */
void flx_cuda_inject_faults(int n);

#ifdef __cplusplus
}
#endif
#endif
