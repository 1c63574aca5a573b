/*
 * fuzz_transport_header - one message of the KV transfer wire format (flx/tp_wire.h) made of the
 * fuzzer's bytes, through the node's message path without UCX, against a live store:
 * tp_core_ingest (the header parsed field by field, the session, the constant-time token compare,
 * the connection, the kind's checks, the store's claim against the reservation), the eager copy into
 * the claim's destinations as node.c does it, and tp_core_recv_done (payload hash, claim completion
 * with its pyramid builds, or the statistics write); then what a sender parses of a node's message
 * (flx_tp_hdr_parse, flx_tp_welcome_parse).
 *
 * Input: byte 0 is a mode: bit 0 writes the live session's id and token into the header, bit 1
 * recomputes the header's XXH3, bit 2 the payload's, bit 3 targets the session opened without
 * statistics (without the first three almost nothing would get past the first checks). Bytes
 * 1..104 are the header, the rest the payload.
 *
 * Properties (abort when broken): a message refused before its token matched changes no session; a
 * refused message never leaves a claim or a receive behind; whatever happened, closing the sessions
 * returns every byte to the pool (used and pending bytes 0) and the store's sessions to none.
 */
#include "fuzz_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/src/tp_core.h"
#include "flx/log.h"
#include "flx/transport.h"

enum { FZ_PATCH_SESSION = 1, FZ_HASH_HEADER = 2, FZ_HASH_PAYLOAD = 4, FZ_NO_STATS_SESSION = 8 };

/* Messages accepted, and data completions, so far: a driver can check its seeds go deep. */
static unsigned long fz_accepted, fz_landed;

/* The session shapes the seeds are written for (fuzz_transport_corpus in tests/transport). */
#define FZ_LAYERS 2
#define FZ_KV 2
#define FZ_Q 4
#define FZ_D 16
#define FZ_L_STATS 100
#define FZ_L_PLAIN 70

static flx_kv_store_h fz_store(void)
{
    static flx_kv_store_h s;
    if (!s) {
        flx_log_set_level(FLX_LOG_ERROR);
        flx_kv_store_params_t p = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                                 FLX_KV_STORE_FIELD_WINDOW | FLX_KV_STORE_FIELD_MAX_SESSIONS,
                                   .capacity_bytes = 8u << 20, .n_layers = FZ_LAYERS, .n_kv_heads = FZ_KV,
                                   .n_q_heads = FZ_Q, .head_dim = FZ_D, .sink = 16, .local = 32, .max_sessions = 4};
        FUZZ_CHECK(flx_kv_store_create(&p, &s) == FLX_OK);
    }
    return s;
}

