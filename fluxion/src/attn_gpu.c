/*
 * attn_gpu.c - the host side of flx/attn_gpu.h: argument checks, the workspace plan and carving,
 * and the refusal where there is no device. Compiled in every build; the kernels (attn_window.cu,
 * attn_causal.cu) only in builds with CUDA (FLX_HAVE_CUDA), so a CPU-only binary links the same
 * functions and gets FLX_ERR_NO_DEVICE from them.
 */
#include "flx/attn_gpu.h"

#include <string.h>

#include "attn_gpu_internal.h"
#include "flx/util.h"

#define FLX_AG_MAX_GROUP 64u
#define FLX_AG_MAX_ITEMS (1u << 20)
#define FLX_AG_ALIGN 256u   /* cudaMalloc's alignment; every carved part starts on it */

static flx_status_t shape_check(const flx_attn_gpu_shape_t *s, const char *who)
{
    if (!s) return flx_error_set(FLX_ERR_INVALID, "%s: shape is NULL", who);
    if (s->group == 0 || s->group > FLX_AG_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "%s: group %u not in 1..%u", who, s->group, FLX_AG_MAX_GROUP);
    if (s->head_dim < 16 || s->head_dim > 256 || s->head_dim % 16)
        return flx_error_set(FLX_ERR_INVALID, "%s: head_dim %u not a multiple of 16 in 16..256", who, s->head_dim);
    if (s->max_items == 0 || s->max_items > FLX_AG_MAX_ITEMS)
        return flx_error_set(FLX_ERR_INVALID, "%s: max_items %u not in 1..%u", who, s->max_items, FLX_AG_MAX_ITEMS);
    return FLX_OK;
}

static size_t table_bytes(const flx_attn_gpu_shape_t *s)
{
    return FLX_ALIGN_UP((size_t)s->max_items * sizeof(flx_attn_gpu_item_t), FLX_AG_ALIGN);
}

flx_status_t flx_attn_window_gpu_plan(const flx_attn_gpu_shape_t *shape, size_t *dev_bytes_p, size_t *host_bytes_p)
{
    flx_status_t st = shape_check(shape, "window gpu plan");
    if (st) return st;
    if (!dev_bytes_p || !host_bytes_p) return flx_error_set(FLX_ERR_INVALID, "window gpu plan: NULL out-param");
    /* + FLX_AG_ALIGN: the carving aligns the start up, whatever allocator the caller used */
    *dev_bytes_p = table_bytes(shape) + FLX_AG_ALIGN;
    *host_bytes_p = table_bytes(shape) + FLX_AG_ALIGN;
    return FLX_OK;
}

static void *align_in(void *p)
{
    return (void *)FLX_ALIGN_UP((uintptr_t)p, FLX_AG_ALIGN);
}

flx_status_t flx_attn_window_gpu_ws_init(flx_attn_gpu_ws_t *ws, const flx_attn_gpu_shape_t *shape, void *dev_mem,
                                         size_t dev_bytes, void *host_mem, size_t host_bytes)
{
    size_t need_dev, need_host;
    flx_status_t st = flx_attn_window_gpu_plan(shape, &need_dev, &need_host);
    if (st) return st;
    if (!ws || !dev_mem || !host_mem)
        return flx_error_set(FLX_ERR_INVALID, "window gpu workspace: NULL workspace or memory");
    if (dev_bytes < need_dev || host_bytes < need_host)
        return flx_error_set(FLX_ERR_INVALID,
                             "window gpu workspace: %zu device and %zu host bytes given, %zu and %zu needed", dev_bytes,
                             host_bytes, need_dev, need_host);
    if (flx_cuda_device_count() == 0)
        return flx_error_set(FLX_ERR_NO_DEVICE, "window gpu workspace: no CUDA device");
    if (!flx_cuda_host_is_pinned(host_mem))
        return flx_error_set(FLX_ERR_INVALID,
                             "window gpu workspace: host memory %p is not page-locked (use flx_cuda_host_alloc)",
                             host_mem);
    memset(ws, 0, sizeof *ws);
    ws->shape = *shape;
    ws->items_dev = align_in(dev_mem);
    ws->items_host = align_in(host_mem);
    return FLX_OK;
}

