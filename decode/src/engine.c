/*
 * engine.c - the decode loop (flx/engine.h).
 *
 * DESIGN
 * The engine keeps sequences, batching and the step driver; attention is not its business. Every
 * layer of every mode goes through flx_attn_layer_run (flx/attn_layer.h), which turns the mode
 * into tasks (FULL / FIXED: every (sequence, kv group); FLUXION: features -> predictor -> selector,
 * streaming-only groups keep their window partial) and runs them on the heterogeneous scheduler
 * (flx/sched.h: one priority queue, the pool's CPU workers helping each other with the chunks of
 * begun tasks, the GPU worker with use_gpu), each merged with its window partial by
 * flx_attn_merge. There is one route and one merge; the paper's comparisons (scheduling policy,
 * placement, Fluxion without streaming skipping or with a fixed blk) are parameters of it.
 *
 * Everything a step touches is allocated at create: the worker pool (or the caller's), one block
 * for the forward workspace, the attention route (its scheduler's per-task workspaces, the
 * features' buffers), the logits, per-worker sampling scratch (the pool's), bf16 staging for the
 * window appends. Sequences live in a fixed array of max_seqs slots; `order` lists the live slots
 * in the order they were added, so the first max_batch of it form a step's batch (FIFO admission)
 * and a waiting sequence joins as soon as an earlier one retires.
 *
 * A token is delivered before it is fed. Window capacity is checked when a token is delivered (the
 * number of fed tokens is known), not when it is appended, so a full window ends one sequence with
 * a reason instead of failing a whole batch halfway through the layers. An append that still fails
 * is a broken invariant or a session closed under us: the step fails and ends its whole batch,
 * because the other layers' windows of those sequences are now out of step.
 *
 * ONE POOL RUNS THE STEP (flx/pool.h): the forward pass, the features and the predictor, the
 * attention tasks' chunks and the sampling. Every chunk boundary depends on the data only and
 * every merge runs in chunk order, so a step's output is bitwise the same for any number of
 * workers and any policy. With use_gpu the engine's own pool keeps one CPU out of its workers for
 * the scheduler's GPU worker thread.
 *
 * GPU PATH (use_gpu): the step runs flx_gpu_model_decode with attn_layer_gpu as its callback. In
 * FULL and FIXED, the window launch (one per layer, all (sequence, group) items, marked as a span
 * of device busy time) and the copy of its partials to page-locked host memory are queued first,
 * then the route runs the tasks' host parts with the window deferred: it waits for the stream after
 * the tasks, never before, so the device window and the host parts overlap, and also when a task
 * failed, so no copy is still in flight into engine memory when the step returns. FLUXION runs the
 * route as on the CPU path (its features compute the window partials on the CPU), its tasks shared
 * with the GPU worker. The engine owns its stream, the device model unless the caller lends one,
 * and the device / page-locked workspaces, all made at create.
 */
#include "flx/engine.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/attn_gpu.h"
#include "flx/cuda_rt.h"
#include "flx/features.h"
#include "flx/selector.h"
#include "flx/bf16.h"
#include "flx/forward.h"
#include "flx/log.h"
#include "flx/util.h"

typedef struct seq {
    flx_engine_seq_id_t id;      /* 0: slot free */
    flx_kv_session_id_t sid;
    flx_kv_session_h sess;       /* acquired while live */
    uint32_t prompt_len, l_cpu;
    uint32_t win_room;           /* session max_new_tokens: tokens that can be fed */
    uint32_t n_fed;              /* tokens appended to the window */
    uint32_t n_gen;              /* tokens delivered */
    int32_t next;                /* token to deliver (n_gen == n_fed) or to feed (n_gen == n_fed + 1) */
    int32_t last;                /* last delivered token, -1 before the first */
    flx_engine_finish_t finish;  /* set when its last token was delivered: retire at the end of the step */
    uint32_t max_new, n_stop;
    int32_t stop[FLX_ENGINE_MAX_STOP];
    int32_t eos_id;
    flx_engine_token_fn on_token;
    flx_engine_logits_fn on_logits;
    void *ctx;
    flx_sampler_t sampler;
    uint64_t decode_ns;
    uint32_t n_steps;
} seq_t;

/* A sampled token (or the sampler's refusal) of one sequence of the step. */
typedef struct sample_slot {
    int32_t tok;
    flx_status_t st;
    int attn_failed;             /* a layer's attention failed this sequence alone (msg says why): no draw */
    char msg[FLX_ERROR_MSG_MAX];
} sample_slot_t;

struct flx_engine {
    const flx_model_t *m;
    flx_kv_store_h store;
    flx_engine_params_t p;       /* resolved: max_seqs, n_threads, max_l_cpu set */
    uint32_t Hq, Hkv, G, D, vocab;

    flx_pool_h pool;             /* runs the step (the caller's, or the engine's own) */
    int pool_owned;
    void *fwd_mem;
    flx_fwd_ws_t *fwd;
    flx_attn_layer_h attn;       /* the one attention route (flx/attn_layer.h) and its scheduler */
    flx_attn_layer_stats_t *lstats; /* (n_layers) of the last step */
    flx_kv_session_h *bsess;     /* (max_batch) the sessions of the step's batch */
    float *logits;               /* (max_batch, vocab) */
    size_t sample_scratch_bytes; /* per worker, in the pool's scratch */
    sample_slot_t *samples;      /* (max_batch) */
    flx_bf16_t *kv_bf16;         /* (2, Hkv, D) staging for one append */
    /* GPU path only (use_gpu; NULL otherwise) */
    int gpu;
    flx_gpu_model_h gm;
    int gm_owned;                /* the engine uploaded gm and destroys it */
    flx_cuda_stream_t stream;
    void *gfwd_dev, *gfwd_host;  /* the forward workspace's device / page-locked memory */
    flx_gpu_fwd_ws_h gws;
    void *gwin_dev, *gwin_host;  /* window workspace + partials: device / page-locked */
    flx_attn_gpu_ws_t wws;
    flx_attn_gpu_item_t *items;  /* (max_batch, Hkv) one window item per (sequence, group) */
    float *ow_dev, *lw_dev;      /* device (max_batch, Hq, D), (max_batch, Hq) window partials */
    float *ow_host, *lw_host;    /* page-locked copies of them */
    flx_cuda_stream_t stream_used; /* the stream of the layer's window launch (the forward's) */
    flx_bf16_t *kv_pinned;       /* page-locked (max_batch, 2, Hkv, D): the rows of a layer's appends, which
                                    the device-window copies queued on the stream read */
    flx_cuda_event_t append_ev;  /* recorded after a layer's appends: kv_pinned is rewritten only past it */
    int append_pending;

    seq_t *seqs;                 /* (max_seqs) */
    uint32_t *order;             /* (max_seqs) live slots, oldest first */
    uint32_t n_live;
    flx_engine_seq_id_t next_id;

    /* the batch of the step in progress, read by attn_layer */
    uint32_t batch;
    seq_t **bseq;                /* (max_batch) */
    int32_t *btok;               /* (max_batch) */
    uint32_t *bpos;              /* (max_batch) */
    flx_engine_seq_stats_t *bstats; /* (max_batch) per-sequence statistics of the step */
    flx_engine_stats_t last, total, cur;
};

/* ---- names and params ---- */

flx_status_t flx_engine_attn_mode_parse(const char *s, flx_engine_attn_mode_t *mode_p)
{
    if (!s || !mode_p)
        return flx_error_set(FLX_ERR_INVALID, "attention mode: NULL argument");
    flx_engine_attn_mode_t m;
    if (!strcmp(s, "full"))
        m = FLX_ENGINE_ATTN_FULL;
    else if (!strcmp(s, "fixed"))
        m = FLX_ENGINE_ATTN_FIXED;
    else if (!strcmp(s, "fluxion"))
        m = FLX_ENGINE_ATTN_FLUXION;
    else
        return flx_error_set(FLX_ERR_INVALID, "attention mode '%s' unknown (full, fixed, fluxion)", s);
    *mode_p = m;
    return FLX_OK;
}

