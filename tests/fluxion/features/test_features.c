/* test_features.c - every one of the 41 features against a slow double oracle written from the
 * definitions of flx/features.h (raw arrays, brute-force bgt* over k); the window partial; the
 * kvstore path (stats accepted by flx_kv_stats_write, features from the session equal the raw
 * path); bad arguments refused. */
#include "../feat_testutil.h"
#include "flx/budget.h"
#include "flx/features.h"

typedef struct seg {
    double lse, onorm;
} seg_t;

/* Softmax over rows idx[0..n) of kv head g (token positions), double. */
static seg_t oracle_seg(const fkv_t *f, uint32_t g, const float *q, const uint32_t *idx, uint32_t n, double *o_out)
{
    seg_t s = {FLX_FEAT_LSE_EMPTY, 0};
    uint32_t D = f->D;
    if (n == 0) {
        if (o_out) memset(o_out, 0, D * sizeof(double));
        return s;
    }
    double m = -INFINITY, l = 0, o[256] = {0}, *lg = malloc(n * sizeof *lg);
    for (uint32_t i = 0; i < n; i++) {
        const flx_bf16_t *k = f->k + ((size_t)g * f->T + idx[i]) * D;
        double x = 0;
        for (uint32_t d = 0; d < D; d++) x += (double)q[d] * flx_bf16_to_f32(k[d]);
        lg[i] = x / sqrt((double)D);
        m = lg[i] > m ? lg[i] : m;
    }
    for (uint32_t i = 0; i < n; i++) {
        double w = exp(lg[i] - m);
        l += w;
        for (uint32_t d = 0; d < D; d++) o[d] += w * flx_bf16_to_f32(f->v[((size_t)g * f->T + idx[i]) * D + d]);
    }
    double n2 = 0;
    for (uint32_t d = 0; d < D; d++) {
        o[d] /= l;
        n2 += o[d] * o[d];
        if (o_out) o_out[d] = o[d];
    }
    free(lg);
    s.lse = m + log(l);
    s.onorm = sqrt(n2);
    return s;
}

static void oracle_mom(const double *x, uint32_t n, double out[4])
{
    memset(out, 0, 4 * sizeof(double));
    if (!n) return;
    for (uint32_t i = 0; i < n; i++) out[0] += x[i] / n;
    double m2 = 0, m3 = 0, m4 = 0;
    for (uint32_t i = 0; i < n; i++) {
        double c = x[i] - out[0];
        m2 += c * c / n, m3 += c * c * c / n, m4 += c * c * c * c / n;
    }
    out[1] = m2;
    out[2] = m2 > 0 ? m3 / pow(m2, 1.5) : 0;
    out[3] = m2 > 0 ? m4 / (m2 * m2) : 0;
}

static double dnorm(const double *x, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) s += x[d] * x[d];
    return sqrt(s);
}

static double rownorm(const flx_bf16_t *x, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) s += (double)flx_bf16_to_f32(x[d]) * flx_bf16_to_f32(x[d]);
    return sqrt(s);
}

typedef struct tcase {
    uint32_t Hq, Hkv, D, L, n_new, sink, local;
    uint64_t seed;
} tcase_t;

