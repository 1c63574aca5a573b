/*
 * sched.c - the heterogeneous scheduler (flx/sched.h).
 *
 * DESIGN
 * Everything a layer needs is made at create: one CPU attention workspace per task (max_tasks of
 * them, planned without a pool: their chunks are handed out here) and one for the GPU worker's
 * thread, per-task chunk counters and per-worker slots on their own cache lines (busy time, timing
 * sums, the first error), the order, lane and active-task arrays, and with a GPU the streams,
 * events, device workspaces and the GPU worker's thread. A run allocates nothing.
 *
 * CPU work is two-level. The queue hands out tasks; the worker that pops one begins it (scoring,
 * top-k and the chunk plan need the whole selection, so they stay on one worker) and appends it to
 * the active list; chunks of active tasks are handed out by a per-task atomic counter, and a free
 * worker takes a chunk of the earliest active task that has one before it pops a new task. The
 * worker whose chunk completes a task (an atomic count of chunks left) ends it: the merge in chunk
 * order, so the bits never depend on who ran which chunk. A worker that finds the queue empty does
 * not leave while a task popped before is still being begun (a count of workers between pop and
 * publication, raised before the pop): it waits to help with its chunks, so the last tasks of a
 * layer are shared like the others. The static shares (UNIFORM, LENGTH) skip the helping: their
 * point is that a share is one worker's.
 *
 * Queues are index ranges of one `order` array: the shared queue is order[0, n) popped with one
 * atomic add on `next`; a static share is order[lane_begin, lane_end) popped with its own cursor
 * (atomic too, so that nothing depends on a share having one consumer). Sorting is a stable merge
 * sort into a scratch array planned for max_tasks (ties keep the given order, so the order is a
 * function of the tasks alone), replacing the engine's insertion sort.
 *
 * The GPU worker is a thread of its own, not a lane of the caller's pool: it must be free to take a
 * task the moment a stream frees up, whatever the CPU workers are doing, and it spends most of its
 * time waiting on the device. Between layers it sleeps on a condition variable; per layer it loops:
 * finish every stream whose end event completed, launch the next task on a free stream, and when
 * neither can progress block on the oldest stream's event (no busy polling of the device).
 *
 * BALANCE. Taking the next task when free is not enough once a GPU worker pulls from the same
 * queue: at a layer's start every CPU worker is free and pops, so the CPU side holds half the
 * tasks of a small batch before the GPU has finished its first, and the GPU then idles while the
 * CPU works through them (measured on an H100: the GPU done at 2.2 ms of a 5.1 ms layer). So a
 * CPU worker that is free takes the queue's next task only if the CPU side would finish it no
 * later than the GPU side would: (cpu_out + b) / cpu_rate <= (gpu_out + b) / gpu_rate, b the
 * task's estimated bytes (Eq. 3's V in bytes), cpu_out the CPU side's backlog (popped tasks' bytes
 * that no worker has started: a task's chunks until each is taken), gpu_out the bytes of the tasks
 * on the GPU's streams. Otherwise it helps, or waits (pausing) for the GPU to take the task or for
 * its own backlog to drain; a CPU side with no backlog always takes it, so the estimate can hold
 * the CPU back only while it has work of its own queued. The rates are each side's estimated bytes
 * over its busy time in earlier runs (CPU: the workers' busy time over their number; GPU: the
 * union of its task intervals), smoothed; the first run with both sides taking tasks measures
 * them, without balancing. Only placement decides this: results do not change.
 *
 * A failure marks the run stopped: nobody takes a new task, tasks already taken finish, and the
 * run reports the failure that comes first in the order. With one shared queue that is the first
 * failing task of the queue whatever the timing: every task before a popped one was popped too.
 */
#include "flx/sched.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn_gpu.h"
#include "flx/log.h"
#include "flx/pool.h"
#include "flx/util.h"

#define MOD "sched"
#define MAX_SPANS 4
#define MAX_STREAMS 8
#define MAX_WORKERS 1024

typedef struct slot {
    uint64_t busy_ns;
    uint32_t n_tasks, n_chunks;
    flx_attn_timing_t tim;
    flx_status_t st;          /* the first error of this worker in the run */
    uint32_t err_pos;         /* its task's position in order */
    char msg[FLX_ERROR_MSG_MAX];
} __attribute__((aligned(FLX_CACHELINE))) slot_t;

/* A task's chunks (CPU): handed out by next, counted down by left; ready once begun. */
typedef struct tstate {
    atomic_uint next;
    atomic_uint left;
    uint32_t n_chunks;
    uint32_t pos;             /* position in order */
    uint32_t worker;          /* who began it */
    uint64_t t_begin;
    uint64_t est;             /* host bytes estimated before it runs (task_bytes) */
    uint64_t out, share;      /* BALANCE: est counted in cpu_out when a CPU worker begins it (just popped);
                                 the begin gives back all but a share per chunk, each chunk its share
                                 when taken */
} __attribute__((aligned(FLX_CACHELINE))) tstate_t;

typedef struct gslot {
    flx_attn_host_gpu_ws_t ws;
    flx_cuda_stream_t stream;
    flx_cuda_event_t ev_begin, ev_end;
    int busy;
    uint32_t task, pos;       /* the task in flight and its position in order */
    uint64_t seq;             /* launch order: the oldest busy slot is waited on */
    float lse[FLX_ATTN_MAX_GROUP];
} gslot_t;

struct flx_sched {
    flx_sched_params_t p;     /* resolved */
    uint32_t Hq, Hkv, G, D, n_cpu;

    flx_pool_h pool;          /* borrowed; NULL: the caller alone */
    /* CPU: a workspace per task and one for the GPU worker's thread (the last); n_cpu + 1 slots */
    void *cmem;
    size_t cws_bytes;
    flx_attn_ws_t *cws;       /* (max_tasks + 1) */
    tstate_t *ts;             /* (max_tasks) */
    slot_t *slots;
    float *lse_tmp;           /* (max_tasks + 1, G) a task's lse when the layer has none */
    uint32_t *active;         /* (max_tasks) begun tasks, in the order they were begun */
    atomic_uint n_active, first_open;
    atomic_uint beginning;    /* CPU workers between a pop of the shared queue and its task's publication */

    /* the run in progress */
    flx_sched_layer_t *L;
    uint64_t t0;
    uint32_t *order;          /* (max_tasks) */
    uint32_t *tmp;            /* (max_tasks) merge sort scratch */
    uint64_t *load;           /* (n_cpu + 1) LENGTH: host tokens per share */
    uint32_t *lane_end;       /* (n_cpu + 2) */
    uint32_t n_lanes;         /* shares (static) or 1 (shared) */
    int shared;               /* PRIORITY / NO_PARALLEL / GPU_ONLY: one queue */
    int gpu_takes;            /* the GPU worker takes tasks this run */
    atomic_uint next;         /* shared queue cursor */
    atomic_uint *cursor;      /* (n_cpu + 1) static shares' cursors */
    atomic_int stop;

