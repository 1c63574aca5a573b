/*
 * node_bench - the decode node as a router sees it: fluxion-decoded started for real on loopback,
 * its control calls against a bare gRPC-core echo server, and the TTFT and TPOT of concurrent
 * sessions on the real model with full, fixed (16, 0.05) and Fluxion attention.
 *
 *   node_bench --daemon FLUXION_DECODED -m MODEL.gguf --text FILE --predictor W
 *              [--lens 2048,4096,8192] [--batches 1,4,8] [--steps 24] [--warm 2] [--calls 2000]
 *              [--open-calls 100] [--threads N] [--csv FILE] [--control-csv FILE] [--dir DIR]
 *
 * METHOD
 * Control calls. A child process runs a minimal echo server on gRPC core (one completion queue,
 * one polling thread, every call answered with the bytes it carried; no protobuf, no handler
 * table). One bare gRPC-core client (one channel per server, one pluck queue, one batch of the six
 * client ops per call) calls both, in pairs A B / B A (the order swapped every pair): the node's
 * NodeStatus and grpc.health.v1.Health/Check (unary no-ops) and OpenSession (a 16-token prompt;
 * WaitReady and CloseSession after it, untimed, so its prefill is over before the next pair), each
 * against the echo of the same request bytes. Ratio per pair node / echo; median and p10..p90.
 * SUMMARY's grpc_overhead_vs_echo is NodeStatus's median ratio.
 *
 * Sessions. The node runs --prefill local: OpenSession carries the prompt's token ids and the
 * node's own prefill thread (the same runtime as flx-generate) fills the store; the product path
 * (a prefill node pushing over UCX, --prefill ucx) is not what this benchmark drives. For each prompt
 * length L and batch B: B prompts of L tokens of the text (different offsets) are opened once per
 * attention mode (3B sessions, the same B prompts in every mode), all are waited READY, then all
 * 3B Generate calls start together (greedy, --steps tokens, EOS ignored). The daemon keeps one
 * engine per mode and its decode thread steps them in turn, starting one engine later each round
 * (A B C, B C A, C A B, ...), so the modes' steps are interleaved on the same machine at the same
 * time. TPOT of a mode is the wall time of its engine's step that each token reports
 * (GenerateResponse.timing.step_us: the step of B sequences), over the steps where all B were in
 * the batch, after --warm steps; the j-th such step of two modes lie in the same or adjacent
 * rounds of the decode thread: ratio per pair, median and min..max. "round" is the client-side
 * median gap between a sequence's tokens (every mode's step plus the daemon's own work and gRPC).
 * TTFT is client-side, from each Generate call (made after READY) to its first token; as the
 * calls of the three modes arrive together, a first token waits for the steps already running.
 *
 * Last line: SUMMARY grpc_overhead_vs_echo=... tpot_fluxion_vs_16_005_8k_b4=... tpot_fluxion_vs_full_8k_b4=...
 * (nan for a point not run).
 */
#define _GNU_SOURCE
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>

#include "../common/bench_stats.h"
#include "flx/cli.h"
#include "flx/tokenizer.h"
#include "node_testutil.h"

enum { MAX_LENS = 8, MAX_BATCH = 64, N_MODES = 3, OPEN_TOKENS = 16 };
#define HOUR_MS 3600000u

static const char *g_mode_name[N_MODES] = {"full", "fixed(16,0.05)", "fluxion"};
static const Fluxion__Decode__V1__AttentionMode g_mode_pb[N_MODES] = {
    FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL, FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED,
    FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION};

static void die(const char *what)
{
    fprintf(stderr, "node_bench: %s\n", what);
    exit(1);
}

static double pct(double *v, int n, double q)   /* v sorted */
{
    if (n <= 0) return NAN;
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* ---- the bare gRPC-core echo server (a child process) ---- */

typedef struct echo_call {
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *msg;
    int cancelled;
    int sent, closed;
} echo_call_t;

/* A call's tags: its address (calloc: at least 8-aligned) with the event kind in the low bits. */
enum { EV_NEW, EV_RECV, EV_SEND, EV_CLOSE };
#define EV_TAG(c, k) ((void *)((uintptr_t)(c) | (uintptr_t)(k)))

static void echo_request(grpc_server *srv, grpc_completion_queue *cq)
{
    echo_call_t *c = calloc(1, sizeof *c);
    if (!c) die("echo: out of memory");
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    if (grpc_server_request_call(srv, &c->call, &c->details, &c->md, cq, cq, EV_TAG(c, EV_NEW)) != GRPC_CALL_OK)
        die("echo: request_call refused");
}

static void echo_free(echo_call_t *c)
{
    if (c->msg) grpc_byte_buffer_destroy(c->msg);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->call) grpc_call_unref(c->call);
    free(c);
}

