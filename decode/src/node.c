/*
 * node.c - the decode node (flx/node.h): session table, local prefill thread, decode thread.
 *
 * DESIGN
 * Three kinds of threads touch a node: callers of the API (gRPC polling threads, any number), the
 * decode thread (one; it alone owns the engines) and, in local mode, the prefill thread. node->mu
 * guards the session table, the queue of new Generate calls, the waiters and the drain state; it
 * is never held while a sink or wait callback runs, because those call into gRPC, whose
 * cancellation callbacks call flx_node_generate_cancel from polling threads. Cancellation is
 * therefore a flag on the call plus a wakeup (wake_mu / wake_cv, held only for the flag), never a
 * lock the decode thread might hold.
 *
 * The decode thread sleeps when no engine has a live sequence, until the next timer (a wait's
 * deadline, a transfer deadline, a lease, a drain's end) or a wakeup; while sequences are live it
 * loops over steps and looks at flags and timers between them, so a cancelled call leaves its
 * batch at the next step. One engine per attention configuration (the engine's mode is per
 * engine): sessions of one configuration share batches; configurations take turns step by step.
 *
 * A session's KV-store session is closed only by the decode thread once its engine let go of it
 * (CloseSession on a DECODING session cancels the sequence first), and by whoever holds it before
 * that (the prefill thread, the timers): an append into a session closed under the engine would
 * fail the whole batch.
 *
 * In LOCAL mode session ids and tokens come from getrandom(2). In UCX mode the session id is the
 * transport's (the id the prefill node's HELLO names) and the token the transport's, 128 bits from
 * getrandom(2): the token, not the id, is what keeps others' bytes out of a session. The
 * transport moves a session to READY or FAILED in the store; the store's state callback wakes the
 * decode thread, which (like every call that looks at a session) brings the node's record in line
 * with the store (sync_locked) under node->mu; the order of locks is node->mu, then the
 * transport's and the store's, and the callback takes only wake_mu, which nests in nothing.
 *
 * Closed sessions keep a record for CLOSED_KEEP_NS so that GetSession / CloseSession after the end
 * of a Generate answer with the final state instead of NOT_FOUND; the table has room for
 * max_sessions live sessions plus as many records, and the oldest record makes room when needed.
 */
#include "flx/node.h"
#include "flx/pool.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "flx/forward.h"
#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/prom.h"
#include "flx/sampling.h"
#include "flx/tokenizer.h"
#include "flx/transport.h"
#include "flx/util.h"

#define MOD "node"
#define CLOSED_KEEP_NS (60ull * 1000000000ull)
#define TEXT_MAX 1024

struct flx_node_waiter {
    struct flx_node_waiter *next;
    uint64_t id;
    uint64_t deadline_ns;
    flx_node_wait_fn fn;
    void *ctx;
    const atomic_int *cancel;      /* the caller's flag, or NULL */
};

typedef struct sess {
    uint64_t id;                   /* 0: free slot */
    flx_node_state_t state;
    flx_node_attn_t attn;
    uint32_t prompt_len, max_new;
    flx_kv_session_id_t kv;        /* 0 until the store holds the session */
    int32_t first_token;
    int32_t *local_tokens;         /* LOCAL: (prompt_len) until the prefill thread takes them */
    size_t reserved_bytes;
    uint64_t bytes_expected, bytes_received;
    uint64_t t_open, t_ready, t_closed;       /* flx_now_ns */
    uint64_t transfer_deadline, lease_end;    /* flx_now_ns */
    uint32_t lease_ms;             /* OpenSession's lease, else the node's */
    int64_t deadline_unix_ms;
    double gbps;
    uint32_t tokens_generated;
    struct flx_node_gen *gen;      /* while DECODING */
    char fail_reason[FLX_NODE_REASON_MAX];
} sess_t;

struct flx_node_gen {
    struct flx_node_gen *next;     /* the incoming queue, then the decode thread's deferred or active list */
    flx_node_h node;
    uint64_t sid;
    flx_kv_session_id_t kv;
    int32_t first_token;
    flx_node_attn_t attn;
    flx_gen_params_t gp;
    int32_t stop[FLX_ENGINE_MAX_STOP];
    int skip_text;
    flx_node_sink_t sink;
    uint64_t deadline_ns, t_request, t_ready, t_last;
    const atomic_int *cancel;      /* the caller's flag (the client went away), or NULL */
    atomic_int closed;             /* CloseSession */
    /* decode thread only */
    flx_engine_h eng;
    flx_engine_seq_id_t seq;
    int deferred_logged;
    uint32_t n_sent;
    int has_pend;                  /* a token of the step in progress waits for its statistics */
    int32_t pend_tok;
    flx_engine_finish_t pend_why;
    int finished;                  /* the engine delivered its last callback */
    flx_engine_finish_t finish_why;
    flx_status_t stop_st;          /* why the decode thread cancelled it */
    char stop_msg[FLX_ERROR_MSG_MAX];
    int32_t dt_ids[16];            /* tokens whose text is not complete UTF-8 yet */
    uint32_t dt_n;
    char text[TEXT_MAX];
};

typedef struct engine_slot {
    flx_node_attn_t attn;
    flx_engine_h e;
} engine_slot_t;

struct flx_node {
    flx_node_config_t cfg;
    flx_node_limits_t lim;
    flx_model_t *model;
    flx_tok_h tok;                 /* NULL: no tokenizer, no text pieces */
    flx_predictor_h pred;
    flx_kv_store_h store;
    flx_tp_node_h tp;              /* UCX mode: the KV receiver over the store; NULL in LOCAL mode */
    int32_t eog[FLX_ENGINE_MAX_STOP];
    uint32_t n_eog;
    uint32_t n_threads;            /* the pool's workers */
    flx_pool_h pool;               /* one worker pool for loading, the prefill and every engine (they take turns) */

    pthread_mutex_t mu;            /* guards the fields down to the counters */
    sess_t *sess;                  /* (n_slots) */
    uint32_t n_slots;
    uint32_t n_open;               /* sessions not CLOSED */
    size_t pending_bytes;          /* LOCAL: reserved by sessions not yet in the store */
    struct flx_node_waiter *waiters;
    struct flx_node_gen *incoming, **incoming_tail;
    uint32_t n_gen;                /* Generate calls accepted and not yet ended */
    int draining;
    uint64_t drain_deadline;
    int stop;
    uint64_t *pf_queue;            /* LOCAL: (n_slots) ring of session ids to prefill */
    uint32_t pf_head, pf_n;
    pthread_cond_t pf_cv;
    uint64_t c_opened, c_ready, c_failed, c_closed, c_gen_calls, c_transfer_bytes, c_lease_expired;

    pthread_mutex_t wake_mu;       /* guards wake */
    pthread_cond_t wake_cv;
    int wake;

    pthread_t decode_thr, pf_thr;
    int decode_started, pf_started;
    void *pf_mem;                  /* LOCAL: prefill workspace */
    flx_fwd_ws_t *pf_ws;
    float *pf_logits;              /* (vocab) */

    /* decode thread only */
    engine_slot_t eng[FLX_NODE_MAX_ENGINES];
    uint32_t n_eng;
    uint32_t eng_next;             /* the engine that steps first in the next round (rotates) */
    struct flx_node_gen *active;
    struct flx_node_gen *deferred, **deferred_tail;   /* calls waiting for an engine, in arrival order */

    pthread_mutex_t stats_mu;      /* guards the sums below (written by the decode thread) */
    flx_engine_stats_t eng_total;
    uint64_t s_heads, s_streaming, s_groups, s_skipped, s_blk[4];
    uint64_t c_tokens, c_gen_ok, c_gen_cancelled, c_gen_deadline, c_gen_unavailable, c_gen_error;
    uint32_t live_seqs;
    flx_prom_hist_t h_ttft, h_tpot, h_ready, h_rate;
};

const char *flx_node_state_name(flx_node_state_t s)
{
    switch (s) {
    case FLX_NODE_OPEN: return "open";
    case FLX_NODE_RECEIVING: return "receiving";
    case FLX_NODE_READY: return "ready";
    case FLX_NODE_DECODING: return "decoding";
    case FLX_NODE_FAILED: return "failed";
    case FLX_NODE_CLOSED: return "closed";
    }
    return "unknown";
}

static void wake(flx_node_h n)
{
    pthread_mutex_lock(&n->wake_mu);
    n->wake = 1;
    pthread_cond_signal(&n->wake_cv);
    pthread_mutex_unlock(&n->wake_mu);
}

static int64_t unix_ms_in(uint64_t ns_from_now)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + (int64_t)(ns_from_now / 1000000);
}

static flx_status_t random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = getrandom(p, len, 0);
        if (r < 0)
            return flx_error_set(FLX_ERR_IO, "getrandom: no randomness from the OS");
        p += r;
        len -= (size_t)r;
    }
    return FLX_OK;
}

/* ---- session table (node->mu held) ---- */

static sess_t *find(flx_node_h n, uint64_t id)
{
    if (id == 0)
        return NULL;
    for (uint32_t i = 0; i < n->n_slots; i++)
        if (n->sess[i].id == id)
            return &n->sess[i];
    return NULL;
}

/* A free slot, or the oldest CLOSED record's. */
static sess_t *slot_alloc(flx_node_h n)
{
    sess_t *oldest = NULL;
    for (uint32_t i = 0; i < n->n_slots; i++) {
        sess_t *s = &n->sess[i];
        if (s->id == 0)
            return s;
        if (s->state == FLX_NODE_CLOSED && (!oldest || s->t_closed < oldest->t_closed))
            oldest = s;
    }
    if (oldest)
        memset(oldest, 0, sizeof *oldest);
    return oldest;
}

