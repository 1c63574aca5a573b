/*
 * flx/selector.h - the granularity-budget selector (paper §6.3, Eq. 1 and Eq. 3).
 *
 * For one GQA group of G query heads sharing a kv head with l_cpu host tokens, given each head's
 * predicted (bgt0, k, p_streaming) and the operating point sp (flx/predictor.h; the paper's rule
 * is thr = 0.5, alpha = 1, m = 0):
 *   streaming head    p_streaming >= thr: reads no host token (budget 0, window only)
 *   group skip        every head streaming: the group reads nothing on the host, no task (V = 0)
 *   bgt_h(blk)        for a retrieval head clamp(max(alpha (bgt0_h + k_h log2(blk)), m blocks), 0, 1),
 *                     where m blocks is the budget of m logical blocks of blk ((m blk - 1/2) / l_cpu,
 *                     which flx_attn_budget_blocks maps to exactly m); 0 for a streaming one.
 *                     THE CLAMP: a fitted line can leave [0, 1] (a negative intercept at small
 *                     blk, above 1 at large blk); budgets are fractions of l_cpu, so they are
 *                     clamped into [0, 1] before V is computed and before they are used. The
 *                     floor of m blocks keeps a head the predictor calls retrieval from reading
 *                     nothing because its line dipped below 0.
 *   V(blk)            2 l_cpu / blk + 2 l_cpu sum_h bgt_h(blk)          (Eq. 3, in token rows:
 *                     multiply by D * sizeof(bf16) for bytes)
 *   blk*              argmin V over {16, 32, 64, 128}; ties go to the smaller blk
 *   priority          V(blk*), the scheduler's task priority (larger first)
 * Non-finite predictions are treated as retrieval heads with budget 1 (the safe side).
 *
 * ABLATIONS (paper §8, "dynamic granularity-budget allocation and streaming head skipping";
 * flx_select_group_opts): keep_streaming treats every head as a retrieval head (its predicted
 * line gives its budget; no group is skipped): Fluxion without streaming-head skipping ("D").
 * fixed_blk in {16, 32, 64, 128} uses that block size for every group instead of argmin V (the
 * budgets, Eq. 1's line at fixed_blk, and V at it): Fluxion with fixed granularity.
 */
#ifndef FLX_SELECTOR_H
#define FLX_SELECTOR_H

#include <stdint.h>

#include "flx/predictor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_selection {
    int skip;          /* 1: streaming-only group, no host work */
    uint32_t blk;      /* blk* (0 when skip) */
    float v;           /* V(blk*) (0 when skip) */
    float v_blk[4];    /* V at 16, 32, 64, 128 (for reports) */
    uint32_t n_retrieval;
} flx_selection_t;

/* pred (G) -> budgets (G) at blk* and the selection. G in [1, 64]; sp NULL means the paper's rule
 * (sp is not range-checked here: flx_select_params_check it once where it is set). */
flx_status_t flx_select_group(const flx_head_pred_t *pred, uint32_t G, uint32_t l_cpu, const flx_select_params_t *sp,
                              float *budgets, flx_selection_t *sel);

typedef struct flx_select_opts {
    int keep_streaming;      /* 1: no head is streaming (no skipping); 0: the rule above */
    uint32_t fixed_blk;      /* 0: argmin V (dynamic granularity); 16, 32, 64 or 128: that blk */
} flx_select_opts_t;

/* flx_select_group with ABLATIONS; opts NULL is {0, 0}, flx_select_group itself. FLX_ERR_INVALID
 * for a fixed_blk that is not 0, 16, 32, 64 or 128 or a keep_streaming not 0 / 1. */
flx_status_t flx_select_group_opts(const flx_head_pred_t *pred, uint32_t G, uint32_t l_cpu,
                                   const flx_select_params_t *sp, const flx_select_opts_t *opts, float *budgets,
                                   flx_selection_t *sel);

#ifdef __cplusplus
}
#endif
#endif
