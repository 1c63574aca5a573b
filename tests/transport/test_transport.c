/*
 * test_transport.c - the KV transfer in one process, over real UCX (argv[1]: shm or tcp): a node
 * and senders on their own UCX contexts. Wire format round trips and refusals, the chunk planner,
 * a whole session landing bit for bit (KV, statistics, pyramid) with contiguous zero-copy
 * receives, several senders at once, and every fault a peer can cause: wrong token, unknown
 * session, malformed header, chunk outside the reservation, duplicate, corrupted payload, bad
 * commit, deadline, lease; each ends as documented and the memory goes back to the pool.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "tp_testutil.h"
#include "../../transport/src/tp_core.h"
#include "../../transport/src/tp_hash.h"
#include "flx/cpu.h"

static flx_rng_t rng;
static flx_tp_err_mode_t em;

static void test_loop(void)
{
    const uint32_t NL = 3, HKV = 2, HQ = 4, D = 64, L = 64 + 16 * 37 + 256 + 9;
    flx_kv_store_h store = kv_make_store(NL, HKV, HQ, D, 64, 256, 64u << 20);
    flx_tp_node_h node = tp_test_node(store, em, 10000, 500);
    kv_prompt_t pr;
    kv_prompt_random(&pr, NL, HKV, D, L, &rng);
    flx_head_stats_t st[3 * 4];
    float mk[3 * 4 * 64], qa[3 * 4 * 64];
    kv_fill_stats(st, mk, qa, NL * HQ, D, &rng);
    flx_tp_session_desc_t d = tp_test_open(node, store, L, 1, 20000, 20000);
    flx_tp_sender_h s = tp_test_sender(&d, em);
    flx_tp_ref_t ref = tp_test_ref(&d);
    flx_tp_welcome_t w;
    CHECK_OK(flx_tp_sender_hello(s, &ref, &w));
    CHECK(w.prompt_len == L && w.n_sink == 64 && w.n_local == 256 && w.n_layers == NL && w.n_q_heads == HQ);
    tp_test_push(s, &ref, &w, &pr, 1u << 20, st, mk, qa, 42);
    flx_tp_session_info_t info;
    CHECK_OK(flx_tp_session_wait(node, d.sid, 20000, &info));
    fprintf(stderr, "loop: state %s, %llu bytes, reason '%s'\n", flx_kv_state_name(info.kv.state),
            (unsigned long long)info.kv.bytes_received, info.kv.fail_reason);
    CHECK(info.kv.state == FLX_KV_READY && info.kv.first_token == 42);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(store, d.sid, &sess));
    kv_check_placement(sess, &info.kv, &pr);
    flx_kv_session_release(sess);
    flx_kv_state_t state;
    char why[200];
    CHECK_OK(flx_tp_sender_status(s, d.sid, 5000, &state, why, sizeof why));
    CHECK(state == FLX_KV_READY);
    flx_tp_node_info_t ni;
    flx_tp_node_info(node, &ni);
    fprintf(stderr, "loop: contig %llu iov %llu eager %llu\n", (unsigned long long)ni.contig_receives,
            (unsigned long long)ni.iov_receives, (unsigned long long)ni.eager_receives);
    CHECK(ni.contig_receives >= NL * HKV && ni.iov_receives == 0); /* host parts zero-copy, window eager */
    CHECK_OK(flx_tp_session_close(node, d.sid));
    flx_tp_sender_destroy(s);
    flx_tp_node_destroy(node);
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    CHECK(si.used_bytes == 0);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(store);
}

