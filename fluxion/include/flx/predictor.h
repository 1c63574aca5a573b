/*
 * flx/predictor.h - the head-property predictor (paper §6.2): an MLP with a shared backbone that
 * maps a head's 41 features (flx/features.h) to (bgt0, k, s); its weights file; the label dataset
 * file; training.
 *
 * NETWORK (109,827 parameters)
 *   x  = (feat - feature_mean) / feature_std                       standardized, (41)
 *   h1 = relu(W1 x + b1)        W1 (256, 41)
 *   h2 = relu(W2 h1 + b2)       W2 (256, 256)
 *   h3 = relu(W3 h2 + b3)       W3 (128, 256)
 *   y  = W4 h3 + b4             W4 (3, 128)     the three heads share h3 (the backbone)
 *   t_i = y_i * target_std[i] + target_mean[i]   (i = 0, 1; de-standardized)
 *   (bgt0, k) of Eq. 1 from t by the file's output map ("outputs"):
 *     "line"      bgt0 = t0, k = t1 (the paper's two regression targets, as they are)
 *     "log-ends"  t0 = ln bgt(16), t1 = ln bgt(128): the two ends of the line over the selector's
 *                 granularities, each clamped into [FLX_PRED_LN_MIN, FLX_PRED_LN_MAX] before exp;
 *                 k = (e^t1 - e^t0) / 3, bgt0 = e^t0 - 4 k. The line is then positive at every
 *                 blk in [16, 128], and a budget of 1e-4 is as easy to output as one of 0.1 (the
 *                 line map needs bgt0 and 4k to cancel to that precision).
 *   p_streaming = sigmoid(y2)
 * Weights are (out, in) row-major, as torch.nn.Linear stores them.
 *
 * WEIGHTS FILE (safetensors, every tensor F32; nothing else is accepted)
 *   feature_mean (41)   feature_std (41)   target_mean (2)   target_std (2)
 *   backbone.0.weight (256, 41)   backbone.0.bias (256)
 *   backbone.1.weight (256, 256)  backbone.1.bias (256)
 *   backbone.2.weight (128, 256)  backbone.2.bias (128)
 *   head.weight (3, 128)          head.bias (3)
 *   metadata: "format" = "fluxion-predictor", "version" = "1", "features" = "appendix-a-41",
 *             optional "tau", "criterion", "source", "trained_by" (free text), the output map
 *             "outputs" = "line" | "log-ends" (absent: "line"), and the selector's operating point
 *             "stream_threshold", "budget_scale", "min_blocks" (decimal strings; each absent one
 *             takes the paper's value 0.5, 1, 0)
 * In PyTorch: nn.Sequential of Linear/ReLU named backbone.{0,1,2} + a Linear named head, inputs
 * standardized with feature_mean/std (std entries > 0), regression outputs de-standardized with
 * target_mean/std and mapped as "outputs" says. The loader refuses missing or extra tensors, other
 * dtypes or shapes, non-finite values, a std <= 0, an unknown "outputs", and other formats/versions,
 * naming what was wrong.
 *
 * DATASET FILE (safetensors, written by fluxion-label, read by fluxion-train)
 *   features F32 (N, 41)      labels F32 (N, 3) = bgt0, k, s (s in {0, 1})
 *   bgt F32 (N, 5)            least budgets at blk 1, 16, 32, 64, 128 (flx/budget.h)
 *   where I32 (N, 3)          layer, query head, decode step of the row (>= 0; I32 because the
 *                             project's safetensors reader has no U32 dtype)
 *   metadata: "format" = "fluxion-dataset", "version" = "1", "tau", "criterion", "source",
 *             optional "n_q_heads", "n_kv_heads" (the source's shape; fluxion-label writes them)
 *   Rows come as fluxion-label writes them: per (layer, step), the n_q_heads heads in order.
 *
 * THREAD MODE: a loaded predictor is immutable; flx_predictor_run may be called from many threads
 * at once, each with its own scratch.
 */
#ifndef FLX_PREDICTOR_H
#define FLX_PREDICTOR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "flx/features.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_PRED_IN FLX_FEAT_COUNT
#define FLX_PRED_H1 256
#define FLX_PRED_H2 256
#define FLX_PRED_H3 128
#define FLX_PRED_OUT 3

/*
 * The selector's operating point (flx/selector.h): how predictions become host reads. The paper
 * gives only the plain rule {0.5, 1, 0}: s >= 0.5 is streaming, budgets are Eq. 1 as predicted.
 * A regression predicts a head's least budget give or take its error, and a head given less than
 * its least budget misses Eq. 2, so the point is calibrated for each weights file on held-out
 * labels (flx_select_calibrate, fluxion-train --calib) and stored with the weights.
 */
