/*
 * attn_task.c - plan/workspace, argument checks, top-k, LSE merge and the per-group task.
 *
 * DESIGN
 * The task is window attention -> (scoring -> top-k per head) -> sparse attention over the union
 * of the heads' blocks -> merge, all in the caller's workspace. FULL skips scoring and reads every
 * host block through the sparse driver with an all-heads mask; FIXED is SPARSE with one budget.
 * Top-k finds the k-th largest score tau by a three-way quickselect on the values, then takes
 * every index above tau and the lowest indices equal to tau: the set of the strict total order
 * (score desc, index asc), unique; the pivot comes from a fixed xorshift sequence (deterministic,
 * expected O(n) on any input not built against that sequence).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_internal.h"
#include "flx/util.h"

int flx_attn_blk_level(uint32_t blk)
{
    switch (blk) {
    case 16: return 0;
    case 32: return 1;
    case 64: return 2;
    case 128: return 3;
    default: return -1;
    }
}

uint32_t flx_attn_budget_blocks(float bgt, uint32_t l_cpu, uint32_t blk)
{
    uint32_t n = (l_cpu + blk - 1) / blk;
    if (!(bgt > 0)) return 0;
    double k = ceil((double)bgt * (double)l_cpu / (double)blk);
    return k >= n ? n : (uint32_t)k;
}

static flx_status_t check_shape(const flx_attn_shape_t *s)
{
    if (!s) return flx_error_set(FLX_ERR_INVALID, "attn plan: shape is NULL");
    if (s->group == 0 || s->group > FLX_ATTN_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "attn plan: group %u not in 1..%d", s->group, FLX_ATTN_MAX_GROUP);
    if (s->head_dim == 0 || s->head_dim % 16 || s->head_dim > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "attn plan: head_dim %u not a multiple of 16 in 16..%d", s->head_dim,
                             FLX_ATTN_MAX_HEAD_DIM);
    if (s->n_threads > 1024)
        return flx_error_set(FLX_ERR_INVALID, "attn plan: n_threads %u above 1024", s->n_threads);
    return FLX_OK;
}

static uint32_t resolve_threads(uint32_t n)
{
#ifdef _OPENMP
    if (n == 0) n = (uint32_t)omp_get_max_threads();
#endif
    return n ? n : 1;
}

/* One carving routine for the size-only pass (mem NULL) and the real one. */
static size_t carve(flx_attn_ws_t *ws, const flx_attn_shape_t *s, void *mem, size_t bytes)
{
    flx_arena_t a;
    flx_arena_init(&a, mem, bytes);
    size_t G = s->group, D = s->head_dim, T = resolve_threads(s->n_threads);
    size_t n = FLX_DIV_UP((size_t)s->max_l_cpu, 16) + 1;
    ws->q_f32 = flx_arena_alloc(&a, G * 2 * D * sizeof(float));
    ws->q_hi = flx_arena_alloc(&a, G * 2 * D * sizeof(flx_bf16_t));
    ws->q_lo = flx_arena_alloc(&a, G * 2 * D * sizeof(flx_bf16_t));
    ws->scores = flx_arena_alloc(&a, G * n * sizeof(float));
    ws->sel = flx_arena_alloc(&a, G * n * sizeof(uint32_t));
    ws->k = flx_arena_alloc(&a, G * sizeof(uint32_t));
    ws->mask = flx_arena_alloc(&a, n * sizeof(uint64_t));
    ws->list = flx_arena_alloc(&a, n * sizeof(uint32_t));
    ws->part = flx_arena_alloc(&a, T * G * (D + 16) * sizeof(float));
    ws->o_win = flx_arena_alloc(&a, G * D * sizeof(float));
    ws->lse_win = flx_arena_alloc(&a, G * sizeof(float));
    ws->shape = *s;
    ws->shape.n_threads = (uint32_t)T;
    ws->n_max = (uint32_t)n;
    return a.used + FLX_CACHELINE;   /* room to align an unaligned start */
}

flx_status_t flx_attn_plan(const flx_attn_shape_t *shape, size_t *ws_bytes_p)
{
    flx_status_t st = check_shape(shape);
    if (st) return st;
    if (!ws_bytes_p) return flx_error_set(FLX_ERR_INVALID, "attn plan: ws_bytes_p is NULL");
    flx_attn_ws_t tmp;
    *ws_bytes_p = carve(&tmp, shape, NULL, 0);
    return FLX_OK;
}

