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
 * Exit status (flx/cli.h): 0 done, 1 a runtime failure (a file, the model), 2 a usage error.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

#define FLXL_VERSION 1u
#define PROG "flx-model-dump"

int main(int argc, char **argv)
{
    const char *model_path = NULL, *ids_path = NULL, *out_path = NULL;
    uint64_t n_req = 0, full_req = 0, threads = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "tokens", "FILE", &ids_path, FLX_CLI_REQUIRED,
                     "token ids: one per line, or raw little-endian i32"),
        FLX_CLI_PATH('o', "out", "FILE", &out_path, FLX_CLI_REQUIRED, "the FLXL dump to write"),
        FLX_CLI_UINT('n', "positions", "N", &n_req, 1, 1u << 22, 0, "positions to run (default: every id)"),
        FLX_CLI_UINT(0, "full", "F", &full_req, 0, 1u << 22, 0,
                     "positions whose full logit rows are written (default N)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, 1024, 0, "pool workers (default: FLX_THREADS, else the CPU budget)"),
    };
    flx_cli_t cli = FLX_CLI_INIT(PROG,
                                 "Teacher-forced logits of our forward pass in the FLXL format bench/model compares "
                                 "with llama.cpp.",
                                 opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_given(&cli, "positions") && flx_cli_given(&cli, "full") && full_req > n_req)
        return flx_cli_usage_error(&cli, "--full %llu exceeds --positions %llu", (unsigned long long)full_req,
                                   (unsigned long long)n_req);
    size_t n_all = 0;
    int32_t *ids = NULL;
    if (flx_tok_ids_read(ids_path, &ids, &n_all)) return flx_cli_fail(&cli, "--tokens: %s", flx_error_msg());
    const uint32_t n = n_req ? (uint32_t)n_req : (uint32_t)FLX_MIN(n_all, UINT32_MAX);
    if (n == 0 || n > n_all) {
        free(ids);
        return flx_cli_fail(&cli, "%u positions asked, %s holds %zu ids", n, ids_path, n_all);
    }
    const uint32_t F = flx_cli_given(&cli, "full") ? (uint32_t)full_req : n;
    if (F > n) {
        free(ids);
        return flx_cli_fail(&cli, "--full %u exceeds the %u positions", F, n);
    }
    flx_model_t *m = NULL;
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_pool_h pool = NULL;
    if (flx_pool_create(&pp, &pool) != FLX_OK) {
        free(ids);
        return flx_cli_fail(&cli, "worker pool: %s", flx_error_msg());
    }
    fprintf(stderr, "flx-model-dump: %s\n", flx_pool_describe(pool));
    if (flx_model_load_pool(model_path, pool, &m) != FLX_OK) {
        flx_pool_destroy(pool);
        free(ids);
        return flx_cli_fail(&cli, "%s", flx_error_msg());
    }
    const uint32_t V = m->cfg.vocab;
    rc = FLX_EXIT_FAILURE;
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
