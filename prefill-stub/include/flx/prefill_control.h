/*
 * flx/prefill_control.h - what a prefill node reads from a decode node's gRPC control plane
 * (fluxion.decode.v1.DecodeNode, proto/fluxion/decode/v1/decode.proto): the NodeStatus and
 * OpenSession answers, parsed and checked field by field before anything in them is used.
 *
 * The answers are outside bytes (a node of another version, a proxy, a peer that is not a node):
 * each parser unpacks with protobuf-c, checks every field it hands out, and writes *out only on
 * success; a refusal is FLX_ERR_FORMAT with flx_error_msg() naming the message and the field.
 * Fuzzed by tests/fuzz/fuzz_prefill_replies.c.
 */
#ifndef FLX_PREFILL_CONTROL_H
#define FLX_PREFILL_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "flx/transport.h"
#include "flx/util.h"

#define FLX_PFX_MODEL_ID_MAX 256   /* bytes of a model id, NUL included */

/* NodeStatus: the model the node serves (an OpenSession must name it and its shape). */
typedef struct flx_pfx_node {
    char model_id[FLX_PFX_MODEL_ID_MAX];   /* non-empty, no control character */
    uint32_t n_layers;                     /* [1, 1024] */
    uint32_t n_kv_heads;                   /* [1, 1024] */
    uint32_t n_q_heads;                    /* a multiple of n_kv_heads, at most FLX_TP_MAX_Q_HEADS */
    uint32_t head_dim;                     /* a multiple of 16 in [16, 256] */
} flx_pfx_node_t;

flx_status_t flx_pfx_parse_node_status(const void *buf, size_t len, flx_pfx_node_t *out);

/* OpenSession: the session to push into, its token and the node's UCX listener. */
typedef struct flx_pfx_session {
    uint64_t sid;                          /* non-zero */
    uint8_t token[FLX_TP_TOKEN_BYTES];
    char host[FLX_TP_HOST_MAX];            /* non-empty, printable ASCII, no space */
    uint16_t port;                         /* [1, 65535] */
} flx_pfx_session_t;

flx_status_t flx_pfx_parse_open_session(const void *buf, size_t len, flx_pfx_session_t *out);

#endif
