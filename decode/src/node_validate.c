/*
 * node_validate.c - unpacking and checking of every request of the control service
 * (flx/node_service.h, REQUEST CHECKS).
 *
 * DESIGN
 * One function per request type, used by the handlers and by the fuzz target alike, so what is
 * fuzzed is what serves. protobuf-c's unpack turns bytes into a message or refuses them; the
 * checks after it name the field and the value, and never trust a length from the message (every
 * repeated field is bounded here before anything walks it).
 */
#include <math.h>
#include <string.h>

#include "flx/node_service.h"
#include "flx/util.h"

#define HOUR_MS 3600000u

/* Unpacks one message of type desc, or FLX_ERR_FORMAT naming the type. */
static flx_status_t unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                           ProtobufCMessage **msg_p)
{
    if (!buf && len)
        return flx_error_set(FLX_ERR_INVALID, "request: NULL buffer");
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, buf ? buf : (const uint8_t *)"");
    if (!m)
        return flx_error_set(FLX_ERR_FORMAT, "request of %zu bytes is not a valid %s message", len, desc->name);
    *msg_p = m;
    return FLX_OK;
}

static flx_status_t check_sid(uint64_t id)
{
    return id ? FLX_OK : flx_error_set(FLX_ERR_INVALID, "session_id 0: no session has id 0");
}

static flx_status_t check_open(const Fluxion__Decode__V1__OpenSessionRequest *r, const flx_node_limits_t *l)
{
    if (!r->model_id || strcmp(r->model_id, l->model_id))
        return flx_error_set(FLX_ERR_INVALID, "model_id '%.64s' is not this node's model '%s'",
                             r->model_id ? r->model_id : "", l->model_id);
    const Fluxion__Decode__V1__ModelShape *sh = r->shape;
    if (!sh)
        return flx_error_set(FLX_ERR_INVALID, "shape is missing");
    if (sh->n_layers != l->n_layers || sh->n_kv_heads != l->n_kv_heads || sh->n_q_heads != l->n_q_heads ||
        sh->head_dim != l->head_dim)
        return flx_error_set(FLX_ERR_INVALID,
                             "shape (n_layers %u, n_kv_heads %u, n_q_heads %u, head_dim %u) is not the model's "
                             "(%u, %u, %u, %u)",
                             sh->n_layers, sh->n_kv_heads, sh->n_q_heads, sh->head_dim, l->n_layers, l->n_kv_heads,
                             l->n_q_heads, l->head_dim);
    if (r->prompt_len == 0 || r->prompt_len > l->max_prompt_len)
        return flx_error_set(FLX_ERR_INVALID, "prompt_len %u outside [1, %u]", r->prompt_len, l->max_prompt_len);
    if (r->max_new_tokens == 0 || r->max_new_tokens > l->max_new_tokens)
        return flx_error_set(FLX_ERR_INVALID, "max_new_tokens %u outside [1, %u]", r->max_new_tokens,
                             l->max_new_tokens);
    if (r->kv_dtype != FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16)
        return flx_error_set(FLX_ERR_INVALID, "kv_dtype %d: the node stores KV_DTYPE_BF16 (1) only", (int)r->kv_dtype);
    const Fluxion__Decode__V1__AttentionConfig *a = r->attention;
    if (!a)
        return flx_error_set(FLX_ERR_INVALID, "attention is missing");
    switch (a->mode) {
    case FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL: break;
    case FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED:
        if (a->blk != 16 && a->blk != 32 && a->blk != 64 && a->blk != 128)
            return flx_error_set(FLX_ERR_INVALID, "attention.blk %u is not 16, 32, 64 or 128", a->blk);
        if (!(a->budget >= 0.0f && a->budget <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "attention.budget %g outside [0, 1]", (double)a->budget);
        break;
    case FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION:
        if (!(a->tau >= 0.0f && a->tau < 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "attention.tau %g outside [0, 1) (0: the default 0.1)",
                                 (double)a->tau);
        if (!l->has_predictor)
            return flx_error_set(FLX_ERR_INVALID, "attention.mode FLUXION: this node has no predictor weights");
        break;
    default:
        return flx_error_set(FLX_ERR_INVALID, "attention.mode %d is not FULL (1), FIXED (2) or FLUXION (3)",
                             (int)a->mode);
    }
    if (r->transfer_timeout_ms > HOUR_MS || r->lease_ms > HOUR_MS)
        return flx_error_set(FLX_ERR_INVALID, "transfer_timeout_ms %u / lease_ms %u: at most %u", r->transfer_timeout_ms,
                             r->lease_ms, HOUR_MS);
    const Fluxion__Decode__V1__LocalPrefill *lp = r->local_prefill;
    if (l->prefill == FLX_NODE_PREFILL_UCX && lp)
        return flx_error_set(FLX_ERR_INVALID, "local_prefill given, but this node takes KV from prefill nodes (ucx)");
    if (l->prefill == FLX_NODE_PREFILL_LOCAL) {
        if (!lp)
            return flx_error_set(FLX_ERR_INVALID, "local_prefill missing: this node runs --prefill local");
        if (lp->n_token_ids != r->prompt_len)
            return flx_error_set(FLX_ERR_INVALID, "local_prefill has %zu token ids, prompt_len is %u",
                                 lp->n_token_ids, r->prompt_len);
        for (size_t i = 0; i < lp->n_token_ids; i++)
            if (lp->token_ids[i] < 0 || (uint32_t)lp->token_ids[i] >= l->vocab)
                return flx_error_set(FLX_ERR_INVALID, "local_prefill.token_ids[%zu] %d outside the vocabulary [0, %u)",
                                     i, lp->token_ids[i], l->vocab);
    }
    return FLX_OK;
}

static flx_status_t check_generate(const Fluxion__Decode__V1__GenerateRequest *r, const flx_node_limits_t *l)
{
    flx_status_t st = check_sid(r->session_id);
    if (st)
        return st;
    const Fluxion__Decode__V1__SamplingParams *s = r->sampling;
    if (s) {
        if (!(s->temperature >= 0.0f && s->temperature <= 1e6f))
            return flx_error_set(FLX_ERR_INVALID, "sampling.temperature %g outside [0, 1e6]", (double)s->temperature);
        if (!(s->top_p >= 0.0f && s->top_p <= 1.0f))
            return flx_error_set(FLX_ERR_INVALID, "sampling.top_p %g outside [0, 1] (0: off)", (double)s->top_p);
    }
    const Fluxion__Decode__V1__StopConditions *c = r->stop;
    if (c) {
        if (c->max_new_tokens > l->max_new_tokens)
            return flx_error_set(FLX_ERR_INVALID, "stop.max_new_tokens %u above the node's limit %u", c->max_new_tokens,
                                 l->max_new_tokens);
        if (c->n_stop_token_ids > l->max_stop_ids)
            return flx_error_set(FLX_ERR_INVALID, "stop.stop_token_ids has %zu ids, at most %u", c->n_stop_token_ids,
                                 l->max_stop_ids);
        for (size_t i = 0; i < c->n_stop_token_ids; i++)
            if (c->stop_token_ids[i] < 0 || (uint32_t)c->stop_token_ids[i] >= l->vocab)
                return flx_error_set(FLX_ERR_INVALID, "stop.stop_token_ids[%zu] %d outside the vocabulary [0, %u)", i,
                                     c->stop_token_ids[i], l->vocab);
    }
    return FLX_OK;
}

/* Unpack, check, and free on refusal: the common shape of every parse function. */
#define PARSE(TYPE, desc, check)                                                   \
    do {                                                                           \
        if (!lim || !req_p)                                                        \
            return flx_error_set(FLX_ERR_INVALID, "parse: NULL argument");         \
        ProtobufCMessage *m_;                                                      \
        flx_status_t st_ = unpack(&(desc), buf, len, &m_);                         \
        if (st_)                                                                   \
            return st_;                                                            \
        TYPE *r_ = (TYPE *)m_;                                                     \
        if ((st_ = (check))) {                                                     \
            protobuf_c_message_free_unpacked(m_, NULL);                            \
            return st_;                                                            \
        }                                                                          \
        *req_p = r_;                                                               \
        return FLX_OK;                                                             \
    } while (0)

flx_status_t flx_svc_parse_open_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                        Fluxion__Decode__V1__OpenSessionRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__OpenSessionRequest, fluxion__decode__v1__open_session_request__descriptor,
          check_open(r_, lim));
}

