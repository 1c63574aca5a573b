/*
 * test_attn_kernels - every fast attention kernel against its reference, the references against
 * dense brute-force softmax, at each dispatch level (scalar, AVX2, AVX-512 BF16 where present),
 * on a pool of 2 workers, GQA group sizes 1/4/7/8, head dims 64/128, host lengths that are not
 * multiples of any block size, budgets 0 and 1 (budget 1 the same bits as FULL). Determinism: every
 * kernel and task gives the same bits on pools of 1, 2, 3 and 7 workers and in the staged form with
 * its chunks run backwards; windows and host parts long enough for several chunks.
 * Label concurrency: TSan runs it.
 */
#include "attn_internal.h"   /* flx_attn_score_heads */
#include "attn_testutil.h"

#define O_ATOL 3e-5
#define O_RTOL 2e-4
#define L_ATOL 1e-4
#define L_RTOL 1e-5

static flx_rng_t rng;
static flx_pool_h g_pools[4];   /* FLX_TEST_WORKERS */

static void rand_q(float *q, size_t n)
{
    for (size_t i = 0; i < n; i++) q[i] = (float)flx_rng_normal(&rng) * 1.5f;
}

/* Sets fast selection of head h checked against reference scores: every selected score must be
 * >= every unselected one up to eps (fast scores carry ~1e-5 relative error). */
static void check_topk_valid(const float *ref_scores, uint32_t n, const uint32_t *sel, uint32_t k)
{
    uint8_t *in = calloc(n + 1, 1);
    float lo = INFINITY, hi = -INFINITY, amax = 0;
    for (uint32_t i = 0; i < k; i++) {
        CHECK(sel[i] < n && !in[sel[i]]);
        in[sel[i]] = 1;
        lo = ref_scores[sel[i]] < lo ? ref_scores[sel[i]] : lo;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!in[i]) hi = ref_scores[i] > hi ? ref_scores[i] : hi;
        amax = fabsf(ref_scores[i]) > amax ? fabsf(ref_scores[i]) : amax;
    }
    if (k && k < n && !(lo >= hi - 1e-4f * (amax + 1))) {
        fprintf(stderr, "top-k selection invalid: worst selected %g < best unselected %g\n", lo, hi);
        exit(1);
    }
    free(in);
}

/* Fast scores against the reference's: |got - ref| <= 1e-4 + 1e-5 |ref| + eps * mag, where mag is
 * the sum of the terms' sizes, sum_d |q_d| max(|min_d|, |max_d|). eps is 0 for the fp32 kernels; the
 * AVX-512 BF16 kernel multiplies by q split into bf16 hi + lo, which keeps q to 2^-16 of itself,
 * so a score whose terms cancel is off by up to 2^-16 of their sizes (the bound 1e-4 alone failed
 * on a score of -0.69 whose terms summed to about 300 in size: 1.5e-4 off). */
static int scores_close(const char *label, const float *got, const float *ref, const flx_kv_head_view_t *view, int lv,
                        uint32_t G, const float *q, double eps)
{
    const uint32_t n = view->meta_n[lv], D = view->head_dim;
    double *extra = malloc(((size_t)G * n + 1) * sizeof *extra);
    CHECK(extra);
    for (uint32_t h = 0; h < G; h++)
        for (uint32_t b = 0; b < n; b++) {
            const flx_bf16_t *m = view->meta[lv] + (size_t)b * 2 * D;
            double mag = 0;
            for (uint32_t d = 0; d < D; d++)
                mag += fabs(q[(size_t)h * D + d]) *
                       fmax(fabs(flx_bf16_to_f32(m[d])), fabs(flx_bf16_to_f32(m[D + d])));
            extra[(size_t)h * n + b] = eps * mag;
        }
    const int ok = flx_test_allclose_extra(label, got, ref, (size_t)G * n, 1e-4, 1e-5, extra);
    free(extra);
    return ok;
}