static void run_case(const tcase_t *c)
{
    flx_rng_t r;
    flx_rng_seed(&r, c->seed);
    fkv_t f;
    fkv_make(&f, &r, c->Hq, c->Hkv, c->D, c->L, c->n_new, 3.0f);
    const uint32_t Hq = c->Hq, Hkv = c->Hkv, D = c->D, L = c->L, G = Hq / Hkv;
    const uint32_t ns = c->sink < L ? c->sink : L, nl = c->local < L - ns ? c->local : L - ns, lc = L - ns - nl;
    const uint32_t nw = ns + nl + c->n_new;
    flx_head_stats_t st[16];
    float mk[16 * 64], qa[16 * 64], feat[16 * FLX_FEAT_COUNT], ow[16 * 64], lw[16];
    flx_prefill_layer_t pl = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .prompt_len = L, .sink = c->sink,
                              .local = c->local, .k = f.k, .v = f.v, .tok_stride = f.T, .q_anchor = f.qa, .tau = 0.1f};
    CHECK_OK(flx_prefill_stats(&pl, st, mk, qa));
    /* window rows per kv head: sink, local, generated */
    flx_bf16_t *wk = malloc((size_t)Hkv * nw * D * 2), *wv = malloc((size_t)Hkv * nw * D * 2);
    uint32_t *widx = malloc(nw * sizeof *widx), *cidx = malloc((lc + 1) * sizeof *cidx);
    CHECK(wk && wv && widx && cidx);
    for (uint32_t i = 0; i < nw; i++) widx[i] = i < ns ? i : i < ns + nl ? L - nl + (i - ns) : L + (i - ns - nl);
    for (uint32_t i = 0; i < lc; i++) cidx[i] = ns + i;
    const flx_bf16_t *pk[8], *pv[8];
    for (uint32_t g = 0; g < Hkv; g++) {
        for (uint32_t i = 0; i < nw; i++) {
            memcpy(wk + ((size_t)g * nw + i) * D, f.k + ((size_t)g * f.T + widx[i]) * D, D * 2);
            memcpy(wv + ((size_t)g * nw + i) * D, f.v + ((size_t)g * f.T + widx[i]) * D, D * 2);
        }
        pk[g] = wk + (size_t)g * nw * D;
        pv[g] = wv + (size_t)g * nw * D;
    }
    flx_feat_layer_t in = {.layer = 3, .n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .l_cpu = lc, .n_sink = ns,
                           .n_local = nl, .n_win = nw, .win_k = pk, .win_v = pv, .stats = st, .mean_k = mk,
                           .q_anchor = qa, .q = f.q};
    CHECK_OK(flx_features_decode(&in, feat, ow, lw));

    /* ---- oracle ---- */
    float ref[16 * FLX_FEAT_COUNT], refow[16 * 64], reflw[16];
    double *x = malloc((lc + 1) * sizeof *x), maxw_q = 0, maxw_a = 0;
    /* bgt*: Eq. 2 normaliser = max over heads of the full output of q' over the whole prompt */
    uint32_t *all = malloc(L * sizeof *all);
    for (uint32_t i = 0; i < L; i++) all[i] = i;
    double maxfull = 0, ofull[16][64];
    for (uint32_t h = 0; h < Hq; h++) {
        seg_t s = oracle_seg(&f, h / G, f.qa + (size_t)h * D, all, L, ofull[h]);
        maxfull = s.onorm > maxfull ? s.onorm : maxfull;
    }
    for (uint32_t h = 0; h < Hq; h++) {
        uint32_t g = h / G;
        const float *q = f.q + (size_t)h * D, *qah = f.qa + (size_t)h * D;
        const flx_bf16_t *K = f.k + (size_t)g * f.T * D, *V = f.v + (size_t)g * f.T * D;
        float *R = ref + (size_t)h * FLX_FEAT_COUNT;
        double mom[4], mkd[64] = {0}, mvd[64] = {0}, a = 0, b = 0, qn = 0, qan = 0, qqa = 0;
        R[0] = 3, R[1] = (float)h, R[2] = (float)lc, R[3] = (float)nw;
        for (uint32_t i = 0; i < ns; i++) a += rownorm(K + (size_t)i * D, D) / ns, b += rownorm(V + (size_t)i * D, D) / ns;
        R[4] = (float)a, R[5] = (float)b;
        for (uint32_t i = 0; i < lc; i++)
            for (uint32_t d = 0; d < D; d++)
                mkd[d] += flx_bf16_to_f32(K[(size_t)(ns + i) * D + d]) / lc,
                    mvd[d] += flx_bf16_to_f32(V[(size_t)(ns + i) * D + d]) / lc;
        R[6] = (float)dnorm(mkd, D), R[7] = (float)dnorm(mvd, D);
        for (uint32_t i = 0; i < lc; i++) x[i] = rownorm(K + (size_t)(ns + i) * D, D);
        oracle_mom(x, lc, mom);
        for (int j = 0; j < 4; j++) R[8 + j] = (float)mom[j];
        for (uint32_t i = 0; i < lc; i++) x[i] = rownorm(V + (size_t)(ns + i) * D, D);
        oracle_mom(x, lc, mom);
        for (int j = 0; j < 4; j++) R[12 + j] = (float)mom[j];
        double qmk = 0;
        for (uint32_t d = 0; d < D; d++)
            qn += (double)q[d] * q[d], qan += (double)qah[d] * qah[d], qqa += (double)q[d] * qah[d], qmk += q[d] * mkd[d];
        qn = sqrt(qn), qan = sqrt(qan);
        double mu = qmk / (qn * sqrt((double)D));
        R[16] = (float)mu;
        for (uint32_t i = 0; i < lc; i++) {
            double dot = 0;
            for (uint32_t d = 0; d < D; d++) dot += (double)qah[d] * flx_bf16_to_f32(K[(size_t)(ns + i) * D + d]);
            x[i] = dot / (qan * sqrt((double)D));
        }
        oracle_mom(x, lc, mom);
        for (int j = 0; j < 4; j++) R[17 + j] = (float)mom[j];
        seg_t sq = oracle_seg(&f, g, q, widx, ns, NULL), lq = oracle_seg(&f, g, q, widx + ns, nl, NULL);
        seg_t sa = oracle_seg(&f, g, qah, widx, ns, NULL), la = oracle_seg(&f, g, qah, widx + ns, nl, NULL);
        seg_t ca = oracle_seg(&f, g, qah, cidx, lc, NULL);
        R[21] = (float)sq.lse;
        R[22] = lc ? (float)(log((double)lc) + qn * mu + 0.5 * qn * qn * mom[1]) : FLX_FEAT_LSE_EMPTY;
        R[23] = (float)lq.lse, R[24] = (float)sa.lse, R[25] = (float)ca.lse, R[26] = (float)la.lse;
        R[27] = (float)sq.onorm, R[28] = (float)lq.onorm, R[29] = (float)sa.onorm, R[30] = (float)ca.onorm;
        R[31] = (float)la.onorm, R[32] = (float)qn, R[33] = (float)qan, R[34] = (float)(qqa / (qn * qan));
        /* bgt*(blk): Quest scores from per-channel min/max of the raw K (bf16-exact), brute force over k */
        for (int j = 0; j < 4; j++) {
            uint32_t blk = 16u << j, n = (lc + blk - 1) / blk, kk = 0;
            float *sc = malloc((n + 1) * sizeof *sc);
            uint32_t *ord = malloc((n + 1) * sizeof *ord), *tok = malloc((L + 1) * sizeof *tok);
            for (uint32_t bb = 0; bb < n; bb++) {
                double s = 0;
                for (uint32_t d = 0; d < D; d++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (uint32_t t = bb * blk; t < (bb + 1) * blk && t < lc; t++) {
                        float v = flx_bf16_to_f32(K[(size_t)(ns + t) * D + d]);
                        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
                    }
                    s += fmax((double)qah[d] * lo, (double)qah[d] * hi);
                }
                sc[bb] = (float)s;
            }
            for (uint32_t i = 0; i < n; i++) {   /* stable selection by (score desc, index asc) */
                uint32_t best = UINT32_MAX;
                for (uint32_t bb = 0; bb < n; bb++) {
                    int used = 0;
                    for (uint32_t u = 0; u < i; u++) used |= ord[u] == bb;
                    if (!used && (best == UINT32_MAX || sc[bb] > sc[best])) best = bb;
                }
                ord[i] = best;
            }
            for (kk = 0; kk <= n; kk++) {
                uint32_t nt = 0;
                for (uint32_t i = 0; i < ns + nl; i++) tok[nt++] = widx[i];
                for (uint32_t i = 0; i < kk; i++)
                    for (uint32_t t = ord[i] * blk; t < (ord[i] + 1) * blk && t < lc; t++) tok[nt++] = ns + t;
                double o[64], e = 0;
                oracle_seg(&f, g, qah, tok, nt, o);
                for (uint32_t d = 0; d < D; d++) e += (o[d] - ofull[h][d]) * (o[d] - ofull[h][d]);
                if (sqrt(e) / maxfull <= 0.1) break;
            }
            if (kk > n) kk = n;
            R[35 + j] = lc ? (float)fmin(1.0, (double)kk * blk / lc) : 0.0f;
            free(sc), free(ord), free(tok);
        }
        double o[64];
        seg_t wa = oracle_seg(&f, g, qah, widx, ns + nl, NULL), wq = oracle_seg(&f, g, q, widx, nw, o);
        maxw_a = wa.onorm > maxw_a ? wa.onorm : maxw_a;
        maxw_q = wq.onorm > maxw_q ? wq.onorm : maxw_q;
        for (uint32_t d = 0; d < D; d++) refow[h * D + d] = (float)o[d];
        reflw[h] = (float)wq.lse;
    }
    for (uint32_t h = 0; h < Hq; h++) ref[h * FLX_FEAT_COUNT + 39] = (float)maxw_q, ref[h * FLX_FEAT_COUNT + 40] = (float)maxw_a;
    int ok = 1;
    for (int i = 0; i < FLX_FEAT_COUNT; i++) {
        float a[16], b[16];
        for (uint32_t h = 0; h < Hq; h++) a[h] = feat[h * FLX_FEAT_COUNT + i], b[h] = ref[h * FLX_FEAT_COUNT + i];
        char label[64];
        snprintf(label, sizeof label, "feature %d %s", i, flx_feature_name(i));
        double at = i >= 35 && i <= 38 ? 1e-6 : 2e-4, rt = i == 11 || i == 15 || i == 20 ? 2e-3 : 2e-4;
        ok &= flx_test_allclose(label, a, b, Hq, at, rt);
    }
    CHECK(ok);
    CHECK_CLOSE("window output", ow, refow, (size_t)Hq * D, 1e-4, 1e-3);
    CHECK_CLOSE("window lse", lw, reflw, Hq, 1e-4, 1e-4);

    /* the decode loop's path: window partials on the attention core's window kernel, at every ISA
     * level, held to the same oracle */
    flx_attn_shape_t ash = {.group = G, .head_dim = D, .max_l_cpu = lc + 16, .pool = NULL};
    size_t wsb;
    CHECK_OK(flx_attn_plan(&ash, &wsb));
    void *wsm = flx_aligned_alloc(64, FLX_ALIGN_UP(wsb, 64));
    flx_attn_ws_t ws;
    CHECK(wsm);
    CHECK_OK(flx_attn_ws_init(&ws, &ash, wsm, wsb));
    const flx_isa_t best = flx_isa_best();
    for (int lvl = FLX_ISA_SCALAR; lvl <= (int)best; lvl++) {
        flx_isa_force((flx_isa_t)lvl);
        float featw[16 * FLX_FEAT_COUNT], oww[16 * 64], lww[16];
        flx_feat_layer_t inw = in;
        inw.ws = &ws;
        CHECK_OK(flx_features_decode(&inw, featw, oww, lww));
        for (int i = 0; i < FLX_FEAT_COUNT; i++) {
            float a[16], b[16];
            for (uint32_t h = 0; h < Hq; h++) a[h] = featw[h * FLX_FEAT_COUNT + i], b[h] = ref[h * FLX_FEAT_COUNT + i];
            char label[96];
            snprintf(label, sizeof label, "%s: feature %d %s", flx_isa_name((flx_isa_t)lvl), i, flx_feature_name(i));
            double at = i >= 35 && i <= 38 ? 1e-6 : 2e-4, rt = i == 11 || i == 15 || i == 20 ? 2e-3 : 2e-4;
            ok &= flx_test_allclose(label, a, b, Hq, at, rt);
        }
        CHECK(ok);
        CHECK_CLOSE("window output (kernel)", oww, refow, (size_t)Hq * D, 1e-4, 1e-3);
        CHECK_CLOSE("window lse (kernel)", lww, reflw, Hq, 1e-4, 1e-4);
        /* group by group (as the decode loop runs them on its pool, last group first here), then the
         * cross-head maximum: the same bits */
        float featg[16 * FLX_FEAT_COUNT], owg[16 * 64], lwg[16];
        for (uint32_t g = Hkv; g-- > 0;) CHECK_OK(flx_features_decode_groups(&inw, g, g + 1, featg, owg, lwg));
        flx_features_decode_finish(&inw, featg);
        CHECK_SAME("features group by group", featg, featw, (size_t)Hq * FLX_FEAT_COUNT);
        CHECK_SAME("window output group by group", owg, oww, (size_t)Hq * D);
        CHECK_SAME("window lse group by group", lwg, lww, Hq);
        CHECK_ST(flx_features_decode_groups(&inw, 1, Hkv + 1, featg, owg, lwg), FLX_ERR_INVALID);
        flx_feat_layer_t bad = inw;   /* the kernel path needs the partial outputs and a matching workspace */
        CHECK_ST(flx_features_decode(&bad, featw, NULL, NULL), FLX_ERR_INVALID);
    }
    flx_isa_force(best);
    flx_aligned_free(wsm);

    /* ---- the kvstore path ---- */
    flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                              FLX_KV_STORE_FIELD_WINDOW,
                                .capacity_bytes = 64u << 20, .n_layers = 2, .n_kv_heads = Hkv, .n_q_heads = Hq,
                                .head_dim = D, .sink = c->sink, .local = c->local};
    flx_kv_store_h store;
    CHECK_OK(flx_kv_store_create(&sp, &store));
    flx_kv_session_params_t pp = {.prompt_len = L, .max_new_tokens = c->n_new + 1};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(store, &pp, &sid));
    flx_bf16_t *ck = malloc((size_t)Hkv * L * D * 2), *cv = malloc((size_t)Hkv * L * D * 2);
    for (uint32_t g = 0; g < Hkv; g++) {
        memcpy(ck + (size_t)g * L * D, f.k + (size_t)g * f.T * D, (size_t)L * D * 2);
        memcpy(cv + (size_t)g * L * D, f.v + (size_t)g * f.T * D, (size_t)L * D * 2);
    }
    for (uint32_t layer = 0; layer < 2; layer++) {
        flx_kv_chunk_t ch = {.layer = layer, .head_begin = 0, .head_end = Hkv, .tok_begin = 0, .tok_end = L,
                             .dtype = FLX_DT_BF16, .head_dim = D};
        CHECK_OK(flx_kv_chunk_write(store, sid, &ch, ck, cv));
        CHECK_OK(flx_kv_stats_write(store, sid, layer, st, mk, qa));
    }
    CHECK_OK(flx_kv_session_begin_decode(store, sid));
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(store, sid, &sess));
    flx_bf16_t rk[8 * 64], rv[8 * 64];
    for (uint32_t t = 0; t < c->n_new; t++) {
        for (uint32_t g = 0; g < Hkv; g++) {
            memcpy(rk + g * D, f.k + ((size_t)g * f.T + L + t) * D, D * 2);
            memcpy(rv + g * D, f.v + ((size_t)g * f.T + L + t) * D, D * 2);
        }
        CHECK_OK(flx_kv_window_append(sess, 1, rk, rv));
    }
    const flx_bf16_t *sk[8], *sv[8];
    flx_feat_layer_t sin;
    float feat2[16 * FLX_FEAT_COUNT], ow2[16 * 64], lw2[16];
    CHECK_OK(flx_features_layer_from_session(sess, 1, f.q, sk, sv, &sin));
    CHECK(sin.n_win == nw && sin.l_cpu == lc && sin.n_sink == ns && sin.n_local == nl && sin.layer == 1);
    sin.layer = 3;
    CHECK_OK(flx_features_decode(&sin, feat2, ow2, lw2));
    CHECK(!memcmp(feat, feat2, (size_t)Hq * FLX_FEAT_COUNT * sizeof(float)));
    CHECK(!memcmp(ow, ow2, (size_t)Hq * D * sizeof(float)) && !memcmp(lw, lw2, Hq * sizeof(float)));
    CHECK_ST(flx_features_layer_from_session(sess, 2, f.q, sk, sv, &sin), FLX_ERR_INVALID);
    flx_kv_session_release(sess);
    /* a session without statistics */
    pp.flags = FLX_KV_SESSION_NO_STATS;
    CHECK_OK(flx_kv_session_open(store, &pp, &sid));
    for (uint32_t layer = 0; layer < 2; layer++) {
        flx_kv_chunk_t ch = {.layer = layer, .head_begin = 0, .head_end = Hkv, .tok_begin = 0, .tok_end = L,
                             .dtype = FLX_DT_BF16, .head_dim = D};
        CHECK_OK(flx_kv_chunk_write(store, sid, &ch, ck, cv));
    }
    CHECK_OK(flx_kv_session_acquire(store, sid, &sess));
    CHECK_ST(flx_features_layer_from_session(sess, 0, f.q, sk, sv, &sin), FLX_ERR_STATE);
    flx_kv_session_release(sess);
    flx_kv_store_destroy(store);
    free(ck), free(cv), free(x), free(all), free(wk), free(wv), free(widx), free(cidx);
    fkv_free(&f);
}

