/*
 * store.c - the host KV store: arena and block pool, sessions, chunk ingest, statistics, views.
 *
 * DESIGN
 * Memory. KV blocks (64 * head_dim bytes: K then V of 16 tokens) come from one arena per store,
 * mapped with libnuma on the store's node and advised for transparent huge pages. A bitmap says
 * which blocks are free; open takes the first free run long enough for the whole session (first
 * fit), else free blocks in ascending order, so open/close cycles reuse memory and never grow it,
 * and a session's blocks are adjacent whenever the pool allows: a transport then receives the
 * host-resident part of a chunk with one contiguous (zero-copy) receive instead of one per block.
 * The scan is O(blocks / 64) words at open, off every per-token path.
 * Everything else a session needs (block tables, pyramid, window, statistics, completion bitmaps)
 * is one side allocation on the same node, laid out by session_layout(), the single source of
 * truth for sizes: flx_kv_session_bytes() and open both call it. A session reserves all its blocks
 * and side memory at open, so a prefill that was accepted can never run out of memory later;
 * capacity_bytes bounds blocks + side memory together and is itself bounded by physical memory.
 *
 * Ingest. Chunks are validated against the session, then claimed: their (layer, head, granule) bits
 * are set under the session lock, so an overlapping or duplicate chunk is refused before a byte is
 * written. The copy (or a transport's zero-copy receive) happens outside any lock, straight into
 * the final place. Completion counts granules per layer. Each completed chunk first builds level 0
 * of the pyramid for the blocks it landed whole (outside the lock, while its bytes are still in
 * cache; disjoint chunks write disjoint entries), so the pyramid is built as the data streams in;
 * the thread completing a layer's last granule builds the rest (blocks that straddled two chunks,
 * then levels 1..3 from level 0), outside the lock (no other writer touches that layer any more).
 * READY = every layer built (+ statistics unless NO_STATS).
 *
 * Lifetime. Two counts. refs keeps the session struct (state, reason, counters): one for the
 * session table, one per view, one per outstanding claim, one per call in progress. mem_refs keeps
 * its memory (blocks, side memory, device window): one for the owner while the session lives
 * (RESERVED .. DECODING), one per view, one per outstanding claim. FAILED and CLOSED drop the
 * owner's hold, so a failed session's memory is back in the pool as soon as no receive is in flight
 * into it and no view reads it, while the session itself stays known (info shows why it failed)
 * until closed. Everything in the side memory (bitmaps, counters of missing granules, statistics
 * flags) is touched only in RESERVED/RECEIVING, where the owner's hold guarantees it exists, or
 * through a claim or view, which hold it themselves. Ids are (generation << 32 | slot + 1): never
 * 0 and never reused.
 *
 * Time. Deadlines and leases are absolute flx_now_ns() times kept per session; the store has no
 * thread, so flx_kv_store_expire (called by whoever owns a clock: the UCX receiver's progress
 * thread) fails what is due. Waiters (flx_kv_session_wait) sleep on one store-wide condition
 * variable, broadcast on every state change; a wait re-checks its own session, so a broadcast for
 * another costs a lookup, never a missed wake-up (the generation count is read before the check).
 *
 * Device window. With FLX_KV_STORE_WINDOW_DEVICE and a GPU at create, each session also owns one
 * cudaMalloc holding a copy of its window (K half then V half, the host window's layout), so
 * GPU window attention reads device memory instead of pulling the window over PCIe every step.
 * The host window stays: it is where chunks land (a transport's zero-copy receive writes host
 * memory) and what CPU workers read, so a node without a GPU runs the same code. The device copy
 * is filled at the one moment its rows are final and nobody reads them yet: when a layer's last
 * granule completes, after the pyramid, by that same thread; layers_built counts a layer only
 * after its upload, so READY implies every upload finished, and a failed upload fails the session
 * instead. Appends write the host row, then the device row, and advance n_win only when both
 * succeeded. Device bytes have their own budget (dev_capacity): device and host memory are
 * different resources and mixing them in capacity_bytes would let one starve the other. The
 * allocation is made at open, after both budgets were reserved under the store lock and before the
 * id is published, so a refused cudaMalloc undoes the reservation and the caller sees
 * FLX_ERR_CAPACITY with nothing left behind. It is freed with the rest of the session memory on the
 * last reference, so a view held across close keeps its device pointers valid. Copies are
 * synchronous for now (flx/cuda_rt.h); cudaFree synchronises the device, a cost paid at session
 * free, off the per-token path (a store-wide device arena like the host one would remove it).
 *
 * Locks. store->lock guards the pool (free bitmap, used_bytes, pending_free, dev_used), the session
 * table, generations and session ids. sess->lock guards state, bitmaps, counters, times and
 * fail_reason. wait_lock guards state_gen only and is taken last. Order: store, session, wait; no
 * lock is held while copying KV, uploading a window or building a pyramid.
 */
#define _GNU_SOURCE
#include <math.h>
#include <numa.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flx/cuda_rt.h"
#include "flx/kvstore.h"
#include "flx/log.h"
#include "flx/util.h"

#define MOD "kvstore"

struct flx_kv_store {
    /* immutable after create */
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim, sink, local, flags, max_sessions;
    size_t capacity;
    size_t block_bytes;
    int numa_node;
    int hugepages, pinned;
    int pin_device;            /* ordinal whose UVA addresses views carry (params cuda_device, default 0) */
    const uint8_t *arena_dev;  /* UVA device address of arena when pinned, else NULL */
    int win_dev;               /* sessions get a device window */
    int cuda_device;           /* ordinal of the device windows; -1 when !win_dev */
    size_t dev_capacity;       /* bytes: budget of all device windows; 0 when !win_dev */
    uint8_t *arena;            /* (n_blocks_max, block_bytes) */
    size_t arena_bytes;
    uint32_t n_blocks_max;

    pthread_mutex_t lock;
    /* guarded by lock */
    uint64_t *free_map;        /* (ceil(n_blocks_max / 64)): bit b set = block b is free */
    uint32_t n_free;           /* set bits of free_map */
    size_t used_bytes;
    size_t pending_free;       /* part of used_bytes: failed/closed sessions' memory still held */
    size_t dev_used;           /* bytes of device windows reserved by sessions not yet freed */
    uint32_t n_sessions;
    struct flx_kv_session **slots; /* (max_sessions) */
    uint32_t *gen;             /* (max_sessions) */

    pthread_mutex_t wait_lock;
    pthread_cond_t wait_cv;    /* CLOCK_MONOTONIC */
    uint64_t state_gen;        /* guarded by wait_lock: bumped on every session state change */
    void (*on_state)(void *ctx); /* immutable after create; may be NULL */
    void *on_state_ctx;
};

typedef struct session_layout {
    uint32_t n_sink, n_local, l_cpu, n_blocks, n_gran, win_cap, gran_words, blk_words;
    uint32_t meta_n[FLX_KV_META_LEVELS];
    size_t meta_off[FLX_KV_META_LEVELS]; /* bf16 elements from a head's meta start */
    size_t meta_per_head;                /* bf16 elements per (layer, head) */
    /* byte offsets in the side allocation */
    size_t off_table, off_meta, off_wk, off_wv, off_nwin, off_stats, off_meank, off_qa, off_sdone, off_bits,
        off_missing, off_built0;
    size_t side_bytes;
    size_t kv_bytes;                     /* blocks * block_bytes */
    size_t dev_bytes;                    /* device window bytes (K and V); 0 when host-only */
    int with_stats;
} session_layout_t;

struct flx_kv_session {
    flx_kv_store_h store;
    flx_kv_session_id_t id;
    uint32_t slot;
    atomic_int refs;          /* the struct (LIFETIME in the DESIGN block) */
    atomic_int mem_refs;      /* the memory: owner + claims + views */
    uint32_t prompt_len, max_new, flags;
    session_layout_t lay;
    uint8_t *side;
    int side_pinned;
    const uint8_t *side_dev;  /* UVA device address of side when side_pinned, else NULL */
    /* side arrays (pointers into side) */
    uint32_t *table;          /* (n_layers, n_kv_heads, n_blocks) */
    flx_bf16_t *meta;         /* (n_layers, n_kv_heads, meta_per_head) */
    flx_bf16_t *win_k;        /* (n_layers, n_kv_heads, win_cap, D) */
    flx_bf16_t *win_v;        /* (n_layers, n_kv_heads, win_cap, D) */
    flx_bf16_t *win_k_dev;    /* device (n_layers, n_kv_heads, win_cap, D), the one allocation, or NULL */
    flx_bf16_t *win_v_dev;    /* device (n_layers, n_kv_heads, win_cap, D), inside it; or NULL */
    uint32_t *n_win;          /* (n_layers); appended by the decode thread only */
    flx_head_stats_t *stats;  /* (n_layers, n_q_heads) or NULL */
    float *mean_k;            /* (n_layers, n_q_heads, D) or NULL */
    float *q_anchor;          /* (n_layers, n_q_heads, D) or NULL */

    pthread_mutex_t lock;
    /* guarded by lock */
    flx_kv_state_t state;
    uint8_t *stats_done;      /* (n_layers) */
    uint64_t *bits;           /* (n_layers, n_kv_heads, gran_words): granule claimed */
    uint32_t *missing;        /* (n_layers): granules (all heads) not yet completed */
    uint64_t *built0;         /* (n_layers, n_kv_heads, blk_words): block's pyramid level 0 built */
    uint32_t layers_built, stats_received;
    uint64_t bytes_received;
    uint32_t claims_inflight;
    int mem_owner;            /* the owner's hold on mem_refs is still there */
    int mem_pending;          /* counted in store->pending_free (owner gone, memory still held) */
    int committed;
    int32_t first_token;      /* -1 until the commit */
    uint64_t deadline_ns, lease_ns, lease_end_ns;
    uint64_t t_open, t_first, t_last, t_ready, t_end;
    char fail_reason[160];
};

/* ---- layout ---- */

static size_t take(size_t *off, size_t bytes)
{
    size_t at = FLX_ALIGN_UP(*off, FLX_CACHELINE);
    *off = at + bytes;
    return at;
}

