/*
 * cuda_rt.c - device discovery, pinning and UVA addresses, page-locked buffers, device memory,
 * streams, events and copies (see flx/cuda_rt.h).
 * Compiled with or without CUDA; without it every device call refuses with FLX_ERR_NO_DEVICE.
 */
#include "flx/cuda_rt.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

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

/* ---- device memory and copies ---- */

/* Checks that device exists; sets the message naming the call. */
static flx_status_t device_check(int device, const char *what)
{
    int n = flx_cuda_device_count();
    if (n == 0) {
#ifdef FLX_HAVE_CUDA
        return flx_error_set(FLX_ERR_NO_DEVICE, "%s on device %d: no CUDA device", what, device);
#else
        return flx_error_set(FLX_ERR_NO_DEVICE, "%s on device %d: built without CUDA", what, device);
#endif
    }
    if (device < 0 || device >= n)
        return flx_error_set(FLX_ERR_INVALID, "%s: device %d out of range (%d devices)", what, device, n);
    return FLX_OK;
}

static atomic_int g_faults = 0;

void flx_cuda_inject_faults(int n)
{
    atomic_store(&g_faults, n > 0 ? n : 0);
}

#ifdef FLX_HAVE_CUDA
/* Consumes one injected fault, if armed. */
static flx_status_t injected_fault(const char *what)
{
    int n = atomic_load(&g_faults);
    while (n > 0)
        if (atomic_compare_exchange_weak(&g_faults, &n, n - 1))
            return flx_error_set(FLX_ERR_DEVICE, "%s: injected fault", what);
    return FLX_OK;
}

/* Makes device current for this thread; *prev_p is the device to restore with device_leave. */
static flx_status_t device_enter(int device, const char *what, int *prev_p)
{
    flx_status_t st = device_check(device, what);
    if (st != FLX_OK) return st;
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != device) e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return flx_status_from_cuda(e, "cudaSetDevice");
    }
    *prev_p = prev;
    return FLX_OK;
}

static void device_leave(int device, int prev)
{
    if (prev != device) (void)cudaSetDevice(prev);
}

/* Translates a failed call and clears the runtime's last error so it does not leak into the next
 * unrelated check (kernel launches read cudaGetLastError). */
static flx_status_t cuda_fail(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return flx_status_from_cuda(e, what);
}
#endif

flx_status_t flx_cuda_mem_info(int device, size_t *free_p, size_t *total_p)
{
    if (!free_p || !total_p) return flx_error_set(FLX_ERR_INVALID, "cuda mem info: NULL argument");
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "cudaMemGetInfo", &prev);
    if (st != FLX_OK) return st;
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMemGetInfo");
    *free_p = f;
    *total_p = t;
    return FLX_OK;
#else
    return device_check(device, "cudaMemGetInfo");
#endif
}

flx_status_t flx_cuda_malloc(int device, size_t len, void **dev_p)
{
    if (!dev_p || len == 0) return flx_error_set(FLX_ERR_INVALID, "cudaMalloc of %zu bytes: NULL or empty", len);
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "cudaMalloc", &prev);
    if (st != FLX_OK) return st;
    if ((st = injected_fault("cudaMalloc")) != FLX_OK) {
        device_leave(device, prev);
        return st;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, len);
    device_leave(device, prev);
    if (e != cudaSuccess) {
        char what[80];
        snprintf(what, sizeof what, "cudaMalloc of %zu bytes on device %d", len, device);
        return cuda_fail(e, what);
    }
    *dev_p = p;
    return FLX_OK;
#else
    return device_check(device, "cudaMalloc");
#endif
}

flx_status_t flx_cuda_free(int device, void *dev)
{
    if (!dev) return FLX_OK;
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "cudaFree", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaFree(dev);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaFree");
#else
    return device_check(device, "cudaFree");
#endif
}

flx_status_t flx_cuda_copy_htod(int device, void *dst_dev, const void *src, size_t len)
{
    return flx_cuda_copy_htod_2d(device, dst_dev, len, src, len, len, 1);
}

