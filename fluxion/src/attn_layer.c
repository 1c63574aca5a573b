/*
 * attn_layer.c - one decode layer's attention for a batch (flx/attn_layer.h).
 *
 * DESIGN
 * This file is the only place where a mode becomes tasks: FULL and FIXED make one task per
 * (sequence, group), FLUXION asks the features, the predictor and the selector; from there every
 * mode is the same tasks on the same scheduler, merged by the same function. Everything is sized at
 * create for max_batch sequences: the task array, budgets, the features' rows and window partials,
 * one features workspace per worker, the predictor's scratch, the host parts' LSE for deferred
 * merges. A run allocates nothing.
 *
 * Everything runs on the caller's worker pool, in two runs a layer: the decisions, then the tasks
 * on the scheduler. The decision run's items are the features of each (sequence, KV group) (each
 * worker its own workspace for the window kernel), then the predictor's register tiles. A sequence's
 * rows need all its groups' features (MAX_ONORM_Q is a maximum over its heads), not the batch's:
 * the item that completes a sequence's groups finishes its features and publishes it, and a tile
 * waits only for the sequences its rows belong to, so the predictor of the first sequences runs
 * while the features of the last are still being computed (a barrier between two runs had left a
 * worker idle at its end, and the tiles of the whole batch split unevenly). The selector (about 1
 * us a group) runs on the calling thread after it.
 *
 * A sequence whose features cannot be had (its statistics or its window make them fail or
 * overflow: what a prefill peer sent) fails alone: its reason is kept, its feature rows are zeroed
 * so the predictor tiles it shares with other sequences stay finite, it gets no task, and its
 * outputs are NaN so nothing downstream mistakes them for attention. The other sequences of the
 * batch go on (flx_attn_layer_row_failed names the failed rows; the engine ends only those). A
 * predictor error still fails the run: the pool reports the lowest failing item's error.
 */
#include "flx/attn_layer.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sched.h>

#include "flx/features.h"
#include "flx/util.h"

enum { SEQ_PENDING = 0, SEQ_READY = 1, SEQ_FAILED = 2 };
enum { ROW_WHY = 256 };

struct flx_attn_layer {
    flx_attn_layer_params_t p;
    uint32_t Hq, Hkv, G, D, W;   /* W: the pool's workers */
    flx_pool_h pool;             /* borrowed */
    flx_sched_h sched;
    flx_sched_task_t *tasks;     /* (max_batch * Hkv) */
    uint32_t *l_cpu;             /* (max_batch) host tokens of each row of the run */
    uint32_t n_tasks;
    uint32_t *row_streaming;     /* (max_batch) FLUXION: window-only query heads of each row of the run */
    uint32_t *row_skipped;       /* (max_batch) FLUXION: KV groups of each row with no host task */
    uint32_t last_batch;
    float *lse;                  /* (max_batch, Hq) the host parts' LSE of a deferred merge */
    /* FLUXION */
    float *feat;                 /* (max_batch, Hq, 41) */
    flx_head_pred_t *pred;       /* (max_batch, Hq) */
    float *budgets;              /* (max_batch, Hq) */
    float *o_win, *lse_win;      /* (max_batch, Hq, D), (max_batch, Hq) */
    const flx_bf16_t **win_ptr;  /* (max_batch, 2, Hkv) */
    flx_feat_layer_t *feat_in;   /* (max_batch) */
    void *fmem;                  /* W features workspaces of fws_bytes */
    size_t fws_bytes;
    flx_attn_ws_t *fws;          /* (W) */
    void *pscratch;              /* the predictor's scratch for max_batch * Hq rows */
    size_t ps_bytes;
    _Atomic uint32_t *seq_left;  /* (max_batch) the run's feature items of each sequence not yet done */
    _Atomic uint32_t *seq_state; /* (max_batch) SEQ_PENDING, SEQ_READY (features final), SEQ_FAILED */
    _Atomic uint32_t *seq_fail;  /* (max_batch) 1: the sequence's features failed (row_why says why) */
    char *row_why;               /* (max_batch, ROW_WHY) the reason of each failed row of the run */
    atomic_int pred_failed;      /* 1: a predictor item failed (the pool may then skip feature items
                                    another predictor item waits for: it must stop waiting) */
    uint32_t n_feat_items, n_rows;   /* the run in progress: B * Hkv feature items, B * Hq predictor rows */
    uint32_t pred_tile;              /* predictor rows per item: one register tile (flx_predictor_tile_rows) */
    _Atomic uint64_t feat_cpu_ns, mlp_cpu_ns;   /* the run in progress: thread time of each kind of item */
    /* the run in progress */
    const flx_attn_layer_args_t *a;
};