/* Every header field is checked, and a refusal names it. */
static void test_wire(void)
{
    flx_tp_hdr_t h = {.kind = FLX_TP_KV, .sid = 0x100000001ull, .layer = 2, .head_begin = 1, .head_end = 3,
                      .tok_begin = 16, .tok_end = 40, .arg0 = 64};
    for (uint32_t i = 0; i < FLX_TP_TOKEN_BYTES; i++) h.token[i] = (uint8_t)(i * 7);
    uint8_t payload[2 * 2 * 24 * 64 * 2];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)i;
    flx_tp_hdr_set_payload(&h, payload, sizeof payload, 1);
    CHECK(h.payload_len == flx_tp_kv_bytes(&h));
    uint8_t b[FLX_TP_HDR_BYTES];
    flx_tp_hdr_encode(&h, b);
    flx_tp_hdr_t got;
    CHECK_OK(flx_tp_hdr_parse(b, sizeof b, sizeof payload, &got));
    CHECK(memcmp(&got, &h, sizeof h) == 0);
    /* one defect at a time: the field it names */
    struct { int off; uint32_t val; int rehash; const char *needle; flx_status_t st; } bad[] = {
        {0, 0x4b584c47, 0, "magic", FLX_ERR_FORMAT},
        {4, 2, 0, "version 2", FLX_ERR_UNSUPPORTED},
        {8, 96, 0, "header_len", FLX_ERR_FORMAT},
        {40, 3, 0, "header_xxh3", FLX_ERR_FORMAT},        /* a field changed, the hash not */
        {6, 9, 1, "kind 9", FLX_ERR_FORMAT},
        {12, 0x80, 1, "unknown flags", FLX_ERR_FORMAT},
        {68, 1, 1, "reserved", FLX_ERR_FORMAT},
        {48, 1, 1, "heads [1, 1) empty", FLX_ERR_FORMAT},
        {56, 16, 1, "tokens [16, 16) empty", FLX_ERR_FORMAT},
        {60, 24, 1, "head_dim 24", FLX_ERR_FORMAT},
        {64, 3, 1, "arg1 3", FLX_ERR_FORMAT},
        {80, 7, 1, "payload 7 bytes", FLX_ERR_FORMAT},
        {16, 0, 1, "session 0", FLX_ERR_FORMAT},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        uint8_t c[FLX_TP_HDR_BYTES];
        memcpy(c, b, sizeof c);
        if (bad[i].off == 4 || bad[i].off == 6) {
            uint16_t v = (uint16_t)bad[i].val;
            memcpy(c + bad[i].off, &v, 2);
        } else if (bad[i].off == 80 || bad[i].off == 16) {
            uint64_t v = bad[i].val;
            memcpy(c + bad[i].off, &v, 8);
        } else {
            memcpy(c + bad[i].off, &bad[i].val, 4);
        }
        if (bad[i].rehash) {
            uint64_t x = flx_tp_hash(c, 96);
            memcpy(c + 96, &x, 8);
        }
        CHECK_ST(flx_tp_hdr_parse(c, sizeof c, bad[i].off == 80 ? 7 : sizeof payload, &got), bad[i].st);
        if (!strstr(flx_error_msg(), bad[i].needle)) fprintf(stderr, "wire: '%s' lacks '%s'\n", flx_error_msg(), bad[i].needle);
        CHECK(strstr(flx_error_msg(), bad[i].needle));
    }
    CHECK_ST(flx_tp_hdr_parse(b, sizeof b - 1, sizeof payload, &got), FLX_ERR_FORMAT);
    CHECK_ST(flx_tp_hdr_parse(b, sizeof b, sizeof payload + 2, &got), FLX_ERR_FORMAT); /* AM data length */
    CHECK(strstr(flx_error_msg(), "carries"));
    /* a KV shape whose byte count passes 2^64, with no payload: the overflow is named */
    flx_tp_hdr_t o = {.kind = FLX_TP_KV, .sid = 5, .head_begin = 0, .head_end = 0xFFFFFFFFu, .tok_begin = 0,
                      .tok_end = 0xFFFFFFF0u, .arg0 = 16};
    flx_tp_hdr_encode(&o, b);
    CHECK_ST(flx_tp_hdr_parse(b, sizeof b, 0, &got), FLX_ERR_FORMAT);
    CHECK(strstr(flx_error_msg(), "overflow"));
    /* control kinds carry no payload hash, the node sends no token */
    flx_tp_hdr_t c = {.kind = FLX_TP_COMMIT, .sid = 5, .arg0 = 1, .payload_xxh3 = 9};
    flx_tp_hdr_encode(&c, b);
    CHECK_ST(flx_tp_hdr_parse(b, sizeof b, 0, &got), FLX_ERR_FORMAT);
    flx_tp_hdr_t st = {.kind = FLX_TP_STATUS, .sid = 5, .arg0 = FLX_KV_FAILED, .payload_len = 4};
    st.token[3] = 1;
    flx_tp_hdr_encode(&st, b);
    CHECK_ST(flx_tp_hdr_parse(b, sizeof b, 4, &got), FLX_ERR_FORMAT);
    CHECK(strstr(flx_error_msg(), "token"));
    /* WELCOME payload */
    flx_tp_welcome_t w = {.n_layers = 32, .n_kv_heads = 8, .n_q_heads = 32, .head_dim = 128, .prompt_len = 1000,
                          .n_sink = 64, .n_local = 256, .flags = FLX_TP_WELCOME_STATS, .heartbeat_ms = 500,
                          .deadline_left_ns = 5};
    uint8_t wb[FLX_TP_WELCOME_BYTES];
    flx_tp_welcome_encode(&w, wb);
    flx_tp_welcome_t w2;
    CHECK_OK(flx_tp_welcome_parse(wb, sizeof wb, &w2));
    CHECK(memcmp(&w, &w2, sizeof w) == 0);
    w.n_q_heads = 33;
    flx_tp_welcome_encode(&w, wb);
    CHECK_ST(flx_tp_welcome_parse(wb, sizeof wb, &w2), FLX_ERR_FORMAT);
    CHECK(strstr(flx_error_msg(), "n_q_heads 33"));
    fprintf(stderr, "wire: %zu refusals, each naming its field\n", FLX_ARRAY_SIZE(bad) + 5);
}

