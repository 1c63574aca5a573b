/*
 * fluxion-label - builds a predictor training set (flx/predictor.h DATASET FILE) from a KV source:
 * for the chosen layers and decode steps, each query head's 41 features (exactly as the decode node
 * computes them, through the real kvstore) paired with its labels (flx/budget.h: least budgets at
 * blk 1..128, the Eq. 1 fit, the streaming bit).
 *
 *   fluxion-label --source dump:FILE | synth:L,Hq,Hkv,D,len,steps[,seed[,share]]
 *                 -o FILE [--layers all|N,N,..] [--step-every N] [--crit fluxion|output|score]
 *                 [--tau X] [-t N]
 * Exit status (flx/cli.h): 0 done, 1 a runtime failure (the dump file, memory), 2 a usage error (a
 * synthetic source's spec is command line).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/budget.h"
#include "flx/cli.h"
#include "flx/log.h"
#include "flx/predictor.h"
#include "flx/progress.h"
#include "flx/util.h"
#include "replay.h"

#define MAX_LAYERS 4096

int main(int argc, char **argv)
{
    static const char *const crits[] = {"fluxion", "output", "score", NULL};
    static const flx_crit_t crit_of[] = {FLX_CRIT_FLUXION, FLX_CRIT_OUTPUT, FLX_CRIT_SCORE};
    const char *source = NULL, *out = NULL, *layers = "all";
    uint64_t every = 4, threads = 0;
    double tau_d = 0.1;
    int crit_i = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_STR(0, "source", "SPEC", &source, FLX_CLI_REQUIRED,
                    "dump:FILE (a KV dump) or synth:L,Hq,Hkv,D,len,steps[,seed[,share]] (synthetic)"),
        FLX_CLI_PATH('o', "out", "FILE", &out, FLX_CLI_REQUIRED, "the dataset file to write"),
        FLX_CLI_STR(0, "layers", "all|N,N,..", &layers, 0, "layers to label (default all)"),
        FLX_CLI_UINT(0, "step-every", "N", &every, 1, 1u << 20, 0, "label every N-th decode step (default 4)"),
        FLX_CLI_ENUM(0, "crit", &crit_i, crits, 0, "budget criterion (default fluxion)"),
        FLX_CLI_FLOAT(0, "tau", "X", &tau_d, 0.0, 1.0, FLX_CLI_LO_OPEN | FLX_CLI_HI_OPEN,
                      "Eq. 2 threshold (default 0.1)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, FLX_POOL_MAX_WORKERS, 0,
                     "pool workers (default: FLX_THREADS, else the CPU budget)"),
    };
    flx_cli_t cli =
        FLX_CLI_INIT("fluxion-label", "Features and labels of a KV source into a predictor dataset file.", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const int synth = !strncmp(source, "synth:", 6);
    if (!synth && strncmp(source, "dump:", 5))
        return flx_cli_usage_error(&cli, "--source '%.200s' is not dump:FILE or synth:...", source);
    uint64_t layer_list[MAX_LAYERS];
    uint32_t n_list = 0;
    if (strcmp(layers, "all") && flx_cli_u64_list("layers", layers, 0, MAX_LAYERS - 1, layer_list, MAX_LAYERS, &n_list))
        return flx_cli_usage_error(&cli, NULL);
    const float tau = (float)tau_d;
    const flx_crit_t crit = crit_of[crit_i];
    flx_kvsrc_h src = NULL;
    flx_replay_t *r = NULL;
    flx_dataset_t ds = {0};
    uint8_t *on = NULL;
    flx_head_label_t *lab = NULL;
    flx_pool_h pool = NULL;
    rc = FLX_EXIT_FAILURE;
    flx_status_t st = flx_replay_open_source(source, &src);
    if (st) {   /* a synthetic source is all command line; a dump is a file */
        if (synth) {
            rc = flx_cli_usage_error(&cli, "--source: %s", flx_error_msg());
            st = FLX_OK;
        }
        goto done;
    }
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    if ((st = flx_pool_create(&pp, &pool))) goto done;
    fprintf(stderr, "fluxion-label: %s\n", flx_pool_describe(pool));
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    on = calloc(sh.n_layers, 1);
    if (!on) {
        st = flx_error_set(FLX_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n_list; i++) {
        if (layer_list[i] >= sh.n_layers) {
            st = flx_error_set(FLX_ERR_INVALID, "--layers: layer %llu, the source has %u layers",
                               (unsigned long long)layer_list[i], sh.n_layers);
            if (synth) {
                rc = flx_cli_usage_error(&cli, NULL);
                st = FLX_OK;
            }
            goto done;
        }
        on[layer_list[i]] = 1;
    }
    if (!n_list) memset(on, 1, sh.n_layers);
    if ((st = flx_replay_create(src, tau, &r))) goto done;
    r->pool = pool;
    uint32_t n_layers_on = 0, n_steps_on = (sh.n_steps + (uint32_t)every - 1) / (uint32_t)every;
    for (uint32_t l = 0; l < sh.n_layers; l++) n_layers_on += on[l];
    size_t rows = (size_t)n_layers_on * n_steps_on * sh.n_q_heads, row = 0;
    ds.features = malloc(rows * FLX_FEAT_COUNT * sizeof(float));
    ds.labels = malloc(rows * 3 * sizeof(float));
    ds.bgt = malloc(rows * FLX_LABEL_N_BLK * sizeof(float));
    ds.where = malloc(rows * 3 * sizeof(uint32_t));
    lab = malloc(sh.n_q_heads * sizeof *lab);
    if (!ds.features || !ds.labels || !ds.bgt || !ds.where || !lab) {
        st = flx_error_set(FLX_ERR_NOMEM, "out of memory for %zu rows", rows);
        goto done;
    }
    ds.tau = tau;
    ds.n_q_heads = sh.n_q_heads, ds.n_kv_heads = sh.n_kv_heads;
    snprintf(ds.criterion, sizeof ds.criterion, "%s", flx_crit_name(crit));
    snprintf(ds.source, sizeof ds.source, "%s", flx_kvsrc_describe(src));
    uint64_t t_start = flx_now_ns();
    const uint64_t n_total = (uint64_t)n_layers_on * n_steps_on;
    uint64_t n_done = 0;
    for (uint32_t l = 0; l < sh.n_layers; l++) {
        if (!on[l]) continue;
        if ((st = flx_replay_load_layer(r, l))) goto done;
        uint32_t n_stream = 0;
        for (uint32_t t = 0; t < sh.n_steps; t += (uint32_t)every) {
            if ((st = flx_replay_step(r, t))) goto done;
            float *feat = ds.features + row * FLX_FEAT_COUNT;
            if ((st = flx_replay_features(r, feat, NULL, NULL, NULL))) goto done;
            flx_label_layer_in_t li = {.n_q_heads = sh.n_q_heads, .n_kv_heads = sh.n_kv_heads, .views = r->views,
                                       .q = r->q_step, .crit = crit, .tau = tau, .pool = pool};
            if ((st = flx_label_layer(&li, lab))) goto done;
            for (uint32_t h = 0; h < sh.n_q_heads; h++, row++) {
                ds.labels[row * 3 + 0] = lab[h].bgt0;
                ds.labels[row * 3 + 1] = lab[h].k;
                ds.labels[row * 3 + 2] = lab[h].streaming;
                memcpy(ds.bgt + row * FLX_LABEL_N_BLK, lab[h].bgt, sizeof lab[h].bgt);
                ds.where[row * 3 + 0] = l;
                ds.where[row * 3 + 1] = h;
                ds.where[row * 3 + 2] = t;
                n_stream += lab[h].streaming;
            }
            flx_progress_report("labelling", ++n_done, n_total, "steps");
        }
        fprintf(stderr, "layer %u: %u steps, streaming share %.2f (%.1f s)\n", l, n_steps_on,
                (double)n_stream / (n_steps_on * sh.n_q_heads), (double)(flx_now_ns() - t_start) * 1e-9);
    }
    ds.n = (uint32_t)row;
    if ((st = flx_dataset_save(&ds, out))) goto done;
    rc = 0;
    printf("fluxion-label: %u rows (%u layers x %u steps x %u heads) from %s -> %s\n", ds.n, n_layers_on, n_steps_on,
           sh.n_q_heads, ds.source, out);
done:
    if (st) fprintf(stderr, "fluxion-label: %s\n", flx_error_msg());
    free(lab);
    free(on);
    free(ds.features);
    free(ds.labels);
    free(ds.bgt);
    free(ds.where);
    flx_replay_destroy(r);
    flx_kvsrc_close(src);
    flx_pool_destroy(pool);
    return rc;
}