flx_status_t flx_attn_ws_init(flx_attn_ws_t *ws, const flx_attn_shape_t *shape, void *mem, size_t bytes)
{
    flx_status_t st = check_shape(shape);
    if (st) return st;
    if (!ws || !mem) return flx_error_set(FLX_ERR_INVALID, "attn ws_init: NULL workspace or memory");
    size_t need;
    flx_attn_plan(shape, &need);
    if (bytes < need)
        return flx_error_set(FLX_ERR_INVALID, "attn ws_init: %zu bytes given, plan needs %zu", bytes, need);
    uintptr_t p = (uintptr_t)mem, al = FLX_ALIGN_UP(p, FLX_CACHELINE);
    carve(ws, shape, (void *)al, bytes - (al - p));
    return FLX_OK;
}

flx_status_t flx_attn_check_view(const flx_kv_head_view_t *v, const char *who)
{
    if (!v) return flx_error_set(FLX_ERR_INVALID, "%s: view is NULL", who);
    if (v->head_dim == 0 || v->head_dim % 16 || v->head_dim > FLX_ATTN_MAX_HEAD_DIM)
        return flx_error_set(FLX_ERR_INVALID, "%s: view head_dim %u not a multiple of 16 in 16..%d", who, v->head_dim,
                             FLX_ATTN_MAX_HEAD_DIM);
    if (v->n_blocks != FLX_DIV_UP(v->l_cpu, 16))
        return flx_error_set(FLX_ERR_INVALID, "%s: view n_blocks %u != ceil(l_cpu %u / 16)", who, v->n_blocks, v->l_cpu);
    if (v->l_cpu && (!v->block_table || !v->pool_base || v->block_bytes < (size_t)64 * v->head_dim))
        return flx_error_set(FLX_ERR_INVALID, "%s: view has l_cpu %u but no block table/pool", who, v->l_cpu);
    if (v->n_win > v->win_cap)
        return flx_error_set(FLX_ERR_INVALID, "%s: view n_win %u above win_cap %u", who, v->n_win, v->win_cap);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++)
        if (v->meta_n[j] != flx_kv_meta_count(v->l_cpu, j))
            return flx_error_set(FLX_ERR_INVALID, "%s: view meta_n[%d] %u != ceil(l_cpu %u / %u)", who, j, v->meta_n[j],
                                 v->l_cpu, 16u << j);
    return FLX_OK;
}

flx_status_t flx_attn_check_sel(const flx_kv_head_view_t *view, int level, uint32_t G, const uint32_t *sel,
                                uint32_t sel_stride, const uint32_t *k, const char *who)
{
    if (level < 0 || level >= FLX_KV_META_LEVELS || !k)
        return flx_error_set(FLX_ERR_INVALID, "%s: level %d or k missing", who, level);
    uint32_t n = flx_kv_meta_count(view->l_cpu, level);
    uint8_t *seen = calloc((size_t)n + 1, 1);
    FLX_CORRUPTION(!seen);
    flx_status_t st = FLX_OK;
    for (uint32_t h = 0; h < G && !st; h++) {
        if (k[h] > n) {
            st = flx_error_set(FLX_ERR_INVALID, "%s: k[%u] = %u exceeds %u blocks", who, h, k[h], n);
            break;
        }
        if (k[h] && !sel) {
            st = flx_error_set(FLX_ERR_INVALID, "%s: sel is NULL but k[%u] = %u", who, h, k[h]);
            break;
        }
        memset(seen, 0, n);
        for (uint32_t i = 0; i < k[h]; i++) {
            uint32_t b = sel[(size_t)h * sel_stride + i];
            if (b >= n) {
                st = flx_error_set(FLX_ERR_INVALID, "%s: head %u block index %u out of range (n %u)", who, h, b, n);
                break;
            }
            if (seen[b]++) {
                st = flx_error_set(FLX_ERR_INVALID, "%s: head %u selects block %u twice", who, h, b);
                break;
            }
        }
    }
    free(seen);
    return st;
}

/* ---------------- top-k ---------------- */

static inline float rank_key(float x)
{
    return x != x ? -INFINITY : x;
}

static inline uint64_t xs_next(uint64_t *rs)
{
    *rs ^= *rs << 13;
    *rs ^= *rs >> 7;
    *rs ^= *rs << 17;
    return *rs;
}

/* Value of rank `target` (0 = largest) among f[0..n), three-way quickselect; permutes f. */
static float select_desc(float *f, uint32_t n, uint32_t target, uint64_t *rs)
{
    uint32_t lo = 0, hi = n;
    for (;;) {
        float pv = f[lo + (uint32_t)(xs_next(rs) % (hi - lo))];
        uint32_t lt = lo, i = lo, gt = hi;   /* [lo, lt) > pv, [lt, i) == pv, [gt, hi) < pv */
        while (i < gt) {
            float x = f[i];
            if (x > pv) {
                f[i++] = f[lt];
                f[lt++] = x;
            } else if (x < pv) {
                f[i] = f[--gt];
                f[gt] = x;
            } else {
                i++;
            }
        }
        if (target < lt) hi = lt;
        else if (target < gt) return pv;
        else lo = gt;
    }
}