flx_status_t flx_attn_window_gpu(flx_attn_gpu_ws_t *ws, const flx_attn_gpu_item_t *items, uint32_t n_items,
                                 flx_cuda_stream_t stream)
{
    if (!ws || !items || !ws->items_dev || !ws->items_host)
        return flx_error_set(FLX_ERR_INVALID, "window gpu: NULL workspace or items (workspace initialised?)");
    if (n_items == 0 || n_items > ws->shape.max_items)
        return flx_error_set(FLX_ERR_INVALID, "window gpu: %u items not in 1..%u (max_items)", n_items,
                             ws->shape.max_items);
    for (uint32_t i = 0; i < n_items; i++) {
        const flx_attn_gpu_item_t *it = &items[i];
        if (!it->q || !it->o || !it->lse)
            return flx_error_set(FLX_ERR_INVALID, "window gpu: item %u has a NULL q, o or lse", i);
        if (it->n_win && (!it->k || !it->v))
            return flx_error_set(FLX_ERR_INVALID, "window gpu: item %u has n_win %u but no window", i, it->n_win);
        if (((uintptr_t)it->k | (uintptr_t)it->v) % 16)
            return flx_error_set(FLX_ERR_INVALID, "window gpu: item %u window rows not 16-byte aligned (%p, %p)", i,
                                 (const void *)it->k, (const void *)it->v);
    }
    if (flx_cuda_device_count() == 0) return flx_error_set(FLX_ERR_NO_DEVICE, "window gpu: no CUDA device");
#ifdef FLX_HAVE_CUDA
    memcpy(ws->items_host, items, (size_t)n_items * sizeof *items);
    return flx_attn_window_gpu_launch(ws, n_items, stream);
#else
    return flx_error_set(FLX_ERR_NO_DEVICE, "window gpu: no CUDA device (built without CUDA)");
#endif
}

flx_status_t flx_attn_causal_gpu(const flx_attn_causal_gpu_args_t *a, flx_cuda_stream_t stream)
{
    if (!a || !a->q || !a->k || !a->v || !a->o)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: NULL args, q, k, v or o");
    const uint32_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    if (Hkv == 0 || Hq == 0 || Hq % Hkv || Hq / Hkv > FLX_AG_MAX_GROUP || Hkv > 65535)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: %u query heads over %u kv heads (group at most %u)", Hq, Hkv,
                             FLX_AG_MAX_GROUP);
    if (D < 16 || D > 256 || D % 16)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: head_dim %u not a multiple of 16 in 16..256", D);
    if (a->nq == 0 || (uint64_t)a->t0 + a->nq > a->kv_stride)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: tokens [%u, %u + %u) not inside kv_stride %u (nq >= 1)",
                             a->t0, a->t0, a->nq, a->kv_stride);
    if ((uint64_t)a->nq * (Hq / Hkv) > (uint64_t)INT32_MAX)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: %u tokens x group %u rows is too many for one launch",
                             a->nq, Hq / Hkv);
    if (a->q_stride < (size_t)Hq * D || a->o_stride < (size_t)Hq * D)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: q_stride %zu or o_stride %zu below Hq * D = %zu",
                             a->q_stride, a->o_stride, (size_t)Hq * D);
    if (((uintptr_t)a->k | (uintptr_t)a->v) % 16)
        return flx_error_set(FLX_ERR_INVALID, "causal gpu: k or v not 16-byte aligned");
    if (flx_cuda_device_count() == 0) return flx_error_set(FLX_ERR_NO_DEVICE, "causal gpu: no CUDA device");
#ifdef FLX_HAVE_CUDA
    return flx_attn_causal_gpu_launch(a, stream);
#else
    (void)stream;
    return flx_error_set(FLX_ERR_NO_DEVICE, "causal gpu: no CUDA device (built without CUDA)");
#endif
}
