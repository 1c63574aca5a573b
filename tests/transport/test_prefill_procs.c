/*
 * test_prefill_procs.c - the decode node (this process, through flx/transport.h) and real flx-prefill
 * processes pushing the synthetic workload over real UCX on loopback: argv[1] is the flx-prefill
 * binary, argv[2] a scratch directory, argv[3] shm or tcp.
 *   - a pushed session is READY and bit for bit what a local push of the same workload gives (KV,
 *     statistics, pyramid), with zero-copy receives for the host-resident parts; its prefill node
 *     leaving after READY counts as a connection that left, not one that failed, and UCX logs no
 *     error on either side;
 *   - three stubs pushing at once into one node all land right;
 *   - one stub pushing one prompt into several sessions in turn over one connection (--session and
 *     --token lists) lands it right in each, and refuses one opened for another length;
 *   - each fault ends as documented within its deadline, with a healthy session receiving at the
 *     same time unaffected, and the failed session's memory back in the pool: the stub dies
 *     (SIGKILL) mid-transfer, stalls (alive, heartbeating: the deadline ends it), is frozen (SIGSTOP:
 *     the node's liveness check ends it), corrupts a chunk after hashing it, sends a wrong token, a
 *     chunk outside the session, a chunk twice, a refused message and then freezing with chunks in
 *     flight, or stops in the middle of writing a message into the transport (the healthy session
 *     then starts: over shared memory it writes into a FIFO of its own, not behind the element the
 *     frozen peer claimed and never finished); a peer that died or fell silent counts as a failed
 *     connection; a READY session nobody claims is reclaimed at its lease;
 *   - flx-prefill's usage errors exit 2 and name the flag.
 */
#include <stdio.h>

#include "flx/features.h"
#include "flx/synth.h"
#include "proc_util.h"
#include "tp_testutil.h"

#define NL 3
#define HQ 8
#define HKV 2
#define D 64

static const char *tool, *dir, *tls;
static flx_tp_err_mode_t em;

static flx_kv_store_h new_store(void)
{
    return kv_make_store(NL, HKV, HQ, D, 64, 256, 192u << 20);
}

/* The same synthetic workload pushed locally (what flx-prefill computes, through the store's own
 * chunk and statistics writes): the reference of the transferred session. */
static flx_kv_session_id_t local_push(flx_kv_store_h s, uint32_t L, uint64_t seed)
{
    flx_synth_params_t sp;
    flx_synth_defaults(&sp, NL, HQ, HKV, D, L, 0, seed);
    flx_synth_t *syn;
    CHECK_OK(flx_synth_create(&sp, &syn));
    flx_bf16_t *k = malloc((size_t)HKV * L * D * 2), *v = malloc((size_t)HKV * L * D * 2);
    float q[HQ * D], mk[HQ * D], qa[HQ * D];
    flx_head_stats_t st[HQ];
    flx_kv_session_params_t pp = {.prompt_len = L, .max_new_tokens = 8};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(s, &pp, &sid));
    flx_kv_session_info_t info;
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    for (uint32_t l = 0; l < NL; l++) {
        CHECK_OK(flx_synth_layer(syn, l, k, v, q, NULL));
        flx_kv_chunk_t c = {.layer = l, .head_begin = 0, .head_end = HKV, .tok_begin = 0, .tok_end = L,
                            .dtype = FLX_DT_BF16, .head_dim = D, .order = FLX_KV_ORDER_SPLIT};
        CHECK_OK(flx_kv_chunk_write(s, sid, &c, k, v));
        flx_prefill_layer_t pl = {.n_q_heads = HQ, .n_kv_heads = HKV, .head_dim = D, .prompt_len = L,
                                  .sink = info.n_sink, .local = info.n_local, .k = k, .v = v, .tok_stride = L,
                                  .q_anchor = q, .tau = 0.1f};
        CHECK_OK(flx_prefill_stats(&pl, st, mk, qa));
        CHECK_OK(flx_kv_stats_write(s, sid, l, st, mk, qa));
    }
    CHECK(flx_kv_session_info(s, sid, &info) == FLX_OK && info.state == FLX_KV_READY);
    free(k);
    free(v);
    flx_synth_destroy(syn);
    return sid;
}