typedef struct flx_select_params {
    float stream_threshold;  /* a head is streaming when p_streaming >= this; in [0.5, 1] */
    float budget_scale;      /* Eq. 1's line is multiplied by this before the clamp; in (0, 64] */
    uint32_t min_blocks;     /* a retrieval head reads at least this many logical blocks; <= 64 */
} flx_select_params_t;

/* {0.5, 1, 0}: the paper's rule. */
flx_select_params_t flx_select_params_paper(void);
/* FLX_ERR_INVALID naming the field outside its range (NaN included). */
flx_status_t flx_select_params_check(const flx_select_params_t *sp);

/* How the two de-standardized regression outputs t0, t1 become Eq. 1's (bgt0, k) (NETWORK above). */
typedef enum {
    FLX_PRED_OUT_LINE = 0,      /* "line": bgt0 = t0, k = t1 (fluxion-train --loss mse) */
    FLX_PRED_OUT_LOG_ENDS = 1,  /* "log-ends": t0 = ln bgt(16), t1 = ln bgt(128) (--loss log-budget) */
} flx_pred_outputs_t;
#define FLX_PRED_LN_MIN (-30.0)  /* log-ends: ln budgets are clamped into [MIN, MAX] before exp */
#define FLX_PRED_LN_MAX 5.0

/* log-ends: the budget an output end t stands for, e^clamp(t, MIN, MAX); a NaN stays NaN (the
 * selector reads everything for a non-finite prediction). Shared by inference and training. */
static inline double flx_pred_end(double t)
{
    return exp(t < FLX_PRED_LN_MIN ? FLX_PRED_LN_MIN : t > FLX_PRED_LN_MAX ? FLX_PRED_LN_MAX : t);
}

/* (bgt0, k) from the de-standardized outputs t0, t1 by map o. */
void flx_pred_line(flx_pred_outputs_t o, double t0, double t1, double *bgt0, double *k);
/* The map's name in the weights file ("line", "log-ends"); NULL for a value outside the enum. */
const char *flx_pred_outputs_name(flx_pred_outputs_t o);

/* The parameters, plain arrays (owned by whoever made the struct). */
typedef struct flx_mlp {
    float feature_mean[FLX_PRED_IN], feature_std[FLX_PRED_IN];
    float target_mean[2], target_std[2];
    flx_pred_outputs_t outputs;                      /* the output map ("outputs" in the file) */
    float *w1, *b1, *w2, *b2, *w3, *b3, *w4, *b4;   /* shapes as above */
    flx_select_params_t select;                      /* the calibrated operating point */
} flx_mlp_t;

/* Allocates the weight arrays of m (zeroed; stds 1; the line map; the paper's select params) / frees them. */
flx_status_t flx_mlp_alloc(flx_mlp_t *m);
void flx_mlp_free(flx_mlp_t *m);
size_t flx_mlp_param_count(void);   /* 109827 */

/* Weights file I/O. meta_* may be NULL. Load reads fixed shapes: it allocates the MLP's arrays
 * (flx_mlp_param_count floats) plus the safetensors reader's bound (flx/safetensors.h), whatever
 * the file claims. */
flx_status_t flx_mlp_save(const flx_mlp_t *m, const char *path, const char *source, const char *criterion,
                          float tau);
flx_status_t flx_mlp_load(const char *path, flx_mlp_t *m);

typedef struct flx_head_pred {
    float bgt0, k;
    float p_streaming;   /* probability the head is streaming; the selector uses >= 0.5 */
} flx_head_pred_t;

/* Inference: a prepared (repacked, AVX-512/AVX2/scalar by flx_isa_active()) copy of an MLP. */
typedef struct flx_predictor *flx_predictor_h;
flx_status_t flx_predictor_create(const flx_mlp_t *m, flx_predictor_h *p);
flx_status_t flx_predictor_load(const char *path, flx_predictor_h *p);   /* flx_mlp_load + create */
void flx_predictor_destroy(flx_predictor_h p);
/* The operating point the weights carry (the paper's when they carry none). */
flx_select_params_t flx_predictor_select_params(flx_predictor_h p);

/* Scratch bytes for up to max_rows rows per call. */
size_t flx_predictor_scratch_bytes(uint32_t max_rows);
/* Rows of the active kernel's full register tile (flx_isa_active: 6 on AVX2, 8 on AVX-512 and for
 * the scalar code, 16 on AMX: one tile): a caller handing out rows (flx_predictor_run_rows) gives each worker multiples
 * of it, since a shorter tail runs in a narrower, slower kernel. */
uint32_t flx_predictor_tile_rows(void);
/* feat (n_rows, 41) -> out (n_rows); rows are independent (all heads of a layer, of every sequence
 * in the batch), in chunks of whole register tiles (flx_predictor_tile_rows) on pool's workers
 * (NULL: the caller alone); the result does not depend on the pool. Non-finite features are
 * refused with FLX_ERR_INVALID naming row and feature. */
