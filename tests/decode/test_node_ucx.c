/*
 * test_node_ucx - fluxion-decoded in its product mode (--prefill ucx) end to end: a real daemon
 * process; flx-prefill processes that open their sessions over gRPC as a router would (--control)
 * and push the KV over real UCX on loopback (TCP, UCX's peer-failure detection); Generate over gRPC
 * with the C client (flx/rpc.h + protobuf-c) and with Debian's python3-grpcio.
 *
 *   test_node_ucx DAEMON PREFILL DIR PYCLIENT                 a random model (2 layers), synthetic KV
 *   test_node_ucx DAEMON PREFILL DIR PYCLIENT model GENERATE WEIGHTS   the real model (77 when absent)
 *
 * Random model (label unit):
 *   - a session opened by the stub is READY with every byte, a time to READY and a rate; Generate
 *     starts from the stub's first token and streams what the engine decodes; the session is
 *     CLOSED after;
 *   - three stubs and three Generate clients at once, one of the stubs corrupting a chunk: each good
 *     session streams exactly the tokens it streams alone, the corrupt one ends FAILED with the hash
 *     reason and never decodes (WaitReady and Generate say FAILED_PRECONDITION with the reason);
 *   - a stalled stub (heartbeating) ends FAILED at its transfer deadline, not as silent, a killed one
 *     FAILED with UCX's reason; the
 *     pool gets every byte back; the node serves the next session as before;
 *   - a cancelled Generate and one past its deadline free the session early (CANCELLED,
 *     DEADLINE_EXCEEDED); OpenSession with local_prefill on a ucx node, bytes that are no message
 *     and a message over max-message-bytes are refused with the right codes;
 *   - the Python client drives a UCX session to the same tokens; /metrics counts it all;
 *   - SIGTERM with a stub mid-transfer and a Generate running: the transfer fails ("draining"),
 *     the stub hears it, the stream ends UNAVAILABLE at the drain timeout, the daemon exits 0.
 * Real model (label model): the stub prefills a real text with SmolLM2 and pushes it; Generate
 * streams exactly flx-generate's text for the same prompt, with full attention and with Fluxion.
 */
#include <pthread.h>
#include <sys/stat.h>

#include "../transport/proc_util.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "node_testutil.h"

static const char *g_daemon, *g_prefill, *g_dir, *g_py;

/* ---- stubs ---- */

typedef struct stub {
    proc_t p;
    uint64_t sid;
} stub_t;