static proc_t push(const flx_tp_session_desc_t *d, const char *name, uint32_t L, uint64_t seed, const char *f1,
                   const char *f2)
{
    char log[600], lens[16], seeds[24];
    snprintf(log, sizeof log, "%s/%s-%s.log", dir, name, tls);
    snprintf(lens, sizeof lens, "%u", L);
    snprintf(seeds, sizeof seeds, "%llu", (unsigned long long)seed);
    return prefill_start(tool, log, d, em, "--synthetic", "--prompt-len", lens, "--seed", seeds, "--max-chunk-mib", "1",
                         "--progress-ms", "100000", f1, f2, (const char *)NULL);
}

/* Waits up to 10 s for the node's connections to be gone (their peers have exited); *ni as it was last. */
static void wait_conns_gone(flx_tp_node_h node, flx_tp_node_info_t *ni)
{
    for (int i = 0; i < 1000; i++) {
        flx_tp_node_info(node, ni);
        if (ni->n_conns == 0) return;
        usleep(10000);
    }
}

static void test_bitwise(void)
{
    flx_kv_store_h store = new_store(), ref = new_store();
    char node_out[600];
    snprintf(node_out, sizeof node_out, "%s/bitwise-%s-node-stdout.log", dir, tls);
    const int saved_stdout = flx_test_capture_begin(1, node_out);   /* UCX logs on stdout */
    flx_tp_node_h node = tp_test_node(store, em, 20000, 500);
    const uint32_t L = 64 + 16 * 50 + 256 + 7;
    flx_tp_session_desc_t d = tp_test_open(node, store, L, 1, 30000, 30000);
    proc_t p = push(&d, "bitwise", L, 7, NULL, NULL);
    int rc = proc_wait(&p, 60000);
    fprintf(stderr, "bitwise: flx-prefill -> %d\n%s", rc, proc_output(&p));
    CHECK(rc == 0 && strstr(proc_output(&p), "READY"));
    /* A prefill node that leaves after READY is not an error on either side: its connection is
     * reclaimed, and neither UCX says ERROR (closing towards a peer that is gone used to flush, and
     * each failed flush was logged on the closing side's stdout, in NONE mode on every session). */
    CHECK(!strstr(proc_output(&p), "UCX  ERROR"));
    flx_tp_node_info_t ni;
    wait_conns_gone(node, &ni);
    flx_test_capture_end(1, saved_stdout);
    CHECK(ni.n_conns == 0 && ni.conns_left == 1 && ni.conns_failed == 0);
    const char *ucx = flx_test_slurp(node_out);
    if (strstr(ucx, "UCX  ERROR")) fprintf(stderr, "bitwise: the node's UCX said:\n%s", ucx);
    CHECK(!strstr(ucx, "UCX  ERROR"));
    flx_tp_session_info_t info;
    CHECK_OK(flx_tp_session_wait(node, d.sid, 10000, &info));
    CHECK(info.kv.state == FLX_KV_READY && info.kv.first_token == 0 && info.receives_inflight == 0);
    CHECK(info.kv.t_first_byte_ns && info.t_last_data_ns >= info.kv.t_first_byte_ns &&
          info.kv.t_ready_ns >= info.kv.t_last_byte_ns);
    flx_kv_session_id_t want = local_push(ref, L, 7);
    uint32_t parts = tp_test_same_session(store, d.sid, ref, want);
    flx_tp_node_info(node, &ni);
    fprintf(stderr, "bitwise: %u (layer, head) parts equal; receives contig %llu iov %llu eager %llu\n", parts,
            (unsigned long long)ni.contig_receives, (unsigned long long)ni.iov_receives,
            (unsigned long long)ni.eager_receives);
    CHECK(ni.contig_receives >= NL && ni.iov_receives == 0);
    CHECK_OK(flx_tp_session_close(node, d.sid));
    flx_tp_node_destroy(node);
    flx_kv_store_destroy(store);
    flx_kv_store_destroy(ref);
}