flx_status_t flx_svc_parse_wait_ready(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                      Fluxion__Decode__V1__WaitReadyRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__WaitReadyRequest, fluxion__decode__v1__wait_ready_request__descriptor,
          check_sid(r_->session_id) ? FLX_ERR_INVALID
          : r_->timeout_ms > HOUR_MS ? flx_error_set(FLX_ERR_INVALID, "timeout_ms %u above %u", r_->timeout_ms, HOUR_MS)
                                     : FLX_OK);
}

flx_status_t flx_svc_parse_get_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                       Fluxion__Decode__V1__GetSessionRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__GetSessionRequest, fluxion__decode__v1__get_session_request__descriptor,
          check_sid(r_->session_id));
}

flx_status_t flx_svc_parse_generate(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                    Fluxion__Decode__V1__GenerateRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__GenerateRequest, fluxion__decode__v1__generate_request__descriptor,
          check_generate(r_, lim));
}

flx_status_t flx_svc_parse_close_session(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                         Fluxion__Decode__V1__CloseSessionRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__CloseSessionRequest, fluxion__decode__v1__close_session_request__descriptor,
          check_sid(r_->session_id));
}

flx_status_t flx_svc_parse_node_status(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                       Fluxion__Decode__V1__NodeStatusRequest **req_p)
{
    PARSE(Fluxion__Decode__V1__NodeStatusRequest, fluxion__decode__v1__node_status_request__descriptor, FLX_OK);
}

flx_status_t flx_svc_parse_health(const uint8_t *buf, size_t len, const flx_node_limits_t *lim,
                                  Grpc__Health__V1__HealthCheckRequest **req_p)
{
    PARSE(Grpc__Health__V1__HealthCheckRequest, grpc__health__v1__health_check_request__descriptor,
          r_->service && strlen(r_->service) > 256
              ? flx_error_set(FLX_ERR_INVALID, "service name of %zu bytes, at most 256", strlen(r_->service))
              : FLX_OK);
}
