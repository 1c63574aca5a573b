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
 * pass spends outside attention) in a quiet window, over the read bandwidth this binary measures on
 * the same pool just before and just after that window (a STREAM-like read of a buffer as large as
 * the weights; the mean of the two samples): one ratio per quiet window, median and range over the
 * rounds of every length. A GGUF model is loaded with every matrix as bf16
 * (flx_model_load_as, FLX_WEIGHTS_BF16), the layout that figure has always judged; the compact block formats the
 * node keeps a quantized file in are compared with it by bench/run model.
 *
 * usage: step_bench -m MODEL --text FILE [--lens 2048,8192] [--rounds 5] [--window 8] [--warm 2]
 *                   [--mode full|fixed|fluxion] [--predictor WEIGHTS] [--threads N] [--csv PATH]
 *        (step_bench --help; flx/cli.h's convention: the text, predictor and CSV are opened before the
 *        model loads)
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

#include "../common/bench_cli.h"
#include "../common/bench_read.h"
#include "../common/bench_stats.h"
#include "flx/cli.h"
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
    double read_gbs;    /* quiet windows: the read bandwidth around the window (0 otherwise) */
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
                  sum.dense_ns ? sum.dense_bytes / (double)sum.dense_ns : 0, (cpu_ns() - c0) / 1e6 / n, 0};
    return w;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *csv_path = NULL, *lens_s = NULL, *pred_path = NULL;
    uint32_t lens[MAX_LENS] = {2048, 8192}, n_lens = 2;
    uint64_t rounds_u = 5, win_u = 8, warm_u = 2, threads_u = 0;
    int mode_ix = 0;   /* MODES[] */
    static const char *const MODES[] = {"full", "fixed", "fluxion", NULL};
    static const flx_engine_attn_mode_t MODE_OF[] = {FLX_ENGINE_ATTN_FULL, FLX_ENGINE_ATTN_FIXED,
                                                      FLX_ENGINE_ATTN_FLUXION};
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, FLX_CLI_REQUIRED, "the text the prompts are cut from"),
        FLX_CLI_STR(0, "lens", "L,L,..", &lens_s, 0, "prompt lengths, at most 8 (default 2048,8192; the SUMMARY "
                    "keys are the last one's)"),
        FLX_CLI_UINT(0, "rounds", "N", &rounds_u, 1, MAX_ROUNDS, 0, "rounds of the four conditions (default 5)"),
        FLX_CLI_UINT(0, "window", "N", &win_u, 1, 1000, 0, "measured steps per condition and round (default 8)"),
        FLX_CLI_UINT(0, "warm", "N", &warm_u, 0, 100, 0, "warm-up steps before each window (default 2)"),
        FLX_CLI_ENUM(0, "mode", &mode_ix, MODES, 0, "attention (default full; fixed: (16, 0.05))"),
        FLX_CLI_PATH(0, "predictor", "WEIGHTS", &pred_path, 0, "predictor weights (--mode fluxion only, required "
                     "there)"),
        FLX_CLI_UINT('t', "threads", "N", &threads_u, 1, FLX_POOL_MAX_WORKERS, 0, "workers of the main engine's pool "
                     "(default: the CPU budget)"),
        FLX_CLI_PATH(0, "csv", "PATH", &csv_path, 0, "CSV written (default: none)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("step_bench", "The real model's decode step under CPU contention: TPOT quiet, with 1 "
                                 "and 2 busy loops pinned to CPUs, and on 1 worker, interleaved in rounds.", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if ((rc = flx_bench_u32_list(&cli, "lens", lens_s, 1, 1u << 22, lens, MAX_LENS, &n_lens)) != FLX_CLI_PROCEED)
        return rc;
    const uint32_t rounds = (uint32_t)rounds_u, win = (uint32_t)win_u, warm = (uint32_t)warm_u;
    const uint32_t threads = (uint32_t)threads_u;
    const flx_engine_attn_mode_t mode = MODE_OF[mode_ix];
    const char *mode_s = MODES[mode_ix];
    if (mode == FLX_ENGINE_ATTN_FLUXION && !pred_path)
        return flx_cli_usage_error(&cli, "--mode fluxion needs --predictor");
    if (flx_cli_applies(&cli, mode == FLX_ENGINE_ATTN_FLUXION, "without --mode fluxion", "predictor", NULL))
        return flx_cli_usage_error(&cli, NULL);
    size_t tlen;
    char *text = NULL;
    if (flx_cli_read_file(text_path, (size_t)1 << 30, &text, &tlen))
        return flx_cli_fail(&cli, "--text: %s", flx_error_msg());
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) return flx_cli_fail(&cli, "--csv: cannot create %s: %s", csv_path, strerror(errno));
    flx_predictor_h pred = NULL;
    if (pred_path && flx_predictor_load(pred_path, &pred))
        return flx_cli_fail(&cli, "--predictor: %s", flx_error_msg());
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

    flx_model_t *m;
    flx_tok_h tok;
    /* A GGUF's quantized matrices as bf16: this benchmark's dense figure judges the GEMV against the
     * memory it streams, and the compact block formats' GEMV is bound by arithmetic on small CPUs
     * (bench/run model compares the two). */
    if (flx_model_load_as(model_path, pool, FLX_WEIGHTS_BF16, &m) || flx_tok_load(model_path, &tok)) die("model");
    const flx_model_config_t *c = &m->cfg;
    size_t n_ids = 0;
    int32_t *ids = malloc((tlen + 2) * sizeof *ids);
    if (!ids || flx_tok_encode(tok, text, tlen, flx_tok_add_bos_default(tok), ids, tlen + 2, &n_ids)) die("tokenize");
    uint32_t Lmax = 0;
    for (uint32_t i = 0; i < n_lens; i++) {
        if (lens[i] > n_ids) return flx_cli_fail(&cli, "--lens %u: %s holds %zu tokens", lens[i], text_path, n_ids);
        Lmax = lens[i] > Lmax ? lens[i] : Lmax;
    }
    printf("step_bench: %s (%u layers, %u/%u heads, head_dim %u), %s attention, %s\n", c->name, c->n_layers,
           c->n_heads, c->n_kv_heads, c->head_dim, mode_s, flx_pool_describe(pool));
    printf("competitors: busy loops pinned to CPU %d (loaded1), CPUs %d and %d (loaded2); %u rounds of %u steps "
           "(+%u warm-up) per condition, order rotated per round\n", cpus[0], cpus[0], cpus[1], rounds, win, warm);
    /* The reference read: a buffer of the weights' size, touched once so no page fault is timed. */
    size_t rbytes = flx_model_weight_bytes(m);
    uint8_t *rbuf = flx_bench_read_buf(&rbytes);
    if (!rbuf) die("read buffer");
    printf("text %s: %zu tokens; weights read per step %.1f MB; read bandwidth (same binary, same pool, %.1f MB "
           "buffer) %.1f GB/s\n", text_path, n_ids, flx_model_weight_bytes(m) / 1e6, rbytes / 1e6,
           flx_bench_read_bw(pool, rbuf, rbytes, 3));

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
    if (csv) fprintf(csv, "L,round,condition,tpot_ms,dense_ms,attn_ms,dense_GBps,cpu_ms,ratio_to_quiet,read_GBps\n");

    double summ[MAX_LENS][N_COND] = {{0}}, frac[MAX_LENS * MAX_ROUNDS];
    int frac_n = 0;
    printf("\n%6s %-9s %10s %10s %10s %12s %8s %22s\n", "L", "condition", "TPOT ms", "dense ms", "attn ms",
           "dense GB/s", "CPU ms", "x quiet: median (range)");
    for (uint32_t li = 0; li < n_lens; li++) {
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
                const double b0 = cond == C_QUIET ? flx_bench_read_bw(pool, rbuf, rbytes, 1) : 0;
                w[r][cond] = run_window(cond == C_WORKERS1 ? &B : &A, warm, win);
                kill_busy(pids, np);
                if (cond == C_QUIET) w[r][cond].read_gbs = (b0 + flx_bench_read_bw(pool, rbuf, rbytes, 1)) / 2;
            }
        for (int cond = 0; cond < N_COND; cond++) {
            double t[MAX_ROUNDS], ratio[MAX_ROUNDS], dn[MAX_ROUNDS], at[MAX_ROUNDS], gb[MAX_ROUNDS], cp[MAX_ROUNDS];
            for (uint32_t r = 0; r < rounds; r++) {
                t[r] = w[r][cond].tpot_ms, dn[r] = w[r][cond].dense_ms, at[r] = w[r][cond].attn_ms;
                gb[r] = w[r][cond].dense_gbs, cp[r] = w[r][cond].cpu_ms;
                ratio[r] = w[r][cond].tpot_ms / w[r][C_QUIET].tpot_ms;
                if (csv)
                    fprintf(csv, "%u,%u,%s,%.4f,%.4f,%.4f,%.3f,%.4f,%.4f,%.3f\n", L, r, COND[cond], t[r], dn[r], at[r],
                            gb[r], cp[r], ratio[r], w[r][cond].read_gbs);
                if (cond == C_QUIET) frac[frac_n++] = gb[r] / w[r][cond].read_gbs;
            }
            const double rmed = flx_bench_median(ratio, (int)rounds), rlo = ratio[0], rhi = ratio[rounds - 1];
            summ[li][cond] = rmed;
            printf("%6u %-9s %10.2f %10.2f %10.2f %12.1f %8.2f %10.2f (%.2f .. %.2f)\n", L, COND[cond],
                   flx_bench_median(t, (int)rounds), flx_bench_median(dn, (int)rounds),
                   flx_bench_median(at, (int)rounds), flx_bench_median(gb, (int)rounds),
                   flx_bench_median(cp, (int)rounds), rmed, rlo, rhi);
        }
        fflush(stdout);
        flx_engine_destroy(A.e);
        flx_engine_destroy(B.e);
    }
    double fr[MAX_LENS * MAX_ROUNDS];
    memcpy(fr, frac, sizeof(double) * (size_t)frac_n);
    const double gemv_frac = frac_n ? flx_bench_median(fr, frac_n) : 0;   /* sorts fr */
    printf("\ndense part / read bandwidth around the same quiet window (%d windows): median %.3f (%.3f .. %.3f)\n",
           frac_n, gemv_frac, frac_n ? fr[0] : 0, frac_n ? fr[frac_n - 1] : 0);
    if (csv) fclose(csv);
    const uint32_t last = n_lens - 1;
    printf("SUMMARY tpot_loaded_over_quiet_real_8k=%.3f tpot_2loaded_over_quiet_real_8k=%.3f "
           "tpot_workers1_over_quiet_real_8k=%.3f gemv_bw_frac=%.3f\n",
           summ[last][C_LOADED1], summ[last][C_LOADED2], summ[last][C_WORKERS1], gemv_frac);
    free(logits);
    flx_aligned_free(rbuf);
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
