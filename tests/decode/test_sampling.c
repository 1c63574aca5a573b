/*
 * test_sampling - flx/sampling.h against brute-force oracles: greedy is argmax, a seed replays,
 * temperature draws follow softmax(logits / T) (chi-square), top-k and top-p never leave the set
 * a full sort says they may use and follow the renormalised distribution inside it, and bad
 * parameters / logits are refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/sampling.h"
#include "flx_test.h"

static float *g_key;   /* for qsort: sort ids by key desc, ties by id asc */
static int cmp_desc(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (g_key[x] != g_key[y]) return g_key[x] > g_key[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* allowed[i] = 1 for tokens the oracle lets (T, top_k, top_p) draw; prob = renormalised p. */
static void oracle(const float *logits, uint32_t V, float T, uint32_t top_k, float top_p, uint8_t *allowed,
                   double *prob)
{
    uint32_t *ord = malloc(V * sizeof *ord);
    float *key = malloc(V * sizeof *key);
    for (uint32_t i = 0; i < V; i++) ord[i] = i, key[i] = logits[i];
    g_key = key;
    qsort(ord, V, sizeof *ord, cmp_desc);
    uint32_t n = V;
    while (n > 0 && logits[ord[n - 1]] == -INFINITY) n--;
    if (top_k && top_k < n) n = top_k;
    double mx = logits[ord[0]], tot = 0;
    double *p = calloc(V, sizeof *p);
    for (uint32_t i = 0; i < n; i++) tot += p[ord[i]] = exp(((double)logits[ord[i]] - mx) / T);
    if (top_p < 1.0f) {
        double acc = 0;
        uint32_t c = 0;
        while (c < n && acc < top_p * tot) acc += p[ord[c++]];
        n = c;
        tot = acc;
    }
    memset(allowed, 0, V);
    for (uint32_t i = 0; i < V; i++) prob[i] = 0;
    for (uint32_t i = 0; i < n; i++) allowed[ord[i]] = 1, prob[ord[i]] = p[ord[i]] / tot;
    free(p);
    free(ord);
    free(key);
}

/* Draws N tokens; fails if any is outside allowed; returns the chi-square statistic over cells with
 * expected count >= 5 (the rest pooled) and its degrees of freedom. */
static double draw_chi2(flx_sampler_t *s, const float *logits, uint32_t V, const uint8_t *allowed, const double *prob,
                        uint32_t N, uint32_t *df_p)
{
    size_t sb = flx_sample_scratch_bytes(V);
    void *scratch = malloc(sb);
    uint32_t *cnt = calloc(V, sizeof *cnt);
    for (uint32_t i = 0; i < N; i++) {
        int32_t t;
        CHECK_OK(flx_sample(s, logits, scratch, sb, &t));
        CHECK(t >= 0 && (uint32_t)t < V);
        if (!allowed[t]) {
            fprintf(stderr, "draw %u: token %d outside the allowed set (logit %g)\n", i, t, (double)logits[t]);
            CHECK(allowed[t]);
        }
        cnt[t]++;
    }
    double chi2 = 0, pool_e = 0, pool_o = 0;
    uint32_t cells = 0;
    for (uint32_t i = 0; i < V; i++) {
        double e = prob[i] * N;
        if (e >= 5) {
            chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
            cells++;
        } else {
            pool_e += e;
            pool_o += cnt[i];
        }
    }
    if (pool_e >= 5) {
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    free(cnt);
    free(scratch);
    *df_p = cells - 1;
    return chi2;
}

/* Upper bound for chi-square with df degrees of freedom at ~1e-6 false-failure rate (Wilson-Hilferty, z = 4.9). */
static double chi2_bound(uint32_t df)
{
    double k = df, z = 4.9, a = 2.0 / (9.0 * k);
    double x = 1.0 - a + z * sqrt(a);
    return k * x * x * x;
}

static void check_dist(const char *label, const float *logits, uint32_t V, float T, uint32_t k, float top_p,
                       uint64_t seed, uint32_t N)
{
    uint8_t *allowed = malloc(V);
    double *prob = malloc(V * sizeof *prob);
    oracle(logits, V, T, k, top_p, allowed, prob);
    flx_sampling_params_t sp = {.temperature = T, .top_k = k, .top_p = top_p, .seed = seed};
    flx_sampler_t s;
    CHECK_OK(flx_sampler_init(&s, &sp, V));
    uint32_t df;
    double chi2 = draw_chi2(&s, logits, V, allowed, prob, N, &df);
    double bound = df ? chi2_bound(df) : 0.0;
    uint32_t n_allowed = 0;
    for (uint32_t i = 0; i < V; i++) n_allowed += allowed[i];
    fprintf(stderr, "%s: V %u T %g top_k %u top_p %g: %u allowed, chi2 %.1f df %u bound %.1f\n", label, V, (double)T,
            k, (double)top_p, n_allowed, chi2, df, bound);
    CHECK(df >= 1 || n_allowed == 1);
    CHECK(n_allowed == 1 || chi2 < bound);
    free(allowed);
    free(prob);
}

int main(void)
{
    flx_rng_t rng;
    uint64_t seed = flx_test_seed("test_sampling");
    flx_rng_seed(&rng, seed);

    /* ---- refusals ---- */
    flx_sampler_t s;
    flx_sampling_params_t bad[] = {
        {.temperature = -0.5f, .top_p = 1.0f}, {.temperature = NAN, .top_p = 1.0f},
        {.temperature = INFINITY, .top_p = 1.0f}, {.temperature = 1.0f, .top_p = 0.0f},
        {.temperature = 1.0f, .top_p = 1.5f}, {.temperature = 1.0f, .top_p = NAN},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        memset(&s, 0xab, sizeof s);
        CHECK_ST(flx_sampler_init(&s, &bad[i], 10), FLX_ERR_INVALID);
        CHECK(strlen(flx_error_msg()) > 0);
        CHECK(s.vocab == 0xabababab);   /* not written on refusal */
    }
    flx_sampling_params_t g = flx_sampling_greedy();
    CHECK_OK(flx_sampling_check(&g));
    CHECK_ST(flx_sampling_check(NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_sampler_init(&s, &g, 0), FLX_ERR_INVALID);

    /* ---- greedy = argmax (ties -> lowest id), no scratch needed ---- */
    enum { VG = 5000 };
    float *lg = malloc(VG * sizeof *lg);
    CHECK_OK(flx_sampler_init(&s, &g, VG));
    for (int rep = 0; rep < 20; rep++) {
        for (uint32_t i = 0; i < VG; i++) lg[i] = (float)flx_rng_normal(&rng) * 3.0f;
        uint32_t want = 0;
        for (uint32_t i = 1; i < VG; i++)
            if (lg[i] > lg[want]) want = i;
        if (rep % 2) {   /* plant a tie above the max: the lower id wins */
            uint32_t a = (uint32_t)flx_rng_below(&rng, VG), b = (uint32_t)flx_rng_below(&rng, VG);
            lg[a] = lg[b] = 100.0f;
            want = a < b ? a : b;
        }
        int32_t t = -1;
        CHECK_OK(flx_sample(&s, lg, NULL, 0, &t));
        CHECK(t == (int32_t)want);
        CHECK(flx_sample_argmax(lg, VG) == want);
    }

    /* ---- a temperature whose 1 / T overflows (1e-40, a float denormal) draws greedy's token ---- */
    {
        flx_sampling_params_t sp = {.temperature = 1e-40f, .top_p = 1.0f, .seed = 7};
        CHECK(sp.temperature > 0.0f && isinf(1.0f / sp.temperature));
        CHECK_OK(flx_sampler_init(&s, &sp, VG));
        void *scr = malloc(flx_sample_scratch_bytes(VG));
        for (int rep = 0; rep < 4; rep++) {
            for (uint32_t i = 0; i < VG; i++) lg[i] = (float)flx_rng_normal(&rng) * 3.0f;
            int32_t t = -1;
            CHECK_OK(flx_sample(&s, lg, scr, flx_sample_scratch_bytes(VG), &t));
            CHECK(t == (int32_t)flx_sample_argmax(lg, VG));
        }
        free(scr);
    }

    /* ---- bad logits and scratch ---- */
    {
        flx_sampling_params_t sp = {.temperature = 1.0f, .top_p = 1.0f, .seed = 1};
        CHECK_OK(flx_sampler_init(&s, &sp, 8));
        float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        size_t sb = flx_sample_scratch_bytes(8);
        void *scr = malloc(sb);
        int32_t t = 12345;
        CHECK_ST(flx_sample(&s, x, scr, sb - 1, &t), FLX_ERR_INVALID);
        x[3] = NAN;
        CHECK_ST(flx_sample(&s, x, scr, sb, &t), FLX_ERR_INVALID);
        x[3] = INFINITY;
        CHECK_ST(flx_sample(&s, x, scr, sb, &t), FLX_ERR_INVALID);
        for (int i = 0; i < 8; i++) x[i] = -INFINITY;
        CHECK_ST(flx_sample(&s, x, scr, sb, &t), FLX_ERR_INVALID);
        CHECK(t == 12345);
        /* -inf tokens are never drawn */
        for (int i = 0; i < 8; i++) x[i] = (i % 3 == 0) ? -INFINITY : 0.0f;
        for (int i = 0; i < 2000; i++) {
            CHECK_OK(flx_sample(&s, x, scr, sb, &t));
            CHECK(t % 3 != 0);
        }
        free(scr);
    }

    /* ---- a seed replays; another seed differs ---- */
    {
        enum { V = 300, N = 400 };
        float x[V];
        for (int i = 0; i < V; i++) x[i] = (float)flx_rng_normal(&rng);
        flx_sampling_params_t sp = {.temperature = 1.3f, .top_k = 50, .top_p = 0.9f, .seed = seed ^ 0x5eed};
        flx_sampler_t a, b, c;
        CHECK_OK(flx_sampler_init(&a, &sp, V));
        CHECK_OK(flx_sampler_init(&b, &sp, V));
        sp.seed++;
        CHECK_OK(flx_sampler_init(&c, &sp, V));
        size_t sb = flx_sample_scratch_bytes(V);
        void *scr = malloc(sb);
        int diff = 0;
        for (int i = 0; i < N; i++) {
            int32_t ta, tb, tc;
            CHECK_OK(flx_sample(&a, x, scr, sb, &ta));
            CHECK_OK(flx_sample(&b, x, scr, sb, &tb));
            CHECK_OK(flx_sample(&c, x, scr, sb, &tc));
            CHECK(ta == tb);
            diff += ta != tc;
        }
        CHECK(diff > N / 4);
        free(scr);
    }

    /* ---- distributions ---- */
    {
        enum { V = 12 };
        float x[V];
        for (int i = 0; i < V; i++) x[i] = (float)flx_rng_normal(&rng) * 1.5f;
        check_dist("temperature 1", x, V, 1.0f, 0, 1.0f, seed + 1, 100000);
        check_dist("temperature 0.6", x, V, 0.6f, 0, 1.0f, seed + 2, 100000);
        check_dist("temperature 2.5", x, V, 2.5f, 0, 1.0f, seed + 3, 100000);
    }
    {
        enum { V = 1000 };
        float *x = malloc(V * sizeof *x);
        /* quantised logits: many ties, so tie-breaking is exercised */
        for (int i = 0; i < V; i++) x[i] = roundf((float)flx_rng_normal(&rng) * 4.0f) / 2.0f;
        check_dist("top-k 7", x, V, 1.0f, 7, 1.0f, seed + 4, 40000);
        check_dist("top-k 40 T 0.8", x, V, 0.8f, 40, 1.0f, seed + 5, 40000);
        check_dist("top-p 0.5", x, V, 1.0f, 0, 0.5f, seed + 6, 40000);
        check_dist("top-p 0.95", x, V, 1.0f, 0, 0.95f, seed + 7, 40000);
        check_dist("top-k 30 + top-p 0.7", x, V, 1.2f, 30, 0.7f, seed + 8, 40000);
        check_dist("top-k > vocab", x, V, 1.0f, 5000, 1.0f, seed + 9, 30000);
        /* a tiny top_p keeps exactly the first-ranked token */
        check_dist("top-p 1e-6", x, V, 1.0f, 0, 1e-6f, seed + 10, 2000);
        free(x);
    }
    {
        /* a vocabulary of the real model's size: the nucleus of a peaked distribution */
        enum { V = 49152 };
        float *x = malloc(V * sizeof *x);
        for (int i = 0; i < V; i++) x[i] = (float)flx_rng_normal(&rng) * 2.0f;
        for (int i = 0; i < 20; i++) x[flx_rng_below(&rng, V)] += 12.0f;
        check_dist("vocab 49152 top-p 0.9", x, V, 1.0f, 0, 0.9f, seed + 11, 3000);
        free(x);
    }
    free(lg);
    fprintf(stderr, "test_sampling: ok\n");
    return 0;
}