/* The planner covers every (head, token) of a layer exactly once, on 16-token granules, and its
 * rendezvous chunks are single contiguous destinations in a fresh store. */
/* The payload hash: the AVX2 kernel and the library agree on every length (XXH3 switches
 * algorithms at 16, 128 and 240 bytes and works in 1 KiB stripes) and however a payload is cut
 * into an IOV; the empty input gives XXH3's published value. */
static void test_hash(void)
{
    static const size_t lens[] = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096 + 7,
                                  (1u << 20) + 13, 16u << 20};
    const size_t cap = 16u << 20;
    uint8_t *buf = malloc(cap);
    CHECK(buf);
    for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)flx_rng_u64(&rng);
    const flx_isa_t best = flx_isa_best();
    CHECK(flx_tp_hash("", 0) == 0x2D06800538D394C2ull);
    for (size_t i = 0; i < FLX_ARRAY_SIZE(lens); i++) {
        const size_t n = lens[i];
        const uint64_t h_best = flx_tp_hash(buf, n);
        flx_isa_force(FLX_ISA_SCALAR);
        const uint64_t h_lib = flx_tp_hash(buf, n);
        flx_isa_force(best);
        if (h_best != h_lib) fprintf(stderr, "hash: %zu bytes: %016llx (%s) vs %016llx (library)\n", n,
                                     (unsigned long long)h_best, flx_isa_name(best), (unsigned long long)h_lib);
        CHECK(h_best == h_lib);
        /* the same bytes as an IOV of up to 5 pieces at random cuts */
        for (int t = 0; t < 3; t++) {
            flx_kv_iov_t iov[5];
            uint32_t k = 0;
            size_t off = 0;
            while (off < n && k < 4) {
                const size_t len = 1 + flx_rng_u64(&rng) % (n - off);
                iov[k++] = (flx_kv_iov_t){buf + off, len};
                off += len;
            }
            if (off < n || k == 0) iov[k++] = (flx_kv_iov_t){buf + off, n - off};
            CHECK(tp_hash_iov(iov, k) == h_best);
            flx_isa_force(FLX_ISA_SCALAR);
            CHECK(tp_hash_iov(iov, k) == h_best);
            flx_isa_force(best);
        }
    }
    free(buf);
}