const char *flx_engine_attn_mode_name(flx_engine_attn_mode_t mode)
{
    switch (mode) {
    case FLX_ENGINE_ATTN_FULL: return "full";
    case FLX_ENGINE_ATTN_FIXED: return "fixed";
    case FLX_ENGINE_ATTN_FLUXION: return "fluxion";
    }
    return "unknown";
}

const char *flx_engine_finish_name(flx_engine_finish_t why)
{
    switch (why) {
    case FLX_FINISH_NONE: return "none";
    case FLX_FINISH_MAX_NEW: return "max_new_tokens";
    case FLX_FINISH_STOP: return "stop";
    case FLX_FINISH_EOS: return "eos";
    case FLX_FINISH_CAPACITY: return "capacity";
    case FLX_FINISH_CANCELED: return "canceled";
    case FLX_FINISH_ERROR: return "error";
    }
    return "unknown";
}

flx_engine_params_t flx_engine_params_default(void)
{
    flx_engine_params_t p = {.max_batch = 8, .max_seqs = 0, .n_threads = 0, .max_l_cpu = 0,
                             .mode = FLX_ENGINE_ATTN_FULL, .blk = 16, .bgt = 0.05f, .close_sessions = 1,
                             .use_gpu = 0, .cuda_device = 0, .gpu_model = NULL, .pool = NULL,
                             .sched_policy = FLX_SCHED_PRIORITY, .placement = FLX_SCHED_HYBRID, .keep_streaming = 0,
                             .fixed_blk = 0, .gpu_streams = 2};
    return p;
}

#define FLX_ENGINE_MAX_BATCH 4096u

