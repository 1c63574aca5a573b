// gpusim: a CPU stand-in for the CUDA runtime, cuBLAS and kernel launches, so the project's GPU
// code (the .cu kernels, the orchestration in forward_gpu.c, the engine's GPU path, the kvstore's
// device windows and pinned arena, the scheduler's GPU worker) runs its `gpu` tests on a machine
// without a GPU. A development aid, never linked into the project's libraries; scripts/gpusim/run.sh
// builds and runs it.
//
// WHAT IT MODELS
//  - kernels: the real .cu source (launches rewritten by transform.py into sim_launch_k calls),
//    compiled by the host C++ compiler against cuda_runtime.h in this folder; each block runs on a
//    pool of blockDim.x host threads, __syncthreads and every warp shuffle or vote are real
//    barriers, atomics are real atomics, and the dynamic shared memory is a heap block of exactly
//    the launch's size (ASan sees overruns); a launch asking for more than 48 KiB without
//    cudaFuncSetAttribute fails as on a device; one kernel runs at a time (one simulated SM);
//  - asynchrony: every stream (the legacy default stream included) is a host thread that runs its
//    operations in order, later than they were queued. A launch or an asynchronous copy returns at
//    once; the kernel's arguments are copied at the launch; a copy from or to page-locked memory
//    reads or writes it when the stream gets there (so a staging buffer rewritten too early is
//    seen), while a copy from pageable memory takes its bytes at the call and a copy into pageable
//    memory waits for the stream, as the runtime documents. cudaStreamSynchronize, events
//    (record, query, synchronize, elapsed time, cudaStreamWaitEvent), cudaDeviceSynchronize and the
//    implicit synchronisation of cudaFree / cudaFreeHost / cudaHostUnregister follow the runtime;
//    synchronous copies run on the legacy stream, which non-blocking streams do not wait for;
//  - device memory: cudaMalloc maps pages that are PROT_NONE except while a kernel, a copy or a
//    GEMM runs, so host code that dereferences a device pointer faults; copies check that their
//    device side is device memory and their host side is not;
//  - page-locked and mapped host memory: cudaHostAlloc and cudaHostRegister (with
//    cudaHostRegisterMapped) move the pages onto a shared-memory file and map it a second time at
//    another address, the device's view (cudaHostGetDevicePointer; cudaPointerGetAttributes
//    reports both). The device view is coherent with the host's, and, like device memory, is
//    readable only while device work runs: host code that uses a device pointer of host memory
//    faults. cudaHostGetDevicePointer refuses memory that was registered without the Mapped flag
//    or never page-locked. Registering a range twice is refused, as by the runtime;
//  - cuBLAS: cublasGemmEx for bf16 A / B, fp32 C, CUBLAS_COMPUTE_32F, with the documented
//    column-major semantics (op(A) m x k, lda, ...), fp32 accumulation, queued on the handle's
//    stream; a GEMM without a user workspace (cublasSetWorkspace) is an error, as the project
//    promises not to need cuBLAS's pool;
//  - cudaPointerGetAttributes (device / host / unregistered), one device of 16 GiB whose free
//    memory follows the allocations.
// WHAT IT DOES NOT
//  - a kernel that reads host memory through its host address instead of its device view is not
//    caught (the device's loads cannot be intercepted); kernels run one block at a time, so races
//    between blocks of one kernel, and between kernels of different streams, are not exercised;
//  - real numerics of tensor cores, real timing (event times are host wall-clock times of a slow
//    simulation), occupancy, bank conflicts, register limits, PCIe bandwidth;
//  - a device-side fault is a host crash when the stream reaches it, not an error status at the
//    next synchronisation.
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <sys/mman.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

thread_local uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local char *sim_dyn_smem;

[[noreturn]] static void die(const char *fmt, const char *what, const void *p, size_t n)
{
    fprintf(stderr, fmt, what, p, n);
    abort();
}

