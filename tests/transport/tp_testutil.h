/*
 * tp_testutil.h - helpers of the transport tests: the UCX transport a test runs over (its argv
 * names it), a node over a store, and a sender pushing a random prompt the way a prefill does.
 */
#ifndef TP_TESTUTIL_H
#define TP_TESTUTIL_H

#include <stdlib.h>
#include <string.h>

#include "../kvstore/kv_testutil.h"
#include "flx/transport.h"

/* "shm": shared-memory data (UCX_TLS=sm,tcp; tcp only for the listener's connection setup) with
 * error mode NONE, which UCX 1.13 shared memory needs; "tcp": loopback TCP with error mode PEER. */
static inline flx_tp_err_mode_t tp_test_transport(const char *which)
{
    if (!strcmp(which, "tcp")) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
        return FLX_TP_ERR_PEER;
    }
    CHECK(!strcmp(which, "shm"));
    setenv("UCX_TLS", "sm,tcp", 1);
    unsetenv("UCX_NET_DEVICES");
    return FLX_TP_ERR_NONE;
}

static inline flx_tp_node_h tp_test_node(flx_kv_store_h store, flx_tp_err_mode_t em, uint32_t liveness_ms,
                                         uint32_t grace_ms)
{
    flx_tp_node_params_t np = {.field_mask = FLX_TP_NODE_FIELD_ERR_MODE | FLX_TP_NODE_FIELD_LIVENESS |
                                             FLX_TP_NODE_FIELD_GRACE,
                               .store = store, .err_mode = em, .liveness_ms = liveness_ms, .cancel_grace_ms = grace_ms};
    flx_tp_node_h node;
    CHECK_OK(flx_tp_node_create(&np, &node));
    return node;
}

static inline flx_tp_session_desc_t tp_test_open(flx_tp_node_h node, flx_kv_store_h store, uint32_t L, int with_stats,
                                                 uint32_t timeout_ms, uint32_t lease_ms)
{
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    flx_tp_open_params_t op = {.field_mask = FLX_TP_OPEN_FIELD_NO_STATS | FLX_TP_OPEN_FIELD_TIMEOUT |
                                             FLX_TP_OPEN_FIELD_LEASE,
                               .n_layers = si.n_layers, .n_kv_heads = si.n_kv_heads, .n_q_heads = si.n_q_heads,
                               .head_dim = si.head_dim, .vocab = 1000, .prompt_len = L, .max_new_tokens = 8,
                               .with_stats = with_stats, .timeout_ms = timeout_ms, .lease_ms = lease_ms};
    flx_tp_session_desc_t d;
    CHECK_OK(flx_tp_session_open(node, &op, &d));
    return d;
}

static inline flx_tp_sender_h tp_test_sender(const flx_tp_session_desc_t *d, flx_tp_err_mode_t em)
{
    flx_tp_sender_params_t sp = {.field_mask = FLX_TP_SENDER_FIELD_ERR_MODE, .host = d->host, .port = d->port,
                                 .err_mode = em};
    flx_tp_sender_h s;
    CHECK_OK(flx_tp_sender_create(&sp, &s));
    return s;
}

/* Pushes every layer of pr as a prefill would (flx_tp_plan_layer chunks, statistics when the
 * session wants them, then the commit) and waits until every send completed. */
static inline void tp_test_push(flx_tp_sender_h s, const flx_tp_ref_t *ref, const flx_tp_welcome_t *w,
                                const kv_prompt_t *pr, uint64_t max_chunk, const flx_head_stats_t *st,
                                const float *mk, const float *qa, int32_t first_token)
{
    uint32_t n_buf = 0;
    void *bufs[4096];
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < w->n_layers; l++) {
        flx_tp_plan_chunk_t plan[256];
        uint32_t n = flx_tp_plan_layer(w, l, max_chunk, plan, 256);
        CHECK(n <= 256);
        for (uint32_t i = 0; i < n; i++) {
            const flx_kv_chunk_t *c = &plan[i].chunk;
            flx_bf16_t *p = kv_granule_payload(pr, l, c->head_begin, c->head_end, c->tok_begin, c->tok_end);
            CHECK(n_buf < 4096);
            bufs[n_buf++] = p;
            CHECK_OK(flx_tp_send_kv(s, ref, c, p, plan[i].send_flags, NULL, NULL));
            bytes += flx_kv_chunk_bytes(c);
        }
        if (st)
            CHECK_OK(flx_tp_send_stats(s, ref, l, w->n_q_heads, w->head_dim, st + (size_t)l * w->n_q_heads,
                                       mk + (size_t)l * w->n_q_heads * w->head_dim,
                                       qa + (size_t)l * w->n_q_heads * w->head_dim, 0));
    }
    flx_kv_commit_t cm = {.first_token = first_token, .n_stats_layers = st ? w->n_layers : 0, .kv_bytes = bytes};
    CHECK_OK(flx_tp_send_commit(s, ref, &cm));
    CHECK_OK(flx_tp_sender_flush(s, 30000));
    for (uint32_t i = 0; i < n_buf; i++) free(bufs[i]);
}

