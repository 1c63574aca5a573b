/*
 * flx/features.h - the 41 head features of the paper's appendix A: prefill-time statistics
 * (computed once per prompt, shipped with the KV as flx_head_stats_t) and decode-time features
 * (computed per step from those statistics, the current query and the device-resident window; they
 * never read host-resident K or V).
 *
 * DEFINITIONS (layer l, query head h of KV group g = h / (Hq / Hkv), head dim D)
 *   Segments of the prompt of L tokens, as the kvstore cuts them (flx/kvstore.h):
 *     sink   prompt positions [0, n_sink)                 n_sink  = min(sink, L)
 *     cpu    [n_sink, n_sink + l_cpu)                     host-resident
 *     local  [n_sink + l_cpu, L)                          n_local = min(local, L - n_sink)
 *   During decode the window is sink, local, then the n_new generated tokens: L_gpu = n_sink +
 *   n_local + n_new. "local" in the features is the PROMPT's local segment (the appendix defines
 *   the segments on the prefill KV); the generated tokens enter only through L_gpu and the
 *   cross-head window outputs O~ (which use the whole window, as the appendix's K_gpu does).
 *   ||x||              Euclidean norm over D
 *   z_i(q)             <q, k_i> / (||q|| sqrt(D)), k_i in the cpu segment
 *   s_S(q)             q K_S^T / sqrt(D);   LSE(s) = log sum_i e^{s_i} (natural log)
 *   O_S(q)             softmax(s_S(q)) V_S
 *   moments            over tokens: MEAN, VAR (population, / n), SKEW = m3 / m2^1.5,
 *                      KURT = m4 / m2^2 (Pearson, 3 for a normal: not excess); SKEW and KURT are 0
 *                      when m2 == 0 (a constant or single-token segment)
 *   empty segment      LSE = FLX_FEAT_LSE_EMPTY, norms and moments 0 (a prompt shorter than
 *                      sink + local has no cpu segment; such a head has nothing on the host)
 *   q'                 the anchor query: the query of the prompt's last token (RoPE applied)
 *   bgt*(blk)          the least budget meeting Eq. 2 (tau) for q' over the prompt, with the window
 *                      = sink + local, at blk in {16, 32, 64, 128} (flx/budget.h, criterion FLUXION)
 *   O~_h'(q)           window-only output of query head h' of the same layer (all window rows)
 *
 * FEATURE VECTOR (float[41], index = enum below; the predictor's input order)
 *   0  layer index l                        1  query head index h (within the layer)
 *   2  L_cpu                                3  L_gpu
 *   4  MEAN_i ||k_i|| over sink             5  MEAN_i ||v_i|| over sink
 *   6  ||MEAN(K_cpu)||                      7  ||MEAN(V_cpu)||
 *   8..11  MEAN, VAR, SKEW, KURT of ||k_i||, i in cpu
 *   12..15 MEAN, VAR, SKEW, KURT of ||v_i||, i in cpu
 *   16 <q, MEAN(K_cpu)> / (||q|| sqrt(D))   (= mu_q)
 *   17..20 MEAN, VAR, SKEW, KURT of z(q')
 *   21 LSE(s_sink(q))   22 LSE(s_cpu(q)) by the moment approximation
 *                          log(L_cpu) + ||q|| mu_q + 1/2 ||q||^2 VAR(z(q'))
 *   23 LSE(s_local(q))  24 LSE(s_sink(q'))  25 LSE(s_cpu(q'))  26 LSE(s_local(q'))
 *   27 ||O_sink(q)||    28 ||O_local(q)||
 *   29 ||O_sink(q')||   30 ||O_cpu(q')||    31 ||O_local(q')||
 *   32 ||q||            33 ||q'||           34 <q, q'> / (||q|| ||q'||)
 *   35..38 bgt*(16), bgt*(32), bgt*(64), bgt*(128)
 *   39 max_h' ||O~_h'(q)||                  40 max_h' ||O~_h'(q')||  (window = sink + local)
 * A zero query (||q|| = 0) gives mu_q = 0 and cosine 0.
 *
 * THREAD MODE: pure functions of their inputs; callable from any thread.
 */
#ifndef FLX_FEATURES_H
#define FLX_FEATURES_H

#include <stdint.h>

#include "flx/attn.h"
#include "flx/bf16.h"
#include "flx/kvstore.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_FEAT_COUNT 41
#define FLX_FEAT_LSE_EMPTY (-30.0f) /* LSE of an empty segment: a mass of e^-30, finite for the MLP */

enum flx_feat_index {
    FLX_F_LAYER = 0, FLX_F_HEAD, FLX_F_L_CPU, FLX_F_L_GPU,
    FLX_F_K_SINK_NORM, FLX_F_V_SINK_NORM, FLX_F_K_CPU_MEAN_NORM, FLX_F_V_CPU_MEAN_NORM,
    FLX_F_K_CPU_NORM_MEAN, FLX_F_K_CPU_NORM_VAR, FLX_F_K_CPU_NORM_SKEW, FLX_F_K_CPU_NORM_KURT,
    FLX_F_V_CPU_NORM_MEAN, FLX_F_V_CPU_NORM_VAR, FLX_F_V_CPU_NORM_SKEW, FLX_F_V_CPU_NORM_KURT,
    FLX_F_MU_Q, FLX_F_Z_A_MEAN, FLX_F_Z_A_VAR, FLX_F_Z_A_SKEW, FLX_F_Z_A_KURT,
    FLX_F_LSE_SINK_Q, FLX_F_LSE_CPU_Q, FLX_F_LSE_LOCAL_Q, FLX_F_LSE_SINK_A, FLX_F_LSE_CPU_A, FLX_F_LSE_LOCAL_A,
    FLX_F_ONORM_SINK_Q, FLX_F_ONORM_LOCAL_Q, FLX_F_ONORM_SINK_A, FLX_F_ONORM_CPU_A, FLX_F_ONORM_LOCAL_A,
    FLX_F_Q_NORM, FLX_F_QA_NORM, FLX_F_Q_COS,
    FLX_F_BGT16, FLX_F_BGT32, FLX_F_BGT64, FLX_F_BGT128,
    FLX_F_MAX_ONORM_Q, FLX_F_MAX_ONORM_A,
};