// ---- memory registry ----
enum Kind { K_DEVICE, K_HOST, K_VIEW };   // device memory, page-locked host memory, its device view
struct Alloc {
    size_t len, map_len;   // bytes asked for, bytes mapped
    Kind kind;
    char *view;            // K_HOST mapped: the device view's address; K_VIEW: the host address
    int fd;                // K_HOST with a view: the shared-memory file (-1 otherwise)
    bool mapped;           // K_HOST: cudaHostGetDevicePointer allowed
    bool own;              // K_HOST: cudaHostAlloc (freed with cudaFreeHost) rather than registered
};
static std::map<uintptr_t, Alloc> g_allocs;
static std::recursive_mutex g_mu;
static size_t g_dev_used;
static int g_open;   // nesting depth of device access (kernels, copies, GEMMs)

static void protect_all(int prot)
{
    for (auto &a : g_allocs)
        if (a.second.kind != K_HOST) mprotect((void *)a.first, a.second.map_len, prot);
}
// Device pages (and device views of host memory) are readable and writable only inside a
// DevAccess scope.
struct DevAccess {
    DevAccess()
    {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        if (g_open++ == 0) protect_all(PROT_READ | PROT_WRITE);
    }
    ~DevAccess()
    {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        if (--g_open == 0) protect_all(PROT_NONE);
    }
};

// The allocation holding p (its start in *base, a copy in *a); false when p is in none.
static bool find(const void *p, uintptr_t *base, Alloc *a)
{
    std::lock_guard<std::recursive_mutex> l(g_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return false;
    --it;
    if ((uintptr_t)p >= it->first + (it->second.len ? it->second.len : 1)) return false;
    *base = it->first;
    *a = it->second;
    return true;
}
static int kind_of(const void *p)
{
    uintptr_t b;
    Alloc a;
    return find(p, &b, &a) ? (int)a.kind : -1;
}
// A range the device may read or write: device memory or a device view of page-locked memory.
static void must_be_device(const void *p, size_t len, const char *what)
{
    uintptr_t b0 = 0, b1 = 1;
    Alloc a, b;
    const bool ok = find(p, &b0, &a) && (len == 0 || find((const char *)p + len - 1, &b1, &b)) &&
                    (len == 0 || b0 == b1) && a.kind != K_HOST;
    if (!ok) die("gpusim: %s: %p (+%zu bytes) is not device memory\n", what, p, len);
}
static bool is_pinned(const void *p) { return kind_of(p) == K_HOST; }

// ---- streams and events ----
struct CUstream_st {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool busy = false;
    bool blocking = true;
    std::thread th;
    explicit CUstream_st(bool b) : blocking(b)
    {
        th = std::thread([this] { run(); });
    }
    void run()
    {
        for (;;) {
            std::function<void()> op;
            {
                std::unique_lock<std::mutex> l(m);
                cv.wait(l, [this] { return !q.empty(); });
                op = std::move(q.front());
                q.pop_front();
                busy = true;
            }
            if (!op) return;   // the stop marker
            op();
            {
                std::lock_guard<std::mutex> l(m);
                busy = false;
            }
            cv.notify_all();
        }
    }
    void push(std::function<void()> op)
    {
        {
            std::lock_guard<std::mutex> l(m);
            q.push_back(std::move(op));
        }
        cv.notify_all();
    }
    void drain()
    {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l, [this] { return q.empty() && !busy; });
    }
    bool idle()
    {
        std::lock_guard<std::mutex> l(m);
        return q.empty() && !busy;
    }
    void stop()
    {
        drain();
        push(nullptr);
        th.join();
    }
};
static std::mutex g_streams_mu;
static std::set<CUstream_st *> g_streams;   // user streams alive
static CUstream_st *legacy()
{
    static CUstream_st *s = new CUstream_st(true);   // never destroyed: its thread outlives main
    return s;
}
static void drain_all()
{
    std::vector<CUstream_st *> v;
    {
        std::lock_guard<std::mutex> l(g_streams_mu);
        v.assign(g_streams.begin(), g_streams.end());
    }
    legacy()->drain();
    for (auto *s : v) s->drain();
}
// The stream an operation goes to, with the legacy stream's implicit ordering: work on the legacy
// stream waits for blocking streams and work on a blocking stream for the legacy one (done here by
// draining them first: stricter than the device, never looser). Non-blocking streams order with
// nothing but themselves.
static CUstream_st *stream_for(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
        std::vector<CUstream_st *> v;
        {
            std::lock_guard<std::mutex> l(g_streams_mu);
            for (auto *x : g_streams)
                if (x->blocking) v.push_back(x);
        }
        for (auto *x : v) x->drain();
        return legacy();
    }
    if (s->blocking) legacy()->drain();
    return s;
}

