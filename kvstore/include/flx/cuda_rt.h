/*
 * flx/cuda_rt.h - the project's only contact with the CUDA runtime outside kernels: device
 * discovery, host-memory pinning for UVA, and the one translation of cudaError_t to flx_status_t.
 *
 * Built without CUDA (FLX_HAVE_CUDA off) these report "no device" (0 devices, FLX_ERR_NO_DEVICE),
 * which is the truth for that binary. Built with CUDA they link the static runtime; any error from
 * device discovery (for example "insufficient driver" on a machine without a GPU) also means no
 * device, so one binary runs everywhere.
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

#ifdef __cplusplus
}
#endif
#endif