static void test_concurrent(void)
{
    flx_kv_store_h store = new_store(), ref = new_store();
    flx_tp_node_h node = tp_test_node(store, em, 20000, 500);
    const uint32_t Ls[3] = {700, 1337, 2048};
    flx_tp_session_desc_t d[3];
    proc_t p[3];
    for (int i = 0; i < 3; i++) d[i] = tp_test_open(node, store, Ls[i], 1, 60000, 60000);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "conc%d", i);
        p[i] = push(&d[i], name, Ls[i], 100 + (uint64_t)i, NULL, NULL);
    }
    for (int i = 0; i < 3; i++) {
        int rc = proc_wait(&p[i], 120000);
        if (rc) fprintf(stderr, "concurrent %d: flx-prefill -> %d\n%s", i, rc, proc_output(&p[i]));
        CHECK(rc == 0);
    }
    for (int i = 0; i < 3; i++) {
        flx_tp_session_info_t info;
        CHECK_OK(flx_tp_session_wait(node, d[i].sid, 10000, &info));
        CHECK(info.kv.state == FLX_KV_READY);
        flx_kv_session_id_t want = local_push(ref, Ls[i], 100 + (uint64_t)i);
        tp_test_same_session(store, d[i].sid, ref, want);
        CHECK_OK(flx_kv_session_close(ref, want));
        CHECK_OK(flx_tp_session_close(node, d[i].sid));
    }
    fprintf(stderr, "concurrent: 3 stubs at once, all equal to their local pushes\n");
    flx_tp_node_destroy(node);
    flx_kv_store_destroy(store);
    flx_kv_store_destroy(ref);
}

/* One flx-prefill pushing one prompt into several sessions in turn over one connection (--session and
 * --token lists, --pregenerate): three of the prompt's length each READY and equal to the local push;
 * one opened for another length (second in the list) refused with the difference while the others go
 * on, and the exit status 1; one connection accepted. */
static void test_several(void)
{
    flx_kv_store_h store = new_store(), ref = new_store();
    flx_tp_node_h node = tp_test_node(store, em, 20000, 500);
    const uint32_t L = 64 + 16 * 30 + 256 + 3, Ls[4] = {L, L + 16, L, L};
    flx_tp_session_desc_t d[4];
    char sids[4 * 24], toks[4 * 33], node_s[FLX_TP_HOST_MAX + 8], log[600];
    size_t ns = 0, nt = 0;
    for (int i = 0; i < 4; i++) {
        d[i] = tp_test_open(node, store, Ls[i], 1, 60000, 60000);
        ns += (size_t)snprintf(sids + ns, sizeof sids - ns, "%s%#" PRIx64, i ? "," : "", d[i].sid);
        if (i) toks[nt++] = ',';
        for (uint32_t j = 0; j < FLX_TP_TOKEN_BYTES; j++) nt += (size_t)sprintf(toks + nt, "%02x", d[i].token[j]);
    }
    snprintf(node_s, sizeof node_s, "%s:%u", d[0].host, d[0].port);
    snprintf(log, sizeof log, "%s/several-%s.log", dir, tls);
    char *argv[] = {(char *)tool, "--node", node_s, "--session", sids, "--token", toks, "--err-mode",
                    em == FLX_TP_ERR_NONE ? "none" : "peer", "--synthetic", "--prompt-len", "803", "--seed", "11",
                    "--max-chunk-mib", "1", "--pregenerate", "--progress-ms", "100000", NULL};
    CHECK(L == 803);
    proc_t p = proc_start(log, argv);
    int rc = proc_wait(&p, 60000);
    const char *out = proc_output(&p);
    fprintf(stderr, "several: flx-prefill -> %d\n%s", rc, out);
    CHECK(rc == 1 && strstr(out, "819 tokens") && strstr(out, "not as session"));
    flx_kv_session_id_t want = local_push(ref, L, 11);
    for (int i = 0; i < 4; i++) {
        char line[64];
        snprintf(line, sizeof line, "READY %#" PRIx64 " ", d[i].sid);
        flx_tp_session_info_t info;
        if (i == 1) {
            CHECK(!strstr(out, line));
            CHECK_OK(flx_tp_session_info(node, d[i].sid, &info));
            CHECK(info.kv.state != FLX_KV_READY && info.kv.bytes_received == 0);
        } else {
            CHECK(strstr(out, line));
            CHECK_OK(flx_tp_session_wait(node, d[i].sid, 10000, &info));
            CHECK(info.kv.state == FLX_KV_READY);
            tp_test_same_session(store, d[i].sid, ref, want);
        }
        CHECK_OK(flx_tp_session_close(node, d[i].sid));
    }
    flx_tp_node_info_t ni;
    wait_conns_gone(node, &ni);
    /* the refused session heard that connection's HELLO and nothing more: the node fails it when the
     * stub leaves, and counts the connection as failed */
    CHECK(ni.conns_accepted == 1);
    fprintf(stderr, "several: one stub, one connection, 3 sessions equal to the local push, 1 refused\n");
    flx_tp_node_destroy(node);
    flx_kv_store_destroy(store);
    flx_kv_store_destroy(ref);
}

