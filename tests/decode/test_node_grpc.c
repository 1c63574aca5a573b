/*
 * test_node_grpc - fluxion-decoded end to end: a real daemon process on a loopback port, driven
 * over gRPC by the C client (flx/rpc.h + protobuf-c) and by Python (Debian's python3-grpcio,
 * modules generated from the .proto at test time).
 *
 *   test_node_grpc DAEMON DIR PYTHON_CLIENT          random model (2 layers), --prefill local
 *   test_node_grpc DAEMON DIR PYTHON_CLIENT model    the real model (77 when absent): text pieces
 *
 * Random model: the daemon loads a checkpoint this test writes (and a predictor whose every head
 * reads its whole host segment, so FLUXION's tokens must equal FULL's); the reference tokens come
 * from the engine in this process on the same checkpoint. Checks:
 *   - NodeStatus reports the model; every malformed OpenSession field is INVALID_ARGUMENT with a
 *     message naming it; bytes that are no message are INVALID_ARGUMENT, a request over
 *     max-message-bytes RESOURCE_EXHAUSTED, an unknown method UNIMPLEMENTED; a session the pool
 *     cannot hold RESOURCE_EXHAUSTED; unknown sessions NOT_FOUND; Generate on a session that is not
 *     READY FAILED_PRECONDITION;
 *   - Open -> WaitReady -> Generate (FULL, FIXED (128, 1.0) and FLUXION) streams exactly the
 *     reference tokens with indexes, timing and statistics; the session is CLOSED after;
 *   - four clients at once, each its own prompt, each gets its own reference tokens (batched);
 *   - a client that cancels: the server stops decoding for it (its session records far fewer
 *     tokens than asked, metrics count the cancellation); a deadline: the same;
 *   - a READY session whose lease passes fails with the reason;
 *   - /metrics over HTTP holds the counters, histograms and Fluxion's statistics;
 *   - the Python client gets the same tokens, and so does the README's router snippet, run as it is
 *     written there (the block after its "router-snippet" marker; FLUXION mode, 32 tokens);
 *   - SIGTERM during a Generate: health NOT_SERVING (Check, and a Watch stream that said SERVING
 *     before), new sessions UNAVAILABLE, the stream ends
 *     UNAVAILABLE at the drain timeout, the daemon exits 0; exit 2 on bad flags, 1 when it cannot
 *     start (a missing model; max-prompt-len above the model's context, named).
 *   - a node with max-sessions 9: sessions opened and closed behind a long local prefill never push
 *     a waiting one out of the prefill queue; a Generate for a ninth attention configuration while
 *     eight decode waits for an engine (its deadline still holds) and then streams its reference
 *     tokens; /metrics escapes a model id with a quote and a backslash.
 * Real model: Generate's text pieces concatenate to what flx-generate prints for the same prompt.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/tokenizer.h"
#include "node_testutil.h"

static const char *g_daemon, *g_dir, *g_py;
static char g_model_dir[512], g_pred[512];
static const char *g_model_id = "test-model";   /* what OpenSession names */
static flx_model_t *g_m;

enum { VOCAB = 512 };

/* ---- references ---- */

typedef struct rec {
    int32_t *out;
    uint32_t n;
} rec_t;

static void on_tok(void *ctx, flx_engine_seq_id_t s, int32_t t, int last, flx_engine_finish_t w)
{
    rec_t *r = ctx;
    if (t >= 0) r->out[r->n++] = t;
}

/* Greedy tokens of prompt under the engine in this process (what the node must stream). */
static uint32_t reference(const int32_t *prompt, uint32_t n, uint32_t max_new, flx_engine_attn_mode_t mode,
                          uint32_t blk, float bgt, int32_t *out)
{
    const flx_model_config_t *c = &g_m->cfg;
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = (size_t)64 << 20, .n_layers = c->n_layers,
                                .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads, .head_dim = c->head_dim};
    flx_kv_store_h store;
    CHECK_OK(flx_kv_store_create(&kp, &store));
    flx_fwd_shape_t fs = {.max_prompt = n, .max_batch = 1, .pool = NULL};
    size_t b;
    CHECK_OK(flx_fwd_plan(g_m, &fs, &b));
    void *mem = flx_aligned_alloc(64, b);
    flx_fwd_ws_t *ws;
    CHECK_OK(flx_fwd_ws_init(g_m, &fs, mem, b, &ws));
    float *lg = malloc(c->vocab * sizeof *lg);
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(g_m, ws, store, prompt, n, max_new, &sid, lg));
    flx_engine_params_t ep = flx_engine_params_default();
    ep.max_batch = 1;
    ep.n_threads = 2;
    ep.mode = mode;
    ep.blk = blk;
    ep.bgt = bgt;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(g_m, store, &ep, &e));
    rec_t r = {out, 0};
    flx_gen_params_t gp = {.max_new_tokens = max_new, .eos_id = -1, .sampling = flx_sampling_greedy(),
                           .on_token = on_tok, .ctx = &r};
    flx_engine_seq_id_t seq;
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, c->vocab), &gp, &seq));
    while (flx_engine_step(e) == FLX_INPROGRESS) {
    }
    flx_engine_destroy(e);
    flx_kv_store_destroy(store);
    flx_aligned_free(mem);
    free(lg);
    return r.n;
}

/* ---- requests ---- */

static Fluxion__Decode__V1__ModelShape g_shape;

static void open_req(Fluxion__Decode__V1__OpenSessionRequest *r, Fluxion__Decode__V1__AttentionConfig *a,
                     Fluxion__Decode__V1__LocalPrefill *lp, const int32_t *prompt, uint32_t n, uint32_t max_new)
{
    fluxion__decode__v1__open_session_request__init(r);
    fluxion__decode__v1__attention_config__init(a);
    fluxion__decode__v1__local_prefill__init(lp);
    a->mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL;
    lp->token_ids = (int32_t *)prompt;
    lp->n_token_ids = n;
    r->model_id = (char *)g_model_id;
    r->shape = &g_shape;
    r->prompt_len = n;
    r->max_new_tokens = max_new;
    r->kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16;
    r->attention = a;
    r->local_prefill = lp;
}