static flx_status_t session_layout(const struct flx_kv_store *s, uint32_t L, uint32_t max_new, int with_stats,
                                   session_layout_t *lay)
{
    if (L == 0) return flx_error_set(FLX_ERR_INVALID, "prompt_len is 0");
    if (L > (1u << 30) || max_new > (1u << 24))
        return flx_error_set(FLX_ERR_INVALID, "prompt_len %u or max_new_tokens %u too large", L, max_new);
    memset(lay, 0, sizeof *lay);
    const size_t LH = (size_t)s->n_layers * s->n_kv_heads, D = s->head_dim;
    lay->n_sink = FLX_MIN(s->sink, L);
    lay->n_local = FLX_MIN(s->local, L - lay->n_sink);
    lay->l_cpu = L - lay->n_sink - lay->n_local;
    lay->n_blocks = FLX_DIV_UP(lay->l_cpu, FLX_KV_BLOCK_TOKENS);
    lay->n_gran = FLX_DIV_UP(L, FLX_KV_BLOCK_TOKENS);
    lay->gran_words = FLX_DIV_UP(lay->n_gran, 64);
    lay->blk_words = FLX_DIV_UP(lay->n_blocks, 64);
    lay->win_cap = lay->n_sink + lay->n_local + max_new;
    size_t e = 0;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        lay->meta_n[j] = flx_kv_meta_count(lay->l_cpu, j);
        lay->meta_off[j] = e;
        e += (size_t)lay->meta_n[j] * 2 * D;
    }
    lay->meta_per_head = e;
    lay->with_stats = with_stats;
    size_t off = 0;
    lay->off_table = take(&off, LH * lay->n_blocks * sizeof(uint32_t));
    lay->off_meta = take(&off, LH * lay->meta_per_head * sizeof(flx_bf16_t));
    lay->off_wk = take(&off, LH * lay->win_cap * D * sizeof(flx_bf16_t));
    lay->off_wv = take(&off, LH * lay->win_cap * D * sizeof(flx_bf16_t));
    lay->off_nwin = take(&off, s->n_layers * sizeof(uint32_t));
    if (with_stats) {
        size_t QH = (size_t)s->n_layers * s->n_q_heads;
        lay->off_stats = take(&off, QH * sizeof(flx_head_stats_t));
        lay->off_meank = take(&off, QH * D * sizeof(float));
        lay->off_qa = take(&off, QH * D * sizeof(float));
    }
    lay->off_sdone = take(&off, s->n_layers);
    lay->off_bits = take(&off, LH * lay->gran_words * sizeof(uint64_t));
    lay->off_missing = take(&off, s->n_layers * sizeof(uint32_t));
    lay->off_built0 = take(&off, LH * lay->blk_words * sizeof(uint64_t));
    lay->side_bytes = FLX_ALIGN_UP(off, 4096);
    lay->kv_bytes = LH * lay->n_blocks * s->block_bytes;
    lay->dev_bytes = s->win_dev ? 2 * LH * lay->win_cap * D * sizeof(flx_bf16_t) : 0;
    return FLX_OK;
}

/* ---- store ---- */

static size_t physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

flx_status_t flx_kv_store_create(const flx_kv_store_params_t *p, flx_kv_store_h *store_p)
{
    flx_status_t st;
    if (!p || !store_p) return flx_error_set(FLX_ERR_INVALID, "kv store: NULL params");
    const uint64_t need = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE;
    if ((p->field_mask & need) != need)
        return flx_error_set(FLX_ERR_INVALID, "kv store: capacity_bytes and the model shape are required");
    if (p->n_layers == 0 || p->n_layers > 1024 || p->n_kv_heads == 0 || p->n_kv_heads > 1024 || p->n_q_heads == 0 ||
        p->n_q_heads % p->n_kv_heads != 0 || p->n_q_heads / p->n_kv_heads > 64)
        return flx_error_set(FLX_ERR_INVALID, "kv store: bad shape: %u layers, %u kv heads, %u query heads",
                             p->n_layers, p->n_kv_heads, p->n_q_heads);
    if (p->head_dim < 16 || p->head_dim > 256 || p->head_dim % 16 != 0)
        return flx_error_set(FLX_ERR_INVALID, "kv store: head_dim %u is not a multiple of 16 in [16, 256]",
                             p->head_dim);
    uint32_t sink = (p->field_mask & FLX_KV_STORE_FIELD_WINDOW) ? p->sink : 64;
    uint32_t local = (p->field_mask & FLX_KV_STORE_FIELD_WINDOW) ? p->local : 256;
    /* Host token i is prompt position sink + i; a 16-aligned sink keeps every 16-token prompt
     * granule inside one physical block, so chunks land in place without splitting. */
    if (sink % FLX_KV_BLOCK_TOKENS != 0 || sink > (1u << 20) || local > (1u << 20))
        return flx_error_set(FLX_ERR_INVALID, "kv store: sink %u must be a multiple of 16 (local %u)", sink, local);
    size_t phys = physical_memory();
    if (p->capacity_bytes < (1u << 20) || (phys && p->capacity_bytes > phys / 10 * 9))
        return flx_error_set(FLX_ERR_CAPACITY,
                             "kv store: capacity %zu bytes must be at least 1 MiB and at most 90%% of the %zu bytes of "
                             "physical memory",
                             p->capacity_bytes, phys);
    const uint32_t known_flags =
        FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PREFAULT | FLX_KV_STORE_PIN_CUDA | FLX_KV_STORE_WINDOW_DEVICE;
    if ((p->field_mask & FLX_KV_STORE_FIELD_FLAGS) && (p->flags & ~known_flags))
        return flx_error_set(FLX_ERR_INVALID, "kv store: unknown flags 0x%x", p->flags & ~known_flags);
    const int dev = (p->field_mask & FLX_KV_STORE_FIELD_CUDA_DEVICE) ? p->cuda_device : 0;
    if (dev < 0) return flx_error_set(FLX_ERR_INVALID, "kv store: cuda_device %d is negative", dev);
    if ((p->field_mask & FLX_KV_STORE_FIELD_DEVICE_CAPACITY) && p->device_capacity_bytes == 0)
        return flx_error_set(FLX_ERR_INVALID, "kv store: device_capacity_bytes is 0");
    int node = (p->field_mask & FLX_KV_STORE_FIELD_NUMA_NODE) ? p->numa_node : FLX_KV_NUMA_ANY;
    if (node == FLX_KV_NUMA_ANY) node = flx_numa_current_node();
    if ((st = flx_numa_check_node(node)) != FLX_OK) return st;

    struct flx_kv_store *s = calloc(1, sizeof *s);
    if (!s) return flx_error_set(FLX_ERR_NOMEM, "kv store");
    s->n_layers = p->n_layers;
    s->n_kv_heads = p->n_kv_heads;
    s->n_q_heads = p->n_q_heads;
    s->head_dim = p->head_dim;
    s->sink = sink;
    s->local = local;
    s->flags = (p->field_mask & FLX_KV_STORE_FIELD_FLAGS) ? p->flags : FLX_KV_STORE_HUGEPAGES;
    s->max_sessions = (p->field_mask & FLX_KV_STORE_FIELD_MAX_SESSIONS) ? p->max_sessions : 1024;
    if (p->field_mask & FLX_KV_STORE_FIELD_ON_STATE) {
        s->on_state = p->on_state;
        s->on_state_ctx = p->on_state_ctx;
    }
    if (s->max_sessions == 0 || s->max_sessions > (1u << 20)) {
        st = flx_error_set(FLX_ERR_INVALID, "kv store: max_sessions %u out of range", s->max_sessions);
        goto err;
    }
    s->capacity = p->capacity_bytes;
    s->block_bytes = (size_t)64 * s->head_dim;
    s->numa_node = node;
    s->cuda_device = -1;
    s->pin_device = dev;
    if (s->flags & FLX_KV_STORE_WINDOW_DEVICE) {
        const int n_dev = flx_cuda_device_count();
        if (n_dev == 0) {
            flx_log_info(MOD, "store: device windows asked for but no cuda device is usable: windows stay in host "
                              "memory");
        } else {
            if (dev >= n_dev) {
                st = flx_error_set(FLX_ERR_INVALID, "kv store: cuda_device %d out of range (%d devices)", dev, n_dev);
                goto err;
            }
            size_t dfree = 0, dtotal = 0;
            if ((st = flx_cuda_mem_info(dev, &dfree, &dtotal)) != FLX_OK) goto err;
            size_t cap = (p->field_mask & FLX_KV_STORE_FIELD_DEVICE_CAPACITY) ? p->device_capacity_bytes : dfree / 4;
            if (cap > dfree) {
                st = flx_error_set(FLX_ERR_CAPACITY,
                                   "kv store: device window budget of %zu bytes exceeds the %zu bytes free on device "
                                   "%d (%zu total)",
                                   cap, dfree, dev, dtotal);
                goto err;
            }
            s->win_dev = 1;
            s->cuda_device = dev;
            s->dev_capacity = cap;
        }
    }
    s->n_blocks_max = (uint32_t)FLX_MIN(s->capacity / s->block_bytes, (size_t)UINT32_MAX - 1);
    s->arena_bytes = FLX_ALIGN_UP((size_t)s->n_blocks_max * s->block_bytes, 2u << 20);
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->wait_lock, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* flx_now_ns's clock */
        pthread_cond_init(&s->wait_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    const size_t map_words = FLX_DIV_UP((size_t)s->n_blocks_max, 64);
    s->free_map = malloc(map_words * sizeof *s->free_map);
    s->slots = calloc(s->max_sessions, sizeof *s->slots);
    s->gen = calloc(s->max_sessions, sizeof *s->gen);
    if (s->free_map) {
        memset(s->free_map, 0xff, map_words * sizeof *s->free_map);
        if (s->n_blocks_max % 64) s->free_map[map_words - 1] = (1ull << (s->n_blocks_max % 64)) - 1;
        s->n_free = s->n_blocks_max;
    }
    if (!s->free_map || !s->slots || !s->gen) {
        st = flx_error_set(FLX_ERR_NOMEM, "kv store tables for %u blocks", s->n_blocks_max);
        goto err;
    }
    /* Reserve address space; pages come on first touch, bound to the node by the mbind policy. */
    s->arena = numa_available() >= 0 ? numa_alloc_onnode(s->arena_bytes, node) : NULL;
    if (!s->arena) {
        void *m = mmap(NULL, s->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        s->arena = m == MAP_FAILED ? NULL : m;
    }
    if (!s->arena) {
        st = flx_error_set(FLX_ERR_NOMEM, "kv store arena of %zu bytes on numa node %d", s->arena_bytes, node);
        goto err;
    }
    if (s->flags & FLX_KV_STORE_HUGEPAGES) s->hugepages = madvise(s->arena, s->arena_bytes, MADV_HUGEPAGE) == 0;
    /* Not inherited by a child: a fork (a helper the node starts, a benchmark's peer processes) would
     * otherwise make the arena copy-on-write, and a receive landing after it would fault a copy of
     * each page it writes (or, with RDMA, write into the page the child kept). Advice only. */
    (void)madvise(s->arena, s->arena_bytes, MADV_DONTFORK);
    if (s->flags & FLX_KV_STORE_PREFAULT)
        for (size_t off = 0; off < s->arena_bytes; off += 4096) s->arena[off] = 0;
    if ((s->flags & FLX_KV_STORE_PIN_CUDA) && flx_cuda_device_count() > 0) {
        if ((st = flx_cuda_host_register(s->arena, s->arena_bytes)) != FLX_OK) goto err;
        s->pinned = 1;
        if ((st = flx_cuda_host_device_ptr(dev, s->arena, (const void **)&s->arena_dev)) != FLX_OK) goto err;
    }
    flx_log_info(MOD,
                 "store: %zu bytes capacity, %u blocks of %zu bytes on numa node %d (thp %d, pinned %d); device "
                 "windows %s (device %d, %zu bytes)",
                 s->capacity, s->n_blocks_max, s->block_bytes, node, s->hugepages, s->pinned,
                 s->win_dev ? "on" : "off", s->cuda_device, s->dev_capacity);
    *store_p = s;
    return FLX_OK;
err:
    flx_kv_store_destroy(s);
    return st;
}

static void session_mem_free(struct flx_kv_session *x);
static void session_struct_free(struct flx_kv_session *x);

void flx_kv_store_destroy(flx_kv_store_h s)
{
    if (!s) return;
    if (s->slots) {
        for (uint32_t i = 0; i < s->max_sessions; i++) {
            struct flx_kv_session *x = s->slots[i];
            if (!x) continue;
            s->slots[i] = NULL;
            /* Views and claims must have been released (documented); drop the table's reference
             * and the owner's hold if the session still had one. */
            FLX_DEBUG_ASSERT(atomic_load(&x->refs) == 1);
            if (x->side) session_mem_free(x);
            session_struct_free(x);
        }
    }
    if (s->arena) {
        if (s->pinned) flx_cuda_host_unregister(s->arena);
        if (numa_available() >= 0) numa_free(s->arena, s->arena_bytes);
        else munmap(s->arena, s->arena_bytes);
    }
    free(s->free_map);
    free(s->slots);
    free(s->gen);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->wait_lock);
    pthread_cond_destroy(&s->wait_cv);
    free(s);
}

void flx_kv_store_info(flx_kv_store_h s, flx_kv_store_info_t *info)
{
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&s->lock);
    info->used_bytes = s->used_bytes;
    info->pending_free_bytes = s->pending_free;
    info->device_used_bytes = s->dev_used;
    info->n_sessions = s->n_sessions;
    pthread_mutex_unlock(&s->lock);
    info->numa_node = s->numa_node;
    info->hugepages = s->hugepages;
    info->pinned = s->pinned;
    info->capacity_bytes = s->capacity;
    info->max_sessions = s->max_sessions;
    info->block_bytes = s->block_bytes;
    info->n_layers = s->n_layers;
    info->n_kv_heads = s->n_kv_heads;
    info->n_q_heads = s->n_q_heads;
    info->head_dim = s->head_dim;
    info->sink = s->sink;
    info->local = s->local;
    info->window_on_device = s->win_dev;
    info->cuda_device = s->cuda_device;
    info->device_capacity_bytes = s->dev_capacity;
}

