/*
 * model_bench - the model runtime on the real model: prefill throughput, time per output token
 * (TPOT) with full attention and with the fixed (16, 0.05) baseline, the decode-step breakdown
 * (dense matrix products vs attention) and the dense part's achieved bandwidth against the read
 * bandwidth this binary measures in the same run.
 *
 * For each prompt length L: the first L ids of the token file are prefilled in-process into a
 * kvstore session (flx_engine_prefill_into_store: what a prefill node does, without the network),
 * then the engine decodes `steps` greedy tokens (EOS ignored, batch 1) in the mode under test. Each
 * mode gets its own prefill (an engine consumes its session), so prefill is measured twice per L.
 * The first WARM steps are not counted. Dense GB/s = weight bytes the forward pass read over the
 * time it spent outside attention, over the read bandwidth the same pool reaches on a buffer of the
 * weights' size just before and just after that run (the mean of the two samples: this machine's
 * bandwidth drifts within minutes, so the reference is taken next to what it judges);
 * dense_bw_frac_formats = the median of that ratio over every (L, mode) run (the dense part does
 * not depend on L or the attention mode).
 *
 * A GGUF model's quantized matrices stay in compact block formats (flx/model.h WEIGHT FORMATS): the
 * same values as bf16 in 0.75 (Q4) or 1.125 (Q8) bytes each, expanded in registers, so that dense
 * part reads fewer bytes and may be bound by arithmetic rather than bandwidth. A second section
 * therefore times the dense part alone (decode steps whose attention callback writes zeros) on the
 * model as loaded and on the same file loaded as bf16 (flx_model_load_as), alternated in pairs,
 * order rotated, at batch 1, 4 and 8: dense_formats_over_bf16_b1 / _b4 / _b8 are the medians of the per-pair
 * time ratios, and gemv_bw_frac is the bf16 GEMV's bandwidth at batch 1 over the read bandwidth taken
 * around each pair (the kernel's memory-speed figure, as before the compact formats; for a Hugging
 * Face model, which is bf16, it is the figure of the main table).
 *
 * usage: model_bench -m MODEL --tokens IDS [--lens 2048,4096,8192] [--steps N] [-t T] [--csv PATH]
 * (-t: pool workers; absent: FLX_THREADS, else the process's CPU budget)
 * Last line: SUMMARY gemv_bw_frac=<x> tpot_full_over_16_005_8k=<TPOT full / TPOT fixed at the largest L>
 *            dense_formats_over_bf16_b1=<x> dense_formats_over_bf16_b4=<x> dense_formats_over_bf16_b8=<x>
 *            dense_bw_frac_formats=<x>
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/bench_cli.h"
#include "../common/bench_read.h"
#include "../common/bench_stats.h"
#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/kvstore.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

enum { WARM = 2 };

static void die(const char *what)
{
    fprintf(stderr, "model_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

typedef struct {
    double prefill_tok_s, tpot_ms, dense_ms, attn_ms, other_ms, dense_gbs, host_mb;
    double read_gbs;   /* the read bandwidth around the run */
    uint32_t L;
    int mode;
} run_t;