static void info_of(const sess_t *s, flx_node_session_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->id = s->id;
    out->state = s->state;
    snprintf(out->fail_reason, sizeof out->fail_reason, "%s", s->fail_reason);
    out->prompt_len = s->prompt_len;
    out->max_new_tokens = s->max_new;
    out->attn = s->attn;
    out->bytes_expected = s->bytes_expected;
    out->bytes_received = s->bytes_received;
    out->reserved_bytes = s->reserved_bytes;
    out->transfer_deadline_unix_ms = s->deadline_unix_ms;
    out->time_to_ready_ns = s->t_ready ? s->t_ready - s->t_open : 0;
    out->transfer_gbps = s->gbps;
    out->tokens_generated = s->tokens_generated;
}

static void mark_failed_locked(flx_node_h n, sess_t *s, const char *reason)
{
    s->state = FLX_NODE_FAILED;
    snprintf(s->fail_reason, sizeof s->fail_reason, "%s", reason);
    n->c_failed++;
    flx_log_info(MOD, "session %llu failed: %s", (unsigned long long)s->id, reason);
}

/* Closes a session's KV: through the transport in UCX mode (its senders hear CLOSED, its record
 * goes), in the store otherwise. */
static void kv_close(flx_node_h n, flx_kv_session_id_t kv)
{
    if (!kv)
        return;
    if (n->tp)
        flx_tp_session_close(n->tp, kv);
    else
        flx_kv_session_close(n->store, kv);
}

/* A LOCAL session that ends before the prefill thread took it: its prompt is freed, its reservation
 * (only counted so far) uncounted, and its entry leaves the prefill queue. The queue then holds one
 * entry per session still waiting, never more than the sessions that can be open, so however many
 * sessions open and close behind a long prefill no waiting entry is overwritten. */
static void drop_local_tokens_locked(flx_node_h n, sess_t *s)
{
    if (!s->local_tokens)
        return;
    free(s->local_tokens);
    s->local_tokens = NULL;
    n->pending_bytes -= s->reserved_bytes;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n->pf_n; i++) {
        const uint64_t id = n->pf_queue[(n->pf_head + i) % n->n_slots];
        if (id != s->id)
            n->pf_queue[(n->pf_head + kept++) % n->n_slots] = id;
    }
    n->pf_n = kept;
}

/* OPEN/RECEIVING/READY -> FAILED with a reason; the KV (if any) goes back to the pool. In UCX mode
 * a transfer still running is failed in the transport (its senders hear the reason) and the id
 * stays open until CloseSession; one that got READY meanwhile is closed. */
static void fail_locked(flx_node_h n, sess_t *s, const char *reason)
{
    if (s->kv && n->tp && (s->state == FLX_NODE_OPEN || s->state == FLX_NODE_RECEIVING) &&
        flx_tp_session_fail(n->tp, s->kv, reason) == FLX_OK) {
        /* failed in the store: its memory returns once no receive holds it */
    } else if (s->kv) {
        kv_close(n, s->kv);
        s->kv = 0;
    }
    drop_local_tokens_locked(n, s);
    mark_failed_locked(n, s, reason);
}

static void close_record_locked(flx_node_h n, sess_t *s)
{
    if (s->state != FLX_NODE_CLOSED) {
        s->state = FLX_NODE_CLOSED;
        s->t_closed = flx_now_ns();
        n->n_open--;
        n->c_closed++;
    }
}

/* UCX mode: an OPEN/RECEIVING session's record brought in line with the store (the transport moves
 * it on): bytes so far, RECEIVING, READY with the committed first token, or FAILED with the
 * transport's reason. node->mu held. */
static void sync_locked(flx_node_h n, sess_t *s)
{
    if (!n->tp || !s->kv || (s->state != FLX_NODE_OPEN && s->state != FLX_NODE_RECEIVING))
        return;
    flx_kv_session_info_t ki;
    if (flx_kv_session_info(n->store, s->kv, &ki) != FLX_OK) {
        s->kv = 0;
        fail_locked(n, s, "the transfer session was closed by the transport");
        return;
    }
    s->bytes_expected = ki.bytes_expected;
    s->bytes_received = ki.bytes_received;
    switch (ki.state) {
    case FLX_KV_RESERVED: break;
    case FLX_KV_RECEIVING: s->state = FLX_NODE_RECEIVING; break;
    case FLX_KV_READY: {
        const uint64_t t_ready = ki.t_ready_ns ? ki.t_ready_ns : flx_now_ns();
        const uint64_t span = ki.t_last_byte_ns > ki.t_first_byte_ns ? ki.t_last_byte_ns - ki.t_first_byte_ns : 0;
        s->state = FLX_NODE_READY;
        s->first_token = ki.first_token;
        s->t_ready = FLX_MAX(t_ready, s->t_open);
        s->lease_end = s->t_ready + (uint64_t)s->lease_ms * 1000000ull;
        s->reserved_bytes = ki.reserved_bytes;
        s->gbps = span ? (double)ki.bytes_received / (double)span : 0;
        n->c_ready++;
        n->c_transfer_bytes += ki.bytes_received;
        flx_prom_hist_observe(&n->h_ready, (double)(s->t_ready - s->t_open) / 1e9);
        if (span)
            flx_prom_hist_observe(&n->h_rate, s->gbps * 1e9);
        flx_log_info(MOD, "session %llu ready: %llu bytes in %.3f s from open (%.2f GB/s first to last byte), "
                          "first token %d",
                     (unsigned long long)s->id, (unsigned long long)ki.bytes_received,
                     (double)(s->t_ready - s->t_open) / 1e9, s->gbps, s->first_token);
        break;
    }
    case FLX_KV_FAILED:   /* failed by the transport, which tells its senders; the id closes with the session */
        mark_failed_locked(n, s, ki.fail_reason[0] ? ki.fail_reason : "the transfer failed");
        break;
    default:   /* DECODING or CLOSED behind the node's back: never served */
        kv_close(n, s->kv);
        s->kv = 0;
        fail_locked(n, s, "the transfer session left the node's control");
        break;
    }
}

static sess_t *find_sync(flx_node_h n, uint64_t id)
{
    sess_t *s = find(n, id);
    if (s)
        sync_locked(n, s);
    return s;
}

/* ---- lifecycle ---- */

static void *decode_main(void *arg);
static void *prefill_main(void *arg);

static flx_status_t limits_init(flx_node_h n)
{
    const flx_model_config_t *c = &n->model->cfg;
    flx_node_limits_t *l = &n->lim;
    memset(l, 0, sizeof *l);
    snprintf(l->model_id, sizeof l->model_id, "%s", n->cfg.model_id[0] ? n->cfg.model_id : c->name);
    l->n_layers = c->n_layers;
    l->n_kv_heads = c->n_kv_heads;
    l->n_q_heads = c->n_heads;
    l->head_dim = c->head_dim;
    l->vocab = c->vocab;
    uint32_t ctx = c->max_ctx ? c->max_ctx : 4096;
    if (n->cfg.max_prompt_len > ctx)   /* sessions the engine would refuse after their whole transfer */
        return flx_error_set(FLX_ERR_INVALID, "max-prompt-len %u exceeds the model's context of %u tokens",
                             n->cfg.max_prompt_len, ctx);
    l->max_prompt_len = n->cfg.max_prompt_len ? n->cfg.max_prompt_len : ctx;
    l->max_new_tokens = n->cfg.max_new_tokens;
    l->max_stop_ids = FLX_ENGINE_MAX_STOP - n->n_eog;
    l->max_timeout_ms = 3600000;
    l->prefill = n->cfg.prefill;
    l->has_predictor = n->pred != NULL;
    return FLX_OK;
}

/* The store's state callback (any thread, the session's lock held): only a wakeup. */
static void store_changed(void *ctx)
{
    wake(ctx);
}

/* UCX mode: the KV receiver over the node's store, on the config's ucx-listen. */
static flx_status_t transport_create(flx_node_h n)
{
    const flx_node_config_t *c = &n->cfg;
    char host[FLX_NODE_ADDR_MAX];
    snprintf(host, sizeof host, "%s", c->ucx_listen);
    char *colon = strrchr(host, ':');
    if (!colon)
        return flx_error_set(FLX_ERR_INVALID, "ucx-listen '%s' is not host:port", c->ucx_listen);
    *colon = '\0';
    uint64_t port = 0;
    if (flx_parse_u64(colon + 1, 0, 65535, &port))
        return flx_error_set(FLX_ERR_INVALID, "ucx-listen '%s': port outside 0..65535", c->ucx_listen);
    char *h = host;
    if (h[0] == '[' && colon > h + 1 && colon[-1] == ']') {   /* [IPv6] */
        colon[-1] = '\0';
        h++;
    }
    /* The node's own lease decides (its timer fails and closes the session); the transport's is a
     * backstop a minute later. */
    flx_tp_node_params_t tp = {
        .field_mask = FLX_TP_NODE_FIELD_LISTEN | FLX_TP_NODE_FIELD_ERR_MODE | FLX_TP_NODE_FIELD_LIVENESS |
                      FLX_TP_NODE_FIELD_TIMEOUTS | (c->ucx_advertise[0] ? FLX_TP_NODE_FIELD_ADVERTISE : 0),
        .store = n->store, .listen_host = h, .listen_port = (uint16_t)port,
        .advertise_host = c->ucx_advertise, .err_mode = c->ucx_err_mode ? FLX_TP_ERR_NONE : FLX_TP_ERR_PEER,
        .liveness_ms = c->ucx_liveness_ms, .default_timeout_ms = c->transfer_timeout_ms,
        .default_lease_ms = c->lease_ms + 60000};
    flx_status_t st = flx_tp_node_create(&tp, &n->tp);
    if (st)
        return flx_error_set(st, "ucx-listen %s: %s", c->ucx_listen, flx_error_msg());
    flx_tp_node_info_t ti;
    flx_tp_node_info(n->tp, &ti);
    flx_log_info(MOD, "kv receiver on ucx %s:%u (listening on %s), error mode %s, liveness %u ms", ti.host, ti.port,
                 c->ucx_listen, c->ucx_err_mode ? "none" : "peer", ti.liveness_ms);
    return FLX_OK;
}