flx_status_t flx_cuda_copy_htod_2d(int device, void *dst_dev, size_t dst_pitch, const void *src, size_t src_pitch,
                                   size_t width, size_t height)
{
    if (width == 0 || height == 0) return FLX_OK;
    if (!dst_dev || !src || dst_pitch < width || src_pitch < width)
        return flx_error_set(FLX_ERR_INVALID, "host-to-device copy: NULL pointer or pitch (%zu, %zu) below width %zu",
                             dst_pitch, src_pitch, width);
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "host-to-device copy", &prev);
    if (st != FLX_OK) return st;
    if ((st = injected_fault("host-to-device copy")) != FLX_OK) {
        device_leave(device, prev);
        return st;
    }
    cudaError_t e = cudaSuccess;
    if (height == 1) {
        e = cudaMemcpy(dst_dev, src, width, cudaMemcpyHostToDevice);
    } else if (dst_pitch <= INT_MAX && src_pitch <= INT_MAX) {
        e = cudaMemcpy2D(dst_dev, dst_pitch, src, src_pitch, width, height, cudaMemcpyHostToDevice);
    } else {
        /* cudaMemcpy2D refuses pitches past the device's memPitch (2^31 - 1): row by row. */
        for (size_t r = 0; r < height && e == cudaSuccess; r++)
            e = cudaMemcpy((char *)dst_dev + r * dst_pitch, (const char *)src + r * src_pitch, width,
                           cudaMemcpyHostToDevice);
    }
    /* From pageable memory cudaMemcpy may return before the DMA lands: wait for it. */
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "host-to-device copy");
    return FLX_OK;
#else
    return device_check(device, "host-to-device copy");
#endif
}

flx_status_t flx_cuda_copy_dtoh(int device, void *dst, const void *src_dev, size_t len)
{
    if (len == 0) return FLX_OK;
    if (!dst || !src_dev) return flx_error_set(FLX_ERR_INVALID, "device-to-host copy of %zu bytes: NULL pointer", len);
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "device-to-host copy", &prev);
    if (st != FLX_OK) return st;
    if ((st = injected_fault("device-to-host copy")) != FLX_OK) {
        device_leave(device, prev);
        return st;
    }
    cudaError_t e = cudaMemcpy(dst, src_dev, len, cudaMemcpyDeviceToHost);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "device-to-host copy");
    return FLX_OK;
#else
    return device_check(device, "device-to-host copy");
#endif
}

/* ---- call-site translation, streams, page-locked host memory ---- */

flx_status_t flx_status_from_cuda_at(int cuda_err, const char *what, const char *file, int line)
{
    if (cuda_err == 0) return FLX_OK;
    const char *base = strrchr(file, '/');
    char site[192];
    snprintf(site, sizeof site, "%s:%d: %s", base ? base + 1 : file, line, what);
#ifdef FLX_HAVE_CUDA
    (void)cudaGetLastError();
#endif
    return flx_status_from_cuda(cuda_err, site);
}

flx_status_t flx_cuda_stream_create(int device, flx_cuda_stream_t *stream_p)
{
    if (!stream_p) return flx_error_set(FLX_ERR_INVALID, "cuda stream create: NULL argument");
#ifdef FLX_HAVE_CUDA
    int prev = device; /* "no switch" until device_enter says otherwise */
    flx_status_t st = device_enter(device, "cudaStreamCreateWithFlags", &prev);
    if (st != FLX_OK) return st;
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamCreateWithFlags");
    *stream_p = s;
    return FLX_OK;
#else
    return device_check(device, "cudaStreamCreateWithFlags");
#endif
}

void flx_cuda_stream_destroy(int device, flx_cuda_stream_t stream)
{
    if (!stream) return;
#ifdef FLX_HAVE_CUDA
    int prev = device;
    if (device_enter(device, "cudaStreamDestroy", &prev) != FLX_OK) return;
    /* cudaStreamDestroy returns at once and releases the stream when its work is done; waiting
     * first means no queued copy still writes into memory the caller frees next. */
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
    (void)cudaGetLastError();
    device_leave(device, prev);
#else
    (void)device;
#endif
}

flx_status_t flx_cuda_stream_sync(int device, flx_cuda_stream_t stream)
{
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaStreamSynchronize", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaStreamSynchronize(stream);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaStreamSynchronize");
#else
    (void)stream;
    return device_check(device, "cudaStreamSynchronize");
#endif
}

