/*
 * flx-gen-ckpt - write a seeded random Llama/Qwen2 model as a Hugging Face checkpoint
 * (config.json + model.safetensors, or K shards + model.safetensors.index.json) or as one GGUF file
 * with a byte-level tokenizer (--format gguf), for tests, fuzz seeds and benchmarks of shapes the
 * real model does not cover. The weights are flx_model_init_random()'s, so
 * a test can regenerate them from the seed and compare what a loader reads back.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/cli.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/util.h"

int main(int argc, char **argv)
{
    static const char *const families[] = {"llama", "qwen2", NULL}, *const dtypes[] = {"bf16", "f16", "f32", NULL},
                             *const formats[] = {"hf", "gguf", NULL};
    static const flx_dtype_t dts[] = {FLX_DT_BF16, FLX_DT_F16, FLX_DT_F32};
    const char *out = NULL;
    int family = 0, dtype_i = 0, format = 0, tied = 0;
    uint64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, shards = 1, seed = 1,
             max_ctx = 4096;
    double theta = 10000.0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_ENUM(0, "family", &family, families, FLX_CLI_REQUIRED, "architecture (qwen2 has QKV biases)"),
        FLX_CLI_UINT(0, "layers", "N", &layers, 1, FLX_MODEL_MAX_LAYERS, FLX_CLI_REQUIRED, "decoder layers"),
        FLX_CLI_UINT(0, "hidden", "H", &hidden, 16, 1u << 16, FLX_CLI_REQUIRED, "model width"),
        FLX_CLI_UINT(0, "heads", "A", &heads, 1, 1024, FLX_CLI_REQUIRED, "query heads"),
        FLX_CLI_UINT(0, "kv-heads", "B", &kv_heads, 1, 1024, 0, "key/value heads (default: --heads)"),
        FLX_CLI_UINT(0, "head-dim", "D", &head_dim, 16, FLX_MODEL_MAX_HEAD_DIM, 0, "head size (default hidden/heads)"),
        FLX_CLI_UINT(0, "ffn", "F", &ffn, 16, 1u << 18, FLX_CLI_REQUIRED, "SwiGLU intermediate size"),
        FLX_CLI_UINT(0, "vocab", "V", &vocab, 1, 1u << 22, FLX_CLI_REQUIRED, "vocabulary (gguf: at least 257)"),
        FLX_CLI_FLAG(0, "tied", &tied, "the LM head is the embedding matrix"),
        FLX_CLI_ENUM(0, "format", &format, formats, 0,
                     "hf: OUT is a Hugging Face folder (created if missing; the default);\n"
                     "gguf: OUT is a .gguf file with a byte-level tokenizer (one token per byte)"),
        FLX_CLI_UINT(0, "shards", "K", &shards, 1, 999, 0, "hf: safetensors shards (default 1)"),
        FLX_CLI_ENUM(0, "dtype", &dtype_i, dtypes, 0, "weight type (default bf16)"),
        FLX_CLI_UINT('s', "seed", "S", &seed, 0, UINT64_MAX, 0, "weights seed (default 1)"),
        FLX_CLI_UINT(0, "max-ctx", "C", &max_ctx, 1, 1u << 24, 0, "context length in tokens (default 4096)"),
        FLX_CLI_FLOAT(0, "rope-theta", "T", &theta, 1.0, 1e12, FLX_CLI_LO_OPEN | FLX_CLI_HI_OPEN,
                      "RoPE base (default 10000)"),
    };
    flx_cli_pos_t pos[] = {FLX_CLI_ARG("OUT", &out, "the checkpoint folder (hf) or file (gguf)")};
    flx_cli_t cli =
        FLX_CLI_INIT_POS("flx-gen-ckpt", "Writes a seeded random Llama or Qwen2 model for tests.", opts, pos);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_applies(&cli, format == 0, "with --format gguf (one file)", "shards", NULL))
        return flx_cli_usage_error(&cli, NULL);
    flx_model_config_t cfg = {.rms_eps = 1e-5f, .rope_theta = (float)theta, .max_ctx = (uint32_t)max_ctx};
    cfg.arch = family ? FLX_ARCH_QWEN2 : FLX_ARCH_LLAMA;
    cfg.qkv_bias = family == 1;
    cfg.n_layers = (uint32_t)layers, cfg.hidden = (uint32_t)hidden, cfg.n_heads = (uint32_t)heads;
    cfg.n_kv_heads = (uint32_t)(kv_heads ? kv_heads : heads), cfg.ffn = (uint32_t)ffn, cfg.vocab = (uint32_t)vocab;
    cfg.tied_embeddings = tied;
    if (head_dim) {
        cfg.head_dim = (uint32_t)head_dim;
    } else if (hidden % heads) {
        return flx_cli_usage_error(&cli, "--hidden %u is not a multiple of --heads %u; give --head-dim", cfg.hidden,
                                   cfg.n_heads);
    } else {
        cfg.head_dim = cfg.hidden / cfg.n_heads;
    }
    if (format == 1 && vocab < 257)
        return flx_cli_usage_error(&cli, "--vocab %u: --format gguf writes a byte-level vocabulary of 257 tokens",
                                   cfg.vocab);
    snprintf(cfg.name, sizeof cfg.name, "flx-random-%s-%ux%u-seed%llu", families[family], cfg.n_layers, cfg.hidden,
             (unsigned long long)seed);
    if (flx_model_config_check(&cfg) != FLX_OK) return flx_cli_usage_error(&cli, NULL);
    const flx_dtype_t dtype = dts[dtype_i];
    if (format == 0 && mkdir(out, 0755) != 0 && errno != EEXIST)
        return flx_cli_fail(&cli, "cannot create %s: %s", out, strerror(errno));
    flx_model_t *m = NULL;
    if (flx_model_init_random(&cfg, seed, &m) != FLX_OK ||
        (format == 0 ? flx_model_save_hf(m, out, dtype, (uint32_t)shards) : flx_model_save_gguf(m, out, dtype))) {
        flx_model_destroy(m);
        return flx_cli_fail(&cli, "%s", flx_error_msg());
    }
    printf("%s: %s, %u layers, hidden %u, heads %u/%u of %u, ffn %u, vocab %u, context %u, %s%s, %s\n", out, cfg.name,
           cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab, cfg.max_ctx,
           flx_dtype_name(dtype), cfg.tied_embeddings ? ", tied" : "", format ? "gguf" : "hf");
    flx_model_destroy(m);
    return 0;
}