typedef struct fault {
    const char *name, *flag, *value;
    const char *reason;          /* a piece of the fail reason (alternatives separated by '|') */
    uint32_t timeout_ms;         /* the session's deadline */
} fault_t;

static int reason_matches(const char *reason, const char *alts)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", alts);
    for (char *save, *t = strtok_r(buf, "|", &save); t; t = strtok_r(NULL, "|", &save))
        if (strstr(reason, t)) return 1;
    return 0;
}

static void test_faults(void)
{
    const uint32_t L = 64 + 16 * 300 + 256; /* 300 host blocks per head: 20 chunks per layer at 1 MiB... */
    const uint64_t session_bytes = 4ull * NL * HKV * L * D;
    char half[32];
    snprintf(half, sizeof half, "%llu", (unsigned long long)(session_bytes / 2));
    const fault_t faults[] = {
        {"die", "--die-after-bytes", half, "peer|receive of", 20000},
        {"stall", "--stall-after-bytes", half, "deadline passed", 8000},
        {"corrupt", "--corrupt-chunk", "1", "payload_xxh3", 20000},
        {"wrongtoken", "--wrong-token", NULL, "refused", 20000},
        {"outside", "--outside-chunk", NULL, "invalid (prompt_len", 20000},
        /* a wrong token after layer 0's chunks, then stopped (SIGSTOP) by itself with them in flight:
         * the node drops the connection, and the receives that cannot end are cancelled once the
         * session has ended (a flushing close would wait on the frozen peer for ever) */
        {"refused-frozen", "--freeze-after-refused", NULL, "refused", 20000},
        {"duplicate", "--duplicate-chunk", "2", "overlaps data already sent", 20000},
        /* stopped (SIGSTOP) once bytes land: alive for the OS and for UCX, silent for the node */
        {"freeze", NULL, NULL, "silent", 20000},
        /* stopped by itself inside UCX's copy of a message into the node's shared-memory FIFO (shm
         * only); the healthy session starts once it is stopped */
        {"frozen-mid-send", "--freeze-mid-send", NULL, "silent", 20000},
    };
    for (size_t f = 0; f < FLX_ARRAY_SIZE(faults); f++) {
        const fault_t *ft = &faults[f];
        const int mid_send = !strcmp(ft->name, "frozen-mid-send");
        /* over TCP the kernel copies the payload (sendmsg): a bad page is EFAULT, not a fault the
         * process can stop in, and a half-sent message blocks no other connection's socket */
        if (mid_send && strcmp(tls, "shm")) continue;
        const int silent = !strcmp(ft->name, "freeze") || mid_send;
        flx_kv_store_h store = new_store(), ref = new_store();
        /* liveness 3 s where silence is the fault, else long enough that a loaded machine's scheduler
         * never makes a healthy peer look silent */
        flx_tp_node_h node = tp_test_node(store, em, silent ? 3000 : 20000, 500);
        /* A healthy session receiving at the same time. */
        flx_tp_session_desc_t good = tp_test_open(node, store, 1500, 1, 60000, 60000);
        flx_tp_session_desc_t bad = tp_test_open(node, store, L, 1, ft->timeout_ms, 60000);
        flx_tp_session_info_t info;
        CHECK_OK(flx_tp_session_info(node, good.sid, &info));
        const size_t good_bytes = info.kv.reserved_bytes;
        proc_t pg = {0};
        if (!mid_send) pg = push(&good, "good", 1500, 5, NULL, NULL);
        char name[32];
        snprintf(name, sizeof name, "fault-%s", ft->name);
        proc_t pb = push(&bad, name, L, 9, ft->flag, ft->value);
        const uint64_t t0 = flx_now_ns();
        if (!strcmp(ft->name, "freeze")) {
            for (int i = 0; i < 2000; i++) {
                CHECK_OK(flx_tp_session_info(node, bad.sid, &info));
                if (info.kv.bytes_received) break;
                usleep(1000);
            }
            CHECK(kill(pb.pid, SIGSTOP) == 0);
        }
        if (mid_send) {
            const int stopped = proc_wait_stopped(&pb, 20000);
            if (!stopped) fprintf(stderr, "fault %s: flx-prefill did not stop\n%s", ft->name, proc_output(&pb));
            CHECK(stopped);
            pg = push(&good, "good", 1500, 5, NULL, NULL);
        }
        flx_status_t st = flx_tp_session_wait(node, bad.sid, ft->timeout_ms + 5000, &info);
        const double ms = (double)(flx_now_ns() - t0) / 1e6;
        if (silent) kill(pb.pid, SIGKILL);
        /* stopped by itself: killed only once its memory is back (its death must not be what ends
         * the receives) */
        const int frozen = !strcmp(ft->name, "refused-frozen");
        int rc_bad = frozen ? -1 : proc_wait(&pb, 30000);
        fprintf(stderr, "fault %s (%s): %s after %.0f ms, reason '%s'; flx-prefill -> %d: %s", ft->name, tls,
                st ? flx_error_msg() : flx_kv_state_name(info.kv.state), ms, info.kv.fail_reason, rc_bad,
                proc_output(&pb));
        CHECK(st == FLX_OK && info.kv.state == FLX_KV_FAILED);
        CHECK(reason_matches(info.kv.fail_reason, ft->reason));
        /* within its deadline (plus what a loaded machine's scheduler may add to the node's sweep) */
        CHECK(info.kv.t_end_ns - info.kv.t_open_ns <= (uint64_t)ft->timeout_ms * 1000000 + 2000000000ull);
        /* a stub that was not killed hears the failure and exits 1 at once (the wrong token over
         * shared memory used to wait for its timeout: the node sent nothing on a dropped connection) */
        if (!strcmp(ft->name, "die") || silent || frozen) CHECK(rc_bad != 0);
        else CHECK(rc_bad == 1);
        if (!strcmp(ft->name, "wrongtoken")) CHECK(info.kv.bytes_received == 0); /* nothing touched memory */
        /* Its memory back in the pool once nothing is in flight into it (the grace period cancels
         * what UCX can cancel). Both conditions are waited for: the completion thread gives the
         * claim back (memory_held drops) a moment before it counts the receive done, and a test that
         * looked at the first alone failed now and then under load (seen with ctest -j2). */
        for (int i = 0; i < 2000; i++) { /* up to 20 s: a loaded machine is slow, a stuck receive never ends */
            CHECK_OK(flx_tp_session_info(node, bad.sid, &info));
            if (!info.kv.memory_held && !info.receives_inflight) break;
            usleep(10000);
        }
        if (info.kv.memory_held || info.receives_inflight) {
            flx_tp_node_info_t ni;
            flx_tp_node_info(node, &ni);
            fprintf(stderr, "fault %s: memory still held: %u receives, %u claims in flight into the session, %llu "
                            "receives in flight in the node, %u connections\n",
                    ft->name, info.receives_inflight, info.kv.claims_inflight,
                    (unsigned long long)ni.receives_inflight, ni.n_conns);
        }
        CHECK(!info.kv.memory_held && info.receives_inflight == 0);
        if (frozen) {
            kill(pb.pid, SIGKILL);
            proc_wait(&pb, 30000);
        }
        /* The healthy one: unaffected. */
        int rc_good = proc_wait(&pg, 60000);
        if (rc_good) fprintf(stderr, "good session's flx-prefill -> %d\n%s", rc_good, proc_output(&pg));
        CHECK(rc_good == 0);
        CHECK_OK(flx_tp_session_wait(node, good.sid, 10000, &info));
        CHECK(info.kv.state == FLX_KV_READY);
        flx_kv_session_id_t want = local_push(ref, 1500, 5);
        tp_test_same_session(store, good.sid, ref, want);
        /* Once both peers are gone: the healthy one left (READY, the normal end); a peer that died
         * or went silent was lost with its session, a failure */
        flx_tp_node_info_t ni;
        wait_conns_gone(node, &ni);
        fprintf(stderr, "fault %s: connections %u open, %llu left, %llu failed\n", ft->name, ni.n_conns,
                (unsigned long long)ni.conns_left, (unsigned long long)ni.conns_failed);
        if (ni.n_conns == 0) CHECK(ni.conns_left >= 1);
        if (!strcmp(ft->name, "die") || silent) CHECK(ni.conns_failed == 1);
        flx_kv_store_info_t si;
        flx_kv_store_info(store, &si);
        CHECK(si.used_bytes == good_bytes && si.pending_free_bytes == 0);
        CHECK_OK(flx_tp_session_close(node, bad.sid));
        CHECK_OK(flx_tp_session_close(node, good.sid));
        flx_tp_node_destroy(node);
        flx_kv_store_info(store, &si);
        CHECK(si.used_bytes == 0);
        flx_kv_store_destroy(store);
        flx_kv_store_destroy(ref);
    }
}

