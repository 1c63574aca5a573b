/*
 * train.c - offline training of the head-property MLP (flx/predictor.h, flx_train).
 *
 * DESIGN
 * The network is small (110 k parameters) and the datasets are tens of thousands of rows, so plain
 * minibatch Adam on the CPU is enough; the GEMMs of the forward and backward passes go through
 * cblas_sgemm (row-major, batch x features). The parameters live in one flat block (flx_mlp_alloc
 * lays out w1 b1 .. w4 b4 contiguously) so Adam, the gradient and weight decay are single loops.
 * Loss per minibatch of B rows with R retrieval rows (s = 0), regression part by p->loss:
 *   LOG_BUDGET (default): the budgets the predicted line gives at the selector's granularities,
 *     in log space, against the least budgets of the labels, by the pinball (quantile) loss at
 *     q = p->quantile:
 *       (1/R) sum_{r retrieval} (1/4) sum_{blk 16..128} rho_q(ln bgt(blk) - ln line(blk)),
 *       rho_q(e) = q e for e > 0 (the line short of the least budget), (q - 1) e otherwise
 *     with bgt(blk) floored at eps = 0.5 / l_cpu (half a token; a non-positive one, which no
 *     retrieval head has, is skipped). The network is trained in the log-ends output map
 *     (flx/predictor.h): its two outputs are ln line(16) and ln line(128), and
 *     line(blk) = (1 - w) line(16) + w line(128), w = (log2 blk - 4) / 3, which is Eq. 1's line
 *     through those ends. Least budgets span three decades (2 blocks of 16 at 32K is 0.001; heads
 *     that need the bulk reach 0.03-0.2). A squared error on the raw values is blind to the small
 *     ones: it fits the tail and leaves a typical head's budget wrong by a factor of ten. In log
 *     space the error is a ratio, and the quantile puts the line above the least budget on about q
 *     of the rows, with a margin that follows how predictable a head is rather than one
 *     budget_scale for all. The outputs are log budgets rather than (bgt0, k) because a small
 *     budget from (bgt0, k) needs the two to cancel to a fraction of a percent of their spread:
 *     trained that way (the first version of this loss), the outcome swung with the seed (one seed
 *     in three left the budgets a hundred times too large), where the log ends train steadily.
 *     Targets are standardized with the mean and spread of ln bgt(16) and ln bgt(128) (floored at
 *     eps) over the training rows.
 *   MSE (the plain regression of the paper's two labels):
 *       (1/R) sum_{r retrieval} 1/2 [(y0 - t0)^2 + (y1 - t1)^2]   (t standardized bgt0, k)
 *   plus, for both, bce_weight (1/B) sum_r BCE(y2, s)              (logits; stable form)
 * A streaming head's budget is never used by the selector, so it does not train the regressions.
 * Determinism: every random draw comes from one xoshiro stream seeded with p->seed (He init,
 * split, per-epoch shuffles); the result is bit-identical for a seed as long as the BLAS uses the
 * same thread count (OPENBLAS_NUM_THREADS; its GEMM partitioning depends on it). The last epoch is
 * kept. The reported metrics come from flx_predictor_evaluate on the test rows, i.e. from the same
 * inference code the decode node runs.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/predictor.h"
#include "flx/progress.h"
#include "flx/util.h"
#include "train_internal.h"

void flx_train_defaults(flx_train_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->epochs = 60;
    p->batch = 256;
    p->lr = 1e-3f;
    p->weight_decay = 0.0f;
    p->test_frac = 0.2f;
    p->bce_weight = 1.0f;
    p->seed = 1;
    p->loss = FLX_TRAIN_LOSS_LOG_BUDGET;
    p->quantile = 0.9f;
}

#define NL 4
static const int DIN[NL] = {FLX_PRED_IN, FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3};
static const int DOUT[NL] = {FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3, FLX_PRED_OUT};

typedef struct train_ws {
    float *act[NL + 1];   /* act[0] = x (B, 41); act[l+1] = layer l output (B, DOUT[l]), post-ReLU */
    float *dact[NL + 1];  /* gradients w.r.t. pre-activations of layer l output, (B, DOUT[l]) */
    float *grad, *adam_m, *adam_v; /* (n_params) flat, layout of flx_mlp_alloc */
} train_ws_t;

static void param_ptrs(float *base, float *w[NL], float *b[NL])
{
    float *p = base;
    for (int l = 0; l < NL; l++) {
        w[l] = p;
        p += (size_t)DOUT[l] * DIN[l];
        b[l] = p;
        p += DOUT[l];
    }
}

