/*
 * core.c - the receiver's logic without UCX (tp_core.h).
 *
 * DESIGN
 * The state machine is the store's (flx/kvstore.h): RESERVED, RECEIVING, READY, DECODING, FAILED,
 * CLOSED, with deadlines, leases and commits. The core adds only what the network needs beside it:
 * who may write (the token), who did (connections, to fail their sessions when they die and to
 * tell them how it ended), and what is in flight (receives the store's claims pin).
 *
 * Order of checks, cheapest and least trusting first: the header parses (flx_tp_hdr_parse), the
 * session exists in this node, the token matches (constant time: a timing difference would let a
 * peer find a token byte by byte), the connection may feed it, then the kind's own checks, the last
 * of which is the store's claim against the reservation. Refusals before the token matched touch no
 * session; refusals after it fail the session they name, since its holder is broken.
 *
 * The session table is a small open-addressing map on the id under one lock; the lock is never
 * held across a store call, so a store call that builds a pyramid (a claim completing a layer) or
 * waits never blocks message checks on the progress thread.
 */
#define _GNU_SOURCE
#include "tp_core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "flx/log.h"
#include "flx/util.h"
#include "tp_hash.h"

#define MOD "transport"
#define CHANGED_CAP 4096u

struct tp_sess {
    flx_kv_session_id_t sid;
    uint8_t token[FLX_TP_TOKEN_BYTES];
    uint32_t vocab;
    int with_stats;
    uint64_t conns[TP_MAX_SESSION_CONNS];
    uint32_t n_conns;
    char peer[64];
    uint32_t inflight;          /* receives posted into its memory and not done */
    uint64_t refused;
    char last_refusal[FLX_TP_STATUS_MAX];
    uint64_t t_last_data;
    int closed;                 /* closed through the node: the record waits for inflight == 0 */
    flx_kv_state_t reported;    /* last state told to its senders (RESERVED: none yet) */
    uint64_t ended_at;          /* when a sweep first saw it ended with receives in flight */
};

/* ---- map (caller holds c->lock) ---- */

static uint32_t map_slot(const tp_core_t *c, flx_kv_session_id_t sid)
{
    uint64_t h = sid * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (c->map_cap - 1);
}

static tp_sess_t *map_get(const tp_core_t *c, flx_kv_session_id_t sid)
{
    for (uint32_t i = map_slot(c, sid);; i = (i + 1) & (c->map_cap - 1)) {
        tp_sess_t *s = c->map[i];
        if (!s) return NULL;
        if (s->sid == sid) return s;
    }
}

static int map_put(tp_core_t *c, tp_sess_t *s)
{
    if (c->map_n + 1 > c->map_cap / 2) return 0;
    uint32_t i = map_slot(c, s->sid);
    while (c->map[i]) i = (i + 1) & (c->map_cap - 1);
    c->map[i] = s;
    c->map_n++;
    return 1;
}

/* Removes and frees s; backward-shift deletion keeps probe chains whole. */
static void map_del(tp_core_t *c, tp_sess_t *s)
{
    uint32_t i = map_slot(c, s->sid), m = c->map_cap - 1;
    while (c->map[i] != s) i = (i + 1) & m;
    c->map[i] = NULL;
    for (uint32_t j = (i + 1) & m; c->map[j]; j = (j + 1) & m) {
        uint32_t home = map_slot(c, c->map[j]->sid);
        /* move j back to i when its home is not in (i, j] (cyclically) */
        if (((j - home) & m) >= ((j - i) & m)) {
            c->map[i] = c->map[j];
            c->map[j] = NULL;
            i = j;
        }
    }
    c->map_n--;
    free(s);
}

static void mark_changed_locked(tp_core_t *c, flx_kv_session_id_t sid)
{
    if (c->n_changed < c->cap_changed) c->changed[c->n_changed++] = sid;
    else c->n_changed = c->cap_changed + 1; /* overflow: the next notices scan everything */
}

static void mark_changed(tp_core_t *c, flx_kv_session_id_t sid)
{
    pthread_mutex_lock(&c->lock);
    mark_changed_locked(c, sid);
    pthread_mutex_unlock(&c->lock);
}

/* ---- lifetime ---- */

