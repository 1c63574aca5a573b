/*
 * flx-prefill - plays a prefill node: computes a prompt's KV cache (a real prefill of a text with the
 * real model, or the synthetic workload at any shape up to 128K tokens) with the statistics Fluxion
 * needs, and pushes it to a decode node over UCX layer by layer while it computes.
 *
 *   flx-prefill --node HOST:PORT --session ID --token HEX  (--model M --prompt-file F [--chat] |
 *               --synthetic --prompt-len N [--seed S]) [options]
 *
 * DESIGN
 * The session's shape and window segments come from the node (HELLO -> WELCOME), so the command
 * line needs only what a router hands out: the node's address, the session id and its token. The
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
 * twice.
 *
 * Exit status: 0 when the node reports the session READY; 1 when it fails (the node's reason is
 * printed), the connection fails or the model cannot run; 2 for a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/features.h"
#include "flx/forward.h"
#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/pool.h"
#include "flx/sampling.h"
#include "flx/synth.h"
#include "flx/tokenizer.h"
#include "flx/transport.h"
#include "flx/util.h"

#define PROG "flx-prefill"

typedef struct opts {
    const char *node, *model, *prompt_file, *token_hex;
    char host[FLX_TP_HOST_MAX];
    uint16_t port;
    uint64_t sid;
    int chat, synthetic, quiet, pregenerate, no_hash;
    uint64_t prompt_len, seed, threads, max_chunk_mib, progress_ms, timeout_ms;
    float tau, temp, top_p;
    uint64_t top_k;
    flx_tp_err_mode_t err_mode;
    /* faults (UINT64_MAX: off) */
    uint64_t die_after, stall_after, corrupt_chunk, dup_chunk;
    int wrong_token, outside_chunk;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --node HOST:PORT --session ID --token HEX\n"
            "                 (--model M --prompt-file F [--chat] | --synthetic --prompt-len N [--seed S]) [options]\n"
            "Computes a prompt's KV cache and statistics and pushes them to a decode node over UCX, layer by\n"
            "layer. The node's WELCOME gives the shape and window; UCX_TLS / UCX_NET_DEVICES pick the transport.\n"
            "  --node           the node's listener (flx_tp_session_desc_t host:port)\n"
            "  --session        the session id (decimal or 0x hex)\n"
            "  --token          the session's 128-bit transfer token, 32 hex digits\n"
            "  --model          a .gguf file or Hugging Face folder (a real prefill); --prompt-file F the text ('-':\n"
            "                   stdin); --chat wraps it with the model's chat template (as flx-generate --chat)\n"
            "  --synthetic      the synthetic workload (flx/synth.h) at the node's shape; --prompt-len N tokens\n"
            "  --seed           synthetic workload seed / first-token sampling seed (default 1)\n"
            "  --pregenerate    synthetic: compute every layer first, then push them all (a transfer measured at\n"
            "                   the transport's speed, not the generator's; memory: the whole session)\n"
            "  --tau            Eq. 2 threshold of the statistics (default 0.1); sent when the node asks for them\n"
            "  --temp, --top-k, --top-p  sampling of the first token (default greedy, as flx-generate)\n"
            "  --threads        prefill workers (default: FLX_THREADS, else the CPU budget)\n"
            "  --max-chunk-mib  largest chunk, MiB (default 16)\n"
            "  --no-payload-hash  send KV payloads without their XXH3 (a node that requires them refuses them)\n"
            "  --err-mode       peer (default) or none: UCX peer-failure detection; the node's must match\n"
            "                   (none for shared memory on UCX 1.13)\n"
            "  --timeout-ms     wait this long for the node's answers (default 60000)\n"
            "  --progress-ms    print progress this often (default 1000); --quiet prints only the result\n"
            "fault injection:\n"
            "  --die-after-bytes N      SIGKILL itself once N KV bytes have been sent\n"
            "  --stall-after-bytes N    stop sending after N KV bytes, stay connected until the node gives up\n"
            "  --corrupt-chunk I        flip a payload byte of KV chunk I (0-based) after hashing it\n"
            "  --wrong-token            send the chunks with a wrong token\n"
            "  --outside-chunk          send one chunk past the session's prompt\n"
            "  --duplicate-chunk I      send KV chunk I twice\n"
            "  -h, --help, --version\n"
            "exit status: 0 the node has the session READY, 1 it failed or could not be pushed, 2 usage error\n");
}

