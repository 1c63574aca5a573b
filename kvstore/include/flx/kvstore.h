/*
 * flx/kvstore.h - the NUMA-aware host KV store of a decode node.
 *
 * OVERVIEW
 * A store holds the KV caches of many sessions (prompts) of one model shape. Prefill pushes each
 * session's KV in chunks (from UCX receiver threads, or in-process); the store checks every chunk
 * against the session it claims, writes it into its final place, builds the Quest metadata pyramid
 * of a layer as soon as that layer is complete, and marks the session READY once every byte and the
 * predictor statistics have arrived. The decode loop then reads READY/DECODING sessions through
 * views, appends generated tokens to the device-resident window, and closes the session.
 *
 * Each (layer, kv head) keeps its window (sink + local + generated tokens) apart from the host
 * segment. The window always has a host copy: chunks land there (UCX writes host memory) and CPU
 * workers read it. With FLX_KV_STORE_WINDOW_DEVICE and a GPU it also has a device copy, which GPU
 * window attention reads (see DEVICE WINDOW).
 *
 * TOKEN SEGMENTS (prompt of L tokens, store defaults sink = 64, local = 256)
 *   n_sink  = min(sink, L)
 *   n_local = min(local, L - n_sink)
 *   l_cpu   = L - n_sink - n_local            host-resident tokens, prompt positions
 *                                             [n_sink, n_sink + l_cpu)
 *   window  = sink tokens, then local tokens, then generated tokens (n_new), in that order;
 *             capacity n_sink + n_local + max_new_tokens per (layer, kv head)
 *
 * BUDGET (used by fluxion/): a head's budget bgt in [0, 1] is the fraction of the l_cpu
 * host-resident tokens it attends to in addition to its window.
 *
 * MEMORY LAYOUT
 *   Physical block (16 tokens of one (session, layer, kv head)), block_bytes = 64 * head_dim:
 *     offset            size            field
 *     0                 32 * head_dim   K  bf16 (16, head_dim), token-major
 *     32 * head_dim     32 * head_dim   V  bf16 (16, head_dim)
 *   Host token i (0 <= i < l_cpu) of (layer, head) lives in block block_table[i / 16], row i % 16.
 *   Rows of the last block past l_cpu are zero and never read by kernels.
 *
 *   Metadata pyramid of (layer, kv head), level j = 0..3 covers logical blocks of blk = 16 << j:
 *     meta[j]: bf16 (meta_n[j], 2, head_dim), meta_n[j] = ceil(l_cpu / blk);
 *     entry b = per-channel min (row 0) and max (row 1) of K over host tokens
 *     [b * blk, min((b + 1) * blk, l_cpu)). The last, partial block covers only existing tokens.
 *
 *   Window of (layer, kv head): win_k, win_v bf16 (win_cap, head_dim); rows [0, n_win) hold
 *   data, rows past n_win are room for generated tokens. The device copy (win_k_dev, win_v_dev)
 *   has the same shape, and rows [0, n_win) equal the host rows byte for byte.
 *
 * MEMORY PLACEMENT
 * KV blocks come from one arena per store, allocated on a NUMA node (chosen by the caller, or the
 * node of the calling CPU) with libnuma, advised for transparent huge pages, optionally pinned
 * for CUDA UVA. Per-session side memory (block tables, metadata, window, statistics, completion
 * bitmaps) is one allocation on the same node. Both count against capacity_bytes; a session that
 * does not fit is refused with FLX_ERR_CAPACITY at open, never later. Neither is inherited by a
 * child process (MADV_DONTFORK): a fork must not turn memory that receives write into copy-on-write.
 * A session's blocks are taken in ascending arena order, as one contiguous run when the pool has
 * one (first fit), so consecutive blocks of a (layer, kv head), and of consecutive heads, are
 * usually adjacent in memory: a chunk in GRANULE order whose tokens are all host-resident then
 * lands in one contiguous range (one zero-copy receive instead of one per block).
 *
 * MEMORY LIFETIME
 * A session's memory (blocks, side memory, device window) is held by its owner while the session
 * lives (RESERVED .. DECODING), by every outstanding chunk claim (a receive in flight into it) and
 * by every acquired view. FAILED and CLOSED drop the owner's hold; the memory returns to the pool
 * when the last hold goes, never earlier: a transport's receive still writing into a failed
 * session's blocks keeps them out of the pool until it completes or is cancelled (peers have
 * corrupted other requests' KV by reusing pages under an in-flight write). flx_kv_store_info
 * reports such memory as pending_free_bytes.
 *
 * DEVICE WINDOW (FLX_KV_STORE_WINDOW_DEVICE)
 * When the flag is set and a CUDA device exists at store create, every session gets one device
 * allocation at open holding a copy of its whole window, K then V, each bf16 (n_layers,
 * n_kv_heads, win_cap, head_dim) like the host window. Device memory is a different resource from
 * host memory, so it has its own budget, device_capacity_bytes, and never counts against
 * capacity_bytes; a session whose window does not fit the device budget, or whose cudaMalloc
 * runs out of memory, is refused at open with FLX_ERR_CAPACITY (any other device error is returned
 * as itself, FLX_ERR_DEVICE); either way nothing stays reserved. The prompt rows of
 * a layer are uploaded when the layer completes (every granule, window rows included, has landed;
 * the same moment its pyramid is built); READY comes only after every layer's upload, and a
 * failed upload makes the session FAILED with the reason. flx_kv_window_append writes the new row
 * to both copies. The device memory is freed with the session's memory, when the last reference
 * goes (a view held across close keeps it valid). Uploads and flx_kv_window_append are
 * synchronous (see flx/cuda_rt.h): an append returns once the row is on the device;
 * flx_kv_window_append_async queues the device row on the caller's stream instead.
 * Without a device (no GPU, no driver, or a build without CUDA) the flag is accepted and the store
 * falls back to host-only windows: flx_kv_store_info reports window_on_device = 0, views carry
 * NULL device pointers, and everything else works unchanged, so one configuration runs on every
 * node.
 *
 * PINNED ARENA (FLX_KV_STORE_PIN_CUDA)
 * With the flag and a CUDA device at create, the arena is page-locked and mapped for the device
 * given as cuda_device (default 0), and each session's side memory (block tables, metadata,
 * window) as well when the system allows it. Views then also carry the device addresses of their
 * host-resident part (pool_base_dev, block_table_dev, meta_dev), so the GPU worker reads the
 * metadata and the selected KV blocks in place over the bus (UVA), without a copy. A session
 * whose side memory could not be pinned has NULL device addresses: its tasks stay on the CPU.
 *
 * SESSION STATE MACHINE
 *   RESERVED --first chunk or statistics--> RECEIVING
 *   RECEIVING --last byte + pyramids + statistics (+ commit with COMMIT)--> READY
 *   READY --begin_decode--> DECODING
 *   RESERVED | RECEIVING --bad chunk, bad commit, transport failure, deadline--> FAILED
 *   READY --lease expired without begin_decode--> FAILED (reclaimed: memory back to the pool)
 *   any --close--> CLOSED
 * FAILED and CLOSED release the session's memory (MEMORY LIFETIME). Anything else is refused with
 * FLX_ERR_STATE. A failed session never becomes READY.
 *
 * DEADLINE AND LEASE
 * A session may carry a deadline (READY must come by then) and a lease (a READY session must be
 * claimed by begin_decode within it, renewable). The store has no thread of its own: whoever owns
 * the clock calls flx_kv_store_expire (the UCX receiver's progress thread does, flx/transport.h),
 * which fails the sessions past their time with the reason and says when the next one is due.
 *
 * COMMIT
 * A session opened with FLX_KV_SESSION_COMMIT becomes READY only after flx_kv_session_commit: the
 * prefill's statement of what it sent (KV bytes, statistics layers) and the first token it
 * sampled. Totals that disagree with the session fail it. The first token is then part of the
 * session (flx_kv_session_info().first_token) for the decode side to start from.
 *
 * THREAD MODE
 * All functions are thread-safe. Chunks of one session may be written concurrently from several
 * threads (disjoint ranges). A view obtained through flx_kv_session_acquire stays valid until the
 * matching release, even if the session is closed or its lease expires meanwhile; its KV is
 * immutable once READY. The window is appended by one thread at a time per session (the decode
 * loop). flx_kv_session_wait blocks its caller only.
 */