struct EvState {
    std::mutex m;
    std::condition_variable cv;
    uint64_t gen = 0;       // records so far
    uint64_t done_gen = 0;  // the last record the stream reached
    double t_ms = 0;        // when it did (host clock)
    bool timing = true;
};
struct CUevent_st {
    std::shared_ptr<EvState> st = std::make_shared<EvState>();
};
static double now_ms()
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static thread_local cudaError_t t_last = cudaSuccess;
static int g_dev = 0;

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = g_dev; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError(void) { cudaError_t e = t_last; t_last = cudaSuccess; return e; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "gpusim error" : "no error"; }
cudaError_t cudaDeviceSynchronize(void) { drain_all(); return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    std::lock_guard<std::recursive_mutex> l(g_mu);
    *t = (size_t)16 << 30;
    *f = *t - g_dev_used;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    const size_t map_len = (n + 4095) / 4096 * 4096;
    void *m = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    memset(m, 0xA5, n);   // garbage, as fresh device memory
    std::lock_guard<std::recursive_mutex> l(g_mu);
    g_allocs[(uintptr_t)m] = {n, map_len, K_DEVICE, nullptr, -1, false, false};
    g_dev_used += n;
    if (g_open == 0) mprotect(m, map_len, PROT_NONE);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    drain_all();   // cudaFree synchronises the device
    std::lock_guard<std::recursive_mutex> l(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != K_DEVICE) return cudaErrorInvalidValue;
    g_dev_used -= it->second.len;
    munmap(p, it->second.map_len);
    g_allocs.erase(it);
    return cudaSuccess;
}

