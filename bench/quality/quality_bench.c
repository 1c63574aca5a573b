/*
 * quality_bench - attention quality of Fluxion against full attention and fixed (blk, bgt) on one
 * KV source (a real model's KV dump or the synthetic workload), through the real kvstore and the
 * same kernels the decode loop runs.
 *
 * For each chosen layer and decode step, per query head h: o_full (exact, flx_full_output), the
 * configuration's output o_c, and
 *   within_tau   ||o_c - o_full|| / max_h' ||o_full,h'|| <= tau        (Eq. 2)
 *   rel_err      ||o_c - o_full|| / ||o_full||
 *   recall       synthetic retrieval heads only: share of the logical blocks (at the blk the head
 *                read with) holding a ground-truth needle token that the head selected
 *   bytes        host bytes read (Quest metadata + distinct K/V blocks) per (layer, step, sequence)
 * Fluxion = features -> predictor -> selector -> host part of retrieval groups (streaming groups
 * read nothing) merged with the window partial the features computed; "fluxion" at the weights'
 * calibrated operating point, "fluxion_paper" at the paper's plain rule.
 * Appends one CSV row per configuration; with --time-batch B also times one Fluxion attention
 * step of B sequences per layer and reports the predictor's share of it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/budget.h"
#include "flx/cli.h"
#include "flx/predictor.h"
#include "flx/selector.h"
#include "flx/synth.h"
#include "flx/util.h"
#include "replay.h"

/* "fluxion" runs the selector at the operating point the weights carry (calibrated by
 * fluxion-train --calib), "fluxion_paper" at the paper's plain rule (s >= 0.5, budgets as predicted). */
enum { N_CFG = 7, CFG_FLUXION = 5, CFG_FLUXION_PAPER = 6 };
static const char *CFG_NAME[N_CFG] = {"full", "fixed_16_005", "fixed_16_002", "fixed_32_005", "fixed_32_002", "fluxion",
                                      "fluxion_paper"};
static const uint32_t CFG_BLK[N_CFG] = {0, 16, 16, 32, 32, 0, 0};
static const float CFG_BGT[N_CFG] = {1.0f, 0.05f, 0.02f, 0.05f, 0.02f, 0.0f, 0.0f};

typedef struct acc {
    double heads, within, rel, recall_num, recall_den, bytes, steps, blk_sum, groups_run, groups;
} acc_t;

static void die(const char *what)
{
    fprintf(stderr, "quality_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

/* Share of the needle blocks of head h (in host logical blocks of size blk) among its selection. */
static void needle_recall(const flx_synth_t *syn, uint32_t layer, uint32_t h, uint32_t step, uint32_t n_sink,
                          uint32_t l_cpu, uint32_t blk, const uint32_t *sel, uint32_t k, acc_t *a)
{
    uint32_t b[16], e[16];
    uint32_t n = flx_synth_needles(syn, layer, h, (int32_t)step, b, e, 16);
    uint32_t nb = blk ? (l_cpu + blk - 1) / blk : 1;
    uint8_t *is_needle = calloc(nb, 1);
    if (!is_needle) return;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t p = b[i]; p < e[i]; p++)
            if (p >= n_sink && p < n_sink + l_cpu) is_needle[blk ? (p - n_sink) / blk : 0] = 1;
    uint32_t den = 0, num = 0;
    for (uint32_t j = 0; j < nb; j++) den += is_needle[j];
    if (blk == 0) num = den;   /* full attention reads every block */
    else
        for (uint32_t j = 0; j < k; j++) num += is_needle[sel[j]] ? 1 : 0;
    a->recall_num += num;
    a->recall_den += den;
    free(is_needle);
}

static double dist(const float *a, const float *b, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) s += ((double)a[d] - b[d]) * ((double)a[d] - b[d]);
    return sqrt(s);
}

/* One configuration of one step, a kv group per item; each group's recall counts in its own slot,
 * summed in group order afterwards (the totals do not depend on the pool). */
typedef struct qjob {
    int c;
    flx_replay_t *r;
    const flx_synth_t *syn;
    flx_attn_ws_t *ws;                 /* one per worker */
    const flx_head_pred_t *hp;
    const flx_select_params_t *sel_cal, *sel_paper;
    float *budgets, *o, *lse;
    const float *o_win, *lse_win;
    uint32_t *sel_blk;
    uint64_t *bytes_g;
    acc_t *recall_g;                   /* (Hkv) */
    uint32_t layer, step, n_sink, l_cpu, G, D;
} qjob_t;