static uint64_t ready_session_lease(flx_rpc_client_h c, const int32_t *prompt, uint32_t n, uint32_t max_new,
                                    const Fluxion__Decode__V1__AttentionConfig *attn, uint32_t lease_ms)
{
    Fluxion__Decode__V1__OpenSessionRequest r;
    Fluxion__Decode__V1__AttentionConfig a;
    Fluxion__Decode__V1__LocalPrefill lp;
    open_req(&r, &a, &lp, prompt, n, max_new);
    if (attn) r.attention = (Fluxion__Decode__V1__AttentionConfig *)attn;
    r.lease_ms = lease_ms;
    uint64_t sid = 0;
    flx_rpc_result_t res;
    if (open_session(c, &r, &sid, &res) != FLX_RPC_OK) {
        fprintf(stderr, "OpenSession: %s %s\n", flx_rpc_code_name(res.code), res.msg);
        CHECK(0);
    }
    Fluxion__Decode__V1__SessionInfo *i = session_call(c, "WaitReady", sid, 30000, &res);
    if (!i) fprintf(stderr, "WaitReady: %s %s\n", flx_rpc_code_name(res.code), res.msg);
    CHECK(i && i->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY);
    CHECK(i->bytes_received == i->bytes_expected && i->bytes_expected > 0 && i->time_to_ready_us > 0);
    fluxion__decode__v1__session_info__free_unpacked(i, NULL);
    return sid;
}

static uint64_t ready_session(flx_rpc_client_h c, const int32_t *prompt, uint32_t n, uint32_t max_new,
                              const Fluxion__Decode__V1__AttentionConfig *attn)
{
    return ready_session_lease(c, prompt, n, max_new, attn, 0);
}

/* The next status a Health.Watch stream sends (-1 when it ended). */
static int watch_status(flx_rpc_stream_h w)
{
    void *m;
    size_t len;
    flx_rpc_result_t res;
    flx_status_t st = flx_rpc_stream_next(w, &m, &len, &res);
    CHECK(st >= 0);
    if (st == 0) return -1;
    Grpc__Health__V1__HealthCheckResponse *h = grpc__health__v1__health_check_response__unpack(NULL, len, m);
    free(m);
    CHECK(h);
    int s = h->status;
    grpc__health__v1__health_check_response__free_unpacked(h, NULL);
    return s;
}

/* ---- tests ---- */

static void test_refusals(flx_rpc_client_h c, const int32_t *prompt)
{
    Fluxion__Decode__V1__OpenSessionRequest r;
    Fluxion__Decode__V1__AttentionConfig a;
    Fluxion__Decode__V1__LocalPrefill lp;
    Fluxion__Decode__V1__ModelShape bad_shape = g_shape;
    bad_shape.head_dim = 64;
    uint64_t sid;
    flx_rpc_result_t res;
    struct {
        const char *needle;
        int code;
    } cases[] = {{"model_id", FLX_RPC_INVALID_ARGUMENT},       {"shape", FLX_RPC_INVALID_ARGUMENT},
                 {"prompt_len", FLX_RPC_INVALID_ARGUMENT},     {"max_new_tokens", FLX_RPC_INVALID_ARGUMENT},
                 {"kv_dtype", FLX_RPC_INVALID_ARGUMENT},       {"attention.mode", FLX_RPC_INVALID_ARGUMENT},
                 {"attention.blk", FLX_RPC_INVALID_ARGUMENT},  {"attention.budget", FLX_RPC_INVALID_ARGUMENT},
                 {"local_prefill", FLX_RPC_INVALID_ARGUMENT},  {"token_ids[3]", FLX_RPC_INVALID_ARGUMENT},
                 {"attention is missing", FLX_RPC_INVALID_ARGUMENT}, {"bytes", FLX_RPC_RESOURCE_EXHAUSTED}};
    int32_t bad_ids[40];
    memcpy(bad_ids, prompt, sizeof bad_ids);
    bad_ids[3] = VOCAB;
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        open_req(&r, &a, &lp, prompt, 40, 8);
        switch (i) {
        case 0: r.model_id = (char *)"other-model"; break;
        case 1: r.shape = &bad_shape; break;
        case 2: r.prompt_len = 0; break;
        case 3: r.max_new_tokens = 1u << 30; break;
        case 4: r.kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_UNSPECIFIED; break;
        case 5: a.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_UNSPECIFIED; break;
        case 6: a.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED; a.blk = 48; a.budget = 0.1f; break;
        case 7: a.mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED; a.blk = 16; a.budget = 1.5f; break;
        case 8: lp.n_token_ids = 39; break;
        case 9: lp.token_ids = bad_ids; break;
        case 10: r.attention = NULL; break;
        case 11: r.prompt_len = 4000; r.max_new_tokens = 4000; lp.n_token_ids = 4000; lp.token_ids = NULL; break;
        }
        if (i == 11) {   /* a session the 4 MiB pool cannot hold (the ids are valid) */
            static int32_t big[4000];
            for (int k = 0; k < 4000; k++) big[k] = k % VOCAB;
            lp.token_ids = big;
        }
        char what[64];
        snprintf(what, sizeof what, "OpenSession refusal %zu", i);
        CHECK(open_session(c, &r, &sid, &res) == cases[i].code);
        expect_code(what, &res, cases[i].code, cases[i].needle);
    }
    /* bytes that are no OpenSessionRequest; a request over max-message-bytes; an unknown method */
    uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    void *resp = NULL;
    size_t rl;
    CHECK_OK(flx_rpc_unary(c, "/fluxion.decode.v1.DecodeNode/OpenSession", junk, sizeof junk, 5000, &resp, &rl, &res));
    expect_code("malformed OpenSession", &res, FLX_RPC_INVALID_ARGUMENT, "not a valid");
    uint8_t *big = calloc(1, 200000);
    CHECK_OK(flx_rpc_unary(c, "/fluxion.decode.v1.DecodeNode/OpenSession", big, 200000, 5000, &resp, &rl, &res));
    expect_code("oversized OpenSession", &res, FLX_RPC_RESOURCE_EXHAUSTED, NULL);
    free(big);
    CHECK_OK(flx_rpc_unary(c, "/fluxion.decode.v1.DecodeNode/Nope", junk, 1, 5000, &resp, &rl, &res));
    expect_code("unknown method", &res, FLX_RPC_UNIMPLEMENTED, "Nope");
    /* unknown sessions, id 0 */
    CHECK(session_call(c, "GetSession", 12345, 0, &res) == NULL);
    expect_code("GetSession unknown", &res, FLX_RPC_NOT_FOUND, "no session");
    CHECK(session_call(c, "GetSession", 0, 0, &res) == NULL);
    expect_code("GetSession 0", &res, FLX_RPC_INVALID_ARGUMENT, "session_id 0");
    CHECK(session_call(c, "WaitReady", 777, 100, &res) == NULL);
    expect_code("WaitReady unknown", &res, FLX_RPC_NOT_FOUND, NULL);
    gen_out_t *o = malloc(sizeof *o);
    generate(c, 999, 4, 5000, 0, o);
    expect_code("Generate unknown", &o->res, FLX_RPC_NOT_FOUND, NULL);
    free(o);
}

