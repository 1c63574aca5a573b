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
 * usage: flx-kv-dump --model MODEL(.gguf | HF dir) --text FILE --prompt-len N --steps S
 *                    [--offset TOKENS] --out FILE
 * Exit status: 0 done, 2 bad usage or input, 1 a runtime failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/forward.h"
#include "flx/kvsource.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

static void usage(void)
{
    fprintf(stderr, "usage: flx-kv-dump --model MODEL(.gguf | HF dir) --text FILE --prompt-len N --steps S\n"
                    "                   [--offset TOKENS] --out FILE\n");
}

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

static char *read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "flx-kv-dump: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
        fclose(f);
        *len_p = (size_t)len;
        return buf;
    }
    fprintf(stderr, "flx-kv-dump: %s: read failed\n", path);
    free(buf);
    fclose(f);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *text_path = NULL, *out_path = NULL;
    uint64_t P = 0, S = UINT64_MAX, off = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "flx-kv-dump: %s needs a value\n", a);
            usage();
            return 2;
        }
        const char *v = argv[++i];
        flx_status_t st = FLX_OK;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--text")) text_path = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--prompt-len")) st = flx_parse_u64(v, 1, 1u << 24, &P);
        else if (!strcmp(a, "--steps")) st = flx_parse_u64(v, 0, 1u << 20, &S);
        else if (!strcmp(a, "--offset")) st = flx_parse_u64(v, 0, 1u << 30, &off);
        else {
            fprintf(stderr, "flx-kv-dump: unknown option %s\n", a);
            usage();
            return 2;
        }
        if (st != FLX_OK) {
            fprintf(stderr, "flx-kv-dump: %s '%s': %s\n", a, v, flx_error_msg());
            return 2;
        }
    }
    if (!model_path || !text_path || !out_path || !P || S == UINT64_MAX) {
        fprintf(stderr, "flx-kv-dump: --model, --text, --prompt-len, --steps and --out are required\n");
        usage();
        return 2;
    }
    const uint32_t n = (uint32_t)(P + S);
    size_t tlen;
    char *text = read_file(text_path, &tlen);
    if (!text) return 2;
    int rc = 2;
    flx_model_t *m = NULL;
    flx_tok_h tok = NULL;
    int32_t *ids = NULL;
    void *wsmem = NULL;
    float *q_all = NULL, *q = NULL;
    flx_kvdump_writer_h w = NULL;
    flx_pool_params_t pp = {0};   /* FLX_THREADS, else the CPU budget */
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
    const flx_model_config_t *c = &m->cfg;
    rc = 1;
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
    rc = 1;
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
