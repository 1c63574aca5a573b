/*
 * test_attn_topk_merge - top-k exactness (ties -> lower index, NaN last, -0 = +0, k = 0 and k = n,
 * a sampled cut that misses; the indices in flx_topk's order) against the sorting reference, at
 * every ISA level this CPU has; LSE merge against a long-double formula, including -inf parts;
 * argument validation of the task (blk, budgets, NaN, G/D mismatch, l_cpu above plan, bad
 * selections).
 */
#include "attn_testutil.h"

static flx_rng_t rng;

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* flx_topk's rank of a score: NaN as -inf (the float compare makes -0 equal to +0). */
static float rank(float x)
{
    return x != x ? -INFINITY : x;
}

/* flx_topk against the sorting reference at the active ISA level: the same set, in its order. */
static void topk_cases(void)
{
    for (int it = 0; it < 400; it++) {
        /* small n (select on all keys), n >= 512 (the sampled cut), and a few long ones */
        uint32_t n = (uint32_t)flx_rng_below(&rng, it < 20 ? 4 : it % 10 == 9 ? 70000 : 3000) + 1;
        float *s = malloc(n * 4);
        uint32_t *idx = malloc(n * 4), *ref = malloc(n * 4);
        int mode = it % 5;
        for (uint32_t i = 0; i < n; i++) {
            if (mode == 0) s[i] = (float)flx_rng_normal(&rng);
            else if (mode == 1) s[i] = (float)flx_rng_below(&rng, 5);          /* heavy ties */
            else if (mode == 2) s[i] = 1.0f;                                    /* all equal */
            else if (mode == 3) s[i] = flx_rng_below(&rng, 10) == 0 ? NAN : (float)flx_rng_below(&rng, 50) - 25;
            else s[i] = flx_rng_below(&rng, 4) == 0 ? -0.0f : flx_rng_below(&rng, 3) == 0 ? -INFINITY : 0.0f;
        }
        /* the sample at stride n / 128 sees only the 128 top keys: with k above 128 the cut
         * misses and the select runs on all keys */
        const int miss = it % 23 == 5 && n >= 512;
        if (miss) {
            for (uint32_t i = 0; i < n; i++) s[i] = (float)(i % 7);
            for (uint32_t j = 0; j < 128; j++) s[(uint64_t)j * n / 128] = 100.0f;
        }
        uint32_t k = it % 7 == 0 ? 0 : it % 7 == 1 ? n : it % 7 == 2 ? (uint32_t)flx_rng_below(&rng, n / 20 + 1)
                                                                     : (uint32_t)flx_rng_below(&rng, n + 1);
        CHECK_OK(flx_topk(s, n, k, idx));
        CHECK_OK(flx_topk_ref(s, n, k, ref));
        /* the order flx_topk promises (and the GPU's top-k matches): the indices above the k-th
         * key, ascending, then those equal to it, ascending; k == n: all, ascending */
        qsort(ref, k, 4, cmp_u32);
        float tau = INFINITY;
        for (uint32_t i = 0; i < k; i++) tau = fminf(tau, rank(s[ref[i]]));
        uint32_t *want = malloc((k + 1) * 4), w = 0;
        for (uint32_t i = 0; i < k; i++)
            if (rank(s[ref[i]]) > tau || k == n) want[w++] = ref[i];
        for (uint32_t i = 0; i < k; i++)
            if (rank(s[ref[i]]) == tau && k < n) want[w++] = ref[i];
        CHECK(w == k);
        for (uint32_t i = 0; i < k; i++)
            if (idx[i] != want[i]) {
                fprintf(stderr, "topk n %u k %u mode %d (%s): position %u is %u, want %u (ref's set, two-part "
                        "order)\n", n, k, mode, flx_isa_name(flx_isa_active()), i, idx[i], want[i]);
                exit(1);
            }
        if (mode == 2 && !miss) /* all equal: exactly the first k indices */
            for (uint32_t i = 0; i < k; i++) CHECK(idx[i] == i);
        free(s);
        free(idx);
        free(ref);
        free(want);
    }
    /* a hand case: ties broken toward lower index, NaN ranks last */
    float s[6] = {3, NAN, 5, 3, 5, 3};
    uint32_t idx[6];
    CHECK_OK(flx_topk(s, 6, 3, idx));
    CHECK(idx[0] == 2 && idx[1] == 4 && idx[2] == 0);
    CHECK_OK(flx_topk(s, 6, 5, idx));
    CHECK(idx[0] == 2 && idx[1] == 4 && idx[2] == 0 && idx[3] == 3 && idx[4] == 5);
    CHECK_ST(flx_topk(s, 6, 7, idx), FLX_ERR_INVALID);
}