typedef struct client_arg {
    flx_rpc_client_h c;
    int32_t prompt[300];
    uint32_t n;
    int32_t ref[64];
    uint32_t n_ref;
} client_arg_t;

static void *client_thread(void *arg)
{
    client_arg_t *a = arg;
    uint64_t sid = ready_session(a->c, a->prompt, a->n, 24, NULL);
    gen_out_t *o = malloc(sizeof *o);
    generate(a->c, sid, 24, 60000, 0, o);
    CHECK(o->res.code == FLX_RPC_OK);
    same_tokens("concurrent client", o->tok, o->n, a->ref, a->n_ref);
    free(o);
    return NULL;
}

static void run_python(daemon_proc_t *d, const int32_t *prompt, uint32_t n, const int32_t *ref, uint32_t n_ref)
{
    char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --target %s --model-id test-model --prompt ", g_py, d->target);
    for (uint32_t i = 0; i < n; i++) k += snprintf(cmd + k, sizeof cmd - k, "%s%d", i ? "," : "", prompt[i]);
    k += snprintf(cmd + k, sizeof cmd - k, " --expect ");
    for (uint32_t i = 0; i < n_ref; i++) k += snprintf(cmd + k, sizeof cmd - k, "%s%d", i ? "," : "", ref[i]);
    CHECK((size_t)k < sizeof cmd);
    int r = system(cmd);
    CHECK(r != -1 && WIFEXITED(r));
    if (WEXITSTATUS(r) != 0) {
        fprintf(stderr, "python client failed (exit %d)\n", WEXITSTATUS(r));
        exit(1);
    }
}

/* The README's Python snippet for router authors, extracted verbatim and run from the repository
 * root (it compiles proto/ with protoc) against the daemon with the prompt's ids as arguments: its
 * "token ids:" line must be the reference. The README is found beside the Python client's folder. */
static void run_readme_snippet(daemon_proc_t *d, const int32_t *prompt, uint32_t n, const int32_t *ref, uint32_t n_ref)
{
    char root[1024], path[1200], py[600], out[600];
    snprintf(root, sizeof root, "%s", g_py);
    for (int up = 0; up < 3; up++) {   /* ROOT/tests/decode/node_client.py -> ROOT */
        char *slash = strrchr(root, '/');
        CHECK(slash);
        *slash = '\0';
    }
    snprintf(path, sizeof path, "%s/README.md", root);
    size_t len;
    char *readme;
    CHECK_OK(flx_cli_read_file(path, (size_t)1 << 20, &readme, &len));
    const char *mark = strstr(readme, "<!-- router-snippet");
    const char *open = mark ? strstr(mark, "\n```python\n") : NULL;
    const char *body = open ? open + strlen("\n```python\n") : NULL;
    const char *end = body ? strstr(body, "\n```\n") : NULL;
    if (!end) {
        fprintf(stderr, "%s: no ```python block after a <!-- router-snippet --> marker\n", path);
        exit(1);
    }
    snprintf(py, sizeof py, "%s/router_snippet.py", g_dir);
    snprintf(out, sizeof out, "%s/router_snippet.out", g_dir);
    FILE *f = fopen(py, "w");
    CHECK(f && fwrite(body, 1, (size_t)(end + 1 - body), f) == (size_t)(end + 1 - body));
    fclose(f);
    free(readme);
    char cmd[16384];
    int k = snprintf(cmd, sizeof cmd, "cd '%s' && FLX_NODE=%s /usr/bin/python3 '%s'", root, d->target, py);
    for (uint32_t i = 0; i < n; i++) k += snprintf(cmd + k, sizeof cmd - k, " %d", prompt[i]);
    k += snprintf(cmd + k, sizeof cmd - k, " > '%s'", out);
    CHECK((size_t)k < sizeof cmd);
    int r = system(cmd);
    CHECK(r != -1 && WIFEXITED(r));
    if (WEXITSTATUS(r) != 0) {
        fprintf(stderr, "the README's router snippet failed (exit %d): %s\n", WEXITSTATUS(r), py);
        exit(1);
    }
    char *got;
    CHECK_OK(flx_cli_read_file(out, (size_t)1 << 20, &got, &len));
    const char *line = strstr(got, "\ntoken ids:");
    CHECK(line);
    line += strlen("\ntoken ids:");
    int32_t toks[64];
    uint32_t nt = 0;
    char *e;
    for (long v; nt < 64 && (v = strtol(line, &e, 10), e != line); line = e) toks[nt++] = (int32_t)v;
    same_tokens("README router snippet", toks, nt, ref, n_ref);
    CHECK(strstr(got, "finish: FINISH_REASON_MAX_NEW_TOKENS"));
    free(got);
}

static void test_limits(const int32_t *prompt);

