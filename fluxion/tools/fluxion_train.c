/*
 * fluxion-train / fluxion-predict - train the head-property predictor on label datasets, and
 * evaluate shipped weights on held-out data (one source file, two programs: FLX_PREDICT_TOOL).
 *
 * usage: fluxion-train --data FILE [--data FILE ...] --out WEIGHTS [--calib FILE ...] [--epochs N]
 *                      [--batch N] [--lr X] [--seed N] [--test-frac X] [--bce-weight X]
 *                      [--weight-decay X] [--loss log-budget|mse] [--quantile Q] [--source TEXT]
 *                      [--verbose]
 *        fluxion-predict --weights WEIGHTS --data FILE [--data FILE ...]
 * Datasets are concatenated (same tau and criterion required). fluxion-train prints its report, one
 * "key value" line per metric, and writes WEIGHTS with the datasets' tau and criterion; MAEs are over
 * the retrieval rows of the held-out split. With --calib (label files never trained on, of one model
 * shape) it also calibrates the selector's operating point (flx_select_calibrate) and stores it in
 * WEIGHTS; without, WEIGHTS carry the paper's rule. fluxion-predict prints the same metrics over
 * every row and, when the files carry their shape, the selector estimate at the weights' operating
 * point and at the paper's rule.
 * Deterministic for a seed and OPENBLAS_NUM_THREADS.
 * Exit status: 0 ok, 2 bad arguments, 1 other failures (an input file that cannot be read or used
 * included).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/predictor.h"
#include "flx/util.h"

#define MAX_DATA 64

__attribute__((unused)) static int parse_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "%s: \"%s\" is not a number in [%g, %g]\n", flag, s ? s : "", lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

__attribute__((unused)) static int parse_u(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!s || flx_parse_u64(s, lo, hi, out) != FLX_OK) {
        fprintf(stderr, "%s: \"%s\" is not an integer in [%llu, %llu]\n", flag, s ? s : "", (unsigned long long)lo,
                (unsigned long long)hi);
        return 0;
    }
    return 1;
}

#ifndef FLX_PREDICT_TOOL
/* Calibrates m->select on the label files calib (labelled like the training rows), prints the
 * outcome and the paper's rule on the same rows. */
static flx_status_t calibrate(flx_mlp_t *m, const flx_dataset_t *train, const char *const *calib, int n_calib)
{
    flx_dataset_t c;
    memset(&c, 0, sizeof c);
    flx_predictor_h p = NULL;
    flx_status_t st = FLX_OK;
    for (int i = 0; i < n_calib && !st; i++) st = flx_dataset_load_append(&c, calib[i]);
    if (!st && (c.tau != train->tau || strcmp(c.criterion, train->criterion) != 0))
        st = flx_error_set(FLX_ERR_INVALID, "--calib rows were labelled with tau %g criterion \"%s\", the training rows "
                           "with tau %g \"%s\"", (double)c.tau, c.criterion, (double)train->tau, train->criterion);
    if (!st) st = flx_predictor_create(m, &p);
    flx_select_params_t sp;
    flx_select_estimate_t e, e0;
    const flx_select_params_t paper = flx_select_params_paper();
    if (!st) st = flx_select_calibrate(p, &c, &sp, &e);
    if (!st) st = flx_select_estimate(p, &c, &paper, &e0);
    if (!st) {
        m->select = sp;
        printf("calib_rows %u\ncalib_stream_threshold %g\ncalib_budget_scale %g\ncalib_min_blocks %u\n", c.n,
               (double)sp.stream_threshold, (double)sp.budget_scale, sp.min_blocks);
        printf("calib_within %.6g\ncalib_within_baseline %.6g\ncalib_bytes_ratio %.6g\n", (double)e.within,
               (double)e.within_baseline, (double)e.bytes_ratio);
        printf("calib_paper_within %.6g\ncalib_paper_bytes_ratio %.6g\n", (double)e0.within, (double)e0.bytes_ratio);
    }
    flx_predictor_destroy(p);
    flx_dataset_free(&c);
    return st;
}
#endif

static void usage(void)
{
#ifdef FLX_PREDICT_TOOL
    fprintf(stderr, "usage: fluxion-predict --weights WEIGHTS --data FILE [--data FILE ...]\n");
#else
    fprintf(stderr, "usage: fluxion-train --data FILE [--data FILE ...] --out WEIGHTS [--calib FILE ...] [--epochs N] "
                    "[--batch N] [--lr X] [--seed N] [--test-frac X] [--bce-weight X] [--weight-decay X] "
                    "[--loss log-budget|mse] [--quantile Q] [--source TEXT] [--verbose]\n");
#endif
}

