/*
 * predictor.c - the head-property MLP (flx/predictor.h): parameters, weights file, batched
 * inference with AVX-512 / AVX2+FMA / scalar kernels, the double-accumulating reference, and the
 * evaluation of a predictor on dataset rows.
 *
 * DESIGN
 * Inference runs once per layer over all heads of the batch (32-128 rows), so it is a small GEMM
 * chain (41 -> 256 -> 256 -> 128 -> 3, about 110 k MACs a row) and bound by arithmetic: the weights
 * (430 KB) stay in L2 across calls. At create every layer is repacked into column panels of NP
 * outputs, k-major: panel[p][k][0..NP) = W[p*NP + j][k] (zero-padded past n_out), so the
 * micro-kernel loads NP weights per k with aligned vector loads and broadcasts one activation per
 * row: MR rows x NP outputs of accumulators stay in registers (AVX-512: 12 x 32 = 24 zmm, then 8/4/
 * 2/1-row tails; AVX2: 6 x 16 = 12 ymm over each half of a panel, then 2/1-row tails across it).
 * The 3-output head uses a 16-wide panel. Bias and ReLU are fused into the store. A panel (K x 32
 * floats, <= 32 KB) stays in L1 while all row tiles pass.
 * Measured on the 2.8 GHz Ice Lake Xeon (test_predictor prints it): 128 rows in about 175 us on
 * one core (about 160 GFLOP/s, near the 2 x 16-lane FMA peak of 179), 32 rows in about 49 us;
 * 28 MFLOP for 128 rows cannot go below about 160 us on one core, so 0.1 ms needs 2 workers.
 * On this project's 2-CPU AMD EPYC (Zen 4, one 512-bit FMA a cycle) the fp32 path runs at about
 * 109 GFLOP/s a core, at its peak. On a 2.45 GHz AMD EPYC (Zen 3, AVX2 only: 2 x 8-lane FMA, a
 * peak of 78 GFLOP/s) the AVX2 path runs 6 rows in 17.5 us (75 GFLOP/s) and 128 rows in 400 us
 * (70 GFLOP/s); its 2-row tail at about 40. Where the CPU has AVX-512 BF16 the two hidden layers
 * (256 -> 256 -> 128, 90 % of the work) take bf16 weights (k-pair panels made at create) and bf16
 * copies of their inputs into _mm512_dpbf16_ps with fp32 sums: twice the multiply-adds per
 * instruction. At FLX_ISA_AMX (Intel Xeon since Sapphire Rapids) the same two layers run on the
 * tile unit: 16 rows a tile, each tile product 16 rows x 32 k x 16 outputs from the same k-pair
 * panels (layer_amx); on the AMX Xeon VM test_predictor's 32 rows took 12.1 us on one core against
 * 42.3 with fp32 FMA and 62.5 with _mm512_dpbf16_ps (which retires at a quarter of FMA's rate
 * there), 128 rows 48.4 us; the fp32 input layer is now most of the rest.
 * Their oracle is flx_mlp_forward_ref_bf16; on the shipped SmolLM2 predictor over real decode
 * features the selector's choices moved in 5 of 5,760 groups (2 streaming, 3 blk), budgets by
 * 0.17 % on average.
 * Rows are independent (and a row's sums run in the same k order whatever tile it is in), so a
 * pool's workers claim chunks of whole register tiles (flx_predictor_tile_rows) and each carries
 * its chunk through all four layers in its own part of the scratch: no barrier between layers, and
 * results independent of the pool; flx_predictor_run_rows is one such chunk for a caller that hands
 * out the rows itself.
 * Standardization is applied to the features explicitly (not folded into W1): L_cpu-like features
 * have means far from 0 and folding would cancel catastrophically in fp32.
 * flx_mlp_forward_ref is the oracle: same math in double, straight from the (out, in) weights.
 */
#include "flx/predictor.h"

#include <immintrin.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "flx/bf16.h"
#include "flx/cpu.h"
#include "flx/safetensors.h"
#include "flx/util.h"

#define T2 __attribute__((target("avx2,fma")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define AI static inline __attribute__((always_inline))

#define N_LAYERS 4
#define IN_PAD 48 /* standardized input row stride (41 rounded up to 16 floats) */

static const uint32_t L_IN[N_LAYERS] = {FLX_PRED_IN, FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3};
static const uint32_t L_OUT[N_LAYERS] = {FLX_PRED_H1, FLX_PRED_H2, FLX_PRED_H3, FLX_PRED_OUT};
static const uint32_t L_NP[N_LAYERS] = {32, 32, 32, 16};

/* ---------------- parameters ---------------- */

static size_t weight_floats(void)
{
    size_t n = 0;
    for (int l = 0; l < N_LAYERS; l++) n += (size_t)L_OUT[l] * L_IN[l] + L_OUT[l];
    return n;
}

/* Trainable parameters (the header's 109,827); the 86 standardization constants are not counted. */
size_t flx_mlp_param_count(void)
{
    return weight_floats();
}

flx_status_t flx_mlp_alloc(flx_mlp_t *m)
{
    if (!m) return flx_error_set(FLX_ERR_INVALID, "mlp alloc: NULL argument");
    /* One block in the order w1 b1 w2 b2 w3 b3 w4 b4: training treats it as one flat vector. */
    float *blk = calloc(weight_floats(), sizeof(float));
    if (!blk) return flx_error_set(FLX_ERR_NOMEM, "mlp alloc: %zu floats", weight_floats());
    memset(m, 0, sizeof *m);
    float **slots[2 * N_LAYERS] = {&m->w1, &m->b1, &m->w2, &m->b2, &m->w3, &m->b3, &m->w4, &m->b4};
    float *p = blk;
    for (int l = 0; l < N_LAYERS; l++) {
        *slots[2 * l] = p;
        p += (size_t)L_OUT[l] * L_IN[l];
        *slots[2 * l + 1] = p;
        p += L_OUT[l];
    }
    for (int i = 0; i < FLX_PRED_IN; i++) m->feature_std[i] = 1.0f;
    m->target_std[0] = m->target_std[1] = 1.0f;
    m->outputs = FLX_PRED_OUT_LINE;
    m->select = flx_select_params_paper();
    return FLX_OK;
}

void flx_mlp_free(flx_mlp_t *m)
{
    if (!m) return;
    free(m->w1);
    memset(m, 0, sizeof *m);
}

static void mlp_layer(const flx_mlp_t *m, int l, const float **w, const float **b)
{
    const float *ws[N_LAYERS] = {m->w1, m->w2, m->w3, m->w4}, *bs[N_LAYERS] = {m->b1, m->b2, m->b3, m->b4};
    *w = ws[l];
    *b = bs[l];
}