static void test_plan(void)
{
    const uint32_t Ls[] = {1, 15, 64, 100, 320, 321, 336, 999, 1024 + 320, 5000};
    const uint64_t maxes[] = {1u << 10, 1u << 14, 1u << 30};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(Ls); i++)
        for (size_t j = 0; j < FLX_ARRAY_SIZE(maxes); j++) {
            const uint32_t L = Ls[i], H = 3;
            flx_kv_store_h s = kv_make_store(1, H, H, 64, 64, 256, 64u << 20);
            flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
            flx_kv_session_id_t sid;
            CHECK_OK(flx_kv_session_open(s, &sp, &sid));
            flx_kv_session_info_t ki;
            CHECK_OK(flx_kv_session_info(s, sid, &ki));
            flx_tp_welcome_t w = {.n_layers = 1, .n_kv_heads = H, .n_q_heads = H, .head_dim = 64, .prompt_len = L,
                                  .n_sink = ki.n_sink, .n_local = ki.n_local, .heartbeat_ms = 1};
            flx_tp_plan_chunk_t plan[4096];
            uint32_t n = flx_tp_plan_layer(&w, 0, maxes[j], plan, 4096);
            CHECK(n <= 4096 && n == flx_tp_plan_layer(&w, 0, maxes[j], NULL, 0));
            for (uint32_t k = 0; k < n; k++) {
                flx_kv_claim_t *cl;
                CHECK_OK(flx_kv_chunk_claim(s, sid, &plan[k].chunk, &cl)); /* overlaps would be refused */
                if (plan[k].send_flags & FLX_TP_SEND_RNDV) CHECK(cl->n_iov == 1);
                CHECK(flx_kv_chunk_bytes(&plan[k].chunk) <= FLX_MAX(maxes[j], 4ull * 16 * 64 * H + 4ull * 320 * 64 * H));
                CHECK_OK(flx_kv_chunk_complete(s, cl, 1));
            }
            CHECK_OK(flx_kv_session_info(s, sid, &ki));
            CHECK(ki.state == FLX_KV_READY && ki.bytes_received == ki.bytes_expected); /* all of it, once */
            CHECK_OK(flx_kv_session_close(s, sid));
            flx_kv_store_destroy(s);
        }
    fprintf(stderr, "plan: every granule once, rendezvous chunks contiguous\n");
}

/* A peer without the token cannot touch a session another peer is feeding; a chunk without a hash
 * fails its session when the node requires hashes; a node shutting down fails what it receives. */