static flx_status_t check_params(const flx_engine_params_t *p)
{
    if (p->max_batch == 0 || p->max_batch > FLX_ENGINE_MAX_BATCH)
        return flx_error_set(FLX_ERR_INVALID, "max_batch %u out of range [1, %u]", p->max_batch, FLX_ENGINE_MAX_BATCH);
    if (p->max_seqs != 0 && (p->max_seqs < p->max_batch || p->max_seqs > 64 * FLX_ENGINE_MAX_BATCH))
        return flx_error_set(FLX_ERR_INVALID, "max_seqs %u must be 0 or in [max_batch %u, %u]", p->max_seqs,
                             p->max_batch, 64 * FLX_ENGINE_MAX_BATCH);
    if (p->n_threads > FLX_POOL_MAX_WORKERS)
        return flx_error_set(FLX_ERR_INVALID, "n_threads %u out of range [0, %u]", p->n_threads, FLX_POOL_MAX_WORKERS);
    if (p->pool && (p->n_threads || p->bind_numa))
        return flx_error_set(FLX_ERR_INVALID,
                             "n_threads %u / bind_numa %d size and place the engine's own pool; with a lent pool "
                             "(params.pool) they must be 0 (create that pool with its worker count and numa_node)",
                             p->n_threads, p->bind_numa);
    switch (p->mode) {
    case FLX_ENGINE_ATTN_FULL:
        break;
    case FLX_ENGINE_ATTN_FIXED:
        if (flx_attn_blk_level(p->blk) < 0)
            return flx_error_set(FLX_ERR_INVALID, "fixed attention blk %u must be 16, 32, 64 or 128", p->blk);
        if (!(p->bgt >= 0.0f && p->bgt <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "fixed attention bgt %g must be in [0, 1]", (double)p->bgt);
        break;
    case FLX_ENGINE_ATTN_FLUXION:
        if (!p->predictor)
            return flx_error_set(FLX_ERR_INVALID, "attention mode fluxion needs a predictor (params.predictor)");
        if (p->select && flx_select_params_check(p->select)) return FLX_ERR_INVALID;
        break;
    default:
        return flx_error_set(FLX_ERR_INVALID, "attention mode %d unknown", (int)p->mode);
    }
    if (p->use_gpu != 0 && p->use_gpu != 1)
        return flx_error_set(FLX_ERR_INVALID, "use_gpu %d must be 0 or 1", p->use_gpu);
    if (p->use_gpu && p->cuda_device < 0)
        return flx_error_set(FLX_ERR_INVALID, "cuda_device %d must be >= 0", p->cuda_device);
    if (!p->use_gpu && p->gpu_model)
        return flx_error_set(FLX_ERR_INVALID, "gpu_model given but use_gpu is 0");
    if ((unsigned)p->sched_policy > FLX_SCHED_LENGTH)
        return flx_error_set(FLX_ERR_INVALID, "sched_policy %d unknown", (int)p->sched_policy);
    if ((unsigned)p->placement > FLX_SCHED_GPU_ONLY)
        return flx_error_set(FLX_ERR_INVALID, "placement %d unknown", (int)p->placement);
    if (p->placement == FLX_SCHED_GPU_ONLY && !p->use_gpu)
        return flx_error_set(FLX_ERR_INVALID, "placement gpu-only needs use_gpu 1");
    if (p->keep_streaming != 0 && p->keep_streaming != 1)
        return flx_error_set(FLX_ERR_INVALID, "keep_streaming %d must be 0 or 1", p->keep_streaming);
    if (p->fixed_blk != 0 && flx_attn_blk_level(p->fixed_blk) < 0)
        return flx_error_set(FLX_ERR_INVALID, "fixed_blk %u must be 0, 16, 32, 64 or 128", p->fixed_blk);
    if (p->mode != FLX_ENGINE_ATTN_FLUXION && (p->fixed_blk || p->keep_streaming))
        return flx_error_set(FLX_ERR_INVALID, "fixed_blk %u / keep_streaming %d are Fluxion's ablations: mode %s",
                             p->fixed_blk, p->keep_streaming, flx_engine_attn_mode_name(p->mode));
    if (p->use_gpu && p->gpu_streams > 8)
        return flx_error_set(FLX_ERR_INVALID, "gpu_streams %u not in 0..8", p->gpu_streams);
    return FLX_OK;
}

/* use_gpu: the device exists, the store keeps its windows on it, a lent model matches. */
static flx_status_t check_gpu(const flx_model_t *model, const flx_kv_store_info_t *si, const flx_engine_params_t *p)
{
    const int n_dev = flx_cuda_device_count();
    if (n_dev == 0)
        return flx_error_set(FLX_ERR_NO_DEVICE,
                             "engine: use_gpu asks for CUDA device %d but there is none (no GPU, no driver, or a "
                             "build without CUDA); create the engine with use_gpu 0 to decode on the CPU",
                             p->cuda_device);
    if (p->cuda_device >= n_dev)
        return flx_error_set(FLX_ERR_INVALID, "engine: cuda_device %d out of range (%d devices)", p->cuda_device,
                             n_dev);
    if (!si->window_on_device)
        return flx_error_set(FLX_ERR_INVALID,
                             "engine: use_gpu needs a kvstore with device windows on device %d "
                             "(FLX_KV_STORE_WINDOW_DEVICE); this store keeps its windows in host memory only",
                             p->cuda_device);
    if (si->cuda_device != p->cuda_device)
        return flx_error_set(FLX_ERR_INVALID, "engine: the kvstore keeps its device windows on device %d, not on %d",
                             si->cuda_device, p->cuda_device);
    if (!si->pinned)
        return flx_error_set(FLX_ERR_INVALID,
                             "engine: use_gpu needs a kvstore pinned for the device (FLX_KV_STORE_PIN_CUDA): the GPU "
                             "worker reads the metadata and the selected KV blocks in place through UVA");
    if (p->gpu_model) {
        flx_gpu_model_info_t gi;
        flx_gpu_model_info(p->gpu_model, &gi);
        const flx_model_config_t *a = &model->cfg, *b = gi.cfg;
        if (gi.device != p->cuda_device)
            return flx_error_set(FLX_ERR_INVALID, "engine: gpu_model is on device %d, cuda_device is %d", gi.device,
                                 p->cuda_device);
        if (a->n_layers != b->n_layers || a->hidden != b->hidden || a->n_heads != b->n_heads ||
            a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim || a->ffn != b->ffn || a->vocab != b->vocab)
            return flx_error_set(FLX_ERR_INVALID, "engine: gpu_model (%s) is not of the model's shape (%s)", b->name,
                                 a->name);
    }
    return FLX_OK;
}

/* use_gpu: the device model (unless lent), the stream, the forward workspace, the window workspace
 * and the partials' buffers. On failure the caller's destroy releases whatever was made. */
static flx_status_t create_gpu(struct flx_engine *e)
{
    const int dev = e->p.cuda_device;
    const uint32_t B = e->p.max_batch, items = B * e->Hkv;
    const size_t rows = (size_t)B * e->Hq;
    flx_status_t st;
    e->gpu = 1;
    if (e->p.gpu_model) {
        e->gm = e->p.gpu_model;
    } else {
        if ((st = flx_gpu_model_create(e->m, dev, &e->gm))) return st;
        e->gm_owned = 1;
    }
    if ((st = flx_cuda_stream_create(dev, &e->stream))) return st;
    flx_gpu_fwd_shape_t gs = {.max_prompt = 0, .max_batch = B};
    size_t fdev, fhost;
    if ((st = flx_gpu_fwd_plan(e->m, &gs, &fdev, &fhost)) || (st = flx_cuda_malloc(dev, fdev, &e->gfwd_dev)) ||
        (st = flx_cuda_host_alloc(fhost, &e->gfwd_host)) ||
        (st = flx_gpu_fwd_ws_create(e->gm, &gs, e->gfwd_dev, fdev, e->gfwd_host, fhost, &e->gws)))
        return st;
    flx_attn_gpu_shape_t ws = {.group = e->G, .head_dim = e->D, .max_items = items};
    size_t wdev, whost;
    if ((st = flx_attn_window_gpu_plan(&ws, &wdev, &whost))) return st;
    /* one block on each side: [window workspace | o_w (rows, D) | lse_w (rows)] */
    const size_t part_o = FLX_ALIGN_UP(wdev, 256), part_l = part_o + FLX_ALIGN_UP(rows * e->D * sizeof(float), 256);
    const size_t hpart_o = FLX_ALIGN_UP(whost, 256);
    const size_t hpart_l = hpart_o + FLX_ALIGN_UP(rows * e->D * sizeof(float), 256);
    if ((st = flx_cuda_malloc(dev, part_l + rows * sizeof(float), &e->gwin_dev)) ||
        (st = flx_cuda_host_alloc(hpart_l + rows * sizeof(float), &e->gwin_host)) ||
        (st = flx_attn_window_gpu_ws_init(&e->wws, &ws, e->gwin_dev, wdev, e->gwin_host, whost)))
        return st;
    e->ow_dev = (float *)((uint8_t *)e->gwin_dev + part_o);
    e->lw_dev = (float *)((uint8_t *)e->gwin_dev + part_l);
    e->ow_host = (float *)((uint8_t *)e->gwin_host + hpart_o);
    e->lw_host = (float *)((uint8_t *)e->gwin_host + hpart_l);
    e->items = calloc(items, sizeof *e->items);
    if (!e->items)
        return flx_error_set(FLX_ERR_NOMEM, "engine create: gpu window tables for %u items", items);
    if ((st = flx_cuda_host_alloc((size_t)B * 2 * e->Hkv * e->D * sizeof(flx_bf16_t), (void **)&e->kv_pinned)) ||
        (st = flx_cuda_event_create(dev, 0, &e->append_ev)))
        return st;
    return FLX_OK;
}

static void destroy_gpu(struct flx_engine *e)
{
    const int dev = e->p.cuda_device;
    flx_cuda_stream_destroy(dev, e->stream);   /* waits for anything still queued */
    flx_gpu_fwd_ws_destroy(e->gws);
    (void)flx_cuda_free(dev, e->gfwd_dev);
    (void)flx_cuda_free(dev, e->gwin_dev);
    flx_cuda_host_free(e->gfwd_host);
    flx_cuda_host_free(e->gwin_host);
    flx_cuda_host_free(e->kv_pinned);
    flx_cuda_event_destroy(dev, e->append_ev);
    if (e->gm_owned) flx_gpu_model_destroy(e->gm);
    free(e->items);
}

/* ---- create / destroy ---- */

static void seq_retire(struct flx_engine *e, uint32_t slot);

flx_status_t flx_engine_create(const flx_model_t *model, flx_kv_store_h store, const flx_engine_params_t *params,
                               flx_engine_h *engine_p)
{
    if (!model || !store || !params || !engine_p)
        return flx_error_set(FLX_ERR_INVALID, "engine create: NULL argument");
    flx_status_t st = check_params(params);
    if (st)
        return st;
    const flx_model_config_t *c = &model->cfg;
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    if (si.n_layers != c->n_layers || si.n_kv_heads != c->n_kv_heads || si.n_q_heads != c->n_heads ||
        si.head_dim != c->head_dim)
        return flx_error_set(FLX_ERR_INVALID,
                             "kvstore shape (layers %u, kv heads %u, q heads %u, head_dim %u) is not the model's "
                             "(%u, %u, %u, %u)",
                             si.n_layers, si.n_kv_heads, si.n_q_heads, si.head_dim, c->n_layers, c->n_kv_heads,
                             c->n_heads, c->head_dim);
    if (params->use_gpu && (st = check_gpu(model, &si, params)))
        return st;

    struct flx_engine *e = calloc(1, sizeof *e);
    if (!e)
        return flx_error_set(FLX_ERR_NOMEM, "engine create");
    e->m = model;
    e->store = store;
    e->p = *params;
    if (e->p.max_seqs == 0) e->p.max_seqs = e->p.max_batch;
    if (e->p.max_l_cpu == 0) e->p.max_l_cpu = c->max_ctx ? c->max_ctx : 1;
    e->Hq = c->n_heads;
    e->Hkv = c->n_kv_heads;
    e->G = c->n_heads / c->n_kv_heads;
    e->D = c->head_dim;
    e->vocab = c->vocab;
    e->next_id = 1;
    const uint32_t B = e->p.max_batch;

    if (params->pool) {
        e->pool = params->pool;
    } else {
        flx_pool_params_t pp = {0};
        if (e->p.n_threads) pp.field_mask |= FLX_POOL_FIELD_N_WORKERS, pp.n_workers = e->p.n_threads;
        if (e->p.bind_numa) pp.field_mask |= FLX_POOL_FIELD_NUMA_NODE, pp.numa_node = si.numa_node;
        if (e->p.use_gpu) pp.field_mask |= FLX_POOL_FIELD_RESERVE, pp.reserve_cpus = 1;   /* the GPU worker's core */
        if ((st = flx_pool_create(&pp, &e->pool)))
            goto fail;
        e->pool_owned = 1;
    }
    e->p.n_threads = flx_pool_size(e->pool);
    e->p.pool = e->pool;

    flx_fwd_shape_t fs = {.max_prompt = 1, .max_batch = B, .pool = e->pool};
    size_t fwd_bytes = 0;
    if ((st = flx_fwd_plan(model, &fs, &fwd_bytes)))
        goto fail;
    flx_attn_layer_params_t lp = {.n_q_heads = e->Hq, .n_kv_heads = e->Hkv, .head_dim = e->D, .max_batch = B,
                                  .max_l_cpu = e->p.max_l_cpu, .blk = e->p.blk, .bgt = e->p.bgt,
                                  .predictor = e->p.predictor};
    lp.mode = e->p.mode == FLX_ENGINE_ATTN_FULL ? FLX_LAYER_FULL
              : e->p.mode == FLX_ENGINE_ATTN_FIXED ? FLX_LAYER_FIXED : FLX_LAYER_FLUXION;
    if (e->p.mode == FLX_ENGINE_ATTN_FLUXION) {
        lp.field_mask |= FLX_ATTN_LAYER_FIELD_OPTS;
        lp.opts.keep_streaming = e->p.keep_streaming, lp.opts.fixed_blk = e->p.fixed_blk;
        if (params->select) lp.field_mask |= FLX_ATTN_LAYER_FIELD_SELECT, lp.select = *params->select;
    }
    e->p.select = NULL;   /* copied: the caller's struct need not outlive create */
    lp.sched.field_mask = FLX_SCHED_FIELD_POLICY | FLX_SCHED_FIELD_PLACEMENT | FLX_SCHED_FIELD_GPU;
    lp.sched.pool = e->pool, lp.sched.policy = e->p.sched_policy, lp.sched.placement = e->p.placement;
    lp.sched.use_gpu = e->p.use_gpu, lp.sched.cuda_device = e->p.cuda_device, lp.sched.gpu_streams = e->p.gpu_streams ? e->p.gpu_streams : 2;
    if ((st = flx_attn_layer_create(&lp, &e->attn)))
        goto fail;
    e->sample_scratch_bytes = flx_sample_scratch_bytes(e->vocab);
    if ((st = flx_pool_reserve_scratch(e->pool, e->sample_scratch_bytes)))
        goto fail;

    e->fwd_mem = flx_aligned_alloc(FLX_CACHELINE, fwd_bytes ? fwd_bytes : FLX_CACHELINE);
    e->lstats = calloc(c->n_layers, sizeof *e->lstats);
    e->bsess = calloc(B, sizeof *e->bsess);
    e->logits = flx_aligned_alloc(FLX_CACHELINE, (size_t)B * e->vocab * sizeof(float));
    e->samples = calloc(B, sizeof *e->samples);
    e->kv_bf16 = calloc((size_t)2 * e->Hkv * e->D, sizeof *e->kv_bf16);
    e->seqs = calloc(e->p.max_seqs, sizeof *e->seqs);
    e->order = calloc(e->p.max_seqs, sizeof *e->order);
    e->bseq = calloc(B, sizeof *e->bseq);
    e->btok = calloc(B, sizeof *e->btok);
    e->bpos = calloc(B, sizeof *e->bpos);
    e->bstats = calloc(B, sizeof *e->bstats);
    if (!e->fwd_mem || !e->lstats || !e->bsess || !e->logits || !e->samples || !e->kv_bf16 || !e->seqs ||
        !e->order || !e->bseq || !e->btok || !e->bpos || !e->bstats) {
        st = flx_error_set(FLX_ERR_NOMEM, "engine create: workspaces for max_batch %u, vocab %u", B, e->vocab);
        goto fail;
    }
    if ((st = flx_fwd_ws_init(model, &fs, e->fwd_mem, fwd_bytes, &e->fwd)))
        goto fail;
    if (e->p.use_gpu && (st = create_gpu(e)))
        goto fail;
    *engine_p = e;
    return FLX_OK;
fail:
    flx_engine_destroy(e);
    return st;
}

flx_pool_h flx_engine_pool(flx_engine_h e)
{
    return e ? e->pool : NULL;
}

void flx_engine_destroy(flx_engine_h e)
{
    if (!e)
        return;
    while (e->n_live) seq_retire(e, e->order[0]);
    if (e->gpu) destroy_gpu(e);
    flx_aligned_free(e->fwd_mem);
    flx_attn_layer_destroy(e->attn);
    free(e->lstats);
    free(e->bsess);
    flx_aligned_free(e->logits);
    free(e->samples);
    free(e->kv_bf16);
    free(e->seqs);
    free(e->order);
    free(e->bseq);
    free(e->btok);
    free(e->bpos);
    free(e->bstats);
    if (e->pool_owned) flx_pool_destroy(e->pool);
    free(e);
}

/* ---- sequences ---- */

static int find_slot(const struct flx_engine *e, flx_engine_seq_id_t id, uint32_t *slot_p)
{
    if (id == 0)
        return 0;
    for (uint32_t i = 0; i < e->n_live; i++)
        if (e->seqs[e->order[i]].id == id) {
            *slot_p = e->order[i];
            return 1;
        }
    return 0;
}

/* Releases the view, closes the session if the engine owns closing, frees the slot. */
static void seq_retire(struct flx_engine *e, uint32_t slot)
{
    seq_t *s = &e->seqs[slot];
    if (s->sess)
        flx_kv_session_release(s->sess);
    if (e->p.close_sessions) {
        flx_status_t st = flx_kv_session_close(e->store, s->sid);
        if (st)
            flx_log_warn("engine", "closing session %#llx of sequence %llu: %s", (unsigned long long)s->sid,
                         (unsigned long long)s->id, flx_error_msg());
    }
    memset(s, 0, sizeof *s);
    uint32_t j = 0;
    for (uint32_t i = 0; i < e->n_live; i++)
        if (e->order[i] != slot) e->order[j++] = e->order[i];
    e->n_live = j;
}

flx_status_t flx_engine_add(flx_engine_h e, flx_kv_session_id_t sid, int32_t first_token, const flx_gen_params_t *gen,
                            flx_engine_seq_id_t *seq_p)
{
    if (!e || !gen || !seq_p)
        return flx_error_set(FLX_ERR_INVALID, "engine add: NULL argument");
    if (gen->max_new_tokens == 0)
        return flx_error_set(FLX_ERR_INVALID, "max_new_tokens 0: must be >= 1 (the first token counts)");
    if (gen->n_stop > FLX_ENGINE_MAX_STOP)
        return flx_error_set(FLX_ERR_INVALID, "%u stop ids, at most %u", gen->n_stop, FLX_ENGINE_MAX_STOP);
    if (gen->n_stop && !gen->stop_ids)
        return flx_error_set(FLX_ERR_INVALID, "n_stop %u but stop_ids is NULL", gen->n_stop);
    for (uint32_t i = 0; i < gen->n_stop; i++)
        if (gen->stop_ids[i] < 0 || (uint32_t)gen->stop_ids[i] >= e->vocab)
            return flx_error_set(FLX_ERR_INVALID, "stop id %d (index %u) outside the vocabulary [0, %u)",
                                 gen->stop_ids[i], i, e->vocab);
    if (gen->eos_id < -1 || (gen->eos_id >= 0 && (uint32_t)gen->eos_id >= e->vocab))
        return flx_error_set(FLX_ERR_INVALID, "eos id %d must be -1 or in [0, %u)", gen->eos_id, e->vocab);
    if (first_token < 0 || (uint32_t)first_token >= e->vocab)
        return flx_error_set(FLX_ERR_INVALID, "first token %d outside the vocabulary [0, %u)", first_token, e->vocab);
    flx_sampler_t sampler;
    flx_status_t st = flx_sampler_init(&sampler, &gen->sampling, e->vocab);
    if (st)
        return st;
    if (e->n_live >= e->p.max_seqs)
        return flx_error_set(FLX_ERR_CAPACITY, "engine has %u live sequences (max_seqs %u)", e->n_live, e->p.max_seqs);

    flx_kv_session_info_t info;
    if ((st = flx_kv_session_info(e->store, sid, &info)))
        return st;
    if (info.state != FLX_KV_READY)
        return flx_error_set(FLX_ERR_STATE, "session %#llx is %s, not READY", (unsigned long long)sid,
                             flx_kv_state_name(info.state));
    if (info.prompt_len > e->m->cfg.max_ctx)
        return flx_error_set(FLX_ERR_INVALID, "session %#llx has a prompt of %u tokens, longer than the model's "
                             "context of %u tokens", (unsigned long long)sid, info.prompt_len, e->m->cfg.max_ctx);
    if (info.l_cpu > e->p.max_l_cpu)
        return flx_error_set(FLX_ERR_CAPACITY, "session %#llx has %u host tokens, engine planned for max_l_cpu %u",
                             (unsigned long long)sid, info.l_cpu, e->p.max_l_cpu);
    flx_kv_session_h sess;
    if ((st = flx_kv_session_acquire(e->store, sid, &sess)))
        return st;
    if (e->p.mode == FLX_ENGINE_ATTN_FLUXION) {
        const flx_head_stats_t *hs = NULL;
        const float *mk, *qa;
        if ((st = flx_kv_head_stats(sess, 0, 0, &hs, &mk, &qa)) || !hs) {
            flx_kv_session_release(sess);
            return st ? st
                      : flx_error_set(FLX_ERR_STATE, "session %#llx has no predictor statistics: the fluxion mode "
                                                     "needs them (prefill with statistics)",
                                      (unsigned long long)sid);
        }
    }
    if ((st = flx_kv_session_begin_decode(e->store, sid))) {
        flx_kv_session_release(sess);
        return st;
    }
    uint32_t slot = 0;
    while (e->seqs[slot].id != 0) slot++;   /* n_live < max_seqs: a free slot exists */
    seq_t *s = &e->seqs[slot];
    memset(s, 0, sizeof *s);
    s->id = e->next_id++;
    s->sid = sid;
    s->sess = sess;
    s->prompt_len = info.prompt_len;
    s->l_cpu = info.l_cpu;
    s->win_room = info.max_new_tokens;
    s->next = first_token;
    s->last = -1;
    s->max_new = gen->max_new_tokens;
    s->n_stop = gen->n_stop;
    if (gen->n_stop) memcpy(s->stop, gen->stop_ids, gen->n_stop * sizeof *s->stop);
    s->eos_id = gen->ignore_eos ? -1 : gen->eos_id;
    s->on_token = gen->on_token;
    s->on_logits = gen->on_logits;
    s->ctx = gen->ctx;
    s->sampler = sampler;
    e->order[e->n_live++] = slot;
    *seq_p = s->id;
    return FLX_OK;
}

/* Delivers s->next: counts it, decides whether it ends the sequence, calls back. */
static void seq_deliver(seq_t *s)
{
    int32_t t = s->next;
    s->n_gen++;
    s->last = t;
    flx_engine_finish_t why = FLX_FINISH_NONE;
    for (uint32_t i = 0; i < s->n_stop; i++)
        if (s->stop[i] == t) why = FLX_FINISH_STOP;
    if (why == FLX_FINISH_NONE && s->eos_id >= 0 && t == s->eos_id)
        why = FLX_FINISH_EOS;
    if (why == FLX_FINISH_NONE && s->n_gen >= s->max_new)
        why = FLX_FINISH_MAX_NEW;
    if (why == FLX_FINISH_NONE && s->n_fed >= s->win_room)
        why = FLX_FINISH_CAPACITY;   /* this token cannot be fed: no window row left */
    s->finish = why;
    if (s->on_token)
        s->on_token(s->ctx, s->id, t, why != FLX_FINISH_NONE, why);
}

static void seq_end_without_token(seq_t *s, flx_engine_finish_t why)
{
    s->finish = why;
    if (s->on_token)
        s->on_token(s->ctx, s->id, -1, 1, why);
}

flx_status_t flx_engine_cancel(flx_engine_h e, flx_engine_seq_id_t id)
{
    uint32_t slot;
    if (!e)
        return flx_error_set(FLX_ERR_INVALID, "engine cancel: NULL engine");
    if (!find_slot(e, id, &slot))
        return flx_error_set(FLX_ERR_NOT_FOUND, "sequence %llu is not live", (unsigned long long)id);
    seq_end_without_token(&e->seqs[slot], FLX_FINISH_CANCELED);
    seq_retire(e, slot);
    return FLX_OK;
}

flx_status_t flx_engine_seq_info(flx_engine_h e, flx_engine_seq_id_t id, flx_engine_seq_info_t *info_p)
{
    uint32_t slot;
    if (!e || !info_p)
        return flx_error_set(FLX_ERR_INVALID, "engine seq info: NULL argument");
    if (!find_slot(e, id, &slot))
        return flx_error_set(FLX_ERR_NOT_FOUND, "sequence %llu is not live", (unsigned long long)id);
    const seq_t *s = &e->seqs[slot];
    flx_engine_seq_info_t x = {.sid = s->sid, .prompt_len = s->prompt_len, .l_cpu = s->l_cpu,
                               .n_generated = s->n_gen, .last_token = s->last, .decode_ns = s->decode_ns,
                               .n_steps = s->n_steps};
    *info_p = x;
    return FLX_OK;
}

uint32_t flx_engine_n_live(flx_engine_h e)
{
    return e ? e->n_live : 0;
}

void flx_engine_last_stats(flx_engine_h e, flx_engine_stats_t *stats_p)
{
    if (e && stats_p) *stats_p = e->last;
}

void flx_engine_total_stats(flx_engine_h e, flx_engine_stats_t *stats_p)
{
    if (e && stats_p) *stats_p = e->total;
}

flx_status_t flx_engine_last_seq_stats(flx_engine_h e, flx_engine_seq_id_t seq, flx_engine_seq_stats_t *stats_p)
{
    if (!e || !stats_p) return flx_error_set(FLX_ERR_INVALID, "engine seq stats: NULL argument");
    for (uint32_t b = 0; b < e->last.n_tokens && seq; b++)
        if (e->bstats[b].seq == seq) {
            *stats_p = e->bstats[b];
            return FLX_OK;
        }
    return flx_error_set(FLX_ERR_NOT_FOUND, "sequence %llu was not in the last step", (unsigned long long)seq);
}

flx_status_t flx_engine_layer_stats(flx_engine_h e, uint32_t layer, flx_attn_layer_stats_t *stats_p)
{
    if (!e || !stats_p) return flx_error_set(FLX_ERR_INVALID, "engine layer stats: NULL argument");
    if (layer >= e->m->cfg.n_layers)
        return flx_error_set(FLX_ERR_INVALID, "engine layer stats: layer %u out of range (%u layers)", layer,
                             e->m->cfg.n_layers);
    *stats_p = e->lstats[layer];
    return FLX_OK;
}

/* ---- the attention entry point ---- */

/* Rounds the batch's new k, v (B, Hkv, D) to bf16 and appends them to each session's window (the
 * kvstore mirrors the rows into device windows). With a stream (the GPU path) the device rows are
 * queued on it from kv_pinned, each sequence its own rows, instead of two synchronous copies per
 * sequence and layer; the window kernel that reads them follows on the same stream. */
static flx_status_t append_kv(struct flx_engine *e, uint32_t layer, uint32_t B, const float *k, const float *v,
                              flx_cuda_stream_t stream)
{
    const size_t kvn = (size_t)e->Hkv * e->D;
    flx_status_t st;
    if (stream && e->append_pending) {   /* the last layer's copies have read kv_pinned */
        if ((st = flx_cuda_event_sync(e->p.cuda_device, e->append_ev))) return st;
        e->append_pending = 0;
    }
    for (uint32_t b = 0; b < B; b++) {
        flx_bf16_t *kb = stream ? e->kv_pinned + (size_t)b * 2 * kvn : e->kv_bf16, *vb = kb + kvn;
        flx_f32_to_bf16_row(k + b * kvn, kb, kvn);
        flx_f32_to_bf16_row(v + b * kvn, vb, kvn);
        st = stream ? flx_kv_window_append_async(e->bseq[b]->sess, layer, kb, vb, stream)
                    : flx_kv_window_append(e->bseq[b]->sess, layer, kb, vb);
        if (st) break;
    }
    if (stream) {   /* also after a failure: rows queued before it still read kv_pinned */
        flx_status_t rst = flx_cuda_event_record(e->p.cuda_device, e->append_ev, stream);
        if (rst == FLX_OK) e->append_pending = 1;
        else if (st == FLX_OK) st = rst;
    }
    return st;
}

/* The route's figures of one layer into the step's sums. */
static void layer_stats_add(struct flx_engine *e, uint32_t layer, const flx_attn_layer_stats_t *x)
{
    e->lstats[layer] = *x;
    const flx_sched_layer_stats_t *s = &x->sched;
    e->cur.n_tasks += s->n_tasks;
    e->cur.n_skipped += x->n_groups - x->n_tasks;
    e->cur.predict_ns += x->predict_ns;
    e->cur.decide_ns += x->decide_ns;
    e->cur.select_ns += x->select_ns;
    e->cur.feat_cpu_ns += x->feat_cpu_ns;
    e->cur.mlp_cpu_ns += x->mlp_cpu_ns;
    e->cur.window_ns += s->attn.window_ns + s->gpu_span_ns;   /* the GPU path's window kernel is its span */
    e->cur.score_ns += s->attn.score_ns;
    e->cur.topk_ns += s->attn.topk_ns;
    e->cur.host_attn_ns += s->attn.attn_ns;
    e->cur.merge_ns += s->attn.merge_ns + x->merge_ns;
    e->cur.host_bytes += s->attn.score_bytes + s->attn.attn_bytes;
    e->cur.host_meta_bytes += s->attn.score_bytes;
    e->cur.cpu_busy_ns += s->cpu_busy_ns;
    e->cur.n_gpu_tasks += s->n_gpu_tasks;
    e->cur.gpu_busy_ns += s->gpu_busy_ns;
    e->cur.gpu_idle_ns += s->gpu_idle_ns;
    e->cur.sched_wall_ns += s->wall_ns;
}

/* Index into groups_by_blk of a logical block size (16 -> 0 ... 128 -> 3). */
static uint32_t blk_index(uint32_t blk)
{
    uint32_t i = 0;
    while (i < 3 && (16u << i) < blk) i++;
    return i;
}

/* Each batch row's share of the layer that just ran: its tasks' host bytes and block sizes, its
 * streaming heads and skipped groups (FLUXION). */
static void seq_stats_add(struct flx_engine *e, uint32_t B)
{
    for (uint32_t b = 0; b < B; b++) {
        flx_engine_seq_stats_t *bs = &e->bstats[b];
        uint32_t streaming = 0, skipped = 0;
        flx_attn_layer_row_stats(e->attn, b, &streaming, &skipped);
        bs->heads += e->Hq;
        bs->groups += e->Hkv;
        bs->streaming_heads += streaming;
        bs->skipped_groups += skipped;
    }
    uint32_t n = 0;
    const flx_sched_task_t *t = flx_attn_layer_tasks(e->attn, &n);
    for (uint32_t i = 0; i < n; i++) {
        flx_engine_seq_stats_t *bs = &e->bstats[t[i].seq];
        bs->host_bytes += t[i].host_bytes;
        if (t[i].blk) bs->groups_by_blk[blk_index(t[i].blk)]++;
    }
}

/* DEFERRED window partials: the stream that computes them is past their copies to the host. */
static flx_status_t window_wait(void *ctx)
{
    struct flx_engine *e = ctx;
    flx_status_t st = flx_cuda_stream_sync(e->p.cuda_device, e->stream_used);
    if (st)
        return flx_error_set(st, "window attention on device %d: %s", e->p.cuda_device, flx_error_msg());
    return FLX_OK;
}

/* One layer through the route: the batch's sessions, q, o; window partials computed on the CPU or
 * deferred to the device (wait_ctx: the engine, whose stream the wait synchronises). */
static flx_status_t layer_run(struct flx_engine *e, uint32_t layer, uint32_t B, const float *q, float *o,
                              int deferred)
{
    for (uint32_t b = 0; b < B; b++) e->bsess[b] = e->bseq[b]->sess;
    flx_attn_layer_args_t a = {.layer = layer, .batch = B, .sess = e->bsess, .q = q, .o = o,
                               .window = FLX_LAYER_WIN_COMPUTE};
    if (deferred) a.window = FLX_LAYER_WIN_DEFERRED, a.o_win = e->ow_host, a.lse_win = e->lw_host;
    a.win_wait = window_wait, a.win_ctx = e;
    flx_attn_layer_stats_t x;
    flx_status_t st = flx_attn_layer_run(e->attn, &a, &x);
    if (!st) {
        layer_stats_add(e, layer, &x);
        seq_stats_add(e, B);
        /* a row that failed alone (its session's statistics or KV): that sequence ends, not the step */
        for (uint32_t b = 0; b < B; b++) {
            const char *why = flx_attn_layer_row_failed(e->attn, b);
            if (why && !e->samples[b].attn_failed) {
                e->samples[b].attn_failed = 1;
                snprintf(e->samples[b].msg, sizeof e->samples[b].msg, "%s", why);
            }
        }
    }
    return st;
}

/* One layer with the windows on the CPU: the appends (queued on stream when not NULL), the route. */
static flx_status_t attn_layer_host(struct flx_engine *e, uint32_t layer, uint32_t B, const float *q, const float *k,
                                    const float *v, float *o, flx_cuda_stream_t stream)
{
    if (FLX_NEVER(B != e->batch))
        return flx_error_set(FLX_ERR_INTERNAL, "attention called with batch %u, step has %u", B, e->batch);
    uint64_t t0 = flx_now_ns();
    flx_status_t st = append_kv(e, layer, B, k, v, stream);
    if (st)
        return st;
    uint64_t t1 = flx_now_ns();
    st = layer_run(e, layer, B, q, o, 0);
    e->cur.append_ns += t1 - t0;
    e->cur.attn_ns += flx_now_ns() - t0;
    return st;
}

/* flx_attn_layer_fn: q (B, Hq, D), k, v (B, Hkv, D) fp32 -> o (B, Hq, D). */
static flx_status_t attn_layer(void *ctx, uint32_t layer, uint32_t B, const float *q, const float *k, const float *v,
                               float *o)
{
    return attn_layer_host(ctx, layer, B, q, k, v, o, NULL);
}

/* flx_gpu_attn_fn of the GPU path. FULL / FIXED: window attention of every (sequence, group) on
 * the device, queued first (a span of the scheduler's GPU busy time) with the copy of its partials
 * to page-locked memory; then the route with deferred window partials: the tasks' host parts run
 * (CPU workers and the GPU worker) while the device computes the window, the route waits for the
 * stream and merges. FLUXION: the route as on the CPU path (its features give the window partials),
 * with the GPU worker taking tasks. */
static flx_status_t attn_layer_gpu(void *ctx, const flx_gpu_attn_args_t *a)
{
    struct flx_engine *e = ctx;
    if (e->p.mode == FLX_ENGINE_ATTN_FLUXION)
        return attn_layer_host(e, a->layer, a->batch, a->q, a->k, a->v, a->o, a->stream);
    const uint32_t B = a->batch, layer = a->layer, Hq = e->Hq, Hkv = e->Hkv, G = e->G, D = e->D;
    const int dev = e->p.cuda_device;
    if (FLX_NEVER(B != e->batch))
        return flx_error_set(FLX_ERR_INTERNAL, "attention called with batch %u, step has %u", B, e->batch);
    const uint64_t t0 = flx_now_ns();
    flx_status_t st = append_kv(e, layer, B, a->k, a->v, a->stream);
    if (st)
        return st;
    const uint64_t t1 = flx_now_ns();
    for (uint32_t id = 0; id < B * Hkv; id++) {
        const uint32_t b = id / Hkv, g = id % Hkv;
        const size_t r0 = (size_t)b * Hq + (size_t)g * G;
        flx_kv_head_view_t view;
        if ((st = flx_kv_head_view(e->bseq[b]->sess, layer, g, &view)))
            return st;
        if (!view.win_k_dev || view.win_device != dev)
            return flx_error_set(FLX_ERR_STATE, "layer %u sequence %llu: its session has no device window on device %d",
                                 layer, (unsigned long long)e->bseq[b]->id, dev);
        flx_attn_gpu_item_t it = {.k = view.win_k_dev, .v = view.win_v_dev, .n_win = view.n_win,
                                  .q = a->q_dev + r0 * D, .o = e->ow_dev + r0 * D, .lse = e->lw_dev + r0};
        e->items[id] = it;
    }
    const size_t rows = (size_t)B * Hq;
    e->stream_used = a->stream;
    flx_sched_h sched = flx_attn_layer_sched(e->attn);
    if ((st = flx_sched_gpu_span(sched, a->stream, 1))) {
        flx_sched_gpu_spans_drop(sched);
        return st;
    }
    st = flx_attn_window_gpu(&e->wws, e->items, B * Hkv, a->stream);
    const flx_status_t st_end = flx_sched_gpu_span(sched, a->stream, 0);   /* closed even when the launch failed */
    if (!st) st = st_end;
    if (st || (st = flx_cuda_copy_dtoh_async(dev, e->ow_host, e->ow_dev, rows * D * sizeof(float), a->stream)) ||
        (st = flx_cuda_copy_dtoh_async(dev, e->lw_host, e->lw_dev, rows * sizeof(float), a->stream))) {
        (void)flx_cuda_stream_sync(dev, a->stream);
        flx_sched_gpu_spans_drop(sched);   /* the layer will not run: its span is not counted in the next */
        return st;
    }
    st = layer_run(e, layer, B, a->q, a->o, 1);
    e->cur.append_ns += t1 - t0;
    e->cur.attn_ns += flx_now_ns() - t0;
    return st;
}

/* ---- the step ---- */

void flx_engine_stats_add(flx_engine_stats_t *a, const flx_engine_stats_t *b)
{
    a->n_steps += b->n_steps;
    a->n_tokens += b->n_tokens;
    a->step_ns += b->step_ns;
    a->dense_ns += b->dense_ns;
    a->attn_ns += b->attn_ns;
    a->append_ns += b->append_ns;
    a->sample_ns += b->sample_ns;
    a->n_tasks += b->n_tasks;
    a->window_ns += b->window_ns;
    a->score_ns += b->score_ns;
    a->topk_ns += b->topk_ns;
    a->host_attn_ns += b->host_attn_ns;
    a->merge_ns += b->merge_ns;
    a->host_bytes += b->host_bytes;
    a->host_meta_bytes += b->host_meta_bytes;
    a->dense_bytes += b->dense_bytes;
    a->predict_ns += b->predict_ns;
    a->decide_ns += b->decide_ns;
    a->select_ns += b->select_ns;
    a->feat_cpu_ns += b->feat_cpu_ns;
    a->mlp_cpu_ns += b->mlp_cpu_ns;
    a->n_skipped += b->n_skipped;
    a->cpu_busy_ns += b->cpu_busy_ns;
    a->n_gpu_tasks += b->n_gpu_tasks;
    a->gpu_busy_ns += b->gpu_busy_ns;
    a->gpu_idle_ns += b->gpu_idle_ns;
    a->sched_wall_ns += b->sched_wall_ns;
}

/* Retires every live sequence whose last token was delivered. */
static void retire_finished(struct flx_engine *e)
{
    for (uint32_t i = 0; i < e->n_live;) {
        uint32_t slot = e->order[i];
        if (e->seqs[slot].finish != FLX_FINISH_NONE)
            seq_retire(e, slot);   /* compacts order: i now names the next one */
        else
            i++;
    }
}

/* Sequences [b0, b1) of the step: their draws into e->samples (a refusal stays with its sequence). */
static flx_status_t sample_seqs(void *ctx, const flx_pool_worker_t *w, uint64_t b0, uint64_t b1)
{
    struct flx_engine *e = ctx;
    for (uint64_t b = b0; b < b1; b++) {
        sample_slot_t *x = &e->samples[b];
        if (x->attn_failed) {
            x->st = FLX_ERR_FORMAT;
            continue;
        }
        x->st = flx_sample(&e->bseq[b]->sampler, e->logits + b * e->vocab, w->scratch, w->scratch_bytes, &x->tok);
        if (x->st) snprintf(x->msg, sizeof x->msg, "%s", flx_error_msg());
    }
    return FLX_OK;
}

flx_status_t flx_engine_step(flx_engine_h e)
{
    if (!e)
        return flx_error_set(FLX_ERR_INVALID, "engine step: NULL engine");
    /* Join: deliver the first token of sequences added since the last step. */
    for (uint32_t i = 0; i < e->n_live; i++) {
        seq_t *s = &e->seqs[e->order[i]];
        if (s->n_gen == 0)
            seq_deliver(s);
    }
    retire_finished(e);
    if (e->n_live == 0)
        return FLX_OK;

    memset(&e->cur, 0, sizeof e->cur);
    uint64_t t0 = flx_now_ns();
    const uint32_t B = FLX_MIN(e->n_live, e->p.max_batch);
    for (uint32_t b = 0; b < B; b++) {
        seq_t *s = &e->seqs[e->order[b]];
        e->bseq[b] = s;
        e->btok[b] = s->next;
        e->bpos[b] = s->prompt_len + s->n_fed;
        memset(&e->bstats[b], 0, sizeof e->bstats[b]);
        e->bstats[b].seq = s->id;
        e->samples[b].attn_failed = 0;
    }
    e->batch = B;
    flx_status_t st;
    if (e->gpu) {
        flx_gpu_decode_args_t ga = {.batch = B, .tokens = e->btok, .pos = e->bpos, .attn = attn_layer_gpu, .ctx = e,
                                    .logits = e->logits};
        st = flx_gpu_model_decode(e->gm, e->gws, e->stream, &ga);
    } else {
        flx_decode_args_t da = {.batch = B, .tokens = e->btok, .pos = e->bpos, .attn = attn_layer, .ctx = e,
                                .logits = e->logits};
        st = flx_model_decode(e->m, e->fwd, &da);
    }
    e->batch = 0;
    if (st) {
        flx_log_error("engine", "decode step of %u sequences failed: %s", B, flx_error_msg());
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
        for (uint32_t b = 0; b < B; b++) seq_end_without_token(e->bseq[b], FLX_FINISH_ERROR);
        retire_finished(e);
        return flx_error_set(st, "%s", msg);
    }
    uint64_t t1 = flx_now_ns();
    /* every sequence's draw on the pool (samplers are per sequence, scratch per worker; logits are
     * only read), then the callbacks in batch order on this thread */
    (void)flx_pool_for(e->pool, B, 1, sample_seqs, e);
    for (uint32_t b = 0; b < B; b++) {
        seq_t *s = e->bseq[b];
        s->n_fed++;
        if (s->on_logits && !e->samples[b].attn_failed)
            s->on_logits(s->ctx, s->id, e->logits + (size_t)b * e->vocab, e->vocab);
        if (e->samples[b].st) {
            flx_log_error("engine", "sequence %llu: %s", (unsigned long long)s->id, e->samples[b].msg);
            seq_end_without_token(s, FLX_FINISH_ERROR);
            continue;
        }
        s->next = e->samples[b].tok;
        seq_deliver(s);
    }
    uint64_t t2 = flx_now_ns();

    flx_fwd_timing_t ft;
    if (e->gpu)
        flx_gpu_fwd_timing_get(e->gws, &ft);
    else
        flx_fwd_timing_get(e->fwd, &ft);
    e->cur.n_steps = 1;
    e->cur.n_tokens = B;
    e->cur.step_ns = t2 - t0;
    e->cur.sample_ns = t2 - t1;
    e->cur.dense_ns = ft.dense_ns;
    e->cur.dense_bytes = ft.dense_bytes;
    for (uint32_t b = 0; b < B; b++) {
        e->bseq[b]->decode_ns += t2 - t0;
        e->bseq[b]->n_steps++;
    }
    e->last = e->cur;
    flx_engine_stats_add(&e->total, &e->cur);
    retire_finished(e);
    return e->n_live ? FLX_INPROGRESS : FLX_OK;
}

/* ---- prefill: one implementation for the in-process path and a prefill node ---- */

/* Which forward pass a prefill runs: the CPU one (m, ws) or the GPU one (gm, gws, stream). */
typedef struct prefill_runner {
    const flx_model_config_t *cfg;
    const flx_model_t *m;
    flx_fwd_ws_t *ws;
    flx_gpu_model_h gm;
    flx_gpu_fwd_ws_h gws;
    flx_cuda_stream_t stream;
} prefill_runner_t;

typedef struct prefill_run_ctx {
    const flx_prefill_out_t *out;
    uint32_t n_q_heads, n_kv_heads, head_dim;
    flx_pool_h pool;              /* the statistics' bgt* searches run on it */
    flx_head_stats_t *stats;      /* (Hq) scratch, NULL without statistics */
    float *mean_k, *q_anchor;     /* (Hq, D) scratch */
} prefill_run_ctx_t;

/* The model's per-layer output, with the layer's statistics when asked for, to the sink. */
static flx_status_t run_on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                                 const float *q_last)
{
    const prefill_run_ctx_t *rc = ctx;
    const flx_prefill_out_t *o = rc->out;
    if (o->tau < 0.0f) return o->on_layer(o->ctx, layer, n, k, v, NULL, NULL, NULL);
    flx_prefill_layer_t pl = {.n_q_heads = rc->n_q_heads, .n_kv_heads = rc->n_kv_heads, .head_dim = rc->head_dim,
                              .prompt_len = n, .sink = o->sink, .local = o->local, .k = k, .v = v,
                              .tok_stride = n, .q_anchor = q_last, .tau = o->tau, .pool = rc->pool};
    flx_status_t st = flx_prefill_stats(&pl, rc->stats, rc->mean_k, rc->q_anchor);
    if (st) return st;
    return o->on_layer(o->ctx, layer, n, k, v, rc->stats, rc->mean_k, rc->q_anchor);
}

