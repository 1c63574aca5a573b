/* attn_layout.c - see attn_layout.h. The pyramid is the kvstore's (flx_kv_pyramid_build), so a layout
 * built here is the store's byte for byte. */
#include <stdlib.h>
#include <string.h>

#include "flx/attn_layout.h"
#include "flx/util.h"

void flx_attn_layout_free(flx_attn_layout_t *lay)
{
    if (!lay) return;
    flx_aligned_free(lay->pool);
    free(lay->table);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) free(lay->meta[j]);
    free(lay->win_k);
    free(lay->win_v);
    memset(lay, 0, sizeof *lay);
}

flx_status_t flx_attn_layout_build(flx_attn_layout_t *lay, uint32_t L, uint32_t D, uint32_t sink, uint32_t local,
                                   flx_attn_row_fn row, void *ctx)
{
    memset(lay, 0, sizeof *lay);
    if (L == 0 || D == 0 || D % 16 || D > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "layout: L %u / head_dim %u invalid", L, D);
    uint32_t n_sink = sink < L ? sink : L, n_local = local < L - n_sink ? local : L - n_sink;
    uint32_t l_cpu = L - n_sink - n_local, nb = (l_cpu + 15) / 16, n_win = n_sink + n_local;
    size_t bb = (size_t)64 * D;
    lay->pool = flx_aligned_alloc(4096, (size_t)nb * bb + 64);
    lay->table = malloc(((size_t)nb + 1) * sizeof *lay->table);
    lay->win_k = malloc(((size_t)n_win + 1) * D * sizeof(flx_bf16_t));
    lay->win_v = malloc(((size_t)n_win + 1) * D * sizeof(flx_bf16_t));
    for (int j = 0; j < FLX_KV_META_LEVELS; j++)
        lay->meta[j] = malloc(((size_t)flx_kv_meta_count(l_cpu, j) * 2 + 1) * D * sizeof(flx_bf16_t));
    int ok = lay->pool && lay->table && lay->win_k && lay->win_v;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) ok = ok && lay->meta[j];
    if (!ok) {
        flx_attn_layout_free(lay);
        return flx_error_set(FLX_ERR_NOMEM, "layout: no memory for %u tokens of head_dim %u", L, D);
    }
    memset(lay->pool, 0, (size_t)nb * bb);
    for (uint32_t i = 0; i < n_sink; i++) row(ctx, i, lay->win_k + (size_t)i * D, lay->win_v + (size_t)i * D);
    for (uint32_t i = 0; i < n_local; i++)
        row(ctx, L - n_local + i, lay->win_k + (size_t)(n_sink + i) * D, lay->win_v + (size_t)(n_sink + i) * D);
    for (uint32_t b = 0; b < nb; b++) {
        lay->table[b] = b;
        flx_bf16_t *kb = (flx_bf16_t *)(lay->pool + (size_t)b * bb), *vb = kb + 16 * D;
        for (uint32_t r = 0; r < 16 && b * 16 + r < l_cpu; r++)
            row(ctx, n_sink + b * 16 + r, kb + (size_t)r * D, vb + (size_t)r * D);
    }
    flx_kv_head_view_t *v = &lay->view;
    v->head_dim = D;
    v->l_cpu = l_cpu;
    v->n_blocks = nb;
    v->block_table = lay->table;
    v->pool_base = lay->pool;
    v->block_bytes = bb;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        v->meta[j] = lay->meta[j];
        v->meta_n[j] = flx_kv_meta_count(l_cpu, j);
    }
    v->win_k = lay->win_k;
    v->win_v = lay->win_v;
    v->n_win = n_win;
    v->win_cap = n_win;
    v->numa_node = 0;
    v->win_k_dev = v->win_v_dev = NULL;   /* host-only window */
    v->win_device = -1;
    flx_kv_pyramid_build(v, lay->meta);   /* the store's own builder: one implementation */
    return FLX_OK;
}
