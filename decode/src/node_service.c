/*
 * node_service.c - the gRPC handlers of the decode node (flx/node_service.h).
 *
 * DESIGN
 * A handler parses, calls the node, packs the answer. The two that wait (WaitReady, Generate)
 * hand the node a context holding the call, a cancel flag and a reference count of two: one for
 * the handler, one for the node's callback. The call's on_cancel only sets the flag and wakes the
 * node (it may run on a polling thread while the node ends the call: it touches nothing the node
 * frees); the node's callback ends the call; the last of the two references frees the context,
 * whichever returns last. So no path reads a call or a context after it was freed, whatever order
 * cancellation, the node's answer and the handler's return take.
 *
 * Messages are packed into a stack buffer when they fit (a token message is ~60 bytes), else a
 * heap one: the decode thread allocates nothing per token on the common path.
 */
#include "flx/node_service.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/util.h"

#define MOD "service"

typedef struct watcher {
    struct watcher *next;
    flx_rpc_call_h call;
    atomic_int cancelled;
} watcher_t;

struct flx_node_service {
    flx_node_h node;
    flx_node_limits_t lim;
    flx_rpc_method_t methods[8];
    pthread_mutex_t mu;            /* guards the fields below */
    int draining, shut;
    watcher_t *watchers;           /* open Health.Watch streams */
};

/* ---- packing ---- */

/* Packs msg into stack (cap bytes) when it fits, else into a malloc'd buffer; NULL when out of
 * memory. Free with pack_free. */
static uint8_t *pack(const ProtobufCMessage *msg, uint8_t *stack, size_t cap, size_t *len_p)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = len <= cap ? stack : malloc(len);
    if (buf)
        protobuf_c_message_pack(msg, buf);
    *len_p = len;
    return buf;
}

static void pack_free(uint8_t *buf, const uint8_t *stack)
{
    if (buf != stack)
        free(buf);
}

/* Packs msg and sends it as the unary reply. */
static void reply_msg(flx_rpc_call_h call, const ProtobufCMessage *msg)
{
    uint8_t stack[512];
    size_t len;
    uint8_t *buf = pack(msg, stack, sizeof stack, &len);
    if (!buf) {
        flx_rpc_finish(call, FLX_ERR_NOMEM, "response of %zu bytes", len);
        return;
    }
    flx_rpc_reply(call, buf, len);
    pack_free(buf, stack);
}

/* Packs msg and sends it as one message of a stream. */
static flx_status_t send_msg(flx_rpc_call_h call, const ProtobufCMessage *msg)
{
    uint8_t stack[512];
    size_t len;
    uint8_t *buf = pack(msg, stack, sizeof stack, &len);
    if (!buf)
        return flx_error_set(FLX_ERR_NOMEM, "stream message of %zu bytes", len);
    flx_status_t st = flx_rpc_send(call, buf, len);
    pack_free(buf, stack);
    return st;
}

static void attn_to_pb(const flx_node_attn_t *a, Fluxion__Decode__V1__AttentionConfig *pb)
{
    fluxion__decode__v1__attention_config__init(pb);
    switch (a->mode) {
    case FLX_ENGINE_ATTN_FULL: pb->mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL; break;
    case FLX_ENGINE_ATTN_FIXED:
        pb->mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED;
        pb->blk = a->blk;
        pb->budget = a->bgt;
        break;
    case FLX_ENGINE_ATTN_FLUXION:
        pb->mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION;
        pb->tau = a->tau;
        break;
    }
}

static void reply_info(flx_rpc_call_h call, const flx_node_session_info_t *in)
{
    Fluxion__Decode__V1__SessionInfo pb;
    Fluxion__Decode__V1__AttentionConfig attn;
    fluxion__decode__v1__session_info__init(&pb);
    attn_to_pb(&in->attn, &attn);
    pb.session_id = in->id;
    pb.state = (Fluxion__Decode__V1__SessionState)in->state;
    pb.fail_reason = (char *)in->fail_reason;
    pb.prompt_len = in->prompt_len;
    pb.max_new_tokens = in->max_new_tokens;
    pb.attention = &attn;
    pb.bytes_expected = in->bytes_expected;
    pb.bytes_received = in->bytes_received;
    pb.reserved_bytes = in->reserved_bytes;
    pb.transfer_deadline_unix_ms = in->transfer_deadline_unix_ms;
    pb.time_to_ready_us = in->time_to_ready_ns / 1000;
    pb.transfer_gbps = in->transfer_gbps;
    pb.tokens_generated = in->tokens_generated;
    reply_msg(call, &pb.base);
}