flx_status_t flx_kv_session_bytes(flx_kv_store_h s, uint32_t L, uint32_t max_new, size_t *bytes_p)
{
    session_layout_t lay;
    flx_status_t st = session_layout(s, L, max_new, 1, &lay);
    if (st != FLX_OK) return st;
    *bytes_p = lay.kv_bytes + lay.side_bytes;
    return FLX_OK;
}

flx_status_t flx_kv_session_device_bytes(flx_kv_store_h s, uint32_t L, uint32_t max_new, size_t *bytes_p)
{
    session_layout_t lay;
    flx_status_t st = session_layout(s, L, max_new, 1, &lay);
    if (st != FLX_OK) return st;
    *bytes_p = lay.dev_bytes;
    return FLX_OK;
}

const char *flx_kv_state_name(flx_kv_state_t st)
{
    static const char *n[] = {"RESERVED", "RECEIVING", "READY", "DECODING", "FAILED", "CLOSED"};
    return (unsigned)st <= FLX_KV_CLOSED ? n[st] : "?";
}

/* ---- sessions ---- */

/* Clears bits [b0, b0 + n) of the free map (taken). */
static void map_take_range(uint64_t *m, size_t b0, size_t n)
{
    size_t b = b0, end = b0 + n;
    while (b < end) {
        size_t w = b / 64, lo = b % 64, hi = FLX_MIN((size_t)64, lo + (end - b));
        uint64_t mask = (hi == 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
        m[w] &= ~mask;
        b += hi - lo;
    }
}

/* Takes n blocks (n <= n_free) into out[], ascending: the first free run of n blocks when there is
 * one, else the lowest free blocks. Caller holds store->lock. */
static void pool_take(struct flx_kv_store *s, uint32_t *out, size_t n)
{
    const size_t words = FLX_DIV_UP((size_t)s->n_blocks_max, 64);
    uint64_t *m = s->free_map;
    size_t run = 0, run_start = 0, start = SIZE_MAX;
    for (size_t w = 0; w < words && start == SIZE_MAX; w++) {
        uint64_t x = m[w];
        if (x == ~0ull) {
            if (!run) run_start = w * 64;
            run += 64;
            if (run >= n) start = run_start;
            continue;
        }
        for (int b = 0; b < 64 && start == SIZE_MAX; b++) {
            if (!(x >> b & 1)) {
                run = 0;
                continue;
            }
            if (!run) run_start = w * 64 + (size_t)b;
            if (++run >= n) start = run_start;
        }
    }
    if (start != SIZE_MAX) {
        for (size_t i = 0; i < n; i++) out[i] = (uint32_t)(start + i);
        map_take_range(m, start, n);
    } else {
        size_t k = 0;
        for (size_t w = 0; w < words && k < n; w++)
            while (m[w] && k < n) {
                int b = __builtin_ctzll(m[w]);
                out[k++] = (uint32_t)(w * 64 + (size_t)b);
                m[w] &= m[w] - 1;
            }
        FLX_CORRUPTION(k != n);
    }
    s->n_free -= (uint32_t)n;
}

/* Returns blocks to the pool and the reservation to the budget. Caller holds store->lock. */
static void pool_put(struct flx_kv_store *s, const uint32_t *blocks, size_t n, size_t bytes)
{
    for (size_t i = 0; i < n; i++) {
        FLX_CORRUPTION(s->free_map[blocks[i] / 64] >> (blocks[i] % 64) & 1); /* freed twice */
        s->free_map[blocks[i] / 64] |= 1ull << (blocks[i] % 64);
    }
    s->n_free += (uint32_t)n;
    s->used_bytes -= bytes;
}

/* The session's memory back to the pool: called once, when mem_refs reaches 0. */
static void session_mem_free(struct flx_kv_session *x)
{
    struct flx_kv_store *s = x->store;
    const size_t n_blocks = (size_t)s->n_layers * s->n_kv_heads * x->lay.n_blocks;
    const size_t total = x->lay.kv_bytes + x->lay.side_bytes;
    /* Free before un-reserving, so the budget never promises memory the device has not got back. */
    if (x->win_k_dev && flx_cuda_free(s->cuda_device, x->win_k_dev) != FLX_OK)
        flx_log_warn(MOD, "session %#llx: freeing its device window of %zu bytes: %s", (unsigned long long)x->id,
                     x->lay.dev_bytes, flx_error_msg());
    x->win_k_dev = x->win_v_dev = NULL;
    pthread_mutex_lock(&s->lock);
    pool_put(s, x->table, n_blocks, total);
    s->dev_used -= x->lay.dev_bytes;
    if (x->mem_pending) s->pending_free -= total;
    x->mem_pending = 0;
    pthread_mutex_unlock(&s->lock);
    if (x->side_pinned) flx_cuda_host_unregister(x->side);
    if (numa_available() >= 0) numa_free(x->side, x->lay.side_bytes);
    else munmap(x->side, x->lay.side_bytes);
    x->side = NULL;
}

static void session_struct_free(struct flx_kv_session *x)
{
    FLX_CORRUPTION(x->side != NULL); /* memory still out: a hold was dropped twice or leaked */
    pthread_mutex_destroy(&x->lock);
    free(x);
}

static void mem_unref(struct flx_kv_session *x)
{
    if (atomic_fetch_sub_explicit(&x->mem_refs, 1, memory_order_acq_rel) == 1) session_mem_free(x);
}

static void session_unref(struct flx_kv_session *x)
{
    if (atomic_fetch_sub_explicit(&x->refs, 1, memory_order_acq_rel) == 1) session_struct_free(x);
}

/* Drops the owner's hold on the memory once the session is FAILED or CLOSED. Called without locks
 * after anything that may have ended the session; the memory returns now, or when the last claim
 * or view lets go (counted as pending meanwhile). */
static void session_settle(struct flx_kv_session *x)
{
    pthread_mutex_lock(&x->lock);
    int drop = x->mem_owner && (x->state == FLX_KV_FAILED || x->state == FLX_KV_CLOSED);
    if (drop) x->mem_owner = 0;
    pthread_mutex_unlock(&x->lock);
    if (!drop) return;
    struct flx_kv_store *s = x->store;
    pthread_mutex_lock(&s->lock);
    x->mem_pending = 1;   /* undone by session_mem_free, whoever lets go last */
    s->pending_free += x->lay.kv_bytes + x->lay.side_bytes;
    pthread_mutex_unlock(&s->lock);
    mem_unref(x);
}

/* The end of a public call that took a reference: settle, then drop the reference. */
static void session_put(struct flx_kv_session *x)
{
    session_settle(x);
    session_unref(x);
}

static uint64_t bytes_expected(const struct flx_kv_session *x)
{
    const struct flx_kv_store *s = x->store;
    return (uint64_t)s->n_layers * s->n_kv_heads * x->prompt_len * s->head_dim * 2 * sizeof(flx_bf16_t);
}

static void notify_state(struct flx_kv_store *s)
{
    pthread_mutex_lock(&s->wait_lock);
    s->state_gen++;
    pthread_cond_broadcast(&s->wait_cv);
    pthread_mutex_unlock(&s->wait_lock);
    if (s->on_state) s->on_state(s->on_state_ctx);
}

/* Caller holds x->lock. Every state change goes through here: times and waiters. */
static void set_state_locked(struct flx_kv_session *x, flx_kv_state_t st)
{
    if (x->state == st) return;
    x->state = st;
    uint64_t now = flx_now_ns();
    if (st == FLX_KV_READY) {
        x->t_ready = now;
        x->lease_end_ns = x->lease_ns ? now + x->lease_ns : 0;
    } else {
        x->lease_end_ns = 0;
    }
    if ((st == FLX_KV_FAILED || st == FLX_KV_CLOSED) && !x->t_end) x->t_end = now;
    if (st != FLX_KV_RECEIVING) notify_state(x->store);
}

static int free_slot_locked(const struct flx_kv_store *s)
{
    for (uint32_t i = 0; i < s->max_sessions; i++)
        if (!s->slots[i]) return 1;
    return 0;
}

/* Whether an open of total bytes (n_blocks blocks, lay->dev_bytes on the device) fits now, under the
 * store lock: FLX_OK, or the capacity refusal naming what ran out; no_slot: every slot is taken. */
static flx_status_t room_locked(struct flx_kv_store *s, const flx_kv_session_params_t *p,
                                const session_layout_t *lay, size_t total, size_t n_blocks, int no_slot)
{
    if (no_slot) return flx_error_set(FLX_ERR_CAPACITY, "session open: all %u session slots in use", s->max_sessions);
    if (s->used_bytes + total > s->capacity || n_blocks > s->n_free)
        return flx_error_set(FLX_ERR_CAPACITY,
                             "session open: prompt of %u tokens needs %zu bytes, %zu of %zu bytes in use (%u sessions, "
                             "%zu bytes held by failed or closed ones)",
                             p->prompt_len, total, s->used_bytes, s->capacity, s->n_sessions, s->pending_free);
    if (lay->dev_bytes > s->dev_capacity - s->dev_used)
        return flx_error_set(FLX_ERR_CAPACITY,
                             "session open: prompt of %u tokens, %u new: device window needs %zu bytes, %zu of %zu "
                             "device bytes in use (%u sessions)",
                             p->prompt_len, p->max_new_tokens, lay->dev_bytes, s->dev_used, s->dev_capacity,
                             s->n_sessions);
    return FLX_OK;
}

flx_status_t flx_kv_session_open(flx_kv_store_h s, const flx_kv_session_params_t *p, flx_kv_session_id_t *sid_p)
{
    flx_status_t st;
    if (!s || !p || !sid_p) return flx_error_set(FLX_ERR_INVALID, "session open: NULL argument");
    const uint32_t known = FLX_KV_SESSION_NO_STATS | FLX_KV_SESSION_COMMIT;
    if (p->flags & ~known) return flx_error_set(FLX_ERR_INVALID, "session open: unknown flags 0x%x", p->flags & ~known);
    session_layout_t lay;
    if ((st = session_layout(s, p->prompt_len, p->max_new_tokens, !(p->flags & FLX_KV_SESSION_NO_STATS), &lay)))
        return st;
    const size_t LH = (size_t)s->n_layers * s->n_kv_heads, n_blocks = LH * lay.n_blocks;
    const size_t total = lay.kv_bytes + lay.side_bytes;

    /* A request that cannot fit is refused before its side memory is mapped and faulted in (a
     * refused open of a 651 MiB session used to bring 560 MiB into RSS first). The check below,
     * under the same lock as the reservation, stays the one that counts. */
    pthread_mutex_lock(&s->lock);
    st = room_locked(s, p, &lay, total, n_blocks, !free_slot_locked(s));
    pthread_mutex_unlock(&s->lock);
    if (st) return st;

    struct flx_kv_session *x = calloc(1, sizeof *x);
    if (!x) return flx_error_set(FLX_ERR_NOMEM, "session");
    /* Side memory first (outside the store lock: mmap can be slow); reserved against the budget
     * together with the blocks below. */
    x->side = numa_available() >= 0 ? numa_alloc_onnode(lay.side_bytes, s->numa_node) : NULL;
    if (!x->side) {
        void *m = mmap(NULL, lay.side_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        x->side = m == MAP_FAILED ? NULL : m;
    }
    if (!x->side) {
        free(x);
        return flx_error_set(FLX_ERR_NOMEM, "session side memory of %zu bytes", lay.side_bytes);
    }
    /* Faulted in now, at open: the pyramid, window and bitmaps are written while KV streams in and
     * right before READY, where a first-touch fault (a zeroed page each) would delay READY (2 ms of
     * a 512 MiB session's last layer was page faults). The memory is reserved against the budget
     * anyway. */
    (void)madvise(x->side, lay.side_bytes, MADV_DONTFORK); /* as the arena */
    for (size_t off = 0; off < lay.side_bytes; off += 4096) x->side[off] = 0;
    x->table = (uint32_t *)(x->side + lay.off_table);

    /* The slot is taken under the lock but the id is published only once the session is complete
     * (x->id stays 0 until then, and no caller can name id 0), so no other thread reaches a
     * half-built session and a refusal below can still undo everything. */
    flx_kv_session_id_t id = 0;
    pthread_mutex_lock(&s->lock);
    uint32_t slot = UINT32_MAX;
    for (uint32_t i = 0; i < s->max_sessions; i++)
        if (!s->slots[i]) {
            slot = i;
            break;
        }
    if ((st = room_locked(s, p, &lay, total, n_blocks, slot == UINT32_MAX)) == FLX_OK) {
        pool_take(s, x->table, n_blocks);
        s->used_bytes += total;
        s->dev_used += lay.dev_bytes;
        s->n_sessions++;
        s->gen[slot]++;
        id = ((uint64_t)s->gen[slot] << 32) | (slot + 1);
        x->slot = slot;
        s->slots[slot] = x;
    }
    pthread_mutex_unlock(&s->lock);
    if (st == FLX_OK && lay.dev_bytes) {
        void *d = NULL;
        if ((st = flx_cuda_malloc(s->cuda_device, lay.dev_bytes, &d)) == FLX_OK) {
            x->win_k_dev = d;
            x->win_v_dev = x->win_k_dev + (size_t)LH * lay.win_cap * s->head_dim;
        } else {
            char why[FLX_ERROR_MSG_MAX];
            snprintf(why, sizeof why, "%s", flx_error_msg());
            /* A full device is a capacity refusal (try later or elsewhere); anything else is the device's. */
            st = flx_error_set(st == FLX_ERR_NOMEM ? FLX_ERR_CAPACITY : st,
                               "session open: device window of %zu bytes for a prompt of %u tokens: %s",
                               lay.dev_bytes, p->prompt_len, why);
            pthread_mutex_lock(&s->lock);
            pool_put(s, x->table, n_blocks, total);
            s->dev_used -= lay.dev_bytes;
            s->slots[slot] = NULL;
            s->n_sessions--;
            pthread_mutex_unlock(&s->lock);
        }
    }
    if (st != FLX_OK) {
        if (numa_available() >= 0) numa_free(x->side, lay.side_bytes);
        else munmap(x->side, lay.side_bytes);
        free(x);
        return st;
    }

    x->store = s;
    atomic_init(&x->refs, 1);
    atomic_init(&x->mem_refs, 1);
    x->mem_owner = 1;
    x->prompt_len = p->prompt_len;
    x->max_new = p->max_new_tokens;
    x->flags = p->flags;
    x->first_token = -1;
    x->deadline_ns = p->deadline_ns;
    x->lease_ns = p->lease_ns;
    x->t_open = flx_now_ns();
    x->lay = lay;
    x->meta = (flx_bf16_t *)(x->side + lay.off_meta);
    x->win_k = (flx_bf16_t *)(x->side + lay.off_wk);
    x->win_v = (flx_bf16_t *)(x->side + lay.off_wv);
    x->n_win = (uint32_t *)(x->side + lay.off_nwin);
    if (lay.with_stats) {
        x->stats = (flx_head_stats_t *)(x->side + lay.off_stats);
        x->mean_k = (float *)(x->side + lay.off_meank);
        x->q_anchor = (float *)(x->side + lay.off_qa);
    }
    x->stats_done = x->side + lay.off_sdone;
    x->bits = (uint64_t *)(x->side + lay.off_bits);
    x->missing = (uint32_t *)(x->side + lay.off_missing);
    x->built0 = (uint64_t *)(x->side + lay.off_built0);
    for (uint32_t l = 0; l < s->n_layers; l++) {
        x->missing[l] = s->n_kv_heads * lay.n_gran;
        x->n_win[l] = lay.n_sink + lay.n_local;
    }
    /* Reused blocks hold old data: zero the rows past l_cpu of each last block (the layout's
     * promise), which also covers the V half. Whole blocks are overwritten by chunks. */
    uint32_t tail = lay.l_cpu % FLX_KV_BLOCK_TOKENS;
    if (tail) {
        size_t row = (size_t)s->head_dim * sizeof(flx_bf16_t);
        for (size_t h = 0; h < LH; h++) {
            uint8_t *b = s->arena + (size_t)x->table[h * lay.n_blocks + lay.n_blocks - 1] * s->block_bytes;
            memset(b + tail * row, 0, (FLX_KV_BLOCK_TOKENS - tail) * row);
            memset(b + (FLX_KV_BLOCK_TOKENS + tail) * row, 0, (FLX_KV_BLOCK_TOKENS - tail) * row);
        }
    }
    /* Best effort: a session whose side memory cannot be pinned still decodes on the CPU; its views
     * carry no UVA addresses (block_table_dev NULL), so no GPU task is made for it. */
    if (s->pinned && flx_cuda_host_register(x->side, lay.side_bytes) == FLX_OK) {
        x->side_pinned = 1;
        if (flx_cuda_host_device_ptr(s->pin_device, x->side, (const void **)&x->side_dev) != FLX_OK) x->side_dev = NULL;
    }
    pthread_mutex_init(&x->lock, NULL);
    x->state = FLX_KV_RESERVED;
    pthread_mutex_lock(&s->lock);
    x->id = id;
    pthread_mutex_unlock(&s->lock);
    *sid_p = id;
    return FLX_OK;
}

/* Looks a session up and takes a reference. */
static flx_status_t session_get(struct flx_kv_store *s, flx_kv_session_id_t sid, struct flx_kv_session **x_p)
{
    uint64_t slot1 = sid & 0xffffffffu;
    struct flx_kv_session *x = NULL;
    pthread_mutex_lock(&s->lock);
    if (slot1 >= 1 && slot1 <= s->max_sessions && s->slots[slot1 - 1] && s->slots[slot1 - 1]->id == sid) {
        x = s->slots[slot1 - 1];
        atomic_fetch_add_explicit(&x->refs, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->lock);
    if (!x) return flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx is unknown or closed", (unsigned long long)sid);
    *x_p = x;
    return FLX_OK;
}

/* Caller holds x->lock. RESERVED/RECEIVING -> FAILED with the reason; the owner's hold is dropped
 * by session_settle once the lock is released. */
static void session_fail_locked(struct flx_kv_session *x, const char *reason)
{
    if (x->state != FLX_KV_RESERVED && x->state != FLX_KV_RECEIVING) return;
    snprintf(x->fail_reason, sizeof x->fail_reason, "%s", reason);
    set_state_locked(x, FLX_KV_FAILED);
    flx_log_warn(MOD, "session %#llx failed: %s", (unsigned long long)x->id, reason);
}

flx_status_t flx_kv_session_close(flx_kv_store_h s, flx_kv_session_id_t sid)
{
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    set_state_locked(x, FLX_KV_CLOSED);
    pthread_mutex_unlock(&x->lock);
    pthread_mutex_lock(&s->lock);
    int owned = s->slots[x->slot] == x;
    if (owned) {
        s->slots[x->slot] = NULL;
        s->n_sessions--;
    }
    pthread_mutex_unlock(&s->lock);
    session_settle(x);
    if (owned) session_unref(x); /* the table's reference */
    session_unref(x);            /* ours */
    return owned ? FLX_OK : flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx closed concurrently",
                                          (unsigned long long)sid);
}

flx_status_t flx_kv_session_fail(flx_kv_store_h s, flx_kv_session_id_t sid, const char *reason)
{
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    if (x->state == FLX_KV_RESERVED || x->state == FLX_KV_RECEIVING) {
        session_fail_locked(x, reason ? reason : "failed by caller");
    } else {
        st = flx_error_set(FLX_ERR_STATE, "session %#llx is %s: only RESERVED or RECEIVING sessions can fail",
                           (unsigned long long)sid, flx_kv_state_name(x->state));
    }
    pthread_mutex_unlock(&x->lock);
    session_put(x);
    return st;
}

flx_status_t flx_kv_session_begin_decode(flx_kv_store_h s, flx_kv_session_id_t sid)
{
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    if (x->state == FLX_KV_READY) set_state_locked(x, FLX_KV_DECODING);
    else
        st = flx_error_set(FLX_ERR_STATE, "session %#llx is %s, not READY", (unsigned long long)sid,
                           flx_kv_state_name(x->state));
    pthread_mutex_unlock(&x->lock);
    session_unref(x);
    return st;
}

static void check_ready_locked(struct flx_kv_session *x);

flx_status_t flx_kv_session_commit(flx_kv_store_h s, flx_kv_session_id_t sid, const flx_kv_commit_t *c)
{
    if (!s || !c) return flx_error_set(FLX_ERR_INVALID, "commit: NULL argument");
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    const uint32_t want_stats = x->lay.with_stats ? s->n_layers : 0;
    const uint64_t want_bytes = bytes_expected(x);
    pthread_mutex_lock(&x->lock);
    if (!(x->flags & FLX_KV_SESSION_COMMIT) || (x->state != FLX_KV_RESERVED && x->state != FLX_KV_RECEIVING)) {
        st = flx_error_set(FLX_ERR_STATE, "commit for session %#llx in state %s%s refused", (unsigned long long)sid,
                           flx_kv_state_name(x->state),
                           x->flags & FLX_KV_SESSION_COMMIT ? "" : " (opened without COMMIT)");
        goto out;
    }
    if (x->committed)
        st = flx_error_set(FLX_ERR_DUPLICATE, "commit sent twice");
    else if (c->first_token < 0)
        st = flx_error_set(FLX_ERR_INVALID, "commit: first token %d is negative", c->first_token);
    else if (c->kv_bytes != want_bytes)
        st = flx_error_set(FLX_ERR_INVALID, "commit: %llu KV bytes sent, the session expects %llu",
                           (unsigned long long)c->kv_bytes, (unsigned long long)want_bytes);
    else if (c->n_stats_layers != want_stats)
        st = flx_error_set(FLX_ERR_INVALID, "commit: statistics of %u layers sent, the session expects %u",
                           c->n_stats_layers, want_stats);
    if (st != FLX_OK) {
        char reason[160];
        snprintf(reason, sizeof reason, "bad commit: %s", flx_error_msg());
        session_fail_locked(x, reason);
        goto out;
    }
    x->committed = 1;
    x->first_token = c->first_token;
    check_ready_locked(x);
out:
    pthread_mutex_unlock(&x->lock);
    session_put(x);
    return st;
}

flx_status_t flx_kv_session_renew(flx_kv_store_h s, flx_kv_session_id_t sid, uint64_t lease_ns)
{
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    if (x->state == FLX_KV_READY) {
        x->lease_ns = lease_ns;
        x->lease_end_ns = lease_ns ? flx_now_ns() + lease_ns : 0;
    } else if (x->state == FLX_KV_RESERVED || x->state == FLX_KV_RECEIVING) {
        x->lease_ns = lease_ns;
    } else {
        st = flx_error_set(FLX_ERR_STATE, "lease of session %#llx in state %s cannot be renewed",
                           (unsigned long long)sid, flx_kv_state_name(x->state));
    }
    pthread_mutex_unlock(&x->lock);
    session_unref(x);
    return st;
}

/* Caller holds x->lock. Fails x when its deadline or lease is due at now; otherwise lowers *next to
 * its next due time. Returns 1 when it failed x. */
static int expire_locked(struct flx_kv_session *x, uint64_t now, uint64_t *next)
{
    char reason[160];
    if ((x->state == FLX_KV_RESERVED || x->state == FLX_KV_RECEIVING) && x->deadline_ns) {
        if (x->deadline_ns > now) {
            *next = FLX_MIN(*next, x->deadline_ns);
            return 0;
        }
        uint32_t stats_want = x->lay.with_stats ? x->store->n_layers : 0;
        snprintf(reason, sizeof reason,
                 "deadline passed %.0f ms after open: %llu of %llu bytes, %u of %u layers, statistics %u of %u%s",
                 (double)(now - x->t_open) / 1e6, (unsigned long long)x->bytes_received,
                 (unsigned long long)bytes_expected(x), x->layers_built, x->store->n_layers, x->stats_received,
                 stats_want, (x->flags & FLX_KV_SESSION_COMMIT) && !x->committed ? ", no commit" : "");
        session_fail_locked(x, reason);
        return 1;
    }
    if (x->state == FLX_KV_READY && x->lease_end_ns) {
        if (x->lease_end_ns > now) {
            *next = FLX_MIN(*next, x->lease_end_ns);
            return 0;
        }
        snprintf(reason, sizeof reason, "lease of %.0f ms expired: READY for %.0f ms and not claimed by a decode",
                 (double)x->lease_ns / 1e6, (double)(now - x->t_ready) / 1e6);
        snprintf(x->fail_reason, sizeof x->fail_reason, "%s", reason);
        set_state_locked(x, FLX_KV_FAILED);
        flx_log_warn(MOD, "session %#llx reclaimed: %s", (unsigned long long)x->id, reason);
        return 1;
    }
    return 0;
}

uint32_t flx_kv_store_expire(flx_kv_store_h s, uint64_t now, uint64_t *next_p)
{
    enum { BATCH = 64 };
    struct flx_kv_session *done[BATCH];
    uint32_t n_failed = 0;
    uint64_t next;
    for (;;) {
        uint32_t n = 0;
        next = UINT64_MAX;
        pthread_mutex_lock(&s->lock);
        for (uint32_t i = 0; i < s->max_sessions && n < BATCH; i++) {
            struct flx_kv_session *x = s->slots[i];
            if (!x || !x->id) continue;
            pthread_mutex_lock(&x->lock);
            if (expire_locked(x, now, &next)) {
                atomic_fetch_add_explicit(&x->refs, 1, memory_order_relaxed);
                done[n++] = x;
            }
            pthread_mutex_unlock(&x->lock);
        }
        pthread_mutex_unlock(&s->lock);
        for (uint32_t i = 0; i < n; i++) session_put(done[i]); /* memory back outside the store lock */
        n_failed += n;
        if (n < BATCH) break; /* a full batch may have stopped the scan early: scan again */
    }
    if (next_p) *next_p = next;
    return n_failed;
}

flx_status_t flx_kv_session_info(flx_kv_store_h s, flx_kv_session_id_t sid, flx_kv_session_info_t *info)
{
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    memset(info, 0, sizeof *info);
    pthread_mutex_lock(&x->lock);
    info->state = x->state;
    info->bytes_received = x->bytes_received;
    info->claims_inflight = x->claims_inflight;
    memcpy(info->fail_reason, x->fail_reason, sizeof info->fail_reason);
    info->first_token = x->first_token;
    info->t_open_ns = x->t_open;
    info->t_first_byte_ns = x->t_first;
    info->t_last_byte_ns = x->t_last;
    info->t_ready_ns = x->t_ready;
    info->t_end_ns = x->t_end;
    info->deadline_ns = x->deadline_ns;
    info->lease_end_ns = x->lease_end_ns;
    info->lease_ns = x->lease_ns;
    pthread_mutex_unlock(&x->lock);
    info->memory_held = atomic_load_explicit(&x->mem_refs, memory_order_acquire) > 0;
    info->flags = x->flags;
    info->prompt_len = x->prompt_len;
    info->n_sink = x->lay.n_sink;
    info->n_local = x->lay.n_local;
    info->l_cpu = x->lay.l_cpu;
    info->max_new_tokens = x->max_new;
    info->bytes_expected = bytes_expected(x);
    info->reserved_bytes = x->lay.kv_bytes + x->lay.side_bytes;
    info->device_bytes = x->lay.dev_bytes;
    session_unref(x);
    return FLX_OK;
}

flx_status_t flx_kv_session_wait(flx_kv_store_h s, flx_kv_session_id_t sid, uint64_t timeout_ns,
                                 flx_kv_state_t *state_p)
{
    if (!s || !state_p) return flx_error_set(FLX_ERR_INVALID, "session wait: NULL argument");
    const uint64_t start = flx_now_ns();
    const uint64_t end = timeout_ns > UINT64_MAX - start ? UINT64_MAX : start + timeout_ns;
    for (;;) {
        pthread_mutex_lock(&s->wait_lock);
        const uint64_t gen = s->state_gen; /* before the check: a change after it bumps gen */
        pthread_mutex_unlock(&s->wait_lock);
        struct flx_kv_session *x;
        flx_status_t st = session_get(s, sid, &x);
        if (st != FLX_OK) return st;
        pthread_mutex_lock(&x->lock);
        flx_kv_state_t state = x->state;
        pthread_mutex_unlock(&x->lock);
        session_unref(x);
        if (state == FLX_KV_CLOSED) /* closing: its state changed before it left the table */
            return flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx closed", (unsigned long long)sid);
        if (state != FLX_KV_RESERVED && state != FLX_KV_RECEIVING) {
            *state_p = state;
            return FLX_OK;
        }
        if (flx_now_ns() >= end)
            return flx_error_set(FLX_ERR_TIMEOUT, "session %#llx still %s after %.0f ms", (unsigned long long)sid,
                                 flx_kv_state_name(state), (double)timeout_ns / 1e6);
        struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull), .tv_nsec = (long)(end % 1000000000ull)};
        pthread_mutex_lock(&s->wait_lock);
        while (s->state_gen == gen)
            if (pthread_cond_timedwait(&s->wait_cv, &s->wait_lock, &ts) != 0) break; /* ETIMEDOUT */
        pthread_mutex_unlock(&s->wait_lock);
    }
}

