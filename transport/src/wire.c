/*
 * wire.c - encoding and checking of the KV transfer wire format (flx/tp_wire.h, docs/transfer.md).
 *
 * DESIGN
 * Bytes are read and written through explicit offsets with memcpy, never by casting a received
 * buffer to a struct: the user header of an active message has no alignment promise, and the
 * offsets are the documented format, not whatever a compiler lays out. The format is little-endian
 * and so are the hosts this builds for (checked at compile time); a big-endian port would swap in
 * get/put only.
 *
 * Parsing checks the cheap things that say "this is not our protocol" first (length, magic,
 * version), then the header's checksum (so no later check reads a corrupted field), then each
 * field. Fields a kind does not use must be zero: a sender that fills them is broken or speaks
 * another version, and silently ignoring them would hide that.
 */
#include "flx/tp_wire.h"

#include <stdio.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "flx/cpu.h"

#include "flx/util.h"
#include "tp_hash.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian; port get/put");
_Static_assert(sizeof(flx_head_stats_t) == FLX_TP_STATS_RECORD_BYTES, "flx_head_stats_t is 30 32-bit fields");

enum {
    OFF_MAGIC = 0, OFF_VERSION = 4, OFF_KIND = 6, OFF_HLEN = 8, OFF_FLAGS = 12, OFF_SID = 16, OFF_TOKEN = 24,
    OFF_LAYER = 40, OFF_HB = 44, OFF_HE = 48, OFF_TB = 52, OFF_TE = 56, OFF_ARG0 = 60, OFF_ARG1 = 64,
    OFF_RSV = 68, OFF_VALUE = 72, OFF_PLEN = 80, OFF_PHASH = 88, OFF_HHASH = 96,
};
_Static_assert(OFF_HHASH + 8 == FLX_TP_HDR_BYTES, "header size");

static uint32_t get32(const uint8_t *p, size_t off)
{
    uint32_t v;
    memcpy(&v, p + off, 4);
    return v;
}
static uint16_t get16(const uint8_t *p, size_t off)
{
    uint16_t v;
    memcpy(&v, p + off, 2);
    return v;
}
static uint64_t get64(const uint8_t *p, size_t off)
{
    uint64_t v;
    memcpy(&v, p + off, 8);
    return v;
}
static void put32(uint8_t *p, size_t off, uint32_t v) { memcpy(p + off, &v, 4); }
static void put16(uint8_t *p, size_t off, uint16_t v) { memcpy(p + off, &v, 2); }
static void put64(uint8_t *p, size_t off, uint64_t v) { memcpy(p + off, &v, 8); }

const char *flx_tp_kind_name(uint32_t kind)
{
    static const char *n[] = {"?", "HELLO", "WELCOME", "KV", "STATS", "COMMIT", "HEARTBEAT", "STATUS"};
    return kind < FLX_ARRAY_SIZE(n) ? n[kind] : "?";
}

uint64_t flx_tp_hash(const void *data, size_t len)
{
    const flx_kv_iov_t one = {(void *)(uintptr_t)data, len};
    return tp_hash_iov(&one, 1);
}

uint64_t tp_hash_iov(const flx_kv_iov_t *iov, uint32_t n)
{
#if defined(__x86_64__)
    if (flx_isa_active() >= FLX_ISA_AVX2) return tp_hash_iov_avx2(iov, n);
#endif
    if (n == 1) return XXH3_64bits(iov[0].dst, iov[0].len);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < n; i++) XXH3_64bits_update(&st, iov[i].dst, iov[i].len);
    return XXH3_64bits_digest(&st);
}