/* A READY session that no decode claims within its lease is reclaimed; one claimed in time is not. */
enum { LEASE_MS = 3000 };
static void test_lease(void)
{
    flx_kv_store_h store = new_store();
    flx_tp_node_h node = tp_test_node(store, em, 20000, 500);
    /* 3 s: long enough for a stub on a loaded machine (ASan, shared cores) to hear READY before the
     * reclaim; with 300 ms one heard FAILED instead and exited 1 */
    flx_tp_session_desc_t a = tp_test_open(node, store, 900, 0, 30000, LEASE_MS);
    flx_tp_session_desc_t b = tp_test_open(node, store, 900, 0, 30000, LEASE_MS);
    proc_t pa = push(&a, "lease-a", 900, 1, NULL, NULL), pb = push(&b, "lease-b", 900, 2, NULL, NULL);
    /* b is claimed as soon as its stub is done, before waiting for a's (a slow exit of a's stub must
     * not let b's lease run out too) */
    const int rc_b = proc_wait(&pb, 60000);
    if (rc_b) fprintf(stderr, "lease stub b -> %d\n%s", rc_b, proc_output(&pb));
    CHECK(rc_b == 0);
    flx_tp_session_info_t info;
    CHECK_OK(flx_tp_session_wait(node, b.sid, 10000, &info));
    CHECK(info.kv.state == FLX_KV_READY && info.kv.flags & FLX_KV_SESSION_NO_STATS);
    CHECK_OK(flx_kv_session_begin_decode(store, b.sid)); /* claimed: what flx_engine_add does */
    const int rc_a = proc_wait(&pa, 60000);
    if (rc_a) fprintf(stderr, "lease stub a -> %d\n%s", rc_a, proc_output(&pa));
    CHECK(rc_a == 0);
    for (int i = 0; i < 1000; i++) { /* the node's sweep runs at least every second */
        CHECK_OK(flx_tp_session_info(node, a.sid, &info));
        if (info.kv.state != FLX_KV_READY) break;
        usleep(10000);
    }
    fprintf(stderr, "lease: %s '%s' %.0f ms after READY\n", flx_kv_state_name(info.kv.state), info.kv.fail_reason,
            (double)(info.kv.t_end_ns - info.kv.t_ready_ns) / 1e6);
    CHECK(info.kv.state == FLX_KV_FAILED && strstr(info.kv.fail_reason, "lease") && !info.kv.memory_held);
    CHECK(info.kv.t_end_ns - info.kv.t_ready_ns >= LEASE_MS * 1000000ull); /* not before its lease */
    CHECK_OK(flx_tp_session_info(node, b.sid, &info));
    CHECK(info.kv.state == FLX_KV_DECODING);
    CHECK_OK(flx_tp_session_close(node, a.sid));
    CHECK_OK(flx_tp_session_close(node, b.sid));
    flx_tp_node_destroy(node);
    flx_kv_store_destroy(store);
}