static void test_random(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_node_grpc"));
    flx_model_config_t mc = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 128, .n_heads = 4, .n_kv_heads = 2,
                             .head_dim = 32, .ffn = 256, .vocab = VOCAB, .max_ctx = 4096, .rms_eps = 1e-5f,
                             .rope_theta = 10000.0f};
    snprintf(mc.name, sizeof mc.name, "test-model");
    flx_model_t *gen;
    CHECK_OK(flx_model_init_random(&mc, flx_rng_u64(&rng), &gen));
    snprintf(g_model_dir, sizeof g_model_dir, "%s/node-model", g_dir);
    mkdir(g_model_dir, 0755);
    CHECK_OK(flx_model_save_hf(gen, g_model_dir, FLX_DT_BF16, 1));
    flx_model_destroy(gen);
    CHECK_OK(flx_model_load(g_model_dir, &g_m));   /* the daemon's weights exactly */
    g_shape = (Fluxion__Decode__V1__ModelShape)FLUXION__DECODE__V1__MODEL_SHAPE__INIT;
    g_shape.n_layers = mc.n_layers;
    g_shape.n_kv_heads = mc.n_kv_heads;
    g_shape.n_q_heads = mc.n_heads;
    g_shape.head_dim = mc.head_dim;
    /* every head retrieval with budget 1: FLUXION reads every host token */
    {
        flx_mlp_t m;
        CHECK_OK(flx_mlp_alloc(&m));
        m.target_mean[0] = 1.0f;
        m.b4[2] = -20.0f;
        snprintf(g_pred, sizeof g_pred, "%s/node-pred.safetensors", g_dir);
        CHECK_OK(flx_mlp_save(&m, g_pred, "test", "constant", 0.1f));
        flx_mlp_free(&m);
    }

    /* usage errors exit 2, a node that cannot start exits 1 */
    char err[600];
    snprintf(err, sizeof err, "%s/node-daemon.err", g_dir);
    daemon_proc_t d;
    int code;
    const char *bad1[] = {"--model", g_model_dir, "--max-batch", "0", NULL};
    CHECK(daemon_start(g_daemon, bad1, err, &d, &code) == -1 && code == 2);
    const char *bad2[] = {"--bogus", NULL};
    CHECK(daemon_start(g_daemon, bad2, err, &d, &code) == -1 && code == 2);
    const char *bad3[] = {"--model", "/nonexistent/model", "--prefill", "local", NULL};
    CHECK(daemon_start(g_daemon, bad3, err, &d, &code) == -1 && code == 1);
    /* prompts the model cannot decode (its context is 4096): refused at start, naming both */
    const char *bad4[] = {"--model", g_model_dir, "--prefill", "ucx", "--max-prompt-len", "5000", NULL};
    CHECK(daemon_start(g_daemon, bad4, err, &d, &code) == -1 && code == 1);
    CHECK(strstr(flx_test_slurp(err), "max-prompt-len 5000 exceeds the model's context of 4096 tokens"));
    /* a tokenizer that is there but unusable stops the start (served without it, no end token
     * would end a call); the KV receiver's settings with a local prefill are a usage error */
    {
        char tokdir[600], cmd[2400];
        snprintf(tokdir, sizeof tokdir, "%s/node-model-badtok", g_dir);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && printf '{\"model\": 7' > '%s/tokenizer.json'", tokdir,
                 g_model_dir, tokdir, tokdir);
        CHECK(system(cmd) == 0);
        const char *bad5[] = {"--model", tokdir, "--prefill", "local", NULL};
        CHECK(daemon_start(g_daemon, bad5, err, &d, &code) == -1 && code == 1);
        const char *log = flx_test_slurp(err);
        CHECK(strstr(log, "tokenizer of ") && strstr(log, "tokenizer.json"));
        const char *bad6[] = {"--model", g_model_dir, "--prefill", "local", "--ucx-err-mode", "none", NULL};
        CHECK(daemon_start(g_daemon, bad6, err, &d, &code) == -1 && code == 2);
    }

    const char *args[] = {"--model", g_model_dir, "--model-id", "test-model", "--predictor", g_pred,
                          "--prefill", "local", "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                          "--kv-capacity", "4M", "--max-batch", "4", "--threads", "2",
                          "--max-message-bytes", "64K", "--lease-ms", "1500", NULL};
    /* started with a soft descriptor limit below the hard one: the daemon raises it (every UCX
     * connection has a worker of its own, about 11 descriptors) */
    struct rlimit nofile;
    CHECK(getrlimit(RLIMIT_NOFILE, &nofile) == 0);
    const int lowered = nofile.rlim_max > 256;
    if (lowered) {
        struct rlimit low = {.rlim_cur = 256, .rlim_max = nofile.rlim_max};
        CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    }
    const int started = daemon_start(g_daemon, args, err, &d, &code);
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile) == 0);
    if (started) {
        fprintf(stderr, "daemon exited %d before serving; its log: %s\n", code, err);
        exit(1);
    }
    if (lowered) CHECK(strstr(flx_test_slurp(err), "file descriptor limit raised from 256 to "));
    flx_rpc_client_h c;
    CHECK_OK(flx_rpc_client_create(d.target, 0, &c));

    /* NodeStatus */
    {
        Fluxion__Decode__V1__NodeStatusRequest q = FLUXION__DECODE__V1__NODE_STATUS_REQUEST__INIT;
        flx_rpc_result_t res;
        size_t len;
        void *b = node_call(c, "NodeStatus", &q.base, 5000, &len, &res);
        CHECK(b);
        Fluxion__Decode__V1__NodeStatusResponse *s = fluxion__decode__v1__node_status_response__unpack(NULL, len, b);
        free(b);
        CHECK(s && !strcmp(s->model_id, "test-model") && s->shape && s->shape->head_dim == 32);
        CHECK(s->prefill_mode == FLUXION__DECODE__V1__PREFILL_MODE__PREFILL_MODE_LOCAL && !s->draining);
        CHECK(s->pool_capacity_bytes == 4u << 20 && s->max_batch == 4);
        fluxion__decode__v1__node_status_response__free_unpacked(s, NULL);
    }

    int32_t prompt[600];
    for (int i = 0; i < 600; i++) prompt[i] = (int32_t)flx_rng_below(&rng, VOCAB);
    test_refusals(c, prompt);

    /* FULL, FIXED (128, 1) and FLUXION (budget 1) stream the reference tokens */
    int32_t ref[64];
    uint32_t n_ref = reference(prompt, 600, 32, FLX_ENGINE_ATTN_FULL, 16, 1.0f, ref);
    CHECK(n_ref == 32);
    Fluxion__Decode__V1__AttentionConfig modes[3];
    for (int i = 0; i < 3; i++) fluxion__decode__v1__attention_config__init(&modes[i]);
    modes[0].mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL;
    modes[1].mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED;
    modes[1].blk = 128;
    modes[1].budget = 1.0f;
    modes[2].mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION;
    gen_out_t *o = malloc(sizeof *o);
    for (int i = 0; i < 3; i++) {
        uint64_t sid = ready_session(c, prompt, 600, 32, &modes[i]);
        generate(c, sid, 32, 60000, 0, o);
        expect_code("Generate", &o->res, FLX_RPC_OK, NULL);
        same_tokens(i == 0 ? "full" : i == 1 ? "fixed (128, 1)" : "fluxion (budget 1)", o->tok, o->n, ref, n_ref);
        CHECK(o->finish == FLUXION__DECODE__V1__FINISH_REASON__FINISH_REASON_MAX_NEW_TOKENS);
        CHECK(o->host_bytes > 0 && o->heads == 31 * 2 * 4);
        if (i == 1) CHECK(o->blk128 == 31 * 2 * 2);   /* every (step, layer, group) at blk 128 */
        if (i == 2) CHECK(o->stream_heads == 0);
        flx_rpc_result_t res;
        Fluxion__Decode__V1__SessionInfo *si = session_call(c, "GetSession", sid, 0, &res);
        CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED && si->tokens_generated == 32);
        fluxion__decode__v1__session_info__free_unpacked(si, NULL);
        /* the session is consumed: Generate again is FAILED_PRECONDITION, CloseSession is fine */
        generate(c, sid, 4, 5000, 0, o);
        expect_code("Generate on a closed session", &o->res, FLX_RPC_FAILED_PRECONDITION, "closed");
        close_session(c, sid);
    }

    /* four clients at once, each its own prompt and reference */
    {
        client_arg_t ca[4];
        pthread_t t[4];
        for (int i = 0; i < 4; i++) {
            ca[i].c = c;
            ca[i].n = 200 + 25 * (uint32_t)i;
            for (uint32_t k = 0; k < ca[i].n; k++) ca[i].prompt[k] = (int32_t)flx_rng_below(&rng, VOCAB);
            ca[i].n_ref = reference(ca[i].prompt, ca[i].n, 24, FLX_ENGINE_ATTN_FULL, 16, 1.0f, ca[i].ref);
        }
        for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, client_thread, &ca[i]) == 0);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    }

    /* a client that cancels, and one whose deadline passes: the server stops decoding for them */
    {
        flx_rpc_result_t res;
        uint64_t sid = ready_session(c, prompt, 100, 3900, NULL);
        generate(c, sid, 3900, 0, 3, o);
        expect_code("cancelled Generate", &o->res, FLX_RPC_CANCELLED, NULL);
        uint32_t left = 0;
        for (int i = 0; i < 500; i++) {
            Fluxion__Decode__V1__SessionInfo *si = session_call(c, "GetSession", sid, 0, &res);
            CHECK(si);
            int closed = si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED;
            left = si->tokens_generated;
            fluxion__decode__v1__session_info__free_unpacked(si, NULL);
            if (closed) break;
            usleep(10000);
        }
        fprintf(stderr, "cancelled after 3 tokens read: the server generated %u of 3900\n", left);
        CHECK(left >= 3 && left < 3900);
        sid = ready_session(c, prompt, 100, 3900, NULL);
        generate(c, sid, 3900, 100, 0, o);
        expect_code("Generate past its deadline", &o->res, FLX_RPC_DEADLINE_EXCEEDED, NULL);
        for (int i = 0; i < 500; i++) {
            Fluxion__Decode__V1__SessionInfo *si = session_call(c, "GetSession", sid, 0, &res);
            int closed = si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED;
            left = si->tokens_generated;
            fluxion__decode__v1__session_info__free_unpacked(si, NULL);
            if (closed) break;
            usleep(10000);
        }
        fprintf(stderr, "deadline of 100 ms: the server generated %u of 3900\n", left);
        CHECK(left < 3900);
    }

    /* a READY session nobody claims: its lease (the node's 1.5 s; 400 ms asked by OpenSession for the
     * second) passes, it fails with the reason naming the lease it had */
    {
        flx_rpc_result_t res;
        uint64_t sid = ready_session(c, prompt, 50, 8, NULL);
        uint64_t sid2 = ready_session_lease(c, prompt, 50, 8, NULL, 400);
        usleep(1000000);
        Fluxion__Decode__V1__SessionInfo *si = session_call(c, "GetSession", sid2, 0, &res);
        CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_FAILED);
        CHECK(strstr(si->fail_reason, "lease of 400 ms"));
        fluxion__decode__v1__session_info__free_unpacked(si, NULL);
        usleep(1500000);
        si = session_call(c, "GetSession", sid, 0, &res);
        CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_FAILED);
        CHECK(strstr(si->fail_reason, "lease of 1500 ms"));
        fluxion__decode__v1__session_info__free_unpacked(si, NULL);
        generate(c, sid, 4, 5000, 0, o);
        expect_code("Generate after the lease", &o->res, FLX_RPC_FAILED_PRECONDITION, "lease");
        si = session_call(c, "WaitReady", sid, 1000, &res);
        CHECK(!si);
        expect_code("WaitReady on a failed session", &res, FLX_RPC_FAILED_PRECONDITION, "lease");
    }

    /* /metrics */
    {
        int hc;
        char *m = http_get(d.metrics_port, "/metrics", &hc);
        CHECK(hc == 200 && strstr(m, "text/plain; version=0.0.4"));
        CHECK(metric(m, "fluxion_generated_tokens_total") >= 3 * 32 + 4 * 24 + 3);
        CHECK(metric(m, "fluxion_generate_ended_total{result=\"ok\"}") == 3 + 4);
        CHECK(metric(m, "fluxion_generate_ended_total{result=\"cancelled\"}") +
                  metric(m, "fluxion_generate_ended_total{result=\"deadline_exceeded\"}") == 2);
        CHECK(metric(m, "fluxion_sessions_lease_expired_total") == 2);
        CHECK(metric(m, "fluxion_tpot_seconds_count") > 0 && metric(m, "fluxion_ttft_seconds_count") >= 9);
        CHECK(metric(m, "fluxion_host_tasks_total{blk=\"128\"}") >= 31 * 2 * 2);
        CHECK(metric(m, "fluxion_host_read_bytes_total") > 0);
        CHECK(metric(m, "fluxion_host_metadata_bytes_total") <= metric(m, "fluxion_host_read_bytes_total"));
        CHECK(metric(m, "fluxion_sessions{state=\"decoding\"}") == 0);
        free(m);
        m = http_get(d.metrics_port, "/nothing", &hc);
        CHECK(hc == 404);
        free(m);
        m = http_get(d.metrics_port, "/healthz", &hc);
        CHECK(hc == 200);
        free(m);
    }

    /* the Python client, same prompt and reference */
    run_python(&d, prompt, 600, ref, n_ref);
    run_readme_snippet(&d, prompt, 600, ref, n_ref);

    /* SIGTERM during a Generate (drain timeout 300 ms): the stream ends UNAVAILABLE, exit 0 */
    flx_rpc_client_destroy(c);
    CHECK(daemon_stop(&d, SIGTERM, 20000) == 0);
    const char *args2[] = {"--model", g_model_dir, "--model-id", "test-model", "--prefill", "local",
                           "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                           "--kv-capacity", "8M", "--threads", "2", "--drain-timeout-ms", "300", NULL};
    CHECK(daemon_start(g_daemon, args2, err, &d, &code) == 0);
    CHECK_OK(flx_rpc_client_create(d.target, 0, &c));
    {
        /* a health watcher: SERVING now, NOT_SERVING once the drain starts */
        Grpc__Health__V1__HealthCheckRequest wq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        size_t wl;
        uint8_t *wb = pb_pack(&wq.base, &wl);
        flx_rpc_stream_h watch;
        CHECK_OK(flx_rpc_stream_open(c, "/grpc.health.v1.Health/Watch", wb, wl, 0, &watch));
        free(wb);
        CHECK(watch_status(watch) == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);

        flx_rpc_result_t res;
        uint64_t sid = ready_session(c, prompt, 100, 3900, NULL);
        Fluxion__Decode__V1__GenerateRequest g = FLUXION__DECODE__V1__GENERATE_REQUEST__INIT;
        g.session_id = sid;
        size_t len;
        uint8_t *b = pb_pack(&g.base, &len);
        flx_rpc_stream_h s;
        CHECK_OK(flx_rpc_stream_open(c, "/fluxion.decode.v1.DecodeNode/Generate", b, len, 0, &s));
        free(b);
        uint32_t n = 0;
        for (;;) {
            void *m;
            size_t ml;
            flx_status_t st = flx_rpc_stream_next(s, &m, &ml, &res);
            CHECK(st >= 0);
            if (st == 0) break;
            free(m);
            if (++n == 5) {
                CHECK(kill(d.pid, SIGTERM) == 0);
                CHECK(watch_status(watch) == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
                usleep(100000);   /* inside the drain: health and new sessions */
                Grpc__Health__V1__HealthCheckRequest hq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
                size_t hl;
                uint8_t *hb = pb_pack(&hq.base, &hl);
                void *hr = NULL;
                size_t hrl;
                flx_rpc_result_t hres;
                CHECK_OK(flx_rpc_unary(c, "/grpc.health.v1.Health/Check", hb, hl, 5000, &hr, &hrl, &hres));
                free(hb);
                CHECK(hres.code == FLX_RPC_OK);
                Grpc__Health__V1__HealthCheckResponse *h = grpc__health__v1__health_check_response__unpack(NULL, hrl, hr);
                CHECK(h && h->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
                grpc__health__v1__health_check_response__free_unpacked(h, NULL);
                free(hr);
                Fluxion__Decode__V1__OpenSessionRequest r;
                Fluxion__Decode__V1__AttentionConfig a;
                Fluxion__Decode__V1__LocalPrefill lp;
                open_req(&r, &a, &lp, prompt, 40, 8);
                uint64_t x;
                flx_rpc_result_t ores;
                CHECK(open_session(c, &r, &x, &ores) == FLX_RPC_UNAVAILABLE);
                expect_code("OpenSession while draining", &ores, FLX_RPC_UNAVAILABLE, "draining");
            }
        }
        flx_rpc_stream_close(s);
        flx_rpc_stream_close(watch);
        fprintf(stderr, "SIGTERM after 5 tokens: the stream got %u tokens\n", n);
        expect_code("Generate across SIGTERM", &res, FLX_RPC_UNAVAILABLE, "draining");
        CHECK(n >= 5 && n < 3900);
    }
    flx_rpc_client_destroy(c);
    CHECK(daemon_stop(&d, 0, 20000) == 0);
    test_limits(prompt);
    free(o);
    flx_model_destroy(g_m);
}

/* A Generate stream on sid that has sent its first two tokens. */
static flx_rpc_stream_h generate_started(flx_rpc_client_h c, uint64_t sid, uint32_t max_new)
{
    flx_rpc_stream_h s = generate_open(c, sid, max_new, 0);
    for (int i = 0; i < 2; i++) {
        void *m;
        size_t ml;
        flx_rpc_result_t res;
        CHECK(flx_rpc_stream_next(s, &m, &ml, &res) == 1);
        free(m);
    }
    return s;
}

static void stream_cancel(flx_rpc_stream_h s)
{
    flx_rpc_stream_cancel(s);
    for (;;) {
        void *m;
        size_t ml;
        flx_rpc_result_t res;
        flx_status_t st = flx_rpc_stream_next(s, &m, &ml, &res);
        CHECK(st >= 0);
        if (st == 0) break;
        free(m);
    }
    flx_rpc_stream_close(s);
}

static Fluxion__Decode__V1__SessionState session_state(flx_rpc_client_h c, uint64_t sid)
{
    flx_rpc_result_t res;
    Fluxion__Decode__V1__SessionInfo *si = session_call(c, "GetSession", sid, 0, &res);
    CHECK(si);
    Fluxion__Decode__V1__SessionState st = si->state;
    fluxion__decode__v1__session_info__free_unpacked(si, NULL);
    return st;
}

typedef struct waiting_call {
    flx_rpc_client_h c;
    uint64_t sid;
    gen_out_t o;
    atomic_int done;
} waiting_call_t;

static void *waiting_call_main(void *arg)
{
    waiting_call_t *w = arg;
    generate(w->c, w->sid, 16, 60000, 0, &w->o);
    atomic_store(&w->done, 1);
    return NULL;
}

/* A node with a small session table (max-sessions 9) and a model id the metrics page must escape:
 *   - local prefill queue: while one long prompt is prefilled, sessions opened and closed behind it
 *     must not push a waiting session out of the queue (it would sit OPEN until its deadline);
 *   - nine attention configurations: eight decoding, a Generate for a ninth waits for an engine
 *     (not refused, its session not closed), a waiting call whose deadline passes ends
 *     DEADLINE_EXCEEDED, and the ninth streams its reference tokens once one of the eight ends;
 *   - /metrics escapes the model id in its label. */
static void test_limits(const int32_t *prompt)
{
    char err[600];
    snprintf(err, sizeof err, "%s/node-daemon-limits.err", g_dir);
    g_model_id = "te\"st\\m";
    const char *args[] = {"--model", g_model_dir, "--model-id", g_model_id, "--prefill", "local",
                          "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--kv-capacity", "64M",
                          "--max-sessions", "9", "--max-batch", "4", "--threads", "2", NULL};
    daemon_proc_t d;
    int code;
    if (daemon_start(g_daemon, args, err, &d, &code)) {
        fprintf(stderr, "daemon exited %d before serving; its log: %s\n", code, err);
        exit(1);
    }
    flx_rpc_client_h c;
    CHECK_OK(flx_rpc_client_create(d.target, 0, &c));

    /* the prefill queue (2 x max-sessions entries) under open/close churn behind a long prefill */
    {
        static int32_t longp[4000];
        for (uint32_t i = 0; i < 4000; i++) longp[i] = prompt[i % 600] ^ (int32_t)(i / 600);
        Fluxion__Decode__V1__OpenSessionRequest r;
        Fluxion__Decode__V1__AttentionConfig a;
        Fluxion__Decode__V1__LocalPrefill lp;
        flx_rpc_result_t res;
        uint64_t sa = 0, sb = 0, sc = 0;
        open_req(&r, &a, &lp, longp, 4000, 8);
        CHECK(open_session(c, &r, &sa, &res) == FLX_RPC_OK);
        open_req(&r, &a, &lp, prompt, 8, 8);
        CHECK(open_session(c, &r, &sb, &res) == FLX_RPC_OK);
        uint32_t behind = 0;
        for (int i = 0; i < 24; i++) {
            CHECK(open_session(c, &r, &sc, &res) == FLX_RPC_OK);
            close_session(c, sc);
            behind += session_state(c, sa) == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_RECEIVING;
        }
        fprintf(stderr, "prefill queue: %u of 24 open/close pairs ran behind the long prefill\n", behind);
        Fluxion__Decode__V1__SessionInfo *si = session_call(c, "WaitReady", sb, 30000, &res);
        if (!si) fprintf(stderr, "WaitReady of the session queued behind: %s %s\n", flx_rpc_code_name(res.code), res.msg);
        CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY);
        fluxion__decode__v1__session_info__free_unpacked(si, NULL);
        si = session_call(c, "WaitReady", sa, 30000, &res);
        CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY);
        fluxion__decode__v1__session_info__free_unpacked(si, NULL);
        close_session(c, sa);
        close_session(c, sb);
    }

    /* eight configurations decoding, a ninth waits for an engine */
    {
        Fluxion__Decode__V1__AttentionConfig fx[9];
        flx_rpc_stream_h busy[8];
        for (int i = 0; i < 9; i++) {
            fluxion__decode__v1__attention_config__init(&fx[i]);
            fx[i].mode = FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED;
            fx[i].blk = 16;
            fx[i].budget = 0.1f * (float)(i + 1);
        }
        for (int i = 0; i < 8; i++) busy[i] = generate_started(c, ready_session(c, prompt, 100, 3900, &fx[i]), 3900);

        uint64_t late = ready_session(c, prompt, 100, 8, &fx[8]);   /* a ninth, with a short deadline */
        gen_out_t *o = malloc(sizeof *o);
        generate(c, late, 8, 300, 0, o);
        expect_code("Generate waiting for an engine past its deadline", &o->res, FLX_RPC_DEADLINE_EXCEEDED, NULL);
        free(o);
        /* the node ends the waiting call too: its session closes with no token generated */
        Fluxion__Decode__V1__SessionState st = 0;
        for (int i = 0; i < 200 && st != FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED; i++) {
            st = session_state(c, late);
            if (st != FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED) usleep(10000);
        }
        CHECK(st == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_CLOSED);

        int32_t ref[16];
        uint32_t n_ref = reference(prompt + 100, 200, 16, FLX_ENGINE_ATTN_FULL, 16, 1.0f, ref);
        waiting_call_t *w = calloc(1, sizeof *w);
        w->c = c;
        w->sid = ready_session(c, prompt + 100, 200, 16, NULL);   /* FULL: a ninth configuration */
        pthread_t t;
        CHECK(pthread_create(&t, NULL, waiting_call_main, w) == 0);
        usleep(300000);
        CHECK(!atomic_load(&w->done));
        CHECK(session_state(c, w->sid) == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_DECODING);
        stream_cancel(busy[0]);
        pthread_join(t, NULL);
        expect_code("Generate that waited for an engine", &w->o.res, FLX_RPC_OK, NULL);
        same_tokens("Generate that waited for an engine", w->o.tok, w->o.n, ref, n_ref);
        free(w);
        for (int i = 1; i < 8; i++) stream_cancel(busy[i]);
    }

    {
        int hc;
        char *m = http_get(d.metrics_port, "/metrics", &hc);
        CHECK(hc == 200 && strstr(m, "fluxion_build_info{model_id=\"te\\\"st\\\\m\",prefill=\"local\"} 1\n"));
        free(m);
    }
    flx_rpc_client_destroy(c);
    CHECK(daemon_stop(&d, SIGTERM, 20000) == 0);
    g_model_id = "test-model";
}