static flx_status_t q_group(void *ctx, const flx_pool_worker_t *wk, uint64_t g0, uint64_t g1)
{
    const qjob_t *j = ctx;
    const uint32_t G = j->G, D = j->D, c = (uint32_t)j->c;
    flx_attn_ws_t *w = &j->ws[wk->index];
    for (uint64_t g = g0; g < g1; g++) {
        const float *qg = j->r->q_step + (size_t)g * G * D;
        float *og = j->o + (size_t)g * G * D, *lg = j->lse + (size_t)g * G;
        flx_attn_timing_t tm = {0};
        flx_status_t st = FLX_OK;
        j->sel_blk[g] = CFG_BLK[c];
        if (c >= CFG_FLUXION) {
            flx_selection_t s;
            st = flx_select_group(j->hp + (size_t)g * G, G, j->l_cpu, c == CFG_FLUXION ? j->sel_cal : j->sel_paper,
                                  j->budgets + (size_t)g * G, &s);
            j->sel_blk[g] = s.skip ? 16 : s.blk;
            if (!st && s.skip) {
                memcpy(og, j->o_win + (size_t)g * G * D, (size_t)G * D * sizeof(float));
                memset(w->k, 0, G * sizeof(uint32_t));
            } else if (!st) {
                flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = s.blk, .budgets = j->budgets + (size_t)g * G};
                st = flx_attn_host_run(w, &j->r->views[g], qg, &cfg, og, lg, &tm);
                if (!st)
                    flx_attn_merge(G, D, j->o_win + (size_t)g * G * D, j->lse_win + (size_t)g * G, og, lg, og, lg);
            }
        } else {
            flx_attn_cfg_t cfg = {.mode = c == 0 ? FLX_ATTN_FULL : FLX_ATTN_FIXED, .blk = CFG_BLK[c] ? CFG_BLK[c] : 16,
                                  .budget = CFG_BGT[c]};
            st = flx_attn_group_run(w, &j->r->views[g], qg, &cfg, og, lg, &tm);
        }
        if (st) return st;
        j->bytes_g[g] = tm.score_bytes + tm.attn_bytes;
        acc_t *rc = &j->recall_g[g];
        memset(rc, 0, sizeof *rc);
        if (j->syn && c != 0)
            for (uint32_t jj = 0; jj < G; jj++) {
                uint32_t h = (uint32_t)g * G + jj;
                if (flx_synth_head_kind(j->syn, j->layer, h) != FLX_SYNTH_RETRIEVAL) continue;
                needle_recall(j->syn, j->layer, h, j->step, j->n_sink, j->l_cpu, j->sel_blk[g],
                              w->sel + (size_t)jj * w->n_max, w->k[jj], rc);
            }
    }
    return FLX_OK;
}

/* The timed Fluxion attention step: task = (sequence, kv group) of a batch. */
typedef struct tjob {
    flx_replay_t *r;
    flx_attn_ws_t *ws;
    const flx_head_pred_t *pb;
    const flx_select_params_t *sel;
    float *bb, *ob, *lb;
    const float *owb, *lwb;
    uint32_t Hq, Hkv, G, D, l_cpu;
} tjob_t;

static flx_status_t t_task(void *ctx, const flx_pool_worker_t *wk, uint64_t t0, uint64_t t1)
{
    const tjob_t *j = ctx;
    const uint32_t G = j->G, D = j->D;
    for (uint64_t task = t0; task < t1; task++) {
        const uint32_t b = (uint32_t)task / j->Hkv, g = (uint32_t)task % j->Hkv;
        const size_t base = (size_t)b * j->Hq + (size_t)g * G;
        flx_selection_t s;
        flx_status_t st = flx_select_group(j->pb + base, G, j->l_cpu, j->sel, j->bb + base, &s);
        if (!st && !s.skip) {
            flx_attn_cfg_t cfg = {.mode = FLX_ATTN_SPARSE, .blk = s.blk, .budgets = j->bb + base};
            st = flx_attn_host_run(&j->ws[wk->index], &j->r->views[g], j->r->q_step + (size_t)g * G * D, &cfg,
                                   j->ob + base * D, j->lb + base, NULL);
            if (!st)
                flx_attn_merge(G, D, j->owb + base * D, j->lwb + base, j->ob + base * D, j->lb + base,
                               j->ob + base * D, j->lb + base);
        }
        if (st) return st;
    }
    return FLX_OK;
}

