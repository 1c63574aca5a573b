/*
 * forward_gpu.c - the GPU forward pass (flx/forward_gpu.h): the device model, the workspace plan,
 * and the decode and prefill orchestration (cuBLAS products, kernels of forward_gpu.cu and
 * flx/attn_gpu.h, transfers, the attention callback and the prefill sink).
 *
 * DESIGN
 * The orchestration is plain C over the CUDA runtime and cuBLAS C APIs, so it is compiled with the
 * project's warnings and shares its argument checks and its plan with CPU-only builds, where every
 * entry point that would touch a device answers FLX_ERR_NO_DEVICE (the plan still works: sizes are
 * arithmetic). The kernels live in forward_gpu.cu.
 *
 * Weights: one device allocation, pieces 256-byte aligned. Per layer W_qkv = [wq; wk; wv] rows
 * (Hq D + 2 Hkv D, hidden) and W_gu = [w_gate; w_up] (2 ffn, hidden), so a decode step makes five
 * products per layer (qkv, o, gate|up, down) plus the LM head. cuBLAS is column-major: a row-major
 * W (out, in) is a column-major (in, out) matrix, so y (n, out) row-major = op_T(W) x with x the
 * row-major (n, in) activations: cublasGemmEx(T, N, m = out, n, k = in, W, lda = in, x, ldb = in,
 * y, ldc = out).
 *
 * Workspace: one device block and one page-locked host block, both carved in the same order by
 * ws_carve() (the size-only pass runs it with NULL bases). The cuBLAS workspace is part of the
 * device block (cublasSetWorkspace), so cuBLAS allocates nothing per call either.
 *
 * Ordering: all device work goes on the caller's stream, in order. The host waits on the stream
 * exactly where it needs device results: before each decode attention callback (q, k, v), before
 * each prefill sink call (K, V, q' only: an event recorded after their copy, so the layer's second
 * half keeps running while the sink works), and at the end (logits). Host staging buffers are
 * rewritten only after the stream has passed the copies that read them.
 */
#include "flx/forward_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn_gpu.h"
#include "flx/progress.h"
#include "flx/util.h"
#include "forward_gpu_internal.h"

#ifdef FLX_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#endif

#define GPU_ALIGN 256u                 /* every carved part starts on cudaMalloc's alignment */
#define GPU_CHUNK_DEFAULT 256u         /* prefill tokens per projection / FFN pass */
#define GPU_CHUNK_MAX 65536u
#define GPU_LM_ROWS 32u                /* prefill rows per LM-head pass for logits_all */
#define GPU_BLAS_WS ((size_t)32 << 20) /* cuBLAS workspace: NVIDIA's recommendation for Hopper */

/* ================= the plan (every build) ================= */

typedef struct carve {
    uint8_t *base;   /* NULL during the size-only pass */
    size_t used;
} carve_t;

static void *carve(carve_t *c, size_t bytes)
{
    size_t off = FLX_ALIGN_UP(c->used, GPU_ALIGN);
    c->used = off + bytes;
    return c->base ? c->base + off : NULL;
}

typedef struct gpu_layer {
    const float *attn_norm, *ffn_norm;   /* (hidden) */
    const flx_bf16_t *wqkv;              /* (Hq D + 2 Hkv D, hidden) */
    const float *bqkv;                   /* (Hq D + 2 Hkv D), Qwen2 only, else NULL */
    const flx_bf16_t *wo;                /* (hidden, Hq D) */
    const flx_bf16_t *wgu;               /* (2 ffn, hidden) */
    const flx_bf16_t *wdown;             /* (hidden, ffn) */
} gpu_layer_t;

struct flx_gpu_model {
    int device;
    flx_model_config_t cfg;
    void *mem;                  /* device: every weight, one allocation */
    size_t bytes;
    size_t step_bytes;          /* flx_model_weight_bytes_bf16: what a decode step reads */
    const flx_bf16_t *tok_embd; /* (vocab, hidden) */
    const flx_bf16_t *lm_head;  /* (vocab, hidden); == tok_embd when tied */
    const float *out_norm;      /* (hidden) */
    const float *inv_freq;      /* (head_dim / 2) */
    gpu_layer_t *layers;        /* host array (n_layers) of device pointers */
};

/* Rows of each buffer, from the shape (resolved: prefill_chunk set). */
typedef struct dims {
    size_t H, D, half, qd, kvd, W, F, V;
    size_t P, B, C, R;   /* max prompt, max batch, chunk, LM-head rows per pass */
    size_t NX;           /* rows of the residual stream: max(P, B) */
    size_t M;            /* rows of a product's input (before splitting): max(C, R, B) */
    size_t KMAX, WMAX;   /* widest product input, widest non-head product output */
} dims_t;

static dims_t dims_of(const flx_model_config_t *c, const flx_gpu_fwd_shape_t *s)
{
    dims_t d;
    d.H = c->hidden, d.D = c->head_dim, d.half = d.D / 2;
    d.qd = (size_t)c->n_heads * d.D, d.kvd = (size_t)c->n_kv_heads * d.D, d.W = d.qd + 2 * d.kvd;
    d.F = c->ffn, d.V = c->vocab;
    d.P = s->max_prompt, d.B = s->max_batch, d.C = d.P ? FLX_MIN(d.P, (size_t)s->prefill_chunk) : 0;
    d.R = FLX_MAX(d.B, FLX_MIN(d.P, (size_t)GPU_LM_ROWS));
    d.NX = FLX_MAX(d.P, d.B);
    d.M = FLX_MAX(FLX_MAX(d.C, d.R), d.B);
    d.KMAX = FLX_MAX(FLX_MAX(d.H, d.qd), d.F);
    d.WMAX = FLX_MAX(FLX_MAX(d.W, d.H), 2 * d.F);
    return d;
}