static void run_case(uint32_t D, uint32_t G, uint32_t l_cpu, uint32_t n_win)
{
    tkv_t t;
    tkv_make(&t, &rng, D, l_cpu, n_win);
    flx_attn_shape_t shape = {.group = G, .head_dim = D, .max_l_cpu = l_cpu + 40, .pool = g_pools[1]};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&shape, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_OK(flx_attn_ws_init(&ws, &shape, mem, bytes));
    size_t GD = (size_t)G * D;
    float *q = malloc(GD * 4), *o = malloc(GD * 4), *o_ref = malloc(GD * 4), *o_or = malloc(GD * 4);
    float lse[FLX_ATTN_MAX_GROUP], lse_ref[FLX_ATTN_MAX_GROUP], lse_or[FLX_ATTN_MAX_GROUP];
    uint32_t *tok = malloc(((size_t)l_cpu + 1) * 4);
    rand_q(q, GD);
    char lab[160];
    const char *isa = flx_isa_name(flx_isa_active());

    /* (1) window */
    CHECK_OK(flx_attn_window_ref(&t.view, G, q, o_ref, lse_ref));
    CHECK_OK(flx_attn_window(&ws, &t.view, q, o, lse));
    for (uint32_t h = 0; h < G; h++) oracle_attend(&t, q + h * D, NULL, 0, 1, o_or + h * D, lse_or + h);
    snprintf(lab, sizeof lab, "[%s D%u G%u L%u W%u] window ref vs oracle o", isa, D, G, l_cpu, n_win);
    CHECK_CLOSE(lab, o_ref, o_or, GD, 1e-6, 1e-5);
    CHECK(lse_close("window ref vs oracle lse", lse_ref, lse_or, G, 1e-6, 1e-6));
    snprintf(lab, sizeof lab, "[%s D%u G%u] window fast vs ref o", isa, D, G);
    CHECK_CLOSE(lab, o, o_ref, GD, O_ATOL, O_RTOL);
    CHECK(lse_close("window fast vs ref lse", lse, lse_ref, G, L_ATOL, L_RTOL));

    /* (1b) the window in segments (the features' sink / local / generated): each segment's
     * partial bitwise the window kernel on that segment alone, the whole within the kernel's
     * tolerance of the reference; refusals */
    {
        uint32_t rows[3];
        rows[0] = (uint32_t)flx_rng_below(&rng, (uint64_t)n_win + 1);
        rows[1] = (uint32_t)flx_rng_below(&rng, (uint64_t)(n_win - rows[0]) + 1);
        rows[2] = n_win - rows[0] - rows[1];
        float *os = malloc(3 * GD * 4 + 4), ls[3 * FLX_ATTN_MAX_GROUP], *o1 = malloc(GD * 4), l1[FLX_ATTN_MAX_GROUP];
        CHECK(os && o1);
        CHECK_OK(flx_attn_window_segments(&ws, &t.view, q, 3, rows, os, ls, o, lse));
        snprintf(lab, sizeof lab, "[%s D%u G%u] window segments %u+%u+%u vs ref o", isa, D, G, rows[0], rows[1],
                 rows[2]);
        CHECK_CLOSE(lab, o, o_ref, GD, O_ATOL, O_RTOL);
        CHECK(lse_close("window segments vs ref lse", lse, lse_ref, G, L_ATOL, L_RTOL));
        for (uint32_t sg = 0, r0 = 0; sg < 3; r0 += rows[sg++]) {
            flx_kv_head_view_t sv = t.view;
            sv.win_k += (size_t)r0 * D, sv.win_v += (size_t)r0 * D, sv.n_win = sv.win_cap = rows[sg];
            CHECK_OK(flx_attn_window(&ws, &sv, q, o1, l1));
            snprintf(lab, sizeof lab, "[%s D%u G%u] segment %u (%u rows) vs window on it", isa, D, G, sg, rows[sg]);
            CHECK_SAME(lab, os + (size_t)sg * GD, o1, GD);
            CHECK(memcmp(ls + sg * G, l1, G * sizeof(float)) == 0);
        }
        rows[2]++;   /* one row more than the window has */
        CHECK_ST(flx_attn_window_segments(&ws, &t.view, q, 3, rows, os, ls, o, lse), FLX_ERR_INVALID);
        rows[2]--;
        CHECK_ST(flx_attn_window_segments(&ws, &t.view, q, 0, rows, os, ls, o, lse), FLX_ERR_INVALID);
        CHECK_ST(flx_attn_window_segments(&ws, &t.view, q, FLX_ATTN_WIN_SEGMENTS + 1, rows, os, ls, o, lse),
                 FLX_ERR_INVALID);
        free(os), free(o1);
    }

    /* (2) scoring at every level */
    for (int lv = 0; lv < FLX_KV_META_LEVELS; lv++) {
        uint32_t n = t.view.meta_n[lv];
        float *s = malloc(((size_t)G * n + 1) * 4), *s_ref = malloc(((size_t)G * n + 1) * 4);
        CHECK_OK(flx_attn_score_ref(&t.view, lv, G, q, s_ref));
        CHECK_OK(flx_attn_score(&ws, &t.view, lv, q, s));
        /* reference vs direct bound on the raw K */
        for (uint32_t h = 0; h < G && n; h++) {
            uint32_t b = (uint32_t)flx_rng_below(&rng, n), blk = 16u << lv;
            double bound = 0;
            for (uint32_t d = 0; d < D; d++) {
                float mn = INFINITY, mx = -INFINITY;
                for (uint32_t i = b * blk; i < (b + 1) * blk && i < l_cpu; i++) {
                    mn = fminf(mn, t.k[(size_t)i * D + d]);
                    mx = fmaxf(mx, t.k[(size_t)i * D + d]);
                }
                bound += fmax((double)q[h * D + d] * mn, (double)q[h * D + d] * mx);
            }
            float bf = (float)bound;
            CHECK_CLOSE("score ref vs direct bound", &s_ref[(size_t)h * n + b], &bf, 1, 1e-5, 1e-6);
            /* the bound really bounds every token of the block */
            for (uint32_t i = b * blk; i < (b + 1) * blk && i < l_cpu; i++) {
                double dot = 0;
                for (uint32_t d = 0; d < D; d++) dot += (double)q[h * D + d] * t.k[(size_t)i * D + d];
                CHECK(dot <= bound + 1e-4);
            }
        }
        snprintf(lab, sizeof lab, "[%s D%u G%u L%u] score fast vs ref level %d", isa, D, G, l_cpu, lv);
        CHECK(scores_close(lab, s, s_ref, &t.view, lv, G, q, flx_isa_active() == FLX_ISA_AVX512BF16 ? 0x1p-15 : 0.0));
        /* a subset of the heads (what a task ranks when some heads read none or all of the blocks):
         * row i is heads[i]'s row of the full scoring, bit for bit; lists not ascending or out of
         * range refused */
        if (n) {
            uint8_t hs[FLX_ATTN_MAX_GROUP];
            uint32_t nh = 0;
            for (uint32_t h = 0; h < G; h++)
                if (G == 1 || flx_rng_below(&rng, 2)) hs[nh++] = (uint8_t)h;
            if (!nh) hs[nh++] = (uint8_t)(G - 1);
            CHECK_OK(flx_attn_score_heads(&ws, &t.view, lv, q, hs, nh, s_ref));
            for (uint32_t i = 0; i < nh; i++) {
                snprintf(lab, sizeof lab, "[%s D%u G%u] head %u's scores as row %u of %u, level %d", isa, D, G, hs[i],
                         i, nh, lv);
                CHECK_SAME(lab, s_ref + (size_t)i * n, s + (size_t)hs[i] * n, n);
            }
            CHECK_ST(flx_attn_score_heads(&ws, &t.view, lv, q, hs, 0, s_ref), FLX_ERR_INVALID);
            uint8_t bad[2] = {(uint8_t)G, 0};
            CHECK_ST(flx_attn_score_heads(&ws, &t.view, lv, q, bad, 1, s_ref), FLX_ERR_INVALID);
            if (G > 1) {
                bad[0] = 1, bad[1] = 0;
                CHECK_ST(flx_attn_score_heads(&ws, &t.view, lv, q, bad, 2, s_ref), FLX_ERR_INVALID);
            }
        }
        free(s);
        free(s_ref);
    }

    /* (4) sparse with per-head random selections (different k, overlapping) */
    for (int lv = 0; lv < FLX_KV_META_LEVELS; lv++) {
        uint32_t n = t.view.meta_n[lv], blk = 16u << lv;
        uint32_t *sel = malloc(((size_t)G * n + 1) * 4), k[FLX_ATTN_MAX_GROUP];
        for (uint32_t h = 0; h < G; h++) {
            uint32_t *sh = sel + (size_t)h * n;
            for (uint32_t i = 0; i < n; i++) sh[i] = i;
            for (uint32_t i = n; i > 1; i--) {
                uint32_t j = (uint32_t)flx_rng_below(&rng, i), x = sh[i - 1];
                sh[i - 1] = sh[j];
                sh[j] = x;
            }
            k[h] = h == 0 ? 0 : h == 1 ? n : (uint32_t)flx_rng_below(&rng, n + 1);
        }
        CHECK_OK(flx_attn_sparse_ref(&t.view, lv, G, q, sel, n, k, o_ref, lse_ref));
        CHECK_OK(flx_attn_sparse(&ws, &t.view, lv, q, sel, n, k, o, lse));
        for (uint32_t h = 0; h < G; h++) {
            size_t nt = blocks_to_tokens(&t, blk, sel + (size_t)h * n, k[h], tok);
            oracle_attend(&t, q + h * D, tok, nt, 0, o_or + h * D, lse_or + h);
        }
        snprintf(lab, sizeof lab, "[%s D%u G%u L%u] sparse ref vs oracle blk %u", isa, D, G, l_cpu, blk);
        CHECK_CLOSE(lab, o_ref, o_or, GD, 1e-6, 1e-5);
        CHECK(lse_close("sparse ref vs oracle lse", lse_ref, lse_or, G, 1e-6, 1e-6));
        snprintf(lab, sizeof lab, "[%s D%u G%u L%u] sparse fast vs ref blk %u", isa, D, G, l_cpu, blk);
        CHECK_CLOSE(lab, o, o_ref, GD, O_ATOL, O_RTOL);
        CHECK(lse_close("sparse fast vs ref lse", lse, lse_ref, G, L_ATOL, L_RTOL));
        free(sel);
    }

    /* (6) FULL task vs oracle over window + every host token */
    for (uint32_t i = 0; i < l_cpu; i++) tok[i] = i;
    flx_attn_cfg_t full = {.mode = FLX_ATTN_FULL};
    CHECK_OK(flx_attn_group_run(&ws, &t.view, q, &full, o, lse, NULL));
    for (uint32_t h = 0; h < G; h++) oracle_attend(&t, q + h * D, tok, l_cpu, 1, o_or + h * D, lse_or + h);
    snprintf(lab, sizeof lab, "[%s D%u G%u L%u] FULL task vs oracle", isa, D, G, l_cpu);
    CHECK_CLOSE(lab, o, o_or, GD, O_ATOL, O_RTOL);
    CHECK(lse_close("FULL lse", lse, lse_or, G, L_ATOL, L_RTOL));
    float *o_full = malloc(GD * 4), lse_full[FLX_ATTN_MAX_GROUP];
    memcpy(o_full, o, GD * 4);
    memcpy(lse_full, lse, G * 4);

    /* SPARSE task: random budgets incl. 0 and 1, each blk; checked against oracle over the task's own
     * selection, which must be a valid top-k of the reference scores */
    for (int lv = 0; lv < FLX_KV_META_LEVELS; lv++) {
        uint32_t blk = 16u << lv, n = t.view.meta_n[lv];
        float bud[FLX_ATTN_MAX_GROUP];
        for (uint32_t h = 0; h < G; h++)
            bud[h] = h == 0 && G > 1 ? 0.0f : h == 1 ? 1.0f : (float)flx_rng_uniform(&rng) * 0.3f;
        flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = blk, .budgets = bud};
        CHECK_OK(flx_attn_group_run(&ws, &t.view, q, &cfg, o, lse, NULL));
        float *s_ref = malloc(((size_t)G * n + 1) * 4);
        CHECK_OK(flx_attn_score_ref(&t.view, lv, G, q, s_ref));
        for (uint32_t h = 0; h < G; h++) {
            uint32_t kh = flx_attn_budget_blocks(bud[h], l_cpu, blk);
            CHECK(ws.k[h] == kh);
            const uint32_t *sh = ws.sel + (size_t)h * ws.n_max;
            check_topk_valid(s_ref + (size_t)h * n, n, sh, kh);
            size_t nt = blocks_to_tokens(&t, blk, sh, kh, tok);
            /* k blocks of blk tokens cover the budget; only the short last block may make it fall short */
            CHECK((double)kh * blk >= (double)bud[h] * l_cpu);
            if (kh) CHECK(nt >= (size_t)(kh - 1) * blk + (l_cpu - (n - 1) * blk));
            oracle_attend(&t, q + h * D, tok, nt, 1, o_or + h * D, lse_or + h);
        }
        snprintf(lab, sizeof lab, "[%s D%u G%u L%u] SPARSE task vs oracle blk %u", isa, D, G, l_cpu, blk);
        CHECK_CLOSE(lab, o, o_or, GD, O_ATOL, O_RTOL);
        CHECK(lse_close("SPARSE lse", lse, lse_or, G, L_ATOL, L_RTOL));
        free(s_ref);
    }

    /* budget 1 == FULL (the same blocks in the same chunks: the same bits at any blk), budget 0 ==
     * window alone (FIXED mode, all heads) */
    for (uint32_t blk = 16; blk <= 128; blk *= 2) {
        flx_attn_cfg_t one = {.mode = FLX_ATTN_FIXED, .blk = blk, .budget = 1.0f};
        CHECK_OK(flx_attn_group_run(&ws, &t.view, q, &one, o, lse, NULL));
        snprintf(lab, sizeof lab, "[%s D%u G%u blk %u] budget 1 vs FULL", isa, D, G, blk);
        CHECK_SAME(lab, o, o_full, GD);
        CHECK_SAME(lab, lse, lse_full, G);
    }
    flx_attn_cfg_t zero = {.mode = FLX_ATTN_FIXED, .blk = 128, .budget = 0.0f};
    CHECK_OK(flx_attn_group_run(&ws, &t.view, q, &zero, o, lse, NULL));
    CHECK_OK(flx_attn_window_ref(&t.view, G, q, o_ref, lse_ref));
    snprintf(lab, sizeof lab, "[%s D%u G%u] budget 0 vs window", isa, D, G);
    CHECK_CLOSE(lab, o, o_ref, GD, O_ATOL, O_RTOL);
    CHECK(lse_close("budget 0 lse", lse, lse_ref, G, L_ATOL, L_RTOL));

    free(o_full);
    free(q);
    free(o);
    free(o_ref);
    free(o_or);
    free(tok);
    free(mem);
    tkv_free(&t);
}

