/* Internal declarations shared by the attention sources of fluxion/src. */
#ifndef FLX_ATTN_INTERNAL_H
#define FLX_ATTN_INTERNAL_H

#include "flx/attn.h"

flx_status_t flx_attn_check_view(const flx_kv_head_view_t *view, const char *who);
flx_status_t flx_attn_check_sel(const flx_kv_head_view_t *view, int level, uint32_t G, const uint32_t *sel,
                                uint32_t sel_stride, const uint32_t *k, const char *who);

/* The task's host part (attn_cpu.c, used by attn_task.c), in the caller-checked workspace:
 * FULL reads every host block; SPARSE reads the union of ws->sel / ws->k (stride ws->n_max).
 * *bytes_p = K+V bytes read. */
flx_status_t flx_attn_task_full_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                                     float *lse, uint64_t *bytes_p);
flx_status_t flx_attn_task_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                  float *o, float *lse, uint64_t *bytes_p);

#endif
