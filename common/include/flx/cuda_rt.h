/*
 * flx/cuda_rt.h - the CUDA runtime for code without CUDA headers: device discovery, host-memory
 * pinning and the device addresses of pinned memory (UVA), page-locked host buffers, device memory,
 * streams, events and copies, and the one translation of cudaError_t to flx_status_t
 * (flx_status_from_cuda; FLX_CUDA_CALL names the file and line). Library flx_cuda_rt in common/, so
 * every module (the kvstore, fluxion's kernels and scheduler, the decode runtime) uses it without
 * reaching into another. The GPU modules (decode/src/forward_gpu*, fluxion/src/attn_*gpu*) call the
 * runtime themselves for launches and stream-ordered work, and translate through the same function.
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
 * once. A device-to-host copy returns once the host bytes are written. The kvstore's copies (window
 * upload and appends) use these; the GPU decode path queues its own transfers on its stream
 * (flx_cuda_copy_dtoh_async below, and the runtime calls of flx/forward_gpu.h).
 *
 * STREAMS
 * flx_cuda_stream_t is cudaStream_t under another name, so C code without the CUDA headers can
 * hold one; NULL is the legacy default stream. Streams made by flx_cuda_stream_create do not
 * synchronise with the legacy default stream (cudaStreamNonBlocking): the synchronous copies above
 * have completed when they return, so work queued afterwards on any stream sees their bytes, and a
 * session uploaded from a receiver thread never waits for the decode loop's queue.
 *
 * UVA (host memory the device reads in place)
 * Memory page-locked with flx_cuda_host_register (mapped) or flx_cuda_host_alloc has a device
 * address, flx_cuda_host_device_ptr, through which kernels read and write it over the bus without a
 * copy. On most systems with unified addressing it equals the host address, but not on all, so
 * code always translates (once per allocation: offsets carry over) and never dereferences the
 * device address on the host.
 *
 * EVENTS
 * flx_cuda_event_t is cudaEvent_t under another name. An event recorded on a stream completes when
 * the stream gets past that point; query, synchronise, order another stream after it, and, for
 * events created with timing, read the device time between two completed events.
 *
 * THREAD MODE: all functions are thread-safe (the CUDA runtime is).
 */
#ifndef FLX_CUDA_RT_H
#define FLX_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Usable CUDA devices (0 when built without CUDA or when discovery fails). Cached after the first call. */
int flx_cuda_device_count(void);
/* Page-locks [p, p + len) and maps it for device access (cudaHostRegisterMapped | Portable). */
flx_status_t flx_cuda_host_register(void *p, size_t len);
flx_status_t flx_cuda_host_unregister(void *p);
/* The device address of host memory page-locked and mapped for device (flx_cuda_host_register or
 * flx_cuda_host_alloc); *dev_p written only on success. FLX_ERR_INVALID for memory that is not. */
flx_status_t flx_cuda_host_device_ptr(int device, const void *host, const void **dev_p);
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

/* cudaStream_t without the CUDA headers (same type: struct CUstream_st is the runtime's). */
typedef struct CUstream_st *flx_cuda_stream_t;

/* A stream on device that does not synchronise with the legacy default stream. *stream_p written
 * only on success; destroy with flx_cuda_stream_destroy. */
flx_status_t flx_cuda_stream_create(int device, flx_cuda_stream_t *stream_p);
/* Waits for the stream's work, then destroys it. Accepts NULL. */
void flx_cuda_stream_destroy(int device, flx_cuda_stream_t stream);
/* Blocks until every operation queued on stream has completed; returns the first error among them
 * (an asynchronous kernel fault is reported here). */
flx_status_t flx_cuda_stream_sync(int device, flx_cuda_stream_t stream);
/* Queues a device-to-host copy of len bytes on stream and returns at once; dst must be page-locked
 * (flx_cuda_host_alloc) for the copy to be asynchronous, and is written once the stream reaches it. */
flx_status_t flx_cuda_copy_dtoh_async(int device, void *dst, const void *src_dev, size_t len,
                                      flx_cuda_stream_t stream);