// Page-locks [p, p + len) rounded out to pages: the pages move onto a shared-memory file (their
// bytes kept) so that a second mapping of it, the device view, sees the same memory.
static cudaError_t pin(char *p, size_t len, bool mapped, bool own)
{
    const uintptr_t a0 = (uintptr_t)p & ~(uintptr_t)4095, a1 = ((uintptr_t)p + len + 4095) & ~(uintptr_t)4095;
    const size_t sz = a1 - a0;
    std::lock_guard<std::recursive_mutex> l(g_mu);
    for (auto &a : g_allocs)
        if (a.second.kind == K_HOST) {
            const uintptr_t b0 = a.first & ~(uintptr_t)4095, b1 = (a.first + a.second.len + 4095) & ~(uintptr_t)4095;
            if (b0 < a1 && a0 < b1) return cudaErrorHostMemoryAlreadyRegistered;
        }
    int fd = memfd_create("gpusim-pinned", 0);
    if (fd < 0 || ftruncate(fd, (off_t)sz) != 0) return cudaErrorMemoryAllocation;
    if (!own && pwrite(fd, (void *)a0, sz, 0) != (ssize_t)sz) {
        close(fd);
        return cudaErrorInvalidValue;
    }
    if (mmap((void *)a0, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) abort();
    char *view = (char *)mmap(nullptr, sz, g_open ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, 0);
    if (view == MAP_FAILED) abort();
    g_allocs[(uintptr_t)p] = {len, sz, K_HOST, view + ((uintptr_t)p - a0), fd, mapped, own};
    g_allocs[(uintptr_t)view + ((uintptr_t)p - a0)] = {len, sz, K_VIEW, p, -1, false, false};
    return cudaSuccess;
}
// Undoes pin: the pages become private anonymous memory again, with their bytes.
static cudaError_t unpin(void *p, bool own)
{
    drain_all();
    std::lock_guard<std::recursive_mutex> l(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.kind != K_HOST || it->second.own != own) return cudaErrorInvalidValue;
    Alloc a = it->second;
    const uintptr_t a0 = (uintptr_t)p & ~(uintptr_t)4095;
    char *v0 = a.view - ((uintptr_t)p - a0);
    g_allocs.erase((uintptr_t)a.view);
    g_allocs.erase(it);
    munmap(v0, a.map_len);
    if (own) {
        munmap((void *)a0, a.map_len);
    } else {
        std::vector<char> keep(a.map_len);
        memcpy(keep.data(), (void *)a0, a.map_len);
        if (mmap((void *)a0, a.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
            MAP_FAILED)
            abort();
        memcpy((void *)a0, keep.data(), a.map_len);
    }
    close(a.fd);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int)
{
    // On a device with unified addressing every cudaHostAlloc buffer is mapped.
    const size_t sz = (n + 4095) / 4096 * 4096;
    void *m = mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
    cudaError_t e = pin((char *)m, n, true, true);
    if (e != cudaSuccess) {
        munmap(m, sz);
        return e;
    }
    memset(m, 0x5A, n);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) { return p ? unpin(p, true) : cudaSuccess; }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
    if (!p || n == 0) return cudaErrorInvalidValue;
    return pin((char *)p, n, (flags & cudaHostRegisterMapped) != 0, false);
}
cudaError_t cudaHostUnregister(void *p) { return unpin(p, false); }
cudaError_t cudaHostGetDevicePointer(void **pd, void *ph, unsigned int flags)
{
    uintptr_t b;
    Alloc a;
    if (flags != 0 || !find(ph, &b, &a) || a.kind != K_HOST || !a.mapped) return cudaErrorInvalidValue;
    *pd = a.view + ((uintptr_t)ph - b);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p)
{
    memset(at, 0, sizeof *at);
    uintptr_t b;
    Alloc a;
    at->type = cudaMemoryTypeUnregistered;
    if (!find(p, &b, &a)) return cudaSuccess;
    const size_t off = (uintptr_t)p - b;
    at->device = 0;
    if (a.kind == K_DEVICE) {
        at->type = cudaMemoryTypeDevice;
        at->devicePointer = (void *)p;
    } else if (a.kind == K_HOST) {
        at->type = cudaMemoryTypeHost;
        at->hostPointer = (void *)p;
        at->devicePointer = a.mapped ? a.view + off : nullptr;
    } else {
        at->type = cudaMemoryTypeHost;
        at->hostPointer = a.view + off;
        at->devicePointer = (void *)p;
    }
    return cudaSuccess;
}

static void check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind k, const char *what)
{
    if (k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice) must_be_device(dst, n, what);
    if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice) must_be_device(src, n, what);
    if (k == cudaMemcpyHostToDevice && kind_of(src) != -1 && kind_of(src) != K_HOST)
        die("gpusim: %s: the host source %p (+%zu bytes) is device memory\n", what, src, n);
    if (k == cudaMemcpyDeviceToHost && kind_of(dst) != -1 && kind_of(dst) != K_HOST)
        die("gpusim: %s: the host destination %p (+%zu bytes) is device memory\n", what, dst, n);
    if (k != cudaMemcpyHostToDevice && k != cudaMemcpyDeviceToHost && k != cudaMemcpyDeviceToDevice)
        die("gpusim: %s: copy kind not modelled (%p, %zu)\n", what, dst, n);
}
// Queues a copy on st with the runtime's rules for pageable host memory (see WHAT IT MODELS).
static void copy_on(CUstream_st *st, void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    if (k == cudaMemcpyHostToDevice && !is_pinned(src)) {
        auto snap = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        st->push([dst, snap, n] {
            DevAccess da;
            memcpy(dst, snap->data(), n);
        });
    } else if (k == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
        st->push([dst, src, n] {
            DevAccess da;
            memcpy(dst, src, n);
        });
        st->drain();
    } else {
        st->push([dst, src, n] {
            DevAccess da;
            memcpy(dst, src, n);
        });
    }
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    check_copy(dst, src, n, k, "cudaMemcpy");
    CUstream_st *st = stream_for(nullptr);
    copy_on(st, dst, src, n, k);
    st->drain();
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s)
{
    check_copy(dst, src, n, k, "cudaMemcpyAsync");
    copy_on(stream_for(s), dst, src, n, k);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k)
{
    CUstream_st *st = stream_for(nullptr);
    for (size_t r = 0; r < h; r++) {
        check_copy((char *)dst + r * dp, (const char *)src + r * sp, w, k, "cudaMemcpy2D");
        copy_on(st, (char *)dst + r * dp, (const char *)src + r * sp, w, k);
    }
    st->drain();
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t s)
{
    CUstream_st *st = stream_for(s);
    for (size_t r = 0; r < h; r++) {
        check_copy((char *)dst + r * dp, (const char *)src + r * sp, w, k, "cudaMemcpy2DAsync");
        copy_on(st, (char *)dst + r * dp, (const char *)src + r * sp, w, k);
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    must_be_device(dst, n, "cudaMemsetAsync");
    stream_for(s)->push([dst, v, n] {
        DevAccess da;
        memset(dst, v, n);
    });
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    auto *st = new CUstream_st((flags & cudaStreamNonBlocking) == 0);
    std::lock_guard<std::mutex> l(g_streams_mu);
    g_streams.insert(st);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s) return cudaErrorInvalidResourceHandle;
    {
        std::lock_guard<std::mutex> l(g_streams_mu);
        if (!g_streams.erase(s)) return cudaErrorInvalidResourceHandle;
    }
    s->stop();   // the runtime lets queued work finish; so does this
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    stream_for(s)->drain();
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return stream_for(s)->idle() ? cudaSuccess : cudaErrorNotReady; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    *e = new CUevent_st();
    (*e)->st->timing = (flags & cudaEventDisableTiming) == 0;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;   // a queued record keeps the state alive through its shared pointer
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return cudaErrorInvalidResourceHandle;
    std::shared_ptr<EvState> st = e->st;
    uint64_t g;
    {
        std::lock_guard<std::mutex> l(st->m);
        g = ++st->gen;
    }
    stream_for(s)->push([st, g] {
        {
            std::lock_guard<std::mutex> l(st->m);
            if (g > st->done_gen) {
                st->done_gen = g;
                st->t_ms = now_ms();
            }
        }
        st->cv.notify_all();
    });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e) return cudaErrorInvalidResourceHandle;
    std::lock_guard<std::mutex> l(e->st->m);
    return e->st->done_gen >= e->st->gen ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e) return cudaErrorInvalidResourceHandle;
    std::unique_lock<std::mutex> l(e->st->m);
    const uint64_t g = e->st->gen;
    e->st->cv.wait(l, [&] { return e->st->done_gen >= g; });
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!a || !b || !ms) return cudaErrorInvalidValue;
    std::unique_lock<std::mutex> la(a->st->m), lb;
    if (b->st != a->st) lb = std::unique_lock<std::mutex>(b->st->m);
    if (!a->st->timing || !b->st->timing) return cudaErrorInvalidResourceHandle;
    if (a->st->gen == 0 || b->st->gen == 0) return cudaErrorInvalidResourceHandle;
    if (a->st->done_gen < a->st->gen || b->st->done_gen < b->st->gen) return cudaErrorNotReady;
    *ms = (float)(b->st->t_ms - a->st->t_ms);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int)
{
    if (!e) return cudaErrorInvalidResourceHandle;
    std::shared_ptr<EvState> st = e->st;
    uint64_t g;
    {
        std::lock_guard<std::mutex> l(st->m);
        g = st->gen;   // the record most recent at the call, as the runtime waits for
    }
    stream_for(s)->push([st, g] {
        std::unique_lock<std::mutex> l(st->m);
        st->cv.wait(l, [&] { return st->done_gen >= g; });
    });
    return cudaSuccess;
}

