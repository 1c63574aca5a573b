/*
 * budget.c - least budgets and head labels (flx/budget.h).
 *
 * DESIGN
 * Per query head: one pass over the host tokens computes the exact dots <q, k_i> (kept in double,
 * they are the blk = 1 scores and every added token's logit), then for each granularity the
 * blocks are scored (Quest bound from the pyramid, computed like flx_attn_score_ref: double sum
 * rounded to float, so ties fall where the runtime's do) and put in a binary heap ordered by
 * (score desc, index asc, NaN last). Blocks are popped one at a time into a double online-softmax
 * accumulator seeded with the window partial, and the criterion is checked after each: the cost is
 * O(l_cpu D) for the dots, O(n) for the heap and O(D) per token actually added, so 128K-token
 * labels stay affordable. The first k that meets the criterion is taken (errors need not fall
 * monotonically). Heads are independent: a pool's workers take one head at a time (two runs:
 * the full outputs, whose largest norm the FLUXION criterion needs, then the searches); scratch is
 * allocated once per call and split per worker.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/budget.h"

const uint32_t FLX_LABEL_BLKS[FLX_LABEL_N_BLK] = {1, 16, 32, 64, 128};

const char *flx_crit_name(flx_crit_t c)
{
    switch (c) {
    case FLX_CRIT_FLUXION: return "fluxion";
    case FLX_CRIT_OUTPUT: return "output";
    case FLX_CRIT_SCORE: return "score";
    }
    return NULL;
}

void flx_label_fit(const float bgt[FLX_LABEL_N_BLK], float *bgt0, float *k)
{
    double b0 = bgt[0], num = 0, den = 0;
    for (int j = 1; j < FLX_LABEL_N_BLK; j++) {
        double x = log2((double)FLX_LABEL_BLKS[j]);
        num += x * ((double)bgt[j] - b0);
        den += x * x;
    }
    *bgt0 = (float)b0;
    *k = (float)(num / den);
}

/* Online-softmax state in double over D channels. */
typedef struct acc {
    double m, l;   /* running max logit, sum of e^{s - m} */
    double *o;     /* (D) sum of e^{s - m} v, unnormalised */
} acc_t;

static void acc_add(acc_t *a, uint32_t D, double s, const flx_bf16_t *v)
{
    if (s > a->m) {
        double c = isinf(a->m) ? 0.0 : exp(a->m - s);
        for (uint32_t d = 0; d < D; d++) a->o[d] *= c;
        a->l *= c;
        a->m = s;
    }
    double w = exp(s - a->m);
    a->l += w;
    for (uint32_t d = 0; d < D; d++) a->o[d] += w * flx_bf16_to_f32(v[d]);
}

static double acc_lse(const acc_t *a)
{
    return a->l > 0 ? a->m + log(a->l) : -INFINITY;
}

/* ||o_acc - ref|| with o_acc normalised (0 output when empty). */
static double acc_dist(const acc_t *a, uint32_t D, const double *ref)
{
    double e = 0;
    for (uint32_t d = 0; d < D; d++) {
        double x = (a->l > 0 ? a->o[d] / a->l : 0.0) - ref[d];
        e += x * x;
    }
    return sqrt(e);
}

static const flx_bf16_t *host_k(const flx_kv_head_view_t *v, uint32_t t)
{
    return flx_kv_block_k(v, t / FLX_KV_BLOCK_TOKENS) + (size_t)(t % FLX_KV_BLOCK_TOKENS) * v->head_dim;
}

static const flx_bf16_t *host_v(const flx_kv_head_view_t *v, uint32_t t)
{
    return flx_kv_block_v(v, t / FLX_KV_BLOCK_TOKENS) + (size_t)(t % FLX_KV_BLOCK_TOKENS) * v->head_dim;
}