static flx_status_t hists_init(flx_node_h n)
{
    static const double lat[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double tpot[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2};
    static const double rate[] = {1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11};
    flx_status_t st;
    if ((st = flx_prom_hist_init(&n->h_ttft, lat, FLX_ARRAY_SIZE(lat))) ||
        (st = flx_prom_hist_init(&n->h_tpot, tpot, FLX_ARRAY_SIZE(tpot))) ||
        (st = flx_prom_hist_init(&n->h_ready, lat, FLX_ARRAY_SIZE(lat))) ||
        (st = flx_prom_hist_init(&n->h_rate, rate, FLX_ARRAY_SIZE(rate))))
        return st;
    return FLX_OK;
}

flx_status_t flx_node_create(const flx_node_config_t *cfg, flx_node_h *node_p)
{
    if (!cfg || !node_p)
        return flx_error_set(FLX_ERR_INVALID, "node create: NULL argument");
    flx_status_t st = flx_node_config_check(cfg);
    if (st)
        return st;
    struct flx_node *n = calloc(1, sizeof *n);
    if (!n)
        return flx_error_set(FLX_ERR_NOMEM, "node");
    n->cfg = *cfg;
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->wake_mu, NULL);
    pthread_mutex_init(&n->stats_mu, NULL);
    pthread_cond_init(&n->wake_cv, NULL);
    pthread_cond_init(&n->pf_cv, NULL);
    n->incoming_tail = &n->incoming;
    n->deferred_tail = &n->deferred;
    if ((st = hists_init(n)))
        goto fail;

    uint64_t t0 = flx_now_ns();
    /* One pool on the store's NUMA node: the prefill thread and the engines take turns on it. */
    flx_pool_params_t pp = {.field_mask = (cfg->threads ? FLX_POOL_FIELD_N_WORKERS : 0) |
                                          (cfg->numa_node >= 0 ? FLX_POOL_FIELD_NUMA_NODE : 0),
                            .n_workers = cfg->threads, .numa_node = cfg->numa_node};
    if ((st = flx_pool_create(&pp, &n->pool)))
        goto fail;
    n->n_threads = flx_pool_size(n->pool);
    flx_log_info(MOD, "%s", flx_pool_describe(n->pool));
    if ((st = flx_model_load_as(cfg->model, n->pool, (flx_weights_t)cfg->weights, &n->model)))
        goto fail;
    flx_log_info(MOD, "weights %s: %.1f MB read a decode step", flx_weights_name((flx_weights_t)cfg->weights),
                 flx_model_weight_bytes(n->model) / 1e6);
    if ((st = flx_tok_load(cfg->model, &n->tok)) == FLX_ERR_NOT_FOUND) {
        flx_log_warn(MOD, "no tokenizer with %s (%s): tokens stream without text", cfg->model, flx_error_msg());
        n->tok = NULL;
        st = FLX_OK;
    } else if (st) {   /* one that is there but cannot be used: without it no end token would stop a call */
        st = flx_error_set(st, "tokenizer of %s: %s", cfg->model, flx_error_msg());
        goto fail;
    } else if (flx_tok_vocab_size(n->tok) > n->model->cfg.vocab) {
        st = flx_error_set(FLX_ERR_FORMAT, "tokenizer has %u tokens, the model's vocabulary %u",
                           flx_tok_vocab_size(n->tok), n->model->cfg.vocab);
        goto fail;
    }
    for (uint32_t i = 0; n->tok && i < flx_tok_vocab_size(n->tok) && n->n_eog < FLX_ENGINE_MAX_STOP / 2; i++)
        if (flx_tok_is_eog(n->tok, (int32_t)i))
            n->eog[n->n_eog++] = (int32_t)i;
    if (cfg->predictor[0] && (st = flx_predictor_load(cfg->predictor, &n->pred)))
        goto fail;
    if ((st = limits_init(n)))
        goto fail;
    const flx_model_config_t *mc = &n->model->cfg;
    flx_kv_store_params_t kp = {
        .field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_NUMA_NODE |
                      FLX_KV_STORE_FIELD_MAX_SESSIONS,
        .capacity_bytes = cfg->kv_capacity_bytes, .numa_node = cfg->numa_node, .n_layers = mc->n_layers,
        .n_kv_heads = mc->n_kv_heads, .n_q_heads = mc->n_heads, .head_dim = mc->head_dim,
        .max_sessions = cfg->max_sessions};
    if (cfg->prefill == FLX_NODE_PREFILL_UCX) {
        kp.field_mask |= FLX_KV_STORE_FIELD_ON_STATE;
        kp.on_state = store_changed;
        kp.on_state_ctx = n;
    }
    if ((st = flx_kv_store_create(&kp, &n->store)))
        goto fail;
    if (cfg->prefill == FLX_NODE_PREFILL_UCX && (st = transport_create(n)))
        goto fail;
    n->n_slots = 2 * cfg->max_sessions;
    n->sess = calloc(n->n_slots, sizeof *n->sess);
    n->pf_queue = calloc(n->n_slots, sizeof *n->pf_queue);
    if (!n->sess || !n->pf_queue) {
        st = flx_error_set(FLX_ERR_NOMEM, "node: session table of %u", n->n_slots);
        goto fail;
    }
    if (cfg->prefill == FLX_NODE_PREFILL_LOCAL) {
        flx_fwd_shape_t fs = {.max_prompt = n->lim.max_prompt_len, .max_batch = 1, .pool = n->pool};
        size_t bytes = 0;
        if ((st = flx_fwd_plan(n->model, &fs, &bytes)))
            goto fail;
        n->pf_mem = flx_aligned_alloc(FLX_CACHELINE, bytes ? bytes : FLX_CACHELINE);
        n->pf_logits = malloc((size_t)mc->vocab * sizeof *n->pf_logits);
        if (!n->pf_mem || !n->pf_logits) {
            st = flx_error_set(FLX_ERR_NOMEM, "node: prefill workspace of %zu bytes for %u tokens", bytes,
                               n->lim.max_prompt_len);
            goto fail;
        }
        if ((st = flx_fwd_ws_init(n->model, &fs, n->pf_mem, bytes, &n->pf_ws)))
            goto fail;
        if (pthread_create(&n->pf_thr, NULL, prefill_main, n)) {
            st = flx_error_set(FLX_ERR_NOMEM, "node: cannot start the prefill thread");
            goto fail;
        }
        n->pf_started = 1;
    }
    if (pthread_create(&n->decode_thr, NULL, decode_main, n)) {
        st = flx_error_set(FLX_ERR_NOMEM, "node: cannot start the decode thread");
        goto fail;
    }
    n->decode_started = 1;
    flx_log_info(MOD, "model %s (id %s): %u layers, %u/%u heads of %u, vocab %u, context %u; loaded in %.2f s; "
                      "tokenizer %s, %u end tokens; predictor %s; prefill %s; kv pool %llu bytes; max %u sessions, "
                      "batch %u",
                 mc->name, n->lim.model_id, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim, mc->vocab,
                 mc->max_ctx, (double)(flx_now_ns() - t0) / 1e9, n->tok ? "yes" : "none", n->n_eog,
                 n->pred ? cfg->predictor : "none (FLUXION refused)",
                 cfg->prefill == FLX_NODE_PREFILL_LOCAL ? "local" : "ucx",
                 (unsigned long long)cfg->kv_capacity_bytes, cfg->max_sessions, cfg->max_batch);
    *node_p = n;
    return FLX_OK;
fail:
    {
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
        flx_node_destroy(n);
        return flx_error_set(st, "%s", msg);
    }
}

void flx_node_destroy(flx_node_h n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->draining = 1;
    n->drain_deadline = flx_now_ns();
    n->stop = 1;
    pthread_cond_broadcast(&n->pf_cv);
    pthread_mutex_unlock(&n->mu);
    wake(n);
    if (n->pf_started)
        pthread_join(n->pf_thr, NULL);
    if (n->decode_started)
        pthread_join(n->decode_thr, NULL);
    for (uint32_t i = 0; i < n->n_eng; i++) flx_engine_destroy(n->eng[i].e);
    /* fails the transfers still running (their senders hear "node shutting down"), waits for their
     * receives; before the store it writes into */
    flx_tp_node_destroy(n->tp);
    for (uint32_t i = 0; n->sess && i < n->n_slots; i++) free(n->sess[i].local_tokens);
    free(n->sess);
    free(n->pf_queue);
    flx_aligned_free(n->pf_mem);
    free(n->pf_logits);
    flx_kv_store_destroy(n->store);
    flx_predictor_destroy(n->pred);
    flx_tok_destroy(n->tok);
    flx_model_destroy(n->model);
    flx_pool_destroy(n->pool);
    flx_prom_hist_destroy(&n->h_ttft);
    flx_prom_hist_destroy(&n->h_tpot);
    flx_prom_hist_destroy(&n->h_ready);
    flx_prom_hist_destroy(&n->h_rate);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->wake_mu);
    pthread_mutex_destroy(&n->stats_mu);
    pthread_cond_destroy(&n->wake_cv);
    pthread_cond_destroy(&n->pf_cv);
    free(n);
}

void flx_node_limits(flx_node_h n, flx_node_limits_t *l)
{
    *l = n->lim;
}

/* ---- sessions ---- */

/* UCX mode: the transfer session in the transport (memory, token, deadline) and what the prefill
 * node is told in *r. node->mu held. */
