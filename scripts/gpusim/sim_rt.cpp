// gpusim: a CPU stand-in for the CUDA runtime, cuBLAS and kernel launches, so the project's GPU
// code (the .cu kernels, the orchestration in forward_gpu.c, the engine's GPU path, the kvstore's
// device windows) runs its `gpu` tests on a machine without a GPU. A development aid, never
// linked into the project's libraries; scripts/gpusim/run.sh builds and runs it.
//
// WHAT IT MODELS
//  - kernels: the real .cu source (launches rewritten by transform.py into sim_launch calls),
//    compiled by the host C++ compiler against cuda_runtime.h in this folder; each block runs on a
//    pool of blockDim.x host threads, __syncthreads and every warp shuffle are real barriers, and
//    the dynamic shared memory is a heap block of exactly the launch's size (ASan sees overruns);
//    a launch asking for more than 48 KiB without cudaFuncSetAttribute fails as on a device;
//  - device memory: cudaMalloc maps pages that are PROT_NONE except while a kernel, a copy or a
//    GEMM runs, so host code that dereferences a device pointer faults; copies check that their
//    device side is device memory and their host side is not;
//  - cuBLAS: cublasGemmEx for bf16 A / B, fp32 C, CUBLAS_COMPUTE_32F, with the documented
//    column-major semantics (op(A) m x k, lda, ...), fp32 accumulation; a GEMM without a user
//    workspace (cublasSetWorkspace) is an error, as the project promises not to need cuBLAS's pool;
//  - page-locked memory and cudaPointerGetAttributes (device / host / unregistered), one device
//    of 16 GiB whose free memory follows the allocations.
// WHAT IT DOES NOT
//  - asynchrony: work runs when it is queued, so a missing stream synchronisation is invisible;
//  - real numerics of tensor cores, real timing, occupancy, bank conflicts, register limits;
//  - a device-side fault reported at a later synchronisation (here it is a host crash at once).
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <sys/mman.h>

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

thread_local uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local char *sim_dyn_smem;

// ---- memory registry ----
struct Alloc {
    size_t len, map_len;
    cudaMemoryType type;
};
static std::map<uintptr_t, Alloc> g_allocs;
static std::recursive_mutex g_mu;
static size_t g_dev_used;
static int g_open;   // nesting depth of device access (kernels, copies, GEMMs)

static void protect_all(int prot)
{
    for (auto &a : g_allocs)
        if (a.second.type == cudaMemoryTypeDevice) mprotect((void *)a.first, a.second.map_len, prot);
}
// Device pages are readable and writable only inside a DevAccess scope.
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

static void reg(void *p, size_t len, size_t map_len, cudaMemoryType t)
{
    std::lock_guard<std::recursive_mutex> l(g_mu);
    g_allocs[(uintptr_t)p] = {len, map_len, t};
    if (t == cudaMemoryTypeDevice) g_dev_used += len;
}
static Alloc unreg(void *p)
{
    std::lock_guard<std::recursive_mutex> l(g_mu);
    Alloc a = {0, 0, cudaMemoryTypeUnregistered};
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) return a;
    a = it->second;
    if (a.type == cudaMemoryTypeDevice) g_dev_used -= a.len;
    g_allocs.erase(it);
    return a;
}
static cudaMemoryType type_of(const void *p)
{
    std::lock_guard<std::recursive_mutex> l(g_mu);
    auto it = g_allocs.upper_bound((uintptr_t)p);
    if (it == g_allocs.begin()) return cudaMemoryTypeUnregistered;
    --it;
    if ((uintptr_t)p < it->first + it->second.len) return it->second.type;
    return cudaMemoryTypeUnregistered;
}
static void must_be_device(const void *p, size_t len, const char *what)
{
    if (type_of(p) != cudaMemoryTypeDevice || (len && type_of((const char *)p + len - 1) != cudaMemoryTypeDevice)) {
        fprintf(stderr, "gpusim: %s: %p (+%zu bytes) is not device memory\n", what, p, len);
        abort();
    }
}

static thread_local cudaError_t t_last = cudaSuccess;
static int g_dev = 0;

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = g_dev; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetLastError(void) { cudaError_t e = t_last; t_last = cudaSuccess; return e; }
const char *cudaGetErrorString(cudaError_t e) { return e ? "gpusim error" : "no error"; }
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
    reg(m, n, map_len, cudaMemoryTypeDevice);
    if (g_open == 0) mprotect(m, map_len, PROT_NONE);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    Alloc a = unreg(p);
    if (a.type != cudaMemoryTypeDevice) return cudaErrorInvalidValue;
    munmap(p, a.map_len);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int)
{
    *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0x5A, n);
    reg(*p, n, n, cudaMemoryTypeHost);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
    if (p) unreg(p), free(p);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int) { reg(p, n, n, cudaMemoryTypeHost); return cudaSuccess; }
