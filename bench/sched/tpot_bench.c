/*
 * tpot_bench - time per output token of the real model (decode steps of a batch) with Fluxion's
 * attention against the fixed (16, 0.05) baseline, in the same decode loop on the same scheduler.
 *
 * METHOD
 * Each configuration (FLUXION with the model's shipped predictor, FIXED (16, 0.05)) runs as
 * `instances` engines (default 4), each with its own store. `batch` sequences of `len` tokens of a real text
 * (different offsets) are prefilled once, in-process, with their prefill statistics (what a prefill
 * node sends), and every layer is written into a session of every store. Then all engines decode
 * greedily, one step each in turn, the order rotated every step. Why several engines: engines of
 * the SAME configuration doing the same work differ by a constant of the engine that holds for the
 * whole run and changes from run to run (their dense parts up to 1.7 ms, 13 %, apart at 2K batch 4
 * in A/A runs, --same; the cause was not found: each engine's buffers and store land elsewhere in
 * memory); one engine a side would add that constant to the comparison. So
 * after WARM steps each step gives the ratio of the configurations' mean step times over their
 * instances, and the median and the spread of those ratios are printed, with the A/A ratio of the
 * instances of one configuration (the run's noise floor: 1 when placement does not matter), each
 * configuration's median TPOT, Fluxion's decision share (features + predictor + selector) of its
 * step, where a step's time went (dense part, attention: decisions and tasks; the thread time of the
 * features, the predictor, and in the tasks of the window, scoring, top-k and attention), and the
 * ratios' median by quarter of the run (Fluxion's decisions change as the answers grow: more groups
 * turn streaming-only after the first 20 to 30 steps). Instances of a configuration must generate
 * the same tokens (checked: the run fails otherwise). --same runs FIXED (16, 0.05) on both sides (an
 * A/A run). --csv writes every step of every engine (time, dense and attention time, host bytes,
 * streaming-only groups, the host bytes' Quest metadata); bench/sched/plot_tpot.py draws it. The
 * host bytes per step are printed with their split: Quest metadata scored, K and V attended.
 *
 * --gpu [DEVICE] runs every engine on its GPU path (flx/engine.h GPU PATH: the dense part on the
 * device, window attention on device windows, a GPU worker beside the CPU workers; one device copy
 * of the model shared by the engines, the stores pinned with device windows); the prefill that
 * fills the stores stays on the CPU.
 *
 * usage: tpot_bench -m MODEL --text FILE --predictor W [--len 8192] [--batch 4] [--steps 128]
 *                   [--instances 4] [--same] [--threads N] [--gpu [DEVICE]] [--csv FILE]   (tpot_bench --help)
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
#include "flx/forward_gpu.h"
#include "flx/kvstore.h"
#include "flx/model_load.h"
#include "flx/pool.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

enum { WARM = 2, MAXB = 16, MAXI = 8 };

static void die(const char *what)
{
    fprintf(stderr, "tpot_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

typedef struct side {
    int cfg;                       /* 0: fluxion, 1: fixed (16, 0.05) */
    flx_kv_store_h store;
    flx_engine_h e;
    double *ms;                    /* (steps) */
    int32_t *tok;                  /* (batch, steps + 1) generated tokens, for the instances' check */
    uint32_t n_tok[MAXB];
    flx_engine_seq_id_t seq[MAXB];
    uint32_t batch, cap;
} side_t;

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    (void)is_last, (void)why;
    side_t *sd = ctx;
    for (uint32_t b = 0; b < sd->batch; b++)
        if (sd->seq[b] == seq && sd->n_tok[b] < sd->cap) sd->tok[(size_t)b * sd->cap + sd->n_tok[b]++] = token;
}

/* One prefill, every store: each layer (and its statistics) into the sequence's session of each. */
typedef struct fan {
    side_t *sd;
    int n;
    const flx_kv_session_id_t *sid;   /* (n) */
} fan_t;