    /* balance (BALANCE in the DESIGN block): each side's outstanding estimated host bytes in this run
     * (the CPU's backlog, the GPU's streams), and each side's rate over earlier runs (bytes/ns; 0
     * until measured) */
    int balance;              /* this run balances */
    _Atomic uint64_t cpu_out, gpu_out;
    double cpu_rate, gpu_rate;

    /* GPU */
    int gpu;
    int dev;
    uint32_t n_streams;
    gslot_t gs[MAX_STREAMS];
    void *gdev, *ghost;
    size_t gdev_bytes, ghost_bytes;
    flx_cuda_event_t ev_ref;
    int ref_recorded;
    uint64_t t_ref_host;      /* host time of ev_ref (the start of the layer's accounting) */
    flx_cuda_event_t span_ev[MAX_SPANS][2];
    uint32_t n_spans, span_open;
    uint64_t *iv;             /* (2 * (max_tasks + MAX_SPANS)) device intervals [start, end) ns from ev_ref */
    uint32_t n_iv;
    uint64_t gpu_seq;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen, gen_done;   /* guarded by mu: runs handed to / finished by the GPU thread */
    int quit;                 /* guarded by mu */
};

/* ---- names ---- */

flx_status_t flx_sched_policy_parse(const char *s, flx_sched_policy_t *p)
{
    static const char *names[] = {"priority", "no-parallel", "uniform", "length"};
    if (!s || !p) return flx_error_set(FLX_ERR_INVALID, "scheduling policy: NULL argument");
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *p = (flx_sched_policy_t)i;
            return FLX_OK;
        }
    return flx_error_set(FLX_ERR_INVALID, "scheduling policy '%s' unknown (priority, no-parallel, uniform, length)", s);
}

const char *flx_sched_policy_name(flx_sched_policy_t p)
{
    switch (p) {
    case FLX_SCHED_PRIORITY: return "priority";
    case FLX_SCHED_NO_PARALLEL: return "no-parallel";
    case FLX_SCHED_UNIFORM: return "uniform";
    case FLX_SCHED_LENGTH: return "length";
    }
    return "unknown";
}

flx_status_t flx_sched_placement_parse(const char *s, flx_sched_placement_t *p)
{
    if (!s || !p) return flx_error_set(FLX_ERR_INVALID, "placement: NULL argument");
    if (!strcmp(s, "hybrid")) *p = FLX_SCHED_HYBRID;
    else if (!strcmp(s, "gpu-only")) *p = FLX_SCHED_GPU_ONLY;
    else return flx_error_set(FLX_ERR_INVALID, "placement '%s' unknown (hybrid, gpu-only)", s);
    return FLX_OK;
}

const char *flx_sched_placement_name(flx_sched_placement_t p)
{
    switch (p) {
    case FLX_SCHED_HYBRID: return "hybrid";
    case FLX_SCHED_GPU_ONLY: return "gpu-only";
    }
    return "unknown";
}

/* ---- create / destroy ---- */

static void *gpu_main(void *arg);

static flx_status_t create_gpu(struct flx_sched *s)
{
    flx_status_t st;
    const int dev = s->dev;
    flx_attn_host_gpu_shape_t sh = {.group = s->G, .head_dim = s->D, .max_l_cpu = s->p.max_l_cpu};
    size_t db, hb;
    if ((st = flx_attn_host_gpu_plan(&sh, &db, &hb))) return st;
    s->gdev_bytes = FLX_ALIGN_UP(db, 256);
    s->ghost_bytes = FLX_ALIGN_UP(hb, 256);
    if ((st = flx_cuda_malloc(dev, s->gdev_bytes * s->n_streams, &s->gdev)) ||
        (st = flx_cuda_host_alloc(s->ghost_bytes * s->n_streams, &s->ghost)))
        return st;
    for (uint32_t k = 0; k < s->n_streams; k++) {
        gslot_t *g = &s->gs[k];
        if ((st = flx_cuda_stream_create(dev, &g->stream)) || (st = flx_cuda_event_create(dev, 1, &g->ev_begin)) ||
            (st = flx_cuda_event_create(dev, 1, &g->ev_end)) ||
            (st = flx_attn_host_gpu_ws_init(&g->ws, &sh, (uint8_t *)s->gdev + k * s->gdev_bytes, s->gdev_bytes,
                                            (uint8_t *)s->ghost + k * s->ghost_bytes, s->ghost_bytes)))
            return st;
    }
    if ((st = flx_cuda_event_create(dev, 1, &s->ev_ref))) return st;
    for (uint32_t i = 0; i < MAX_SPANS; i++)
        for (int e = 0; e < 2; e++)
            if ((st = flx_cuda_event_create(dev, 1, &s->span_ev[i][e]))) return st;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, gpu_main, s) != 0)
        return flx_error_set(FLX_ERR_NOMEM, "scheduler: cannot start the GPU worker's thread");
    s->thread_started = 1;
    return FLX_OK;
}

