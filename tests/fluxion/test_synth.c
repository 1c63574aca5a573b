/*
 * test_synth - the synthetic workload (flx/synth.h): determinism, layer and worker-count
 * independence (pools of 1, 2, 3 and 7 workers), knob refusals, and the ground truth it promises (kinds, needles, sinks, value
 * norms, normal z-scores, Eq. 2 separation of streaming and retrieval heads).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/synth.h"
#include "flx_test.h"

enum { L = 3, HQ = 8, HKV = 2, D = 64, P = 4096, S = 8 };
#define T (P + S)
#define R (S + 1)

static flx_bf16_t *kb, *vb, *kb2, *vb2;
static float *qf, *qf2, *K, *V;

static double dot(const float *a, const float *b)
{
    double d = 0;
    for (int i = 0; i < D; i++) d += (double)a[i] * b[i];
    return d;
}

static void softmax_row(const float *q, const float *Kh, uint32_t n, double *w)
{
    double mx = -INFINITY, z = 0;
    for (uint32_t t = 0; t < n; t++) {
        w[t] = dot(q, Kh + (size_t)t * D) / sqrt((double)D);
        mx = fmax(mx, w[t]);
    }
    for (uint32_t t = 0; t < n; t++) z += (w[t] = exp(w[t] - mx));
    for (uint32_t t = 0; t < n; t++) w[t] /= z;
}

static void output(const double *w, const float *Vh, uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1, double *o)
{
    double z = 0;
    for (int i = 0; i < D; i++) o[i] = 0;
    for (uint32_t t = 0; t < b1; t++) {
        if (!((t >= a0 && t < a1) || (t >= b0 && t < b1))) continue;
        z += w[t];
        for (int i = 0; i < D; i++) o[i] += w[t] * Vh[(size_t)t * D + i];
    }
    for (int i = 0; i < D; i++) o[i] /= z;
}

static void expect_bad(flx_synth_params_t p, const char *knob)
{
    flx_synth_t *s = NULL;
    CHECK_ST(flx_synth_create(&p, &s), FLX_ERR_INVALID);
    if (!strstr(flx_error_msg(), knob)) {
        fprintf(stderr, "refusal '%s' does not name %s\n", flx_error_msg(), knob);
        exit(1);
    }
}

int main(void)
{
    const size_t nkv = (size_t)HKV * T * D, nq = (size_t)HQ * R * D;
    kb = malloc(nkv * 2), vb = malloc(nkv * 2), kb2 = malloc(nkv * 2), vb2 = malloc(nkv * 2);
    qf = malloc(nq * 4), qf2 = malloc(nq * 4), K = malloc(nkv * 4), V = malloc(nkv * 4);
    double *w = malloc(T * sizeof *w);
    CHECK(kb && vb && kb2 && vb2 && qf && qf2 && K && V && w);

    flx_synth_params_t p;
    flx_synth_defaults(&p, L, HQ, HKV, D, P, S, 1234);
    p.rope_theta = 100000.0f;

    /* knob refusals name the knob */
    { flx_synth_params_t b = p; b.retrieval_share = 1.5f; expect_bad(b, "retrieval_share"); }
    { flx_synth_params_t b = p; b.n_q_heads = 7; expect_bad(b, "n_q_heads"); }
    { flx_synth_params_t b = p; b.head_dim = 15; expect_bad(b, "head_dim"); }
    { flx_synth_params_t b = p; b.needles_active = b.needle_sites + 1; expect_bad(b, "needles_active"); }
    { flx_synth_params_t b = p; b.move_every = 0; expect_bad(b, "move_every"); }
    { flx_synth_params_t b = p; b.noise = NAN; expect_bad(b, "noise"); }
    { flx_synth_params_t b = p; b.host_end_margin = P; expect_bad(b, "host_end_margin"); }
    { flx_synth_params_t b = p; b.needle_sites = 1000; expect_bad(b, "needle_sites"); }
    { flx_synth_params_t b = p; b.rope_theta = -1; expect_bad(b, "rope_theta"); }
    { flx_synth_params_t b = p; b.head_jitter = 5.0f; expect_bad(b, "head_jitter"); }

    flx_synth_t *syn, *syn2;
    CHECK_OK(flx_synth_create(&p, &syn));
    CHECK_OK(flx_synth_create(&p, &syn2));
    CHECK_ST(flx_synth_layer(syn, L, kb, vb, qf, NULL), FLX_ERR_INVALID);

    /* determinism, worker-count and layer independence */
    CHECK_OK(flx_synth_layer(syn, 1, kb, vb, qf, NULL));
    for (int wi = 0; wi < 4; wi++) {
        flx_pool_h pool = flx_test_pool(FLX_TEST_WORKERS[wi]);
        CHECK_OK(flx_synth_layer(syn2, 0, kb2, vb2, qf2, pool));
        CHECK(memcmp(kb, kb2, nkv * 2) != 0);   /* layers differ */
        CHECK_OK(flx_synth_layer(syn2, 1, kb2, vb2, qf2, pool));
        CHECK(!memcmp(kb, kb2, nkv * 2) && !memcmp(vb, vb2, nkv * 2) && !memcmp(qf, qf2, nq * 4));
        flx_pool_destroy(pool);
    }
    flx_synth_destroy(syn2);
    { flx_synth_params_t b = p; b.seed = 99; CHECK_OK(flx_synth_create(&b, &syn2)); }
    CHECK_OK(flx_synth_layer(syn2, 1, kb2, vb2, qf2, NULL));
    CHECK(memcmp(kb, kb2, nkv * 2) != 0);
    flx_synth_destroy(syn2);

    /* value norms grow with depth */
    CHECK(flx_synth_value_norm(syn, L - 1) > 2.0f * flx_synth_value_norm(syn, 0));

    uint32_t host_lo = p.host_begin, host_hi = P - p.host_end_margin;
    int sink_ok = 0, sink_n = 0, sep_ok = 0, sep_n = 0, mass_ok = 0, mass_n = 0;
    double prev_vn = 0;
    for (uint32_t l = 0; l < L; l++) {
        CHECK_OK(flx_synth_layer(syn, l, kb, vb, qf, NULL));
        flx_bf16_to_f32_row(kb, K, nkv);
        flx_bf16_to_f32_row(vb, V, nkv);
        /* kinds: round(share * HQ) retrieval heads, spread over the groups */
        int n_ret = 0, per_group[HKV] = {0};
        for (uint32_t h = 0; h < HQ; h++)
            if (flx_synth_head_kind(syn, l, h) == FLX_SYNTH_RETRIEVAL) n_ret++, per_group[h / (HQ / HKV)]++;
        CHECK(n_ret == (int)lrintf(p.retrieval_share * HQ));
        for (int g = 0; g < HKV; g++) CHECK(per_group[g] == n_ret / HKV);
        /* value norms: sinks small, others grow with depth */
        double vs = 0, vo = 0;
        for (uint32_t t = 0; t < P; t++) {
            double n = sqrt(dot(V + (size_t)t * D, V + (size_t)t * D));
            if (t < 64) vs += n / 64;
            else vo += n / (P - 64);
        }
        CHECK(vs < 0.5 * vo);
        CHECK(vo > prev_vn);
        prev_vn = vo;
        double onorm[HQ][R], err[HQ][R];
        for (uint32_t h = 0; h < HQ; h++) {
            const uint32_t g = h / (HQ / HKV);
            const float *Kh = K + (size_t)g * T * D, *Vh = V + (size_t)g * T * D;
            int ret = flx_synth_head_kind(syn, l, h) == FLX_SYNTH_RETRIEVAL;
            uint32_t b[16], e[16], b2[16], e2[16];
            uint32_t na = flx_synth_needles(syn, l, h, 0, b, e, 16);
            CHECK(na == (ret ? p.needles_active : 0));
            if (ret) {
                /* inside the host region, needle_len long, block-aligned from host_begin */
                for (uint32_t a = 0; a < na; a++)
                    CHECK(b[a] >= host_lo && e[a] <= host_hi && e[a] - b[a] == p.needle_len &&
                          (b[a] - p.host_begin) % p.needle_len == 0);
                uint32_t nb = flx_synth_needles(syn, l, h, (int32_t)p.move_every, b2, e2, 16);
                CHECK(nb == na);
                int same = 1;
                for (uint32_t a = 0; a < na; a++) same &= b[a] == b2[a];
                CHECK(!same);   /* needles move */
                /* heads of a group have different needles */
                for (uint32_t h2 = g * (HQ / HKV); h2 < (g + 1) * (HQ / HKV); h2++) {
                    if (h2 == h || flx_synth_head_kind(syn, l, h2) != FLX_SYNTH_RETRIEVAL) continue;
                    uint32_t n3 = flx_synth_needles(syn, l, h2, 0, b2, e2, 16);
                    int eq = n3 == na;
                    for (uint32_t a = 0; a < na && eq; a++) eq &= b[a] == b2[a];
                    CHECK(!eq);
                }
            }
            for (uint32_t r = 0; r < R; r++) {
                const float *q = qf + ((size_t)h * R + r) * D;
                uint32_t last = P - 1 + r;
                softmax_row(q, Kh, last + 1, w);
                /* sinks: token 0 far above the host average (most rows; needle crosstalk can eat it) */
                double host_mean = 0;
                for (uint32_t t = host_lo; t < host_hi; t++) host_mean += w[t] / (host_hi - host_lo);
                sink_n++;
                sink_ok += w[0] > 100.0 * host_mean;
                double of[D], ow[D];
                output(w, Vh, 0, last + 1, 0, last + 1, of);
                output(w, Vh, 0, 64, P - 256, last + 1, ow);
                double e2s = 0;
                for (int i = 0; i < D; i++) e2s += (ow[i] - of[i]) * (ow[i] - of[i]);
                err[h][r] = sqrt(e2s);
                double on = 0;
                for (int i = 0; i < D; i++) on += of[i] * of[i];
                onorm[h][r] = sqrt(on);
                /* needle mass: retrieval heads favour their active needles, streaming heads do not
                 * favour the needles of the group's retrieval heads */
                uint32_t nb[16], ne[16];
                uint32_t src_h = h;
                if (!ret)
                    for (uint32_t h2 = g * (HQ / HKV); h2 < (g + 1) * (HQ / HKV); h2++)
                        if (flx_synth_head_kind(syn, l, h2) == FLX_SYNTH_RETRIEVAL) src_h = h2;
                uint32_t nn = flx_synth_needles(syn, l, src_h, (int32_t)r - 1, nb, ne, 16);
                if (!nn) continue;
                double wn = 0, wh = 0;
                uint32_t cn = 0;
                for (uint32_t a = 0; a < nn; a++)
                    for (uint32_t t = nb[a]; t < ne[a]; t++) wn += w[t], cn++;
                for (uint32_t t = host_lo; t < host_hi; t++) wh += w[t];
                double ratio = (wn / cn) / (wh / (host_hi - host_lo));
                mass_n++;
                mass_ok += ret ? ratio > 20.0 : ratio < 3.0;
            }
            if (h == 0 || !ret) {
                /* z-scores of the anchor over host keys outside every needle of the group */
                const float *q = qf + (size_t)h * R * D;
                double qn = sqrt(dot(q, q) * D), m1 = 0, m2 = 0, m3 = 0, m4 = 0;
                uint32_t n = 0;
                for (uint32_t t = host_lo; t < host_hi; t += 1) {
                    int in = 0;
                    for (uint32_t h2 = g * (HQ / HKV); h2 < (g + 1) * (HQ / HKV) && !in; h2++)
                        for (int32_t st = -1; st < S && !in; st++) {
                            uint32_t nb[16], ne[16], nn = flx_synth_needles(syn, l, h2, st, nb, ne, 16);
                            for (uint32_t a = 0; a < nn; a++) in |= t >= nb[a] && t < ne[a];
                        }
                    if (in) continue;
                    w[n++] = dot(q, Kh + (size_t)t * D) / qn;
                }
                for (uint32_t i = 0; i < n; i++) m1 += w[i] / n;
                for (uint32_t i = 0; i < n; i++) {
                    double c = w[i] - m1;
                    m2 += c * c / n, m3 += c * c * c / n, m4 += c * c * c * c / n;
                }
                double sk = m3 / pow(m2, 1.5), ku = m4 / (m2 * m2);
                fprintf(stderr, "layer %u head %u: z skew %.3f kurtosis %.3f over %u keys\n", l, h, sk, ku, n);
                CHECK(fabs(sk) < 0.3 && ku > 2.5 && ku < 3.8);
            }
        }
        /* Eq. 2 with the window alone separates the kinds for most heads */
        for (uint32_t h = 0; h < HQ; h++) {
            int pass = 0;
            for (uint32_t r = 0; r < R; r++) {
                double mx = 0;
                for (uint32_t h2 = 0; h2 < HQ; h2++) mx = fmax(mx, onorm[h2][r]);
                pass += err[h][r] <= 0.1 * mx;
            }
            int streaming = 2 * pass >= R;
            sep_n++;
            sep_ok += streaming == (flx_synth_head_kind(syn, l, h) == FLX_SYNTH_STREAMING);
        }
    }
    fprintf(stderr, "Eq. 2 separation: %d/%d heads as their kind; needle mass as expected: %d/%d rows\n", sep_ok, sep_n,
            mass_ok, mass_n);
    fprintf(stderr, "token 0 above 100x the host mean: %d/%d rows\n", sink_ok, sink_n);
    CHECK(sink_ok * 10 >= sink_n * 8);
    CHECK(sep_ok * 4 >= sep_n * 3);
    CHECK(mass_ok * 10 >= mass_n * 8);
    flx_synth_destroy(syn);
    free(kb), free(vb), free(kb2), free(vb2), free(qf), free(qf2), free(K), free(V), free(w);
    return 0;
}