/* Short stable name of feature i ("layer", "l_cpu", "lse_cpu_q", ...), used in dataset files and
 * reports; NULL outside [0, 41). */
const char *flx_feature_name(int i);

/* ---- prefill: statistics of one layer ---- */

typedef struct flx_prefill_layer {
    uint32_t n_q_heads, n_kv_heads, head_dim;  /* Hq multiple of Hkv; D multiple of 16, <= 256 */
    uint32_t prompt_len;                       /* L >= 1 */
    uint32_t sink, local;                      /* the store's segment sizes (defaults 64, 256) */
    const flx_bf16_t *k, *v;                   /* (Hkv, tok_stride, D): token i of kv head g at
                                                * (g * tok_stride + i) * D; RoPE applied to K */
    uint32_t tok_stride;                       /* >= prompt_len */
    const float *q_anchor;                     /* (Hq, D) query of token L - 1, RoPE applied */
    float tau;                                 /* Eq. 2 threshold for bgt* (default 0.1) */
    flx_pool_h pool;                           /* workers for the bgt* searches (borrowed); NULL:
                                                  the caller alone; results do not depend on it */
} flx_prefill_layer_t;

/* Statistics of every query head of the layer: stats (Hq), mean_k (Hq, D) = MEAN(K_cpu) of the
 * head's group, q_anchor_out (Hq, D) = copy of q'. The output passes flx_kv_stats_write's checks.
 * Cost O(Hq * L * D) plus the bgt* searches; allocates its scratch. FLX_ERR_INVALID names a bad
 * argument. */
flx_status_t flx_prefill_stats(const flx_prefill_layer_t *in, flx_head_stats_t *stats, float *mean_k,
                               float *q_anchor_out);

/* ---- decode: features of one layer ---- */

typedef struct flx_feat_layer {
    uint32_t layer;                             /* l (feature 0) */
    uint32_t n_q_heads, n_kv_heads, head_dim;
    uint32_t l_cpu, n_sink, n_local;            /* the session's segments */
    uint32_t n_win;                             /* window rows = n_sink + n_local + n_new */
    const flx_bf16_t *const *win_k;             /* per kv head: (>= n_win, D) window K rows */
    const flx_bf16_t *const *win_v;             /* per kv head: window V rows */
    const flx_head_stats_t *stats;              /* (Hq) prefill statistics */
    const float *mean_k;                        /* (Hq, D) */
    const float *q_anchor;                      /* (Hq, D) */
    const float *q;                             /* (Hq, D) current queries */
    flx_attn_ws_t *ws;                          /* optional: an attention workspace (flx/attn.h) for
                                                 * group Hq / Hkv and head_dim D, used by one thread:
                                                 * the window partials then run on the attention
                                                 * core's SIMD window kernel (the decode loop's
                                                 * path); NULL: a scalar loop (offline tools) */
} flx_feat_layer_t;

/* feat (Hq, 41). Also returns, when not NULL, each head's window partial (o_win (Hq, D), lse_win
 * (Hq)) over all n_win rows, which the attention step merges with the host part instead of
 * recomputing it (both are required when in->ws is set: they hold the partials being merged).
 * Reads only the window. */
flx_status_t flx_features_decode(const flx_feat_layer_t *in, float *feat, float *o_win, float *lse_win);

/* flx_features_decode in two parts, so that a pool can compute the groups at once:
 * _groups computes the rows of the heads of kv groups [g0, g1) (feat, o_win, lse_win rows of those
 * heads; with in->ws, one workspace per concurrent call), leaving in FLX_F_MAX_ONORM_Q each head's
 * own window-output norm; _finish, once every group is done, replaces it by the maximum over the
 * layer's heads. flx_features_decode is _groups(0, n_kv_heads) then _finish: the same bits. */
flx_status_t flx_features_decode_groups(const flx_feat_layer_t *in, uint32_t g0, uint32_t g1, float *feat,
                                        float *o_win, float *lse_win);
void flx_features_decode_finish(const flx_feat_layer_t *in, float *feat);

/* Builds the flx_feat_layer_t of (session, layer) from the store: views of every kv head, stats.
 * win_k / win_v must hold n_kv_heads pointers each and outlive the returned struct's use.
 * FLX_ERR_STATE when the session has no statistics (opened with FLX_KV_SESSION_NO_STATS). */
flx_status_t flx_features_layer_from_session(flx_kv_session_h sess, uint32_t layer, const float *q,
                                             const flx_bf16_t **win_k, const flx_bf16_t **win_v,
                                             flx_feat_layer_t *out);

#ifdef __cplusplus
}
#endif
#endif
