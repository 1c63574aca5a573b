/*
 * sched_bench - attention time per decode layer through the one attention route (flx/attn_layer.h:
 * the modes as tasks on the heterogeneous scheduler) on the synthetic Llama-3.1-8B-like workload,
 * for Fluxion, fixed (16, 0.05), fixed (32, 0.02) and full, at the given lengths and batch sizes
 * and on mixed-length batches, with each configuration's within-tau share beside its time; then
 * the scheduler ablation (policies) and Fluxion's ablations (streaming skipping, fixed granularity)
 * on the mixed batches.
 *
 * METHOD
 * Sessions are real kvstore sessions replayed from the synthetic source (the prefill statistics
 * included), one per row of the batch as far as --distinct (default 16) and memory allow. Rows beyond
 * that reuse a session, which does the same work but reads bytes another row has just read, partly
 * from the caches: that flattered Fluxion (32K batch 4, layers 0, 8, 16, 24, caches cleared: Fluxion
 * / fixed (16, 0.05) 2.16x with 2 sessions for the 4 rows, 1.73x with 4), so rows stay distinct
 * where memory allows. The points that share a set of sessions (the batches of one length with their
 * GPU points; a mixed batch and its ablation) are measured on one load of each layer into them, and
 * that set-up (the synthetic layer, its prefill statistics) runs on the worker pool. For every
 * measured layer the configurations run interleaved, one layer call each, in an order rotated every
 * repetition (A B C D, B C D A, ...). A repetition of a configuration is its run of every measured
 * layer, as a decode step would run them: its time is their sum, a ratio is taken per repetition
 * between such sums, and the median and the spread (min..max) of the ratios are reported, with each
 * layer's own ratio beside them (layers differ: at 32K batch 4 one layer's ratio alone ranged 1.5
 * to 2.7). WARM-UP: on every layer loaded, each configuration makes one untimed call before the
 * repetitions. The first calls after a load ran slow, and the rotation makes Fluxion the first
 * configuration of the first repetition: on the AMX Xeon VM (2026-12-02) Fluxion at 128K batch 8
 * took 133 ms a layer in that repetition against 32 in the others (fixed (16, 0.05) 93 against 64),
 * one repetition's ratio 0.70 where the others gave 1.98 and 2.18; on U(64K, 128K) batch 1 its
 * first call on each new layer spent 3.2 to 3.4 ms in its tasks against 1.6 to 2.2 in the later
 * ones, the caches read through before every call alike. Part of it was first touches of the
 * configurations' workspaces (page faults on a point's first layer; now paged in at create); most
 * is the first read of the data a load wrote, whatever reads it (docs/sched.md; the cause not
 * found). Measured here is the steady state a decode step sees, a layer's data having been read
 * by the steps before it. The default layers are eight spread over the model, none of the
 * synthetic predictor's training layers (scripts/train_predictor.sh: 1, 7, 13, 19, 25, 29). The
 * within-tau share (Eq. 2: ||o_c - o_full|| / max_h' ||o_full,h'|| <= tau, per query head of each
 * sequence) is measured against the full configuration's output of the same call set. Times are
 * wall times of flx_attn_layer_run (features + predictor + selector + tasks + merges); Fluxion's
 * decision time is reported as a share of its layer time.
 *
 * With a CUDA device (and only then) the 32K and 128K points add the GPU worker: Fluxion on the
 * scheduler with it (hybrid, priority), the hybrid fixed (16, 0.05) baseline (no-parallel: the GPU
 * takes no task), and fixed (16, 0.05) GPU-only (top-k and sparse attention on the device over
 * UVA); each row then carries the GPU idle ratio of its layers (flx/sched.h: the window partials
 * are on the CPU here, so the GPU's work in a layer is the tasks it took).
 *
 * Output: a table on stdout, one CSV row per (point, configuration), and a SUMMARY line.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/bench_cli.h"
#include "../common/bench_stats.h"
#include "flx/attn_layer.h"
#include "flx/budget.h"
#include "flx/cli.h"
#include "flx/cuda_rt.h"
#include "flx/util.h"
#include "replay.h"

#define MAX_DISTINCT 16
#define MAX_B 64
#define MAX_LENS 8      /* context lengths at most (--lens) */
#define MAX_BATCHES 8   /* batch sizes per length at most (--batches) */
#define MAX_CFGS 8      /* configurations of one point at most (ABL_CFG has the most, 7) */
#define MAX_LAYERS 8   /* layers measured at most (--layers) */
#define HQ 32
#define HKV 8
#define D 128

static void die(const char *what)
{
    fprintf(stderr, "sched_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

/* ---- caches ----
 * Every timed layer call starts with caches holding none of its bytes, as in a decode step, where
 * the other layers' work runs between two calls of a layer: before each call a buffer of twice the
 * last-level cache (at least 64 MiB) is read through. Without it a call reads what the call before
 * it left there: Fluxion's and fixed (16, 0.05)'s Quest metadata are the same bytes, and a layer
 * call of 27.5 MiB fits a 32 MiB L3. */
static unsigned char *g_evict;
static size_t g_evict_n;
static volatile uint64_t g_evict_sink;   /* keeps the reads */

static void evict_init(void)
{
    size_t llc = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        char unit = 0;
        unsigned long v = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) llc = (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
        fclose(f);
    }
    g_evict_n = FLX_MAX((size_t)64 << 20, 2 * llc);
    if (!(g_evict = malloc(g_evict_n))) {
        fprintf(stderr, "sched_bench: no memory for the %zu-byte cache eviction buffer\n", g_evict_n);
        exit(1);
    }
    memset(g_evict, 1, g_evict_n);
}

static void evict(void)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < g_evict_n; i += 64) sum += g_evict[i];
    g_evict_sink += sum;
}