/* A refusal ends the call with st and the message set with it: 1; FLX_OK: 0. */
static int refused(flx_rpc_call_h call, flx_status_t st)
{
    if (st) flx_rpc_finish(call, st, "%s", flx_error_msg());
    return st != FLX_OK;
}

/* ---- DecodeNode ---- */

static void h_open(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__OpenSessionRequest *r;
    flx_status_t st = flx_svc_parse_open_session(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    flx_node_open_params_t p = {.prompt_len = r->prompt_len, .max_new_tokens = r->max_new_tokens,
                                .transfer_timeout_ms = r->transfer_timeout_ms, .lease_ms = r->lease_ms,
                                .local_tokens = r->local_prefill ? r->local_prefill->token_ids : NULL};
    const Fluxion__Decode__V1__AttentionConfig *a = r->attention;
    switch (a->mode) {
    case FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED:
        p.attn = (flx_node_attn_t){FLX_ENGINE_ATTN_FIXED, a->blk, a->budget, 0};
        break;
    case FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION:
        p.attn = (flx_node_attn_t){FLX_ENGINE_ATTN_FLUXION, 0, 0, a->tau > 0 ? a->tau : 0.1f};
        break;
    default: p.attn = (flx_node_attn_t){FLX_ENGINE_ATTN_FULL, 0, 0, 0}; break;
    }
    flx_node_open_result_t res;
    st = flx_node_open(svc->node, &p, &res);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    if (refused(call, st)) return;
    Fluxion__Decode__V1__OpenSessionResponse pb;
    Fluxion__Decode__V1__UcxEndpoint ucx;
    fluxion__decode__v1__open_session_response__init(&pb);
    fluxion__decode__v1__ucx_endpoint__init(&ucx);
    pb.session_id = res.id;
    pb.transfer_token.data = res.token;
    pb.transfer_token.len = sizeof res.token;
    ucx.worker_address.data = res.ucx_worker_address;
    ucx.worker_address.len = res.ucx_worker_address_len;
    ucx.listener_host = res.ucx_host;
    ucx.listener_port = res.ucx_port;
    pb.ucx = &ucx;
    pb.transfer_deadline_unix_ms = res.transfer_deadline_unix_ms;
    pb.reserved_bytes = res.reserved_bytes;
    reply_msg(call, &pb.base);
}

static void h_get(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__GetSessionRequest *r;
    flx_status_t st = flx_svc_parse_get_session(req, len, &svc->lim, &r);
    flx_node_session_info_t info;
    if (!st) {
        st = flx_node_info(svc->node, r->session_id, &info);
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    if (st)
        flx_rpc_finish(call, st, "%s", flx_error_msg());
    else
        reply_info(call, &info);
}

static void h_close(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__CloseSessionRequest *r;
    flx_status_t st = flx_svc_parse_close_session(req, len, &svc->lim, &r);
    flx_node_state_t prev = FLX_NODE_CLOSED;
    if (!st) {
        st = flx_node_close(svc->node, r->session_id, &prev);
        protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    if (refused(call, st)) return;
    Fluxion__Decode__V1__CloseSessionResponse pb;
    fluxion__decode__v1__close_session_response__init(&pb);
    pb.previous_state = (Fluxion__Decode__V1__SessionState)prev;
    reply_msg(call, &pb.base);
}

static void h_status(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__NodeStatusRequest *r;
    flx_status_t st = flx_svc_parse_node_status(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    protobuf_c_message_free_unpacked(&r->base, NULL);
    flx_node_status_t s;
    flx_node_status(svc->node, &s);
    Fluxion__Decode__V1__NodeStatusResponse pb;
    Fluxion__Decode__V1__ModelShape shape;
    fluxion__decode__v1__node_status_response__init(&pb);
    fluxion__decode__v1__model_shape__init(&shape);
    shape.n_layers = s.limits.n_layers;
    shape.n_kv_heads = s.limits.n_kv_heads;
    shape.n_q_heads = s.limits.n_q_heads;
    shape.head_dim = s.limits.head_dim;
    pb.model_id = s.limits.model_id;
    pb.version = (char *)FLX_VERSION;
    pb.shape = &shape;
    pb.max_prompt_len = s.limits.max_prompt_len;
    pb.max_new_tokens = s.limits.max_new_tokens;
    pb.prefill_mode = s.limits.prefill == FLX_NODE_PREFILL_LOCAL ? FLUXION__DECODE__V1__PREFILL_MODE__PREFILL_MODE_LOCAL
                                                                 : FLUXION__DECODE__V1__PREFILL_MODE__PREFILL_MODE_UCX;
    pb.draining = s.draining;
    pb.pool_capacity_bytes = s.pool_capacity_bytes;
    pb.pool_used_bytes = s.pool_used_bytes;
    pb.max_sessions = s.max_sessions;
    pb.max_batch = s.max_batch;
    pb.sessions_open = s.by_state[FLX_NODE_OPEN];
    pb.sessions_receiving = s.by_state[FLX_NODE_RECEIVING];
    pb.sessions_ready = s.by_state[FLX_NODE_READY];
    pb.sessions_decoding = s.by_state[FLX_NODE_DECODING];
    pb.sessions_failed = s.by_state[FLX_NODE_FAILED];
    pb.sessions_opened_total = s.sessions_opened_total;
    pb.sessions_failed_total = s.sessions_failed_total;
    pb.generate_calls_total = s.generate_calls_total;
    pb.tokens_generated_total = s.tokens_generated_total;
    pb.transfer_bytes_total = s.transfer_bytes_total;
    pb.decode_threads = s.decode_threads;
    reply_msg(call, &pb.base);
}

/* A call the node answers later: see DESIGN. */
typedef struct pending {
    flx_node_service_h svc;
    flx_rpc_call_h call;
    atomic_int cancelled;
    atomic_int refs;
} pending_t;

static pending_t *pending_new(flx_node_service_h svc, flx_rpc_call_h call)
{
    pending_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->svc = svc;
    p->call = call;
    atomic_store(&p->refs, 2);
    return p;
}

static void pending_unref(pending_t *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1)
        free(p);
}

static void pending_on_cancel(void *ctx)
{
    pending_t *p = ctx;
    atomic_store(&p->cancelled, 1);
    flx_node_wake(p->svc->node);
}

/* The node's answer to a WaitReady. */
static void wait_done(void *ctx, flx_status_t st, const flx_node_session_info_t *info)
{
    pending_t *p = ctx;
    if (st == FLX_ERR_TIMEOUT)
        flx_rpc_finish(p->call, st, "session %llu still %s at the deadline", (unsigned long long)info->id,
                       flx_node_state_name(info->state));
    else if (st == FLX_ERR_CANCELED)
        flx_rpc_finish(p->call, st, "the client cancelled the wait");
    else if (st == FLX_ERR_UNAVAILABLE)
        flx_rpc_finish(p->call, st, "node draining: session %llu will not become ready here",
                       (unsigned long long)info->id);
    else if (st)
        flx_rpc_finish(p->call, st, "session %llu: %s", (unsigned long long)info->id, flx_status_name(st));
    else if (info->state == FLX_NODE_FAILED)
        flx_rpc_finish(p->call, FLX_ERR_STATE, "session %llu failed: %s", (unsigned long long)info->id,
                       info->fail_reason);
    else if (info->state == FLX_NODE_CLOSED)
        flx_rpc_finish(p->call, FLX_ERR_STATE, "session %llu was closed", (unsigned long long)info->id);
    else
        reply_info(p->call, info);
    pending_unref(p);
}

static void h_wait(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__WaitReadyRequest *r;
    flx_status_t st = flx_svc_parse_wait_ready(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    uint64_t id = r->session_id, deadline = flx_rpc_call_deadline_ns(call);
    if (r->timeout_ms)
        deadline = FLX_MIN(deadline, flx_now_ns() + (uint64_t)r->timeout_ms * 1000000ull);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    pending_t *p = pending_new(svc, call);
    if (!p) {
        flx_rpc_finish(call, FLX_ERR_NOMEM, "wait for session %llu", (unsigned long long)id);
        return;
    }
    if (flx_rpc_call_on_cancel(call, pending_on_cancel, p)) {
        free(p);
        flx_rpc_finish(call, FLX_ERR_CANCELED, "the client cancelled");
        return;
    }
    flx_node_session_info_t info;
    st = flx_node_wait(svc->node, id, deadline, wait_done, p, &p->cancelled, &info);
    if (st == FLX_INPROGRESS) {
        pending_unref(p);   /* the node's callback holds the other reference */
        return;
    }
    /* answered now: the node holds no reference; the call ends here */
    atomic_store(&p->refs, 1);
    if (st == FLX_OK)
        wait_done(p, FLX_OK, &info);
    else {
        flx_rpc_finish(call, st, "%s", flx_error_msg());
        pending_unref(p);
    }
}

/* ---- Generate ---- */

static void gen_on_token(void *ctx, const flx_node_token_t *t)
{
    pending_t *p = ctx;
    Fluxion__Decode__V1__GenerateResponse pb;
    Fluxion__Decode__V1__TokenTiming tim;
    Fluxion__Decode__V1__StepStats stats;
    fluxion__decode__v1__generate_response__init(&pb);
    fluxion__decode__v1__token_timing__init(&tim);
    fluxion__decode__v1__step_stats__init(&stats);
    pb.index = t->index;
    pb.token_id = t->token;
    pb.text = (char *)t->text;
    tim.since_request_us = t->since_request_ns / 1000;
    tim.interval_us = t->interval_ns / 1000;
    tim.step_us = t->step_ns / 1000;
    tim.batch_size = t->batch;
    pb.timing = &tim;
    uint32_t by_blk[4];
    memcpy(by_blk, t->stats.groups_by_blk, sizeof by_blk);
    stats.host_bytes = t->stats.host_bytes;
    stats.streaming_heads = t->stats.streaming_heads;
    stats.heads = t->stats.heads;
    stats.skipped_groups = t->stats.skipped_groups;
    stats.groups = t->stats.groups;
    stats.n_groups_by_blk = 4;
    stats.groups_by_blk = by_blk;
    pb.stats = &stats;
    switch (t->finish) {
    case FLX_FINISH_MAX_NEW: pb.finish_reason = FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_MAX_NEW_TOKENS; break;
    case FLX_FINISH_STOP: pb.finish_reason = FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_STOP_TOKEN; break;
    case FLX_FINISH_EOS: pb.finish_reason = FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_EOS; break;
    case FLX_FINISH_CAPACITY: pb.finish_reason = FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_WINDOW_FULL; break;
    default: break;
    }
    if (send_msg(p->call, &pb.base) == FLX_ERR_CANCELED && !atomic_load(&p->cancelled)) {
        /* the stream broke under us (the client went away between steps): stop decoding for it */
        atomic_store(&p->cancelled, 1);
    }
}

static void gen_on_end(void *ctx, flx_status_t st, const char *msg)
{
    pending_t *p = ctx;
    flx_rpc_finish(p->call, st, "%s", msg);
    pending_unref(p);
}

static void h_generate(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Fluxion__Decode__V1__GenerateRequest *r;
    flx_status_t st = flx_svc_parse_generate(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    flx_node_gen_params_t gp = {.session = r->session_id, .sampling = flx_sampling_greedy(),
                                .deadline_ns = flx_rpc_call_deadline_ns(call), .skip_text = r->skip_text};
    if (r->sampling) {
        gp.sampling.temperature = r->sampling->temperature;
        gp.sampling.top_k = r->sampling->top_k;
        gp.sampling.top_p = r->sampling->top_p > 0 ? r->sampling->top_p : 1.0f;
        gp.sampling.seed = r->sampling->seed;
    }
    if (r->stop) {
        gp.max_new_tokens = r->stop->max_new_tokens;
        gp.stop_ids = r->stop->stop_token_ids;
        gp.n_stop = (uint32_t)r->stop->n_stop_token_ids;
        gp.ignore_eos = r->stop->ignore_eos;
    }
    pending_t *p = pending_new(svc, call);
    if (!p) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        flx_rpc_finish(call, FLX_ERR_NOMEM, "generate");
        return;
    }
    if (flx_rpc_call_on_cancel(call, pending_on_cancel, p)) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        free(p);
        flx_rpc_finish(call, FLX_ERR_CANCELED, "the client cancelled");
        return;
    }
    gp.cancelled = &p->cancelled;
    flx_node_sink_t sink = {.on_token = gen_on_token, .on_end = gen_on_end, .ctx = p};
    st = flx_node_generate(svc->node, &gp, &sink);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    if (st) {
        flx_rpc_finish(call, st, "%s", flx_error_msg());
        atomic_store(&p->refs, 1);
    }
    pending_unref(p);
}

/* ---- Health ---- */

static int health_known(const char *service)
{
    return !service || !*service || !strcmp(service, "fluxion.decode.v1.DecodeNode");
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus serving(flx_node_service_h svc)
{
    pthread_mutex_lock(&svc->mu);
    int d = svc->draining;
    pthread_mutex_unlock(&svc->mu);
    return d ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
             : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

static void h_check(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Grpc__Health__V1__HealthCheckRequest *r;
    flx_status_t st = flx_svc_parse_health(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    int known = health_known(r->service);
    if (!known)
        flx_rpc_finish(call, FLX_ERR_NOT_FOUND, "unknown service '%s'", r->service);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    if (!known)
        return;
    Grpc__Health__V1__HealthCheckResponse pb;
    grpc__health__v1__health_check_response__init(&pb);
    pb.status = serving(svc);
    reply_msg(call, &pb.base);
}

static void watcher_on_cancel(void *ctx)
{
    watcher_t *w = ctx;
    atomic_store(&w->cancelled, 1);
}

/* Sends status to every watcher; ends those whose client left (svc->mu held). */
static void watchers_send(flx_node_service_h svc, Grpc__Health__V1__HealthCheckResponse__ServingStatus status,
                          int end_all)
{
    Grpc__Health__V1__HealthCheckResponse pb;
    grpc__health__v1__health_check_response__init(&pb);
    pb.status = status;
    for (watcher_t **pp = &svc->watchers; *pp;) {
        watcher_t *w = *pp;
        int gone = atomic_load(&w->cancelled) || send_msg(w->call, &pb.base) != FLX_OK;
        if (!gone && !end_all) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        flx_rpc_finish(w->call, gone ? FLX_ERR_CANCELED : FLX_OK, "health watch ended");
        free(w);
    }
}

static void h_watch(void *ctx, flx_rpc_call_h call, const uint8_t *req, size_t len)
{
    flx_node_service_h svc = ctx;
    Grpc__Health__V1__HealthCheckRequest *r;
    flx_status_t st = flx_svc_parse_health(req, len, &svc->lim, &r);
    if (refused(call, st)) return;
    Grpc__Health__V1__HealthCheckResponse pb;
    grpc__health__v1__health_check_response__init(&pb);
    int known = health_known(r->service);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    pb.status = known ? serving(svc) : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    watcher_t *w = calloc(1, sizeof *w);
    if (!w) {
        flx_rpc_finish(call, FLX_ERR_NOMEM, "health watch");
        return;
    }
    w->call = call;
    pthread_mutex_lock(&svc->mu);
    if (svc->shut || flx_rpc_call_on_cancel(call, watcher_on_cancel, w)) {
        pthread_mutex_unlock(&svc->mu);
        free(w);
        flx_rpc_finish(call, FLX_ERR_UNAVAILABLE, "health watch: the server is stopping");
        return;
    }
    send_msg(call, &pb.base);
    w->next = svc->watchers;
    svc->watchers = w;
    /* drop watchers whose clients left since the last change */
    for (watcher_t **pp = &svc->watchers; *pp;) {
        watcher_t *x = *pp;
        if (!atomic_load(&x->cancelled)) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        flx_rpc_finish(x->call, FLX_ERR_CANCELED, "health watch cancelled");
        free(x);
    }
    pthread_mutex_unlock(&svc->mu);
}

/* ---- service ---- */

flx_status_t flx_node_service_create(flx_node_h node, flx_node_service_h *svc_p)
{
    if (!node || !svc_p)
        return flx_error_set(FLX_ERR_INVALID, "service create: NULL argument");
    struct flx_node_service *s = calloc(1, sizeof *s);
    if (!s)
        return flx_error_set(FLX_ERR_NOMEM, "service");
    s->node = node;
    flx_node_limits(node, &s->lim);
    pthread_mutex_init(&s->mu, NULL);
    const flx_rpc_method_t m[8] = {
        {FLX_SVC_PREFIX "OpenSession", h_open, s},   {FLX_SVC_PREFIX "WaitReady", h_wait, s},
        {FLX_SVC_PREFIX "GetSession", h_get, s},     {FLX_SVC_PREFIX "Generate", h_generate, s},
        {FLX_SVC_PREFIX "CloseSession", h_close, s}, {FLX_SVC_PREFIX "NodeStatus", h_status, s},
        {FLX_SVC_HEALTH_PREFIX "Check", h_check, s}, {FLX_SVC_HEALTH_PREFIX "Watch", h_watch, s},
    };
    memcpy(s->methods, m, sizeof m);
    *svc_p = s;
    return FLX_OK;
}

const flx_rpc_method_t *flx_node_service_methods(flx_node_service_h s, uint32_t *n_p)
{
    *n_p = FLX_ARRAY_SIZE(s->methods);
    return s->methods;
}

void flx_node_service_drain(flx_node_service_h s)
{
    pthread_mutex_lock(&s->mu);
    if (!s->draining) {
        s->draining = 1;
        watchers_send(s, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING, 0);
    }
    pthread_mutex_unlock(&s->mu);
}

void flx_node_service_shutdown(flx_node_service_h s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->shut = 1;
    watchers_send(s, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING, 1);
    pthread_mutex_unlock(&s->mu);
}

void flx_node_service_destroy(flx_node_service_h s)
{
    if (!s)
        return;
    flx_node_service_shutdown(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
