/*
 * dataset.c - the label dataset file (flx/predictor.h): save, strict load-and-append, free.
 *
 * DESIGN
 * A dataset is what fluxion-label measured and fluxion-train consumes; several files (models,
 * prompts) are concatenated by loading them one after the other into one flx_dataset_t. Rows
 * labelled under a different tau or criterion answer a different question, so mixing them is
 * refused rather than averaged. The loader trusts nothing: format and version metadata, the exact
 * tensor set, dtypes, shapes that agree on N, finite values, s in {0, 1}.
 * DEVIATION: "where" is stored as I32 (values 0..2^31-1), not U32: the project's safetensors
 * reader knows no U32 dtype. Negative values are refused on load.
 */
#include "flx/predictor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/safetensors.h"
#include "flx/util.h"

#define DS_FORMAT "fluxion-dataset"

flx_status_t flx_dataset_save(const flx_dataset_t *d, const char *path)
{
    if (!d || !path || (d->n && (!d->features || !d->labels || !d->bgt || !d->where)))
        return flx_error_set(FLX_ERR_INVALID, "dataset save: NULL argument");
    if (d->n > INT32_MAX) return flx_error_set(FLX_ERR_INVALID, "dataset save: %u rows", d->n);
    for (size_t i = 0; i < (size_t)d->n * 3; i++)
        if (d->where[i] > INT32_MAX)
            return flx_error_set(FLX_ERR_INVALID, "dataset save: where[%zu] = %u above 2^31-1", i, d->where[i]);
    flx_st_writer_h w = NULL;
    flx_status_t st = flx_st_writer_create(&w);
    if (st) return st;
    int64_t n = d->n;
    int64_t sf[2] = {n, FLX_PRED_IN}, sl[2] = {n, 3}, sb[2] = {n, 5}, sw[2] = {n, 3};
    char tau[32];
    snprintf(tau, sizeof tau, "%.9g", (double)d->tau);
    if (!st) st = flx_st_writer_add(w, "features", FLX_DT_F32, 2, sf, d->features);
    if (!st) st = flx_st_writer_add(w, "labels", FLX_DT_F32, 2, sl, d->labels);
    if (!st) st = flx_st_writer_add(w, "bgt", FLX_DT_F32, 2, sb, d->bgt);
    if (!st) st = flx_st_writer_add(w, "where", FLX_DT_I32, 2, sw, d->where);
    if (!st) st = flx_st_writer_set_metadata(w, "format", DS_FORMAT);
    if (!st) st = flx_st_writer_set_metadata(w, "version", "1");
    if (!st) st = flx_st_writer_set_metadata(w, "tau", tau);
    if (!st) st = flx_st_writer_set_metadata(w, "criterion", d->criterion);
    if (!st) st = flx_st_writer_set_metadata(w, "source", d->source);
    if (d->n_q_heads && d->n_kv_heads) {
        char hq[16], hkv[16];
        snprintf(hq, sizeof hq, "%u", d->n_q_heads);
        snprintf(hkv, sizeof hkv, "%u", d->n_kv_heads);
        if (!st) st = flx_st_writer_set_metadata(w, "n_q_heads", hq);
        if (!st) st = flx_st_writer_set_metadata(w, "n_kv_heads", hkv);
    }
    if (!st) st = flx_st_writer_save(w, path);
    flx_st_writer_destroy(w);
    return st;
}

static flx_status_t meta(flx_st_reader_h r, const char *path, const char *key, const char **v)
{
    *v = flx_st_metadata(r, key);
    if (!*v) return flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"%s\" missing", path, key);
    return FLX_OK;
}

static flx_status_t grow(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, n ? n * elem : 1);
    if (!q) return flx_error_set(FLX_ERR_NOMEM, "dataset: %zu bytes", n * elem);
    *p = q;
    return FLX_OK;
}