static run_t run_one(const flx_model_t *m, flx_fwd_ws_t *fws, flx_kv_store_h store, const int32_t *ids, uint32_t L,
                     uint32_t steps, flx_pool_h pool, const flx_engine_params_t *ep, float *logits)
{
    run_t r = {0};
    flx_kv_session_id_t sid;
    uint64_t t0 = flx_now_ns();
    if (flx_engine_prefill_into_store(m, fws, store, ids, L, steps + 1, &sid, logits) != FLX_OK) die("prefill");
    r.prefill_tok_s = L / ((flx_now_ns() - t0) * 1e-9);
    int32_t first = 0;
    for (uint32_t j = 1; j < m->cfg.vocab; j++)
        if (logits[j] > logits[first]) first = (int32_t)j;
    flx_engine_params_t p = *ep;
    p.pool = pool;
    flx_engine_h eng;
    if (flx_engine_create(m, store, &p, &eng) != FLX_OK) die("engine");
    flx_gen_params_t gen = {.max_new_tokens = steps + 1, .eos_id = -1, .ignore_eos = 1,
                            .sampling = flx_sampling_greedy()};
    flx_engine_seq_id_t seq;
    if (flx_engine_add(eng, sid, first, &gen, &seq) != FLX_OK) die("engine add");
    flx_engine_stats_t sum = {0}, s;
    uint32_t n = 0;
    for (uint32_t i = 0;; i++) {
        flx_status_t st = flx_engine_step(eng);
        if (st < 0) die("engine step");
        flx_engine_last_stats(eng, &s);
        if (i >= WARM && s.n_tokens) {
            sum.step_ns += s.step_ns, sum.dense_ns += s.dense_ns, sum.attn_ns += s.attn_ns;
            sum.dense_bytes += s.dense_bytes, sum.host_bytes += s.host_bytes;
            n++;
        }
        if (st == FLX_OK) break;
    }
    flx_engine_destroy(eng);
    if (n == 0) {
        fprintf(stderr, "model_bench: no decode step measured (steps %u <= warm-up %d)\n", steps, WARM);
        exit(1);
    }
    r.tpot_ms = sum.step_ns / 1e6 / n;
    r.dense_ms = sum.dense_ns / 1e6 / n;
    r.attn_ms = sum.attn_ns / 1e6 / n;
    r.other_ms = r.tpot_ms - r.dense_ms - r.attn_ms;
    r.dense_gbs = sum.dense_ns ? sum.dense_bytes / (double)sum.dense_ns : 0;
    r.host_mb = sum.host_bytes / 1e6 / n;
    return r;
}

/* ---- the dense part with the model's own weight formats against the same values as bf16 ---- */

enum { AB_PAIRS = 8, AB_STEPS = 4 };

static flx_status_t attn_zero(void *ctx, uint32_t layer, uint32_t batch, const float *q, const float *k,
                              const float *v, float *o)
{
    const flx_model_config_t *c = ctx;
    memset(o, 0, sizeof(float) * batch * c->n_heads * c->head_dim);
    return FLX_OK;
}

typedef struct {
    const flx_model_t *m;
    flx_fwd_ws_t *ws;
    void *mem;
} ab_side_t;

static void ab_side_init(ab_side_t *a, const flx_model_t *m, flx_pool_h pool, uint32_t batch)
{
    flx_fwd_shape_t fs = {.max_prompt = 1, .max_batch = batch, .pool = pool};
    size_t b;
    a->m = m;
    if (flx_fwd_plan(m, &fs, &b) != FLX_OK || !(a->mem = flx_aligned_alloc(64, b)) ||
        flx_fwd_ws_init(m, &fs, a->mem, b, &a->ws) != FLX_OK)
        die("forward workspace (weight formats)");
}

/* Mean dense time (ns) and bytes of AB_STEPS decode steps of batch B (attention left out: the
 * callback writes zeros), after one unmeasured step. */
static double ab_dense_ns(ab_side_t *a, uint32_t B, float *logits, uint64_t *bytes_p)
{
    int32_t tok[8];
    uint32_t pos[8];
    for (uint32_t i = 0; i < B; i++) tok[i] = (int32_t)(100 + 37 * i), pos[i] = 7 + i;
    flx_decode_args_t d = {.batch = B, .tokens = tok, .pos = pos, .attn = attn_zero, .ctx = (void *)&a->m->cfg,
                           .logits = logits};
    uint64_t ns = 0;
    for (int s = 0; s <= AB_STEPS; s++) {
        if (flx_model_decode(a->m, a->ws, &d) != FLX_OK) die("decode (weight formats)");
        flx_fwd_timing_t t;
        flx_fwd_timing_get(a->ws, &t);
        if (s) ns += t.dense_ns, *bytes_p = t.dense_bytes;
    }
    return (double)ns / AB_STEPS;
}

