/*
 * flx-synth-calibrate - the statistics that tie the synthetic workload to a real model: per layer
 * and overall, for a KV dump or a synthetic source.
 *
 * DESIGN
 * Everything is computed directly in double from the source's arrays, with no Fluxion kernel in
 * the loop, so the numbers can calibrate those kernels' inputs. For every query head and query row
 * (anchor q' at position prompt_len - 1, decode step t at prompt_len + t):
 *   streaming   the window-only output (first 64 + last 256 prompt tokens + generated tokens up to
 *               the row's own) meets Eq. 2: ||o_window - o_full|| / max_h' ||o_full,h'|| <= 0.1,
 *               the max taken over the layer's query heads at that row. Reported as the share of
 *               (head, row) pairs, and the share of heads that meet it on at least half the rows.
 *   sink mass   full-softmax mass on the first 64 and on the first 4 tokens (mean over heads, rows)
 *   z-scores    z_i(q') = <q', k_i> / (||q'|| sqrt(D)) over host keys [64, prompt_len - 256):
 *               mean, variance, skewness, Pearson kurtosis per head, averaged over heads
 *   value norms mean ||v|| of the first 64 prompt tokens vs the other prompt tokens
 * For a synthetic source the share of heads whose ground-truth kind matches the measured
 * classification is printed too.
 *
 * usage: flx-synth-calibrate (--dump FILE | --synth L,HQ,HKV,D,LEN,STEPS[,SEED[,SHARE]])
 *                            [--theta THETA] [--csv FILE]
 * Exit status (flx/cli.h): 0 done, 1 a runtime failure (the dump, the CSV file), 2 a usage error.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/kvsource.h"
#include "flx/progress.h"
#include "flx/synth.h"
#include "flx/util.h"

#define SINK 64u
#define LOCAL 256u
#define TAU 0.1

typedef struct stats {
    double stream_pairs, stream_heads, sink64, sink4, zm, zv, zs, zk, vn_sink, vn_other, kind_agree;
} stats_t;

/* Softmax-weighted output over the tokens in [a0, a1) and [b0, b1) (double). */
static void attend(const float *q, const float *K, const float *V, uint32_t D, uint32_t a0, uint32_t a1, uint32_t b0,
                   uint32_t b1, double *s, double *o, double *mass_out, const uint32_t *mass_ends, int n_mass)
{
    const double scale = 1.0 / sqrt((double)D);
    double mx = -INFINITY;
    for (int part = 0; part < 2; part++)
        for (uint32_t t = part ? b0 : a0; t < (part ? b1 : a1); t++) {
            double d = 0;
            for (uint32_t i = 0; i < D; i++) d += (double)q[i] * K[(size_t)t * D + i];
            s[t] = d * scale;
            if (s[t] > mx) mx = s[t];
        }
    double z = 0;
    for (uint32_t i = 0; i < D; i++) o[i] = 0;
    for (int m = 0; m < n_mass; m++) mass_out[m] = 0;
    for (int part = 0; part < 2; part++)
        for (uint32_t t = part ? b0 : a0; t < (part ? b1 : a1); t++) {
            double w = exp(s[t] - mx);
            z += w;
            for (int m = 0; m < n_mass; m++)
                if (t < mass_ends[m]) mass_out[m] += w;
            for (uint32_t i = 0; i < D; i++) o[i] += w * V[(size_t)t * D + i];
        }
    for (uint32_t i = 0; i < D; i++) o[i] /= z;
    for (int m = 0; m < n_mass; m++) mass_out[m] /= z;
}

/* Per-head sums of layer_stats, summed over heads in head order afterwards (the totals do not
 * depend on the pool). */
typedef struct head_sums {
    double s64, s4, zm, zv, zs, zk;
    int zheads;
} head_sums_t;

typedef struct stats_job {
    const flx_kvsrc_shape_t *sh;
    const float *K, *V, *Q;
    double *err, *onorm;        /* (Hq, R) */
    head_sums_t *sums;          /* (Hq) */
} stats_job_t;

