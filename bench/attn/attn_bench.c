/*
 * attn_bench - Fluxion CPU attention core at Llama-3.1-8B per-layer shapes (32 query heads, 8 KV
 * heads, head_dim 128), prompt lengths and batch sizes from the command line.
 *
 * For each L it creates a one-layer kvstore (sink 64, local 256; l_cpu = L - 320 host tokens per kv
 * head), pushes the KV of the largest batch's sequences through flx_kv_chunk_write (the store builds
 * the pyramid), runs a worker pool bound to the store's NUMA node (flx/pool.h), and times the host
 * part of one decode step (flx_attn_host_run for every (sequence, kv group): tasks claimed by the
 * workers, one workspace each; the best of --reps steps) in modes: FULL, and FIXED (blk, bgt) for blk in
 * {16,32,64,128} x bgt in {0.02, 0.05}. Time is split into scoring+top-k and attention (Fig. 2(d)
 * of the paper); GB/s is over the bytes each kernel must read (scoring: the metadata entries at that
 * blk; attention: K+V of the distinct blocks the group's heads selected; full: all K+V), against a
 * STREAM-like read bandwidth measured by this binary on the same pool (the best of its samples:
 * start, after each prompt length). Workers: FLX_THREADS, else the process's CPU budget. Then
 * top-k alone, one head at each (L, blk in {16, 64}, bgt): flx_topk's AVX-512 passes against its
 * scalar loops in the same binary, pairs in rotated order (topk_row).
 *
 * usage: attn_bench [--lens 32768,65536,131072] [--batches 1,4,8] [--reps N] [--csv PATH]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "../common/bench_cli.h"
#include "../common/bench_read.h"
#include "../common/bench_stats.h"
#include "flx/attn.h"
#include "flx/cli.h"
#include "flx/kvstore.h"
#include "flx/util.h"

enum { HQ = 32, HKV = 8, G = HQ / HKV, D = 128, SINK = 64, LOCAL = 256 };

typedef struct {
    uint64_t seed;
} rowgen_t;

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Stateless rows: values ~ sum of 4 uniform bytes (bell-shaped), with a slowly varying per-64-token
 * bias so block scores are not all alike. */
static void gen_row(void *ctx, uint32_t i, flx_bf16_t *k, flx_bf16_t *v)
{
    const rowgen_t *g = ctx;
    float bias = (float)(mix(g->seed ^ (i / 64)) % 1000) / 1000.0f;
    for (uint32_t d = 0; d < D; d += 4) {
        uint64_t r = mix(g->seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * D + d);
        for (int j = 0; j < 4; j++) {
            uint32_t b = (uint32_t)(r >> (16 * j));
            float x = ((float)((b & 255) + ((b >> 8) & 255)) - 255.0f) / 90.0f;
            k[d + j] = flx_f32_to_bf16(x + (j == 0 ? bias : 0.0f));
            v[d + j] = flx_f32_to_bf16(-x * 0.5f);
        }
    }
}

enum { CH = 1024 };   /* tokens per pushed chunk */

typedef struct push {
    flx_kv_store_h store;
    flx_kv_session_id_t sid;
    uint32_t L, x;
} push_t;

/* Chunk c of sequence x's KV, generated into the worker's scratch and written to the store. */
static flx_status_t push_chunk(void *ctx, const flx_pool_worker_t *w, uint64_t c, uint64_t c_end)
{
    const push_t *p = ctx;
    flx_bf16_t *ck = w->scratch, *cv = ck + (size_t)HKV * CH * D;
    for (; c < c_end; c++) {
        const uint32_t c0 = (uint32_t)c * CH, c1 = c0 + CH < p->L ? c0 + CH : p->L;
        for (uint32_t h = 0; h < HKV; h++) {
            rowgen_t g = {.seed = mix(p->L * 1000003ull + p->x * HKV + h)};
            for (uint32_t t = c0; t < c1; t++)
                gen_row(&g, t, ck + ((size_t)h * (c1 - c0) + t - c0) * D, cv + ((size_t)h * (c1 - c0) + t - c0) * D);
        }
        flx_kv_chunk_t kc = {.layer = 0, .head_begin = 0, .head_end = HKV, .tok_begin = c0, .tok_end = c1,
                             .dtype = FLX_DT_BF16, .head_dim = D};
        flx_status_t st = flx_kv_chunk_write(p->store, p->sid, &kc, ck, cv);
        if (st) return st;
    }
    return FLX_OK;
}