flx_status_t tp_core_init(tp_core_t *c, const tp_core_params_t *p)
{
    memset(c, 0, sizeof *c);
    c->store = p->store;
    flx_kv_store_info(p->store, &c->si);
    c->liveness_ms = p->liveness_ms;
    c->default_timeout_ms = p->default_timeout_ms;
    c->default_lease_ms = p->default_lease_ms;
    c->cancel_grace_ms = p->cancel_grace_ms;
    c->require_hash = p->require_hash;
    c->map_cap = 16;
    while (c->map_cap < 4 * (uint64_t)c->si.max_sessions) c->map_cap <<= 1;
    c->map = calloc(c->map_cap, sizeof *c->map);
    c->cap_changed = CHANGED_CAP;
    c->changed = malloc(c->cap_changed * sizeof *c->changed);
    if (!c->map || !c->changed) {
        free(c->map);
        free(c->changed);
        return flx_error_set(FLX_ERR_NOMEM, "transport session table of %u entries", c->map_cap);
    }
    pthread_mutex_init(&c->lock, NULL);
    return FLX_OK;
}

void tp_core_fini(tp_core_t *c)
{
    for (uint32_t i = 0; i < c->map_cap; i++) free(c->map[i]);
    free(c->map);
    free(c->changed);
    pthread_mutex_destroy(&c->lock);
}

static int token_eq(const uint8_t *a, const uint8_t *b)
{
    volatile uint8_t d = 0; /* no early exit: the time does not depend on where they differ */
    for (uint32_t i = 0; i < FLX_TP_TOKEN_BYTES; i++) d |= a[i] ^ b[i];
    return d == 0;
}