static std::map<const void *, int> g_smem_attr;
cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int v)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > 227 * 1024) return cudaErrorInvalidValue;
    std::lock_guard<std::recursive_mutex> l(g_mu);
    g_smem_attr[fn] = v;
    return cudaSuccess;
}

// ---- cuBLAS ----
struct cublasContext {
    cudaStream_t s;
    void *ws;
    size_t wsb;
};
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) { *h = new cublasContext(); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    h->s = s;
    h->ws = nullptr;   // as documented: SetStream resets the workspace to cuBLAS's own pool
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *w, size_t n)
{
    must_be_device(w, n, "cublasSetWorkspace");
    if ((uintptr_t)w % 256) return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = w, h->wsb = n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t) { return "gpusim status"; }

static float bf(const uint16_t *p)
{
    uint32_t u = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t)
{
    if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!h->ws) {
        fprintf(stderr, "gpusim: cublasGemmEx without a user workspace\n");
        abort();
    }
    if (m <= 0 || n <= 0 || k <= 0 || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    const uint16_t *a = (const uint16_t *)A, *b = (const uint16_t *)B;
    float *c = (float *)C;
    const float al = *(const float *)alpha, be = *(const float *)beta;   // host pointer mode: read at the call
    // op(A) is m x k, op(B) is k x n, C is m x n, all column-major
    must_be_device(A, (ta == CUBLAS_OP_N ? (size_t)(k - 1) * lda + m : (size_t)(m - 1) * lda + k) * 2, "gemm A");
    must_be_device(B, (tb == CUBLAS_OP_N ? (size_t)(n - 1) * ldb + k : (size_t)(k - 1) * ldb + n) * 2, "gemm B");
    must_be_device(C, ((size_t)(n - 1) * ldc + m) * 4, "gemm C");
    stream_for(h->s)->push([=] {
        DevAccess da;
#pragma omp parallel for schedule(static)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int p = 0; p < k; p++) {
                    const float x = ta == CUBLAS_OP_N ? bf(a + i + (size_t)p * lda) : bf(a + p + (size_t)i * lda);
                    const float y = tb == CUBLAS_OP_N ? bf(b + p + (size_t)j * ldb) : bf(b + j + (size_t)p * ldb);
                    acc = fmaf(x, y, acc);
                }
                float *cp = c + i + (size_t)j * ldc;
                *cp = al * acc + (be != 0.0f ? be * *cp : 0.0f);
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// ---- kernel launches ----
struct Warp {
    std::barrier<> bar{32};
    float f[2][32];     // shuffles alternate between two buffers: one barrier per shuffle
    double d[2][32];
    unsigned u[2][32];
};
// A block's threads. Between blocks (and while another block size's pool runs) they sleep on a
// condition variable: std::barrier spins and yields before it sleeps, and hundreds of idle
// simulated threads yielding would starve the ones doing the work.
struct Pool {
    unsigned nt;
    std::barrier<> block_bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<std::thread> th;
    std::function<void()> body;
    uint3 bidx;
    char *smem;
    std::mutex m;
    std::condition_variable cv;
    uint64_t gen = 0;        // blocks started
    unsigned running = 0;    // threads still in the current block
    explicit Pool(unsigned n) : nt(n), block_bar(n)
    {
        for (unsigned w = 0; w < n / 32; w++) warps.emplace_back(new Warp());
        for (unsigned t = 0; t < n; t++) th.emplace_back([this, t] { run(t); });
    }
    void run(unsigned t);
    void block(uint3 b, char *sm)   // runs one block on the pool's threads and waits for it
    {
        std::unique_lock<std::mutex> l(m);
        bidx = b;
        smem = sm;
        running = nt;
        gen++;
        cv.notify_all();
        cv.wait(l, [this] { return running == 0; });
    }
};
static thread_local Pool *t_pool;
static thread_local Warp *t_warp;
static thread_local unsigned t_lane, t_phase;

void Pool::run(unsigned t)
{
    t_pool = this;
    t_warp = warps[t / 32].get();
    t_lane = t % 32;
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> l(m);
            cv.wait(l, [&] { return gen != seen; });
            seen = gen;
            threadIdx = {t, 0, 0};
            blockIdx = bidx;
            sim_dyn_smem = smem;
        }
        t_phase = 0;
        body();
        std::lock_guard<std::mutex> l(m);
        if (--running == 0) cv.notify_all();
    }
}

