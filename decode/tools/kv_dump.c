/*
 * flx-kv-dump - a teacher-forced KV dump of a real model (flx/kvsource.h format).
 *
 * DESIGN
 * One prefill of prompt_len + n_steps tokens of a text gives everything: the on_layer callback
 * hands each layer's K, V (RoPE applied, (Hkv, n, D) bf16) and q_all holds every query, of which
 * the dump keeps the anchor (position prompt_len - 1) and the n_steps decode queries after it.
 * Teacher forcing makes the "decoded" tokens the text's next tokens, exactly what a decode of them
 * would see, without a decode loop.
 *
 * usage: flx-kv-dump -m MODEL(.gguf | HF dir) --text FILE --prompt-len N --steps S [--offset TOKENS]
 *                    -o FILE
 * Exit status (flx/cli.h): 0 done, 1 a runtime failure (a file, the model), 2 a usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/forward.h"
#include "flx/kvsource.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

typedef struct dump_ctx {
    flx_kvdump_writer_h w;
    const float *q_all;          /* (n_layers, n, Hq, D) */
    float *q;                    /* (Hq, S + 1, D) */
    uint32_t n, P, S, Hq, D;
} dump_ctx_t;

static flx_status_t on_layer(void *vctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                             const float *q_last)
{
    (void)q_last;
    dump_ctx_t *c = vctx;
    if (FLX_NEVER(n != c->n)) return flx_error_set(FLX_ERR_INTERNAL, "prefill gave %u tokens, asked %u", n, c->n);
    /* q_all for this layer is complete when its on_layer runs */
    const float *ql = c->q_all + (size_t)layer * n * c->Hq * c->D;
    for (uint32_t h = 0; h < c->Hq; h++)
        for (uint32_t r = 0; r <= c->S; r++)
            memcpy(c->q + ((size_t)h * (c->S + 1) + r) * c->D, ql + ((size_t)(c->P - 1 + r) * c->Hq + h) * c->D,
                   c->D * sizeof(float));
    return flx_kvdump_writer_layer(c->w, layer, k, v, c->q);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *out_path = NULL;
    uint64_t P = 0, S = 0, off = 0, threads = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "MODEL", &model_path, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
        FLX_CLI_PATH(0, "text", "FILE", &text_path, FLX_CLI_REQUIRED, "the text (UTF-8) whose tokens are fed"),
        FLX_CLI_UINT(0, "prompt-len", "N", &P, 1, 1u << 24, FLX_CLI_REQUIRED, "prompt tokens (the anchor is the last)"),
        FLX_CLI_UINT(0, "steps", "S", &S, 0, 1u << 20, FLX_CLI_REQUIRED,
                     "teacher-forced decode steps after the prompt"),
        FLX_CLI_UINT(0, "offset", "TOKENS", &off, 0, 1u << 30, 0, "tokens of the text skipped first (default 0)"),
        FLX_CLI_PATH('o', "out", "FILE", &out_path, FLX_CLI_REQUIRED, "the KV dump to write (safetensors)"),
        FLX_CLI_UINT('t', "threads", "N", &threads, 1, 1024, 0, "pool workers (default: FLX_THREADS, else the CPU budget)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("flx-kv-dump", "Teacher-forced KV dump of a model on a text: K, V, the anchor query "
                                 "and the decode queries of every layer (docs/predictor.md).", opts);
    cli.progress = 1;
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    const uint32_t n = (uint32_t)(P + S);
    size_t tlen;
    char *text = NULL;
    if (flx_cli_read_file(text_path, (size_t)1 << 31, &text, &tlen))
        return flx_cli_fail(&cli, "--text: %s", flx_error_msg());
    rc = FLX_EXIT_FAILURE;
    flx_model_t *m = NULL;
    flx_tok_h tok = NULL;
    int32_t *ids = NULL;
    void *wsmem = NULL;
    float *q_all = NULL, *q = NULL;
    flx_kvdump_writer_h w = NULL;
    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = (uint32_t)threads};
    flx_pool_h pool = NULL;
    if (flx_pool_create(&pp, &pool) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: worker pool: %s\n", flx_error_msg());
        goto out;
    }
    fprintf(stderr, "flx-kv-dump: %s\n", flx_pool_describe(pool));
    if (flx_model_load_pool(model_path, pool, &m) != FLX_OK || flx_tok_load(model_path, &tok) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: %s: %s\n", model_path, flx_error_msg());
        goto out;
    }
    const flx_model_config_t *c = &m->cfg;
    if (n > c->max_ctx) {
        fprintf(stderr,
                "flx-kv-dump: --prompt-len %llu + --steps %llu = %u tokens, longer than the model's context of %u "
                "tokens\n",
                (unsigned long long)P, (unsigned long long)S, n, c->max_ctx);
        goto out;
    }
    size_t n_ids = 0, cap = tlen + 2;
    if (!(ids = malloc(cap * sizeof *ids))) goto oom;
    if (flx_tok_encode(tok, text, tlen, flx_tok_add_bos_default(tok), ids, cap, &n_ids) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: %s: tokenize: %s\n", text_path, flx_error_msg());
        goto out;
    }
    if (off + n > n_ids) {
        fprintf(stderr, "flx-kv-dump: %s has %zu tokens, --offset %llu + --prompt-len %llu + --steps %llu need %llu\n",
                text_path, n_ids, (unsigned long long)off, (unsigned long long)P, (unsigned long long)S,
                (unsigned long long)(off + n));
        goto out;
    }
    flx_fwd_shape_t shape = {.max_prompt = n, .max_batch = 1, .pool = pool};
    size_t wsb;
    flx_fwd_ws_t *ws;
    if (flx_fwd_plan(m, &shape, &wsb) != FLX_OK || !(wsmem = flx_aligned_alloc(64, wsb)) ||
        flx_fwd_ws_init(m, &shape, wsmem, wsb, &ws) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: workspace: %s\n", flx_error_msg());
        goto out;
    }
    if (!(q_all = malloc((size_t)c->n_layers * n * c->n_heads * c->head_dim * sizeof *q_all)) ||
        !(q = malloc((size_t)c->n_heads * (S + 1) * c->head_dim * sizeof *q)))
        goto oom;
    flx_kvsrc_shape_t ksh = {c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, (uint32_t)P, (uint32_t)S};
    char tdesc[512];
    snprintf(tdesc, sizeof tdesc, "%s offset %llu", text_path, (unsigned long long)off);
    if (flx_kvdump_writer_create(&ksh, c->name, tdesc, &w) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: %s\n", flx_error_msg());
        goto out;
    }
    dump_ctx_t ctx = {w, q_all, q, n, (uint32_t)P, (uint32_t)S, c->n_heads, c->head_dim};
    flx_prefill_args_t pa = {.tokens = ids + off, .n_tokens = n, .on_layer = on_layer, .ctx = &ctx, .q_all = q_all};
    uint64_t t0 = flx_now_ns();
    if (flx_model_prefill(m, ws, &pa) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: prefill: %s\n", flx_error_msg());
        goto out;
    }
    double secs = (flx_now_ns() - t0) * 1e-9;
    if (flx_kvdump_writer_save(w, out_path) != FLX_OK) {
        fprintf(stderr, "flx-kv-dump: %s: %s\n", out_path, flx_error_msg());
        goto out;
    }
    fprintf(stderr, "flx-kv-dump: %s: %u tokens (prompt %llu + %llu steps) prefilled in %.2f s, wrote %s\n", c->name,
            n, (unsigned long long)P, (unsigned long long)S, secs, out_path);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "flx-kv-dump: out of memory\n");
out:
    flx_kvdump_writer_destroy(w);
    free(q_all), free(q);
    flx_aligned_free(wsmem);
    free(ids);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    free(text);
    return rc;
}
