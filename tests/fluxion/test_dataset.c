/*
 * test_dataset.c - dataset file round trip, appending two files, and the loader's refusals
 * (format, version, tau/criterion mix, shapes, dtypes, extra tensors, s not in {0,1}, NaN).
 */
#include <string.h>
#include <unistd.h>

#include "flx/predictor.h"
#include "flx/safetensors.h"
#include "flx_test.h"

static char dir[64];

static void random_ds(flx_dataset_t *d, uint32_t n, flx_rng_t *rng, float tau)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    d->features = malloc((size_t)n * FLX_PRED_IN * 4);
    d->labels = malloc((size_t)n * 3 * 4);
    d->bgt = malloc((size_t)n * 5 * 4);
    d->where = malloc((size_t)n * 3 * 4);
    CHECK(d->features && d->labels && d->bgt && d->where);
    for (size_t i = 0; i < (size_t)n * FLX_PRED_IN; i++) d->features[i] = (float)flx_rng_normal(rng);
    for (uint32_t r = 0; r < n; r++) {
        d->labels[r * 3] = (float)flx_rng_uniform(rng);
        d->labels[r * 3 + 1] = (float)(0.1 * flx_rng_normal(rng));
        d->labels[r * 3 + 2] = (float)flx_rng_below(rng, 2);
        for (int j = 0; j < 5; j++) d->bgt[r * 5 + j] = (float)flx_rng_uniform(rng);
        for (int j = 0; j < 3; j++) d->where[r * 3 + j] = (uint32_t)flx_rng_below(rng, 1000);
    }
    d->tau = tau;
    snprintf(d->criterion, sizeof d->criterion, "fluxion");
    snprintf(d->source, sizeof d->source, "unit %u", n);
}

static void file(char *buf, const char *name)
{
    snprintf(buf, 128, "%s/%s", dir, name);
}

/* Saves d, rewrites one piece (tensor `name` replaced by data/dtype/shape, or metadata key) and
 * expects the loader to refuse naming `want`. */