/* ---- chunks ---- */

/* A claim as handed out: the public part plus the session it holds a reference on. */
typedef struct claim_priv {
    struct flx_kv_session *sess;
    flx_kv_claim_t pub;
    flx_kv_iov_t iov[];        /* (pub.n_iov) */
} claim_priv_t;

static claim_priv_t *claim_priv_of(flx_kv_claim_t *pub)
{
    return (claim_priv_t *)((uint8_t *)pub - offsetof(claim_priv_t, pub));
}

static void check_ready_locked(struct flx_kv_session *x)
{
    if ((x->state == FLX_KV_RECEIVING || x->state == FLX_KV_RESERVED) && x->layers_built == x->store->n_layers &&
        (!x->lay.with_stats || x->stats_received == x->store->n_layers) &&
        (!(x->flags & FLX_KV_SESSION_COMMIT) || x->committed))
        set_state_locked(x, FLX_KV_READY);
}

/* Destination of prompt position p of (layer, head); *run_p = contiguous rows from p on. */
static uint8_t *dest_of(struct flx_kv_session *x, uint32_t layer, uint32_t head, uint32_t p, int is_v,
                        uint32_t *run_p)
{
    struct flx_kv_store *s = x->store;
    const session_layout_t *lay = &x->lay;
    const size_t row = (size_t)s->head_dim * sizeof(flx_bf16_t), lh = (size_t)layer * s->n_kv_heads + head;
    const uint32_t L = x->prompt_len, host_end = lay->n_sink + lay->l_cpu;
    if (p < lay->n_sink || p >= host_end) {
        uint32_t w = p < lay->n_sink ? p : lay->n_sink + (p - host_end);
        *run_p = p < lay->n_sink ? lay->n_sink - p : L - p;
        flx_bf16_t *base = is_v ? x->win_v : x->win_k;
        return (uint8_t *)(base + (lh * lay->win_cap + w) * s->head_dim);
    }
    uint32_t i = p - lay->n_sink, r = i % FLX_KV_BLOCK_TOKENS;
    *run_p = FLX_MIN(FLX_KV_BLOCK_TOKENS - r, host_end - p);
    uint8_t *blk = s->arena + (size_t)x->table[lh * lay->n_blocks + i / FLX_KV_BLOCK_TOKENS] * s->block_bytes;
    return blk + (is_v ? FLX_KV_BLOCK_TOKENS * row : 0) + r * row;
}