static void check_invalid(void)
{
    flx_rng_t r;
    flx_rng_seed(&r, 8);
    fkv_t f;
    fkv_make(&f, &r, 4, 2, 32, 120, 0, 2.0f);
    flx_head_stats_t st[4];
    float mk[4 * 32], qa[4 * 32], feat[4 * FLX_FEAT_COUNT];
    flx_prefill_layer_t ok = {.n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32, .prompt_len = 120, .sink = 16,
                              .local = 32, .k = f.k, .v = f.v, .tok_stride = 120, .q_anchor = f.qa, .tau = 0.1f}, p;
    CHECK_OK(flx_prefill_stats(&ok, st, mk, qa));
    p = ok, p.n_q_heads = 5;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    p = ok, p.head_dim = 24;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "head_dim 24"));
    p = ok, p.tok_stride = 100;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    p = ok, p.prompt_len = 0;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    p = ok, p.tau = 0;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    p = ok, p.k = NULL;
    CHECK_ST(flx_prefill_stats(&p, st, mk, qa), FLX_ERR_INVALID);
    CHECK_ST(flx_prefill_stats(&ok, NULL, mk, qa), FLX_ERR_INVALID);
    const flx_bf16_t *pk[2] = {f.k, f.k + 120 * 32}, *pv[2] = {f.v, f.v + 120 * 32};
    flx_feat_layer_t in = {.n_q_heads = 4, .n_kv_heads = 2, .head_dim = 32, .l_cpu = 72, .n_sink = 16, .n_local = 32,
                           .n_win = 48, .win_k = pk, .win_v = pv, .stats = st, .mean_k = mk, .q_anchor = qa, .q = f.q}, b;
    CHECK_OK(flx_features_decode(&in, feat, NULL, NULL));
    b = in, b.n_win = 40;
    CHECK_ST(flx_features_decode(&b, feat, NULL, NULL), FLX_ERR_INVALID);
    b = in, b.n_kv_heads = 3;
    CHECK_ST(flx_features_decode(&b, feat, NULL, NULL), FLX_ERR_INVALID);
    b = in, b.head_dim = 512;
    CHECK_ST(flx_features_decode(&b, feat, NULL, NULL), FLX_ERR_INVALID);
    b = in, b.stats = NULL;
    CHECK_ST(flx_features_decode(&b, feat, NULL, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_features_decode(&in, NULL, NULL, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_features_layer_from_session(NULL, 0, f.q, NULL, NULL, &b), FLX_ERR_INVALID);
    CHECK(flx_feature_name(-1) == NULL && flx_feature_name(FLX_FEAT_COUNT) == NULL);
    CHECK(!strcmp(flx_feature_name(FLX_F_L_CPU), "l_cpu") && !strcmp(flx_feature_name(FLX_F_LSE_CPU_Q), "lse_cpu_q"));
    for (int i = 0; i < FLX_FEAT_COUNT; i++)
        for (int j = 0; j < i; j++) CHECK(strcmp(flx_feature_name(i), flx_feature_name(j)));
    fkv_free(&f);
}

int main(void)
{
    check_invalid();
    const tcase_t cases[] = {
        {4, 2, 32, 16 + 32 + 400, 5, 16, 32, 1},    /* G = 2, D 32, generated tokens */
        {8, 2, 64, 16 + 32 + 260, 0, 16, 32, 2},    /* G = 4, D 64 */
        {6, 2, 32, 16 + 32 + 77, 3, 16, 32, 3},     /* G = 3, short host segment */
        {4, 1, 64, 40, 2, 16, 32, 4},               /* prompt shorter than sink + local: no host part */
        {2, 2, 32, 10, 1, 16, 32, 5},               /* prompt shorter than sink */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    printf("test_features: ok\n");
    return 0;
}