/* ---------------- weights file ---------------- */

typedef struct st_entry {
    const char *name;
    int n_dims;
    int64_t shape[2];
} st_entry_t;

#define N_TENSORS 12
static const st_entry_t TENSORS[N_TENSORS] = {
    {"feature_mean", 1, {FLX_PRED_IN, 0}},          {"feature_std", 1, {FLX_PRED_IN, 0}},
    {"target_mean", 1, {2, 0}},                     {"target_std", 1, {2, 0}},
    {"backbone.0.weight", 2, {FLX_PRED_H1, FLX_PRED_IN}}, {"backbone.0.bias", 1, {FLX_PRED_H1, 0}},
    {"backbone.1.weight", 2, {FLX_PRED_H2, FLX_PRED_H1}}, {"backbone.1.bias", 1, {FLX_PRED_H2, 0}},
    {"backbone.2.weight", 2, {FLX_PRED_H3, FLX_PRED_H2}}, {"backbone.2.bias", 1, {FLX_PRED_H3, 0}},
    {"head.weight", 2, {FLX_PRED_OUT, FLX_PRED_H3}},      {"head.bias", 1, {FLX_PRED_OUT, 0}},
};

/* The arrays of m in TENSORS order. */
static void mlp_arrays(const flx_mlp_t *m, float *arr[N_TENSORS])
{
    flx_mlp_t *mm = (flx_mlp_t *)m;
    float *a[N_TENSORS] = {mm->feature_mean, mm->feature_std, mm->target_mean, mm->target_std,
                           mm->w1, mm->b1, mm->w2, mm->b2, mm->w3, mm->b3, mm->w4, mm->b4};
    memcpy(arr, a, sizeof a);
}

flx_status_t flx_mlp_save(const flx_mlp_t *m, const char *path, const char *source, const char *criterion,
                          float tau)
{
    if (!m || !m->w1 || !path) return flx_error_set(FLX_ERR_INVALID, "mlp save: NULL argument");
    flx_status_t bad = flx_select_params_check(&m->select);
    if (bad) return bad;
    if (!flx_pred_outputs_name(m->outputs))
        return flx_error_set(FLX_ERR_INVALID, "mlp save: output map %d unknown", (int)m->outputs);
    flx_st_writer_h w = NULL;
    flx_status_t st = flx_st_writer_create(&w);
    if (st) return st;
    float *arr[N_TENSORS];
    mlp_arrays(m, arr);
    for (int i = 0; i < N_TENSORS && !st; i++)
        st = flx_st_writer_add(w, TENSORS[i].name, FLX_DT_F32, TENSORS[i].n_dims, TENSORS[i].shape, arr[i]);
    char tau_s[32];
    snprintf(tau_s, sizeof tau_s, "%.9g", (double)tau);
    if (!st) st = flx_st_writer_set_metadata(w, "format", "fluxion-predictor");
    if (!st) st = flx_st_writer_set_metadata(w, "version", "1");
    if (!st) st = flx_st_writer_set_metadata(w, "features", "appendix-a-41");
    if (!st && isfinite(tau)) st = flx_st_writer_set_metadata(w, "tau", tau_s);
    if (!st && criterion) st = flx_st_writer_set_metadata(w, "criterion", criterion);
    if (!st && source) st = flx_st_writer_set_metadata(w, "source", source);
    if (!st) st = flx_st_writer_set_metadata(w, "trained_by", "fluxion flx_train");
    if (!st) st = flx_st_writer_set_metadata(w, "outputs", flx_pred_outputs_name(m->outputs));
    char thr_s[32], scale_s[32], minb_s[16];
    snprintf(thr_s, sizeof thr_s, "%.9g", (double)m->select.stream_threshold);
    snprintf(scale_s, sizeof scale_s, "%.9g", (double)m->select.budget_scale);
    snprintf(minb_s, sizeof minb_s, "%u", m->select.min_blocks);
    if (!st) st = flx_st_writer_set_metadata(w, "stream_threshold", thr_s);
    if (!st) st = flx_st_writer_set_metadata(w, "budget_scale", scale_s);
    if (!st) st = flx_st_writer_set_metadata(w, "min_blocks", minb_s);
    if (!st) st = flx_st_writer_save(w, path);
    flx_st_writer_destroy(w);
    return st;
}

static flx_status_t expect_meta(flx_st_reader_h r, const char *path, const char *key, const char *want)
{
    const char *v = flx_st_metadata(r, key);
    if (!v) return flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"%s\" missing (want \"%s\")", path, key, want);
    if (strcmp(v, want) != 0)
        return flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"%s\" is \"%s\", want \"%s\"", path, key, v, want);
    return FLX_OK;
}

/* Optional numeric metadata: absent leaves *v; present must parse whole and be finite. */
static flx_status_t meta_number(flx_st_reader_h r, const char *path, const char *key, double *v)
{
    const char *s = flx_st_metadata(r, key);
    if (!s) return FLX_OK;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(x))
        return flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"%s\" is \"%s\", not a number", path, key, s);
    *v = x;
    return FLX_OK;
}

flx_status_t flx_mlp_load(const char *path, flx_mlp_t *m)
{
    if (!path || !m) return flx_error_set(FLX_ERR_INVALID, "mlp load: NULL argument");
    flx_st_reader_h r = NULL;
    flx_status_t st = flx_st_open(path, &r);
    if (st) return st;
    flx_mlp_t t;
    int have = 0;
    if ((st = expect_meta(r, path, "format", "fluxion-predictor")) || (st = expect_meta(r, path, "version", "1")) ||
        (st = expect_meta(r, path, "features", "appendix-a-41")))
        goto out;
    for (size_t i = 0; i < flx_st_count(r); i++) {
        const char *name = flx_st_at(r, i)->name;
        int known = 0;
        for (int j = 0; j < N_TENSORS; j++) known |= strcmp(name, TENSORS[j].name) == 0;
        if (!known) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: unexpected tensor \"%s\"", path, name);
            goto out;
        }
    }
    if ((st = flx_mlp_alloc(&t))) goto out;
    have = 1;
    float *arr[N_TENSORS];
    mlp_arrays(&t, arr);
    for (int j = 0; j < N_TENSORS; j++) {
        const flx_st_tensor_t *ten;
        if (!flx_st_find(r, TENSORS[j].name)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: tensor \"%s\" missing", path, TENSORS[j].name);
            goto out;
        }
        if ((st = flx_st_expect(r, TENSORS[j].name, FLX_DT_F32, TENSORS[j].n_dims, TENSORS[j].shape, &ten))) {
            char msg[FLX_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", flx_error_msg());
            st = flx_error_set(FLX_ERR_FORMAT, "%s: %s", path, msg);
            goto out;
        }
        size_t n = ten->nbytes / sizeof(float);
        memcpy(arr[j], ten->data, ten->nbytes);
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(arr[j][i])) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: tensor \"%s\" element %zu is not finite (%g)", path,
                                   TENSORS[j].name, i, (double)arr[j][i]);
                goto out;
            }
            /* a std whose inverse is not a float (subnormal) would normalise features to inf */
            if ((j == 1 || j == 3) && !(arr[j][i] > 0.0f && isfinite(1.0f / arr[j][i]))) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: tensor \"%s\" element %zu is %g, must be > 0 with a finite "
                                   "inverse", path, TENSORS[j].name, i, (double)arr[j][i]);
                goto out;
            }
        }
    }
    double thr = t.select.stream_threshold, scale = t.select.budget_scale, minb = t.select.min_blocks;
    if ((st = meta_number(r, path, "stream_threshold", &thr)) || (st = meta_number(r, path, "budget_scale", &scale)) ||
        (st = meta_number(r, path, "min_blocks", &minb)))
        goto out;
    if (minb != floor(minb) || minb < 0 || minb > 64) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"min_blocks\" %g is not an integer in [0, 64]", path, minb);
        goto out;
    }
    const char *outputs = flx_st_metadata(r, "outputs");   /* absent: the line map (flx_mlp_alloc's) */
    if (outputs && !strcmp(outputs, flx_pred_outputs_name(FLX_PRED_OUT_LOG_ENDS))) t.outputs = FLX_PRED_OUT_LOG_ENDS;
    else if (outputs && strcmp(outputs, flx_pred_outputs_name(FLX_PRED_OUT_LINE)) != 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"outputs\" is \"%s\", want \"line\" or \"log-ends\"", path,
                           outputs);
        goto out;
    }
    t.select.stream_threshold = (float)thr, t.select.budget_scale = (float)scale, t.select.min_blocks = (uint32_t)minb;
    if ((st = flx_select_params_check(&t.select))) {
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
        st = flx_error_set(FLX_ERR_FORMAT, "%s: %s", path, msg);
        goto out;
    }
    *m = t;
    have = 0;
out:
    if (have) flx_mlp_free(&t);
    flx_st_close(r);
    return st;
}

void flx_pred_line(flx_pred_outputs_t o, double t0, double t1, double *bgt0, double *k)
{
    if (o == FLX_PRED_OUT_LINE) {
        *bgt0 = t0, *k = t1;
        return;
    }
    double b16 = flx_pred_end(t0), b128 = flx_pred_end(t1);
    *k = (b128 - b16) / 3.0;
    *bgt0 = b16 - 4.0 * *k;
}

const char *flx_pred_outputs_name(flx_pred_outputs_t o)
{
    return o == FLX_PRED_OUT_LINE ? "line" : o == FLX_PRED_OUT_LOG_ENDS ? "log-ends" : NULL;
}

/* ---------------- reference ---------------- */

static float sigmoidf_stable(float y)
{
    if (y >= 0.0f) return 1.0f / (1.0f + expf(-y));
    float e = expf(y);
    return e / (1.0f + e);
}

/* bf16 rounding of x (via fp32, as the fast path rounds its fp32 values). */
static double round_bf16(double x)
{
    return flx_bf16_to_f32(flx_f32_to_bf16((float)x));
}

static flx_status_t forward_ref(const flx_mlp_t *m, const float *feat, uint32_t n_rows, int bf16_hidden,
                                flx_head_pred_t *out)
{
    if (!m || !m->w1 || (n_rows && (!feat || !out))) return flx_error_set(FLX_ERR_INVALID, "mlp ref: NULL argument");
    double a[FLX_PRED_H1], b[FLX_PRED_H1];
    for (uint32_t r = 0; r < n_rows; r++) {
        for (int i = 0; i < FLX_PRED_IN; i++)
            a[i] = ((double)feat[(size_t)r * FLX_PRED_IN + i] - m->feature_mean[i]) / m->feature_std[i];
        for (int l = 0; l < N_LAYERS; l++) {
            const float *w, *bias;
            mlp_layer(m, l, &w, &bias);
            const int rb = bf16_hidden && (l == 1 || l == 2);
            if (rb)
                for (uint32_t k = 0; k < L_IN[l]; k++) a[k] = round_bf16(a[k]);
            for (uint32_t o = 0; o < L_OUT[l]; o++) {
                double s = bias[o];
                for (uint32_t k = 0; k < L_IN[l]; k++) {
                    const double wk = w[(size_t)o * L_IN[l] + k];
                    s += (rb ? round_bf16(wk) : wk) * a[k];
                }
                b[o] = (l < N_LAYERS - 1 && s < 0.0) ? 0.0 : s;
            }
            memcpy(a, b, L_OUT[l] * sizeof(double));
        }
        double bgt0, k;
        flx_pred_line(m->outputs, a[0] * m->target_std[0] + m->target_mean[0],
                      a[1] * m->target_std[1] + m->target_mean[1], &bgt0, &k);
        out[r].bgt0 = (float)bgt0;
        out[r].k = (float)k;
        out[r].p_streaming = (float)(a[2] >= 0 ? 1.0 / (1.0 + exp(-a[2])) : exp(a[2]) / (1.0 + exp(a[2])));
    }
    return FLX_OK;
}

flx_status_t flx_mlp_forward_ref(const flx_mlp_t *m, const float *feat, uint32_t n_rows, flx_head_pred_t *out)
{
    return forward_ref(m, feat, n_rows, 0, out);
}

flx_status_t flx_mlp_forward_ref_bf16(const flx_mlp_t *m, const float *feat, uint32_t n_rows, flx_head_pred_t *out)
{
    return forward_ref(m, feat, n_rows, 1, out);
}

/* ---------------- prepared predictor ---------------- */

struct flx_predictor {
    flx_select_params_t select;
    float mean[IN_PAD], inv_std[IN_PAD];
    float target_mean[2], target_std[2];
    flx_pred_outputs_t outputs;
    float *wp[N_LAYERS];   /* (n_panels, K, NP) k-major panels, zero-padded columns */
    float *bp[N_LAYERS];   /* (n_panels * NP) padded bias */
    flx_bf16_t *wpb[N_LAYERS];   /* hidden layers 1, 2 on AVX-512 BF16: (n_panels, K / 2, NP, 2) k-pair panels */
};

int flx_predictor_bf16_hidden(flx_predictor_h p)
{
    return p && p->wpb[1] && flx_isa_active() >= FLX_ISA_AVX512BF16;
}