/* Serves until killed; writes the bound port to fd first. */
static void echo_serve(int fd)
{
    grpc_init();
    grpc_server *srv = grpc_server_create(NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv, cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(srv, "127.0.0.1:0", cr);
    grpc_server_credentials_release(cr);
    if (port <= 0) die("echo: cannot bind 127.0.0.1:0");
    grpc_server_start(srv);
    if (write(fd, &port, sizeof port) != sizeof port) die("echo: cannot report its port");
    close(fd);
    echo_request(srv, cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) break;
        echo_call_t *c = (echo_call_t *)((uintptr_t)ev.tag & ~(uintptr_t)3);
        grpc_op ops[3];
        memset(ops, 0, sizeof ops);
        switch ((uintptr_t)ev.tag & 3) {
        case EV_NEW:
            echo_request(srv, cq);
            if (!ev.success) {
                echo_free(c);
                break;
            }
            ops[0].op = GRPC_OP_RECV_MESSAGE;
            ops[0].data.recv_message.recv_message = &c->msg;
            grpc_call_start_batch(c->call, ops, 1, EV_TAG(c, EV_RECV), NULL);
            ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
            ops[0].data.recv_close_on_server.cancelled = &c->cancelled;
            grpc_call_start_batch(c->call, ops, 1, EV_TAG(c, EV_CLOSE), NULL);
            break;
        case EV_RECV:   /* the request's bytes go back as the response */
            ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
            ops[1].op = GRPC_OP_SEND_MESSAGE;
            if (!c->msg) c->msg = grpc_raw_byte_buffer_create(NULL, 0);
            ops[1].data.send_message.send_message = c->msg;
            ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
            ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
            grpc_call_start_batch(c->call, ops, 3, EV_TAG(c, EV_SEND), NULL);
            break;
        default:
            if (((uintptr_t)ev.tag & 3) == EV_SEND) c->sent = 1;
            else c->closed = 1;
            if (c->sent && c->closed) echo_free(c);
        }
    }
    _exit(0);
}

/* Forks the echo server (before this process starts gRPC) and returns its port. */
static int echo_start(pid_t *pid_p)
{
    int pfd[2];
    if (pipe(pfd)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(pfd[0]);
        echo_serve(pfd[1]);
    }
    close(pfd[1]);
    int port = 0;
    if (read(pfd[0], &port, sizeof port) != sizeof port || port <= 0) die("the echo server did not start");
    close(pfd[0]);
    *pid_p = pid;
    return port;
}

/* ---- the bare gRPC-core client: one call = one batch of the six client ops ---- */

typedef struct bare_client {
    grpc_channel *ch;
    grpc_completion_queue *cq;
} bare_client_t;

static void bare_open(bare_client_t *c, const char *target)
{
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (!c->ch || !c->cq) die("bare client: no channel");
}

static void bare_close(bare_client_t *c)
{
    grpc_channel_destroy(c->ch);
    grpc_completion_queue_shutdown(c->cq);
    grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_completion_queue_destroy(c->cq);
}

/* One unary call; returns its wall time in ns; dies unless status OK. The response's bytes go to
 * *resp_p (malloc'd, read after the clock stopped) when resp_p is not NULL, its size to *resp_len. */
static uint64_t bare_unary(bare_client_t *c, const char *method, const uint8_t *req, size_t len, uint8_t **resp_p,
                           size_t *resp_len)
{
    const uint64_t t0 = flx_now_ns();
    grpc_slice m = grpc_slice_from_static_string(method);
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(30000, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL, dl, NULL);
    grpc_slice s = grpc_slice_from_static_buffer(req, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1), *rb = NULL;
    grpc_metadata_array mi, mt;
    grpc_metadata_array_init(&mi);
    grpc_metadata_array_init(&mt);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &mi;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &rb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &mt;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    int tag;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) die("bare client: batch refused");
    grpc_event ev = grpc_completion_queue_pluck(c->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    const uint64_t t1 = flx_now_ns();
    if (ev.type != GRPC_OP_COMPLETE || code != GRPC_STATUS_OK) {
        fprintf(stderr, "node_bench: %s: status %d: %.*s\n", method, (int)code, (int)GRPC_SLICE_LENGTH(details),
                (const char *)GRPC_SLICE_START_PTR(details));
        exit(1);
    }
    *resp_len = rb ? grpc_byte_buffer_length(rb) : 0;
    if (resp_p) {
        uint8_t *o = malloc(*resp_len + 1);
        grpc_byte_buffer_reader rd;
        if (!o || (rb && !grpc_byte_buffer_reader_init(&rd, rb))) die("bare client: reading a response");
        if (rb) {
            grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
            memcpy(o, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
            grpc_slice_unref(sl);
            grpc_byte_buffer_reader_destroy(&rd);
        }
        *resp_p = o;
    }
    if (rb) grpc_byte_buffer_destroy(rb);
    grpc_byte_buffer_destroy(bb);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&mi);
    grpc_metadata_array_destroy(&mt);
    grpc_call_unref(call);
    return t1 - t0;
}

/* ---- node requests ---- */