static flx_status_t head_stats(void *ctx, const flx_pool_worker_t *w, uint64_t h0, uint64_t h1)
{
    (void)w;
    const stats_job_t *j = ctx;
    const flx_kvsrc_shape_t *sh = j->sh;
    const uint32_t D = sh->head_dim, Hq = sh->n_q_heads, gs = Hq / sh->n_kv_heads, R = sh->n_steps + 1;
    const uint32_t P = sh->prompt_len, T = P + sh->n_steps;
    const uint32_t sink_end = FLX_MIN(SINK, P), loc_begin = P > LOCAL ? FLX_MAX(P - LOCAL, sink_end) : sink_end;
    double *s = malloc((size_t)T * sizeof *s);
    if (!s) return flx_error_set(FLX_ERR_NOMEM, "scores of %u tokens", T);
    for (uint64_t h = h0; h < h1; h++) {
        const float *Kh = j->K + (size_t)(h / gs) * T * D, *Vh = j->V + (size_t)(h / gs) * T * D;
        double of[1024], ow[1024], mass[2], dummy[1];
        const uint32_t ends[2] = {sink_end, FLX_MIN(4u, P)};
        head_sums_t *hs = &j->sums[h];
        memset(hs, 0, sizeof *hs);
        for (uint32_t r = 0; r < R; r++) {
            const float *q = j->Q + ((size_t)h * R + r) * D;
            uint32_t last = P - 1 + r;   /* attends [0, last] */
            attend(q, Kh, Vh, D, 0, last + 1, 0, 0, s, of, mass, ends, 2);
            hs->s64 += mass[0], hs->s4 += mass[1];
            attend(q, Kh, Vh, D, 0, sink_end, loc_begin, last + 1, s, ow, dummy, ends, 0);
            double e = 0, n = 0;
            for (uint32_t i = 0; i < D; i++) e += (ow[i] - of[i]) * (ow[i] - of[i]), n += of[i] * of[i];
            j->err[(size_t)h * R + r] = sqrt(e);
            j->onorm[(size_t)h * R + r] = sqrt(n);
            if (r == 0 && loc_begin > sink_end + 2) {
                double qn = 0;
                for (uint32_t i = 0; i < D; i++) qn += (double)q[i] * q[i];
                qn = sqrt(qn) * sqrt((double)D);
                double m1 = 0, m2 = 0, m3 = 0, m4 = 0, nz = loc_begin - sink_end;
                for (uint32_t t = sink_end; t < loc_begin; t++) {
                    double d = 0;
                    for (uint32_t i = 0; i < D; i++) d += (double)q[i] * Kh[(size_t)t * D + i];
                    s[t] = d / qn;
                    m1 += s[t];
                }
                m1 /= nz;
                for (uint32_t t = sink_end; t < loc_begin; t++) {
                    double c = s[t] - m1, c2 = c * c;
                    m2 += c2, m3 += c2 * c, m4 += c2 * c2;
                }
                m2 /= nz, m3 /= nz, m4 /= nz;
                hs->zm += m1, hs->zv += m2, hs->zs += m2 > 0 ? m3 / pow(m2, 1.5) : 0;
                hs->zk += m2 > 0 ? m4 / (m2 * m2) : 0;
                hs->zheads++;
            }
        }
    }
    free(s);
    return FLX_OK;
}

static flx_status_t layer_stats(const flx_kvsrc_shape_t *sh, const flx_synth_t *syn, uint32_t layer, const float *K,
                                const float *V, const float *Q, flx_pool_h pool, stats_t *out)
{
    const uint32_t D = sh->head_dim, Hq = sh->n_q_heads, R = sh->n_steps + 1;
    const uint32_t P = sh->prompt_len, T = P + sh->n_steps;
    const uint32_t sink_end = FLX_MIN(SINK, P);
    double *err = calloc((size_t)Hq * R, sizeof *err), *onorm = calloc((size_t)Hq * R, sizeof *onorm);
    head_sums_t *sums = calloc(Hq, sizeof *sums);
    if (!err || !onorm || !sums) {
        free(err), free(onorm), free(sums);
        return flx_error_set(FLX_ERR_NOMEM, "layer %u statistics of %u heads", layer, Hq);
    }
    stats_job_t j = {sh, K, V, Q, err, onorm, sums};
    flx_status_t st = flx_pool_for(pool, Hq, 1, head_stats, &j);
    if (st) {
        free(err), free(onorm), free(sums);
        return st;
    }
    double s64 = 0, s4 = 0, zm = 0, zv = 0, zs = 0, zk = 0;
    int zheads = 0;
    for (uint32_t h = 0; h < Hq; h++) {
        s64 += sums[h].s64, s4 += sums[h].s4, zm += sums[h].zm, zv += sums[h].zv, zs += sums[h].zs, zk += sums[h].zk;
        zheads += sums[h].zheads;
    }
    free(sums);
    uint32_t pairs = 0, heads = 0, agree = 0;
    for (uint32_t h = 0; h < Hq; h++) {
        uint32_t ok = 0;
        for (uint32_t r = 0; r < R; r++) {
            double mx = 0;
            for (uint32_t h2 = 0; h2 < Hq; h2++) mx = FLX_MAX(mx, onorm[(size_t)h2 * R + r]);
            ok += err[(size_t)h * R + r] <= TAU * mx;
        }
        pairs += ok;
        int streaming = 2 * ok >= R;
        heads += streaming;
        if (syn) agree += streaming == (flx_synth_head_kind(syn, layer, h) == FLX_SYNTH_STREAMING);
    }
    double vs = 0, vo = 0;
    for (uint32_t g = 0; g < sh->n_kv_heads; g++)
        for (uint32_t t = 0; t < P; t++) {
            double n = 0;
            for (uint32_t i = 0; i < D; i++) n += (double)V[((size_t)g * T + t) * D + i] * V[((size_t)g * T + t) * D + i];
            if (t < sink_end) vs += sqrt(n);
            else vo += sqrt(n);
        }
    out->stream_pairs = (double)pairs / ((double)Hq * R);
    out->stream_heads = (double)heads / Hq;
    out->kind_agree = syn ? (double)agree / Hq : NAN;
    out->sink64 = s64 / ((double)Hq * R), out->sink4 = s4 / ((double)Hq * R);
    double zh = zheads ? zheads : NAN;
    out->zm = zm / zh, out->zv = zv / zh, out->zs = zs / zh, out->zk = zk / zh;
    out->vn_sink = vs / ((double)sh->n_kv_heads * sink_end);
    out->vn_other = P > sink_end ? vo / ((double)sh->n_kv_heads * (P - sink_end)) : NAN;
    free(err), free(onorm);
    return FLX_OK;
}