/* ---- configurations ---- */

typedef struct cfg {
    const char *name;
    flx_layer_mode_t mode;
    uint32_t blk;
    float bgt;
    flx_sched_policy_t policy;
    flx_select_opts_t opts;
    int gpu;                          /* a GPU worker */
    flx_sched_placement_t placement;
} cfg_t;

static const cfg_t MAIN_CFG[4] = {
    {"fluxion", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"fixed_16_005", FLX_LAYER_FIXED, 16, 0.05f, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"fixed_32_002", FLX_LAYER_FIXED, 32, 0.02f, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"full", FLX_LAYER_FULL, 0, 0, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
};
static const cfg_t GPU_CFG[4] = {
    {"fixed_16_005", FLX_LAYER_FIXED, 16, 0.05f, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"fluxion_gpu", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {0, 0}, 1, FLX_SCHED_HYBRID},
    {"hybrid_16_005", FLX_LAYER_FIXED, 16, 0.05f, FLX_SCHED_NO_PARALLEL, {0, 0}, 1, FLX_SCHED_HYBRID},
    {"gpu_only_16_005", FLX_LAYER_FIXED, 16, 0.05f, FLX_SCHED_PRIORITY, {0, 0}, 1, FLX_SCHED_GPU_ONLY},
};
static const cfg_t ABL_CFG[7] = {
    {"fluxion", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"sched_no_parallel", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_NO_PARALLEL, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"sched_uniform", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_UNIFORM, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"sched_length", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_LENGTH, {0, 0}, 0, FLX_SCHED_HYBRID},
    {"fluxion_no_skip", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {1, 0}, 0, FLX_SCHED_HYBRID},
    {"fluxion_blk16", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {0, 16}, 0, FLX_SCHED_HYBRID},
    {"fluxion_blk32", FLX_LAYER_FLUXION, 0, 0, FLX_SCHED_PRIORITY, {0, 32}, 0, FLX_SCHED_HYBRID},
};
_Static_assert(FLX_ARRAY_SIZE(ABL_CFG) <= MAX_CFGS && FLX_ARRAY_SIZE(MAIN_CFG) <= MAX_CFGS &&
                   FLX_ARRAY_SIZE(GPU_CFG) <= MAX_CFGS, "a point holds at most MAX_CFGS configurations");

/* ---- sessions ---- */

typedef struct sess_set {
    uint32_t n;
    uint32_t len[MAX_DISTINCT];
    flx_kvsrc_h src[MAX_DISTINCT];
    flx_replay_t *rp[MAX_DISTINCT];
} sess_set_t;

/* The sessions' set-up (the synthetic layer, its prefill statistics) runs on pool. */
static void set_open(sess_set_t *s, const uint32_t *len, uint32_t n, uint64_t seed, flx_pool_h pool)
{
    memset(s, 0, sizeof s[0]);
    s->n = n;
    for (uint32_t i = 0; i < n; i++) {
        char spec[128];
        s->len[i] = len[i];
        snprintf(spec, sizeof spec, "synth:32,%d,%d,%d,%u,4,%llu,0.5", HQ, HKV, D, len[i],
                 (unsigned long long)(seed + i));
        if (flx_replay_open_source(spec, &s->src[i])) die(spec);
        if (flx_replay_create_flags(s->src[i], 0.1f, FLX_KV_STORE_PIN_CUDA, &s->rp[i])) die("replay");
        s->rp[i]->pool = pool;
    }
}

/* Loads layer into the first n sessions of the set (those a batch's rows use). */
static void set_load(sess_set_t *s, uint32_t layer, uint32_t n)
{
    for (uint32_t i = 0; i < n && i < s->n; i++)
        if (flx_replay_load_layer(s->rp[i], layer) || flx_replay_step(s->rp[i], 1)) die("load layer");
}

static void set_close(sess_set_t *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        flx_replay_destroy(s->rp[i]);
        flx_kvsrc_close(s->src[i]);
    }
}

/* ---- measuring one point ---- */

typedef struct result {
    double ms_med, ms_min, ms_max;        /* layer time */
    double within, bytes, predict_share;  /* within-tau share; host bytes per layer; decision share */
    double decide_ms, select_ms;          /* per layer (median): the features + predictor pool run, the selector */
    double feat_cpu_ms, mlp_cpu_ms;       /* per layer (median): thread time of that run in the features, the MLP */
    double sp16_med, sp16_min, sp16_max;  /* the base configuration's time / this one's (main points: base
                                           * fixed_16_005, so Fluxion's row is its speedup over it;
                                           * ablation points: base fluxion) */
    double spfull_med, spfull_min, spfull_max;
    double tasks, groups;
    double gpu_idle;                      /* mean GPU idle ratio of its layers (NAN without a GPU worker) */
    double gpu_tasks, gpu_busy_ms;        /* per layer: tasks the device ran, its busy time (NAN without) */
    double cpu_busy;                      /* mean share of the scheduler's run its CPU workers spent in tasks */
    flx_attn_timing_t tim;                /* per layer (mean): the tasks' kernel thread times and bytes */
} result_t;

typedef struct ctx {
    flx_predictor_h pred;
    flx_pool_h pool;
    uint32_t reps;
    float tau;
    const uint32_t *layers;
    uint32_t n_layers;
    uint32_t gpu_streams;
    FILE *csv;
    FILE *trace;   /* every task of the last rep of the GPU configurations (--trace) */
} ctx_t;