static void test_hostile(void)
{
    const uint32_t NL = 2, HKV = 2, HQ = 2, D = 64, L = 700;
    flx_kv_store_h store = kv_make_store(NL, HKV, HQ, D, 64, 256, 64u << 20);
    flx_tp_node_h node = tp_test_node(store, em, 10000, 500);
    kv_prompt_t pr;
    kv_prompt_random(&pr, NL, HKV, D, L, &rng);
    flx_tp_session_desc_t d = tp_test_open(node, store, L, 0, 20000, 20000);
    flx_tp_sender_h good = tp_test_sender(&d, em), evil = tp_test_sender(&d, em);
    flx_tp_ref_t ref = tp_test_ref(&d), wrong = ref;
    wrong.token[5] ^= 1;
    flx_tp_welcome_t w;
    CHECK_OK(flx_tp_sender_hello(good, &ref, &w));
    CHECK_ST(flx_tp_sender_hello(evil, &wrong, &w), FLX_ERR_STATE); /* refused, named */
    CHECK(strstr(flx_error_msg(), "wrong token"));
    flx_kv_chunk_t c = {.layer = 0, .head_begin = 0, .head_end = 1, .tok_begin = 64, .tok_end = 128,
                        .dtype = FLX_DT_BF16, .head_dim = D, .order = FLX_KV_ORDER_GRANULE};
    flx_bf16_t *junk = calloc(1, flx_kv_chunk_bytes(&c));
    flx_tp_send_kv(evil, &wrong, &c, junk, FLX_TP_SEND_RNDV, NULL, NULL);
    flx_tp_sender_flush(evil, 5000);
    flx_tp_session_info_t info;
    CHECK_OK(flx_tp_session_info(node, d.sid, &info));
    CHECK(info.kv.state == FLX_KV_RESERVED && info.kv.bytes_received == 0 && info.msgs_refused >= 1);
    fprintf(stderr, "hostile: refused '%s'\n", info.last_refusal);
    tp_test_push(good, &ref, &w, &pr, 1u << 20, NULL, NULL, NULL, 3);
    CHECK_OK(flx_tp_session_wait(node, d.sid, 20000, &info));
    CHECK(info.kv.state == FLX_KV_READY);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(store, d.sid, &sess));
    kv_check_placement(sess, &info.kv, &pr);
    flx_kv_session_release(sess);
    CHECK_OK(flx_tp_session_close(node, d.sid));
    /* no payload hash: the node requires them */
    d = tp_test_open(node, store, L, 0, 20000, 20000);
    ref = tp_test_ref(&d);
    CHECK_OK(flx_tp_sender_hello(good, &ref, &w));
    CHECK(w.flags & FLX_TP_WELCOME_CHECKSUM);
    CHECK_OK(flx_tp_send_kv(good, &ref, &c, junk, FLX_TP_SEND_EAGER | FLX_TP_SEND_NO_HASH, NULL, NULL));
    CHECK_OK(flx_tp_session_wait(node, d.sid, 20000, &info));
    CHECK(info.kv.state == FLX_KV_FAILED && strstr(info.kv.fail_reason, "payload_xxh3"));
    flx_kv_state_t state;
    char why[200];
    CHECK_OK(flx_tp_sender_status(good, d.sid, 5000, &state, why, sizeof why));
    CHECK(state == FLX_KV_FAILED && strstr(why, "payload_xxh3"));
    CHECK_OK(flx_tp_session_close(node, d.sid));
    /* a producer's hash that is not the bytes' fails the session the same way */
    d = tp_test_open(node, store, L, 0, 20000, 20000);
    ref = tp_test_ref(&d);
    CHECK_OK(flx_tp_sender_hello(good, &ref, &w));
    CHECK_ST(flx_tp_send_kv_hashed(good, &ref, &c, junk, 0, FLX_TP_SEND_RNDV | FLX_TP_SEND_NO_HASH, NULL, NULL),
             FLX_ERR_INVALID);
    const uint64_t junk_hash = flx_tp_hash(junk, flx_kv_chunk_bytes(&c));
    CHECK_OK(flx_tp_send_kv_hashed(good, &ref, &c, junk, junk_hash ^ 1, FLX_TP_SEND_RNDV, NULL, NULL));
    CHECK_OK(flx_tp_session_wait(node, d.sid, 20000, &info));
    CHECK(info.kv.state == FLX_KV_FAILED && strstr(info.kv.fail_reason, "payload_xxh3"));
    CHECK_OK(flx_tp_session_close(node, d.sid));
    /* shutdown: a session half received fails with the reason, its memory back */
    d = tp_test_open(node, store, L, 0, 20000, 20000);
    ref = tp_test_ref(&d);
    CHECK_OK(flx_tp_sender_hello(good, &ref, &w));
    flx_bf16_t *p = kv_granule_payload(&pr, 0, 0, 1, 64, 128);
    CHECK_OK(flx_tp_send_kv(good, &ref, &c, p, FLX_TP_SEND_RNDV, NULL, NULL));
    CHECK_OK(flx_tp_sender_flush(good, 5000));
    flx_tp_node_destroy(node);
    flx_kv_session_info_t ki;
    CHECK_OK(flx_kv_session_info(store, d.sid, &ki));
    CHECK(ki.state == FLX_KV_FAILED && strstr(ki.fail_reason, "shutting down") && !ki.memory_held);
    CHECK_OK(flx_kv_session_close(store, d.sid));
    flx_tp_sender_destroy(good);
    flx_tp_sender_destroy(evil);
    free(p);
    free(junk);
    kv_prompt_free(&pr);
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    CHECK(si.used_bytes == 0);
    flx_kv_store_destroy(store);
}

