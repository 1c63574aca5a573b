/*
 * synth.c - the structured synthetic workload (flx/synth.h).
 *
 * DESIGN
 * Scores are built in units of s = <q, k> / sqrt(D). Keys start as isotropic N(0, 1) noise in the
 * pre-RoPE space and queries as N(0, noise^2), so the bulk of host scores is exactly normal with std
 * about `noise` (plus the small spread the query's structural components add against noise keys):
 * the normal z-scores of the paper's appendix A.
 *
 * The rotary pairs are split in two by frequency (HF rotate-half layout: dims i and i + D/2 turn
 * together at theta^(-2i/D)):
 *   recency pairs     theta_i >= 1/recent_span. Every key carries one shared vector r (equal
 *                     amplitude in each pair, random phases) and the query too, so after RoPE their
 *                     product is recent_strength * mean_i cos(delta * theta_i): a kernel that is 1
 *                     at distance 0 and decorrelates beyond ~recent_span tokens. This is how a
 *                     real head's recency arises from RoPE.
 *   structural pairs  the slow rest (rotation over a needle span or the sink block stays small):
 *                     the sink direction and the needle directions live here. A query aims its
 *                     structural components at the target's position (the component is rotated
 *                     to the target, as a content match of a real head would be), so a match
 *                     keeps its strength at any distance; low frequencies keep it over the span.
 * Structural components have key amplitude KEY_AMP * sqrt(D) and query amplitude strength /
 * KEY_AMP, so a match scores `strength` while the query part adds only strength^2 / (KEY_AMP^2 D)
 * to the variance of unmatched scores.
 *
 * Values are N(0, 1) * vnorm(l) / sqrt(D) per dimension (norm ~ vnorm(l), growing with depth);
 * sink values are scaled by sink_value_scale; needle tokens share a per-site value direction
 * (needle_value_coherence of the norm), because a retrieved span carries one piece of content.
 *
 * Every random stream is xoshiro256** seeded by splitmix64 over (seed, layer, head, purpose), so
 * a layer, and each head of it, is the same whichever layers are generated and whatever the thread
 * count. Ground truth (kinds, sites, active sets) is recomputed from the same keys on demand.
 */
#include "flx/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/util.h"

#define KEY_AMP 2.0f

enum { P_KIND = 1, P_SITES, P_ACTIVE, P_SINKDIR, P_RECDIR, P_NDIR, P_VDIR, P_KEY, P_VAL, P_QRY, P_JITTER };

struct flx_synth {
    flx_synth_params_t p;
    uint32_t n_rec_pairs;        /* pairs [0, n_rec_pairs) carry recency; the rest is structural */
    float *inv_freq;             /* (D/2) */
};

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void stream(flx_rng_t *r, uint64_t seed, uint32_t layer, uint32_t head, uint32_t purpose, int64_t extra)
{
    uint64_t k = splitmix64(seed);
    k = splitmix64(k ^ ((uint64_t)layer << 32 | head));
    k = splitmix64(k ^ ((uint64_t)purpose << 48) ^ (uint64_t)extra);
    flx_rng_seed(r, k);
}

/* Box-Muller on 24-bit uniforms, both outputs used. */
static void fill_normal(flx_rng_t *r, float *x, size_t n, float scale)
{
    const float two_pi = 6.28318530717958647f;
    for (size_t i = 0; i < n; i += 2) {
        uint64_t u = flx_rng_u64(r);
        float u1 = ((float)(u >> 40) + 0.5f) * (1.0f / 16777216.0f);
        float u2 = (float)((u >> 8) & 0xffffffu) * (1.0f / 16777216.0f);
        float rad = sqrtf(-2.0f * logf(u1)) * scale;
        x[i] = rad * cosf(two_pi * u2);
        if (i + 1 < n) x[i + 1] = rad * sinf(two_pi * u2);
    }
}