static inline flx_tp_ref_t tp_test_ref(const flx_tp_session_desc_t *d)
{
    flx_tp_ref_t r = {.sid = d->sid};
    memcpy(r.token, d->token, FLX_TP_TOKEN_BYTES);
    return r;
}

/* Two READY sessions hold the same bytes: every host row (K and V), window row, pyramid level and
 * statistics record of every layer and head. Returns the number of (layer, head) parts compared. */
static inline uint32_t tp_test_same_session(flx_kv_store_h sa, flx_kv_session_id_t a, flx_kv_store_h sb,
                                            flx_kv_session_id_t b)
{
    flx_kv_session_h xa, xb;
    CHECK_OK(flx_kv_session_acquire(sa, a, &xa));
    CHECK_OK(flx_kv_session_acquire(sb, b, &xb));
    flx_kv_session_shape_t ka, kb;
    CHECK_OK(flx_kv_session_shape(xa, &ka));
    CHECK_OK(flx_kv_session_shape(xb, &kb));
    CHECK(memcmp(&ka, &kb, sizeof ka) == 0);
    const size_t row = ka.head_dim * sizeof(flx_bf16_t);
    uint32_t parts = 0;
    for (uint32_t l = 0; l < ka.n_layers; l++) {
        for (uint32_t h = 0; h < ka.n_kv_heads; h++, parts++) {
            flx_kv_head_view_t va, vb;
            CHECK_OK(flx_kv_head_view(xa, l, h, &va));
            CHECK_OK(flx_kv_head_view(xb, l, h, &vb));
            CHECK(va.l_cpu == vb.l_cpu && va.n_win == vb.n_win);
            for (uint32_t i = 0; i < va.l_cpu; i++) {
                CHECK(memcmp(flx_kv_block_k(&va, i / 16) + (size_t)(i % 16) * ka.head_dim,
                             flx_kv_block_k(&vb, i / 16) + (size_t)(i % 16) * ka.head_dim, row) == 0);
                CHECK(memcmp(flx_kv_block_v(&va, i / 16) + (size_t)(i % 16) * ka.head_dim,
                             flx_kv_block_v(&vb, i / 16) + (size_t)(i % 16) * ka.head_dim, row) == 0);
            }
            CHECK(memcmp(va.win_k, vb.win_k, va.n_win * row) == 0);
            CHECK(memcmp(va.win_v, vb.win_v, va.n_win * row) == 0);
            for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
                CHECK(va.meta_n[j] == vb.meta_n[j]);
                CHECK(memcmp(va.meta[j], vb.meta[j], (size_t)va.meta_n[j] * 2 * row) == 0);
            }
        }
        for (uint32_t q = 0; q < ka.n_q_heads && ka.with_stats; q++) {
            const flx_head_stats_t *sa_, *sb_;
            const float *mka, *mkb, *qaa, *qab;
            CHECK_OK(flx_kv_head_stats(xa, l, q, &sa_, &mka, &qaa));
            CHECK_OK(flx_kv_head_stats(xb, l, q, &sb_, &mkb, &qab));
            CHECK(sa_ && sb_ && memcmp(sa_, sb_, sizeof *sa_) == 0);
            CHECK(memcmp(mka, mkb, ka.head_dim * sizeof(float)) == 0 && memcmp(qaa, qab, ka.head_dim * sizeof(float)) == 0);
        }
    }
    flx_kv_session_release(xa);
    flx_kv_session_release(xb);
    return parts;
}

#endif