static flx_status_t prefill_run(const prefill_runner_t *r, const int32_t *tokens, uint32_t n,
                                const flx_prefill_out_t *out, float *first_logits)
{
    if (!r->cfg || !tokens || !out || !out->on_layer || !first_logits)
        return flx_error_set(FLX_ERR_INVALID, "prefill: NULL argument");
    if (n == 0) return flx_error_set(FLX_ERR_INVALID, "prefill: empty prompt");
    if (isnan(out->tau) || (out->tau >= 0.0f && !(out->tau > 0.0f && out->tau < 1.0f)))
        return flx_error_set(FLX_ERR_INVALID, "prefill: tau %g not in (0, 1)", (double)out->tau);
    const uint32_t Hq = r->cfg->n_heads, D = r->cfg->head_dim;
    prefill_run_ctx_t rc = {.out = out, .n_q_heads = Hq, .n_kv_heads = r->cfg->n_kv_heads, .head_dim = D,
                            .pool = r->ws ? flx_fwd_ws_pool(r->ws) : NULL};
    if (out->tau >= 0.0f) {
        rc.stats = malloc(Hq * sizeof *rc.stats);
        rc.mean_k = malloc((size_t)Hq * D * sizeof(float));
        rc.q_anchor = malloc((size_t)Hq * D * sizeof(float));
        if (!rc.stats || !rc.mean_k || !rc.q_anchor) {
            free(rc.stats);
            free(rc.mean_k);
            free(rc.q_anchor);
            return flx_error_set(FLX_ERR_NOMEM, "prefill: statistics of %u heads", Hq);
        }
    }
    flx_prefill_args_t pa = {.tokens = tokens, .n_tokens = n, .on_layer = run_on_layer, .ctx = &rc,
                             .logits_last = first_logits};
    flx_status_t st = r->gm ? flx_gpu_model_prefill(r->gm, r->gws, r->stream, &pa) : flx_model_prefill(r->m, r->ws, &pa);
    free(rc.stats);
    free(rc.mean_k);
    free(rc.q_anchor);
    return st;
}

