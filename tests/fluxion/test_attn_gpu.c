/*
 * test_attn_gpu - the device attention kernels of flx/attn_gpu.h against CPU references (label gpu;
 * exits 77 where no CUDA device is usable, including binaries built without CUDA):
 *  (a) window attention, one launch for many (sequence, group) items of different window lengths
 *      (0, 1, 31, 32, 33, 100, 129, 700 rows: empty, partial, exact and multi-tile, and more tiles
 *      than the block has warps), G in {1, 3, 4, 8, 9, 16, 64}, D in {16, 48, 64, 128, 256}, vs
 *      flx_attn_window_ref (double); rows past n_win hold NaN on the device, so a kernel that reads
 *      past a window fails; an empty window must give o = 0 and lse = -inf exactly;
 *  (b) causal prefill attention, in chunks [t0, t0 + nq) like the GPU prefill issues it, vs a dense
 *      double-precision softmax over keys 0..t; K, V have NaN in the token slots past the prompt
 *      (kv_stride > n) and o a row stride larger than Hq D; D 192 and 256 take the launcher's
 *      path that opts in to more than 48 KiB of shared memory.
 * Tolerance: fp32 accumulation (online softmax, expf) against double, the bounds test_attn_kernels
 * holds the CPU fast kernels to: o within 3e-5 + 2e-4 |ref|, lse within 1e-4 + 1e-5 |ref|; a wrong
 * mask, row, head or rescale moves them by O(0.1).
 */
#include <math.h>
#include <string.h>

#include "attn_testutil.h"
#include "flx/attn_gpu.h"
#include "flx/cuda_rt.h"

#define O_ATOL 3e-5
#define O_RTOL 2e-4
#define L_ATOL 1e-4
#define L_RTOL 1e-5

static flx_rng_t rng;
static flx_cuda_stream_t g_stream;

static void *dev_upload(const void *src, size_t bytes)
{
    void *d;
    CHECK_OK(flx_cuda_malloc(0, bytes, &d));
    CHECK_OK(flx_cuda_copy_htod(0, d, src, bytes));
    return d;
}

static void rand_f(float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(flx_rng_normal(&rng) * sd);
}

/* (a) */
static void test_window(uint32_t D, uint32_t G, const uint32_t *n_win, uint32_t n_items)
{
    tkv_t *t = calloc(n_items, sizeof *t);
    flx_attn_gpu_item_t *items = calloc(n_items, sizeof *items);
    float *q = malloc((size_t)n_items * G * D * sizeof *q), *o = malloc((size_t)n_items * G * D * sizeof *o);
    float *lse = malloc((size_t)n_items * G * sizeof *lse), *o_ref = malloc((size_t)G * D * sizeof *o_ref);
    float *lse_ref = malloc(G * sizeof *lse_ref);
    void **dk = calloc(n_items, sizeof *dk), **dvv = calloc(n_items, sizeof *dvv);
    CHECK(t && items && q && o && lse && o_ref && lse_ref && dk && dvv);
    rand_f(q, (size_t)n_items * G * D, 1.0);
    float *dq = dev_upload(q, (size_t)n_items * G * D * sizeof *q);
    float *dout;
    CHECK_OK(flx_cuda_malloc(0, (size_t)n_items * G * (D + 1) * sizeof(float), (void **)&dout));
    float *dlse = dout + (size_t)n_items * G * D;
    for (uint32_t i = 0; i < n_items; i++) {
        tkv_make(&t[i], &rng, D, 0, n_win[i]);
        const size_t bytes = (size_t)t[i].view.win_cap * D * sizeof(flx_bf16_t);   /* NaN rows past n_win */
        dk[i] = dev_upload(t[i].win_k, bytes);
        dvv[i] = dev_upload(t[i].win_v, bytes);
        flx_attn_gpu_item_t it = {.k = dk[i], .v = dvv[i], .n_win = n_win[i], .q = dq + (size_t)i * G * D,
                                  .o = dout + (size_t)i * G * D, .lse = dlse + (size_t)i * G};
        items[i] = it;
    }
    flx_attn_gpu_shape_t sh = {.group = G, .head_dim = D, .max_items = n_items};
    size_t db, hb;
    CHECK_OK(flx_attn_window_gpu_plan(&sh, &db, &hb));
    void *dmem, *hmem;
    CHECK_OK(flx_cuda_malloc(0, db, &dmem));
    CHECK_OK(flx_cuda_host_alloc(hb, &hmem));
    flx_attn_gpu_ws_t ws;
    CHECK_OK(flx_attn_window_gpu_ws_init(&ws, &sh, dmem, db, hmem, hb));
    CHECK_OK(flx_attn_window_gpu(&ws, items, n_items, g_stream));
    CHECK_OK(flx_cuda_stream_sync(0, g_stream));
    CHECK_OK(flx_cuda_copy_dtoh(0, o, dout, (size_t)n_items * G * D * sizeof *o));
    CHECK_OK(flx_cuda_copy_dtoh(0, lse, dlse, (size_t)n_items * G * sizeof *lse));
    for (uint32_t i = 0; i < n_items; i++) {
        const float *oi = o + (size_t)i * G * D, *li = lse + (size_t)i * G;
        char label[128];
        if (n_win[i] == 0) {
            for (uint32_t x = 0; x < G * D; x++) CHECK(oi[x] == 0.0f);
            for (uint32_t h = 0; h < G; h++) CHECK(li[h] == -INFINITY);
            continue;
        }
        CHECK_OK(flx_attn_window_ref(&t[i].view, G, q + (size_t)i * G * D, o_ref, lse_ref));
        snprintf(label, sizeof label, "window D %u G %u item %u n_win %u: o", D, G, i, n_win[i]);
        CHECK_CLOSE(label, oi, o_ref, (size_t)G * D, O_ATOL, O_RTOL);
        snprintf(label, sizeof label, "window D %u G %u item %u n_win %u: lse", D, G, i, n_win[i]);
        CHECK_CLOSE(label, li, lse_ref, G, L_ATOL, L_RTOL);
    }
    for (uint32_t i = 0; i < n_items; i++) {
        CHECK_OK(flx_cuda_free(0, dk[i]));
        CHECK_OK(flx_cuda_free(0, dvv[i]));
        tkv_free(&t[i]);
    }
    CHECK_OK(flx_cuda_free(0, dq));
    CHECK_OK(flx_cuda_free(0, dout));
    CHECK_OK(flx_cuda_free(0, dmem));
    flx_cuda_host_free(hmem);
    free(t), free(items), free(q), free(o), free(lse), free(o_ref), free(lse_ref), free(dk), free(dvv);
}

