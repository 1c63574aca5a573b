/*
 * attn_gpu.c - the host side of flx/attn_gpu.h: argument checks, the workspace plans and carving,
 * the host part's staging, and the refusal where there is no device. Compiled in every build; the
 * kernels (attn_window.cu, attn_causal.cu, attn_host.cu) only in builds with CUDA (FLX_HAVE_CUDA),
 * so a CPU-only binary links the same functions and gets FLX_ERR_NO_DEVICE from them.
 */
#include "flx/attn_gpu.h"

#include <string.h>

#include "attn_gpu_internal.h"
#include "attn_internal.h"
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

/* ---- the host part on the device ---- */

#define FLX_AG_MAX_SPLITS 256u
#define FLX_AG_MAX_L_CPU (1u << 26)

static flx_status_t no_device(const char *who)
{
#ifdef FLX_HAVE_CUDA
    if (flx_cuda_device_count() == 0) return flx_error_set(FLX_ERR_NO_DEVICE, "%s: no CUDA device", who);
    return FLX_OK;
#else
    return flx_error_set(FLX_ERR_NO_DEVICE, "%s: no CUDA device (built without CUDA)", who);
#endif
}

flx_status_t flx_attn_gpu_view(const flx_kv_head_view_t *view, flx_attn_gpu_view_t *gv_p)
{
    flx_status_t st = flx_attn_check_view(view, "gpu view");
    if (st) return st;
    if (!gv_p) return flx_error_set(FLX_ERR_INVALID, "gpu view: NULL out-param");
    if (view->host_device < 0 || (view->l_cpu && (!view->pool_base_dev || !view->block_table_dev)))
        return flx_error_set(FLX_ERR_INVALID,
                             "gpu view: %u host tokens but no device addresses (a store pinned with "
                             "FLX_KV_STORE_PIN_CUDA gives them)",
                             view->l_cpu);
    if (((uintptr_t)view->pool_base_dev | view->block_bytes) % 16)
        return flx_error_set(FLX_ERR_INVALID, "gpu view: pool %p or block_bytes %zu not 16-byte aligned",
                             (const void *)view->pool_base_dev, view->block_bytes);
    flx_attn_gpu_view_t gv;
    memset(&gv, 0, sizeof gv);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        if (view->meta_n[j] && !view->meta_dev[j])
            return flx_error_set(FLX_ERR_INVALID, "gpu view: metadata level %d has no device address", j);
        if ((uintptr_t)view->meta_dev[j] % 16)
            return flx_error_set(FLX_ERR_INVALID, "gpu view: metadata level %d at %p not 16-byte aligned", j,
                                 (const void *)view->meta_dev[j]);
        gv.meta[j] = view->meta_dev[j];
        gv.meta_n[j] = view->meta_n[j];
    }
    gv.pool = view->pool_base_dev;
    gv.table = view->block_table_dev;
    gv.block_bytes = view->block_bytes;
    gv.l_cpu = view->l_cpu;
    gv.n_blocks = view->n_blocks;
    gv.head_dim = view->head_dim;
    gv.device = view->host_device;
    *gv_p = gv;
    return FLX_OK;
}

static flx_status_t host_shape_check(const flx_attn_host_gpu_shape_t *s, const char *who)
{
    if (!s) return flx_error_set(FLX_ERR_INVALID, "%s: shape is NULL", who);
    if (s->group == 0 || s->group > FLX_AG_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "%s: group %u not in 1..%u", who, s->group, FLX_AG_MAX_GROUP);
    if (s->head_dim < 16 || s->head_dim > 256 || s->head_dim % 16)
        return flx_error_set(FLX_ERR_INVALID, "%s: head_dim %u not a multiple of 16 in 16..256", who, s->head_dim);
    if (s->max_l_cpu == 0 || s->max_l_cpu > FLX_AG_MAX_L_CPU)
        return flx_error_set(FLX_ERR_INVALID, "%s: max_l_cpu %u not in 1..%u", who, s->max_l_cpu, FLX_AG_MAX_L_CPU);
    return FLX_OK;
}

/* One carving for the size-only pass (bases NULL) and the real one. The inputs (q, k, o_win,
 * lse_win) and the outputs (o, lse, count) are each one contiguous area, laid out alike in device
 * and staging memory, so that each moves in one copy. Returns the device bytes; *host_p the host's. */
