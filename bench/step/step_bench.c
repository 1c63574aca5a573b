/*
 * step_bench - the decode step under CPU contention (bench/step/run): time per output token (TPOT)
 * of the real model with the host busy, against the same engine with the host quiet, in one run.
 *
 * For each prompt length L, the first L tokens of a real text (tokenized here, with the model's
 * tokenizer) are prefilled twice into one kvstore: session A is decoded by an engine on the
 * default worker pool (the process's CPU budget, or --threads), session B by an engine whose pool
 * has one worker. Both decode greedily (EOS ignored) in windows of --window steps, after --warm
 * steps each; a window runs under one condition:
 *   quiet     engine A, nothing added;
 *   loaded1   engine A with one CPU-bound process (a busy loop) pinned to one CPU of the mask;
 *   loaded2   engine A with two such processes on two CPUs (both of a 2-CPU machine);
 *   workers1  engine B (one worker), nothing added.
 * A round runs the four conditions in an order rotated from round to round (A B C D, B C D A, ..);
 * every ratio (loaded1 / quiet, loaded2 / quiet, workers1 / quiet) is taken within a round, and the
 * table gives the median and the spread (min .. max) over rounds. The competitors are forked by
 * this binary (sched_setaffinity, as taskset does), started before the window's warm-up steps and
 * killed after it; they die with the benchmark (PR_SET_PDEATHSIG).
 *
 * CPU ms: the process's CPU time per step (all its workers; the competitors are other processes):
 * what a step costs in CPU, spinning included, whatever the wall time.
 *
 * gemv_bw_frac: the dense part's bandwidth (weight bytes a step reads over the time the forward
 * pass spends outside attention) in the quiet windows, over the read bandwidth this binary
 * measures on the same pool (the best of its samples: start and after each length).
 *
 * usage: step_bench -m MODEL --text FILE [--lens 2048,8192] [--rounds 5] [--window 8] [--warm 2]
 *                   [--mode full|fixed|fluxion] [--predictor WEIGHTS] [--threads N] [--csv PATH]
 * (fixed: (16, 0.05); fluxion: the given predictor, prefill statistics with tau 0.1)
 * Last line: SUMMARY tpot_loaded_over_quiet_real_8k=<x> tpot_2loaded_over_quiet_real_8k=<y>
 *            tpot_workers1_over_quiet_real_8k=<z> gemv_bw_frac=<w> (8k: the largest length)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/bench_read.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/kvstore.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

enum { C_QUIET = 0, C_LOADED1, C_LOADED2, C_WORKERS1, N_COND, MAX_ROUNDS = 64, MAX_LENS = 8 };
static const char *COND[N_COND] = {"quiet", "loaded1", "loaded2", "workers1"};

static void die(const char *what)
{
    fprintf(stderr, "step_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

/* ---- competitors ---- */

static pid_t spawn_busy(int cpu)
{
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "step_bench: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
        if (sched_setaffinity(0, sizeof s, &s)) _exit(3);
        for (volatile unsigned long x = 0;; x++) {
        }
    }
    return pid;
}

static void kill_busy(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
}

/* ---- input ---- */

static char *read_text(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "step_bench: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (!b) exit(1);
    *len_p = n;
    return b;
}

/* ---- one engine with its session ---- */

typedef struct side {
    flx_engine_h e;
    flx_engine_seq_id_t seq;
} side_t;

static void side_open(side_t *s, const flx_model_t *m, flx_fwd_ws_t *fws, flx_kv_store_h store, const int32_t *ids,
                      uint32_t L, uint32_t room, const flx_engine_params_t *ep, float *logits)
{
    flx_kv_session_id_t sid;
    if (ep->mode == FLX_ENGINE_ATTN_FLUXION
            ? flx_engine_prefill_with_stats(m, fws, store, ids, L, room, 0.1f, &sid, logits)
            : flx_engine_prefill_into_store(m, fws, store, ids, L, room, &sid, logits))
        die("prefill");
    if (flx_engine_create(m, store, ep, &s->e)) die("engine");
    flx_gen_params_t gen = {.max_new_tokens = room, .eos_id = -1, .ignore_eos = 1,
                            .sampling = flx_sampling_greedy()};
    if (flx_engine_add(s->e, sid, (int32_t)flx_sample_argmax(logits, m->cfg.vocab), &gen, &s->seq)) die("add");
}