/* (b) Dense causal softmax in double of token t, query head h (kv head h / G). */
static void causal_ref(const float *q, size_t q_stride, const float *k, const float *v, uint32_t kv_stride,
                       uint32_t t, uint32_t h, uint32_t G, uint32_t D, double *p, float *out)
{
    const float *qh = q + (size_t)t * q_stride + (size_t)h * D;
    const float *K = k + (size_t)(h / G) * kv_stride * D, *V = v + (size_t)(h / G) * kv_stride * D;
    double mx = -INFINITY, sum = 0;
    for (uint32_t j = 0; j <= t; j++) {
        double s = 0;
        for (uint32_t d = 0; d < D; d++) s += (double)qh[d] * K[(size_t)j * D + d];
        p[j] = s / sqrt((double)D);
        mx = p[j] > mx ? p[j] : mx;
    }
    for (uint32_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
    for (uint32_t d = 0; d < D; d++) {
        double a = 0;
        for (uint32_t j = 0; j <= t; j++) a += p[j] * V[(size_t)j * D + d];
        out[d] = (float)(a / sum);
    }
}

static void test_causal(uint32_t Hq, uint32_t Hkv, uint32_t D, uint32_t n, uint32_t chunk)
{
    const uint32_t G = Hq / Hkv, kv_stride = n + 5;
    const size_t qd = (size_t)Hq * D, o_stride = qd + 16, kv_el = (size_t)Hkv * kv_stride * D;
    float *q = malloc((size_t)n * qd * sizeof *q), *kf = malloc(kv_el * sizeof *kf), *vf = malloc(kv_el * sizeof *vf);
    flx_bf16_t *kb = malloc(kv_el * sizeof *kb), *vb = malloc(kv_el * sizeof *vb);
    float *o = malloc((size_t)chunk * o_stride * sizeof *o), *ref = malloc(D * sizeof *ref);
    double *p = malloc((size_t)n * sizeof *p);
    CHECK(q && kf && vf && kb && vb && o && ref && p);
    rand_f(q, (size_t)n * qd, 1.0);
    for (size_t i = 0; i < kv_el; i++) {
        const uint32_t tok = (uint32_t)(i / D % kv_stride);
        if (tok >= n) {   /* past the prompt: NaN, must never be read */
            kb[i] = vb[i] = 0x7fc0;
            kf[i] = vf[i] = NAN;
            continue;
        }
        kf[i] = tkv_rnd_bf16(&rng, 0.1f, 1.0f);
        vf[i] = tkv_rnd_bf16(&rng, 0.0f, 1.0f);
        kb[i] = flx_f32_to_bf16(kf[i]);
        vb[i] = flx_f32_to_bf16(vf[i]);
    }
    float *dq = dev_upload(q, (size_t)n * qd * sizeof *q);
    flx_bf16_t *dk = dev_upload(kb, kv_el * sizeof *kb), *dv = dev_upload(vb, kv_el * sizeof *vb);
    float *dout;
    CHECK_OK(flx_cuda_malloc(0, (size_t)chunk * o_stride * sizeof(float), (void **)&dout));
    for (uint32_t t0 = 0; t0 < n; t0 += chunk) {
        const uint32_t nq = FLX_MIN(chunk, n - t0);
        flx_attn_causal_gpu_args_t a = {.q = dq, .q_stride = qd, .k = dk, .v = dv, .kv_stride = kv_stride, .t0 = t0,
                                        .nq = nq, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .o = dout,
                                        .o_stride = o_stride};
        CHECK_OK(flx_attn_causal_gpu(&a, g_stream));
        CHECK_OK(flx_cuda_stream_sync(0, g_stream));
        CHECK_OK(flx_cuda_copy_dtoh(0, o, dout, (size_t)nq * o_stride * sizeof *o));
        double worst = 0;
        for (uint32_t i = 0; i < nq; i++)
            for (uint32_t h = 0; h < Hq; h++) {
                causal_ref(q, qd, kf, vf, kv_stride, t0 + i, h, G, D, p, ref);
                const float *got = o + (size_t)i * o_stride + (size_t)h * D;
                for (uint32_t d = 0; d < D; d++) {
                    const double err = fabs((double)got[d] - ref[d]) / (O_ATOL + O_RTOL * fabs(ref[d]));
                    if (!(err <= 1.0) || !isfinite(got[d])) {
                        fprintf(stderr, "causal Hq %u Hkv %u D %u n %u chunk %u: token %u head %u dim %u: got %.8g "
                                "ref %.8g\n", Hq, Hkv, D, n, chunk, t0 + i, h, d, (double)got[d], (double)ref[d]);
                        CHECK(0);
                    }
                    worst = err > worst ? err : worst;
                }
            }
        if (t0 + nq == n)
            fprintf(stderr, "causal Hq %u Hkv %u D %u n %u chunk %u: last chunk worst %.3f of tolerance -> ok\n", Hq,
                    Hkv, D, n, chunk, worst);
    }
    CHECK_OK(flx_cuda_free(0, dq));
    CHECK_OK(flx_cuda_free(0, dk));
    CHECK_OK(flx_cuda_free(0, dv));
    CHECK_OK(flx_cuda_free(0, dout));
    free(q), free(kf), free(vf), free(kb), free(vb), free(o), free(ref), free(p);
}

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_attn_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_attn_gpu"));
    CHECK_OK(flx_cuda_stream_create(0, &g_stream));

    const uint32_t lens[] = {0, 1, 31, 32, 33, 100, 129, 700};
    const uint32_t Ds[] = {16, 48, 64, 128, 256}, Gs[] = {1, 3, 4, 8, 9, 16, 64};
    for (size_t di = 0; di < FLX_ARRAY_SIZE(Ds); di++)
        for (size_t gi = 0; gi < FLX_ARRAY_SIZE(Gs); gi++)
            test_window(Ds[di], Gs[gi], lens, (uint32_t)FLX_ARRAY_SIZE(lens));
    /* a whole layer's worth: 48 items of random lengths, as a batch of 8 x 6 kv heads */
    uint32_t many[48];
    for (int i = 0; i < 48; i++) many[i] = (uint32_t)flx_rng_below(&rng, 1200);
    test_window(64, 4, many, 48);
    test_window(128, 8, many, 48);
    fprintf(stderr, "window: ok\n");

    test_causal(4, 4, 64, 1, 1);
    test_causal(8, 2, 128, 100, 33);
    test_causal(8, 1, 256, 77, 77);
    test_causal(9, 3, 64, 300, 128);
    test_causal(64, 1, 16, 40, 7);
    test_causal(6, 2, 48, 65, 65);
    test_causal(4, 2, 192, 50, 19);
    test_causal(4, 1, 64, 700, 256);
    fprintf(stderr, "causal: ok\n");

    flx_cuda_stream_destroy(0, g_stream);
    fprintf(stderr, "test_attn_gpu: ok\n");
    return 0;
}