/* The real model: Generate's text equals flx-generate's for the same prompt. */
static int test_model(void)
{
    char path[1024];
    if (!flx_test_model_path("test_node_grpc", path, sizeof path)) return FLX_TEST_SKIP;
    flx_tok_h tok;
    CHECK_OK(flx_tok_load(path, &tok));
    const char *text = "The GNU General Public License is a free, copyleft license for software. Question: what "
                       "kind of license is the GPL? Answer:";
    size_t n = 0;
    int32_t ids[256];
    CHECK_OK(flx_tok_encode(tok, text, strlen(text), flx_tok_add_bos_default(tok) && flx_tok_bos(tok) >= 0, ids, 256,
                            &n));
    char err[600];
    snprintf(err, sizeof err, "%s/node-model-daemon.err", g_dir);
    const char *args[] = {"--model", path, "--model-id", "smollm2", "--prefill", "local", "--grpc-listen", "127.0.0.1:0",
                          "--metrics-listen", "off", "--kv-capacity", "256M", "--threads", "2", NULL};
    daemon_proc_t d;
    int code;
    CHECK(daemon_start(g_daemon, args, err, &d, &code) == 0);
    flx_rpc_client_h c;
    CHECK_OK(flx_rpc_client_create(d.target, 0, &c));
    g_shape = (Fluxion__Decode__V1__ModelShape)FLUXION__DECODE__V1__MODEL_SHAPE__INIT;
    g_shape.n_layers = 30;
    g_shape.n_kv_heads = 3;
    g_shape.n_q_heads = 9;
    g_shape.head_dim = 64;
    Fluxion__Decode__V1__OpenSessionRequest r;
    Fluxion__Decode__V1__AttentionConfig a;
    Fluxion__Decode__V1__LocalPrefill lp;
    open_req(&r, &a, &lp, ids, (uint32_t)n, 24);
    r.model_id = (char *)"smollm2";
    uint64_t sid = 0;
    flx_rpc_result_t res;
    CHECK(open_session(c, &r, &sid, &res) == FLX_RPC_OK);
    Fluxion__Decode__V1__SessionInfo *si = session_call(c, "WaitReady", sid, 60000, &res);
    CHECK(si && si->state == FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY);
    fluxion__decode__v1__session_info__free_unpacked(si, NULL);

    Fluxion__Decode__V1__GenerateRequest g = FLUXION__DECODE__V1__GENERATE_REQUEST__INIT;
    Fluxion__Decode__V1__StopConditions stop = FLUXION__DECODE__V1__STOP_CONDITIONS__INIT;
    stop.max_new_tokens = 24;
    g.session_id = sid;
    g.stop = &stop;
    size_t len;
    uint8_t *b = pb_pack(&g.base, &len);
    flx_rpc_stream_h s;
    CHECK_OK(flx_rpc_stream_open(c, "/fluxion.decode.v1.DecodeNode/Generate", b, len, 120000, &s));
    free(b);
    char got[4096] = "";
    int32_t toks[64];
    uint32_t nt = 0;
    for (;;) {
        void *m;
        size_t ml;
        flx_status_t st = flx_rpc_stream_next(s, &m, &ml, &res);
        if (st == 0) break;
        Fluxion__Decode__V1__GenerateResponse *x = fluxion__decode__v1__generate_response__unpack(NULL, ml, m);
        free(m);
        CHECK(x && nt < 64);
        toks[nt++] = x->token_id;
        strncat(got, x->text, sizeof got - strlen(got) - 1);
        fluxion__decode__v1__generate_response__free_unpacked(x, NULL);
    }
    flx_rpc_stream_close(s);
    CHECK(res.code == FLX_RPC_OK && nt >= 1);
    /* the text of the same ids decoded at once (pieces must add up to it) */
    char want[4096];
    size_t wl = 0;
    CHECK_OK(flx_tok_decode(tok, toks, nt, FLX_TOK_SKIP_SPECIAL, want, sizeof want, &wl));
    want[wl] = '\0';
    fprintf(stderr, "real model answer (%u tokens): %s\n", nt, got);
    CHECK(!strcmp(got, want));
    /* and flx-generate prints the same text for the same ids (its prompt file holds the text) */
    char cmd[4096], pfile[600], ofile[600];
    snprintf(pfile, sizeof pfile, "%s/node-model-prompt.txt", g_dir);
    snprintf(ofile, sizeof ofile, "%s/node-model-generate.out", g_dir);
    FILE *f = fopen(pfile, "w");
    fputs(text, f);
    fclose(f);
    char gen_tool[1024];
    snprintf(gen_tool, sizeof gen_tool, "%s", g_daemon);
    char *slash = strrchr(gen_tool, '/');
    snprintf(slash + 1, sizeof gen_tool - (size_t)(slash + 1 - gen_tool), "flx-generate");
    snprintf(cmd, sizeof cmd, "%s --model %s --prompt-file %s --max-new 24 --threads 2 >%s 2>/dev/null", gen_tool,
             path, pfile, ofile);
    same_text_as(cmd, ofile, got);
    flx_rpc_client_destroy(c);
    CHECK(daemon_stop(&d, SIGTERM, 20000) == 0);
    flx_tok_destroy(tok);
    return 0;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 4);
    g_daemon = argv[1];
    g_dir = argv[2];
    g_py = argv[3];
    mkdir(g_dir, 0755);
    signal(SIGPIPE, SIG_IGN);
    if (argc > 4 && !strcmp(argv[4], "model")) {
        int r = test_model();
        if (r == 0) fprintf(stderr, "test_node_grpc model: ok\n");
        return r;
    }
    test_random();
    fprintf(stderr, "test_node_grpc: ok\n");
    return 0;
}