void __syncthreads(void) { t_pool->block_bar.arrive_and_wait(); }
void __syncwarp(unsigned) { t_warp->bar.arrive_and_wait(); }
// A lane writes buffer (phase & 1) and reads it after the barrier; it writes that buffer again two
// exchanges later, past the next barrier, which no lane reaches before it has read this one.
template <class T>
static T exchange(T (&buf)[2][32], T v, unsigned from)
{
    const unsigned ph = t_phase++ & 1u;
    buf[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    return buf[ph][from & 31u];
}
float __shfl_xor_sync(unsigned, float v, int m) { return exchange(t_warp->f, v, t_lane ^ (unsigned)m); }
double __shfl_xor_sync(unsigned, double v, int m) { return exchange(t_warp->d, v, t_lane ^ (unsigned)m); }
unsigned __shfl_xor_sync(unsigned, unsigned v, int m) { return exchange(t_warp->u, v, t_lane ^ (unsigned)m); }
float __shfl_sync(unsigned, float v, int src) { return exchange(t_warp->f, v, (unsigned)src); }
unsigned __shfl_sync(unsigned, unsigned v, int src) { return exchange(t_warp->u, v, (unsigned)src); }
unsigned __shfl_up_sync(unsigned, unsigned v, unsigned delta)
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->u[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    return t_lane >= delta ? t_warp->u[ph][t_lane - delta] : v;
}
unsigned __ballot_sync(unsigned, int pred)
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->u[ph][t_lane] = pred ? 1u : 0u;
    t_warp->bar.arrive_and_wait();
    unsigned m = 0;
    for (unsigned l = 0; l < 32; l++) m |= t_warp->u[ph][l] << l;
    return m;
}