#ifndef FLX_KVSTORE_H
#define FLX_KVSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "flx/bf16.h"
#include "flx/cuda_rt.h"
#include "flx/safetensors.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_KV_BLOCK_TOKENS 16
#define FLX_KV_META_LEVELS 4          /* blk = 16, 32, 64, 128 */
#define FLX_KV_NUMA_ANY (-1)

typedef struct flx_kv_store *flx_kv_store_h;
typedef uint64_t flx_kv_session_id_t;   /* never 0; not reused after close */

/* ---- store ---- */

enum {
    FLX_KV_STORE_FIELD_CAPACITY = 1u << 0,
    FLX_KV_STORE_FIELD_NUMA_NODE = 1u << 1,
    FLX_KV_STORE_FIELD_SHAPE = 1u << 2,      /* n_layers, n_kv_heads, n_q_heads, head_dim */
    FLX_KV_STORE_FIELD_WINDOW = 1u << 3,     /* sink, local */
    FLX_KV_STORE_FIELD_FLAGS = 1u << 4,
    FLX_KV_STORE_FIELD_MAX_SESSIONS = 1u << 5,
    FLX_KV_STORE_FIELD_CUDA_DEVICE = 1u << 6,       /* cuda_device */
    FLX_KV_STORE_FIELD_DEVICE_CAPACITY = 1u << 7,   /* device_capacity_bytes */
    FLX_KV_STORE_FIELD_ON_STATE = 1u << 8,          /* on_state, on_state_ctx */
};