flx_status_t flx_sched_create(const flx_sched_params_t *params, flx_sched_h *sched_p)
{
    if (!params || !sched_p) return flx_error_set(FLX_ERR_INVALID, "scheduler create: NULL argument");
    flx_sched_params_t p = *params;
    if (!(p.field_mask & FLX_SCHED_FIELD_POLICY)) p.policy = FLX_SCHED_PRIORITY;
    if (!(p.field_mask & FLX_SCHED_FIELD_PLACEMENT)) p.placement = FLX_SCHED_HYBRID;
    if (!(p.field_mask & FLX_SCHED_FIELD_GPU)) p.use_gpu = 0, p.cuda_device = 0, p.gpu_streams = 2;
    if (p.n_kv_heads == 0 || p.n_q_heads % p.n_kv_heads || p.n_q_heads / p.n_kv_heads > FLX_ATTN_MAX_GROUP ||
        p.n_q_heads == 0)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: %u query heads over %u kv heads (group at most %d)",
                             p.n_q_heads, p.n_kv_heads, FLX_ATTN_MAX_GROUP);
    if (p.head_dim < 16 || p.head_dim > FLX_ATTN_MAX_HEAD_DIM || p.head_dim % 16)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: head_dim %u not a multiple of 16 in 16..%d", p.head_dim,
                             FLX_ATTN_MAX_HEAD_DIM);
    if (p.max_l_cpu == 0 || p.max_tasks == 0 || p.max_tasks > (1u << 24))
        return flx_error_set(FLX_ERR_INVALID, "scheduler: max_l_cpu %u or max_tasks %u out of range", p.max_l_cpu,
                             p.max_tasks);
    if ((unsigned)p.policy > FLX_SCHED_LENGTH)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: policy %d unknown", (int)p.policy);
    if ((unsigned)p.placement > FLX_SCHED_GPU_ONLY)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: placement %d unknown", (int)p.placement);
    if (p.use_gpu != 0 && p.use_gpu != 1)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: use_gpu %d must be 0 or 1", p.use_gpu);
    if (p.placement == FLX_SCHED_GPU_ONLY && !p.use_gpu)
        return flx_error_set(FLX_ERR_INVALID, "scheduler: placement gpu-only needs a GPU worker (use_gpu 1)");
    if (p.use_gpu && (p.gpu_streams == 0 || p.gpu_streams > MAX_STREAMS || p.cuda_device < 0))
        return flx_error_set(FLX_ERR_INVALID, "scheduler: gpu_streams %u not in 1..%u or cuda_device %d negative",
                             p.gpu_streams, MAX_STREAMS, p.cuda_device);
    if (p.use_gpu && flx_cuda_device_count() <= p.cuda_device)
        return flx_error_set(FLX_ERR_NO_DEVICE,
                             "scheduler: a GPU worker on CUDA device %d asked for, but %d device(s) are usable",
                             p.cuda_device, flx_cuda_device_count());

    struct flx_sched *s = calloc(1, sizeof *s);
    if (!s) return flx_error_set(FLX_ERR_NOMEM, "scheduler");
    flx_status_t st;
    s->p = p;
    s->Hq = p.n_q_heads;
    s->Hkv = p.n_kv_heads;
    s->G = p.n_q_heads / p.n_kv_heads;
    s->D = p.head_dim;
    s->pool = p.pool;
    s->n_cpu = flx_pool_size(p.pool);
    const uint32_t W = s->n_cpu + 1, NT = p.max_tasks + 1;
    /* without a pool: their chunks are handed out by the scheduler, not by the kernels */
    flx_attn_shape_t as = {.group = s->G, .head_dim = s->D, .max_l_cpu = p.max_l_cpu, .pool = NULL};
    if ((st = flx_attn_plan(&as, &s->cws_bytes))) goto fail;
    s->cws_bytes = FLX_ALIGN_UP(s->cws_bytes, FLX_CACHELINE);
    s->cmem = flx_aligned_alloc(FLX_CACHELINE, s->cws_bytes * NT);
    s->cws = calloc(NT, sizeof *s->cws);
    s->ts = flx_aligned_alloc(FLX_CACHELINE, p.max_tasks * sizeof *s->ts);
    s->active = calloc(p.max_tasks, sizeof *s->active);
    s->slots = flx_aligned_alloc(FLX_CACHELINE, W * sizeof *s->slots);
    s->lse_tmp = calloc((size_t)NT * s->G, sizeof *s->lse_tmp);
    s->order = calloc(p.max_tasks, sizeof *s->order);
    s->tmp = calloc(p.max_tasks, sizeof *s->tmp);
    s->load = calloc(W, sizeof *s->load);
    s->lane_end = calloc(W + 1, sizeof *s->lane_end);
    s->cursor = calloc(W, sizeof *s->cursor);
    s->iv = calloc(2 * ((size_t)p.max_tasks + MAX_SPANS), sizeof *s->iv);
    if (!s->cmem || !s->cws || !s->ts || !s->active || !s->slots || !s->lse_tmp || !s->order || !s->tmp || !s->load ||
        !s->lane_end || !s->cursor || !s->iv) {
        st = flx_error_set(FLX_ERR_NOMEM, "scheduler: workspaces for %u workers and %u tasks", W, p.max_tasks);
        goto fail;
    }
    /* Touched now, not by the first layer run: a task's workspace is sized for max_l_cpu, and
     * first-touch page faults made the first call of fixed (16, 0.05) at 64K batch 4 take 21.0 ms
     * (1,441 faults) against 16.2 with the pages in (sched_bench, 2-CPU VM). The memory is the
     * scheduler's either way. */
    memset(s->cmem, 0, s->cws_bytes * NT);
    memset(s->slots, 0, W * sizeof *s->slots);
    memset(s->ts, 0, p.max_tasks * sizeof *s->ts);
    for (uint32_t i = 0; i < NT; i++)
        if ((st = flx_attn_ws_init(&s->cws[i], &as, (uint8_t *)s->cmem + (size_t)i * s->cws_bytes, s->cws_bytes)))
            goto fail;
    if (p.use_gpu) {
        s->gpu = 1;
        s->dev = p.cuda_device;
        s->n_streams = p.gpu_streams;
        if ((st = create_gpu(s))) goto fail;
    }
    *sched_p = s;
    return FLX_OK;
fail:
    flx_sched_destroy(s);
    return st;
}

void flx_sched_destroy(flx_sched_h s)
{
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->gpu) {
        for (uint32_t k = 0; k < s->n_streams; k++) {
            flx_cuda_stream_destroy(s->dev, s->gs[k].stream);   /* waits for its work */
            flx_cuda_event_destroy(s->dev, s->gs[k].ev_begin);
            flx_cuda_event_destroy(s->dev, s->gs[k].ev_end);
        }
        flx_cuda_event_destroy(s->dev, s->ev_ref);
        for (uint32_t i = 0; i < MAX_SPANS; i++)
            for (int e = 0; e < 2; e++) flx_cuda_event_destroy(s->dev, s->span_ev[i][e]);
        (void)flx_cuda_free(s->dev, s->gdev);
        flx_cuda_host_free(s->ghost);
        if (s->thread_started) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv);
        }
    }
    flx_aligned_free(s->cmem);
    free(s->cws);
    flx_aligned_free(s->ts);
    free(s->active);
    flx_aligned_free(s->slots);
    free(s->lse_tmp);
    free(s->order);
    free(s->tmp);
    free(s->load);
    free(s->lane_end);
    free(s->cursor);
    free(s->iv);
    free(s);
}

/* ---- ordering ---- */

/* Stable merge sort of idx[0, n) by key descending (NaN lowest), scratch tmp[0, n). */
static void sort_desc(uint32_t *idx, uint32_t *tmp, uint32_t n, const flx_sched_task_t *t, int by_len)
{
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            const uint32_t mid = FLX_MIN(lo + w, n), hi = FLX_MIN(lo + 2 * w, n);
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                double a, b;
                if (by_len) {
                    a = t[idx[i]].l_cpu, b = t[idx[j]].l_cpu;
                } else {
                    a = isnan(t[idx[i]].priority) ? -INFINITY : t[idx[i]].priority;
                    b = isnan(t[idx[j]].priority) ? -INFINITY : t[idx[j]].priority;
                }
                tmp[k++] = b > a ? idx[j++] : idx[i++];   /* equal: the left (earlier) one first */
            }
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