void flx_synth_defaults(flx_synth_params_t *p, uint32_t n_layers, uint32_t n_q_heads, uint32_t n_kv_heads,
                        uint32_t head_dim, uint32_t prompt_len, uint32_t n_steps, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->n_layers = n_layers, p->n_q_heads = n_q_heads, p->n_kv_heads = n_kv_heads, p->head_dim = head_dim;
    p->prompt_len = prompt_len, p->n_steps = n_steps, p->seed = seed;
    p->rope_theta = 500000.0f;
    p->retrieval_share = 0.5f;
    p->host_begin = 64;
    p->host_end_margin = 256;
    p->n_sink_tokens = 64;
    p->recent_span = 256;
    /* Mass that must compete with the whole host region grows with its length: strengths are set
     * relative to ln(host tokens), which keeps the sink and needle shares of a head roughly
     * independent of the prompt length. */
    uint32_t host = prompt_len > 320 + 256 ? prompt_len - 320 : 256;
    float lh = logf((float)host);
    p->sink_strength = lh + 5.0f;
    p->sink_tail = 0.3f;
    p->sink_value_scale = 0.1f;
    p->recent_strength = 7.0f;
    p->needle_sites = 8;
    p->needle_len = 16;
    p->needles_active = 2;
    p->move_every = 4;
    p->needle_strength = lh + 1.0f;
    p->needle_value_coherence = 0.8f;
    p->head_jitter = 0.5f;
    p->value_norm_base = 1.0f;
    p->value_norm_growth = 3.0f;
    p->noise = 1.0f;
}

#define BAD(name, ...) flx_error_set(FLX_ERR_INVALID, "synth knob " name ": " __VA_ARGS__)

static int finite_in(float x, float lo, float hi) { return isfinite(x) && x >= lo && x <= hi; }

static flx_status_t check(const flx_synth_params_t *p)
{
    if (p->n_layers == 0 || p->n_layers > 4096) return BAD("n_layers", "%u not in [1, 4096]", p->n_layers);
    if (p->n_kv_heads == 0 || p->n_kv_heads > 1024) return BAD("n_kv_heads", "%u not in [1, 1024]", p->n_kv_heads);
    if (p->n_q_heads == 0 || p->n_q_heads % p->n_kv_heads)
        return BAD("n_q_heads", "%u is not a positive multiple of n_kv_heads %u", p->n_q_heads, p->n_kv_heads);
    if (p->head_dim < 16 || p->head_dim > 1024 || p->head_dim % 2)
        return BAD("head_dim", "%u not an even number in [16, 1024]", p->head_dim);
    if (p->prompt_len == 0 || p->prompt_len > (1u << 24)) return BAD("prompt_len", "%u not in [1, 2^24]", p->prompt_len);
    if (p->n_steps > (1u << 20)) return BAD("n_steps", "%u above 2^20", p->n_steps);
    if (!finite_in(p->rope_theta, 2.0f, 1e9f)) return BAD("rope_theta", "%g not in [2, 1e9]", (double)p->rope_theta);
    if (!finite_in(p->retrieval_share, 0.0f, 1.0f))
        return BAD("retrieval_share", "%g not in [0, 1]", (double)p->retrieval_share);
    if (p->n_sink_tokens > p->prompt_len)
        return BAD("n_sink_tokens", "%u exceeds prompt_len %u", p->n_sink_tokens, p->prompt_len);
    if (!finite_in(p->sink_strength, 0.0f, 100.0f)) return BAD("sink_strength", "%g not in [0, 100]", (double)p->sink_strength);
    if (!finite_in(p->sink_tail, 0.0f, 1.0f)) return BAD("sink_tail", "%g not in [0, 1]", (double)p->sink_tail);
    if (!finite_in(p->sink_value_scale, 0.0f, 100.0f))
        return BAD("sink_value_scale", "%g not in [0, 100]", (double)p->sink_value_scale);
    if (p->recent_span < 2 || p->recent_span > p->prompt_len + p->n_steps)
        return BAD("recent_span", "%u not in [2, prompt_len + n_steps]", p->recent_span);
    if (!finite_in(p->recent_strength, 0.0f, 100.0f))
        return BAD("recent_strength", "%g not in [0, 100]", (double)p->recent_strength);
    if (p->needle_len == 0 || p->needle_len > 4096) return BAD("needle_len", "%u not in [1, 4096]", p->needle_len);
    if (p->needle_sites > 1024) return BAD("needle_sites", "%u above 1024", p->needle_sites);
    if (p->needles_active > p->needle_sites)
        return BAD("needles_active", "%u exceeds needle_sites %u", p->needles_active, p->needle_sites);
    if (p->move_every == 0) return BAD("move_every", "must be positive");
    if (!finite_in(p->needle_strength, 0.0f, 100.0f))
        return BAD("needle_strength", "%g not in [0, 100]", (double)p->needle_strength);
    if (!finite_in(p->needle_value_coherence, 0.0f, 1.0f))
        return BAD("needle_value_coherence", "%g not in [0, 1]", (double)p->needle_value_coherence);
    if (!finite_in(p->head_jitter, 0.0f, 4.0f)) return BAD("head_jitter", "%g not in [0, 4]", (double)p->head_jitter);
    if (!finite_in(p->value_norm_base, 1e-6f, 1e6f))
        return BAD("value_norm_base", "%g not in [1e-6, 1e6]", (double)p->value_norm_base);
    if (!finite_in(p->value_norm_growth, 0.0f, 1e3f))
        return BAD("value_norm_growth", "%g not in [0, 1000]", (double)p->value_norm_growth);
    if (!finite_in(p->noise, 0.0f, 100.0f)) return BAD("noise", "%g not in [0, 100]", (double)p->noise);
    if (p->host_begin < p->n_sink_tokens)
        return BAD("host_begin", "%u below n_sink_tokens %u", p->host_begin, p->n_sink_tokens);
    if ((uint64_t)p->host_begin + p->host_end_margin > p->prompt_len)
        return BAD("host_end_margin", "host_begin %u + host_end_margin %u exceed prompt_len %u", p->host_begin,
                   p->host_end_margin, p->prompt_len);
    uint32_t host = p->prompt_len - p->host_end_margin - p->host_begin;
    if (p->retrieval_share > 0 && p->needle_sites && (uint64_t)p->needle_sites * p->needle_len > host)
        return BAD("needle_sites", "%u sites of needle_len %u do not fit the host region of %u tokens", p->needle_sites,
                   p->needle_len, host);
    return FLX_OK;
}

