/*
 * attn_bind.c - what needs the kvstore library: binding the OpenMP worker pool to the KV's NUMA node,
 * and the task addressed by (session, layer, kv group).
 *
 * DESIGN
 * libgomp keeps its pool threads alive between parallel regions, so binding them once (here)
 * holds for every later kernel call with the same thread count; kernels never pay for it per call.
 */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "flx/attn.h"

flx_status_t flx_attn_bind_threads(int numa_node, uint32_t n_threads)
{
    flx_status_t st = flx_numa_check_node(numa_node);
    if (st) return st;
    if (n_threads == 0) {
#ifdef _OPENMP
        n_threads = (uint32_t)omp_get_max_threads();
#else
        n_threads = 1;
#endif
    }
    flx_status_t worst = FLX_OK;
#pragma omp parallel num_threads(n_threads)
    {
        flx_status_t s = flx_numa_bind_thread(numa_node);
        if (s) {
#pragma omp critical
            worst = s;
        }
    }
    return worst;
}

flx_status_t flx_attn_session_run(flx_attn_ws_t *ws, flx_kv_session_h sess, uint32_t layer, uint32_t kv_head,
                                  const float *q, const flx_attn_cfg_t *cfg, float *o, float *lse,
                                  flx_attn_timing_t *timing)
{
    if (!sess) return flx_error_set(FLX_ERR_INVALID, "attn session_run: session is NULL");
    flx_kv_head_view_t view;
    flx_status_t st = flx_kv_head_view(sess, layer, kv_head, &view);
    if (st) return st;
    return flx_attn_group_run(ws, &view, q, cfg, o, lse, timing);
}