/* Every ISA level this CPU has (the AVX-512 passes and the scalar loops select the same sets). */
static void test_topk(void)
{
    const flx_isa_t best = flx_isa_best();
    for (int lvl = FLX_ISA_SCALAR; lvl <= (int)best; lvl++) {
        flx_isa_force((flx_isa_t)lvl);
        topk_cases();
    }
    flx_isa_force(best);
    fprintf(stderr, "topk: ok (scalar..%s)\n", flx_isa_name(best));
}

static void test_merge(void)
{
    const uint32_t G = 6, D = 32;
    float oa[6 * 32], ob[6 * 32], o[6 * 32], ref[6 * 32];
    float la[6] = {0.5f, -INFINITY, 3.0f, -INFINITY, 80.0f, -90.0f};
    float lb[6] = {1.5f, 2.0f, -INFINITY, -INFINITY, 75.0f, -88.0f};
    float lse[6], lref[6];
    for (uint32_t i = 0; i < G * D; i++) {
        oa[i] = (float)flx_rng_normal(&rng);
        ob[i] = (float)flx_rng_normal(&rng);
    }
    for (uint32_t h = 0; h < G; h++) {
        long double ea = isinf(la[h]) ? 0 : expl((long double)la[h]), eb = isinf(lb[h]) ? 0 : expl((long double)lb[h]);
        for (uint32_t d = 0; d < D; d++)
            ref[h * D + d] = ea + eb == 0 ? 0.0f : (float)((ea * oa[h * D + d] + eb * ob[h * D + d]) / (ea + eb));
        lref[h] = ea + eb == 0 ? -INFINITY : (float)logl(ea + eb);
    }
    flx_attn_merge(G, D, oa, la, ob, lb, o, lse);
    CHECK_CLOSE("merge o", o, ref, G * D, 1e-6, 1e-5);
    CHECK(lse_close("merge lse", lse, lref, G, 1e-6, 1e-6));
    /* in place, into b */
    flx_attn_merge(G, D, oa, la, ob, lb, ob, lb);
    CHECK_CLOSE("merge in place o", ob, ref, G * D, 1e-6, 1e-5);
    fprintf(stderr, "merge: ok\n");
}