static flx_status_t tp_open(flx_node_h n, const flx_node_open_params_t *p, uint64_t tmo_ns, flx_node_open_result_t *r,
                            flx_kv_session_id_t *kv_p)
{
    const flx_node_limits_t *l = &n->lim;
    const uint32_t lease_ms = p->lease_ms ? p->lease_ms : n->cfg.lease_ms;
    flx_tp_open_params_t op = {
        .field_mask = FLX_TP_OPEN_FIELD_NO_STATS | FLX_TP_OPEN_FIELD_TIMEOUT | FLX_TP_OPEN_FIELD_LEASE,
        .n_layers = l->n_layers, .n_kv_heads = l->n_kv_heads, .n_q_heads = l->n_q_heads, .head_dim = l->head_dim,
        .vocab = l->vocab, .prompt_len = p->prompt_len, .max_new_tokens = p->max_new_tokens,
        .with_stats = p->attn.mode == FLX_ENGINE_ATTN_FLUXION, .timeout_ms = (uint32_t)(tmo_ns / 1000000ull),
        .lease_ms = lease_ms + 60000};   /* the node's own lease decides; the transport's is a backstop */
    flx_tp_session_desc_t d;
    flx_status_t st = flx_tp_session_open(n->tp, &op, &d);
    if (st)
        return st;
    memcpy(r->token, d.token, sizeof r->token);
    snprintf(r->ucx_host, sizeof r->ucx_host, "%s", d.host);
    r->ucx_port = d.port;
    if (d.worker_address_len <= sizeof r->ucx_worker_address) {
        memcpy(r->ucx_worker_address, d.worker_address, d.worker_address_len);
        r->ucx_worker_address_len = (uint32_t)d.worker_address_len;
    }
    *kv_p = d.sid;
    return FLX_OK;
}

flx_status_t flx_node_open(flx_node_h n, const flx_node_open_params_t *p, flx_node_open_result_t *res_p)
{
    if (!n || !p || !res_p)
        return flx_error_set(FLX_ERR_INVALID, "node open: NULL argument");
    const flx_node_limits_t *l = &n->lim;
    if (p->prompt_len == 0 || p->prompt_len > l->max_prompt_len)
        return flx_error_set(FLX_ERR_INVALID, "prompt_len %u outside [1, %u]", p->prompt_len, l->max_prompt_len);
    if (p->max_new_tokens == 0 || p->max_new_tokens > l->max_new_tokens)
        return flx_error_set(FLX_ERR_INVALID, "max_new_tokens %u outside [1, %u]", p->max_new_tokens,
                             l->max_new_tokens);
    if (p->attn.mode == FLX_ENGINE_ATTN_FLUXION && !n->pred)
        return flx_error_set(FLX_ERR_INVALID, "attention mode fluxion: this node has no predictor weights");
    if ((l->prefill == FLX_NODE_PREFILL_LOCAL) != (p->local_tokens != NULL))
        return flx_error_set(FLX_ERR_INVALID, "%s",
                             p->local_tokens ? "local_prefill given, but this node takes KV from prefill nodes (ucx)"
                                             : "local_prefill missing: this node runs --prefill local");
    for (uint32_t i = 0; p->local_tokens && i < p->prompt_len; i++)
        if (p->local_tokens[i] < 0 || (uint32_t)p->local_tokens[i] >= l->vocab)
            return flx_error_set(FLX_ERR_INVALID, "local_prefill token %u is %d, outside the vocabulary [0, %u)", i,
                                 p->local_tokens[i], l->vocab);
    size_t bytes = 0;
    flx_status_t st = flx_kv_session_bytes(n->store, p->prompt_len, p->max_new_tokens, &bytes);
    if (st)
        return st;
    uint64_t id = 0;
    flx_node_open_result_t r;
    memset(&r, 0, sizeof r);
    if (!n->tp) {   /* LOCAL mode; in UCX mode the transport gives both */
        do {
            if ((st = random_bytes(&id, sizeof id)))
                return st;
        } while (id == 0);
        if ((st = random_bytes(r.token, sizeof r.token)))
            return st;
    }
    int32_t *toks = NULL;
    if (p->local_tokens) {
        toks = malloc((size_t)p->prompt_len * sizeof *toks);
        if (!toks)
            return flx_error_set(FLX_ERR_NOMEM, "local_prefill of %u tokens", p->prompt_len);
        memcpy(toks, p->local_tokens, (size_t)p->prompt_len * sizeof *toks);
    }

    const uint64_t now = flx_now_ns();
    const uint64_t tmo_ns = (uint64_t)(p->transfer_timeout_ms ? p->transfer_timeout_ms : n->cfg.transfer_timeout_ms) *
                            1000000ull;
    flx_kv_session_id_t kv = 0;
    pthread_mutex_lock(&n->mu);
    flx_kv_store_info_t si;
    flx_kv_store_info(n->store, &si);
    sess_t *s = NULL;
    if (n->draining)
        st = flx_error_set(FLX_ERR_UNAVAILABLE, "node is draining: open the session on another node");
    else if (n->n_open >= n->cfg.max_sessions)
        st = flx_error_set(FLX_ERR_CAPACITY, "%u sessions open (max-sessions %u)", n->n_open, n->cfg.max_sessions);
    else if (si.used_bytes + n->pending_bytes + bytes > si.capacity_bytes)
        st = flx_error_set(FLX_ERR_CAPACITY, "session needs %zu bytes of host KV memory, %zu of %zu are in use", bytes,
                           si.used_bytes + n->pending_bytes, si.capacity_bytes);
    else if (n->tp && !(st = tp_open(n, p, tmo_ns, &r, &kv)))
        id = kv;   /* the transport's id: the one the prefill node's HELLO names */
    if (!st && find(n, id))
        st = flx_error_set(FLX_ERR_INTERNAL, "session id %llu repeated", (unsigned long long)id);
    else if (!st && !(s = slot_alloc(n)))
        st = flx_error_set(FLX_ERR_CAPACITY, "session table full (%u slots)", n->n_slots);
    if (st && kv)
        kv_close(n, kv);
    if (!st) {
        memset(s, 0, sizeof *s);
        s->id = id;
        s->kv = kv;
        s->state = FLX_NODE_OPEN;
        s->attn = p->attn;
        s->prompt_len = p->prompt_len;
        s->max_new = p->max_new_tokens;
        s->local_tokens = toks;
        s->reserved_bytes = bytes;
        s->t_open = now;
        s->transfer_deadline = now + tmo_ns;
        s->deadline_unix_ms = unix_ms_in(tmo_ns);
        s->lease_end = UINT64_MAX;
        s->lease_ms = p->lease_ms ? p->lease_ms : n->cfg.lease_ms;
        n->n_open++;
        n->c_opened++;
        if (toks) {
            n->pending_bytes += bytes;
            n->pf_queue[(n->pf_head + n->pf_n++) % n->n_slots] = id;
            pthread_cond_signal(&n->pf_cv);
        }
        toks = NULL;
        r.id = id;
        r.transfer_deadline_unix_ms = s->deadline_unix_ms;
        r.reserved_bytes = bytes;
    }
    pthread_mutex_unlock(&n->mu);
    free(toks);
    if (st)
        return st;
    flx_log_info(MOD, "session %llu opened: prompt %u, max_new %u, mode %s, %zu bytes", (unsigned long long)id,
                 p->prompt_len, p->max_new_tokens, flx_engine_attn_mode_name(p->attn.mode), bytes);
    wake(n);   /* its transfer deadline is a new timer */
    *res_p = r;
    return FLX_OK;
}

flx_status_t flx_node_info(flx_node_h n, uint64_t id, flx_node_session_info_t *info_p)
{
    if (!n || !info_p)
        return flx_error_set(FLX_ERR_INVALID, "node info: NULL argument");
    pthread_mutex_lock(&n->mu);
    sess_t *s = find_sync(n, id);
    if (s)
        info_of(s, info_p);
    pthread_mutex_unlock(&n->mu);
    return s ? FLX_OK : flx_error_set(FLX_ERR_NOT_FOUND, "no session %llu", (unsigned long long)id);
}

flx_status_t flx_node_close(flx_node_h n, uint64_t id, flx_node_state_t *prev_p)
{
    if (!n)
        return flx_error_set(FLX_ERR_INVALID, "node close: NULL node");
    pthread_mutex_lock(&n->mu);
    sess_t *s = find(n, id);
    if (!s) {
        pthread_mutex_unlock(&n->mu);
        return flx_error_set(FLX_ERR_NOT_FOUND, "no session %llu", (unsigned long long)id);
    }
    flx_node_state_t prev = s->state;
    if (s->state == FLX_NODE_DECODING) {
        atomic_store(&s->gen->closed, 1);   /* the decode thread cancels, then closes the KV */
    } else if (s->state != FLX_NODE_CLOSED) {
        kv_close(n, s->kv);
        s->kv = 0;
        drop_local_tokens_locked(n, s);
    }
    if (s->state != FLX_NODE_DECODING)
        close_record_locked(n, s);
    pthread_mutex_unlock(&n->mu);
    wake(n);
    if (prev_p)
        *prev_p = prev;
    return FLX_OK;
}

static int terminal(flx_node_state_t s)
{
    return s == FLX_NODE_READY || s == FLX_NODE_DECODING || s == FLX_NODE_FAILED || s == FLX_NODE_CLOSED;
}