static int bad(const char *flag, const char *val, const char *want)
{
    fprintf(stderr, PROG ": %s '%s': %s\n", flag, val ? val : "", want);
    return 2;
}

static int parse_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s '%s': not a number in [%g, %g]\n", flag, s, lo, hi);
        return 2;
    }
    *out = (float)v;
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1, o->max_chunk_mib = 16, o->progress_ms = 1000, o->timeout_ms = 60000, o->tau = 0.1f;
    o->top_p = 1.0f, o->err_mode = FLX_TP_ERR_PEER;
    o->die_after = o->stall_after = o->corrupt_chunk = o->dup_chunk = UINT64_MAX;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf(PROG " (fluxion) %s, wire format version %u\n", FLX_VERSION, FLX_TP_VERSION);
            exit(0);
        }
        /* flags without a value */
        if (!strcmp(a, "--chat")) { o->chat = 1; continue; }
        if (!strcmp(a, "--synthetic")) { o->synthetic = 1; continue; }
        if (!strcmp(a, "--quiet")) { o->quiet = 1; continue; }
        if (!strcmp(a, "--pregenerate")) { o->pregenerate = 1; continue; }
        if (!strcmp(a, "--no-payload-hash")) { o->no_hash = 1; continue; }
        if (!strcmp(a, "--wrong-token")) { o->wrong_token = 1; continue; }
        if (!strcmp(a, "--outside-chunk")) { o->outside_chunk = 1; continue; }
        static const char *with_value[] = {"--node", "--session", "--token", "--model", "--prompt-file",
                                           "--prompt-len", "--seed", "--tau", "--temp", "--top-k", "--top-p",
                                           "--threads", "--max-chunk-mib", "--err-mode", "--timeout-ms",
                                           "--progress-ms", "--die-after-bytes", "--stall-after-bytes",
                                           "--corrupt-chunk", "--duplicate-chunk"};
        int known = 0;
        for (size_t k = 0; k < FLX_ARRAY_SIZE(with_value); k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, PROG ": unknown option '%s' (--help lists them)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        uint64_t *u = NULL, lo = 0, hi = UINT64_MAX;
        if (!strcmp(a, "--node")) {
            const char *colon = strrchr(v, ':');
            uint64_t port;
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof o->host ||
                flx_parse_u64(colon + 1, 1, 65535, &port))
                return bad(a, v, "expected HOST:PORT with a port in [1, 65535]");
            memcpy(o->host, v, (size_t)(colon - v));
            o->host[colon - v] = 0;
            o->port = (uint16_t)port;
            o->node = v;
        } else if (!strcmp(a, "--session")) {
            char *end;
            errno = 0;
            unsigned long long x = strtoull(v, &end, 0);
            if (!*v || *end || errno || x == 0 || v[0] == '-') return bad(a, v, "expected a non-zero session id");
            o->sid = x;
        } else if (!strcmp(a, "--token")) {
            if (strlen(v) != 2 * FLX_TP_TOKEN_BYTES || strspn(v, "0123456789abcdefABCDEF") != strlen(v))
                return bad(a, v, "expected 32 hex digits");
            o->token_hex = v;
        } else if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--prompt-file")) {
            o->prompt_file = v;
        } else if (!strcmp(a, "--err-mode")) {
            if (flx_tp_err_mode_parse(v, &o->err_mode)) return bad(a, v, "expected peer or none");
        } else if (!strcmp(a, "--tau")) {
            if (parse_float(a, v, 1e-6, 0.999999, &o->tau)) return 2;
        } else if (!strcmp(a, "--temp")) {
            if (parse_float(a, v, 0, 1e6, &o->temp)) return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(a, v, 1e-6, 1, &o->top_p)) return 2;
        } else {
            if (!strcmp(a, "--prompt-len")) u = &o->prompt_len, lo = 1, hi = 1u << 30;
            else if (!strcmp(a, "--seed")) u = &o->seed;
            else if (!strcmp(a, "--top-k")) u = &o->top_k, hi = 1u << 30;
            else if (!strcmp(a, "--threads")) u = &o->threads, lo = 1, hi = 1024;
            else if (!strcmp(a, "--max-chunk-mib")) u = &o->max_chunk_mib, lo = 1, hi = 1u << 20;
            else if (!strcmp(a, "--timeout-ms")) u = &o->timeout_ms, lo = 1, hi = 86400000;
            else if (!strcmp(a, "--progress-ms")) u = &o->progress_ms, lo = 1, hi = 86400000;
            else if (!strcmp(a, "--die-after-bytes")) u = &o->die_after;
            else if (!strcmp(a, "--stall-after-bytes")) u = &o->stall_after;
            else if (!strcmp(a, "--corrupt-chunk")) u = &o->corrupt_chunk, hi = UINT32_MAX;
            else u = &o->dup_chunk, hi = UINT32_MAX; /* --duplicate-chunk */
            char want[64];
            snprintf(want, sizeof want, "expected an integer in [%" PRIu64 ", %" PRIu64 "]", lo, hi);
            if (flx_parse_u64(v, lo, hi, u)) return bad(a, v, want);
        }
    }
    if (!o->node || !o->sid || !o->token_hex) {
        fprintf(stderr, PROG ": --node, --session and --token are required\n");
        return 2;
    }
    if (o->synthetic == !!o->model) {
        fprintf(stderr, PROG ": give either --model (with --prompt-file) or --synthetic (with --prompt-len)\n");
        return 2;
    }
    if (o->model && !o->prompt_file) {
        fprintf(stderr, PROG ": --model needs --prompt-file\n");
        return 2;
    }
    if (o->pregenerate && !o->synthetic) {
        fprintf(stderr, PROG ": --pregenerate is for --synthetic\n");
        return 2;
    }
    if (o->synthetic && (!o->prompt_len || o->prompt_file || o->chat)) {
        fprintf(stderr, PROG ": --synthetic needs --prompt-len and takes no --prompt-file or --chat\n");
        return 2;
    }
    return 0;
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
} push_t;