flx_status_t flx_engine_prefill_run(const flx_model_t *m, flx_fwd_ws_t *ws, const int32_t *tokens, uint32_t n,
                                    const flx_prefill_out_t *out, float *first_logits)
{
    if (!m || !ws) return flx_error_set(FLX_ERR_INVALID, "prefill: NULL model or workspace");
    prefill_runner_t r = {.cfg = &m->cfg, .m = m, .ws = ws};
    return prefill_run(&r, tokens, n, out, first_logits);
}

flx_status_t flx_engine_store_layer(flx_kv_store_h store, flx_kv_session_id_t sid, uint32_t layer, uint32_t n,
                                    const flx_bf16_t *k, const flx_bf16_t *v, const flx_head_stats_t *stats,
                                    const float *mean_k, const float *q_anchor)
{
    if (!store) return flx_error_set(FLX_ERR_INVALID, "store layer: NULL store");
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    flx_kv_chunk_t c = {.layer = layer, .head_begin = 0, .head_end = si.n_kv_heads, .tok_begin = 0, .tok_end = n,
                        .dtype = FLX_DT_BF16, .head_dim = si.head_dim, .order = FLX_KV_ORDER_SPLIT};
    flx_status_t st = flx_kv_chunk_write(store, sid, &c, k, v);
    if (st || !stats) return st;
    return flx_kv_stats_write(store, sid, layer, stats, mean_k, q_anchor);
}

