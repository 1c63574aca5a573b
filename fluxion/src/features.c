/*
 * features.c - prefill statistics and decode-time features (flx/features.h).
 *
 * DESIGN
 * Prefill (once per prompt, off the hot path) works in double straight from the raw arrays: per kv
 * head the K/V norm moments and MEAN(K_cpu), per query head the anchor's z moments and segment
 * partials; bgt*(blk) is flx_label_layer itself (criterion FLUXION) on views that
 * flx_attn_layout_build lays out in the store's format with the window = sink + local, so the
 * statistic is the very search the labels use. Decode runs per layer per step and allocates
 * nothing: per KV group one pass of the attention core's window kernel whose chunks stop at the
 * segment boundaries (sink, local, generated), so the same chunk states give each segment's
 * partial (its LSE and output norm) and, merged, the window partial the attention step reuses (the
 * scalar path without a workspace: one two-pass softmax per segment, then LSE merges); the host
 * segment enters only through the stored statistics (LSE_cpu by the moment approximation).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/attn_layout.h"
#include "flx/budget.h"
#include "flx/features.h"

static const char *const g_names[FLX_FEAT_COUNT] = {
    "layer", "head", "l_cpu", "l_gpu",
    "k_sink_norm", "v_sink_norm", "k_cpu_mean_norm", "v_cpu_mean_norm",
    "k_cpu_norm_mean", "k_cpu_norm_var", "k_cpu_norm_skew", "k_cpu_norm_kurt",
    "v_cpu_norm_mean", "v_cpu_norm_var", "v_cpu_norm_skew", "v_cpu_norm_kurt",
    "mu_q", "z_a_mean", "z_a_var", "z_a_skew", "z_a_kurt",
    "lse_sink_q", "lse_cpu_q", "lse_local_q", "lse_sink_a", "lse_cpu_a", "lse_local_a",
    "onorm_sink_q", "onorm_local_q", "onorm_sink_a", "onorm_cpu_a", "onorm_local_a",
    "q_norm", "qa_norm", "q_cos",
    "bgt16", "bgt32", "bgt64", "bgt128",
    "max_onorm_q", "max_onorm_a",
};

const char *flx_feature_name(int i)
{
    return i >= 0 && i < FLX_FEAT_COUNT ? g_names[i] : NULL;
}

/* ---- prefill ---- */

static void moments(const double *x, uint32_t n, float out[4])
{
    memset(out, 0, 4 * sizeof(float));
    if (n == 0) return;
    double mean = 0, m2 = 0, m3 = 0, m4 = 0;
    for (uint32_t i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (uint32_t i = 0; i < n; i++) {
        double c = x[i] - mean, c2 = c * c;
        m2 += c2;
        m3 += c2 * c;
        m4 += c2 * c2;
    }
    m2 /= n, m3 /= n, m4 /= n;
    out[0] = (float)mean;
    out[1] = (float)m2;
    out[2] = m2 > 0 ? (float)(m3 / pow(m2, 1.5)) : 0.0f;
    out[3] = m2 > 0 ? (float)(m4 / (m2 * m2)) : 0.0f;
}

static double norm_bf16(const flx_bf16_t *x, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) {
        double a = flx_bf16_to_f32(x[d]);
        s += a * a;
    }
    return sqrt(s);
}

static double norm_f32(const float *x, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) s += (double)x[d] * x[d];
    return sqrt(s);
}

/* Double softmax partial of q over n contiguous rows: returns LSE (FLX_FEAT_LSE_EMPTY when n = 0),
 * *onorm = ||O||. */
static double seg_partial_d(const float *q, const flx_bf16_t *k, const flx_bf16_t *v, uint32_t n, uint32_t D,
                            double *onorm)
{
    *onorm = 0;
    if (n == 0) return FLX_FEAT_LSE_EMPTY;
    double scale = 1.0 / sqrt((double)D), m = -INFINITY, l = 0, o[FLX_ATTN_MAX_HEAD_DIM] = {0};
    for (uint32_t i = 0; i < n; i++) {
        double s = 0;
        for (uint32_t d = 0; d < D; d++) s += (double)q[d] * flx_bf16_to_f32(k[(size_t)i * D + d]);
        m = s * scale > m ? s * scale : m;
    }
    for (uint32_t i = 0; i < n; i++) {
        double s = 0;
        for (uint32_t d = 0; d < D; d++) s += (double)q[d] * flx_bf16_to_f32(k[(size_t)i * D + d]);
        double w = exp(s * scale - m);
        l += w;
        for (uint32_t d = 0; d < D; d++) o[d] += w * flx_bf16_to_f32(v[(size_t)i * D + d]);
    }
    double n2 = 0;
    for (uint32_t d = 0; d < D; d++) n2 += (o[d] / l) * (o[d] / l);
    *onorm = sqrt(n2);
    return m + log(l);
}

