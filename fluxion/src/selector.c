/*
 * selector.c - Eq. 1 + Eq. 3 for one GQA group, and the paper's two ablations of it (flx/selector.h).
 */
#include "flx/selector.h"

#include <math.h>
#include <string.h>

static const uint32_t SEL_BLKS[4] = {16, 32, 64, 128};

static float clamp01(float x)
{
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

flx_select_params_t flx_select_params_paper(void)
{
    flx_select_params_t sp = {.stream_threshold = 0.5f, .budget_scale = 1.0f, .min_blocks = 0};
    return sp;
}

flx_status_t flx_select_params_check(const flx_select_params_t *sp)
{
    if (!sp) return flx_error_set(FLX_ERR_INVALID, "select params: NULL");
    if (!(sp->stream_threshold >= 0.5f && sp->stream_threshold <= 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "select params: stream_threshold %g not in [0.5, 1]",
                             (double)sp->stream_threshold);
    if (!(sp->budget_scale > 0.0f && sp->budget_scale <= 64.0f))
        return flx_error_set(FLX_ERR_INVALID, "select params: budget_scale %g not in (0, 64]",
                             (double)sp->budget_scale);
    if (sp->min_blocks > 64)
        return flx_error_set(FLX_ERR_INVALID, "select params: min_blocks %u above 64", sp->min_blocks);
    return FLX_OK;
}

static int head_streaming(const flx_head_pred_t *p, const flx_select_params_t *sp, int keep)
{
    return !keep && isfinite(p->bgt0) && isfinite(p->k) && isfinite(p->p_streaming) &&
           p->p_streaming >= sp->stream_threshold;
}

/* Budget of one head at blk (0 for a streaming head). Non-finite predictions read everything. */
static float head_budget(const flx_head_pred_t *p, const flx_select_params_t *sp, int keep, uint32_t blk,
                         uint32_t l_cpu)
{
    if (!isfinite(p->bgt0) || !isfinite(p->k) || !isfinite(p->p_streaming)) return 1.0f;
    if (head_streaming(p, sp, keep)) return 0.0f;
    float b = sp->budget_scale * (p->bgt0 + p->k * log2f((float)blk));
    if (sp->min_blocks) {
        float floor_b = (float)(((double)sp->min_blocks * blk - 0.5) / l_cpu);
        b = b > floor_b ? b : floor_b;
    }
    return clamp01(b);
}

flx_status_t flx_select_group(const flx_head_pred_t *pred, uint32_t G, uint32_t l_cpu, const flx_select_params_t *sp,
                              float *budgets, flx_selection_t *sel)
{
    return flx_select_group_opts(pred, G, l_cpu, sp, NULL, budgets, sel);
}

flx_status_t flx_select_group_opts(const flx_head_pred_t *pred, uint32_t G, uint32_t l_cpu,
                                   const flx_select_params_t *sp, const flx_select_opts_t *opts, float *budgets,
                                   flx_selection_t *sel)
{
    if (!pred || !budgets || !sel) return flx_error_set(FLX_ERR_INVALID, "select: NULL argument");
    if (G == 0 || G > 64) return flx_error_set(FLX_ERR_INVALID, "select: group size %u outside [1, 64]", G);
    const flx_select_opts_t none = {0, 0};
    if (!opts) opts = &none;
    int fixed = -1;
    for (int j = 0; j < 4; j++)
        if (opts->fixed_blk == SEL_BLKS[j]) fixed = j;
    if ((opts->fixed_blk && fixed < 0) || (opts->keep_streaming != 0 && opts->keep_streaming != 1))
        return flx_error_set(FLX_ERR_INVALID, "select: fixed_blk %u not 0, 16, 32, 64 or 128, or keep_streaming %d "
                                              "not 0 or 1", opts->fixed_blk, opts->keep_streaming);
    const int keep = opts->keep_streaming;
    const flx_select_params_t paper = flx_select_params_paper();
    if (!sp) sp = &paper;
    memset(sel, 0, sizeof *sel);
    for (uint32_t h = 0; h < G; h++) sel->n_retrieval += !head_streaming(&pred[h], sp, keep);
    if (sel->n_retrieval == 0 || l_cpu == 0) {
        sel->skip = 1;
        for (uint32_t h = 0; h < G; h++) budgets[h] = 0.0f;
        return FLX_OK;
    }
    int best = 0;
    double v_best = 0.0;
    for (int j = 0; j < 4; j++) {
        double sum = 0.0;
        for (uint32_t h = 0; h < G; h++) sum += head_budget(&pred[h], sp, keep, SEL_BLKS[j], l_cpu);
        double v = 2.0 * (double)l_cpu / SEL_BLKS[j] + 2.0 * (double)l_cpu * sum;
        sel->v_blk[j] = (float)v;
        if (j == 0 || v < v_best) best = j, v_best = v;   /* strict, in double: ties keep the smaller blk */
    }
    if (fixed >= 0) best = fixed;
    sel->blk = SEL_BLKS[best];
    sel->v = sel->v_blk[best];
    for (uint32_t h = 0; h < G; h++) budgets[h] = head_budget(&pred[h], sp, keep, sel->blk, l_cpu);
    return FLX_OK;
}