int main(int argc, char **argv)
{
    const char *dump = NULL, *synth = NULL, *csv = NULL;
    double theta = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH(0, "dump", "FILE", &dump, 0, "a KV dump (flx-kv-dump)"),
        FLX_CLI_STR(0, "synth", "L,HQ,HKV,D,LEN,STEPS[,SEED[,SHARE]]", &synth, 0, "a synthetic source"),
        FLX_CLI_FLOAT(0, "theta", "THETA", &theta, 1.0, 1e12, FLX_CLI_LO_OPEN,
                      "synth: RoPE base of the synthetic keys"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv, 0, "also write the table as CSV"),
    };
    flx_cli_t cli = FLX_CLI_INIT("flx-synth-calibrate", "The statistics that tie the synthetic workload to a real "
                                 "model (docs/synthetic.md), per layer and overall.", opts);
    cli.synopsis = "(--dump FILE | --synth L,HQ,HKV,D,LEN,STEPS[,SEED[,SHARE]]) [--theta THETA] [--csv FILE]";
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_exclusive(&cli, "dump", "synth", 1) ||
        flx_cli_applies(&cli, synth != NULL, "with --dump (only with --synth)", "theta", NULL))
        return flx_cli_usage_error(&cli, NULL);
    flx_kvsrc_h src = NULL;
    if (dump) {
        if (flx_kvsrc_open_dump(dump, &src) != FLX_OK) return flx_cli_fail(&cli, "%s", flx_error_msg());
    } else {
        uint64_t f[8] = {0, 0, 0, 0, 0, 0, 1, 0};
        uint32_t n = 0;
        char head[256];
        double share = -1;
        /* the integers L..SEED, then an optional retrieval share (a number in [0, 1]) */
        const char *last = strrchr(synth, ',');
        int has_share = 0;
        for (const char *p = synth; *p; p++) has_share += *p == ',';
        has_share = has_share == 7;
        snprintf(head, sizeof head, "%.*s", has_share ? (int)(last - synth) : (int)strlen(synth), synth);
        if (flx_cli_u64_list("synth", head, 0, UINT64_MAX, f, 7, &n)) return flx_cli_usage_error(&cli, NULL);
        if (n < 6)
            return flx_cli_usage_error(&cli, "--synth '%.200s' needs L,HQ,HKV,D,LEN,STEPS (%u fields)", synth, n);
        if (has_share && (flx_parse_f64(last + 1, &share) || !(share >= 0 && share <= 1)))
            return flx_cli_usage_error(&cli, "--synth '%.200s': the retrieval share '%s' is not a number in [0, 1]",
                                       synth, last + 1);
        for (int i = 0; i < 6; i++)
            if (f[i] > UINT32_MAX)
                return flx_cli_usage_error(&cli, "--synth '%.200s': field %d is above %u", synth, i + 1, UINT32_MAX);
        flx_synth_params_t p;
        flx_synth_defaults(&p, (uint32_t)f[0], (uint32_t)f[1], (uint32_t)f[2], (uint32_t)f[3], (uint32_t)f[4],
                           (uint32_t)f[5], f[6]);
        if (has_share) p.retrieval_share = (float)share;
        if (flx_cli_given(&cli, "theta")) p.rope_theta = (float)theta;
        flx_synth_t *syn;
        if (flx_synth_create(&p, &syn) != FLX_OK) return flx_cli_usage_error(&cli, "--synth: %s", flx_error_msg());
        if (flx_kvsrc_from_synth(syn, &src) != FLX_OK) {
            flx_synth_destroy(syn);
            return flx_cli_fail(&cli, "%s", flx_error_msg());
        }
    }
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    const size_t T = (size_t)sh.prompt_len + sh.n_steps, nkv = (size_t)sh.n_kv_heads * T * sh.head_dim;
    const size_t nq = (size_t)sh.n_q_heads * (sh.n_steps + 1) * sh.head_dim;
    flx_bf16_t *kb = malloc(nkv * sizeof *kb), *vb = malloc(nkv * sizeof *vb);
    float *K = malloc(nkv * sizeof *K), *V = malloc(nkv * sizeof *V), *Q = malloc(nq * sizeof *Q);
    FILE *cf = NULL;
    rc = FLX_EXIT_FAILURE;
    flx_pool_params_t pp = {0};   /* FLX_THREADS, else the CPU budget */
    flx_pool_h pool = NULL;
    if (flx_pool_create(&pp, &pool) != FLX_OK) {
        fprintf(stderr, "flx-synth-calibrate: worker pool: %s\n", flx_error_msg());
        goto out;
    }
    fprintf(stderr, "flx-synth-calibrate: %s\n", flx_pool_describe(pool));
    if (!kb || !vb || !K || !V || !Q) {
        fprintf(stderr, "flx-synth-calibrate: out of memory for a layer of %zu tokens\n", T);
        goto out;
    }
    if (csv && !(cf = fopen(csv, "w"))) {
        fprintf(stderr, "flx-synth-calibrate: %s: %s\n", csv, strerror(errno));
        goto out;
    }
    if (cf) fprintf(cf, "layer,stream_pairs,stream_heads,kind_agree,sink64,sink4,z_mean,z_var,z_skew,z_kurt,vnorm_sink,vnorm_other\n");
    printf("source %s\n", flx_kvsrc_describe(src));
    printf("%5s %8s %8s %6s %7s %7s %8s %8s %7s %7s %8s %8s\n", "layer", "strm_pr", "strm_hd", "agree", "sink64", "sink4",
           "z_mean", "z_var", "z_skew", "z_kurt", "vn_sink", "vn_other");
    stats_t all = {0};
    for (uint32_t l = 0; l < sh.n_layers; l++) {
        if (flx_kvsrc_layer(src, l, kb, vb, Q, pool) != FLX_OK) {
            fprintf(stderr, "flx-synth-calibrate: layer %u: %s\n", l, flx_error_msg());
            goto out;
        }
        flx_bf16_to_f32_row(kb, K, nkv);
        flx_bf16_to_f32_row(vb, V, nkv);
        stats_t s;
        if (layer_stats(&sh, flx_kvsrc_synth(src), l, K, V, Q, pool, &s) != FLX_OK) {
            fprintf(stderr, "flx-synth-calibrate: %s\n", flx_error_msg());
            goto out;
        }
        printf("%5u %8.3f %8.3f %6.2f %7.3f %7.3f %8.4f %8.4f %7.3f %7.3f %8.3f %8.3f\n", l, s.stream_pairs,
               s.stream_heads, s.kind_agree, s.sink64, s.sink4, s.zm, s.zv, s.zs, s.zk, s.vn_sink, s.vn_other);
        if (cf)
            fprintf(cf, "%u,%.5f,%.5f,%.4f,%.5f,%.5f,%.6f,%.6f,%.5f,%.5f,%.5f,%.5f\n", l, s.stream_pairs, s.stream_heads,
                    s.kind_agree, s.sink64, s.sink4, s.zm, s.zv, s.zs, s.zk, s.vn_sink, s.vn_other);
        double *a = &all.stream_pairs, *b = &s.stream_pairs;
        for (size_t i = 0; i < sizeof all / sizeof(double); i++) a[i] += b[i] / sh.n_layers;
        flx_progress_report("statistics", l + 1, sh.n_layers, "layers");
    }
    printf("%5s %8.3f %8.3f %6.2f %7.3f %7.3f %8.4f %8.4f %7.3f %7.3f %8.3f %8.3f\n", "all", all.stream_pairs,
           all.stream_heads, all.kind_agree, all.sink64, all.sink4, all.zm, all.zv, all.zs, all.zk, all.vn_sink,
           all.vn_other);
    if (cf)
        fprintf(cf, "all,%.5f,%.5f,%.4f,%.5f,%.5f,%.6f,%.6f,%.5f,%.5f,%.5f,%.5f\n", all.stream_pairs, all.stream_heads,
                all.kind_agree, all.sink64, all.sink4, all.zm, all.zv, all.zs, all.zk, all.vn_sink, all.vn_other);
    rc = 0;
out:
    if (cf && fclose(cf) != 0) {
        fprintf(stderr, "flx-synth-calibrate: %s: write failed\n", csv);
        rc = 1;
    }
    free(kb), free(vb), free(K), free(V), free(Q);
    flx_kvsrc_close(src);
    flx_pool_destroy(pool);
    return rc;
}