flx_status_t flx_synth_create(const flx_synth_params_t *p, flx_synth_t **syn_p)
{
    if (!p || !syn_p) return flx_error_set(FLX_ERR_INVALID, "synth: NULL argument");
    flx_status_t st = check(p);
    if (st) return st;
    flx_synth_t *s = calloc(1, sizeof *s);
    float *inv = malloc(p->head_dim / 2 * sizeof *inv);
    if (!s || !inv) {
        free(s), free(inv);
        return flx_error_set(FLX_ERR_NOMEM, "synth: %u floats", p->head_dim / 2);
    }
    s->p = *p;
    s->inv_freq = inv;
    const uint32_t half = p->head_dim / 2;
    uint32_t nr = 0;
    for (uint32_t i = 0; i < half; i++) {
        inv[i] = (float)pow((double)p->rope_theta, -2.0 * i / p->head_dim);
        if (inv[i] * (float)p->recent_span >= 1.0f) nr = i + 1;
    }
    /* keep at least a quarter of the pairs structural and one for recency */
    s->n_rec_pairs = FLX_MAX(1u, FLX_MIN(nr, half - FLX_MAX(2u, half / 4)));
    *syn_p = s;
    return FLX_OK;
}

void flx_synth_destroy(flx_synth_t *syn)
{
    if (!syn) return;
    free(syn->inv_freq);
    free(syn);
}

const flx_synth_params_t *flx_synth_params(const flx_synth_t *syn) { return &syn->p; }

/* ---- ground truth ---- */

/* Retrieval heads of a layer: round(share * Hq) of them, dealt round-robin over the groups in a
 * seeded order, with a seeded slot order inside each group. */