/* Fills order / lane_end for the run's policy (see POLICIES in flx/sched.h). */
static void plan_order(struct flx_sched *s, const flx_sched_layer_t *L)
{
    const uint32_t n = L->n_tasks;
    const flx_sched_task_t *t = L->tasks;
    const int gpu = s->gpu;
    for (uint32_t i = 0; i < n; i++) s->order[i] = i;
    s->shared = s->p.policy == FLX_SCHED_PRIORITY || s->p.policy == FLX_SCHED_NO_PARALLEL ||
                s->p.placement == FLX_SCHED_GPU_ONLY;
    s->gpu_takes = gpu && s->p.policy != FLX_SCHED_NO_PARALLEL;
    if (s->p.placement == FLX_SCHED_GPU_ONLY) s->gpu_takes = 1;
    atomic_store(&s->next, 0);
    if (s->shared) {
        if (s->p.policy == FLX_SCHED_PRIORITY) sort_desc(s->order, s->tmp, n, t, 0);
        s->n_lanes = 1;
        s->lane_end[0] = n;
        return;
    }
    const uint32_t lanes = s->n_cpu + (gpu ? 1 : 0);
    s->n_lanes = lanes;
    if (s->p.policy == FLX_SCHED_UNIFORM) {
        for (uint32_t l = 0; l < lanes; l++) {
            s->lane_end[l] = (uint32_t)((uint64_t)n * (l + 1) / lanes);
            atomic_store(&s->cursor[l], l ? s->lane_end[l - 1] : 0);
        }
        return;
    }
    /* LENGTH: longest first to the least-loaded share; then each share's tasks in the given order,
     * laid out share after share */
    uint32_t *byl = s->tmp;   /* reuse: sort into order, then distribute */
    sort_desc(s->order, byl, n, t, 1);
    for (uint32_t l = 0; l < lanes; l++) s->load[l] = 0;
    uint32_t *lane_of = s->tmp;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t task = s->order[i];
        uint32_t best = 0;
        for (uint32_t l = 1; l < lanes; l++)
            if (s->load[l] < s->load[best]) best = l;
        s->load[best] += t[task].l_cpu ? t[task].l_cpu : 1;
        lane_of[task] = best;
    }
    uint32_t k = 0;
    for (uint32_t l = 0; l < lanes; l++) {
        atomic_store(&s->cursor[l], k);
        for (uint32_t i = 0; i < n; i++)
            if (lane_of[i] == l) s->order[k++] = i;
        s->lane_end[l] = k;
    }
}

/* The next task of lane (shared queue, or the static share `lane`) and its position in order; 0
 * when there is none. */
static int pop(struct flx_sched *s, uint32_t lane, uint32_t *task_p, uint32_t *pos_p)
{
    if (atomic_load_explicit(&s->stop, memory_order_relaxed)) return 0;
    uint32_t i, end;
    if (s->shared) {
        i = atomic_fetch_add(&s->next, 1);
        end = s->lane_end[0];
    } else {
        i = atomic_fetch_add(&s->cursor[lane], 1);
        end = s->lane_end[lane];
    }
    if (i >= end) return 0;
    *task_p = s->order[i];
    *pos_p = i;
    return 1;
}

/* ---- running a task ---- */

static void task_cfg(const flx_sched_task_t *t, flx_attn_cfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    if (t->blk == 0) {
        cfg->mode = FLX_ATTN_FULL;
    } else if (t->budgets) {
        cfg->mode = FLX_ATTN_SPARSE, cfg->blk = t->blk, cfg->budgets = t->budgets;
    } else {
        cfg->mode = FLX_ATTN_FIXED, cfg->blk = t->blk, cfg->budget = t->budget;
    }
}

/* Records a failure of worker slot w (task i at position pos of order, status st, message now in
 * flx_error_msg()), keeping the earliest in order, and stops the run. */
static void fail(struct flx_sched *s, uint32_t w, uint32_t i, uint32_t pos, flx_status_t st)
{
    slot_t *sl = &s->slots[w];
    if (!sl->st || pos < sl->err_pos) {
        const flx_sched_task_t *t = &s->L->tasks[i];
        snprintf(sl->msg, sizeof sl->msg, "layer %u task %u (batch row %u, kv group %u): %s", s->L->layer, i, t->seq,
                 t->kv_group, flx_error_msg());
        sl->st = st;
        sl->err_pos = pos;
    }
    atomic_store(&s->stop, 1);
}

/* The rows of task i: o, and lse (the layer's, or the task's scratch row). */
static void task_rows(const struct flx_sched *s, uint32_t i, float **o_p, float **lse_p, size_t *r0_p)
{
    const flx_sched_layer_t *L = s->L;
    const flx_sched_task_t *t = &L->tasks[i];
    const size_t r0 = (size_t)t->seq * s->Hq + (size_t)t->kv_group * s->G;
    *o_p = L->o + r0 * s->D;
    *lse_p = L->lse ? L->lse + r0 : s->lse_tmp + (size_t)i * s->G;
    *r0_p = r0;
}

/* Host bytes task t reads, estimated before it runs: its priority, Eq. 3's V in host rows of D
 * bf16 (a NaN or negative one: nothing). */
static uint64_t task_bytes(const struct flx_sched *s, const flx_sched_task_t *t)
{
    return t->priority > 0 ? (uint64_t)((double)t->priority * s->D * sizeof(flx_bf16_t)) : 0;
}

/* BALANCE: 1 when the CPU side should leave the queue's next task to the GPU worker. */
static int leave_to_gpu(struct flx_sched *s)
{
    const uint32_t at = atomic_load_explicit(&s->next, memory_order_relaxed);
    if (at >= s->lane_end[0]) return 0;   /* nothing left: the caller's pop ends its lane */
    const uint64_t cpu = atomic_load_explicit(&s->cpu_out, memory_order_relaxed);
    if (cpu == 0) return 0;
    const double b = (double)s->ts[s->order[at]].est;
    const double gpu = (double)atomic_load_explicit(&s->gpu_out, memory_order_relaxed);
    return ((double)cpu + b) / s->cpu_rate > (gpu + b) / s->gpu_rate;
}

/* Begins task i (position pos) on worker w: scoring, top-k, chunk plan on the task's workspace.
 * Returns its chunk count; 0 means the task is complete (nothing to read: ended here). */
static flx_status_t cpu_begin(struct flx_sched *s, uint32_t w, uint32_t i, uint32_t pos, uint32_t *n_p)
{
    const flx_sched_layer_t *L = s->L;
    flx_sched_task_t *t = &L->tasks[i];
    tstate_t *ts = &s->ts[i];
    const uint64_t a = flx_now_ns();
    t->start_ns = a - s->t0;
    t->worker = (int32_t)w;
    ts->pos = pos, ts->worker = w, ts->t_begin = a;
    ts->out = w < s->n_cpu ? ts->est : 0;   /* BALANCE: the CPU side's now (not the GPU thread's fallback) */
    atomic_fetch_add_explicit(&s->cpu_out, ts->out, memory_order_relaxed);
    float *o, *lse;
    size_t r0;
    task_rows(s, i, &o, &lse, &r0);
    flx_kv_head_view_t view;
    flx_attn_cfg_t cfg;
    task_cfg(t, &cfg);
    uint32_t n = 0;
    flx_status_t st = flx_kv_head_view(L->sess[t->seq], L->layer, t->kv_group, &view);
    if (!st)
        st = flx_attn_task_begin(&s->cws[i], &view, L->q + r0 * s->D, &cfg, L->window == FLX_SCHED_WIN_COMPUTE, &n);
    s->slots[w].busy_ns += flx_now_ns() - a;
    if (st) {
        atomic_fetch_sub_explicit(&s->cpu_out, ts->out, memory_order_relaxed);
        fail(s, w, i, pos, st);
        return st;
    }
    /* begun: what is left is its chunks, a share each, given back as they are taken */
    ts->share = ts->out / ((uint64_t)n + 1);
    atomic_fetch_sub_explicit(&s->cpu_out, ts->out - (uint64_t)n * ts->share, memory_order_relaxed);
    *n_p = n;
    return FLX_OK;
}