flx_status_t flx_cuda_copy_dtoh_async(int device, void *dst, const void *src_dev, size_t len,
                                      flx_cuda_stream_t stream)
{
    if (len == 0) return FLX_OK;
    if (!dst || !src_dev)
        return flx_error_set(FLX_ERR_INVALID, "async device-to-host copy of %zu bytes: NULL pointer", len);
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "async device-to-host copy", &prev);
    if (st != FLX_OK) return st;
    if ((st = injected_fault("async device-to-host copy")) != FLX_OK) {
        device_leave(device, prev);
        return st;
    }
    cudaError_t e = cudaMemcpyAsync(dst, src_dev, len, cudaMemcpyDeviceToHost, stream);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "async device-to-host copy");
#else
    (void)stream;
    return device_check(device, "async device-to-host copy");
#endif
}

flx_status_t flx_cuda_host_alloc(size_t len, void **p_p)
{
    if (!p_p || len == 0)
        return flx_error_set(FLX_ERR_INVALID, "page-locked allocation of %zu bytes: NULL or empty", len);
    if (flx_cuda_device_count() == 0)
        return flx_error_set(FLX_ERR_NO_DEVICE, "page-locked allocation of %zu bytes: no CUDA device", len);
#ifdef FLX_HAVE_CUDA
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, len, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        char what[80];
        snprintf(what, sizeof what, "cudaHostAlloc of %zu bytes", len);
        return cuda_fail(e, what);
    }
    *p_p = p;
    return FLX_OK;
#else
    return FLX_ERR_NO_DEVICE;
#endif
}

void flx_cuda_host_free(void *p)
{
#ifdef FLX_HAVE_CUDA
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
#else
    (void)p;
#endif
}

int flx_cuda_host_is_pinned(const void *p)
{
    if (!p || flx_cuda_device_count() == 0) return 0;
#ifdef FLX_HAVE_CUDA
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
#else
    return 0;
#endif
}

flx_status_t flx_cuda_host_device_ptr(int device, const void *host, const void **dev_p)
{
    if (!host || !dev_p) return flx_error_set(FLX_ERR_INVALID, "host device pointer: NULL argument");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaHostGetDevicePointer", &prev);
    if (st != FLX_OK) return st;
    void *d = NULL;
    cudaError_t e = cudaHostGetDevicePointer(&d, (void *)host, 0);
    device_leave(device, prev);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaHostGetDevicePointer of %p (page-locked and mapped?)", host);
        return cuda_fail(e, what);
    }
    *dev_p = d;
    return FLX_OK;
#else
    return device_check(device, "cudaHostGetDevicePointer");
#endif
}

/* The asynchronous host-to-device copies: height rows of width bytes (one row: a plain copy, any
 * length), what naming the call in errors. The callers have checked their arguments. */
static flx_status_t htod_async(int device, void *dst_dev, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width, size_t height, flx_cuda_stream_t stream, const char *what)
{
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, what, &prev);
    if (st != FLX_OK) return st;
    if ((st = injected_fault(what)) != FLX_OK) {
        device_leave(device, prev);
        return st;
    }
    cudaError_t e =
        height == 1 ? cudaMemcpyAsync(dst_dev, src, width, cudaMemcpyHostToDevice, stream)
                    : cudaMemcpy2DAsync(dst_dev, dst_pitch, src, src_pitch, width, height, cudaMemcpyHostToDevice,
                                        stream);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, what);
#else
    (void)dst_dev, (void)dst_pitch, (void)src, (void)src_pitch, (void)width, (void)height, (void)stream;
    return device_check(device, what);
#endif
}

flx_status_t flx_cuda_copy_htod_2d_async(int device, void *dst_dev, size_t dst_pitch, const void *src, size_t src_pitch,
                                         size_t width, size_t height, flx_cuda_stream_t stream)
{
    if (width == 0 || height == 0) return FLX_OK;
    if (!dst_dev || !src || dst_pitch < width || src_pitch < width || dst_pitch > INT_MAX || src_pitch > INT_MAX)
        return flx_error_set(FLX_ERR_INVALID, "async 2D host-to-device copy: NULL pointer or pitch (%zu, %zu) not in "
                             "width %zu..INT_MAX", dst_pitch, src_pitch, width);
    return htod_async(device, dst_dev, dst_pitch, src, src_pitch, width, height, stream,
                      "async 2D host-to-device copy");
}

