/*
 * attn_task.c - plan/workspace, argument checks, top-k, LSE merge and the per-group task.
 *
 * DESIGN
 * The task is (scoring -> top-k per head) -> the union of the heads' blocks, then chunks of window
 * and host attention, then the merges, all in the caller's workspace. FULL skips scoring and reads
 * every host block through the same chunks with an all-heads mask; FIXED is SPARSE with one
 * budget. The stages are public (flx_attn_task_begin / _chunk / _end) so that a scheduler can put
 * the chunks of many tasks on its workers; flx_attn_group_run and flx_attn_host_run are the same
 * stages with the chunks on the workspace's pool, so both paths give the same bits.
 * Top-k finds the k-th largest score tau by a three-way quickselect on the values, then takes
 * every index above tau and the lowest indices equal to tau: the set of the strict total order
 * (score desc, index asc), unique; the pivot comes from a fixed xorshift sequence (deterministic,
 * expected O(n) on any input not built against that sequence).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "attn_simd.h"
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
    /* A float budget stands for a decimal within 6e-8 of it, relative: 0.05f * 3200 / 16 must be
     * the 10 blocks 5 % means, not 11. Fractions of a block below 1e-6 of the count are that error. */
    const double x = (double)bgt * (double)l_cpu / (double)blk;
    double k = ceil(x - x * 1e-6);
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
    return FLX_OK;
}

/* One carving routine for the size-only pass (mem NULL) and the real one. */
static size_t carve(flx_attn_ws_t *ws, const flx_attn_shape_t *s, void *mem, size_t bytes)
{
    flx_arena_t a;
    flx_arena_init(&a, mem, bytes);
    size_t G = s->group, D = s->head_dim, T = FLX_ATTN_MAX_CHUNKS;
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
    ws->chunk_ns = flx_arena_alloc(&a, T * sizeof(uint64_t));
    ws->o_win = flx_arena_alloc(&a, G * D * sizeof(float));
    ws->lse_win = flx_arena_alloc(&a, G * sizeof(float));
    ws->o_seg = flx_arena_alloc(&a, FLX_ATTN_WIN_SEGMENTS * G * D * sizeof(float));
    ws->lse_seg = flx_arena_alloc(&a, FLX_ATTN_WIN_SEGMENTS * G * sizeof(float));
    ws->shape = *s;
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
    memset(ws, 0, sizeof *ws);
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

/* Value of rank `target` (0 = largest) among f[0..n), three-way quickselect; permutes f. above
 * (may be NULL) gets how many of them are larger than it. */
static float select_desc(float *f, uint32_t n, uint32_t target, uint64_t *rs, uint32_t *above)
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
        if (target < lt) {
            hi = lt;
        } else if (target < gt) {   /* [0, lt) holds exactly the values above pv */
            if (above) *above = lt;
            return pv;
        } else {
            lo = gt;
        }
    }
}

/* select_desc with each round's partition as two 16-lane passes (count, then keep one side in
 * place), which do not mispredict as the scalar three-way partition does; the scalar select
 * finishes the last few keys. Same value, same count above it. */
static float select_desc_avx512(float *f, uint32_t n, uint32_t target, uint64_t *rs, uint32_t *above)
{
    uint32_t up = 0;   /* keys dropped from the set because they are above the target */
    while (n > 64) {
        const float pv = f[xs_next(rs) % n];
        uint32_t gt, eq;
        attn_topk_count_avx512(f, n, pv, &gt, &eq);
        if (target < gt) {
            n = attn_topk_keep_avx512(f, n, pv, 1);
        } else if (target < gt + eq) {
            *above = up + gt;
            return pv;
        } else {
            n = attn_topk_keep_avx512(f, n, pv, 0);
            target -= gt + eq;
            up += gt + eq;
        }
    }
    uint32_t a = 0;
    const float t = select_desc(f, n, target, rs, &a);
    *above = up + a;
    return t;
}