static flx_status_t check_params(const flx_attn_layer_params_t *p)
{
    if (p->n_kv_heads == 0 || p->n_q_heads == 0 || p->n_q_heads % p->n_kv_heads ||
        p->n_q_heads / p->n_kv_heads > FLX_ATTN_MAX_GROUP)
        return flx_error_set(FLX_ERR_INVALID, "attention layer: %u query heads over %u kv heads (group at most %d)",
                             p->n_q_heads, p->n_kv_heads, FLX_ATTN_MAX_GROUP);
    if (p->max_batch == 0 || p->max_batch > 4096 || p->max_l_cpu == 0)
        return flx_error_set(FLX_ERR_INVALID, "attention layer: max_batch %u not in 1..4096 or max_l_cpu 0",
                             p->max_batch);
    switch (p->mode) {
    case FLX_LAYER_FULL: break;
    case FLX_LAYER_FIXED:
        if (flx_attn_blk_level(p->blk) < 0)
            return flx_error_set(FLX_ERR_INVALID, "attention layer: fixed blk %u must be 16, 32, 64 or 128", p->blk);
        if (!(p->bgt >= 0.0f && p->bgt <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "attention layer: fixed bgt %g must be in [0, 1]", (double)p->bgt);
        break;
    case FLX_LAYER_FLUXION: {
        if (!p->predictor) return flx_error_set(FLX_ERR_INVALID, "attention layer: mode fluxion needs a predictor");
        if ((p->field_mask & FLX_ATTN_LAYER_FIELD_SELECT) && flx_select_params_check(&p->select)) return FLX_ERR_INVALID;
        const flx_select_opts_t o = p->opts;
        if ((p->field_mask & FLX_ATTN_LAYER_FIELD_OPTS) &&
            ((o.keep_streaming != 0 && o.keep_streaming != 1) ||
             (o.fixed_blk != 0 && flx_attn_blk_level(o.fixed_blk) < 0)))
            return flx_error_set(FLX_ERR_INVALID, "attention layer: opts keep_streaming %d (0 or 1), fixed_blk %u "
                                                  "(0, 16, 32, 64 or 128)", o.keep_streaming, o.fixed_blk);
        break;
    }
    default: return flx_error_set(FLX_ERR_INVALID, "attention layer: mode %d unknown", (int)p->mode);
    }
    return FLX_OK;
}

flx_status_t flx_attn_layer_create(const flx_attn_layer_params_t *params, flx_attn_layer_h *layer_p)
{
    if (!params || !layer_p) return flx_error_set(FLX_ERR_INVALID, "attention layer create: NULL argument");
    flx_status_t st = check_params(params);
    if (st) return st;
    struct flx_attn_layer *L = calloc(1, sizeof *L);
    if (!L) return flx_error_set(FLX_ERR_NOMEM, "attention layer");
    L->p = *params;
    L->Hq = params->n_q_heads, L->Hkv = params->n_kv_heads, L->G = L->Hq / L->Hkv, L->D = params->head_dim;
    if (L->p.mode == FLX_LAYER_FLUXION) {
        if (!(L->p.field_mask & FLX_ATTN_LAYER_FIELD_SELECT)) L->p.select = flx_predictor_select_params(params->predictor);
        if (!(L->p.field_mask & FLX_ATTN_LAYER_FIELD_OPTS)) memset(&L->p.opts, 0, sizeof L->p.opts);
    }
    flx_sched_params_t sp = params->sched;
    sp.n_q_heads = L->Hq, sp.n_kv_heads = L->Hkv, sp.head_dim = L->D, sp.max_l_cpu = params->max_l_cpu;
    sp.max_tasks = params->max_batch * L->Hkv;
    if ((st = flx_sched_create(&sp, &L->sched))) goto fail;
    L->pool = sp.pool;
    L->W = flx_pool_size(sp.pool);
    const uint32_t B = params->max_batch;
    const size_t rows = (size_t)B * L->Hq;
    L->tasks = calloc((size_t)B * L->Hkv, sizeof *L->tasks);
    L->lse = malloc(rows * sizeof *L->lse);
    L->l_cpu = calloc(B, sizeof *L->l_cpu);
    L->row_streaming = calloc(B, sizeof *L->row_streaming);
    L->row_skipped = calloc(B, sizeof *L->row_skipped);
    if (!L->tasks || !L->lse || !L->l_cpu || !L->row_streaming || !L->row_skipped) {
        st = flx_error_set(FLX_ERR_NOMEM, "attention layer: tasks of %u sequences", B);
        goto fail;
    }
    if (L->p.mode == FLX_LAYER_FLUXION) {
        flx_attn_shape_t fs = {.group = L->G, .head_dim = L->D, .max_l_cpu = 1, .pool = NULL};
        if ((st = flx_attn_plan(&fs, &L->fws_bytes))) goto fail;
        L->fws_bytes = FLX_ALIGN_UP(L->fws_bytes, FLX_CACHELINE);
        L->ps_bytes = FLX_ALIGN_UP(flx_predictor_scratch_bytes((uint32_t)FLX_MIN(rows, (size_t)UINT32_MAX)) + 1,
                                   FLX_CACHELINE);
        L->feat_in = calloc(B, sizeof *L->feat_in);
        L->feat = malloc(rows * FLX_FEAT_COUNT * sizeof(float));
        L->pred = malloc(rows * sizeof *L->pred);
        L->budgets = malloc(rows * sizeof(float));
        L->o_win = malloc(rows * L->D * sizeof(float));
        L->lse_win = malloc(rows * sizeof(float));
        L->win_ptr = malloc((size_t)B * 2 * L->Hkv * sizeof *L->win_ptr);
        L->fmem = flx_aligned_alloc(FLX_CACHELINE, L->fws_bytes * L->W);
        L->fws = calloc(L->W, sizeof *L->fws);
        L->pscratch = flx_aligned_alloc(FLX_CACHELINE, L->ps_bytes);
        L->seq_left = calloc(B, sizeof *L->seq_left);
        L->seq_state = calloc(B, sizeof *L->seq_state);
        L->seq_fail = calloc(B, sizeof *L->seq_fail);
        L->row_why = calloc(B, ROW_WHY);
        if (!L->feat || !L->pred || !L->budgets || !L->o_win || !L->lse_win || !L->win_ptr || !L->feat_in || !L->fmem ||
            !L->fws || !L->pscratch || !L->seq_left || !L->seq_state || !L->seq_fail || !L->row_why) {
            st = flx_error_set(FLX_ERR_NOMEM, "attention layer: fluxion buffers for %u sequences", B);
            goto fail;
        }
        memset(L->fmem, 0, L->fws_bytes * L->W);   /* paged in now, as the scheduler's workspaces */
        memset(L->pscratch, 0, L->ps_bytes);
        for (uint32_t w = 0; w < L->W; w++)
            if ((st = flx_attn_ws_init(&L->fws[w], &fs, (uint8_t *)L->fmem + (size_t)w * L->fws_bytes, L->fws_bytes)))
                goto fail;
    }
    *layer_p = L;
    return FLX_OK;
fail:
    flx_attn_layer_destroy(L);
    return st;
}

void flx_attn_layer_destroy(flx_attn_layer_h L)
{
    if (!L) return;
    flx_sched_destroy(L->sched);
    free(L->tasks);
    free(L->lse);
    free(L->l_cpu);
    free(L->row_streaming);
    free(L->row_skipped);
    free(L->row_why);
    free(L->feat_in);
    free(L->feat);
    free(L->pred);
    free(L->budgets);
    free(L->o_win);
    free(L->lse_win);
    free(L->win_ptr);
    flx_aligned_free(L->fmem);
    free(L->fws);
    flx_aligned_free(L->pscratch);
    free((void *)L->seq_left);
    free((void *)L->seq_state);
    free((void *)L->seq_fail);
    free(L);
}

/* Row b's features failed: the first reason is kept (the others' threads lose the exchange). */
static void row_fail(struct flx_attn_layer *L, uint32_t b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void row_fail(struct flx_attn_layer *L, uint32_t b, const char *fmt, ...)
{
    if (atomic_exchange_explicit(&L->seq_fail[b], 1, memory_order_relaxed)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->row_why + (size_t)b * ROW_WHY, ROW_WHY, fmt, ap);
    va_end(ap);
}

/* Feature item b * Hkv + g: the features (and window partials) of KV group g of sequence b. The
 * item that completes a sequence's groups (failed or not) finishes its features (the maximum
 * over its heads), checks them, and publishes the sequence's state for the predictor items waiting
 * on it; a failed sequence's rows are zeroed (the predictor refuses a tile with a non-finite row,
 * and other sequences share its tiles). A failure is the sequence's, never the item's. */
static flx_status_t feat_item(struct flx_attn_layer *L, uint32_t wi, uint32_t id)
{
    const uint32_t b = id / L->Hkv, g = id % L->Hkv;
    flx_feat_layer_t in = L->feat_in[b];
    in.ws = &L->fws[wi];
    const size_t r0 = (size_t)b * L->Hq;
    float *feat = L->feat + r0 * FLX_FEAT_COUNT;
    if (flx_features_decode_groups(&in, g, g + 1, feat, L->o_win + r0 * L->D, L->lse_win + r0))
        row_fail(L, b, "layer %u batch row %u kv group %u: features: %s", L->a->layer, b, g, flx_error_msg());
    /* acq_rel: the last one sees every group's rows (and the fail flag) of the others */
    if (atomic_fetch_sub_explicit(&L->seq_left[b], 1, memory_order_acq_rel) == 1) {
        int ok = !atomic_load_explicit(&L->seq_fail[b], memory_order_relaxed);
        if (ok) {
            flx_features_decode_finish(&L->feat_in[b], feat);
            for (size_t i = 0; ok && i < (size_t)L->Hq * FLX_FEAT_COUNT; i++)
                if (!isfinite(feat[i])) {
                    row_fail(L, b, "layer %u batch row %u: feature %zu of query head %zu is %g (out of range: "
                                   "the session's prefill statistics, its window KV or the query)",
                             L->a->layer, b, i % FLX_FEAT_COUNT, i / FLX_FEAT_COUNT, (double)feat[i]);
                    ok = 0;
                }
        }
        if (!ok) memset(feat, 0, (size_t)L->Hq * FLX_FEAT_COUNT * sizeof(float));
        atomic_store_explicit(&L->seq_state[b], ok ? SEQ_READY : SEQ_FAILED, memory_order_release);
    }
    return FLX_OK;
}

/* Predictor item t: rows [t * tile, t * tile + tile) once the sequences they belong to have their
 * features (a failed sequence's rows are zeros: predicted, then ignored). Items are claimed in
 * order, so every feature item below a claimed predictor item is running or done: the wait ends.
 * Past a failure the pool may skip a feature item claimed before this one (it checks when it runs
 * an item, not when it claims it); only a predictor item fails a run, and it raises pred_failed
 * first, on which the wait ends. A tile that has to wait first prefetches the network's weights:
 * the layer's attention has pushed them out of L2, and streaming them back is most of a tile's
 * time in a decode step (docs/sched.md); batch 1 waits for its one sequence every layer. */
static flx_status_t pred_item(struct flx_attn_layer *L, uint32_t t)
{
    const uint32_t r0 = t * L->pred_tile, r1 = r0 + L->pred_tile < L->n_rows ? r0 + L->pred_tile : L->n_rows;
    int warmed = 0;
    for (uint32_t b = r0 / L->Hq; b <= (r1 - 1) / L->Hq; b++) {
        uint32_t spins = 0;
        while (atomic_load_explicit(&L->seq_state[b], memory_order_acquire) == SEQ_PENDING) {
            if (!warmed) {   /* the wait brings the network's weights back into this core's L2 */
                flx_predictor_prefetch(L->p.predictor);
                warmed = 1;
                continue;
            }
            if (atomic_load_explicit(&L->pred_failed, memory_order_relaxed))   /* the run fails anyway */
                return flx_error_set(FLX_ERR_STATE, "layer %u batch row %u: predictor: another tile failed",
                                     L->a->layer, b);
            if (++spins >= 256) sched_yield();   /* the feature item's worker may need this CPU */
            else flx_cpu_relax();
        }
    }
    flx_status_t st = flx_predictor_run_rows(L->p.predictor, L->feat, L->n_rows, r0, r1, L->pred, L->pscratch,
                                             L->ps_bytes);
    if (st) {
        st = flx_error_set(st, "layer %u: predictor: %s", L->a->layer, flx_error_msg());
        atomic_store_explicit(&L->pred_failed, 1, memory_order_relaxed);   /* before the pool hears of it */
    }
    return st;
}

/* The decision run: B * Hkv feature items, then the predictor's row tiles, in one pool run. */
static flx_status_t decide_items(void *arg, const flx_pool_worker_t *w, uint64_t i0, uint64_t i1)
{
    struct flx_attn_layer *L = arg;
    const uint32_t wi = w ? w->index : 0;
    if (FLX_NEVER(wi >= L->W)) return flx_error_set(FLX_ERR_INTERNAL, "attention layer: worker %u of %u", wi, L->W);
    for (uint64_t id = i0; id < i1; id++) {
        const uint64_t t0 = flx_now_ns();
        const int is_feat = id < L->n_feat_items;
        flx_status_t st = is_feat ? feat_item(L, wi, (uint32_t)id) : pred_item(L, (uint32_t)(id - L->n_feat_items));
        atomic_fetch_add_explicit(is_feat ? &L->feat_cpu_ns : &L->mlp_cpu_ns, flx_now_ns() - t0, memory_order_relaxed);
        if (st) return st;
    }
    return FLX_OK;
}

/* ---- the run ---- */

/* Eq. 3's V of a group: metadata rows at blk (none for FULL) plus K and V rows of every head. */
static float volume(uint32_t l_cpu, uint32_t blk, const float *budgets, float budget, uint32_t G)
{
    double sum = 0;
    for (uint32_t h = 0; h < G; h++) sum += budgets ? budgets[h] : budget;
    return (float)((blk ? 2.0 * l_cpu / blk : 0.0) + 2.0 * l_cpu * sum);
}

/* Checks args; L->l_cpu gets each row's host tokens (at most max_l_cpu). */
static flx_status_t check_args(struct flx_attn_layer *L, const flx_attn_layer_args_t *a)
{
    if (!a) return flx_error_set(FLX_ERR_INVALID, "attention layer run: args is NULL");
    if (a->batch == 0 || a->batch > L->p.max_batch)
        return flx_error_set(FLX_ERR_INVALID, "attention layer run: batch %u not in 1..%u (max_batch)", a->batch,
                             L->p.max_batch);
    if (!a->sess || !a->q || !a->o) return flx_error_set(FLX_ERR_INVALID, "attention layer run: NULL sess, q or o");
    if (a->window != FLX_LAYER_WIN_COMPUTE && a->window != FLX_LAYER_WIN_DEFERRED)
        return flx_error_set(FLX_ERR_INVALID, "attention layer run: window %d unknown", (int)a->window);
    if (a->window == FLX_LAYER_WIN_DEFERRED) {
        if (L->p.mode == FLX_LAYER_FLUXION)
            return flx_error_set(FLX_ERR_INVALID, "attention layer run: deferred window partials in mode fluxion (its "
                                                  "features compute them)");
        if (!a->o_win || !a->lse_win || !a->win_wait)
            return flx_error_set(FLX_ERR_INVALID, "attention layer run: deferred window without o_win, lse_win or "
                                                  "win_wait");
    }
    for (uint32_t b = 0; b < a->batch; b++) {
        if (!a->sess[b]) return flx_error_set(FLX_ERR_INVALID, "attention layer run: session of batch row %u is NULL", b);
        flx_kv_session_shape_t sh;
        flx_status_t st = flx_kv_session_shape(a->sess[b], &sh);
        if (st) return st;
        if (sh.l_cpu > L->p.max_l_cpu)
            return flx_error_set(FLX_ERR_INVALID, "attention layer run: batch row %u has %u host tokens, above "
                                                  "max_l_cpu %u", b, sh.l_cpu, L->p.max_l_cpu);
        L->l_cpu[b] = sh.l_cpu;
    }
    return FLX_OK;
}

flx_status_t flx_attn_layer_run(flx_attn_layer_h L, const flx_attn_layer_args_t *a, flx_attn_layer_stats_t *stats)
{
    if (!L) return flx_error_set(FLX_ERR_INVALID, "attention layer run: NULL layer");
    int ran = 0;   /* flx_sched_run was reached: the caller's GPU spans are the run's */
    flx_status_t st = check_args(L, a);
    if (st) goto out;
    const uint64_t t0 = flx_now_ns();
    const uint32_t B = a->batch, Hq = L->Hq, Hkv = L->Hkv, G = L->G, D = L->D;
    L->a = a;
    L->last_batch = B;
    memset(L->row_streaming, 0, B * sizeof *L->row_streaming);
    memset(L->row_skipped, 0, B * sizeof *L->row_skipped);
    uint64_t predict_ns = 0, merge_ns = 0, decide_ns = 0;
    uint32_t n = 0;
    flx_sched_layer_t sl = {.layer = a->layer, .batch = B, .sess = a->sess, .q = a->q, .o = a->o};
    if (L->p.mode == FLX_LAYER_FLUXION) {
        for (uint32_t b = 0; b < B; b++) {   /* first: a run that stops below reports no failed row */
            atomic_store_explicit(&L->seq_left[b], Hkv, memory_order_relaxed);
            atomic_store_explicit(&L->seq_state[b], SEQ_PENDING, memory_order_relaxed);
            atomic_store_explicit(&L->seq_fail[b], 0, memory_order_relaxed);
        }
        for (uint32_t b = 0; b < B; b++) {
            const flx_bf16_t **wk = L->win_ptr + (size_t)b * 2 * Hkv, **wv = wk + Hkv;
            if ((st = flx_features_layer_from_session(a->sess[b], a->layer, a->q + (size_t)b * Hq * D, wk, wv,
                                                      &L->feat_in[b]))) {
                st = flx_error_set(st, "layer %u batch row %u: features: %s", a->layer, b, flx_error_msg());
                goto out;
            }
        }
        /* one run: a sequence's predictor rows start as soon as its features are in */
        L->n_feat_items = B * Hkv, L->n_rows = B * Hq, L->pred_tile = flx_predictor_tile_rows();
        atomic_store_explicit(&L->feat_cpu_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&L->mlp_cpu_ns, 0, memory_order_relaxed);
        atomic_store_explicit(&L->pred_failed, 0, memory_order_relaxed);
        if ((st = flx_pool_for(L->pool, L->n_feat_items + FLX_DIV_UP(L->n_rows, L->pred_tile), 1, decide_items, L)))
            goto out;
        decide_ns = flx_now_ns() - t0;
        for (uint32_t b = 0; b < B; b++) {
            if (atomic_load_explicit(&L->seq_state[b], memory_order_relaxed) == SEQ_FAILED) {
                /* no task; outputs no one can take for attention */
                float *o = a->o + (size_t)b * Hq * D;
                for (size_t i = 0; i < (size_t)Hq * D; i++) o[i] = NAN;
                continue;
            }
            for (uint32_t g = 0; g < Hkv; g++) {
                const size_t r0 = (size_t)b * Hq + (size_t)g * G;
                flx_selection_t sel;
                if ((st = flx_select_group_opts(L->pred + r0, G, L->l_cpu[b], &L->p.select, &L->p.opts,
                                                L->budgets + r0, &sel)))
                    goto out;
                L->row_streaming[b] += G - sel.n_retrieval;
                if (sel.skip) {   /* streaming only: the window partial is the output */
                    L->row_skipped[b]++;
                    memcpy(a->o + r0 * D, L->o_win + r0 * D, (size_t)G * D * sizeof(float));
                    continue;
                }
                flx_sched_task_t *t = &L->tasks[n++];
                memset(t, 0, sizeof *t);
                t->seq = b, t->kv_group = g, t->blk = sel.blk, t->budgets = L->budgets + r0, t->priority = sel.v;
                t->l_cpu = L->l_cpu[b];
            }
        }
        predict_ns = flx_now_ns() - t0;
        sl.window = FLX_SCHED_WIN_GIVEN, sl.o_win = L->o_win, sl.lse_win = L->lse_win;
    } else {
        const uint32_t blk = L->p.mode == FLX_LAYER_FIXED ? L->p.blk : 0;
        const float bgt = L->p.mode == FLX_LAYER_FIXED ? L->p.bgt : 1.0f;
        for (uint32_t b = 0; b < B; b++) {
            for (uint32_t g = 0; g < Hkv; g++) {
                flx_sched_task_t *t = &L->tasks[n++];
                memset(t, 0, sizeof *t);
                t->seq = b, t->kv_group = g, t->blk = blk, t->budget = bgt, t->l_cpu = L->l_cpu[b];
                t->priority = volume(L->l_cpu[b], blk, NULL, bgt, G);
            }
        }
        if (a->window == FLX_LAYER_WIN_DEFERRED) sl.window = FLX_SCHED_WIN_NONE, sl.lse = L->lse;
        else sl.window = FLX_SCHED_WIN_COMPUTE;
    }
    L->n_tasks = n;
    sl.tasks = L->tasks, sl.n_tasks = n;
    flx_sched_layer_stats_t ss;
    st = flx_sched_run(L->sched, &sl, &ss);
    ran = 1;
    if (a->window == FLX_LAYER_WIN_DEFERRED) {
        /* waited for even when a task failed: the caller's copies into o_win may still be in flight */
        flx_status_t wst = a->win_wait(a->win_ctx);
        if (st) goto out;
        if ((st = wst)) goto out;
        const uint64_t m0 = flx_now_ns();
        for (uint32_t i = 0; i < n; i++) {
            const flx_sched_task_t *t = &L->tasks[i];
            const size_t r0 = (size_t)t->seq * Hq + (size_t)t->kv_group * G;
            flx_attn_merge(G, D, a->o_win + r0 * D, a->lse_win + r0, a->o + r0 * D, L->lse + r0, a->o + r0 * D,
                           L->lse + r0);
        }
        merge_ns = flx_now_ns() - m0;
    }
    if (st) goto out;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->sched = ss;
        stats->wall_ns = flx_now_ns() - t0;
        stats->predict_ns = predict_ns;
        stats->decide_ns = decide_ns;
        stats->feat_cpu_ns = atomic_load_explicit(&L->feat_cpu_ns, memory_order_relaxed);
        stats->mlp_cpu_ns = atomic_load_explicit(&L->mlp_cpu_ns, memory_order_relaxed);
        stats->select_ns = predict_ns ? predict_ns - decide_ns : 0;
        stats->merge_ns = merge_ns;
        stats->n_groups = B * Hkv;
        stats->n_tasks = n;
    }
out:
    if (!ran) flx_sched_gpu_spans_drop(L->sched);   /* failed before the run: the window launch the caller
                                                       marked is not counted in a later layer */
    L->a = NULL;
    return st;
}

const flx_sched_task_t *flx_attn_layer_tasks(flx_attn_layer_h L, uint32_t *n_p)
{
    if (!L) return NULL;
    if (n_p) *n_p = L->n_tasks;
    return L->tasks;
}

void flx_attn_layer_row_stats(flx_attn_layer_h L, uint32_t row, uint32_t *streaming_heads, uint32_t *skipped_groups)
{
    const int in = L && row < L->last_batch;
    if (streaming_heads) *streaming_heads = in ? L->row_streaming[row] : 0;
    if (skipped_groups) *skipped_groups = in ? L->row_skipped[row] : 0;
}

const char *flx_attn_layer_row_failed(flx_attn_layer_h L, uint32_t row)
{
    const int failed = L && L->p.mode == FLX_LAYER_FLUXION && row < L->last_batch &&
                       atomic_load_explicit(&L->seq_state[row], memory_order_relaxed) == SEQ_FAILED;
    return failed ? L->row_why + (size_t)row * ROW_WHY : NULL;
}

flx_sched_h flx_attn_layer_sched(flx_attn_layer_h L)
{
    return L ? L->sched : NULL;
}