typedef struct window {
    double tpot_ms, dense_ms, attn_ms, dense_gbs, cpu_ms;
} window_t;

/* CPU time of this process (its worker threads included), in ns. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* warm steps, then n measured steps: their mean. */
static window_t run_window(side_t *s, uint32_t warm, uint32_t n)
{
    flx_engine_stats_t st, sum = {0};
    uint64_t c0 = 0;
    for (uint32_t i = 0; i < warm + n; i++) {
        if (i == warm) c0 = cpu_ns();
        flx_status_t rc = flx_engine_step(s->e);
        if (rc != FLX_INPROGRESS) die(rc < 0 ? "engine step" : "engine step: the sequence ended early");
        if (i < warm) continue;
        flx_engine_last_stats(s->e, &st);
        sum.step_ns += st.step_ns, sum.dense_ns += st.dense_ns, sum.attn_ns += st.attn_ns;
        sum.dense_bytes += st.dense_bytes;
    }
    window_t w = {sum.step_ns / 1e6 / n, sum.dense_ns / 1e6 / n, sum.attn_ns / 1e6 / n,
                  sum.dense_ns ? sum.dense_bytes / (double)sum.dense_ns : 0, (cpu_ns() - c0) / 1e6 / n};
    return w;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *csv_path = NULL, *mode_s = "full", *pred_path = NULL;
    uint32_t lens[MAX_LENS] = {2048, 8192}, rounds = 5, win = 8, warm = 2, threads = 0;
    int n_lens = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        uint64_t x = 0;
        int bad = 0;
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--text")) text_path = v;
        else if (!strcmp(a, "--csv")) csv_path = v;
        else if (!strcmp(a, "--mode")) mode_s = v;
        else if (!strcmp(a, "--predictor")) pred_path = v;
        else if (!strcmp(a, "--rounds")) bad = flx_parse_u64(v, 1, MAX_ROUNDS, &x), rounds = (uint32_t)x;
        else if (!strcmp(a, "--window")) bad = flx_parse_u64(v, 1, 1000, &x), win = (uint32_t)x;
        else if (!strcmp(a, "--warm")) bad = flx_parse_u64(v, 0, 100, &x), warm = (uint32_t)x;
        else if (!strcmp(a, "--threads")) bad = flx_parse_u64(v, 0, FLX_POOL_MAX_WORKERS, &x), threads = (uint32_t)x;
        else if (!strcmp(a, "--lens")) {
            n_lens = 0;
            for (char *p = (char *)v; *p && n_lens < MAX_LENS;) {
                lens[n_lens++] = (uint32_t)strtoul(p, &p, 10);
                if (*p == ',') p++;
                else if (*p) bad = 1, p += strlen(p);
            }
        } else {
            fprintf(stderr, "step_bench: unknown option %s\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "step_bench: %s '%s' is out of range\n", a, v);
            return 2;
        }
    }
    flx_engine_attn_mode_t mode;
    if (!model_path || !text_path || n_lens == 0 || flx_engine_attn_mode_parse(mode_s, &mode) ||
        (mode == FLX_ENGINE_ATTN_FLUXION) != (pred_path != NULL)) {
        fprintf(stderr, "usage: step_bench -m MODEL --text FILE [--lens 2048,8192] [--rounds 5] [--window 8] "
                        "[--warm 2] [--mode full|fixed|fluxion] [--predictor WEIGHTS (fluxion)] [--threads N] "
                        "[--csv PATH]\n");
        return 2;
    }
    flx_predictor_h pred = NULL;
    if (pred_path && flx_predictor_load(pred_path, &pred)) die(pred_path);
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = threads};
    flx_pool_params_t p1 = {.field_mask = FLX_POOL_FIELD_N_WORKERS, .n_workers = 1};
    flx_pool_h pool, pool1;
    if (flx_pool_create(&pp, &pool) || flx_pool_create(&p1, &pool1)) die("worker pool");
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask)) die("affinity");
    int cpus[2], nc = 0;
    for (int c = CPU_SETSIZE - 1; c >= 0 && nc < 2; c--)
        if (CPU_ISSET(c, &mask)) cpus[nc++] = c;
    if (nc == 1) cpus[1] = cpus[0];

    double bw = flx_bench_read_bw_1g(pool, 5);
    flx_model_t *m;
    flx_tok_h tok;
    if (flx_model_load_pool(model_path, pool, &m) || flx_tok_load(model_path, &tok)) die("model");
    const flx_model_config_t *c = &m->cfg;
    size_t tlen, n_ids = 0;
    char *text = read_text(text_path, &tlen);
    int32_t *ids = malloc((tlen + 2) * sizeof *ids);
    if (!ids || flx_tok_encode(tok, text, tlen, flx_tok_add_bos_default(tok), ids, tlen + 2, &n_ids)) die("tokenize");
    uint32_t Lmax = 0;
    for (int i = 0; i < n_lens; i++) {
        if (lens[i] < 1 || lens[i] > n_ids) {
            fprintf(stderr, "step_bench: length %u: %s has %zu tokens\n", lens[i], text_path, n_ids);
            return 2;
        }
        Lmax = lens[i] > Lmax ? lens[i] : Lmax;
    }
    printf("step_bench: %s (%u layers, %u/%u heads, head_dim %u), %s attention, %s\n", c->name, c->n_layers,
           c->n_heads, c->n_kv_heads, c->head_dim, mode_s, flx_pool_describe(pool));
    printf("competitors: busy loops pinned to CPU %d (loaded1), CPUs %d and %d (loaded2); %u rounds of %u steps "
           "(+%u warm-up) per condition, order rotated per round\n", cpus[0], cpus[0], cpus[1], rounds, win, warm);
    printf("text %s: %zu tokens; weights read per step %.1f MB; read bandwidth (same binary, same pool) %.1f GB/s\n",
           text_path, n_ids, flx_model_weight_bytes(m) / 1e6, bw);

    const uint32_t room = rounds * N_COND * (win + warm) + 8;
    size_t per_tok = (size_t)c->n_layers * c->n_kv_heads * c->head_dim * 2 * sizeof(flx_bf16_t);
    flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = per_tok * ((size_t)Lmax + room) * 3 + ((size_t)256 << 20),
                                .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads,
                                .head_dim = c->head_dim};
    flx_kv_store_h store;
    if (flx_kv_store_create(&sp, &store)) die("kvstore");
    flx_fwd_shape_t fs = {.max_prompt = Lmax, .max_batch = 1, .pool = pool};
    size_t wsb;
    void *wsmem = NULL;
    flx_fwd_ws_t *fws;
    if (flx_fwd_plan(m, &fs, &wsb) || !(wsmem = flx_aligned_alloc(64, wsb)) || flx_fwd_ws_init(m, &fs, wsmem, wsb, &fws))
        die("forward workspace");
    float *logits = malloc(c->vocab * sizeof *logits);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) {
        fprintf(stderr, "step_bench: %s: %s\n", csv_path, strerror(errno));
        return 1;
    }
    if (csv) fprintf(csv, "L,round,condition,tpot_ms,dense_ms,attn_ms,dense_GBps,cpu_ms,ratio_to_quiet\n");

    double summ[MAX_LENS][N_COND] = {{0}}, gb_sum = 0;
    int frac_n = 0;
    printf("\n%6s %-9s %10s %10s %10s %12s %8s %22s\n", "L", "condition", "TPOT ms", "dense ms", "attn ms",
           "dense GB/s", "CPU ms", "x quiet: median (range)");
    for (int li = 0; li < n_lens; li++) {
        const uint32_t L = lens[li];
        flx_engine_params_t ep = flx_engine_params_default();
        ep.mode = mode, ep.blk = 16, ep.bgt = 0.05f, ep.max_batch = 1, ep.max_l_cpu = L, ep.predictor = pred;
        side_t A, B;
        ep.pool = pool;
        side_open(&A, m, fws, store, ids, L, room, &ep, logits);
        ep.pool = pool1;
        side_open(&B, m, fws, store, ids, L, room, &ep, logits);
        window_t w[MAX_ROUNDS][N_COND];
        for (uint32_t r = 0; r < rounds; r++)
            for (int k = 0; k < N_COND; k++) {
                const int cond = (int)((k + r) % N_COND);
                pid_t pids[2];
                int np = cond == C_LOADED1 ? 1 : cond == C_LOADED2 ? 2 : 0;
                for (int i = 0; i < np; i++) pids[i] = spawn_busy(cpus[i]);
                w[r][cond] = run_window(cond == C_WORKERS1 ? &B : &A, warm, win);
                kill_busy(pids, np);
            }
        for (int cond = 0; cond < N_COND; cond++) {
            double t[MAX_ROUNDS], ratio[MAX_ROUNDS], dn[MAX_ROUNDS], at[MAX_ROUNDS], gb[MAX_ROUNDS], cp[MAX_ROUNDS];
            for (uint32_t r = 0; r < rounds; r++) {
                t[r] = w[r][cond].tpot_ms, dn[r] = w[r][cond].dense_ms, at[r] = w[r][cond].attn_ms;
                gb[r] = w[r][cond].dense_gbs, cp[r] = w[r][cond].cpu_ms;
                ratio[r] = w[r][cond].tpot_ms / w[r][C_QUIET].tpot_ms;
                if (csv)
                    fprintf(csv, "%u,%u,%s,%.4f,%.4f,%.4f,%.3f,%.4f,%.4f\n", L, r, COND[cond], t[r], dn[r], at[r], gb[r],
                            cp[r], ratio[r]);
                if (cond == C_QUIET) gb_sum += gb[r], frac_n++;
            }
            const double rmed = median(ratio, (int)rounds), rlo = ratio[0], rhi = ratio[rounds - 1];
            summ[li][cond] = rmed;
            printf("%6u %-9s %10.2f %10.2f %10.2f %12.1f %8.2f %10.2f (%.2f .. %.2f)\n", L, COND[cond],
                   median(t, (int)rounds), median(dn, (int)rounds), median(at, (int)rounds), median(gb, (int)rounds),
                   median(cp, (int)rounds), rmed, rlo, rhi);
        }
        fflush(stdout);
        flx_engine_destroy(A.e);
        flx_engine_destroy(B.e);
        double b = flx_bench_read_bw_1g(pool, 5);
        bw = b > bw ? b : bw;
    }
    const double gemv_frac = frac_n ? gb_sum / frac_n / bw : 0;
    printf("\nread bandwidth, best sample of the run: %.1f GB/s; dense part in the quiet windows: %.3f of it\n", bw,
           gemv_frac);
    printf("(the quiet windows' dense GB/s above are against the best read sample; a shared machine makes every "
           "figure noisy: re-measure on a quiet one)\n");
    if (csv) fclose(csv);
    const int last = n_lens - 1;
    printf("SUMMARY tpot_loaded_over_quiet_real_8k=%.3f tpot_2loaded_over_quiet_real_8k=%.3f "
           "tpot_workers1_over_quiet_real_8k=%.3f gemv_bw_frac=%.3f\n",
           summ[last][C_LOADED1], summ[last][C_LOADED2], summ[last][C_WORKERS1], gemv_frac);
    free(logits);
    free(ids);
    free(text);
    flx_aligned_free(wsmem);
    flx_kv_store_destroy(store);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_predictor_destroy(pred);
    flx_pool_destroy(pool1);
    flx_pool_destroy(pool);
    return 0;
}