/*
 * Threshold selection. tau = the k-th largest key (NaN -> -inf) is found on a candidate set: a
 * deterministic sample of 128 keys gives a cut t a few standard deviations below the expected
 * k-th key, one pass copies keys >= t (as floats, into idx's own memory), and a three-way
 * quickselect on them finds tau and how many keys are above it (if the cut missed, on all keys).
 * Then every index with key > tau is taken, followed by the lowest indices with key == tau until
 * k. Streaming passes plus an expected O(n) select; the result does not depend on the sample
 * (only the speed does). With AVX-512 the two passes over the n keys and the select's partitions
 * (until 64 keys are left) run on 16 lanes: the same indices, in the same order, as the scalar
 * loops.
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
    const int simd = flx_isa_active() >= FLX_ISA_AVX512;
    uint64_t rs = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n << 32 | k);
    float tau;
    uint32_t m = 0, above = 0;
    enum { S = 128 };
    if (n >= 4 * S) {
        float smp[S];
        for (uint32_t i = 0; i < S; i++) smp[i] = rank_key(scores[(uint64_t)i * n / S]);
        double r = (double)k * S / n;
        uint32_t rr = (uint32_t)(r + 3.0 * sqrt(r + 1.0) + 4.0);
        float t = rr < S ? select_desc(smp, S, rr, &rs, NULL) : -INFINITY;
        if (t > -INFINITY) {
            if (simd) {
                m = attn_topk_cut_avx512(scores, n, t, f);
            } else {
                for (uint32_t i = 0; i < n; i++) {
                    float x = rank_key(scores[i]);
                    f[m] = x;
                    m += x >= t;
                }
            }
        }
        if (m < k) m = 0;   /* the cut missed: select on all keys */
    }
    if (!m) {   /* select on all keys */
        for (uint32_t i = 0; i < n; i++) f[i] = rank_key(scores[i]);
        m = n;
    }
    /* every key above tau (>= t) is a candidate */
    tau = simd ? select_desc_avx512(f, m, k - 1, &rs, &above) : select_desc(f, m, k - 1, &rs, &above);
    uint32_t eq = k - above, c;   /* the k-th is equal to tau: eq >= 1 */
    if (simd) {
        c = attn_topk_take_avx512(scores, n, tau, eq, idx);
    } else {
        c = 0;
        for (uint32_t i = 0; i < n; i++) {   /* c < k here: idx[c] is in bounds */
            idx[c] = i;
            c += rank_key(scores[i]) > tau;
        }
        for (uint32_t i = 0; i < n && eq; i++)
            if (rank_key(scores[i]) == tau) idx[c++] = i, eq--;
    }
    if (FLX_NEVER(c != k)) return flx_error_set(FLX_ERR_INTERNAL, "topk: took %u of k %u (n %u)", c, k, n);
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

uint32_t flx_attn_cfg_blocks(uint32_t G, const flx_attn_cfg_t *cfg, int level, uint32_t l_cpu, uint32_t *k,
                             uint8_t *ranked)
{
    const uint32_t blk = 16u << level, n = flx_kv_meta_count(l_cpu, level);
    uint32_t n_ranked = 0;
    for (uint32_t h = 0; h < G; h++) {
        const float b = cfg->mode == FLX_ATTN_FULL ? 1.0f : cfg->mode == FLX_ATTN_FIXED ? cfg->budget : cfg->budgets[h];
        k[h] = flx_attn_budget_blocks(b, l_cpu, blk);
        if (k[h] > 0 && k[h] < n) {
            if (ranked) ranked[n_ranked] = (uint8_t)h;
            n_ranked++;
        }
    }
    return n_ranked;
}

flx_status_t flx_attn_check_cfg(uint32_t G, const flx_attn_cfg_t *cfg, int *level_p)
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
        for (uint32_t h = 0; h < G; h++)
            if (!(cfg->budgets[h] >= 0.0f && cfg->budgets[h] <= 1.0f))
                return flx_error_set(FLX_ERR_INVALID, "attn task: budget of head %u is %g, not in [0, 1]", h,
                                     (double)cfg->budgets[h]);
    }
    *level_p = level;
    return FLX_OK;
}