int main(int argc, char **argv)
{
    const char *data[MAX_DATA], *calib[MAX_DATA], *out = NULL, *weights = NULL, *source = NULL;
    int n_data = 0, n_calib = 0;
    flx_train_params_t tp;
    flx_train_defaults(&tp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u __attribute__((unused));
        int ok = 1, takes = 1;
        if (!strcmp(a, "--data")) {
            if (!v || n_data == MAX_DATA) ok = 0;
            else data[n_data++] = v;
        } else if (!strcmp(a, "--verbose")) {
            tp.verbose = 1;
            takes = 0;
#ifdef FLX_PREDICT_TOOL
        } else if (!strcmp(a, "--weights")) {
            ok = (weights = v) != NULL;
#else
        } else if (!strcmp(a, "--out")) {
            ok = (out = v) != NULL;
        } else if (!strcmp(a, "--calib")) {
            if (!v || n_calib == MAX_DATA) ok = 0;
            else calib[n_calib++] = v;
        } else if (!strcmp(a, "--source")) {
            ok = (source = v) != NULL;
        } else if (!strcmp(a, "--epochs")) {
            if ((ok = parse_u(a, v, 1, 100000, &u))) tp.epochs = (uint32_t)u;
        } else if (!strcmp(a, "--batch")) {
            if ((ok = parse_u(a, v, 1, 1u << 20, &u))) tp.batch = (uint32_t)u;
        } else if (!strcmp(a, "--seed")) {
            if ((ok = parse_u(a, v, 0, UINT64_MAX, &u))) tp.seed = u;
        } else if (!strcmp(a, "--lr")) {
            ok = parse_float(a, v, 1e-9, 10.0, &tp.lr);
        } else if (!strcmp(a, "--test-frac")) {
            ok = parse_float(a, v, 0.0, 0.99, &tp.test_frac);
        } else if (!strcmp(a, "--bce-weight")) {
            ok = parse_float(a, v, 0.0, 1e6, &tp.bce_weight);
        } else if (!strcmp(a, "--weight-decay")) {
            ok = parse_float(a, v, 0.0, 10.0, &tp.weight_decay);
        } else if (!strcmp(a, "--quantile")) {
            ok = parse_float(a, v, 0.01, 0.99, &tp.quantile);
        } else if (!strcmp(a, "--loss")) {
            if (v && !strcmp(v, "log-budget")) tp.loss = FLX_TRAIN_LOSS_LOG_BUDGET;
            else if (v && !strcmp(v, "mse")) tp.loss = FLX_TRAIN_LOSS_MSE;
            else {
                fprintf(stderr, "--loss: \"%s\" is not log-budget or mse\n", v ? v : "");
                ok = 0;
            }
#endif
        } else {
            fprintf(stderr, "unknown argument \"%s\"\n", a);
            ok = 0;
        }
        if (!ok) {
            usage();
            return 2;
        }
        i += takes;
    }
#ifdef FLX_PREDICT_TOOL
    if (!n_data || !weights) {
#else
    if (!n_data || !out) {
#endif
        usage();
        return 2;
    }
    (void)out, (void)weights, (void)source, (void)calib, (void)n_calib;

    flx_dataset_t d;
    memset(&d, 0, sizeof d);
    flx_status_t st = FLX_OK;
    for (int i = 0; i < n_data && !st; i++) st = flx_dataset_load_append(&d, data[i]);
    if (st) {
        fprintf(stderr, "error: %s\n", flx_error_msg());
        flx_dataset_free(&d);
        return 1; /* a file that cannot be read or used: a runtime failure, not a usage error */
    }
#ifdef FLX_PREDICT_TOOL
    flx_predictor_h p = NULL;
    uint32_t *rows = malloc((size_t)(d.n ? d.n : 1) * sizeof *rows);
    flx_eval_t ev;
    if (!rows) st = flx_error_set(FLX_ERR_NOMEM, "rows");
    for (uint32_t i = 0; !st && i < d.n; i++) rows[i] = i;
    if (!st) st = flx_predictor_load(weights, &p);
    if (!st) st = flx_predictor_evaluate(p, &d, rows, d.n, &ev);
    if (!st) {
        printf("rows %u\nretrieval_rows %u\n", ev.n_rows, ev.n_retrieval);
        printf("mae_bgt0 %.6g\nmae_k %.6g\nmae_bgt16 %.6g\n", (double)ev.mae_bgt0, (double)ev.mae_k,
               (double)ev.mae_bgt16);
        printf("stream_precision %.6g\nstream_recall %.6g\n", (double)ev.stream_precision, (double)ev.stream_recall);
    }
    if (!st && d.n_q_heads) {
        const flx_select_params_t sp[2] = {flx_predictor_select_params(p), flx_select_params_paper()};
        const char *name[2] = {"select", "select_paper"};
        for (int i = 0; i < 2 && !st; i++) {
            flx_select_estimate_t e;
            if (!(st = flx_select_estimate(p, &d, &sp[i], &e)))
                printf("%s_stream_threshold %g\n%s_budget_scale %g\n%s_min_blocks %u\n%s_within %.6g\n"
                       "%s_within_baseline %.6g\n%s_bytes_ratio %.6g\n", name[i], (double)sp[i].stream_threshold,
                       name[i], (double)sp[i].budget_scale, name[i], sp[i].min_blocks, name[i], (double)e.within,
                       name[i], (double)e.within_baseline, name[i], (double)e.bytes_ratio);
        }
    }
    free(rows);
    flx_predictor_destroy(p);
#else
    flx_mlp_t m;
    flx_train_report_t rep;
    st = flx_mlp_alloc(&m);
    if (!st) st = flx_train(&d, &tp, &m, &rep);
    if (!st && n_calib) st = calibrate(&m, &d, calib, n_calib);
    if (!st) st = flx_mlp_save(&m, out, source ? source : d.source, d.criterion, d.tau);
    if (!st) {
        printf("loss %s\noutputs %s\nn_train %u\nn_test %u\ntrain_loss %.6g\n",
               tp.loss == FLX_TRAIN_LOSS_MSE ? "mse" : "log-budget",
               flx_pred_outputs_name(m.outputs), rep.n_train, rep.n_test, (double)rep.train_loss);
        printf("test_mae_bgt0 %.6g\ntest_mae_k %.6g\ntest_mae_bgt16 %.6g\n", (double)rep.test_mae_bgt0,
               (double)rep.test_mae_k, (double)rep.test_mae_bgt16);
        printf("stream_precision %.6g\nstream_recall %.6g\n", (double)rep.stream_precision,
               (double)rep.stream_recall);
    }
    flx_mlp_free(&m);
#endif
    flx_dataset_free(&d);
    if (st) {
        fprintf(stderr, "error: %s\n", flx_error_msg());
        return 1;
    }
    return 0;
}
