/*
 * flx/tp_wire.h - the KV transfer wire format: the header every UCX active message between a prefill
 * node and a decode node carries, and the payloads of its kinds. docs/transfer.md has the offset
 * tables; this header is the code's side of them.
 *
 * OVERVIEW
 * One active-message id (FLX_TP_AM_ID) carries every message. Its UCX user header is one
 * flx_tp_hdr_t encoded in FLX_TP_HDR_BYTES little-endian bytes; its data is the payload. A
 * receiver parses the header with flx_tp_hdr_parse before anything else happens: every field is
 * checked (magic, version, length, the header's own XXH3 checksum, the kind, the flags, fields the
 * kind does not use being zero, ranges being non-empty, the payload length against the AM data
 * length and against the kind's shape), and a refusal names the field and its value. Only then does
 * the node look at the session (token, state, reservation: flx/transport.h).
 *
 *   kind        direction       payload
 *   HELLO       prefill -> node none: asks for the session's description
 *   WELCOME     node -> prefill flx_tp_welcome_t, FLX_TP_WELCOME_BYTES
 *   KV          prefill -> node bf16 K and V of (layer, kv heads, tokens) in GRANULE order
 *   STATS       prefill -> node the predictor's statistics of one layer (+ mean K + anchor q')
 *   COMMIT      prefill -> node none: first token and totals in the header
 *   HEARTBEAT   prefill -> node none: the sender is alive (no session)
 *   STATUS      node -> prefill the reason text: the session ended (READY, FAILED, CLOSED) or a
 *                               message was refused
 *
 * CHECKSUMS
 * header_xxh3 = XXH3-64 (seed 0) of the header's first 96 bytes: always present and always checked.
 * payload_xxh3 = XXH3-64 of the payload, present when flags has FLX_TP_FLAG_PAYLOAD_XXH3; the node
 * checks it after the bytes landed, before they count (docs/transfer.md has the measured cost and
 * why it is on by default).
 *
 * THREAD MODE
 * Pure functions over caller memory; thread-safe.
 */
#ifndef FLX_TP_WIRE_H
#define FLX_TP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "flx/kvstore.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_TP_AM_ID 0x46u            /* the one UCP active-message id */
#define FLX_TP_MAGIC 0x4B584C46u      /* "FLXK" in memory order */
#define FLX_TP_VERSION 1u
#define FLX_TP_HDR_BYTES 104u
#define FLX_TP_TOKEN_BYTES 16u
#define FLX_TP_WELCOME_BYTES 64u
#define FLX_TP_STATUS_MAX 160u        /* bytes of a STATUS reason */
#define FLX_TP_STATS_RECORD_BYTES 120u /* one flx_head_stats_t on the wire */
#define FLX_TP_MAX_Q_HEADS 4096u

typedef enum {
    FLX_TP_HELLO = 1,
    FLX_TP_WELCOME = 2,
    FLX_TP_KV = 3,
    FLX_TP_STATS = 4,
    FLX_TP_COMMIT = 5,
    FLX_TP_HEARTBEAT = 6,
    FLX_TP_STATUS = 7,
} flx_tp_kind_t;

const char *flx_tp_kind_name(uint32_t kind);

enum {
    FLX_TP_FLAG_PAYLOAD_XXH3 = 1u << 0,   /* payload_xxh3 holds the payload's XXH3-64 */
};

/* A header as the code sees it; docs/transfer.md says which fields each kind uses (the others are
 * zero on the wire, and parse refuses them otherwise). */
