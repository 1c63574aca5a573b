/*
 * attn_layout.h - lays one (layer, kv head) of KV out in the kvstore's memory format (flx/kvstore.h:
 * 16-token physical blocks of K then V bf16, the Quest min/max pyramid for blk 16..128, the window)
 * in memory owned by this helper, and returns a flx_kv_head_view_t over it. Used by fluxion-attn and
 * bench/attn until they go through the real kvstore; the layout is the store's, byte for byte.
 *
 * Token segments follow the store: n_sink = min(sink, L), n_local = min(local, L - n_sink),
 * l_cpu = L - n_sink - n_local; the host part is prompt positions [n_sink, n_sink + l_cpu), the window
 * is the sink tokens then the local tokens.
 */
#ifndef FLX_ATTN_LAYOUT_H
#define FLX_ATTN_LAYOUT_H

#include "flx/attn.h"

typedef struct flx_attn_layout {
    uint8_t *pool;                              /* (n_blocks, 64 D) bytes */
    uint32_t *table;                            /* identity (n_blocks) */
    flx_bf16_t *meta[FLX_KV_META_LEVELS];       /* (meta_n[j], 2, D) */
    flx_bf16_t *win_k, *win_v;                  /* (n_sink + n_local, D) */
    flx_kv_head_view_t view;
} flx_attn_layout_t;

/* Row accessor: writes K and V of prompt position i (D values each) as bf16. */
typedef void (*flx_attn_row_fn)(void *ctx, uint32_t i, flx_bf16_t *k, flx_bf16_t *v);

flx_status_t flx_attn_layout_build(flx_attn_layout_t *lay, uint32_t L, uint32_t D, uint32_t sink, uint32_t local,
                                   flx_attn_row_fn row, void *ctx);
void flx_attn_layout_free(flx_attn_layout_t *lay);

#endif
