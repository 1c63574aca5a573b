/*
 * flx-model-dump - teacher-forced logits of our forward pass, for comparison with an independent
 * implementation (bench/model/llama_ref.c writes llama.cpp's side; bench/model/compare_logits.c
 * compares the two).
 *
 * Reads token ids (one per line, or raw little-endian i32), runs ONE prefill over the first n of
 * them with logits for every position (flx_model_prefill, logits_all), and writes the "FLXL" v1
 * file documented as an offset table in bench/model/llama_ref.c: header, the ids, per position
 * the top-2 ids and logits (argmax over the full row, ties to the lowest id, NaN never a maximum),
 * then the full rows of the first F positions.
 *
 * usage: flx-model-dump -m MODEL(.gguf | HF dir) --tokens FILE [-n N] [--full F] -o OUT
 * Exit status: 0 done, 2 bad usage or input, 1 a runtime failure.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/forward.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/util.h"

#define FLXL_VERSION 1u

static void usage(void)
{
    fprintf(stderr, "usage: flx-model-dump -m MODEL(.gguf | HF dir) --tokens FILE [-n N] [--full F] -o OUT\n"
                    "  --tokens FILE  one id per line, or raw little-endian i32\n"
                    "  -n N           positions (default: all ids)\n"
                    "  --full F       positions whose full logit rows are written (default N)\n");
}

/* Reads ids as text (digits, '-', whitespace only) or raw i32. Returns NULL with a message. */
static int32_t *read_ids(const char *path, size_t *n_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flx-model-dump: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "flx-model-dump: %s: read failed\n", path);
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    int text = 1;
    for (long i = 0; i < len && text; i++)
        text = isdigit((unsigned char)buf[i]) || buf[i] == '-' || isspace((unsigned char)buf[i]);
    int32_t *ids = malloc(((size_t)len / 2 + 2) * sizeof *ids);
    size_t n = 0;
    if (!ids) {
        free(buf);
        return NULL;
    }
    if (text) {
        char *p = buf, *end;
        for (;;) {
            while (isspace((unsigned char)*p)) p++;
            if (!*p) break;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
                fprintf(stderr, "flx-model-dump: %s: bad token id near byte %ld\n", path, (long)(p - buf));
                free(buf), free(ids);
                return NULL;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
    } else {
        if (len % 4) {
            fprintf(stderr, "flx-model-dump: %s: %ld bytes is not a whole number of i32 ids\n", path, len);
            free(buf), free(ids);
            return NULL;
        }
        n = (size_t)len / 4;
        memcpy(ids, buf, (size_t)len);
    }
    free(buf);
    *n_p = n;
    return ids;
}