/* A rendezvous chunk whose destination is not one range (window and host rows of several heads)
 * lands through an IOV receive, straight into its places. */
static void test_iov(void)
{
    const uint32_t NL = 2, HKV = 2, HQ = 2, D = 64, L = 64 + 16 * 20 + 256 + 5;
    flx_kv_store_h store = kv_make_store(NL, HKV, HQ, D, 64, 256, 64u << 20);
    flx_tp_node_h node = tp_test_node(store, em, 10000, 500);
    kv_prompt_t pr;
    kv_prompt_random(&pr, NL, HKV, D, L, &rng);
    flx_tp_session_desc_t d = tp_test_open(node, store, L, 0, 20000, 20000);
    flx_tp_sender_h s = tp_test_sender(&d, em);
    flx_tp_ref_t ref = tp_test_ref(&d);
    flx_tp_welcome_t w;
    CHECK_OK(flx_tp_sender_hello(s, &ref, &w));
    void *bufs[2];
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < NL; l++) {
        flx_kv_chunk_t c = {.layer = l, .head_begin = 0, .head_end = HKV, .tok_begin = 0, .tok_end = L,
                            .dtype = FLX_DT_BF16, .head_dim = D, .order = FLX_KV_ORDER_GRANULE};
        bufs[l] = kv_granule_payload(&pr, l, 0, HKV, 0, L);
        if (l == 0) { /* hashed here, and by the producer */
            CHECK_OK(flx_tp_send_kv(s, &ref, &c, bufs[l], FLX_TP_SEND_RNDV, NULL, NULL));
        } else {
            const uint64_t h = flx_tp_hash(bufs[l], flx_kv_chunk_bytes(&c));
            CHECK_OK(flx_tp_send_kv_hashed(s, &ref, &c, bufs[l], h, FLX_TP_SEND_RNDV, NULL, NULL));
        }
        bytes += flx_kv_chunk_bytes(&c);
    }
    flx_kv_commit_t cm = {.first_token = 1, .kv_bytes = bytes};
    CHECK_OK(flx_tp_send_commit(s, &ref, &cm));
    CHECK_OK(flx_tp_sender_flush(s, 20000));
    flx_tp_session_info_t info;
    CHECK_OK(flx_tp_session_wait(node, d.sid, 20000, &info));
    CHECK(info.kv.state == FLX_KV_READY);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(store, d.sid, &sess));
    kv_check_placement(sess, &info.kv, &pr);
    flx_kv_session_release(sess);
    flx_tp_node_info_t ni;
    flx_tp_node_info(node, &ni);
    fprintf(stderr, "iov: %llu IOV rendezvous receives, placement right\n", (unsigned long long)ni.iov_receives);
    CHECK(ni.iov_receives == NL && ni.contig_receives == 0);
    CHECK_OK(flx_tp_session_close(node, d.sid));
    flx_tp_sender_destroy(s);
    flx_tp_node_destroy(node);
    for (uint32_t l = 0; l < NL; l++) free(bufs[l]);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(store);
}