flx_status_t flx_node_wait(flx_node_h n, uint64_t id, uint64_t deadline_ns, flx_node_wait_fn fn, void *ctx,
                           const atomic_int *cancelled, flx_node_session_info_t *info_p)
{
    if (!n || !fn || !info_p)
        return flx_error_set(FLX_ERR_INVALID, "node wait: NULL argument");
    struct flx_node_waiter *w = calloc(1, sizeof *w);
    if (!w)
        return flx_error_set(FLX_ERR_NOMEM, "node wait");
    w->id = id;
    w->deadline_ns = deadline_ns;
    w->fn = fn;
    w->ctx = ctx;
    w->cancel = cancelled;
    flx_status_t st = FLX_INPROGRESS;
    pthread_mutex_lock(&n->mu);
    sess_t *s = find_sync(n, id);
    if (!s) {
        st = flx_error_set(FLX_ERR_NOT_FOUND, "no session %llu", (unsigned long long)id);
    } else if (terminal(s->state)) {
        info_of(s, info_p);
        st = FLX_OK;
    } else if (n->draining) {
        st = flx_error_set(FLX_ERR_UNAVAILABLE, "node is draining");
    } else {
        w->next = n->waiters;
        n->waiters = w;
    }
    pthread_mutex_unlock(&n->mu);
    if (st != FLX_INPROGRESS) {
        free(w);
        return st;
    }
    wake(n);   /* a new deadline */
    return FLX_INPROGRESS;
}

void flx_node_wake(flx_node_h n)
{
    if (n)
        wake(n);
}

/* ---- generation ---- */

flx_status_t flx_node_generate(flx_node_h n, const flx_node_gen_params_t *p, const flx_node_sink_t *sink)
{
    if (!n || !p || !sink || !sink->on_token || !sink->on_end)
        return flx_error_set(FLX_ERR_INVALID, "node generate: NULL argument");
    if (p->n_stop > n->lim.max_stop_ids || (p->n_stop && !p->stop_ids))
        return flx_error_set(FLX_ERR_INVALID, "%u stop ids, at most %u", p->n_stop, n->lim.max_stop_ids);
    for (uint32_t i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] < 0 || (uint32_t)p->stop_ids[i] >= n->lim.vocab)
            return flx_error_set(FLX_ERR_INVALID, "stop_token_ids[%u] %d outside the vocabulary [0, %u)", i,
                                 p->stop_ids[i], n->lim.vocab);
    flx_status_t st = flx_sampling_check(&p->sampling);
    if (st)
        return st;
    struct flx_node_gen *g = calloc(1, sizeof *g);
    if (!g)
        return flx_error_set(FLX_ERR_NOMEM, "node generate");
    g->node = n;
    g->sink = *sink;
    g->skip_text = p->skip_text || !n->tok;
    g->deadline_ns = p->deadline_ns;
    g->cancel = p->cancelled;
    g->t_request = flx_now_ns();
    uint32_t ns = 0;
    for (uint32_t i = 0; i < p->n_stop; i++) g->stop[ns++] = p->stop_ids[i];
    for (uint32_t i = 0; !p->ignore_eos && i < n->n_eog; i++) g->stop[ns++] = n->eog[i];
    g->gp.stop_ids = g->stop;
    g->gp.n_stop = ns;
    g->gp.eos_id = -1;   /* the model's end tokens are among the stop ids unless ignore_eos */
    g->gp.sampling = p->sampling;

    pthread_mutex_lock(&n->mu);
    sess_t *s = find_sync(n, p->session);
    if (n->draining)
        st = flx_error_set(FLX_ERR_UNAVAILABLE, "node is draining: no new Generate");
    else if (!s)
        st = flx_error_set(FLX_ERR_NOT_FOUND, "no session %llu", (unsigned long long)p->session);
    else if (s->state == FLX_NODE_FAILED)
        st = flx_error_set(FLX_ERR_STATE, "session %llu failed: %s", (unsigned long long)s->id, s->fail_reason);
    else if (s->state != FLX_NODE_READY)
        st = flx_error_set(FLX_ERR_STATE, "session %llu is %s, not ready", (unsigned long long)s->id,
                           flx_node_state_name(s->state));
    else if (p->max_new_tokens > s->max_new)
        st = flx_error_set(FLX_ERR_INVALID, "max_new_tokens %u exceeds the session's reservation %u",
                           p->max_new_tokens, s->max_new);
    if (!st) {
        g->sid = s->id;
        g->kv = s->kv;
        g->first_token = s->first_token;
        g->attn = s->attn;
        g->t_ready = s->t_ready;
        g->gp.max_new_tokens = p->max_new_tokens ? p->max_new_tokens : s->max_new;
        s->state = FLX_NODE_DECODING;
        s->gen = g;
        s->lease_end = UINT64_MAX;
        *n->incoming_tail = g;
        n->incoming_tail = &g->next;
        n->n_gen++;
        n->c_gen_calls++;
    }
    pthread_mutex_unlock(&n->mu);
    if (st) {
        free(g);
        return st;
    }
    wake(n);
    return FLX_OK;
}

/* ---- node ---- */

void flx_node_status(flx_node_h n, flx_node_status_t *out)
{
    memset(out, 0, sizeof *out);
    flx_kv_store_info_t si;
    flx_kv_store_info(n->store, &si);
    out->limits = n->lim;
    out->pool_capacity_bytes = si.capacity_bytes;
    out->max_sessions = n->cfg.max_sessions;
    out->max_batch = n->cfg.max_batch;
    out->decode_threads = n->n_threads;
    pthread_mutex_lock(&n->mu);
    out->pool_used_bytes = si.used_bytes + n->pending_bytes;
    out->draining = n->draining;
    for (uint32_t i = 0; i < n->n_slots; i++) {
        if (n->sess[i].id)
            sync_locked(n, &n->sess[i]);
        if (n->sess[i].id && n->sess[i].state >= FLX_NODE_OPEN && n->sess[i].state <= FLX_NODE_CLOSED)
            out->by_state[n->sess[i].state]++;
    }
    out->sessions_opened_total = n->c_opened;
    out->sessions_failed_total = n->c_failed;
    out->generate_calls_total = n->c_gen_calls;
    out->transfer_bytes_total = n->c_transfer_bytes;
    pthread_mutex_unlock(&n->mu);
    pthread_mutex_lock(&n->stats_mu);
    out->tokens_generated_total = n->c_tokens;
    pthread_mutex_unlock(&n->stats_mu);
}

void flx_node_drain(flx_node_h n, uint32_t timeout_ms)
{
    const uint64_t dl = flx_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    pthread_mutex_lock(&n->mu);
    if (!n->draining || dl < n->drain_deadline) {
        if (!n->draining)
            flx_log_info(MOD, "draining: %u Generate calls running, up to %u ms", n->n_gen, timeout_ms);
        n->draining = 1;
        n->drain_deadline = dl;
    }
    pthread_mutex_unlock(&n->mu);
    wake(n);
}

int flx_node_draining(flx_node_h n)
{
    pthread_mutex_lock(&n->mu);
    int d = n->draining;
    pthread_mutex_unlock(&n->mu);
    return d;
}

uint32_t flx_node_n_generating(flx_node_h n)
{
    pthread_mutex_lock(&n->mu);
    uint32_t g = n->n_gen;
    pthread_mutex_unlock(&n->mu);
    return g;
}

/* ---- local prefill thread ---- */

static void *prefill_main(void *arg)
{
    flx_node_h n = arg;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->stop && n->pf_n == 0) pthread_cond_wait(&n->pf_cv, &n->mu);
        if (n->stop) {
            pthread_mutex_unlock(&n->mu);
            break;
        }
        uint64_t id = n->pf_queue[n->pf_head];
        n->pf_head = (n->pf_head + 1) % n->n_slots;
        n->pf_n--;
        sess_t *s = find(n, id);
        if (!s || s->state != FLX_NODE_OPEN || !s->local_tokens) {
            pthread_mutex_unlock(&n->mu);
            continue;
        }
        int32_t *toks = s->local_tokens;
        s->local_tokens = NULL;
        const uint32_t len = s->prompt_len, max_new = s->max_new;
        const flx_node_attn_t attn = s->attn;
        const size_t reserved = s->reserved_bytes;
        s->state = FLX_NODE_RECEIVING;
        pthread_mutex_unlock(&n->mu);

        const uint64_t t0 = flx_now_ns();
        flx_kv_session_id_t kv = 0;
        flx_status_t st;
        if (attn.mode == FLX_ENGINE_ATTN_FLUXION)
            st = flx_engine_prefill_with_stats(n->model, n->pf_ws, n->store, toks, len, max_new, attn.tau, &kv,
                                               n->pf_logits);
        else
            st = flx_engine_prefill_into_store(n->model, n->pf_ws, n->store, toks, len, max_new, &kv, n->pf_logits);
        const uint64_t t1 = flx_now_ns();
        free(toks);
        char reason[FLX_NODE_REASON_MAX];
        if (st)
            snprintf(reason, sizeof reason, "local prefill: %s", flx_error_msg());
        flx_kv_session_info_t ki;
        memset(&ki, 0, sizeof ki);
        if (!st)
            flx_kv_session_info(n->store, kv, &ki);

        pthread_mutex_lock(&n->mu);
        n->pending_bytes -= reserved;
        s = find(n, id);
        if (!s || s->state != FLX_NODE_RECEIVING) {
            /* closed, failed by its deadline or a drain while it was computed: never READY */
            if (!st)
                flx_kv_session_close(n->store, kv);
        } else if (st) {
            fail_locked(n, s, reason);
        } else {
            s->kv = kv;
            s->first_token = (int32_t)flx_sample_argmax(n->pf_logits, n->lim.vocab);
            s->state = FLX_NODE_READY;
            s->t_ready = t1;
            s->lease_end = t1 + (uint64_t)s->lease_ms * 1000000ull;
            s->bytes_expected = ki.bytes_expected;
            s->bytes_received = ki.bytes_received;
            s->reserved_bytes = ki.reserved_bytes;
            s->gbps = t1 > t0 ? (double)ki.bytes_received / (double)(t1 - t0) : 0;
            n->c_ready++;
            n->c_transfer_bytes += ki.bytes_received;
            flx_prom_hist_observe(&n->h_ready, (double)(t1 - s->t_open) / 1e9);
            flx_prom_hist_observe(&n->h_rate, s->gbps * 1e9);
        }
        pthread_mutex_unlock(&n->mu);
        flx_log_info(MOD, "session %llu: local prefill of %u tokens in %.3f s: %s", (unsigned long long)id, len,
                     (double)(t1 - t0) / 1e9, st ? reason : "ready");
        wake(n);   /* its waiters */
    }
    return NULL;
}