/* One configuration on a pool of FLX_TEST_WORKERS[wi] workers: window, sparse kernel, the group and
 * host tasks into out (4 G D + 4 G floats). */
static void run_all(const tkv_t *t, uint32_t G, const float *q, const flx_attn_cfg_t *cfg, flx_pool_h pool,
                    int staged_backwards, float *out)
{
    const uint32_t D = t->D;
    const size_t GD = (size_t)G * D;
    flx_attn_shape_t shape = {.group = G, .head_dim = D, .max_l_cpu = t->l_cpu, .pool = pool};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&shape, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_OK(flx_attn_ws_init(&ws, &shape, mem, bytes));
    float *o = out, *lse = out + 4 * GD;
    CHECK_OK(flx_attn_window(&ws, &t->view, q, o, lse));
    const int lv = cfg->mode == FLX_ATTN_FULL ? 0 : flx_attn_blk_level(cfg->blk);
    const uint32_t n = t->view.meta_n[lv];
    uint32_t *sel = malloc(((size_t)G * n + 1) * 4), k[FLX_ATTN_MAX_GROUP];
    for (uint32_t h = 0; h < G; h++) {   /* a fixed selection: every (h + 1)-th block */
        k[h] = 0;
        for (uint32_t b = h % 3; b < n; b += h % 5 + 1) sel[(size_t)h * n + k[h]++] = b;
    }
    CHECK_OK(flx_attn_sparse(&ws, &t->view, lv, q, sel, n, k, o + GD, lse + G));
    free(sel);
    for (int with_window = 1; with_window >= 0; with_window--) {
        float *og = o + (2 + !with_window) * GD, *lg = lse + (2 + !with_window) * G;
        if (!staged_backwards) {
            if (with_window) CHECK_OK(flx_attn_group_run(&ws, &t->view, q, cfg, og, lg, NULL));
            else CHECK_OK(flx_attn_host_run(&ws, &t->view, q, cfg, og, lg, NULL));
            continue;
        }
        uint32_t nc;
        CHECK_OK(flx_attn_task_begin(&ws, &t->view, q, cfg, with_window, &nc));
        for (uint32_t c = nc; c-- > 0;) CHECK_OK(flx_attn_task_chunk(&ws, c));
        CHECK_ST(flx_attn_task_chunk(&ws, nc), FLX_ERR_INVALID);
        CHECK_OK(flx_attn_task_end(&ws, og, lg, NULL));
    }
    free(mem);
}