enum {
    FLX_KV_STORE_HUGEPAGES = 1u << 0,  /* madvise(MADV_HUGEPAGE) on the arena (default on) */
    FLX_KV_STORE_PREFAULT = 1u << 1,   /* touch the whole arena at create: memory is really there */
    FLX_KV_STORE_PIN_CUDA = 1u << 2,   /* cudaHostRegister the arena and side memory if a GPU exists */
    /*
     * Device copy of every session's window when a GPU exists at create (DEVICE WINDOW above);
     * host-only windows otherwise. Opt-in, off by default: the device memory is shared with the
     * model weights and the GPU worker's workspaces, so how much of it windows may take is a
     * deployment decision; asking for it creates a CUDA context (hundreds of MiB, seconds) that
     * tools, tests and CPU-only deployments should not pay for; and every append costs a
     * synchronous copy until the GPU worker owns a stream. The decode node sets it when it starts
     * a GPU worker.
     */
    FLX_KV_STORE_WINDOW_DEVICE = 1u << 3,
};

typedef struct flx_kv_store_params {
    uint64_t field_mask;     /* FLX_KV_STORE_FIELD_*: which fields below are set */
    size_t capacity_bytes;   /* KV blocks + side memory of all sessions (required) */
    int numa_node;           /* FLX_KV_NUMA_ANY (default) or a node that exists */
    uint32_t n_layers;       /* required */
    uint32_t n_kv_heads;     /* required */
    uint32_t n_q_heads;      /* multiple of n_kv_heads (required) */
    uint32_t head_dim;       /* multiple of 16, 16..256 (required) */
    uint32_t sink;           /* default 64 */
    uint32_t local;          /* default 256 */
    uint32_t flags;          /* FLX_KV_STORE_*; default HUGEPAGES */
    uint32_t max_sessions;   /* default 1024 */
    int cuda_device;         /* device ordinal of the device windows and of the pinned arena's UVA
                              * addresses (default 0); >= 0 */
    size_t device_capacity_bytes; /* device windows of all sessions; default a quarter of the device
                                   * memory free at create; at most the free memory at create.
                                   * Only with FLX_KV_STORE_WINDOW_DEVICE and a device. */
    /* Called after a session's state changed to anything but RECEIVING (READY, DECODING, FAILED,
     * CLOSED), on the thread that changed it, with the session's lock held: it may only signal
     * (wake a thread that then asks flx_kv_session_info), never call into the store. What lets an
     * owner of many sessions (the decode node) learn of READY and FAILED without polling. */
    void (*on_state)(void *ctx);
    void *on_state_ctx;
} flx_kv_store_params_t;

/* Unknown flags, a negative cuda_device, a device_capacity_bytes of 0 or above the device's free
 * memory are refused. With WINDOW_DEVICE, a cuda_device that does not exist is refused when the
 * machine has devices; on a machine with none the store falls back to host windows. */