/* The merge of task i, once its last chunk is done, by worker w. */
static void cpu_end(struct flx_sched *s, uint32_t w, uint32_t i)
{
    const flx_sched_layer_t *L = s->L;
    flx_sched_task_t *t = &L->tasks[i];
    const uint64_t a = flx_now_ns();
    float *o, *lse;
    size_t r0;
    task_rows(s, i, &o, &lse, &r0);
    flx_attn_timing_t tim = {0};
    flx_status_t st = flx_attn_task_end(&s->cws[i], o, lse, &tim);
    if (st) {
        fail(s, w, i, s->ts[i].pos, st);
        return;
    }
    if (L->window == FLX_SCHED_WIN_GIVEN) {
        const uint64_t m0 = flx_now_ns();
        flx_attn_merge(s->G, s->D, L->o_win + r0 * s->D, L->lse_win + r0, o, lse, o, lse);
        tim.merge_ns += flx_now_ns() - m0;
    }
    const uint64_t b = flx_now_ns();
    t->end_ns = b - s->t0;
    t->host_bytes = tim.score_bytes + tim.attn_bytes;
    slot_t *sl = &s->slots[w];
    sl->busy_ns += b - a;
    sl->n_tasks++;
    flx_attn_timing_add(&sl->tim, &tim);
}

/* Chunk c of task i on worker w; the worker that completes the task ends it. */
static void cpu_chunk(struct flx_sched *s, uint32_t w, uint32_t i, uint32_t c)
{
    atomic_fetch_sub_explicit(&s->cpu_out, s->ts[i].share, memory_order_relaxed);   /* taken */
    const uint64_t a = flx_now_ns();
    flx_status_t st = flx_attn_task_chunk(&s->cws[i], c);
    slot_t *sl = &s->slots[w];
    sl->busy_ns += flx_now_ns() - a;
    sl->n_chunks++;
    if (st) {
        fail(s, w, i, s->ts[i].pos, st);
        return;
    }
    if (atomic_fetch_sub(&s->ts[i].left, 1) == 1) cpu_end(s, w, i);
}

/* A whole task on worker w, every chunk here (static shares, the GPU worker's fallback). */
static void cpu_whole(struct flx_sched *s, uint32_t w, uint32_t i, uint32_t pos)
{
    uint32_t n;
    if (cpu_begin(s, w, i, pos, &n)) return;
    atomic_store(&s->ts[i].left, n);
    if (n == 0) {
        cpu_end(s, w, i);
        return;
    }
    for (uint32_t c = 0; c < n; c++) cpu_chunk(s, w, i, c);   /* a taken task finishes, even in a failed run */
}

/* One chunk of the earliest begun task that still has one, on worker w; 0 when there is none. */
static int help(struct flx_sched *s, uint32_t w)
{
    const uint32_t na = atomic_load(&s->n_active);
    for (uint32_t a = atomic_load(&s->first_open); a < na; a++) {
        const uint32_t i = atomic_load_explicit((_Atomic uint32_t *)&s->active[a], memory_order_acquire);
        if (i == UINT32_MAX) continue;   /* being published */
        tstate_t *ts = &s->ts[i];
        if (atomic_load(&ts->next) >= ts->n_chunks) {
            uint32_t f = a;   /* every earlier one is handed out too: move the scan's start */
            if (f == atomic_load(&s->first_open)) atomic_compare_exchange_strong(&s->first_open, &f, a + 1);
            continue;
        }
        const uint32_t c = atomic_fetch_add(&ts->next, 1);
        if (c >= ts->n_chunks) continue;
        cpu_chunk(s, w, i, c);
        return 1;
    }
    return 0;
}

/* Begins task i popped from the shared queue on worker w and publishes its chunks to the helpers
 * (or ends it here when it has none). */
static void cpu_start(struct flx_sched *s, uint32_t w, uint32_t i, uint32_t pos)
{
    uint32_t n;
    if (cpu_begin(s, w, i, pos, &n)) return;
    tstate_t *ts = &s->ts[i];
    ts->n_chunks = n;
    atomic_store(&ts->next, 0);
    atomic_store(&ts->left, n);
    if (n == 0) {
        cpu_end(s, w, i);
        return;
    }
    const uint32_t a = atomic_fetch_add(&s->n_active, 1);   /* publish: helpers take its chunks */
    atomic_store_explicit((_Atomic uint32_t *)&s->active[a], i, memory_order_release);
}

/* A CPU worker's lane: the static share `lane`, or the shared queue with helping. */
static flx_status_t cpu_lane(void *arg, const flx_pool_worker_t *pw, uint64_t l0, uint64_t l1)
{
    struct flx_sched *s = arg;
    const uint32_t w = pw ? pw->index : 0;
    if (FLX_NEVER(w >= s->n_cpu))
        return flx_error_set(FLX_ERR_INTERNAL, "scheduler: pool worker %u of %u", w, s->n_cpu);
    uint32_t waits = 0;
    for (uint64_t lane = l0; lane < l1; lane++) {
        uint32_t i, pos;
        if (!s->shared) {
            while (pop(s, (uint32_t)lane, &i, &pos)) cpu_whole(s, w, i, pos);
            continue;
        }
        int empty = 0;   /* the queue gave nothing: it stays empty for this run */
        for (;;) {
            if (help(s, w)) continue;
            if (!empty && !atomic_load_explicit(&s->stop, memory_order_relaxed)) {
                if (s->balance && leave_to_gpu(s)) {   /* the GPU worker may need this CPU after a while */
                    if (++waits % 256 == 0) sched_yield();
                    else flx_cpu_relax();
                    continue;
                }
                /* counted before the pop: a worker that finds the queue empty then sees every task
                 * popped before that and not yet published, and helps with it once it is */
                atomic_fetch_add(&s->beginning, 1);
                if (pop(s, 0, &i, &pos)) {
                    cpu_start(s, w, i, pos);
                    atomic_fetch_sub(&s->beginning, 1);
                    continue;
                }
                atomic_fetch_sub(&s->beginning, 1);
                empty = 1;
            }
            /* nothing to pop (or the run failed): help until no begun task has a chunk left and no
             * popped task is still being begun, so the last tasks of a layer are shared too, and
             * every task some worker took is finished */
            const uint32_t seen = atomic_load(&s->n_active);
            if (atomic_load(&s->beginning) == 0) {
                if (!help(s, w)) break;
                continue;
            }
            /* one is being begun: wait for a publication reading two counters, not the tasks'
             * lines the beginner writes */
            while (atomic_load_explicit(&s->n_active, memory_order_relaxed) == seen &&
                   atomic_load_explicit(&s->beginning, memory_order_relaxed) != 0) {
                if (++waits % 256 == 0) sched_yield();
                else flx_cpu_relax();
            }
        }
    }
    return FLX_OK;
}