typedef struct open_msg {
    Fluxion__Decode__V1__OpenSessionRequest r;
    Fluxion__Decode__V1__ModelShape shape;
    Fluxion__Decode__V1__AttentionConfig a;
    Fluxion__Decode__V1__LocalPrefill lp;
} open_msg_t;

static void open_msg_init(open_msg_t *o, const char *model_id, const Fluxion__Decode__V1__ModelShape *shape, int mode,
                          const int32_t *ids, uint32_t len, uint32_t max_new)
{
    fluxion__decode__v1__open_session_request__init(&o->r);
    fluxion__decode__v1__attention_config__init(&o->a);
    fluxion__decode__v1__local_prefill__init(&o->lp);
    o->shape = *shape;
    o->shape.base.descriptor = &fluxion__decode__v1__model_shape__descriptor;
    o->a.mode = g_mode_pb[mode];
    if (mode == 1) o->a.blk = 16, o->a.budget = 0.05f;
    o->lp.token_ids = (int32_t *)ids;
    o->lp.n_token_ids = len;
    o->r.model_id = (char *)model_id;
    o->r.shape = &o->shape;
    o->r.prompt_len = len;
    o->r.max_new_tokens = max_new;
    o->r.kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16;
    o->r.attention = &o->a;
    o->r.transfer_timeout_ms = HOUR_MS;   /* sessions wait in the prefill queue */
    o->r.lease_ms = HOUR_MS;              /* READY sessions wait for the others */
    o->r.local_prefill = &o->lp;
}

static uint64_t node_open(flx_rpc_client_h c, open_msg_t *o)
{
    size_t len;
    flx_rpc_result_t res;
    void *b = node_call(c, "OpenSession", &o->r.base, 30000, &len, &res);
    if (!b) {
        fprintf(stderr, "node_bench: OpenSession (prompt %u): code %d: %s\n", o->r.prompt_len, res.code, res.msg);
        exit(1);
    }
    Fluxion__Decode__V1__OpenSessionResponse *r = fluxion__decode__v1__open_session_response__unpack(NULL, len, b);
    free(b);
    if (!r) die("OpenSession: malformed response");
    uint64_t sid = r->session_id;
    fluxion__decode__v1__open_session_response__free_unpacked(r, NULL);
    return sid;
}

static void node_wait_ready(flx_rpc_client_h c, uint64_t sid)
{
    Fluxion__Decode__V1__WaitReadyRequest w = FLUXION__DECODE__V1__WAIT_READY_REQUEST__INIT;
    w.session_id = sid;
    w.timeout_ms = HOUR_MS;
    size_t len;
    flx_rpc_result_t res;
    void *b = node_call(c, "WaitReady", &w.base, HOUR_MS + 60000, &len, &res);
    Fluxion__Decode__V1__SessionInfo *si = b ? fluxion__decode__v1__session_info__unpack(NULL, len, b) : NULL;
    free(b);
    if (!si || si->state != FLUXION__DECODE__V1__SESSION_STATE__SESSION_STATE_READY) {
        fprintf(stderr, "node_bench: WaitReady %llu: code %d: %s %s\n", (unsigned long long)sid, res.code, res.msg,
                si && si->fail_reason ? si->fail_reason : "");
        exit(1);
    }
    fluxion__decode__v1__session_info__free_unpacked(si, NULL);
}

static void node_close(flx_rpc_client_h c, uint64_t sid)
{
    Fluxion__Decode__V1__CloseSessionRequest r = FLUXION__DECODE__V1__CLOSE_SESSION_REQUEST__INIT;
    r.session_id = sid;
    size_t len;
    flx_rpc_result_t res;
    void *b = node_call(c, "CloseSession", &r.base, 30000, &len, &res);
    if (!b) die("CloseSession failed");
    free(b);
}

/* ---- control calls ---- */

typedef struct ctl_result {
    const char *call;
    int pairs;
    double node_us, echo_us, med, p10, p90;
    size_t req_bytes, resp_bytes;
} ctl_result_t;

/* Pairs A B / B A (the order swapped every pair) of the node's method against the echo of the same
 * request bytes. open: the method is OpenSession; each session is then waited READY and closed
 * through rc, untimed, so that its prefill is over before the next pair. */
