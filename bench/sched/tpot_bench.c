/*
 * tpot_bench - time per output token of the real model (decode steps of a batch) with Fluxion's
 * attention against the fixed (16, 0.05) baseline, in the same decode loop on the same scheduler.
 *
 * METHOD
 * Two engines (FLUXION with the model's shipped predictor, FIXED (16, 0.05)) each get `batch`
 * sequences of `len` tokens of a real text (different offsets), prefilled in-process with their
 * prefill statistics (what a prefill node sends). Then they decode greedily, one step each in
 * turn, the order swapped every pair (A B, B A, ...); after WARM steps each pair gives the ratio
 * TPOT_fluxion / TPOT_fixed of two steps measured back to back, and the median and the spread of the
 * ratios are printed, with each engine's median TPOT and Fluxion's decision share (features +
 * predictor + selector) of its step, and per engine where a step's time went (dense part, attention:
 * decisions and tasks; the thread time of the features, the predictor, and in the tasks of the
 * window, scoring, top-k and attention), and the pairs' median by quarter of the run (Fluxion's
 * decisions change as the answers grow: more groups turn streaming-only after the first 20 to 30
 * steps). --csv writes every step of both engines (time, dense and attention time, host bytes,
 * streaming-only groups); bench/sched/plot_tpot.py draws it.
 *
 * usage: tpot_bench -m MODEL --text FILE --predictor W [--len 8192] [--batch 4] [--steps 128]
 *                   [--threads N] [--csv FILE]   (tpot_bench --help; flx/cli.h's convention)
 * Last line: RESULT tpot_fluxion_vs_16_005=<median ratio> ... (bench/sched/run puts it in SUMMARY).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/bench_stats.h"
#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model_load.h"
#include "flx/pool.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

enum { WARM = 2, MAXB = 16 };

static void die(const char *what)
{
    fprintf(stderr, "tpot_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

typedef struct side {
    flx_kv_store_h store;
    flx_engine_h e;
    double *ms;      /* (steps) */
} side_t;

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    (void)ctx, (void)seq, (void)token, (void)is_last, (void)why;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *pred_path = NULL, *csv_path = NULL;
    uint64_t len = 8192, batch = 4, steps = 128, threads = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, FLX_CLI_REQUIRED, "the text the sequences are cut from"),
        FLX_CLI_PATH(0, "predictor", "W", &pred_path, FLX_CLI_REQUIRED, "the model's predictor weights (Fluxion)"),
        FLX_CLI_UINT(0, "len", "N", &len, 64, 1u << 20, 0, "tokens of each sequence (default 8192)"),
        FLX_CLI_UINT(0, "batch", "N", &batch, 1, MAXB, 0, "sequences per engine (default 4)"),
        FLX_CLI_UINT(0, "steps", "N", &steps, WARM + 2, 10000, 0, "decode steps per engine, the first 2 not counted "
                     "(default 128)"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv_path, 0, "per step and engine: ms, dense and attention ms, host bytes, "
                     "streaming-only groups (default: none)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, FLX_POOL_MAX_WORKERS, 0, "pool workers (default: the CPU "
                     "budget)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("tpot_bench", "Time per output token of the real model with Fluxion against fixed "
                                 "(16, 0.05), steps of the two engines interleaved.", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    size_t text_len;
    char *text = NULL;
    if (flx_cli_read_file(text_path, (size_t)1 << 30, &text, &text_len))
        return flx_cli_fail(&cli, "--text: %s", flx_error_msg());
    flx_predictor_h pred;
    if (flx_predictor_load(pred_path, &pred)) return flx_cli_fail(&cli, "--predictor: %s", flx_error_msg());
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_pool_h pool;
    if (flx_pool_create(&pp, &pool)) die("worker pool");
    flx_model_t *m;
    flx_tok_h tok;
    if (flx_model_load_pool(model_path, pool, &m) || flx_tok_load(model_path, &tok)) die(model_path);
    const flx_model_config_t *c = &m->cfg;
    size_t n_ids = 0;
    flx_status_t est = flx_tok_encode(tok, text, text_len, 0, NULL, 0, &n_ids);   /* the size pass */
    if (est && est != FLX_ERR_CAPACITY) die("tokenizing");
    int32_t *ids = malloc(n_ids * sizeof *ids);
    if (!ids || flx_tok_encode(tok, text, text_len, 0, ids, n_ids, &n_ids)) die("tokenizing");
    const size_t stride = 997;   /* the sequences start at different places of the text */
    if (n_ids < len + stride * (batch - 1)) {
        fprintf(stderr, "tpot_bench: %s has %zu tokens, %llu sequences of %llu need %llu\n", text_path, n_ids,
                (unsigned long long)batch, (unsigned long long)len,
                (unsigned long long)(len + stride * (batch - 1)));
        return 1;
    }
    printf("tpot_bench: %s, %s; %llu sequences of %llu tokens of %s; %llu decode steps per engine, %d warm-up\n",
           c->name, flx_pool_describe(pool), (unsigned long long)batch, (unsigned long long)len, text_path,
           (unsigned long long)steps, WARM);
    flx_fwd_shape_t fs = {.max_prompt = (uint32_t)len, .max_batch = 1, .pool = pool};
    size_t wsb;
    flx_fwd_ws_t *fws;
    void *wsmem = NULL;
    if (flx_fwd_plan(m, &fs, &wsb) || !(wsmem = flx_aligned_alloc(64, wsb)) || flx_fwd_ws_init(m, &fs, wsmem, wsb, &fws))
        die("prefill workspace");
    float *lg = malloc(c->vocab * sizeof *lg);
    side_t sd[2];   /* 0: fluxion, 1: fixed (16, 0.05) */
    const char *name[2] = {"fluxion", "fixed(16,0.05)"};
    for (int k = 0; k < 2; k++) {
        const size_t per_tok = (size_t)c->n_layers * c->n_kv_heads * c->head_dim * 2 * sizeof(flx_bf16_t);
        flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                    .capacity_bytes = per_tok * (len + steps + 64) * batch * 2 + ((size_t)64 << 20),
                                    .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads,
                                    .head_dim = c->head_dim};
        if (flx_kv_store_create(&kp, &sd[k].store)) die("kvstore");
        flx_engine_params_t ep = flx_engine_params_default();
        ep.max_batch = (uint32_t)batch, ep.max_l_cpu = (uint32_t)len, ep.pool = pool;
        if (k == 0) ep.mode = FLX_ENGINE_ATTN_FLUXION, ep.predictor = pred;
        else ep.mode = FLX_ENGINE_ATTN_FIXED, ep.blk = 16, ep.bgt = 0.05f;
        if (flx_engine_create(m, sd[k].store, &ep, &sd[k].e)) die("engine");
        sd[k].ms = calloc(steps, sizeof(double));
        for (uint64_t b = 0; b < batch; b++) {
            flx_kv_session_id_t sid;
            const uint64_t t0 = flx_now_ns();
            if (flx_engine_prefill_with_stats(m, fws, sd[k].store, ids + b * stride, (uint32_t)len,
                                              (uint32_t)steps + 4, 0.1f, &sid, lg))
                die("prefill");
            printf("  %s: prefill of sequence %llu: %.1f s\n", name[k], (unsigned long long)b,
                   (double)(flx_now_ns() - t0) * 1e-9);
            fflush(stdout);
            flx_gen_params_t gp = {.max_new_tokens = (uint32_t)steps + 1, .eos_id = -1,
                                   .sampling = flx_sampling_greedy(), .on_token = on_token};
            flx_engine_seq_id_t id;
            if (flx_engine_add(sd[k].e, sid, (int32_t)flx_sample_argmax(lg, c->vocab), &gp, &id)) die("add");
        }
    }
    FILE *csv = NULL;
    if (csv_path && !(csv = fopen(csv_path, "w"))) die("--csv: cannot create the file");
    if (csv) fprintf(csv, "step,engine,ms,dense_ms,attn_ms,decide_ms,host_mib,skipped_groups\n");
    double pred_ns = 0, step_ns = 0;
    for (uint64_t s = 0; s < steps; s++)
        for (int j = 0; j < 2; j++) {
            const int k = (int)((s + (uint64_t)j) % 2);   /* A B, B A, ... */
            const uint64_t t0 = flx_now_ns();
            flx_status_t st = flx_engine_step(sd[k].e);
            if (st < 0) die(name[k]);
            sd[k].ms[s] = (double)(flx_now_ns() - t0) * 1e-6;
            flx_engine_stats_t x;
            flx_engine_last_stats(sd[k].e, &x);
            if (csv)
                fprintf(csv, "%llu,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%llu\n", (unsigned long long)s,
                        k == 0 ? "fluxion" : "fixed_16_005", sd[k].ms[s],
                        (double)x.dense_ns * 1e-6, (double)x.attn_ns * 1e-6, (double)x.predict_ns * 1e-6,
                        (double)x.host_bytes / 1048576.0, (unsigned long long)x.n_skipped);
            if (k == 0 && s >= WARM) pred_ns += (double)x.predict_ns, step_ns += (double)x.step_ns;
        }
    if (csv) fclose(csv);
    const int n = (int)(steps - WARM);   /* >= 2: --steps is at least WARM + 2 */
    double *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r), med[2];
    for (int i = 0; i < n; i++) r[i] = sd[0].ms[WARM + i] / sd[1].ms[WARM + i];
    /* the pairs' median by quarter of the run, in step order (does the ratio drift as the answers grow?) */
    double quarter[4] = {NAN, NAN, NAN, NAN};
    if (n >= 8) {
        double *v = malloc((size_t)n * sizeof *v);
        for (int qi = 0; qi < 4; qi++) {
            const int a = n * qi / 4, b = n * (qi + 1) / 4;
            memcpy(v, r + a, (size_t)(b - a) * sizeof *v);
            quarter[qi] = flx_bench_median(v, b - a);
        }
        free(v);
    }
    const double rmed = flx_bench_median(r, n), rmin = r[0], rmax = r[n - 1];
    for (int k = 0; k < 2; k++) {
        double *v = malloc((size_t)n * sizeof *v);
        memcpy(v, sd[k].ms + WARM, (size_t)n * sizeof *v);
        med[k] = flx_bench_median(v, n);
        free(v);
    }
    flx_engine_stats_t tf, tx;
    flx_engine_total_stats(sd[0].e, &tf);
    flx_engine_total_stats(sd[1].e, &tx);
    const flx_engine_stats_t *tt[2] = {&tf, &tx};
    for (int k = 0; k < 2; k++) {
        const flx_engine_stats_t *t = tt[k];
        const double ns = 1e-6 / (double)(t->n_steps ? t->n_steps : 1);   /* ns summed -> ms per step */
        printf("%-16s TPOT median %8.2f ms, host bytes per step %8.2f MiB; per step (mean, warm-up included): dense "
               "%.2f ms, attention %.2f ms (decisions %.2f: features and predictor %.2f, selector %.2f; tasks %.2f); "
               "thread-ms: features %.2f, predictor %.2f, in tasks window %.2f, scoring %.2f, top-k %.2f, attention "
               "%.2f\n",
               name[k], med[k], (double)t->host_bytes / (double)(t->n_steps ? t->n_steps : 1) / 1048576.0,
               (double)t->dense_ns * ns, (double)t->attn_ns * ns, (double)t->predict_ns * ns, (double)t->decide_ns * ns,
               (double)t->select_ns * ns, (double)t->sched_wall_ns * ns, (double)t->feat_cpu_ns * ns,
               (double)t->mlp_cpu_ns * ns,
               (double)t->window_ns * ns, (double)t->score_ns * ns, (double)t->topk_ns * ns,
               (double)t->host_attn_ns * ns);
    }
    printf("ratio per step pair fluxion / fixed(16,0.05): median %.3f [%.3f, %.3f] over %d pairs; fluxion's decisions "
           "(features + predictor + selector) %.1f%% of its step, %.0f of %u (layer, sequence, kv group)s "
           "streaming-only per step\n",
           rmed, rmin, rmax, n, step_ns > 0 ? 100.0 * pred_ns / step_ns : 0.0, (double)tf.n_skipped / tf.n_steps,
           c->n_layers * c->n_kv_heads * (uint32_t)batch);
    if (n >= 8)
        printf("ratio median by quarter of the steps, in order: %.3f %.3f %.3f %.3f\n", quarter[0], quarter[1],
               quarter[2], quarter[3]);
    printf("RESULT tpot_fluxion_vs_16_005=%.3f tpot_fluxion_ms=%.2f tpot_16_005_ms=%.2f predictor_share=%.4f\n", rmed,
           med[0], med[1], step_ns > 0 ? pred_ns / step_ns : 0.0);
    for (int k = 0; k < 2; k++) {
        flx_engine_destroy(sd[k].e);
        flx_kv_store_destroy(sd[k].store);
        free(sd[k].ms);
    }
    free(r), free(lg), free(ids), free(text);
    flx_aligned_free(wsmem);
    flx_predictor_destroy(pred);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    return 0;
}