flx_status_t flx_predictor_create(const flx_mlp_t *m, flx_predictor_h *p_out)
{
    if (!m || !m->w1 || !p_out) return flx_error_set(FLX_ERR_INVALID, "predictor create: NULL argument");
    if (!flx_pred_outputs_name(m->outputs))
        return flx_error_set(FLX_ERR_INVALID, "predictor create: output map %d unknown", (int)m->outputs);
    struct flx_predictor *p = flx_aligned_alloc(64, sizeof *p);
    if (!p) return flx_error_set(FLX_ERR_NOMEM, "predictor create");
    memset(p, 0, sizeof *p);
    for (int i = 0; i < FLX_PRED_IN; i++) {
        if (!(m->feature_std[i] > 0.0f) || !isfinite(1.0f / m->feature_std[i]) || !isfinite(m->feature_mean[i])) {
            flx_aligned_free(p);
            return flx_error_set(FLX_ERR_INVALID, "predictor create: feature %d mean %g std %g", i,
                                 (double)m->feature_mean[i], (double)m->feature_std[i]);
        }
        p->mean[i] = m->feature_mean[i];
        p->inv_std[i] = 1.0f / m->feature_std[i];
    }
    if (flx_select_params_check(&m->select)) {
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
        flx_aligned_free(p);
        return flx_error_set(FLX_ERR_INVALID, "predictor create: %s", msg);
    }
    p->select = m->select;
    memcpy(p->target_mean, m->target_mean, sizeof p->target_mean);
    memcpy(p->target_std, m->target_std, sizeof p->target_std);
    p->outputs = m->outputs;
    for (int l = 0; l < N_LAYERS; l++) {
        const float *w, *b;
        mlp_layer(m, l, &w, &b);
        uint32_t np = L_NP[l], npan = FLX_DIV_UP(L_OUT[l], np), K = L_IN[l];
        p->wp[l] = flx_aligned_alloc(64, (size_t)npan * K * np * sizeof(float));
        p->bp[l] = flx_aligned_alloc(64, (size_t)npan * np * sizeof(float));
        if (!p->wp[l] || !p->bp[l]) {
            flx_predictor_destroy(p);
            return flx_error_set(FLX_ERR_NOMEM, "predictor create: layer %d panels", l);
        }
        for (uint32_t pn = 0; pn < npan; pn++)
            for (uint32_t k = 0; k < K; k++)
                for (uint32_t j = 0; j < np; j++) {
                    uint32_t o = pn * np + j;
                    p->wp[l][((size_t)pn * K + k) * np + j] = o < L_OUT[l] ? w[(size_t)o * K + k] : 0.0f;
                }
        for (uint32_t o = 0; o < npan * np; o++) p->bp[l][o] = o < L_OUT[l] ? b[o] : 0.0f;
        if ((l == 1 || l == 2) && flx_isa_best() >= FLX_ISA_AVX512BF16) {
            /* lane j of a k pair holds (W[o][k], W[o][k + 1]): what _mm512_dpbf16_ps multiplies
             * with a broadcast pair of activations (K = 256: even) */
            p->wpb[l] = flx_aligned_alloc(64, (size_t)npan * K * np * sizeof(flx_bf16_t));
            if (!p->wpb[l]) {
                flx_predictor_destroy(p);
                return flx_error_set(FLX_ERR_NOMEM, "predictor create: layer %d bf16 panels", l);
            }
            for (uint32_t pn = 0; pn < npan; pn++)
                for (uint32_t k = 0; k < K; k++)
                    for (uint32_t j = 0; j < np; j++)
                        p->wpb[l][(size_t)pn * K * np + ((size_t)(k / 2) * np + j) * 2 + k % 2] =
                            flx_f32_to_bf16(p->wp[l][((size_t)pn * K + k) * np + j]);
        }
    }
    *p_out = p;
    return FLX_OK;
}

flx_status_t flx_predictor_load(const char *path, flx_predictor_h *p)
{
    flx_mlp_t m;
    flx_status_t st = flx_mlp_load(path, &m);
    if (st) return st;
    st = flx_predictor_create(&m, p);
    flx_mlp_free(&m);
    return st;
}

flx_select_params_t flx_predictor_select_params(flx_predictor_h p) { return p->select; }

void flx_predictor_destroy(flx_predictor_h p)
{
    if (!p) return;
    for (int l = 0; l < N_LAYERS; l++) {
        flx_aligned_free(p->wp[l]);
        flx_aligned_free(p->bp[l]);
        flx_aligned_free(p->wpb[l]);
    }
    flx_aligned_free(p);
}

/* Per row: the standardized input (IN_PAD), two ping-pong activations (256 each), the head (16),
 * and a bf16 copy of a hidden activation (256 bf16 = 128 floats). */
#define ROW_FLOATS (IN_PAD + 2 * FLX_PRED_H1 + 16 + FLX_PRED_H1 / 2)

size_t flx_predictor_scratch_bytes(uint32_t max_rows)
{
    return (size_t)max_rows * ROW_FLOATS * sizeof(float) + 64;
}

uint32_t flx_predictor_tile_rows(void)
{
    const flx_isa_t isa = flx_isa_active();
    return isa >= FLX_ISA_AMX ? 16 : isa >= FLX_ISA_AVX2 && isa < FLX_ISA_AVX512 ? 6 : 8;
}

static void prefetch_bytes(const void *p, size_t n)
{
    const char *c = p;
    for (size_t o = 0; o < n; o += 64) _mm_prefetch(c + o, _MM_HINT_T1);
}

void flx_predictor_prefetch(flx_predictor_h p)
{
    if (!p) return;
    const int bf16 = flx_predictor_bf16_hidden(p);
    for (int l = 0; l < N_LAYERS; l++) {
        const uint32_t np = L_NP[l], npan = FLX_DIV_UP(L_OUT[l], np), K = L_IN[l];
        const size_t n = (size_t)npan * K * np;
        if (bf16 && p->wpb[l]) prefetch_bytes(p->wpb[l], n * sizeof(flx_bf16_t));
        else prefetch_bytes(p->wp[l], n * sizeof(float));
        prefetch_bytes(p->bp[l], (size_t)npan * np * sizeof(float));
    }
}

/* ---------------- kernels ----------------
 * y[r][o] = act(b[o] + sum_k x[r][k] * W[o][k]) for rows [0, n), outputs [0, n_out) (all panels,
 * columns past n_out are not stored). x has stride ldx, y stride ldy. */

typedef void (*layer_fn)(const float *x, size_t ldx, uint32_t n, const float *wp, const float *bp, uint32_t K,
                         uint32_t n_out, uint32_t np, int relu, float *y, size_t ldy);