static double dot_bf16(const float *q, const flx_bf16_t *k, uint32_t D)
{
    double s = 0;
    for (uint32_t d = 0; d < D; d++) s += (double)q[d] * flx_bf16_to_f32(k[d]);
    return s;
}

/* Window partial of one head into a (seeded accumulator). */
static void acc_window(acc_t *a, const flx_kv_head_view_t *v, const float *q, double scale)
{
    uint32_t D = v->head_dim;
    a->m = -INFINITY;
    a->l = 0;
    memset(a->o, 0, D * sizeof(double));
    for (uint32_t i = 0; i < v->n_win; i++)
        acc_add(a, D, scale * dot_bf16(q, v->win_k + (size_t)i * D, D), v->win_v + (size_t)i * D);
}

static flx_status_t check_views(const flx_kv_head_view_t *views, uint32_t Hq, uint32_t Hkv, const float *q,
                                const char *who)
{
    if (!views || !q) return flx_error_set(FLX_ERR_INVALID, "%s: views or q is NULL", who);
    if (Hkv == 0 || Hq == 0 || Hq % Hkv)
        return flx_error_set(FLX_ERR_INVALID, "%s: n_q_heads %u not a multiple of n_kv_heads %u", who, Hq, Hkv);
    const flx_kv_head_view_t *v0 = &views[0];
    uint32_t D = v0->head_dim;
    if (D == 0 || D % 16 || D > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "%s: head_dim %u not a multiple of 16 in 16..256", who, D);
    for (uint32_t g = 0; g < Hkv; g++) {
        const flx_kv_head_view_t *v = &views[g];
        if (v->head_dim != D || v->l_cpu != v0->l_cpu || v->n_win != v0->n_win)
            return flx_error_set(FLX_ERR_INVALID, "%s: view %u (head_dim %u, l_cpu %u, n_win %u) differs from view 0",
                                 who, g, v->head_dim, v->l_cpu, v->n_win);
        if ((v->n_win && (!v->win_k || !v->win_v)) || (v->l_cpu && (!v->block_table || !v->pool_base)))
            return flx_error_set(FLX_ERR_INVALID, "%s: view %u lacks window or block pointers", who, g);
        if (v->n_blocks != (v->l_cpu + 15) / 16)
            return flx_error_set(FLX_ERR_INVALID, "%s: view %u has %u blocks for l_cpu %u", who, g, v->n_blocks,
                                 v->l_cpu);
        for (int j = 0; j < FLX_KV_META_LEVELS && v->l_cpu; j++)
            if (!v->meta[j] || v->meta_n[j] != flx_kv_meta_count(v->l_cpu, j))
                return flx_error_set(FLX_ERR_INVALID, "%s: view %u pyramid level %d missing or of %u entries", who,
                                     g, j, v->meta_n[j]);
    }
    return FLX_OK;
}

/* Full output of head h (q of D), double: o (D), returns lse. a is scratch. */
static double full_head(const flx_kv_head_view_t *v, const float *q, acc_t *a, double *o)
{
    uint32_t D = v->head_dim;
    double scale = 1.0 / sqrt((double)D);
    acc_window(a, v, q, scale);
    for (uint32_t t = 0; t < v->l_cpu; t++) acc_add(a, D, scale * dot_bf16(q, host_k(v, t), D), host_v(v, t));
    for (uint32_t d = 0; d < D; d++) o[d] = a->l > 0 ? a->o[d] / a->l : 0.0;
    return acc_lse(a);
}