int main(int argc, char **argv)
{
    const char *source = NULL, *weights = NULL, *csv = NULL, *label = "", *layers_s = NULL;
    uint64_t every = 8, n_layers_pick = 4, time_batch = 0, threads = 0, layer_arg[256];
    uint32_t n_layer_arg = 0;
    float tau = 0.1f;
    flx_cli_opt_t opts[] = {
        FLX_CLI_STR(0, "source", "SPEC", &source, FLX_CLI_REQUIRED,
                    "dump:FILE or synth:L,Hq,Hkv,D,len,steps[,seed[,share]]"),
        FLX_CLI_PATH(0, "weights", "FILE", &weights, FLX_CLI_REQUIRED, "predictor weights"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv, 0, "CSV rows appended"),
        FLX_CLI_STR(0, "label", "NAME", &label, 0, "the rows' label in the CSV"),
        FLX_CLI_STR(0, "layers", "N,N,..", &layers_s, 0, "layers to measure"),
        FLX_CLI_UINT(0, "n-layers", "N", &n_layers_pick, 1, 4096, 0, "or N layers spread over the model (default 4)"),
        FLX_CLI_UINT(0, "step-every", "N", &every, 1, 1u << 20, 0, "every N-th decode step (default 8)"),
        FLX_CLI_UINT(0, "time-batch", "B", &time_batch, 0, 64, 0, "also time the predictor at batch B (0: no)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, 256, 0, "pool workers (default: FLX_THREADS, else the CPU budget)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("quality_bench", "Attention quality of Fluxion against full and fixed (blk, bgt) on a "
                                 "KV source: within-tau share, error, needle recall, host bytes.", opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_exclusive(&cli, "layers", "n-layers", 0) ||
        (layers_s && flx_cli_u64_list("layers", layers_s, 0, 4095, layer_arg, 256, &n_layer_arg)))
        return flx_cli_usage_error(&cli, NULL);
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_pool_h pool;
    if (flx_pool_create(&pp, &pool)) die("worker pool");
    printf("quality_bench: %s\n", flx_pool_describe(pool));
    const int nt = (int)flx_pool_size(pool);
    flx_kvsrc_h src;
    if (flx_replay_open_source(source, &src)) die(source);
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    const flx_synth_t *syn = flx_kvsrc_synth(src);
    flx_replay_t *r;
    if (flx_replay_create(src, tau, &r)) die("replay");
    r->pool = pool;
    flx_predictor_h pred;
    if (flx_predictor_load(weights, &pred)) die(weights);
    const flx_select_params_t sel_cal = flx_predictor_select_params(pred), sel_paper = flx_select_params_paper();
    printf("operating point of %s: stream_threshold %g budget_scale %g min_blocks %u\n", weights,
           (double)sel_cal.stream_threshold, (double)sel_cal.budget_scale, sel_cal.min_blocks);

    /* Layers: an explicit list, or n_layers_pick spread evenly over the model (first and last in). */
    uint32_t layer_list[4096], n_lay = 0;
    if (n_layer_arg) {
        for (uint32_t i = 0; i < n_layer_arg; i++) {
            if (layer_arg[i] >= sh.n_layers)
                return flx_cli_fail(&cli, "--layers: layer %llu, the source has %u layers",
                                    (unsigned long long)layer_arg[i], sh.n_layers);
            layer_list[n_lay++] = (uint32_t)layer_arg[i];
        }
    } else {
        uint32_t n = n_layers_pick < sh.n_layers ? (uint32_t)n_layers_pick : sh.n_layers;
        for (uint32_t i = 0; i < n; i++) layer_list[n_lay++] = n > 1 ? i * (sh.n_layers - 1) / (n - 1) : 0;
    }

    uint32_t Hq = sh.n_q_heads, Hkv = sh.n_kv_heads, G = Hq / Hkv, D = sh.head_dim;
    flx_attn_shape_t ash = {.group = G, .head_dim = D, .max_l_cpu = sh.prompt_len, .pool = NULL};
    size_t ws_bytes;
    if (flx_attn_plan(&ash, &ws_bytes)) die("plan");
    flx_attn_ws_t *ws = calloc((size_t)nt, sizeof *ws);
    void **ws_mem = calloc((size_t)nt, sizeof *ws_mem);
    for (int t = 0; t < nt; t++) {
        ws_mem[t] = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
        if (!ws_mem[t] || flx_attn_ws_init(&ws[t], &ash, ws_mem[t], ws_bytes)) die("workspace");
    }
    size_t HD = (size_t)Hq * D;
    float *o_full = malloc(HD * sizeof(float)), *onorm = malloc(Hq * sizeof(float));
    float *o = malloc(HD * sizeof(float)), *lse = malloc(Hq * sizeof(float));
    float *o_win = malloc(HD * sizeof(float)), *lse_win = malloc(Hq * sizeof(float));
    float *feat = malloc((size_t)Hq * FLX_FEAT_COUNT * sizeof(float)), *budgets = malloc(Hq * sizeof(float));
    flx_head_pred_t *hp = malloc(Hq * sizeof *hp);
    size_t pscr_bytes = flx_predictor_scratch_bytes(Hq * (uint32_t)(time_batch ? time_batch : 1));
    void *pscr = malloc(pscr_bytes);
    acc_t acc[N_CFG] = {0};
    uint32_t sel_blk[FLX_ATTN_MAX_GROUP * 4];
    uint64_t bytes_g[FLX_ATTN_MAX_GROUP * 4];
    acc_t recall_g[FLX_ATTN_MAX_GROUP * 4];
    double t_pred = 0, t_step = 0;
    uint32_t n_timed = 0;

    for (uint32_t li = 0; li < n_lay; li++) {
        uint32_t layer = layer_list[li];
        if (flx_replay_load_layer(r, layer)) die("load layer");
        uint32_t l_cpu = r->info.l_cpu, n_sink = r->info.n_sink;
        for (uint32_t step = 0; step < sh.n_steps; step += (uint32_t)every) {
            if (flx_replay_step(r, step)) die("step");
            if (flx_full_output(r->views, Hq, Hkv, r->q_step, o_full, onorm)) die("full output");
            double maxn = 0;
            for (uint32_t h = 0; h < Hq; h++) maxn = onorm[h] > maxn ? onorm[h] : maxn;
            if (flx_replay_features(r, feat, o_win, lse_win, &ws[0])) die("features");
            if (flx_predictor_run(pred, feat, Hq, hp, pscr, pscr_bytes, NULL)) die("predictor");
            for (int c = 0; c < N_CFG; c++) {
                acc_t *a = &acc[c];
                qjob_t qj = {.c = c, .r = r, .syn = syn, .ws = ws, .hp = hp, .sel_cal = &sel_cal, .sel_paper = &sel_paper,
                             .budgets = budgets, .o = o, .lse = lse, .o_win = o_win, .lse_win = lse_win,
                             .sel_blk = sel_blk, .bytes_g = bytes_g, .recall_g = recall_g, .layer = layer,
                             .step = step, .n_sink = n_sink, .l_cpu = l_cpu, .G = G, .D = D};
                if (flx_pool_for(pool, Hkv, 1, q_group, &qj)) die(CFG_NAME[c]);
                for (uint32_t g = 0; g < Hkv; g++) {
                    a->recall_num += recall_g[g].recall_num;
                    a->recall_den += recall_g[g].recall_den;
                }
                if (syn && c == 0)
                    for (uint32_t h = 0; h < Hq; h++)
                        if (flx_synth_head_kind(syn, layer, h) == FLX_SYNTH_RETRIEVAL)
                            needle_recall(syn, layer, h, step, n_sink, l_cpu, 0, NULL, 0, a);
                for (uint32_t h = 0; h < Hq; h++) {
                    double e = dist(o + (size_t)h * D, o_full + (size_t)h * D, D);
                    a->heads += 1;
                    a->within += maxn > 0 ? e / maxn <= tau : 1;
                    a->rel += onorm[h] > 0 ? e / onorm[h] : 0;
                }
                for (uint32_t g = 0; g < Hkv; g++) {
                    a->bytes += (double)bytes_g[g];
                    a->groups += 1;
                    if (bytes_g[g]) {
                        a->groups_run += 1;
                        a->blk_sum += sel_blk[g];
                    }
                }
                a->steps += 1;
            }
        }
        /* One Fluxion attention step of time_batch sequences (the same KV for each: the bytes and
         * the work are what count), predictor share of it. */
        if (time_batch) {
            uint32_t B = (uint32_t)time_batch, R = B * Hq;
            float *fb = malloc((size_t)R * FLX_FEAT_COUNT * sizeof(float));
            flx_head_pred_t *pb = malloc(R * sizeof *pb);
            float *bb = malloc(R * sizeof(float)), *ob = malloc((size_t)R * D * sizeof(float));
            float *lb = malloc(R * sizeof(float)), *owb = malloc((size_t)R * D * sizeof(float));
            float *lwb = malloc(R * sizeof(float));
            if (!fb || !pb || !bb || !ob || !lb || !owb || !lwb) die("time buffers");
            for (int rep = 0; rep < 3; rep++) {
                uint64_t t0 = flx_now_ns();
                for (uint32_t b = 0; b < B; b++)
                    if (flx_replay_features(r, fb + (size_t)b * Hq * FLX_FEAT_COUNT, owb + (size_t)b * HD, lwb + (size_t)b * Hq,
                                            &ws[0]))
                        die("features");
                uint64_t t1 = flx_now_ns();
                if (flx_predictor_run(pred, fb, R, pb, pscr, pscr_bytes, pool)) die("predictor");
                uint64_t t2 = flx_now_ns();
                tjob_t tj = {.r = r, .ws = ws, .pb = pb, .sel = &sel_cal, .bb = bb, .ob = ob, .lb = lb, .owb = owb,
                             .lwb = lwb, .Hq = Hq, .Hkv = Hkv, .G = G, .D = D, .l_cpu = l_cpu};
                if (flx_pool_for(pool, (uint64_t)B * Hkv, 1, t_task, &tj)) die("timed step");
                uint64_t t3 = flx_now_ns();
                if (rep > 0) {   /* the first repetition warms caches and the thread pool */
                    t_pred += (double)(t2 - t1);
                    t_step += (double)(t3 - t0);
                    n_timed++;
                }
            }
            free(fb); free(pb); free(bb); free(ob); free(lb); free(owb); free(lwb);
        }
    }

    printf("%-14s %8s %10s %10s %8s %14s %8s %8s\n", "config", "heads", "within_tau", "rel_err", "recall",
           "bytes/layer", "mean_blk", "tasks");
    FILE *f = NULL;
    if (csv) {
        f = fopen(csv, "a");
        if (!f) {
            perror(csv);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0)
            fprintf(f, "label,source,prompt_len,config,heads,within_tau,mean_rel_err,recall,bytes_per_layer_step,"
                       "mean_blk,task_share,retrieval_share\n");
    }
    float share = syn ? flx_synth_params(syn)->retrieval_share : -1.0f;
    for (int c = 0; c < N_CFG; c++) {
        acc_t *a = &acc[c];
        double recall = a->recall_den > 0 ? a->recall_num / a->recall_den : NAN;
        double bytes = a->steps ? a->bytes / a->steps : 0;
        double mblk = a->groups_run ? a->blk_sum / a->groups_run : 0;
        double tshare = a->groups ? a->groups_run / a->groups : 0;
        printf("%-14s %8.0f %10.4f %10.4f %8.4f %14.0f %8.1f %8.3f\n", CFG_NAME[c], a->heads, a->within / a->heads,
               a->rel / a->heads, recall, bytes, mblk, tshare);
        if (f)
            fprintf(f, "%s,\"%s\",%u,%s,%.0f,%.6f,%.6f,%.6f,%.1f,%.2f,%.4f,%.2f\n", label, flx_kvsrc_describe(src),
                    sh.prompt_len, CFG_NAME[c], a->heads, a->within / a->heads, a->rel / a->heads, recall, bytes,
                    mblk, tshare, share);
    }
    if (n_timed) {
        printf("timed Fluxion attention step, batch %llu, %u workers: %.3f ms per layer, predictor %.3f ms = %.2f%%\n",
               (unsigned long long)time_batch, nt, t_step / n_timed * 1e-6, t_pred / n_timed * 1e-6,
               100.0 * t_pred / t_step);
        if (f) fprintf(f, "%s,\"%s\",%u,predictor_share_b%llu,0,%.6f,0,0,0,0,0,%.2f\n", label, flx_kvsrc_describe(src),
                       sh.prompt_len, (unsigned long long)time_batch, t_pred / t_step, share);
    }
    if (f) fclose(f);
    for (int t = 0; t < nt; t++) free(ws_mem[t]);
    free(ws); free(ws_mem); free(o_full); free(onorm); free(o); free(lse); free(o_win); free(lse_win);
    free(feat); free(budgets); free(hp); free(pscr);
    flx_predictor_destroy(pred);
    flx_replay_destroy(r);
    flx_kvsrc_close(src);
    flx_pool_destroy(pool);
    return 0;
}