static int head_is_retrieval(const flx_synth_t *s, uint32_t layer, uint32_t h)
{
    const flx_synth_params_t *p = &s->p;
    const uint32_t G = p->n_kv_heads, gs = p->n_q_heads / G;
    uint32_t n_ret = (uint32_t)lrintf(p->retrieval_share * (float)p->n_q_heads);
    if (n_ret == 0) return 0;
    if (n_ret >= p->n_q_heads) return 1;
    flx_rng_t r;
    stream(&r, p->seed, layer, 0, P_KIND, 0);
    /* rank of group g in the dealing order, and rank of slot j inside group g: sampled keys */
    uint32_t g = h / gs, j = h % gs;
    uint32_t grank = 0, srank = 0;
    uint64_t gkey_h = 0, skey_h = 0;
    for (uint32_t x = 0; x < G; x++) {
        uint64_t key = flx_rng_u64(&r);
        if (x == g) gkey_h = key;
    }
    stream(&r, p->seed, layer, 0, P_KIND, 0);
    for (uint32_t x = 0; x < G; x++)
        grank += flx_rng_u64(&r) < gkey_h;
    flx_rng_t rs;
    stream(&rs, p->seed, layer, g + 1, P_KIND, 1);
    for (uint32_t x = 0; x < gs; x++) {
        uint64_t key = flx_rng_u64(&rs);
        if (x == j) skey_h = key;
    }
    stream(&rs, p->seed, layer, g + 1, P_KIND, 1);
    for (uint32_t x = 0; x < gs; x++)
        srank += flx_rng_u64(&rs) < skey_h;
    return (uint64_t)srank * G + grank < n_ret;
}

flx_synth_kind_t flx_synth_head_kind(const flx_synth_t *syn, uint32_t layer, uint32_t q_head)
{
    if (!syn || layer >= syn->p.n_layers || q_head >= syn->p.n_q_heads) return FLX_SYNTH_STREAMING;
    return head_is_retrieval(syn, layer, q_head) ? FLX_SYNTH_RETRIEVAL : FLX_SYNTH_STREAMING;
}

/* Site k of a retrieval head: one span per stratum of the host region, placed at random in it at an
 * offset from host_begin that is a multiple of needle_len when the stratum holds one (it does unless
 * the host region is barely longer than the sites). With the defaults (host_begin = the store's
 * sink, needle_len 16) a needle is then one logical block at blk 16 and lies inside one block at
 * every coarser granularity: the "needle blocks" the recall counts. */
static void sites(const flx_synth_t *s, uint32_t layer, uint32_t h, uint32_t *begin)
{
    const flx_synth_params_t *p = &s->p;
    const uint32_t host = p->prompt_len - p->host_end_margin - p->host_begin, S = p->needle_sites, n = p->needle_len;
    flx_rng_t r;
    stream(&r, p->seed, layer, h, P_SITES, 0);
    for (uint32_t k = 0; k < S; k++) {
        uint64_t lo = (uint64_t)host * k / S, hi = (uint64_t)host * (k + 1) / S;   /* hi - lo >= needle_len */
        uint64_t a0 = (lo + n - 1) / n, a1 = (hi - n) / n;                       /* aligned slots in [lo, hi - n] */
        uint64_t off = a1 >= a0 ? (a0 + flx_rng_below(&r, a1 - a0 + 1)) * n : lo + flx_rng_below(&r, hi - lo - n + 1);
        begin[k] = p->host_begin + (uint32_t)off;
    }
}

/* Active sites at a step: a window of needles_active consecutive entries of a seeded permutation
 * of the sites, advanced by needles_active every move_every steps (so consecutive epochs differ
 * whenever needles_active < needle_sites); the anchor (step -1) is epoch 0, step t epoch 1 + t / move_every. */
static uint32_t active(const flx_synth_t *s, uint32_t layer, uint32_t h, int32_t step, uint32_t *idx)
{
    const flx_synth_params_t *p = &s->p;
    const uint32_t S = p->needle_sites, A = p->needles_active;
    uint32_t perm[1024];
    for (uint32_t k = 0; k < S; k++) perm[k] = k;
    flx_rng_t r;
    stream(&r, p->seed, layer, h, P_ACTIVE, 0);
    for (uint32_t k = S; k > 1; k--) {
        uint32_t j = (uint32_t)flx_rng_below(&r, k), t = perm[k - 1];
        perm[k - 1] = perm[j], perm[j] = t;
    }
    uint64_t epoch = step < 0 ? 0 : 1 + (uint64_t)step / p->move_every;
    for (uint32_t a = 0; a < A; a++) idx[a] = perm[(epoch * A + a) % S];
    return A;
}

