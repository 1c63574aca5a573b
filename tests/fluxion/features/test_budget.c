/* test_budget.c - least budgets and labels (flx/budget.h) against the runtime: at every returned
 * budget the sparse output of flx_attn_group_run (SPARSE mode) meets the criterion and at every
 * smaller block count it does not; blk = 1 against a brute-force exact top-k; the Eq. 1 fit; the
 * budget <-> blocks round trip; streaming heads; bad arguments. */
#include "../feat_testutil.h"
#include "flx/attn.h"
#include "flx/budget.h"

#define TOL 2e-4   /* fp32 runtime vs double labels */

typedef struct lay_set {
    flx_attn_layout_t lay[8];
    flx_kv_head_view_t views[8];
} lay_set_t;

static void build(lay_set_t *s, const fkv_t *f, uint32_t sink, uint32_t local)
{
    for (uint32_t g = 0; g < f->Hkv; g++) {
        fkv_row_t rc = {f, g};
        CHECK_OK(flx_attn_layout_build(&s->lay[g], f->L, f->D, sink, local, fkv_row, &rc));
        s->views[g] = s->lay[g].view;
    }
}

static void unbuild(lay_set_t *s, uint32_t Hkv)
{
    for (uint32_t g = 0; g < Hkv; g++) flx_attn_layout_free(&s->lay[g]);
}

/* Runtime error of head h (group member i) at k blocks of blk. */
static double rt_err(flx_attn_ws_t *ws, const flx_kv_head_view_t *v, const float *qg, uint32_t G, uint32_t i,
                     uint32_t blk, uint32_t k, flx_crit_t crit, const float *ofull, float lse_full, double norm)
{
    float bud[FLX_ATTN_MAX_GROUP], o[FLX_ATTN_MAX_GROUP * 256], lse[FLX_ATTN_MAX_GROUP];
    uint32_t D = v->head_dim;
    float b = k == 0 ? 0.0f : (float)(((double)k - 0.5) * blk / v->l_cpu);
    if (b > 1) b = 1;
    CHECK(flx_attn_budget_blocks(b, v->l_cpu, blk) == k);
    for (uint32_t j = 0; j < G; j++) bud[j] = b;
    flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = blk, .budgets = bud};
    CHECK_OK(flx_attn_group_run(ws, v, qg, &cfg, o, lse, NULL));
    if (crit == FLX_CRIT_SCORE) return 1.0 - exp((double)lse[i] - lse_full);
    double e = 0;
    for (uint32_t d = 0; d < D; d++) e += ((double)o[i * D + d] - ofull[d]) * ((double)o[i * D + d] - ofull[d]);
    return sqrt(e) / norm;
}

/* Double oracle for blk = 1: exact scores, order (score desc, index asc), least k. */
static uint32_t oracle_blk1(const fkv_t *f, const flx_kv_head_view_t *v, const float *q, flx_crit_t crit,
                            double tau, const double *ofull, double lse_full, double norm)
{
    uint32_t D = f->D, n = v->l_cpu, nw = v->n_win;
    double sc = 1.0 / sqrt((double)D);
    float *s = malloc((n + 1) * sizeof *s);
    uint32_t *ord = malloc((n + 1) * sizeof *ord), *used = calloc(n + 1, sizeof *used);
    double *lg = malloc((n + nw + 1) * sizeof *lg);
    CHECK(s && ord && used && lg);
    for (uint32_t t = 0; t < n; t++) {
        const flx_bf16_t *k = flx_kv_block_k(v, t / 16) + (size_t)(t % 16) * D;
        double x = 0;
        for (uint32_t d = 0; d < D; d++) x += (double)q[d] * flx_bf16_to_f32(k[d]);
        s[t] = (float)x;
        lg[t] = x * sc;
    }
    for (uint32_t r = 0; r < n; r++) {   /* selection sort: obviously right */
        int64_t b = -1;
        for (uint32_t t = 0; t < n; t++)
            if (!used[t] && (b < 0 || s[t] > s[b])) b = t;
        used[b] = 1;
        ord[r] = (uint32_t)b;
    }
    uint32_t ans = n;
    for (uint32_t k = 1; k <= n; k++) {   /* recompute from scratch: slow and plain */
        double m = -INFINITY, l = 0, o[256] = {0};
        for (uint32_t pass = 0; pass < 2; pass++)
            for (uint32_t i = 0; i < nw + k; i++) {
                double x;
                const flx_bf16_t *vv;
                if (i < nw) {
                    x = 0;
                    for (uint32_t d = 0; d < D; d++) x += (double)q[d] * flx_bf16_to_f32(v->win_k[(size_t)i * D + d]);
                    x *= sc;
                    vv = v->win_v + (size_t)i * D;
                } else {
                    uint32_t t = ord[i - nw];
                    x = lg[t];
                    vv = flx_kv_block_v(v, t / 16) + (size_t)(t % 16) * D;
                }
                if (pass == 0) m = x > m ? x : m;
                else {
                    double w = exp(x - m);
                    l += w;
                    for (uint32_t d = 0; d < D; d++) o[d] += w * flx_bf16_to_f32(vv[d]);
                }
            }
        double err;
        if (crit == FLX_CRIT_SCORE) err = 1.0 - exp(m + log(l) - lse_full);
        else {
            double e = 0;
            for (uint32_t d = 0; d < D; d++) e += (o[d] / l - ofull[d]) * (o[d] / l - ofull[d]);
            err = sqrt(e) / norm;
        }
        if (err <= tau) {
            ans = k;
            break;
        }
    }
    free(s), free(ord), free(used), free(lg);
    return ans;
}