/*
 * Threshold selection. tau = the k-th largest key (NaN -> -inf) is found on a candidate set: a
 * deterministic sample of 128 keys gives a cut t a few standard deviations below the expected
 * k-th key, one pass copies keys >= t (as floats, into idx's own memory), and a three-way
 * quickselect on them finds tau (if the cut missed, on all keys). Then every index with key > tau
 * is taken, followed by the lowest indices with key == tau until k. Streaming passes plus an
 * expected O(n) select; the result does not depend on the sample (only the speed does).
 */
flx_status_t flx_topk(const float *scores, uint32_t n, uint32_t k, uint32_t *idx)
{
    if ((!scores && n) || (!idx && n) || k > n)
        return flx_error_set(FLX_ERR_INVALID, "topk: k %u of n %u", k, n);
    if (k == 0) return FLX_OK;
    if (k == n) {
        for (uint32_t i = 0; i < n; i++) idx[i] = i;
        return FLX_OK;
    }
    float *f = (float *)idx;   /* scratch in idx's memory (the project builds with -fno-strict-aliasing) */
    uint64_t rs = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n << 32 | k);
    float tau;
    uint32_t m = 0;
    enum { S = 128 };
    if (n >= 4 * S) {
        float smp[S];
        for (uint32_t i = 0; i < S; i++) smp[i] = rank_key(scores[(uint64_t)i * n / S]);
        double r = (double)k * S / n;
        uint32_t rr = (uint32_t)(r + 3.0 * sqrt(r + 1.0) + 4.0);
        float t = rr < S ? select_desc(smp, S, rr, &rs) : -INFINITY;
        if (t > -INFINITY) {
            for (uint32_t i = 0; i < n; i++) {
                float x = rank_key(scores[i]);
                f[m] = x;
                m += x >= t;
            }
        }
        if (m < k) m = 0;   /* the cut missed: select on all keys */
    }
    if (m) {
        tau = select_desc(f, m, k - 1, &rs);
    } else {
        for (uint32_t i = 0; i < n; i++) f[i] = rank_key(scores[i]);
        tau = select_desc(f, n, k - 1, &rs);
    }
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        idx[c] = i;
        c += rank_key(scores[i]) > tau;
    }
    for (uint32_t i = 0; i < n && c < k; i++)
        if (rank_key(scores[i]) == tau) idx[c++] = i;
    return FLX_OK;
}

/* ---------------- merge ---------------- */

void flx_attn_merge(uint32_t G, uint32_t D, const float *o_a, const float *lse_a, const float *o_b,
                    const float *lse_b, float *o, float *lse)
{
    for (uint32_t h = 0; h < G; h++) {
        float la = lse_a[h], lb = lse_b[h];
        float m = la > lb ? la : lb;
        const float *oa = o_a + (size_t)h * D, *ob = o_b + (size_t)h * D;
        float *oh = o + (size_t)h * D;
        if (m == -INFINITY) {   /* both parts empty */
            for (uint32_t d = 0; d < D; d++) oh[d] = 0;
            lse[h] = -INFINITY;
            continue;
        }
        float wa = la == -INFINITY ? 0.0f : expf(la - m), wb = lb == -INFINITY ? 0.0f : expf(lb - m);
        float inv = 1.0f / (wa + wb);
        float ca = wa * inv, cb = wb * inv;
        for (uint32_t d = 0; d < D; d++)
            oh[d] = (ca ? ca * oa[d] : 0.0f) + (cb ? cb * ob[d] : 0.0f);
        lse[h] = m + logf(wa + wb);
    }
}

/* ---------------- the task ---------------- */