static void test_usage(void)
{
    static const struct { const char *args, *needle; int rc; } cases[] = {
        {"--help", "usage", 0},
        {"--version", "flx-prefill", 0},
        {"--node 127.0.0.1:1 --session 1 --synthetic --prompt-len 5", "--token", 2},
        {"--node nohost --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5", "--node", 2},
        {"--node h:1 --session 0 --token 00000000000000000000000000000000 --synthetic --prompt-len 5", "--session", 2},
        {"--node h:1 --session 1 --token 0000 --synthetic --prompt-len 5", "--token", 2},
        {"--node h:1 --session 1,2 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 --pregenerate",
         "1 token(s) for 2 session(s)", 2},
        {"--node h:1 --session 1,2 --token 00000000000000000000000000000000,00000000000000000000000000000001 "
         "--synthetic --prompt-len 5", "need --pregenerate", 2},
        {"--node h:1 --session 1,2 --token 00000000000000000000000000000000,00000000000000000000000000000001 "
         "--synthetic --prompt-len 5 --pregenerate --corrupt-chunk 1", "fault flags take one session", 2},
        {"--node h:1 --session 1,1 --token 00000000000000000000000000000000,00000000000000000000000000000001 "
         "--synthetic --prompt-len 5 --pregenerate", "listed twice", 2},
        {"--node h:1 --session 1,,2 --token 00000000000000000000000000000000 --synthetic --prompt-len 5", "--session",
         2},
        {"--node h:1 --session 1 --token 00000000000000000000000000000000 --synthetic", "--prompt-len", 2},
        {"--node h:1 --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 --model m",
         "exclude each other", 2},
        {"--node h:1 --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 --prompt",
         "unknown option --prompt", 2},
        {"--node h:1 --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 --err-mode x",
         "--err-mode", 2},
        {"--node h:1 --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 --max-chunk-mib",
         "needs a value", 2},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        char cmd[4096], log[600];
        snprintf(log, sizeof log, "%s/usage-%s.log", dir, tls); /* the shm and tcp runs share dir */
        snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", tool, cases[i].args, log);
        int r = system(cmd);
        CHECK(r != -1 && WIFEXITED(r));
        proc_t p = {0};
        snprintf(p.log, sizeof p.log, "%s", log);
        const char *out = proc_output(&p);
        if (WEXITSTATUS(r) != cases[i].rc || !strstr(out, cases[i].needle))
            fprintf(stderr, "flx-prefill %s -> %d (want %d, '%s'):\n%s", cases[i].args, WEXITSTATUS(r), cases[i].rc,
                    cases[i].needle, out);
        CHECK(WEXITSTATUS(r) == cases[i].rc && strstr(out, cases[i].needle));
    }
    /* a node that is not there: exit 1 with the reason, within the timeout */
    char cmd[4096], log[600];
    snprintf(log, sizeof log, "%s/usage-%s.log", dir, tls); /* the shm and tcp runs share dir */
    snprintf(cmd, sizeof cmd,
             "%s --node 127.0.0.1:9 --session 1 --token 00000000000000000000000000000000 --synthetic --prompt-len 5 "
             "--timeout-ms 2000 --err-mode %s >%s 2>&1",
             tool, em == FLX_TP_ERR_NONE ? "none" : "peer", log);
    int r = system(cmd);
    proc_t p = {0};
    snprintf(p.log, sizeof p.log, "%s", log);
    fprintf(stderr, "no node -> %d: %s", WEXITSTATUS(r), proc_output(&p));
    CHECK(WIFEXITED(r) && WEXITSTATUS(r) == 1);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 4);
    tool = argv[1];
    dir = argv[2];
    tls = argv[3];
    em = tp_test_transport(tls);
    const char *only = argc > 4 ? argv[4] : NULL; /* run one part: usage, bitwise, concurrent, several, lease, faults */
#define PART(name)                                    \
    if (!only || !strcmp(only, #name)) test_##name()
    PART(usage);
    PART(bitwise);
    PART(concurrent);
    PART(several);
    PART(lease);
    PART(faults);
#undef PART
    printf("test_prefill_procs %s: ok\n", tls);
    return 0;
}