static flx_status_t fan_on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                                 const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor)
{
    const fan_t *f = ctx;
    for (int i = 0; i < f->n; i++) {
        flx_status_t st = flx_engine_store_layer(f->sd[i].store, f->sid[i], layer, n, k, v, stats, mean_k, q_anchor);
        if (st) return st;
    }
    return FLX_OK;
}

static double mean_ms(const side_t *sd, int n, int cfg, uint64_t s)
{
    double sum = 0;
    int c = 0;
    for (int i = 0; i < n; i++)
        if (sd[i].cfg == cfg) sum += sd[i].ms[s], c++;
    return sum / c;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *pred_path = NULL, *csv_path = NULL;
    uint64_t len = 8192, batch = 4, steps = 128, threads = 0, instances = 4, gpu_dev = 0;
    int same = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, FLX_CLI_REQUIRED, "the text the sequences are cut from"),
        FLX_CLI_PATH(0, "predictor", "W", &pred_path, FLX_CLI_REQUIRED, "the model's predictor weights (Fluxion)"),
        FLX_CLI_UINT(0, "len", "N", &len, 64, 1u << 20, 0, "tokens of each sequence (default 8192)"),
        FLX_CLI_UINT(0, "batch", "N", &batch, 1, MAXB, 0, "sequences per engine (default 4)"),
        FLX_CLI_UINT(0, "steps", "N", &steps, WARM + 2, 10000, 0, "decode steps per engine, the first 2 not counted "
                     "(default 128)"),
        FLX_CLI_UINT(0, "instances", "N", &instances, 1, MAXI, 0, "engines per configuration, each with its own "
                     "store, their step times averaged (default 4)"),
        FLX_CLI_FLAG(0, "same", &same, "an A/A run: fixed (16, 0.05) on both sides"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv_path, 0, "per step and engine: ms, dense and attention ms, host bytes, "
                     "streaming-only groups, the host bytes' Quest metadata (default: none)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, FLX_POOL_MAX_WORKERS, 0, "pool workers (default: the CPU "
                     "budget)"),
        FLX_CLI_UINT(0, "gpu", "DEVICE", &gpu_dev, 0, 1023, FLX_CLI_OPTIONAL, "every engine on its GPU path on CUDA "
                     "device DEVICE (default 0): dense part, device windows and a GPU worker"),
    };
    flx_cli_t cli = FLX_CLI_INIT("tpot_bench", "Time per output token of the real model with Fluxion against fixed "
                                 "(16, 0.05), steps of the engines interleaved.", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const int use_gpu = flx_cli_given(&cli, "gpu") > 0;
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
    flx_gpu_model_h gm = NULL;   /* one device copy, borrowed by every engine */
    if (use_gpu && flx_gpu_model_create(m, (int)gpu_dev, &gm)) die("--gpu");
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
    const char *name[2] = {same ? "fixed(16,0.05)/A" : "fluxion", "fixed(16,0.05)"};
    const char *csv_name[2] = {same ? "fixed_16_005_a" : "fluxion", "fixed_16_005"};
    printf("tpot_bench: %s, %s; %llu sequences of %llu tokens of %s; %llu decode steps per engine, %d warm-up; "
           "%llu engine(s) per configuration%s%s\n",
           c->name, flx_pool_describe(pool), (unsigned long long)batch, (unsigned long long)len, text_path,
           (unsigned long long)steps, WARM, (unsigned long long)instances, same ? "; A/A: fixed on both sides" : "",
           use_gpu ? "; the GPU path (dense part, windows and a GPU worker on the device)" : "");
    flx_fwd_shape_t fs = {.max_prompt = (uint32_t)len, .max_batch = 1, .pool = pool};
    size_t wsb;
    flx_fwd_ws_t *fws;
    void *wsmem = NULL;
    if (flx_fwd_plan(m, &fs, &wsb) || !(wsmem = flx_aligned_alloc(64, wsb)) || flx_fwd_ws_init(m, &fs, wsmem, wsb, &fws))
        die("prefill workspace");
    float *lg = malloc(c->vocab * sizeof *lg);
    const int ns = 2 * (int)instances;
    side_t sd[2 * MAXI];
    memset(sd, 0, sizeof sd);
    for (int i = 0; i < ns; i++) {   /* created interleaved: fluxion, fixed, fluxion, fixed, ... */
        side_t *x = &sd[i];
        x->cfg = i % 2, x->batch = (uint32_t)batch, x->cap = (uint32_t)steps + 1;
        const size_t per_tok = (size_t)c->n_layers * c->n_kv_heads * c->head_dim * 2 * sizeof(flx_bf16_t);
        flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                    .capacity_bytes = per_tok * (len + steps + 64) * batch * 2 + ((size_t)64 << 20),
                                    .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads,
                                    .head_dim = c->head_dim};
        if (use_gpu) {   /* windows mirrored on the device; the arena pinned for the GPU worker's UVA reads */
            kp.field_mask |= FLX_KV_STORE_FIELD_FLAGS | FLX_KV_STORE_FIELD_CUDA_DEVICE;
            kp.flags = FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE | FLX_KV_STORE_PIN_CUDA;
            kp.cuda_device = (int)gpu_dev;
        }
        if (flx_kv_store_create(&kp, &x->store)) die("kvstore");
        flx_engine_params_t ep = flx_engine_params_default();
        ep.max_batch = (uint32_t)batch, ep.max_l_cpu = (uint32_t)len, ep.pool = pool;
        if (x->cfg == 0 && !same) ep.mode = FLX_ENGINE_ATTN_FLUXION, ep.predictor = pred;
        else ep.mode = FLX_ENGINE_ATTN_FIXED, ep.blk = 16, ep.bgt = 0.05f;
        ep.use_gpu = use_gpu, ep.cuda_device = (int)gpu_dev, ep.gpu_model = gm;
        if (flx_engine_create(m, x->store, &ep, &x->e)) die("engine");
        x->ms = calloc(steps, sizeof(double));
        x->tok = calloc((size_t)batch * x->cap, sizeof(int32_t));
        if (!x->ms || !x->tok) die("memory");
    }
    flx_kv_store_info_t si;
    flx_kv_store_info(sd[0].store, &si);
    for (uint64_t b = 0; b < batch; b++) {
        flx_kv_session_id_t sid[2 * MAXI];
        flx_kv_session_params_t sp = {.prompt_len = (uint32_t)len, .max_new_tokens = (uint32_t)steps + 4};
        for (int i = 0; i < ns; i++)
            if (flx_kv_session_open(sd[i].store, &sp, &sid[i])) die("session");
        fan_t fan = {.sd = sd, .n = ns, .sid = sid};
        flx_prefill_out_t out = {.on_layer = fan_on_layer, .ctx = &fan, .tau = 0.1f, .sink = si.sink,
                                 .local = si.local};
        const uint64_t t0 = flx_now_ns();
        if (flx_engine_prefill_run(m, fws, ids + b * stride, (uint32_t)len, &out, lg)) die("prefill");
        printf("  prefill of sequence %llu into %d stores: %.1f s\n", (unsigned long long)b, ns,
               (double)(flx_now_ns() - t0) * 1e-9);
        fflush(stdout);
        for (int i = 0; i < ns; i++) {
            flx_gen_params_t gp = {.max_new_tokens = (uint32_t)steps + 1, .eos_id = -1,
                                   .sampling = flx_sampling_greedy(), .on_token = on_token, .ctx = &sd[i]};
            if (flx_engine_add(sd[i].e, sid[i], (int32_t)flx_sample_argmax(lg, c->vocab), &gp, &sd[i].seq[b]))
                die("add");
        }
    }
    FILE *csv = NULL;
    if (csv_path && !(csv = fopen(csv_path, "w"))) die("--csv: cannot create the file");
    if (csv) fprintf(csv, "step,engine,instance,ms,dense_ms,attn_ms,decide_ms,host_mib,skipped_groups,meta_mib\n");
    double pred_ns = 0, step_ns = 0;
    for (uint64_t s = 0; s < steps; s++)
        for (int j = 0; j < ns; j++) {
            side_t *x = &sd[(s + (uint64_t)j) % (uint64_t)ns];   /* the order rotated every step */
            const uint64_t t0 = flx_now_ns();
            flx_status_t st = flx_engine_step(x->e);
            if (st < 0) die(name[x->cfg]);
            x->ms[s] = (double)(flx_now_ns() - t0) * 1e-6;
            flx_engine_stats_t st_x;
            flx_engine_last_stats(x->e, &st_x);
            if (csv)
                fprintf(csv, "%llu,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%llu,%.3f\n", (unsigned long long)s,
                        csv_name[x->cfg], (int)((x - sd) / 2), x->ms[s], (double)st_x.dense_ns * 1e-6,
                        (double)st_x.attn_ns * 1e-6, (double)st_x.predict_ns * 1e-6,
                        (double)st_x.host_bytes / 1048576.0, (unsigned long long)st_x.n_skipped,
                        (double)st_x.host_meta_bytes / 1048576.0);
            if (x->cfg == 0 && s >= WARM) pred_ns += (double)st_x.predict_ns, step_ns += (double)st_x.step_ns;
        }
    if (csv) fclose(csv);
    /* the instances of a configuration decoded the same KV greedily: the same tokens, or the run is void */
    for (int i = 2; i < ns; i++)
        for (uint64_t b = 0; b < batch; b++)
            if (sd[i].n_tok[b] != sd[i % 2].n_tok[b] ||
                memcmp(sd[i].tok + b * sd[i].cap, sd[i % 2].tok + b * sd[i].cap, sd[i].n_tok[b] * sizeof(int32_t))) {
                fprintf(stderr, "tpot_bench: %s instances 0 and %d generated different tokens for sequence %llu\n",
                        name[i % 2], i / 2, (unsigned long long)b);
                return 1;
            }
    const int n = (int)(steps - WARM);   /* >= 2: --steps is at least WARM + 2 */
    double *r = malloc((size_t)n * sizeof *r), *v = malloc((size_t)n * sizeof *v), med[2];
    if (!r || !v) die("memory");
    for (int i = 0; i < n; i++) r[i] = mean_ms(sd, ns, 0, WARM + i) / mean_ms(sd, ns, 1, WARM + i);
    /* the ratios' median by quarter of the run, in step order (does the ratio drift as the answers grow?) */
    double quarter[4] = {NAN, NAN, NAN, NAN};
    for (int qi = 0; qi < 4 && n >= 8; qi++) {
        const int a = n * qi / 4, b = n * (qi + 1) / 4;
        memcpy(v, r + a, (size_t)(b - a) * sizeof *v);
        quarter[qi] = flx_bench_median(v, b - a);
    }
    const double rmed = flx_bench_median(r, n), rmin = r[0], rmax = r[n - 1];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) v[i] = mean_ms(sd, ns, k, WARM + i);
        med[k] = flx_bench_median(v, n);
    }
    /* A/A: instance 0 against the mean of the others, each configuration (same work, other memory) */
    double aa[2] = {NAN, NAN};
    for (int k = 0; k < 2 && instances > 1; k++) {
        for (int i = 0; i < n; i++) {
            double o = 0;
            for (int j = 2 + k; j < ns; j += 2) o += sd[j].ms[WARM + i];
            v[i] = sd[k].ms[WARM + i] / (o / (double)(instances - 1));
        }
        aa[k] = flx_bench_median(v, n);
    }
    const double share = step_ns > 0 ? pred_ns / step_ns : 0.0;   /* of the first configuration's steps */
    for (int k = 0; k < 2; k++) {
        flx_engine_stats_t t;
        memset(&t, 0, sizeof t);
        for (int i = k; i < ns; i += 2) {
            flx_engine_stats_t x;
            flx_engine_total_stats(sd[i].e, &x);
            flx_engine_stats_add(&t, &x);
        }
        const double ns_ms = 1e-6 / (double)(t.n_steps ? t.n_steps : 1);   /* ns summed -> ms per step */
        const double mib = 1.0 / (double)(t.n_steps ? t.n_steps : 1) / 1048576.0;   /* bytes summed -> MiB a step */
        printf("%-16s TPOT median %8.2f ms, host bytes per step %8.2f MiB (Quest metadata %.2f, K and V %.2f); per "
               "step (mean, warm-up included): dense %.2f ms, attention %.2f ms (decisions %.2f: features and "
               "predictor %.2f, selector %.2f; tasks %.2f); thread-ms: features %.2f, predictor %.2f, in tasks window "
               "%.2f, scoring %.2f, top-k %.2f, attention %.2f; CPU workers in tasks %.2f (%.0f%% of %u x tasks)\n",
               name[k], med[k], (double)t.host_bytes * mib, (double)t.host_meta_bytes * mib,
               (double)(t.host_bytes - t.host_meta_bytes) * mib,
               (double)t.dense_ns * ns_ms, (double)t.attn_ns * ns_ms, (double)t.predict_ns * ns_ms,
               (double)t.decide_ns * ns_ms, (double)t.select_ns * ns_ms, (double)t.sched_wall_ns * ns_ms,
               (double)t.feat_cpu_ns * ns_ms, (double)t.mlp_cpu_ns * ns_ms, (double)t.window_ns * ns_ms,
               (double)t.score_ns * ns_ms, (double)t.topk_ns * ns_ms, (double)t.host_attn_ns * ns_ms,
               (double)t.cpu_busy_ns * ns_ms,
               t.sched_wall_ns ? 100.0 * (double)t.cpu_busy_ns / ((double)t.sched_wall_ns * flx_pool_size(pool)) : 0.0,
               flx_pool_size(pool));
        if (use_gpu)   /* the idle ratio as flx-generate gives it: idle over the attention layers' wall time */
            printf("%-16s GPU per step: %.1f tasks on the GPU worker, busy %.2f ms, idle %.2f ms of the attention "
                   "layers' %.2f ms (idle ratio %.3f)\n", name[k],
                   (double)t.n_gpu_tasks / (double)(t.n_steps ? t.n_steps : 1), (double)t.gpu_busy_ns * ns_ms,
                   (double)t.gpu_idle_ns * ns_ms, (double)t.sched_wall_ns * ns_ms,
                   t.sched_wall_ns ? (double)t.gpu_idle_ns / (double)t.sched_wall_ns : NAN);
    }
    flx_engine_stats_t tf;
    flx_engine_total_stats(sd[0].e, &tf);
    printf("ratio per step %s / fixed(16,0.05) (each the mean of its %llu engine(s)): median %.3f [%.3f, %.3f] over "
           "%d steps; %s's decisions (features + predictor + selector) %.1f%% of its step, %.0f of %u (layer, "
           "sequence, kv group)s streaming-only per step\n",
           name[0], (unsigned long long)instances, rmed, rmin, rmax, n, name[0], 100.0 * share,
           (double)tf.n_skipped / (double)(tf.n_steps ? tf.n_steps : 1), c->n_layers * c->n_kv_heads * (uint32_t)batch);
    if (instances > 1)
        printf("A/A, engine 0 / the other engines of its configuration (same work; 1 if placement did not matter): "
               "%s %.3f, %s %.3f\n", name[0], aa[0], name[1], aa[1]);
    if (n >= 8)
        printf("ratio median by quarter of the steps, in order: %.3f %.3f %.3f %.3f\n", quarter[0], quarter[1],
               quarter[2], quarter[3]);
    printf("RESULT tpot_fluxion_vs_16_005=%.3f tpot_fluxion_ms=%.2f tpot_16_005_ms=%.2f predictor_share=%.4f "
           "aa_fluxion=%.3f aa_16_005=%.3f\n", rmed, med[0], med[1], share, aa[0], aa[1]);
    for (int i = 0; i < ns; i++) {
        flx_engine_destroy(sd[i].e);
        flx_kv_store_destroy(sd[i].store);
        free(sd[i].ms);
        free(sd[i].tok);
    }
    free(r), free(v), free(lg), free(ids), free(text);
    flx_aligned_free(wsmem);
    flx_predictor_destroy(pred);
    flx_tok_destroy(tok);
    flx_gpu_model_destroy(gm);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    return 0;
}