cudaError_t cudaHostUnregister(void *p) { unreg(p); return cudaSuccess; }
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    a->type = type_of(p);
    a->device = 0;
    a->devicePointer = a->type == cudaMemoryTypeDevice ? (void *)p : nullptr;
    a->hostPointer = a->type == cudaMemoryTypeHost ? (void *)p : nullptr;
    return cudaSuccess;
}

static void check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind k, const char *what)
{
    if (k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice) must_be_device(dst, n, what);
    if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice) must_be_device(src, n, what);
    if (k == cudaMemcpyHostToDevice && type_of(src) == cudaMemoryTypeDevice) {
        fprintf(stderr, "gpusim: %s: the host source %p is device memory\n", what, src);
        abort();
    }
    if (k == cudaMemcpyDeviceToHost && type_of(dst) == cudaMemoryTypeDevice) {
        fprintf(stderr, "gpusim: %s: the host destination %p is device memory\n", what, dst);
        abort();
    }
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    check_copy(dst, src, n, k, "cudaMemcpy");
    DevAccess da;
    memcpy(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t)
{
    check_copy(dst, src, n, k, "cudaMemcpyAsync");
    DevAccess da;
    memcpy(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k)
{
    DevAccess da;
    for (size_t r = 0; r < h; r++) {
        check_copy((char *)dst + r * dp, (const char *)src + r * sp, w, k, "cudaMemcpy2D");
        memcpy((char *)dst + r * dp, (const char *)src + r * sp, w);
    }
    return cudaSuccess;
}
struct CUstream_st { int dummy; };
struct CUevent_st { int dummy; };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) { *s = new CUstream_st(); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { delete s; return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) { *e = new CUevent_st(); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

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
    const float al = *(const float *)alpha, be = *(const float *)beta;
    // op(A) is m x k, op(B) is k x n, C is m x n, all column-major
    must_be_device(A, (ta == CUBLAS_OP_N ? (size_t)(k - 1) * lda + m : (size_t)(m - 1) * lda + k) * 2, "gemm A");
    must_be_device(B, (tb == CUBLAS_OP_N ? (size_t)(n - 1) * ldb + k : (size_t)(k - 1) * ldb + n) * 2, "gemm B");
    must_be_device(C, ((size_t)(n - 1) * ldc + m) * 4, "gemm C");
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
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// ---- kernel launches ----
struct Warp {
    std::barrier<> bar{32};
    float f[2][32];     // shuffles alternate between two buffers: one barrier per shuffle
    double d[2][32];
};
struct Pool {
    unsigned nt;
    std::barrier<> start, done, block_bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<std::thread> th;
    std::function<void()> body;
    uint3 bidx;
    char *smem;
    explicit Pool(unsigned n) : nt(n), start(n + 1), done(n + 1), block_bar(n)
    {
        for (unsigned w = 0; w < n / 32; w++) warps.emplace_back(new Warp());
        for (unsigned t = 0; t < n; t++) th.emplace_back([this, t] { run(t); });
    }
    void run(unsigned t);
};
static thread_local Pool *t_pool;
static thread_local Warp *t_warp;
static thread_local unsigned t_lane, t_phase;

void Pool::run(unsigned t)
{
    t_pool = this;
    t_warp = warps[t / 32].get();
    t_lane = t % 32;
    for (;;) {
        start.arrive_and_wait();
        threadIdx = {t, 0, 0};
        blockIdx = bidx;
        sim_dyn_smem = smem;
        t_phase = 0;
        body();
        done.arrive_and_wait();
    }
}

void __syncthreads(void) { t_pool->block_bar.arrive_and_wait(); }
// A lane writes buffer (phase & 1) and reads it after the barrier; it writes that buffer again two
// shuffles later, past the next barrier, which no lane reaches before it has read this one.
float __shfl_xor_sync(unsigned, float v, int m)
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->f[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    return t_warp->f[ph][t_lane ^ (unsigned)m];
}
double __shfl_xor_sync(unsigned, double v, int m)
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->d[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    return t_warp->d[ph][t_lane ^ (unsigned)m];
}
float __shfl_sync(unsigned, float v, int src)
{
    const unsigned ph = t_phase++ & 1u;
    t_warp->f[ph][t_lane] = v;
    t_warp->bar.arrive_and_wait();
    return t_warp->f[ph][(unsigned)src & 31u];
}

static std::map<unsigned, Pool *> g_pools;   // pools live until exit (their threads never end)

void sim_launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t, std::function<void()> body)
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
    Pool *&p = g_pools[block.x];
    if (!p) p = new Pool(block.x);
    gridDim = grid;
    blockDim = block;
    p->body = body;
    DevAccess da;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            char *s = smem ? (char *)malloc(smem) : nullptr;   // exact size: ASan catches overruns
            if (s) memset(s, 0xCD, smem);
            p->smem = s;
            p->bidx = {bx, by, 0};
            p->start.arrive_and_wait();
            p->done.arrive_and_wait();
            free(s);
        }
}
