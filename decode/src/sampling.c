/*
 * sampling.c - greedy / temperature / top-k / top-p token sampling (flx/sampling.h).
 *
 * DESIGN
 * Candidates are token ids in a scratch index array. Both filters are selections under one strict
 * total order, "a before b" iff x[a] > x[b] or (x[a] == x[b] and a < b), so ties always go to the
 * lower id and the selected set is deterministic. top-k is a quickselect on the logits; top-p is a
 * quickselect that tracks the probability mass of the part it keeps, so it finds the nucleus (the
 * shortest sorted prefix with mass >= top_p) in expected linear time without sorting the
 * vocabulary. Probabilities are kept unnormalised (exp((l - max) / T)) in fp32 with double sums;
 * the nucleus target is top_p times their sum.
 */
#include "flx/sampling.h"

#include <math.h>
#include <string.h>

flx_sampling_params_t flx_sampling_greedy(void)
{
    flx_sampling_params_t p = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    return p;
}

flx_status_t flx_sampling_check(const flx_sampling_params_t *p)
{
    if (!p)
        return flx_error_set(FLX_ERR_INVALID, "sampling params are NULL");
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return flx_error_set(FLX_ERR_INVALID, "temperature %g must be a finite value >= 0", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "top_p %g must be in (0, 1]", (double)p->top_p);
    return FLX_OK;
}

flx_status_t flx_sampler_init(flx_sampler_t *s, const flx_sampling_params_t *p, uint32_t vocab)
{
    if (!s)
        return flx_error_set(FLX_ERR_INVALID, "sampler is NULL");
    flx_status_t st = flx_sampling_check(p);
    if (st)
        return st;
    if (vocab == 0)
        return flx_error_set(FLX_ERR_INVALID, "vocab %u must be >= 1", vocab);
    flx_sampler_t x;
    x.p = *p;
    x.vocab = vocab;
    flx_rng_seed(&x.rng, p->seed);
    *s = x;
    return FLX_OK;
}

size_t flx_sample_scratch_bytes(uint32_t vocab)
{
    return (size_t)vocab * (sizeof(uint32_t) + sizeof(float)) + FLX_CACHELINE;
}

uint32_t flx_sample_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    uint32_t i = 0;
    while (i < n && isnan(x[i])) i++;
    if (i == n)
        return 0;
    best = i;
    for (i = best + 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* a ranks before b: higher key, ties to the lower id. */
static inline int before(const float *key, uint32_t a, uint32_t b)
{
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

static inline void swap_u32(uint32_t *a, uint32_t *b)
{
    uint32_t t = *a;
    *a = *b;
    *b = t;
}

/* Partitions idx[lo, hi) (hi - lo >= 1) around a median-of-three pivot: returns m with idx[lo, m)
 * before idx[m] (the pivot) and idx[m], idx(m, hi) after it. */
static uint32_t partition(const float *key, uint32_t *idx, uint32_t lo, uint32_t hi)
{
    uint32_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (before(key, idx[mid], idx[lo])) swap_u32(&idx[mid], &idx[lo]);
    if (before(key, idx[last], idx[lo])) swap_u32(&idx[last], &idx[lo]);
    if (before(key, idx[last], idx[mid])) swap_u32(&idx[last], &idx[mid]);
    /* idx[mid] is now the median: use it as pivot, parked at the end. */
    swap_u32(&idx[mid], &idx[last]);
    uint32_t pv = idx[last], store = lo;
    for (uint32_t i = lo; i < last; i++)
        if (before(key, idx[i], pv))
            swap_u32(&idx[i], &idx[store++]);
    swap_u32(&idx[store], &idx[last]);
    return store;
}

/* Moves the k first-ranked of idx[0, n) to idx[0, k) (in no particular order); 0 < k < n. */
static void select_top_k(const float *key, uint32_t *idx, uint32_t n, uint32_t k)
{
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        uint32_t m = partition(key, idx, lo, hi);
        if (m == k || m + 1 == k)
            return;
        if (m > k)
            hi = m;
        else
            lo = m + 1;
    }
}

/* Reorders idx[0, n) so that idx[0, c) is the nucleus (shortest first-ranked prefix under p whose
 * mass reaches target); returns c (n when the whole set falls short by rounding). */
static uint32_t select_nucleus(const float *p, uint32_t *idx, uint32_t n, double target)
{
    uint32_t lo = 0, hi = n;
    while (hi > lo) {
        uint32_t m = partition(p, idx, lo, hi);
        double mass = 0.0;
        for (uint32_t i = lo; i < m; i++) mass += p[idx[i]];
        if (mass >= target) {
            hi = m;   /* the nucleus ends strictly inside [lo, m) */
            continue;
        }
        mass += p[idx[m]];
        if (mass >= target)
            return m + 1;
        target -= mass;
        lo = m + 1;
    }
    return hi < n ? hi : n;
}

flx_status_t flx_sample(flx_sampler_t *s, const float *logits, void *scratch, size_t scratch_bytes, int32_t *token_p)
{
    if (!s || !logits || !token_p)
        return flx_error_set(FLX_ERR_INVALID, "sample: NULL sampler, logits or token");
    const uint32_t V = s->vocab;
    uint32_t n_finite = 0;
    for (uint32_t i = 0; i < V; i++) {
        float x = logits[i];
        if (isnan(x) || x == INFINITY)
            return flx_error_set(FLX_ERR_INVALID, "logit %u is %g: refusing to sample", i, (double)x);
        n_finite += x != -INFINITY;
    }
    if (n_finite == 0)
        return flx_error_set(FLX_ERR_INVALID, "all %u logits are -inf", V);
    /* a temperature so small that 1 / T overflows is greedy's limit (0 * inf would be NaN below) */
    if (s->p.temperature == 0.0f || !isfinite(1.0f / s->p.temperature)) {
        *token_p = (int32_t)flx_sample_argmax(logits, V);
        return FLX_OK;
    }
    if (!scratch || scratch_bytes < flx_sample_scratch_bytes(V))
        return flx_error_set(FLX_ERR_INVALID, "sample scratch %zu bytes, need %zu for vocab %u", scratch_bytes,
                             flx_sample_scratch_bytes(V), V);
    float *p = (float *)FLX_ALIGN_UP((uintptr_t)scratch, FLX_CACHELINE);
    uint32_t *idx = (uint32_t *)(p + V);

    uint32_t n = 0;
    for (uint32_t i = 0; i < V; i++)
        if (logits[i] != -INFINITY) idx[n++] = i;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top_k(logits, idx, n, s->p.top_k);
        n = s->p.top_k;
    }
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++) mx = logits[idx[i]] > mx ? logits[idx[i]] : mx;
    const float inv_t = 1.0f / s->p.temperature;
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t t = idx[i];
        p[t] = expf((logits[t] - mx) * inv_t);
        total += p[t];
    }
    if (s->p.top_p < 1.0f) {
        n = select_nucleus(p, idx, n, (double)s->p.top_p * total);
        total = 0.0;
        for (uint32_t i = 0; i < n; i++) total += p[idx[i]];
    }
    double u = flx_rng_uniform(&s->rng) * total, acc = 0.0;
    uint32_t pick = idx[0];   /* replaced below: the most likely candidate (p = 1) is always kept */
    for (uint32_t i = 0; i < n; i++) {
        if (p[idx[i]] > 0.0f)
            pick = idx[i];    /* rounding fallback: the last candidate that can be drawn */
        acc += p[idx[i]];
        if (u < acc)
            break;
    }
    *token_p = (int32_t)pick;
    return FLX_OK;
}