/* Validates a chunk against the session's shape; on failure sets the message and returns it. */
static flx_status_t chunk_check(const struct flx_kv_session *x, const flx_kv_chunk_t *c)
{
    const struct flx_kv_store *s = x->store;
    const uint32_t L = x->prompt_len;
    if (c->dtype != FLX_DT_BF16)
        return flx_error_set(FLX_ERR_INVALID, "chunk dtype %s, expected BF16", flx_dtype_name(c->dtype));
    if (c->order != FLX_KV_ORDER_SPLIT && c->order != FLX_KV_ORDER_GRANULE)
        return flx_error_set(FLX_ERR_INVALID, "chunk order %d unknown", (int)c->order);
    if (c->head_dim != s->head_dim)
        return flx_error_set(FLX_ERR_INVALID, "chunk head_dim %u, store has %u", c->head_dim, s->head_dim);
    if (c->layer >= s->n_layers)
        return flx_error_set(FLX_ERR_INVALID, "chunk layer %u out of range (n_layers %u)", c->layer, s->n_layers);
    if (c->head_begin >= c->head_end || c->head_end > s->n_kv_heads)
        return flx_error_set(FLX_ERR_INVALID, "chunk kv heads [%u, %u) invalid (n_kv_heads %u)", c->head_begin,
                             c->head_end, s->n_kv_heads);
    if (c->tok_begin >= c->tok_end || c->tok_end > L)
        return flx_error_set(FLX_ERR_INVALID, "chunk tokens [%u, %u) invalid (prompt_len %u)", c->tok_begin,
                             c->tok_end, L);
    if (c->tok_begin % FLX_KV_BLOCK_TOKENS != 0 || (c->tok_end % FLX_KV_BLOCK_TOKENS != 0 && c->tok_end != L))
        return flx_error_set(FLX_ERR_INVALID, "chunk tokens [%u, %u) not aligned to 16 (prompt_len %u)", c->tok_begin,
                             c->tok_end, L);
    return FLX_OK;
}