static flx_status_t check_cfg(const flx_attn_ws_t *ws, const flx_attn_cfg_t *cfg, int *level_p)
{
    if (!cfg) return flx_error_set(FLX_ERR_INVALID, "attn task: cfg is NULL");
    if (cfg->mode == FLX_ATTN_FULL) {
        *level_p = 0;
        return FLX_OK;
    }
    if (cfg->mode != FLX_ATTN_SPARSE && cfg->mode != FLX_ATTN_FIXED)
        return flx_error_set(FLX_ERR_INVALID, "attn task: unknown mode %d", (int)cfg->mode);
    int level = flx_attn_blk_level(cfg->blk);
    if (level < 0)
        return flx_error_set(FLX_ERR_INVALID, "attn task: blk %u not one of 16, 32, 64, 128", cfg->blk);
    if (cfg->mode == FLX_ATTN_FIXED) {
        if (!(cfg->budget >= 0.0f && cfg->budget <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "attn task: budget %g not in [0, 1]", (double)cfg->budget);
    } else {
        if (!cfg->budgets) return flx_error_set(FLX_ERR_INVALID, "attn task: SPARSE mode needs budgets");
        for (uint32_t h = 0; h < ws->shape.group; h++)
            if (!(cfg->budgets[h] >= 0.0f && cfg->budgets[h] <= 1.0f))
                return flx_error_set(FLX_ERR_INVALID, "attn task: budget of head %u is %g, not in [0, 1]", h,
                                     (double)cfg->budgets[h]);
    }
    *level_p = level;
    return FLX_OK;
}

static flx_status_t check_task(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                               float *lse, const char *who)
{
    flx_status_t st = flx_attn_check_view(view, who);
    if (st) return st;
    if (!ws || !q || !o || !lse) return flx_error_set(FLX_ERR_INVALID, "%s: NULL argument", who);
    if (view->head_dim != ws->shape.head_dim)
        return flx_error_set(FLX_ERR_INVALID, "%s: view head_dim %u differs from the workspace's D %u", who,
                             view->head_dim, ws->shape.head_dim);
    if (view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "%s: view l_cpu %u above the planned max_l_cpu %u", who, view->l_cpu,
                             ws->shape.max_l_cpu);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++)
        if (view->meta_n[j] && !view->meta[j])
            return flx_error_set(FLX_ERR_INVALID, "%s: view metadata level %d missing", who, j);
    return FLX_OK;
}

flx_status_t flx_attn_host_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                               const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing)
{
    int level;
    flx_status_t st = check_task(ws, view, q, o, lse, "attn host_run");
    if (st || (st = check_cfg(ws, cfg, &level))) return st;
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    uint64_t t0 = flx_now_ns(), t1, t2, ts = 0, bytes = 0;
    if (cfg->mode == FLX_ATTN_FULL) {
        t1 = t0;
        st = flx_attn_task_full_host(ws, view, q, o, lse, &bytes);
    } else {
        uint32_t blk = 16u << level, n = view->meta_n[level];
        int any = 0, all = 1;
        for (uint32_t h = 0; h < G; h++) {
            float b = cfg->mode == FLX_ATTN_FIXED ? cfg->budget : cfg->budgets[h];
            ws->k[h] = flx_attn_budget_blocks(b, view->l_cpu, blk);
            any |= ws->k[h] > 0;
            all &= ws->k[h] == n;
        }
        if (any && !all) {
            if ((st = flx_attn_score(ws, view, level, q, ws->scores))) return st;
            ts = flx_now_ns();
            uint32_t *sel = ws->sel;
            const float *scores = ws->scores;
            uint32_t nmax = ws->n_max;
            const uint32_t *kk = ws->k;
            int nt = (int)ws->shape.n_threads;
#ifdef FLX_TSAN
            nt = 1;
#endif
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
            for (uint32_t h = 0; h < G; h++)
                flx_topk(scores + (size_t)h * n, n, kk[h], sel + (size_t)h * nmax);
        } else {
            for (uint32_t h = 0; h < G; h++)
                for (uint32_t i = 0; i < ws->k[h]; i++) ws->sel[(size_t)h * ws->n_max + i] = i;
        }
        if (timing) timing->score_bytes = any && !all ? (uint64_t)n * 2 * D * sizeof(flx_bf16_t) : 0;
        t1 = flx_now_ns();
        st = flx_attn_task_sparse(ws, view, level, q, o, lse, &bytes);
    }
    t2 = flx_now_ns();
    if (st) return st;
    if (timing) {
        if (cfg->mode == FLX_ATTN_FULL) timing->score_bytes = 0;
        timing->score_ns = ts ? ts - t0 : 0;
        timing->topk_ns = ts ? t1 - ts : t1 - t0;
        timing->attn_ns = t2 - t1;
        timing->attn_bytes = bytes;
    }
    return FLX_OK;
}

flx_status_t flx_attn_group_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing)
{
    int level;
    flx_status_t st = check_task(ws, view, q, o, lse, "attn group_run");
    if (st || (st = check_cfg(ws, cfg, &level))) return st;
    if (view->n_win && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "attn group_run: n_win %u but no window arrays", view->n_win);
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    uint64_t t0 = flx_now_ns();
    if ((st = flx_attn_window(ws, view, q, ws->o_win, ws->lse_win))) return st;
    uint64_t t1 = flx_now_ns();
    if ((st = flx_attn_host_run(ws, view, q, cfg, o, lse, timing))) return st;
    uint64_t t2 = flx_now_ns();
    flx_attn_merge(G, D, ws->o_win, ws->lse_win, o, lse, o, lse);
    if (timing) {
        timing->window_ns = t1 - t0;
        timing->merge_ns = flx_now_ns() - t2;
    }
    return FLX_OK;
}