void flx_tp_hdr_encode(const flx_tp_hdr_t *h, uint8_t out[FLX_TP_HDR_BYTES])
{
    memset(out, 0, FLX_TP_HDR_BYTES);
    put32(out, OFF_MAGIC, FLX_TP_MAGIC);
    put16(out, OFF_VERSION, FLX_TP_VERSION);
    put16(out, OFF_KIND, (uint16_t)h->kind);
    put32(out, OFF_HLEN, FLX_TP_HDR_BYTES);
    put32(out, OFF_FLAGS, h->flags);
    put64(out, OFF_SID, h->sid);
    memcpy(out + OFF_TOKEN, h->token, FLX_TP_TOKEN_BYTES);
    put32(out, OFF_LAYER, h->layer);
    put32(out, OFF_HB, h->head_begin);
    put32(out, OFF_HE, h->head_end);
    put32(out, OFF_TB, h->tok_begin);
    put32(out, OFF_TE, h->tok_end);
    put32(out, OFF_ARG0, h->arg0);
    put32(out, OFF_ARG1, h->arg1);
    put64(out, OFF_VALUE, h->value);
    put64(out, OFF_PLEN, h->payload_len);
    put64(out, OFF_PHASH, h->payload_xxh3);
    put64(out, OFF_HHASH, flx_tp_hash(out, OFF_HHASH));
}

void flx_tp_hdr_set_payload(flx_tp_hdr_t *h, const void *payload, uint64_t len, int with_hash)
{
    h->payload_len = len;
    if (with_hash) {
        h->flags |= FLX_TP_FLAG_PAYLOAD_XXH3;
        h->payload_xxh3 = flx_tp_hash(payload, len);
    } else {
        h->flags &= ~(uint32_t)FLX_TP_FLAG_PAYLOAD_XXH3;
        h->payload_xxh3 = 0;
    }
}

uint64_t flx_tp_kv_bytes(const flx_tp_hdr_t *h)
{
    if (h->head_end <= h->head_begin || h->tok_end <= h->tok_begin) return 0;
    uint64_t n = (uint64_t)(h->head_end - h->head_begin) * (h->tok_end - h->tok_begin), b;
    if (__builtin_mul_overflow(n, (uint64_t)h->arg0 * 4, &b)) return 0;
    return b;
}

uint64_t flx_tp_stats_bytes(uint32_t n_q_heads, uint32_t head_dim)
{
    return (uint64_t)n_q_heads * (FLX_TP_STATS_RECORD_BYTES + 8ull * head_dim);
}

flx_kv_chunk_t flx_tp_hdr_chunk(const flx_tp_hdr_t *h)
{
    return (flx_kv_chunk_t){.layer = h->layer, .head_begin = h->head_begin, .head_end = h->head_end,
                            .tok_begin = h->tok_begin, .tok_end = h->tok_end, .dtype = FLX_DT_BF16,
                            .head_dim = h->arg0, .order = FLX_KV_ORDER_GRANULE};
}

static int head_dim_ok(uint32_t d) { return d >= 16 && d <= 256 && d % 16 == 0; }

#define BAD(...) flx_error_set(FLX_ERR_FORMAT, "message header: " __VA_ARGS__)

/* Fields the kind does not use must be zero; names the first that is not. */
static flx_status_t unused_zero(const flx_tp_hdr_t *h, int ranges, int args, int value)
{
    const char *k = flx_tp_kind_name(h->kind);
    if (!ranges && (h->layer || h->head_begin || h->head_end || h->tok_begin || h->tok_end))
        return BAD("%s with layer %u heads [%u, %u) tokens [%u, %u): must be 0", k, h->layer, h->head_begin,
                   h->head_end, h->tok_begin, h->tok_end);
    if (args < 1 && h->arg0) return BAD("%s with arg0 %u: must be 0", k, h->arg0);
    if (args < 2 && h->arg1) return BAD("%s with arg1 %u: must be 0", k, h->arg1);
    if (!value && h->value) return BAD("%s with value %llu: must be 0", k, (unsigned long long)h->value);
    return FLX_OK;
}