/* ---- decode thread ---- */

static int attn_equal(const flx_node_attn_t *a, const flx_node_attn_t *b)
{
    if (a->mode != b->mode)
        return 0;
    return a->mode != FLX_ENGINE_ATTN_FIXED || (a->blk == b->blk && a->bgt == b->bgt);
}

/* The engine of an attention configuration, created on first use; an idle one makes room. When
 * FLX_NODE_MAX_ENGINES other configurations are all decoding, *e_p is NULL (FLX_OK): the call waits
 * for one of them to go idle. */
static flx_status_t engine_for(flx_node_h n, const flx_node_attn_t *attn, flx_engine_h *e_p)
{
    *e_p = NULL;
    for (uint32_t i = 0; i < n->n_eng; i++)
        if (attn_equal(&n->eng[i].attn, attn)) {
            *e_p = n->eng[i].e;
            return FLX_OK;
        }
    uint32_t slot = n->n_eng;
    if (slot == FLX_NODE_MAX_ENGINES) {
        for (slot = 0; slot < n->n_eng && flx_engine_n_live(n->eng[slot].e); slot++) {
        }
        if (slot == n->n_eng)
            return FLX_OK;
        flx_engine_destroy(n->eng[slot].e);
        n->eng[slot].e = NULL;
    }
    flx_engine_params_t ep = flx_engine_params_default();
    ep.max_batch = n->cfg.max_batch;
    ep.max_seqs = n->cfg.max_sessions;
    ep.pool = n->pool;
    ep.max_l_cpu = n->lim.max_prompt_len;
    ep.mode = attn->mode;
    ep.blk = attn->mode == FLX_ENGINE_ATTN_FIXED ? attn->blk : 16;
    ep.bgt = attn->mode == FLX_ENGINE_ATTN_FIXED ? attn->bgt : 0.05f;
    ep.close_sessions = 0;
    ep.predictor = attn->mode == FLX_ENGINE_ATTN_FLUXION ? n->pred : NULL;
    flx_engine_h e;
    flx_status_t st = flx_engine_create(n->model, n->store, &ep, &e);
    if (st)
        return st;
    n->eng[slot].attn = *attn;
    n->eng[slot].e = e;
    if (slot == n->n_eng)
        n->n_eng++;
    flx_log_info(MOD, "engine for %s attention created (blk %u, bgt %g)", flx_engine_attn_mode_name(attn->mode), ep.blk,
                 (double)ep.bgt);
    *e_p = e;
    return FLX_OK;
}

/* Appends the text of token t to g->text and returns its length. A piece that ends inside a UTF-8
 * character waits for the tokens that complete it (up to 16); what is sent is always valid UTF-8
 * (the proto's text is a string), so bytes that form no character, or a character still incomplete
 * at the end of the call or when the 16 are used up, go out as U+FFFD. */
static size_t detok(flx_node_h n, struct flx_node_gen *g, int32_t t, int flush)
{
    g->text[0] = '\0';
    if (g->skip_text)
        return 0;
    if (t >= 0 && g->dt_n < FLX_ARRAY_SIZE(g->dt_ids))
        g->dt_ids[g->dt_n++] = t;
    if (!g->dt_n)
        return 0;
    char raw[TEXT_MAX];
    size_t len = 0;
    if (flx_tok_decode(n->tok, g->dt_ids, g->dt_n, FLX_TOK_SKIP_SPECIAL, raw, sizeof raw, &len)) {
        g->dt_n = 0;
        return 0;
    }
    /* hold back an incomplete UTF-8 character, unless this is the end or the buffer is full */
    size_t i = len, k = 0;
    while (i > 0 && k < 4 && ((unsigned char)raw[i - 1] & 0xC0) == 0x80) i--, k++;
    int incomplete = 0;
    if (i > 0) {
        unsigned char c = (unsigned char)raw[i - 1];
        size_t need = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
        incomplete = k < need;
    } else {
        incomplete = k > 0;
    }
    if (incomplete && !flush && g->dt_n < FLX_ARRAY_SIZE(g->dt_ids))
        return 0;
    g->dt_n = 0;
    return flx_utf8_repair(raw, len, g->text, sizeof g->text);
}

static void emit(flx_node_h n, struct flx_node_gen *g, int32_t tok, flx_engine_finish_t why, int with_step)
{
    const uint64_t now = flx_now_ns();
    flx_node_token_t t;
    memset(&t, 0, sizeof t);
    t.index = g->n_sent;
    t.token = tok;
    t.text_len = detok(n, g, tok, why != FLX_FINISH_NONE);
    t.text = g->text;
    t.since_request_ns = now - g->t_request;
    uint64_t from = g->n_sent ? g->t_last : FLX_MAX(g->t_request, g->t_ready);
    t.interval_ns = now > from ? now - from : 0;
    t.finish = why;
    if (with_step) {
        flx_engine_stats_t last;
        flx_engine_last_stats(g->eng, &last);
        t.step_ns = last.step_ns;
        t.batch = (uint32_t)last.n_tokens;
        if (flx_engine_last_seq_stats(g->eng, g->seq, &t.stats) == FLX_OK) {
            pthread_mutex_lock(&n->stats_mu);
            n->s_heads += t.stats.heads;
            n->s_streaming += t.stats.streaming_heads;
            n->s_groups += t.stats.groups;
            n->s_skipped += t.stats.skipped_groups;
            for (int j = 0; j < 4; j++) n->s_blk[j] += t.stats.groups_by_blk[j];
            pthread_mutex_unlock(&n->stats_mu);
        }
    }
    flx_prom_hist_observe(g->n_sent ? &n->h_tpot : &n->h_ttft, (double)t.interval_ns / 1e9);
    pthread_mutex_lock(&n->stats_mu);
    n->c_tokens++;
    pthread_mutex_unlock(&n->stats_mu);
    g->sink.on_token(g->sink.ctx, &t);
    g->n_sent++;
    g->t_last = now;
}

/* The engine's token callback (decode thread, inside flx_engine_step / flx_engine_cancel). */
static void on_engine_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    struct flx_node_gen *g = ctx;
    if (token >= 0 && g->n_sent == 0) {
        /* the first token (the prefill's) joins at the start of a step: out at once, not after it */
        emit(g->node, g, token, is_last ? why : FLX_FINISH_NONE, 0);
    } else if (token >= 0) {
        g->has_pend = 1;
        g->pend_tok = token;
        g->pend_why = is_last ? why : FLX_FINISH_NONE;
    }
    if (is_last) {
        g->finished = 1;
        g->finish_why = why;
    }
}

/* Ends a call: the session's record and its KV first (a client that sees the stream end and asks
 * GetSession finds it CLOSED), then the sink's on_end, then the call is freed. */
static void gen_end(flx_node_h n, struct flx_node_gen *g, flx_status_t st, const char *msg)
{
    pthread_mutex_lock(&n->mu);
    sess_t *s = find(n, g->sid);
    if (s && s->gen == g) {
        s->gen = NULL;
        s->tokens_generated = g->n_sent;
        close_record_locked(n, s);
        s->kv = 0;
    }
    pthread_mutex_unlock(&n->mu);
    kv_close(n, g->kv);
    pthread_mutex_lock(&n->stats_mu);
    if (st == FLX_OK) n->c_gen_ok++;
    else if (st == FLX_ERR_CANCELED) n->c_gen_cancelled++;
    else if (st == FLX_ERR_TIMEOUT) n->c_gen_deadline++;
    else if (st == FLX_ERR_UNAVAILABLE) n->c_gen_unavailable++;
    else n->c_gen_error++;
    pthread_mutex_unlock(&n->stats_mu);
    g->sink.on_end(g->sink.ctx, st, msg ? msg : "");
    pthread_mutex_lock(&n->mu);
    n->n_gen--;
    pthread_mutex_unlock(&n->mu);
    free(g);
}

/* New calls join their engine, in arrival order after the calls still waiting for one (those whose
 * attention configuration found every engine busy with others; they stay first in line). */