/* Dense time of the loaded model (its matrices in the file's formats, flx/model.h) over the same
 * model loaded as bf16, per pair of alternated runs (order rotated), at batch 1 and 4; and the bf16
 * GEMV's bandwidth against the read bandwidth taken around each pair. Prints a table and a CSV;
 * returns the batch-1, 4 and 8 medians in ratio[3] and the bandwidth fraction's median. */
static double formats_ab(const flx_model_t *m, const char *path, flx_pool_h pool, const uint8_t *rbuf, size_t rbytes,
                         FILE *csv, double ratio[3])
{
    flx_model_t *mb;
    if (flx_model_load_as(path, pool, FLX_WEIGHTS_BF16, &mb) != FLX_OK) die("model as bf16");
    const uint32_t batches[3] = {1, 4, 8};
    float *logits = malloc(sizeof(float) * 8 * m->cfg.vocab);
    double fr[2 * AB_PAIRS];
    int n_fr = 0;
    printf("\ndense part, the file's formats (%.1f MB a step) against bf16 (%.1f MB), %d alternated pairs of %d steps:\n",
           flx_model_weight_bytes(m) / 1e6, flx_model_weight_bytes(mb) / 1e6, AB_PAIRS, AB_STEPS);
    printf("%6s %14s %14s %14s %14s\n", "batch", "formats ms", "bf16 ms", "ratio median", "range");
    for (int bi = 0; bi < 3; bi++) {
        const uint32_t B = batches[bi];
        ab_side_t a, b;
        ab_side_init(&a, m, pool, B);
        ab_side_init(&b, mb, pool, B);
        double r[AB_PAIRS], ta[AB_PAIRS], tb[AB_PAIRS];
        for (int p = 0; p < AB_PAIRS; p++) {
            uint64_t ba = 0, bb = 0;
            const double bw0 = flx_bench_read_bw(pool, rbuf, rbytes, 1);
            if (p & 1) tb[p] = ab_dense_ns(&b, B, logits, &bb), ta[p] = ab_dense_ns(&a, B, logits, &ba);
            else ta[p] = ab_dense_ns(&a, B, logits, &ba), tb[p] = ab_dense_ns(&b, B, logits, &bb);
            const double bw = (bw0 + flx_bench_read_bw(pool, rbuf, rbytes, 1)) / 2;
            r[p] = ta[p] / tb[p];
            if (B == 1) fr[n_fr++] = bb / tb[p] / bw;
            if (csv) fprintf(csv, "formats_ab,%u,%d,%.4f,%.4f,%.4f,%llu,%llu,%.2f\n", B, p, ta[p] / 1e6, tb[p] / 1e6, r[p],
                             (unsigned long long)ba, (unsigned long long)bb, bw);
        }
        const double med_a = flx_bench_median(ta, AB_PAIRS), med_b = flx_bench_median(tb, AB_PAIRS);
        ratio[bi] = flx_bench_median(r, AB_PAIRS);   /* sorts r */
        printf("%6u %14.2f %14.2f %14.3f %6.3f .. %.3f\n", B, med_a / 1e6, med_b / 1e6, ratio[bi], r[0], r[AB_PAIRS - 1]);
        flx_aligned_free(a.mem);
        flx_aligned_free(b.mem);
    }
    free(logits);
    flx_model_destroy(mb);
    return flx_bench_median(fr, n_fr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *ids_path = NULL, *csv_path = NULL, *lens_s = NULL;
    uint32_t lens[8] = {2048, 4096, 8192}, n_lens = 3;
    uint64_t steps_u = 24, threads_u = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "tokens", "IDS", &ids_path, FLX_CLI_REQUIRED, "token ids, one per line (the prompts' source)"),
        FLX_CLI_STR(0, "lens", "L,L,..", &lens_s, 0, "prompt lengths (default 2048,4096,8192)"),
        FLX_CLI_UINT(0, "steps", "N", &steps_u, WARM + 1, 100000, 0, "decode steps per run, the first 2 not counted "
                     "(default 24)"),
        FLX_CLI_UINT('t', "threads", "N", &threads_u, 1, 1024, 0, "pool workers (default: FLX_THREADS, else the CPU budget)"),
        FLX_CLI_PATH(0, "csv", "PATH", &csv_path, 0, "CSV written"),
    };
    flx_cli_t cli = FLX_CLI_INIT("model_bench", "TPOT of the real model, full vs fixed (16, 0.05), the dense/attention "
                                 "split and the dense part's bandwidth against the measured one.", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if ((rc = flx_bench_u32_list(&cli, "lens", lens_s, 1, 1u << 22, lens, 8, &n_lens)) != FLX_CLI_PROCEED) return rc;
    const uint32_t steps = (uint32_t)steps_u;
    const int threads = (int)threads_u;
    size_t n_ids;
    int32_t *ids = NULL;
    if (flx_tok_ids_read(ids_path, &ids, &n_ids)) return flx_cli_fail(&cli, "--tokens: %s", flx_error_msg());
    uint32_t Lmax = 0;
    for (uint32_t i = 0; i < n_lens; i++) {
        if (lens[i] > n_ids) {
            free(ids);
            return flx_cli_fail(&cli, "--lens %u: the token file holds %zu ids", lens[i], n_ids);
        }
        Lmax = lens[i] > Lmax ? lens[i] : Lmax;
    }
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_pool_h pool;
    if (flx_pool_create(&pp, &pool) != FLX_OK) die("worker pool");
    flx_model_t *m;
    if (flx_model_load_pool(model_path, pool, &m) != FLX_OK) die("model");
    size_t rbytes = flx_model_weight_bytes(m);
    uint8_t *rbuf = flx_bench_read_buf(&rbytes);
    if (!rbuf) die("read buffer");
    const double bw0 = flx_bench_read_bw(pool, rbuf, rbytes, 3);
    const flx_model_config_t *c = &m->cfg;
    printf("model_bench: %s (%u layers, %u/%u heads, head_dim %u), %s, %u decode steps (%d warm-up)\n", c->name,
           c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, flx_pool_describe(pool), steps, WARM);
    printf("weights read per decode step: %.1f MB; read bandwidth (same binary, same pool): %.1f GB/s\n",
           flx_model_weight_bytes(m) / 1e6, bw0);

    flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = (size_t)1 << 30, .n_layers = c->n_layers,
                                .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads, .head_dim = c->head_dim};
    flx_kv_store_h store;
    if (flx_kv_store_create(&sp, &store) != FLX_OK) die("kvstore");
    flx_fwd_shape_t fs = {.max_prompt = Lmax, .max_batch = 1, .pool = pool};
    size_t wsb;
    flx_fwd_ws_t *fws;
    void *wsmem = NULL;
    if (flx_fwd_plan(m, &fs, &wsb) != FLX_OK || !(wsmem = flx_aligned_alloc(64, wsb)) ||
        flx_fwd_ws_init(m, &fs, wsmem, wsb, &fws) != FLX_OK)
        die("forward workspace");
    float *logits = malloc(sizeof(float) * c->vocab);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) {
        fprintf(stderr, "model_bench: %s: %s\n", csv_path, strerror(errno));
        return 1;
    }
    if (csv)
        fprintf(csv, "L,mode,blk,bgt,prefill_tok_s,tpot_ms,dense_ms,attn_ms,other_ms,dense_GBps,read_bw_GBps,"
                     "dense_bw_frac,host_MB_per_step\n");
    printf("\n%6s %-14s %12s %9s %9s %9s %9s %11s %12s\n", "L", "mode", "prefill t/s", "TPOT ms", "dense ms",
           "attn ms", "other ms", "dense GB/s", "host MB/step");
    flx_engine_params_t modes[2] = {flx_engine_params_default(), flx_engine_params_default()};
    modes[0].mode = FLX_ENGINE_ATTN_FULL;
    modes[1].mode = FLX_ENGINE_ATTN_FIXED, modes[1].blk = 16, modes[1].bgt = 0.05f;
    for (int k = 0; k < 2; k++) modes[k].max_batch = 1, modes[k].max_l_cpu = Lmax;
    run_t runs[16];
    int n_runs = 0;
    for (uint32_t li = 0; li < n_lens; li++) {
        for (int k = 0; k < 2; k++) {
            const double b0 = flx_bench_read_bw(pool, rbuf, rbytes, 1);
            run_t r = run_one(m, fws, store, ids, lens[li], steps, pool, &modes[k], logits);
            r.read_gbs = (b0 + flx_bench_read_bw(pool, rbuf, rbytes, 1)) / 2;
            r.L = lens[li];
            r.mode = k;
            printf("%6u %-14s %12.0f %9.2f %9.2f %9.2f %9.2f %11.1f %12.2f\n", lens[li], k ? "fixed(16,0.05)" : "full",
                   r.prefill_tok_s, r.tpot_ms, r.dense_ms, r.attn_ms, r.other_ms, r.dense_gbs, r.host_mb);
            fflush(stdout);
            runs[n_runs++] = r;
        }
    }
    double frac[16], tpot_last[2] = {0, 0};
    for (int i = 0; i < n_runs; i++) {
        const run_t *r = &runs[i];
        if (csv)
            fprintf(csv, "%u,%s,%u,%.2f,%.1f,%.4f,%.4f,%.4f,%.4f,%.2f,%.2f,%.4f,%.3f\n", r->L, r->mode ? "fixed" : "full",
                    modes[r->mode].blk, r->mode ? (double)modes[r->mode].bgt : 1.0, r->prefill_tok_s, r->tpot_ms,
                    r->dense_ms, r->attn_ms, r->other_ms, r->dense_gbs, r->read_gbs, r->dense_gbs / r->read_gbs,
                    r->host_mb);
        frac[i] = r->dense_gbs / r->read_gbs;
        if (r->L == lens[n_lens - 1]) tpot_last[r->mode] = r->tpot_ms;
    }
    const double gemv_frac = flx_bench_median(frac, n_runs);   /* sorts frac */
    printf("\ndense part / read bandwidth around the same run: median %.3f (%.3f .. %.3f) over %d runs\n", gemv_frac,
           frac[0], frac[n_runs - 1], n_runs);
    printf("TPOT full / fixed(16, 0.05) at L %u: %.3f\n", lens[n_lens - 1], tpot_last[0] / tpot_last[1]);
    double fmt_ratio[3] = {1, 1, 1}, bf16_frac = gemv_frac;
    const size_t plen = strlen(model_path);
    if (plen > 5 && !strcmp(model_path + plen - 5, ".gguf")) {
        if (csv) fprintf(csv, "section,batch,pair,formats_dense_ms,bf16_dense_ms,ratio,formats_bytes,bf16_bytes,read_bw_GBps\n");
        bf16_frac = formats_ab(m, model_path, pool, rbuf, rbytes, csv, fmt_ratio);
        printf("bf16 GEMV (batch 1) / read bandwidth around each pair: median %.3f\n", bf16_frac);
    }
    if (csv) fclose(csv);
    free(logits);
    flx_aligned_free(rbuf);
    flx_aligned_free(wsmem);
    flx_kv_store_destroy(store);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    free(ids);
    printf("SUMMARY gemv_bw_frac=%.3f tpot_full_over_16_005_8k=%.3f dense_formats_over_bf16_b1=%.3f "
           "dense_formats_over_bf16_b4=%.3f dense_formats_over_bf16_b8=%.3f dense_bw_frac_formats=%.3f\n", bf16_frac,
           tpot_last[0] / tpot_last[1], fmt_ratio[0], fmt_ratio[1], fmt_ratio[2], gemv_frac);
    return 0;
}