struct flx_gpu_fwd_ws {
    flx_gpu_model_h gm;
    flx_gpu_fwd_shape_t shape;  /* prefill_chunk resolved */
    dims_t d;
#ifdef FLX_HAVE_CUDA
    cublasHandle_t blas;
    cudaEvent_t kv_ready;       /* prefill: the layer's K, V, q' are on the host */
#endif
    /* device */
    float *x;                   /* (NX, H) residual stream */
    float *q;                   /* (P, Hq D) prefill queries, RoPE applied */
    flx_bf16_t *kb, *vb;        /* (Hkv, n, D) prefill K, V of the current layer (n = its tokens) */
    float *qkv;                 /* (B, Hq D + 2 Hkv D) decode q | k | v, each batch-major */
    float *o;                   /* (max(C, B), Hq D) attention output */
    flx_bf16_t *ab;             /* split (S M, KMAX): the products' input (S = FLX_GPU_SPLIT) */
    float *y;                   /* split (S M, WMAX): the products' output */
    float *yl;                  /* split (S R, vocab): the LM head's output */
    float *lg;                  /* (R, vocab) logits */
    float *cs, *sn;             /* (NX, D / 2) RoPE table of the call's positions */
    int32_t *tok;               /* (NX) */
    uint32_t *pos;              /* (B) */
    void *blas_ws;              /* GPU_BLAS_WS bytes */
    /* host, page-locked */
    int32_t *htok;              /* (NX) */
    uint32_t *hpos;             /* (B) */
    float *hqkv;                /* (B, Hq D + 2 Hkv D) */
    float *ho;                  /* (B, Hq D) */
    flx_bf16_t *hk, *hv;        /* (P * Hkv D) each */
    float *hq;                  /* (Hq D) prefill q' */
    float *hlg;                 /* (B, vocab) */
    flx_fwd_timing_t timing;
};

/* Carves (bases set) or sizes (bases NULL) both blocks, filling ws's pointers when ws != NULL. */
static void ws_carve(const dims_t *d, carve_t *dv, carve_t *hs, struct flx_gpu_fwd_ws *ws)
{
    struct flx_gpu_fwd_ws t;
    memset(&t, 0, sizeof t);
    t.x = carve(dv, d->NX * d->H * 4);
    t.q = carve(dv, d->P * d->qd * 4);
    t.kb = carve(dv, d->P * d->kvd * 2);
    t.vb = carve(dv, d->P * d->kvd * 2);
    t.qkv = carve(dv, d->B * d->W * 4);
    t.o = carve(dv, FLX_MAX(d->C, d->B) * d->qd * 4);
    t.ab = carve(dv, FLX_GPU_SPLIT * d->M * d->KMAX * 2);
    t.y = carve(dv, FLX_GPU_SPLIT * d->M * d->WMAX * 4);
    t.yl = carve(dv, FLX_GPU_SPLIT * d->R * d->V * 4);
    t.lg = carve(dv, d->R * d->V * 4);
    t.cs = carve(dv, d->NX * d->half * 4);
    t.sn = carve(dv, d->NX * d->half * 4);
    t.tok = carve(dv, d->NX * 4);
    t.pos = carve(dv, d->B * 4);
    t.blas_ws = carve(dv, GPU_BLAS_WS);
    t.htok = carve(hs, d->NX * 4);
    t.hpos = carve(hs, d->B * 4);
    t.hqkv = carve(hs, d->B * d->W * 4);
    t.ho = carve(hs, d->B * d->qd * 4);
    t.hk = carve(hs, d->P * d->kvd * 2);
    t.hv = carve(hs, d->P * d->kvd * 2);
    t.hq = carve(hs, d->qd * 4);
    t.hlg = carve(hs, d->B * d->V * 4);
    if (!ws) return;
    ws->x = t.x, ws->q = t.q, ws->kb = t.kb, ws->vb = t.vb, ws->qkv = t.qkv, ws->o = t.o, ws->ab = t.ab;
    ws->y = t.y, ws->yl = t.yl, ws->lg = t.lg, ws->cs = t.cs, ws->sn = t.sn, ws->tok = t.tok, ws->pos = t.pos;
    ws->blas_ws = t.blas_ws;
    ws->htok = t.htok, ws->hpos = t.hpos, ws->hqkv = t.hqkv, ws->ho = t.ho, ws->hk = t.hk, ws->hv = t.hv;
    ws->hq = t.hq, ws->hlg = t.hlg;
}

/* Checks shape against m's config; *out = shape with prefill_chunk resolved. */
static flx_status_t shape_resolve(const flx_model_config_t *c, const flx_gpu_fwd_shape_t *shape,
                                  flx_gpu_fwd_shape_t *out)
{
    if (!shape) return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: shape is NULL");
    flx_status_t st = flx_model_config_check(c);
    if (st) return st;
    if (shape->max_prompt > (1u << 22))
        return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: max_prompt %u above %u", shape->max_prompt, 1u << 22);
    if (shape->max_prompt > c->max_ctx)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: max_prompt %u tokens is longer than the model's "
                             "context of %u tokens", shape->max_prompt, c->max_ctx);
    if (shape->max_batch == 0 || shape->max_batch > 4096)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: max_batch %u not in 1..4096", shape->max_batch);
    if (shape->prefill_chunk > GPU_CHUNK_MAX)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: prefill_chunk %u above %u", shape->prefill_chunk,
                             GPU_CHUNK_MAX);
    *out = *shape;
    if (out->prefill_chunk == 0) out->prefill_chunk = GPU_CHUNK_DEFAULT;
    return FLX_OK;
}

flx_status_t flx_gpu_fwd_plan(const flx_model_t *m, const flx_gpu_fwd_shape_t *shape, size_t *dev_bytes_p,
                              size_t *host_bytes_p)
{
    if (!m || !dev_bytes_p || !host_bytes_p) return flx_error_set(FLX_ERR_INVALID, "gpu forward plan: NULL argument");
    flx_gpu_fwd_shape_t s;
    flx_status_t st = shape_resolve(&m->cfg, shape, &s);
    if (st) return st;
    const dims_t d = dims_of(&m->cfg, &s);
    carve_t dv = {NULL, 0}, hs = {NULL, 0};
    ws_carve(&d, &dv, &hs, NULL);
    /* + GPU_ALIGN: the carving aligns the bases up, whatever allocator the caller used */
    *dev_bytes_p = dv.used + GPU_ALIGN;
    *host_bytes_p = hs.used + GPU_ALIGN;
    return FLX_OK;
}