static void admit(flx_node_h n)
{
    pthread_mutex_lock(&n->mu);
    *n->deferred_tail = n->incoming;
    n->incoming = NULL;
    n->incoming_tail = &n->incoming;
    pthread_mutex_unlock(&n->mu);
    struct flx_node_gen *g = n->deferred;
    n->deferred = NULL;
    n->deferred_tail = &n->deferred;
    while (g) {
        struct flx_node_gen *next = g->next;
        g->next = NULL;
        flx_status_t st = engine_for(n, &g->attn, &g->eng);
        if (!st && !g->eng) {
            if (!g->deferred_logged)
                flx_log_info(MOD, "session %llu waits for an engine: %u other attention configurations are decoding",
                             (unsigned long long)g->sid, FLX_NODE_MAX_ENGINES);
            g->deferred_logged = 1;
            *n->deferred_tail = g;
            n->deferred_tail = &g->next;
            g = next;
            continue;
        }
        if (!st) {
            g->gp.on_token = on_engine_token;
            g->gp.ctx = g;
            st = flx_engine_add(g->eng, g->kv, g->first_token, &g->gp, &g->seq);
        }
        if (st) {
            char msg[FLX_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", flx_error_msg());
            flx_log_error(MOD, "session %llu cannot decode: %s", (unsigned long long)g->sid, msg);
            gen_end(n, g, st, msg);
        } else {
            g->next = n->active;
            n->active = g;
        }
        g = next;
    }
}

/* Sends a call's token of the last step, and ends the call when that was its last callback. Returns
 * 1 when the call ended (it is freed). */
static int gen_flush(flx_node_h n, struct flx_node_gen *g, int with_step)
{
    if (g->has_pend) {
        g->has_pend = 0;
        emit(n, g, g->pend_tok, g->pend_why, with_step);
    }
    if (!g->finished)
        return 0;
    flx_status_t st = FLX_OK;
    const char *msg = "";
    if (g->finish_why == FLX_FINISH_CANCELED) {
        st = g->stop_st ? g->stop_st : FLX_ERR_CANCELED;
        msg = g->stop_msg;
    } else if (g->finish_why == FLX_FINISH_ERROR) {
        st = g->stop_st ? g->stop_st : FLX_ERR_INTERNAL;
        msg = g->stop_msg[0] ? g->stop_msg : "the decode step failed";
    }
    gen_end(n, g, st, msg);
    return 1;
}

/* Why a call must stop now (its error set), or FLX_OK. */
static flx_status_t call_stop(const struct flx_node_gen *g, uint64_t now, int drain_over)
{
    if (g->cancel && atomic_load(g->cancel))
        return flx_error_set(FLX_ERR_CANCELED, "the client cancelled after %u tokens", g->n_sent);
    if (atomic_load(&g->closed))
        return flx_error_set(FLX_ERR_CANCELED, "session closed by CloseSession after %u tokens", g->n_sent);
    if (now >= g->deadline_ns)
        return flx_error_set(FLX_ERR_TIMEOUT, "deadline passed after %u tokens", g->n_sent);
    if (drain_over)
        return flx_error_set(FLX_ERR_UNAVAILABLE, "node draining: stopped after %u tokens", g->n_sent);
    return FLX_OK;
}

/* Cancels calls whose client went away, whose session was closed, whose deadline passed, or that
 * a drain stops; each leaves its engine now, before the next step. A call still waiting for an
 * engine ends the same way. */
static void check_calls(flx_node_h n, uint64_t now, int drain_over)
{
    for (struct flx_node_gen **pp = &n->active; *pp;) {
        struct flx_node_gen *g = *pp;
        flx_status_t st = call_stop(g, now, drain_over);
        if (!st) {
            pp = &g->next;
            continue;
        }
        g->stop_st = st;
        snprintf(g->stop_msg, sizeof g->stop_msg, "%s", flx_error_msg());
        if (flx_engine_cancel(g->eng, g->seq) != FLX_OK && !g->finished) {
            g->finished = 1;   /* not live in the engine: end it all the same */
            g->finish_why = FLX_FINISH_CANCELED;
        }
        *pp = g->next;
        gen_flush(n, g, 0);
    }
    n->deferred_tail = &n->deferred;
    for (struct flx_node_gen **pp = &n->deferred; *pp;) {
        struct flx_node_gen *g = *pp;
        flx_status_t st = call_stop(g, now, drain_over);
        if (!st) {
            pp = n->deferred_tail = &g->next;
            continue;
        }
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
        *pp = g->next;
        gen_end(n, g, st, msg);
    }
}

/* Waiters whose wait is over, sessions whose deadline or lease passed, drains. Returns the next
 * timer (flx_now_ns clock, UINT64_MAX: none). */
static uint64_t timers(flx_node_h n, uint64_t now)
{
    typedef struct done {
        struct flx_node_waiter *w;
        flx_status_t st;
        flx_node_session_info_t info;
    } done_t;
    done_t *done = NULL;
    uint32_t n_done = 0, cap_done = 0;
    uint64_t next = UINT64_MAX;
    pthread_mutex_lock(&n->mu);
    const int draining = n->draining;
    for (uint32_t i = 0; i < n->n_slots; i++) {
        sess_t *s = &n->sess[i];
        if (!s->id)
            continue;
        sync_locked(n, s);
        if (s->state == FLX_NODE_OPEN || s->state == FLX_NODE_RECEIVING) {
            if (draining) {
                fail_locked(n, s, "node draining: the transfer was stopped");
            } else if (now >= s->transfer_deadline) {
                char r[FLX_NODE_REASON_MAX];
                snprintf(r, sizeof r, "transfer deadline of %.0f ms passed (%llu of %llu bytes received)",
                         (double)(s->transfer_deadline - s->t_open) / 1e6, (unsigned long long)s->bytes_received,
                         (unsigned long long)s->bytes_expected);
                fail_locked(n, s, r);
            } else {
                next = FLX_MIN(next, s->transfer_deadline);
            }
        } else if (s->state == FLX_NODE_READY) {
            if (now >= s->lease_end) {
                char r[FLX_NODE_REASON_MAX];
                snprintf(r, sizeof r, "lease of %u ms expired before a Generate claimed it", s->lease_ms);
                fail_locked(n, s, r);
                n->c_lease_expired++;
            } else {
                next = FLX_MIN(next, s->lease_end);
            }
        } else if (s->state == FLX_NODE_CLOSED) {
            if (now >= s->t_closed + CLOSED_KEEP_NS)
                memset(s, 0, sizeof *s);
            else
                next = FLX_MIN(next, s->t_closed + CLOSED_KEEP_NS);
        }
    }
    for (struct flx_node_waiter **pp = &n->waiters; *pp;) {
        struct flx_node_waiter *w = *pp;
        sess_t *s = find(n, w->id);
        flx_status_t st = FLX_INPROGRESS;
        if (w->cancel && atomic_load(w->cancel))
            st = FLX_ERR_CANCELED;
        else if (!s)
            st = FLX_ERR_NOT_FOUND;
        else if (terminal(s->state))
            st = FLX_OK;
        else if (draining)
            st = FLX_ERR_UNAVAILABLE;
        else if (now >= w->deadline_ns)
            st = FLX_ERR_TIMEOUT;
        if (st == FLX_INPROGRESS) {
            next = FLX_MIN(next, w->deadline_ns);
            pp = &w->next;
            continue;
        }
        if (n_done == cap_done) {
            uint32_t c = cap_done ? cap_done * 2 : 16;
            done_t *d = realloc(done, c * sizeof *d);
            if (!d) {   /* try again at the next pass */
                next = now;
                break;
            }
            done = d;
            cap_done = c;
        }
        done[n_done].w = w;
        done[n_done].st = st;
        memset(&done[n_done].info, 0, sizeof done[n_done].info);
        if (s)
            info_of(s, &done[n_done].info);
        n_done++;
        *pp = w->next;
    }
    pthread_mutex_unlock(&n->mu);
    for (uint32_t i = 0; i < n_done; i++) {
        done[i].w->fn(done[i].w->ctx, done[i].st, &done[i].info);
        free(done[i].w);
    }
    free(done);
    return next;
}

/* One step of every engine with live sequences, starting one engine later each round (no
 * configuration always waits behind another); each call's token goes out after its step. */
static void step_engines(flx_node_h n)
{
    uint32_t live = 0;
    const uint32_t first = n->n_eng ? n->eng_next++ % n->n_eng : 0;
    for (uint32_t k = 0; k < n->n_eng; k++) {
        flx_engine_h e = n->eng[(first + k) % n->n_eng].e;
        if (!flx_engine_n_live(e))
            continue;
        flx_engine_stats_t before;
        flx_engine_total_stats(e, &before);
        flx_status_t st = flx_engine_step(e);
        char msg[FLX_ERROR_MSG_MAX] = "";
        if (st < 0) {
            snprintf(msg, sizeof msg, "decode step failed: %s", flx_error_msg());
            flx_log_error(MOD, "%s", msg);
        }
        flx_engine_stats_t after;
        flx_engine_total_stats(e, &after);
        if (after.n_steps > before.n_steps) {
            flx_engine_stats_t last;
            flx_engine_last_stats(e, &last);
            pthread_mutex_lock(&n->stats_mu);
            flx_engine_stats_add(&n->eng_total, &last);
            pthread_mutex_unlock(&n->stats_mu);
        }
        for (struct flx_node_gen **pp = &n->active; *pp;) {
            struct flx_node_gen *g = *pp;
            if (g->eng != e) {
                pp = &g->next;
                continue;
            }
            if (g->finished && g->finish_why == FLX_FINISH_ERROR && !g->stop_st) {
                g->stop_st = st < 0 ? st : FLX_ERR_INTERNAL;
                snprintf(g->stop_msg, sizeof g->stop_msg, "%s", msg);
            }
            *pp = g->next;
            if (!gen_flush(n, g, 1)) {   /* still running: back in the list */
                g->next = *pp;
                *pp = g;
                pp = &g->next;
            }
        }
        live += flx_engine_n_live(e);
    }
    pthread_mutex_lock(&n->stats_mu);
    n->live_seqs = live;
    pthread_mutex_unlock(&n->stats_mu);
}

static void *decode_main(void *arg)
{
    flx_node_h n = arg;
    for (;;) {
        admit(n);
        const uint64_t now = flx_now_ns();
        pthread_mutex_lock(&n->mu);
        const int stop = n->stop, drain_over = n->draining && now >= n->drain_deadline;
        const uint64_t drain_deadline = n->draining ? n->drain_deadline : UINT64_MAX;
        pthread_mutex_unlock(&n->mu);
        check_calls(n, now, drain_over);
        uint64_t next = timers(n, now);
        step_engines(n);
        if (stop && !n->active) {
            pthread_mutex_lock(&n->mu);
            int idle = !n->incoming && !n->waiters && !n->deferred;
            pthread_mutex_unlock(&n->mu);
            if (idle)
                break;
            continue;
        }
        if (n->active || n->deferred)
            continue;   /* live sequences: the next step (calls wait for an engine only while others decode) */
        /* Idle: sleep until a wakeup or the next timer. */
        next = FLX_MIN(next, drain_deadline);
        pthread_mutex_lock(&n->wake_mu);
        while (!n->wake) {
            if (next == UINT64_MAX) {
                pthread_cond_wait(&n->wake_cv, &n->wake_mu);
                continue;
            }
            uint64_t t = flx_now_ns();
            if (t >= next)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t dl = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (next - t);
            ts.tv_sec = (time_t)(dl / 1000000000ull);
            ts.tv_nsec = (long)(dl % 1000000000ull);
            pthread_cond_timedwait(&n->wake_cv, &n->wake_mu, &ts);
            if (flx_now_ns() >= next)
                break;
        }
        n->wake = 0;
        pthread_mutex_unlock(&n->wake_mu);
    }
    return NULL;
}

/* ---- metrics ---- */

flx_status_t flx_node_metrics_text(flx_node_h n, char **text_p, size_t *len_p)
{
    flx_prom_buf_t b = {0};
    flx_node_status_t s;
    flx_node_status(n, &s);
    pthread_mutex_lock(&n->mu);
    uint64_t c_ready = n->c_ready, c_closed = n->c_closed, c_lease = n->c_lease_expired;
    pthread_mutex_unlock(&n->mu);
    pthread_mutex_lock(&n->stats_mu);
    flx_engine_stats_t t = n->eng_total;
    uint64_t heads = n->s_heads, streaming = n->s_streaming, groups = n->s_groups, skipped = n->s_skipped;
    uint64_t blk[4] = {n->s_blk[0], n->s_blk[1], n->s_blk[2], n->s_blk[3]};
    uint64_t ok = n->c_gen_ok, canc = n->c_gen_cancelled, dl = n->c_gen_deadline, unav = n->c_gen_unavailable,
             err = n->c_gen_error;
    uint32_t live = n->live_seqs;
    pthread_mutex_unlock(&n->stats_mu);

    char model_id[2 * FLX_NODE_ID_MAX];
    flx_prom_escape(s.limits.model_id, model_id, sizeof model_id);
    flx_prom_printf(&b, "# HELP fluxion_build_info The node's model and prefill mode.\n"
                        "# TYPE fluxion_build_info gauge\n"
                        "fluxion_build_info{model_id=\"%s\",prefill=\"%s\"} 1\n",
                    model_id, s.limits.prefill == FLX_NODE_PREFILL_LOCAL ? "local" : "ucx");
    flx_prom_metric(&b, "fluxion_draining", "gauge", "1 while the node drains (SIGTERM).", s.draining);
    flx_prom_header(&b, "fluxion_sessions", "gauge", "Sessions by state now (closed: records kept for a minute).");
    for (int st = FLX_NODE_OPEN; st <= FLX_NODE_CLOSED; st++) {
        char l[32];
        snprintf(l, sizeof l, "state=\"%s\"", flx_node_state_name((flx_node_state_t)st));
        flx_prom_sample(&b, "fluxion_sessions", l, s.by_state[st]);
    }
    flx_prom_metric(&b, "fluxion_sessions_opened_total", "counter", "Sessions opened.", (double)s.sessions_opened_total);
    flx_prom_metric(&b, "fluxion_sessions_ready_total", "counter", "Sessions whose KV arrived whole.", (double)c_ready);
    flx_prom_metric(&b, "fluxion_sessions_failed_total", "counter",
                    "Sessions that failed (transfer error, deadline, lease, drain).", (double)s.sessions_failed_total);
    flx_prom_metric(&b, "fluxion_sessions_lease_expired_total", "counter",
                    "READY sessions reclaimed because no Generate claimed them in time.", (double)c_lease);
    flx_prom_metric(&b, "fluxion_sessions_closed_total", "counter", "Sessions closed.", (double)c_closed);
    flx_prom_metric(&b, "fluxion_kv_pool_capacity_bytes", "gauge", "Host KV pool size.",
                    (double)s.pool_capacity_bytes);
    flx_prom_metric(&b, "fluxion_kv_pool_used_bytes", "gauge", "Host KV pool bytes reserved by sessions.",
                    (double)s.pool_used_bytes);
    flx_prom_metric(&b, "fluxion_transfer_bytes_total", "counter", "KV payload bytes received into sessions.",
                    (double)s.transfer_bytes_total);
    flx_prom_metric(&b, "fluxion_transfer_failures_total", "counter",
                    "Sessions whose KV did not arrive whole (every failure before READY).",
                    (double)(s.sessions_failed_total - c_lease));
    if (n->tp) {
        flx_tp_node_info_t ti;
        flx_tp_node_info(n->tp, &ti);
        flx_prom_metric(&b, "fluxion_transfer_connections", "gauge", "UCX connections from prefill nodes open now.",
                        ti.n_conns);
        flx_prom_metric(&b, "fluxion_transfer_connections_failed_total", "counter",
                        "UCX connections lost (peer gone, silent past the liveness time) with a session of theirs "
                        "that failed.", (double)ti.conns_failed);
        flx_prom_metric(&b, "fluxion_transfer_connections_left_total", "counter",
                        "UCX connections whose prefill node went away with none of its sessions receiving "
                        "(the normal end).", (double)ti.conns_left);
        flx_prom_metric(&b, "fluxion_transfer_messages_total", "counter", "UCX messages handled.", (double)ti.msgs);
        flx_prom_metric(&b, "fluxion_transfer_messages_refused_total", "counter",
                        "UCX messages refused (bad header, token, session or chunk).", (double)ti.msgs_refused);
    }
    flx_prom_hist_render(&b, "fluxion_time_to_ready_seconds", "OpenSession to READY.", &n->h_ready);
    flx_prom_hist_render(&b, "fluxion_transfer_rate_bytes_per_second",
                         "KV payload bytes of a session over its transfer time.", &n->h_rate);
    flx_prom_metric(&b, "fluxion_generate_calls_total", "counter", "Generate calls accepted.",
                    (double)s.generate_calls_total);
    flx_prom_header(&b, "fluxion_generate_ended_total", "counter", "Generate calls ended, by how.");
    flx_prom_sample(&b, "fluxion_generate_ended_total", "result=\"ok\"", (double)ok);
    flx_prom_sample(&b, "fluxion_generate_ended_total", "result=\"cancelled\"", (double)canc);
    flx_prom_sample(&b, "fluxion_generate_ended_total", "result=\"deadline_exceeded\"", (double)dl);
    flx_prom_sample(&b, "fluxion_generate_ended_total", "result=\"unavailable\"", (double)unav);
    flx_prom_sample(&b, "fluxion_generate_ended_total", "result=\"error\"", (double)err);
    flx_prom_metric(&b, "fluxion_generated_tokens_total", "counter", "Tokens streamed to clients.",
                    (double)s.tokens_generated_total);
    flx_prom_metric(&b, "fluxion_decoding_sequences", "gauge", "Sequences in the decode engines now.", live);
    flx_prom_hist_render(&b, "fluxion_ttft_seconds",
                         "Time to first token: from READY (or the Generate call, if later) to its send.", &n->h_ttft);
    flx_prom_hist_render(&b, "fluxion_tpot_seconds", "Time per output token: between a sequence's tokens.",
                         &n->h_tpot);
    flx_prom_metric(&b, "fluxion_decode_steps_total", "counter", "Decode steps run.", (double)t.n_steps);
    flx_prom_metric(&b, "fluxion_decode_step_seconds_total", "counter", "Wall time of the decode steps.",
                    (double)t.step_ns / 1e9);
    flx_prom_header(&b, "fluxion_decode_seconds_total", "counter",
                    "Decode time by part: dense (the forward outside attention) and attention (wall), and inside "
                    "attention the kernels' thread time by part.");
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"dense\"", (double)t.dense_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"attention\"", (double)t.attn_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"window_append\"", (double)t.append_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"window\"", (double)t.window_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"score\"", (double)t.score_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"topk\"", (double)t.topk_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"host_attention\"", (double)t.host_attn_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"merge\"", (double)t.merge_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"predictor\"", (double)t.predict_ns / 1e9);
    flx_prom_sample(&b, "fluxion_decode_seconds_total", "part=\"sample\"", (double)t.sample_ns / 1e9);
    flx_prom_metric(&b, "fluxion_host_read_bytes_total", "counter",
                    "Host-resident KV bytes attention read (Quest metadata + K/V blocks).", (double)t.host_bytes);
    flx_prom_metric(&b, "fluxion_host_metadata_bytes_total", "counter",
                    "Of those, the Quest metadata attention scored.", (double)t.host_meta_bytes);
    flx_prom_metric(&b, "fluxion_attention_heads_total", "counter", "(sequence, step, layer, query head)s decoded.",
                    (double)heads);
    flx_prom_metric(&b, "fluxion_streaming_heads_total", "counter",
                    "Of those, heads Fluxion's selector left window-only.", (double)streaming);
    flx_prom_metric(&b, "fluxion_attention_groups_total", "counter", "(sequence, step, layer, kv group)s decoded.",
                    (double)groups);
    flx_prom_metric(&b, "fluxion_skipped_groups_total", "counter",
                    "Of those, groups that read nothing on the host (every head streaming).", (double)skipped);
    flx_prom_header(&b, "fluxion_host_tasks_total", "counter", "Host attention tasks by logical block size.");
    for (int j = 0; j < 4; j++) {
        char l[32];
        snprintf(l, sizeof l, "blk=\"%d\"", 16 << j);
        flx_prom_sample(&b, "fluxion_host_tasks_total", l, (double)blk[j]);
    }
    if (b.failed) {
        free(b.p);
        return flx_error_set(FLX_ERR_NOMEM, "metrics text");
    }
    *text_p = b.p;
    *len_p = b.len;
    return FLX_OK;
}