typedef struct acc {
    uint64_t score_ns, topk_ns, attn_ns, score_bytes, attn_bytes;
} acc_t;

typedef struct task_job {
    flx_attn_ws_t *wss;            /* one per worker */
    const flx_kv_head_view_t *views;
    const float *qs;
    const flx_attn_cfg_t *cfg;
    acc_t *per;                    /* one per worker */
} task_job_t;

/* Tasks [t0, t1) (sequence x kv group), each on the claiming worker's workspace. */
static flx_status_t task_run(void *ctx, const flx_pool_worker_t *w, uint64_t t0, uint64_t t1)
{
    const task_job_t *j = ctx;
    for (uint64_t task = t0; task < t1; task++) {
        float o[G * D], lse[G];
        flx_attn_timing_t tm = {0};
        flx_status_t st = flx_attn_host_run(&j->wss[w->index], &j->views[task], j->qs + (size_t)task * G * D, j->cfg,
                                            o, lse, &tm);
        if (st) return st;
        acc_t *a = &j->per[w->index];
        a->score_ns += tm.score_ns, a->topk_ns += tm.topk_ns, a->attn_ns += tm.attn_ns;
        a->score_bytes += tm.score_bytes, a->attn_bytes += tm.attn_bytes;
    }
    return FLX_OK;
}

/* One measured configuration, kept until the end: its fractions use the run's best bandwidth. */
typedef struct {
    uint32_t L, batch, blk;
    const char *mode;
    float bgt;
    double sc_only_ms, tk_ms, at_ms, frac, sc_gb, at_gb, score_mb, attn_mb;
} row_t;

/* Top-k of one head at n blocks: the AVX-512 passes against the scalar loops of the same
 * flx_topk (flx_isa_force), timed in pairs with the order rotated, each side R calls over 16
 * score rows (N(0, 1) with 1 % needles at +4); returns the median ratio scalar / SIMD (NaN: no
 * AVX-512 here) and prints the row. */
static double topk_row(uint32_t n, uint32_t k, const char *what)
{
    enum { ROWS = 16, PAIRS = 15 };
    const flx_isa_t best = flx_isa_active();
    if (best < FLX_ISA_AVX512) return NAN;
    float *s = malloc((size_t)ROWS * n * sizeof(float));
    uint32_t *idx = malloc((size_t)n * sizeof(uint32_t));
    if (!s || !idx) {
        fprintf(stderr, "attn_bench: out of memory for the top-k rows\n");
        exit(1);
    }
    flx_rng_t rng;
    flx_rng_seed(&rng, 0x5eed);
    for (size_t i = 0; i < (size_t)ROWS * n; i++)
        s[i] = (float)flx_rng_normal(&rng) + (flx_rng_below(&rng, 100) == 0 ? 4.0f : 0.0f);
    const uint32_t R = n < 4096 ? 64 : 16;
    double ratio[PAIRS], t[2][PAIRS];
    for (int p = 0; p < PAIRS; p++) {
        for (int side = 0; side < 2; side++) {
            const int simd = (side + p) % 2;   /* rotated order */
            flx_isa_force(simd ? best : FLX_ISA_SCALAR);
            const uint64_t t0 = flx_now_ns();
            for (uint32_t c = 0; c < R; c++)
                if (flx_topk(s + (size_t)(c % ROWS) * n, n, k, idx)) {
                    fprintf(stderr, "attn_bench: flx_topk: %s\n", flx_error_msg());
                    exit(1);
                }
            t[simd][p] = (double)(flx_now_ns() - t0) / R * 1e-3;
        }
        ratio[p] = t[0][p] / t[1][p];
    }
    flx_isa_force(best);
    const double med = flx_bench_median(ratio, PAIRS), lo = ratio[0], hi = ratio[PAIRS - 1];
    printf("%-12s %7u %6u %12.2f %10.2f %9.2f [%5.2f, %5.2f]\n", what, n, k, flx_bench_median(t[0], PAIRS),
           flx_bench_median(t[1], PAIRS), med, lo, hi);
    free(s);
    free(idx);
    return med;
}