void flx_gpu_model_info(flx_gpu_model_h gm, flx_gpu_model_info_t *info_p)
{
    if (!gm || !info_p) return;
    flx_gpu_model_info_t i = {.device = gm->device, .weight_bytes = gm->bytes, .cfg = &gm->cfg};
    *info_p = i;
}

void flx_gpu_fwd_timing_get(flx_gpu_fwd_ws_h ws, flx_fwd_timing_t *timing_p)
{
    if (ws && timing_p) *timing_p = ws->timing;
}

/* Argument checks shared by decode in every build (messages as flx_model_decode's). */
static flx_status_t decode_check(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, const flx_gpu_decode_args_t *a)
{
    if (!gm || !ws) return flx_error_set(FLX_ERR_INVALID, "gpu decode: model or workspace is NULL");
    if (ws->gm != gm) return flx_error_set(FLX_ERR_INVALID, "gpu decode: workspace was created for another model");
    if (!a || !a->tokens || !a->pos || !a->attn || !a->logits)
        return flx_error_set(FLX_ERR_INVALID, "gpu decode: args, tokens, pos, attn or logits is NULL");
    if (a->batch == 0 || a->batch > ws->shape.max_batch)
        return flx_error_set(FLX_ERR_INVALID, "gpu decode: batch %u not in 1..%u (max_batch)", a->batch,
                             ws->shape.max_batch);
    for (uint32_t b = 0; b < a->batch; b++)
        if (a->tokens[b] < 0 || (uint32_t)a->tokens[b] >= gm->cfg.vocab)
            return flx_error_set(FLX_ERR_INVALID, "gpu decode: token id %d of sequence %u not in 0..%u", a->tokens[b],
                                 b, gm->cfg.vocab - 1);
    return FLX_OK;
}

static flx_status_t prefill_check(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, const flx_prefill_args_t *a)
{
    if (!gm || !ws) return flx_error_set(FLX_ERR_INVALID, "gpu prefill: model or workspace is NULL");
    if (ws->gm != gm) return flx_error_set(FLX_ERR_INVALID, "gpu prefill: workspace was created for another model");
    if (!a || !a->tokens) return flx_error_set(FLX_ERR_INVALID, "gpu prefill: args or tokens is NULL");
    if (a->n_tokens > gm->cfg.max_ctx)
        return flx_error_set(FLX_ERR_INVALID, "gpu prefill: a prompt of %u tokens is longer than the model's context "
                             "of %u tokens", a->n_tokens, gm->cfg.max_ctx);
    if (ws->shape.max_prompt == 0)
        return flx_error_set(FLX_ERR_INVALID, "gpu prefill: the workspace was planned for decode only (max_prompt 0)");
    if (a->n_tokens == 0 || a->n_tokens > ws->shape.max_prompt)
        return flx_error_set(FLX_ERR_INVALID, "gpu prefill: n_tokens %u not in 1..%u (max_prompt)", a->n_tokens,
                             ws->shape.max_prompt);
    for (uint32_t t = 0; t < a->n_tokens; t++)
        if (a->tokens[t] < 0 || (uint32_t)a->tokens[t] >= gm->cfg.vocab)
            return flx_error_set(FLX_ERR_INVALID, "gpu prefill: token id %d at position %u not in 0..%u", a->tokens[t],
                                 t, gm->cfg.vocab - 1);
    return FLX_OK;
}

#ifdef FLX_HAVE_CUDA

/* ================= CUDA build ================= */

/* ---- cuBLAS, loaded at run time ----
 * cuBLAS is dlopen'ed, not linked: CUDA 13 ships it only as a shared library, and a binary that
 * needed libcublas.so.13 to start could not run on the CPU-only hosts a CUDA build promises to run
 * on (the CUDA runtime is linked statically for the same reason). Symbols already in the process
 * (a static cuBLAS, or scripts/gpusim's stand-in) are taken first. Without cuBLAS a workspace
 * refuses with FLX_ERR_NO_DEVICE naming the library; nothing else of the GPU path needs it. */
typedef struct blas_api {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_string)(cublasStatus_t);
} blas_api_t;

static blas_api_t g_blas;              /* written once under g_blas_once */
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static char g_blas_err[256];           /* why loading failed ("" when it did not) */

static void blas_load_once(void)
{
    static const char *const libs[] = {"libcublas.so.13", "libcublas.so"};
    static const char *const names[6] = {"cublasCreate_v2",       "cublasDestroy_v2", "cublasSetStream_v2",
                                         "cublasSetWorkspace_v2", "cublasGemmEx",     "cublasGetStatusString"};
    void *h = dlopen(NULL, RTLD_NOW);   /* the process's global symbols */
    if (!h || !dlsym(h, names[0])) {
        h = NULL;
        for (size_t i = 0; i < FLX_ARRAY_SIZE(libs) && !h; i++) h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(g_blas_err, sizeof g_blas_err, "cuBLAS (libcublas.so.13) not loadable: %s", dlerror());
            return;
        }
    }
    void *fn[6];
    for (int i = 0; i < 6; i++)
        if (!(fn[i] = dlsym(h, names[i]))) {
            snprintf(g_blas_err, sizeof g_blas_err, "cuBLAS has no %s", names[i]);
            return;
        }
    /* POSIX: a data pointer from dlsym converts to a function pointer through memcpy */
    memcpy(&g_blas.create, &fn[0], sizeof fn[0]);
    memcpy(&g_blas.destroy, &fn[1], sizeof fn[1]);
    memcpy(&g_blas.set_stream, &fn[2], sizeof fn[2]);
    memcpy(&g_blas.set_workspace, &fn[3], sizeof fn[3]);
    memcpy(&g_blas.gemm_ex, &fn[4], sizeof fn[4]);
    memcpy(&g_blas.status_string, &fn[5], sizeof fn[5]);
}