flx_status_t flx_predictor_run(flx_predictor_h p, const float *feat, uint32_t n_rows, flx_head_pred_t *out,
                               void *scratch, size_t scratch_bytes, flx_pool_h pool);
/* Rows [r0, r1) of a run over n_rows rows, on the calling thread: feat, out and scratch laid out
 * as flx_predictor_run lays them out for n_rows, so disjoint ranges may run at once on one scratch
 * (the decode layer runs a sequence's rows as soon as its features are in); each row comes out
 * bitwise as flx_predictor_run computes it. Checks only its own rows' features. */
flx_status_t flx_predictor_run_rows(flx_predictor_h p, const float *feat, uint32_t n_rows, uint32_t r0, uint32_t r1,
                                    flx_head_pred_t *out, void *scratch, size_t scratch_bytes);

/* Brings the weights the active kernels read (a few hundred KB) towards this core's L2 with
 * prefetches, returning once they are issued: for a thread that must wait before it runs rows
 * (the decode layer's predictor item waiting for a sequence's features), so that the wait, not the
 * run, pays for the weights coming back from beyond L2 (a layer's attention evicts them). Changes
 * no result; p may be NULL (nothing). */
void flx_predictor_prefetch(flx_predictor_h p);

/* The oracle of flx_predictor_run: the same network in double straight from the (out, in) weights,
 * one row at a time, no dispatch. Does not check the features (tests feed it finite ones). */
flx_status_t flx_mlp_forward_ref(const flx_mlp_t *m, const float *feat, uint32_t n_rows, flx_head_pred_t *out);
/* The oracle of the AVX-512 BF16 path (flx_predictor_bf16_hidden): as flx_mlp_forward_ref with the
 * two hidden 256-wide layers' weights and inputs rounded to bf16, the sums still in double. */
flx_status_t flx_mlp_forward_ref_bf16(const flx_mlp_t *m, const float *feat, uint32_t n_rows, flx_head_pred_t *out);
/* 1 when runs of p take the bf16 path now: the CPU has AVX-512 BF16 (and FLX_ISA allows it). The
 * hidden layers (256 -> 256 -> 128, 90 % of the multiply-adds) then multiply bf16 weights and
 * activations with fp32 sums, twice the work per instruction of fp32 FMA (_mm512_dpbf16_ps), or on
 * AMX tiles at FLX_ISA_AMX: the predictor is bound by arithmetic (about 4 M multiply-adds a decode
 * layer at batch 4 on SmolLM2). The input layer and the 3-output head stay fp32. */
int flx_predictor_bf16_hidden(flx_predictor_h p);

/* ---- dataset ---- */

typedef struct flx_dataset {
    uint32_t n;
    uint32_t n_q_heads, n_kv_heads; /* the source's shape; 0 when unknown or when files of different
                                       shapes were appended (the selector estimate needs it) */
    float *features;   /* (n, 41) */
    float *labels;     /* (n, 3) */
    float *bgt;        /* (n, 5) */
    uint32_t *where;   /* (n, 3) */
    char source[256], criterion[32];
    float tau;
} flx_dataset_t;

flx_status_t flx_dataset_save(const flx_dataset_t *d, const char *path);
/* Loads and appends to d (d zeroed first for a fresh set); rows of a file whose tau or criterion
 * differ from rows already in d are refused. d's arrays grow by the rows the file holds, i.e. by
 * its tensor bytes, plus the safetensors reader's bound (flx/safetensors.h). */
flx_status_t flx_dataset_load_append(flx_dataset_t *d, const char *path);
void flx_dataset_free(flx_dataset_t *d);

/* Quality of a predictor on rows of a dataset (fluxion-train's test split, fluxion-predict). */
typedef struct flx_eval {
    uint32_t n_rows, n_retrieval;          /* rows evaluated; those labelled retrieval (s = 0) */
    float mae_bgt0, mae_k, mae_bgt16;      /* over retrieval rows (NaN when none); bgt16 = bgt0 + 4k vs bgt[1] */
    float stream_precision, stream_recall; /* streaming class, p >= 0.5; 1 when the denominator is 0 and
                                              nothing was missed */
} flx_eval_t;

/* rows (n_rows indices into d) -> ev. Runs p single-threaded in chunks. */
flx_status_t flx_predictor_evaluate(flx_predictor_h p, const flx_dataset_t *d, const uint32_t *rows, uint32_t n_rows,
                                    flx_eval_t *ev);