unsigned __match_any_sync(unsigned, unsigned v)   // the lanes holding the same v as this one
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->u[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    unsigned m = 0;
    for (unsigned l = 0; l < 32; l++) m |= (t_warp->u[ph][l] == v ? 1u : 0u) << l;
    return m;
}

static std::map<unsigned, Pool *> g_pools;   // pools live until exit (their threads never end)
static std::mutex g_kernel_mu;               // one kernel at a time: one simulated multiprocessor

void sim_launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body)
{
    if (grid.x == 0 || grid.y == 0 || grid.z != 1 || block.x == 0 || block.x > 1024 || block.x % 32 || block.y != 1 ||
        block.z != 1 || grid.y > 65535) {
        t_last = cudaErrorInvalidConfiguration;
        return;
    }
    int limit = 48 * 1024;
    {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        auto it = g_smem_attr.find(fn);
        if (it != g_smem_attr.end()) limit = it->second;
    }
    if ((long)smem > limit) {
        t_last = cudaErrorInvalidValue;
        return;
    }
    stream_for(s)->push([grid, block, smem, body] {
        std::lock_guard<std::mutex> kl(g_kernel_mu);
        Pool *&p = g_pools[block.x];
        if (!p) p = new Pool(block.x);
        gridDim = grid;
        blockDim = block;
        p->body = body;
        DevAccess da;
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                char *sm = smem ? (char *)malloc(smem) : nullptr;   // exact size: ASan catches overruns
                if (sm) memset(sm, 0xCD, smem);
                p->block({bx, by, 0}, sm);
                free(sm);
            }
    });
}