typedef struct row_ctx {
    const flx_bf16_t *k, *v;   /* the kv head's rows (tok_stride, D) */
    uint32_t D;
} row_ctx_t;

static void row_copy(void *ctx, uint32_t i, flx_bf16_t *k, flx_bf16_t *v)
{
    const row_ctx_t *c = ctx;
    memcpy(k, c->k + (size_t)i * c->D, c->D * sizeof(flx_bf16_t));
    memcpy(v, c->v + (size_t)i * c->D, c->D * sizeof(flx_bf16_t));
}

flx_status_t flx_prefill_stats(const flx_prefill_layer_t *in, flx_head_stats_t *stats, float *mean_k,
                               float *q_anchor_out)
{
    if (!in || !stats || !mean_k || !q_anchor_out)
        return flx_error_set(FLX_ERR_INVALID, "prefill stats: NULL argument");
    const uint32_t Hq = in->n_q_heads, Hkv = in->n_kv_heads, D = in->head_dim, L = in->prompt_len;
    if (Hkv == 0 || Hq == 0 || Hq % Hkv)
        return flx_error_set(FLX_ERR_INVALID, "prefill stats: n_q_heads %u not a multiple of n_kv_heads %u", Hq, Hkv);
    if (D == 0 || D % 16 || D > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "prefill stats: head_dim %u not a multiple of 16 in 16..256", D);
    if (L == 0 || in->tok_stride < L)
        return flx_error_set(FLX_ERR_INVALID, "prefill stats: prompt_len %u / tok_stride %u invalid", L,
                             in->tok_stride);
    if (!in->k || !in->v || !in->q_anchor) return flx_error_set(FLX_ERR_INVALID, "prefill stats: k, v or q_anchor is NULL");
    if (!(in->tau > 0.0f && in->tau < 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "prefill stats: tau %g not in (0, 1)", (double)in->tau);
    for (size_t i = 0; i < (size_t)Hq * D; i++)
        if (!isfinite(in->q_anchor[i]))
            return flx_error_set(FLX_ERR_INVALID, "prefill stats: q_anchor[%zu] not finite", i);

    const uint32_t n_sink = in->sink < L ? in->sink : L;
    const uint32_t n_local = in->local < L - n_sink ? in->local : L - n_sink;
    const uint32_t l_cpu = L - n_sink - n_local, G = Hq / Hkv;
    flx_attn_layout_t *lay = calloc(Hkv, sizeof *lay);
    flx_kv_head_view_t *views = malloc(Hkv * sizeof *views);
    flx_head_label_t *lab = malloc(Hq * sizeof *lab);
    double *x = malloc(((size_t)l_cpu + 1) * sizeof *x);
    flx_head_stats_t *st_out = calloc(Hq, sizeof *st_out);
    double *mk = calloc((size_t)Hq * D, sizeof *mk);
    flx_status_t st = FLX_OK;
    if (!lay || !views || !lab || !x || !st_out || !mk) {
        st = flx_error_set(FLX_ERR_NOMEM, "prefill stats: no memory for %u heads of %u tokens", Hq, L);
        goto out;
    }
    uint32_t built = 0;
    for (; built < Hkv; built++) {
        row_ctx_t rc = {in->k + (size_t)built * in->tok_stride * D, in->v + (size_t)built * in->tok_stride * D, D};
        if ((st = flx_attn_layout_build(&lay[built], L, D, in->sink, in->local, row_copy, &rc))) goto out;
        views[built] = lay[built].view;
    }
    const uint32_t blks[4] = {16, 32, 64, 128};
    flx_label_layer_in_t li = {.n_q_heads = Hq, .n_kv_heads = Hkv, .views = views, .q = in->q_anchor,
                               .crit = FLX_CRIT_FLUXION, .tau = in->tau, .n_blk = 4, .blks = blks,
                               .pool = in->pool};
    if ((st = flx_label_layer(&li, lab))) goto out;

    double max_win = 0;
    for (uint32_t g = 0; g < Hkv; g++) {
        const flx_bf16_t *K = in->k + (size_t)g * in->tok_stride * D, *V = in->v + (size_t)g * in->tok_stride * D;
        const flx_bf16_t *Kc = K + (size_t)n_sink * D, *Vc = V + (size_t)n_sink * D;
        flx_head_stats_t s;
        memset(&s, 0, sizeof s);
        s.version = FLX_HEAD_STATS_VERSION;
        double ks = 0, vs = 0;
        for (uint32_t i = 0; i < n_sink; i++) {
            ks += norm_bf16(K + (size_t)i * D, D);
            vs += norm_bf16(V + (size_t)i * D, D);
        }
        s.k_sink_norm = n_sink ? (float)(ks / n_sink) : 0.0f;
        s.v_sink_norm = n_sink ? (float)(vs / n_sink) : 0.0f;
        double *mkg = mk + (size_t)g * G * D, mv[FLX_ATTN_MAX_HEAD_DIM] = {0};
        for (uint32_t i = 0; i < l_cpu; i++)
            for (uint32_t d = 0; d < D; d++) {
                mkg[d] += flx_bf16_to_f32(Kc[(size_t)i * D + d]);
                mv[d] += flx_bf16_to_f32(Vc[(size_t)i * D + d]);
            }
        double nk = 0, nv = 0;
        for (uint32_t d = 0; d < D && l_cpu; d++) {
            mkg[d] /= l_cpu;
            mv[d] /= l_cpu;
            nk += mkg[d] * mkg[d];
            nv += mv[d] * mv[d];
        }
        s.k_cpu_mean_norm = (float)sqrt(nk);
        s.v_cpu_mean_norm = (float)sqrt(nv);
        for (uint32_t i = 0; i < l_cpu; i++) x[i] = norm_bf16(Kc + (size_t)i * D, D);
        moments(x, l_cpu, s.k_cpu_norm_mom);
        for (uint32_t i = 0; i < l_cpu; i++) x[i] = norm_bf16(Vc + (size_t)i * D, D);
        moments(x, l_cpu, s.v_cpu_norm_mom);

        for (uint32_t h = g * G; h < (g + 1) * G; h++) {
            const float *qa = in->q_anchor + (size_t)h * D;
            flx_head_stats_t *o = &st_out[h];
            *o = s;
            if (h != g * G) memcpy(mk + (size_t)h * D, mkg, D * sizeof(double));
            double qn = norm_f32(qa, D);
            for (uint32_t i = 0; i < l_cpu; i++) {
                double dot = 0;
                for (uint32_t d = 0; d < D; d++) dot += (double)qa[d] * flx_bf16_to_f32(Kc[(size_t)i * D + d]);
                x[i] = qn > 0 ? dot / (qn * sqrt((double)D)) : 0.0;
            }
            moments(x, l_cpu, o->z_anchor_mom);
            const uint32_t off[3] = {0, n_sink, n_sink + l_cpu}, cnt[3] = {n_sink, l_cpu, n_local};
            for (int sgm = 0; sgm < 3; sgm++) {
                double on;
                o->lse_anchor[sgm] = (float)seg_partial_d(qa, K + (size_t)off[sgm] * D, V + (size_t)off[sgm] * D,
                                                          cnt[sgm], D, &on);
                o->onorm_anchor[sgm] = (float)on;
            }
            o->q_anchor_norm = (float)qn;
            for (int j = 0; j < 4; j++) o->bgt_star[j] = lab[h].bgt[j + 1];   /* bgt[0] is blk 1, not searched */
            /* window = sink + local of the layout view: its rows are exactly those */
            double on;
            seg_partial_d(qa, views[g].win_k, views[g].win_v, views[g].n_win, D, &on);
            max_win = on > max_win ? on : max_win;
        }
    }
    for (uint32_t h = 0; h < Hq; h++) {
        st_out[h].max_onorm_gpu_anchor = (float)max_win;
        stats[h] = st_out[h];
    }
    for (size_t i = 0; i < (size_t)Hq * D; i++) {
        mean_k[i] = (float)mk[i];
        q_anchor_out[i] = in->q_anchor[i];
    }
out:
    if (lay)
        for (uint32_t g = 0; g < Hkv; g++) flx_attn_layout_free(&lay[g]);
    free(lay);
    free(views);
    free(lab);
    free(x);
    free(st_out);
    free(mk);
    return st;
}

/* ---- decode ---- */

/* fp32 two-pass softmax partial of q (pre-scaled) over n rows: o (D), returns lse (-inf when n = 0). */
static float seg_partial_f(const float *qs, const flx_bf16_t *k, const flx_bf16_t *v, uint32_t n, uint32_t D,
                           float *o)
{
    memset(o, 0, D * sizeof(float));
    if (n == 0) return -INFINITY;
    float m = -INFINITY, l = 0;
    for (uint32_t i = 0; i < n; i++) {
        float s = 0;
        for (uint32_t d = 0; d < D; d++) s += qs[d] * flx_bf16_to_f32(k[(size_t)i * D + d]);
        m = s > m ? s : m;
    }
    for (uint32_t i = 0; i < n; i++) {
        float s = 0;
        for (uint32_t d = 0; d < D; d++) s += qs[d] * flx_bf16_to_f32(k[(size_t)i * D + d]);
        float w = expf(s - m);
        l += w;
        for (uint32_t d = 0; d < D; d++) o[d] += w * flx_bf16_to_f32(v[(size_t)i * D + d]);
    }
    for (uint32_t d = 0; d < D; d++) o[d] /= l;
    return m + logf(l);
}

static float norm_vec(const float *x, uint32_t D)
{
    return (float)norm_f32(x, D);
}

/* acc <- merge(acc, part), both (o, lse): the attention core's LSE merge, one head. */
static void merge_into(float *o, float *lse, const float *op, float lsep, uint32_t D)
{
    flx_attn_merge(1, D, o, lse, op, &lsep, o, lse);
}

/* The partials of the G heads of one kv group in one pass of the attention core's window kernel
 * over the segments (sink, local, generated): per head the sink and local LSE and output norms go
 * to seg_lse / seg_norm [0] and [1]; o (G, D), lse (G) receive the whole window's partial. */
static flx_status_t group_partials(flx_attn_ws_t *ws, const flx_bf16_t *K, const flx_bf16_t *V, uint32_t ns,
                                   uint32_t nl, uint32_t nn, uint32_t D, const float *q, float *o, float *lse,
                                   float seg_lse[2][FLX_ATTN_MAX_GROUP], float seg_norm[2][FLX_ATTN_MAX_GROUP])
{
    const uint32_t G = ws->shape.group, rows[3] = {ns, nl, nn};
    flx_kv_head_view_t v;
    memset(&v, 0, sizeof v);
    v.head_dim = D, v.numa_node = -1, v.win_device = -1;
    v.win_k = (flx_bf16_t *)K, v.win_v = (flx_bf16_t *)V;
    v.n_win = v.win_cap = ns + nl + nn;
    flx_status_t st = flx_attn_window_segments(ws, &v, q, 3, rows, ws->o_seg, ws->lse_seg, o, lse);
    if (st) return st;
    for (int sgm = 0; sgm < 2; sgm++)   /* an empty segment's partial is already o = 0, lse = -inf */
        for (uint32_t j = 0; j < G; j++) {
            seg_lse[sgm][j] = ws->lse_seg[sgm * G + j];
            seg_norm[sgm][j] = norm_vec(ws->o_seg + ((size_t)sgm * G + j) * D, D);
        }
    return FLX_OK;
}

flx_status_t flx_features_decode_groups(const flx_feat_layer_t *in, uint32_t g0, uint32_t g1, float *feat,
                                        float *o_win, float *lse_win)
{
    if (!in || !feat) return flx_error_set(FLX_ERR_INVALID, "features: in or feat is NULL");
    const uint32_t Hq = in->n_q_heads, Hkv = in->n_kv_heads, D = in->head_dim;
    if (Hkv == 0 || Hq == 0 || Hq % Hkv)
        return flx_error_set(FLX_ERR_INVALID, "features: n_q_heads %u not a multiple of n_kv_heads %u", Hq, Hkv);
    if (D == 0 || D % 16 || D > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "features: head_dim %u not a multiple of 16 in 16..256", D);
    if (in->n_win < in->n_sink + in->n_local)
        return flx_error_set(FLX_ERR_INVALID, "features: n_win %u below sink %u + local %u", in->n_win, in->n_sink,
                             in->n_local);
    if (!in->stats || !in->mean_k || !in->q_anchor || !in->q || !in->win_k || !in->win_v)
        return flx_error_set(FLX_ERR_INVALID, "features: stats, mean_k, q_anchor, q or window pointers NULL");
    for (uint32_t g = 0; g < Hkv && in->n_win; g++)
        if (!in->win_k[g] || !in->win_v[g])
            return flx_error_set(FLX_ERR_INVALID, "features: window of kv head %u is NULL", g);
    if (g0 > g1 || g1 > Hkv)
        return flx_error_set(FLX_ERR_INVALID, "features: kv groups [%u, %u) not within [0, %u)", g0, g1, Hkv);
    const uint32_t G = Hq / Hkv, ns = in->n_sink, nl = in->n_local, nn = in->n_win - ns - nl;
    flx_attn_ws_t *ws = in->ws;
    if (ws && (!o_win || !lse_win || ws->shape.group != G || ws->shape.head_dim != D))
        return flx_error_set(FLX_ERR_INVALID, "features: workspace of group %u head_dim %u for %u / %u, or no o_win",
                             ws->shape.group, ws->shape.head_dim, G, D);
    const float scale = 1.0f / sqrtf((float)D);
    float qs[FLX_ATTN_MAX_HEAD_DIM], os[FLX_ATTN_MAX_HEAD_DIM], ol[FLX_ATTN_MAX_HEAD_DIM];
    float on[FLX_ATTN_MAX_HEAD_DIM], ow[FLX_ATTN_MAX_HEAD_DIM];
    float seg_lse[2][FLX_ATTN_MAX_GROUP], seg_norm[2][FLX_ATTN_MAX_GROUP];   /* sink, local of one group */
    for (uint32_t h = g0 * G; h < g1 * G; h++) {
        const flx_head_stats_t *s = &in->stats[h];
        const float *q = in->q + (size_t)h * D, *qa = in->q_anchor + (size_t)h * D, *mk = in->mean_k + (size_t)h * D;
        const flx_bf16_t *K = in->win_k[h / G], *V = in->win_v[h / G];
        float *f = feat + (size_t)h * FLX_FEAT_COUNT;
        double qq = 0, qm = 0, qaqa = 0, qqa = 0;
        for (uint32_t d = 0; d < D; d++) {
            qq += (double)q[d] * q[d];
            qm += (double)q[d] * mk[d];
            qaqa += (double)qa[d] * qa[d];
            qqa += (double)q[d] * qa[d];
            qs[d] = q[d] * scale;
        }
        const double qn = sqrt(qq), mu = qn > 0 ? qm / (qn * sqrt((double)D)) : 0.0;
        float lse_s, lse_l, lse_w, onorm_s, onorm_l;
        if (ws) {
            /* the group's partials for all its heads at once, on its first head */
            if (h % G == 0) {
                flx_status_t st = group_partials(ws, K, V, ns, nl, nn, D, q, o_win + (size_t)h * D, lse_win + h,
                                                 seg_lse, seg_norm);
                if (st) return st;
            }
            lse_s = seg_lse[0][h % G], lse_l = seg_lse[1][h % G];
            onorm_s = seg_norm[0][h % G], onorm_l = seg_norm[1][h % G];
            lse_w = lse_win[h];
            memcpy(ow, o_win + (size_t)h * D, D * sizeof(float));
        } else {
            lse_s = seg_partial_f(qs, K, V, ns, D, os);
            lse_l = seg_partial_f(qs, K + (size_t)ns * D, V + (size_t)ns * D, nl, D, ol);
            float lse_n = seg_partial_f(qs, K + (size_t)(ns + nl) * D, V + (size_t)(ns + nl) * D, nn, D, on);
            lse_w = -INFINITY;
            memset(ow, 0, D * sizeof(float));
            merge_into(ow, &lse_w, os, lse_s, D);
            merge_into(ow, &lse_w, ol, lse_l, D);
            merge_into(ow, &lse_w, on, lse_n, D);
            onorm_s = norm_vec(os, D), onorm_l = norm_vec(ol, D);
        }

        f[FLX_F_LAYER] = (float)in->layer;
        f[FLX_F_HEAD] = (float)h;
        f[FLX_F_L_CPU] = (float)in->l_cpu;
        f[FLX_F_L_GPU] = (float)in->n_win;
        f[FLX_F_K_SINK_NORM] = s->k_sink_norm;
        f[FLX_F_V_SINK_NORM] = s->v_sink_norm;
        f[FLX_F_K_CPU_MEAN_NORM] = s->k_cpu_mean_norm;
        f[FLX_F_V_CPU_MEAN_NORM] = s->v_cpu_mean_norm;
        for (int j = 0; j < 4; j++) {
            f[FLX_F_K_CPU_NORM_MEAN + j] = s->k_cpu_norm_mom[j];
            f[FLX_F_V_CPU_NORM_MEAN + j] = s->v_cpu_norm_mom[j];
            f[FLX_F_Z_A_MEAN + j] = s->z_anchor_mom[j];
            f[FLX_F_BGT16 + j] = s->bgt_star[j];
        }
        f[FLX_F_MU_Q] = (float)mu;
        f[FLX_F_LSE_SINK_Q] = ns ? lse_s : FLX_FEAT_LSE_EMPTY;
        f[FLX_F_LSE_CPU_Q] = in->l_cpu ? (float)(log((double)in->l_cpu) + qn * mu + 0.5 * qq * s->z_anchor_mom[1])
                                       : FLX_FEAT_LSE_EMPTY;
        f[FLX_F_LSE_LOCAL_Q] = nl ? lse_l : FLX_FEAT_LSE_EMPTY;
        for (int j = 0; j < 3; j++) {
            /* an empty segment's -inf (the stats' contract) is the features' finite EMPTY */
            f[FLX_F_LSE_SINK_A + j] = s->lse_anchor[j] > -INFINITY ? s->lse_anchor[j] : FLX_FEAT_LSE_EMPTY;
            f[FLX_F_ONORM_SINK_A + j] = s->onorm_anchor[j];
        }
        f[FLX_F_ONORM_SINK_Q] = onorm_s;
        f[FLX_F_ONORM_LOCAL_Q] = onorm_l;
        f[FLX_F_Q_NORM] = (float)qn;
        f[FLX_F_QA_NORM] = s->q_anchor_norm;
        f[FLX_F_Q_COS] = qn > 0 && qaqa > 0 ? (float)(qqa / (qn * sqrt(qaqa))) : 0.0f;
        f[FLX_F_MAX_ONORM_A] = s->max_onorm_gpu_anchor;
        f[FLX_F_MAX_ONORM_Q] = norm_vec(ow, D);   /* this head's; the maximum comes in _finish */
        if (o_win && !ws) memcpy(o_win + (size_t)h * D, ow, D * sizeof(float));
        if (lse_win && !ws) lse_win[h] = lse_w;
    }
    return FLX_OK;
}

void flx_features_decode_finish(const flx_feat_layer_t *in, float *feat)
{
    float max_win = 0;
    for (uint32_t h = 0; h < in->n_q_heads; h++) {
        const float nw = feat[(size_t)h * FLX_FEAT_COUNT + FLX_F_MAX_ONORM_Q];
        max_win = nw > max_win ? nw : max_win;
    }
    for (uint32_t h = 0; h < in->n_q_heads; h++) feat[(size_t)h * FLX_FEAT_COUNT + FLX_F_MAX_ONORM_Q] = max_win;
}

flx_status_t flx_features_decode(const flx_feat_layer_t *in, float *feat, float *o_win, float *lse_win)
{
    flx_status_t st = flx_features_decode_groups(in, 0, in ? in->n_kv_heads : 0, feat, o_win, lse_win);
    if (st) return st;
    flx_features_decode_finish(in, feat);
    return FLX_OK;
}