flx_status_t flx_tp_hdr_parse(const void *buf, size_t len, uint64_t data_len, flx_tp_hdr_t *out)
{
    const uint8_t *p = buf;
    if (!buf || len != FLX_TP_HDR_BYTES) return BAD("length %zu, expected %u", len, FLX_TP_HDR_BYTES);
    if (get32(p, OFF_MAGIC) != FLX_TP_MAGIC) return BAD("magic 0x%08x, expected 0x%08x", get32(p, OFF_MAGIC), FLX_TP_MAGIC);
    if (get16(p, OFF_VERSION) != FLX_TP_VERSION)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "message header: version %u, this node speaks %u",
                             get16(p, OFF_VERSION), FLX_TP_VERSION);
    if (get32(p, OFF_HLEN) != FLX_TP_HDR_BYTES)
        return BAD("header_len %u, expected %u", get32(p, OFF_HLEN), FLX_TP_HDR_BYTES);
    uint64_t want = flx_tp_hash(p, OFF_HHASH);
    if (get64(p, OFF_HHASH) != want)
        return BAD("header_xxh3 0x%016llx, the header hashes to 0x%016llx (corrupted)",
                   (unsigned long long)get64(p, OFF_HHASH), (unsigned long long)want);
    flx_tp_hdr_t h;
    memset(&h, 0, sizeof h);
    h.kind = get16(p, OFF_KIND);
    h.flags = get32(p, OFF_FLAGS);
    h.sid = get64(p, OFF_SID);
    memcpy(h.token, p + OFF_TOKEN, FLX_TP_TOKEN_BYTES);
    h.layer = get32(p, OFF_LAYER);
    h.head_begin = get32(p, OFF_HB);
    h.head_end = get32(p, OFF_HE);
    h.tok_begin = get32(p, OFF_TB);
    h.tok_end = get32(p, OFF_TE);
    h.arg0 = get32(p, OFF_ARG0);
    h.arg1 = get32(p, OFF_ARG1);
    h.value = get64(p, OFF_VALUE);
    h.payload_len = get64(p, OFF_PLEN);
    h.payload_xxh3 = get64(p, OFF_PHASH);
    if (h.kind < FLX_TP_HELLO || h.kind > FLX_TP_STATUS) return BAD("kind %u unknown", h.kind);
    const char *k = flx_tp_kind_name(h.kind);
    if (h.flags & ~(uint32_t)FLX_TP_FLAG_PAYLOAD_XXH3) return BAD("%s with unknown flags 0x%x", k, h.flags);
    if (get32(p, OFF_RSV) != 0) return BAD("%s with reserved word 0x%x: must be 0", k, get32(p, OFF_RSV));
    if (h.payload_len != data_len)
        return BAD("%s says payload_len %llu, the message carries %llu bytes", k, (unsigned long long)h.payload_len,
                   (unsigned long long)data_len);
    if (!(h.flags & FLX_TP_FLAG_PAYLOAD_XXH3) && h.payload_xxh3)
        return BAD("%s with payload_xxh3 but no PAYLOAD_XXH3 flag", k);
    static const uint8_t zero_token[FLX_TP_TOKEN_BYTES];
    flx_status_t st;
    switch (h.kind) {
    case FLX_TP_HELLO:
    case FLX_TP_COMMIT:
        if (h.kind == FLX_TP_COMMIT && h.arg0 > INT32_MAX) return BAD("COMMIT first token %u is negative", h.arg0);
        if ((st = unused_zero(&h, 0, h.kind == FLX_TP_COMMIT ? 2 : 0, h.kind == FLX_TP_COMMIT)))
            return st;
        if (h.payload_len) return BAD("%s with a payload of %llu bytes: must be empty", k, (unsigned long long)h.payload_len);
        break;
    case FLX_TP_WELCOME:
        if ((st = unused_zero(&h, 0, 0, 0))) return st;
        if (h.payload_len != FLX_TP_WELCOME_BYTES)
            return BAD("WELCOME payload %llu bytes, expected %u", (unsigned long long)h.payload_len,
                       FLX_TP_WELCOME_BYTES);
        break;
    case FLX_TP_KV:
        if ((st = unused_zero(&h, 1, 1, 0))) return st;
        if (h.head_begin >= h.head_end) return BAD("KV kv heads [%u, %u) empty", h.head_begin, h.head_end);
        if (h.tok_begin >= h.tok_end) return BAD("KV tokens [%u, %u) empty", h.tok_begin, h.tok_end);
        if (!head_dim_ok(h.arg0)) return BAD("KV head_dim %u not a multiple of 16 in [16, 256]", h.arg0);
        if (!flx_tp_kv_bytes(&h)) /* 0 for a product past 2^64: no payload_len can carry it */
            return BAD("KV %u heads x %u tokens x head_dim %u overflow 64 bits", h.head_end - h.head_begin,
                       h.tok_end - h.tok_begin, h.arg0);
        if (flx_tp_kv_bytes(&h) != h.payload_len)
            return BAD("KV payload %llu bytes, its %u heads x %u tokens x head_dim %u need %llu",
                       (unsigned long long)h.payload_len, h.head_end - h.head_begin, h.tok_end - h.tok_begin, h.arg0,
                       (unsigned long long)flx_tp_kv_bytes(&h));
        break;
    case FLX_TP_STATS:
        if (h.head_begin || h.head_end || h.tok_begin || h.tok_end || h.value)
            return BAD("STATS with heads, tokens or value set: must be 0");
        if (!head_dim_ok(h.arg0)) return BAD("STATS head_dim %u not a multiple of 16 in [16, 256]", h.arg0);
        if (h.arg1 == 0 || h.arg1 > FLX_TP_MAX_Q_HEADS)
            return BAD("STATS n_q_heads %u outside [1, %u]", h.arg1, FLX_TP_MAX_Q_HEADS);
        if (flx_tp_stats_bytes(h.arg1, h.arg0) != h.payload_len)
            return BAD("STATS payload %llu bytes, %u heads of head_dim %u need %llu", (unsigned long long)h.payload_len,
                       h.arg1, h.arg0, (unsigned long long)flx_tp_stats_bytes(h.arg1, h.arg0));
        break;
    case FLX_TP_HEARTBEAT:
        if ((st = unused_zero(&h, 0, 0, 0))) return st;
        if (h.sid || memcmp(h.token, zero_token, FLX_TP_TOKEN_BYTES) || h.payload_len || h.flags)
            return BAD("HEARTBEAT with a session, token, flags or payload: must be empty");
        break;
    case FLX_TP_STATUS:
        if ((st = unused_zero(&h, 0, 2, 0))) return st;
        if (h.arg0 > FLX_KV_CLOSED) return BAD("STATUS state %u unknown", h.arg0);
        if (h.arg1 > 1) return BAD("STATUS refused %u: must be 0 or 1", h.arg1);
        if (h.payload_len > FLX_TP_STATUS_MAX)
            return BAD("STATUS reason of %llu bytes, at most %u", (unsigned long long)h.payload_len, FLX_TP_STATUS_MAX);
        break;
    }
    if (h.kind != FLX_TP_HEARTBEAT && h.sid == 0) return BAD("%s for session 0", k);
    if ((h.kind == FLX_TP_WELCOME || h.kind == FLX_TP_STATUS) && memcmp(h.token, zero_token, FLX_TP_TOKEN_BYTES))
        return BAD("%s carries a token: the node never sends one", k);
    if ((h.flags & FLX_TP_FLAG_PAYLOAD_XXH3) && h.kind != FLX_TP_KV && h.kind != FLX_TP_STATS)
        return BAD("%s with PAYLOAD_XXH3: only KV and STATS payloads are hashed", k);
    *out = h;
    return FLX_OK;
}