static void layer_unref(layer_buf_t *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1) return;
    push_t *p = b->push;
    free(b->data);
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
    layer_buf_t *buf;
    flx_head_stats_t *stats;     /* (Hq) or NULL */
    float *mean_k, *q_anchor;    /* (Hq, D) */
} prepared_t;

static void prepared_free(prepared_t *pl)
{
    free(pl->plan);
    free(pl->stats);
    free(pl->mean_k);
    free(pl->q_anchor);
    if (pl->buf) layer_unref(pl->buf);
    memset(pl, 0, sizeof *pl);
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
    layer_buf_t *b = calloc(1, sizeof *b);
    const uint64_t layer_bytes = 4ull * p->w.n_kv_heads * n * D;
    if (b) b->data = malloc(layer_bytes);
    if (stats) {
        pl->stats = malloc(Hq * sizeof *pl->stats);
        pl->mean_k = malloc((size_t)Hq * D * sizeof(float));
        pl->q_anchor = malloc((size_t)Hq * D * sizeof(float));
    }
    if (!pl->plan || !b || !b->data || (stats && (!pl->stats || !pl->mean_k || !pl->q_anchor))) {
        if (b) free(b->data);
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
    uint8_t *dst = b->data;
    for (uint32_t i = 0; i < pl->n_chunks; i++) {
        const flx_kv_chunk_t *c = &pl->plan[i].chunk;
        dst = pack_granules(dst, k, v, n, D, c->head_begin, c->head_end, c->tok_begin, c->tok_end);
    }
    if (stats) {
        memcpy(pl->stats, stats, Hq * sizeof *stats);
        memcpy(pl->mean_k, mean_k, (size_t)Hq * D * sizeof(float));
        memcpy(pl->q_anchor, q_anchor, (size_t)Hq * D * sizeof(float));
    }
    return FLX_OK;
}

/* Sends a packed layer (with the faults asked for), then frees it (its buffer lives until the last
 * chunk has been sent). */
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
        chunk_ctx_t *cc = malloc(sizeof *cc);
        if (!cc) {
            st = flx_error_set(FLX_ERR_NOMEM, "chunk");
            break;
        }
        cc->buf = b;
        cc->bytes = bytes;
        atomic_fetch_add(&b->refs, 1);
        const uint64_t idx = p->chunk_index++;
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
            st = flx_tp_send_kv(p->snd, &p->ref, c, payload, pl->plan[i].send_flags | p->hash_flag, chunk_sent, cc);
        }
        if (!st && idx == o->dup_chunk) {
            chunk_ctx_t *c2 = malloc(sizeof *c2);
            if (c2) {
                *c2 = *cc;
                c2->bytes = 0;
                atomic_fetch_add(&b->refs, 1);
                fprintf(stderr, PROG ": --duplicate-chunk %" PRIu64 ": layer %u tokens [%u, %u) sent twice\n", idx,
                        c->layer, c->tok_begin, c->tok_end);
                st = flx_tp_send_kv(p->snd, &p->ref, c, payload, pl->plan[i].send_flags, chunk_sent, c2);
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
    if (!st && !p->stalled && pl->stats) {
        st = flx_tp_send_stats(p->snd, &p->ref, pl->layer, p->w.n_q_heads, D, pl->stats, pl->mean_k, pl->q_anchor,
                               p->hash_flag);
        if (!st) p->n_stats++;
    }
    const uint32_t layer = pl->layer;
    prepared_free(pl);
    progress(p, layer + 1, 0);
    return st;
}

/* The sink of the prefill: one layer's KV (and statistics) onto the wire while the next computes. */
static flx_status_t on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                             const flx_head_stats_t *stats, const float *mean_k, const float *q_anchor)
{
    push_t *p = ctx;
    throttle(p, 2);
    prepared_t pl;
    flx_status_t st = layer_pack(p, layer, n, k, v, stats, mean_k, q_anchor, &pl);
    return st ? st : layer_send(p, &pl);
}