static void layer_scalar(const float *x, size_t ldx, uint32_t n, const float *wp, const float *bp, uint32_t K,
                         uint32_t n_out, uint32_t np, int relu, float *y, size_t ldy)
{
    float acc[32];
    for (uint32_t pn = 0; pn * np < n_out; pn++) {
        const float *w = wp + (size_t)pn * K * np;
        uint32_t nc = n_out - pn * np < np ? n_out - pn * np : np;
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t j = 0; j < np; j++) acc[j] = bp[pn * np + j];
            for (uint32_t k = 0; k < K; k++) {
                float xv = x[r * ldx + k];
                for (uint32_t j = 0; j < np; j++) acc[j] += xv * w[(size_t)k * np + j];
            }
            for (uint32_t j = 0; j < nc; j++) y[r * ldy + pn * np + j] = relu && acc[j] < 0.0f ? 0.0f : acc[j];
        }
    }
}

/* MR rows x NV vectors of 16 outputs. */
#define MK512(MR, NV)                                                                                          \
    T512 static void mk512_##MR##_##NV(const float *x, size_t ldx, const float *w, const float *bias, uint32_t K, \
                                       uint32_t nc, int relu, float *y, size_t ldy)                            \
    {                                                                                                          \
        __m512 acc[MR][NV];                                                                                    \
        for (int v = 0; v < NV; v++) {                                                                         \
            __m512 b = _mm512_load_ps(bias + 16 * v);                                                          \
            for (int r = 0; r < MR; r++) acc[r][v] = b;                                                        \
        }                                                                                                      \
        for (uint32_t k = 0; k < K; k++) {                                                                     \
            __m512 wv[NV];                                                                                     \
            for (int v = 0; v < NV; v++) wv[v] = _mm512_load_ps(w + (size_t)k * 16 * NV + 16 * v);             \
            for (int r = 0; r < MR; r++) {                                                                     \
                __m512 xb = _mm512_set1_ps(x[r * ldx + k]);                                                    \
                for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(xb, wv[v], acc[r][v]);                \
            }                                                                                                  \
        }                                                                                                      \
        __m512 z = _mm512_setzero_ps();                                                                        \
        for (int r = 0; r < MR; r++)                                                                           \
            for (int v = 0; v < NV; v++) {                                                                     \
                __m512 a = relu ? _mm512_max_ps(acc[r][v], z) : acc[r][v];                                     \
                int c = (int)nc - 16 * v;                                                                      \
                if (c >= 16) _mm512_storeu_ps(y + r * ldy + 16 * v, a);                                        \
                else if (c > 0) _mm512_mask_storeu_ps(y + r * ldy + 16 * v, (__mmask16)((1u << c) - 1), a);   \
            }                                                                                                  \
    }
MK512(12, 2) MK512(8, 2) MK512(4, 2) MK512(2, 2) MK512(1, 2) MK512(8, 1) MK512(4, 1) MK512(2, 1) MK512(1, 1)

T512 static void layer_avx512(const float *x, size_t ldx, uint32_t n, const float *wp, const float *bp, uint32_t K,
                              uint32_t n_out, uint32_t np, int relu, float *y, size_t ldy)
{
    for (uint32_t pn = 0; pn * np < n_out; pn++) {
        const float *w = wp + (size_t)pn * K * np, *b = bp + pn * np;
        uint32_t nc = n_out - pn * np < np ? n_out - pn * np : np;
        float *yp = y + pn * np;
        uint32_t r = 0;
        if (np == 32) {
            for (; r + 12 <= n; r += 12) mk512_12_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
            if (r + 8 <= n) mk512_8_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 8;
            for (; r + 8 <= n; r += 8) mk512_8_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
            if (r + 4 <= n) mk512_4_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 4;
            if (r + 2 <= n) mk512_2_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 2;
            if (r < n) mk512_1_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
        } else {
            for (; r + 8 <= n; r += 8) mk512_8_1(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
            if (r + 4 <= n) mk512_4_1(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 4;
            if (r + 2 <= n) mk512_2_1(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 2;
            if (r < n) mk512_1_1(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
        }
    }
}

/* AVX-512 BF16 hidden layers: MR rows x 32 outputs, two k at a time; x is bf16 (ldx elements a
 * row), the panel k-pair interleaved (flx_predictor_create); fp32 accumulation, bias and ReLU fused
 * into the store as above. Twice the multiply-adds of an fp32 FMA per instruction: the hidden
 * layers are 90 % of the network's work and bound by arithmetic. */
#define MKBF(MR)                                                                                               \
    T512BF static void mkbf_##MR(const flx_bf16_t *x, size_t ldx, const flx_bf16_t *w, const float *bias,     \
                                 uint32_t K, uint32_t nc, int relu, float *y, size_t ldy)                      \
    {                                                                                                          \
        __m512 acc[MR][2];                                                                                     \
        for (int v = 0; v < 2; v++) {                                                                          \
            __m512 b = _mm512_load_ps(bias + 16 * v);                                                          \
            for (int r = 0; r < MR; r++) acc[r][v] = b;                                                        \
        }                                                                                                      \
        for (uint32_t k = 0; k < K; k += 2) {                                                                  \
            const __m512bh w0 = (__m512bh)_mm512_load_si512(w + (size_t)k * 32);                               \
            const __m512bh w1 = (__m512bh)_mm512_load_si512(w + (size_t)k * 32 + 32);                          \
            for (int r = 0; r < MR; r++) {                                                                     \
                uint32_t pr;                                                                                   \
                memcpy(&pr, x + r * ldx + k, sizeof pr);                                                       \
                const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pr);                                      \
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);                                               \
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);                                               \
            }                                                                                                  \
        }                                                                                                      \
        __m512 z = _mm512_setzero_ps();                                                                        \
        for (int r = 0; r < MR; r++)                                                                           \
            for (int v = 0; v < 2; v++) {                                                                      \
                __m512 a = relu ? _mm512_max_ps(acc[r][v], z) : acc[r][v];                                     \
                int c = (int)nc - 16 * v;                                                                      \
                if (c >= 16) _mm512_storeu_ps(y + r * ldy + 16 * v, a);                                        \
                else if (c > 0) _mm512_mask_storeu_ps(y + r * ldy + 16 * v, (__mmask16)((1u << c) - 1), a);   \
            }                                                                                                  \
    }
MKBF(12) MKBF(8) MKBF(4) MKBF(2) MKBF(1)

/* n rows of K fp32 (stride ldx) -> bf16 (stride ldy), round to nearest even; K a multiple of 16. */
T512BF static void rows_to_bf16(const float *x, size_t ldx, uint32_t n, uint32_t K, flx_bf16_t *y, size_t ldy)
{
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t k = 0; k < K; k += 16)
            _mm256_storeu_si256((__m256i *)(y + r * ldy + k),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + r * ldx + k)));
}