flx_status_t flx_dataset_load_append(flx_dataset_t *d, const char *path)
{
    if (!d || !path) return flx_error_set(FLX_ERR_INVALID, "dataset load: NULL argument");
    flx_st_reader_h r = NULL;
    flx_status_t st = flx_st_open(path, &r);
    if (st) return st;
    const char *fmt, *ver, *tau_s, *crit, *src;
    if ((st = meta(r, path, "format", &fmt)) || (st = meta(r, path, "version", &ver)) ||
        (st = meta(r, path, "tau", &tau_s)) || (st = meta(r, path, "criterion", &crit)) ||
        (st = meta(r, path, "source", &src)))
        goto out;
    if (strcmp(fmt, DS_FORMAT) != 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"format\" is \"%s\", want \"%s\"", path, fmt, DS_FORMAT);
        goto out;
    }
    if (strcmp(ver, "1") != 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"version\" is \"%s\", want \"1\"", path, ver);
        goto out;
    }
    char *end;
    errno = 0;
    float tau = strtof(tau_s, &end);
    if (errno || end == tau_s || *end || !isfinite(tau)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"tau\" is \"%s\", not a finite number", path, tau_s);
        goto out;
    }
    if (strlen(crit) >= sizeof d->criterion) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"criterion\" longer than %zu", path, sizeof d->criterion - 1);
        goto out;
    }
    /* optional shape: both or neither, n_q_heads a multiple of n_kv_heads */
    uint64_t hq = 0, hkv = 0;
    const char *hq_s = flx_st_metadata(r, "n_q_heads"), *hkv_s = flx_st_metadata(r, "n_kv_heads");
    if ((hq_s != NULL) != (hkv_s != NULL) ||
        (hq_s && (flx_parse_u64(hq_s, 1, 4096, &hq) || flx_parse_u64(hkv_s, 1, 4096, &hkv) || hq % hkv))) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata n_q_heads \"%s\" / n_kv_heads \"%s\": want both, positive, "
                           "n_q_heads a multiple of n_kv_heads", path, hq_s ? hq_s : "(absent)", hkv_s ? hkv_s : "(absent)");
        goto out;
    }
    if (d->n && (tau != d->tau || strcmp(crit, d->criterion) != 0)) {
        st = flx_error_set(FLX_ERR_INVALID, "%s: tau %g criterion \"%s\" differ from the loaded rows' %g \"%s\"", path,
                           (double)tau, crit, (double)d->tau, d->criterion);
        goto out;
    }
    static const char *names[4] = {"features", "labels", "bgt", "where"};
    if (flx_st_count(r) != 4) {
        for (size_t i = 0; i < flx_st_count(r); i++) {
            const char *nm = flx_st_at(r, i)->name;
            int known = 0;
            for (int j = 0; j < 4; j++) known |= strcmp(nm, names[j]) == 0;
            if (!known) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: unexpected tensor \"%s\"", path, nm);
                goto out;
            }
        }
    }
    const flx_st_tensor_t *tf, *tl, *tb, *tw;
    int64_t ef[2] = {-1, FLX_PRED_IN};
    if ((st = flx_st_expect(r, "features", FLX_DT_F32, 2, ef, &tf))) goto named;
    int64_t n = tf->shape[0];
    int64_t el[2] = {n, 3}, eb[2] = {n, 5}, ew[2] = {n, 3};
    if ((st = flx_st_expect(r, "labels", FLX_DT_F32, 2, el, &tl)) || (st = flx_st_expect(r, "bgt", FLX_DT_F32, 2, eb, &tb)) ||
        (st = flx_st_expect(r, "where", FLX_DT_I32, 2, ew, &tw)))
        goto named;
    if ((uint64_t)n + d->n > INT32_MAX) {
        st = flx_error_set(FLX_ERR_CAPACITY, "%s: %lld rows on top of %u", path, (long long)n, d->n);
        goto out;
    }
    /* The data may start at any byte (flx/safetensors.h): read through byte pointers and memcpy. */
    const uint8_t *ff = tf->data, *fl = tl->data, *fb = tb->data, *iw = tw->data;
    for (int64_t i = 0; i < n * FLX_PRED_IN; i++) {
        float v;
        memcpy(&v, ff + 4 * i, 4);
        if (!isfinite(v)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: features row %lld feature %lld is not finite", path,
                               (long long)(i / FLX_PRED_IN), (long long)(i % FLX_PRED_IN));
            goto out;
        }
    }
    for (int64_t i = 0; i < n * 3; i++) {
        float v;
        memcpy(&v, fl + 4 * i, 4);
        if (!isfinite(v) || (i % 3 == 2 && v != 0.0f && v != 1.0f)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: labels row %lld column %lld is %g (%s)", path, (long long)(i / 3),
                               (long long)(i % 3), (double)v, i % 3 == 2 ? "s must be 0 or 1" : "not finite");
            goto out;
        }
    }
    for (int64_t i = 0; i < n * 5; i++) {
        float v;
        memcpy(&v, fb + 4 * i, 4);
        if (!isfinite(v)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: bgt row %lld column %lld is not finite", path, (long long)(i / 5),
                               (long long)(i % 5));
            goto out;
        }
    }
    for (int64_t i = 0; i < n * 3; i++) {
        int32_t v;
        memcpy(&v, iw + 4 * i, 4);
        if (v < 0) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: where row %lld column %lld is negative (%d)", path,
                               (long long)(i / 3), (long long)(i % 3), v);
            goto out;
        }
    }
    size_t tot = (size_t)d->n + (size_t)n;
    if ((st = grow((void **)&d->features, tot * FLX_PRED_IN, 4)) || (st = grow((void **)&d->labels, tot * 3, 4)) ||
        (st = grow((void **)&d->bgt, tot * 5, 4)) || (st = grow((void **)&d->where, tot * 3, 4)))
        goto out;
    memcpy(d->features + (size_t)d->n * FLX_PRED_IN, ff, tf->nbytes);
    memcpy(d->labels + (size_t)d->n * 3, fl, tl->nbytes);
    memcpy(d->bgt + (size_t)d->n * 5, fb, tb->nbytes);
    memcpy(d->where + (size_t)d->n * 3, iw, tw->nbytes);
    if (d->n == 0) {
        d->n_q_heads = (uint32_t)hq, d->n_kv_heads = (uint32_t)hkv;
    } else if (d->n_q_heads != hq || d->n_kv_heads != hkv) {
        d->n_q_heads = d->n_kv_heads = 0;   /* mixed shapes: no group structure to estimate with */
    }
    if (d->n == 0) {
        d->tau = tau;
        snprintf(d->criterion, sizeof d->criterion, "%s", crit);
        snprintf(d->source, sizeof d->source, "%s", src);
    } else if (strcmp(d->source, src) != 0 && strlen(d->source) + strlen(src) + 3 < sizeof d->source) {
        strcat(d->source, "; ");
        strcat(d->source, src);
    }
    d->n = (uint32_t)tot;
    goto out;
named: {
    char msg[FLX_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", flx_error_msg());
    st = flx_error_set(st, "%s: %s", path, msg);
}
out:
    flx_st_close(r);
    return st;
}

void flx_dataset_free(flx_dataset_t *d)
{
    if (!d) return;
    free(d->features);
    free(d->labels);
    free(d->bgt);
    free(d->where);
    memset(d, 0, sizeof *d);
}