static uint64_t *gran_word(struct flx_kv_session *x, uint32_t layer, uint32_t head, uint32_t g, uint64_t *bit)
{
    *bit = 1ull << (g % 64);
    return &x->bits[((size_t)layer * x->store->n_kv_heads + head) * x->lay.gran_words + g / 64];
}

/* Builds a claim's destination list, adjacent destinations merged; with iov NULL it only counts. */
typedef struct iov_build {
    flx_kv_iov_t *iov;
    uint32_t n;
    uint8_t *end;             /* end of the last destination */
    uint64_t bytes;
} iov_build_t;

static void iov_push(iov_build_t *b, uint8_t *dst, size_t len)
{
    if (b->n && b->end == dst) {
        if (b->iov) b->iov[b->n - 1].len += len;
    } else {
        if (b->iov) b->iov[b->n] = (flx_kv_iov_t){.dst = dst, .len = len};
        b->n++;
    }
    b->end = dst + len;
    b->bytes += len;
}

/* Destinations of rows [p0, p1) of (layer, head), K or V, in order. */
static void iov_rows(struct flx_kv_session *x, iov_build_t *b, uint32_t layer, uint32_t h, uint32_t p0, uint32_t p1,
                     int is_v)
{
    const size_t row = (size_t)x->store->head_dim * sizeof(flx_bf16_t);
    for (uint32_t p = p0; p < p1;) {
        uint32_t run;
        uint8_t *d = dest_of(x, layer, h, p, is_v, &run);
        run = FLX_MIN(run, p1 - p);
        iov_push(b, d, run * row);
        p += run;
    }
}

/* The destinations of a checked chunk, in its payload order. */
static void claim_layout(struct flx_kv_session *x, const flx_kv_chunk_t *c, iov_build_t *b)
{
    const uint32_t g0 = c->tok_begin / FLX_KV_BLOCK_TOKENS, g1 = FLX_DIV_UP(c->tok_end, FLX_KV_BLOCK_TOKENS);
    if (c->order == FLX_KV_ORDER_GRANULE) {
        for (uint32_t h = c->head_begin; h < c->head_end; h++)
            for (uint32_t g = g0; g < g1; g++) {
                uint32_t p0 = g * FLX_KV_BLOCK_TOKENS, p1 = FLX_MIN(p0 + FLX_KV_BLOCK_TOKENS, c->tok_end);
                iov_rows(x, b, c->layer, h, p0, p1, 0);
                iov_rows(x, b, c->layer, h, p0, p1, 1);
            }
    } else {
        for (int is_v = 0; is_v < 2; is_v++)
            for (uint32_t h = c->head_begin; h < c->head_end; h++)
                iov_rows(x, b, c->layer, h, c->tok_begin, c->tok_end, is_v);
    }
}

flx_status_t flx_kv_chunk_claim(flx_kv_store_h s, flx_kv_session_id_t sid, const flx_kv_chunk_t *c,
                                flx_kv_claim_t **claim_p)
{
    if (!s || !c || !claim_p) return flx_error_set(FLX_ERR_INVALID, "chunk claim: NULL argument");
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    if (x->state != FLX_KV_RESERVED && x->state != FLX_KV_RECEIVING) {
        st = flx_error_set(FLX_ERR_STATE, "chunk for session %#llx in state %s refused", (unsigned long long)sid,
                           flx_kv_state_name(x->state));
        goto refuse;
    }
    if ((st = chunk_check(x, c)) != FLX_OK) goto fail;
    const uint32_t g0 = c->tok_begin / FLX_KV_BLOCK_TOKENS, g1 = FLX_DIV_UP(c->tok_end, FLX_KV_BLOCK_TOKENS);
    for (uint32_t h = c->head_begin; h < c->head_end; h++)
        for (uint32_t g = g0; g < g1; g++) {
            uint64_t bit, *w = gran_word(x, c->layer, h, g, &bit);
            if (*w & bit) {
                st = flx_error_set(FLX_ERR_DUPLICATE,
                                   "chunk layer %u heads [%u, %u) tokens [%u, %u) overlaps data already sent "
                                   "(head %u, tokens from %u)",
                                   c->layer, c->head_begin, c->head_end, c->tok_begin, c->tok_end, h,
                                   g * FLX_KV_BLOCK_TOKENS);
                goto fail;
            }
        }
    /* Destinations, in payload order: counted, then listed. */
    iov_build_t count = {0};
    claim_layout(x, c, &count);
    claim_priv_t *priv = malloc(sizeof *priv + (size_t)count.n * sizeof(flx_kv_iov_t));
    if (!priv) {
        st = flx_error_set(FLX_ERR_NOMEM, "chunk claim: %u destinations", count.n);
        goto refuse;
    }
    priv->sess = x;
    flx_kv_claim_t *cl = &priv->pub;
    iov_build_t b = {.iov = priv->iov};
    claim_layout(x, c, &b);
    FLX_CORRUPTION(b.n != count.n || b.bytes != flx_kv_chunk_bytes(c));
    cl->sid = sid;
    cl->chunk = *c;
    cl->iov = priv->iov;
    cl->n_iov = b.n;
    cl->bytes = b.bytes;
    for (uint32_t h = c->head_begin; h < c->head_end; h++)
        for (uint32_t g = g0; g < g1; g++) {
            uint64_t bit, *w = gran_word(x, c->layer, h, g, &bit);
            *w |= bit;
        }
    set_state_locked(x, FLX_KV_RECEIVING);
    if (!x->t_first) x->t_first = flx_now_ns();
    x->claims_inflight++;
    atomic_fetch_add_explicit(&x->mem_refs, 1, memory_order_relaxed); /* the owner holds it: it exists */
    pthread_mutex_unlock(&x->lock);
    *claim_p = cl; /* keeps our session reference and a memory hold until complete */
    return FLX_OK;

fail:
    {
        char reason[160];
        snprintf(reason, sizeof reason, "bad chunk: %s", flx_error_msg());
        session_fail_locked(x, reason);
    }
refuse:
    pthread_mutex_unlock(&x->lock);
    session_put(x);
    return st;
}

/* The pyramid view and levels of (layer, head). */
static void head_view(struct flx_kv_session *x, uint32_t layer, uint32_t h, flx_kv_head_view_t *v,
                      flx_bf16_t *meta[FLX_KV_META_LEVELS])
{
    const size_t lh = (size_t)layer * x->store->n_kv_heads + h;
    flx_bf16_t *base = x->meta + lh * x->lay.meta_per_head;
    v->head_dim = x->store->head_dim;
    v->l_cpu = x->lay.l_cpu;
    v->n_blocks = x->lay.n_blocks;
    v->block_table = x->table + lh * x->lay.n_blocks;
    v->pool_base = x->store->arena;
    v->block_bytes = x->store->block_bytes;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) meta[j] = base + x->lay.meta_off[j];
}

/* Host blocks [*b0, *b1) whose rows all lie in prompt positions [t0, t1): a chunk that lands them
 * can build their level 0 alone. */
static void blocks_within(const struct flx_kv_session *x, uint32_t t0, uint32_t t1, uint32_t *b0, uint32_t *b1)
{
    const session_layout_t *lay = &x->lay;
    const uint32_t host0 = lay->n_sink, host1 = lay->n_sink + lay->l_cpu;
    *b0 = *b1 = 0;
    if (t1 <= host0 || t0 >= host1) return;
    const uint32_t i0 = FLX_MAX(t0, host0) - host0, i1 = FLX_MIN(t1, host1) - host0;
    *b0 = FLX_DIV_UP(i0, FLX_KV_BLOCK_TOKENS);
    *b1 = i1 == lay->l_cpu ? lay->n_blocks : i1 / FLX_KV_BLOCK_TOKENS;
    if (*b1 < *b0) *b1 = *b0;
}

/* Level 0 of blocks [b0, b1), the ones a completed chunk landed whole (run before its completion is
 * counted, so the thread that completes the layer sees it). Blocks that straddle two chunks are left
 * to that thread. */
