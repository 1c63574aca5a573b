/*
 * test_predictor.c - the fast predictor against flx_mlp_forward_ref at every ISA level the CPU has
 * (1, 3, 32, 100 rows, pools of 1 to 7 workers, and every row in ranges of 1 to 8 rows: the same
 * bits) for both output maps, weights file round trip, loader refusals, non-finite features, and
 * the timing of one layer (32 and 128 rows, one thread).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "flx/cpu.h"
#include "flx/predictor.h"
#include "flx/safetensors.h"
#include "flx_test.h"

static void random_mlp(flx_mlp_t *m, flx_rng_t *rng)
{
    CHECK_OK(flx_mlp_alloc(m));
    for (int i = 0; i < FLX_PRED_IN; i++) {
        m->feature_mean[i] = (float)(100.0 * flx_rng_normal(rng));
        m->feature_std[i] = (float)(0.5 + 50.0 * flx_rng_uniform(rng));
    }
    for (int i = 0; i < 2; i++) {
        m->target_mean[i] = (float)flx_rng_normal(rng);
        m->target_std[i] = (float)(0.1 + flx_rng_uniform(rng));
    }
    const uint32_t fan[4] = {FLX_PRED_IN, FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3};
    float *w[4] = {m->w1, m->w2, m->w3, m->w4}, *b[4] = {m->b1, m->b2, m->b3, m->b4};
    const uint32_t outs[4] = {FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3, FLX_PRED_OUT};
    for (int l = 0; l < 4; l++) {
        double sc = sqrt(2.0 / fan[l]);
        for (size_t i = 0; i < (size_t)outs[l] * fan[l]; i++) w[l][i] = (float)(sc * flx_rng_normal(rng));
        for (uint32_t i = 0; i < outs[l]; i++) b[l][i] = (float)(0.1 * flx_rng_normal(rng));
    }
}

static void random_feat(const flx_mlp_t *m, float *f, uint32_t n, flx_rng_t *rng)
{
    for (uint32_t r = 0; r < n; r++)
        for (int i = 0; i < FLX_PRED_IN; i++)
            f[(size_t)r * FLX_PRED_IN + i] = m->feature_mean[i] + m->feature_std[i] * (float)flx_rng_normal(rng);
}

static void check_fast_vs_ref(const flx_mlp_t *m, flx_predictor_h p, flx_rng_t *rng)
{
    static const uint32_t ROWS[4] = {1, 3, 32, 100};
    float feat[100 * FLX_PRED_IN];
    flx_head_pred_t got[100], ref[100];
    size_t sb = flx_predictor_scratch_bytes(100);
    void *scratch = malloc(sb);
    CHECK(scratch);
    for (int ri = 0; ri < 4; ri++) {
        uint32_t n = ROWS[ri];
        random_feat(m, feat, n, rng);
        /* the bf16 path against its own oracle (bf16 weights and hidden inputs, double sums): what
         * is left is fp32 summation and now and then an activation within 1e-7 of a bf16 rounding
         * midpoint that rounds to the other neighbour (a 2^-8 step in one input: up to about 1e-3
         * at the outputs of these random networks, seen at 9.1e-4); a packing or layout error
         * is off by the outputs' own size */
        const int bf = flx_predictor_bf16_hidden(p);
        if (bf) CHECK_OK(flx_mlp_forward_ref_bf16(m, feat, n, ref));
        else CHECK_OK(flx_mlp_forward_ref(m, feat, n, ref));
        flx_head_pred_t one[100];
        for (int wi = 0; wi < 4; wi++) {   /* pools of 1, 2, 3, 7 workers: the same bits */
            flx_pool_h pool = flx_test_pool(FLX_TEST_WORKERS[wi]);
            memset(got, 0xff, sizeof got);
            CHECK_OK(flx_predictor_run(p, feat, n, got, scratch, sb, pool));
            flx_pool_destroy(pool);
            char label[96];
            snprintf(label, sizeof label, "%s rows %u workers %u", flx_isa_name(flx_isa_active()), n,
                     FLX_TEST_WORKERS[wi]);
            if (bf) CHECK_CLOSE(label, (const float *)got, (const float *)ref, 3 * n, 3e-3, 2e-2);
            else CHECK_CLOSE(label, (const float *)got, (const float *)ref, 3 * n, 1e-4, 1e-3);
            if (bf && wi == 0) {   /* and how far bf16 moves the outputs from the fp32 network's (a
                                       * guard against gross errors: up to 0.018 over 25 seeds) */
                flx_head_pred_t ref32[100];
                CHECK_OK(flx_mlp_forward_ref(m, feat, n, ref32));
                strncat(label, " vs fp32", sizeof label - strlen(label) - 1);
                CHECK_CLOSE(label, (const float *)got, (const float *)ref32, 3 * n, 4e-2, 1e-1);
            }
            if (wi == 0) memcpy(one, got, n * sizeof *got);
            else CHECK_SAME(label, (const float *)got, (const float *)one, 3 * n);
        }
        /* a row's bits do not depend on the tile it lands in: flx_predictor_run put most rows in
         * full register tiles; ranges of 1 to 8 rows put them in every tail kernel too */
        memset(got, 0xff, sizeof got);
        flx_predictor_prefetch(NULL);   /* nothing */
        for (uint32_t r0 = 0, len = 1; r0 < n; r0 += len, len = len % 8 + 1) {
            flx_predictor_prefetch(p);   /* as a decode layer's waiting tile does: touches no result */
            CHECK_OK(flx_predictor_run_rows(p, feat, n, r0, r0 + len < n ? r0 + len : n, got, scratch, sb));
        }
        char label[96];
        snprintf(label, sizeof label, "%s rows %u in ranges of 1..8", flx_isa_name(flx_isa_active()), n);
        CHECK_SAME(label, (const float *)got, (const float *)one, 3 * n);
    }
    free(scratch);
}