/* More sessions end between two passes of the node's loop than one call of tp_core_notices returns
 * (40 sessions, each fed by its own connection, failed at once; then all closed at once): every
 * sender hears its session's end, once, over as many calls as it takes, and the closed records go. */
static void test_notices(void)
{
    enum { NS = 40 };
    flx_kv_store_h store = kv_make_store(1, 1, 1, 16, 16, 16, 16u << 20);
    tp_core_t core;
    tp_core_params_t cp = {.store = store, .liveness_ms = 10000, .default_timeout_ms = 60000,
                           .default_lease_ms = 60000, .cancel_grace_ms = 500};
    CHECK_OK(tp_core_init(&core, &cp));
    flx_tp_session_desc_t d[NS];
    for (uint32_t i = 0; i < NS; i++) {
        flx_tp_open_params_t op = {.n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1, .head_dim = 16, .vocab = 1000,
                                   .prompt_len = 100, .max_new_tokens = 8};
        CHECK_OK(tp_core_open(&core, &op, &d[i]));
        flx_tp_hdr_t h = {.kind = FLX_TP_HELLO, .sid = d[i].sid};
        memcpy(h.token, d[i].token, FLX_TP_TOKEN_BYTES);
        uint8_t hdr[FLX_TP_HDR_BYTES];
        flx_tp_hdr_encode(&h, hdr);
        tp_recv_t *r = NULL;
        tp_reply_t reply;
        int drop = 0;
        CHECK_OK(tp_core_ingest(&core, 100 + i, "peer", hdr, sizeof hdr, 0, &r, &reply, &drop));
        CHECK(!r && !drop && reply.kind == FLX_TP_WELCOME);
    }
    for (int round = 0; round < 2; round++) {
        const flx_kv_state_t want = round ? FLX_KV_CLOSED : FLX_KV_FAILED;
        if (round) {
            for (uint32_t i = 0; i < NS; i++) CHECK_OK(tp_core_close(&core, d[i].sid));
        } else {
            tp_core_fail_all(&core, "test: failed at once");
        }
        uint32_t heard[NS] = {0}, calls = 0, k;
        tp_notice_t no[32];
        while ((k = tp_core_notices(&core, no, 32)) > 0) {
            calls++;
            for (uint32_t j = 0; j < k; j++) {
                CHECK(no[j].reply.state == (uint32_t)want && no[j].n_conns == 1);
                const uint64_t i = no[j].conns[0] - 100;
                CHECK(i < NS && no[j].reply.sid == d[i].sid);
                heard[i]++;
            }
            if (k < 32) break;
        }
        for (uint32_t i = 0; i < NS; i++) CHECK(heard[i] == 1);
        fprintf(stderr, "notices: %u sessions %s, every sender told once, in %u calls\n", NS,
                flx_kv_state_name(want), calls);
        CHECK(calls == 2);
    }
    CHECK(core.map_n == 0);   /* every closed record whose end was told is gone */
    tp_core_fini(&core);
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    CHECK(si.used_bytes == 0);
    flx_kv_store_destroy(store);
}