static void test_validation(void)
{
    tkv_t t;
    tkv_make(&t, &rng, 64, 333, 20);
    flx_attn_shape_t shape = {.group = 4, .head_dim = 64, .max_l_cpu = 333, .pool = NULL};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&shape, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_ST(flx_attn_ws_init(&ws, &shape, mem, bytes - 100), FLX_ERR_INVALID);
    CHECK_OK(flx_attn_ws_init(&ws, &shape, mem, bytes));
    float q[4 * 64] = {0}, o[4 * 64], lse[4];
    float bud[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = 20, .budgets = bud};
    CHECK_ST(flx_attn_group_run(&ws, &t.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    fprintf(stderr, "  refusal: %s\n", flx_error_msg());
    cfg.blk = 64;
    bud[2] = 1.5f;
    CHECK_ST(flx_attn_group_run(&ws, &t.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    fprintf(stderr, "  refusal: %s\n", flx_error_msg());
    bud[2] = NAN;
    CHECK_ST(flx_attn_group_run(&ws, &t.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    bud[2] = -0.01f;
    CHECK_ST(flx_attn_host_run(&ws, &t.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    bud[2] = 0.3f;
    flx_attn_cfg_t fx = {.mode = FLX_ATTN_FIXED, .blk = 16, .budget = NAN};
    CHECK_ST(flx_attn_group_run(&ws, &t.view, q, &fx, o, lse, NULL), FLX_ERR_INVALID);
    flx_attn_cfg_t bad = {.mode = (flx_attn_mode_t)7, .blk = 16};
    CHECK_ST(flx_attn_group_run(&ws, &t.view, q, &bad, o, lse, NULL), FLX_ERR_INVALID);
    CHECK_OK(flx_attn_group_run(&ws, &t.view, q, &cfg, o, lse, NULL));
    /* D mismatch */
    tkv_t t2;
    tkv_make(&t2, &rng, 128, 100, 5);
    CHECK_ST(flx_attn_group_run(&ws, &t2.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    fprintf(stderr, "  refusal: %s\n", flx_error_msg());
    tkv_free(&t2);
    /* l_cpu above plan */
    tkv_make(&t2, &rng, 64, 400, 5);
    CHECK_ST(flx_attn_group_run(&ws, &t2.view, q, &cfg, o, lse, NULL), FLX_ERR_INVALID);
    fprintf(stderr, "  refusal: %s\n", flx_error_msg());
    tkv_free(&t2);
    /* bad selections */
    uint32_t sel[4 * 8] = {0}, k[4] = {1, 1, 1, 1};
    sel[0] = 999;
    CHECK_ST(flx_attn_sparse(&ws, &t.view, 2, q, sel, 8, k, o, lse), FLX_ERR_INVALID);
    CHECK_ST(flx_attn_sparse_ref(&t.view, 2, 4, q, sel, 8, k, o, lse), FLX_ERR_INVALID);
    sel[0] = 1;
    sel[1] = 1;
    k[0] = 2;
    CHECK_ST(flx_attn_sparse(&ws, &t.view, 2, q, sel, 8, k, o, lse), FLX_ERR_INVALID);
    fprintf(stderr, "  refusal: %s\n", flx_error_msg());
    k[0] = 7;
    CHECK_ST(flx_attn_sparse(&ws, &t.view, 2, q, sel, 8, k, o, lse), FLX_ERR_INVALID);
    /* plan refusals */
    flx_attn_shape_t bs = shape;
    bs.head_dim = 72;
    CHECK_ST(flx_attn_plan(&bs, &bytes), FLX_ERR_INVALID);
    bs = shape;
    bs.group = 0;
    CHECK_ST(flx_attn_plan(&bs, &bytes), FLX_ERR_INVALID);
    /* budget -> k */
    CHECK(flx_attn_budget_blocks(0.0f, 1000, 16) == 0);
    CHECK(flx_attn_budget_blocks(1.0f, 1000, 16) == 63);
    CHECK(flx_attn_budget_blocks(0.05f, 1000, 16) == 4);
    CHECK(flx_attn_budget_blocks(0.02f, 32768, 32) == 21);
    CHECK(flx_attn_budget_blocks(1.0f, 0, 128) == 0);
    /* whole products stay whole although the float is a little above the decimal (0.05f > 0.05) */
    CHECK(flx_attn_budget_blocks(0.05f, 3200, 16) == 10);
    CHECK(flx_attn_budget_blocks(0.1f, 1600, 16) == 10);
    CHECK(flx_attn_budget_blocks(0.3f, 1600, 16) == 30);
    CHECK(flx_attn_budget_blocks(0.05f, 3216, 16) == 11);   /* 10.05 blocks */
    CHECK(flx_attn_blk_level(64) == 2 && flx_attn_blk_level(8) == -1);
    free(mem);
    tkv_free(&t);
    fprintf(stderr, "validation: ok\n");
}

int main(void)
{
    flx_rng_seed(&rng, flx_test_seed("test_attn_topk_merge"));
    test_topk();
    test_merge();
    test_validation();
    return 0;
}
