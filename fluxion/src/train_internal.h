/*
 * train_internal.h - the minibatch loss and gradient of flx_train, exposed for the gradient check.
 */
#ifndef FLX_TRAIN_INTERNAL_H
#define FLX_TRAIN_INTERNAL_H

#include "flx/predictor.h"

/* x (B, 41) standardized features, tgt (B, 2) standardized bgt0/k, s (B) in {0, 1} -> *loss (the
 * training objective of train.c's DESIGN) and grad (flx_mlp_param_count(), layout w1 b1 .. w4 b4). */
flx_status_t flx_train_batch_loss(const flx_mlp_t *m, const float *x, const float *tgt, const float *s, int B,
                                  float bce_w, float *grad, double *loss);

#endif