/* check_fast_vs_ref at every ISA level the CPU has, back to the best after. */
static void check_every_isa(const flx_mlp_t *m, flx_predictor_h p, flx_rng_t *rng)
{
    flx_isa_t best = flx_isa_best();
    for (int lvl = FLX_ISA_SCALAR; lvl <= (int)best; lvl++) {
        flx_isa_force((flx_isa_t)lvl);
        check_fast_vs_ref(m, p, rng);
    }
    flx_isa_force(best);
}

static char tmpdir[256];

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

/* Saves m as tmpdir/name (path written to path) and loads it back into *back. */
static void save_load(const flx_mlp_t *m, const char *name, char *path, size_t cap, flx_mlp_t *back)
{
    path_of(path, cap, name);
    CHECK_OK(flx_mlp_save(m, path, "unit test", "fluxion", 0.05f));
    CHECK_OK(flx_mlp_load(path, back));
}

/* Writes the tensors of m as the loader expects, with one change, and checks the refusal names
 * `want`. mode: 0 drop tensor `name`, 1 add extra tensor, 2 write `name` as F16, 3 wrong shape of
 * `name`, 4 metadata format wrong, 5 metadata `name` set to meta_value. */
static const char *meta_value;
static void check_refusal(const flx_mlp_t *m, int mode, const char *name, const char *want)
{
    static const char *names[12] = {"feature_mean", "feature_std", "target_mean", "target_std",
                                    "backbone.0.weight", "backbone.0.bias", "backbone.1.weight", "backbone.1.bias",
                                    "backbone.2.weight", "backbone.2.bias", "head.weight", "head.bias"};
    const float *arr[12] = {m->feature_mean, m->feature_std, m->target_mean, m->target_std, m->w1, m->b1,
                            m->w2, m->b2, m->w3, m->b3, m->w4, m->b4};
    const int64_t shapes[12][2] = {{41, 0}, {41, 0}, {2, 0}, {2, 0}, {256, 41}, {256, 0},
                                   {256, 256}, {256, 0}, {128, 256}, {128, 0}, {3, 128}, {3, 0}};
    flx_st_writer_h w;
    CHECK_OK(flx_st_writer_create(&w));
    for (int i = 0; i < 12; i++) {
        int nd = shapes[i][1] ? 2 : 1;
        int64_t sh[2] = {shapes[i][0], shapes[i][1]};
        int hit = name && strcmp(names[i], name) == 0;
        if (hit && mode == 0) continue;
        if (hit && mode == 2) {
            uint16_t *h = calloc((size_t)sh[0] * (nd == 2 ? sh[1] : 1), 2);
            CHECK_OK(flx_st_writer_add(w, names[i], FLX_DT_F16, nd, sh, h));
            free(h);
            continue;
        }
        if (hit && mode == 3) sh[0] -= 1;
        CHECK_OK(flx_st_writer_add(w, names[i], FLX_DT_F32, nd, sh, arr[i]));
    }
    if (mode == 1) {
        int64_t sh[1] = {2};
        CHECK_OK(flx_st_writer_add(w, name, FLX_DT_F32, 1, sh, m->target_mean));
    }
    CHECK_OK(flx_st_writer_set_metadata(w, "format", mode == 4 ? "fluxion-dataset" : "fluxion-predictor"));
    CHECK_OK(flx_st_writer_set_metadata(w, "version", "1"));
    CHECK_OK(flx_st_writer_set_metadata(w, "features", "appendix-a-41"));
    if (mode == 5) CHECK_OK(flx_st_writer_set_metadata(w, name, meta_value));
    char path[300];
    path_of(path, sizeof path, "bad.safetensors");
    CHECK_OK(flx_st_writer_save(w, path));
    flx_st_writer_destroy(w);
    flx_mlp_t t;
    memset(&t, 0x5a, sizeof t);
    flx_status_t st = flx_mlp_load(path, &t);
    fprintf(stderr, "refusal mode %d (%s): %s\n", mode, name ? name : "-", flx_error_msg());
    CHECK(st < 0);
    CHECK(strstr(flx_error_msg(), want) != NULL);
    CHECK(t.w1 == (float *)(uintptr_t)0x5a5a5a5a5a5a5a5aull); /* out-param untouched */
    flx_predictor_h p = NULL;
    CHECK(flx_predictor_load(path, &p) < 0 && p == NULL);
}