static void forward(float *params, train_ws_t *ws, int B)
{
    float *w[NL], *b[NL];
    param_ptrs(params, w, b);
    for (int l = 0; l < NL; l++) {
        float *y = ws->act[l + 1];
        for (int r = 0; r < B; r++) memcpy(y + (size_t)r * DOUT[l], b[l], DOUT[l] * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, DOUT[l], DIN[l], 1.0f, ws->act[l], DIN[l], w[l],
                    DIN[l], 1.0f, y, DOUT[l]);
        if (l < NL - 1)
            for (size_t i = 0; i < (size_t)B * DOUT[l]; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    }
}

/* Writes dY into ws->dact[NL] and returns the batch loss (DESIGN); b: the batch's targets. */
static double loss_grad(const flx_mlp_t *m, const float *y, const flx_train_batch_t *b, flx_train_loss_t kind,
                        float bce_w, double q, float *dy)
{
    const int B = b->n;
    int R = 0;
    for (int r = 0; r < B; r++) R += b->s[r] < 0.5f;
    double loss = 0.0;
    for (int r = 0; r < B; r++) {
        const float *yr = y + (size_t)r * 3;
        float *d = dy + (size_t)r * 3;
        d[0] = d[1] = 0.0f;
        if (b->s[r] < 0.5f && kind == FLX_TRAIN_LOSS_MSE) {
            float e0 = yr[0] - b->tgt[2 * r], e1 = yr[1] - b->tgt[2 * r + 1];
            loss += 0.5 * ((double)e0 * e0 + (double)e1 * e1) / R;
            d[0] = e0 / (float)R;
            d[1] = e1 / (float)R;
        } else if (b->s[r] < 0.5f) {
            const double eps = b->eps[r];
            const double t0 = (double)yr[0] * m->target_std[0] + m->target_mean[0];
            const double t1 = (double)yr[1] * m->target_std[1] + m->target_mean[1];
            const double b16 = flx_pred_end(t0), b128 = flx_pred_end(t1);
            double g0 = 0.0, g1 = 0.0;
            for (int j = 0; j < 4; j++) {
                if (!(b->bud[4 * r + j] > 0.0f)) continue;   /* not a retrieval head's budget: no log */
                const double w = j / 3.0, line = (1.0 - w) * b16 + w * b128, lab = fmax(b->bud[4 * r + j], eps);
                double e = log(lab) - log(line);   /* > 0: the line is short of the least budget */
                loss += 0.25 * (e > 0.0 ? q * e : (q - 1.0) * e) / R;
                double de = e > 0.0 ? -q : 1.0 - q;   /* d loss / d ln line */
                g0 += 0.25 * de * (1.0 - w) * b16 / line / R;
                g1 += 0.25 * de * w * b128 / line / R;
            }
            /* the clamp of the ends passes no gradient (unreached in training: targets are ln budgets <= 0) */
            d[0] = t0 >= FLX_PRED_LN_MIN && t0 <= FLX_PRED_LN_MAX ? (float)(g0 * m->target_std[0]) : 0.0f;
            d[1] = t1 >= FLX_PRED_LN_MIN && t1 <= FLX_PRED_LN_MAX ? (float)(g1 * m->target_std[1]) : 0.0f;
        }
        float z = yr[2];
        /* BCE(z, s) = max(z, 0) - z s + log(1 + e^-|z|) */
        loss += bce_w * (fmax(z, 0.0) - (double)z * b->s[r] + log1p(exp(-fabs((double)z)))) / B;
        float sig = z >= 0.0f ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
        d[2] = bce_w * (sig - b->s[r]) / (float)B;
    }
    return loss;
}

static void backward(float *params, train_ws_t *ws, int B)
{
    float *w[NL], *b[NL], *gw[NL], *gb[NL];
    param_ptrs(params, w, b);
    param_ptrs(ws->grad, gw, gb);
    for (int l = NL - 1; l >= 0; l--) {
        float *dz = ws->dact[l + 1];
        /* dW = dZ^T X, db = column sums of dZ */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, DOUT[l], DIN[l], B, 1.0f, dz, DOUT[l], ws->act[l],
                    DIN[l], 0.0f, gw[l], DIN[l]);
        for (int o = 0; o < DOUT[l]; o++) {
            float sum = 0.0f;
            for (int r = 0; r < B; r++) sum += dz[(size_t)r * DOUT[l] + o];
            gb[l][o] = sum;
        }
        if (l == 0) break;
        float *dx = ws->dact[l];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, DIN[l], DOUT[l], 1.0f, dz, DOUT[l], w[l], DIN[l],
                    0.0f, dx, DIN[l]);
        const float *a = ws->act[l];   /* post-ReLU output of layer l-1: the ReLU mask */
        for (size_t i = 0; i < (size_t)B * DIN[l]; i++)
            if (a[i] <= 0.0f) dx[i] = 0.0f;
    }
}