/* A hidden layer (np = 32 panels) from bf16 rows. */
T512BF static void layer_bf16(const flx_bf16_t *x, size_t ldx, uint32_t n, const flx_bf16_t *wp, const float *bp,
                              uint32_t K, uint32_t n_out, int relu, float *y, size_t ldy)
{
    for (uint32_t pn = 0; pn * 32 < n_out; pn++) {
        const flx_bf16_t *w = wp + (size_t)pn * K * 32;
        const float *b = bp + pn * 32;
        uint32_t nc = n_out - pn * 32 < 32 ? n_out - pn * 32 : 32, r = 0;
        float *yp = y + pn * 32;
        for (; r + 12 <= n; r += 12) mkbf_12(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
        for (; r + 8 <= n; r += 8) mkbf_8(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
        if (r + 4 <= n) mkbf_4(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 4;
        if (r + 2 <= n) mkbf_2(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy), r += 2;
        if (r < n) mkbf_1(x + r * ldx, ldx, w, b, K, nc, relu, yp + r * ldy, ldy);
    }
}

/* MR rows x NV vectors of 8 outputs from a panel whose k rows are ldw floats apart (NV * 8 <= ldw:
 * a kernel may take a 16-output half of a 32-wide panel). AVX2 has 16 ymm registers: 6 x 2 holds
 * 12 accumulators, 2 weight vectors and a broadcast. 3 x 4 (the tile until 2026-11) needs 17, and
 * GCC 12 stored its accumulators to the stack every k: 36 GFLOP/s on one Zen 3 core. The store
 * loop is unrolled so that no accumulator is indexed at run time: without it GCC kept even 6 x 2's
 * array in memory. */
#define MK2(MR, NV)                                                                                            \
    T2 static void mk2_##MR##_##NV(const float *x, size_t ldx, const float *w, size_t ldw, const float *bias,   \
                                   uint32_t K, uint32_t nc, int relu, float *y, size_t ldy)                    \
    {                                                                                                          \
        __m256 acc[MR][NV];                                                                                    \
        for (int v = 0; v < NV; v++) {                                                                         \
            __m256 b = _mm256_load_ps(bias + 8 * v);                                                           \
            for (int r = 0; r < MR; r++) acc[r][v] = b;                                                        \
        }                                                                                                      \
        for (uint32_t k = 0; k < K; k++) {                                                                     \
            __m256 wv[NV];                                                                                     \
            for (int v = 0; v < NV; v++) wv[v] = _mm256_load_ps(w + (size_t)k * ldw + 8 * v);                  \
            for (int r = 0; r < MR; r++) {                                                                     \
                __m256 xb = _mm256_broadcast_ss(x + r * ldx + k);                                              \
                for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(xb, wv[v], acc[r][v]);                \
            }                                                                                                  \
        }                                                                                                      \
        __m256 z = _mm256_setzero_ps();                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++)                                                   \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {                                             \
                __m256 a = relu ? _mm256_max_ps(acc[r][v], z) : acc[r][v];                                     \
                int c = (int)nc - 8 * v;                                                                       \
                if (c >= 8) {                                                                                  \
                    _mm256_storeu_ps(y + r * ldy + 8 * v, a);                                                  \
                } else if (c > 0) {                                                                            \
                    float t[8];                                                                                \
                    _mm256_storeu_ps(t, a);                                                                    \
                    memcpy(y + r * ldy + 8 * v, t, (size_t)c * sizeof(float));                                 \
                }                                                                                              \
            }                                                                                                  \
    }
MK2(6, 2) MK2(2, 4) MK2(2, 2) MK2(1, 4) MK2(1, 2)

#if FLX_HAVE_AMX
/* AMX hidden layer over n <= 16 bf16 rows (ldx elements apart): tiles 0-3 accumulate 64 outputs
 * (4 x 16 columns) and start from the bias (a stride-0 load repeats its 16 values on every row),
 * tile 4 is a 16 x 32 slice of the rows, tiles 5-7 the panels' 16 k pairs x 16 outputs, which the
 * 32-wide k-pair panels of flx_predictor_create already are (a 128-byte stride skips the other
 * half). K a multiple of 32, n_out of 64 (256 -> 256 and 256 -> 128). ReLU after the store. The
 * caller has configured the tiles (amx_predictor_cfg). */
TAMX static void layer_amx(const flx_bf16_t *x, size_t ldx, uint32_t n, const flx_bf16_t *wp, const float *bp,
                           uint32_t K, uint32_t n_out, int relu, float *y, size_t ldy)
{
    const size_t xs = ldx * sizeof(flx_bf16_t), ys = ldy * sizeof(float), ws = 32 * 2 * sizeof(flx_bf16_t);
    for (uint32_t o = 0; o < n_out; o += 64) {
        const flx_bf16_t *w0 = wp + (size_t)(o / 32) * K * 32, *w1 = w0 + (size_t)K * 32;
        _tile_loadd(0, bp + o, 0);
        _tile_loadd(1, bp + o + 16, 0);
        _tile_loadd(2, bp + o + 32, 0);
        _tile_loadd(3, bp + o + 48, 0);
        for (uint32_t k = 0; k < K; k += 32) {   /* rows k/2 .. k/2 + 16 of the k-pair panels */
            _tile_loadd(4, x + k, xs);
            _tile_loadd(5, w0 + (size_t)k * 32, ws);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, w0 + (size_t)k * 32 + 32, ws);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, w1 + (size_t)k * 32, ws);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, w1 + (size_t)k * 32 + 32, ws);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, y + o, ys);
        _tile_stored(1, y + o + 16, ys);
        _tile_stored(2, y + o + 32, ys);
        _tile_stored(3, y + o + 48, ys);
    }
    if (relu)
        for (uint32_t r = 0; r < n; r++)
            for (uint32_t o = 0; o < n_out; o += 16)
                _mm512_storeu_ps(y + r * ldy + o, _mm512_max_ps(_mm512_loadu_ps(y + r * ldy + o), _mm512_setzero_ps()));
}

/* Tiles for layer_amx over n rows: accumulators and row slices n rows x 64 bytes, panels 16 x 64. */
static void amx_predictor_cfg(amx_cfg_t *c, uint32_t n)
{
    amx_cfg_init(c);
    for (int t = 0; t < 5; t++) amx_cfg_tile(c, t, n, 64);
    for (int t = 5; t < 8; t++) amx_cfg_tile(c, t, 16, 64);
}
#endif

