/*
 * fluxion_demo.c - the main job until the decode node exists: what the host KV store and the
 * attention core do for one decode step of a long prompt, printed for a person to read.
 *
 * A prompt of L tokens with the per-layer shape of Llama-3.1-8B (32 query heads, 8 KV heads,
 * head_dim 128) is pushed into a NUMA-aware store the way a prefill node would: chunks in random
 * order, checked and placed, the Quest pyramid built when the layer completes. The KV carries a
 * few "needle" spans per KV head whose keys match the decode query, so attention has something to
 * find. Then one decode step's attention runs for every KV group in each mode (full, the paper's
 * fixed (blk, bgt) baselines, budget 1, window only), and the demo prints host bytes read, time,
 * error against full attention, and how many needle blocks the Quest top-k found.
 *
 * usage: fluxion-demo [--tokens L] [-s S]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/cli.h"
#include "flx/cpu.h"
#include "flx/kvstore.h"
#include "flx/util.h"

#define N_KV 8
#define GROUP 4
#define D 128
#define NEEDLES 4

static void die(const char *what)
{
    fprintf(stderr, "fluxion-demo: %s: %s\n", what, flx_error_msg());
    exit(1);
}

int main(int argc, char **argv)
{
    uint64_t tokens = 32768 + 320, seed = 2026;
    flx_cli_opt_t opts[] = {
        FLX_CLI_UINT(0, "tokens", "L", &tokens, 1024, 1u << 20, 0, "prompt tokens (default 33088)"),
        FLX_CLI_UINT('s', "seed", "S", &seed, 0, UINT64_MAX, 0,
                     "seed of the KV, the needles and the queries (default 2026)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("fluxion-demo",
                                 "One decode step of attention over a long prompt in the host KV store, "
                                 "per mode: host bytes read, time, error against full attention, needles found.",
                                 opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const uint32_t L = (uint32_t)tokens;
    flx_rng_t rng;
    flx_rng_seed(&rng, seed);
    const uint32_t H = N_KV * GROUP;

    /* Store: one layer of the Llama-3.1-8B shape. */
    flx_kv_store_params_t sp = {0};
    sp.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE;
    sp.capacity_bytes = (size_t)2 << 30;
    sp.n_layers = 1, sp.n_kv_heads = N_KV, sp.n_q_heads = H, sp.head_dim = D;
    flx_kv_store_h store;
    if (flx_kv_store_create(&sp, &store) != FLX_OK) die("store");
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    printf("== host KV store\n");
    printf("capacity %.1f GiB on NUMA node %d of %d (transparent huge pages %s, CUDA pinned %s), blocks of %zu bytes\n",
           si.capacity_bytes / 1073741824.0, si.numa_node, flx_numa_node_count(), si.hugepages ? "on" : "off",
           si.pinned ? "yes" : "no", si.block_bytes);
    printf("kernels: %s (best on this CPU: %s)\n", flx_isa_name(flx_isa_active()), flx_isa_name(flx_isa_best()));

    /* Prompt KV with needles: (N_KV, L, D) for K and V. */
    size_t n = (size_t)N_KV * L * D;
    flx_bf16_t *k = malloc(n * 2), *v = malloc(n * 2);
    float *dir = malloc((size_t)N_KV * NEEDLES * D * sizeof(float)); /* needle key directions */
    uint32_t needle_tok[N_KV][NEEDLES];
    if (!k || !v || !dir) die("memory");
    for (size_t i = 0; i < n; i++) {
        k[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
        v[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
    }
    for (uint32_t h = 0; h < N_KV; h++)
        for (int j = 0; j < NEEDLES; j++) {
            float *u = dir + ((size_t)h * NEEDLES + j) * D;
            double nn = 0;
            for (int d = 0; d < D; d++) {
                u[d] = (float)flx_rng_normal(&rng);
                nn += (double)u[d] * u[d];
            }
            for (int d = 0; d < D; d++) u[d] = (float)(u[d] / sqrt(nn));
            /* A 16-token span in the host segment (positions [64, L - 256)), 16-aligned. */
            uint32_t t0 = 64 + 16 * (uint32_t)flx_rng_below(&rng, (L - 64 - 256 - 16) / 16);
            needle_tok[h][j] = t0;
            for (uint32_t t = t0; t < t0 + 16; t++)
                for (int d = 0; d < D; d++) {
                    size_t at = ((size_t)h * L + t) * D + d;
                    k[at] = flx_f32_to_bf16(24.0f * u[d] + 0.3f * (float)flx_rng_normal(&rng));
                    v[at] = flx_f32_to_bf16(4.0f * u[d] * (j % 2 ? 1 : -1) + (float)flx_rng_normal(&rng));
                }
        }

    /* Push like a prefill node: 2048-token chunks of 2 heads, in random order. */
    flx_kv_session_params_t ssp = {.prompt_len = L, .max_new_tokens = 16, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    if (flx_kv_session_open(store, &ssp, &sid) != FLX_OK) die("session open");
    typedef struct { uint32_t h0, t0, t1; } ch_t;
    uint32_t n_ch = 0, per = 2048;
    ch_t *ch = malloc(sizeof *ch * (N_KV / 2) * (L / per + 1));
    for (uint32_t h0 = 0; h0 < N_KV; h0 += 2)
        for (uint32_t t0 = 0; t0 < L; t0 += per) ch[n_ch++] = (ch_t){h0, t0, t0 + per < L ? t0 + per : L};
    for (uint32_t i = n_ch; i > 1; i--) {
        uint32_t j = (uint32_t)flx_rng_below(&rng, i);
        ch_t t = ch[i - 1];
        ch[i - 1] = ch[j];
        ch[j] = t;
    }
    flx_bf16_t *pk = malloc((size_t)2 * per * D * 2), *pv = malloc((size_t)2 * per * D * 2);
    uint64_t t_push = 0, bytes_push = 0;
    for (uint32_t i = 0; i < n_ch; i++) {
        uint32_t nt = ch[i].t1 - ch[i].t0;
        for (uint32_t hh = 0; hh < 2; hh++) {
            memcpy(pk + (size_t)hh * nt * D, k + ((size_t)(ch[i].h0 + hh) * L + ch[i].t0) * D, (size_t)nt * D * 2);
            memcpy(pv + (size_t)hh * nt * D, v + ((size_t)(ch[i].h0 + hh) * L + ch[i].t0) * D, (size_t)nt * D * 2);
        }
        flx_kv_chunk_t c = {0, ch[i].h0, ch[i].h0 + 2, ch[i].t0, ch[i].t1, FLX_DT_BF16, D, FLX_KV_ORDER_SPLIT};
        uint64_t a = flx_now_ns();
        if (flx_kv_chunk_write(store, sid, &c, pk, pv) != FLX_OK) die("chunk");
        t_push += flx_now_ns() - a;
        bytes_push += 2ull * 2 * nt * D * 2;
    }
    flx_kv_session_info_t info;
    flx_kv_session_info(store, sid, &info);
    printf("\n== prefill push (in-process, as a prefill node would over UCX)\n");
    printf("prompt %u tokens: %u sink + %u host-resident + %u local; %u chunks in random order, %.1f MiB in %.3f s "
           "(%.2f GB/s incl. checks and the pyramid); session %s\n",
           L, info.n_sink, info.l_cpu, info.n_local, n_ch, bytes_push / 1048576.0, t_push * 1e-9,
           bytes_push / (t_push * 1e-9) * 1e-9, flx_kv_state_name(info.state));
    flx_kv_store_info(store, &si);
    printf("store: %u session(s), %.1f MiB reserved of %.1f GiB\n", si.n_sessions, si.used_bytes / 1048576.0,
           si.capacity_bytes / 1073741824.0);
    if (flx_kv_session_begin_decode(store, sid) != FLX_OK) die("begin decode");

    /* One decode query per head: its needle direction (head g of a group targets needle g % 4)
     * plus noise, and the new token's K/V appended to the window. */
    flx_kv_session_h sess;
    if (flx_kv_session_acquire(store, sid, &sess) != FLX_OK) die("acquire");
    flx_bf16_t nk[N_KV * D], nv[N_KV * D];
    for (size_t i = 0; i < N_KV * D; i++) {
        nk[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
        nv[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
    }
    if (flx_kv_window_append(sess, 0, nk, nv) != FLX_OK) die("window append");
    float *q = malloc((size_t)H * D * sizeof(float));
    for (uint32_t h = 0; h < N_KV; h++)
        for (uint32_t g = 0; g < GROUP; g++)
            for (int d = 0; d < D; d++)
                q[((size_t)h * GROUP + g) * D + d] =
                    1.5f * dir[((size_t)h * NEEDLES + g % NEEDLES) * D + d] * sqrtf(D) + 0.5f * (float)flx_rng_normal(&rng);

    /* the workers run next to the KV they read: the store's NUMA node */
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_NUMA_NODE, .numa_node = si.numa_node};
    flx_pool_h pool;
    if (flx_pool_create(&pp, &pool) != FLX_OK) die("worker pool");
    fprintf(stderr, "fluxion-demo: %s\n", flx_pool_describe(pool));
    flx_attn_shape_t shape = {GROUP, D, info.l_cpu, pool};
    size_t ws_bytes;
    if (flx_attn_plan(&shape, &ws_bytes) != FLX_OK) die("plan");
    void *ws_mem = flx_aligned_alloc(64, ws_bytes);
    flx_attn_ws_t ws;
    if (flx_attn_ws_init(&ws, &shape, ws_mem, ws_bytes) != FLX_OK) die("workspace");

    struct {
        const char *name;
        flx_attn_cfg_t cfg;
    } modes[] = {
        {"full", {FLX_ATTN_FULL, 16, NULL, 0}},
        {"fixed (16, 0.05)", {FLX_ATTN_FIXED, 16, NULL, 0.05f}},
        {"fixed (32, 0.02)", {FLX_ATTN_FIXED, 32, NULL, 0.02f}},
        {"fixed (128, 0.02)", {FLX_ATTN_FIXED, 128, NULL, 0.02f}},
        {"budget 1 (16)", {FLX_ATTN_FIXED, 16, NULL, 1.0f}},
        {"window only", {FLX_ATTN_FIXED, 16, NULL, 0.0f}},
    };
    const int n_modes = (int)FLX_ARRAY_SIZE(modes);
    float *o_full = malloc((size_t)H * D * sizeof(float)), *o = malloc((size_t)H * D * sizeof(float));
    float lse[GROUP];
    float *scores = malloc(sizeof(float) * (info.l_cpu / 16 + 1));
    uint32_t *idx = malloc(sizeof(uint32_t) * (info.l_cpu / 16 + 1));
    printf("\n== one decode step of attention over %u KV groups x %u query heads (%s)\n", N_KV, GROUP,
           flx_pool_describe(pool));
    printf("%-18s %14s %10s %12s %12s %14s\n", "mode", "host MiB read", "ms", "score+topk", "max rel err",
           "needles found");
    for (int m = 0; m < n_modes; m++) {
        flx_attn_timing_t tsum = {0};
        uint64_t a = flx_now_ns();
        for (uint32_t h = 0; h < N_KV; h++) {
            flx_kv_head_view_t view;
            flx_attn_timing_t t = {0};
            if (flx_kv_head_view(sess, 0, h, &view) != FLX_OK) die("view");
            if (flx_attn_group_run(&ws, &view, q + (size_t)h * GROUP * D, &modes[m].cfg, o + (size_t)h * GROUP * D, lse,
                                   &t) != FLX_OK)
                die(modes[m].name);
            flx_attn_timing_add(&tsum, &t);
        }
        double ms = (flx_now_ns() - a) * 1e-6;
        if (m == 0) memcpy(o_full, o, (size_t)H * D * sizeof(float));
        double worst = 0;
        for (uint32_t h = 0; h < H; h++) {
            double e = 0, r = 0;
            for (int d = 0; d < D; d++) {
                double x = o[(size_t)h * D + d] - o_full[(size_t)h * D + d];
                e += x * x;
                r += (double)o_full[(size_t)h * D + d] * o_full[(size_t)h * D + d];
            }
            worst = fmax(worst, sqrt(e / (r > 0 ? r : 1)));
        }
        /* Needle blocks in each head's Quest top-k at this mode's granularity and budget. */
        char found[32] = "-";
        if (modes[m].cfg.mode == FLX_ATTN_FIXED && modes[m].cfg.budget > 0) {
            uint32_t blk = modes[m].cfg.blk, hit = 0, total = 0;
            int level = flx_attn_blk_level(blk);
            for (uint32_t h = 0; h < N_KV; h++) {
                flx_kv_head_view_t view;
                flx_kv_head_view(sess, 0, h, &view);
                uint32_t nb = view.meta_n[level], kk = flx_attn_budget_blocks(modes[m].cfg.budget, view.l_cpu, blk);
                for (uint32_t g = 0; g < GROUP; g++) {
                    flx_attn_score_ref(&view, level, 1, q + ((size_t)h * GROUP + g) * D, scores);
                    flx_topk(scores, nb, kk, idx);
                    uint32_t want = (needle_tok[h][g % NEEDLES] - info.n_sink) / blk;
                    for (uint32_t i = 0; i < kk; i++) hit += idx[i] == want;
                    total++;
                }
            }
            snprintf(found, sizeof found, "%u/%u", hit, total);
        }
        double st = (double)(tsum.score_ns + tsum.topk_ns), all = st + (double)tsum.attn_ns;
        printf("%-18s %14.2f %10.2f %11.0f%% %12.2e %14s\n", modes[m].name,
               (tsum.attn_bytes + tsum.score_bytes) / 1048576.0, ms, all > 0 ? 100.0 * st / all : 0.0, worst, found);
    }
    printf("\n(budget = fraction of the %u host-resident tokens a head reads beyond its %u-token window; max rel err "
           "= max over heads of ||o - o_full|| / ||o_full||)\n",
           info.l_cpu, info.n_sink + info.n_local + 1);
    flx_kv_session_release(sess);
    flx_kv_session_close(store, sid);
    flx_kv_store_info(store, &si);
    printf("session closed: %u session(s), %zu bytes reserved\n", si.n_sessions, si.used_bytes);
    flx_kv_store_destroy(store);
    flx_pool_destroy(pool);
    free(k), free(v), free(dir), free(ch), free(pk), free(pv), free(q), free(o_full), free(o), free(scores), free(idx);
    flx_aligned_free(ws_mem);
    return 0;
}