static void check_determinism(uint32_t D, uint32_t G, uint32_t l_cpu, uint32_t n_win)
{
    tkv_t t;
    tkv_make(&t, &rng, D, l_cpu, n_win);
    const size_t GD = (size_t)G * D, N = 4 * GD + 4 * G;
    float *q = malloc(GD * 4), *ref = malloc(N * 4), *got = malloc(N * 4), bud[FLX_ATTN_MAX_GROUP];
    rand_q(q, GD);
    for (uint32_t h = 0; h < G; h++) bud[h] = (float)flx_rng_uniform(&rng) * 0.4f;
    const flx_attn_cfg_t cfgs[] = {{.mode = FLX_ATTN_FULL},
                                   {.mode = FLX_ATTN_FIXED, .blk = 16, .budget = 0.3f},
                                   {.mode = FLX_ATTN_SPARSE, .blk = 32, .budgets = bud},
                                   {.mode = FLX_ATTN_FIXED, .blk = 64, .budget = 1.0f}};
    for (size_t c = 0; c < FLX_ARRAY_SIZE(cfgs); c++) {
        run_all(&t, G, q, &cfgs[c], NULL, 0, ref);
        for (int wi = 0; wi < 5; wi++) {
            char lab[160];
            snprintf(lab, sizeof lab, "[%s D%u G%u L%u W%u] cfg %zu: %s", flx_isa_name(flx_isa_active()), D, G,
                     l_cpu, n_win, c, wi < 4 ? "pool" : "staged, chunks backwards");
            run_all(&t, G, q, &cfgs[c], wi < 4 ? g_pools[wi] : NULL, wi == 4, got);
            CHECK_SAME(lab, got, ref, N);
        }
    }
    fprintf(stderr, "[%s D%u G%u L%u W%u] same bits at 1, 2, 3, 7 workers and staged backwards\n",
            flx_isa_name(flx_isa_active()), D, G, l_cpu, n_win);
    free(q), free(ref), free(got);
    tkv_free(&t);
}