static flx_tp_session_desc_t fz_open(tp_core_t *c, uint32_t L, int with_stats)
{
    flx_tp_open_params_t op = {.field_mask = FLX_TP_OPEN_FIELD_NO_STATS, .n_layers = FZ_LAYERS, .n_kv_heads = FZ_KV,
                               .n_q_heads = FZ_Q, .head_dim = FZ_D, .vocab = 1000, .prompt_len = L,
                               .max_new_tokens = 4, .with_stats = with_stats};
    flx_tp_session_desc_t d;
    FUZZ_CHECK(tp_core_open(c, &op, &d) == FLX_OK);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 + FLX_TP_HDR_BYTES) return 0;
    flx_kv_store_h store = fz_store();
    tp_core_t core;
    tp_core_params_t cp = {.store = store, .liveness_ms = 1000, .default_timeout_ms = 60000,
                           .default_lease_ms = 60000, .cancel_grace_ms = 1000, .require_hash = 1};
    FUZZ_CHECK(tp_core_init(&core, &cp) == FLX_OK);
    flx_tp_session_desc_t sess[2] = {fz_open(&core, FZ_L_STATS, 1), fz_open(&core, FZ_L_PLAIN, 0)};
    const int mode = data[0], which = (mode & FZ_NO_STATS_SESSION) ? 1 : 0;
    const uint8_t *payload = data + 1 + FLX_TP_HDR_BYTES;
    const size_t len = size - 1 - FLX_TP_HDR_BYTES;
    uint8_t hdr[FLX_TP_HDR_BYTES];
    memcpy(hdr, data + 1, FLX_TP_HDR_BYTES);
    if (mode & FZ_PATCH_SESSION) {
        memcpy(hdr + 16, &sess[which].sid, 8);                      /* session_id at offset 16 */
        memcpy(hdr + 24, sess[which].token, FLX_TP_TOKEN_BYTES);    /* token at offset 24 */
    }
    if (mode & FZ_HASH_PAYLOAD) {
        uint64_t h = flx_tp_hash(payload, len);
        memcpy(hdr + 88, &h, 8);                                    /* payload_xxh3 at offset 88 */
    }
    if (mode & FZ_HASH_HEADER) {
        uint64_t h = flx_tp_hash(hdr, 96);
        memcpy(hdr + 96, &h, 8);                                    /* header_xxh3 at offset 96 */
    }
    flx_kv_session_info_t before[2];
    for (int i = 0; i < 2; i++) FUZZ_CHECK(flx_kv_session_info(store, sess[i].sid, &before[i]) == FLX_OK);

    tp_recv_t *r = NULL;
    tp_reply_t reply;
    int drop = 0;
    flx_status_t st = tp_core_ingest(&core, 7, "fuzz:1", hdr, sizeof hdr, len, &r, &reply, &drop);
    if (st != FLX_OK) {
        FUZZ_CHECK(r == NULL);
        if (drop) /* refused before the token matched: no session changed */
            for (int i = 0; i < 2; i++) {
                flx_kv_session_info_t now;
                FUZZ_CHECK(flx_kv_session_info(store, sess[i].sid, &now) == FLX_OK);
                FUZZ_CHECK(now.state == before[i].state && now.bytes_received == before[i].bytes_received);
            }
    }
    fz_accepted += st == FLX_OK;
    if (r) { /* the eager path of node.c: the data lands in the destinations, then completes */
        const flx_kv_iov_t *iov;
        flx_kv_iov_t one;
        const uint32_t n = tp_recv_iov(r, &iov, &one);
        size_t off = 0;
        for (uint32_t i = 0; i < n; i++) {
            FUZZ_CHECK(off + iov[i].len <= len);
            memcpy(iov[i].dst, payload + off, iov[i].len);
            off += iov[i].len;
        }
        FUZZ_CHECK(off == len);
        r->status = FLX_OK;
        tp_core_recv_done(&core, r);
        fz_landed++;
    }
    for (int i = 0; i < 2; i++) {
        flx_tp_session_info_t info;
        FUZZ_CHECK(tp_core_info(&core, sess[i].sid, &info) == FLX_OK);
        FUZZ_CHECK(info.receives_inflight == 0 && info.kv.claims_inflight == 0);
        FUZZ_CHECK(tp_core_close(&core, sess[i].sid) == FLX_OK);
    }
    tp_core_fini(&core);
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    FUZZ_CHECK(si.used_bytes == 0 && si.pending_free_bytes == 0 && si.n_sessions == 0);

    /* What a sender parses of a node's message. */
    flx_tp_hdr_t h;
    if (flx_tp_hdr_parse(hdr, sizeof hdr, len, &h) == FLX_OK && h.kind == FLX_TP_WELCOME) {
        flx_tp_welcome_t w;
        /* the planner walks every chunk: keep to shapes a fuzz iteration can afford */
        if (flx_tp_welcome_parse(payload, len, &w) == FLX_OK && (uint64_t)w.prompt_len * w.n_kv_heads <= (1u << 20)) {
            FUZZ_CHECK(w.n_sink + w.n_local <= w.prompt_len && w.n_q_heads % w.n_kv_heads == 0);
            flx_tp_plan_chunk_t plan[64];
            uint32_t k = flx_tp_plan_layer(&w, 0, 1u << 20, plan, 64);
            uint64_t covered = 0;
            for (uint32_t i = 0; i < k && i < 64; i++) covered += flx_kv_chunk_bytes(&plan[i].chunk);
            if (k <= 64) FUZZ_CHECK(covered == 4ull * w.n_kv_heads * w.prompt_len * w.head_dim);
        }
    }
    return 0;
}