uint32_t flx_synth_needles(const flx_synth_t *syn, uint32_t layer, uint32_t q_head, int32_t step, uint32_t *begin,
                           uint32_t *end, uint32_t max)
{
    if (!syn || layer >= syn->p.n_layers || q_head >= syn->p.n_q_heads || step < -1 ||
        (step >= 0 && (uint32_t)step >= syn->p.n_steps) || !head_is_retrieval(syn, layer, q_head) ||
        syn->p.needles_active == 0)
        return 0;
    uint32_t b[1024], idx[1024];
    sites(syn, layer, q_head, b);
    uint32_t n = active(syn, layer, q_head, step, idx), w = 0;
    for (uint32_t a = 0; a < n && w < max; a++, w++) {
        begin[w] = b[idx[a]];
        end[w] = b[idx[a]] + syn->p.needle_len;
    }
    return w;
}

/* ---- generation ---- */

/* A unit vector in the structural dims (pairs [nr, half) in both halves), optionally orthogonal
 * to `against` (unit). */
static void struct_dir(const flx_synth_t *s, flx_rng_t *r, float *u, const float *against)
{
    const uint32_t D = s->p.head_dim, half = D / 2, nr = s->n_rec_pairs;
    memset(u, 0, D * sizeof *u);
    fill_normal(r, u + nr, half - nr, 1.0f);
    fill_normal(r, u + half + nr, half - nr, 1.0f);
    if (against) {
        double d = 0;
        for (uint32_t i = 0; i < D; i++) d += (double)u[i] * against[i];
        for (uint32_t i = 0; i < D; i++) u[i] -= (float)d * against[i];
    }
    double n2 = 0;
    for (uint32_t i = 0; i < D; i++) n2 += (double)u[i] * u[i];
    float inv = (float)(1.0 / sqrt(n2 > 0 ? n2 : 1));
    for (uint32_t i = 0; i < D; i++) u[i] *= inv;
}

/* The recency vector: equal amplitude 1/sqrt(nr) in each recency pair, random phase. */
static void rec_dir(const flx_synth_t *s, flx_rng_t *r, float *u)
{
    const uint32_t D = s->p.head_dim, half = D / 2, nr = s->n_rec_pairs;
    memset(u, 0, D * sizeof *u);
    const float a = 1.0f / sqrtf((float)nr);
    for (uint32_t i = 0; i < nr; i++) {
        double ph = 6.283185307179586 * flx_rng_uniform(r);
        u[i] = a * (float)cos(ph);
        u[i + half] = a * (float)sin(ph);
    }
}

static void rope(const flx_synth_t *s, float *x, double pos)
{
    const uint32_t half = s->p.head_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        double a = pos * s->inv_freq[i];
        float c = (float)cos(a), sn = (float)sin(a);
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * sn;
        x[i + half] = x0 * sn + x1 * c;
    }
}

/* x -= its components along the nb orthonormal rows of basis (D each), one row after the other. */
static void project_out(float *x, const float *basis, uint32_t nb, uint32_t D)
{
    for (uint32_t m = 0; m < nb; m++) {
        const float *c = basis + (size_t)m * D;
        double d = 0;
        for (uint32_t i = 0; i < D; i++) d += (double)x[i] * c[i];
        for (uint32_t i = 0; i < D; i++) x[i] -= (float)d * c[i];
    }
}

/* Head h's strength of one component: the knob plus head_jitter * N(0, 1) in score units, floored at a
 * fifth of the knob. Additive, so a head's mass share moves by the same factor at every prompt length
 * (the sink and needle knobs grow with ln L; a relative spread would grow with them). */