static size_t host_carve(flx_attn_host_gpu_ws_t *ws, const flx_attn_host_gpu_shape_t *s, uint8_t *dev,
                         uint8_t *host, size_t *host_p)
{
    const size_t G = s->group, D = s->head_dim, n = FLX_DIV_UP((size_t)s->max_l_cpu, 16);
    const size_t S = FLX_MIN(n, (size_t)FLX_AG_MAX_SPLITS);
    size_t off = 0;
#define PART(field, type, count)                                              \
    do {                                                                      \
        ws->field = dev ? (type *)(dev + off) : NULL;                         \
        off = FLX_ALIGN_UP(off + (size_t)(count) * sizeof(type), FLX_AG_ALIGN); \
    } while (0)
    const size_t in0 = off;
    PART(q, float, G * D);
    PART(k, uint32_t, G);
    PART(o_win, float, G * D);
    PART(lse_win, float, G);
    ws->in_bytes = off - in0;
    const size_t out0 = off;
    PART(o, float, G * D);
    PART(lse, float, G);
    PART(count, uint32_t, 2);
    ws->out_bytes = off - out0;
    PART(scores, float, G * n);
    PART(sel, uint32_t, G * n);
    PART(mask, uint64_t, n);
    PART(list, uint32_t, n);
    PART(part_o, float, S * G * D);
    PART(part_lse, float, S * G);
#undef PART
    ws->in_host = host;
    ws->out_host = host ? host + ws->in_bytes : NULL;
    ws->n_max = (uint32_t)n;
    ws->max_splits = (uint32_t)S;
    ws->shape = *s;
    *host_p = ws->in_bytes + ws->out_bytes + FLX_AG_ALIGN;
    return off + FLX_AG_ALIGN;
}

flx_status_t flx_attn_host_gpu_plan(const flx_attn_host_gpu_shape_t *shape, size_t *dev_bytes_p, size_t *host_bytes_p)
{
    flx_status_t st = host_shape_check(shape, "host gpu plan");
    if (st) return st;
    if (!dev_bytes_p || !host_bytes_p) return flx_error_set(FLX_ERR_INVALID, "host gpu plan: NULL out-param");
    flx_attn_host_gpu_ws_t tmp;
    size_t host;
    const size_t dev = host_carve(&tmp, shape, NULL, NULL, &host);
    *dev_bytes_p = dev;
    *host_bytes_p = host;
    return FLX_OK;
}

flx_status_t flx_attn_host_gpu_ws_init(flx_attn_host_gpu_ws_t *ws, const flx_attn_host_gpu_shape_t *shape,
                                       void *dev_mem, size_t dev_bytes, void *host_mem, size_t host_bytes)
{
    size_t need_dev, need_host;
    flx_status_t st = flx_attn_host_gpu_plan(shape, &need_dev, &need_host);
    if (st) return st;
    if (!ws || !dev_mem || !host_mem)
        return flx_error_set(FLX_ERR_INVALID, "host gpu workspace: NULL workspace or memory");
    if (dev_bytes < need_dev || host_bytes < need_host)
        return flx_error_set(FLX_ERR_INVALID, "host gpu workspace: %zu device and %zu host bytes given, %zu and %zu needed",
                             dev_bytes, host_bytes, need_dev, need_host);
    if ((st = no_device("host gpu workspace"))) return st;
    if (!flx_cuda_host_is_pinned(host_mem))
        return flx_error_set(FLX_ERR_INVALID,
                             "host gpu workspace: host memory %p is not page-locked (use flx_cuda_host_alloc)", host_mem);
    memset(ws, 0, sizeof *ws);
    size_t hb;
    host_carve(ws, shape, align_in(dev_mem), align_in(host_mem), &hb);
    return FLX_OK;
}

static flx_status_t ws_check(const flx_attn_host_gpu_ws_t *ws, const char *who)
{
    if (!ws || !ws->q || !ws->in_host)
        return flx_error_set(FLX_ERR_INVALID, "%s: NULL workspace (initialised with flx_attn_host_gpu_ws_init?)", who);
    return FLX_OK;
}

