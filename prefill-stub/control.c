/*
 * control.c - the decode node's control-plane answers as a prefill node reads them
 * (flx/prefill_control.h).
 */
#include "flx/prefill_control.h"

#include <stdio.h>
#include <string.h>

#include "fluxion/decode/v1/decode.pb-c.h"

#define BAD(msg, ...) flx_error_set(FLX_ERR_FORMAT, msg ": " __VA_ARGS__)

/* A string of 1 .. cap - 1 bytes without control characters; ascii: printable ASCII without space
 * (a host name or address), else any other byte too (a model id may be UTF-8, as the node's config
 * allows). */
static int text_ok(const char *s, size_t cap, int ascii)
{
    if (!s || !s[0]) return 0;
    for (size_t n = 0; s[n]; n++) {
        const unsigned char c = (unsigned char)s[n];
        if (n + 1 >= cap || c < 0x20 || c == 0x7f || (ascii && (c == 0x20 || c > 0x7e))) return 0;
    }
    return 1;
}

flx_status_t flx_pfx_parse_node_status(const void *buf, size_t len, flx_pfx_node_t *out)
{
    if (!buf || !out) return flx_error_set(FLX_ERR_INVALID, "NodeStatus answer: NULL argument");
    Fluxion__Decode__V1__NodeStatusResponse *m =
        fluxion__decode__v1__node_status_response__unpack(NULL, len, (const uint8_t *)buf);
    if (!m) return BAD("NodeStatus answer", "not a fluxion.decode.v1.NodeStatusResponse (%zu bytes)", len);
    flx_status_t st = FLX_OK;
    const Fluxion__Decode__V1__ModelShape *s = m->shape;
    if (!text_ok(m->model_id, FLX_PFX_MODEL_ID_MAX, 0))
        st = BAD("NodeStatus answer", "model_id empty, longer than %d bytes or holding a control character",
                 FLX_PFX_MODEL_ID_MAX - 1);
    else if (!s)
        st = BAD("NodeStatus answer", "no shape");
    else if (s->n_layers == 0 || s->n_layers > 1024)
        st = BAD("NodeStatus answer", "shape.n_layers %u outside [1, 1024]", s->n_layers);
    else if (s->n_kv_heads == 0 || s->n_kv_heads > 1024)
        st = BAD("NodeStatus answer", "shape.n_kv_heads %u outside [1, 1024]", s->n_kv_heads);
    else if (s->n_q_heads == 0 || s->n_q_heads > FLX_TP_MAX_Q_HEADS || s->n_q_heads % s->n_kv_heads)
        st = BAD("NodeStatus answer", "shape.n_q_heads %u not a multiple of n_kv_heads %u up to %u", s->n_q_heads,
                 s->n_kv_heads, FLX_TP_MAX_Q_HEADS);
    else if (s->head_dim < 16 || s->head_dim > 256 || s->head_dim % 16)
        st = BAD("NodeStatus answer", "shape.head_dim %u not a multiple of 16 in [16, 256]", s->head_dim);
    if (!st) {
        snprintf(out->model_id, sizeof out->model_id, "%s", m->model_id);
        out->n_layers = s->n_layers, out->n_kv_heads = s->n_kv_heads;
        out->n_q_heads = s->n_q_heads, out->head_dim = s->head_dim;
    }
    fluxion__decode__v1__node_status_response__free_unpacked(m, NULL);
    return st;
}

flx_status_t flx_pfx_parse_open_session(const void *buf, size_t len, flx_pfx_session_t *out)
{
    if (!buf || !out) return flx_error_set(FLX_ERR_INVALID, "OpenSession answer: NULL argument");
    Fluxion__Decode__V1__OpenSessionResponse *m =
        fluxion__decode__v1__open_session_response__unpack(NULL, len, (const uint8_t *)buf);
    if (!m) return BAD("OpenSession answer", "not a fluxion.decode.v1.OpenSessionResponse (%zu bytes)", len);
    flx_status_t st = FLX_OK;
    const Fluxion__Decode__V1__UcxEndpoint *u = m->ucx;
    if (m->session_id == 0)
        st = BAD("OpenSession answer", "session_id 0");
    else if (m->transfer_token.len != FLX_TP_TOKEN_BYTES)
        st = BAD("OpenSession answer", "transfer_token of %zu bytes, not %u", m->transfer_token.len,
                 FLX_TP_TOKEN_BYTES);
    else if (!u || !u->listener_host || !u->listener_host[0])
        st = BAD("OpenSession answer", "no UCX listener (is the node running --prefill local?)");
    else if (!text_ok(u->listener_host, FLX_TP_HOST_MAX, 1))
        st = BAD("OpenSession answer", "ucx.listener_host longer than %d bytes or not printable ASCII",
                 FLX_TP_HOST_MAX - 1);
    else if (u->listener_port == 0 || u->listener_port > 65535)
        st = BAD("OpenSession answer", "ucx.listener_port %u outside [1, 65535]", u->listener_port);
    if (!st) {
        out->sid = m->session_id;
        memcpy(out->token, m->transfer_token.data, FLX_TP_TOKEN_BYTES);
        snprintf(out->host, sizeof out->host, "%s", u->listener_host);
        out->port = (uint16_t)u->listener_port;
    }
    fluxion__decode__v1__open_session_response__free_unpacked(m, NULL);
    return st;
}