static flx_status_t blas_load(void)
{
    pthread_once(&g_blas_once, blas_load_once);
    if (g_blas_err[0]) return flx_error_set(FLX_ERR_NO_DEVICE, "gpu forward: %s", g_blas_err);
    return FLX_OK;
}

/* cublasStatus_t -> status: the single translation point, naming the call site. */
static flx_status_t status_from_cublas(cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return FLX_OK;
    const char *base = strrchr(file, '/');
    flx_status_t st = s == CUBLAS_STATUS_ALLOC_FAILED                                     ? FLX_ERR_NOMEM
                      : (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH) ? FLX_ERR_UNSUPPORTED
                      : s == CUBLAS_STATUS_INVALID_VALUE                                  ? FLX_ERR_INTERNAL
                                                                                          : FLX_ERR_DEVICE;
    (void)cudaGetLastError();
    return flx_error_set(st, "%s:%d: %s: cublas status %d (%s)", base ? base + 1 : file, line, what, (int)s,
                         g_blas.status_string(s));
}
#define CUBLAS_CALL(call) status_from_cublas((call), #call, __FILE__, __LINE__)

/* Makes device current on this thread; *prev_p is the one to restore with device_leave. */
static flx_status_t device_enter(int device, int *prev_p)
{
    int prev = 0;
    flx_status_t st = FLX_CUDA_CALL(cudaGetDevice(&prev));
    if (st == FLX_OK && prev != device) st = FLX_CUDA_CALL(cudaSetDevice(device));
    if (st == FLX_OK) *prev_p = prev;
    return st;
}

static void device_leave(int device, int prev)
{
    if (prev != device) (void)cudaSetDevice(prev);
}

/* ---- the device model ---- */

/* Carves (base set) or sizes (base NULL) the weight block; fills gm's pointers when base is set. */
static void model_carve(const flx_model_config_t *c, carve_t *cv, struct flx_gpu_model *gm)
{
    const size_t H = c->hidden, D = c->head_dim, qd = (size_t)c->n_heads * D, kvd = (size_t)c->n_kv_heads * D;
    const size_t W = qd + 2 * kvd, F = c->ffn, V = c->vocab;
    const flx_bf16_t *emb = carve(cv, V * H * 2);
    const flx_bf16_t *head = c->tied_embeddings ? emb : carve(cv, V * H * 2);
    const float *out_norm = carve(cv, H * 4);
    const float *inv_freq = carve(cv, D / 2 * 4);
    if (gm) gm->tok_embd = emb, gm->lm_head = head, gm->out_norm = out_norm, gm->inv_freq = inv_freq;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        gpu_layer_t L;
        L.attn_norm = carve(cv, H * 4);
        L.ffn_norm = carve(cv, H * 4);
        L.wqkv = carve(cv, W * H * 2);
        L.bqkv = c->qkv_bias ? carve(cv, W * 4) : NULL;
        L.wo = carve(cv, H * qd * 2);
        L.wgu = carve(cv, 2 * F * H * 2);
        L.wdown = carve(cv, H * F * 2);
        if (gm) gm->layers[l] = L;
    }
}

static flx_status_t upload(int device, const void *dst, const void *src, size_t bytes)
{
    return flx_cuda_copy_htod(device, (void *)dst, src, bytes);
}

/* A (rows, cols) matrix as bf16 at dst: as it is when stored as bf16, else expanded to bf16 (the
 * same values, flx/model.h) through a host staging buffer of up to 4 MiB. */
static flx_status_t upload_mat(int device, const flx_bf16_t *dst, const flx_wmat_t *w, size_t rows, size_t cols)
{
    if (w->fmt == FLX_WFMT_BF16) return upload(device, dst, w->p, rows * cols * 2);
    const size_t per = FLX_MAX((size_t)1, ((size_t)4 << 20) / (cols * 2));
    flx_bf16_t *buf = malloc(FLX_MIN(per, rows) * cols * 2);
    if (!buf) return flx_error_set(FLX_ERR_NOMEM, "gpu model: staging %zu rows of %zu values", FLX_MIN(per, rows), cols);
    flx_status_t st = FLX_OK;
    for (size_t r0 = 0; r0 < rows && st == FLX_OK; r0 += per) {
        const size_t nr = FLX_MIN(per, rows - r0);
        for (size_t r = 0; r < nr; r++) flx_wmat_row_bf16(w, cols, r0 + r, 0, cols, buf + r * cols);
        st = upload(device, dst + r0 * cols, buf, nr * cols * 2);
    }
    free(buf);
    return st;
}

static flx_status_t model_upload(const flx_model_t *m, struct flx_gpu_model *gm)
{
    const flx_model_config_t *c = &m->cfg;
    const size_t H = c->hidden, D = c->head_dim, qd = (size_t)c->n_heads * D, kvd = (size_t)c->n_kv_heads * D;
    const size_t F = c->ffn, V = c->vocab;
    const int dev = gm->device;
    flx_status_t st;
    float inv_freq[FLX_MODEL_MAX_HEAD_DIM / 2];
    flx_rope_inv_freq(c, inv_freq);
    if ((st = upload_mat(dev, gm->tok_embd, &m->tok_embd, V, H)) ||
        (!c->tied_embeddings && (st = upload_mat(dev, gm->lm_head, &m->lm_head, V, H))) ||
        (st = upload(dev, gm->out_norm, m->out_norm, H * 4)) || (st = upload(dev, gm->inv_freq, inv_freq, D / 2 * 4)))
        return st;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        const gpu_layer_t *L = &gm->layers[l];
        if ((st = upload(dev, L->attn_norm, w->attn_norm, H * 4)) || (st = upload(dev, L->ffn_norm, w->ffn_norm, H * 4)) ||
            (st = upload_mat(dev, L->wqkv, &w->wq, qd, H)) || (st = upload_mat(dev, L->wqkv + qd * H, &w->wk, kvd, H)) ||
            (st = upload_mat(dev, L->wqkv + (qd + kvd) * H, &w->wv, kvd, H)) ||
            (st = upload_mat(dev, L->wo, &w->wo, H, qd)) || (st = upload_mat(dev, L->wgu, &w->w_gate, F, H)) ||
            (st = upload_mat(dev, L->wgu + F * H, &w->w_up, F, H)) || (st = upload_mat(dev, L->wdown, &w->w_down, H, F)))
            return flx_error_set(st, "gpu model: uploading layer %u: %s", l, flx_error_msg());
        if (c->qkv_bias &&
            ((st = upload(dev, L->bqkv, w->bq, qd * 4)) || (st = upload(dev, L->bqkv + qd, w->bk, kvd * 4)) ||
             (st = upload(dev, L->bqkv + qd + kvd, w->bv, kvd * 4))))
            return flx_error_set(st, "gpu model: uploading the biases of layer %u: %s", l, flx_error_msg());
    }
    return FLX_OK;
}