flx_status_t flx_full_output(const flx_kv_head_view_t *views, uint32_t n_q_heads, uint32_t n_kv_heads,
                             const float *q, float *o, float *onorm)
{
    flx_status_t st = check_views(views, n_q_heads, n_kv_heads, q, "full output");
    if (st) return st;
    if (!o || !onorm) return flx_error_set(FLX_ERR_INVALID, "full output: o or onorm is NULL");
    uint32_t D = views[0].head_dim, G = n_q_heads / n_kv_heads;
    double buf[2 * FLX_ATTN_MAX_HEAD_DIM], *od = buf + FLX_ATTN_MAX_HEAD_DIM;
    acc_t a = {.o = buf};
    for (uint32_t h = 0; h < n_q_heads; h++) {
        full_head(&views[h / G], q + (size_t)h * D, &a, od);
        double n2 = 0;
        for (uint32_t d = 0; d < D; d++) {
            o[(size_t)h * D + d] = (float)od[d];
            n2 += od[d] * od[d];
        }
        onorm[h] = (float)sqrt(n2);
    }
    return FLX_OK;
}

/* ---- block heap: max-heap on (score desc, index asc, NaN lowest) ---- */

typedef struct hent {
    float s;
    uint32_t i;
} hent_t;

static int better(hent_t a, hent_t b)
{
    if (isnan(a.s) != isnan(b.s)) return !isnan(a.s);
    if (a.s != b.s) return a.s > b.s;
    return a.i < b.i;
}

static void sift_down(hent_t *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && better(h[l], h[m])) m = l;
        if (r < n && better(h[r], h[m])) m = r;
        if (m == i) return;
        hent_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static hent_t heap_pop(hent_t *h, uint32_t *n)
{
    hent_t top = h[0];
    h[0] = h[--*n];
    sift_down(h, *n, 0);
    return top;
}

float flx_label_budget(uint32_t k, uint32_t l_cpu, uint32_t blk)
{
    if (k == 0 || l_cpu == 0) return 0.0f;
    double x = (double)k * blk / l_cpu;
    float b = x >= 1.0 ? 1.0f : (float)x;
    while (b > 0 && flx_attn_budget_blocks(b, l_cpu, blk) > k) b = nextafterf(b, 0.0f);
    while (b < 1.0f && flx_attn_budget_blocks(b, l_cpu, blk) < k) b = nextafterf(b, 1.0f);
    return b;
}

typedef struct head_ctx {
    flx_crit_t crit;
    double tau, norm;      /* FLUXION: max_h' ||o_h'||; OUTPUT: ||o_h|| */
    const double *o_full;  /* (D) */
    double lse_full;
} head_ctx_t;

/* Criterion error of the accumulator (SCORE: missing mass fraction). */
static double crit_err(const head_ctx_t *c, const acc_t *a, uint32_t D)
{
    if (c->crit == FLX_CRIT_SCORE) {
        if (isinf(c->lse_full)) return 0.0;
        return 1.0 - exp(acc_lse(a) - c->lse_full);
    }
    double e = acc_dist(a, D, c->o_full);
    return c->norm > 0 ? e / c->norm : (e > 0 ? INFINITY : 0.0);
}

/* SCORE: missing mass <= tau is mass >= 1 - tau; the output criteria: relative error <= tau. */
static int crit_ok(const head_ctx_t *c, double err)
{
    return err <= c->tau;
}

/* Least k at one granularity: blocks popped from heap hp (n entries) into a copy of the window
 * accumulator. dots (l_cpu) are the exact unscaled logits. */
static uint32_t least_k(const flx_kv_head_view_t *v, const head_ctx_t *c, const acc_t *win, acc_t *a, hent_t *hp,
                        uint32_t n, uint32_t blk, const double *dots)
{
    uint32_t D = v->head_dim, l_cpu = v->l_cpu;
    double scale = 1.0 / sqrt((double)D);
    a->m = win->m;
    a->l = win->l;
    memcpy(a->o, win->o, D * sizeof(double));
    uint32_t k = 0;
    while (n > 0) {
        hent_t e = heap_pop(hp, &n);
        uint32_t t1 = (e.i + 1) * blk < l_cpu ? (e.i + 1) * blk : l_cpu;
        for (uint32_t t = e.i * blk; t < t1; t++) acc_add(a, D, scale * dots[t], host_v(v, t));
        k++;
        if (crit_ok(c, crit_err(c, a, D))) return k;
    }
    return k;
}