static float jittered(const flx_synth_t *s, float strength, uint32_t layer, uint32_t h, uint32_t what)
{
    flx_rng_t r;
    stream(&r, s->p.seed, layer, h, P_JITTER, what);
    float x = strength + s->p.head_jitter * (float)flx_rng_normal(&r);
    return x > 0.2f * strength ? x : 0.2f * strength;
}

float flx_synth_value_norm(const flx_synth_t *syn, uint32_t layer)
{
    const flx_synth_params_t *p = &syn->p;
    float depth = p->n_layers > 1 ? (float)layer / (float)(p->n_layers - 1) : 0.0f;
    return p->value_norm_base * (1.0f + p->value_norm_growth * depth);
}

typedef struct synth_job {
    const flx_synth_t *syn;
    uint32_t layer;
    float *cs;            /* (T, D) cos | sin per position */
    flx_bf16_t *k, *v;
    float *q;
} synth_job_t;

static flx_status_t rope_table(void *ctx, const flx_pool_worker_t *w, uint64_t t0, uint64_t t1)
{
    (void)w;
    const synth_job_t *j = ctx;
    const uint32_t D = j->syn->p.head_dim, half = D / 2;
    for (uint64_t t = t0; t < t1; t++)
        for (uint32_t i = 0; i < half; i++) {
            double a = (double)t * j->syn->inv_freq[i];
            j->cs[t * D + i] = (float)cos(a);
            j->cs[t * D + half + i] = (float)sin(a);
        }
    return FLX_OK;
}

/* kv group g: its keys and values, and the queries of its heads; every random stream is keyed by
 * (seed, layer, head or group, purpose), so groups are independent of each other and of who runs
 * them. */