/* Every weight the upload reads is present (a loader or init_random model always is). */
static flx_status_t model_check(const flx_model_t *m)
{
    const flx_model_config_t *c = &m->cfg;
    if (!m->tok_embd.p || !m->out_norm || !m->lm_head.p || !m->layers)
        return flx_error_set(FLX_ERR_INVALID, "gpu model: model without embeddings, output norm, head or layers");
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        if (!w->attn_norm || !w->ffn_norm || !w->wq.p || !w->wk.p || !w->wv.p || !w->wo.p || !w->w_gate.p ||
            !w->w_up.p || !w->w_down.p || (c->qkv_bias && (!w->bq || !w->bk || !w->bv)))
            return flx_error_set(FLX_ERR_INVALID, "gpu model: layer %u misses a weight%s", l,
                                 c->qkv_bias ? " or a bias" : "");
    }
    return FLX_OK;
}

flx_status_t flx_gpu_model_create(const flx_model_t *m, int device, flx_gpu_model_h *gm_p)
{
    if (!m || !gm_p) return flx_error_set(FLX_ERR_INVALID, "gpu model: NULL argument");
    flx_status_t st = flx_model_config_check(&m->cfg);
    if (st || (st = model_check(m))) return st;
    const int n_dev = flx_cuda_device_count();
    if (n_dev == 0)
        return flx_error_set(FLX_ERR_NO_DEVICE, "gpu model: no CUDA device (no GPU, no driver, or discovery failed)");
    if (device < 0 || device >= n_dev)
        return flx_error_set(FLX_ERR_INVALID, "gpu model: device %d out of range (%d devices)", device, n_dev);
    carve_t cv = {NULL, 0};
    model_carve(&m->cfg, &cv, NULL);
    const size_t bytes = cv.used;
    size_t free_b = 0, total_b = 0;
    if ((st = flx_cuda_mem_info(device, &free_b, &total_b))) return st;
    if (bytes > free_b)
        return flx_error_set(FLX_ERR_CAPACITY, "gpu model: %s needs %zu bytes of weights, device %d has %zu of %zu free",
                             m->cfg.name, bytes, device, free_b, total_b);
    struct flx_gpu_model *gm = calloc(1, sizeof *gm);
    gpu_layer_t *layers = calloc(m->cfg.n_layers, sizeof *layers);
    if (!gm || !layers) {
        free(gm);
        free(layers);
        return flx_error_set(FLX_ERR_NOMEM, "gpu model: host tables of %u layers", m->cfg.n_layers);
    }
    gm->device = device;
    gm->cfg = m->cfg;
    gm->layers = layers;
    gm->bytes = bytes;
    gm->step_bytes = flx_model_weight_bytes_bf16(m);
    if ((st = flx_cuda_malloc(device, bytes, &gm->mem))) {
        st = flx_error_set(st, "gpu model: %zu bytes of weights on device %d: %s", bytes, device, flx_error_msg());
        goto fail;
    }
    cv.base = gm->mem, cv.used = 0;
    model_carve(&m->cfg, &cv, gm);
    if ((st = model_upload(m, gm))) goto fail;
    *gm_p = gm;
    return FLX_OK;
fail:
    flx_gpu_model_destroy(gm);
    return st;
}

void flx_gpu_model_destroy(flx_gpu_model_h gm)
{
    if (!gm) return;
    if (gm->mem) (void)flx_cuda_free(gm->device, gm->mem);
    free(gm->layers);
    free(gm);
}

/* ---- workspaces ---- */

static void *align_base(void *p)
{
    return (void *)FLX_ALIGN_UP((uintptr_t)p, GPU_ALIGN);
}

flx_status_t flx_gpu_fwd_ws_create(flx_gpu_model_h gm, const flx_gpu_fwd_shape_t *shape, void *dev_mem,
                                   size_t dev_bytes, void *host_mem, size_t host_bytes, flx_gpu_fwd_ws_h *ws_p)
{
    if (!gm || !dev_mem || !host_mem || !ws_p)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward workspace: NULL model, memory or out-param");
    flx_gpu_fwd_shape_t s;
    flx_status_t st = shape_resolve(&gm->cfg, shape, &s);
    if (st) return st;
    const dims_t d = dims_of(&gm->cfg, &s);
    carve_t dv = {NULL, 0}, hs = {NULL, 0};
    ws_carve(&d, &dv, &hs, NULL);
    if (dev_bytes < dv.used + GPU_ALIGN || host_bytes < hs.used + GPU_ALIGN)
        return flx_error_set(FLX_ERR_INVALID,
                             "gpu forward workspace: %zu device and %zu host bytes given, %zu and %zu needed", dev_bytes,
                             host_bytes, dv.used + GPU_ALIGN, hs.used + GPU_ALIGN);
    if (!flx_cuda_host_is_pinned(host_mem))
        return flx_error_set(FLX_ERR_INVALID,
                             "gpu forward workspace: host memory %p is not page-locked (use flx_cuda_host_alloc)",
                             host_mem);
    struct cudaPointerAttributes pa;
    if ((st = FLX_CUDA_CALL(cudaPointerGetAttributes(&pa, dev_mem)))) return st;
    if (pa.type != cudaMemoryTypeDevice || pa.device != gm->device)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward workspace: device memory %p is not memory of device %d",
                             dev_mem, gm->device);
    struct flx_gpu_fwd_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return flx_error_set(FLX_ERR_NOMEM, "gpu forward workspace");
    ws->gm = gm;
    ws->shape = s;
    ws->d = d;
    dv.base = align_base(dev_mem), dv.used = 0;
    hs.base = align_base(host_mem), hs.used = 0;
    ws_carve(&d, &dv, &hs, ws);
    int prev = gm->device;
    if ((st = device_enter(gm->device, &prev))) {
        free(ws);
        return st;
    }
    if ((st = blas_load()) || (st = CUBLAS_CALL(g_blas.create(&ws->blas)))) goto fail;
    if ((st = FLX_CUDA_CALL(cudaEventCreateWithFlags(&ws->kv_ready, cudaEventDisableTiming)))) goto fail;
    device_leave(gm->device, prev);
    *ws_p = ws;
    return FLX_OK;