/* ---- sources ---- */

static flx_status_t run_model(push_t *p, const opts_t *o, int32_t *first_token)
{
    flx_model_t *m = NULL;
    flx_tok_h tok = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    void *pmem = NULL;
    float *logits = NULL;
    void *scratch = NULL;
    size_t text_len = 0, n_ids = 0;
    flx_pool_h pool = NULL;
    flx_pool_params_t pp = {.field_mask = o->threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)o->threads};
    flx_status_t st;
    if ((st = flx_pool_create(&pp, &pool))) goto out;
    if ((st = flx_model_load_pool(o->model, pool, &m)) || (st = flx_tok_load(o->model, &tok))) {
        st = flx_error_set(st, "loading %s: %s", o->model, flx_error_msg());
        goto out;
    }
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
    if ((st = flx_cli_read_file(o->prompt_file, (size_t)1 << 30, &text, &text_len)) ||
        (st = flx_tok_encode_prompt(tok, text, text_len, o->chat, &ids, &n_ids)))
        goto out;
    if (n_ids != p->w.prompt_len) {
        st = flx_error_set(FLX_ERR_INVALID, "the prompt has %zu tokens, the session was opened for %u", n_ids,
                           p->w.prompt_len);
        goto out;
    }
    const uint32_t n = (uint32_t)n_ids;
    flx_fwd_shape_t fs = {.max_prompt = n, .max_batch = 1, .pool = pool};
    size_t pbytes = 0;
    flx_fwd_ws_t *ws;
    if ((st = flx_fwd_plan(m, &fs, &pbytes))) goto out;
    if (!(pmem = flx_aligned_alloc(64, pbytes ? pbytes : 64))) {
        st = flx_error_set(FLX_ERR_NOMEM, "prefill workspace of %zu bytes", pbytes);
        goto out;
    }
    if ((st = flx_fwd_ws_init(m, &fs, pmem, pbytes, &ws))) goto out;
    logits = malloc((size_t)cfg->vocab * sizeof *logits);
    scratch = malloc(flx_sample_scratch_bytes(cfg->vocab));
    if (!logits || !scratch) {
        st = flx_error_set(FLX_ERR_NOMEM, "logits");
        goto out;
    }
    /* The node's segments, as the in-process path uses its store's (flx_engine_prefill_with_stats). */
    flx_prefill_out_t out = {.on_layer = on_layer, .ctx = p,
                             .tau = (p->w.flags & FLX_TP_WELCOME_STATS) ? o->tau : -1.0f,
                             .sink = p->w.n_sink, .local = p->w.n_local};
    if ((st = flx_engine_prefill_run(m, ws, ids, n, &out, logits))) goto out;
    flx_sampling_params_t sp = {.temperature = o->temp, .top_k = (uint32_t)o->top_k, .top_p = o->top_p,
                                .seed = o->seed};
    flx_sampler_t sampler;
    if ((st = flx_sampler_init(&sampler, &sp, cfg->vocab)) ||
        (st = flx_sample(&sampler, logits, scratch, flx_sample_scratch_bytes(cfg->vocab), first_token)))
        goto out;