static void count_done(void *ctx, flx_status_t st)
{
    (void)st;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

/* The typed sends refuse at once, queuing nothing and never running done, once they cannot help
 * their session: FLX_ERR_STATE with the node's reason once it said the session FAILED (another
 * session on the same connection sends on), FLX_ERR_IO with the connection's error once it failed. */
static void test_send_refused(void)
{
    const uint32_t D = 64, L = 400;
    flx_kv_store_h store = kv_make_store(1, 1, 1, D, 64, 256, 16u << 20);
    flx_tp_node_h node = tp_test_node(store, em, 10000, 500);
    flx_tp_session_desc_t a = tp_test_open(node, store, L, 0, 20000, 20000);
    flx_tp_session_desc_t b = tp_test_open(node, store, L, 0, 20000, 20000);
    flx_tp_sender_h s = tp_test_sender(&a, em);
    flx_tp_ref_t ra = tp_test_ref(&a), rb = tp_test_ref(&b);
    flx_tp_welcome_t w;
    CHECK_OK(flx_tp_sender_hello(s, &ra, &w));
    CHECK_OK(flx_tp_sender_hello(s, &rb, &w));
    CHECK_OK(flx_tp_session_fail(node, a.sid, "test: failed by its owner"));
    flx_kv_state_t state;
    char why[FLX_TP_STATUS_MAX + 1];
    CHECK_OK(flx_tp_sender_status(s, a.sid, 10000, &state, why, sizeof why));
    CHECK(state == FLX_KV_FAILED);
    flx_kv_chunk_t c = {.layer = 0, .head_begin = 0, .head_end = 1, .tok_begin = 64, .tok_end = 128,
                        .dtype = FLX_DT_BF16, .head_dim = D, .order = FLX_KV_ORDER_GRANULE};
    flx_bf16_t *payload = calloc(1, flx_kv_chunk_bytes(&c));
    flx_head_stats_t hs = {0};
    float v[64] = {0};
    const flx_kv_commit_t cm = {.first_token = 1};
    atomic_int calls = 0;
    CHECK_ST(flx_tp_send_kv(s, &ra, &c, payload, 0, count_done, &calls), FLX_ERR_STATE);
    CHECK(strstr(flx_error_msg(), "is FAILED: test: failed by its owner"));
    CHECK_ST(flx_tp_send_stats(s, &ra, 0, 1, D, &hs, v, v, 0), FLX_ERR_STATE);
    CHECK_ST(flx_tp_send_commit(s, &ra, &cm), FLX_ERR_STATE);
    CHECK_OK(flx_tp_send_kv(s, &rb, &c, payload, 0, count_done, &calls));
    CHECK_OK(flx_tp_sender_flush(s, 10000));
    flx_tp_session_info_t info;
    for (int i = 0; i < 1000; i++) { /* done runs just after the flush sees the send complete; the node
                                        counts the bytes once its completion thread has them */
        CHECK_OK(flx_tp_session_info(node, b.sid, &info));
        if (atomic_load(&calls) == 1 && info.kv.bytes_received == flx_kv_chunk_bytes(&c)) break;
        usleep(10000);
    }
    CHECK(atomic_load(&calls) == 1);
    CHECK(info.kv.state == FLX_KV_RECEIVING && info.kv.bytes_received == flx_kv_chunk_bytes(&c));
    /* the node gone: its connection fails (UCX reports it over TCP, and over shared memory through the
     * connection's TCP side) */
    flx_tp_node_destroy(node);
    flx_tp_sender_info_t si;
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        flx_tp_sender_info(s, &si);
        if (si.peer_failed) break;
        usleep(10000);
    }
    fprintf(stderr, "send refused: '%s'; after the node went: peer_failed %d '%s'\n", why, si.peer_failed, si.error);
    CHECK(si.peer_failed);
    CHECK_ST(flx_tp_send_kv(s, &rb, &c, payload, 0, count_done, &calls), FLX_ERR_IO);
    CHECK(strstr(flx_error_msg(), si.error));
    CHECK_ST(flx_tp_send_commit(s, &rb, &cm), FLX_ERR_IO);
    flx_tp_sender_destroy(s);
    CHECK(atomic_load(&calls) == 1);
    free(payload);
    flx_kv_store_destroy(store);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 2);
    em = tp_test_transport(argv[1]);
    flx_rng_seed(&rng, flx_test_seed("test_transport"));
    test_wire();
    test_hash();
    test_plan();
    test_loop();
    test_iov();
    test_hostile();
    test_notices();
    test_send_refused();
    printf("test_transport %s: ok\n", argv[1]);
    return 0;
}
