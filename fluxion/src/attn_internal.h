/* Internal declarations shared by the attention sources of fluxion/src. */
#ifndef FLX_ATTN_INTERNAL_H
#define FLX_ATTN_INTERNAL_H

#include "flx/attn.h"

flx_status_t flx_attn_check_view(const flx_kv_head_view_t *view, const char *who);
flx_status_t flx_attn_check_sel(const flx_kv_head_view_t *view, int level, uint32_t G, const uint32_t *sel,
                                uint32_t sel_stride, const uint32_t *k, const char *who);

#endif
