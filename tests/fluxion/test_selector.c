/*
 * test_selector.c - Eq. 1 + Eq. 3 worked by hand for small GQA groups: blk choice, per-head
 * budgets, the clamp at both ends, streaming heads, all-streaming skip, ties, non-finite input.
 */
#include <string.h>

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
    CHECK_OK(flx_select_group(g1, 2, 1000, bud, &s));
    CHECK(!s.skip && s.blk == 32 && s.n_retrieval == 2);
    check_v(&s, (const double[4]){665.0, 662.5, 691.25, 735.625});
    CHECK(fabsf(s.v - 662.5f) < 1e-3f);
    CHECK(fabsf(bud[0] - 0.20f) < 1e-6f && fabsf(bud[1] - 0.10f) < 1e-6f);

    /* clamp: head 0 is below 0 at 16 and 32, head 1 above 1 everywhere; l_cpu 100 */
    flx_head_pred_t g2[2] = {{-0.5f, 0.1f, 0.0f}, {0.9f, 0.05f, 0.0f}};
    CHECK_OK(flx_select_group(g2, 2, 100, bud, &s));
    check_v(&s, (const double[4]){212.5, 206.25, 223.125, 241.5625});
    CHECK(s.blk == 32 && bud[0] == 0.0f && bud[1] == 1.0f);

    /* a streaming head (p >= 0.5, boundary included) reads nothing and adds nothing to V */
    flx_head_pred_t g3[3] = {{0.10f, 0.02f, 0.2f}, {0.9f, 0.1f, 0.7f}, {0.9f, 0.1f, 0.5f}};
    CHECK_OK(flx_select_group(g3, 3, 1000, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 1 && s.blk == 32);
    check_v(&s, (const double[4]){485.0, 462.5, 471.25, 495.625});
    CHECK(fabsf(bud[0] - 0.2f) < 1e-6f && bud[1] == 0.0f && bud[2] == 0.0f);

    /* all streaming: skipped, no host work */
    flx_head_pred_t g4[2] = {{0.3f, 0.02f, 0.9f}, {0.3f, 0.02f, 0.6f}};
    bud[0] = bud[1] = 7.0f;
    CHECK_OK(flx_select_group(g4, 2, 1000, bud, &s));
    CHECK(s.skip && s.blk == 0 && s.v == 0.0f && s.n_retrieval == 0 && bud[0] == 0.0f && bud[1] == 0.0f);

    /* tie between 16 and 32 (k = 1/32 makes V(16) = V(32) = 56 exactly at l_cpu 64): smaller wins */
    flx_head_pred_t g5[1] = {{0.25f, 0.03125f, 0.0f}};
    CHECK_OK(flx_select_group(g5, 1, 64, bud, &s));
    CHECK(s.v_blk[0] == 56.0f && s.v_blk[1] == 56.0f);
    CHECK(s.blk == 16 && bud[0] == 0.375f);

    /* MHA (G = 1), flat line: V falls with blk, 128 wins */
    flx_head_pred_t g6[1] = {{0.3f, 0.0f, 0.0f}};
    CHECK_OK(flx_select_group(g6, 1, 1000, bud, &s));
    CHECK(s.blk == 128 && fabsf(bud[0] - 0.3f) < 1e-6f);

    /* non-finite prediction: retrieval with budget 1 at every blk */
    flx_head_pred_t g7[3] = {{NAN, 0.0f, 0.0f}, {0.1f, 0.0f, NAN}, {0.1f, 0.0f, 0.9f}};
    CHECK_OK(flx_select_group(g7, 3, 100, bud, &s));
    CHECK(!s.skip && s.n_retrieval == 2 && s.blk == 128);
    check_v(&s, (const double[4]){12.5 + 400.0, 6.25 + 400.0, 3.125 + 400.0, 1.5625 + 400.0});
    CHECK(bud[0] == 1.0f && bud[1] == 1.0f && bud[2] == 0.0f);
    flx_head_pred_t g8[1] = {{0.1f, INFINITY, 0.0f}};
    CHECK_OK(flx_select_group(g8, 1, 100, bud, &s));
    CHECK(bud[0] == 1.0f);

    /* bad arguments */
    flx_head_pred_t many[65];
    memset(many, 0, sizeof many);
    CHECK_ST(flx_select_group(many, 0, 100, bud, &s), FLX_ERR_INVALID);
    CHECK_ST(flx_select_group(many, 65, 100, bud, &s), FLX_ERR_INVALID);
    CHECK_ST(flx_select_group(NULL, 1, 100, bud, &s), FLX_ERR_INVALID);
    CHECK_OK(flx_select_group(many, 64, 100, bud, &s));
    return 0;
}