flx_status_t flx_kv_store_create(const flx_kv_store_params_t *params, flx_kv_store_h *store_p);
/* Closes every session; views must have been released. Accepts NULL. */
void flx_kv_store_destroy(flx_kv_store_h store);

typedef struct flx_kv_store_info {
    int numa_node;            /* node the arena is bound to (recorded for worker binding) */
    int hugepages;            /* THP advice accepted */
    int pinned;               /* registered with CUDA */
    size_t capacity_bytes;
    size_t used_bytes;        /* reserved by sessions whose memory is not yet back in the pool */
    size_t pending_free_bytes;/* part of used_bytes: FAILED / CLOSED sessions whose memory is still
                                 held by an in-flight claim or a view (MEMORY LIFETIME) */
    uint32_t max_sessions;
    size_t block_bytes;
    uint32_t n_sessions;      /* not CLOSED */
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim, sink, local;
    int window_on_device;     /* sessions get device windows (WINDOW_DEVICE asked and a device found) */
    int cuda_device;          /* ordinal of the device windows; -1 when window_on_device is 0 */
    size_t device_capacity_bytes; /* device window budget; 0 when window_on_device is 0 */
    size_t device_used_bytes; /* device window bytes of sessions not yet freed */
} flx_kv_store_info_t;

void flx_kv_store_info(flx_kv_store_h store, flx_kv_store_info_t *info_p);

/* Host bytes a session of this prompt length would reserve (KV blocks + side memory), counted
 * against capacity_bytes. */
flx_status_t flx_kv_session_bytes(flx_kv_store_h store, uint32_t prompt_len, uint32_t max_new_tokens,
                                  size_t *bytes_p);
/* Device bytes the same session would reserve against device_capacity_bytes (its device window);
 * 0 when the store keeps windows in host memory only. */
flx_status_t flx_kv_session_device_bytes(flx_kv_store_h store, uint32_t prompt_len, uint32_t max_new_tokens,
                                         size_t *bytes_p);

/* ---- sessions ---- */

typedef enum {
    FLX_KV_RESERVED = 0,
    FLX_KV_RECEIVING,
    FLX_KV_READY,
    FLX_KV_DECODING,
    FLX_KV_FAILED,
    FLX_KV_CLOSED,
} flx_kv_state_t;

const char *flx_kv_state_name(flx_kv_state_t s);

enum {
    FLX_KV_SESSION_NO_STATS = 1u << 0,  /* READY without predictor statistics (full / fixed modes) */
    FLX_KV_SESSION_COMMIT = 1u << 1,    /* READY also needs flx_kv_session_commit (COMMIT above) */
};

typedef struct flx_kv_session_params {
    uint32_t prompt_len;       /* L >= 1 */
    uint32_t max_new_tokens;   /* window room for generated tokens */
    uint32_t flags;            /* FLX_KV_SESSION_* */
    uint64_t deadline_ns;      /* flx_now_ns() time by which READY must come; 0 = none */
    uint64_t lease_ns;         /* ns a READY session may wait for begin_decode; 0 = unlimited */
} flx_kv_session_params_t;

flx_status_t flx_kv_session_open(flx_kv_store_h store, const flx_kv_session_params_t *params,
                                 flx_kv_session_id_t *sid_p);
/* Legal from any state but CLOSED; the id is dead at once, the memory returns when the last hold
 * goes (MEMORY LIFETIME). */
flx_status_t flx_kv_session_close(flx_kv_store_h store, flx_kv_session_id_t sid);
/* Marks RESERVED/RECEIVING sessions FAILED with the reason (transport error, deadline); the
 * session stays known (info shows the reason) until closed. */
flx_status_t flx_kv_session_fail(flx_kv_store_h store, flx_kv_session_id_t sid, const char *reason);
/* READY -> DECODING. */
flx_status_t flx_kv_session_begin_decode(flx_kv_store_h store, flx_kv_session_id_t sid);

/* What the prefill says it sent, checked against the session: kv_bytes must equal bytes_expected
 * and n_stats_layers the number of layers (0 for a NO_STATS session). */