fail:
    if (ws->blas) g_blas.destroy(ws->blas);
    device_leave(gm->device, prev);
    free(ws);
    return st;
}

void flx_gpu_fwd_ws_destroy(flx_gpu_fwd_ws_h ws)
{
    if (!ws) return;
    int prev = ws->gm->device;
    if (device_enter(ws->gm->device, &prev) == FLX_OK) {
        if (ws->kv_ready) (void)cudaEventDestroy(ws->kv_ready);
        if (ws->blas) (void)g_blas.destroy(ws->blas);
        (void)cudaGetLastError();
        device_leave(ws->gm->device, prev);
    }
    free(ws);
}

/* ---- the pieces of a pass ---- */

/* y (n2, rows) = W (rows, cols) applied to each of the n2 rows of x (n2, cols); n2 = S n rows of
 * a split activation. */
static flx_status_t gemm(flx_gpu_fwd_ws_h ws, const char *name, const flx_bf16_t *w, size_t rows, size_t cols,
                         const flx_bf16_t *x, size_t n2, float *y)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = g_blas.gemm_ex(ws->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n2, (int)cols, &one, w,
                                    CUDA_R_16BF, (int)cols, x, CUDA_R_16BF, (int)cols, &zero, y, CUDA_R_32F, (int)rows,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s == CUBLAS_STATUS_SUCCESS) return FLX_OK;
    char what[96];
    snprintf(what, sizeof what, "cublasGemmEx %s (%zu x %zu) x %zu columns", name, rows, cols, n2);
    return status_from_cublas(s, what, __FILE__, __LINE__);
}

static flx_status_t blas_bind(flx_gpu_fwd_ws_h ws, cudaStream_t stream)
{
    flx_status_t st = CUBLAS_CALL(g_blas.set_stream(ws->blas, stream));
    /* after SetStream: it resets the workspace to cuBLAS's own pool */
    if (!st) st = CUBLAS_CALL(g_blas.set_workspace(ws->blas, ws->blas_ws, GPU_BLAS_WS));
    return st;
}

/* The second half of a layer for rows [0, n) of x (the attention output in ws->o, n rows):
 * x += W_o o; x += W_down (silu(W_gate xn) * W_up xn), xn = rmsnorm(x, ffn_norm); and, when
 * next_gain is not NULL, ab = split(rmsnorm(x, next_gain)) for the next product. */
static flx_status_t layer_tail(flx_gpu_fwd_ws_h ws, const gpu_layer_t *L, float *x, uint32_t n, const float *next_gain,
                               cudaStream_t stream)
{
    const dims_t *d = &ws->d;
    const float eps = ws->gm->cfg.rms_eps;
    flx_status_t st;
    if ((st = flx_gk_split(ws->o, n, (uint32_t)d->qd, ws->ab, stream)) ||
        (st = gemm(ws, "W_o", L->wo, d->H, d->qd, ws->ab, FLX_GPU_SPLIT * (size_t)n, ws->y)) ||
        (st = flx_gk_add_norm_split(x, ws->y, n, (uint32_t)d->H, L->ffn_norm, eps, ws->ab, stream)) ||
        (st = gemm(ws, "W_gate|W_up", L->wgu, 2 * d->F, d->H, ws->ab, FLX_GPU_SPLIT * (size_t)n, ws->y)) ||
        (st = flx_gk_silu_mul_split(ws->y, n, (uint32_t)d->F, ws->ab, stream)) ||
        (st = gemm(ws, "W_down", L->wdown, d->H, d->F, ws->ab, FLX_GPU_SPLIT * (size_t)n, ws->y)) ||
        (st = flx_gk_add_norm_split(x, ws->y, n, (uint32_t)d->H, next_gain, eps, ws->ab, stream)))
        return st;
    return FLX_OK;
}

/* Logits of rows [0, n) of x (n <= R) into ws->lg (n, vocab). */
static flx_status_t lm_head(flx_gpu_fwd_ws_h ws, float *x, uint32_t n, cudaStream_t stream)
{
    const dims_t *d = &ws->d;
    flx_gpu_model_h gm = ws->gm;
    flx_status_t st;
    if ((st = flx_gk_add_norm_split(x, NULL, n, (uint32_t)d->H, gm->out_norm, gm->cfg.rms_eps, ws->ab,
                                    stream)) ||
        (st = gemm(ws, "LM head", gm->lm_head, d->V, d->H, ws->ab, FLX_GPU_SPLIT * (size_t)n, ws->yl)) ||
        (st = flx_gk_sum_parts(ws->yl, n, (uint32_t)d->V, ws->lg, stream)))
        return st;
    return FLX_OK;
}

/* Error exit of a pass: wait for what was queued (so the workspace may be reused), keep st. */
static flx_status_t pass_fail(cudaStream_t stream, flx_status_t st)
{
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    return st;
}

/* ---- decode ---- */