/* One point: configurations cf[0..nc) on the batch whose row b uses session set->rp[row_of[b]];
 * cf must include "full" (for within-tau) unless only timing is wanted (full_ix < 0). The points of a
 * session set are measured together, layer by layer (measure_points), so each layer is loaded into
 * the sessions once for all of them; a point's own state lives here between its layers. */
typedef struct point {
    char name[48];
    uint32_t row_of[MAX_B], B;
    const cfg_t *cf;
    uint32_t nc;
    int full_ix, base_ix;
    result_t *res;                                       /* nc results, filled by point_end */
    /* state */
    uint32_t max_l, r;
    flx_attn_layer_h L[MAX_CFGS];
    float *q, *o[MAX_CFGS];
    double *ms, *pred_ns, *within, *bytes, *tasks, *idle, *gtasks, *within_l, *gbusy, *cbusy, *dec, heads;
    flx_attn_timing_t tim[MAX_CFGS];                     /* sums over every run */
} point_t;

static void point_init(point_t *pt, const char *name, const uint32_t *row_of, uint32_t B, const cfg_t *cf,
                       uint32_t nc, int full_ix, int base_ix, result_t *res)
{
    memset(pt, 0, sizeof *pt);
    snprintf(pt->name, sizeof pt->name, "%s", name);
    memcpy(pt->row_of, row_of, B * sizeof row_of[0]);
    pt->B = B, pt->cf = cf, pt->nc = nc, pt->full_ix = full_ix, pt->base_ix = base_ix, pt->res = res;
}

static void point_begin(const ctx_t *cx, const sess_set_t *set, point_t *pt)
{
    const uint32_t B = pt->B, nc = pt->nc;
    const cfg_t *cf = pt->cf;
    for (uint32_t i = 0; i < set->n; i++) pt->max_l = FLX_MAX(pt->max_l, set->len[i]);
    for (uint32_t c = 0; c < nc; c++) {
        flx_attn_layer_params_t p;
        memset(&p, 0, sizeof p);
        p.n_q_heads = HQ, p.n_kv_heads = HKV, p.head_dim = D, p.max_batch = B, p.max_l_cpu = pt->max_l;
        p.mode = cf[c].mode, p.blk = cf[c].blk, p.bgt = cf[c].bgt, p.predictor = cx->pred;
        p.field_mask = FLX_ATTN_LAYER_FIELD_OPTS, p.opts = cf[c].opts;
        p.sched.field_mask = FLX_SCHED_FIELD_POLICY | FLX_SCHED_FIELD_PLACEMENT | FLX_SCHED_FIELD_GPU;
        p.sched.policy = cf[c].policy, p.sched.placement = cf[c].placement;
        p.sched.use_gpu = cf[c].gpu, p.sched.cuda_device = 0, p.sched.gpu_streams = cx->gpu_streams;
        p.sched.pool = cx->pool;
        if (flx_attn_layer_create(&p, &pt->L[c])) die("attention layer");
    }
    const size_t rows = (size_t)B * HQ;
    const uint32_t R = cx->reps * cx->n_layers;
    pt->q = malloc(rows * D * sizeof(float));
    for (uint32_t c = 0; c < nc; c++) pt->o[c] = malloc(rows * D * sizeof(float));
    pt->ms = calloc((size_t)nc * R, sizeof(double)), pt->pred_ns = calloc(nc, sizeof(double));
    pt->within = calloc(nc, sizeof(double)), pt->bytes = calloc(nc, sizeof(double));
    pt->tasks = calloc(nc, sizeof(double)), pt->idle = calloc(nc, sizeof(double));
    pt->gtasks = calloc(nc, sizeof(double)), pt->gbusy = calloc(nc, sizeof(double));
    pt->cbusy = calloc(nc, sizeof(double));
    pt->within_l = calloc((size_t)nc * cx->n_layers, sizeof(double));   /* within-tau heads per layer */
    pt->dec = calloc((size_t)nc * 4 * R, sizeof(double));             /* the decision run: 4 series per config */
    int ok = pt->q && pt->ms && pt->pred_ns && pt->within && pt->bytes && pt->tasks && pt->idle && pt->gtasks &&
             pt->gbusy && pt->cbusy && pt->within_l && pt->dec;
    for (uint32_t c = 0; c < nc; c++) ok = ok && pt->o[c];
    if (!ok) {
        fprintf(stderr, "sched_bench: out of memory for point %s\n", pt->name);
        exit(1);
    }
}

/* The sessions the point's rows use. */
static uint32_t point_sessions(const point_t *pt)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < pt->B; b++) n = FLX_MAX(n, pt->row_of[b] + 1);
    return n;
}

