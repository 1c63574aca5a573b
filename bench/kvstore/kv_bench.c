/*
 * kv_bench.c - host KV store benchmark.
 *
 * For a 32K-token prompt (one layer, 8 kv heads; head_dim 128 and 64), in one run on one thread:
 *   memcpy     copy of the K bytes the pyramid reads (same size), the bandwidth reference
 *   pyramid    flx_kv_pyramid_build over every head (reads each K row once)
 *   ingest     flx_kv_chunk_write of the whole prompt (validation + placement copy), against a
 *              memcpy of the same K+V bytes
 * Times are the best of several repetitions. Prints a table, writes CSV, ends with
 *   SUMMARY pyramid_vs_memcpy=<pyramid GB/s / memcpy GB/s at D=128> meta_overhead=<meta / (K+V)>
 * usage: kv_bench [CSV_PATH]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/cpu.h"
#include "flx/kvstore.h"
#include "flx/util.h"

#define REPS 7

static double best_of(double *t, int n)
{
    double b = t[0];
    for (int i = 1; i < n; i++) b = t[i] < b ? t[i] : b;
    return b;
}

int main(int argc, char **argv)
{
    const char *csv = NULL;
    flx_cli_pos_t pos[] = {FLX_CLI_ARG_OPT("CSV_PATH", &csv, "CSV written (default: none)")};
    flx_cli_t cli = {.prog = "kv_bench", .summary = "Host KV store: pyramid build and chunk ingest against memcpy of "
                     "the same bytes, metadata overhead (32K tokens).", .pos = pos, .n_pos = 1};
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (csv && !out) return flx_cli_fail(&cli, "cannot create %s", csv);
    if (out) fprintf(out, "head_dim,tokens,kv_heads,memcpy_gbs,pyramid_gbs,pyramid_vs_memcpy,ingest_gbs,ingest_vs_memcpy,meta_overhead\n");
    printf("kvstore benchmark (1 thread, isa %s)\n", flx_isa_name(flx_isa_active()));
    printf("%8s %8s %12s %12s %10s %12s %10s %10s\n", "head_dim", "l_cpu", "memcpy GB/s", "pyramid GB/s", "ratio",
           "ingest GB/s", "ratio", "meta/KV");
    double summary_ratio = 0, summary_meta = 0;
    const uint32_t Ds[] = {128, 64};
    for (int di = 0; di < 2; di++) {
        const uint32_t D = Ds[di], H = 8, L = 32768 + 64 + 256;
        flx_kv_store_params_t p = {0};
        p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE;
        p.capacity_bytes = (size_t)1 << 30;
        p.n_layers = 1, p.n_kv_heads = H, p.n_q_heads = H * 4, p.head_dim = D;
        flx_kv_store_h s;
        if (flx_kv_store_create(&p, &s) != FLX_OK) {
            fprintf(stderr, "kv_bench: %s\n", flx_error_msg());
            return 1;
        }
        size_t n = (size_t)H * L * D;
        flx_bf16_t *k = malloc(n * 2), *v = malloc(n * 2);
        flx_rng_t rng;
        flx_rng_seed(&rng, 7);
        for (size_t i = 0; i < n; i++) {
            k[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
            v[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
        }
        /* Ingest: the whole prompt in 1024-token chunks, against a memcpy of the same bytes. */
        uint8_t *dst = malloc(2 * n * 2), *src = malloc(2 * n * 2);
        memset(dst, 1, 2 * n * 2);
        memcpy(src, k, n * 2);
        memcpy(src + n * 2, v, n * 2);
        double t_ing[REPS], t_cpy2[REPS];
        flx_kv_session_id_t sid = 0;
        flx_bf16_t *ck = malloc((size_t)H * 1024 * D * 2), *cv = malloc((size_t)H * 1024 * D * 2);
        for (int r = 0; r < REPS; r++) {
            if (sid) flx_kv_session_close(s, sid);
            flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 16, .flags = FLX_KV_SESSION_NO_STATS};
            if (flx_kv_session_open(s, &sp, &sid) != FLX_OK) {
                fprintf(stderr, "kv_bench: %s\n", flx_error_msg());
                return 1;
            }
            double t_chunks = 0;
            for (uint32_t t0 = 0; t0 < L; t0 += 1024) {
                uint32_t t1 = t0 + 1024 < L ? t0 + 1024 : L;
                for (uint32_t h = 0; h < H; h++) { /* payload (H, tokens, D): built outside the timing */
                    memcpy(ck + (size_t)h * (t1 - t0) * D, k + ((size_t)h * L + t0) * D, (size_t)(t1 - t0) * D * 2);
                    memcpy(cv + (size_t)h * (t1 - t0) * D, v + ((size_t)h * L + t0) * D, (size_t)(t1 - t0) * D * 2);
                }
                flx_kv_chunk_t c = {0, 0, H, t0, t1, FLX_DT_BF16, D, FLX_KV_ORDER_SPLIT};
                uint64_t a = flx_now_ns();
                if (flx_kv_chunk_write(s, sid, &c, ck, cv) != FLX_OK) {
                    fprintf(stderr, "kv_bench: %s\n", flx_error_msg());
                    return 1;
                }
                t_chunks += (double)(flx_now_ns() - a);
            }
            t_ing[r] = t_chunks * 1e-9;
            uint64_t a = flx_now_ns();
            memcpy(dst, src, 2 * n * 2);
            t_cpy2[r] = (double)(flx_now_ns() - a) * 1e-9;
        }
        /* Pyramid of every head (the ingest above built it too, inside the last chunk write). */
        flx_kv_session_h sess;
        flx_kv_session_acquire(s, sid, &sess);
        flx_kv_head_view_t views[8];
        flx_bf16_t *meta[8][FLX_KV_META_LEVELS];
        size_t meta_bytes = 0;
        for (uint32_t h = 0; h < H; h++) {
            flx_kv_head_view(sess, 0, h, &views[h]);
            for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
                size_t b = (size_t)views[h].meta_n[j] * 2 * D * 2;
                meta[h][j] = malloc(b);
                memset(meta[h][j], 0, b);
                meta_bytes += b;
            }
        }
        const uint32_t l_cpu = views[0].l_cpu;
        const size_t k_bytes = (size_t)H * l_cpu * D * 2;
        uint8_t *a_src = malloc(k_bytes), *a_dst = malloc(k_bytes);
        memset(a_src, 3, k_bytes);
        memset(a_dst, 4, k_bytes);
        double t_pyr[REPS], t_cpy[REPS];
        for (int r = 0; r < REPS; r++) {
            uint64_t a = flx_now_ns();
            memcpy(a_dst, a_src, k_bytes);
            t_cpy[r] = (double)(flx_now_ns() - a) * 1e-9;
            a = flx_now_ns();
            for (uint32_t h = 0; h < H; h++) flx_kv_pyramid_build(&views[h], meta[h]);
            t_pyr[r] = (double)(flx_now_ns() - a) * 1e-9;
        }
        double memcpy_gbs = k_bytes / best_of(t_cpy, REPS) * 1e-9;
        double pyr_gbs = k_bytes / best_of(t_pyr, REPS) * 1e-9;
        double ing_gbs = 2.0 * n * 2 / best_of(t_ing, REPS) * 1e-9;
        double cpy2_gbs = 2.0 * n * 2 / best_of(t_cpy2, REPS) * 1e-9;
        double meta_ratio = (double)meta_bytes / (2.0 * k_bytes);
        printf("%8u %8u %12.2f %12.2f %10.3f %12.2f %10.3f %10.4f\n", D, l_cpu, memcpy_gbs, pyr_gbs, pyr_gbs / memcpy_gbs,
               ing_gbs, ing_gbs / cpy2_gbs, meta_ratio);
        if (out)
            fprintf(out, "%u,%u,%u,%.3f,%.3f,%.4f,%.3f,%.4f,%.5f\n", D, l_cpu, H, memcpy_gbs, pyr_gbs,
                    pyr_gbs / memcpy_gbs, ing_gbs, ing_gbs / cpy2_gbs, meta_ratio);
        if (D == 128) {
            summary_ratio = pyr_gbs / memcpy_gbs;
            summary_meta = meta_ratio;
        }
        for (uint32_t h = 0; h < H; h++)
            for (int j = 0; j < FLX_KV_META_LEVELS; j++) free(meta[h][j]);
        flx_kv_session_release(sess);
        flx_kv_session_close(s, sid);
        flx_kv_store_destroy(s);
        free(k), free(v), free(dst), free(src), free(ck), free(cv), free(a_src), free(a_dst);
    }
    if (out) fclose(out);
    printf("SUMMARY pyramid_vs_memcpy=%.3f meta_overhead=%.4f\n", summary_ratio, summary_meta);
    return 0;
}