static void check_bad_value(flx_mlp_t *m, float *slot, float v, const char *want)
{
    float old = *slot;
    *slot = v;
    char path[300];
    path_of(path, sizeof path, "badval.safetensors");
    CHECK_OK(flx_mlp_save(m, path, "test", "fluxion", 0.05f));
    *slot = old;
    flx_mlp_t t;
    flx_status_t st = flx_mlp_load(path, &t);
    fprintf(stderr, "bad value %g: %s\n", (double)v, flx_error_msg());
    CHECK(st < 0);
    CHECK(strstr(flx_error_msg(), want) != NULL);
}

static void bench(flx_predictor_h p, const flx_mlp_t *m, flx_rng_t *rng, uint32_t n, uint32_t nt)
{
    flx_pool_h pool = flx_test_pool(nt);
    float *feat = malloc((size_t)n * FLX_PRED_IN * sizeof(float));
    flx_head_pred_t *out = malloc(n * sizeof *out);
    size_t sb = flx_predictor_scratch_bytes(n);
    void *scratch = malloc(sb);
    CHECK(feat && out && scratch);
    random_feat(m, feat, n, rng);
    double best = 1e30;
    for (int it = 0; it < 200; it++) {
        uint64_t t0 = flx_now_ns();
        CHECK_OK(flx_predictor_run(p, feat, n, out, scratch, sb, pool));
        double us = (double)(flx_now_ns() - t0) / 1e3;
        if (us < best) best = us;
    }
    fprintf(stderr, "timing %s: %u rows, %u worker(s): best %.1f us (%.1f GFLOP/s)\n", flx_isa_name(flx_isa_active()),
            n, nt, best, 2.0 * (double)flx_mlp_param_count() * n / best / 1e3);
    flx_pool_destroy(pool);
    free(feat);
    free(out);
    free(scratch);
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_predictor"));
    CHECK(flx_mlp_param_count() == 109827);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flx_test_predictor.XXXXXX");
    CHECK(mkdtemp(tmpdir));

    flx_mlp_t m;
    random_mlp(&m, &rng);
    flx_predictor_h p;
    CHECK_OK(flx_predictor_create(&m, &p));
    flx_isa_t best = flx_isa_best();
    check_every_isa(&m, p, &rng);

    /* the log-ends output map: the ends ln bgt(16), ln bgt(128) become Eq. 1's line */
    {
        double bgt0, k;
        flx_pred_line(FLX_PRED_OUT_LOG_ENDS, log(0.01), log(0.04), &bgt0, &k);
        CHECK(fabs(k - 0.01) < 1e-12 && fabs(bgt0 + 0.03) < 1e-12);   /* 0.01 at blk 16, 0.04 at 128 */
        flx_pred_line(FLX_PRED_OUT_LOG_ENDS, 100.0, -100.0, &bgt0, &k);   /* clamped into [-30, 5] */
        CHECK(fabs(bgt0 + 4.0 * k - exp(FLX_PRED_LN_MAX)) < 1e-9 && fabs(bgt0 + 7.0 * k - exp(FLX_PRED_LN_MIN)) < 1e-9);
        flx_pred_line(FLX_PRED_OUT_LOG_ENDS, NAN, -3.0, &bgt0, &k);   /* NaN stays NaN: the selector reads all */
        CHECK(isnan(bgt0) && isnan(k));
        flx_pred_line(FLX_PRED_OUT_LINE, 0.2, -0.01, &bgt0, &k);
        CHECK(bgt0 == 0.2 && k == -0.01);
        flx_mlp_t ml;
        random_mlp(&ml, &rng);
        ml.outputs = FLX_PRED_OUT_LOG_ENDS;
        ml.target_mean[0] = -6.0f, ml.target_mean[1] = -4.0f;
        flx_predictor_h pl;
        CHECK_OK(flx_predictor_create(&ml, &pl));
        check_every_isa(&ml, pl, &rng);
        char lpath[300];
        flx_mlp_t back;
        save_load(&ml, "wl.safetensors", lpath, sizeof lpath, &back);
        CHECK(back.outputs == FLX_PRED_OUT_LOG_ENDS);
        flx_mlp_free(&back);
        ml.outputs = (flx_pred_outputs_t)5;
        CHECK_ST(flx_mlp_save(&ml, lpath, "unit test", "fluxion", 0.05f), FLX_ERR_INVALID);
        flx_predictor_destroy(pl);
        CHECK_ST(flx_predictor_create(&ml, &pl), FLX_ERR_INVALID);
        flx_mlp_free(&ml);
    }

    /* non-finite feature */
    {
        float feat[3 * FLX_PRED_IN];
        flx_head_pred_t out[3];
        random_feat(&m, feat, 3, &rng);
        feat[2 * FLX_PRED_IN + 7] = NAN;
        size_t sb = flx_predictor_scratch_bytes(3);
        void *s = malloc(sb);
        CHECK_ST(flx_predictor_run(p, feat, 3, out, s, sb, NULL), FLX_ERR_INVALID);
        CHECK(strstr(flx_error_msg(), "row 2 feature 7") != NULL);
        feat[2 * FLX_PRED_IN + 7] = 0.0f;
        CHECK_ST(flx_predictor_run(p, feat, 3, out, s, sb - 65, NULL), FLX_ERR_INVALID);
        free(s);
    }

    /* round trip, bit exact */
    char path[300];
    flx_mlp_t m2;
    save_load(&m, "w.safetensors", path, sizeof path, &m2);
    CHECK(m2.outputs == FLX_PRED_OUT_LINE);
    CHECK(memcmp(m.feature_mean, m2.feature_mean, sizeof m.feature_mean) == 0);
    CHECK(memcmp(m.feature_std, m2.feature_std, sizeof m.feature_std) == 0);
    CHECK(memcmp(m.target_mean, m2.target_mean, sizeof m.target_mean) == 0);
    CHECK(memcmp(m.target_std, m2.target_std, sizeof m.target_std) == 0);
    size_t nw = flx_mlp_param_count();
    CHECK(memcmp(m.w1, m2.w1, nw * sizeof(float)) == 0);
    CHECK(memcmp(m.b4, m2.b4, 3 * sizeof(float)) == 0);
    flx_select_params_t paper = flx_select_params_paper();   /* random_mlp leaves the paper's rule */
    CHECK(memcmp(&m2.select, &paper, sizeof paper) == 0);
    flx_mlp_free(&m2);
    flx_predictor_h p2;
    CHECK_OK(flx_predictor_load(path, &p2));
    flx_select_params_t got = flx_predictor_select_params(p2);
    CHECK(memcmp(&got, &paper, sizeof paper) == 0);
    flx_predictor_destroy(p2);

    /* the operating point travels with the weights */
    m.select = (flx_select_params_t){.stream_threshold = 0.95f, .budget_scale = 2.5f, .min_blocks = 4};
    CHECK_OK(flx_mlp_save(&m, path, "unit test", "fluxion", 0.05f));
    CHECK_OK(flx_predictor_load(path, &p2));
    got = flx_predictor_select_params(p2);
    CHECK(got.stream_threshold == 0.95f && got.budget_scale == 2.5f && got.min_blocks == 4);
    flx_predictor_destroy(p2);
    m.select.budget_scale = 0.0f;   /* out of range: not written */
    CHECK_ST(flx_mlp_save(&m, path, "unit test", "fluxion", 0.05f), FLX_ERR_INVALID);
    CHECK_ST(flx_predictor_create(&m, &p2), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "budget_scale") != NULL);
    m.select = paper;

    /* refusals */
    check_refusal(&m, 0, "backbone.1.bias", "\"backbone.1.bias\" missing");
    check_refusal(&m, 1, "extra.weight", "unexpected tensor \"extra.weight\"");
    check_refusal(&m, 2, "head.weight", "head.weight");
    check_refusal(&m, 3, "backbone.2.weight", "backbone.2.weight");
    check_refusal(&m, 4, NULL, "\"format\"");
    meta_value = "0.3";
    check_refusal(&m, 5, "stream_threshold", "stream_threshold 0.3 not in [0.5, 1]");
    meta_value = "two";
    check_refusal(&m, 5, "budget_scale", "\"budget_scale\" is \"two\", not a number");
    meta_value = "1.5";
    check_refusal(&m, 5, "min_blocks", "\"min_blocks\" 1.5 is not an integer");
    meta_value = "nan";
    check_refusal(&m, 5, "stream_threshold", "not a number");
    meta_value = "cubic";
    check_refusal(&m, 5, "outputs", "\"outputs\" is \"cubic\", want \"line\" or \"log-ends\"");
    check_bad_value(&m, &m.w2[1000], NAN, "\"backbone.1.weight\" element 1000 is not finite");
    check_bad_value(&m, &m.b4[2], INFINITY, "\"head.bias\" element 2 is not finite");
    check_bad_value(&m, &m.feature_std[5], 0.0f, "\"feature_std\" element 5");
    /* subnormal: 1/std is inf, so every normalised feature would be (and the fast path's output
     * silently disagreed with the reference) */
    check_bad_value(&m, &m.feature_std[3], 1e-40f,
                    "\"feature_std\" element 3 is 9.99995e-41, must be > 0 with a finite inverse");
    check_bad_value(&m, &m.target_std[1], -1.0f, "\"target_std\" element 1");

    for (int lvl = FLX_ISA_AVX2; lvl <= (int)best; lvl++) {
        flx_isa_force((flx_isa_t)lvl);
        bench(p, &m, &rng, 32, 1);
        bench(p, &m, &rng, 128, 1);
    }
    flx_isa_force(best);
    bench(p, &m, &rng, 128, 2);

    flx_predictor_destroy(p);
    flx_predictor_destroy(NULL);
    flx_mlp_free(&m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    CHECK(system(cmd) == 0);
    return 0;
}