/* The in-process sink: each layer into a store session, as the UCX receiver would land it. */
typedef struct store_sink {
    flx_kv_store_h store;
    flx_kv_session_id_t sid;
} store_sink_t;

static flx_status_t store_on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                                   const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor)
{
    const store_sink_t *sc = ctx;
    return flx_engine_store_layer(sc->store, sc->sid, layer, n, k, v, stats, mean_k, q_anchor);
}

static flx_status_t prefill(const prefill_runner_t *r, flx_kv_store_h store, const int32_t *tokens, uint32_t n,
                            uint32_t max_new_tokens, float tau, flx_kv_session_id_t *sid_p, float *first_logits)
{
    if (!r->cfg || !store || !tokens || !sid_p || !first_logits)
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: NULL argument");
    if (n == 0)
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: empty prompt");
    if (n > r->cfg->max_ctx)   /* before the session takes any memory or a layer runs */
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: a prompt of %u tokens is longer than the model's "
                             "context of %u tokens", n, r->cfg->max_ctx);
    if (tau >= 0.0f && !(tau > 0.0f && tau < 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: tau %g not in (0, 1)", (double)tau);
    flx_kv_session_params_t sp = {.prompt_len = n, .max_new_tokens = max_new_tokens,
                                  .flags = tau < 0.0f ? FLX_KV_SESSION_NO_STATS : 0};
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    flx_kv_session_id_t sid;
    flx_status_t st = flx_kv_session_open(store, &sp, &sid);
    if (st) return st;
    store_sink_t sc = {.store = store, .sid = sid};
    flx_prefill_out_t out = {.on_layer = store_on_layer, .ctx = &sc, .tau = tau, .sink = si.sink, .local = si.local};
    if ((st = prefill_run(r, tokens, n, &out, first_logits)))
        goto fail;
    flx_kv_session_info_t info;
    if ((st = flx_kv_session_info(store, sid, &info)))
        goto fail;
    if (info.state != FLX_KV_READY) {
        st = flx_error_set(FLX_ERR_INTERNAL, "session %#llx is %s after a complete prefill of %u tokens",
                           (unsigned long long)sid, flx_kv_state_name(info.state), n);
        goto fail;
    }
    *sid_p = sid;
    return FLX_OK;
fail: {
    char msg[FLX_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", flx_error_msg());
    flx_kv_session_close(store, sid);
    return flx_error_set(st, "%s", msg);
}
}

flx_status_t flx_engine_prefill_into_store(const flx_model_t *m, flx_fwd_ws_t *ws, flx_kv_store_h store,
                                           const int32_t *tokens, uint32_t n, uint32_t max_new_tokens,
                                           flx_kv_session_id_t *sid_p, float *first_logits)
{
    if (!m || !ws)
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: NULL argument");
    prefill_runner_t r = {.cfg = &m->cfg, .m = m, .ws = ws};
    return prefill(&r, store, tokens, n, max_new_tokens, -1.0f, sid_p, first_logits);
}

flx_status_t flx_engine_prefill_with_stats(const flx_model_t *m, flx_fwd_ws_t *ws, flx_kv_store_h store,
                                           const int32_t *tokens, uint32_t n, uint32_t max_new_tokens, float tau,
                                           flx_kv_session_id_t *sid_p, float *first_logits)
{
    if (!(tau > 0.0f && tau < 1.0f))
        return flx_error_set(FLX_ERR_INVALID, "prefill with statistics: tau %g not in (0, 1)", (double)tau);
    if (!m || !ws)
        return flx_error_set(FLX_ERR_INVALID, "prefill into store: NULL argument");
    prefill_runner_t r = {.cfg = &m->cfg, .m = m, .ws = ws};
    return prefill(&r, store, tokens, n, max_new_tokens, tau, sid_p, first_logits);
}

flx_status_t flx_engine_prefill_gpu(flx_gpu_model_h gm, flx_gpu_fwd_ws_h ws, flx_cuda_stream_t stream,
                                    flx_kv_store_h store, const int32_t *tokens, uint32_t n, uint32_t max_new_tokens,
                                    float tau, flx_kv_session_id_t *sid_p, float *first_logits)
{
    if (!gm || !ws)
        return flx_error_set(FLX_ERR_INVALID, "gpu prefill into store: NULL model or workspace");
    if (isnan(tau))   /* prefill() takes tau < 0 as "no statistics" and checks (0, 1) otherwise */
        return flx_error_set(FLX_ERR_INVALID, "gpu prefill into store: tau is NaN");
    flx_gpu_model_info_t gi;
    flx_gpu_model_info(gm, &gi);
    prefill_runner_t r = {.cfg = gi.cfg, .gm = gm, .gws = ws, .stream = stream};
    return prefill(&r, store, tokens, n, max_new_tokens, tau, sid_p, first_logits);
}