static void build_chunk_blocks(struct flx_kv_session *x, const flx_kv_chunk_t *c, uint32_t b0, uint32_t b1)
{
    for (uint32_t h = c->head_begin; h < c->head_end && b0 < b1; h++) {
        flx_kv_head_view_t v;
        flx_bf16_t *meta[FLX_KV_META_LEVELS];
        head_view(x, c->layer, h, &v, meta);
        flx_kv_pyramid_build_blocks(&v, meta[0], b0, b1);
    }
}

/* Marks the blocks build_chunk_blocks built (caller holds x->lock). */
static void mark_chunk_blocks_locked(struct flx_kv_session *x, const flx_kv_chunk_t *c, uint32_t b0, uint32_t b1)
{
    for (uint32_t h = c->head_begin; h < c->head_end; h++) {
        uint64_t *w = x->built0 + ((size_t)c->layer * x->store->n_kv_heads + h) * x->lay.blk_words;
        for (uint32_t b = b0; b < b1; b++) w[b / 64] |= 1ull << (b % 64);
    }
}

/* A complete layer: level 0 of the blocks no chunk built whole, then levels 1..3 (bit for bit
 * flx_kv_pyramid_build's result). */
static void build_layer(struct flx_kv_session *x, uint32_t layer)
{
    for (uint32_t h = 0; h < x->store->n_kv_heads; h++) {
        flx_kv_head_view_t v;
        flx_bf16_t *meta[FLX_KV_META_LEVELS];
        head_view(x, layer, h, &v, meta);
        const uint64_t *w = x->built0 + ((size_t)layer * x->store->n_kv_heads + h) * x->lay.blk_words;
        for (uint32_t b = 0; b < x->lay.n_blocks;) {
            if (w[b / 64] >> (b % 64) & 1) {
                b++;
                continue;
            }
            uint32_t e = b + 1;
            while (e < x->lay.n_blocks && !(w[e / 64] >> (e % 64) & 1)) e++;
            flx_kv_pyramid_build_blocks(&v, meta[0], b, e);
            b = e;
        }
        flx_kv_pyramid_build_upper(&v, meta);
    }
}

/* Copies the prompt rows of one layer's window (all heads) to the device window. Called once per
 * layer, by the thread that completed it: the rows are final and no view exists yet. */
static flx_status_t upload_layer(struct flx_kv_session *x, uint32_t layer)
{
    if (!x->win_k_dev) return FLX_OK;
    const struct flx_kv_store *s = x->store;
    const size_t D = s->head_dim, row = D * sizeof(flx_bf16_t), pitch = x->lay.win_cap * row;
    const size_t off = (size_t)layer * s->n_kv_heads * x->lay.win_cap * D;
    const size_t width = (size_t)(x->lay.n_sink + x->lay.n_local) * row;
    flx_status_t st = flx_cuda_copy_htod_2d(s->cuda_device, x->win_k_dev + off, pitch, x->win_k + off, pitch, width,
                                            s->n_kv_heads);
    if (st == FLX_OK)
        st = flx_cuda_copy_htod_2d(s->cuda_device, x->win_v_dev + off, pitch, x->win_v + off, pitch, width,
                                   s->n_kv_heads);
    return st;
}

flx_status_t flx_kv_chunk_complete(flx_kv_store_h s, flx_kv_claim_t *cl, int ok)
{
    if (!s || !cl) return flx_error_set(FLX_ERR_INVALID, "chunk complete: NULL argument");
    /* The claim holds a reference and a memory hold: the session and its memory are alive even if
     * it was failed or closed meanwhile. */
    claim_priv_t *priv = claim_priv_of(cl);
    struct flx_kv_session *sess = priv->sess;
    flx_status_t st = FLX_OK;
    const flx_kv_chunk_t *c = &cl->chunk;
    const uint32_t nh = c->head_end - c->head_begin;
    const uint32_t ng = FLX_DIV_UP(c->tok_end, FLX_KV_BLOCK_TOKENS) - c->tok_begin / FLX_KV_BLOCK_TOKENS;
    int build = 0;
    uint32_t b0, b1;   /* the host blocks this chunk landed whole */
    blocks_within(sess, c->tok_begin, c->tok_end, &b0, &b1);
    if (ok) build_chunk_blocks(sess, c, b0, b1); /* its bytes are still in cache (the receiver just hashed them) */
    pthread_mutex_lock(&sess->lock);
    sess->claims_inflight--;
    if (!ok) {
        char reason[160];
        snprintf(reason, sizeof reason, "transfer of layer %u tokens [%u, %u) failed", c->layer, c->tok_begin,
                 c->tok_end);
        session_fail_locked(sess, reason);
        st = FLX_OK;
    } else if (sess->state == FLX_KV_RECEIVING) {
        sess->bytes_received += cl->bytes;
        if (sess->bytes_received == bytes_expected(sess)) sess->t_last = flx_now_ns();
        sess->missing[c->layer] -= nh * ng;
        mark_chunk_blocks_locked(sess, c, b0, b1);
        build = sess->missing[c->layer] == 0;
    } else {
        st = flx_error_set(FLX_ERR_STATE, "chunk completed for session %#llx in state %s",
                           (unsigned long long)cl->sid, flx_kv_state_name(sess->state));
    }
    pthread_mutex_unlock(&sess->lock);
    if (build) {
        build_layer(sess, c->layer);
        flx_status_t up = upload_layer(sess, c->layer);
        char reason[160];
        if (up != FLX_OK) snprintf(reason, sizeof reason, "device window upload of layer %u: %s", c->layer,
                                   flx_error_msg());
        pthread_mutex_lock(&sess->lock);
        if (up == FLX_OK) {
            sess->layers_built++;
            check_ready_locked(sess);
        } else {
            session_fail_locked(sess, reason);
        }
        pthread_mutex_unlock(&sess->lock);
        if (up != FLX_OK) st = flx_error_set(up, "session %#llx: %s", (unsigned long long)cl->sid, reason);
    }
    free(priv);
    session_settle(sess);
    mem_unref(sess);
    session_unref(sess);
    return st;
}

flx_status_t flx_kv_chunk_write(flx_kv_store_h s, flx_kv_session_id_t sid, const flx_kv_chunk_t *c,
                                const flx_bf16_t *k, const flx_bf16_t *v)
{
    if (!k || (!v && (!c || c->order != FLX_KV_ORDER_GRANULE))) {
        if (!s || !c) return flx_error_set(FLX_ERR_INVALID, "chunk write: NULL argument");
        struct flx_kv_session *x;
        if (session_get(s, sid, &x) == FLX_OK) {
            pthread_mutex_lock(&x->lock);
            session_fail_locked(x, "bad chunk: NULL payload");
            pthread_mutex_unlock(&x->lock);
            session_put(x);
        }
        return flx_error_set(FLX_ERR_INVALID, "chunk write: NULL payload");
    }
    flx_kv_claim_t *cl;
    flx_status_t st = flx_kv_chunk_claim(s, sid, c, &cl);
    if (st != FLX_OK) return st;
    /* Payload order: GRANULE is one stream at k; SPLIT is K at k then V at v, each half the bytes. */
    const uint8_t *p = (const uint8_t *)k;
    uint64_t done = 0;
    for (uint32_t i = 0; i < cl->n_iov; i++) {
        if (c->order != FLX_KV_ORDER_GRANULE && done == cl->bytes / 2) p = (const uint8_t *)v;
        size_t len = cl->iov[i].len;
        if (c->order != FLX_KV_ORDER_GRANULE && done < cl->bytes / 2 && done + len > cl->bytes / 2) {
            /* a merged destination spans the K/V boundary: K's tail, then V's head */
            size_t kpart = cl->bytes / 2 - done;
            memcpy(cl->iov[i].dst, p, kpart);
            memcpy((uint8_t *)cl->iov[i].dst + kpart, v, len - kpart);
            p = (const uint8_t *)v + (len - kpart);
        } else {
            memcpy(cl->iov[i].dst, p, len);
            p += len;
        }
        done += len;
    }
    return flx_kv_chunk_complete(s, cl, 1);
}

/* ---- statistics ---- */

static int finite_nonneg(float x) { return isfinite(x) && x >= 0.0f; }

/* Checks one record; sets the message naming the head and field. */
static flx_status_t stats_check(const flx_head_stats_t *st, const float *q, uint32_t D, uint32_t layer, uint32_t h)
{
#define BAD(why) flx_error_set(FLX_ERR_INVALID, "stats layer %u head %u: %s", layer, h, why)
    if (st->version != FLX_HEAD_STATS_VERSION)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "stats layer %u head %u: version %u, expected %u", layer, h,
                             st->version, FLX_HEAD_STATS_VERSION);
    if (st->reserved != 0) return BAD("reserved (must be 0)");
    const float *all = &st->k_sink_norm;
    const size_t nf = (sizeof *st - offsetof(flx_head_stats_t, k_sink_norm)) / sizeof(float);
    /* LSEs may be -inf (empty segment), never NaN or +inf; everything else must be finite. */
    for (size_t i = 0; i < nf; i++) {
        const float *f = &all[i];
        int is_lse = f >= st->lse_anchor && f < st->lse_anchor + 3;
        if (is_lse ? isnan(*f) || *f == INFINITY : !isfinite(*f))
            return BAD(is_lse ? "an lse_anchor is NaN or +inf" : "a field is not finite");
    }
    if (!finite_nonneg(st->k_sink_norm) || !finite_nonneg(st->v_sink_norm) || !finite_nonneg(st->k_cpu_mean_norm) ||
        !finite_nonneg(st->v_cpu_mean_norm))
        return BAD("a norm is negative");
    if (st->k_cpu_norm_mom[0] < 0 || st->k_cpu_norm_mom[1] < 0 || st->v_cpu_norm_mom[0] < 0 ||
        st->v_cpu_norm_mom[1] < 0 || st->z_anchor_mom[1] < 0)
        return BAD("a mean norm or variance is negative");
    for (int i = 0; i < 3; i++)
        if (st->onorm_anchor[i] < 0) return BAD("onorm_anchor is negative");
    if (st->q_anchor_norm < 0 || st->max_onorm_gpu_anchor < 0) return BAD("q_anchor_norm or max_onorm is negative");
    for (int i = 0; i < 4; i++)
        if (!(st->bgt_star[i] >= 0.0f && st->bgt_star[i] <= 1.0f)) return BAD("bgt_star outside [0, 1]");
    double n2 = 0;
    for (uint32_t d = 0; d < D; d++) {
        if (!isfinite(q[d])) return BAD("q_anchor is not finite");
        n2 += (double)q[d] * q[d];
    }
    double n = sqrt(n2);
    if (fabs(n - st->q_anchor_norm) > 1e-3 * n + 1e-6)
        return flx_error_set(FLX_ERR_INVALID, "stats layer %u head %u: q_anchor_norm %g but ||q_anchor|| = %g", layer, h,
                             st->q_anchor_norm, n);
    return FLX_OK;
#undef BAD
}