typedef struct flx_kv_commit {
    int32_t first_token;       /* the token the prefill sampled from its last logits, >= 0 */
    uint32_t n_stats_layers;
    uint64_t kv_bytes;
} flx_kv_commit_t;

/* For a RESERVED/RECEIVING session opened with FLX_KV_SESSION_COMMIT; may come before the last
 * chunk has landed (READY then waits for it). Totals that disagree, a negative first token or a
 * second commit fail the session (FLX_ERR_INVALID / FLX_ERR_DUPLICATE); a session opened without
 * COMMIT refuses it with FLX_ERR_STATE, unchanged. */
flx_status_t flx_kv_session_commit(flx_kv_store_h store, flx_kv_session_id_t sid, const flx_kv_commit_t *commit);

/* Sets the lease to lease_ns (0 = unlimited), counted from now for a READY session, from READY for
 * a RESERVED/RECEIVING one. FLX_ERR_STATE for DECODING, FAILED. */
flx_status_t flx_kv_session_renew(flx_kv_store_h store, flx_kv_session_id_t sid, uint64_t lease_ns);

/* Fails every RESERVED/RECEIVING session whose deadline is at or before now_ns ("deadline ...")
 * and every READY session whose lease ended ("lease ... expired"). Returns how many it failed;
 * *next_ns_p (may be NULL) gets the earliest deadline or lease end still ahead, UINT64_MAX if
 * none. */
uint32_t flx_kv_store_expire(flx_kv_store_h store, uint64_t now_ns, uint64_t *next_ns_p);

typedef struct flx_kv_session_info {
    flx_kv_state_t state;
    uint32_t prompt_len, n_sink, n_local, l_cpu, max_new_tokens;
    uint32_t flags;            /* FLX_KV_SESSION_* it was opened with */
    uint64_t bytes_expected;   /* K+V payload bytes the prefill must push */
    uint64_t bytes_received;   /* K+V payload bytes of completed chunks */
    uint32_t claims_inflight;  /* chunk claims not yet completed (receives in flight) */
    int memory_held;           /* the session's memory is still out of the pool */
    size_t reserved_bytes;
    char fail_reason[160];     /* why FAILED, else empty */
    size_t device_bytes;       /* device window bytes (0: host-only window) */
    int32_t first_token;       /* from the commit; -1 before it or without COMMIT */
    /* flx_now_ns() times; 0 = not yet */
    uint64_t t_open_ns;        /* open */
    uint64_t t_first_byte_ns;  /* first chunk claimed */
    uint64_t t_last_byte_ns;   /* the chunk that completed the last K/V bytes */
    uint64_t t_ready_ns;       /* READY */
    uint64_t t_end_ns;         /* FAILED or CLOSED */
    uint64_t deadline_ns;      /* 0 = none */
    uint64_t lease_end_ns;     /* READY: when the lease ends; 0 = unlimited or not READY */
    uint64_t lease_ns;
} flx_kv_session_info_t;

flx_status_t flx_kv_session_info(flx_kv_store_h store, flx_kv_session_id_t sid, flx_kv_session_info_t *info_p);

/* Blocks until the session is neither RESERVED nor RECEIVING (READY, DECODING or FAILED: *state_p)
 * or timeout_ns passed (FLX_ERR_TIMEOUT); FLX_ERR_NOT_FOUND once the session is closed or
 * unknown. No busy waiting: woken by the store's state changes. */
flx_status_t flx_kv_session_wait(flx_kv_store_h store, flx_kv_session_id_t sid, uint64_t timeout_ns,
                                 flx_kv_state_t *state_p);

/* ---- chunks (prefill -> store) ---- */

/*
 * A chunk: K and V of kv heads [head_begin, head_end) of one layer for prompt positions
 * [tok_begin, tok_end). tok_begin is a multiple of 16; tok_end is a multiple of 16 or equals L.
 * Every (layer, head, 16-token granule) must arrive exactly once. Payload order, nh = head_end -
 * head_begin, nt = tok_end - tok_begin, granule g holding n_g tokens (16, or fewer at L):
 *   SPLIT    K bf16 (nh, nt, head_dim), then V bf16 (nh, nt, head_dim): a prefill's natural layout;
 *   GRANULE  for each head, for each granule: K bf16 (n_g, head_dim), then V bf16 (n_g, head_dim):
 *            a physical block's layout, so the host-resident part of a chunk maps onto adjacent
 *            blocks as one run (the UCX wire format's order, docs/transfer.md).
 */