static flx_status_t synth_group(const synth_job_t *job, uint32_t g)
{
    const flx_synth_t *syn = job->syn;
    const flx_synth_params_t *p = &syn->p;
    const uint32_t layer = job->layer, D = p->head_dim, half = D / 2, gs = p->n_q_heads / p->n_kv_heads;
    const uint32_t T = p->prompt_len + p->n_steps, R = p->n_steps + 1, S = p->needle_sites;
    const float sqd = sqrtf((float)D), vnorm = flx_synth_value_norm(syn, layer);
    const float *cs = job->cs;
    flx_bf16_t *k = job->k, *v = job->v;
    float *q = job->q;
    float *work = malloc(((size_t)(5 + 3 * gs * S) * D + (size_t)gs * S * 2) * sizeof *work);
    if (!work) return FLX_ERR_NOMEM;
    float *us = work, *ur = us + D, *x = ur + D, *y = x + D;
    float *ndir = y + D, *vdir = ndir + (size_t)gs * S * D;
    float *basis = vdir + (size_t)gs * S * D;                  /* (1 + gs S, D) orthonormal */
    uint32_t *sb = (uint32_t *)(basis + (size_t)(1 + gs * S) * D); /* (gs, S) site begins */
    uint8_t ret[1024];
    flx_rng_t r;
    stream(&r, p->seed, layer, g, P_SINKDIR, 0);
    struct_dir(syn, &r, us, NULL);
    stream(&r, p->seed, layer, g, P_RECDIR, 0);
    rec_dir(syn, &r, ur);
    for (uint32_t j = 0; j < gs; j++) {
        uint32_t h = g * gs + j;
        ret[j] = (uint8_t)head_is_retrieval(syn, layer, h);
        if (!ret[j] || !S) continue;
        sites(syn, layer, h, sb + (size_t)j * S);
        stream(&r, p->seed, layer, h, P_NDIR, 0);
        for (uint32_t k2 = 0; k2 < S; k2++) struct_dir(syn, &r, ndir + ((size_t)j * S + k2) * D, us);
        stream(&r, p->seed, layer, h, P_VDIR, 0);
        for (uint32_t k2 = 0; k2 < S; k2++) {
            float *w = vdir + ((size_t)j * S + k2) * D;
            fill_normal(&r, w, D, 1.0f);
            double n2 = 0;
            for (uint32_t i = 0; i < D; i++) n2 += (double)w[i] * w[i];
            for (uint32_t i = 0; i < D; i++) w[i] *= (float)(1.0 / sqrt(n2));
        }
    }
    /* The directions a query of this group is matched along after RoPE: w_0 = the sink direction
     * (token 0 is never rotated) and, per needle site, its direction rotated to the span's
     * centre c. They are made orthonormal in that rotated frame (Gram-Schmidt; the site's
     * pre-RoPE key direction becomes R(-c) w, so its keys lie along R(t - c) w ~ w inside the
     * span), and query noise is kept out of their span. Without this, rotation leaves every
     * structural component overlapping the others by ~1/sqrt(structural dims), and noise
     * against a key of amplitude KEY_AMP sqrt(D) scores with std KEY_AMP: sink and needle
     * scores would swing by several units from step to step, which real sinks and retrieval
     * matches do not. */
    uint32_t nb = 0;
    for (uint32_t j = 0; j <= gs * S; j++) {
        float *b = basis + (size_t)nb * D, *u = NULL;
        double c = 0;
        if (j == 0) {
            memcpy(b, us, D * sizeof *b);
        } else {
            uint32_t hj = (j - 1) / S, k2 = (j - 1) % S;
            if (!ret[hj]) continue;
            u = ndir + ((size_t)hj * S + k2) * D;
            c = sb[(size_t)hj * S + k2] + 0.5 * (p->needle_len - 1);
            memcpy(b, u, D * sizeof *b);
            rope(syn, b, c);
        }
        project_out(b, basis, nb, D);
        double n2 = 0;
        for (uint32_t i = 0; i < D; i++) n2 += (double)b[i] * b[i];
        if (n2 < 1e-6) continue;   /* more sites than structural dimensions: keep u as drawn */
        for (uint32_t i = 0; i < D; i++) b[i] *= (float)(1.0 / sqrt(n2));
        if (u) {
            memcpy(u, b, D * sizeof *u);
            rope(syn, u, -c);
        }
        nb++;
    }
    /* the projection removes nb of D noise dimensions; rescale to keep the bulk z-score spread */
    const float noise_scale = nb < D ? sqrtf((float)D / (float)(D - nb)) : 1.0f;
    const float amp = KEY_AMP * sqd;
    /* keys and values, token by token (streams split per 4096-token chunk would also work; one
     * stream per head keeps it simple and thread-count independent) */
    flx_rng_t rk, rv;
    stream(&rk, p->seed, layer, g, P_KEY, 0);
    stream(&rv, p->seed, layer, g, P_VAL, 0);
    const float rec_amp = amp;
    const float coh = p->needle_value_coherence, incoh = sqrtf(1.0f - coh * coh);
    for (uint32_t t = 0; t < T; t++) {
        fill_normal(&rk, x, D, 1.0f);
        /* sink tokens carry no recency: the sink's score must not swing with the query's
         * position (real sinks are stable), which the recency kernel at distance ~pos would do */
        if (t >= p->n_sink_tokens)
            for (uint32_t i = 0; i < D; i++) x[i] += rec_amp * ur[i];
        float sv = 1.0f;
        if (t < p->n_sink_tokens) {
            float a = amp * (t == 0 ? 1.0f : p->sink_tail);
            for (uint32_t i = 0; i < D; i++) x[i] += a * us[i];
            sv = p->sink_value_scale;
        }
        fill_normal(&rv, y, D, vnorm * sv / sqd);
        if (S && t >= p->host_begin && t < p->prompt_len - p->host_end_margin)
            for (uint32_t j = 0; j < gs; j++) {
                if (!ret[j]) continue;
                for (uint32_t k2 = 0; k2 < S; k2++) {
                    uint32_t b = sb[(size_t)j * S + k2];
                    if (t < b || t >= b + p->needle_len) continue;
                    const float *u = ndir + ((size_t)j * S + k2) * D, *w = vdir + ((size_t)j * S + k2) * D;
                    for (uint32_t i = 0; i < D; i++) {
                        x[i] += amp * u[i];
                        y[i] = incoh * y[i] + coh * vnorm * w[i];
                    }
                }
            }
        const float *c = cs + (size_t)t * D, *sn = c + half;
        flx_bf16_t *kr = k + ((size_t)g * T + t) * D, *vr = v + ((size_t)g * T + t) * D;
        for (uint32_t i = 0; i < half; i++) {
            float x0 = x[i], x1 = x[i + half];
            kr[i] = flx_f32_to_bf16(x0 * c[i] - x1 * sn[i]);
            kr[i + half] = flx_f32_to_bf16(x0 * sn[i] + x1 * c[i]);
        }
        flx_f32_to_bf16_row(y, vr, D);
    }
    /* queries: RoPE(pos) of (noise + recency), plus structural components aimed at their
     * targets (sink at position 0, each active needle at its span's centre) */
    for (uint32_t j = 0; j < gs; j++) {
        uint32_t h = g * gs + j;
        float s_sink = jittered(syn, p->sink_strength, layer, h, 0);
        float s_rec = jittered(syn, p->recent_strength, layer, h, 1);
        float s_ndl = jittered(syn, p->needle_strength, layer, h, 2);
        flx_rng_t rq;
        stream(&rq, p->seed, layer, h, P_QRY, 0);
        for (uint32_t row = 0; row < R; row++) {
            int32_t step = (int32_t)row - 1;
            double pos = (double)p->prompt_len + step;
            float *qr = q + ((size_t)h * R + row) * D;
            fill_normal(&rq, qr, D, p->noise);
            rope(syn, qr, pos);
            project_out(qr, basis, nb, D);
            for (uint32_t i = 0; i < D; i++) qr[i] *= noise_scale;
            for (uint32_t i = 0; i < D; i++) x[i] = s_rec / KEY_AMP * ur[i];
            rope(syn, x, pos);
            for (uint32_t i = 0; i < D; i++) qr[i] += x[i];
            for (uint32_t i = 0; i < D; i++) qr[i] += s_sink / KEY_AMP * us[i];
            if (!ret[j] || !S || !p->needles_active) continue;
            uint32_t idx[1024];
            uint32_t na = active(syn, layer, h, step, idx);
            for (uint32_t a = 0; a < na; a++) {
                memcpy(x, ndir + ((size_t)j * S + idx[a]) * D, D * sizeof *x);
                rope(syn, x, sb[(size_t)j * S + idx[a]] + 0.5 * (p->needle_len - 1));
                for (uint32_t i = 0; i < D; i++) qr[i] += s_ndl / KEY_AMP * x[i];
            }
        }
    }
    free(work);
    return FLX_OK;
}