static flx_status_t check_task(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, const char *who)
{
    flx_status_t st = flx_attn_check_view(view, who);
    if (st) return st;
    if (!ws || !q) return flx_error_set(FLX_ERR_INVALID, "%s: NULL argument", who);
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

typedef struct topk_job {
    const flx_attn_ws_t *ws;
    const uint8_t *heads;   /* the scored heads: heads[i]'s scores are row i */
    uint32_t n;
} topk_job_t;

static flx_status_t topk_heads(void *ctx, const flx_pool_worker_t *w, uint64_t i0, uint64_t i1)
{
    (void)w;
    const topk_job_t *j = ctx;
    const flx_attn_ws_t *ws = j->ws;
    for (uint64_t i = i0; i < i1; i++) {
        const uint32_t h = j->heads[i];
        flx_status_t st = flx_topk(ws->scores + i * j->n, j->n, ws->k[h], ws->sel + (size_t)h * ws->n_max);
        if (st) return st;
    }
    return FLX_OK;
}

flx_status_t flx_attn_task_begin(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                 const flx_attn_cfg_t *cfg, int with_window, uint32_t *n_chunks_p)
{
    int level;
    flx_status_t st = check_task(ws, view, q, "attn task");
    if (st || (st = flx_attn_check_cfg(ws->shape.group, cfg, &level))) return st;
    if (!n_chunks_p) return flx_error_set(FLX_ERR_INVALID, "attn task: n_chunks_p is NULL");
    if (with_window && view->n_win && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "attn task: n_win %u but no window arrays", view->n_win);
    const uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    ws->view = *view;
    ws->with_window = with_window != 0;
    ws->score_ns = ws->topk_ns = ws->score_bytes = 0;
    uint32_t n_list = 0;
    uint64_t tokens = 0;
    if (cfg->mode == FLX_ATTN_FULL) {
        const uint64_t all = G == 64 ? ~0ull : ((1ull << G) - 1);
        for (uint32_t b = 0; b < view->n_blocks; b++) {
            ws->mask[b] = all;
            ws->list[b] = b;
        }
        n_list = view->n_blocks;
        tokens = view->l_cpu;
    } else {
        const uint32_t blk = 16u << level, n = view->meta_n[level];
        /* Only a head that reads some but not all of the blocks is scored and ranked; one that reads
         * none (a streaming head of a retrieval group) or all takes blocks 0..k-1. The union, and so
         * the output, is the same set either way. */
        uint8_t ranked[FLX_ATTN_MAX_GROUP];
        const uint32_t n_ranked = flx_attn_cfg_blocks(G, cfg, level, view->l_cpu, ws->k, ranked);
        for (uint32_t h = 0; h < G; h++)   /* a head reading every block (k = n) takes them in order */
            if (ws->k[h] >= n)
                for (uint32_t b = 0; b < ws->k[h]; b++) ws->sel[(size_t)h * ws->n_max + b] = b;
        if (n_ranked) {
            const uint64_t t0 = flx_now_ns();
            if ((st = flx_attn_score_heads(ws, view, level, q, ranked, n_ranked, ws->scores))) return st;
            const uint64_t t1 = flx_now_ns();
            topk_job_t tj = {ws, ranked, n};
            if ((st = flx_pool_for(ws->shape.pool, n_ranked, 1, topk_heads, &tj))) return st;
            ws->score_ns = t1 - t0;
            ws->topk_ns = flx_now_ns() - t1;
            ws->score_bytes = (uint64_t)n * 2 * D * sizeof(flx_bf16_t);
        }
        if ((st = flx_attn_build_union(ws, n, ws->sel, ws->n_max, ws->k, &n_list))) return st;
        /* the distinct blocks read (the last one holds only the tokens up to l_cpu) */
        for (uint32_t u = 0; u < n_list; u++) {
            const uint32_t b = ws->list[u], t1 = (b + 1) * blk < view->l_cpu ? (b + 1) * blk : view->l_cpu;
            tokens += t1 - b * blk;
        }
    }
    ws->attn_bytes = tokens * D * 4;   /* K + V, bf16 */
    flx_attn_prep_attn_q(ws, q);
    const uint32_t nw = ws->with_window ? flx_attn_plan_window(ws, view->n_win) : (ws->n_win_chunks = 0);
    const uint32_t nh = flx_attn_plan_host(ws, view, cfg->mode == FLX_ATTN_FULL ? 0 : level, n_list);
    *n_chunks_p = nw + nh;
    return FLX_OK;
}

flx_status_t flx_attn_task_chunk(flx_attn_ws_t *ws, uint32_t c)
{
    if (!ws) return flx_error_set(FLX_ERR_INVALID, "attn task chunk: workspace is NULL");
    if (c >= ws->n_win_chunks + ws->n_host_chunks)
        return flx_error_set(FLX_ERR_INVALID, "attn task chunk %u of %u", c, ws->n_win_chunks + ws->n_host_chunks);
    const uint64_t t0 = flx_now_ns();
    if (c < ws->n_win_chunks) flx_attn_window_chunk(ws, &ws->view, c, flx_attn_slot(ws, c));
    else flx_attn_host_chunk(ws, &ws->view, c - ws->n_win_chunks, flx_attn_slot(ws, c));
    ws->chunk_ns[c] = flx_now_ns() - t0;
    return FLX_OK;
}

flx_status_t flx_attn_task_end(flx_attn_ws_t *ws, float *o, float *lse, flx_attn_timing_t *timing)
{
    if (!ws || !o || !lse) return flx_error_set(FLX_ERR_INVALID, "attn task end: NULL argument");
    const uint32_t nw = ws->n_win_chunks, nh = ws->n_host_chunks;
    flx_attn_part_finish(ws, nw, nh, o, lse);
    const uint64_t t0 = flx_now_ns();
    if (ws->with_window) {
        flx_attn_part_finish(ws, 0, nw, ws->o_win, ws->lse_win);
        flx_attn_merge(ws->shape.group, ws->shape.head_dim, ws->o_win, ws->lse_win, o, lse, o, lse);
    }
    if (timing) {
        uint64_t win = 0, host = 0;
        for (uint32_t c = 0; c < nw + nh; c++) *(c < nw ? &win : &host) += ws->chunk_ns[c];
        timing->window_ns = win;
        timing->score_ns = ws->score_ns;
        timing->topk_ns = ws->topk_ns;
        timing->attn_ns = host;
        timing->merge_ns = ws->with_window ? flx_now_ns() - t0 : 0;
        timing->score_bytes = ws->score_bytes;
        timing->attn_bytes = ws->attn_bytes;
    }
    return FLX_OK;
}

typedef struct task_job {
    flx_attn_ws_t *ws;
} task_job_t;

static flx_status_t task_chunks(void *ctx, const flx_pool_worker_t *w, uint64_t c0, uint64_t c1)
{
    (void)w;
    const task_job_t *j = ctx;
    for (uint64_t c = c0; c < c1; c++) {
        flx_status_t st = flx_attn_task_chunk(j->ws, (uint32_t)c);
        if (st) return st;
    }
    return FLX_OK;
}

/* begin, every chunk on the workspace's pool, end. */
static flx_status_t task_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                             const flx_attn_cfg_t *cfg, int with_window, float *o, float *lse,
                             flx_attn_timing_t *timing, const char *who)
{
    if (!o || !lse) return flx_error_set(FLX_ERR_INVALID, "%s: NULL argument", who);
    uint32_t n;
    flx_status_t st = flx_attn_task_begin(ws, view, q, cfg, with_window, &n);
    if (st) return st;
    task_job_t j = {ws};
    if ((st = flx_pool_for(ws->shape.pool, n, 1, task_chunks, &j))) return st;
    return flx_attn_task_end(ws, o, lse, timing);
}

flx_status_t flx_attn_host_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                               const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing)
{
    return task_run(ws, view, q, cfg, 0, o, lse, timing, "attn host_run");
}

flx_status_t flx_attn_group_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                const flx_attn_cfg_t *cfg, float *o, float *lse, flx_attn_timing_t *timing)
{
    return task_run(ws, view, q, cfg, 1, o, lse, timing, "attn group_run");
}
