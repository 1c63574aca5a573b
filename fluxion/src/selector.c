/*
 * selector.c - Eq. 1 + Eq. 3 for one GQA group (flx/selector.h).
 */
#include "flx/selector.h"

#include <math.h>
#include <string.h>

static const uint32_t SEL_BLKS[4] = {16, 32, 64, 128};

static float clamp01(float x)
{
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

/* Budget of one head at blk; -1 marks a streaming head (no host tokens). */
static float head_budget(const flx_head_pred_t *p, uint32_t blk)
{
    if (!isfinite(p->bgt0) || !isfinite(p->k) || !isfinite(p->p_streaming)) return 1.0f;
    if (p->p_streaming >= 0.5f) return 0.0f;
    return clamp01(p->bgt0 + p->k * log2f((float)blk));
}

static int head_streaming(const flx_head_pred_t *p)
{
    return isfinite(p->bgt0) && isfinite(p->k) && isfinite(p->p_streaming) && p->p_streaming >= 0.5f;
}

flx_status_t flx_select_group(const flx_head_pred_t *pred, uint32_t G, uint32_t l_cpu, float *budgets,
                              flx_selection_t *sel)
{
    if (!pred || !budgets || !sel) return flx_error_set(FLX_ERR_INVALID, "select: NULL argument");
    if (G == 0 || G > 64) return flx_error_set(FLX_ERR_INVALID, "select: group size %u outside [1, 64]", G);
    memset(sel, 0, sizeof *sel);
    for (uint32_t h = 0; h < G; h++) sel->n_retrieval += !head_streaming(&pred[h]);
    if (sel->n_retrieval == 0 || l_cpu == 0) {
        sel->skip = 1;
        for (uint32_t h = 0; h < G; h++) budgets[h] = 0.0f;
        return FLX_OK;
    }
    int best = 0;
    for (int j = 0; j < 4; j++) {
        double sum = 0.0;
        for (uint32_t h = 0; h < G; h++) sum += head_budget(&pred[h], SEL_BLKS[j]);
        double v = 2.0 * (double)l_cpu / SEL_BLKS[j] + 2.0 * (double)l_cpu * sum;
        sel->v_blk[j] = (float)v;
        if (v < sel->v_blk[best]) best = j;   /* strict: ties keep the smaller blk */
    }
    sel->blk = SEL_BLKS[best];
    sel->v = sel->v_blk[best];
    for (uint32_t h = 0; h < G; h++) budgets[h] = head_budget(&pred[h], sel->blk);
    return FLX_OK;
}