out:
    free(scratch);
    free(logits);
    flx_aligned_free(pmem);
    free(ids);
    free(text);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
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
    prepared_t *all = o->pregenerate ? calloc(w->n_layers, sizeof *all) : NULL;
    if (o->pregenerate && !all) st = flx_error_set(FLX_ERR_NOMEM, "%u layers", w->n_layers);
    const uint64_t t0 = flx_now_ns();
    for (uint32_t l = 0; l < w->n_layers && !st && !p->stalled; l++) {
        if ((st = flx_synth_layer(syn, l, k, v, q, pool))) break;
        if (with_stats) {
            flx_prefill_layer_t pl = {.n_q_heads = w->n_q_heads, .n_kv_heads = w->n_kv_heads, .head_dim = w->head_dim,
                                      .prompt_len = w->prompt_len, .sink = w->n_sink, .local = w->n_local, .k = k,
                                      .v = v, .tok_stride = w->prompt_len, .q_anchor = q, .tau = o->tau, .pool = pool};
            if ((st = flx_prefill_stats(&pl, stats, mean_k, qa))) break;
        }
        if (all) st = layer_pack(p, l, w->prompt_len, k, v, with_stats ? stats : NULL, mean_k, qa, &all[l]);
        else st = on_layer(p, l, w->prompt_len, k, v, with_stats ? stats : NULL, mean_k, qa);
    }
    if (all) {
        if (!o->quiet)
            fprintf(stderr, PROG ": --pregenerate: %u layers computed in %.1f s; pushing them all now\n", w->n_layers,
                    (double)(flx_now_ns() - t0) / 1e9);
        p->t_start = p->t_last_print = flx_now_ns();
        for (uint32_t l = 0; l < w->n_layers; l++) {
            if (!st && !p->stalled) st = layer_send(p, &all[l]);
            else prepared_free(&all[l]);
        }
        free(all);
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

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    push_t p = {.o = &o, .max_chunk = o.max_chunk_mib << 20, .hash_flag = o.no_hash ? FLX_TP_SEND_NO_HASH : 0};
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cv, NULL);
    p.ref.sid = o.sid;
    for (uint32_t i = 0; i < FLX_TP_TOKEN_BYTES; i++) {
        unsigned x;
        sscanf(o.token_hex + 2 * i, "%2x", &x);
        p.ref.token[i] = (uint8_t)x;
    }
    flx_tp_sender_params_t sp = {.field_mask = FLX_TP_SENDER_FIELD_ERR_MODE | FLX_TP_SENDER_FIELD_TIMEOUT,
                                 .host = o.host, .port = o.port, .err_mode = o.err_mode,
                                 .connect_timeout_ms = (uint32_t)FLX_MIN(o.timeout_ms, UINT32_MAX)};
    flx_status_t st = flx_tp_sender_create(&sp, &p.snd);
    if (st) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        return 1;
    }
    rc = 1;
    if ((st = flx_tp_sender_hello(p.snd, &p.ref, &p.w))) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        goto out;
    }
    if (!o.quiet)
        fprintf(stderr,
                PROG ": session %#" PRIx64 " on %s: %u layers, %u/%u heads of %u, %u tokens (sink %u, local %u), "
                     "statistics %s, deadline in %.1f s\n",
                o.sid, o.node, p.w.n_layers, p.w.n_q_heads, p.w.n_kv_heads, p.w.head_dim, p.w.prompt_len, p.w.n_sink,
                p.w.n_local, p.w.flags & FLX_TP_WELCOME_STATS ? "wanted" : "not wanted",
                (double)p.w.deadline_left_ns / 1e9);
    if (o.wrong_token) p.ref.token[0] ^= 0xff; /* HELLO went with the right one: the chunks carry this */
    p.t_start = p.t_last_print = flx_now_ns();
    int32_t first = 0; /* the synthetic workload has no vocabulary: token 0 */
    st = o.synthetic ? run_synthetic(&p, &o) : run_model(&p, &o, &first);
    if (st) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        goto out;
    }
    if (p.stalled) {
        fprintf(stderr, PROG ": --stall-after-bytes %" PRIu64 ": stalled after %" PRIu64 " bytes, staying connected\n",
                o.stall_after, p.kv_bytes);
    } else {
        flx_kv_commit_t cm = {.first_token = first, .n_stats_layers = p.n_stats, .kv_bytes = p.kv_bytes};
        if ((st = flx_tp_send_commit(p.snd, &p.ref, &cm)) ||
            (st = flx_tp_sender_flush(p.snd, (uint32_t)FLX_MIN(o.timeout_ms, UINT32_MAX)))) {
            fprintf(stderr, PROG ": %s\n", flx_error_msg());
            /* the node's STATUS below says what happened to the session */
        }
        const double s = (double)(flx_now_ns() - p.t_start) / 1e9;
        progress(&p, p.w.n_layers, 1);
        if (!o.quiet)
            fprintf(stderr, PROG ": pushed %" PRIu64 " KV bytes + statistics of %u layers in %.3f s (%.1f MB/s "
                            "while computing), first token %d\n",
                    p.kv_bytes, p.n_stats, s, s > 0 ? (double)p.kv_bytes / s / 1e6 : 0.0, first);
    }
    flx_kv_state_t state;
    char why[FLX_TP_STATUS_MAX + 1];
    flx_tp_sender_status(p.snd, o.sid, (uint32_t)FLX_MIN(o.timeout_ms + p.w.deadline_left_ns / 1000000, UINT32_MAX),
                         &state, why, sizeof why);
    flx_tp_sender_info_t si;
    flx_tp_sender_info(p.snd, &si);
    if (state == FLX_KV_READY) {
        printf("READY %#" PRIx64 " %" PRIu64 " bytes first_token %d\n", o.sid, p.kv_bytes, first);
        rc = 0;
    } else if (state == FLX_KV_RESERVED) {
        fprintf(stderr, PROG ": session %#" PRIx64 " did not become READY: %s%s%s\n", o.sid,
                why[0] ? why : "no answer from the node", si.error[0] ? "; " : "", si.error);
    } else {
        fprintf(stderr, PROG ": the node says session %#" PRIx64 " is %s: %s%s%s\n", o.sid, flx_kv_state_name(state),
                why, si.error[0] ? "; " : "", si.error);
    }
out:
    flx_tp_sender_destroy(p.snd);
    return rc;
}
