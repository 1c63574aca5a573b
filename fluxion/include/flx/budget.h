/*
 * flx/budget.h - least budgets and head-property labels (paper §4.1, §6.2, Eq. 1 and Eq. 2).
 *
 * The offline side of Fluxion: for one layer at one decode step, given every kv head's KV (a
 * flx_kv_head_view_t: host blocks, Quest pyramid, window rows [0, n_win)) and every query head's
 * query, find per head and per granularity the least budget whose sparse output meets a criterion,
 * then the head's labels (bgt0, k, s). The prefill statistics' bgt*(blk) (flx/features.h) are the
 * same search for q' with the window = sink + local.
 *
 * SPARSE OUTPUT at (blk, k blocks): window rows [0, n_win) plus the k host logical blocks of size
 * blk with the highest Quest scores (blk >= 16: sum_d max(q_d min_d, q_d max_d) over the pyramid
 * level of blk; blk = 1: the exact score <q, k_i>), ties to the lower index — the selection
 * flx_attn_group_run makes in SPARSE mode. Its BUDGET is the fraction of the host tokens read,
 * bgt = min(1, k * blk / l_cpu) (the short last block counted as full), which
 * flx_attn_budget_blocks maps back to k blocks. k = 0 is the window alone.
 *
 * CRITERIA (per head h of the layer; o_h the exact full output over window + every host token):
 *   FLUXION  Eq. 2:  ||o_h(k) - o_h|| / max_h' ||o_h'|| <= tau   (h' over the layer's query heads)
 *   OUTPUT   ||o_h(k) - o_h|| / ||o_h|| <= tau                   (the paper's "output (10%)")
 *   SCORE    attention mass of window + selected tokens >= 1 - tau of the full mass
 *            (the paper's "score (95%)" is tau = 0.05)
 * The LEAST budget is the smallest k (blocks added in score order, one at a time) at which the
 * criterion holds; errors need not fall monotonically, and the first k that meets it is the one
 * taken. All outputs are accumulated in double from the bf16 K/V.
 *
 * LABELS (§6.2): bgt[i] = least budget at blk = FLX_LABEL_BLKS[i] = 1, 16, 32, 64, 128.
 *   s    = 1 (streaming) when the window alone meets the criterion (k = 0), else 0.
 *   bgt0 = bgt[0] (the least budget at blk = 1, as the paper sets it).
 *   k    = least-squares slope of bgt(blk) - bgt0 against log2(blk) over blk = 16..128, the line
 *          pinned at bgt0: k = sum_j x_j (bgt_j - bgt0) / sum_j x_j^2, x_j = log2(blk_j).
 *   A streaming head has bgt[] = 0, bgt0 = 0, k = 0.
 *
 * THREAD MODE: pure; flx_label_layer runs its heads on in->pool's workers (results do not depend
 * on the pool: each head is computed by one worker).
 */
#ifndef FLX_BUDGET_H
#define FLX_BUDGET_H

#include <stdint.h>

#include "flx/kvstore.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_LABEL_N_BLK 5
extern const uint32_t FLX_LABEL_BLKS[FLX_LABEL_N_BLK]; /* 1, 16, 32, 64, 128 */

typedef enum {
    FLX_CRIT_FLUXION = 0,
    FLX_CRIT_OUTPUT = 1,
    FLX_CRIT_SCORE = 2,
} flx_crit_t;

const char *flx_crit_name(flx_crit_t c);   /* "fluxion", "output", "score" */

typedef struct flx_head_label {
    float bgt[FLX_LABEL_N_BLK];  /* least budget at blk 1, 16, 32, 64, 128 */
    float bgt0, k;               /* Eq. 1 */
    uint8_t streaming;           /* s */
    float err_window;            /* the criterion's error of the window alone (for SCORE: missing mass) */
} flx_head_label_t;

typedef struct flx_label_layer_in {
    uint32_t n_q_heads, n_kv_heads;     /* Hq multiple of Hkv */
    const flx_kv_head_view_t *views;    /* (Hkv); all with the same head_dim, l_cpu and n_win */
    const float *q;                     /* (Hq, D), RoPE applied */
    flx_crit_t crit;
    float tau;                          /* in (0, 1) */
    uint32_t n_blk;                     /* how many of the granularities to search: blk list below */
    const uint32_t *blks;               /* subset of {1, 16, 32, 64, 128}, or NULL for all five */
    flx_pool_h pool;                    /* workers for the heads (borrowed); NULL: the caller alone */
} flx_label_layer_in_t;

/* Least budgets and labels of every query head: out (Hq). With a subset of blks only the searched
 * entries of bgt[] are set (others 0), and bgt0/k are fitted only when blk 1 and at least one of
 * 16..128 were searched (else 0). FLX_ERR_INVALID names a bad argument; FLX_ERR_NOMEM. */
flx_status_t flx_label_layer(const flx_label_layer_in_t *in, flx_head_label_t *out);

/* The budget of k logical blocks of blk tokens: min(1, k * blk / l_cpu), nudged to the nearest float
 * that flx_attn_budget_blocks maps back to exactly k (k <= ceil(l_cpu / blk)); 0 for k = 0. */
float flx_label_budget(uint32_t k, uint32_t l_cpu, uint32_t blk);

/* The Eq. 1 fit alone: bgt (5) at blk 1, 16, 32, 64, 128 -> (bgt0, k) as above. */
void flx_label_fit(const float bgt[FLX_LABEL_N_BLK], float *bgt0, float *k);

/* Exact full output of every query head over window + all host tokens (double accumulation):
 * o (Hq, D), onorm (Hq) = ||o_h||. Used by labels, the quality benchmark and tests. */
flx_status_t flx_full_output(const flx_kv_head_view_t *views, uint32_t n_q_heads, uint32_t n_kv_heads,
                             const float *q, float *o, float *onorm);

#ifdef __cplusplus
}
#endif
#endif
