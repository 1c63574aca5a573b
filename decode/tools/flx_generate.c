/*
 * flx-generate - generate text with a real model on one machine: load a checkpoint (GGUF or a
 * Hugging Face folder) and its tokenizer, prefill the prompt in-process into a kvstore (what a
 * prefill node would push), decode with the engine (full or fixed attention over the kvstore), and
 * stream the text to stdout. Timings go to stderr afterwards: prefill tokens/s, TPOT mean / p50 /
 * p90, the attention share of a step, host bytes read per step.
 *
 * The first token is sampled from the prefill logits with --seed, the rest by the engine with a
 * sampler seeded from --seed too (one stream of draws per sequence, as the engine does).
 *
 * --gpu [DEVICE] runs the prefill and the dense part of decoding on a CUDA device (the weights are
 * uploaded once and shared by both), keeps the kvstore's windows on that device too and runs
 * window attention there (flx/engine.h, GPU PATH). Without a usable device it stops with the
 * FLX_ERR_NO_DEVICE message and exit code 1: asking for a GPU never silently decodes on the CPU.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cuda_rt.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/forward_gpu.h"
#include "flx/kvstore.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/sampling.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

#define PROG "flx-generate"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --model PATH --prompt-file FILE [--chat] [--mode full|fixed|fluxion] [--blk 16] [--bgt 0.05]\n"
            "                    [--predictor WEIGHTS] [--tau 0.1] [--stream-threshold P] [--budget-scale A]\n"
            "                    [--min-blocks M]\n"
            "                    [--max-new 64] [--temp 0] [--top-k 0] [--top-p 1] [--seed S] [--threads N]\n"
            "                    [--gpu [DEVICE]] [--policy priority|no-parallel|uniform|length]\n"
            "                    [--placement hybrid|gpu-only] [--no-skip-streaming] [--fixed-blk B] [--gpu-streams N]\n"
            "  --model        a .gguf file or a Hugging Face folder (config.json, *.safetensors, tokenizer.json)\n"
            "  --prompt-file  the prompt text (UTF-8); '-' reads stdin\n"
            "  --chat         wrap the prompt as one user message with the model's chat template\n"
            "  --mode         attention over the host-resident KV: full (exact), fixed (blk, bgt) or fluxion\n"
            "                 (predicted per-head budgets and block size)\n"
            "  --predictor    fluxion: predictor weights (default fluxion/weights/predictor-smollm2-135m-instruct\n"
            "                 .safetensors next to the build, or $FLX_PREDICTOR)\n"
            "  --tau          fluxion: Eq. 2 threshold of the prefill statistics (default 0.1)\n"
            "  --stream-threshold, --budget-scale, --min-blocks\n"
            "                 fluxion: override the selector's operating point the weights carry (a head is\n"
            "                 streaming when p >= P in [0.5, 1]; Eq. 1 budgets scaled by A in (0, 64]; a\n"
            "                 retrieval head reads at least M in [0, 64] blocks); 0.5 1 0 is the paper's rule\n"
            "  --blk          fixed: logical block size 16, 32, 64 or 128\n"
            "  --bgt          fixed: fraction in [0, 1] of the host-resident tokens each head reads besides\n"
            "                 its window (sink + local + generated tokens)\n"
            "  --max-new      tokens to generate, 1..1000000 (the first one included)\n"
            "  --temp         sampling temperature >= 0 (0 = greedy); --top-k >= 0 (0 = off); --top-p in (0, 1]\n"
            "  --seed         sampling seed (default 1)\n"
            "  --threads      workers of the pool that runs loading, prefill and every decode step, 1..1024,\n"
            "                 this thread included (default: FLX_THREADS, else the CPUs this process may use:\n"
            "                 its affinity mask, capped by its cgroup CPU quota); the choice and its reason\n"
            "                 are printed on stderr (\"workers N: ...\")\n"
            "  --gpu          prefill and the dense part of decoding on CUDA device DEVICE (default 0), window\n"
            "                 attention on its device windows; the scheduler's GPU worker takes attention tasks\n"
            "                 over the pinned host KV (UVA) beside the CPU workers\n"
            "  --policy       the scheduler: priority (Fluxion's: one queue by Eq. 3 volume, every worker\n"
            "                 takes the next task when free), no-parallel (the GPU takes none), uniform or\n"
            "                 length (static shares); default priority\n"
            "  --placement    hybrid (default) or gpu-only (--gpu: every task on the GPU worker)\n"
            "  --no-skip-streaming, --fixed-blk B\n"
            "                 fluxion's ablations: streaming-only groups read like the others; one block size\n"
            "                 16, 32, 64 or 128 for every group instead of the selector's choice\n"
            "  --gpu-streams  --gpu: attention tasks the GPU worker keeps in flight, 1..8 (default 2)\n");
}

static int parse_u64(const char *flag, const char *s, unsigned long long lo, unsigned long long hi,
                     unsigned long long *out)
{
    uint64_t v;
    if (flx_parse_u64(s, lo, hi, &v) != FLX_OK) {
        fprintf(stderr, PROG ": --%s '%s' is not an integer in %llu..%llu\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Strict float parse into [lo, hi] (lo_open: lo excluded). */