static void check_case(uint64_t seed, uint32_t Hq, uint32_t Hkv, uint32_t D, uint32_t L, float peak)
{
    flx_rng_t r;
    flx_rng_seed(&r, seed);
    fkv_t f;
    fkv_make(&f, &r, Hq, Hkv, D, L, 0, peak);
    lay_set_t ls;
    build(&ls, &f, 16, 32);
    const flx_kv_head_view_t *views = ls.views;
    uint32_t G = Hq / Hkv, l_cpu = views[0].l_cpu;
    float *ofull = malloc((size_t)Hq * D * sizeof(float)), onorm[64], lse_full[64];
    CHECK(ofull);
    CHECK_OK(flx_full_output(views, Hq, Hkv, f.q, ofull, onorm));
    flx_attn_shape_t shape = {.group = G, .head_dim = D, .max_l_cpu = l_cpu, .pool = NULL};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&shape, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_OK(flx_attn_ws_init(&ws, &shape, mem, bytes));
    /* full output and lse from the runtime (FULL mode) agree with flx_full_output */
    for (uint32_t g = 0; g < Hkv; g++) {
        float o[64 * 256];
        flx_attn_cfg_t cfg = {.mode = FLX_ATTN_FULL};
        CHECK_OK(flx_attn_group_run(&ws, &views[g], f.q + (size_t)g * G * D, &cfg, o, lse_full + g * G, NULL));
        CHECK_CLOSE("full output vs runtime FULL", o, ofull + (size_t)g * G * D, (size_t)G * D, 1e-4, 1e-3);
    }
    double maxn = 0;
    for (uint32_t h = 0; h < Hq; h++) maxn = onorm[h] > maxn ? onorm[h] : maxn;

    const flx_crit_t crits[3] = {FLX_CRIT_FLUXION, FLX_CRIT_OUTPUT, FLX_CRIT_SCORE};
    const float taus[3] = {0.1f, 0.1f, 0.05f};
    flx_head_label_t lab[64];
    int nonstream = 0;
    for (int c = 0; c < 3; c++) {
        flx_label_layer_in_t in = {.n_q_heads = Hq, .n_kv_heads = Hkv, .views = views, .q = f.q, .crit = crits[c],
                                   .tau = taus[c], .pool = NULL};
        CHECK_OK(flx_label_layer(&in, lab));
        for (int wi = 0; wi < 4; wi++) {   /* the same labels on pools of 1, 2, 3 and 7 workers */
            flx_head_label_t lab_w[64];
            in.pool = flx_test_pool(FLX_TEST_WORKERS[wi]);
            CHECK_OK(flx_label_layer(&in, lab_w));
            CHECK(memcmp(lab_w, lab, Hq * sizeof *lab) == 0);
            flx_pool_destroy(in.pool);
            in.pool = NULL;
        }
        for (uint32_t h = 0; h < Hq; h++) {
            const float *qg = f.q + (size_t)(h / G) * G * D;
            double norm = crits[c] == FLX_CRIT_FLUXION ? maxn : onorm[h];
            const float *of = ofull + (size_t)h * D;
            double e0 = rt_err(&ws, &views[h / G], qg, G, h % G, 16, 0, crits[c], of, lse_full[h], norm);
            CHECK(fabs(e0 - lab[h].err_window) <= TOL);
            CHECK(lab[h].streaming == (lab[h].err_window <= taus[c]));
            if (lab[h].streaming) {
                for (int j = 0; j < FLX_LABEL_N_BLK; j++) CHECK(lab[h].bgt[j] == 0.0f);
                CHECK(lab[h].bgt0 == 0.0f && lab[h].k == 0.0f);
                continue;
            }
            nonstream++;
            for (int j = 1; j < FLX_LABEL_N_BLK; j++) {
                uint32_t blk = FLX_LABEL_BLKS[j], k = flx_attn_budget_blocks(lab[h].bgt[j], l_cpu, blk);
                CHECK(k >= 1 && fabsf(lab[h].bgt[j] - flx_label_budget(k, l_cpu, blk)) == 0.0f);
                double ek = rt_err(&ws, &views[h / G], qg, G, h % G, blk, k, crits[c], of, lse_full[h], norm);
                if (!(ek <= taus[c] + TOL)) {
                    fprintf(stderr, "crit %s head %u blk %u: k %u err %g > tau\n", flx_crit_name(crits[c]), h, blk,
                            k, ek);
                    exit(1);
                }
                for (uint32_t kk = 0; kk < k; kk++) {
                    double e = rt_err(&ws, &views[h / G], qg, G, h % G, blk, kk, crits[c], of, lse_full[h], norm);
                    if (!(e > taus[c] - TOL)) {
                        fprintf(stderr, "crit %s head %u blk %u: k %u not least (%u gives %g)\n",
                                flx_crit_name(crits[c]), h, blk, k, kk, e);
                        exit(1);
                    }
                }
            }
            double ofd[256];
            for (uint32_t d = 0; d < D; d++) ofd[d] = of[d];
            uint32_t k1 = oracle_blk1(&f, &views[h / G], f.q + (size_t)h * D, crits[c], taus[c], ofd, lse_full[h], norm);
            CHECK(flx_attn_budget_blocks(lab[h].bgt[0], l_cpu, 1) == k1);
            float b0, kk;
            flx_label_fit(lab[h].bgt, &b0, &kk);
            CHECK(b0 == lab[h].bgt0 && kk == lab[h].k && lab[h].bgt0 == lab[h].bgt[0]);
        }
    }
    CHECK(nonstream > 0);
    /* a subset of granularities: only those set, no fit */
    const uint32_t only[2] = {64, 16};
    flx_head_label_t sub[64];
    flx_label_layer_in_t in = {.n_q_heads = Hq, .n_kv_heads = Hkv, .views = views, .q = f.q,
                               .crit = FLX_CRIT_FLUXION, .tau = 0.1f, .n_blk = 2, .blks = only};
    CHECK_OK(flx_label_layer(&in, sub));
    in.blks = NULL;
    CHECK_OK(flx_label_layer(&in, lab));
    for (uint32_t h = 0; h < Hq; h++) {
        CHECK(sub[h].bgt[1] == lab[h].bgt[1] && sub[h].bgt[3] == lab[h].bgt[3]);
        CHECK(sub[h].bgt[0] == 0 && sub[h].bgt[2] == 0 && sub[h].bgt[4] == 0 && sub[h].bgt0 == 0 && sub[h].k == 0);
    }
    free(mem);
    free(ofull);
    unbuild(&ls, Hkv);
    fkv_free(&f);
}

