/*
 * test_predictor_tools.c - fluxion-train and fluxion-predict end to end: a small synthetic dataset
 * is trained on, the weights load, fluxion-predict reports the same held-out metrics format, and
 * bad flags exit with 2 and bad files with 1.
 * argv[1] = fluxion-train, argv[2] = fluxion-predict, argv[3] = scratch directory.
 */
#include <string.h>
#include <sys/wait.h>

#include "flx/predictor.h"
#include "flx_test.h"

/* The word after `key` on its "key value" line of file ("" when absent). */
static void word_of(const char *path, const char *key, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    CHECK(f);
    char line[256], k[64], v[128];
    out[0] = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %127s", k, v) == 2 && !strcmp(k, key)) snprintf(out, cap, "%s", v);
    fclose(f);
}

/* Value of "key v" in file, NaN when absent or not a number. */
static double value_of(const char *path, const char *key)
{
    char w[128], *end;
    word_of(path, key, w, sizeof w);
    double v = strtod(w, &end);
    return w[0] && !*end ? v : NAN;
}

int main(int argc, char **argv)
{
    CHECK(argc == 4);
    const char *tr = argv[1], *pr = argv[2], *dir = argv[3];
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_predictor_tools"));
    flx_dataset_t d;
    memset(&d, 0, sizeof d);
    d.n = 2000;
    d.features = malloc((size_t)d.n * FLX_PRED_IN * 4);
    d.labels = malloc((size_t)d.n * 3 * 4);
    d.bgt = malloc((size_t)d.n * 5 * 4);
    d.where = calloc((size_t)d.n * 3, 4);
    CHECK(d.features && d.labels && d.bgt && d.where);
    for (uint32_t r = 0; r < d.n; r++) {
        float *f = d.features + (size_t)r * FLX_PRED_IN;
        for (int i = 0; i < FLX_PRED_IN; i++) f[i] = (float)flx_rng_normal(&rng);
        d.labels[r * 3] = 0.3f + 0.1f * f[0];
        d.labels[r * 3 + 1] = 0.02f + 0.01f * f[1];
        d.labels[r * 3 + 2] = f[2] > 1.0f;
        for (int j = 0; j < 5; j++) d.bgt[r * 5 + j] = d.labels[r * 3] + (j ? j + 3 : 0) * d.labels[r * 3 + 1];
        d.where[r * 3] = r / 4, d.where[r * 3 + 1] = r % 4;   /* blocks of 4 heads, 2 kv groups */
        f[FLX_F_L_CPU] = 4096.0f;
    }
    d.n_q_heads = 4, d.n_kv_heads = 2;
    d.tau = 0.05f;
    snprintf(d.criterion, sizeof d.criterion, "fluxion");
    snprintf(d.source, sizeof d.source, "tools test");
    char ds[512], w[512], out[512], cmd[4096];
    snprintf(ds, sizeof ds, "%s/tools_ds.safetensors", dir);
    snprintf(w, sizeof w, "%s/tools_w.safetensors", dir);
    snprintf(out, sizeof out, "%s/tools_out.txt", dir);
    CHECK_OK(flx_dataset_save(&d, ds));

    /* the log-budget loss (the default) runs, says so and writes the log-ends map; --loss mse
     * regresses the labels themselves (the line map) */
    char word[128];
    flx_mlp_t m;
    snprintf(cmd, sizeof cmd, "%s --data %s --out %s --epochs 2 --quantile 0.8 > %s", tr, ds, w, out);
    CHECK(flx_test_sh(cmd) == 0);
    word_of(out, "loss", word, sizeof word);
    CHECK(!strcmp(word, "log-budget") && isfinite(value_of(out, "test_mae_bgt16")));
    word_of(out, "outputs", word, sizeof word);
    CHECK(!strcmp(word, "log-ends"));
    CHECK_OK(flx_mlp_load(w, &m));
    CHECK(m.outputs == FLX_PRED_OUT_LOG_ENDS);
    flx_mlp_free(&m);
    snprintf(cmd, sizeof cmd, "%s --data %s --out %s --epochs 5 --batch 64 --seed 7 --test-frac 0.25 --loss mse > %s",
             tr, ds, w, out);
    CHECK(flx_test_sh(cmd) == 0);
    word_of(out, "loss", word, sizeof word);
    CHECK(!strcmp(word, "mse"));
    CHECK(value_of(out, "n_train") == 1500 && value_of(out, "n_test") == 500);
    double mae = value_of(out, "test_mae_bgt0");
    CHECK(isfinite(mae) && mae < 0.1);
    CHECK(isfinite(value_of(out, "stream_recall")));
    word_of(out, "outputs", word, sizeof word);
    CHECK(!strcmp(word, "line"));
    CHECK_OK(flx_mlp_load(w, &m));
    CHECK(m.outputs == FLX_PRED_OUT_LINE);
    flx_mlp_free(&m);

    snprintf(cmd, sizeof cmd, "%s --weights %s --data %s > %s", pr, w, ds, out);
    CHECK(flx_test_sh(cmd) == 0);
    CHECK(value_of(out, "rows") == 2000);
    CHECK(isfinite(value_of(out, "mae_bgt0")) && value_of(out, "mae_bgt0") < 0.1);
    /* without --calib the weights carry the paper's rule; both estimates are printed */
    CHECK(value_of(out, "select_stream_threshold") == 0.5 && value_of(out, "select_budget_scale") == 1.0);
    CHECK(value_of(out, "select_within") == value_of(out, "select_paper_within"));
    CHECK(isfinite(value_of(out, "select_bytes_ratio")) && value_of(out, "select_within_baseline") > 0.0);
    /* per length: every row's l_cpu is 4096, so the 4K band is all of them and no other is printed */
    CHECK(value_of(out, "select_len4K_heads") == 2000 && isnan(value_of(out, "select_len8K_heads")));
    CHECK(value_of(out, "select_len4K_within") == value_of(out, "select_within"));
    CHECK(value_of(out, "select_len4K_bytes_ratio") == value_of(out, "select_bytes_ratio"));

    /* --calib: the operating point is calibrated, printed, stored, and fluxion-predict reports it;
     * its within share reaches the baseline's or it is the fallback that does best */
    snprintf(cmd, sizeof cmd, "%s --data %s --calib %s --out %s --epochs 5 --batch 64 --seed 7 > %s", tr, ds, ds, w, out);
    CHECK(flx_test_sh(cmd) == 0);
    double thr = value_of(out, "calib_stream_threshold"), scale = value_of(out, "calib_budget_scale");
    double minb = value_of(out, "calib_min_blocks"), cw = value_of(out, "calib_within");
    CHECK(thr >= 0.5 && thr <= 1.0 && scale > 0.0 && scale <= 64.0 && minb >= 0 && isfinite(cw));
    double cwb = value_of(out, "calib_within_baseline"), cb = value_of(out, "calib_bytes_ratio");
    double pw = value_of(out, "calib_paper_within"), pb = value_of(out, "calib_paper_bytes_ratio");
    CHECK(value_of(out, "calib_len4K_within") == cw && value_of(out, "calib_len4K_within_baseline") == cwb);
    if (cw >= cwb)   /* reaches the baseline: no dearer than the paper's rule when that reaches it too */
        CHECK(pw < cwb || cb <= pb + 1e-6);
    else             /* the fallback: none reaches it, and none within the baseline's volume does better */
        CHECK(pw < cwb && (pb > 1.0 || cw >= pw));
    flx_predictor_h p;
    CHECK_OK(flx_predictor_load(w, &p));
    flx_select_params_t sp = flx_predictor_select_params(p);
    CHECK(sp.stream_threshold == (float)thr && sp.budget_scale == (float)scale && sp.min_blocks == (uint32_t)minb);
    flx_predictor_destroy(p);
    snprintf(cmd, sizeof cmd, "%s --weights %s --data %s > %s", pr, w, ds, out);
    CHECK(flx_test_sh(cmd) == 0);
    CHECK(fabs(value_of(out, "select_within") - cw) < 1e-5);
    /* calibration rows labelled under another tau are refused */
    d.tau = 0.1f;
    char ds2[600];
    snprintf(ds2, sizeof ds2, "%s/tools_ds_tau.safetensors", dir);
    CHECK_OK(flx_dataset_save(&d, ds2));
    snprintf(cmd, sizeof cmd, "%s --data %s --calib %s --out %s --epochs 1 2>/dev/null >/dev/null", tr, ds, ds2, w);
    CHECK(flx_test_sh(cmd) == 1);

    /* bad flags (exit 2) and files (exit 1) */
    const char *bad[] = {"--data %s --out %s --epochs 0", "--data %s --out %s --lr -1", "--data %s --out %s --lr x",
                         "--data %s --out %s --test-frac 1", "--data %s --out %s --batch 12a", "--data %s",
                         "--data %s --out %s --bogus", "--data %s --out %s --loss l2",
                         "--data %s --out %s --quantile 1", "--data %s --out %s --loss mse --quantile 0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[1100];
        snprintf(args, sizeof args, bad[i], ds, w);
        snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null >/dev/null", tr, args);
        CHECK(flx_test_sh(cmd) == 2);
    }
    snprintf(cmd, sizeof cmd, "%s --weights %s --data %s 2>/dev/null >/dev/null", pr, ds, ds); /* dataset as weights */
    CHECK(flx_test_sh(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s --weights %s --data %s/missing 2>/dev/null >/dev/null", pr, w, dir);
    CHECK(flx_test_sh(cmd) == 1);
    snprintf(cmd, sizeof cmd, "%s %s/missing --data %s --out %s 2>/dev/null >/dev/null", tr, dir, ds, w);   /* stray */
    CHECK(flx_test_sh(cmd) == 2);
    flx_dataset_free(&d);
    return 0;
}