flx_status_t flx_gpu_model_decode(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                  const flx_gpu_decode_args_t *a)
{
    flx_status_t st = decode_check(gm, ws, a);
    if (st) return st;
    const flx_model_config_t *c = &gm->cfg;
    const dims_t *d = &ws->d;
    const uint32_t B = a->batch, H = c->hidden;
    const size_t qd = d->qd, kvd = d->kvd;
    float *dq = ws->qkv, *dk = ws->qkv + (size_t)B * qd, *dv = dk + (size_t)B * kvd;
    const float *hq = ws->hqkv, *hk = ws->hqkv + (size_t)B * qd, *hv = hk + (size_t)B * kvd;
    int prev = gm->device;
    if ((st = device_enter(gm->device, &prev))) return st;
    const uint64_t t_start = flx_now_ns();
    uint64_t attn_ns = 0;
    memcpy(ws->htok, a->tokens, B * sizeof *a->tokens);
    memcpy(ws->hpos, a->pos, B * sizeof *a->pos);
    if ((st = blas_bind(ws, stream)) ||
        (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->tok, ws->htok, B * sizeof *ws->tok, cudaMemcpyHostToDevice, stream))) ||
        (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->pos, ws->hpos, B * sizeof *ws->pos, cudaMemcpyHostToDevice, stream))) ||
        (st = flx_gk_embed(gm->tok_embd, ws->tok, B, H, ws->x, stream)) ||
        (st = flx_gk_rope_table(ws->pos, 0, B, gm->inv_freq, (uint32_t)d->half, ws->cs, ws->sn, stream)) ||
        (st = flx_gk_add_norm_split(ws->x, NULL, B, H, gm->layers[0].attn_norm, c->rms_eps, ws->ab, stream)))
        goto fail;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const gpu_layer_t *L = &gm->layers[l];
        flx_gk_qkv_args_t qa = {.y = ws->y, .n = B, .bias = L->bqkv, .cs = ws->cs, .sn = ws->sn,
                                .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                                .q_out = dq, .q_stride = (uint32_t)qd, .k_f32 = dk, .v_f32 = dv};
        if ((st = gemm(ws, "W_qkv", L->wqkv, d->W, H, ws->ab, FLX_GPU_SPLIT * (size_t)B, ws->y)) ||
            (st = flx_gk_qkv_finish(&qa, stream)) ||
            (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hqkv, ws->qkv, (size_t)B * d->W * sizeof(float),
                                                cudaMemcpyDeviceToHost, stream))) ||
            (st = FLX_CUDA_CALL(cudaStreamSynchronize(stream))))
            goto fail;
        flx_gpu_attn_args_t aa = {.layer = l, .batch = B, .q = hq, .k = hk, .v = hv, .q_dev = dq, .k_dev = dk,
                                  .v_dev = dv, .stream = stream, .device = gm->device, .o = ws->ho};
        const uint64_t t0 = flx_now_ns();
        st = a->attn(a->ctx, &aa);
        attn_ns += flx_now_ns() - t0;
        if (st) goto fail;
        const float *next = l + 1 < c->n_layers ? gm->layers[l + 1].attn_norm : gm->out_norm;
        if ((st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->o, ws->ho, (size_t)B * qd * sizeof(float), cudaMemcpyHostToDevice,
                                                stream))) ||
            (st = layer_tail(ws, L, ws->x, B, next, stream)))
            goto fail;
    }
    /* layer_tail of the last layer left split(rmsnorm(x, out_norm)) in ab */
    if ((st = gemm(ws, "LM head", gm->lm_head, d->V, H, ws->ab, FLX_GPU_SPLIT * (size_t)B, ws->yl)) ||
        (st = flx_gk_sum_parts(ws->yl, B, (uint32_t)d->V, ws->lg, stream)) ||
        (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hlg, ws->lg, (size_t)B * d->V * sizeof(float), cudaMemcpyDeviceToHost,
                                            stream))) ||
        (st = FLX_CUDA_CALL(cudaStreamSynchronize(stream))))
        goto fail;
    memcpy(a->logits, ws->hlg, (size_t)B * d->V * sizeof(float));
    const uint64_t total = flx_now_ns() - t_start;
    ws->timing.attn_ns = attn_ns;
    ws->timing.dense_ns = total - attn_ns;
    ws->timing.dense_bytes = gm->step_bytes;
    device_leave(gm->device, prev);
    return FLX_OK;
fail:
    st = pass_fail(stream, st);
    device_leave(gm->device, prev);
    return st;
}

/* ---- prefill ---- */

