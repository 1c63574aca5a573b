/*
 * calibrate.c - the selector's operating point estimated and calibrated on labelled rows
 * (flx/predictor.h: flx_select_estimate, flx_select_calibrate).
 *
 * DESIGN
 * The predictor regresses each head's least budget; the selector turns predictions into reads.
 * Whether a head then meets Eq. 2 is known exactly from its labels: the least budget at every
 * granularity (bgt) says how much it needed, the streaming label says whether it needed anything.
 * So an operating point can be scored on held-out label files without replaying any KV: run the
 * real selector (flx_select_group) on the predictions of each GQA group and compare its budgets
 * with the labels. Predictions are computed once; the grid search only re-runs the selector.
 *
 * The target is the fixed (16, 0.05) baseline the paper measures against: reach its within-tau
 * share with the least Eq. 3 volume. This picks a point per weights file instead of one global
 * margin, because how far a predictor errs, and on which side, depends on the model and the data.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/predictor.h"
#include "flx/selector.h"

static const float GRID_THR[] = {0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 0.95f, 0.97f, 0.99f, 0.995f, 0.999f};
/* budget_scale: below 1 too (a regression to the mean over-reads many heads), and in steps of 0.05
 * around 1, where calibrated points land (a step there is about 5 % of the volume) */
static const float GRID_SCALE[] = {0.5f, 0.55f, 0.6f, 0.65f, 0.7f, 0.75f, 0.8f, 0.85f, 0.9f, 0.95f, 1.0f, 1.05f,
                                   1.1f, 1.15f, 1.2f, 1.25f, 1.3f, 1.4f, 1.5f, 1.6f, 1.75f, 2.0f, 2.25f, 2.5f,
                                   3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 8.0f};
static const uint32_t GRID_MINB[] = {0, 1, 2, 4, 8};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Index of blk in bgt[] (1, 16, 32, 64, 128). */
static int blk_col(uint32_t blk)
{
    return blk == 16 ? 1 : blk == 32 ? 2 : blk == 64 ? 3 : 4;
}

static flx_status_t check_rows(const flx_dataset_t *d)
{
    const uint32_t Hq = d->n_q_heads, Hkv = d->n_kv_heads;
    if (!Hq || !Hkv || Hq % Hkv)
        return flx_error_set(FLX_ERR_INVALID, "select estimate: the dataset has no (or mixed) n_q_heads/n_kv_heads "
                                              "metadata; label it with fluxion-label, one model shape per call");
    if (Hq / Hkv > 64) return flx_error_set(FLX_ERR_INVALID, "select estimate: group of %u heads above 64", Hq / Hkv);
    if (d->n == 0 || d->n % Hq)
        return flx_error_set(FLX_ERR_INVALID, "select estimate: %u rows are not whole blocks of %u heads", d->n, Hq);
    for (uint32_t r = 0; r < d->n; r++) {
        const uint32_t *w = d->where + (size_t)r * 3, *w0 = d->where + (size_t)(r - r % Hq) * 3;
        if (w[1] != r % Hq || w[0] != w0[0] || w[2] != w0[2])
            return flx_error_set(FLX_ERR_INVALID, "select estimate: row %u (layer %u head %u step %u) breaks the "
                                                  "blocks of %u heads of one (layer, step)", r, w[0], w[1], w[2], Hq);
        if (!(d->features[(size_t)r * FLX_FEAT_COUNT + FLX_F_L_CPU] >= 0.0f))
            return flx_error_set(FLX_ERR_INVALID, "select estimate: row %u has a negative l_cpu", r);
    }
    return FLX_OK;
}

/* The estimate of one operating point from predictions already made (pred: d->n rows), over the
 * groups whose l_cpu lies in [l_lo, l_hi). */
static void estimate(const flx_dataset_t *d, const flx_head_pred_t *pred, const flx_select_params_t *sp,
                     uint32_t l_lo, uint32_t l_hi, flx_select_estimate_t *e)
{
    const uint32_t Hq = d->n_q_heads, G = Hq / d->n_kv_heads;
    double within = 0, within_b = 0, v = 0, v_b = 0;
    uint32_t groups = 0;
    float budgets[64];
    for (uint32_t r0 = 0; r0 < d->n; r0 += G) {
        const double l_cpu = d->features[(size_t)r0 * FLX_FEAT_COUNT + FLX_F_L_CPU];
        if (!(l_cpu >= l_lo && l_cpu < l_hi)) continue;
        groups++;
        flx_selection_t sel;
        flx_select_group(pred + r0, G, (uint32_t)l_cpu, sp, budgets, &sel);   /* arguments checked above */
        v += sel.skip ? 0.0 : sel.v;
        v_b += 2.0 * l_cpu / 16.0 + 2.0 * l_cpu * fmin(1.0, G * 0.05);
        for (uint32_t j = 0; j < G; j++) {
            const float *lab = d->labels + (size_t)(r0 + j) * 3, *bgt = d->bgt + (size_t)(r0 + j) * 5;   /* (n, 5): blk 1 .. 128 */
            const int streaming = lab[2] >= 0.5f;
            within_b += streaming || bgt[1] <= 0.05f + 1e-6f;
            within += streaming || (!sel.skip && budgets[j] > 0.0f && budgets[j] + 1e-6f >= bgt[blk_col(sel.blk)]);
        }
    }
    const double n = (double)groups * G;
    e->n_heads = groups * G;
    e->n_groups = groups;
    e->within = n > 0 ? (float)(within / n) : 0.0f;
    e->within_baseline = n > 0 ? (float)(within_b / n) : 0.0f;
    e->bytes_ratio = v_b > 0 ? (float)(v / v_b) : 0.0f;
}