/* ---- the GPU worker ---- */

/* Device time of e from ev_ref, in ns (0 for events before it). */
static flx_status_t dev_time(struct flx_sched *s, flx_cuda_event_t e, uint64_t *ns_p)
{
    return flx_cuda_event_elapsed_ns(s->dev, s->ev_ref, e, ns_p);
}

static flx_status_t add_interval(struct flx_sched *s, flx_cuda_event_t b, flx_cuda_event_t e, uint64_t *len_p)
{
    uint64_t x = 0, y = 0;
    flx_status_t st = flx_cuda_event_sync(s->dev, s->ev_ref);   /* its stream may lag behind b's */
    if (!st) st = dev_time(s, b, &x);
    if (!st) st = dev_time(s, e, &y);
    if (st) return st;
    if (y < x) y = x;
    s->iv[2 * s->n_iv] = x;
    s->iv[2 * s->n_iv + 1] = y;
    s->n_iv++;
    if (len_p) *len_p = y - x;
    return FLX_OK;
}

/* Launches task i on stream slot k (or runs it here on the CPU when its session has no device
 * addresses). Returns 1 when it is in flight on the device. */
static int gpu_launch(struct flx_sched *s, uint32_t k, uint32_t i, uint32_t pos)
{
    const flx_sched_layer_t *L = s->L;
    flx_sched_task_t *t = &L->tasks[i];
    const uint32_t G = s->G, D = s->D, w = s->n_cpu;
    const size_t r0 = (size_t)t->seq * s->Hq + (size_t)t->kv_group * G;
    flx_kv_head_view_t view;
    flx_status_t st = flx_kv_head_view(L->sess[t->seq], L->layer, t->kv_group, &view);
    if (st) {
        fail(s, w, i, pos, st);
        return 0;
    }
    if (view.host_device != s->dev || !view.block_table_dev) {   /* not pinned: the CPU kernels, here */
        cpu_whole(s, w, i, pos);   /* a failure is in the slot */
        return 0;
    }
    gslot_t *g = &s->gs[k];
    const uint64_t a = flx_now_ns();
    t->start_ns = a - s->t0;
    flx_attn_cfg_t cfg;
    task_cfg(t, &cfg);
    const float *ow = NULL, *lw = NULL;
    if (L->window == FLX_SCHED_WIN_GIVEN) {
        ow = L->o_win + r0 * D, lw = L->lse_win + r0;
    } else if (L->window == FLX_SCHED_WIN_COMPUTE) {   /* the host window, on this thread */
        flx_attn_ws_t *cw = &s->cws[s->p.max_tasks];
        if ((st = flx_attn_window(cw, &view, L->q + r0 * D, cw->o_win, cw->lse_win))) {
            fail(s, w, i, pos, st);
            return 0;
        }
        ow = cw->o_win, lw = cw->lse_win;   /* copied into the staging by the launch */
    }
    if ((st = flx_cuda_event_record(s->dev, g->ev_begin, g->stream)) ||
        (st = flx_attn_host_gpu(&g->ws, &view, L->q + r0 * D, &cfg, ow, lw, g->stream)) ||
        (st = flx_cuda_event_record(s->dev, g->ev_end, g->stream))) {
        fail(s, w, i, pos, st);
        (void)flx_cuda_stream_sync(s->dev, g->stream);   /* nothing queued may still use the staging */
        g->ws.pending = 0;
        return 0;
    }
    g->busy = 1;
    g->task = i;
    g->pos = pos;
    g->seq = s->gpu_seq++;
    atomic_fetch_add_explicit(&s->gpu_out, s->ts[i].est, memory_order_relaxed);
    return 1;
}

/* Stream slot k's task completed on the device: its result into the layer. */
static void gpu_finish(struct flx_sched *s, uint32_t k)
{
    const flx_sched_layer_t *L = s->L;
    gslot_t *g = &s->gs[k];
    const uint32_t i = g->task, pos = g->pos, G = s->G, D = s->D, w = s->n_cpu;
    flx_sched_task_t *t = &L->tasks[i];
    const size_t r0 = (size_t)t->seq * s->Hq + (size_t)t->kv_group * G;
    g->busy = 0;
    atomic_fetch_sub_explicit(&s->gpu_out, s->ts[i].est, memory_order_relaxed);
    flx_attn_timing_t tim = {0};
    uint64_t dev_ns = 0;
    flx_status_t st = flx_attn_host_gpu_finish(&g->ws, L->o + r0 * D, L->lse ? L->lse + r0 : g->lse, &tim);
    if (!st) st = add_interval(s, g->ev_begin, g->ev_end, &dev_ns);
    if (st) {
        fail(s, w, i, pos, st);
        return;
    }
    t->end_ns = flx_now_ns() - s->t0;
    t->worker = FLX_SCHED_GPU;
    t->host_bytes = tim.score_bytes + tim.attn_bytes;
    tim.attn_ns = dev_ns;
    flx_attn_timing_add(&s->slots[w].tim, &tim);
    s->slots[w].n_tasks++;
}

/* The GPU worker's part of one run. */
static void gpu_layer(struct flx_sched *s)
{
    const uint32_t lane = s->shared ? 0 : s->n_cpu;
    int more = s->gpu_takes;
    for (;;) {
        int progressed = 0, busy = 0;
        for (uint32_t k = 0; k < s->n_streams; k++) {
            if (!s->gs[k].busy) continue;
            flx_status_t q = flx_cuda_event_query(s->dev, s->gs[k].ev_end);
            if (q == FLX_OK) {
                gpu_finish(s, k);
                progressed = 1;
            } else if (q < 0) {
                s->gs[k].busy = 0;
                atomic_fetch_sub_explicit(&s->gpu_out, s->ts[s->gs[k].task].est, memory_order_relaxed);
                (void)flx_cuda_stream_sync(s->dev, s->gs[k].stream);
                s->gs[k].ws.pending = 0;
                fail(s, s->n_cpu, s->gs[k].task, s->gs[k].pos, q);
            } else {
                busy++;
            }
        }
        for (uint32_t k = 0; more && k < s->n_streams; k++) {
            if (s->gs[k].busy) continue;
            uint32_t i, pos;
            if (!pop(s, lane, &i, &pos)) {
                more = 0;
                break;
            }
            busy += gpu_launch(s, k, i, pos);
            progressed = 1;
        }
        if (!busy && !more) return;
        if (!progressed) {   /* every stream busy, or nothing left to launch: wait for the oldest */
            uint32_t oldest = UINT32_MAX;
            for (uint32_t k = 0; k < s->n_streams; k++)
                if (s->gs[k].busy && (oldest == UINT32_MAX || s->gs[k].seq < s->gs[oldest].seq)) oldest = k;
            if (oldest != UINT32_MAX)   /* a failure shows in the next pass's query, which fails the task */
                (void)flx_cuda_event_sync(s->dev, s->gs[oldest].ev_end);
        }
    }
}