static void refuse(const flx_dataset_t *d, const char *tname, flx_dtype_t dt, int64_t rows, int64_t cols,
                   const void *data, const char *mkey, const char *mval, const char *want)
{
    static const char *names[4] = {"features", "labels", "bgt", "where"};
    const void *arr[4] = {d->features, d->labels, d->bgt, d->where};
    const int64_t cw[4] = {FLX_PRED_IN, 3, 5, 3};
    const flx_dtype_t dts[4] = {FLX_DT_F32, FLX_DT_F32, FLX_DT_F32, FLX_DT_I32};
    flx_st_writer_h w;
    CHECK_OK(flx_st_writer_create(&w));
    int replaced = 0;
    for (int i = 0; i < 4; i++) {
        int64_t sh[2] = {d->n, cw[i]};
        if (tname && strcmp(tname, names[i]) == 0) {
            replaced = 1;
            if (!data) continue; /* dropped */
            sh[0] = rows;
            sh[1] = cols;
            CHECK_OK(flx_st_writer_add(w, names[i], dt, 2, sh, data));
        } else {
            CHECK_OK(flx_st_writer_add(w, names[i], dts[i], 2, sh, arr[i]));
        }
    }
    if (tname && !replaced) {
        int64_t sh[2] = {rows, cols};
        CHECK_OK(flx_st_writer_add(w, tname, dt, 2, sh, data));
    }
    const char *keys[5] = {"format", "version", "tau", "criterion", "source"};
    const char *vals[5] = {"fluxion-dataset", "1", "0.05", "fluxion", "x"};
    int known = 0;
    for (int i = 0; i < 5; i++) {
        if (mkey && strcmp(mkey, keys[i]) == 0) {
            known = 1;
            if (mval) CHECK_OK(flx_st_writer_set_metadata(w, keys[i], mval));
        } else {
            CHECK_OK(flx_st_writer_set_metadata(w, keys[i], vals[i]));
        }
    }
    if (mkey && !known) CHECK_OK(flx_st_writer_set_metadata(w, mkey, mval));   /* an extra key */
    char path[128];
    file(path, "bad.safetensors");
    CHECK_OK(flx_st_writer_save(w, path));
    flx_st_writer_destroy(w);
    flx_dataset_t t;
    memset(&t, 0, sizeof t);
    flx_status_t st = flx_dataset_load_append(&t, path);
    fprintf(stderr, "refused: %s\n", flx_error_msg());
    CHECK(st < 0);
    CHECK(strstr(flx_error_msg(), want) != NULL);
    CHECK(t.n == 0);
    flx_dataset_free(&t);
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_dataset"));
    snprintf(dir, sizeof dir, "/tmp/flx_test_dataset.XXXXXX");
    CHECK(mkdtemp(dir));

    flx_dataset_t a, b, c;
    random_ds(&a, 37, &rng, 0.05f);
    random_ds(&b, 5, &rng, 0.05f);
    char pa[128], pb[128], pc[128];
    file(pa, "a.safetensors");
    file(pb, "b.safetensors");
    file(pc, "c.safetensors");
    CHECK_OK(flx_dataset_save(&a, pa));
    CHECK_OK(flx_dataset_save(&b, pb));

    flx_dataset_t l;
    memset(&l, 0, sizeof l);
    CHECK_OK(flx_dataset_load_append(&l, pa));
    CHECK(l.n == 37 && l.tau == 0.05f && strcmp(l.criterion, "fluxion") == 0 && strcmp(l.source, "unit 37") == 0);
    CHECK(memcmp(l.features, a.features, 37 * FLX_PRED_IN * 4) == 0);
    CHECK(memcmp(l.labels, a.labels, 37 * 3 * 4) == 0);
    CHECK(memcmp(l.bgt, a.bgt, 37 * 5 * 4) == 0);
    CHECK(memcmp(l.where, a.where, 37 * 3 * 4) == 0);
    CHECK_OK(flx_dataset_load_append(&l, pb));
    CHECK(l.n == 42);
    CHECK(memcmp(l.features + 37 * FLX_PRED_IN, b.features, 5 * FLX_PRED_IN * 4) == 0);
    CHECK(memcmp(l.where + 37 * 3, b.where, 5 * 3 * 4) == 0);
    CHECK(strstr(l.source, "unit 5") != NULL);

    /* mixing tau or criterion is refused, and leaves l as it was */
    random_ds(&c, 3, &rng, 0.1f);
    CHECK_OK(flx_dataset_save(&c, pc));
    CHECK_ST(flx_dataset_load_append(&l, pc), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "tau") != NULL && l.n == 42);
    c.tau = 0.05f;
    snprintf(c.criterion, sizeof c.criterion, "quest");
    CHECK_OK(flx_dataset_save(&c, pc));
    CHECK_ST(flx_dataset_load_append(&l, pc), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "criterion") != NULL && l.n == 42);
    flx_dataset_free(&l);

    /* the source's shape travels with the rows; files of different shapes leave it unknown */
    a.n_q_heads = 8, a.n_kv_heads = 2, b.n_q_heads = 8, b.n_kv_heads = 2;
    CHECK_OK(flx_dataset_save(&a, pa));
    CHECK_OK(flx_dataset_save(&b, pb));
    memset(&l, 0, sizeof l);
    CHECK_OK(flx_dataset_load_append(&l, pa));
    CHECK(l.n_q_heads == 8 && l.n_kv_heads == 2);
    CHECK_OK(flx_dataset_load_append(&l, pb));
    CHECK(l.n_q_heads == 8 && l.n_kv_heads == 2 && l.n == 42);
    b.n_q_heads = 9, b.n_kv_heads = 3;
    CHECK_OK(flx_dataset_save(&b, pb));
    CHECK_OK(flx_dataset_load_append(&l, pb));
    CHECK(l.n_q_heads == 0 && l.n_kv_heads == 0 && l.n == 47);
    flx_dataset_free(&l);
    a.n_q_heads = a.n_kv_heads = 0;

    /* an empty dataset round-trips */
    flx_dataset_t e = {0};
    snprintf(e.criterion, sizeof e.criterion, "fluxion");
    CHECK_OK(flx_dataset_save(&e, pc));
    memset(&l, 0, sizeof l);
    CHECK_OK(flx_dataset_load_append(&l, pc));
    CHECK(l.n == 0);
    flx_dataset_free(&l);

    /* refusals */
    a.tau = 0.05f;
    refuse(&a, NULL, 0, 0, 0, NULL, "format", "fluxion-predictor", "\"format\"");
    refuse(&a, NULL, 0, 0, 0, NULL, "version", "2", "\"version\"");
    refuse(&a, NULL, 0, 0, 0, NULL, "tau", "abc", "\"tau\"");
    refuse(&a, NULL, 0, 0, 0, NULL, "criterion", NULL, "\"criterion\" missing");
    refuse(&a, NULL, 0, 0, 0, NULL, "n_q_heads", "8", "n_kv_heads \"(absent)\"");
    refuse(&a, NULL, 0, 0, 0, NULL, "n_kv_heads", "x", "n_q_heads \"(absent)\"");
    refuse(&a, "labels", 0, 0, 0, NULL, NULL, NULL, "labels");
    refuse(&a, "bgt", FLX_DT_F32, 36, 5, a.bgt, NULL, NULL, "bgt");
    refuse(&a, "features", FLX_DT_F32, 37, 40, a.features, NULL, NULL, "features");
    refuse(&a, "where", FLX_DT_F32, 37, 3, a.where, NULL, NULL, "where");
    refuse(&a, "extra", FLX_DT_F32, 1, 3, a.labels, NULL, NULL, "unexpected tensor \"extra\"");
    float *bad = malloc(37 * 3 * 4);
    memcpy(bad, a.labels, 37 * 3 * 4);
    bad[10 * 3 + 2] = 0.5f;
    refuse(&a, "labels", FLX_DT_F32, 37, 3, bad, NULL, NULL, "labels row 10 column 2");
    bad[10 * 3 + 2] = 1.0f;
    bad[4 * 3 + 0] = NAN;
    refuse(&a, "labels", FLX_DT_F32, 37, 3, bad, NULL, NULL, "labels row 4 column 0");
    free(bad);
    bad = malloc(37 * FLX_PRED_IN * 4);
    memcpy(bad, a.features, 37 * FLX_PRED_IN * 4);
    bad[3 * FLX_PRED_IN + 40] = INFINITY;
    refuse(&a, "features", FLX_DT_F32, 37, FLX_PRED_IN, bad, NULL, NULL, "features row 3 feature 40");
    free(bad);
    int32_t *bw = malloc(37 * 3 * 4);
    memcpy(bw, a.where, 37 * 3 * 4);
    bw[7] = -1;
    refuse(&a, "where", FLX_DT_I32, 37, 3, bw, NULL, NULL, "where row 2 column 1");
    free(bw);

    flx_dataset_free(&a);
    flx_dataset_free(&b);
    flx_dataset_free(&c);
    flx_dataset_free(NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return 0;
}