/* Starts flx-prefill --control target with the extra arguments (NULL-terminated). */
static stub_t stub_start(const char *target, const char *name, const char *const *extra)
{
    char log[600];
    snprintf(log, sizeof log, "%s/%s.log", g_dir, name);
    const char *argv[40] = {g_prefill, "--control", target, "--quiet", "--threads", "1"};
    size_t n = 6;
    for (size_t i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    stub_t s = {.p = proc_start(log, (char *const *)argv)};
    return s;
}

/* The session id the stub printed (waits for its SESSION line up to 30 s). */
static uint64_t stub_session(stub_t *s)
{
    for (int t = 0; t < 3000 && !s->sid; t++) {
        const char *out = proc_output(&s->p);
        const char *l = strstr(out, "SESSION ");
        if (l) s->sid = strtoull(l + 8, NULL, 10);
        else usleep(10000);
    }
    if (!s->sid) fprintf(stderr, "no SESSION line from the stub:\n%s\n", proc_output(&s->p));
    CHECK(s->sid);
    return s->sid;
}

static int stub_wait(stub_t *s, int want)
{
    int rc = proc_wait(&s->p, 120000);
    if (want >= 0 && rc != want) {
        fprintf(stderr, "flx-prefill exited %d, want %d:\n%s\n", rc, want, proc_output(&s->p));
        exit(1);
    }
    return rc;
}

/* A stub run to its end; the session's id (READY). */
static uint64_t stub_ready(const char *target, const char *name, const char *const *extra)
{
    stub_t s = stub_start(target, name, extra);
    stub_wait(&s, 0);
    return stub_session(&s);
}

static Fluxion__Decode__V1__SessionInfo *get_session(flx_rpc_client_h c, uint64_t sid)
{
    flx_rpc_result_t res;
    Fluxion__Decode__V1__SessionInfo *i = session_call(c, "GetSession", sid, 0, &res);
    if (!i) fprintf(stderr, "GetSession %llu: %s %s\n", (unsigned long long)sid, flx_rpc_code_name(res.code), res.msg);
    CHECK(i);
    return i;
}

/* The session is FAILED with a reason containing needle; WaitReady and Generate refuse it. A
 * killed peer's reason is UCX's ("Endpoint timeout", "Connection reset") or the liveness check's. */
static void expect_failed(flx_rpc_client_h c, uint64_t sid, const char *needle)
{
    Fluxion__Decode__V1__SessionInfo *i = get_session(c, sid);
    fprintf(stderr, "session %llu: %s: %s\n", (unsigned long long)sid,
            i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_FAILED ? "FAILED" : "not failed",
            i->fail_reason);
    CHECK(i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_FAILED && strstr(i->fail_reason, needle));
    fluxion__decode__v1__session_info__free_unpacked(i, NULL);
    flx_rpc_result_t res;
    CHECK(!session_call(c, "WaitReady", sid, 1000, &res));
    expect_code("WaitReady on a failed session", &res, FLX_RPC_FAILED_PRECONDITION, needle);
    gen_out_t *g = malloc(sizeof *g);
    generate(c, sid, 8, 10000, 0, g);
    CHECK(g->n == 0);   /* nothing half-received is ever decoded */
    expect_code("Generate on a failed session", &g->res, FLX_RPC_FAILED_PRECONDITION, needle);
    free(g);
}

static Fluxion__Decode__V1__NodeStatusResponse *node_status(flx_rpc_client_h c)
{
    Fluxion__Decode__V1__NodeStatusRequest q = FLUXION__DECODE__V1__NODE_STATUS_REQUEST__INIT;
    size_t len;
    flx_rpc_result_t res;
    void *b = node_call(c, "NodeStatus", &q.base, 10000, &len, &res);
    CHECK(b);
    Fluxion__Decode__V1__NodeStatusResponse *s = fluxion__decode__v1__node_status_response__unpack(NULL, len, b);
    free(b);
    CHECK(s);
    return s;
}

/* Waits until no host KV memory is held (failed sessions' memory returns once no receive holds it). */
static void expect_pool_empty(flx_rpc_client_h c)
{
    uint64_t used = 0;
    for (int t = 0; t < 500; t++) {
        Fluxion__Decode__V1__NodeStatusResponse *s = node_status(c);
        used = s->pool_used_bytes;
        fluxion__decode__v1__node_status_response__free_unpacked(s, NULL);
        if (!used) return;
        usleep(10000);
    }
    fprintf(stderr, "%llu bytes of the pool still held\n", (unsigned long long)used);
    exit(1);
}

typedef struct gen_job {
    flx_rpc_client_h c;
    uint64_t sid;
    uint32_t max_new;
    gen_out_t out;
} gen_job_t;

static void *gen_thread(void *arg)
{
    gen_job_t *j = arg;
    generate(j->c, j->sid, j->max_new, 60000, 0, &j->out);
    return NULL;
}

#define PROMPT_LEN "700"

/* Tokens of a fresh session of seed seed, alone. */
static void alone(flx_rpc_client_h c, const char *target, const char *seed, gen_out_t *out)
{
    const char *a[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", seed, "--max-new", "32", NULL};
    char name[64];
    snprintf(name, sizeof name, "alone-%s", seed);
    uint64_t sid = stub_ready(target, name, a);
    generate(c, sid, 16, 60000, 0, out);
    CHECK(out->res.code == FLX_RPC_OK && out->n == 16 && out->tok[0] == 0);   /* the synthetic first token */
}

static void test_random(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_node_ucx"));
    /* Different KV must give different tokens (seeds 3 and 4 below), or nothing later could tell one
     * session's KV from another's. A random model can ignore the KV (seen: 15 of 15 tokens alike for
     * FLX_SEED=193668239450397, the same in every build): such a draw is replaced by another, at most
     * 3 times. A node that decoded without the received KV fails every draw. */
    flx_model_config_t mc = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 128, .n_heads = 4, .n_kv_heads = 2,
                             .head_dim = 32, .ffn = 256, .vocab = 512, .max_ctx = 8192, .rms_eps = 1e-5f,
                             .rope_theta = 10000.0f};
    snprintf(mc.name, sizeof mc.name, "test-model");
    char model_dir[600], err[600];
    snprintf(model_dir, sizeof model_dir, "%s/ucx-model", g_dir);
    mkdir(model_dir, 0755);
    snprintf(err, sizeof err, "%s/ucx-daemon.err", g_dir);
    const char *args[] = {"--model", model_dir, "--model-id", "test-model", "--grpc-listen", "127.0.0.1:0",
                          "--metrics-listen", "127.0.0.1:0", "--kv-capacity", "64M", "--max-batch", "4",
                          "--threads", "2", "--max-message-bytes", "64K", "--drain-timeout-ms", "500",
                          "--lease-ms", "60000", "--ucx-liveness-ms", "3000", NULL};
    daemon_proc_t d;
    flx_rpc_client_h c;
    gen_out_t *ref = calloc(4, sizeof *ref);
    CHECK(ref);
    for (int draw = 0;; draw++) {
        flx_model_t *gen;
        CHECK_OK(flx_model_init_random(&mc, flx_rng_u64(&rng), &gen));
        CHECK_OK(flx_model_save_hf(gen, model_dir, FLX_DT_BF16, 1));
        flx_model_destroy(gen);
        int code;
        CHECK(daemon_start(g_daemon, args, err, &d, &code) == 0);
        CHECK_OK(flx_rpc_client_create(d.target, 0, &c));
        Fluxion__Decode__V1__NodeStatusResponse *ns = node_status(c);
        CHECK(ns->prefill_mode == FLUXION__DECODE__V1__PREFILL_MODE__PREFILL_MODE_UCX);
        fluxion__decode__v1__node_status_response__free_unpacked(ns, NULL);

        /* one session: READY with every byte, then Generate from the stub's first token */
        {
            const char *a[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "2", "--max-new", "32", NULL};
            uint64_t sid = stub_ready(d.target, "first", a);
            Fluxion__Decode__V1__SessionInfo *i = get_session(c, sid);
            CHECK(i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY);
            CHECK(i->bytes_expected > 0 && i->bytes_received == i->bytes_expected && i->time_to_ready_us > 0 &&
                  i->transfer_gbps > 0 && i->prompt_len == 700);
            fprintf(stderr, "first session: %llu bytes, READY after %llu us, %.3f GB/s\n",
                    (unsigned long long)i->bytes_received, (unsigned long long)i->time_to_ready_us,
                    i->transfer_gbps);
            fluxion__decode__v1__session_info__free_unpacked(i, NULL);
            generate(c, sid, 16, 60000, 0, &ref[0]);
            CHECK(ref[0].res.code == FLX_RPC_OK && ref[0].n == 16 && ref[0].tok[0] == 0 &&
                  ref[0].finish == FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_MAX_NEW_TOKENS);
            i = get_session(c, sid);
            CHECK(i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED &&
                  i->tokens_generated == 16);
            fluxion__decode__v1__session_info__free_unpacked(i, NULL);
        }
        /* the references of seeds 3 and 4, each alone */
        alone(c, d.target, "3", &ref[1]);
        alone(c, d.target, "4", &ref[2]);
        int differ = 0;
        for (uint32_t k = 1; k < 16; k++) differ |= ref[1].tok[k] != ref[2].tok[k];
        if (differ) break;   /* different KV, different tokens: the KV decides them */
        fprintf(stderr, "model draw %d: seeds 3 and 4 gave the same tokens; drawing another model\n", draw);
        CHECK(draw < 3);
        flx_rpc_client_destroy(c);
        CHECK(daemon_stop(&d, SIGTERM, 30000) == 0);
    }

    /* three stubs at once (one corrupting a chunk), then three Generate calls at once */
    {
        const char *a2[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "2", "--max-new", "32", NULL};
        const char *a3[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "3", "--max-new", "32", NULL};
        const char *a4[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "4", "--max-new", "32", NULL};
        const char *bad[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "5", "--corrupt-chunk", "1", NULL};
        stub_t s[4] = {stub_start(d.target, "conc-2", a2), stub_start(d.target, "conc-3", a3),
                       stub_start(d.target, "conc-4", a4), stub_start(d.target, "conc-bad", bad)};
        for (int k = 0; k < 3; k++) stub_wait(&s[k], 0);
        CHECK(stub_wait(&s[3], 1) == 1 && strstr(proc_output(&s[3].p), "hash"));
        gen_job_t *j = calloc(3, sizeof *j);
        pthread_t th[3];
        for (int k = 0; k < 3; k++) {
            j[k].c = c;
            j[k].sid = stub_session(&s[k]);
            j[k].max_new = 16;
            CHECK(pthread_create(&th[k], NULL, gen_thread, &j[k]) == 0);
        }
        for (int k = 0; k < 3; k++) {
            pthread_join(th[k], NULL);
            CHECK(j[k].out.res.code == FLX_RPC_OK);
            same_tokens("concurrent session", j[k].out.tok, j[k].out.n, ref[k].tok, ref[k].n);
        }
        free(j);
        expect_failed(c, stub_session(&s[3]), "hash");
    }

    /* a stalled stub (alive: it beats every 750 ms) FAILED at its deadline, past the 3 s liveness; a
     * killed one FAILED with UCX's reason */
    {
        const char *stall[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--stall-after-bytes", "8192",
                               "--transfer-timeout-ms", "4500", NULL};
        const char *die[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--die-after-bytes", "8192", NULL};
        stub_t s1 = stub_start(d.target, "stall", stall), s2 = stub_start(d.target, "die", die);
        CHECK(stub_wait(&s1, 1) == 1 && stub_wait(&s2, -1) == 128 + SIGKILL);
        expect_failed(c, stub_session(&s1), "deadline");
        expect_failed(c, stub_session(&s2), "failed: ");
        flx_rpc_result_t res;
        size_t len;
        Fluxion__Decode__V1__CloseSessionRequest cl = FLUXION__DECODE__V1__CLOSE_SESSION_REQUEST__INIT;
        cl.session_id = stub_session(&s1);
        void *b = node_call(c, "CloseSession", &cl.base, 10000, &len, &res);
        CHECK(b);
        Fluxion__Decode__V1__CloseSessionResponse *cr = fluxion__decode__v1__close_session_response__unpack(NULL, len, b);
        CHECK(cr && cr->previous_state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_FAILED);
        fluxion__decode__v1__close_session_response__free_unpacked(cr, NULL);
        free(b);
    }
    expect_pool_empty(c);
    alone(c, d.target, "3", &ref[3]);   /* the node serves on as before */
    same_tokens("after the faults", ref[3].tok, ref[3].n, ref[1].tok, ref[1].n);

    /* cancellation and deadline free the session early */
    {
        const char *a[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "6", "--max-new", "4000", NULL};
        gen_out_t *g = malloc(sizeof *g);
        uint64_t sid = stub_ready(d.target, "cancel", a);
        generate(c, sid, 4000, 60000, 3, g);
        expect_code("cancelled Generate", &g->res, FLX_RPC_CANCELLED, NULL);
        sid = stub_ready(d.target, "deadline", a);
        generate(c, sid, 4000, 100, 0, g);
        expect_code("Generate past its deadline", &g->res, FLX_RPC_DEADLINE_EXCEEDED, NULL);
        free(g);
        /* the node stopped decoding for it: the session ends with far fewer tokens than asked */
        Fluxion__Decode__V1__SessionInfo *i = NULL;
        for (int t = 0; t < 500; t++, usleep(10000)) {
            if (i) fluxion__decode__v1__session_info__free_unpacked(i, NULL);
            i = get_session(c, sid);
            if (i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED) break;
        }
        fprintf(stderr, "the session past its deadline: %u tokens generated\n", i->tokens_generated);
        CHECK(i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED && i->tokens_generated < 4000);
        fluxion__decode__v1__session_info__free_unpacked(i, NULL);
        for (int t = 0; t < 500; t++) {
            Fluxion__Decode__V1__NodeStatusResponse *s = node_status(c);
            int idle = s->sessions_decoding == 0;
            fluxion__decode__v1__node_status_response__free_unpacked(s, NULL);
            if (idle) break;
            CHECK(t < 499);
            usleep(10000);
        }
        expect_pool_empty(c);
    }

    /* refusals */
    {
        Fluxion__Decode__V1__OpenSessionRequest r = FLUXION__DECODE__V1__OPEN_SESSION_REQUEST__INIT;
        Fluxion__Decode__V1__ModelShape shape = FLUXION__DECODE__V1__MODEL_SHAPE__INIT;
        Fluxion__Decode__V1__AttentionConfig a = FLUXION__DECODE__V1__ATTENTION_CONFIG__INIT;
        Fluxion__Decode__V1__LocalPrefill lp = FLUXION__DECODE__V1__LOCAL_PREFILL__INIT;
        shape.n_layers = 2, shape.n_kv_heads = 2, shape.n_q_heads = 4, shape.head_dim = 32;
        a.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL;
        int32_t ids[16] = {1, 2, 3};
        lp.token_ids = ids;
        lp.n_token_ids = 16;
        r.model_id = (char *)"test-model";
        r.shape = &shape;
        r.prompt_len = 16;
        r.max_new_tokens = 8;
        r.kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16;
        r.attention = &a;
        r.local_prefill = &lp;
        uint64_t sid;
        flx_rpc_result_t res;
        CHECK(open_session(c, &r, &sid, &res) == FLX_RPC_INVALID_ARGUMENT);
        expect_code("local_prefill on a ucx node", &res, FLX_RPC_INVALID_ARGUMENT, "local_prefill");
        int32_t *big = calloc(40000, sizeof *big);
        for (int k = 0; k < 40000; k++) big[k] = 300;   /* two bytes each: 80 KB, over the 64K limit */
        lp.token_ids = big;
        lp.n_token_ids = 40000;
        r.prompt_len = 40000;
        CHECK(open_session(c, &r, &sid, &res) == FLX_RPC_RESOURCE_EXHAUSTED);
        expect_code("a request over max-message-bytes", &res, FLX_RPC_RESOURCE_EXHAUSTED, NULL);
        free(big);
        const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
        void *resp = NULL;
        size_t rl;
        CHECK_OK(flx_rpc_unary(c, "/fluxion.decode.v1.DecodeNode/OpenSession", junk, sizeof junk, 10000, &resp, &rl,
                               &res));
        expect_code("bytes that are no message", &res, FLX_RPC_INVALID_ARGUMENT, NULL);
        free(resp);
        /* a session still OPEN cannot be generated */
        r.local_prefill = NULL;
        r.prompt_len = 700;
        CHECK(open_session(c, &r, &sid, &res) == FLX_RPC_OK);
        gen_out_t *g = malloc(sizeof *g);
        generate(c, sid, 8, 10000, 0, g);
        expect_code("Generate on an OPEN session", &g->res, FLX_RPC_FAILED_PRECONDITION, "open");
        free(g);
        Fluxion__Decode__V1__CloseSessionRequest cl = FLUXION__DECODE__V1__CLOSE_SESSION_REQUEST__INIT;
        cl.session_id = sid;
        size_t len;
        free(node_call(c, "CloseSession", &cl.base, 10000, &len, &res));
        CHECK(res.code == FLX_RPC_OK);
    }

    /* the Python client on a UCX session */
    {
        const char *a[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "3", "--max-new", "32", NULL};
        uint64_t sid = stub_ready(d.target, "python", a);
        char cmd[2048], ids_path[600];
        snprintf(ids_path, sizeof ids_path, "%s/ucx-python.ids", g_dir);
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --target %s generate --session %llu --max-new 16 --quiet "
                                  "--ids-out %s >&2",
                 g_py, d.target, (unsigned long long)sid, ids_path);
        CHECK(system(cmd) == 0);
        FILE *f = fopen(ids_path, "r");
        CHECK(f);
        int32_t got[16];
        uint32_t n = 0;
        while (n < 16 && fscanf(f, "%d", &got[n]) == 1) n++;
        fclose(f);
        same_tokens("python client", got, n, ref[1].tok, ref[1].n);
    }

    /* /metrics */
    {
        int hc;
        char *m = http_get(d.metrics_port, "/metrics", &hc);
        CHECK(hc == 200 && strstr(m, "fluxion_build_info{model_id=\"test-model\",prefill=\"ucx\"} 1"));
        CHECK(metric(m, "fluxion_transfer_bytes_total") > 0 && metric(m, "fluxion_sessions_failed_total") >= 3);
        /* the killed flx-prefill's connection failed its session; each one that left after READY left */
        CHECK(metric(m, "fluxion_transfer_connections_failed_total") >= 1);
        CHECK(metric(m, "fluxion_transfer_connections_left_total") >= 3);
        /* the deadline ends the call at the node (deadline_exceeded) or at gRPC first (cancelled) */
        CHECK(metric(m, "fluxion_generate_ended_total{result=\"cancelled\"}") +
                  metric(m, "fluxion_generate_ended_total{result=\"deadline_exceeded\"}") >= 2);
        free(m);
    }

    /* SIGTERM with a transfer under way and a Generate running */
    {
        const char *a[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--seed", "7", "--max-new", "4000", NULL};
        uint64_t sid = stub_ready(d.target, "drain-gen", a);
        const char *stall[] = {"--synthetic", "--prompt-len", PROMPT_LEN, "--stall-after-bytes", "8192",
                               "--transfer-timeout-ms", "60000", NULL};
        stub_t s = stub_start(d.target, "drain-stall", stall);
        stub_session(&s);
        for (int t = 0; t < 500 && !strstr(proc_output(&s.p), "stalled after"); t++) usleep(10000);
        gen_job_t *j = calloc(1, sizeof *j);
        j->c = c;
        j->sid = sid;
        j->max_new = 4000;
        pthread_t th;
        CHECK(pthread_create(&th, NULL, gen_thread, j) == 0);
        usleep(50000);
        CHECK(daemon_stop(&d, SIGTERM, 30000) == 0);
        pthread_join(th, NULL);
        fprintf(stderr, "the Generate under SIGTERM: %u tokens, %s %s\n", j->out.n,
                flx_rpc_code_name(j->out.res.code), j->out.res.msg);
        /* ended UNAVAILABLE by the drain, or (a fast machine) finished whole within it */
        CHECK((j->out.res.code == FLX_RPC_UNAVAILABLE && j->out.n < 4000) ||
              (j->out.res.code == FLX_RPC_OK && j->out.n == 4000));
        free(j);
        CHECK(stub_wait(&s, 1) == 1);
        const char *out = proc_output(&s.p);
        if (!strstr(out, "draining") && !strstr(out, "shutting down")) {
            fprintf(stderr, "the stalled stub did not hear the drain:\n%s\n", out);
            exit(1);
        }
    }
    flx_rpc_client_destroy(c);
    free(ref);
}

/* ---- the real model ---- */

static int test_model(const char *gen_tool, const char *pred)
{
    char model[1024];
    if (!flx_test_model_path("test_node_ucx", model, sizeof model)) return FLX_TEST_SKIP;
    char err[600], prompt[600];
    snprintf(err, sizeof err, "%s/ucx-model-daemon.err", g_dir);
    snprintf(prompt, sizeof prompt, "%s/ucx-model-prompt.txt", g_dir);
    {
        FILE *in = fopen("/usr/share/common-licenses/GPL-3", "r");
        CHECK(in);
        char text[2600];
        size_t n = fread(text, 1, 2400, in);
        fclose(in);
        FILE *f = fopen(prompt, "w");
        CHECK(f);
        fwrite(text, 1, n, f);
        fputs("\n\nQuestion: what does this license let me do with the program? Answer briefly.", f);
        fclose(f);
    }
    /* the stub prefills the text while it pushes: under TSan that takes longer than the node's
     * default transfer deadline of 30 s */
    const char *args[] = {"--model", model, "--model-id", "smollm2", "--predictor", pred, "--grpc-listen",
                          "127.0.0.1:0", "--metrics-listen", "off", "--kv-capacity", "512M", "--threads", "2",
                          "--transfer-timeout-ms", "300000", NULL};
    daemon_proc_t d;
    int code;
    CHECK(daemon_start(g_daemon, args, err, &d, &code) == 0);
    flx_tok_h tok;
    CHECK_OK(flx_tok_load(model, &tok));
    static const char *const modes[][2] = {{"full", ""}, {"fluxion", "--mode fluxion"}};
    for (int k = 0; k < 2; k++) {
        const char *a[] = {"-m", model, "-f", prompt, "--chat", "--mode", modes[k][0], "--max-new", "32", NULL};
        char name[64];
        snprintf(name, sizeof name, "model-%s", modes[k][0]);
        uint64_t sid = stub_ready(d.target, name, a);
        flx_rpc_client_h c;
        CHECK_OK(flx_rpc_client_create(d.target, 0, &c));
        gen_out_t *g = malloc(sizeof *g);
        generate(c, sid, 24, 120000, 0, g);
        CHECK(g->res.code == FLX_RPC_OK && g->n >= 1);
        char got[4096];
        size_t gl = 0;
        CHECK_OK(flx_tok_decode(tok, g->tok, g->n, FLX_TOK_SKIP_SPECIAL, got, sizeof got - 1, &gl));
        got[gl] = '\0';
        free(g);
        flx_rpc_client_destroy(c);
        char cmd[4096], ofile[600];
        snprintf(ofile, sizeof ofile, "%s/ucx-model-%s.out", g_dir, modes[k][0]);
        snprintf(cmd, sizeof cmd, "%s --model %s --prompt-file %s --chat --max-new 24 --threads 2 %s %s%s >%s "
                                  "2>/dev/null",
                 gen_tool, model, prompt, modes[k][1], k ? "--predictor " : "", k ? pred : "", ofile);
        fprintf(stderr, "%s over UCX: %s\n", modes[k][0], got);
        same_text_as(cmd, ofile, got);
    }
    flx_tok_destroy(tok);
    CHECK(daemon_stop(&d, SIGTERM, 20000) == 0);
    return 0;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 5);
    g_daemon = argv[1];
    g_prefill = argv[2];
    g_dir = argv[3];
    g_py = argv[4];
    mkdir(g_dir, 0755);
    signal(SIGPIPE, SIG_IGN);
    /* TCP over loopback with UCX's peer-failure detection (the node's default error mode) */
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    if (argc > 7 && !strcmp(argv[5], "model")) {
        int r = test_model(argv[6], argv[7]);
        if (r == 0) fprintf(stderr, "test_node_ucx model: ok\n");
        return r;
    }
    test_random();
    fprintf(stderr, "test_node_ucx: ok\n");
    return 0;
}