static flx_status_t synth_groups(void *ctx, const flx_pool_worker_t *w, uint64_t g0, uint64_t g1)
{
    (void)w;
    for (uint64_t g = g0; g < g1; g++) {
        flx_status_t st = synth_group(ctx, (uint32_t)g);
        if (st) return st;
    }
    return FLX_OK;
}

flx_status_t flx_synth_layer(const flx_synth_t *syn, uint32_t layer, flx_bf16_t *k, flx_bf16_t *v, float *q,
                             flx_pool_h pool)
{
    if (!syn || !k || !v || !q) return flx_error_set(FLX_ERR_INVALID, "synth layer: NULL argument");
    const flx_synth_params_t *p = &syn->p;
    if (layer >= p->n_layers) return flx_error_set(FLX_ERR_INVALID, "synth layer %u out of range (n_layers %u)", layer, p->n_layers);
    const uint32_t D = p->head_dim, T = p->prompt_len + p->n_steps;
    const uint32_t n_rows = FLX_MAX(T, 1u);
    /* cos/sin table of every position, shared by the heads */
    float *cs = malloc((size_t)n_rows * D * sizeof *cs);
    if (!cs) return flx_error_set(FLX_ERR_NOMEM, "synth layer: rope table of %u positions", T);
    synth_job_t j = {syn, layer, cs, k, v, q};
    flx_status_t st = flx_pool_for(pool, T, 1024, rope_table, &j);
    if (!st) st = flx_pool_for(pool, p->n_kv_heads, 1, synth_groups, &j);
    free(cs);
    if (st) return flx_error_set(st, "synth layer %u: out of memory", layer);
    return FLX_OK;
}