static ctl_result_t control(bare_client_t *node, bare_client_t *echo, flx_rpc_client_h rc, const char *name,
                            const char *method, const uint8_t *req, size_t len, int pairs, int open)
{
    double *tn = malloc((size_t)pairs * sizeof *tn), *te = malloc((size_t)pairs * sizeof *te),
           *r = malloc((size_t)pairs * sizeof *r);
    if (!tn || !te || !r) die("out of memory");
    size_t rl = 0, el = 0;
    const int warm = pairs / 10 + 2;
    for (int i = -warm; i < pairs; i++) {
        uint64_t t_echo = 0, t_node = 0;
        uint8_t *resp = NULL;
        for (int k = 0; k < 2; k++) {
            if (((k + i) & 1) == 0)
                t_echo = bare_unary(echo, "/bench.Echo/Echo", req, len, NULL, &el);
            else
                t_node = bare_unary(node, method, req, len, open ? &resp : NULL, &rl);
        }
        if (open) {
            Fluxion__Decode__V1__OpenSessionResponse *o = fluxion__decode__v1__open_session_response__unpack(NULL, rl, resp);
            if (!o) die("OpenSession: malformed response");
            node_wait_ready(rc, o->session_id);
            node_close(rc, o->session_id);
            fluxion__decode__v1__open_session_response__free_unpacked(o, NULL);
            free(resp);
        }
        if (el != len) die("the echo server answered with other bytes than it got");
        if (i >= 0) {
            tn[i] = (double)t_node / 1e3;
            te[i] = (double)t_echo / 1e3;
            r[i] = tn[i] / te[i];
        }
    }
    ctl_result_t out = {.call = name, .pairs = pairs, .req_bytes = len, .resp_bytes = rl};
    out.node_us = flx_bench_median(tn, pairs);
    out.echo_us = flx_bench_median(te, pairs);
    out.med = flx_bench_median(r, pairs);   /* sorts r: the percentiles below read it sorted */
    out.p10 = pct(r, pairs, 0.1);
    out.p90 = pct(r, pairs, 0.9);
    free(tn), free(te), free(r);
    return out;
}

/* ---- concurrent sessions ---- */

typedef struct tok_rec {
    uint64_t t_ns;          /* arrival at the client */
    uint32_t step_us;       /* the node's step that computed it (0 for the first token) */
    uint32_t batch;         /* sequences in that step */
    uint64_t host_bytes;    /* host-resident bytes this sequence read in that step */
    uint32_t streaming, heads;
} tok_rec_t;

typedef struct stream_job {
    flx_rpc_client_h c;
    pthread_barrier_t *bar;
    uint64_t sid;
    uint32_t steps;
    uint64_t t_call;
    tok_rec_t *rec;   /* (steps) */
    uint32_t n;
    flx_rpc_result_t res;
} stream_job_t;

static void *stream_main(void *arg)
{
    stream_job_t *j = arg;
    Fluxion__Decode__V1__GenerateRequest g = FLUXION__DECODE__V1__GENERATE_REQUEST__INIT;
    Fluxion__Decode__V1__StopConditions stop = FLUXION__DECODE__V1__STOP_CONDITIONS__INIT;
    stop.max_new_tokens = j->steps;
    stop.ignore_eos = 1;
    g.session_id = j->sid;
    g.stop = &stop;
    size_t len;
    uint8_t *b = pb_pack(&g.base, &len);
    pthread_barrier_wait(j->bar);
    j->t_call = flx_now_ns();
    flx_rpc_stream_h s;
    if (flx_rpc_stream_open(j->c, "/fluxion.decode.v1.DecodeNode/Generate", b, len, HOUR_MS, &s)) {
        fprintf(stderr, "node_bench: Generate: %s\n", flx_error_msg());
        exit(1);
    }
    free(b);
    for (;;) {
        void *m;
        size_t ml;
        flx_status_t st = flx_rpc_stream_next(s, &m, &ml, &j->res);
        if (st <= 0) break;
        const uint64_t now = flx_now_ns();
        Fluxion__Decode__V1__GenerateResponse *x = fluxion__decode__v1__generate_response__unpack(NULL, ml, m);
        free(m);
        if (!x || j->n >= j->steps || x->index != j->n) die("Generate: a malformed or unexpected message");
        tok_rec_t *r = &j->rec[j->n++];
        r->t_ns = now;
        r->step_us = x->timing ? (uint32_t)x->timing->step_us : 0;
        r->batch = x->timing ? x->timing->batch_size : 0;
        r->host_bytes = x->stats ? x->stats->host_bytes : 0;
        r->streaming = x->stats ? x->stats->streaming_heads : 0;
        r->heads = x->stats ? x->stats->heads : 0;
        fluxion__decode__v1__generate_response__free_unpacked(x, NULL);
    }
    flx_rpc_stream_close(s);
    return NULL;
}

typedef struct mode_result {
    double ttft_med, ttft_max;        /* ms */
    double tpot_med, tpot_min, tpot_max;   /* ms: the engine's step of B sequences */
    int n_steps;
    double host_mib;                  /* per sequence per step, mean */
    double streaming_share;           /* streaming heads / heads */
    double round_ms;                  /* client-side gap between a sequence's tokens, median */
    double vs[N_MODES][3];            /* paired ratio to each mode: median, min, max */
    double *step_ms;                  /* (n_steps) in step order */
} mode_result_t;