static void *gpu_main(void *arg)
{
    struct flx_sched *s = arg;
    uint64_t seen = 0;
    int cpu;
    /* the core the pool keeps for a dedicated thread, when it keeps one */
    if (s->pool && flx_pool_reserved_cpus(s->pool, &cpu, 1) > 0 && flx_pool_bind_reserved(s->pool) != FLX_OK)
        flx_log_warn(MOD, "the GPU worker's thread could not move to the pool's reserved CPU: %s", flx_error_msg());
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->gen == seen && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        seen = s->gen;
        pthread_mutex_unlock(&s->mu);
        gpu_layer(s);
        pthread_mutex_lock(&s->mu);
        s->gen_done = seen;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

static void record_ref(struct flx_sched *s, flx_cuda_stream_t stream)
{
    if (s->ref_recorded) return;
    if (flx_cuda_event_record(s->dev, s->ev_ref, stream) == FLX_OK) {
        s->ref_recorded = 1;
        s->t_ref_host = flx_now_ns();
    }
}

flx_status_t flx_sched_gpu_span(flx_sched_h s, flx_cuda_stream_t stream, int begin)
{
    if (!s) return flx_error_set(FLX_ERR_INVALID, "scheduler gpu span: NULL scheduler");
    if (!s->gpu) return flx_error_set(FLX_ERR_INVALID, "scheduler gpu span: the scheduler has no GPU worker");
    if (begin ? s->span_open || s->n_spans >= MAX_SPANS : !s->span_open)
        return flx_error_set(FLX_ERR_INVALID, "scheduler gpu span: %s without a matching %s (%u of %d spans)",
                             begin ? "begin" : "end", begin ? "end" : "begin", s->n_spans, MAX_SPANS);
    if (begin) record_ref(s, stream);
    flx_status_t st = flx_cuda_event_record(s->dev, s->span_ev[s->n_spans][begin ? 0 : 1], stream);
    if (st) return st;
    if (begin) {
        s->span_open = 1;
    } else {
        s->span_open = 0;
        s->n_spans++;
    }
    return FLX_OK;
}

void flx_sched_gpu_spans_drop(flx_sched_h s)
{
    if (!s) return;
    s->n_spans = s->span_open = 0;
    s->ref_recorded = 0;
}

/* ---- the run ---- */

static flx_status_t check_layer(const struct flx_sched *s, const flx_sched_layer_t *L)
{
    if (!L) return flx_error_set(FLX_ERR_INVALID, "scheduler run: layer is NULL");
    if (L->n_tasks > s->p.max_tasks)
        return flx_error_set(FLX_ERR_INVALID, "scheduler run: %u tasks, planned for max_tasks %u", L->n_tasks,
                             s->p.max_tasks);
    if (L->n_tasks && (!L->tasks || !L->sess || !L->q || !L->o))
        return flx_error_set(FLX_ERR_INVALID, "scheduler run: NULL tasks, sess, q or o");
    if ((unsigned)L->window > FLX_SCHED_WIN_NONE)
        return flx_error_set(FLX_ERR_INVALID, "scheduler run: window %d unknown", (int)L->window);
    if (L->window == FLX_SCHED_WIN_GIVEN && L->n_tasks && (!L->o_win || !L->lse_win))
        return flx_error_set(FLX_ERR_INVALID, "scheduler run: window GIVEN without o_win / lse_win");
    if (L->window == FLX_SCHED_WIN_NONE && L->n_tasks && !L->lse)
        return flx_error_set(FLX_ERR_INVALID, "scheduler run: window NONE needs lse for the caller's merge");
    for (uint32_t i = 0; i < L->n_tasks; i++) {
        const flx_sched_task_t *t = &L->tasks[i];
        if (t->seq >= L->batch || !L->sess[t->seq] || t->kv_group >= s->Hkv)
            return flx_error_set(FLX_ERR_INVALID, "scheduler run: task %u batch row %u (batch %u) or kv group %u (%u) "
                                                  "out of range, or its session NULL",
                                 i, t->seq, L->batch, t->kv_group, s->Hkv);
        if (t->blk != 0 && flx_attn_blk_level(t->blk) < 0)
            return flx_error_set(FLX_ERR_INVALID, "scheduler run: task %u blk %u not 0, 16, 32, 64 or 128", i, t->blk);
        if (t->blk && !t->budgets && !(t->budget >= 0.0f && t->budget <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "scheduler run: task %u budget %g not in [0, 1]", i, (double)t->budget);
        if (t->blk && t->budgets)
            for (uint32_t h = 0; h < s->G; h++)
                if (!(t->budgets[h] >= 0.0f && t->budgets[h] <= 1.0f))
                    return flx_error_set(FLX_ERR_INVALID, "scheduler run: task %u head %u budget %g not in [0, 1]", i,
                                         h, (double)t->budgets[h]);
    }
    return FLX_OK;
}

/* Busy time: the union of the intervals, sorted by start (insertion into place: few per layer). */
static uint64_t union_ns(uint64_t *iv, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        const uint64_t a = iv[2 * i], b = iv[2 * i + 1];
        uint32_t j = i;
        for (; j > 0 && iv[2 * (j - 1)] > a; j--) iv[2 * j] = iv[2 * (j - 1)], iv[2 * j + 1] = iv[2 * (j - 1) + 1];
        iv[2 * j] = a, iv[2 * j + 1] = b;
    }
    uint64_t tot = 0, cs = 0, ce = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (i == 0 || iv[2 * i] > ce) {
            tot += ce - cs;
            cs = iv[2 * i], ce = iv[2 * i + 1];
        } else if (iv[2 * i + 1] > ce) {
            ce = iv[2 * i + 1];
        }
    }
    return n ? tot + (ce - cs) : 0;
}

/* BALANCE: each side's rate from this run (estimated bytes over busy time), smoothed over runs. */
static void update_rates(struct flx_sched *s, const flx_sched_layer_t *L, uint64_t gpu_busy_ns)
{
    double cpu_b = 0, gpu_b = 0;
    for (uint32_t i = 0; i < L->n_tasks; i++) {
        const int32_t w = L->tasks[i].worker;
        if (w == FLX_SCHED_GPU) gpu_b += (double)s->ts[i].est;
        else if (w >= 0 && w < (int32_t)s->n_cpu) cpu_b += (double)s->ts[i].est;
    }
    uint64_t cpu_busy = 0;
    for (uint32_t w = 0; w < s->n_cpu; w++) cpu_busy += s->slots[w].busy_ns;
    if (cpu_b > 0 && cpu_busy > 0) {
        const double r = cpu_b * s->n_cpu / (double)cpu_busy;
        s->cpu_rate = s->cpu_rate > 0 ? 0.5 * (s->cpu_rate + r) : r;
    }
    if (gpu_b > 0 && gpu_busy_ns > 0) {
        const double r = gpu_b / (double)gpu_busy_ns;
        s->gpu_rate = s->gpu_rate > 0 ? 0.5 * (s->gpu_rate + r) : r;
    }
}