int main(int argc, char **argv)
{
    uint32_t lens[8] = {32768, 65536, 131072}, batches[8] = {1, 4, 8};
    uint32_t n_lens = 3, n_b = 3;   /* counts of lens[], batches[] */
    const char *csv_path = "attn.csv", *lens_s = NULL, *batches_s = NULL;
    uint64_t reps_u = 3;
    flx_cli_opt_t opts[] = {
        FLX_CLI_STR(0, "lens", "L,L,..", &lens_s, 0, "prompt lengths, 1024..2097152 (default 32768,65536,131072)"),
        FLX_CLI_STR(0, "batches", "B,B,..", &batches_s, 0, "batch sizes, 1..64 (default 1,4,8)"),
        FLX_CLI_UINT(0, "reps", "N", &reps_u, 1, 1000, 0, "steps timed per configuration, the best kept (default 3)"),
        FLX_CLI_PATH(0, "csv", "PATH", &csv_path, 0, "CSV written (default attn.csv)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("attn_bench", "Fluxion's CPU attention core at Llama-3.1-8B layer shapes against the "
                                 "read bandwidth this binary measures.", opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if ((rc = flx_bench_u32_list(&cli, "lens", lens_s, 1024, 1u << 21, lens, 8, &n_lens)) != FLX_CLI_PROCEED ||
        (rc = flx_bench_u32_list(&cli, "batches", batches_s, 1, 64, batches, 8, &n_b)) != FLX_CLI_PROCEED)
        return rc;
    const int reps = (int)reps_u;
    flx_pool_h pool = NULL;   /* made with the first store, on its NUMA node */
    {
        flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                    .capacity_bytes = (size_t)16 << 20, .n_layers = 1, .n_kv_heads = HKV,
                                    .n_q_heads = HQ, .head_dim = D};
        flx_kv_store_h probe;
        flx_kv_store_info_t pi;
        if (flx_kv_store_create(&sp, &probe)) return 1;
        flx_kv_store_info(probe, &pi);
        flx_kv_store_destroy(probe);
        flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_NUMA_NODE, .numa_node = pi.numa_node};
        if (flx_pool_create(&pp, &pool)) {
            fprintf(stderr, "attn_bench: worker pool: %s\n", flx_error_msg());
            return 1;
        }
    }
    int threads = (int)flx_pool_size(pool);
    if (threads > 64) {
        fprintf(stderr, "attn_bench: %d workers, at most 64 (FLX_THREADS)\n", threads);
        return 2;
    }
    uint32_t bmax = 0;
    for (uint32_t i = 0; i < n_b; i++) bmax = batches[i] > bmax ? batches[i] : bmax;
    if (bmax > 64) bmax = 64;
    printf("attn_bench: Llama-3.1-8B layer shapes (H %d, H_kv %d, D %d), sink %d local %d, %s, isa %s\n", HQ, HKV,
           D, SINK, LOCAL, flx_pool_describe(pool), flx_isa_name(flx_isa_active()));

    /* STREAM-like read bandwidth over 1 GiB with the same thread count, sampled at the start, after
     * each prompt length and at the end: every fraction uses the best sample (on a shared machine a
     * contended sample would flatter the kernels). */
    size_t sb = (size_t)1 << 30;
    uint8_t *sbuf = flx_aligned_alloc(4096, sb);
    if (!sbuf) return 1;
    memset(sbuf, 1, sb);
    double bw = flx_bench_read_bw(pool, sbuf, sb, 5);
    printf("read bandwidth: %.1f GB/s (%d workers, best of 5 passes over 1 GiB)\n", bw, threads);
    row_t *rows = calloc(64 * 8 * 8, sizeof *rows);
    int n_rows = 0;
    printf("%7s %5s %-6s %4s %6s %9s %9s %10s %10s %7s %9s %9s\n", "L", "batch", "mode", "blk", "bgt", "score ms",
           "topk ms", "attn ms",
           "total ms", "topk%", "score GB/s", "attn GB/s");

    /* One workspace per worker, each task on one worker: a layer's tasks (sequence x kv group) are
     * claimed by the workers, as the scheduler's CPU workers pull them. */
    flx_attn_shape_t shape = {.group = G, .head_dim = D, .max_l_cpu = 0, .pool = NULL};
    for (uint32_t li = 0; li < n_lens; li++) shape.max_l_cpu = lens[li] > shape.max_l_cpu ? lens[li] : shape.max_l_cpu;
    size_t wsb;
    if (flx_attn_plan(&shape, &wsb)) return 1;
    if (flx_pool_reserve_scratch(pool, (size_t)2 * HKV * CH * D * sizeof(flx_bf16_t))) return 1;
    flx_attn_ws_t *wss = calloc((size_t)threads, sizeof *wss);
    void **wsm = calloc((size_t)threads, sizeof *wsm);
    for (int t = 0; t < threads; t++) {
        wsm[t] = flx_aligned_alloc(64, wsb);
        if (!wsm[t] || flx_attn_ws_init(&wss[t], &shape, wsm[t], wsb)) return 1;
    }
    float *qs = malloc(sizeof(float) * 64 * HQ * D);
    flx_rng_t rng;
    flx_rng_seed(&rng, 1234);
    double last_attn_frac = -1, last_score_frac = -1, last_full_frac = -1;

    for (uint32_t li = 0; li < n_lens; li++) {
        uint32_t L = lens[li], B = bmax;
        /* memory check: K+V + pyramid (~1/8 + 1/16 + ...) of one layer, batch B */
        double need_gb = (double)L * D * 4 * HKV * B * 1.15 / 1e9;
        long avail_kb = flx_bench_mem_available_kb();
        while (B > 1 && avail_kb > 0 && need_gb > 0.6 * avail_kb / 1e6) {
            B /= 2;
            need_gb = (double)L * D * 4 * HKV * B * 1.15 / 1e9;
        }
        if (B < bmax)
            printf("L %u: memory available %.1f GB: batch capped at %u; skipped larger batches\n", L, avail_kb / 1e6, B);
        uint64_t t0 = flx_now_ns();
        flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                                  FLX_KV_STORE_FIELD_WINDOW,
                                    .capacity_bytes = (size_t)(need_gb * 1.2e9) + ((size_t)64 << 20), .n_layers = 1,
                                    .n_kv_heads = HKV, .n_q_heads = HQ, .head_dim = D, .sink = SINK, .local = LOCAL};
        flx_kv_store_h store;
        if (flx_kv_store_create(&sp, &store)) {
            printf("L %u: store: %s\n", L, flx_error_msg());
            return 1;
        }
        flx_kv_session_id_t sid[64];
        flx_kv_session_h sess[64];
        for (uint32_t x = 0; x < B; x++) {
            flx_kv_session_params_t ssp = {.prompt_len = L, .max_new_tokens = 16, .flags = FLX_KV_SESSION_NO_STATS};
            if (flx_kv_session_open(store, &ssp, &sid[x])) {
                printf("L %u: session: %s\n", L, flx_error_msg());
                return 1;
            }
            push_t pj = {store, sid[x], L, x};
            if (flx_pool_for(pool, FLX_DIV_UP(L, CH), 1, push_chunk, &pj) ||
                flx_kv_session_acquire(store, sid[x], &sess[x])) {
                printf("L %u: push/acquire: %s\n", L, flx_error_msg());
                return 1;
            }
        }
        flx_kv_store_info_t sinfo;
        flx_kv_store_info(store, &sinfo);
        flx_kv_head_view_t *views = calloc((size_t)B * HKV, sizeof *views);
        for (uint32_t x = 0; x < B * HKV; x++)
            if (flx_kv_head_view(sess[x / HKV], 0, x % HKV, &views[x])) {
                printf("view: %s\n", flx_error_msg());
                return 1;
            }
        printf("L %u: pushed %u sequences x %d kv heads through the kvstore (numa node %d) in %.1f s\n", L, B, HKV,
               sinfo.numa_node, (flx_now_ns() - t0) * 1e-9);
        for (uint32_t bi = 0; bi < n_b; bi++) {
            uint32_t b = batches[bi];
            if (b > B) {
                printf("skipped L %u batch %u (memory cap)\n", L, b);
                continue;
            }
            struct { flx_attn_mode_t mode; uint32_t blk; float bgt; } modes[9];
            int nm = 0;
            modes[nm].mode = FLX_ATTN_FULL, modes[nm].blk = 16, modes[nm++].bgt = 1;
            const uint32_t blks[4] = {16, 32, 64, 128};
            const float bgts[2] = {0.02f, 0.05f};
            for (int j = 0; j < 2; j++)
                for (int i = 0; i < 4; i++) modes[nm].mode = FLX_ATTN_FIXED, modes[nm].blk = blks[i], modes[nm++].bgt = bgts[j];
            for (int mi = 0; mi < nm; mi++) {
                flx_attn_cfg_t cfg = {.mode = modes[mi].mode, .blk = modes[mi].blk, .budget = modes[mi].bgt};
                /* best of r_n repetitions (rep 0 warms up); each rep is one layer step of b sequences */
                acc_t a = {0};
                double best_wall = 1e30;
                int r_n = modes[mi].mode == FLX_ATTN_FULL ? (reps > 2 ? 2 : reps) : reps;
                for (int r = 0; r < r_n + 1; r++) {
                    for (uint32_t i = 0; i < b * HQ * D; i++) qs[i] = (float)flx_rng_normal(&rng);
                    acc_t per[64] = {{0}};
                    task_job_t tj = {wss, views, qs, &cfg, per};
                    uint64_t w0 = flx_now_ns();
                    flx_status_t fail = flx_pool_for(pool, (uint64_t)b * HKV, 1, task_run, &tj);
                    double wall = (flx_now_ns() - w0) * 1e-9;
                    if (fail) {
                        printf("host_run failed: %s\n", flx_error_msg());
                        return 1;
                    }
                    if (r == 0 || wall >= best_wall) continue;
                    best_wall = wall;
                    memset(&a, 0, sizeof a);
                    for (int t = 0; t < threads; t++) {
                        a.score_ns += per[t].score_ns, a.topk_ns += per[t].topk_ns, a.attn_ns += per[t].attn_ns;
                        a.score_bytes += per[t].score_bytes, a.attn_bytes += per[t].attn_bytes;
                    }
                }
                /* A kernel's time per layer step = its summed thread time / threads (all threads busy),
                 * so GB/s is what the kernel sustains with every core on it. */
                const double T = threads;
                double sc_only_ms = a.score_ns / 1e6 / T, tk_ms = a.topk_ns / 1e6 / T;
                double sc_ms = sc_only_ms + tk_ms, at_ms = a.attn_ns / 1e6 / T;
                double sc_gb = a.score_ns ? a.score_bytes / (a.score_ns / T) : 0;
                double at_gb = a.attn_ns ? a.attn_bytes / (a.attn_ns / T) : 0;
                double frac = sc_ms / (sc_ms + at_ms);
                const char *mn = modes[mi].mode == FLX_ATTN_FULL ? "full" : "fixed";
                printf("%7u %5u %-6s %4u %6.2f %9.3f %9.3f %10.3f %10.3f %6.1f%% %9.1f %9.1f\n", L, b, mn, modes[mi].blk,
                       modes[mi].bgt, sc_only_ms, tk_ms, at_ms, sc_ms + at_ms, 100 * frac, sc_gb, at_gb);
                rows[n_rows++] = (row_t){L, b, modes[mi].blk, mn, modes[mi].bgt, sc_only_ms, tk_ms, at_ms, frac, sc_gb,
                                         at_gb, a.score_bytes / 1e6, a.attn_bytes / 1e6};
            }
            fflush(stdout);
        }
        for (uint32_t x = 0; x < B; x++) {
            flx_kv_session_release(sess[x]);
            flx_kv_session_close(store, sid[x]);
        }
        free(views);
        flx_kv_store_destroy(store);
        double bw2 = flx_bench_read_bw(pool, sbuf, sb, 5);
        printf("read bandwidth after L %u: %.1f GB/s\n", L, bw2);
        bw = bw2 > bw ? bw2 : bw;
    }
    flx_aligned_free(sbuf);
    for (int t = 0; t < threads; t++) flx_aligned_free(wsm[t]);
    free(wsm);
    free(wss);
    free(qs);
    flx_pool_destroy(pool);

    /* top-k alone: the AVX-512 passes vs the scalar loops, per (L, blk, bgt) of the table */
    double topk_speedup = NAN;
    if (flx_isa_active() >= FLX_ISA_AVX512) {
        printf("top-k of one head, %s vs scalar (same flx_topk, pairs in rotated order, median [min, max] of 15):\n",
               flx_isa_name(flx_isa_active()));
        printf("%-12s %7s %6s %12s %10s %9s\n", "(L,blk,bgt)", "blocks", "k", "scalar us", "simd us", "speedup");
        for (uint32_t li = 0; li < n_lens; li++)
            for (uint32_t blk = 16; blk <= 64; blk *= 4)
                for (int bi = 0; bi < 2; bi++) {
                    const float bgt = bi ? 0.05f : 0.02f;
                    const uint32_t l_cpu = lens[li] - SINK - LOCAL, n = FLX_DIV_UP(l_cpu, blk);
                    char what[32];
                    snprintf(what, sizeof what, "%uK,%u,%.2f", lens[li] / 1024, blk, (double)bgt);
                    const double sp = topk_row(n, flx_attn_budget_blocks(bgt, l_cpu, blk), what);
                    if (blk == 16 && bi == 1) topk_speedup = sp;   /* (16, 0.05) at the largest L */
                }
    } else {
        printf("top-k: no AVX-512 here, one path (the scalar loops): no speedup measured\n");
    }

    FILE *csv = fopen(csv_path, "w");
    if (!csv) {
        perror(csv_path);
        return 1;
    }
    fprintf(csv, "L,batch,mode,blk,budget,score_ms,topk_ms,score_topk_ms,attn_ms,total_ms,topk_frac,score_GBps,attn_GBps,"
                 "score_MB,attn_MB,read_bw_GBps,score_bw_frac,attn_bw_frac\n");
    for (int i = 0; i < n_rows; i++) {
        const row_t *r = &rows[i];
        double sc_ms = r->sc_only_ms + r->tk_ms;
        fprintf(csv, "%u,%u,%s,%u,%.2f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f\n", r->L, r->batch,
                r->mode, r->blk, (double)r->bgt, r->sc_only_ms, r->tk_ms, sc_ms, r->at_ms, sc_ms + r->at_ms, r->frac,
                r->sc_gb, r->at_gb, r->score_mb, r->attn_mb, bw, r->sc_gb / bw, r->at_gb / bw);
        if (!strcmp(r->mode, "full")) last_full_frac = r->at_gb / bw;
        if (!strcmp(r->mode, "fixed") && r->blk == 16 && r->bgt == 0.05f) {
            last_attn_frac = r->at_gb / bw;
            last_score_frac = r->sc_gb / bw;
        }
    }
    fclose(csv);
    free(rows);
    printf("fractions against the best read bandwidth of the run: %.1f GB/s\n", bw);
    printf("summary keys: fixed (16, 0.05) and full at the largest (L, batch) measured; score GB/s = metadata bytes over "
           "scoring time (top-k timed apart)\n");
    printf("SUMMARY attn_bw_frac=%.3f score_bw_frac=%.3f full_bw_frac=%.3f topk_simd_speedup_16_005=%.2f\n",
           last_attn_frac, last_score_frac, last_full_frac, topk_speedup);
    return 0;
}