flx_status_t flx_attn_score_gpu(const flx_attn_gpu_view_t *gv, int level, uint32_t G, const float *q, float *scores,
                                uint32_t ld, flx_cuda_stream_t stream)
{
    if (!gv || !q || !scores) return flx_error_set(FLX_ERR_INVALID, "score gpu: NULL view, q or scores");
    if (level < 0 || level >= FLX_KV_META_LEVELS || G == 0 || G > FLX_AG_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "score gpu: level %d or G %u out of range", level, G);
    if (ld < gv->meta_n[level] || (gv->meta_n[level] && !gv->meta[level]))
        return flx_error_set(FLX_ERR_INVALID, "score gpu: ld %u below %u blocks, or no metadata", ld,
                             gv->meta_n[level]);
    flx_status_t st = no_device("score gpu");
    if (st) return st;
#ifdef FLX_HAVE_CUDA
    return flx_attn_score_gpu_launch(gv, level, G, q, scores, ld, stream);
#else
    (void)stream;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_topk_gpu(const float *scores, uint32_t ld, uint32_t n, uint32_t G, const uint32_t *k, uint32_t *idx,
                          flx_cuda_stream_t stream)
{
    if (!scores || !k || !idx) return flx_error_set(FLX_ERR_INVALID, "topk gpu: NULL scores, k or idx");
    if (G == 0 || G > FLX_AG_MAX_GROUP || ld < n)
        return flx_error_set(FLX_ERR_INVALID, "topk gpu: G %u or ld %u below n %u", G, ld, n);
    flx_status_t st = no_device("topk gpu");
    if (st) return st;
#ifdef FLX_HAVE_CUDA
    return flx_topk_gpu_launch(scores, ld, n, G, k, idx, stream);
#else
    (void)stream;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_attn_sparse_gpu(flx_attn_host_gpu_ws_t *ws, const flx_attn_gpu_view_t *gv, int level,
                                 const float *q, const uint32_t *sel, uint32_t ld, const uint32_t *k, float *o,
                                 float *lse, flx_cuda_stream_t stream)
{
    flx_status_t st = ws_check(ws, "sparse gpu");
    if (st) return st;
    if (!gv || !q || !sel || !k || !o || !lse)
        return flx_error_set(FLX_ERR_INVALID, "sparse gpu: NULL view, q, sel, k, o or lse");
    if (level < 0 || level >= FLX_KV_META_LEVELS || gv->head_dim != ws->shape.head_dim)
        return flx_error_set(FLX_ERR_INVALID, "sparse gpu: level %d, or head_dim %u differs from the workspace's %u",
                             level, gv->head_dim, ws->shape.head_dim);
    if (gv->l_cpu > ws->shape.max_l_cpu || ld < gv->meta_n[level])
        return flx_error_set(FLX_ERR_INVALID, "sparse gpu: l_cpu %u above max_l_cpu %u, or ld %u below %u blocks",
                             gv->l_cpu, ws->shape.max_l_cpu, ld, gv->meta_n[level]);
    if ((st = no_device("sparse gpu"))) return st;
#ifdef FLX_HAVE_CUDA
    return flx_attn_sparse_gpu_launch(ws, gv, level, q, sel, ld, k, NULL, NULL, o, lse, stream);
#else
    (void)stream;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_attn_merge_gpu(uint32_t rows, uint32_t D, const float *o_a, const float *lse_a, const float *o_b,
                                const float *lse_b, float *o, float *lse, flx_cuda_stream_t stream)
{
    if (!o_a || !lse_a || !o_b || !lse_b || !o || !lse)
        return flx_error_set(FLX_ERR_INVALID, "merge gpu: NULL pointer");
    if (rows == 0 || rows > (1u << 30) || D == 0 || D > 4096)
        return flx_error_set(FLX_ERR_INVALID, "merge gpu: rows %u or D %u out of range", rows, D);
    flx_status_t st = no_device("merge gpu");
    if (st) return st;
#ifdef FLX_HAVE_CUDA
    return flx_attn_merge_gpu_launch(rows, D, 1, o_a, 0, lse_a, 0, o_b, lse_b, o, lse, stream);
#else
    (void)stream;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_attn_host_gpu(flx_attn_host_gpu_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                               const flx_attn_cfg_t *cfg, const float *o_win, const float *lse_win,
                               flx_cuda_stream_t stream)
{
    flx_status_t st = ws_check(ws, "host gpu");
    if (st) return st;
    if (!q) return flx_error_set(FLX_ERR_INVALID, "host gpu: q is NULL");
    if (!o_win != !lse_win) return flx_error_set(FLX_ERR_INVALID, "host gpu: o_win and lse_win go together");
    if (ws->pending)
        return flx_error_set(FLX_ERR_STATE, "host gpu: the workspace's last task was not finished "
                                            "(flx_attn_host_gpu_finish after the stream got past it)");
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    flx_attn_gpu_view_t gv;
    int level;
    if ((st = flx_attn_gpu_view(view, &gv)) || (st = flx_attn_check_cfg(G, cfg, &level))) return st;
    if (view->head_dim != D || view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "host gpu: view head_dim %u l_cpu %u vs workspace D %u max_l_cpu %u",
                             view->head_dim, view->l_cpu, D, ws->shape.max_l_cpu);
    if ((st = no_device("host gpu"))) return st;
#ifdef FLX_HAVE_CUDA
    /* the staging: q, k, then the window partial, as the device area is laid out */
    uint8_t *in = ws->in_host;
    const size_t off_k = (size_t)((uint8_t *)ws->k - (uint8_t *)ws->q), off_ow = (size_t)((uint8_t *)ws->o_win - (uint8_t *)ws->q);
    const size_t off_lw = (size_t)((uint8_t *)ws->lse_win - (uint8_t *)ws->q);
    uint32_t *k = (uint32_t *)(in + off_k);
    memcpy(in, q, (size_t)G * D * sizeof(float));
    const int scored = flx_attn_cfg_blocks(G, cfg, level, view->l_cpu, k, NULL) > 0;
    size_t in_len = off_k + G * sizeof(uint32_t);
    if (o_win) {
        memcpy(in + off_ow, o_win, (size_t)G * D * sizeof(float));
        memcpy(in + off_lw, lse_win, G * sizeof(float));
        in_len = off_lw + G * sizeof(float);
    }
    const uint32_t n = view->meta_n[level];
    const flx_cuda_stream_t s = stream;
    if ((st = flx_cuda_copy_htod_async(gv.device, ws->q, in, in_len, s))) return st;
    if (scored && (st = flx_attn_score_gpu_launch(&gv, level, G, ws->q, ws->scores, ws->n_max, s))) return st;
    if (cfg->mode != FLX_ATTN_FULL && (st = flx_topk_gpu_launch(ws->scores, ws->n_max, n, G, ws->k, ws->sel, s)))
        return st;
    if ((st = flx_attn_sparse_gpu_launch(ws, &gv, level, ws->q, cfg->mode == FLX_ATTN_FULL ? NULL : ws->sel,
                                         ws->n_max, ws->k, o_win ? ws->o_win : NULL, ws->lse_win, ws->o, ws->lse, s)))
        return st;
    if ((st = flx_cuda_copy_dtoh_async(gv.device, ws->out_host, ws->o, ws->out_bytes, s))) return st;
    ws->pending = 1;
    ws->blk = cfg->mode == FLX_ATTN_FULL ? 0 : 16u << level;
    ws->score_bytes = scored ? (uint64_t)n * 2 * D * sizeof(flx_bf16_t) : 0;
    return FLX_OK;
#else
    (void)o_win, (void)stream;
    return FLX_ERR_NO_DEVICE;
#endif
}

flx_status_t flx_attn_host_gpu_finish(flx_attn_host_gpu_ws_t *ws, float *o, float *lse, flx_attn_timing_t *timing)
{
    flx_status_t st = ws_check(ws, "host gpu finish");
    if (st) return st;
    if (!o || !lse) return flx_error_set(FLX_ERR_INVALID, "host gpu finish: NULL o or lse");
    if (!ws->pending) return flx_error_set(FLX_ERR_STATE, "host gpu finish: no task in flight on this workspace");
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    const uint8_t *out = ws->out_host;
    const size_t off_l = (size_t)((uint8_t *)ws->lse - (uint8_t *)ws->o), off_c = (size_t)((uint8_t *)ws->count - (uint8_t *)ws->o);
    uint32_t count[2];
    memcpy(o, out, (size_t)G * D * sizeof(float));
    memcpy(lse, out + off_l, G * sizeof(float));
    memcpy(count, out + off_c, sizeof count);
    if (timing) {
        timing->score_bytes = ws->score_bytes;
        timing->attn_bytes = (uint64_t)count[1] * D * 4;   /* K + V bf16 of the union's tokens */
    }
    ws->pending = 0;
    return FLX_OK;
}