static flx_status_t random_token(uint8_t *out)
{
    size_t got = 0;
    while (got < FLX_TP_TOKEN_BYTES) {
        ssize_t n = getrandom(out + got, FLX_TP_TOKEN_BYTES - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return flx_error_set(FLX_ERR_IO, "getrandom for the transfer token: %s", strerror(errno));
        got += (size_t)n;
    }
    return FLX_OK;
}

flx_status_t tp_core_open(tp_core_t *c, const flx_tp_open_params_t *p, flx_tp_session_desc_t *desc_p)
{
    if (!p || !desc_p) return flx_error_set(FLX_ERR_INVALID, "session open: NULL argument");
    const flx_kv_store_info_t *si = &c->si;
    if (p->n_layers != si->n_layers || p->n_kv_heads != si->n_kv_heads || p->n_q_heads != si->n_q_heads ||
        p->head_dim != si->head_dim)
        return flx_error_set(FLX_ERR_INVALID,
                             "session open: model shape %u layers, %u/%u heads of %u is not the store's (%u layers, "
                             "%u/%u heads of %u)",
                             p->n_layers, p->n_q_heads, p->n_kv_heads, p->head_dim, si->n_layers, si->n_q_heads,
                             si->n_kv_heads, si->head_dim);
    if (p->vocab == 0) return flx_error_set(FLX_ERR_INVALID, "session open: vocab is 0");
    const uint32_t timeout = (p->field_mask & FLX_TP_OPEN_FIELD_TIMEOUT) && p->timeout_ms ? p->timeout_ms
                                                                                           : c->default_timeout_ms;
    const uint32_t lease = (p->field_mask & FLX_TP_OPEN_FIELD_LEASE) && p->lease_ms ? p->lease_ms : c->default_lease_ms;
    const int with_stats = (p->field_mask & FLX_TP_OPEN_FIELD_NO_STATS) ? p->with_stats != 0 : 1;
    tp_sess_t *s = calloc(1, sizeof *s);
    if (!s) return flx_error_set(FLX_ERR_NOMEM, "session open");
    flx_status_t st = random_token(s->token);
    if (st) {
        free(s);
        return st;
    }
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    const uint64_t now = flx_now_ns();
    flx_kv_session_params_t sp = {.prompt_len = p->prompt_len, .max_new_tokens = p->max_new_tokens,
                                  .flags = FLX_KV_SESSION_COMMIT | (with_stats ? 0 : FLX_KV_SESSION_NO_STATS),
                                  .deadline_ns = now + (uint64_t)timeout * 1000000,
                                  .lease_ns = (uint64_t)lease * 1000000};
    if ((st = flx_kv_session_open(c->store, &sp, &s->sid))) {
        free(s);
        return st;
    }
    s->vocab = p->vocab;
    s->with_stats = with_stats;
    pthread_mutex_lock(&c->lock);
    int ok = map_put(c, s);
    pthread_mutex_unlock(&c->lock);
    if (!ok) {
        flx_kv_session_close(c->store, s->sid);
        free(s);
        return flx_error_set(FLX_ERR_CAPACITY, "session open: the transport's table of %u sessions is full",
                             c->map_cap / 2);
    }
    flx_kv_session_info_t ki;
    flx_kv_session_info(c->store, s->sid, &ki);
    memset(desc_p, 0, sizeof *desc_p);
    desc_p->sid = s->sid;
    memcpy(desc_p->token, s->token, FLX_TP_TOKEN_BYTES);
    desc_p->deadline_ns = sp.deadline_ns;
    desc_p->deadline_unix_ms = (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000 + timeout;
    desc_p->reserved_bytes = ki.reserved_bytes;
    return FLX_OK;
}

flx_status_t tp_core_close(tp_core_t *c, flx_kv_session_id_t sid)
{
    pthread_mutex_lock(&c->lock);
    tp_sess_t *s = map_get(c, sid);
    if (!s || s->closed) {
        pthread_mutex_unlock(&c->lock);
        return flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx is unknown or closed", (unsigned long long)sid);
    }
    s->closed = 1;
    pthread_mutex_unlock(&c->lock);
    flx_status_t st = flx_kv_session_close(c->store, sid);
    if (st == FLX_ERR_NOT_FOUND) st = FLX_OK; /* closed in the store already (the decode loop did) */
    pthread_mutex_lock(&c->lock);
    mark_changed_locked(c, sid);
    pthread_mutex_unlock(&c->lock);
    return st;
}

flx_status_t tp_core_info(tp_core_t *c, flx_kv_session_id_t sid, flx_tp_session_info_t *out)
{
    flx_tp_session_info_t info;
    memset(&info, 0, sizeof info);
    pthread_mutex_lock(&c->lock);
    tp_sess_t *s = map_get(c, sid);
    const int known = s && !s->closed;   /* s may go once the lock does */
    if (known) {
        info.receives_inflight = s->inflight;
        info.n_conns = s->n_conns;
        memcpy(info.peer, s->peer, sizeof info.peer);
        info.msgs_refused = s->refused;
        memcpy(info.last_refusal, s->last_refusal, sizeof info.last_refusal);
        info.t_last_data_ns = s->t_last_data;
    }
    pthread_mutex_unlock(&c->lock);
    if (!known)
        return flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx is unknown or closed", (unsigned long long)sid);
    flx_status_t st = flx_kv_session_info(c->store, sid, &info.kv);
    if (st) return st;
    *out = info;
    return FLX_OK;
}

/* ---- messages ---- */

static void status_reply(tp_reply_t *r, flx_kv_session_id_t sid, flx_kv_state_t state, int refused, const char *why)
{
    r->kind = FLX_TP_STATUS;
    r->sid = sid;
    r->state = (uint32_t)state;
    r->refused = refused != 0;
    size_t n = strlen(why);
    r->len = (uint32_t)FLX_MIN(n, (size_t)FLX_TP_STATUS_MAX);
    memcpy(r->payload, why, r->len);
}

/* Refuses a message naming session s (token already checked): counts it on s too. */
static void refuse_locked(tp_core_t *c, tp_sess_t *s, const char *why)
{
    c->msgs_refused++;
    if (s) {
        s->refused++;
        size_t n = strnlen(why, sizeof s->last_refusal - 1); /* truncated on purpose */
        memcpy(s->last_refusal, why, n);
        s->last_refusal[n] = 0;
    }
}

/* Fails session sid with the reason (the store ignores it unless RESERVED/RECEIVING) and answers
 * with its state. */
static flx_status_t fail_session(tp_core_t *c, flx_kv_session_id_t sid, flx_status_t st, const char *reason,
                                 tp_reply_t *reply)
{
    flx_kv_session_fail(c->store, sid, reason);
    flx_kv_session_info_t ki;
    flx_kv_state_t state = flx_kv_session_info(c->store, sid, &ki) == FLX_OK ? ki.state : FLX_KV_CLOSED;
    status_reply(reply, sid, state, 1, reason);
    mark_changed(c, sid);
    return flx_error_set(st, "%s", reason);
}

flx_status_t tp_core_ingest(tp_core_t *c, uint64_t conn, const char *peer, const void *hdr_buf, size_t hdr_len,
                            uint64_t data_len, tp_recv_t **recv_p, tp_reply_t *reply, int *drop_conn)
{
    *recv_p = NULL;
    reply->kind = 0;
    *drop_conn = 0;
    flx_tp_hdr_t h;
    flx_status_t st = flx_tp_hdr_parse(hdr_buf, hdr_len, data_len, &h);
    pthread_mutex_lock(&c->lock);
    c->msgs++;
    if (st) {
        c->msgs_refused++;
        pthread_mutex_unlock(&c->lock);
        *drop_conn = 1; /* nothing in it can be trusted, not even the session it names */
        return st;
    }
    if (h.kind == FLX_TP_HEARTBEAT) {
        pthread_mutex_unlock(&c->lock);
        return FLX_OK;
    }
    if (h.kind == FLX_TP_WELCOME || h.kind == FLX_TP_STATUS) {
        c->msgs_refused++;
        pthread_mutex_unlock(&c->lock);
        *drop_conn = 1;
        return flx_error_set(FLX_ERR_FORMAT, "%s sent to a node: only nodes send it", flx_tp_kind_name(h.kind));
    }
    tp_sess_t *s = map_get(c, h.sid);
    char why[256];
    if (!s || s->closed) {
        c->msgs_refused++;
        pthread_mutex_unlock(&c->lock);
        snprintf(why, sizeof why, "refused %s: session %#llx is unknown or closed", flx_tp_kind_name(h.kind),
                 (unsigned long long)h.sid);
        status_reply(reply, h.sid, FLX_KV_CLOSED, 1, why);
        *drop_conn = 1;
        return flx_error_set(FLX_ERR_NOT_FOUND, "%s", why);
    }
    if (!token_eq(s->token, h.token)) {
        snprintf(why, sizeof why, "refused %s from %s: wrong token for session %#llx", flx_tp_kind_name(h.kind), peer,
                 (unsigned long long)h.sid);
        refuse_locked(c, s, why);
        pthread_mutex_unlock(&c->lock);
        status_reply(reply, h.sid, FLX_KV_RESERVED, 1, why);
        *drop_conn = 1;
        return flx_error_set(FLX_ERR_INVALID, "%s", why);
    }
    /* The holder of the token: remember its connection. */
    uint32_t k = 0;
    while (k < s->n_conns && s->conns[k] != conn) k++;
    if (k == s->n_conns) {
        if (s->n_conns == TP_MAX_SESSION_CONNS) {
            snprintf(why, sizeof why, "refused %s from %s: session %#llx already has %u connections",
                     flx_tp_kind_name(h.kind), peer, (unsigned long long)h.sid, TP_MAX_SESSION_CONNS);
            refuse_locked(c, s, why);
            pthread_mutex_unlock(&c->lock);
            status_reply(reply, h.sid, FLX_KV_RESERVED, 1, why);
            return flx_error_set(FLX_ERR_CAPACITY, "%s", why);
        }
        if (!s->n_conns) snprintf(s->peer, sizeof s->peer, "%s", peer);
        s->conns[s->n_conns++] = conn;
    }
    const int with_stats = s->with_stats;
    const uint32_t vocab = s->vocab;
    const flx_kv_session_id_t sid = h.sid;
    pthread_mutex_unlock(&c->lock);

    flx_kv_session_info_t ki;
    switch (h.kind) {
    case FLX_TP_HELLO:
        if ((st = flx_kv_session_info(c->store, sid, &ki))) {
            status_reply(reply, sid, FLX_KV_CLOSED, 1, "session closed");
            return st;
        }
        if (ki.state != FLX_KV_RESERVED && ki.state != FLX_KV_RECEIVING) {
            snprintf(why, sizeof why, "session %#llx is %s%s%s", (unsigned long long)sid, flx_kv_state_name(ki.state),
                     ki.fail_reason[0] ? ": " : "", ki.fail_reason);
            status_reply(reply, sid, ki.state, 1, why);
            return flx_error_set(FLX_ERR_STATE, "%s", why);
        }
        {
            const uint64_t now = flx_now_ns();
            flx_tp_welcome_t w = {.n_layers = c->si.n_layers, .n_kv_heads = c->si.n_kv_heads,
                                  .n_q_heads = c->si.n_q_heads, .head_dim = c->si.head_dim,
                                  .prompt_len = ki.prompt_len, .n_sink = ki.n_sink, .n_local = ki.n_local,
                                  .flags = (with_stats ? FLX_TP_WELCOME_STATS : 0) |
                                           (c->require_hash ? FLX_TP_WELCOME_CHECKSUM : 0),
                                  .heartbeat_ms = FLX_MAX(1u, c->liveness_ms / 4),
                                  .deadline_left_ns = ki.deadline_ns > now ? ki.deadline_ns - now : 1};
            reply->kind = FLX_TP_WELCOME;
            reply->sid = sid;
            reply->len = FLX_TP_WELCOME_BYTES;
            flx_tp_welcome_encode(&w, reply->payload);
        }
        return FLX_OK;
    case FLX_TP_COMMIT: {
        if (h.arg0 >= vocab) {
            snprintf(why, sizeof why, "bad commit: first token %u outside the vocabulary of %u", h.arg0, vocab);
            return fail_session(c, sid, FLX_ERR_INVALID, why, reply);
        }
        flx_kv_commit_t cm = {.first_token = (int32_t)h.arg0, .n_stats_layers = h.arg1, .kv_bytes = h.value};
        if ((st = flx_kv_session_commit(c->store, sid, &cm))) {
            snprintf(why, sizeof why, "%s", flx_error_msg());
            flx_kv_state_t state = flx_kv_session_info(c->store, sid, &ki) == FLX_OK ? ki.state : FLX_KV_CLOSED;
            status_reply(reply, sid, state, 1, why);
        }
        mark_changed(c, sid);
        return st;
    }
    case FLX_TP_KV:
    case FLX_TP_STATS:
        break;
    default:
        return flx_error_set(FLX_ERR_INTERNAL, "kind %u passed the header check", h.kind);
    }

    if (c->require_hash && !(h.flags & FLX_TP_FLAG_PAYLOAD_XXH3)) {
        snprintf(why, sizeof why, "bad %s: no payload_xxh3, and this node requires payload hashes",
                 flx_tp_kind_name(h.kind));
        return fail_session(c, sid, FLX_ERR_FORMAT, why, reply);
    }
    tp_recv_t *r = calloc(1, sizeof *r);
    if (!r) return flx_error_set(FLX_ERR_NOMEM, "receive of %llu bytes", (unsigned long long)data_len);
    r->hdr = h;
    r->conn = conn;
    if (h.kind == FLX_TP_KV) {
        flx_kv_chunk_t ch = flx_tp_hdr_chunk(&h);
        if ((st = flx_kv_chunk_claim(c->store, sid, &ch, &r->claim))) {
            snprintf(why, sizeof why, "%s", flx_error_msg());
            flx_kv_state_t state = flx_kv_session_info(c->store, sid, &ki) == FLX_OK ? ki.state : FLX_KV_CLOSED;
            status_reply(reply, sid, state, 1, why);
            pthread_mutex_lock(&c->lock);
            refuse_locked(c, map_get(c, sid), why);
            mark_changed_locked(c, sid);
            pthread_mutex_unlock(&c->lock);
            free(r);
            return flx_error_set(st, "%s", why);
        }
    } else {
        if (!with_stats) {
            snprintf(why, sizeof why, "refused STATS layer %u: session %#llx was opened without statistics", h.layer,
                     (unsigned long long)sid);
            status_reply(reply, sid, FLX_KV_RECEIVING, 1, why);
            free(r);
            return flx_error_set(FLX_ERR_STATE, "%s", why);
        }
        if (h.arg1 != c->si.n_q_heads || h.arg0 != c->si.head_dim || h.layer >= c->si.n_layers) {
            snprintf(why, sizeof why, "bad statistics: layer %u of %u heads of %u, the model has %u layers of %u heads of %u",
                     h.layer, h.arg1, h.arg0, c->si.n_layers, c->si.n_q_heads, c->si.head_dim);
            free(r);
            return fail_session(c, sid, FLX_ERR_INVALID, why, reply);
        }
        r->buf = malloc(h.payload_len); /* exactly the model's statistics: bounded by the shape just checked */
        if (!r->buf) {
            free(r);
            return flx_error_set(FLX_ERR_NOMEM, "statistics of %llu bytes", (unsigned long long)h.payload_len);
        }
    }
    pthread_mutex_lock(&c->lock);
    tp_sess_t *s2 = map_get(c, sid);
    if (s2) s2->inflight++;
    pthread_mutex_unlock(&c->lock);
    *recv_p = r;
    return FLX_OK;
}

/* XXH3 of a recv's landed bytes, in payload order (the wire's kernel: AVX2 where the CPU has it). */
static uint64_t landed_hash(const tp_recv_t *r)
{
    const flx_kv_iov_t *iov;
    flx_kv_iov_t one;
    const uint32_t n = tp_recv_iov(r, &iov, &one);
    return tp_hash_iov(iov, n);
}

static void describe(const flx_tp_hdr_t *h, char *out, size_t cap)
{
    if (h->kind == FLX_TP_KV)
        snprintf(out, cap, "KV layer %u heads [%u, %u) tokens [%u, %u)", h->layer, h->head_begin, h->head_end,
                 h->tok_begin, h->tok_end);
    else
        snprintf(out, cap, "STATS layer %u", h->layer);
}

void tp_core_recv_done(tp_core_t *c, tp_recv_t *r)
{
    const flx_kv_session_id_t sid = r->hdr.sid;
    char what[96], reason[256] = "";
    describe(&r->hdr, what, sizeof what);
    flx_status_t st = r->status;
    if (st != FLX_OK) {
        snprintf(reason, sizeof reason, "receive of %s failed: %s", what, r->why[0] ? r->why : flx_status_name(st));
    } else if (r->hdr.flags & FLX_TP_FLAG_PAYLOAD_XXH3) {
        uint64_t got = landed_hash(r);
        if (got != r->hdr.payload_xxh3) {
            snprintf(reason, sizeof reason, "bad %s: payload_xxh3 0x%016llx, the bytes that landed hash to 0x%016llx",
                     what, (unsigned long long)r->hdr.payload_xxh3, (unsigned long long)got);
            st = FLX_ERR_FORMAT;
        }
    }
    if (st != FLX_OK) flx_kv_session_fail(c->store, sid, reason); /* our reason first: the claim's is generic */
    uint64_t landed = 0;
    if (r->claim) {
        landed = r->claim->bytes;
        flx_kv_chunk_complete(c->store, r->claim, st == FLX_OK); /* a closed or failed session: counted for nobody */
    } else if (st == FLX_OK) {
        const uint32_t hq = r->hdr.arg1, d = r->hdr.arg0;
        /* The payload is the wire layout of the three arrays (little-endian, 4-byte aligned at malloc'd
         * offsets that are multiples of 8): used in place. */
        const flx_head_stats_t *stats = (const flx_head_stats_t *)r->buf;
        const float *mean_k = (const float *)(r->buf + (size_t)hq * FLX_TP_STATS_RECORD_BYTES);
        const float *q_anchor = mean_k + (size_t)hq * d;
        flx_kv_stats_write(c->store, sid, r->hdr.layer, stats, mean_k, q_anchor); /* failures fail the session */
    }
    pthread_mutex_lock(&c->lock);
    if (st == FLX_OK) c->kv_bytes += landed;
    tp_sess_t *s = map_get(c, sid);
    if (s) {
        s->inflight--;
        s->t_last_data = FLX_MAX(s->t_last_data, r->t_done_ns);
        if (s->closed && !s->inflight) map_del(c, s);
    }
    mark_changed_locked(c, sid);
    pthread_mutex_unlock(&c->lock);
    free(r->buf);
    free(r);
}

uint32_t tp_core_conn_failed(tp_core_t *c, uint64_t conn, const char *peer, const char *why, uint32_t *n_failed_p)
{
    /* Collect under the lock, fail outside it. */
    uint32_t cap = 64, n = 0, failed = 0;
    flx_kv_session_id_t *sids = malloc(cap * sizeof *sids);
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < c->map_cap; i++) {
        tp_sess_t *s = c->map[i];
        if (!s || s->closed) continue;
        for (uint32_t k = 0; k < s->n_conns; k++)
            if (s->conns[k] == conn) {
                if (n == cap) {
                    flx_kv_session_id_t *m = sids ? realloc(sids, 2 * cap * sizeof *sids) : NULL;
                    if (m) sids = m, cap *= 2;
                }
                if (sids && n < cap) sids[n++] = s->sid;
                break;
            }
    }
    pthread_mutex_unlock(&c->lock);
    char reason[FLX_TP_STATUS_MAX];
    snprintf(reason, sizeof reason, "peer %s %s", peer, why);
    uint32_t was_failed = 0;
    for (uint32_t i = 0; i < n; i++) {
        flx_kv_session_info_t ki;
        if (flx_kv_session_fail(c->store, sids[i], reason) == FLX_OK) {
            failed++;
            mark_changed(c, sids[i]);
        } else if (flx_kv_session_info(c->store, sids[i], &ki) == FLX_OK && ki.state == FLX_KV_FAILED) {
            was_failed++;   /* failed before this: by the peer's own receive errors, its bad data, ... */
        }
    }
    free(sids);
    if (n_failed_p) *n_failed_p = was_failed;
    return failed;
}

int tp_core_conn_active(tp_core_t *c, uint64_t conn)
{
    pthread_mutex_lock(&c->lock);
    int active = 0;
    for (uint32_t i = 0; i < c->map_cap && !active; i++) {
        tp_sess_t *s = c->map[i];
        if (!s || s->closed) continue;
        for (uint32_t k = 0; k < s->n_conns; k++)
            if (s->conns[k] == conn) {
                flx_kv_session_info_t ki;
                /* a store call under the core lock: info takes only the store's own locks, briefly */
                active = flx_kv_session_info(c->store, s->sid, &ki) == FLX_OK &&
                         (ki.state == FLX_KV_RESERVED || ki.state == FLX_KV_RECEIVING);
                break;
            }
    }
    pthread_mutex_unlock(&c->lock);
    return active;
}

/* The ids of every session record (caller frees), *n_p of them. */
static flx_kv_session_id_t *all_sids(tp_core_t *c, uint32_t *n_p)
{
    pthread_mutex_lock(&c->lock);
    flx_kv_session_id_t *ids = malloc(((size_t)c->map_n + 1) * sizeof *ids);
    uint32_t n = 0;
    for (uint32_t i = 0; ids && i < c->map_cap; i++)
        if (c->map[i]) ids[n++] = c->map[i]->sid;
    pthread_mutex_unlock(&c->lock);
    *n_p = n;
    return ids;
}

uint64_t tp_core_sweep(tp_core_t *c, uint64_t now, uint64_t *conns_out, uint32_t cap, uint32_t *n_conns_p)
{
    uint64_t next = UINT64_MAX;
    uint32_t n_expired = flx_kv_store_expire(c->store, now, &next);
    uint32_t n = 0, n_out = 0;
    flx_kv_session_id_t *ids = all_sids(c, &n);
    for (uint32_t i = 0; ids && i < n; i++) {
        flx_kv_session_info_t ki;
        int gone = flx_kv_session_info(c->store, ids[i], &ki) != FLX_OK;
        pthread_mutex_lock(&c->lock);
        tp_sess_t *s = map_get(c, ids[i]);
        if (s) {
            int ended = gone || s->closed || ki.state == FLX_KV_FAILED;
            if (n_expired) mark_changed_locked(c, s->sid);
            if (gone && !s->inflight) {
                if (!s->closed) mark_changed_locked(c, s->sid); /* closed elsewhere: tell its senders */
                if (s->reported == FLX_KV_CLOSED || !s->n_conns) map_del(c, s);
                else s->closed = 1;
            } else if (ended && s->inflight) {
                if (!s->ended_at) s->ended_at = now;
                else if (now - s->ended_at >= (uint64_t)c->cancel_grace_ms * 1000000)
                    for (uint32_t k = 0; k < s->n_conns && n_out < cap; k++) conns_out[n_out++] = s->conns[k];
            } else {
                s->ended_at = 0;
            }
        }
        pthread_mutex_unlock(&c->lock);
    }
    free(ids);
    *n_conns_p = n_out;
    return next == UINT64_MAX ? UINT64_MAX : (next > now ? next - now : 0);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint32_t tp_core_notices(tp_core_t *c, tp_notice_t *out, uint32_t cap)
{
    uint32_t n = 0, n_out = 0;
    flx_kv_session_id_t *ids;
    pthread_mutex_lock(&c->lock);
    int all = c->n_changed > c->cap_changed;
    if (!all && c->n_changed) {
        ids = malloc(c->n_changed * sizeof *ids);
        if (ids) memcpy(ids, c->changed, c->n_changed * sizeof *ids);
        n = ids ? c->n_changed : 0;
        all = !ids;
    } else {
        ids = NULL;
    }
    c->n_changed = 0;
    pthread_mutex_unlock(&c->lock);
    if (all) ids = all_sids(c, &n);
    if (!ids) return 0;
    qsort(ids, n, sizeof *ids, cmp_u64);
    uint32_t i = 0;
    for (; i < n && n_out < cap; i++) {
        if (i && ids[i] == ids[i - 1]) continue;
        flx_kv_session_info_t ki;
        flx_kv_state_t state = flx_kv_session_info(c->store, ids[i], &ki) == FLX_OK ? ki.state : FLX_KV_CLOSED;
        if (state == FLX_KV_DECODING) state = FLX_KV_READY; /* what the prefill wants to know: it landed */
        if (state == FLX_KV_RESERVED || state == FLX_KV_RECEIVING) continue;
        pthread_mutex_lock(&c->lock);
        tp_sess_t *s = map_get(c, ids[i]);
        if (s && s->n_conns && s->reported != state) {
            tp_notice_t *no = &out[n_out++];
            s->reported = state;
            no->n_conns = s->n_conns;
            memcpy(no->conns, s->conns, sizeof no->conns);
            status_reply(&no->reply, s->sid, state, 0,
                         state == FLX_KV_FAILED ? ki.fail_reason : state == FLX_KV_READY ? "ready" : "closed");
            if (s->closed && state == FLX_KV_CLOSED && !s->inflight) map_del(c, s);
        }
        pthread_mutex_unlock(&c->lock);
    }
    /* out is full: the sessions not looked at yet stay changed for the next call */
    pthread_mutex_lock(&c->lock);
    for (; i < n; i++) mark_changed_locked(c, ids[i]);
    pthread_mutex_unlock(&c->lock);
    free(ids);
    return n_out;
}

flx_status_t tp_core_fail(tp_core_t *c, flx_kv_session_id_t sid, const char *reason)
{
    pthread_mutex_lock(&c->lock);
    tp_sess_t *s = map_get(c, sid);
    const int known = s && !s->closed;
    pthread_mutex_unlock(&c->lock);
    if (!known) return flx_error_set(FLX_ERR_NOT_FOUND, "session %#llx is unknown or closed", (unsigned long long)sid);
    flx_status_t st = flx_kv_session_fail(c->store, sid, reason);
    if (st == FLX_OK) mark_changed(c, sid);
    return st;
}

void tp_core_fail_all(tp_core_t *c, const char *reason)
{
    uint32_t n = 0;
    flx_kv_session_id_t *ids = all_sids(c, &n);
    for (uint32_t i = 0; ids && i < n; i++)
        if (flx_kv_session_fail(c->store, ids[i], reason) == FLX_OK) mark_changed(c, ids[i]);
    free(ids);
}

void tp_core_counters(tp_core_t *c, uint64_t *msgs, uint64_t *refused, uint64_t *kv_bytes)
{
    pthread_mutex_lock(&c->lock);
    *msgs = c->msgs;
    *refused = c->msgs_refused;
    *kv_bytes = c->kv_bytes;
    pthread_mutex_unlock(&c->lock);
}

uint32_t tp_core_n_sessions(tp_core_t *c)
{
    pthread_mutex_lock(&c->lock);
    uint32_t n = c->map_n;
    pthread_mutex_unlock(&c->lock);
    return n;
}
