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
 * The command line (flx/cli.h) is checked whole before anything is read; then the prompt file and
 * the predictor (small, fast to refuse), then the model; a prompt longer than the model's context is
 * refused before any memory is sized for it (exit 1, both lengths named). --progress (or a terminal
 * on stderr) shows model loading and the prefill layer by layer.
 *
 * --gpu [DEVICE] runs the prefill and the dense part of decoding on a CUDA device (the weights are
 * uploaded once and shared by both), keeps the kvstore's windows on that device too and runs
 * window attention there (flx/engine.h, GPU PATH). Without a usable device it stops with the
 * FLX_ERR_NO_DEVICE message and exit code 1: asking for a GPU never silently decodes on the CPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
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
#define MAX_PROMPT_BYTES ((size_t)1 << 30)

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
    /* modes in flx_engine_attn_mode_t's order; blk = 16 << index */
    static const char *const modes[] = {"full", "fixed", "fluxion", NULL},
                             *const blks[] = {"16", "32", "64", "128", NULL},
                             /* in flx_sched_policy_t's and flx_sched_placement_t's orders */
                             *const policies[] = {"priority", "no-parallel", "uniform", "length", NULL},
                             *const placements[] = {"hybrid", "gpu-only", NULL},
                             /* in flx_weights_t's order */
                             *const weights_fmts[] = {"compact", "bf16", NULL};
    const char *model_path = NULL, *prompt_text = NULL, *prompt_path = NULL, *pred_path = getenv("FLX_PREDICTOR");
    int chat = 0, mode = 0, blk_i = 0, policy = 0, placement = 0, no_skip = 0, fixed_blk_i = 0, weights = 0;
    uint64_t max_new = 64, threads = 0, top_k = 0, seed = 1, gpu_dev = 0, sel_minb = 0, gpu_streams = 2;
    double bgt = 0.05, tau = 0.1, temp = 0.0, top_p = 1.0, sel_thr = 0, sel_scale = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED,
                     "a .gguf file or a Hugging Face folder (config.json, *.safetensors, tokenizer.json)"),
        FLX_CLI_ENUM(0, "weights", &weights, weights_fmts, 0,
                     "a GGUF's Q4_0/Q4_1/Q8_0 matrices: compact (their blocks, the default) or bf16\n"
                     "(dequantized); the same values, so the same tokens (docs/workers.md)"),
        FLX_CLI_STR('p', "prompt", "TEXT", &prompt_text, 0, "the prompt itself (UTF-8)"),
        FLX_CLI_PATH('f', "prompt-file", "FILE", &prompt_path, 0, "the prompt from a file (UTF-8); '-' reads stdin"),
        FLX_CLI_FLAG(0, "chat", &chat, "wrap the prompt as one user message with the model's chat template"),
        FLX_CLI_ENUM(0, "mode", &mode, modes, 0,
                     "attention over the host-resident KV: full (exact, the default), fixed (blk, bgt)\n"
                     "or fluxion (predicted per-head budgets and block size)"),
        FLX_CLI_ENUM(0, "blk", &blk_i, blks, 0, "fixed: logical block size (default 16)"),
        FLX_CLI_FLOAT(0, "bgt", "X", &bgt, 0.0, 1.0, 0,
                      "fixed: fraction of the host-resident tokens each head reads besides its\n"
                      "window (sink + local + generated tokens), default 0.05"),
        FLX_CLI_PATH(0, "predictor", "WEIGHTS", &pred_path, 0,
                     "fluxion: predictor weights (default $FLX_PREDICTOR, else the shipped\n"
                     "fluxion/weights/predictor-smollm2-135m-instruct.safetensors)"),
        FLX_CLI_FLOAT(0, "tau", "X", &tau, 0.0, 1.0, FLX_CLI_LO_OPEN | FLX_CLI_HI_OPEN,
                      "fluxion: Eq. 2 threshold of the prefill statistics (default 0.1)"),
        FLX_CLI_FLOAT(0, "stream-threshold", "P", &sel_thr, 0.5, 1.0, 0,
                      "fluxion: a head is streaming when p >= P (overrides the weights' operating point;\n"
                      "0.5 with --budget-scale 1 --min-blocks 0 is the paper's rule)"),
        FLX_CLI_FLOAT(0, "budget-scale", "A", &sel_scale, 0.0, 64.0, FLX_CLI_LO_OPEN,
                      "fluxion: Eq. 1 budgets scaled by A"),
        FLX_CLI_UINT(0, "min-blocks", "M", &sel_minb, 0, 64, 0, "fluxion: a retrieval head reads at least M blocks"),
        FLX_CLI_UINT('n', "max-new", "N", &max_new, 1, 1000000, 0,
                     "tokens to generate, the first one included (default 64)"),
        FLX_CLI_FLOAT(0, "temp", "T", &temp, 0.0, 1e6, 0, "sampling temperature (default 0: greedy)"),
        FLX_CLI_UINT(0, "top-k", "K", &top_k, 0, UINT32_MAX, 0, "sample among the K likeliest tokens (0: all)"),
        FLX_CLI_FLOAT(0, "top-p", "P", &top_p, 0.0, 1.0, FLX_CLI_LO_OPEN, "nucleus sampling mass (default 1)"),
        FLX_CLI_UINT('s', "seed", "S", &seed, 0, UINT64_MAX, 0, "sampling seed (default 1)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, 1024, 0, "pool workers for loading, prefill and every decode step,\n"
                     "this thread included (default: FLX_THREADS, else the CPUs this process may use)"),
        FLX_CLI_UINT(0, "gpu", "DEVICE", &gpu_dev, 0, 1023, FLX_CLI_OPTIONAL,
                     "prefill and the dense part of decoding on CUDA device DEVICE (default 0),\n"
                     "window attention on its device windows; the scheduler's GPU worker takes attention\n"
                     "tasks over the pinned host KV (UVA) beside the CPU workers"),
        FLX_CLI_ENUM(0, "policy", &policy, policies, 0,
                     "the scheduler: priority (Fluxion's: one queue by Eq. 3 volume, every worker takes\n"
                     "the next task when free), no-parallel (the GPU takes none), uniform or length\n"
                     "(static shares); default priority"),
        FLX_CLI_ENUM(0, "placement", &placement, placements, 0,
                     "hybrid (default) or gpu-only (with --gpu: every task on the GPU worker)"),
        FLX_CLI_FLAG(0, "no-skip-streaming", &no_skip,
                     "fluxion ablation: streaming-only groups read the host like the others"),
        FLX_CLI_ENUM(0, "fixed-blk", &fixed_blk_i, blks, 0,
                     "fluxion ablation: one block size for every group instead of the selector's"),
        FLX_CLI_UINT(0, "gpu-streams", "N", &gpu_streams, 1, 8, 0,
                     "with --gpu: attention tasks the GPU worker keeps in flight (default 2)"),
    };
    flx_cli_t cli = FLX_CLI_INIT(PROG, "Generates text with a model on one machine: prefill into a host KV store, "
                                 "decode with full, fixed or Fluxion attention.", opts);
    cli.synopsis = "-m MODEL (-p TEXT | -f FILE) [options]";
    cli.epilog = "The text goes to stdout; the model, timings and progress go to stderr.";
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const flx_engine_attn_mode_t amode = (flx_engine_attn_mode_t)mode;
    char fixed_only[96], fluxion_only[96];
    snprintf(fixed_only, sizeof fixed_only, "with --mode %s (only with --mode fixed)", modes[mode]);
    snprintf(fluxion_only, sizeof fluxion_only, "with --mode %s (only with --mode fluxion)", modes[mode]);
    if (flx_cli_exclusive(&cli, "prompt", "prompt-file", 1) ||
        flx_cli_applies(&cli, amode == FLX_ENGINE_ATTN_FIXED, fixed_only, "blk", "bgt", NULL) ||
        flx_cli_applies(&cli, amode == FLX_ENGINE_ATTN_FLUXION, fluxion_only, "predictor", "tau", "stream-threshold",
                        "budget-scale", "min-blocks", "no-skip-streaming", "fixed-blk", NULL) ||
        flx_cli_applies(&cli, flx_cli_given(&cli, "gpu") > 0, "without --gpu (there is no GPU worker)", "placement",
                        "gpu-streams", NULL) ||
        flx_cli_applies(&cli, temp > 0.0, "with greedy sampling (--temp 0): give --temp T > 0", "top-k", "top-p",
                        "seed", NULL))
        return flx_cli_usage_error(&cli, NULL);

    flx_engine_params_t ep = flx_engine_params_default();
    ep.max_batch = 1;
    ep.mode = amode;
    ep.blk = 16u << blk_i;
    ep.bgt = (float)bgt;
    ep.sched_policy = (flx_sched_policy_t)policy;
    ep.placement = (flx_sched_placement_t)placement;
    ep.keep_streaming = no_skip;
    ep.fixed_blk = flx_cli_given(&cli, "fixed-blk") ? 16u << fixed_blk_i : 0;
    ep.gpu_streams = (uint32_t)gpu_streams;
    flx_sampling_params_t sp = flx_sampling_greedy();
    sp.temperature = (float)temp;
    sp.top_k = (uint32_t)top_k;
    sp.top_p = (float)top_p;
    sp.seed = seed;
    const int use_gpu = flx_cli_given(&cli, "gpu") > 0;

    /* the prompt and the predictor before the model: a missing file fails in a moment */
    char *text = NULL;
    size_t text_len = 0;
    if (prompt_text) {
        text_len = strlen(prompt_text);
        if (!(text = malloc(text_len + 1))) return flx_cli_fail(&cli, "out of memory");
        memcpy(text, prompt_text, text_len + 1);
    } else if (flx_cli_read_file(prompt_path, MAX_PROMPT_BYTES, &text, &text_len)) {
        return flx_cli_fail(&cli, "--prompt-file: %s", flx_error_msg());
    }
    flx_predictor_h pred = NULL;
    if (ep.mode == FLX_ENGINE_ATTN_FLUXION) {
        if (!pred_path) pred_path = FLX_DEFAULT_PREDICTOR;
        if (flx_predictor_load(pred_path, &pred)) {
            free(text);
            return flx_cli_fail(&cli, "--predictor %s: %s", pred_path, flx_error_msg());
        }
        ep.predictor = pred;
    }
    flx_select_params_t sel = pred ? flx_predictor_select_params(pred) : flx_select_params_paper();
    if (flx_cli_given(&cli, "stream-threshold")) sel.stream_threshold = (float)sel_thr;
    if (flx_cli_given(&cli, "budget-scale")) sel.budget_scale = (float)sel_scale;
    if (flx_cli_given(&cli, "min-blocks")) sel.min_blocks = (uint32_t)sel_minb;
    ep.select = pred ? &sel : NULL;

    rc = FLX_EXIT_FAILURE;
    flx_model_t *m = NULL;
    flx_tok_h tok = NULL;
    flx_kv_store_h store = NULL;
    flx_engine_h eng = NULL;
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
    ep.pool = pool;
    uint64_t t_load = flx_now_ns();
    if ((st = flx_model_load_as(model_path, pool, (flx_weights_t)weights, &m)) || (st = flx_tok_load(model_path, &tok))) {
        fprintf(stderr, PROG ": loading %s: %s\n", model_path, flx_error_msg());
        goto out;
    }
    fprintf(stderr, PROG ": %s\n", flx_pool_describe(pool));   /* after the errors a user must see first */
    const flx_model_config_t *cfg = &m->cfg;
    fprintf(stderr, PROG ": weights %s: %.1f MB read a decode step (matrices as %s, head as %s)\n",
            flx_weights_name((flx_weights_t)weights), flx_model_weight_bytes(m) / 1e6,
            cfg->n_layers ? flx_wfmt_name(m->layers[0].w_up.fmt) : "-", flx_wfmt_name(m->lm_head.fmt));
    if (use_gpu && (st = flx_gpu_model_create(m, (int)gpu_dev, &gm))) {
        fprintf(stderr, PROG ": --gpu %d: %s\n", (int)gpu_dev, flx_error_msg());
        goto out;
    }
    t_load = flx_now_ns() - t_load;
    if (flx_tok_vocab_size(tok) > cfg->vocab) {
        fprintf(stderr, PROG ": tokenizer has %u tokens, the model's vocabulary only %u\n", flx_tok_vocab_size(tok),
                cfg->vocab);
        goto out;
    }

    size_t n_ids = 0;
    if ((st = flx_tok_encode_prompt(tok, text, text_len, chat, &ids, &n_ids))) {
        fprintf(stderr, PROG ": %s: %s\n", chat ? "--chat" : "encoding the prompt", flx_error_msg());
        goto out;
    }
    if (n_ids > cfg->max_ctx) {   /* refused before any memory is sized for it or a layer runs */
        fprintf(stderr, PROG ": the prompt is %zu tokens, longer than the model's context of %u tokens (%s)\n",
                n_ids, cfg->max_ctx, model_path);
        goto out;
    }
    if (n_ids + max_new > cfg->max_ctx)
        fprintf(stderr, PROG ": warning: prompt %zu + max-new %llu tokens exceed the model's trained context %u\n",
                n_ids, (unsigned long long)max_new, cfg->max_ctx);
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
            kp.cuda_device = (int)gpu_dev;
        }
        if ((st = flx_kv_store_create(&kp, &store))) {
            fprintf(stderr, PROG ": kvstore: %s\n", flx_error_msg());
            goto out;
        }
    }
    ep.max_l_cpu = n;
    ep.use_gpu = use_gpu;
    ep.cuda_device = (int)gpu_dev;
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
        if ((st = flx_gpu_fwd_plan(m, &gs, &gdev_b, &ghost_b)) ||
            (st = flx_cuda_malloc((int)gpu_dev, gdev_b, &gdev_mem)) ||
            (st = flx_cuda_host_alloc(ghost_b, &ghost_mem)) || (st = flx_cuda_stream_create((int)gpu_dev, &gstream)) ||
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
    flx_cuda_stream_destroy((int)gpu_dev, gstream);
    gstream = NULL;
    if (gdev_mem) (void)flx_cuda_free((int)gpu_dev, gdev_mem);
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
    if (use_gpu) fprintf(stderr, ", gpu %d", (int)gpu_dev);
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
                "attention per step: %.0f tasks, host bytes read %.2f MiB (Quest metadata %.2f), kernel time "
                "(summed over tasks) window %s, score %.3f ms, top-k %.3f ms, host attention %.3f ms, merge %.3f ms\n",
                (double)tot.n_tasks / tot.n_steps, (double)tot.host_bytes / tot.n_steps / (1 << 20),
                (double)tot.host_meta_bytes / tot.n_steps / (1 << 20), win,
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
    flx_cuda_stream_destroy((int)gpu_dev, gstream);
    if (gdev_mem) (void)flx_cuda_free((int)gpu_dev, gdev_mem);
    flx_cuda_host_free(ghost_mem);
    flx_gpu_model_destroy(gm);
    flx_predictor_destroy(pred);
    flx_kv_store_destroy(store);
    flx_aligned_free(pmem);
    free(scratch);
    free(logits);
    free(tpot);
    free(ids);
    free(text);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    return rc;
}