static flx_status_t predict_all(flx_predictor_h p, const flx_dataset_t *d, flx_head_pred_t **pred_p)
{
    flx_head_pred_t *pred = malloc((size_t)d->n * sizeof *pred);
    const uint32_t chunk = 4096;
    size_t scr_bytes = flx_predictor_scratch_bytes(chunk);
    void *scr = malloc(scr_bytes);
    flx_status_t st = FLX_OK;
    if (!pred || !scr) st = flx_error_set(FLX_ERR_NOMEM, "select estimate: predictions of %u rows", d->n);
    for (uint32_t r = 0; !st && r < d->n; r += chunk) {
        uint32_t n = d->n - r < chunk ? d->n - r : chunk;
        st = flx_predictor_run(p, d->features + (size_t)r * FLX_FEAT_COUNT, n, pred + r, scr, scr_bytes, NULL);
    }
    free(scr);
    if (st) {
        free(pred);
        return st;
    }
    *pred_p = pred;
    return FLX_OK;
}

flx_status_t flx_select_estimate_lengths(flx_predictor_h p, const flx_dataset_t *d, const flx_select_params_t *sp,
                                         const uint32_t *edges, uint32_t n_bands, flx_select_estimate_t *est)
{
    if (!p || !d || !sp || !edges || !est) return flx_error_set(FLX_ERR_INVALID, "select estimate: NULL argument");
    for (uint32_t b = 0; b < n_bands; b++)
        if (edges[b] >= edges[b + 1])
            return flx_error_set(FLX_ERR_INVALID, "select estimate: empty length range [%u, %u)", edges[b], edges[b + 1]);
    flx_status_t st = flx_select_params_check(sp);
    if (st || (st = check_rows(d))) return st;
    flx_head_pred_t *pred;
    if ((st = predict_all(p, d, &pred))) return st;
    for (uint32_t b = 0; b < n_bands; b++) estimate(d, pred, sp, edges[b], edges[b + 1], &est[b]);
    free(pred);
    return FLX_OK;
}

flx_status_t flx_select_estimate(flx_predictor_h p, const flx_dataset_t *d, const flx_select_params_t *sp,
                                 flx_select_estimate_t *est)
{
    const uint32_t all[2] = {0, UINT32_MAX};
    return flx_select_estimate_lengths(p, d, sp, all, 1, est);
}

flx_status_t flx_select_calibrate(flx_predictor_h p, const flx_dataset_t *d, flx_select_params_t *out,
                                  flx_select_estimate_t *est)
{
    if (!p || !d || !out || !est) return flx_error_set(FLX_ERR_INVALID, "select calibrate: NULL argument");
    flx_status_t st = check_rows(d);
    if (st) return st;
    flx_head_pred_t *pred;
    if ((st = predict_all(p, d, &pred))) return st;
    flx_select_params_t best = flx_select_params_paper(), fallback = best;
    flx_select_estimate_t best_e, fallback_e;
    estimate(d, pred, &best, 0, UINT32_MAX, &best_e);
    fallback_e = best_e;
    int have_best = 0, have_fallback = 0;
    for (size_t a = 0; a < N_OF(GRID_THR); a++)
        for (size_t b = 0; b < N_OF(GRID_SCALE); b++)
            for (size_t c = 0; c < N_OF(GRID_MINB); c++) {
                flx_select_params_t sp = {GRID_THR[a], GRID_SCALE[b], GRID_MINB[c]};
                flx_select_estimate_t e;
                estimate(d, pred, &sp, 0, UINT32_MAX, &e);
                if (e.within >= e.within_baseline) {
                    if (!have_best || e.bytes_ratio < best_e.bytes_ratio) best = sp, best_e = e, have_best = 1;
                } else if (e.bytes_ratio <= 1.0f) {
                    if (!have_fallback || e.within > fallback_e.within ||
                        (e.within == fallback_e.within && e.bytes_ratio < fallback_e.bytes_ratio))
                        fallback = sp, fallback_e = e, have_fallback = 1;
                }
            }
    free(pred);
    *out = have_best ? best : fallback;
    *est = have_best ? best_e : fallback_e;
    return FLX_OK;
}