typedef enum {
    FLX_KV_ORDER_SPLIT = 0,
    FLX_KV_ORDER_GRANULE = 1,
} flx_kv_order_t;

typedef struct flx_kv_chunk {
    uint32_t layer;
    uint32_t head_begin, head_end;
    uint32_t tok_begin, tok_end;
    flx_dtype_t dtype;        /* must be FLX_DT_BF16 */
    uint32_t head_dim;        /* must equal the store's */
    flx_kv_order_t order;     /* payload order; SPLIT (0) by default */
} flx_kv_chunk_t;

/* Payload bytes of a chunk (K and V); 0 for an empty or inverted range. */
static inline uint64_t flx_kv_chunk_bytes(const flx_kv_chunk_t *c)
{
    if (c->head_end <= c->head_begin || c->tok_end <= c->tok_begin) return 0;
    return 2ull * (c->head_end - c->head_begin) * (c->tok_end - c->tok_begin) * c->head_dim * sizeof(flx_bf16_t);
}

/* Validates, copies and completes a chunk. SPLIT order: k and v are the K and V halves of the
 * payload; GRANULE order: k is the whole payload and v is unused (NULL). A malformed, overlapping or duplicate
 * chunk for a RESERVED/RECEIVING session is refused and the session goes FAILED (its peer is
 * broken); a chunk for an unknown, closed, FAILED, READY or DECODING session is refused and nothing
 * changes. A chunk that completes a layer whose device-window upload fails returns that error
 * (FLX_ERR_DEVICE...) and the session goes FAILED. */
flx_status_t flx_kv_chunk_write(flx_kv_store_h store, flx_kv_session_id_t sid, const flx_kv_chunk_t *chunk,
                                const flx_bf16_t *k, const flx_bf16_t *v);

/*
 * Zero-copy path for transports: claim validates the chunk and reserves its range (a later
 * overlapping claim is refused), and lists where the payload must land, in payload order, with
 * adjacent destinations merged (n_iov == 1: one contiguous range). The caller fills them (for
 * example with a UCX rendezvous receive) and calls complete with ok = 1, or ok = 0 to fail the
 * session. The claim holds the session's memory (MEMORY LIFETIME) until complete, whatever happens
 * to the session meanwhile: complete must be called exactly once for every claim.
 */
typedef struct flx_kv_iov {
    void *dst;
    size_t len;
} flx_kv_iov_t;

typedef struct flx_kv_claim {
    flx_kv_session_id_t sid;
    flx_kv_chunk_t chunk;
    /* Destinations in payload order, adjacent ones merged. */
    uint64_t bytes;           /* payload bytes: the sum of iov[].len */
    uint32_t n_iov;
    flx_kv_iov_t *iov;        /* owned by the claim; valid until complete */
} flx_kv_claim_t;

flx_status_t flx_kv_chunk_claim(flx_kv_store_h store, flx_kv_session_id_t sid, const flx_kv_chunk_t *chunk,
                                flx_kv_claim_t **claim_p);
flx_status_t flx_kv_chunk_complete(flx_kv_store_h store, flx_kv_claim_t *claim, int ok);

/* ---- predictor statistics (prefill -> store), one record per (layer, query head) ---- */

#define FLX_HEAD_STATS_VERSION 1u

/*
 * Prefill-time statistics of appendix A of the paper for one (layer, query head); K/V quantities
 * are those of the head's KV group. Segments: sink, cpu (host-resident) and local, as above.
 * q' is the anchor query (the prompt's last query of that head).
 */