static uint32_t odd_len(uint32_t lo, uint32_t hi)
{
    uint32_t l;
    do l = lo + (uint32_t)flx_rng_below(&rng, hi - lo); while (l % 16 == 0);
    return l;
}

int main(void)
{
    flx_rng_seed(&rng, flx_test_seed("test_attn_kernels"));
    for (int i = 0; i < 4; i++) g_pools[i] = flx_test_pool(FLX_TEST_WORKERS[i]);
    const uint32_t Gs[] = {1, 4, 7, 8}, Ds[] = {64, 128};
    const flx_isa_t isas[] = {FLX_ISA_SCALAR, FLX_ISA_AVX2, FLX_ISA_AVX512, FLX_ISA_AVX512BF16, FLX_ISA_AMX};
    for (size_t ii = 0; ii < FLX_ARRAY_SIZE(isas); ii++) {
        flx_isa_t got = flx_isa_force(isas[ii]);
        if (got != isas[ii]) {
            fprintf(stderr, "level %s not available here (runs as %s): skipped\n", flx_isa_name(isas[ii]),
                    flx_isa_name(got));
            continue;
        }
        for (size_t di = 0; di < 2; di++)
            for (size_t gi = 0; gi < 4; gi++)
                run_case(Ds[di], Gs[gi], odd_len(200, 1500), 1 + (uint32_t)flx_rng_below(&rng, 90));
        /* empty parts: no host tokens; no window; both tiny */
        run_case(64, 4, 0, 37);
        run_case(128, 8, odd_len(17, 300), 0);
        run_case(64, 7, 5, 0);
        /* several window chunks (>= 256 rows each) and host chunks (>= 32 blocks each) */
        check_determinism(64, 3, odd_len(3000, 5000), 300 + (uint32_t)flx_rng_below(&rng, 400));
        check_determinism(128, 4, odd_len(600, 1100), 1);
    }
    flx_isa_force(flx_isa_best());
    for (int i = 0; i < 4; i++) flx_pool_destroy(g_pools[i]);
    fprintf(stderr, "test_attn_kernels: ok\n");
    return 0;
}