flx_status_t flx_kv_stats_write(flx_kv_store_h s, flx_kv_session_id_t sid, uint32_t layer,
                                const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor)
{
    if (!s || !stats || !mean_k || !q_anchor) return flx_error_set(FLX_ERR_INVALID, "stats write: NULL argument");
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    const uint32_t H = s->n_q_heads, D = s->head_dim;
    pthread_mutex_lock(&x->lock);
    if (x->state != FLX_KV_RESERVED && x->state != FLX_KV_RECEIVING) {
        st = flx_error_set(FLX_ERR_STATE, "stats for session %#llx in state %s refused", (unsigned long long)sid,
                           flx_kv_state_name(x->state));
        goto out;
    }
    if (!x->lay.with_stats) {
        st = flx_error_set(FLX_ERR_STATE, "session %#llx was opened without statistics", (unsigned long long)sid);
        goto out;
    }
    if (layer >= s->n_layers) {
        st = flx_error_set(FLX_ERR_INVALID, "stats layer %u out of range (n_layers %u)", layer, s->n_layers);
        goto fail;
    }
    if (x->stats_done[layer]) {
        st = flx_error_set(FLX_ERR_DUPLICATE, "stats of layer %u sent twice", layer);
        goto fail;
    }
    for (uint32_t h = 0; h < H; h++) {
        if ((st = stats_check(&stats[h], q_anchor + (size_t)h * D, D, layer, h)) != FLX_OK) goto fail;
        for (uint32_t d = 0; d < D; d++)
            if (!isfinite(mean_k[(size_t)h * D + d])) {
                st = flx_error_set(FLX_ERR_INVALID, "stats layer %u head %u: mean_k not finite", layer, h);
                goto fail;
            }
    }
    memcpy(x->stats + (size_t)layer * H, stats, H * sizeof *stats);
    memcpy(x->mean_k + (size_t)layer * H * D, mean_k, (size_t)H * D * sizeof(float));
    memcpy(x->q_anchor + (size_t)layer * H * D, q_anchor, (size_t)H * D * sizeof(float));
    x->stats_done[layer] = 1;
    x->stats_received++;
    set_state_locked(x, FLX_KV_RECEIVING);
    check_ready_locked(x);
    goto out;
fail:
    {
        char reason[160];
        snprintf(reason, sizeof reason, "bad statistics: %s", flx_error_msg());
        session_fail_locked(x, reason);
    }
out:
    pthread_mutex_unlock(&x->lock);
    session_put(x);
    return st;
}

/* ---- views ---- */

flx_status_t flx_kv_session_acquire(flx_kv_store_h s, flx_kv_session_id_t sid, flx_kv_session_h *sess_p)
{
    if (!s || !sess_p) return flx_error_set(FLX_ERR_INVALID, "acquire: NULL argument");
    struct flx_kv_session *x;
    flx_status_t st = session_get(s, sid, &x);
    if (st != FLX_OK) return st;
    pthread_mutex_lock(&x->lock);
    flx_kv_state_t state = x->state;
    /* READY/DECODING: the owner holds the memory, so it exists; the view now holds it too. */
    if (state == FLX_KV_READY || state == FLX_KV_DECODING) atomic_fetch_add_explicit(&x->mem_refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&x->lock);
    if (state != FLX_KV_READY && state != FLX_KV_DECODING) {
        session_unref(x);
        return flx_error_set(FLX_ERR_STATE, "session %#llx is %s, not READY or DECODING", (unsigned long long)sid,
                             flx_kv_state_name(state));
    }
    *sess_p = x;
    return FLX_OK;
}

void flx_kv_session_release(flx_kv_session_h x)
{
    if (!x) return;
    mem_unref(x);
    session_unref(x);
}

flx_status_t flx_kv_head_view(flx_kv_session_h x, uint32_t layer, uint32_t kv_head, flx_kv_head_view_t *v)
{
    const struct flx_kv_store *s = x->store;
    if (layer >= s->n_layers || kv_head >= s->n_kv_heads)
        return flx_error_set(FLX_ERR_INVALID, "view layer %u kv head %u out of range (%u, %u)", layer, kv_head,
                             s->n_layers, s->n_kv_heads);
    const size_t lh = (size_t)layer * s->n_kv_heads + kv_head;
    flx_bf16_t *meta = x->meta + lh * x->lay.meta_per_head;
    v->head_dim = s->head_dim;
    v->l_cpu = x->lay.l_cpu;
    v->n_blocks = x->lay.n_blocks;
    v->block_table = x->table + lh * x->lay.n_blocks;
    v->pool_base = s->arena;
    v->block_bytes = s->block_bytes;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        v->meta[j] = meta + x->lay.meta_off[j];
        v->meta_n[j] = x->lay.meta_n[j];
    }
    v->win_k = x->win_k + lh * x->lay.win_cap * s->head_dim;
    v->win_v = x->win_v + lh * x->lay.win_cap * s->head_dim;
    v->n_win = x->n_win[layer];
    v->win_cap = x->lay.win_cap;
    v->numa_node = s->numa_node;
    v->win_k_dev = x->win_k_dev ? x->win_k_dev + lh * x->lay.win_cap * s->head_dim : NULL;
    v->win_v_dev = x->win_v_dev ? x->win_v_dev + lh * x->lay.win_cap * s->head_dim : NULL;
    v->win_device = x->win_k_dev ? s->cuda_device : -1;
    if (s->arena_dev && x->side_dev) {   /* same offsets in the device's view of the same memory */
        v->pool_base_dev = s->arena_dev;
        v->block_table_dev = (const uint32_t *)(x->side_dev + ((const uint8_t *)v->block_table - x->side));
        for (int j = 0; j < FLX_KV_META_LEVELS; j++)
            v->meta_dev[j] = (const flx_bf16_t *)(x->side_dev + ((const uint8_t *)v->meta[j] - x->side));
        v->host_device = s->pin_device;
    } else {
        v->pool_base_dev = NULL;
        v->block_table_dev = NULL;
        for (int j = 0; j < FLX_KV_META_LEVELS; j++) v->meta_dev[j] = NULL;
        v->host_device = -1;
    }
    return FLX_OK;
}

flx_status_t flx_kv_head_stats(flx_kv_session_h x, uint32_t layer, uint32_t q_head, const flx_head_stats_t **stats_p,
                               const float **mean_k_p, const float **q_anchor_p)
{
    const struct flx_kv_store *s = x->store;
    if (layer >= s->n_layers || q_head >= s->n_q_heads)
        return flx_error_set(FLX_ERR_INVALID, "stats layer %u head %u out of range (%u, %u)", layer, q_head,
                             s->n_layers, s->n_q_heads);
    const size_t i = (size_t)layer * s->n_q_heads + q_head;
    *stats_p = x->stats ? x->stats + i : NULL;
    *mean_k_p = x->mean_k ? x->mean_k + i * s->head_dim : NULL;
    *q_anchor_p = x->q_anchor ? x->q_anchor + i * s->head_dim : NULL;
    return FLX_OK;
}

flx_status_t flx_kv_session_shape(flx_kv_session_h x, flx_kv_session_shape_t *shape_p)
{
    if (!x || !shape_p) return flx_error_set(FLX_ERR_INVALID, "session shape: NULL argument");
    const struct flx_kv_store *s = x->store;
    *shape_p = (flx_kv_session_shape_t){.n_layers = s->n_layers, .n_kv_heads = s->n_kv_heads,
                                        .n_q_heads = s->n_q_heads, .head_dim = s->head_dim,
                                        .prompt_len = x->prompt_len, .n_sink = x->lay.n_sink,
                                        .n_local = x->lay.n_local, .l_cpu = x->lay.l_cpu,
                                        .with_stats = x->stats != NULL};
    return FLX_OK;
}

/* flx_kv_window_append (stream NULL: the device rows copied synchronously) and
 * flx_kv_window_append_async (queued on stream from the caller's page-locked k, v). */
static flx_status_t window_append(flx_kv_session_h x, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v,
                                  flx_cuda_stream_t stream)
{
    if (!x) return flx_error_set(FLX_ERR_INVALID, "window append: NULL session");
    const struct flx_kv_store *s = x->store;
    if (!k || !v || layer >= s->n_layers)
        return flx_error_set(FLX_ERR_INVALID, "window append: layer %u out of range or NULL data", layer);
    if (stream && x->win_k_dev && (!flx_cuda_host_is_pinned(k) || !flx_cuda_host_is_pinned(v)))
        return flx_error_set(FLX_ERR_INVALID, "window append on a stream: k and v must be page-locked host memory "
                             "(the copies read them when the stream reaches them)");
    pthread_mutex_lock(&x->lock);
    flx_kv_state_t state = x->state;
    pthread_mutex_unlock(&x->lock);
    if (state != FLX_KV_DECODING)
        return flx_error_set(FLX_ERR_STATE, "window append: session %#llx is %s, not DECODING",
                             (unsigned long long)x->id, flx_kv_state_name(state));
    uint32_t n = x->n_win[layer];
    if (n >= x->lay.win_cap)
        return flx_error_set(FLX_ERR_CAPACITY, "window of layer %u full (%u tokens: max_new_tokens %u reached)", layer,
                             n, x->max_new);
    const size_t D = s->head_dim;
    for (uint32_t h = 0; h < s->n_kv_heads; h++) {
        size_t lh = (size_t)layer * s->n_kv_heads + h;
        memcpy(x->win_k + (lh * x->lay.win_cap + n) * D, k + h * D, D * sizeof(flx_bf16_t));
        memcpy(x->win_v + (lh * x->lay.win_cap + n) * D, v + h * D, D * sizeof(flx_bf16_t));
    }
    if (x->win_k_dev) {
        /* Row n of every head of the layer: n_kv_heads rows of D, a win_cap-row pitch apart. */
        const size_t row = D * sizeof(flx_bf16_t), pitch = x->lay.win_cap * row;
        const size_t off = ((size_t)layer * s->n_kv_heads * x->lay.win_cap + n) * D;
        flx_status_t st = FLX_OK;
        for (int kv = 0; kv < 2 && st == FLX_OK; kv++) {
            flx_bf16_t *dst = (kv ? x->win_v_dev : x->win_k_dev) + off;
            const flx_bf16_t *src = kv ? v : k;
            st = stream ? flx_cuda_copy_htod_2d_async(s->cuda_device, dst, pitch, src, row, row, s->n_kv_heads, stream)
                        : flx_cuda_copy_htod_2d(s->cuda_device, dst, pitch, src, row, row, s->n_kv_heads);
        }
        if (st != FLX_OK) {
            char why[FLX_ERROR_MSG_MAX];
            snprintf(why, sizeof why, "%s", flx_error_msg());
            return flx_error_set(st, "window append: session %#llx layer %u row %u to device %d: %s",
                                 (unsigned long long)x->id, layer, n, s->cuda_device, why);
        }
    }
    x->n_win[layer] = n + 1;
    return FLX_OK;
}

flx_status_t flx_kv_window_append(flx_kv_session_h x, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v)
{
    return window_append(x, layer, k, v, NULL);
}

flx_status_t flx_kv_window_append_async(flx_kv_session_h x, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v,
                                        flx_cuda_stream_t stream)
{
    if (!stream) return flx_error_set(FLX_ERR_INVALID, "window append on a stream: NULL stream");
    return window_append(x, layer, k, v, stream);
}