/* 6-row tiles over each 16-output half of a panel (np 32 or 16), then the tail rows two at a time
 * across the whole panel. */
T2 static void layer_avx2(const float *x, size_t ldx, uint32_t n, const float *wp, const float *bp, uint32_t K,
                          uint32_t n_out, uint32_t np, int relu, float *y, size_t ldy)
{
    for (uint32_t pn = 0; pn * np < n_out; pn++) {
        const float *w = wp + (size_t)pn * K * np, *b = bp + pn * np;
        uint32_t nc = n_out - pn * np < np ? n_out - pn * np : np;
        float *yp = y + pn * np;
        uint32_t r6 = n - n % 6, r = r6;
        for (uint32_t h = 0; h * 16 < nc; h++)
            for (uint32_t r0 = 0; r0 < r6; r0 += 6)
                mk2_6_2(x + r0 * ldx, ldx, w + 16 * h, np, b + 16 * h, K, nc - 16 * h, relu,
                        yp + r0 * ldy + 16 * h, ldy);
        if (np == 32) {
            for (; r + 2 <= n; r += 2) mk2_2_4(x + r * ldx, ldx, w, np, b, K, nc, relu, yp + r * ldy, ldy);
            if (r < n) mk2_1_4(x + r * ldx, ldx, w, np, b, K, nc, relu, yp + r * ldy, ldy);
        } else {
            for (; r + 2 <= n; r += 2) mk2_2_2(x + r * ldx, ldx, w, np, b, K, nc, relu, yp + r * ldy, ldy);
            if (r < n) mk2_1_2(x + r * ldx, ldx, w, np, b, K, nc, relu, yp + r * ldy, ldy);
        }
    }
}

typedef struct run_job {
    const struct flx_predictor *p;
    layer_fn fn;
    const float *feat;
    float *xs, *ha, *hb, *hy;
    flx_bf16_t *xb;   /* NULL: the hidden layers in fp32 */
    int amx;          /* the hidden layers (xb set) on AMX tiles, else _mm512_dpbf16_ps */
    flx_head_pred_t *out;
} run_job_t;

/* Rows [r0, r1) of j's run through all layers; scratch rows are indexed by absolute row. */
static void run_rows(const run_job_t *j, uint32_t r0, uint32_t r1)
{
    const struct flx_predictor *p = j->p;
    const layer_fn fn = j->fn;
    const float *feat = j->feat;
    flx_bf16_t *xb = j->xb;
    flx_head_pred_t *out = j->out;
    uint32_t n = r1 - r0;
    if (!n) return;
    float *x = j->xs + (size_t)r0 * IN_PAD;
    for (uint32_t r = 0; r < n; r++) {
        const float *f = feat + (size_t)(r0 + r) * FLX_PRED_IN;
        for (int i = 0; i < FLX_PRED_IN; i++) x[r * IN_PAD + i] = (f[i] - p->mean[i]) * p->inv_std[i];
    }
    float *a = j->ha + (size_t)r0 * FLX_PRED_H1, *b = j->hb + (size_t)r0 * FLX_PRED_H1, *y = j->hy + (size_t)r0 * 16;
    fn(x, IN_PAD, n, p->wp[0], p->bp[0], L_IN[0], L_OUT[0], L_NP[0], 1, a, FLX_PRED_H1);
    if (xb) {   /* the hidden layers in bf16 (rows_to_bf16 rounds each activation once) */
        xb += (size_t)r0 * FLX_PRED_H1;
#if FLX_HAVE_AMX
        if (j->amx) {   /* tiles of 16 rows */
            amx_cfg_t cfg;
            for (uint32_t t0 = 0; t0 < n; t0 += 16) {
                const uint32_t m = n - t0 < 16 ? n - t0 : 16;
                flx_bf16_t *xt = xb + (size_t)t0 * FLX_PRED_H1;
                float *at = a + (size_t)t0 * FLX_PRED_H1, *bt = b + (size_t)t0 * FLX_PRED_H1;
                amx_predictor_cfg(&cfg, m);
                amx_begin(&cfg);
                rows_to_bf16(at, FLX_PRED_H1, m, L_IN[1], xt, FLX_PRED_H1);
                layer_amx(xt, FLX_PRED_H1, m, p->wpb[1], p->bp[1], L_IN[1], L_OUT[1], 1, bt, FLX_PRED_H1);
                rows_to_bf16(bt, FLX_PRED_H1, m, L_IN[2], xt, FLX_PRED_H1);
                layer_amx(xt, FLX_PRED_H1, m, p->wpb[2], p->bp[2], L_IN[2], L_OUT[2], 1, at, FLX_PRED_H1);
                amx_end();
            }
        } else
#endif
        {
            rows_to_bf16(a, FLX_PRED_H1, n, L_IN[1], xb, FLX_PRED_H1);
            layer_bf16(xb, FLX_PRED_H1, n, p->wpb[1], p->bp[1], L_IN[1], L_OUT[1], 1, b, FLX_PRED_H1);
            rows_to_bf16(b, FLX_PRED_H1, n, L_IN[2], xb, FLX_PRED_H1);
            layer_bf16(xb, FLX_PRED_H1, n, p->wpb[2], p->bp[2], L_IN[2], L_OUT[2], 1, a, FLX_PRED_H1);
        }
    } else {
        fn(a, FLX_PRED_H1, n, p->wp[1], p->bp[1], L_IN[1], L_OUT[1], L_NP[1], 1, b, FLX_PRED_H1);
        fn(b, FLX_PRED_H1, n, p->wp[2], p->bp[2], L_IN[2], L_OUT[2], L_NP[2], 1, a, FLX_PRED_H1);
    }
    fn(a, FLX_PRED_H1, n, p->wp[3], p->bp[3], L_IN[3], L_OUT[3], L_NP[3], 0, y, 16);
    for (uint32_t r = 0; r < n; r++) {
        const float *yr = y + (size_t)r * 16;
        double bgt0, k;   /* the line map passes the floats through exactly */
        flx_pred_line(p->outputs, yr[0] * p->target_std[0] + p->target_mean[0],
                      yr[1] * p->target_std[1] + p->target_mean[1], &bgt0, &k);
        out[r0 + r].bgt0 = (float)bgt0;
        out[r0 + r].k = (float)k;
        out[r0 + r].p_streaming = sigmoidf_stable(yr[2]);
    }
}

static flx_status_t run_chunk(void *ctx, const flx_pool_worker_t *w, uint64_t r0, uint64_t r1)
{
    (void)w;
    const run_job_t *j = ctx;
    run_rows(j, (uint32_t)r0, (uint32_t)r1);
    return FLX_OK;
}