static void shuffle(uint32_t *idx, uint32_t n, flx_rng_t *rng)
{
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)flx_rng_below(rng, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* Mean and spread of x[row * stride] over rows (NULL: rows 0 .. n-1). */
static void mean_std(const float *x, size_t stride, const uint32_t *rows, uint32_t n, float *mean, float *std)
{
    double s = 0, s2 = 0;
    for (uint32_t i = 0; i < n; i++) s += x[(size_t)(rows ? rows[i] : i) * stride];
    double mu = n ? s / n : 0.0;
    for (uint32_t i = 0; i < n; i++) {
        double d = x[(size_t)(rows ? rows[i] : i) * stride] - mu;
        s2 += d * d;
    }
    double sd = n ? sqrt(s2 / n) : 0.0;
    *mean = (float)mu;
    *std = sd > 1e-6 * fmax(1.0, fabs(mu)) ? (float)sd : 1.0f;   /* constant feature: std 1 */
}

/* One minibatch: loss and gradient (train_internal.h; the gradient check in test_train). */
flx_status_t flx_train_batch_loss(const flx_mlp_t *m, const flx_train_batch_t *b, const flx_train_params_t *p,
                                  float *grad, double *loss)
{
    const flx_pred_outputs_t want = p->loss == FLX_TRAIN_LOSS_MSE ? FLX_PRED_OUT_LINE : FLX_PRED_OUT_LOG_ENDS;
    if (m->outputs != want)
        return flx_error_set(FLX_ERR_INVALID, "batch loss: loss %d trains the %s output map, m has map %d",
                             (int)p->loss, flx_pred_outputs_name(want), (int)m->outputs);
    train_ws_t ws;
    memset(&ws, 0, sizeof ws);
    flx_status_t st = FLX_OK;
    const int B = b->n;
    for (int l = 0; l <= NL; l++) {
        int w = l == 0 ? FLX_PRED_IN : DOUT[l - 1];
        ws.act[l] = malloc((size_t)B * w * sizeof(float));
        ws.dact[l] = malloc((size_t)B * w * sizeof(float));
        if (!ws.act[l] || !ws.dact[l]) st = flx_error_set(FLX_ERR_NOMEM, "batch loss: %d rows", B);
    }
    if (!st) {
        memcpy(ws.act[0], b->x, (size_t)B * FLX_PRED_IN * sizeof(float));
        ws.grad = grad;
        forward(m->w1, &ws, B);
        *loss = loss_grad(m, ws.act[NL], b, p->loss, p->bce_weight, p->quantile, ws.dact[NL]);
        backward(m->w1, &ws, B);
    }
    for (int l = 0; l <= NL; l++) {
        free(ws.act[l]);
        free(ws.dact[l]);
    }
    return st;
}

flx_status_t flx_train(const flx_dataset_t *d, const flx_train_params_t *p, flx_mlp_t *m, flx_train_report_t *rep)
{
    if (!d || !p || !m || !m->w1 || !rep) return flx_error_set(FLX_ERR_INVALID, "train: NULL argument");
    if (p->epochs == 0 || p->batch == 0 || !(p->lr > 0.0f) || !isfinite(p->lr) || !(p->test_frac >= 0.0f) ||
        !(p->test_frac < 1.0f) || !(p->bce_weight >= 0.0f) || !isfinite(p->bce_weight) ||
        !(p->weight_decay >= 0.0f) || !isfinite(p->weight_decay) ||
        (p->loss != FLX_TRAIN_LOSS_LOG_BUDGET && p->loss != FLX_TRAIN_LOSS_MSE) || !(p->quantile > 0.0f) ||
        !(p->quantile < 1.0f))
        return flx_error_set(FLX_ERR_INVALID,
                             "train: epochs %u batch %u lr %g test_frac %g bce_weight %g wd %g loss %d quantile %g",
                             p->epochs, p->batch, (double)p->lr, (double)p->test_frac, (double)p->bce_weight,
                             (double)p->weight_decay, (int)p->loss, (double)p->quantile);
    uint32_t n_test = (uint32_t)floor((double)d->n * p->test_frac + 0.5);
    uint32_t n_train = d->n - n_test;
    if (n_train == 0) return flx_error_set(FLX_ERR_INVALID, "train: %u rows leave no training row", d->n);

    const size_t np = flx_mlp_param_count();
    const int B = (int)(p->batch < n_train ? p->batch : n_train);
    flx_status_t st = FLX_OK;
    train_ws_t ws;
    memset(&ws, 0, sizeof ws);
    uint32_t *idx = malloc((size_t)d->n * sizeof *idx);
    float *tgt = malloc((size_t)B * 2 * sizeof(float)), *sv = malloc((size_t)B * sizeof(float));
    float *bud = malloc((size_t)B * 4 * sizeof(float)), *beps = malloc((size_t)B * sizeof(float));
    int ok = idx && tgt && sv && bud && beps;
    for (int l = 0; l <= NL; l++) {
        int w = l == 0 ? FLX_PRED_IN : DOUT[l - 1];
        ws.act[l] = malloc((size_t)B * w * sizeof(float));
        ws.dact[l] = malloc((size_t)B * w * sizeof(float));
        ok = ok && ws.act[l] && ws.dact[l];
    }
    ws.grad = calloc(np, sizeof(float));
    ws.adam_m = calloc(np, sizeof(float));
    ws.adam_v = calloc(np, sizeof(float));
    flx_predictor_h pred = NULL;
    if (!ok || !ws.grad || !ws.adam_m || !ws.adam_v) {
        st = flx_error_set(FLX_ERR_NOMEM, "train: workspace for batch %d", B);
        goto out;
    }

    flx_rng_t rng;
    flx_rng_seed(&rng, p->seed);
    for (uint32_t i = 0; i < d->n; i++) idx[i] = i;
    shuffle(idx, d->n, &rng);
    uint32_t *test = idx, *train = idx + n_test;

    /* standardization from the training rows */
    for (int f = 0; f < FLX_PRED_IN; f++)
        mean_std(d->features + f, FLX_PRED_IN, train, n_train, &m->feature_mean[f], &m->feature_std[f]);
    uint32_t *ret = malloc((size_t)n_train * sizeof *ret), n_ret = 0;
    if (!ret) {
        st = flx_error_set(FLX_ERR_NOMEM, "train: %u rows", n_train);
        goto out;
    }
    for (uint32_t i = 0; i < n_train; i++)
        if (d->labels[(size_t)train[i] * 3 + 2] < 0.5f) ret[n_ret++] = train[i];
    m->outputs = p->loss == FLX_TRAIN_LOSS_MSE ? FLX_PRED_OUT_LINE : FLX_PRED_OUT_LOG_ENDS;
    if (m->outputs == FLX_PRED_OUT_LINE) {
        for (int t = 0; t < 2; t++) mean_std(d->labels + t, 3, ret, n_ret, &m->target_mean[t], &m->target_std[t]);
    } else {
        float *lnb = malloc((size_t)n_ret * 2 * sizeof *lnb);
        uint32_t n_pos = 0;
        if (!lnb) st = flx_error_set(FLX_ERR_NOMEM, "train: %u rows", n_ret);
        for (uint32_t i = 0; !st && i < n_ret; i++) {
            const float *bg = d->bgt + (size_t)ret[i] * 5;
            const double eps = 0.5 / fmax(d->features[(size_t)ret[i] * FLX_PRED_IN + FLX_F_L_CPU], 1.0);
            if (!(bg[1] > 0.0f) || !(bg[4] > 0.0f)) continue;
            lnb[2 * n_pos] = (float)log(fmax(bg[1], eps));
            lnb[2 * n_pos + 1] = (float)log(fmax(bg[4], eps));
            n_pos++;
        }
        for (int t = 0; !st && t < 2; t++) mean_std(lnb + t, 2, NULL, n_pos, &m->target_mean[t], &m->target_std[t]);
        free(lnb);
    }
    free(ret);
    if (st) goto out;

    /* He init */
    float *params = m->w1, *w[NL], *b[NL];
    param_ptrs(params, w, b);
    for (int l = 0; l < NL; l++) {
        double sc = sqrt(2.0 / DIN[l]);
        for (size_t i = 0; i < (size_t)DOUT[l] * DIN[l]; i++) w[l][i] = (float)(sc * flx_rng_normal(&rng));
        memset(b[l], 0, DOUT[l] * sizeof(float));
    }

    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    uint64_t step = 0;
    double epoch_loss = 0.0;
    for (uint32_t ep = 0; ep < p->epochs; ep++) {
        shuffle(train, n_train, &rng);
        epoch_loss = 0.0;
        uint32_t n_batches = 0;
        for (uint32_t s0 = 0; s0 < n_train; s0 += (uint32_t)B) {
            int nb = (int)(n_train - s0 < (uint32_t)B ? n_train - s0 : (uint32_t)B);
            for (int r = 0; r < nb; r++) {
                uint32_t row = train[s0 + r];
                const float *f = d->features + (size_t)row * FLX_PRED_IN;
                for (int i = 0; i < FLX_PRED_IN; i++)
                    ws.act[0][(size_t)r * FLX_PRED_IN + i] = (f[i] - m->feature_mean[i]) / m->feature_std[i];
                const float *lab = d->labels + (size_t)row * 3;
                tgt[2 * r] = (lab[0] - m->target_mean[0]) / m->target_std[0];
                tgt[2 * r + 1] = (lab[1] - m->target_mean[1]) / m->target_std[1];
                sv[r] = lab[2];
                memcpy(bud + 4 * r, d->bgt + (size_t)row * 5 + 1, 4 * sizeof(float));
                beps[r] = 0.5f / fmaxf(f[FLX_F_L_CPU], 1.0f);
            }
            forward(params, &ws, nb);
            const flx_train_batch_t batch = {.x = ws.act[0], .tgt = tgt, .bud = bud, .eps = beps, .s = sv, .n = nb};
            epoch_loss += loss_grad(m, ws.act[NL], &batch, p->loss, p->bce_weight, p->quantile, ws.dact[NL]);
            n_batches++;
            backward(params, &ws, nb);
            step++;
            double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
            float *gw[NL], *gb[NL];
            param_ptrs(ws.grad, gw, gb);
            if (p->weight_decay > 0.0f)
                for (int l = 0; l < NL; l++)
                    for (size_t i = 0; i < (size_t)DOUT[l] * DIN[l]; i++) gw[l][i] += p->weight_decay * w[l][i];
            for (size_t i = 0; i < np; i++) {
                float g = ws.grad[i];
                ws.adam_m[i] = (float)(b1 * ws.adam_m[i] + (1.0 - b1) * g);
                ws.adam_v[i] = (float)(b2 * ws.adam_v[i] + (1.0 - b2) * (double)g * g);
                params[i] -= (float)(p->lr * (ws.adam_m[i] / c1) / (sqrt(ws.adam_v[i] / c2) + eps));
            }
        }
        epoch_loss /= n_batches;
        if (!isfinite(epoch_loss)) {
            st = flx_error_set(FLX_ERR_INVALID, "train: loss diverged at epoch %u (lr %g)", ep, (double)p->lr);
            goto out;
        }
        if (p->verbose) fprintf(stderr, "epoch %u: train loss %.5f\n", ep + 1, epoch_loss);
        flx_progress_report("training", ep + 1, p->epochs, "epochs");
    }

    flx_eval_t ev = {0};
    if ((st = flx_predictor_create(m, &pred))) goto out;
    if (n_test && (st = flx_predictor_evaluate(pred, d, test, n_test, &ev))) goto out;
    memset(rep, 0, sizeof *rep);
    rep->n_train = n_train;
    rep->n_test = n_test;
    rep->test_mae_bgt0 = n_test ? ev.mae_bgt0 : NAN;
    rep->test_mae_k = n_test ? ev.mae_k : NAN;
    rep->test_mae_bgt16 = n_test ? ev.mae_bgt16 : NAN;
    rep->stream_precision = n_test ? ev.stream_precision : NAN;
    rep->stream_recall = n_test ? ev.stream_recall : NAN;
    rep->train_loss = (float)epoch_loss;
out:
    flx_predictor_destroy(pred);
    for (int l = 0; l <= NL; l++) {
        free(ws.act[l]);
        free(ws.dact[l]);
    }
    free(ws.grad);
    free(ws.adam_m);
    free(ws.adam_v);
    free(idx);
    free(tgt);
    free(sv);
    free(bud);
    free(beps);
    return st;
}