typedef struct flx_head_stats {
    uint32_t version;             /* FLX_HEAD_STATS_VERSION */
    uint32_t reserved;            /* 0 */
    float k_sink_norm;            /* MEAN over sink tokens of ||k_i|| */
    float v_sink_norm;            /* MEAN over sink tokens of ||v_i|| */
    float k_cpu_mean_norm;        /* || MEAN(K_cpu) || */
    float v_cpu_mean_norm;        /* || MEAN(V_cpu) || */
    float k_cpu_norm_mom[4];      /* MEAN, VAR, SKEW, KURT of ||k_i||, i in cpu segment */
    float v_cpu_norm_mom[4];      /* same for ||v_i|| */
    float z_anchor_mom[4];        /* MEAN, VAR, SKEW, KURT of z_i(q') = <q', k_i> / (||q'|| sqrt(D)) */
    float lse_anchor[3];          /* LSE(s_S(q')) for S = sink, cpu, local */
    float onorm_anchor[3];        /* ||O_S(q')|| for S = sink, cpu, local */
    float q_anchor_norm;          /* ||q'|| */
    float bgt_star[4];            /* least budget meeting Eq. 2 for q' at blk 16, 32, 64, 128; [0, 1] */
    float max_onorm_gpu_anchor;   /* max over query heads of the layer of ||O~_h'(q')|| (window only) */
} flx_head_stats_t;

/* Statistics of all query heads of one layer: stats (n_q_heads), mean_k and q_anchor fp32
 * (n_q_heads, head_dim). Checked: version, finiteness, non-negative norms and variances,
 * bgt_star in [0, 1], ||q_anchor|| consistent with q_anchor_norm. Exactly once per layer. */
flx_status_t flx_kv_stats_write(flx_kv_store_h store, flx_kv_session_id_t sid, uint32_t layer,
                                const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor);

/* ---- views (decode side) ---- */

typedef struct flx_kv_session *flx_kv_session_h;

/* Takes a reference on a READY or DECODING session (it holds the session's memory until release);
 * FLX_ERR_STATE otherwise. */
flx_status_t flx_kv_session_acquire(flx_kv_store_h store, flx_kv_session_id_t sid, flx_kv_session_h *sess_p);
void flx_kv_session_release(flx_kv_session_h sess);

/* Everything a kernel needs about one (layer, kv head); pointers stay valid while the session is
 * acquired. n_win is a snapshot taken when the view is made: rows [0, n_win) of both window copies
 * are valid; a later append adds rows past it (take a new view to see them). */
typedef struct flx_kv_head_view {
    uint32_t head_dim;
    uint32_t l_cpu;                    /* host-resident tokens */
    uint32_t n_blocks;                 /* ceil(l_cpu / 16) */
    const uint32_t *block_table;       /* (n_blocks) physical block indices */
    const uint8_t *pool_base;          /* block b at pool_base + b * block_bytes */
    size_t block_bytes;                /* 64 * head_dim */
    const flx_bf16_t *meta[FLX_KV_META_LEVELS]; /* (meta_n[j], 2, head_dim) */
    uint32_t meta_n[FLX_KV_META_LEVELS];
    flx_bf16_t *win_k;                 /* (win_cap, head_dim) */
    flx_bf16_t *win_v;                 /* (win_cap, head_dim) */
    uint32_t n_win;                    /* tokens in the window now */
    uint32_t win_cap;
    int numa_node;
    /* Device copy of this head's window (DEVICE WINDOW): device pointers, never dereference on
     * the host. Same shape as win_k / win_v, rows [0, n_win) equal to them. NULL when the store
     * keeps windows in host memory only. */
    flx_bf16_t *win_k_dev;             /* device (win_cap, head_dim) or NULL */
    flx_bf16_t *win_v_dev;             /* device (win_cap, head_dim) or NULL */
    int win_device;                    /* CUDA ordinal holding win_*_dev; -1 when they are NULL */
    /* UVA (PINNED ARENA): the device's addresses of this head's host-resident part, the same memory
     * as pool_base / block_table / meta[], for kernels on host_device that read it over the bus.
     * Never dereference on the host. NULL (host_device -1) unless the store pinned its memory. */
    const uint8_t *pool_base_dev;      /* device address of pool_base, or NULL */
    const uint32_t *block_table_dev;   /* device address of block_table, or NULL */
    const flx_bf16_t *meta_dev[FLX_KV_META_LEVELS]; /* device addresses of meta[j], or NULL */
    int host_device;                   /* CUDA ordinal of the *_dev addresses above; -1 when NULL */
} flx_kv_head_view_t;

flx_status_t flx_kv_head_view(flx_kv_session_h sess, uint32_t layer, uint32_t kv_head, flx_kv_head_view_t *view_p);

/* Statistics of (layer, query head): pointers into the session (valid while acquired); NULL
 * pointers when the session was opened with FLX_KV_SESSION_NO_STATS. */