/* Checks a run's arguments and the features of rows [r0, r1); fills the job. */
static flx_status_t run_setup(flx_predictor_h p, const float *feat, uint32_t n_rows, uint32_t r0, uint32_t r1,
                              flx_head_pred_t *out, void *scratch, size_t scratch_bytes, run_job_t *j)
{
    if (!p || (n_rows && (!feat || !out || !scratch)))
        return flx_error_set(FLX_ERR_INVALID, "predictor run: NULL argument");
    if (r0 > r1 || r1 > n_rows)
        return flx_error_set(FLX_ERR_INVALID, "predictor run: rows [%u, %u) not within [0, %u)", r0, r1, n_rows);
    if (scratch_bytes < flx_predictor_scratch_bytes(n_rows))
        return flx_error_set(FLX_ERR_INVALID, "predictor run: scratch %zu bytes < %zu for %u rows", scratch_bytes,
                             flx_predictor_scratch_bytes(n_rows), n_rows);
    for (uint32_t r = r0; r < r1; r++)
        for (int i = 0; i < FLX_PRED_IN; i++)
            if (!isfinite(feat[(size_t)r * FLX_PRED_IN + i]))
                return flx_error_set(FLX_ERR_INVALID, "predictor run: row %u feature %d is not finite (%g)", r, i,
                                     (double)feat[(size_t)r * FLX_PRED_IN + i]);
    float *base = (float *)FLX_ALIGN_UP((uintptr_t)scratch, 64);
    *j = (run_job_t){.p = p, .feat = feat, .out = out};
    j->xs = base, j->ha = j->xs + (size_t)n_rows * IN_PAD, j->hb = j->ha + (size_t)n_rows * FLX_PRED_H1;
    j->hy = j->hb + (size_t)n_rows * FLX_PRED_H1;
    const flx_isa_t isa = flx_isa_active();
    j->fn = isa >= FLX_ISA_AVX512 ? layer_avx512 : isa >= FLX_ISA_AVX2 ? layer_avx2 : layer_scalar;
    if (flx_predictor_bf16_hidden(p)) j->xb = (flx_bf16_t *)(j->hy + (size_t)n_rows * 16);
    j->amx = j->xb && isa >= FLX_ISA_AMX;
    return FLX_OK;
}

flx_status_t flx_predictor_run(flx_predictor_h p, const float *feat, uint32_t n_rows, flx_head_pred_t *out,
                               void *scratch, size_t scratch_bytes, flx_pool_h pool)
{
    run_job_t j;
    flx_status_t st = run_setup(p, feat, n_rows, 0, n_rows, out, scratch, scratch_bytes, &j);
    if (st || !n_rows) return st;
    /* Chunks of whole register tiles: one tile each for a decode layer's few rows (a batch of 4 has
     * 36 on SmolLM2, which chunks of 32 split 32 + 4 between two workers: 66 us a layer, 73 on one),
     * four for the large runs of training and evaluation. Rows do not depend on the chunking. */
    const uint32_t tile = flx_predictor_tile_rows();
    return flx_pool_for(pool, n_rows, n_rows <= 128 ? tile : 4 * tile, run_chunk, &j);
}

flx_status_t flx_predictor_run_rows(flx_predictor_h p, const float *feat, uint32_t n_rows, uint32_t r0, uint32_t r1,
                                    flx_head_pred_t *out, void *scratch, size_t scratch_bytes)
{
    run_job_t j;
    flx_status_t st = run_setup(p, feat, n_rows, r0, r1, out, scratch, scratch_bytes, &j);
    if (st) return st;
    run_rows(&j, r0, r1);
    return FLX_OK;
}

/* ---------------- evaluation ---------------- */

flx_status_t flx_predictor_evaluate(flx_predictor_h p, const flx_dataset_t *d, const uint32_t *rows, uint32_t n_rows,
                                    flx_eval_t *ev)
{
    if (!p || !d || !ev || (n_rows && !rows)) return flx_error_set(FLX_ERR_INVALID, "evaluate: NULL argument");
    enum { CH = 256 };
    float *feat = malloc((size_t)CH * FLX_PRED_IN * sizeof(float));
    flx_head_pred_t *pred = malloc(CH * sizeof *pred);
    size_t sb = flx_predictor_scratch_bytes(CH);
    void *scratch = flx_aligned_alloc(64, sb);
    flx_status_t st = FLX_OK;
    if (!feat || !pred || !scratch) {
        st = flx_error_set(FLX_ERR_NOMEM, "evaluate: buffers");
        goto out;
    }
    double e0 = 0, ek = 0, e16 = 0;
    uint64_t n_ret = 0, tp = 0, fp = 0, fn = 0;
    for (uint32_t c = 0; c < n_rows; c += CH) {
        uint32_t n = n_rows - c < CH ? n_rows - c : CH;
        for (uint32_t i = 0; i < n; i++) {
            if (rows[c + i] >= d->n) {
                st = flx_error_set(FLX_ERR_INVALID, "evaluate: row %u >= n %u", rows[c + i], d->n);
                goto out;
            }
            memcpy(feat + (size_t)i * FLX_PRED_IN, d->features + (size_t)rows[c + i] * FLX_PRED_IN,
                   FLX_PRED_IN * sizeof(float));
        }
        if ((st = flx_predictor_run(p, feat, n, pred, scratch, sb, NULL))) goto out;
        for (uint32_t i = 0; i < n; i++) {
            const float *lab = d->labels + (size_t)rows[c + i] * 3;
            int s = lab[2] >= 0.5f, ps = pred[i].p_streaming >= 0.5f;
            tp += s && ps;
            fp += !s && ps;
            fn += s && !ps;
            if (s) continue;
            n_ret++;
            e0 += fabs((double)pred[i].bgt0 - lab[0]);
            ek += fabs((double)pred[i].k - lab[1]);
            e16 += fabs((double)pred[i].bgt0 + 4.0 * pred[i].k - d->bgt[(size_t)rows[c + i] * 5 + 1]);
        }
    }
    ev->n_rows = n_rows;
    ev->n_retrieval = (uint32_t)n_ret;
    ev->mae_bgt0 = n_ret ? (float)(e0 / n_ret) : NAN;
    ev->mae_k = n_ret ? (float)(ek / n_ret) : NAN;
    ev->mae_bgt16 = n_ret ? (float)(e16 / n_ret) : NAN;
    ev->stream_precision = tp + fp ? (float)tp / (float)(tp + fp) : (fn ? 0.0f : 1.0f);
    ev->stream_recall = tp + fn ? (float)tp / (float)(tp + fn) : 1.0f;
out:
    free(feat);
    free(pred);
    flx_aligned_free(scratch);
    return st;
}