/* Host keys opposite to every query: the window alone holds the mass, every head streams. */
static void check_streaming(void)
{
    flx_rng_t r;
    flx_rng_seed(&r, 99);
    fkv_t f;
    fkv_make(&f, &r, 2, 1, 32, 400, 0, 0.0f);
    for (uint32_t d = 0; d < 32; d++) f.q[32 + d] = f.q[d];
    for (uint32_t i = 16; i < 400 - 32; i++)
        for (uint32_t d = 0; d < 32; d++) f.k[(size_t)i * 32 + d] = flx_f32_to_bf16(-3.0f * f.q[d]);
    lay_set_t ls;
    build(&ls, &f, 16, 32);
    flx_head_label_t lab[2];
    for (int c = 0; c < 3; c++) {
        flx_label_layer_in_t in = {.n_q_heads = 2, .n_kv_heads = 1, .views = ls.views, .q = f.q, .crit = (flx_crit_t)c,
                                   .tau = 0.05f};
        CHECK_OK(flx_label_layer(&in, lab));
        for (int h = 0; h < 2; h++) {
            CHECK(lab[h].streaming == 1 && lab[h].err_window < 1e-6f);
            for (int j = 0; j < FLX_LABEL_N_BLK; j++) CHECK(lab[h].bgt[j] == 0.0f);
        }
    }
    unbuild(&ls, 1);
    fkv_free(&f);
}

