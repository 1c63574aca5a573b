/*
 * fluxion-label - builds a predictor training set (flx/predictor.h DATASET FILE) from a KV source:
 * for the chosen layers and decode steps, each query head's 41 features (exactly as the decode node
 * computes them, through the real kvstore) paired with its labels (flx/budget.h: least budgets at
 * blk 1..128, the Eq. 1 fit, the streaming bit).
 *
 *   fluxion-label --source dump:FILE | synth:L,Hq,Hkv,D,len,steps[,seed[,share]]
 *                 --out FILE [--layers all|N,N,..] [--step-every N] [--crit fluxion|output|score]
 *                 [--tau X] [--threads N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/budget.h"
#include "flx/log.h"
#include "flx/predictor.h"
#include "flx/util.h"
#include "replay.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: fluxion-label --source dump:FILE|synth:L,Hq,Hkv,D,len,steps[,seed[,share]] --out FILE\n"
            "                     [--layers all|N,N,...] [--step-every N] [--crit fluxion|output|score]\n"
            "                     [--tau X] [--threads N]\n");
}

static int parse_layers(const char *s, uint32_t n_layers, uint8_t *on)
{
    if (!strcmp(s, "all")) {
        memset(on, 1, n_layers);
        return 0;
    }
    memset(on, 0, n_layers);
    char buf[1024];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t l;
        if (flx_parse_u64(tok, 0, n_layers - 1, &l)) return -1;
        on[l] = 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *source = NULL, *out = NULL, *layers = "all";
    uint64_t every = 4, threads = 0;
    float tau = 0.1f;
    flx_crit_t crit = FLX_CRIT_FLUXION;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "fluxion-label: %s needs a value\n", a);
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--source")) source = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--layers")) layers = v;
        else if (!strcmp(a, "--step-every")) {
            if (flx_parse_u64(v, 1, 1u << 20, &every)) {
                fprintf(stderr, "fluxion-label: --step-every: %s\n", flx_error_msg());
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            if (flx_parse_u64(v, 0, FLX_POOL_MAX_WORKERS, &threads)) {
                fprintf(stderr, "fluxion-label: --threads: %s\n", flx_error_msg());
                return 2;
            }
        } else if (!strcmp(a, "--tau")) {
            char *end;
            tau = strtof(v, &end);
            if (*end || !(tau > 0.0f && tau < 1.0f)) {
                fprintf(stderr, "fluxion-label: --tau '%s' not in (0, 1)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--crit")) {
            if (!strcmp(v, "fluxion")) crit = FLX_CRIT_FLUXION;
            else if (!strcmp(v, "output")) crit = FLX_CRIT_OUTPUT;
            else if (!strcmp(v, "score")) crit = FLX_CRIT_SCORE;
            else {
                fprintf(stderr, "fluxion-label: --crit '%s' is not fluxion, output or score\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "fluxion-label: unknown flag %s\n", a);
            usage();
            return 2;
        }
    }
    if (!source || !out) {
        usage();
        return 2;
    }
    flx_kvsrc_h src = NULL;
    flx_replay_t *r = NULL;
    flx_dataset_t ds = {0};
    uint8_t *on = NULL;
    flx_head_label_t *lab = NULL;
    flx_pool_h pool = NULL;
    int rc = 1;
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_status_t st = flx_pool_create(&pp, &pool);
    if (st) goto done;
    fprintf(stderr, "fluxion-label: %s\n", flx_pool_describe(pool));
    if ((st = flx_replay_open_source(source, &src))) goto done;
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    on = malloc(sh.n_layers);
    if (!on || parse_layers(layers, sh.n_layers, on)) {
        fprintf(stderr, "fluxion-label: --layers '%s': expected all or layer numbers below %u\n", layers, sh.n_layers);
        rc = 2;
        goto done;
    }
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
        }
        fprintf(stderr, "layer %u: %u steps, streaming share %.2f (%.1f s)\n", l, n_steps_on,
                (double)n_stream / (n_steps_on * sh.n_q_heads), (double)(flx_now_ns() - t_start) * 1e-9);
    }
    ds.n = (uint32_t)row;
    if ((st = flx_dataset_save(&ds, out))) goto done;
    printf("fluxion-label: %u rows (%u layers x %u steps x %u heads) from %s -> %s\n", ds.n, n_layers_on, n_steps_on,
           sh.n_q_heads, ds.source, out);
    rc = 0;
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