static int parse_f(const char *flag, const char *s, double lo, int lo_open, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
        fprintf(stderr, PROG ": --%s '%s' is not a number in %s%g, %g]\n", flag, s, lo_open ? "(" : "[", lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static char *read_file(const char *path, size_t *len_p)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, PROG ": cannot open prompt file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || err) {
        fprintf(stderr, PROG ": reading prompt file %s failed\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len_p = n;
    return buf;
}

/* Streaming detokenizer: holds tokens until their bytes end on a UTF-8 character boundary. */
typedef struct stream {
    flx_tok_h tok;
    int32_t pending[16];
    size_t n_pending;
    char buf[1024];
    uint32_t n_tokens;
    flx_engine_finish_t why;
    int done;
} stream_t;

static int utf8_incomplete(const char *s, size_t n)
{
    size_t i = n, k = 0;
    while (i > 0 && k < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, k++;
    if (i == 0) return k > 0;
    unsigned char c = (unsigned char)s[i - 1];
    size_t need = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    return k < need;
}

static void stream_flush(stream_t *s, int force)
{
    if (!s->n_pending) return;
    size_t len = 0;
    flx_status_t st = flx_tok_decode(s->tok, s->pending, s->n_pending, FLX_TOK_SKIP_SPECIAL, s->buf, sizeof s->buf,
                                     &len);
    if (st) {
        fprintf(stderr, "\n" PROG ": decoding tokens: %s\n", flx_error_msg());
        s->n_pending = 0;
        return;
    }
    if (!force && utf8_incomplete(s->buf, len) && s->n_pending < FLX_ARRAY_SIZE(s->pending)) return;
    fwrite(s->buf, 1, len, stdout);
    fflush(stdout);
    s->n_pending = 0;
}

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    stream_t *s = ctx;
    if (token >= 0) {
        s->n_tokens++;
        s->pending[s->n_pending++] = token;
        stream_flush(s, 0);
    }
    if (is_last) {
        stream_flush(s, 1);
        s->done = 1;
        s->why = why;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    enum { O_MODEL = 1, O_PROMPT, O_CHAT, O_MODE, O_BLK, O_BGT, O_MAXNEW, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_THREADS,
           O_PREDICTOR, O_TAU, O_GPU, O_THR, O_SCALE, O_MINB, O_POLICY, O_PLACEMENT, O_NOSKIP, O_FIXBLK, O_GSTREAMS,
           O_HELP };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},   {"prompt-file", required_argument, 0, O_PROMPT},
        {"chat", no_argument, 0, O_CHAT},           {"mode", required_argument, 0, O_MODE},
        {"blk", required_argument, 0, O_BLK},       {"bgt", required_argument, 0, O_BGT},
        {"max-new", required_argument, 0, O_MAXNEW}, {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},    {"top-p", required_argument, 0, O_TOPP},
        {"seed", required_argument, 0, O_SEED},     {"threads", required_argument, 0, O_THREADS},
        {"predictor", required_argument, 0, O_PREDICTOR}, {"tau", required_argument, 0, O_TAU},
        {"gpu", optional_argument, 0, O_GPU},
        {"stream-threshold", required_argument, 0, O_THR}, {"budget-scale", required_argument, 0, O_SCALE},
        {"min-blocks", required_argument, 0, O_MINB},
        {"policy", required_argument, 0, O_POLICY}, {"placement", required_argument, 0, O_PLACEMENT},
        {"no-skip-streaming", no_argument, 0, O_NOSKIP}, {"fixed-blk", required_argument, 0, O_FIXBLK},
        {"gpu-streams", required_argument, 0, O_GSTREAMS},
        {"help", no_argument, 0, O_HELP},           {0, 0, 0, 0},
    };
    const char *model_path = NULL, *prompt_path = NULL, *pred_path = getenv("FLX_PREDICTOR");
    float tau = 0.1f;
    int chat = 0;
    flx_engine_params_t ep = flx_engine_params_default();
    ep.max_batch = 1;
    flx_sampling_params_t sp = flx_sampling_greedy();
    sp.seed = 1;
    unsigned long long v, max_new = 64, threads = 0;
    int c, use_gpu = 0, gpu_dev = 0;
    float sel_thr = NAN, sel_scale = NAN;   /* NaN / -1: keep the weights' operating point */
    long long sel_minb = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_MODEL: model_path = a; break;
        case O_PROMPT: prompt_path = a; break;
        case O_CHAT: chat = 1; break;
        case O_MODE:
            if (flx_engine_attn_mode_parse(a, &ep.mode)) {
                fprintf(stderr, PROG ": --mode: %s\n", flx_error_msg());
                return 2;
            }
            break;
        case O_BLK:
            if (parse_u64("blk", a, 16, 128, &v)) return 2;
            if (v != 16 && v != 32 && v != 64 && v != 128) {
                fprintf(stderr, PROG ": --blk %llu is not 16, 32, 64 or 128\n", v);
                return 2;
            }
            ep.blk = (uint32_t)v;
            break;
        case O_BGT: if (parse_f("bgt", a, 0.0, 0, 1.0, &ep.bgt)) return 2; break;
        case O_MAXNEW: if (parse_u64("max-new", a, 1, 1000000, &max_new)) return 2; break;
        case O_TEMP: if (parse_f("temp", a, 0.0, 0, 1e6, &sp.temperature)) return 2; break;
        case O_TOPK: if (parse_u64("top-k", a, 0, UINT32_MAX, &v)) return 2; sp.top_k = (uint32_t)v; break;
        case O_TOPP: if (parse_f("top-p", a, 0.0, 1, 1.0, &sp.top_p)) return 2; break;
        case O_SEED: if (parse_u64("seed", a, 0, UINT64_MAX, &v)) return 2; sp.seed = v; break;
        case O_THREADS: if (parse_u64("threads", a, 1, 1024, &threads)) return 2; break;
        case O_PREDICTOR: pred_path = a; break;
        case O_TAU: if (parse_f("tau", a, 0.0, 1, 0.999999, &tau)) return 2; break;
        case O_GPU:
            /* "--gpu", "--gpu=N" or "--gpu N": a following all-digit word is the device */
            if (!a && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9') a = argv[optind++];
            if (a) {
                if (parse_u64("gpu", a, 0, 1023, &v)) return 2;
                gpu_dev = (int)v;
            }
            use_gpu = 1;
            break;
        case O_THR: if (parse_f("stream-threshold", a, 0.5, 0, 1.0, &sel_thr)) return 2; break;
        case O_SCALE: if (parse_f("budget-scale", a, 0.0, 1, 64.0, &sel_scale)) return 2; break;
        case O_MINB: if (parse_u64("min-blocks", a, 0, 64, &v)) return 2; sel_minb = (long long)v; break;
        case O_POLICY:
            if (flx_sched_policy_parse(a, &ep.sched_policy)) {
                fprintf(stderr, PROG ": --policy: %s\n", flx_error_msg());
                return 2;
            }
            break;
        case O_PLACEMENT:
            if (flx_sched_placement_parse(a, &ep.placement)) {
                fprintf(stderr, PROG ": --placement: %s\n", flx_error_msg());
                return 2;
            }
            break;
        case O_NOSKIP: ep.keep_streaming = 1; break;
        case O_FIXBLK:
            if (parse_u64("fixed-blk", a, 16, 128, &v)) return 2;
            if (v != 16 && v != 32 && v != 64 && v != 128) {
                fprintf(stderr, PROG ": --fixed-blk %llu is not 16, 32, 64 or 128\n", v);
                return 2;
            }
            ep.fixed_blk = (uint32_t)v;
            break;
        case O_GSTREAMS: if (parse_u64("gpu-streams", a, 1, 8, &v)) return 2; ep.gpu_streams = (uint32_t)v; break;
        case O_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, PROG ": unknown option or missing value: %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path || !prompt_path) {
        fprintf(stderr, PROG ": %s is required\n", !model_path ? "--model" : "--prompt-file");
        usage(stderr);
        return 2;
    }
    if (optind != argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    flx_predictor_h pred = NULL;
    if (ep.mode == FLX_ENGINE_ATTN_FLUXION) {   /* load the weights before the model: fail fast */
        if (!pred_path) pred_path = FLX_DEFAULT_PREDICTOR;
        if (flx_predictor_load(pred_path, &pred)) {
            fprintf(stderr, PROG ": --predictor %s: %s\n", pred_path, flx_error_msg());
            return 2;
        }
        ep.predictor = pred;
    }
    flx_select_params_t sel = pred ? flx_predictor_select_params(pred) : flx_select_params_paper();
    if (!isnan(sel_thr)) sel.stream_threshold = sel_thr;
    if (!isnan(sel_scale)) sel.budget_scale = sel_scale;
    if (sel_minb >= 0) sel.min_blocks = (uint32_t)sel_minb;
    ep.select = pred ? &sel : NULL;

    int rc = 1;
    flx_model_t *m = NULL;
    flx_tok_h tok = NULL;
    flx_kv_store_h store = NULL;
    flx_engine_h eng = NULL;
    char *text = NULL, *chat_text = NULL;
    int32_t *ids = NULL;
    void *pmem = NULL, *scratch = NULL, *gdev_mem = NULL, *ghost_mem = NULL;
    flx_gpu_model_h gm = NULL;
    flx_gpu_fwd_ws_h gws = NULL;
    flx_cuda_stream_t gstream = NULL;
    float *logits = NULL;
    uint64_t *tpot = NULL;
    flx_pool_h pool = NULL;
    flx_status_t st;

    /* one pool for everything: loading, prefill, the engine's steps */
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    if ((st = flx_pool_create(&pp, &pool))) {
        fprintf(stderr, PROG ": worker pool: %s\n", flx_error_msg());
        goto out;
    }
    fprintf(stderr, PROG ": %s\n", flx_pool_describe(pool));
    ep.pool = pool;
    uint64_t t_load = flx_now_ns();
    if ((st = flx_model_load_pool(model_path, pool, &m)) || (st = flx_tok_load(model_path, &tok))) {
        fprintf(stderr, PROG ": loading %s: %s\n", model_path, flx_error_msg());
        goto out;
    }
    const flx_model_config_t *cfg = &m->cfg;
    if (use_gpu && (st = flx_gpu_model_create(m, gpu_dev, &gm))) {
        fprintf(stderr, PROG ": --gpu %d: %s\n", gpu_dev, flx_error_msg());
        goto out;
    }
    t_load = flx_now_ns() - t_load;
    if (flx_tok_vocab_size(tok) > cfg->vocab) {
        fprintf(stderr, PROG ": tokenizer has %u tokens, the model's vocabulary only %u\n", flx_tok_vocab_size(tok),
                cfg->vocab);
        goto out;
    }

    size_t text_len = 0;
    if (!(text = read_file(prompt_path, &text_len)))
        goto out;
    const char *input = text;
    size_t input_len = text_len;
    if (chat) {
        flx_tok_msg_t msg = {.role = "user", .content = text};
        size_t need = 0;
        st = flx_tok_chat(tok, &msg, 1, 1, NULL, 0, &need);
        if (st && st != FLX_ERR_CAPACITY) {
            fprintf(stderr, PROG ": --chat: %s\n", flx_error_msg());
            goto out;
        }
        chat_text = malloc(need + 1);
        if (!chat_text || (st = flx_tok_chat(tok, &msg, 1, 1, chat_text, need + 1, &need))) {
            fprintf(stderr, PROG ": --chat: %s\n", chat_text ? flx_error_msg() : "out of memory");
            goto out;
        }
        input = chat_text;
        input_len = need;
    }
    int add_bos = flx_tok_add_bos_default(tok) && flx_tok_bos(tok) >= 0;
    size_t n_ids = 0;
    st = flx_tok_encode(tok, input, input_len, add_bos, NULL, 0, &n_ids);
    if (st && st != FLX_ERR_CAPACITY) {
        fprintf(stderr, PROG ": encoding the prompt: %s\n", flx_error_msg());
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, PROG ": the prompt is empty\n");
        goto out;
    }
    if (n_ids + max_new > cfg->max_ctx)
        fprintf(stderr, PROG ": warning: prompt %zu + max-new %llu tokens exceed the model's trained context %u\n",
                n_ids, max_new, cfg->max_ctx);
    if (n_ids > UINT32_MAX / 2) {
        fprintf(stderr, PROG ": prompt of %zu tokens is too long\n", n_ids);
        goto out;
    }
    ids = malloc(n_ids * sizeof *ids);
    if (!ids || (st = flx_tok_encode(tok, input, input_len, add_bos, ids, n_ids, &n_ids))) {
        fprintf(stderr, PROG ": encoding the prompt: %s\n", ids ? flx_error_msg() : "out of memory");
        goto out;
    }
    const uint32_t n = (uint32_t)n_ids;

    /* The store: room for this one session (KV + window + side tables), with slack. */
    {
        size_t per_tok = (size_t)cfg->n_layers * cfg->n_kv_heads * cfg->head_dim * 2 * sizeof(flx_bf16_t);
        size_t cap = per_tok * ((size_t)n + max_new + 2048) * 2 + ((size_t)64 << 20);
        flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                    .capacity_bytes = cap, .n_layers = cfg->n_layers,
                                    .n_kv_heads = cfg->n_kv_heads, .n_q_heads = cfg->n_heads,
                                    .head_dim = cfg->head_dim};
        if (use_gpu) {   /* windows mirrored on the device; the arena pinned for the GPU worker's UVA reads */
            kp.field_mask |= FLX_KV_STORE_FIELD_FLAGS | FLX_KV_STORE_FIELD_CUDA_DEVICE;
            kp.flags = FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE | FLX_KV_STORE_PIN_CUDA;
            kp.cuda_device = gpu_dev;
        }
        if ((st = flx_kv_store_create(&kp, &store))) {
            fprintf(stderr, PROG ": kvstore: %s\n", flx_error_msg());
            goto out;
        }
    }
    ep.max_l_cpu = n;
    ep.use_gpu = use_gpu;
    ep.cuda_device = gpu_dev;
    ep.gpu_model = gm;
    if ((st = flx_engine_create(m, store, &ep, &eng))) {
        fprintf(stderr, PROG ": engine: %s\n", flx_error_msg());
        goto out;
    }

    /* prefill */
    flx_fwd_shape_t fs = {.max_prompt = n, .max_batch = 1, .pool = pool};
    size_t pbytes = 0;
    flx_fwd_ws_t *pws = NULL;
    if (use_gpu) {
        flx_gpu_fwd_shape_t gs = {.max_prompt = n, .max_batch = 1};
        size_t gdev_b = 0, ghost_b = 0;
        if ((st = flx_gpu_fwd_plan(m, &gs, &gdev_b, &ghost_b)) || (st = flx_cuda_malloc(gpu_dev, gdev_b, &gdev_mem)) ||
            (st = flx_cuda_host_alloc(ghost_b, &ghost_mem)) || (st = flx_cuda_stream_create(gpu_dev, &gstream)) ||
            (st = flx_gpu_fwd_ws_create(gm, &gs, gdev_mem, gdev_b, ghost_mem, ghost_b, &gws))) {
            fprintf(stderr, PROG ": gpu prefill workspace for %u tokens: %s\n", n, flx_error_msg());
            goto out;
        }
    } else if ((st = flx_fwd_plan(m, &fs, &pbytes)) || !(pmem = flx_aligned_alloc(64, pbytes ? pbytes : 64)) ||
               (st = flx_fwd_ws_init(m, &fs, pmem, pbytes, &pws))) {
        fprintf(stderr, PROG ": prefill workspace for %u tokens: %s\n", n, st ? flx_error_msg() : "out of memory");
        goto out;
    }
    logits = malloc((size_t)cfg->vocab * sizeof *logits);
    scratch = malloc(flx_sample_scratch_bytes(cfg->vocab));
    if (!logits || !scratch) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    flx_kv_session_id_t sid;
    uint64_t t_pre = flx_now_ns();
    const uint32_t room = (uint32_t)FLX_MIN(max_new, 1u << 30);
    if (use_gpu)
        st = flx_engine_prefill_gpu(gm, gws, gstream, store, ids, n, room,
                                    ep.mode == FLX_ENGINE_ATTN_FLUXION ? tau : -1.0f, &sid, logits);
    else if (ep.mode == FLX_ENGINE_ATTN_FLUXION)
        st = flx_engine_prefill_with_stats(m, pws, store, ids, n, room, tau, &sid, logits);
    else
        st = flx_engine_prefill_into_store(m, pws, store, ids, n, room, &sid, logits);
    if (st) {
        fprintf(stderr, PROG ": prefill: %s\n", flx_error_msg());
        goto out;
    }
    t_pre = flx_now_ns() - t_pre;
    flx_aligned_free(pmem);   /* the prompt's activations are not needed while decoding */
    pmem = NULL;
    flx_gpu_fwd_ws_destroy(gws);
    gws = NULL;
    flx_cuda_stream_destroy(gpu_dev, gstream);
    gstream = NULL;
    if (gdev_mem) (void)flx_cuda_free(gpu_dev, gdev_mem);
    gdev_mem = NULL;
    flx_cuda_host_free(ghost_mem);
    ghost_mem = NULL;

    flx_sampler_t first;
    int32_t tok0;
    if ((st = flx_sampler_init(&first, &sp, cfg->vocab)) ||
        (st = flx_sample(&first, logits, scratch, flx_sample_scratch_bytes(cfg->vocab), &tok0))) {
        fprintf(stderr, PROG ": sampling: %s\n", flx_error_msg());
        flx_kv_session_close(store, sid);
        goto out;
    }
    /* end-of-generation tokens of the tokenizer (EOS, <|im_end|>, <|eot_id|>, ...) stop the sequence */
    int32_t stops[FLX_ENGINE_MAX_STOP];
    uint32_t n_stop = 0;
    for (uint32_t i = 0; i < flx_tok_vocab_size(tok) && n_stop < FLX_ENGINE_MAX_STOP; i++)
        if (flx_tok_is_eog(tok, (int32_t)i)) stops[n_stop++] = (int32_t)i;
    stream_t stream = {.tok = tok};
    flx_gen_params_t gp = {.max_new_tokens = (uint32_t)max_new, .stop_ids = stops, .n_stop = n_stop,
                           .eos_id = flx_tok_eos(tok), .sampling = sp, .on_token = on_token, .ctx = &stream};
    gp.sampling.seed = sp.seed ^ 0x9e3779b97f4a7c15ull;
    flx_engine_seq_id_t seq;
    if ((st = flx_engine_add(eng, sid, tok0, &gp, &seq))) {
        fprintf(stderr, PROG ": %s\n", flx_error_msg());
        flx_kv_session_close(store, sid);
        goto out;
    }
    flx_kv_session_info_t si;
    flx_kv_session_info(store, sid, &si);
    fprintf(stderr, PROG ": %s (%u layers, %u/%u heads of %u), prompt %u tokens (sink %u, local %u, host %u), "
                    "mode %s",
            cfg->name, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, n, si.n_sink, si.n_local,
            si.l_cpu, flx_engine_attn_mode_name(ep.mode));
    if (ep.mode == FLX_ENGINE_ATTN_FIXED) fprintf(stderr, " (blk %u, bgt %g)", ep.blk, (double)ep.bgt);
    if (ep.mode == FLX_ENGINE_ATTN_FLUXION)
        fprintf(stderr, " (predictor %s, tau %g; selector: stream threshold %g, budget scale %g, min blocks %u)",
                pred_path, (double)tau, (double)sel.stream_threshold, (double)sel.budget_scale, sel.min_blocks);
    if (use_gpu) fprintf(stderr, ", gpu %d", gpu_dev);
    fprintf(stderr, "\n");
    fflush(stderr);

    tpot = malloc((size_t)max_new * sizeof *tpot);
    if (!tpot) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    size_t n_steps = 0;
    for (;;) {
        st = flx_engine_step(eng);
        if (st < 0) {
            fprintf(stderr, "\n" PROG ": decode step: %s\n", flx_error_msg());
            goto out;
        }
        flx_engine_stats_t last, tot_now;
        flx_engine_last_stats(eng, &last);
        flx_engine_total_stats(eng, &tot_now);
        if (tot_now.n_steps > n_steps && n_steps < max_new) tpot[n_steps++] = last.step_ns;   /* a step ran */
        if (st == FLX_OK) break;
    }
    printf("\n");
    fflush(stdout);

    flx_engine_stats_t tot;
    flx_engine_total_stats(eng, &tot);
    double mean = 0, p50 = 0, p90 = 0;
    if (tot.n_steps) {
        qsort(tpot, n_steps, sizeof *tpot, cmp_u64);
        mean = (double)tot.step_ns / (double)tot.n_steps / 1e6;
        p50 = (double)tpot[(n_steps - 1) / 2] / 1e6;
        p90 = (double)tpot[(size_t)((n_steps - 1) * 0.9)] / 1e6;
    }
    double attn_share = tot.attn_ns + tot.dense_ns ? (double)tot.attn_ns / (double)(tot.attn_ns + tot.dense_ns) : 0;
    fprintf(stderr, "--- %u tokens generated, ended by %s\n", stream.n_tokens, flx_engine_finish_name(stream.why));
    fprintf(stderr, "load      %.2f s\n", (double)t_load / 1e9);
    fprintf(stderr, "prefill   %u tokens in %.3f s: %.1f tokens/s\n", n, (double)t_pre / 1e9,
            (double)n / ((double)t_pre / 1e9));
    fprintf(stderr, "decode    %llu steps, TPOT mean %.2f ms, p50 %.2f ms, p90 %.2f ms (%.1f tokens/s)\n",
            (unsigned long long)tot.n_steps, mean, p50, p90, mean > 0 ? 1e3 / mean : 0.0);
    fprintf(stderr, "split     attention %.1f%% (window appends %.2f ms/step), dense %.1f%% of the forward time\n",
            100 * attn_share, tot.n_steps ? (double)tot.append_ns / tot.n_steps / 1e6 : 0.0, 100 * (1 - attn_share));
    if (tot.n_steps) {
        /* Fluxion's window partials come out of its features: their time is in the line below. */
        char win[48] = "in the features";
        if (ep.mode != FLX_ENGINE_ATTN_FLUXION)
            snprintf(win, sizeof win, "%.3f ms", (double)tot.window_ns / tot.n_steps / 1e6);
        fprintf(stderr,
                "attention per step: %.0f tasks, host bytes read %.2f MiB, kernel time (summed over tasks) "
                "window %s, score %.3f ms, top-k %.3f ms, host attention %.3f ms, merge %.3f ms\n",
                (double)tot.n_tasks / tot.n_steps, (double)tot.host_bytes / tot.n_steps / (1 << 20), win,
                (double)tot.score_ns / tot.n_steps / 1e6, (double)tot.topk_ns / tot.n_steps / 1e6,
                (double)tot.host_attn_ns / tot.n_steps / 1e6, (double)tot.merge_ns / tot.n_steps / 1e6);
    }
    if (tot.n_steps && ep.mode == FLX_ENGINE_ATTN_FLUXION)
        fprintf(stderr, "fluxion per step: features + predictor + selector %.3f ms (%.1f%% of the step), %.0f of %u "
                        "groups streaming-only (no host read)\n",
                (double)tot.predict_ns / tot.n_steps / 1e6,
                tot.step_ns ? 100.0 * (double)tot.predict_ns / (double)tot.step_ns : 0.0,
                (double)tot.n_skipped / tot.n_steps, cfg->n_layers * cfg->n_kv_heads);
    char ratio[48] = "n/a: no GPU";
    if (use_gpu && tot.sched_wall_ns)
        snprintf(ratio, sizeof ratio, "%.3f", (double)tot.gpu_idle_ns / (double)tot.sched_wall_ns);
    if (tot.n_steps)
        fprintf(stderr, "scheduler (%s, %s) per step: CPU workers busy %.3f ms in tasks; %.1f tasks on the GPU worker; "
                        "GPU busy %.3f ms, idle %.3f ms of the attention layers' %.3f ms (idle ratio %s)\n",
                flx_sched_policy_name(ep.sched_policy), flx_sched_placement_name(ep.placement),
                (double)tot.cpu_busy_ns / tot.n_steps / 1e6, (double)tot.n_gpu_tasks / tot.n_steps,
                (double)tot.gpu_busy_ns / tot.n_steps / 1e6, (double)tot.gpu_idle_ns / tot.n_steps / 1e6,
                (double)tot.sched_wall_ns / tot.n_steps / 1e6, ratio);
    rc = 0;
out:
    flx_engine_destroy(eng);
    flx_gpu_fwd_ws_destroy(gws);
    flx_cuda_stream_destroy(gpu_dev, gstream);
    if (gdev_mem) (void)flx_cuda_free(gpu_dev, gdev_mem);
    flx_cuda_host_free(ghost_mem);
    flx_gpu_model_destroy(gm);
    flx_predictor_destroy(pred);
    flx_kv_store_destroy(store);
    flx_aligned_free(pmem);
    free(scratch);
    free(logits);
    free(tpot);
    free(ids);
    free(chat_text);
    free(text);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    return rc;
}