typedef struct label_job {
    const flx_label_layer_in_t *in;
    flx_head_label_t *out;
    uint32_t G, D, l_cpu, nb;
    const uint32_t *blks;
    const int *slot;
    double *ofull, *lse_full;   /* (Hq, D), (Hq) */
    unsigned char *scratch;     /* (workers, per_thread) */
    size_t per_thread;
    double maxnorm;
    int want_fit;
} label_job_t;

static flx_status_t label_full(void *ctx, const flx_pool_worker_t *w, uint64_t h0, uint64_t h1)
{
    const label_job_t *j = ctx;
    const uint32_t D = j->D;
    for (uint64_t h = h0; h < h1; h++) {
        acc_t a = {.o = (double *)(j->scratch + (size_t)w->index * j->per_thread)};
        j->lse_full[h] = full_head(&j->in->views[h / j->G], j->in->q + (size_t)h * D, &a, j->ofull + (size_t)h * D);
    }
    return FLX_OK;
}

static flx_status_t label_heads(void *ctx, const flx_pool_worker_t *w, uint64_t h0, uint64_t h1)
{
    const label_job_t *j = ctx;
    const flx_label_layer_in_t *in = j->in;
    const uint32_t D = j->D, l_cpu = j->l_cpu;
    for (uint64_t h = h0; h < h1; h++) {
        unsigned char *sp = j->scratch + (size_t)w->index * j->per_thread;
        acc_t win = {.o = (double *)sp}, a = {.o = (double *)sp + D};
        double *dots = (double *)sp + 3 * D;
        hent_t *hp = (hent_t *)(dots + l_cpu);
        const flx_kv_head_view_t *v = &in->views[h / j->G];
        const float *q = in->q + (size_t)h * D;
        const double *of = j->ofull + (size_t)h * D;
        double on = 0;
        for (uint32_t d = 0; d < D; d++) on += of[d] * of[d];
        head_ctx_t c = {.crit = in->crit, .tau = in->tau, .o_full = of, .lse_full = j->lse_full[h],
                        .norm = in->crit == FLX_CRIT_FLUXION ? j->maxnorm : sqrt(on)};
        flx_head_label_t lab;
        memset(&lab, 0, sizeof lab);
        acc_window(&win, v, q, 1.0 / sqrt((double)D));
        lab.err_window = (float)crit_err(&c, &win, D);
        lab.streaming = (uint8_t)crit_ok(&c, lab.err_window);
        if (!lab.streaming) {
            for (uint32_t t = 0; t < l_cpu; t++) dots[t] = dot_bf16(q, host_k(v, t), D);
            for (uint32_t jj = 0; jj < j->nb; jj++) {
                uint32_t blk = j->blks[jj], n;
                if (blk == 1) {
                    n = l_cpu;
                    for (uint32_t t = 0; t < n; t++) hp[t] = (hent_t){(float)dots[t], t};
                } else {
                    int lv = flx_attn_blk_level(blk);
                    const flx_bf16_t *meta = v->meta[lv];
                    n = v->meta_n[lv];
                    for (uint32_t b = 0; b < n; b++) {
                        const flx_bf16_t *mn = meta + (size_t)b * 2 * D, *mx = mn + D;
                        double s = 0;
                        for (uint32_t d = 0; d < D; d++) {
                            double x = (double)q[d] * flx_bf16_to_f32(mn[d]);
                            double y = (double)q[d] * flx_bf16_to_f32(mx[d]);
                            s += x > y ? x : y;
                        }
                        hp[b] = (hent_t){(float)s, b};
                    }
                }
                for (uint32_t i = n / 2; i-- > 0;) sift_down(hp, n, i);
                uint32_t k = least_k(v, &c, &win, &a, hp, n, blk, dots);
                lab.bgt[j->slot[jj]] = flx_label_budget(k, l_cpu, blk);
            }
            if (j->want_fit) flx_label_fit(lab.bgt, &lab.bgt0, &lab.k);
        }
        j->out[h] = lab;
    }
    return FLX_OK;
}