flx_status_t flx_cuda_copy_htod_async(int device, void *dst_dev, const void *src, size_t len,
                                      flx_cuda_stream_t stream)
{
    if (len == 0) return FLX_OK;
    if (!dst_dev || !src)
        return flx_error_set(FLX_ERR_INVALID, "async host-to-device copy of %zu bytes: NULL pointer", len);
    return htod_async(device, dst_dev, len, src, len, len, 1, stream, "async host-to-device copy");
}

flx_status_t flx_cuda_memset_async(int device, void *dst_dev, int byte, size_t len, flx_cuda_stream_t stream)
{
    if (len == 0) return FLX_OK;
    if (!dst_dev) return flx_error_set(FLX_ERR_INVALID, "async memset of %zu bytes: NULL pointer", len);
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaMemsetAsync", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaMemsetAsync(dst_dev, byte, len, stream);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaMemsetAsync");
#else
    (void)byte, (void)stream;
    return device_check(device, "cudaMemsetAsync");
#endif
}

/* ---- events ---- */

flx_status_t flx_cuda_event_create(int device, int timing, flx_cuda_event_t *ev_p)
{
    if (!ev_p) return flx_error_set(FLX_ERR_INVALID, "cuda event create: NULL argument");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaEventCreateWithFlags", &prev);
    if (st != FLX_OK) return st;
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventCreateWithFlags");
    *ev_p = ev;
    return FLX_OK;
#else
    (void)timing;
    return device_check(device, "cudaEventCreateWithFlags");
#endif
}

void flx_cuda_event_destroy(int device, flx_cuda_event_t ev)
{
    if (!ev) return;
#ifdef FLX_HAVE_CUDA
    int prev = device;
    if (device_enter(device, "cudaEventDestroy", &prev) != FLX_OK) return;
    if (cudaEventDestroy(ev) != cudaSuccess) (void)cudaGetLastError();
    device_leave(device, prev);
#else
    (void)device;
#endif
}

flx_status_t flx_cuda_event_record(int device, flx_cuda_event_t ev, flx_cuda_stream_t stream)
{
    if (!ev) return flx_error_set(FLX_ERR_INVALID, "cuda event record: NULL event");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaEventRecord", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaEventRecord(ev, stream);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaEventRecord");
#else
    (void)stream;
    return device_check(device, "cudaEventRecord");
#endif
}

flx_status_t flx_cuda_event_query(int device, flx_cuda_event_t ev)
{
    if (!ev) return flx_error_set(FLX_ERR_INVALID, "cuda event query: NULL event");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaEventQuery", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaEventQuery(ev);
    device_leave(device, prev);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return FLX_INPROGRESS;
    }
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaEventQuery");
#else
    return device_check(device, "cudaEventQuery");
#endif
}

flx_status_t flx_cuda_event_sync(int device, flx_cuda_event_t ev)
{
    if (!ev) return flx_error_set(FLX_ERR_INVALID, "cuda event sync: NULL event");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaEventSynchronize", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaEventSynchronize(ev);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaEventSynchronize");
#else
    return device_check(device, "cudaEventSynchronize");
#endif
}

flx_status_t flx_cuda_event_elapsed_ns(int device, flx_cuda_event_t a, flx_cuda_event_t b, uint64_t *ns_p)
{
    if (!a || !b || !ns_p) return flx_error_set(FLX_ERR_INVALID, "cuda event elapsed: NULL argument");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaEventElapsedTime", &prev);
    if (st != FLX_OK) return st;
    float ms = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, a, b);
    device_leave(device, prev);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventElapsedTime");
    *ns_p = ms > 0.0f ? (uint64_t)((double)ms * 1e6 + 0.5) : 0;
    return FLX_OK;
#else
    return device_check(device, "cudaEventElapsedTime");
#endif
}

flx_status_t flx_cuda_stream_wait_event(int device, flx_cuda_stream_t stream, flx_cuda_event_t ev)
{
    if (!ev) return flx_error_set(FLX_ERR_INVALID, "cuda stream wait event: NULL event");
#ifdef FLX_HAVE_CUDA
    int prev = device;
    flx_status_t st = device_enter(device, "cudaStreamWaitEvent", &prev);
    if (st != FLX_OK) return st;
    cudaError_t e = cudaStreamWaitEvent(stream, ev, 0);
    device_leave(device, prev);
    return e == cudaSuccess ? FLX_OK : cuda_fail(e, "cudaStreamWaitEvent");
#else
    (void)stream;
    return device_check(device, "cudaStreamWaitEvent");
#endif
}
