/*
 * train_internal.h - the minibatch loss and gradient of flx_train, exposed for the gradient check.
 */
#ifndef FLX_TRAIN_INTERNAL_H
#define FLX_TRAIN_INTERNAL_H

#include "flx/predictor.h"

/* One minibatch of n rows: x (n, 41) standardized features, tgt (n, 2) standardized bgt0/k labels,
 * bud (n, 4) least budgets at blk 16, 32, 64, 128, eps (n) the log floor of each row (0.5 / l_cpu),
 * s (n) in {0, 1}. */
typedef struct flx_train_batch {
    const float *x, *tgt, *bud, *eps, *s;
    int n;
} flx_train_batch_t;

/* The batch's loss (train.c's DESIGN, regression part by p->loss, s by p->bce_weight; the output
 * de-standardization from m->target_mean/std) -> *loss, and its gradient -> grad
 * (flx_mlp_param_count(), layout w1 b1 .. w4 b4). */
flx_status_t flx_train_batch_loss(const flx_mlp_t *m, const flx_train_batch_t *b, const flx_train_params_t *p,
                                  float *grad, double *loss);

#endif