static int parse_u32(const char *s, uint32_t *v)
{
    uint64_t x;
    if (flx_parse_u64(s, 0, UINT32_MAX, &x) != FLX_OK) return -1;
    *v = (uint32_t)x;
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *ids_path = NULL, *out_path = NULL;
    uint32_t n_req = 0, full_req = UINT32_MAX;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "flx-model-dump: %s needs a value\n", a);
            usage();
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--tokens")) ids_path = v;
        else if (!strcmp(a, "-o")) out_path = v;
        else if (!strcmp(a, "-n")) {
            if (parse_u32(v, &n_req) || n_req == 0) {
                fprintf(stderr, "flx-model-dump: -n '%s' is not a positive integer\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--full")) {
            if (parse_u32(v, &full_req)) {
                fprintf(stderr, "flx-model-dump: --full '%s' is not a non-negative integer\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "flx-model-dump: unknown option %s\n", a);
            usage();
            return 2;
        }
    }
    if (!model_path || !ids_path || !out_path) {
        usage();
        return 2;
    }
    size_t n_all;
    int32_t *ids = read_ids(ids_path, &n_all);
    if (!ids) return 2;
    uint32_t n = n_req ? n_req : (uint32_t)n_all;
    if (n == 0 || n > n_all) {
        fprintf(stderr, "flx-model-dump: %u positions asked, %s holds %zu ids\n", n, ids_path, n_all);
        free(ids);
        return 2;
    }
    uint32_t F = full_req == UINT32_MAX ? n : full_req;
    if (F > n) {
        fprintf(stderr, "flx-model-dump: --full %u exceeds the %u positions\n", F, n);
        free(ids);
        return 2;
    }
    flx_model_t *m = NULL;
    flx_pool_params_t pp = {0};   /* FLX_THREADS, else the CPU budget */
    flx_pool_h pool = NULL;
    if (flx_pool_create(&pp, &pool) != FLX_OK) {
        fprintf(stderr, "flx-model-dump: worker pool: %s\n", flx_error_msg());
        free(ids);
        return 2;
    }
    fprintf(stderr, "flx-model-dump: %s\n", flx_pool_describe(pool));
    if (flx_model_load_pool(model_path, pool, &m) != FLX_OK) {
        fprintf(stderr, "flx-model-dump: %s\n", flx_error_msg());
        flx_pool_destroy(pool);
        free(ids);
        return 2;
    }
    const uint32_t V = m->cfg.vocab;
    int rc = 1;
    void *wsmem = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    flx_fwd_shape_t shape = {.max_prompt = n, .max_batch = 1, .pool = pool};
    size_t wsb;
    flx_fwd_ws_t *ws;
    if (flx_fwd_plan(m, &shape, &wsb) != FLX_OK || !(wsmem = flx_aligned_alloc(64, wsb)) ||
        flx_fwd_ws_init(m, &shape, wsmem, wsb, &ws) != FLX_OK) {
        fprintf(stderr, "flx-model-dump: workspace: %s\n", flx_error_msg());
        goto out;
    }
    logits = malloc((size_t)n * V * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "flx-model-dump: %zu bytes of logits\n", (size_t)n * V * sizeof *logits);
        goto out;
    }
    flx_prefill_args_t pa = {.tokens = ids, .n_tokens = n, .logits_all = logits};
    uint64_t t0 = flx_now_ns();
    flx_status_t st = flx_model_prefill(m, ws, &pa);
    if (st != FLX_OK) {
        fprintf(stderr, "flx-model-dump: prefill: %s\n", flx_error_msg());
        rc = st == FLX_ERR_INVALID ? 2 : 1;
        goto out;
    }
    double secs = (flx_now_ns() - t0) * 1e-9;
    out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "flx-model-dump: %s: %s\n", out_path, strerror(errno));
        goto out;
    }
    uint32_t hdr[6] = {0, FLXL_VERSION, n, V, F, 0};
    memcpy(&hdr[0], "FLXL", 4);
    char producer[8] = "fluxion";
    int ok = fwrite(hdr, sizeof hdr, 1, out) == 1 && fwrite(producer, 8, 1, out) == 1 &&
             fwrite(ids, 4, n, out) == n;
    uint32_t agree_text = 0;
    for (uint32_t t = 0; t < n && ok; t++) {
        const float *row = logits + (size_t)t * V;
        int32_t i1 = -1, i2 = -1;
        float l1 = -INFINITY, l2 = -INFINITY;
        for (uint32_t j = 0; j < V; j++) {
            float x = row[j];
            if (isnan(x)) continue;
            if (i1 < 0 || x > l1) {
                i2 = i1, l2 = l1;
                i1 = (int32_t)j, l1 = x;
            } else if (i2 < 0 || x > l2) {
                i2 = (int32_t)j, l2 = x;
            }
        }
        if (t + 1 < n && i1 == ids[t + 1]) agree_text++;
        struct { int32_t a, b; float la, lb; } rec = {i1, i2, l1, l2};
        ok = fwrite(&rec, sizeof rec, 1, out) == 1;
    }
    if (ok && F) ok = fwrite(logits, (size_t)V * sizeof *logits, F, out) == F;
    if (fclose(out) != 0) ok = 0;
    out = NULL;
    if (!ok) {
        fprintf(stderr, "flx-model-dump: %s: write failed\n", out_path);
        goto out;
    }
    fprintf(stderr, "flx-model-dump: %s: %u positions in %.2f s (%.0f tokens/s), argmax = next token at %u/%u\n",
            m->cfg.name, n, secs, n / secs, agree_text, n - 1);
    rc = 0;
out:
    if (out) fclose(out);
    free(logits);
    flx_aligned_free(wsmem);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    free(ids);
    return rc;
}