static void check_fit_and_roundtrip(void)
{
    float b0, k;
    const float lin[5] = {0.1f, 0.1f + 4 * 0.03f, 0.1f + 5 * 0.03f, 0.1f + 6 * 0.03f, 0.1f + 7 * 0.03f};
    flx_label_fit(lin, &b0, &k);
    CHECK(b0 == 0.1f && fabsf(k - 0.03f) < 1e-6f);
    const float hand[5] = {0.2f, 0.3f, 0.3f, 0.5f, 0.6f};   /* sum x(b - b0) = 5.5, sum x^2 = 126 */
    flx_label_fit(hand, &b0, &k);
    CHECK(b0 == 0.2f && fabs(k - 5.5 / 126) < 1e-6);
    const float flat[5] = {0.4f, 0.4f, 0.4f, 0.4f, 0.4f};
    flx_label_fit(flat, &b0, &k);
    CHECK(k == 0.0f);
    flx_rng_t r;
    flx_rng_seed(&r, 5);
    uint64_t n = 0;
    for (int it = 0; it < 20000; it++) {
        uint32_t blk = FLX_LABEL_BLKS[flx_rng_below(&r, 5)];
        uint32_t l_cpu = 1 + (uint32_t)flx_rng_below(&r, it % 2 ? 200000 : 3000), nb = (l_cpu + blk - 1) / blk;
        uint32_t kb = (uint32_t)flx_rng_below(&r, nb + 1);
        float b = flx_label_budget(kb, l_cpu, blk);
        CHECK(b >= 0.0f && b <= 1.0f);
        CHECK(fabs(b - fmin(1.0, (double)kb * blk / l_cpu)) <= 1e-6);
        if (flx_attn_budget_blocks(b, l_cpu, blk) != kb) {
            fprintf(stderr, "round trip: k %u blk %u l_cpu %u -> %.9g -> %u\n", kb, blk, l_cpu, (double)b,
                    flx_attn_budget_blocks(b, l_cpu, blk));
            exit(1);
        }
        n++;
    }
    CHECK(flx_label_budget(0, 100, 16) == 0.0f && flx_label_budget(7, 100, 16) == 1.0f);
    CHECK(!strcmp(flx_crit_name(FLX_CRIT_FLUXION), "fluxion") && !strcmp(flx_crit_name(FLX_CRIT_OUTPUT), "output") &&
          !strcmp(flx_crit_name(FLX_CRIT_SCORE), "score") && flx_crit_name((flx_crit_t)9) == NULL);
}

static void check_invalid(void)
{
    flx_rng_t r;
    flx_rng_seed(&r, 3);
    fkv_t f;
    fkv_make(&f, &r, 4, 2, 32, 200, 0, 2.0f);
    lay_set_t ls;
    build(&ls, &f, 16, 32);
    flx_head_label_t lab[4];
    float o[4 * 32], on[4];
    flx_label_layer_in_t ok = {.n_q_heads = 4, .n_kv_heads = 2, .views = ls.views, .q = f.q, .tau = 0.1f}, in;
    CHECK_OK(flx_label_layer(&ok, lab));
    CHECK_ST(flx_label_layer(NULL, lab), FLX_ERR_INVALID);
    CHECK_ST(flx_label_layer(&ok, NULL), FLX_ERR_INVALID);
    in = ok, in.tau = 0.0f;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    in = ok, in.tau = 1.0f;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    in = ok, in.tau = NAN;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    in = ok, in.n_q_heads = 3;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    in = ok, in.crit = (flx_crit_t)5;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    const uint32_t bad1[1] = {8}, bad2[2] = {16, 16};
    in = ok, in.blks = bad1, in.n_blk = 1;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "blk 8"));
    in = ok, in.blks = bad2, in.n_blk = 2;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    in = ok, in.blks = bad2, in.n_blk = 0;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    flx_kv_head_view_t vv[2] = {ls.views[0], ls.views[1]};
    vv[1].l_cpu--;
    in = ok, in.views = vv;
    CHECK_ST(flx_label_layer(&in, lab), FLX_ERR_INVALID);
    CHECK_ST(flx_full_output(vv, 4, 2, f.q, o, on), FLX_ERR_INVALID);
    CHECK_ST(flx_full_output(ls.views, 4, 2, NULL, o, on), FLX_ERR_INVALID);
    CHECK_ST(flx_full_output(ls.views, 4, 2, f.q, o, NULL), FLX_ERR_INVALID);
    unbuild(&ls, 2);
    fkv_free(&f);
}

int main(void)
{
    check_fit_and_roundtrip();
    check_invalid();
    check_streaming();
    check_case(1, 4, 2, 32, 16 + 32 + 700, 3.0f);   /* G = 2, short last block at every level */
    check_case(2, 6, 2, 64, 16 + 32 + 517, 4.0f);   /* G = 3 */
    check_case(3, 4, 1, 32, 16 + 32 + 300, 1.5f);   /* G = 4, flatter attention */
    printf("test_budget: ok\n");
    return 0;
}