enum {
    W_LAYERS = 0, W_KV = 4, W_Q = 8, W_D = 12, W_L = 16, W_SINK = 20, W_LOCAL = 24, W_FLAGS = 28, W_HB = 32,
    W_RSV0 = 36, W_DEADLINE = 40, W_RSV1 = 48,
};

void flx_tp_welcome_encode(const flx_tp_welcome_t *w, uint8_t out[FLX_TP_WELCOME_BYTES])
{
    memset(out, 0, FLX_TP_WELCOME_BYTES);
    put32(out, W_LAYERS, w->n_layers);
    put32(out, W_KV, w->n_kv_heads);
    put32(out, W_Q, w->n_q_heads);
    put32(out, W_D, w->head_dim);
    put32(out, W_L, w->prompt_len);
    put32(out, W_SINK, w->n_sink);
    put32(out, W_LOCAL, w->n_local);
    put32(out, W_FLAGS, w->flags);
    put32(out, W_HB, w->heartbeat_ms);
    put64(out, W_DEADLINE, w->deadline_left_ns);
}

#define BADW(...) flx_error_set(FLX_ERR_FORMAT, "WELCOME: " __VA_ARGS__)

flx_status_t flx_tp_welcome_parse(const void *buf, size_t len, flx_tp_welcome_t *out)
{
    const uint8_t *p = buf;
    if (!buf || len != FLX_TP_WELCOME_BYTES) return BADW("length %zu, expected %u", len, FLX_TP_WELCOME_BYTES);
    flx_tp_welcome_t w = {.n_layers = get32(p, W_LAYERS), .n_kv_heads = get32(p, W_KV), .n_q_heads = get32(p, W_Q),
                          .head_dim = get32(p, W_D), .prompt_len = get32(p, W_L), .n_sink = get32(p, W_SINK),
                          .n_local = get32(p, W_LOCAL), .flags = get32(p, W_FLAGS), .heartbeat_ms = get32(p, W_HB),
                          .deadline_left_ns = get64(p, W_DEADLINE)};
    if (w.n_layers == 0 || w.n_layers > 1024) return BADW("n_layers %u outside [1, 1024]", w.n_layers);
    if (w.n_kv_heads == 0 || w.n_kv_heads > 1024) return BADW("n_kv_heads %u outside [1, 1024]", w.n_kv_heads);
    if (w.n_q_heads == 0 || w.n_q_heads > FLX_TP_MAX_Q_HEADS || w.n_q_heads % w.n_kv_heads)
        return BADW("n_q_heads %u not a multiple of n_kv_heads %u up to %u", w.n_q_heads, w.n_kv_heads,
                    FLX_TP_MAX_Q_HEADS);
    if (!head_dim_ok(w.head_dim)) return BADW("head_dim %u not a multiple of 16 in [16, 256]", w.head_dim);
    if (w.prompt_len == 0 || w.prompt_len > (1u << 30)) return BADW("prompt_len %u outside [1, 2^30]", w.prompt_len);
    if ((uint64_t)w.n_sink + w.n_local > w.prompt_len || (w.n_sink % 16 && w.n_sink != w.prompt_len))
        return BADW("sink %u + local %u tokens do not fit prompt_len %u on 16-token granules", w.n_sink, w.n_local,
                    w.prompt_len);
    if (w.flags & ~(uint32_t)(FLX_TP_WELCOME_STATS | FLX_TP_WELCOME_CHECKSUM)) return BADW("unknown flags 0x%x", w.flags);
    if (w.heartbeat_ms == 0 || w.heartbeat_ms > 3600000u) return BADW("heartbeat_ms %u outside [1, 3600000]", w.heartbeat_ms);
    if (get32(p, W_RSV0) || get64(p, W_RSV1) || get64(p, W_RSV1 + 8)) return BADW("reserved bytes not 0");
    *out = w;
    return FLX_OK;
}

void flx_tp_stats_encode(uint32_t hq, uint32_t d, const flx_head_stats_t *stats, const float *mean_k,
                         const float *q_anchor, uint8_t *out)
{
    memcpy(out, stats, (size_t)hq * FLX_TP_STATS_RECORD_BYTES);
    out += (size_t)hq * FLX_TP_STATS_RECORD_BYTES;
    memcpy(out, mean_k, (size_t)hq * d * sizeof(float));
    memcpy(out + (size_t)hq * d * sizeof(float), q_anchor, (size_t)hq * d * sizeof(float));
}