/* Measured layer li (loaded into the sessions): every repetition of the point's configurations. */
static void point_layer(const ctx_t *cx, const sess_set_t *set, point_t *pt, uint32_t li)
{
    const uint32_t B = pt->B, nc = pt->nc, R = cx->reps * cx->n_layers;
    const cfg_t *cf = pt->cf;
    float *q = pt->q, **o = pt->o;
    double *ms = pt->ms, *dec = pt->dec;
    flx_kv_session_h sess[MAX_B];
    for (uint32_t b = 0; b < B; b++) {
        sess[b] = set->rp[pt->row_of[b]]->sess;
        memcpy(q + (size_t)b * HQ * D, set->rp[pt->row_of[b]]->q_step, (size_t)HQ * D * sizeof(float));
    }
    flx_attn_layer_args_t a = {.layer = 0, .batch = B, .sess = sess, .q = q, .window = FLX_LAYER_WIN_COMPUTE};
    for (uint32_t c = 0; c < nc; c++) {   /* WARM-UP: one untimed call each on the layer just loaded */
        a.o = o[c];
        evict();
        if (flx_attn_layer_run(pt->L[c], &a, NULL)) die(cf[c].name);
    }
    for (uint32_t rep = 0; rep < cx->reps; rep++, pt->r++) {
        const uint32_t r = pt->r;
        for (uint32_t k = 0; k < nc; k++) {
            const uint32_t c = (k + rep) % nc;   /* rotated order */
            a.o = o[c];
            flx_attn_layer_stats_t st;
            evict();
            const uint64_t t0 = flx_now_ns();
            if (flx_attn_layer_run(pt->L[c], &a, &st)) die(cf[c].name);
            ms[(size_t)c * R + r] = (double)(flx_now_ns() - t0) * 1e-6;
            pt->pred_ns[c] += (double)st.predict_ns;
            const uint64_t dn[4] = {st.decide_ns, st.select_ns, st.feat_cpu_ns, st.mlp_cpu_ns};
            for (int j = 0; j < 4; j++) dec[((size_t)c * 4 + j) * R + r] = (double)dn[j] * 1e-6;
            pt->idle[c] += st.sched.has_gpu ? st.sched.gpu_idle_ratio / R : NAN;
            pt->gtasks[c] += st.sched.has_gpu ? (double)st.sched.n_gpu_tasks / R : NAN;
            pt->gbusy[c] += st.sched.has_gpu ? (double)st.sched.gpu_busy_ns * 1e-6 / R : NAN;
            /* the share of the scheduler's run its CPU workers spent in tasks (begins, chunks of any
             * begun task, merges): what the per-task trace cannot show */
            const double cw = (double)st.sched.n_cpu_workers * (double)st.sched.wall_ns;
            pt->cbusy[c] += cw > 0 ? (double)st.sched.cpu_busy_ns / cw / R : 0;
            flx_attn_timing_add(&pt->tim[c], &st.sched.attn);
            if (cx->trace && cf[c].gpu && rep + 1 == cx->reps) {
                uint32_t nt;
                const flx_sched_task_t *tk = flx_attn_layer_tasks(pt->L[c], &nt);
                for (uint32_t i = 0; i < nt; i++)
                    fprintf(cx->trace, "%s,%s,%u,%u,%u,%u,%d,%.1f,%.1f,%llu,%.0f,%u\n", pt->name, cf[c].name,
                            cx->layers[li], tk[i].seq, tk[i].kv_group, tk[i].blk, (int)tk[i].worker,
                            (double)tk[i].start_ns * 1e-3, (double)tk[i].end_ns * 1e-3,
                            (unsigned long long)tk[i].host_bytes, (double)tk[i].priority, tk[i].l_cpu);
            }
            if (rep == 0) {
                pt->bytes[c] += (double)(st.sched.attn.score_bytes + st.sched.attn.attn_bytes);
                pt->tasks[c] += st.n_tasks;
            }
        }
    }
    if (pt->full_ix >= 0) {   /* within tau against the full output of this layer */
        for (uint32_t b = 0; b < B; b++) {
            double maxn = 0;
            for (uint32_t h = 0; h < HQ; h++) {
                double n2 = 0;
                const float *f = o[pt->full_ix] + ((size_t)b * HQ + h) * D;
                for (uint32_t d = 0; d < D; d++) n2 += (double)f[d] * f[d];
                maxn = fmax(maxn, sqrt(n2));
            }
            for (uint32_t h = 0; h < HQ; h++) {
                const float *f = o[pt->full_ix] + ((size_t)b * HQ + h) * D;
                for (uint32_t c = 0; c < nc; c++) {
                    const float *x = o[c] + ((size_t)b * HQ + h) * D;
                    double e = 0;
                    for (uint32_t d = 0; d < D; d++) e += ((double)x[d] - f[d]) * ((double)x[d] - f[d]);
                    const double in = maxn > 0 ? sqrt(e) / maxn <= cx->tau : 1.0;
                    pt->within[c] += in;
                    pt->within_l[(size_t)c * cx->n_layers + li] += in;
                }
                pt->heads += 1;
            }
        }
    }
}

/* The point's figures from its repetitions: printed, written to the CSV, kept in pt->res; its state freed. */
static void point_end(const ctx_t *cx, point_t *pt)
{
    const uint32_t B = pt->B, nc = pt->nc, R = cx->reps * cx->n_layers, max_l = pt->max_l;
    const int full_ix = pt->full_ix, base_ix = pt->base_ix;
    const cfg_t *cf = pt->cf;
    const char *point = pt->name;
    double *ms = pt->ms, *dec = pt->dec, *pred_ns = pt->pred_ns, *within = pt->within, *within_l = pt->within_l;
    double *bytes = pt->bytes, *tasks = pt->tasks, *idle = pt->idle, *gtasks = pt->gtasks, *gbusy = pt->gbusy;
    double *cbusy = pt->cbusy;
    const double heads = pt->heads;
    result_t *res = pt->res;
    /* A repetition is one decode step over the measured layers: its time is the sum of their layer
     * times, and its ratios are quotients of such sums (what a step would gain), not medians of
     * per-layer quotients; ms/layer is a step's time over the number of layers. */
    const uint32_t NL = cx->n_layers, NR = cx->reps;
    double *step = calloc((size_t)nc * NR, sizeof(double));
    for (uint32_t c = 0; c < nc; c++)
        for (uint32_t li = 0; li < NL; li++)
            for (uint32_t rep = 0; rep < NR; rep++) step[(size_t)c * NR + rep] += ms[(size_t)c * R + li * NR + rep];
    for (uint32_t c = 0; c < nc; c++) {
        result_t *x = &res[c];
        memset(x, 0, sizeof *x);
        double *v = malloc(NR * sizeof(double)), *rat = malloc(NR * sizeof(double));
        double *ratf = malloc(NR * sizeof(double));
        double sum_ms = 0;
        for (uint32_t i = 0; i < NR; i++) {
            const double t = step[(size_t)c * NR + i];
            v[i] = t / NL;
            sum_ms += t;
            rat[i] = base_ix >= 0 ? step[(size_t)base_ix * NR + i] / t : NAN;
            ratf[i] = full_ix >= 0 ? step[(size_t)full_ix * NR + i] / t : NAN;
        }
        x->ms_med = flx_bench_median(v, (int)NR), x->ms_min = v[0], x->ms_max = v[NR - 1];
        x->sp16_med = flx_bench_median(rat, (int)NR), x->sp16_min = rat[0], x->sp16_max = rat[NR - 1];
        x->spfull_med = flx_bench_median(ratf, (int)NR), x->spfull_min = ratf[0], x->spfull_max = ratf[NR - 1];
        /* the spread over the layers: per layer, the median over repetitions of base / this */
        double lay_rat[MAX_LAYERS];
        for (uint32_t li = 0; li < NL && base_ix >= 0 && base_ix != (int)c; li++) {
            for (uint32_t i = 0; i < NR; i++)
                rat[i] = ms[(size_t)base_ix * R + li * NR + i] / ms[(size_t)c * R + li * NR + i];
            lay_rat[li] = flx_bench_median(rat, (int)NR);
        }
        x->within = full_ix >= 0 && heads > 0 ? within[c] / heads : NAN;
        x->bytes = bytes[c] / cx->n_layers;
        x->tasks = tasks[c] / cx->n_layers;
        x->groups = (double)B * HKV;
        x->predict_share = sum_ms > 0 ? pred_ns[c] * 1e-6 / sum_ms : 0;
        x->gpu_idle = idle[c], x->gpu_tasks = gtasks[c], x->gpu_busy_ms = gbusy[c], x->cpu_busy = cbusy[c];
        double *dm = dec + (size_t)c * 4 * R;   /* the medians sort each series in place */
        x->decide_ms = flx_bench_median(dm, (int)R), x->select_ms = flx_bench_median(dm + R, (int)R);
        x->feat_cpu_ms = flx_bench_median(dm + 2 * R, (int)R), x->mlp_cpu_ms = flx_bench_median(dm + 3 * R, (int)R);
        char gcol[64] = "";
        if (cf[c].gpu)
            snprintf(gcol, sizeof gcol, "  gpu %5.1f tasks, busy %7.3f ms, idle %.3f", x->gpu_tasks, x->gpu_busy_ms,
                     x->gpu_idle);
        printf("%-22s %-20s %9.3f [%8.3f, %8.3f] %8.3f %10.1f %8.3f [%6.3f, %6.3f] %8.3f %7.1f/%-4.0f %6.3f %5.3f%s\n",
               point, cf[c].name, x->ms_med, x->ms_min, x->ms_max, x->within, x->bytes / 1048576.0, x->sp16_med,
               x->sp16_min, x->sp16_max, x->spfull_med, x->tasks, x->groups, x->predict_share, x->cpu_busy, gcol);
        {   /* where the tasks' thread time goes, per layer: the CPU kernels (GPU tasks add bytes only) */
            const flx_attn_timing_t *tm = &pt->tim[c];
            const double k = 1e-6 / R, sb = (double)tm->score_bytes / R / 1048576.0;
            const double ab = (double)tm->attn_bytes / R / 1048576.0;
            printf("%-22s %-20s   task thread ms per layer: window %.3f, scoring %.3f (%.1f MiB), top-k %.3f, "
                   "attention %.3f (%.1f MiB), merge %.3f\n", "", "", tm->window_ns * k, tm->score_ns * k, sb,
                   tm->topk_ns * k, tm->attn_ns * k, ab, tm->merge_ns * k);
        }
        if (x->predict_share > 0)
            printf("%-22s %-20s   decisions per layer: features + predictor run %.3f ms (thread ms: features %.3f, "
                   "MLP %.3f), selector %.3f ms\n", "", "", x->decide_ms, x->feat_cpu_ms, x->mlp_cpu_ms, x->select_ms);
        if (NL > 1 && base_ix >= 0 && base_ix != (int)c) {
            const double hl = heads / NL;   /* every layer counts the same heads */
            printf("%-22s %-20s   per layer (base/this%s):", "", "", hl > 0 ? ", in-tau" : "");
            for (uint32_t li = 0; li < NL; li++) {
                printf(" L%u %.2f", cx->layers[li], lay_rat[li]);
                if (hl > 0) printf(" %.3f", within_l[(size_t)c * NL + li] / hl);
            }
            printf("\n");
        }
        if (cx->csv)
            fprintf(cx->csv, "%s,%s,%u,%u,%.4f,%.4f,%.4f,%.5f,%.0f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.0f,%.5f,%d,%s,"
                    "%.4f,%.2f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", point, cf[c].name, B, max_l, x->ms_med, x->ms_min,
                    x->ms_max, x->within, x->bytes, x->sp16_med, x->sp16_min, x->sp16_max, x->spfull_med, x->spfull_min,
                    x->spfull_max, x->tasks, x->groups, x->predict_share, flx_pool_size(cx->pool),
                    base_ix >= 0 ? cf[base_ix].name : "", x->gpu_idle, x->gpu_tasks, x->gpu_busy_ms, x->decide_ms,
                    x->select_ms, x->feat_cpu_ms, x->mlp_cpu_ms, x->cpu_busy);
        free(v), free(rat), free(ratf);
    }
    fflush(stdout);
    for (uint32_t c = 0; c < nc; c++) {
        flx_attn_layer_destroy(pt->L[c]);
        free(pt->o[c]);
    }
    free(pt->q), free(ms), free(step), free(pred_ns), free(within), free(within_l), free(bytes), free(tasks);
    free(idle), free(gtasks), free(gbusy), free(cbusy);
    free(dec);
}

/* Measures points pt[0..n) on the sessions of set: per layer, the layer is loaded into the sessions
 * the points use, once, and every point runs its repetitions on it; the points' figures are then
 * printed in order. */
static void measure_points(const ctx_t *cx, sess_set_t *set, point_t *pt, uint32_t n)
{
    uint32_t n_used = 0;
    for (uint32_t i = 0; i < n; i++) {
        point_begin(cx, set, &pt[i]);
        n_used = FLX_MAX(n_used, point_sessions(&pt[i]));
    }
    for (uint32_t li = 0; li < cx->n_layers; li++) {
        set_load(set, cx->layers[li], n_used);
        for (uint32_t i = 0; i < n; i++) point_layer(cx, set, &pt[i], li);
    }
    for (uint32_t i = 0; i < n; i++) point_end(cx, &pt[i]);
}

int main(int argc, char **argv)
{
    const char *weights = NULL, *csv_path = NULL, *lens_s = NULL, *batches_s = NULL, *layers_s = NULL;
    const char *mixed_s = NULL, *trace_path = NULL;
    uint32_t lens[MAX_LENS] = {16384, 32768, 65536, 131072}, n_lens = 4, batches[MAX_BATCHES] = {1, 4, 8, 16}, n_b = 4;
    uint32_t layers[MAX_LAYERS] = {0, 4, 8, 12, 16, 20, 24, 28}, n_layers = 8;
    uint32_t mixed_lo[4] = {16384, 32768}, mixed_hi[4] = {65536, 131072};
    uint32_t n_mixed = 2;
    uint64_t reps = 3, workers = 0, distinct = MAX_DISTINCT, max_tokens = 0, mixed_b = 8, gpu_streams = 2;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH(0, "weights", "FILE", &weights, FLX_CLI_REQUIRED, "predictor weights (Fluxion's configurations)"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv_path, 0, "CSV written (default: none)"),
        FLX_CLI_STR(0, "lens", "L,L,..", &lens_s, 0, "prompt lengths, 1024..1048576, at most 8 (default "
                    "16384,32768,65536,131072)"),
        FLX_CLI_STR(0, "batches", "B,B,..", &batches_s, 0, "batch sizes, 1..64, at most 8 (default 1,4,8,16)"),
        FLX_CLI_STR(0, "layers", "l,l,..", &layers_s, 0, "layers of the synthetic model measured, 0..31, at most 8 "
                    "(default 0,4,8,12,16,20,24,28)"),
        FLX_CLI_STR(0, "mixed", "LO-HI,..", &mixed_s, 0, "mixed-length batches: lengths drawn in LO..HI, at most 4 "
                    "(default 16384-65536,32768-131072)"),
        FLX_CLI_UINT(0, "mixed-batch", "B", &mixed_b, 1, MAX_B, 0, "rows of a mixed batch (default 8)"),
        FLX_CLI_UINT(0, "reps", "N", &reps, 1, 1000, 0, "repetitions per layer (default 3)"),
        FLX_CLI_UINT(0, "workers", "N", &workers, 1, FLX_POOL_MAX_WORKERS, 0, "pool workers (default: the CPU "
                     "budget)"),
        FLX_CLI_UINT(0, "distinct", "N", &distinct, 1, MAX_DISTINCT, 0, "distinct sessions per point: rows beyond "
                     "them reuse one, reading what another row just read (default 16, as memory allows)"),
        FLX_CLI_UINT(0, "max-tokens", "N", &max_tokens, 1024, 1ull << 32, 0, "tokens of sessions open at once "
                     "(default: from MemAvailable)"),
        FLX_CLI_UINT(0, "gpu-streams", "N", &gpu_streams, 1, 8, 0, "the GPU worker's streams (tasks in flight on the "
                     "device; default 2)"),
        FLX_CLI_PATH(0, "trace", "FILE", &trace_path, 0, "CSV of every task of the GPU configurations' last rep: "
                     "the worker that began it (its chunks run on any), begin and end (us), host bytes, priority "
                     "(default: none)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("sched_bench", "Attention time per decode layer through the heterogeneous scheduler: "
                                 "Fluxion vs fixed (16, 0.05), (32, 0.02) and full, with within-tau shares; the "
                                 "scheduler's and Fluxion's ablations on mixed batches.", opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    uint64_t mlo[4], mhi[4];
    FILE *csv = NULL;
    if ((rc = flx_bench_u32_list(&cli, "lens", lens_s, 1024, 1u << 20, lens, MAX_LENS, &n_lens)) != FLX_CLI_PROCEED ||
        (rc = flx_bench_u32_list(&cli, "batches", batches_s, 1, MAX_B, batches, MAX_BATCHES, &n_b)) !=
            FLX_CLI_PROCEED ||
        (rc = flx_bench_u32_list(&cli, "layers", layers_s, 0, 31, layers, MAX_LAYERS, &n_layers)) != FLX_CLI_PROCEED)
        return rc;
    if (mixed_s) {
        if (flx_cli_range_list("mixed", mixed_s, 1024, 1u << 20, mlo, mhi, 4, &n_mixed))
            return flx_cli_usage_error(&cli, NULL);
        for (uint32_t i = 0; i < n_mixed; i++) mixed_lo[i] = (uint32_t)mlo[i], mixed_hi[i] = (uint32_t)mhi[i];
    }
    if (csv_path && !(csv = fopen(csv_path, "w")))
        return flx_cli_fail(&cli, "--csv: cannot create %s: %s", csv_path, strerror(errno));
    FILE *trace = NULL;
    if (trace_path && !(trace = fopen(trace_path, "w"))) {
        if (csv) fclose(csv);
        return flx_cli_fail(&cli, "--trace: cannot create %s: %s", trace_path, strerror(errno));
    }
    if (trace) fprintf(trace, "point,config,layer,seq,group,blk,worker,start_us,end_us,host_bytes,priority,l_cpu\n");
    ctx_t cx = {.reps = (uint32_t)reps, .tau = 0.1f, .layers = layers, .n_layers = n_layers,
                .gpu_streams = (uint32_t)gpu_streams, .trace = trace};
    flx_pool_params_t pp = {.field_mask = workers ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)workers};
    if (flx_pool_create(&pp, &cx.pool)) die("worker pool");
    evict_init();
    if (flx_predictor_load(weights, &cx.pred)) die("--weights");
    cx.csv = csv;
    if (cx.csv)
        fprintf(cx.csv, "point,config,batch,max_len,ms_med,ms_min,ms_max,within_tau,host_bytes,base_over_this,"
                        "base_over_this_min,base_over_this_max,full_over_this,full_over_this_min,"
                        "full_over_this_max,tasks,groups,predict_share,workers,base,gpu_idle_ratio,gpu_tasks,"
                        "gpu_busy_ms,decide_ms,select_ms,feat_cpu_ms,mlp_cpu_ms,cpu_busy\n");
    /* memory: a session of L tokens takes 2 x (store + replay source) x L x 8 heads x 128 x 2 bytes */
    const long avail = flx_bench_mem_available_kb() / 1024;
    const uint64_t budget_tokens =
        max_tokens ? max_tokens : avail > 0 ? (uint64_t)avail * 1048576 / 2 / 8192 : 1u << 20;
    printf("sched_bench: Llama-3.1-8B layer shape (32 q heads, 8 kv heads, D 128), synthetic KV, %s, "
           "%u layer(s), %llu reps; MemAvailable %ld MiB -> at most %llu tokens of sessions at once\n",
           flx_pool_describe(cx.pool), n_layers, (unsigned long long)reps, avail, (unsigned long long)budget_tokens);
    printf("columns: a rep runs every measured layer once (a step); ms/layer: a rep's time / layers,\n"
           "  median [min, max] over reps; in-tau share vs full; host MiB read per layer; base/this: per-rep\n"
           "  ratio of the summed times, base fixed_16_005 (mix/size points) or fluxion (abl points), median\n"
           "  [min, max]; full/this likewise; tasks per layer / groups; pred: features+predictor+selector share;\n"
           "  cpu: the share of the scheduler's run its CPU workers spent in tasks (begins, chunks, merges)\n");
    printf("%-22s %-20s %9s %21s %8s %10s %8s %17s %8s %12s %6s %5s\n", "point", "config", "ms/layer", "[min, max]",
           "in-tau", "MiB/layer", "base/this", "[min, max]", "full/this", "tasks/groups", "pred", "cpu");
    double sp16_32k_b4 = NAN, sp16_128k_b8 = NAN, spfull_32k_b4 = NAN, wt_fl_32k = NAN, wt_16_32k = NAN;
    double g_sp = NAN, g_idle_fl = NAN, g_idle_hy = NAN, g_sp128 = NAN, g_idle_fl128 = NAN, g_idle_hy128 = NAN;
    const int gpu = flx_cuda_device_count() > 0;
    if (gpu)
        printf("GPU: a CUDA device: the gpu points run (sessions pinned for UVA), the GPU worker with %u stream(s)\n",
               cx.gpu_streams);
    else
        printf("GPU: none usable: no GPU point (the GPU worker's figures need a device)\n");
    uint32_t row_of[MAX_B];
    for (uint32_t li = 0; li < n_lens; li++) {
        const uint32_t L = lens[li];
        uint32_t nd = (uint32_t)FLX_MIN(distinct, (uint64_t)FLX_MAX(1, budget_tokens / L));
        uint32_t bmax = 0;
        for (uint32_t bi = 0; bi < n_b; bi++) bmax = FLX_MAX(bmax, batches[bi]);
        nd = FLX_MIN(nd, bmax);
        uint32_t dl[MAX_DISTINCT];
        for (uint32_t i = 0; i < nd; i++) dl[i] = L;
        sess_set_t set;
        set_open(&set, dl, nd, 1000 + L, cx.pool);
        printf("%uK: %u distinct session(s); rows of a batch beyond them reuse one\n", L / 1024, nd);
        /* every batch of this length (and its GPU point) on one load of each layer */
        point_t pts[2 * MAX_BATCHES];
        result_t res[2 * MAX_BATCHES][4];
        int main_of[MAX_BATCHES], gpu_of[MAX_BATCHES];   /* batch bi's point, its GPU point (or -1) */
        uint32_t np = 0;
        for (uint32_t bi = 0; bi < n_b; bi++) {
            const uint32_t B = batches[bi];
            for (uint32_t b = 0; b < B; b++) row_of[b] = b % nd;
            char point[48];
            snprintf(point, sizeof point, "%uK_b%u", L / 1024, B);
            main_of[bi] = (int)np;
            point_init(&pts[np], point, row_of, B, MAIN_CFG, 4, 3, 1, res[np]);
            np++;
            gpu_of[bi] = -1;
            if (gpu && (L == 32768 || L == 131072) && (B == 4 || B == 8)) {
                snprintf(point, sizeof point, "gpu%uK_b%u", L / 1024, B);
                gpu_of[bi] = (int)np;   /* base: the hybrid baseline */
                point_init(&pts[np], point, row_of, B, GPU_CFG, 4, -1, 2, res[np]);
                np++;
            }
        }
        measure_points(&cx, &set, pts, np);
        for (uint32_t bi = 0; bi < n_b; bi++) {
            const uint32_t B = batches[bi];
            const result_t *rm = res[main_of[bi]];
            if (L == 32768 && B == 4) sp16_32k_b4 = rm[0].sp16_med, spfull_32k_b4 = rm[0].spfull_med;
            if (L == 131072 && B == 8) sp16_128k_b8 = rm[0].sp16_med;
            /* the within-tau keys: at the target point, 32K batch 4 (else the first 32K point measured) */
            if (L == 32768 && (B == 4 || wt_fl_32k != wt_fl_32k)) wt_fl_32k = rm[0].within, wt_16_32k = rm[1].within;
            if (gpu_of[bi] >= 0) {
                const result_t *rg = res[gpu_of[bi]];
                if (L == 32768 && B == 4) g_sp = rg[1].sp16_med, g_idle_fl = rg[1].gpu_idle, g_idle_hy = rg[2].gpu_idle;
                if (L == 131072 && B == 8)
                    g_sp128 = rg[1].sp16_med, g_idle_fl128 = rg[1].gpu_idle, g_idle_hy128 = rg[2].gpu_idle;
            }
        }
        set_close(&set);
    }
    flx_rng_t rng;
    flx_rng_seed(&rng, 20261124);
    for (uint32_t mi = 0; mi < n_mixed; mi++) {
        /* B lengths U(lo, hi), grouped into at most `distinct` sessions (sorted, each group its median) */
        uint32_t lens_b[MAX_B], B = (uint32_t)mixed_b;
        for (uint32_t b = 0; b < B; b++)
            lens_b[b] = mixed_lo[mi] + (uint32_t)flx_rng_below(&rng, (uint64_t)mixed_hi[mi] - mixed_lo[mi] + 1);
        uint32_t idx[MAX_B];
        for (uint32_t b = 0; b < B; b++) idx[b] = b;
        for (uint32_t i = 1; i < B; i++)
            for (uint32_t j = i; j > 0 && lens_b[idx[j - 1]] > lens_b[idx[j]]; j--) {
                uint32_t t = idx[j];
                idx[j] = idx[j - 1], idx[j - 1] = t;
            }
        uint64_t tot = 0;
        for (uint32_t b = 0; b < B; b++) tot += lens_b[b];
        uint32_t nd = (uint32_t)FLX_MIN(FLX_MIN(distinct, (uint64_t)B), (uint64_t)FLX_MAX(1, budget_tokens * B / tot));
        uint32_t dl[MAX_DISTINCT];
        for (uint32_t g = 0; g < nd; g++) {
            const uint32_t i0 = g * B / nd, i1 = (g + 1) * B / nd;
            dl[g] = lens_b[idx[(i0 + i1) / 2]];
            for (uint32_t i = i0; i < i1; i++) row_of[idx[i]] = g;
        }
        sess_set_t set;
        set_open(&set, dl, nd, 5000 + mi * 100, cx.pool);
        printf("U(%uK, %uK) batch %u: %u distinct session(s), rows grouped by length\n", mixed_lo[mi] / 1024,
               mixed_hi[mi] / 1024, B, nd);
        char point[48];
        point_t pts[2];
        result_t res_main[4], res_abl[7];
        snprintf(point, sizeof point, "mix%uK-%uK_b%u", mixed_lo[mi] / 1024, mixed_hi[mi] / 1024, B);
        point_init(&pts[0], point, row_of, B, MAIN_CFG, 4, 3, 1, res_main);
        snprintf(point, sizeof point, "abl%uK-%uK_b%u", mixed_lo[mi] / 1024, mixed_hi[mi] / 1024, B);
        point_init(&pts[1], point, row_of, B, ABL_CFG, 7, -1, 0, res_abl);
        measure_points(&cx, &set, pts, 2);
        set_close(&set);
    }
    if (cx.csv) fclose(cx.csv);
    if (trace) fclose(trace);
    flx_predictor_destroy(cx.pred);
    flx_pool_destroy(cx.pool);
    char gpu_keys[512] = "";
    if (gpu)
        snprintf(gpu_keys, sizeof gpu_keys, " gpu_speedup_vs_hybrid_16_005_32k_b4=%.3f gpu_idle_ratio_fluxion_32k_b4=%.4f "
                 "gpu_idle_ratio_hybrid_16_005_32k_b4=%.4f gpu_speedup_vs_hybrid_16_005_128k_b8=%.3f "
                 "gpu_idle_ratio_fluxion_128k_b8=%.4f gpu_idle_ratio_hybrid_16_005_128k_b8=%.4f", g_sp, g_idle_fl,
                 g_idle_hy, g_sp128, g_idle_fl128, g_idle_hy128);
    printf("SUMMARY speedup_vs_16_005_32k_b4=%.3f speedup_vs_16_005_128k_b8=%.3f speedup_vs_full_32k_b4=%.3f "
           "within_tau_fluxion_32k=%.4f within_tau_16_005_32k=%.4f%s\n",
           sp16_32k_b4, sp16_128k_b8, spfull_32k_b4, wt_fl_32k, wt_16_32k, gpu_keys);
    free(g_evict);
    return 0;
}
