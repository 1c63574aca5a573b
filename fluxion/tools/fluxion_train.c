/*
 * fluxion-train / fluxion-predict - train the head-property predictor on label datasets, and
 * evaluate shipped weights on held-out data (one source file, two programs: FLX_PREDICT_TOOL).
 *
 * usage: fluxion-train --data FILE [--data FILE ...] -o WEIGHTS [--calib FILE ...] [--epochs N]
 *                      [--batch N] [--lr X] [-s N] [--test-frac X] [--bce-weight X]
 *                      [--weight-decay X] [--loss log-budget|mse] [--quantile Q] [--source TEXT]
 *                      [--verbose]
 *        fluxion-predict --weights WEIGHTS --data FILE [--data FILE ...]
 * Datasets are concatenated (same tau and criterion required). fluxion-train prints its report, one
 * "key value" line per metric, and writes WEIGHTS with the datasets' tau and criterion; MAEs are over
 * the retrieval rows of the held-out split. With --calib (label files never trained on, of one model
 * shape) it also calibrates the selector's operating point (flx_select_calibrate) and stores it in
 * WEIGHTS; without, WEIGHTS carry the paper's rule. fluxion-predict prints the same metrics over
 * every row and, when the files carry their shape, the selector estimate at the weights' operating
 * point and at the paper's rule. Both print the estimate at the chosen (weights') point per prompt
 * length too (calib_len32K_within ..., select_len32K_within ...): one point serves every length,
 * and how its within share and volume split over the lengths is what a node serving some of them
 * wants to know.
 * Deterministic for a seed and OPENBLAS_NUM_THREADS.
 * Exit status (flx/cli.h): 0 ok, 1 a runtime failure (an input file, memory), 2 a usage error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/predictor.h"
#include "flx/util.h"

#define MAX_DATA 64

/* The selector's estimate at sp per prompt length, one band per power of two of l_cpu
 * ([2^k / sqrt 2, 2^k sqrt 2), the first from 0): PREFIX_len32K_within, _within_baseline,
 * _bytes_ratio and _heads, for the bands that hold rows. */
static flx_status_t print_lengths(const char *prefix, flx_predictor_h p, const flx_dataset_t *d,
                                  const flx_select_params_t *sp)
{
    enum { BANDS = 22 };   /* 1 .. 2M tokens */
    uint32_t edges[BANDS + 1];
    for (int k = 0; k <= BANDS; k++) edges[k] = k ? (uint32_t)ceil(ldexp(M_SQRT1_2, k)) : 0;
    flx_select_estimate_t e[BANDS];
    flx_status_t st = flx_select_estimate_lengths(p, d, sp, edges, BANDS, e);
    for (int k = 0; !st && k < BANDS; k++) {
        if (!e[k].n_heads) continue;
        char band[24];
        snprintf(band, sizeof band, k < 10 ? "%u" : "%uK", k < 10 ? 1u << k : 1u << (k - 10));
        printf("%s_len%s_heads %u\n%s_len%s_within %.6g\n%s_len%s_within_baseline %.6g\n%s_len%s_bytes_ratio %.6g\n",
               prefix, band, e[k].n_heads, prefix, band, (double)e[k].within, prefix, band, (double)e[k].within_baseline,
               prefix, band, (double)e[k].bytes_ratio);
    }
    return st;
}

#ifndef FLX_PREDICT_TOOL
/* Calibrates m->select on the label files calib (labelled like the training rows), prints the
 * outcome and the paper's rule on the same rows. */
static flx_status_t calibrate(flx_mlp_t *m, const flx_dataset_t *train, const char *const *calib, uint32_t n_calib)
{
    flx_dataset_t c;
    memset(&c, 0, sizeof c);
    flx_predictor_h p = NULL;
    flx_status_t st = FLX_OK;
    for (uint32_t i = 0; i < n_calib && !st; i++) st = flx_dataset_load_append(&c, calib[i]);
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
        st = print_lengths("calib", p, &c, &sp);
    }
    flx_predictor_destroy(p);
    flx_dataset_free(&c);
    return st;
}
#endif