/* Queues a host-to-device copy of len bytes on stream and returns at once. From page-locked memory
 * the bytes are read when the stream reaches the copy (keep them until then); from pageable memory
 * the runtime takes them before returning. */
flx_status_t flx_cuda_copy_htod_async(int device, void *dst_dev, const void *src, size_t len,
                                      flx_cuda_stream_t stream);
/* flx_cuda_copy_htod_2d queued on stream (height rows of width bytes, src_pitch and dst_pitch
 * apart); the same rules for the source as flx_cuda_copy_htod_async. */
flx_status_t flx_cuda_copy_htod_2d_async(int device, void *dst_dev, size_t dst_pitch, const void *src, size_t src_pitch,
                                         size_t width, size_t height, flx_cuda_stream_t stream);
/* Queues setting len bytes of device memory to byte on stream. */
flx_status_t flx_cuda_memset_async(int device, void *dst_dev, int byte, size_t len, flx_cuda_stream_t stream);

/* cudaEvent_t without the CUDA headers. */
typedef struct CUevent_st *flx_cuda_event_t;

/* timing 1: the event can give elapsed times (flx_cuda_event_elapsed_ns); 0: lighter, ordering only.
 * *ev_p written only on success; destroy with flx_cuda_event_destroy. */
flx_status_t flx_cuda_event_create(int device, int timing, flx_cuda_event_t *ev_p);
/* Accepts NULL. */
void flx_cuda_event_destroy(int device, flx_cuda_event_t ev);
flx_status_t flx_cuda_event_record(int device, flx_cuda_event_t ev, flx_cuda_stream_t stream);
/* FLX_OK when the stream got past the event's last record (or it was never recorded),
 * FLX_INPROGRESS when not yet, an error when the device reported one. Never blocks. */
flx_status_t flx_cuda_event_query(int device, flx_cuda_event_t ev);
/* Blocks until the event completes. */
flx_status_t flx_cuda_event_sync(int device, flx_cuda_event_t ev);
/* Device time from a to b (both completed, both created with timing), in nanoseconds (the
 * runtime's resolution is about 0.5 us); negative intervals read 0. */
flx_status_t flx_cuda_event_elapsed_ns(int device, flx_cuda_event_t a, flx_cuda_event_t b, uint64_t *ns_p);
/* Work queued on stream after this call waits for the event's last record to complete. */
flx_status_t flx_cuda_stream_wait_event(int device, flx_cuda_stream_t stream, flx_cuda_event_t ev);

/* len > 0 bytes of page-locked host memory usable by every device (cudaHostAllocPortable): the
 * staging buffers of asynchronous copies. *p_p written only on success; FLX_ERR_NOMEM when the
 * system refuses. Free with flx_cuda_host_free. */
flx_status_t flx_cuda_host_alloc(size_t len, void **p_p);
/* Accepts NULL. */
void flx_cuda_host_free(void *p);
/* 1 when p points into page-locked host memory (flx_cuda_host_alloc or flx_cuda_host_register), 0
 * otherwise (pageable memory, device memory, NULL, or no device). */
int flx_cuda_host_is_pinned(const void *p);

/* flx_status_from_cuda with the call site in the message: "file:line: what: cuda error N (name)".
 * Also clears the runtime's last (non-sticky) error, so it does not leak into a later launch check. */
flx_status_t flx_status_from_cuda_at(int cuda_err, const char *what, const char *file, int line);
/* Checks a CUDA runtime call where it is made: st = FLX_CUDA_CALL(cudaMemcpyAsync(...)); a kernel
 * launch is checked with FLX_CUDA_CALL(cudaGetLastError()). */
#define FLX_CUDA_CALL(call) flx_status_from_cuda_at((int)(call), #call, __FILE__, __LINE__)

/* Test hook: the next n calls of flx_cuda_malloc and the copies fail with FLX_ERR_DEVICE (message
 * "injected fault") without reaching the runtime, so tests on a GPU machine can check what a
 * failed cudaMalloc or copy does to a session. Process-wide; n <= 0 disarms it. Never used by
 * library code. */
void flx_cuda_inject_faults(int n);

#ifdef __cplusplus
}
#endif
#endif