/*
 * Estimated outcome of a selector operating point on labelled rows (a validation dataset with its
 * shape): every (layer, step, kv group) of n_q_heads / n_kv_heads heads runs flx_select_group on
 * the predictions; a head counts as within the criterion when its label says streaming, or when it
 * was not treated as streaming and its budget at the chosen blk is at least its least budget there
 * (bgt, as labelled). The volume is Eq. 3 (V of the chosen blk, 0 for a skipped group). The
 * baseline is fixed (16, 0.05): within when streaming or bgt(16) <= 0.05; its volume
 * 2 l_cpu / 16 + 2 l_cpu min(1, G 0.05), the same sum-of-budgets bound.
 */
typedef struct flx_select_estimate {
    uint32_t n_heads, n_groups;
    float within, within_baseline;   /* shares of heads */
    float bytes_ratio;               /* sum of V / sum of the baseline's V */
} flx_select_estimate_t;

flx_status_t flx_select_estimate(flx_predictor_h p, const flx_dataset_t *d, const flx_select_params_t *sp,
                                 flx_select_estimate_t *est);
/* The same estimate per band of host length, the predictions made once for all bands: est[b] over
 * the groups whose l_cpu lies in [edges[b], edges[b + 1]) (n_bands + 1 edges): how a point chosen
 * over every length holds at the lengths a node serves (n_heads = 0 and shares 0 for a band without
 * groups). flx_select_estimate is the one band [0, UINT32_MAX). FLX_ERR_INVALID when an edge does
 * not exceed the one before. */
flx_status_t flx_select_estimate_lengths(flx_predictor_h p, const flx_dataset_t *d, const flx_select_params_t *sp,
                                         const uint32_t *edges, uint32_t n_bands, flx_select_estimate_t *est);

/*
 * Calibration of the operating point on validation rows: over a grid of stream_threshold
 * {0.5 .. 0.999}, budget_scale {0.5 .. 8; steps of 0.05 from 0.5 to 1.3} and min_blocks
 * {0, 1, 2, 4, 8}, the point with the least estimated volume whose within share reaches the
 * baseline's; when none does, the point with the highest within share whose volume stays at or
 * below the baseline's (the paper's rule when even that is empty). Ties go to the earlier grid
 * point (lower threshold, scale, min_blocks). *out is the point, *est its estimate.
 * FLX_ERR_INVALID when d has no shape or its rows are not in blocks of n_q_heads heads of one
 * (layer, step).
 */
flx_status_t flx_select_calibrate(flx_predictor_h p, const flx_dataset_t *d, flx_select_params_t *out,
                                  flx_select_estimate_t *est);

/* ---- training (flx_fluxion_train, links a BLAS) ---- */

/* Regression objective for bgt0 and k (train.c DESIGN). */
typedef enum {
    FLX_TRAIN_LOSS_LOG_BUDGET = 0,  /* pinball loss of the line's budgets at blk 16..128 against the least
                                     * budgets, in log space (quantile below); trains the log-ends map */
    FLX_TRAIN_LOSS_MSE = 1,         /* squared error on the standardized bgt0 and k labels; the line map */
} flx_train_loss_t;

typedef struct flx_train_params {
    uint32_t epochs;        /* default 60 */
    uint32_t batch;         /* default 256 */
    float lr;               /* Adam, default 1e-3 */
    float weight_decay;     /* L2 on weights, default 0 */
    float test_frac;        /* held-out share, default 0.2 (split by a seeded shuffle) */
    float bce_weight;       /* weight of the s loss against the two regressions, default 1 */
    uint64_t seed;          /* init, shuffle, split */
    flx_train_loss_t loss;  /* default FLX_TRAIN_LOSS_LOG_BUDGET */
    float quantile;         /* LOG_BUDGET: the quantile of the least budget regressed, in (0, 1), default 0.9 */
    int verbose;            /* per-epoch lines on stderr */
} flx_train_params_t;

void flx_train_defaults(flx_train_params_t *p);

typedef struct flx_train_report {
    uint32_t n_train, n_test;
    float test_mae_bgt0, test_mae_k;        /* over test rows that are retrieval heads */
    float test_mae_bgt16;                   /* |bgt0 + 4k - bgt(16)| likewise */
    float stream_precision, stream_recall;  /* streaming class on the test rows (p >= 0.5) */
    float train_loss;                       /* last epoch */
} flx_train_report_t;

/* Trains m (allocated by the caller with flx_mlp_alloc) on d: feature and target standardization
 * from the training rows, regression of bgt0, k by p->loss over retrieval rows only (a streaming
 * head's budget is never used), binary cross-entropy for s over all rows. Deterministic
 * for a seed and a BLAS thread count. Reports each epoch to the calling thread's progress observer
 * (flx/progress.h, stage "training"). */
flx_status_t flx_train(const flx_dataset_t *d, const flx_train_params_t *p, flx_mlp_t *m, flx_train_report_t *rep);

#ifdef __cplusplus
}
#endif
#endif