int main(int argc, char **argv)
{
    const char *data[MAX_DATA], *out = NULL, *weights = NULL;
    uint32_t n_data = 0;
#ifdef FLX_PREDICT_TOOL
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH(0, "weights", "WEIGHTS", &weights, FLX_CLI_REQUIRED, "predictor weights (safetensors)"),
        FLX_CLI_LIST(0, "data", "FILE", data, MAX_DATA, &n_data, FLX_CLI_REQUIRED, "dataset file (fluxion-label)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("fluxion-predict", "A predictor's weights on dataset files: MAE, streaming "
                                 "precision/recall and the selector's estimate, one \"key value\" line each.", opts);
#else
    static const char *const losses[] = {"log-budget", "mse", NULL};
    const char *calib[MAX_DATA], *source = NULL;
    uint32_t n_calib = 0;
    flx_train_params_t tp;
    flx_train_defaults(&tp);
    uint64_t epochs = tp.epochs, batch = tp.batch, seed = tp.seed;
    double lr = tp.lr, test_frac = tp.test_frac, bce = tp.bce_weight, wd = tp.weight_decay, quantile = tp.quantile;
    int loss_i = 0, verbose = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_LIST(0, "data", "FILE", data, MAX_DATA, &n_data, FLX_CLI_REQUIRED, "dataset file to train on"),
        FLX_CLI_PATH('o', "out", "WEIGHTS", &out, FLX_CLI_REQUIRED, "the weights file to write"),
        FLX_CLI_LIST(0, "calib", "FILE", calib, MAX_DATA, &n_calib, 0,
                     "held-out dataset to calibrate the selector's operating point on"),
        FLX_CLI_UINT(0, "epochs", "N", &epochs, 1, 100000, 0, "passes over the training rows (default 60)"),
        FLX_CLI_UINT(0, "batch", "N", &batch, 1, 1u << 20, 0, "rows per step (default 256)"),
        FLX_CLI_FLOAT(0, "lr", "X", &lr, 1e-9, 10.0, 0, "Adam learning rate (default 0.001)"),
        FLX_CLI_UINT('s', "seed", "S", &seed, 0, UINT64_MAX, 0, "initialisation, split and shuffle seed (default 1)"),
        FLX_CLI_FLOAT(0, "test-frac", "X", &test_frac, 0.0, 0.99, 0, "held-out share of the rows (default 0.2)"),
        FLX_CLI_FLOAT(0, "bce-weight", "X", &bce, 0.0, 1e6, 0, "weight of the streaming loss (default 1)"),
        FLX_CLI_FLOAT(0, "weight-decay", "X", &wd, 0.0, 10.0, 0, "L2 weight decay (default 0)"),
        FLX_CLI_ENUM(0, "loss", &loss_i, losses, 0, "budget loss (default log-budget)"),
        FLX_CLI_FLOAT(0, "quantile", "Q", &quantile, 0.01, 0.99, 0,
                      "log-budget: the pinball loss's quantile (default 0.9)"),
        FLX_CLI_STR(0, "source", "TEXT", &source, 0, "the weights' \"source\" metadata (default: the datasets')"),
        FLX_CLI_FLAG(0, "verbose", &verbose, "one line per epoch on stderr"),
    };
    flx_cli_t cli = FLX_CLI_INIT("fluxion-train", "Trains the head-property predictor on dataset files and, with "
                                 "--calib, calibrates the selector's operating point.", opts);
#endif
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
#ifndef FLX_PREDICT_TOOL
    if (flx_cli_applies(&cli, loss_i == 0, "with --loss mse (only with --loss log-budget)", "quantile", NULL))
        return flx_cli_usage_error(&cli, NULL);
    tp.epochs = (uint32_t)epochs, tp.batch = (uint32_t)batch, tp.seed = seed;
    tp.lr = (float)lr, tp.test_frac = (float)test_frac, tp.bce_weight = (float)bce, tp.weight_decay = (float)wd;
    tp.quantile = (float)quantile, tp.verbose = verbose;
    tp.loss = loss_i == 0 ? FLX_TRAIN_LOSS_LOG_BUDGET : FLX_TRAIN_LOSS_MSE;
#endif
    (void)out, (void)weights;

    flx_dataset_t d;
    memset(&d, 0, sizeof d);
    flx_status_t st = FLX_OK;
    for (uint32_t i = 0; i < n_data && !st; i++) st = flx_dataset_load_append(&d, data[i]);
    if (st) {
        flx_dataset_free(&d);
        return flx_cli_fail(&cli, "--data: %s", flx_error_msg());
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
        if (!st) st = print_lengths("select", p, &d, &sp[0]);
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
    if (st) return flx_cli_fail(&cli, "%s", flx_error_msg());
    return 0;
}
