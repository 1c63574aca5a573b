/*
 * attn_bind.c - what needs the kvstore library: the task addressed by (session, layer, kv group).
 * (Workers are bound to the KV's NUMA node by their pool, flx/pool.h.)
 */
#include "flx/attn.h"

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