flx_status_t flx_gpu_model_prefill(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                   const flx_prefill_args_t *a)
{
    flx_status_t st = prefill_check(gm, ws, a);
    if (st) return st;
    const flx_model_config_t *c = &gm->cfg;
    const dims_t *d = &ws->d;
    const uint32_t n = a->n_tokens, H = c->hidden, C = (uint32_t)d->C, R = (uint32_t)d->R;
    const size_t qd = d->qd, kvd = d->kvd;
    int prev = gm->device;
    if ((st = device_enter(gm->device, &prev))) return st;
    memcpy(ws->htok, a->tokens, (size_t)n * sizeof *a->tokens);
    if ((st = blas_bind(ws, stream)) ||
        (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->tok, ws->htok, (size_t)n * sizeof *ws->tok, cudaMemcpyHostToDevice,
                                            stream))) ||
        (st = flx_gk_embed(gm->tok_embd, ws->tok, n, H, ws->x, stream)) ||
        (st = flx_gk_rope_table(NULL, 0, n, gm->inv_freq, (uint32_t)d->half, ws->cs, ws->sn, stream)))
        goto fail;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const gpu_layer_t *L = &gm->layers[l];
        /* first half, chunk by chunk: the layer's K, V (bf16, (Hkv, n, D)) and q */
        for (uint32_t t0 = 0; t0 < n; t0 += C) {
            const uint32_t cn = FLX_MIN(C, n - t0);
            flx_gk_qkv_args_t qa = {.y = ws->y, .n = cn, .bias = L->bqkv, .cs = ws->cs + (size_t)t0 * d->half,
                                    .sn = ws->sn + (size_t)t0 * d->half, .n_heads = c->n_heads,
                                    .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                                    .q_out = ws->q + (size_t)t0 * qd, .q_stride = (uint32_t)qd, .kb = ws->kb,
                                    .vb = ws->vb, .kv_stride = n, .tok0 = t0};
            if ((st = flx_gk_add_norm_split(ws->x + (size_t)t0 * H, NULL, cn, H, L->attn_norm, c->rms_eps, ws->ab,
                                            stream)) ||
                (st = gemm(ws, "W_qkv", L->wqkv, d->W, H, ws->ab, FLX_GPU_SPLIT * (size_t)cn, ws->y)) ||
                (st = flx_gk_qkv_finish(&qa, stream)))
                goto fail;
        }
        if (a->on_layer &&
            ((st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hk, ws->kb, (size_t)n * kvd * 2, cudaMemcpyDeviceToHost, stream))) ||
             (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hv, ws->vb, (size_t)n * kvd * 2, cudaMemcpyDeviceToHost, stream))) ||
             (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hq, ws->q + (size_t)(n - 1) * qd, qd * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream))) ||
             (st = FLX_CUDA_CALL(cudaEventRecord(ws->kv_ready, stream)))))
            goto fail;
        /* into pageable memory this copy returns once done; into page-locked memory, the final
         * synchronisation covers it (nothing rewrites q before then) */
        if (a->q_all && (st = FLX_CUDA_CALL(cudaMemcpyAsync(a->q_all + (size_t)l * n * qd, ws->q,
                                                           (size_t)n * qd * sizeof(float), cudaMemcpyDeviceToHost,
                                                           stream))))
            goto fail;
        /* second half, chunk by chunk: attention over keys [0, t], W_o, FFN */
        for (uint32_t t0 = 0; t0 < n; t0 += C) {
            const uint32_t cn = FLX_MIN(C, n - t0);
            flx_attn_causal_gpu_args_t ca = {.q = ws->q, .q_stride = qd, .k = ws->kb, .v = ws->vb, .kv_stride = n,
                                             .t0 = t0, .nq = cn, .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads,
                                             .head_dim = c->head_dim, .o = ws->o, .o_stride = qd};
            if ((st = flx_attn_causal_gpu(&ca, stream)) ||
                (st = layer_tail(ws, L, ws->x + (size_t)t0 * H, cn, NULL, stream)))
                goto fail;
        }
        if (a->on_layer) {
            if ((st = FLX_CUDA_CALL(cudaEventSynchronize(ws->kv_ready)))) goto fail;
            if ((st = a->on_layer(a->ctx, l, n, ws->hk, ws->hv, ws->hq))) goto fail;
            flx_progress_report("prefill", l + 1, c->n_layers, "layers");   /* the layer's KV is out */
        }
    }
    if (a->logits_all) {
        for (uint32_t r0 = 0; r0 < n; r0 += R) {
            const uint32_t rn = FLX_MIN(R, n - r0);
            /* into pageable memory the copy returns once done; page-locked, the stream orders it
             * before the next pass rewrites lg */
            if ((st = lm_head(ws, ws->x + (size_t)r0 * H, rn, stream)) ||
                (st = FLX_CUDA_CALL(cudaMemcpyAsync(a->logits_all + (size_t)r0 * d->V, ws->lg,
                                                    (size_t)rn * d->V * sizeof(float), cudaMemcpyDeviceToHost, stream))))
                goto fail;
        }
    } else if (a->logits_last) {
        if ((st = lm_head(ws, ws->x + (size_t)(n - 1) * H, 1, stream)) ||
            (st = FLX_CUDA_CALL(cudaMemcpyAsync(ws->hlg, ws->lg, d->V * sizeof(float), cudaMemcpyDeviceToHost,
                                                stream))))
            goto fail;
    }
    if ((st = FLX_CUDA_CALL(cudaStreamSynchronize(stream)))) goto fail;
    if (a->logits_last)
        memcpy(a->logits_last, a->logits_all ? a->logits_all + (size_t)(n - 1) * d->V : ws->hlg, d->V * sizeof(float));
    device_leave(gm->device, prev);
    return FLX_OK;
fail:
    st = pass_fail(stream, st);
    device_leave(gm->device, prev);
    return st;
}

#else /* !FLX_HAVE_CUDA */

/* ================= CPU-only build: the same functions, refusing ================= */

flx_status_t flx_gpu_model_create(const flx_model_t *m, int device, flx_gpu_model_h *gm_p)
{
    if (!m || !gm_p) return flx_error_set(FLX_ERR_INVALID, "gpu model: NULL argument");
    return flx_error_set(FLX_ERR_NO_DEVICE, "gpu model on device %d: no CUDA device (built without CUDA)", device);
}

void flx_gpu_model_destroy(flx_gpu_model_h gm)
{
    (void)gm;   /* none can exist */
}

flx_status_t flx_gpu_fwd_ws_create(flx_gpu_model_h gm, const flx_gpu_fwd_shape_t *shape, void *dev_mem,
                                   size_t dev_bytes, void *host_mem, size_t host_bytes, flx_gpu_fwd_ws_h *ws_p)
{
    if (!gm || !dev_mem || !host_mem || !ws_p)
        return flx_error_set(FLX_ERR_INVALID, "gpu forward workspace: NULL model, memory or out-param");
    return flx_error_set(FLX_ERR_NO_DEVICE, "gpu forward workspace: no CUDA device (built without CUDA)");
}

void flx_gpu_fwd_ws_destroy(flx_gpu_fwd_ws_h ws)
{
    (void)ws;
}

flx_status_t flx_gpu_model_decode(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                  const flx_gpu_decode_args_t *args)
{
    flx_status_t st = decode_check(gm, ws, args);
    return st ? st : flx_error_set(FLX_ERR_NO_DEVICE, "gpu decode: no CUDA device (built without CUDA)");
}

flx_status_t flx_gpu_model_prefill(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                   const flx_prefill_args_t *args)
{
    flx_status_t st = prefill_check(gm, ws, args);
    return st ? st : flx_error_set(FLX_ERR_NO_DEVICE, "gpu prefill: no CUDA device (built without CUDA)");
}

#endif
