/*
 * test_selector.c - Eq. 1 + Eq. 3 worked by hand for small GQA groups: blk choice, per-head
 * budgets, the clamp at both ends, streaming heads, all-streaming skip, ties, non-finite input.
 */
#include <string.h>

#include "flx/attn.h"
#include "flx/selector.h"
#include "flx_test.h"

static void check_v(const flx_selection_t *s, const double want[4])
{
    float w[4] = {(float)want[0], (float)want[1], (float)want[2], (float)want[3]};
    CHECK_CLOSE("v_blk", s->v_blk, w, 4, 1e-4, 1e-5);
}

int main(void)
{
    float bud[64];
    flx_selection_t s;

    /* two retrieval heads, l_cpu 1000: sums .27 .30 .33 .36 -> V 665, 662.5, 691.25, 735.625 */
    flx_head_pred_t g1[2] = {{0.10f, 0.02f, 0.1f}, {0.05f, 0.01f, 0.4f}};
    CHECK_OK(flx_select_group(g1, 2, 1000, NULL, bud, &s));
    CHECK(!s.skip && s.blk == 32 && s.n_retrieval == 2);
    check_v(&s, (const double[4]){665.0, 662.5, 691.25, 735.625});
    CHECK(fabsf(s.v - 662.5f) < 1e-3f);
    CHECK(fabsf(bud[0] - 0.20f) < 1e-6f && fabsf(bud[1] - 0.10f) < 1e-6f);

    /* clamp: head 0 is below 0 at 16 and 32, head 1 above 1 everywhere; l_cpu 100 */
    flx_head_pred_t g2[2] = {{-0.5f, 0.1f, 0.0f}, {0.9f, 0.05f, 0.0f}};
    CHECK_OK(flx_select_group(g2, 2, 100, NULL, bud, &s));
    check_v(&s, (const double[4]){212.5, 206.25, 223.125, 241.5625});
    CHECK(s.blk == 32 && bud[0] == 0.0f && bud[1] == 1.0f);

    /* a streaming head (p >= 0.5, boundary included) reads nothing and adds nothing to V */
    flx_head_pred_t g3[3] = {{0.10f, 0.02f, 0.2f}, {0.9f, 0.1f, 0.7f}, {0.9f, 0.1f, 0.5f}};
    CHECK_OK(flx_select_group(g3, 3, 1000, NULL, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 1 && s.blk == 32);
    check_v(&s, (const double[4]){485.0, 462.5, 471.25, 495.625});
    CHECK(fabsf(bud[0] - 0.2f) < 1e-6f && bud[1] == 0.0f && bud[2] == 0.0f);

    /* all streaming: skipped, no host work */
    flx_head_pred_t g4[2] = {{0.3f, 0.02f, 0.9f}, {0.3f, 0.02f, 0.6f}};
    bud[0] = bud[1] = 7.0f;
    CHECK_OK(flx_select_group(g4, 2, 1000, NULL, bud, &s));
    CHECK(s.skip && s.blk == 0 && s.v == 0.0f && s.n_retrieval == 0 && bud[0] == 0.0f && bud[1] == 0.0f);

    /* tie between 16 and 32 (k = 1/32 makes V(16) = V(32) = 56 exactly at l_cpu 64): smaller wins */
    flx_head_pred_t g5[1] = {{0.25f, 0.03125f, 0.0f}};
    CHECK_OK(flx_select_group(g5, 1, 64, NULL, bud, &s));
    CHECK(s.v_blk[0] == 56.0f && s.v_blk[1] == 56.0f);
    CHECK(s.blk == 16 && bud[0] == 0.375f);

    /* the same tie where V(16) rounds up to the float above V(32)'s: decided in double, 16 wins */
    flx_head_pred_t g5b[1] = {{0.00199f, 0.03125f, 0.0f}};
    CHECK_OK(flx_select_group(g5b, 1, 178250, NULL, bud, &s));
    CHECK(s.blk == 16);

    /* MHA (G = 1), flat line: V falls with blk, 128 wins */
    flx_head_pred_t g6[1] = {{0.3f, 0.0f, 0.0f}};
    CHECK_OK(flx_select_group(g6, 1, 1000, NULL, bud, &s));
    CHECK(s.blk == 128 && fabsf(bud[0] - 0.3f) < 1e-6f);

    /* non-finite prediction: retrieval with budget 1 at every blk */
    flx_head_pred_t g7[3] = {{NAN, 0.0f, 0.0f}, {0.1f, 0.0f, NAN}, {0.1f, 0.0f, 0.9f}};
    CHECK_OK(flx_select_group(g7, 3, 100, NULL, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 2 && s.blk == 128);
    check_v(&s, (const double[4]){12.5 + 400.0, 6.25 + 400.0, 3.125 + 400.0, 1.5625 + 400.0});
    CHECK(bud[0] == 1.0f && bud[1] == 1.0f && bud[2] == 0.0f);
    flx_head_pred_t g8[1] = {{0.1f, INFINITY, 0.0f}};
    CHECK_OK(flx_select_group(g8, 1, 100, NULL, bud, &s));
    CHECK(bud[0] == 1.0f);

    /* operating point: the paper's rule is the NULL default */
    flx_select_params_t sp = flx_select_params_paper();
    CHECK(sp.stream_threshold == 0.5f && sp.budget_scale == 1.0f && sp.min_blocks == 0);
    CHECK_OK(flx_select_group(g1, 2, 1000, &sp, bud, &s));
    CHECK(s.blk == 32 && fabsf(bud[0] - 0.20f) < 1e-6f && fabsf(bud[1] - 0.10f) < 1e-6f);

    /* stream_threshold 0.8: g3's head 1 (p 0.7) and head 2 (p 0.5) become retrieval; head 2 joins at
     * 0.9 + 0.1 log2(blk) = 1 (clamped) everywhere, head 1 likewise: sums 2.18 2.20 2.22 2.24 at
     * l_cpu 1000 -> V 4485, 4462.5, 4471.25, 4495.625 */
    sp.stream_threshold = 0.8f;
    CHECK_OK(flx_select_group(g3, 3, 1000, &sp, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 3 && s.blk == 32);
    check_v(&s, (const double[4]){4485.0, 4462.5, 4471.25, 4495.625});
    CHECK(bud[1] == 1.0f && bud[2] == 1.0f);
    /* and g4 (p 0.9, 0.6) is no longer skipped: head 1 reads 0.3 + 0.02 log2(blk) */
    CHECK_OK(flx_select_group(g4, 2, 1000, &sp, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 1 && bud[0] == 0.0f && bud[1] > 0.3f);
    sp.stream_threshold = 1.0f;   /* nothing is streaming, not even p = 1 is excluded below 1 */
    flx_head_pred_t g9[1] = {{0.1f, 0.0f, 0.999f}};
    CHECK_OK(flx_select_group(g9, 1, 1000, &sp, bud, &s));
    CHECK(!s.skip && fabsf(bud[0] - 0.1f) < 1e-6f);

    /* budget_scale 2 doubles the line before the clamp: g1 -> sums .54 .60 .66 .72 at l_cpu 1000,
     * V = 2 l / blk + 2 l sum = 125 + 1080 at 16 (the least), 62.5 + 1200 at 32, ... */
    sp = flx_select_params_paper();
    sp.budget_scale = 2.0f;
    CHECK_OK(flx_select_group(g1, 2, 1000, &sp, bud, &s));
    check_v(&s, (const double[4]){1205.0, 1262.5, 1351.25, 1455.625});
    CHECK(s.blk == 16 && fabsf(bud[0] - 0.36f) < 1e-6f && fabsf(bud[1] - 0.18f) < 1e-6f);
    /* the clamp still caps at 1 */
    flx_head_pred_t g10[1] = {{0.6f, 0.0f, 0.0f}};
    CHECK_OK(flx_select_group(g10, 1, 1000, &sp, bud, &s));
    CHECK(bud[0] == 1.0f);
    /* budget_scale 0.5 halves it, and the cheaper reads move blk*: sums .135 .15 .165 .18,
     * V = 125 + 270, 62.5 + 300, 31.25 + 330 (the least, blk 64), 15.625 + 360 */
    sp.budget_scale = 0.5f;
    CHECK_OK(flx_select_group(g1, 2, 1000, &sp, bud, &s));
    check_v(&s, (const double[4]){395.0, 362.5, 361.25, 375.625});
    CHECK(s.blk == 64 && fabsf(bud[0] - 0.11f) < 1e-6f && fabsf(bud[1] - 0.055f) < 1e-6f);

    /* min_blocks 2: a retrieval head whose line is below 0 still reads exactly 2 blocks of blk*;
     * V = 2 l / blk + 2 (2 blk - 1/2) at l_cpu 10000: 1313, 752, 567.5, 667.25 -> blk 64 */
    sp = flx_select_params_paper();
    sp.min_blocks = 2;
    flx_head_pred_t g11[1] = {{-0.2f, 0.01f, 0.1f}};
    CHECK_OK(flx_select_group(g11, 1, 10000, &sp, bud, &s));
    check_v(&s, (const double[4]){1313.0, 752.0, 567.5, 667.25});
    CHECK(s.blk == 64 && flx_attn_budget_blocks(bud[0], 10000, 64) == 2);
    /* a line above the floor is kept */
    flx_head_pred_t g12[1] = {{0.1f, 0.0f, 0.1f}};
    CHECK_OK(flx_select_group(g12, 1, 10000, &sp, bud, &s));
    CHECK(fabsf(bud[0] - 0.1f) < 1e-6f);
    /* streaming heads get no floor */
    flx_head_pred_t g13[2] = {{0.1f, 0.0f, 0.1f}, {-0.2f, 0.0f, 0.9f}};
    CHECK_OK(flx_select_group(g13, 2, 10000, &sp, bud, &s));
    CHECK(bud[1] == 0.0f);
    /* the floor covers every granularity exactly: at l_cpu 1000 and each blk, 3 blocks */
    sp.min_blocks = 3;
    for (uint32_t blk = 16; blk <= 128; blk *= 2) {
        float b = (float)(((double)3 * blk - 0.5) / 1000);
        CHECK(flx_attn_budget_blocks(b, 1000, blk) == 3);
    }

    /* range checks name the field */
    flx_select_params_t bad = flx_select_params_paper();
    bad.stream_threshold = 0.4f;
    CHECK_ST(flx_select_params_check(&bad), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "stream_threshold") != NULL);
    bad.stream_threshold = NAN;
    CHECK_ST(flx_select_params_check(&bad), FLX_ERR_INVALID);
    bad = flx_select_params_paper();
    bad.budget_scale = 0.0f;
    CHECK_ST(flx_select_params_check(&bad), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "budget_scale") != NULL);
    bad.budget_scale = 64.5f;
    CHECK_ST(flx_select_params_check(&bad), FLX_ERR_INVALID);
    bad.budget_scale = 0.5f;   /* below 1 is a point too: it reads less than the line says */
    CHECK_OK(flx_select_params_check(&bad));
    bad = flx_select_params_paper();
    bad.min_blocks = 65;
    CHECK_ST(flx_select_params_check(&bad), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "min_blocks") != NULL);
    CHECK_ST(flx_select_params_check(NULL), FLX_ERR_INVALID);
    sp = flx_select_params_paper();
    CHECK_OK(flx_select_params_check(&sp));

    /* bad arguments */
    flx_head_pred_t many[65];
    memset(many, 0, sizeof many);
    CHECK_ST(flx_select_group(many, 0, 100, NULL, bud, &s), FLX_ERR_INVALID);
    CHECK_ST(flx_select_group(many, 65, 100, NULL, bud, &s), FLX_ERR_INVALID);
    CHECK_ST(flx_select_group(NULL, 1, 100, NULL, bud, &s), FLX_ERR_INVALID);
    CHECK_OK(flx_select_group(many, 64, 100, NULL, bud, &s));

    /* ablations: without streaming skipping the streaming heads get their lines (g3: 0.9 + 0.1 log2 blk
     * clamps to 1) and add to V; with a fixed blk that blk and its budgets */
    flx_select_opts_t keep = {1, 0}, fix64 = {0, 64};
    CHECK_OK(flx_select_group_opts(g3, 3, 1000, NULL, &keep, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 3 && s.blk == 32 && bud[1] == 1.0f && bud[2] == 1.0f);
    check_v(&s, (const double[4]){4485.0, 4462.5, 4471.25, 4495.625});
    CHECK_OK(flx_select_group_opts(g4, 2, 1000, NULL, &keep, bud, &s));   /* all streaming, kept */
    CHECK(!s.skip && s.n_retrieval == 2 && bud[0] > 0.3f && bud[1] > 0.3f);
    CHECK_OK(flx_select_group_opts(g1, 2, 1000, NULL, &fix64, bud, &s));
    CHECK(!s.skip && s.blk == 64 && fabsf(s.v - 691.25f) < 1e-3f);
    CHECK(fabsf(bud[0] - 0.22f) < 1e-6f && fabsf(bud[1] - 0.11f) < 1e-6f);
    CHECK_OK(flx_select_group_opts(g4, 2, 1000, NULL, &fix64, bud, &s));   /* skipping still applies */
    CHECK(s.skip);
    flx_select_opts_t bad_opts = {0, 48};
    CHECK_ST(flx_select_group_opts(g1, 2, 1000, NULL, &bad_opts, bud, &s), FLX_ERR_INVALID);
    bad_opts.fixed_blk = 0, bad_opts.keep_streaming = 2;
    CHECK_ST(flx_select_group_opts(g1, 2, 1000, NULL, &bad_opts, bud, &s), FLX_ERR_INVALID);
    return 0;
}