flx_status_t flx_kv_head_stats(flx_kv_session_h sess, uint32_t layer, uint32_t q_head, const flx_head_stats_t **stats_p,
                               const float **mean_k_p, const float **q_anchor_p);

/* Shape and segments of an acquired session (what a consumer of views needs besides them). */
typedef struct flx_kv_session_shape {
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
    uint32_t prompt_len, n_sink, n_local, l_cpu;
    int with_stats;                    /* 0 when opened with FLX_KV_SESSION_NO_STATS */
} flx_kv_session_shape_t;

flx_status_t flx_kv_session_shape(flx_kv_session_h sess, flx_kv_session_shape_t *shape_p);

/* Appends one generated token of one layer: k, v bf16 (n_kv_heads, head_dim), to the host window
 * and, when the session has one, to the device window (synchronously: on return the row is on the
 * device). FLX_ERR_CAPACITY when the window is full; on any failure (a device copy error included)
 * nothing is appended and n_win stays. Only for DECODING sessions, one thread at a time per
 * session. */
flx_status_t flx_kv_window_append(flx_kv_session_h sess, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v);
/* flx_kv_window_append with the device row's copies queued on stream instead of waited for (the
 * decode loop's GPU path: its window kernel follows on the same stream). k and v must be
 * page-locked (flx_cuda_host_alloc) when the session has a device window, FLX_ERR_INVALID
 * otherwise, and must stay unchanged until the stream has passed the copies; the host row is
 * written before the call returns. A failure to queue appends nothing; a copy that fails later
 * shows at the stream's next synchronisation. */
flx_status_t flx_kv_window_append_async(flx_kv_session_h sess, uint32_t layer, const flx_bf16_t *k,
                                        const flx_bf16_t *v, flx_cuda_stream_t stream);

/* Physical block pointer helpers (no checks: kernels call them in loops). */
static inline const flx_bf16_t *flx_kv_block_k(const flx_kv_head_view_t *v, uint32_t blk_idx)
{
    return (const flx_bf16_t *)(v->pool_base + (size_t)v->block_table[blk_idx] * v->block_bytes);
}
static inline const flx_bf16_t *flx_kv_block_v(const flx_kv_head_view_t *v, uint32_t blk_idx)
{
    return flx_kv_block_k(v, blk_idx) + (size_t)FLX_KV_BLOCK_TOKENS * v->head_dim;
}

/* ---- metadata pyramid ---- */

/* Entries at level j (blk = 16 << j) for l_cpu host tokens: ceil(l_cpu / blk). */
static inline uint32_t flx_kv_meta_count(uint32_t l_cpu, int level)
{
    uint32_t blk = (uint32_t)FLX_KV_BLOCK_TOKENS << level;
    return (l_cpu + blk - 1) / blk;
}

/* Builds all levels of the pyramid of one (layer, kv head) in one pass over its K blocks, reading
 * view->block_table / pool_base / block_bytes / l_cpu / head_dim and writing meta[j] (meta_n[j]
 * entries of (2, head_dim)). Reads no row at or past l_cpu. Used by the store when a layer is
 * complete, and by tools and benchmarks that lay KV out themselves. Runtime-dispatched SIMD;
 * flx_kv_pyramid_build_ref is the scalar reference. */
void flx_kv_pyramid_build(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS]);
void flx_kv_pyramid_build_ref(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS]);

/* The same pyramid in two steps, bit for bit: level 0 of blocks [b0, b1) (their rows must have
 * landed; the store calls it per chunk, as each chunk completes, while the chunk is still in cache),
 * then levels 1..3 from a complete level 0 (when the layer is complete). */
void flx_kv_pyramid_build_blocks(const flx_kv_head_view_t *view, flx_bf16_t *meta0, uint32_t b0, uint32_t b1);
void flx_kv_pyramid_build_upper(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS]);

/* ---- NUMA ---- */

/* Number of configured NUMA nodes (1 without libnuma support). */
int flx_numa_node_count(void);
/* 0 when node exists (has memory); refusals name the node. */
flx_status_t flx_numa_check_node(int node);
/* Node of the CPU the caller runs on. */
int flx_numa_current_node(void);

#ifdef __cplusplus
}
#endif
#endif