flx_status_t flx_label_layer(const flx_label_layer_in_t *in, flx_head_label_t *out)
{
    if (!in || !out) return flx_error_set(FLX_ERR_INVALID, "label layer: in or out is NULL");
    flx_status_t st = check_views(in->views, in->n_q_heads, in->n_kv_heads, in->q, "label layer");
    if (st) return st;
    if ((unsigned)in->crit > FLX_CRIT_SCORE) return flx_error_set(FLX_ERR_INVALID, "label layer: criterion %d unknown", (int)in->crit);
    if (!(in->tau > 0.0f && in->tau < 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "label layer: tau %g not in (0, 1)", (double)in->tau);
    const uint32_t *blks = in->blks ? in->blks : FLX_LABEL_BLKS;
    uint32_t nb = in->blks ? in->n_blk : FLX_LABEL_N_BLK;
    if (nb == 0 || nb > FLX_LABEL_N_BLK) return flx_error_set(FLX_ERR_INVALID, "label layer: n_blk %u not in 1..5", nb);
    int slot[FLX_LABEL_N_BLK];
    for (uint32_t j = 0; j < nb; j++) {
        slot[j] = -1;
        for (int i = 0; i < FLX_LABEL_N_BLK; i++)
            if (blks[j] == FLX_LABEL_BLKS[i]) slot[j] = i;
        for (uint32_t i = 0; i < j; i++)
            if (blks[i] == blks[j]) slot[j] = -1;
        if (slot[j] < 0)
            return flx_error_set(FLX_ERR_INVALID, "label layer: blk %u not one of 1, 16, 32, 64, 128 or repeated",
                                 blks[j]);
    }

    const uint32_t Hq = in->n_q_heads, G = Hq / in->n_kv_heads, D = in->views[0].head_dim;
    const uint32_t l_cpu = in->views[0].l_cpu;
    const uint32_t nt = flx_pool_size(in->pool);
    /* per head: o_full (D) + lse; per worker: 3 accumulators' o (D), dots (l_cpu), heap (l_cpu) */
    size_t per_thread = (size_t)3 * D * sizeof(double) + (size_t)l_cpu * (sizeof(double) + sizeof(hent_t));
    double *ofull = malloc((size_t)Hq * (D + 1) * sizeof(double));
    unsigned char *scratch = malloc((size_t)nt * per_thread + 16);
    if (!ofull || !scratch) {
        free(ofull);
        free(scratch);
        return flx_error_set(FLX_ERR_NOMEM, "label layer: no memory for %u heads of %u host tokens", Hq, l_cpu);
    }
    label_job_t j = {.in = in, .out = out, .G = G, .D = D, .l_cpu = l_cpu, .nb = nb, .blks = blks, .slot = slot,
                     .ofull = ofull, .lse_full = ofull + (size_t)Hq * D, .scratch = scratch, .per_thread = per_thread};
    st = flx_pool_for(in->pool, Hq, 1, label_full, &j);
    j.maxnorm = 0;
    for (uint32_t h = 0; h < Hq && !st; h++) {
        double n2 = 0;
        for (uint32_t d = 0; d < D; d++) n2 += ofull[(size_t)h * D + d] * ofull[(size_t)h * D + d];
        j.maxnorm = sqrt(n2) > j.maxnorm ? sqrt(n2) : j.maxnorm;
    }

    int have_blk1 = 0;
    for (uint32_t jj = 0; jj < nb; jj++) {
        have_blk1 |= slot[jj] == 0;
        j.want_fit |= slot[jj] > 0;
    }
    j.want_fit &= have_blk1;
    if (!st) st = flx_pool_for(in->pool, Hq, 1, label_heads, &j);
    free(ofull);
    free(scratch);
    return st;
}

