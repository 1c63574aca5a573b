/*
 * features_session.c - flx_feat_layer_t of (session, layer) from the kvstore (flx/features.h).
 *
 * DESIGN
 * Pure plumbing: the window rows come from each kv head's view (a snapshot of n_win), the
 * statistics from the session's per-layer arrays, which the store keeps contiguous as
 * (n_layers, n_q_heads), so query head 0's pointers cover the whole layer. Nothing is copied.
 */
#include "flx/features.h"

flx_status_t flx_features_layer_from_session(flx_kv_session_h sess, uint32_t layer, const float *q,
                                             const flx_bf16_t **win_k, const flx_bf16_t **win_v,
                                             flx_feat_layer_t *out)
{
    if (!sess || !q || !win_k || !win_v || !out)
        return flx_error_set(FLX_ERR_INVALID, "features from session: NULL argument");
    flx_kv_session_shape_t sh;
    flx_status_t st = flx_kv_session_shape(sess, &sh);
    if (st) return st;
    if (layer >= sh.n_layers)
        return flx_error_set(FLX_ERR_INVALID, "features from session: layer %u of %u", layer, sh.n_layers);
    const flx_head_stats_t *stats;
    const float *mean_k, *q_anchor;
    if ((st = flx_kv_head_stats(sess, layer, 0, &stats, &mean_k, &q_anchor))) return st;
    if (!stats || !mean_k || !q_anchor)
        return flx_error_set(FLX_ERR_STATE, "features from session: session has no statistics");
    uint32_t n_win = 0;
    for (uint32_t g = 0; g < sh.n_kv_heads; g++) {
        flx_kv_head_view_t v;
        if ((st = flx_kv_head_view(sess, layer, g, &v))) return st;
        win_k[g] = v.win_k;
        win_v[g] = v.win_v;
        n_win = v.n_win;
    }
    *out = (flx_feat_layer_t){.layer = layer, .n_q_heads = sh.n_q_heads, .n_kv_heads = sh.n_kv_heads,
                              .head_dim = sh.head_dim, .l_cpu = sh.l_cpu, .n_sink = sh.n_sink,
                              .n_local = sh.n_local, .n_win = n_win, .win_k = win_k, .win_v = win_v,
                              .stats = stats, .mean_k = mean_k, .q_anchor = q_anchor, .q = q};
    return FLX_OK;
}