/* Runs one (len, batch) point: 3B sessions, every Generate at once; fills res[mode]. */
static void sessions_point(flx_rpc_client_h c, const char *model_id, const Fluxion__Decode__V1__ModelShape *shape,
                           const int32_t *ids, size_t n_ids, uint32_t L, uint32_t B, uint32_t steps, uint32_t warm,
                           mode_result_t res[N_MODES])
{
    const uint32_t n = N_MODES * B;
    stream_job_t *jobs = calloc(n, sizeof *jobs);
    pthread_t *th = calloc(n, sizeof *th);
    if (!jobs || !th) die("out of memory");
    const size_t stride = B > 1 ? (n_ids - L) / (B - 1) : 0;   /* the prompts start at different places */
    const uint64_t t0 = flx_now_ns();
    for (uint32_t b = 0; b < B; b++)
        for (int m = 0; m < N_MODES; m++) {
            open_msg_t o;
            open_msg_init(&o, model_id, shape, m, ids + b * stride, L, steps);
            jobs[m * B + b].sid = node_open(c, &o);
        }
    for (uint32_t i = 0; i < n; i++) node_wait_ready(c, jobs[i].sid);
    printf("  L %u batch %u: %u sessions prefilled by the node (local) in %.1f s\n", L, B, n,
           (double)(flx_now_ns() - t0) / 1e9);
    fflush(stdout);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, n);
    for (uint32_t i = 0; i < n; i++) {
        jobs[i].c = c;
        jobs[i].bar = &bar;
        jobs[i].steps = steps;
        jobs[i].rec = calloc(steps, sizeof(tok_rec_t));
        if (!jobs[i].rec || pthread_create(&th[i], NULL, stream_main, &jobs[i])) die("stream thread");
    }
    for (uint32_t i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (uint32_t i = 0; i < n; i++)
        if (jobs[i].res.code != FLX_RPC_OK || jobs[i].n != steps) {
            fprintf(stderr, "node_bench: Generate of session %llu: %u of %u tokens, code %d: %s\n",
                    (unsigned long long)jobs[i].sid, jobs[i].n, steps, jobs[i].res.code, jobs[i].res.msg);
            exit(1);
        }

    double *v = malloc((size_t)(n + steps) * sizeof *v);
    if (!v) die("out of memory");
    for (int m = 0; m < N_MODES; m++) {
        mode_result_t *r = &res[m];
        memset(r, 0, sizeof *r);
        for (uint32_t b = 0; b < B; b++) v[b] = (double)(jobs[m * B + b].rec[0].t_ns - jobs[m * B + b].t_call) / 1e6;
        r->ttft_med = flx_bench_median(v, (int)B);
        r->ttft_max = v[B - 1];
        /* the engine's full-batch steps after warm, from the first sequence (all B share each step) */
        const stream_job_t *j0 = &jobs[m * B];
        r->step_ms = malloc(steps * sizeof *r->step_ms);
        if (!r->step_ms) die("out of memory");
        uint32_t seen = 0;
        int ng = 0;
        for (uint32_t k = 1; k < steps; k++)
            if (j0->rec[k].batch == B && seen++ >= warm) r->step_ms[r->n_steps++] = j0->rec[k].step_us / 1e3;
        for (uint32_t k = 1 + warm; k < steps; k++) v[ng++] = (double)(j0->rec[k].t_ns - j0->rec[k - 1].t_ns) / 1e6;
        r->round_ms = ng ? flx_bench_median(v, ng) : NAN;
        double hb = 0, sh = 0, hd = 0;
        uint32_t cnt = 0;
        for (uint32_t b = 0; b < B; b++)
            for (uint32_t k = 1; k < steps; k++) {
                const tok_rec_t *t = &jobs[m * B + b].rec[k];
                hb += (double)t->host_bytes, sh += t->streaming, hd += t->heads, cnt++;
            }
        r->host_mib = cnt ? hb / cnt / 1048576.0 : NAN;
        r->streaming_share = hd > 0 ? sh / hd : NAN;
        if (r->n_steps) {
            memcpy(v, r->step_ms, (size_t)r->n_steps * sizeof *v);
            r->tpot_med = flx_bench_median(v, r->n_steps);
            r->tpot_min = v[0], r->tpot_max = v[r->n_steps - 1];
        } else {
            r->tpot_med = r->tpot_min = r->tpot_max = NAN;
        }
    }
    for (int a = 0; a < N_MODES; a++)
        for (int b = 0; b < N_MODES; b++) {
            const int np = FLX_MIN(res[a].n_steps, res[b].n_steps);
            for (int k = 0; k < np; k++) v[k] = res[a].step_ms[k] / res[b].step_ms[k];
            if (np) {
                res[a].vs[b][0] = flx_bench_median(v, np);
                res[a].vs[b][1] = v[0], res[a].vs[b][2] = v[np - 1];
            } else {
                res[a].vs[b][0] = res[a].vs[b][1] = res[a].vs[b][2] = NAN;
            }
        }
    for (int m = 0; m < N_MODES; m++) free(res[m].step_ms), res[m].step_ms = NULL;
    for (uint32_t i = 0; i < n; i++) free(jobs[i].rec);
    free(v), free(jobs), free(th);
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    const char *daemon = NULL, *model = NULL, *text_path = NULL, *pred = NULL, *lens_s = "2048,4096,8192",
               *batches_s = "1,4,8", *csv_path = NULL, *ctl_csv_path = NULL, *dir = "/tmp";
    uint64_t steps = 24, warm = 2, calls = 2000, open_calls = 100, threads = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH(0, "daemon", "PATH", &daemon, FLX_CLI_REQUIRED, "the fluxion-decoded binary to start"),
        FLX_CLI_PATH('m', "model", "PATH", &model, FLX_CLI_REQUIRED, "the model the node loads (.gguf or HF folder)"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, FLX_CLI_REQUIRED, "the text the prompts are cut from"),
        FLX_CLI_PATH(0, "predictor", "W", &pred, FLX_CLI_REQUIRED, "Fluxion predictor weights for the node"),
        FLX_CLI_STR(0, "lens", "LIST", &lens_s, 0, "prompt lengths in tokens (default 2048,4096,8192)"),
        FLX_CLI_STR(0, "batches", "LIST", &batches_s, 0, "concurrent sessions per mode (default 1,4,8)"),
        FLX_CLI_UINT(0, "steps", "N", &steps, 4, 4096, 0, "tokens per Generate, the first included (default 24)"),
        FLX_CLI_UINT(0, "warm", "N", &warm, 0, 64, 0, "full-batch steps left out of TPOT (default 2)"),
        FLX_CLI_UINT(0, "calls", "N", &calls, 0, 1000000, 0,
                     "pairs per unary no-op (NodeStatus, health Check) vs echo; 0 skips them (default 2000)"),
        FLX_CLI_UINT(0, "open-calls", "N", &open_calls, 0, 100000, 0, "pairs of OpenSession vs echo (default 100)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 0, 4096, 0, "the node's decode threads (default 0: all)"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv_path, 0, "the sessions' table as CSV"),
        FLX_CLI_PATH(0, "control-csv", "FILE", &ctl_csv_path, 0, "the control calls' table as CSV"),
        FLX_CLI_PATH(0, "dir", "DIR", &dir, 0, "where the node's log goes (default /tmp)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("node_bench", "fluxion-decoded on loopback: control calls vs a bare gRPC-core echo, "
                                               "TTFT and TPOT of concurrent sessions (full, fixed (16, 0.05), Fluxion)",
                                 opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    uint64_t lens[MAX_LENS], batches[MAX_LENS];
    uint32_t n_lens = 0, n_batches = 0;
    if (flx_cli_u64_list("lens", lens_s, 16, 1u << 20, lens, MAX_LENS, &n_lens) ||
        flx_cli_u64_list("batches", batches_s, 1, MAX_BATCH, batches, MAX_LENS, &n_batches))
        return flx_cli_usage_error(&cli, NULL);
    if (warm + 2 > steps - 1) return flx_cli_usage_error(&cli, "--steps %llu leaves fewer than 2 steps after --warm %llu",
                                                          (unsigned long long)steps, (unsigned long long)warm);
    signal(SIGPIPE, SIG_IGN);

    flx_tok_h tok;
    if (flx_tok_load(model, &tok)) return flx_cli_fail(&cli, "loading the tokenizer: %s", flx_error_msg());
    char *text;
    size_t text_len, n_ids = 0;
    if (flx_cli_read_file(text_path, (size_t)1 << 30, &text, &text_len))
        return flx_cli_fail(&cli, "--text: %s", flx_error_msg());
    flx_status_t est = flx_tok_encode(tok, text, text_len, 0, NULL, 0, &n_ids);   /* the size pass */
    int32_t *ids = est && est != FLX_ERR_CAPACITY ? NULL : malloc((n_ids + 1) * sizeof *ids);
    if (!ids || flx_tok_encode(tok, text, text_len, 0, ids, n_ids, &n_ids))
        return flx_cli_fail(&cli, "tokenizing %s: %s", text_path, flx_error_msg());
    uint64_t max_len = 0, max_b = 1;
    for (uint32_t i = 0; i < n_lens; i++) max_len = FLX_MAX(max_len, lens[i]);
    for (uint32_t i = 0; i < n_batches; i++) max_b = FLX_MAX(max_b, batches[i]);
    if (n_ids < max_len + max_b || n_ids < OPEN_TOKENS)
        return flx_cli_fail(&cli, "%s has %zu tokens: too few for prompts of %llu", text_path, n_ids,
                            (unsigned long long)max_len);

    pid_t echo_pid;
    const int echo_port = echo_start(&echo_pid);   /* forked before this process starts gRPC */

    /* the node: generous KV capacity (the arena is touched only where sessions live) */
    const long avail_kb = flx_bench_mem_available_kb();
    const uint64_t cap_mib = avail_kb > 0 ? FLX_MAX((uint64_t)avail_kb / 1024 * 6 / 10, 1024) : 8192;
    char cap_s[32], thr_s[32], batch_s[32], err_path[400];
    snprintf(cap_s, sizeof cap_s, "%lluM", (unsigned long long)cap_mib);
    snprintf(thr_s, sizeof thr_s, "%llu", (unsigned long long)threads);
    snprintf(batch_s, sizeof batch_s, "%llu", (unsigned long long)max_b);
    snprintf(err_path, sizeof err_path, "%s/node_bench-daemon.log", dir);
    const char *args[] = {"--model", model, "--model-id", "bench", "--predictor", pred, "--prefill", "local",
                          "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "off", "--kv-capacity", cap_s,
                          "--max-batch", batch_s, "--log-level", "warn",
                          /* READY sessions wait while the others prefill: the daemon's default lease and
                             transfer timeout cover the whole run */
                          "--lease-ms", "3600000", "--transfer-timeout-ms", "3600000",
                          threads ? "--threads" : NULL, thr_s, NULL};
    daemon_proc_t d;
    int code = 0;
    if (daemon_start(daemon, args, err_path, &d, &code))
        return flx_cli_fail(&cli, "%s exited with %d before serving (its log: %s)", daemon, code, err_path);
    flx_rpc_client_h rc_node;
    if (flx_rpc_client_create(d.target, 64u << 20, &rc_node)) return flx_cli_fail(&cli, "%s", flx_error_msg());

    size_t len;
    flx_rpc_result_t res;
    Fluxion__Decode__V1__NodeStatusRequest nsr = FLUXION__DECODE__V1__NODE_STATUS_REQUEST__INIT;
    void *b = node_call(rc_node, "NodeStatus", &nsr.base, 30000, &len, &res);
    Fluxion__Decode__V1__NodeStatusResponse *ns = b ? fluxion__decode__v1__node_status_response__unpack(NULL, len, b) : NULL;
    free(b);
    if (!ns || !ns->shape) return flx_cli_fail(&cli, "NodeStatus: code %d: %s", res.code, res.msg);
    Fluxion__Decode__V1__ModelShape shape = *ns->shape;
    const double per_tok = 2.0 * 2.0 * shape.n_layers * shape.n_kv_heads * shape.head_dim;   /* K and V, bf16 */
    printf("node_bench: fluxion-decoded %s pid %d on %s, model %s (%u layers, %u/%u heads, head_dim %u), "
           "%u decode threads, --prefill local (KV from the node's own prefill thread, not from a prefill node over "
           "UCX); echo server on 127.0.0.1:%d\n",
           ns->version, (int)d.pid, d.target, model, shape.n_layers, shape.n_q_heads, shape.n_kv_heads, shape.head_dim,
           ns->decode_threads, echo_port);
    fflush(stdout);

    /* 1. control calls */
    char echo_target[64];
    snprintf(echo_target, sizeof echo_target, "127.0.0.1:%d", echo_port);
    bare_client_t bn, be;
    bare_open(&bn, d.target);
    bare_open(&be, echo_target);
    ctl_result_t ctl[3];
    int n_ctl = 0;
    if (calls) {
        uint8_t *req = pb_pack(&nsr.base, &len);
        ctl[n_ctl++] = control(&bn, &be, rc_node, "NodeStatus", "/fluxion.decode.v1.DecodeNode/NodeStatus", req, len,
                               (int)calls, 0);
        free(req);
        Grpc__Health__V1__HealthCheckRequest hc = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        req = pb_pack(&hc.base, &len);
        ctl[n_ctl++] = control(&bn, &be, rc_node, "Health/Check", "/grpc.health.v1.Health/Check", req, len, (int)calls, 0);
        free(req);
    }
    if (open_calls) {
        open_msg_t o;
        open_msg_init(&o, "bench", &shape, 0, ids, OPEN_TOKENS, 4);
        uint8_t *req = pb_pack(&o.r.base, &len);
        ctl[n_ctl++] = control(&bn, &be, rc_node, "OpenSession", "/fluxion.decode.v1.DecodeNode/OpenSession", req, len,
                               (int)open_calls, 1);
        free(req);
    }
    bare_close(&bn);
    bare_close(&be);
    kill(echo_pid, SIGKILL);
    waitpid(echo_pid, NULL, 0);
    double overhead = NAN;
    if (n_ctl) {
        printf("\ncontrol calls, bare gRPC-core client, pairs node / echo of the same request bytes (order swapped "
               "every pair)\n%-14s %7s %9s %9s %9s %9s  %s\n", "call", "pairs", "req B", "node us", "echo us",
               "ratio", "p10..p90");
    }
    FILE *cf = ctl_csv_path ? fopen(ctl_csv_path, "w") : NULL;
    if (ctl_csv_path && !cf) return flx_cli_fail(&cli, "cannot create %s", ctl_csv_path);
    if (cf) fprintf(cf, "call,pairs,req_bytes,resp_bytes,node_us_median,echo_us_median,ratio_median,ratio_p10,ratio_p90\n");
    for (int i = 0; i < n_ctl; i++) {
        const ctl_result_t *x = &ctl[i];
        printf("%-14s %7d %9zu %9.1f %9.1f %9.3f  %.3f..%.3f\n", x->call, x->pairs, x->req_bytes, x->node_us,
               x->echo_us, x->med, x->p10, x->p90);
        if (cf)
            fprintf(cf, "%s,%d,%zu,%zu,%.2f,%.2f,%.4f,%.4f,%.4f\n", x->call, x->pairs, x->req_bytes, x->resp_bytes,
                    x->node_us, x->echo_us, x->med, x->p10, x->p90);
        if (!strcmp(x->call, "NodeStatus")) overhead = x->med;
    }
    if (cf) fclose(cf);
    fflush(stdout);

    /* 2. concurrent sessions */
    FILE *sf = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !sf) return flx_cli_fail(&cli, "cannot create %s", csv_path);
    if (sf)
        fprintf(sf, "len,batch,mode,ttft_ms_median,ttft_ms_max,tpot_ms_median,tpot_ms_min,tpot_ms_max,steps,"
                    "round_ms,host_mib_per_seq_step,streaming_share,vs_16_005_median,vs_16_005_min,vs_16_005_max,"
                    "vs_full_median,vs_full_min,vs_full_max\n");
    double key_fixed = NAN, key_full = NAN;
    if (n_lens && n_batches)
        printf("\nconcurrent sessions: the three modes' Generate calls at once, their steps interleaved by the node; "
               "%llu tokens each, TPOT over full-batch steps after %llu\n", (unsigned long long)steps,
               (unsigned long long)warm);
    for (uint32_t li = 0; li < n_lens; li++)
        for (uint32_t bi = 0; bi < n_batches; bi++) {
            const uint32_t L = (uint32_t)lens[li], B = (uint32_t)batches[bi];
            const double need = N_MODES * B * (L + steps + 256.0) * per_tok * 1.25;
            const long av = flx_bench_mem_available_kb();
            if (av > 0 && need > (double)av * 1024.0 - (1u << 30)) {
                printf("  L %u batch %u: skipped: its %u sessions need about %.1f GiB, MemAvailable is %.1f GiB\n", L, B,
                       N_MODES * B, need / 1073741824.0, av / 1048576.0);
                continue;
            }
            mode_result_t r[N_MODES];
            sessions_point(rc_node, "bench", &shape, ids, n_ids, L, B, (uint32_t)steps, (uint32_t)warm, r);
            printf("%6s %5s %-15s %9s %9s %9s %15s %6s %9s %10s %8s %22s %22s\n", "L", "batch", "mode", "TTFT ms",
                   "TTFT max", "TPOT ms", "min..max", "steps", "round ms", "host MiB", "stream", "vs fixed(16,0.05)",
                   "vs full");
            for (int m = 0; m < N_MODES; m++) {
                const mode_result_t *x = &r[m];
                char range[32], vf[40], vu[40];
                snprintf(range, sizeof range, "%.1f..%.1f", x->tpot_min, x->tpot_max);
                snprintf(vf, sizeof vf, "%.3f [%.3f, %.3f]", x->vs[1][0], x->vs[1][1], x->vs[1][2]);
                snprintf(vu, sizeof vu, "%.3f [%.3f, %.3f]", x->vs[0][0], x->vs[0][1], x->vs[0][2]);
                printf("%6u %5u %-15s %9.2f %9.2f %9.2f %15s %6d %9.2f %10.2f %8.3f %22s %22s\n", L, B, g_mode_name[m],
                       x->ttft_med, x->ttft_max, x->tpot_med, range, x->n_steps, x->round_ms, x->host_mib,
                       m == 2 ? x->streaming_share : 0.0, m == 1 ? "-" : vf, m == 0 ? "-" : vu);
                if (sf)
                    fprintf(sf, "%u,%u,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%.3f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", L,
                            B, m == 0 ? "full" : m == 1 ? "fixed_16_005" : "fluxion", x->ttft_med, x->ttft_max,
                            x->tpot_med, x->tpot_min, x->tpot_max, x->n_steps, x->round_ms, x->host_mib,
                            m == 2 ? x->streaming_share : 0.0, x->vs[1][0], x->vs[1][1], x->vs[1][2], x->vs[0][0],
                            x->vs[0][1], x->vs[0][2]);
            }
            fflush(stdout);
            if (L == 8192 && B == 4) key_fixed = r[2].vs[1][0], key_full = r[2].vs[0][0];
        }
    if (sf) fclose(sf);

    fluxion__decode__v1__node_status_response__free_unpacked(ns, NULL);
    flx_rpc_client_destroy(rc_node);
    const int dc = daemon_stop(&d, SIGTERM, 60000);
    if (dc != 0) return flx_cli_fail(&cli, "fluxion-decoded exited with %d after SIGTERM (its log: %s)", dc, err_path);
    flx_tok_destroy(tok);
    free(ids), free(text);
    printf("SUMMARY grpc_overhead_vs_echo=%.3f tpot_fluxion_vs_16_005_8k_b4=%.3f tpot_fluxion_vs_full_8k_b4=%.3f\n",
           overhead, key_fixed, key_full);
    return 0;
}