typedef struct flx_tp_hdr {
    uint32_t kind;             /* flx_tp_kind_t */
    uint32_t flags;            /* FLX_TP_FLAG_* */
    uint64_t sid;              /* session id (0 for HEARTBEAT) */
    uint8_t token[FLX_TP_TOKEN_BYTES];
    uint32_t layer;            /* KV, STATS */
    uint32_t head_begin, head_end; /* KV: kv heads [begin, end) */
    uint32_t tok_begin, tok_end;   /* KV: prompt positions [begin, end) */
    uint32_t arg0;             /* KV, STATS: head_dim; COMMIT: first token; STATUS: flx_kv_state_t */
    uint32_t arg1;             /* STATS: n_q_heads; COMMIT: statistics layers sent; STATUS: 1 when it
                                  answers a refused message (the state is then the session's or 0) */
    uint64_t value;            /* COMMIT: KV bytes sent */
    uint64_t payload_len;      /* bytes of the message's data */
    uint64_t payload_xxh3;     /* with FLX_TP_FLAG_PAYLOAD_XXH3 */
} flx_tp_hdr_t;

/* XXH3-64 (seed 0) of bytes: the one hash of the wire format. */
uint64_t flx_tp_hash(const void *data, size_t len);

/* Encodes h into out (FLX_TP_HDR_BYTES bytes), computing header_xxh3. Checks nothing: a test or a
 * fault-injecting sender may encode any header. */
void flx_tp_hdr_encode(const flx_tp_hdr_t *h, uint8_t out[FLX_TP_HDR_BYTES]);

/* Sets payload_len, and payload_xxh3 + FLX_TP_FLAG_PAYLOAD_XXH3 when with_hash, for payload. */
void flx_tp_hdr_set_payload(flx_tp_hdr_t *h, const void *payload, uint64_t len, int with_hash);

/* Parses and checks a header received with data_len bytes of data (the order above; the first
 * failed check is reported as FLX_ERR_FORMAT naming the field, or FLX_ERR_UNSUPPORTED for another
 * version). *h is written only on success. */
flx_status_t flx_tp_hdr_parse(const void *buf, size_t len, uint64_t data_len, flx_tp_hdr_t *h);

/* KV payload bytes of a header's ranges and head_dim (2 * heads * tokens * head_dim * 2); 0 when a
 * range is empty or the product overflows. */
uint64_t flx_tp_kv_bytes(const flx_tp_hdr_t *h);
/* STATS payload bytes for n_q_heads and head_dim: n_q_heads * (120 + 8 * head_dim). */
uint64_t flx_tp_stats_bytes(uint32_t n_q_heads, uint32_t head_dim);

/* The chunk a KV header describes (GRANULE order). */
flx_kv_chunk_t flx_tp_hdr_chunk(const flx_tp_hdr_t *h);

/* ---- WELCOME: what the node tells a prefill about a session ---- */

enum {
    FLX_TP_WELCOME_STATS = 1u << 0,       /* the session expects statistics for every layer */
    FLX_TP_WELCOME_CHECKSUM = 1u << 1,    /* KV and STATS payloads must carry payload_xxh3 */
};

typedef struct flx_tp_welcome {
    uint32_t n_layers, n_kv_heads, n_q_heads, head_dim;
    uint32_t prompt_len;
    uint32_t n_sink, n_local;  /* the session's window segments: host tokens are [n_sink, prompt_len - n_local) */
    uint32_t flags;            /* FLX_TP_WELCOME_* */
    uint32_t heartbeat_ms;     /* send something (HEARTBEAT at least) this often, or be taken for dead */
    uint64_t deadline_left_ns; /* time to READY left when sent; 0 = no deadline */
} flx_tp_welcome_t;

void flx_tp_welcome_encode(const flx_tp_welcome_t *w, uint8_t out[FLX_TP_WELCOME_BYTES]);
/* Checks every field (shape ranges, segments inside the prompt, known flags, zero reserved
 * bytes); FLX_ERR_FORMAT naming the field. */
flx_status_t flx_tp_welcome_parse(const void *buf, size_t len, flx_tp_welcome_t *w);

/* ---- STATS payload ---- */

/* Encodes the statistics of one layer: stats (Hq records), mean_k (Hq, D) f32, q_anchor (Hq, D) f32
 * into out (flx_tp_stats_bytes(Hq, D) bytes). */
void flx_tp_stats_encode(uint32_t n_q_heads, uint32_t head_dim, const flx_head_stats_t *stats, const float *mean_k,
                         const float *q_anchor, uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif
