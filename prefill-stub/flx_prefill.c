/*
 * flx-prefill - plays a prefill node: computes a prompt's KV cache (a real prefill of a text with the
 * real model, or the synthetic workload at any shape up to 128K tokens) with the statistics Fluxion
 * needs, and pushes it to a decode node over UCX layer by layer while it computes.
 *
 *   flx-prefill (--control HOST:PORT | --node HOST:PORT --session ID --token HEX)
 *               (--model M --prompt-file F [--chat] | --synthetic --prompt-len N [--seed S]) [options]
 *
 * DESIGN
 * The session's shape and window segments come from the node (HELLO -> WELCOME), so the command
 * line needs only what a router hands out: the node's address, the session id and its token. With
 * --control it is its own router: NodeStatus (model id, shape), then OpenSession over gRPC with the
 * length of the prompt it tokenized (the model is loaded and the text tokenized first, so the
 * session's deadline is not spent on loading), then "SESSION ID" on stdout for a client's Generate.
 * The
 * prefill is the engine's own (flx_engine_prefill_run: the same forward pass and the same
 * statistics as the in-process path), with a sink that packs each layer into the wire's GRANULE
 * order, cuts it on the node's segments (flx_tp_plan_layer: host-resident parts rendezvous, window
 * parts eager) and hands the chunks to the sender, which moves them while the next layer computes.
 * A layer's packed buffer is freed when its last chunk has been sent; at most two layers are in
 * flight, so memory stays at a few layers whatever the prompt length.
 *
 * Fault injection (tests, demos) acts on the wire exactly as a broken peer would: die (SIGKILL)
 * after N bytes landed, stall (stop sending, stay connected and alive) after N bytes, corrupt the
 * payload of chunk I after its hash was taken, a wrong token, a chunk outside the session, chunk I
 * twice, and a refused message (a wrong token) after layer 0's chunks, the process stopped (SIGSTOP)
 * as soon as it has gone out: a frozen peer whose connection the node drops while its chunks are
 * still in flight; and a process stopped in the middle of writing a message into the transport (its
 * payload sits on a page it cannot read, and the fault raises SIGSTOP inside UCX's copy): over
 * shared memory that is a claimed and never finished element of the node's receive FIFO.
 *
 * Exit status (flx/cli.h): 0 when the node reports the session READY; 1 when it fails (the node's
 * reason is printed), OpenSession is refused, the connection fails or the model cannot run; 2 for a
 * usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/features.h"
#include "flx/forward.h"
#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/pool.h"
#include "flx/prefill_control.h"
#include "flx/rpc.h"
#include "flx/sampling.h"
#include "flx/synth.h"
#include "flx/tokenizer.h"
#include "flx/transport.h"
#include "flx/util.h"
#include "fluxion/decode/v1/decode.pb-c.h"

#define PROG "flx-prefill"
#define FLX_PREFILL_MAX_SESSIONS 16

typedef struct opts {
    const char *node, *control, *model, *prompt_file, *token_hex, *session, *model_id;
    char host[FLX_TP_HOST_MAX];
    uint16_t port;
    uint64_t sid;                /* the first of sids */
    uint64_t sids[FLX_PREFILL_MAX_SESSIONS];
    uint8_t tokens[FLX_PREFILL_MAX_SESSIONS][FLX_TP_TOKEN_BYTES];
    uint32_t n_sessions;         /* --node: the sessions of --session / --token, pushed in order */
    int chat, synthetic, quiet, pregenerate, no_hash, mode, blk_i;
    uint64_t prompt_len, seed, threads, max_chunk_mib, progress_ms, timeout_ms;
    uint64_t max_new, transfer_timeout_ms, lease_ms;
    double tau, temp, top_p, bgt;
    uint64_t top_k;
    int err_mode_i;
    flx_tp_err_mode_t err_mode;
    /* faults (UINT64_MAX: off) */
    uint64_t die_after, stall_after, corrupt_chunk, dup_chunk;
    int wrong_token, outside_chunk, freeze_after_refused, freeze_mid_send;
} opts_t;

static const char *const MODES[] = {"full", "fixed", "fluxion", NULL};
static const char *const BLKS[] = {"16", "32", "64", "128", NULL};
static const char *const ERR_MODES[] = {"peer", "none", NULL};

/* "HOST:PORT" with a port in [1, 65535] into host (cap bytes) and *port. */
static flx_status_t parse_hostport(const char *opt, const char *v, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(v, ':');
    uint64_t pt;
    if (!colon || colon == v || (size_t)(colon - v) >= cap || flx_parse_u64(colon + 1, 1, 65535, &pt))
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s' is not HOST:PORT with a port in 1..65535", opt, v);
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = 0;
    *port = (uint16_t)pt;
    return FLX_OK;
}

/* Parses the command line (flx/cli.h); returns FLX_CLI_PROCEED or the exit code. */
static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1, o->max_chunk_mib = 16, o->progress_ms = 1000, o->timeout_ms = 60000, o->tau = 0.1;
    o->top_p = 1.0, o->max_new = 256, o->bgt = 0.05;
    o->die_after = o->stall_after = o->corrupt_chunk = o->dup_chunk = UINT64_MAX;
    flx_cli_opt_t opts[] = {
        FLX_CLI_STR(0, "control", "HOST:PORT", &o->control, 0,
                    "the decode node's gRPC control service: open the session with OpenSession (as a router\n"
                    "would), then push its KV; prints 'SESSION ID' on stdout first"),
        FLX_CLI_STR(0, "node", "HOST:PORT", &o->node, 0,
                    "the node's UCX listener, for a session someone else opened (with --session, --token)"),
        FLX_CLI_STR(0, "session", "ID[,ID..]", &o->session, 0,
                    "the session id (decimal or 0x hex); with --pregenerate up to 16, comma-separated:\n"
                    "the same prompt pushed into each in turn over one connection (the first on a new\n"
                    "connection, the others on a warm one)"),
        FLX_CLI_STR(0, "token", "HEX[,HEX..]", &o->token_hex, 0,
                    "the session's 128-bit transfer token, 32 hex digits (one per --session)"),
        FLX_CLI_PATH('m', "model", "M", &o->model, 0, "a .gguf file or Hugging Face folder: a real prefill"),
        FLX_CLI_PATH('f', "prompt-file", "F", &o->prompt_file, 0, "the text of the real prefill ('-': stdin)"),
        FLX_CLI_FLAG(0, "chat", &o->chat, "wrap the text with the model's chat template (as flx-generate --chat)"),
        FLX_CLI_FLAG(0, "synthetic", &o->synthetic, "the synthetic workload (flx/synth.h) at the node's shape"),
        FLX_CLI_UINT(0, "prompt-len", "N", &o->prompt_len, 1, 1u << 30, 0, "synthetic: tokens"),
        FLX_CLI_UINT('s', "seed", "S", &o->seed, 0, UINT64_MAX, 0,
                     "synthetic workload seed / first-token sampling seed (default 1)"),
        FLX_CLI_FLAG(0, "pregenerate", &o->pregenerate,
                     "compute every layer first, then push them all (a transfer measured at the transport's\n"
                     "speed, not the prefill's; memory: the whole session's KV)"),
        FLX_CLI_ENUM(0, "mode", &o->mode, MODES, 0,
                     "--control: the session's attention (default full; fluxion makes the node ask for the\n"
                     "statistics)"),
        FLX_CLI_ENUM(0, "blk", &o->blk_i, BLKS, 0, "--control --mode fixed: logical block size (default 16)"),
        FLX_CLI_FLOAT(0, "bgt", "X", &o->bgt, 0.0, 1.0, 0, "--control --mode fixed: budget (default 0.05)"),
        FLX_CLI_UINT('n', "max-new", "N", &o->max_new, 1, 1u << 20, 0,
                     "--control: tokens the session reserves room for (default 256)"),
        FLX_CLI_STR(0, "model-id", "ID", &o->model_id, 0, "--control: the model id (default: the node's)"),
        FLX_CLI_UINT(0, "transfer-timeout-ms", "MS", &o->transfer_timeout_ms, 1, 3600000, 0,
                     "--control: the session must be READY within this (default: the node's)"),
        FLX_CLI_UINT(0, "lease-ms", "MS", &o->lease_ms, 1, 3600000, 0,
                     "--control: a READY session waits this long for its Generate (default: the node's)"),
        FLX_CLI_FLOAT(0, "tau", "X", &o->tau, 0.0, 1.0, FLX_CLI_LO_OPEN | FLX_CLI_HI_OPEN,
                      "Eq. 2 threshold of the statistics (default 0.1); sent when the node asks for them"),
        FLX_CLI_FLOAT(0, "temp", "T", &o->temp, 0.0, 1e6, 0, "first-token sampling temperature (default 0: greedy)"),
        FLX_CLI_UINT(0, "top-k", "K", &o->top_k, 0, 1u << 30, 0, "first-token top-k (0: all)"),
        FLX_CLI_FLOAT(0, "top-p", "P", &o->top_p, 0.0, 1.0, FLX_CLI_LO_OPEN, "first-token nucleus mass (default 1)"),
        FLX_CLI_UINT('t', "threads", "N", &o->threads, 1, 1024, 0,
                     "prefill workers (default: FLX_THREADS, else the CPU budget)"),
        FLX_CLI_UINT(0, "max-chunk-mib", "N", &o->max_chunk_mib, 1, 1u << 20, 0, "largest chunk, MiB (default 16)"),
        FLX_CLI_FLAG(0, "no-payload-hash", &o->no_hash,
                     "send KV payloads without their XXH3 (a node that requires them refuses them)"),
        FLX_CLI_ENUM(0, "err-mode", &o->err_mode_i, ERR_MODES, 0,
                     "UCX peer-failure detection; the node's ucx-err-mode must match (none for shared\n"
                     "memory on UCX 1.13; default peer)"),
        FLX_CLI_UINT(0, "timeout-ms", "MS", &o->timeout_ms, 1, 86400000, 0,
                     "wait this long for the node's answers (default 60000)"),
        FLX_CLI_UINT(0, "progress-ms", "MS", &o->progress_ms, 1, 86400000, 0, "print progress this often (default 1000)"),
        FLX_CLI_FLAG(0, "quiet", &o->quiet, "print only the result"),
        FLX_CLI_UINT(0, "die-after-bytes", "N", &o->die_after, 0, UINT64_MAX, 0,
                     "fault: SIGKILL itself once N KV bytes have been sent"),
        FLX_CLI_UINT(0, "stall-after-bytes", "N", &o->stall_after, 0, UINT64_MAX, 0,
                     "fault: stop sending after N KV bytes, stay connected until the node gives up"),
        FLX_CLI_UINT(0, "corrupt-chunk", "I", &o->corrupt_chunk, 0, UINT32_MAX, 0,
                     "fault: flip a payload byte of KV chunk I (0-based) after hashing it"),
        FLX_CLI_FLAG(0, "wrong-token", &o->wrong_token, "fault: send the chunks with a wrong token"),
        FLX_CLI_FLAG(0, "outside-chunk", &o->outside_chunk, "fault: send one chunk past the session's prompt"),
        FLX_CLI_UINT(0, "duplicate-chunk", "I", &o->dup_chunk, 0, UINT32_MAX, 0, "fault: send KV chunk I twice"),
        FLX_CLI_FLAG(0, "freeze-after-refused", &o->freeze_after_refused,
                     "fault: after layer 0's chunks send a message with a wrong token (the node refuses it and\n"
                     "drops the connection) and stop (SIGSTOP) once it has gone out, chunks still in flight"),
        FLX_CLI_FLAG(0, "freeze-mid-send", &o->freeze_mid_send,
                     "fault: stop (SIGSTOP) inside UCX while it copies layer 0's first eager chunk into the\n"
                     "transport (SIGCONT goes on with the copy)"),
    };
    flx_cli_t cli = FLX_CLI_INIT(PROG, "Computes a prompt's KV cache and statistics and pushes them to a decode node "
                                       "over UCX, layer by layer, as a prefill node does.",
                                 opts);
    cli.synopsis = "(--control HOST:PORT | --node HOST:PORT --session ID[,ID..] --token HEX[,HEX..])\n"
                   "       (--model M --prompt-file F [--chat] | --synthetic --prompt-len N) [options]";
    cli.epilog = "The node's WELCOME gives the session's shape and window; UCX_TLS / UCX_NET_DEVICES pick the "
                 "transport.\nstdout: 'SESSION ID' (--control, before the push), then 'READY 0xID BYTES bytes "
                 "first_token T'.\nexit 1 also when the node reports the session FAILED (its reason on stderr).";
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const int control = o->control != NULL;
    if (flx_cli_exclusive(&cli, "control", "node", 1) || flx_cli_exclusive(&cli, "model", "synthetic", 1) ||
        flx_cli_applies(&cli, !control, "with --control (OpenSession gives them)", "session", "token", NULL) ||
        flx_cli_applies(&cli, control, "without --control (the session is opened already)", "mode", "blk", "bgt",
                        "max-new", "model-id", "transfer-timeout-ms", "lease-ms", NULL) ||
        flx_cli_applies(&cli, o->mode == 1, "unless --mode fixed", "blk", "bgt", NULL) ||
        flx_cli_applies(&cli, o->synthetic, "without --synthetic", "prompt-len", NULL) ||
        flx_cli_applies(&cli, !o->synthetic, "with --synthetic", "prompt-file", "chat", NULL))
        return flx_cli_usage_error(&cli, NULL);
    if (!control && (!o->session || !o->token_hex))
        return flx_cli_usage_error(&cli, "--node needs --session and --token");
    if (o->model && !o->prompt_file) return flx_cli_usage_error(&cli, "--model needs --prompt-file");
    if (o->synthetic && !o->prompt_len) return flx_cli_usage_error(&cli, "--synthetic needs --prompt-len");
    if (o->node && parse_hostport("node", o->node, o->host, sizeof o->host, &o->port))
        return flx_cli_usage_error(&cli, NULL);
    if (control) {
        char h[FLX_TP_HOST_MAX];
        uint16_t pt;
        if (parse_hostport("control", o->control, h, sizeof h, &pt)) return flx_cli_usage_error(&cli, NULL);
    }
    if (o->session) {
        if (flx_cli_id_list("session", o->session, o->sids, FLX_PREFILL_MAX_SESSIONS, &o->n_sessions))
            return flx_cli_usage_error(&cli, NULL);
        o->sid = o->sids[0];
    }
    if (o->token_hex) {
        uint32_t n;
        if (flx_cli_hex_list("token", o->token_hex, FLX_TP_TOKEN_BYTES, &o->tokens[0][0], FLX_PREFILL_MAX_SESSIONS,
                             &n))
            return flx_cli_usage_error(&cli, NULL);
        if (n != o->n_sessions)
            return flx_cli_usage_error(&cli, "--token: %u token(s) for %u session(s)", n, o->n_sessions);
    }
    if (o->n_sessions > 1) {
        if (!o->pregenerate)
            return flx_cli_usage_error(&cli, "several sessions need --pregenerate (the prompt is computed once)");
        if (o->die_after != UINT64_MAX || o->stall_after != UINT64_MAX || o->corrupt_chunk != UINT64_MAX ||
            o->dup_chunk != UINT64_MAX || o->wrong_token || o->outside_chunk || o->freeze_after_refused ||
            o->freeze_mid_send)
            return flx_cli_usage_error(&cli, "the fault flags take one session");
    }
    o->err_mode = o->err_mode_i ? FLX_TP_ERR_NONE : FLX_TP_ERR_PEER;
    return FLX_CLI_PROCEED;
}

/* ---- pushing ---- */

typedef struct layer_buf {
    struct push *push;
    uint8_t *data;               /* the layer's chunks, packed one after the other */
    atomic_int refs;             /* the producer + one per chunk in flight */
} layer_buf_t;

typedef struct push {
    const opts_t *o;
    flx_tp_sender_h snd;
    flx_tp_ref_t ref;
    flx_tp_welcome_t w;
    uint64_t max_chunk;
    uint64_t chunk_index;        /* KV chunks sent so far */
    uint64_t kv_bytes;           /* KV bytes sent (the commit's total) */
    uint32_t n_stats;
    atomic_uint_fast64_t bytes_landed;
    uint64_t t_start, t_last_print;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    uint32_t hash_flag;          /* FLX_TP_SEND_NO_HASH with --no-payload-hash */
    uint32_t layers_inflight;    /* guarded by lock */
    int stalled;
    struct prepared *all;        /* --pregenerate: (n_layers) packed layers, pushed after the prefill
                                  * into each session and freed together after the last commit */
} push_t;

static void layer_unref(layer_buf_t *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1) return;
    push_t *p = b->push;
    flx_aligned_free(b->data);
    free(b);
    pthread_mutex_lock(&p->lock);
    p->layers_inflight--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
}

typedef struct chunk_ctx {
    layer_buf_t *buf;
    uint64_t bytes;
} chunk_ctx_t;

static void chunk_sent(void *ctx, flx_status_t st)
{
    chunk_ctx_t *c = ctx;
    push_t *p = c->buf->push;
    if (st == FLX_OK) {
        uint64_t done = atomic_fetch_add(&p->bytes_landed, c->bytes) + c->bytes;
        if (done >= p->o->die_after) {
            fprintf(stderr, PROG ": --die-after-bytes %" PRIu64 ": dying now (SIGKILL) with sends in flight\n",
                    p->o->die_after);
            raise(SIGKILL);
        }
    }
    layer_unref(c->buf);
    free(c);
}

static void progress(push_t *p, uint32_t layer, int force)
{
    const uint64_t now = flx_now_ns();
    if (p->o->quiet || (!force && now - p->t_last_print < p->o->progress_ms * 1000000)) return;
    p->t_last_print = now;
    const double s = (double)(now - p->t_start) / 1e9, landed = (double)atomic_load(&p->bytes_landed);
    fprintf(stderr, PROG ": layer %u/%u, %.1f MiB sent, %.1f MiB landed, %.1f MB/s over %.1f s\n", layer,
            p->w.n_layers, (double)p->kv_bytes / 1048576.0, landed / 1048576.0, s > 0 ? landed / s / 1e6 : 0.0, s);
}

/* Waits until fewer than max layers are in flight. */
static void throttle(push_t *p, uint32_t max)
{
    pthread_mutex_lock(&p->lock);
    while (p->layers_inflight >= max) pthread_cond_wait(&p->cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* Packs rows [t0, t1) of kv heads [h0, h1) from k, v (Hkv, stride, D) in GRANULE order. */
static uint8_t *pack_granules(uint8_t *dst, const flx_bf16_t *k, const flx_bf16_t *v, uint32_t stride, uint32_t D,
                              uint32_t h0, uint32_t h1, uint32_t t0, uint32_t t1)
{
    for (uint32_t h = h0; h < h1; h++)
        for (uint32_t g = t0; g < t1; g += 16) {
            const size_t rows = FLX_MIN(16u, t1 - g), bytes = rows * D * sizeof(flx_bf16_t);
            const size_t off = ((size_t)h * stride + g) * D;
            memcpy(dst, k + off, bytes);
            dst += bytes;
            memcpy(dst, v + off, bytes);
            dst += bytes;
        }
    return dst;
}

/* --freeze-after-refused: the refused message went out (the sender's progress thread). */
static void freeze_now(void *ctx, flx_status_t st)
{
    (void)ctx, (void)st;
    raise(SIGSTOP);
}

/* --freeze-mid-send: a chunk's payload on pages that cannot be read. UCX's copy of it into the
 * transport (shared memory: into the node's FIFO element it has just claimed) faults; the handler
 * stops the process there, and if it is continued makes the pages readable so the copy goes on. */
static uint8_t *g_poison;
static size_t g_poison_len;

static void poison_hit(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    const uint8_t *a = si->si_addr;
    if (g_poison && a >= g_poison && a < g_poison + g_poison_len) {
        raise(SIGSTOP);
        mprotect(g_poison, g_poison_len, PROT_READ);
        return;
    }
    signal(sig, SIG_DFL); /* any other fault is a crash: it faults again, by default */
}

static const uint8_t *poison_copy(const uint8_t *src, size_t bytes)
{
    uint8_t *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    memcpy(m, src, bytes);
    struct sigaction sa = {.sa_sigaction = poison_hit, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) || mprotect(m, bytes, PROT_NONE)) { /* the kernel rounds to pages */
        munmap(m, bytes);
        return NULL;
    }
    g_poison_len = bytes;
    g_poison = m; /* left mapped: the send may read it whenever the process goes on */
    return m;
}

/* Sends an already-built KV header with payload (fault injection goes through here). */
static flx_status_t send_raw_kv(push_t *p, flx_tp_hdr_t *h, const void *payload, uint32_t flags, chunk_ctx_t *cc)
{
    uint8_t hdr[FLX_TP_HDR_BYTES];
    flx_tp_hdr_encode(h, hdr);
    return flx_tp_send_raw(p->snd, hdr, payload, h->payload_len, flags, cc ? chunk_sent : NULL, cc);
}

/* One layer packed for the wire: its chunks (plan order, one after the other in buf) and a copy of
 * its statistics. */
typedef struct prepared {
    uint32_t layer, n_chunks;
    flx_tp_plan_chunk_t *plan;
    uint64_t *hash;              /* (n_chunks) each chunk's payload XXH3, taken as it was packed; or NULL */
    layer_buf_t *buf;
    flx_head_stats_t *stats;     /* (Hq) or NULL */
    float *mean_k, *q_anchor;    /* (Hq, D) */
} prepared_t;

static void prepared_free(prepared_t *pl)
{
    free(pl->plan);
    free(pl->hash);
    free(pl->stats);
    free(pl->mean_k);
    free(pl->q_anchor);
    if (pl->buf) layer_unref(pl->buf);
    memset(pl, 0, sizeof *pl);
}

/* A layer's buffer on transparent huge pages where the kernel gives them: the node's rendezvous reads
 * it page by page (CMA pins each page of the source), 2 MiB pages make that 512 times fewer. */
static uint8_t *layer_alloc(uint64_t bytes)
{
    const size_t huge = 2u << 20, len = (size_t)(bytes + huge - 1) / huge * huge;
    uint8_t *m = flx_aligned_alloc(huge, len);
    if (m) (void)madvise(m, len, MADV_HUGEPAGE);
    return m;
}

/* Plans and packs one layer (k, v (Hkv, n, D)) and copies its statistics. */
static flx_status_t layer_pack(push_t *p, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                               const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor,
                               prepared_t *pl)
{
    const uint32_t D = p->w.head_dim, Hq = p->w.n_q_heads;
    if (n != p->w.prompt_len)
        return flx_error_set(FLX_ERR_INVALID, "layer %u has %u tokens, the session %u", layer, n, p->w.prompt_len);
    memset(pl, 0, sizeof *pl);
    pl->layer = layer;
    pl->n_chunks = flx_tp_plan_layer(&p->w, layer, p->max_chunk, NULL, 0);
    pl->plan = malloc(pl->n_chunks * sizeof *pl->plan);
    if (!p->hash_flag) pl->hash = malloc(pl->n_chunks * sizeof *pl->hash);
    layer_buf_t *b = calloc(1, sizeof *b);
    const uint64_t layer_bytes = 4ull * p->w.n_kv_heads * n * D;
    if (b) b->data = layer_alloc(layer_bytes);
    if (stats) {
        pl->stats = malloc(Hq * sizeof *pl->stats);
        pl->mean_k = malloc((size_t)Hq * D * sizeof(float));
        pl->q_anchor = malloc((size_t)Hq * D * sizeof(float));
    }
    if (!pl->plan || (!p->hash_flag && !pl->hash) || !b || !b->data ||
        (stats && (!pl->stats || !pl->mean_k || !pl->q_anchor))) {
        if (b) flx_aligned_free(b->data);
        free(b);
        prepared_free(pl);
        return flx_error_set(FLX_ERR_NOMEM, "layer %u: %llu bytes", layer, (unsigned long long)layer_bytes);
    }
    b->push = p;
    atomic_init(&b->refs, 1);
    pl->buf = b;
    pthread_mutex_lock(&p->lock);
    p->layers_inflight++;
    pthread_mutex_unlock(&p->lock);
    flx_tp_plan_layer(&p->w, layer, p->max_chunk, pl->plan, pl->n_chunks);
    /* Each chunk hashed right after it is packed, while its bytes are still in cache: a prefill node
     * hashes what it produces, and the send then only queues it. */
    uint8_t *dst = b->data;
    for (uint32_t i = 0; i < pl->n_chunks; i++) {
        const flx_kv_chunk_t *c = &pl->plan[i].chunk;
        uint8_t *chunk = dst;
        dst = pack_granules(dst, k, v, n, D, c->head_begin, c->head_end, c->tok_begin, c->tok_end);
        if (pl->hash) pl->hash[i] = flx_tp_hash(chunk, (size_t)(dst - chunk));
    }
    if (stats) {
        memcpy(pl->stats, stats, Hq * sizeof *stats);
        memcpy(pl->mean_k, mean_k, (size_t)Hq * D * sizeof(float));
        memcpy(pl->q_anchor, q_anchor, (size_t)Hq * D * sizeof(float));
    }
    return FLX_OK;
}

/* Sends chunk i of a packed layer with the hash taken when it was packed (or none). */
static flx_status_t send_chunk(push_t *p, const prepared_t *pl, uint32_t i, const uint8_t *payload, chunk_ctx_t *cc)
{
    const flx_kv_chunk_t *c = &pl->plan[i].chunk;
    const uint32_t flags = pl->plan[i].send_flags;
    return pl->hash ? flx_tp_send_kv_hashed(p->snd, &p->ref, c, payload, pl->hash[i], flags, chunk_sent, cc)
                    : flx_tp_send_kv(p->snd, &p->ref, c, payload, flags | FLX_TP_SEND_NO_HASH, chunk_sent, cc);
}

/* Sends a packed layer into the session p->ref (with the faults asked for); the caller frees it (its
 * buffer lives until the last chunk has been sent). */
static flx_status_t layer_send(push_t *p, prepared_t *pl)
{
    const opts_t *o = p->o;
    const uint32_t D = p->w.head_dim, n = p->w.prompt_len;
    layer_buf_t *b = pl->buf;
    uint8_t *payload = b->data;
    flx_status_t st = FLX_OK;
    for (uint32_t i = 0; i < pl->n_chunks && !st; i++) {
        const flx_kv_chunk_t *c = &pl->plan[i].chunk;
        const uint64_t bytes = flx_kv_chunk_bytes(c);
        if (p->kv_bytes + bytes > o->stall_after) {
            p->stalled = 1;
            break;
        }
        const uint64_t idx = p->chunk_index;
        const uint8_t *src = payload;   /* what the chunk is sent from */
        if (o->freeze_mid_send && pl->layer == 0 && !g_poison && idx != o->corrupt_chunk &&
            (pl->plan[i].send_flags & FLX_TP_SEND_EAGER)) {
            if (!(src = poison_copy(payload, bytes))) {
                st = flx_error_set(FLX_ERR_NOMEM, "--freeze-mid-send: %s", strerror(errno));
                break;
            }
            fprintf(stderr, PROG ": --freeze-mid-send: layer 0 tokens [%u, %u) sent from an unreadable page\n",
                    c->tok_begin, c->tok_end);
        }
        chunk_ctx_t *cc = malloc(sizeof *cc);
        if (!cc) {
            st = flx_error_set(FLX_ERR_NOMEM, "chunk");
            break;
        }
        cc->buf = b;
        cc->bytes = bytes;
        atomic_fetch_add(&b->refs, 1);
        p->chunk_index++;
        if (idx == o->corrupt_chunk) {
            flx_tp_hdr_t h = {.kind = FLX_TP_KV, .sid = p->ref.sid, .layer = c->layer, .head_begin = c->head_begin,
                              .head_end = c->head_end, .tok_begin = c->tok_begin, .tok_end = c->tok_end, .arg0 = D};
            memcpy(h.token, p->ref.token, FLX_TP_TOKEN_BYTES);
            flx_tp_hdr_set_payload(&h, payload, bytes, 1);
            payload[bytes / 2] ^= 0x40; /* after the hash: what the node receives is not what was hashed */
            fprintf(stderr, PROG ": --corrupt-chunk %" PRIu64 ": layer %u tokens [%u, %u) corrupted after hashing\n",
                    idx, c->layer, c->tok_begin, c->tok_end);
            st = send_raw_kv(p, &h, payload, pl->plan[i].send_flags, cc);
        } else {
            st = send_chunk(p, pl, i, src, cc);
        }
        if (st) {   /* not queued: it ends here, with the error, as a failed send would */
            chunk_sent(cc, st);
            break;
        }
        if (idx == o->dup_chunk) {
            chunk_ctx_t *c2 = malloc(sizeof *c2);
            if (c2) {   /* not from *cc: its send may have completed and freed it already */
                c2->buf = b;
                c2->bytes = 0;
                atomic_fetch_add(&b->refs, 1);
                fprintf(stderr, PROG ": --duplicate-chunk %" PRIu64 ": layer %u tokens [%u, %u) sent twice\n", idx,
                        c->layer, c->tok_begin, c->tok_end);
                st = send_chunk(p, pl, i, payload, c2);
                if (st) chunk_sent(c2, st);
            }
        }
        if (!st) p->kv_bytes += bytes;
        payload += bytes;
    }
    if (!st && !p->stalled && pl->layer == 0 && o->outside_chunk) {
        /* one granule of head 0 just past the prompt, with the right token and a valid header */
        const uint32_t t0 = (n + 15) & ~15u;
        flx_tp_hdr_t h = {.kind = FLX_TP_KV, .sid = p->ref.sid, .layer = 0, .head_begin = 0, .head_end = 1,
                          .tok_begin = t0, .tok_end = t0 + 16, .arg0 = D};
        memcpy(h.token, p->ref.token, FLX_TP_TOKEN_BYTES);
        const uint64_t bytes = flx_tp_kv_bytes(&h);
        uint8_t *junk = calloc(1, bytes);
        if (junk) {
            flx_tp_hdr_set_payload(&h, junk, bytes, 1);
            fprintf(stderr, PROG ": --outside-chunk: tokens [%u, %u) of a %u-token session\n", t0, t0 + 16, n);
            st = send_raw_kv(p, &h, junk, FLX_TP_SEND_EAGER, NULL);
            if (!st) st = flx_tp_sender_flush(p->snd, (uint32_t)o->timeout_ms); /* junk must outlive the send */
            free(junk);
            if (st == FLX_ERR_IO) st = FLX_OK; /* the node's verdict comes as a STATUS */
        }
    }
    if (!st && !p->stalled && pl->layer == 0 && o->freeze_after_refused) {
        /* header only, the session's own but for the token; stopped from the sender's progress thread
         * the moment the send completes, before it can move more of the chunks posted above */
        flx_tp_hdr_t h = {.kind = FLX_TP_KV, .sid = p->ref.sid, .layer = 0, .head_begin = 0, .head_end = 1,
                          .tok_begin = 0, .tok_end = 16, .arg0 = D};
        memcpy(h.token, p->ref.token, FLX_TP_TOKEN_BYTES);
        h.token[0] ^= 0xff;
        static uint8_t zero[16 * 256 * 2 * 2];   /* 16 tokens of K and V; the wire's head_dim is <= 256 */
        const uint64_t bytes = flx_tp_kv_bytes(&h);
        if (FLX_NEVER(bytes > sizeof zero)) {   /* falls through to prepared_free below */
            st = flx_error_set(FLX_ERR_INTERNAL, "--freeze-after-refused: head_dim %u above the wire's 256", D);
        } else {
            flx_tp_hdr_set_payload(&h, zero, bytes, 1);
            fprintf(stderr, PROG ": --freeze-after-refused: a wrong token after layer 0's chunks, then SIGSTOP\n");
            uint8_t hdr[FLX_TP_HDR_BYTES];
            flx_tp_hdr_encode(&h, hdr);
            st = flx_tp_send_raw(p->snd, hdr, zero, bytes, FLX_TP_SEND_EAGER, freeze_now, NULL);
        }
    }
    if (!st && !p->stalled && pl->stats) {
        st = flx_tp_send_stats(p->snd, &p->ref, pl->layer, p->w.n_q_heads, D, pl->stats, pl->mean_k, pl->q_anchor,
                               p->hash_flag);
        if (!st) p->n_stats++;
    }
    progress(p, pl->layer + 1, 0);
    return st;
}

/* The sink of the prefill: one layer's KV (and statistics) onto the wire while the next computes. */
static flx_status_t on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                             const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor)
{
    push_t *p = ctx;
    if (p->all) return layer_pack(p, layer, n, k, v, stats, mean_k, q_anchor, &p->all[layer]);
    throttle(p, 2);
    prepared_t pl;
    flx_status_t st = layer_pack(p, layer, n, k, v, stats, mean_k, q_anchor, &pl);
    if (st) return st;
    st = layer_send(p, &pl);
    prepared_free(&pl);
    return st;
}

/* Frees --pregenerate's layers (a send still in flight keeps its own reference to its buffer). */
static void push_release(push_t *p)
{
    for (uint32_t l = 0; p->all && l < p->w.n_layers; l++) prepared_free(&p->all[l]);
    free(p->all);
    p->all = NULL;
}

/* --pregenerate: every layer computed and packed; now pushed into the session p->ref one after the
 * other. The layers stay: they were all allocated anyway, and they are freed together after the last
 * session's commit (push_release), so that unmapping them (a third of this process's time while
 * pushing) stays out of the transfer. */
static flx_status_t push_all(push_t *p, uint64_t t_compute_ns)
{
    const opts_t *o = p->o;
    if (!o->quiet && p->ref.sid == o->sid)
        fprintf(stderr, PROG ": --pregenerate: %u layers computed in %.1f s; pushing them all now\n", p->w.n_layers,
                (double)t_compute_ns / 1e9);
    else if (!o->quiet)
        fprintf(stderr, PROG ": --pregenerate: pushing the %u layers again, into session %#" PRIx64 "\n",
                p->w.n_layers, p->ref.sid);
    p->t_start = p->t_last_print = flx_now_ns();
    flx_status_t st = FLX_OK;
    for (uint32_t l = 0; l < p->w.n_layers && !st && !p->stalled; l++)
        if (p->all[l].buf) st = layer_send(p, &p->all[l]);
    return st;
}

/* ---- sources ---- */

/* A real prefill's inputs, ready before the session is opened (its length is the prompt's). */
typedef struct model_src {
    flx_pool_h pool;
    flx_model_t *m;
    flx_tok_h tok;
    int32_t *ids;
    size_t n_ids;
} model_src_t;

static void model_src_free(model_src_t *ms)
{
    free(ms->ids);
    flx_tok_destroy(ms->tok);
    flx_model_destroy(ms->m);
    flx_pool_destroy(ms->pool);
    memset(ms, 0, sizeof *ms);
}

/* Loads the model and its tokenizer and tokenizes the prompt file. */
static flx_status_t model_src_load(const opts_t *o, model_src_t *ms)
{
    memset(ms, 0, sizeof *ms);
    char *text = NULL;
    size_t text_len = 0;
    flx_pool_params_t pp = {.field_mask = o->threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)o->threads};
    flx_status_t st;
    if ((st = flx_pool_create(&pp, &ms->pool))) goto out;
    if ((st = flx_model_load_pool(o->model, ms->pool, &ms->m)) || (st = flx_tok_load(o->model, &ms->tok))) {
        st = flx_error_set(st, "loading %s: %s", o->model, flx_error_msg());
        goto out;
    }
    if ((st = flx_cli_read_file(o->prompt_file, (size_t)1 << 30, &text, &text_len)) ||
        (st = flx_tok_encode_prompt(ms->tok, text, text_len, o->chat, &ms->ids, &ms->n_ids)))
        goto out;
    if (ms->n_ids == 0 || ms->n_ids > UINT32_MAX) st = flx_error_set(FLX_ERR_INVALID, "the prompt has %zu tokens", ms->n_ids);
out:
    free(text);
    if (st) model_src_free(ms);
    return st;
}

static flx_status_t run_model(push_t *p, const opts_t *o, const model_src_t *ms, int32_t *first_token)
{
    const flx_model_t *m = ms->m;
    void *pmem = NULL;
    float *logits = NULL;
    void *scratch = NULL;
    flx_status_t st;
    const flx_model_config_t *cfg = &m->cfg;
    if (cfg->n_layers != p->w.n_layers || cfg->n_kv_heads != p->w.n_kv_heads || cfg->n_heads != p->w.n_q_heads ||
        cfg->head_dim != p->w.head_dim) {
        st = flx_error_set(FLX_ERR_INVALID,
                           "the model (%u layers, %u/%u heads of %u) is not the session's (%u layers, %u/%u heads of "
                           "%u)",
                           cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, p->w.n_layers, p->w.n_q_heads,
                           p->w.n_kv_heads, p->w.head_dim);
        goto out;
    }
    if (ms->n_ids != p->w.prompt_len) {
        st = flx_error_set(FLX_ERR_INVALID, "the prompt has %zu tokens, the session was opened for %u", ms->n_ids,
                           p->w.prompt_len);
        goto out;
    }
    const uint32_t n = (uint32_t)ms->n_ids;
    flx_fwd_shape_t fs = {.max_prompt = n, .max_batch = 1, .pool = ms->pool};
    size_t pbytes = 0;
    flx_fwd_ws_t *ws;
    if ((st = flx_fwd_plan(m, &fs, &pbytes))) goto out;
    if (!(pmem = flx_aligned_alloc(64, pbytes ? pbytes : 64))) {
        st = flx_error_set(FLX_ERR_NOMEM, "prefill workspace of %zu bytes", pbytes);
        goto out;
    }
    if ((st = flx_fwd_ws_init(m, &fs, pmem, pbytes, &ws))) goto out;
    if (o->pregenerate && !(p->all = calloc(p->w.n_layers, sizeof *p->all))) {
        st = flx_error_set(FLX_ERR_NOMEM, "%u layers", p->w.n_layers);
        goto out;
    }
    logits = malloc((size_t)cfg->vocab * sizeof *logits);
    scratch = malloc(flx_sample_scratch_bytes(cfg->vocab));
    if (!logits || !scratch) {
        st = flx_error_set(FLX_ERR_NOMEM, "logits");
        goto out;
    }
    /* The node's segments, as the in-process path uses its store's (flx_engine_prefill_with_stats). */
    flx_prefill_out_t out = {.on_layer = on_layer, .ctx = p,
                             .tau = (p->w.flags & FLX_TP_WELCOME_STATS) ? (float)o->tau : -1.0f,
                             .sink = p->w.n_sink, .local = p->w.n_local};
    const uint64_t t0 = flx_now_ns();
    st = flx_engine_prefill_run(m, ws, ms->ids, n, &out, logits);
    if (p->all) {
        flx_status_t st2 = push_all(p, flx_now_ns() - t0);
        if (!st) st = st2;
    }
    if (st) goto out;
    flx_sampling_params_t sp = {.temperature = (float)o->temp, .top_k = (uint32_t)o->top_k, .top_p = (float)o->top_p,
                                .seed = o->seed};
    flx_sampler_t sampler;
    if ((st = flx_sampler_init(&sampler, &sp, cfg->vocab)) ||
        (st = flx_sample(&sampler, logits, scratch, flx_sample_scratch_bytes(cfg->vocab), first_token)))
        goto out;
out:
    free(scratch);
    free(logits);
    flx_aligned_free(pmem);
    return st;
}

static flx_status_t run_synthetic(push_t *p, const opts_t *o)
{
    const flx_tp_welcome_t *w = &p->w;
    if (o->prompt_len != w->prompt_len)
        return flx_error_set(FLX_ERR_INVALID, "--prompt-len %" PRIu64 ", the session was opened for %u",
                             o->prompt_len, w->prompt_len);
    flx_synth_params_t sp;
    flx_synth_defaults(&sp, w->n_layers, w->n_q_heads, w->n_kv_heads, w->head_dim, w->prompt_len, 0, o->seed);
    flx_synth_t *syn;
    flx_status_t st = flx_synth_create(&sp, &syn);
    if (st) return st;
    flx_pool_h pool = NULL;
    flx_pool_params_t pp = {.field_mask = o->threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)o->threads};
    if ((st = flx_pool_create(&pp, &pool))) {
        flx_synth_destroy(syn);
        return st;
    }
    const size_t L = w->prompt_len, D = w->head_dim;
    flx_bf16_t *k = malloc((size_t)w->n_kv_heads * L * D * sizeof *k);
    flx_bf16_t *v = malloc((size_t)w->n_kv_heads * L * D * sizeof *v);
    float *q = malloc((size_t)w->n_q_heads * D * sizeof *q);
    flx_head_stats_t *stats = malloc(w->n_q_heads * sizeof *stats);
    float *mean_k = malloc((size_t)w->n_q_heads * D * sizeof *mean_k);
    float *qa = malloc((size_t)w->n_q_heads * D * sizeof *qa);
    if (!k || !v || !q || !stats || !mean_k || !qa) st = flx_error_set(FLX_ERR_NOMEM, "synthetic layer of %zu tokens", L);
    const int with_stats = (w->flags & FLX_TP_WELCOME_STATS) != 0;
    if (o->pregenerate && !(p->all = calloc(w->n_layers, sizeof *p->all)))
        st = flx_error_set(FLX_ERR_NOMEM, "%u layers", w->n_layers);
    const uint64_t t0 = flx_now_ns();
    for (uint32_t l = 0; l < w->n_layers && !st && !p->stalled; l++) {
        if ((st = flx_synth_layer(syn, l, k, v, q, pool))) break;
        if (with_stats) {
            flx_prefill_layer_t pl = {.n_q_heads = w->n_q_heads, .n_kv_heads = w->n_kv_heads, .head_dim = w->head_dim,
                                      .prompt_len = w->prompt_len, .sink = w->n_sink, .local = w->n_local, .k = k,
                                      .v = v, .tok_stride = w->prompt_len, .q_anchor = q, .tau = (float)o->tau, .pool = pool};
            if ((st = flx_prefill_stats(&pl, stats, mean_k, qa))) break;
        }
        st = on_layer(p, l, w->prompt_len, k, v, with_stats ? stats : NULL, mean_k, qa);
    }
    if (p->all) {
        flx_status_t st2 = push_all(p, flx_now_ns() - t0);
        if (!st) st = st2;
    }
    free(k);
    free(v);
    free(q);
    free(stats);
    free(mean_k);
    free(qa);
    flx_synth_destroy(syn);
    flx_pool_destroy(pool);
    return st;
}

/* ---- --control: the session opened over gRPC, as a router would ---- */

#define SVC "/fluxion.decode.v1.DecodeNode/"

/* A unary DecodeNode call: the answer's bytes (the caller's to free and to parse), or FLX_ERR_STATE
 * naming the method and the node's status. */
static flx_status_t node_call(flx_rpc_client_h c, const char *method, const ProtobufCMessage *req, uint32_t timeout_ms,
                              void **resp_p, size_t *resp_len_p)
{
    const size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return flx_error_set(FLX_ERR_NOMEM, "%s request", method);
    protobuf_c_message_pack(req, buf);
    char path[96];
    snprintf(path, sizeof path, SVC "%s", method);
    flx_rpc_result_t res;
    *resp_p = NULL;
    flx_status_t st = flx_rpc_unary(c, path, buf, len, timeout_ms, resp_p, resp_len_p, &res);
    free(buf);
    if (st) return st;
    if (res.code != FLX_RPC_OK) {
        free(*resp_p);
        *resp_p = NULL;
        return flx_error_set(FLX_ERR_STATE, "%s: %s: %s", method, flx_rpc_code_name(res.code), res.msg);
    }
    return FLX_OK;
}

/* NodeStatus (the model id and shape the session must name), then OpenSession with this prompt's
 * length; on success the UCX endpoint, the id and the token are in o and ref. Both answers go
 * through flx/prefill_control.h's checks before anything in them is used. */
static flx_status_t control_open(opts_t *o, const model_src_t *ms, flx_tp_ref_t *ref)
{
    flx_rpc_client_h c = NULL;
    void *resp = NULL;
    size_t resp_len = 0;
    const uint32_t tmo = (uint32_t)FLX_MIN(o->timeout_ms, UINT32_MAX);
    flx_status_t st = flx_rpc_client_create(o->control, 0, &c);
    if (st) return st;
    Fluxion__Decode__V1__NodeStatusRequest nreq;
    fluxion__decode__v1__node_status_request__init(&nreq);
    flx_pfx_node_t node;
    if ((st = node_call(c, "NodeStatus", &nreq.base, tmo, &resp, &resp_len)) ||
        (st = flx_pfx_parse_node_status(resp, resp_len, &node)))
        goto out;
    if (ms->m && (ms->m->cfg.n_layers != node.n_layers || ms->m->cfg.n_kv_heads != node.n_kv_heads ||
                  ms->m->cfg.n_heads != node.n_q_heads || ms->m->cfg.head_dim != node.head_dim)) {
        st = flx_error_set(FLX_ERR_INVALID, "the model (%u layers, %u/%u heads of %u) is not the node's (%u layers, "
                                            "%u/%u heads of %u)",
                           ms->m->cfg.n_layers, ms->m->cfg.n_heads, ms->m->cfg.n_kv_heads, ms->m->cfg.head_dim,
                           node.n_layers, node.n_q_heads, node.n_kv_heads, node.head_dim);
        goto out;
    }
    free(resp);
    resp = NULL;
    Fluxion__Decode__V1__OpenSessionRequest req;
    Fluxion__Decode__V1__AttentionConfig attn;
    Fluxion__Decode__V1__ModelShape shape;
    fluxion__decode__v1__open_session_request__init(&req);
    fluxion__decode__v1__attention_config__init(&attn);
    fluxion__decode__v1__model_shape__init(&shape);
    shape.n_layers = node.n_layers, shape.n_kv_heads = node.n_kv_heads;
    shape.n_q_heads = node.n_q_heads, shape.head_dim = node.head_dim;
    static const Fluxion__Decode__V1__AttentionMode modes[] = {
        FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FULL, FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FIXED,
        FLUXION__DECODE__V1__ATTENTION_MODE__ATTENTION_MODE_FLUXION};
    attn.mode = modes[o->mode];
    if (o->mode == 1) {
        attn.blk = 16u << o->blk_i;
        attn.budget = (float)o->bgt;
    } else if (o->mode == 2) {
        attn.tau = (float)o->tau;
    }
    req.model_id = (char *)(o->model_id ? o->model_id : node.model_id);
    req.shape = &shape;
    req.prompt_len = ms->m ? (uint32_t)ms->n_ids : (uint32_t)FLX_MIN(o->prompt_len, UINT32_MAX);
    req.max_new_tokens = (uint32_t)o->max_new;
    req.kv_dtype = FLUXION__DECODE__V1__KV_DTYPE__KV_DTYPE_BF16;
    req.attention = &attn;
    req.transfer_timeout_ms = (uint32_t)o->transfer_timeout_ms;
    req.lease_ms = (uint32_t)o->lease_ms;
    flx_pfx_session_t ss;
    if ((st = node_call(c, "OpenSession", &req.base, tmo, &resp, &resp_len)) ||
        (st = flx_pfx_parse_open_session(resp, resp_len, &ss)))
        goto out;
    _Static_assert(sizeof o->host == sizeof ss.host, "the listener host fits opts");
    memcpy(o->host, ss.host, sizeof o->host);
    o->port = ss.port;
    o->sid = ss.sid;
    ref->sid = ss.sid;
    memcpy(ref->token, ss.token, FLX_TP_TOKEN_BYTES);
out:
    free(resp);
    flx_rpc_client_destroy(c);
    return st;
}

/* The end of a session's push: the commit, the flush and the node's verdict; 0 when it said READY
 * (the READY line printed), else 1 with the reason on stderr. After the last session's commit the
 * packed layers are freed. */
static int finish_session(push_t *p, const opts_t *o, int32_t first, int last)
{
    const flx_kv_session_id_t sid = p->ref.sid;
    if (p->stalled) {
        fprintf(stderr, PROG ": --stall-after-bytes %" PRIu64 ": stalled after %" PRIu64 " bytes, staying connected\n",
                o->stall_after, p->kv_bytes);
    } else {
        flx_status_t st;
        flx_kv_commit_t cm = {.first_token = first, .n_stats_layers = p->n_stats, .kv_bytes = p->kv_bytes};
        if ((st = flx_tp_send_commit(p->snd, &p->ref, &cm)) ||
            (st = flx_tp_sender_flush(p->snd, (uint32_t)FLX_MIN(o->timeout_ms, UINT32_MAX)))) {
            fprintf(stderr, PROG ": %s\n", flx_error_msg());
            /* the node's STATUS below says what happened to the session */
        }
        if (last) push_release(p);
        const double s = (double)(flx_now_ns() - p->t_start) / 1e9;
        progress(p, p->w.n_layers, 1);
        if (!o->quiet)
            fprintf(stderr, PROG ": pushed %" PRIu64 " KV bytes + statistics of %u layers in %.3f s (%.1f MB/s "
                            "while computing), first token %d\n",
                    p->kv_bytes, p->n_stats, s, s > 0 ? (double)p->kv_bytes / s / 1e6 : 0.0, first);
    }
    flx_kv_state_t state;
    char why[FLX_TP_STATUS_MAX + 1];
    flx_tp_sender_status(p->snd, sid, (uint32_t)FLX_MIN(o->timeout_ms + p->w.deadline_left_ns / 1000000, UINT32_MAX),
                         &state, why, sizeof why);
    flx_tp_sender_info_t si;
    flx_tp_sender_info(p->snd, &si);
    if (state == FLX_KV_READY) {
        printf("READY %#" PRIx64 " %" PRIu64 " bytes first_token %d\n", sid, p->kv_bytes, first);
        fflush(stdout);
        return 0;
    }
    if (state == FLX_KV_RESERVED)
        fprintf(stderr, PROG ": session %#" PRIx64 " did not become READY: %s%s%s\n", sid,
                why[0] ? why : "no answer from the node", si.error[0] ? "; " : "", si.error);
    else
        fprintf(stderr, PROG ": the node says session %#" PRIx64 " is %s: %s%s%s\n", sid, flx_kv_state_name(state), why,
                si.error[0] ? "; " : "", si.error);
    return 1;
}

/* HELLO for the session p->ref: its WELCOME into *w, printed. */
static flx_status_t hello(push_t *p, const opts_t *o, flx_tp_welcome_t *w)
{
    flx_status_t st = flx_tp_sender_hello(p->snd, &p->ref, w);
    if (st || o->quiet) return st;
    fprintf(stderr,
            PROG ": session %#" PRIx64 " on %s:%u: %u layers, %u/%u heads of %u, %u tokens (sink %u, local %u), "
                 "statistics %s, deadline in %.1f s\n",
            p->ref.sid, o->host, o->port, w->n_layers, w->n_q_heads, w->n_kv_heads, w->head_dim, w->prompt_len,
            w->n_sink, w->n_local, w->flags & FLX_TP_WELCOME_STATS ? "wanted" : "not wanted",
            (double)w->deadline_left_ns / 1e9);
    return FLX_OK;
}

/* The next session of --session's list, into which the packed layers are pushed again: its WELCOME
 * must describe what was computed for the first. */
static flx_status_t next_session(push_t *p, const opts_t *o, uint32_t i)
{
    p->ref.sid = o->sids[i];
    memcpy(p->ref.token, o->tokens[i], FLX_TP_TOKEN_BYTES);
    flx_tp_welcome_t w;
    flx_status_t st = hello(p, o, &w);
    if (st) return st;
    const flx_tp_welcome_t *a = &p->w;
    if (w.n_layers != a->n_layers || w.n_q_heads != a->n_q_heads || w.n_kv_heads != a->n_kv_heads ||
        w.head_dim != a->head_dim || w.prompt_len != a->prompt_len || w.n_sink != a->n_sink ||
        w.n_local != a->n_local || (w.flags & FLX_TP_WELCOME_STATS) != (a->flags & FLX_TP_WELCOME_STATS))
        return flx_error_set(FLX_ERR_INVALID,
                             "session %#" PRIx64 " was opened for %u layers, %u/%u heads of %u, %u tokens (sink %u, "
                             "local %u, statistics %s), not as session %#" PRIx64 " the prompt was computed for",
                             p->ref.sid, w.n_layers, w.n_q_heads, w.n_kv_heads, w.head_dim, w.prompt_len, w.n_sink,
                             w.n_local, w.flags & FLX_TP_WELCOME_STATS ? "wanted" : "not wanted", o->sid);
    p->w = w;
    p->kv_bytes = p->chunk_index = 0;
    p->n_stats = 0;
    atomic_store(&p->bytes_landed, 0);
    return FLX_OK;
}

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc != FLX_CLI_PROCEED) return rc;
    push_t p = {.o = &o, .max_chunk = o.max_chunk_mib << 20, .hash_flag = o.no_hash ? FLX_TP_SEND_NO_HASH : 0};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cv, NULL);
    model_src_t ms = {0};
    flx_status_t st;
    rc = 1;
    if (o.model && (st = model_src_load(&o, &ms))) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        return 1;
    }
    if (o.control) {
        if ((st = control_open(&o, &ms, &p.ref))) {
            fprintf(stderr, PROG ": --control %s: %s\n", o.control, flx_error_msg());
            model_src_free(&ms);
            return 1;
        }
        printf("SESSION %" PRIu64 "\n", o.sid);   /* a router or client can WaitReady on it now */
        fflush(stdout);
    } else {
        p.ref.sid = o.sid;
        memcpy(p.ref.token, o.tokens[0], FLX_TP_TOKEN_BYTES);
    }
    flx_tp_sender_params_t sp = {.field_mask = FLX_TP_SENDER_FIELD_ERR_MODE | FLX_TP_SENDER_FIELD_TIMEOUT,
                                 .host = o.host, .port = o.port, .err_mode = o.err_mode,
                                 .connect_timeout_ms = (uint32_t)FLX_MIN(o.timeout_ms, UINT32_MAX)};
    if ((st = flx_tp_sender_create(&sp, &p.snd))) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        model_src_free(&ms);
        return 1;
    }
    if ((st = hello(&p, &o, &p.w))) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        goto out;
    }
    if (o.wrong_token) p.ref.token[0] ^= 0xff; /* HELLO went with the right one: the chunks carry this */
    p.t_start = p.t_last_print = flx_now_ns();
    int32_t first = 0; /* the synthetic workload has no vocabulary: token 0 */
    st = o.synthetic ? run_synthetic(&p, &o) : run_model(&p, &o, &ms, &first);
    if (st) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        goto out;
    }
    rc = finish_session(&p, &o, first, o.n_sessions <= 1);
    /* The other sessions of the list, in turn over this connection (parse_args: only with --pregenerate
     * and without faults). Every one is tried; the exit status is 1 if any did not become READY. */
    for (uint32_t i = 1; i < o.n_sessions; i++) {
        if ((st = next_session(&p, &o, i)) || (st = push_all(&p, 0))) {
            fprintf(stderr, PROG ": session %#" PRIx64 ": %s\n", p.ref.sid, flx_error_msg());
            rc = 1;
            continue;   /* the layers are freed at the end */
        }
        rc |= finish_session(&p, &o, first, i + 1 == o.n_sessions);
    }
out:
    flx_tp_sender_destroy(p.snd); /* sends in flight end here, cancelled: their layer references with them */
    push_release(&p);
    model_src_free(&ms);
    return rc;
}