flx_status_t flx_sched_run(flx_sched_h s, flx_sched_layer_t *L, flx_sched_layer_stats_t *stats)
{
    if (!s) return flx_error_set(FLX_ERR_INVALID, "scheduler run: NULL scheduler");
    flx_status_t st = check_layer(s, L);
    if (!st && s->span_open) st = flx_error_set(FLX_ERR_INVALID, "scheduler run: a GPU span was begun and not ended");
    if (st) {   /* the spans marked for this layer go with it: none is counted in a later one */
        flx_sched_gpu_spans_drop(s);
        return st;
    }
    const uint64_t t_start = flx_now_ns();
    s->t0 = t_start;
    s->L = L;
    atomic_store(&s->stop, 0);
    const uint32_t W = s->n_cpu + 1;
    for (uint32_t w = 0; w < W; w++) {
        slot_t *sl = &s->slots[w];
        sl->busy_ns = 0, sl->n_tasks = 0, sl->n_chunks = 0, sl->st = FLX_OK, sl->err_pos = UINT32_MAX;
        memset(&sl->tim, 0, sizeof sl->tim);
    }
    for (uint32_t i = 0; i < L->n_tasks; i++) {
        L->tasks[i].worker = FLX_SCHED_NOT_RUN;
        L->tasks[i].start_ns = L->tasks[i].end_ns = 0;
    }
    plan_order(s, L);
    for (uint32_t i = 0; i < L->n_tasks; i++) s->ts[i].est = task_bytes(s, &L->tasks[i]);
    atomic_store(&s->cpu_out, 0);
    atomic_store(&s->gpu_out, 0);
    /* BALANCE applies when both sides pull from the one queue; it runs once both rates are known */
    const int both_pull = s->gpu_takes && s->shared && s->p.placement == FLX_SCHED_HYBRID;
    s->balance = both_pull && s->cpu_rate > 0 && s->gpu_rate > 0;
    atomic_store(&s->n_active, 0);
    atomic_store(&s->first_open, 0);
    atomic_store(&s->beginning, 0);
    for (uint32_t i = 0; i < L->n_tasks; i++) s->active[i] = UINT32_MAX;
    s->n_iv = 0;
    int woke = 0;
    if (s->gpu) {
        record_ref(s, s->gs[0].stream);
        if (s->gpu_takes && L->n_tasks) {
            pthread_mutex_lock(&s->mu);
            s->gen++;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            woke = 1;
        }
    }
    const uint32_t cpu_lanes = s->p.placement == FLX_SCHED_GPU_ONLY || !L->n_tasks ? 0 : s->n_cpu;
    flx_status_t pst = cpu_lanes ? flx_pool_for(s->pool, cpu_lanes, 1, cpu_lane, s) : FLX_OK;
    if (pst) atomic_store(&s->stop, 1);
    if (woke) {
        pthread_mutex_lock(&s->mu);
        while (s->gen_done != s->gen) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    const uint64_t task_busy_ns = s->gpu ? union_ns(s->iv, s->n_iv) : 0;   /* the tasks' intervals only */
    /* the spans the caller marked (its window kernel): they must be complete to be read */
    uint64_t span_ns = 0;
    for (uint32_t i = 0; i < s->n_spans; i++) {
        uint64_t len = 0;
        if (flx_cuda_event_sync(s->dev, s->span_ev[i][1]) == FLX_OK &&
            add_interval(s, s->span_ev[i][0], s->span_ev[i][1], &len) == FLX_OK)
            span_ns += len;
    }
    const uint64_t t_end = flx_now_ns();
    const uint64_t t_first = s->gpu && s->ref_recorded && s->t_ref_host < t_start ? s->t_ref_host : t_start;
    s->n_spans = 0;
    s->ref_recorded = 0;
    s->L = NULL;

    /* the failure earliest in order, else the parallel runner's own */
    flx_status_t fst = FLX_OK;
    uint32_t fpos = UINT32_MAX, fw = 0;
    for (uint32_t w = 0; w < W; w++)
        if (s->slots[w].st && s->slots[w].err_pos < fpos) fpos = s->slots[w].err_pos, fw = w, fst = s->slots[w].st;
    if (!fst && !pst && both_pull) update_rates(s, L, task_busy_ns);
    if (stats) {
        flx_sched_layer_stats_t x;
        memset(&x, 0, sizeof x);
        x.wall_ns = t_end - t_first;
        x.n_tasks = L->n_tasks;
        x.n_cpu_workers = s->n_cpu;
        for (uint32_t w = 0; w < W; w++) {
            const slot_t *sl = &s->slots[w];
            flx_attn_timing_add(&x.attn, &sl->tim);
            x.n_chunks += sl->n_chunks;
            if (w < s->n_cpu) {
                x.cpu_busy_ns += sl->busy_ns;
                x.cpu_busy_max_ns = FLX_MAX(x.cpu_busy_max_ns, sl->busy_ns);
            }
        }
        for (uint32_t i = 0; i < L->n_tasks; i++) {
            x.n_cpu_tasks += L->tasks[i].worker >= 0 && L->tasks[i].worker < (int32_t)s->n_cpu;
            x.n_gpu_tasks += L->tasks[i].worker == FLX_SCHED_GPU;
            x.n_gpu_fallback += L->tasks[i].worker == (int32_t)s->n_cpu;
        }
        if (s->gpu) {
            x.has_gpu = 1;
            x.gpu_busy_ns = union_ns(s->iv, s->n_iv);
            x.gpu_span_ns = span_ns;
            x.gpu_idle_ns = x.gpu_busy_ns < x.wall_ns ? x.wall_ns - x.gpu_busy_ns : 0;
            x.gpu_idle_ratio = x.wall_ns ? (double)x.gpu_idle_ns / (double)x.wall_ns : 0.0;
            x.balanced = s->balance;
            x.cpu_rate = s->cpu_rate, x.gpu_rate = s->gpu_rate;
        }
        *stats = x;
    }
    if (fst) return flx_error_set(fst, "%s", s->slots[fw].msg);
    if (pst) return pst;
    return FLX_OK;
}

void flx_sched_last_order(flx_sched_h s, const uint32_t **order_p, const uint32_t **lane_end_p, uint32_t *n_lanes_p)
{
    if (!s) return;
    if (order_p) *order_p = s->order;
    if (lane_end_p) *lane_end_p = s->lane_end;
    if (n_lanes_p) *n_lanes_p = s->n_lanes;
}
