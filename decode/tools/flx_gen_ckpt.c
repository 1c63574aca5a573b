/*
 * flx-gen-ckpt - write a seeded random Llama/Qwen2 model as a Hugging Face checkpoint
 * (config.json + model.safetensors, or K shards + model.safetensors.index.json), for tests and
 * benchmarks of shapes the real model does not cover. The weights are flx_model_init_random()'s, so
 * a test can regenerate them from the seed and compare what a loader reads back.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/util.h"
#include "flx/model.h"
#include "flx/model_load.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: flx-gen-ckpt --family llama|qwen2 --layers N --hidden H --heads A [--kv-heads B]\n"
            "                    [--head-dim D] --ffn F --vocab V [--tied] [--shards K]\n"
            "                    [--dtype bf16|f16|f32] [--seed S] [--max-ctx C] [--rope-theta T] OUT_DIR\n"
            "  --kv-heads defaults to --heads, --head-dim to hidden/heads, --shards to 1, --dtype to bf16,\n"
            "  --seed to 1, --max-ctx to 4096, --rope-theta to 10000. OUT_DIR is created if missing.\n");
}

static int parse_u64(const char *flag, const char *s, unsigned long long lo, unsigned long long hi,
                     unsigned long long *out)
{
    uint64_t v;
    if (flx_parse_u64(s, lo, hi, &v) != FLX_OK) {
        fprintf(stderr, "flx-gen-ckpt: --%s '%s' is not an integer in %llu..%llu\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    enum { O_FAMILY = 1, O_LAYERS, O_HIDDEN, O_HEADS, O_KV, O_HD, O_FFN, O_VOCAB, O_TIED, O_SHARDS, O_DTYPE,
           O_SEED, O_CTX, O_THETA, O_HELP };
    static const struct option opts[] = {
        {"family", required_argument, 0, O_FAMILY}, {"layers", required_argument, 0, O_LAYERS},
        {"hidden", required_argument, 0, O_HIDDEN}, {"heads", required_argument, 0, O_HEADS},
        {"kv-heads", required_argument, 0, O_KV},   {"head-dim", required_argument, 0, O_HD},
        {"ffn", required_argument, 0, O_FFN},       {"vocab", required_argument, 0, O_VOCAB},
        {"tied", no_argument, 0, O_TIED},           {"shards", required_argument, 0, O_SHARDS},
        {"dtype", required_argument, 0, O_DTYPE},   {"seed", required_argument, 0, O_SEED},
        {"max-ctx", required_argument, 0, O_CTX},   {"rope-theta", required_argument, 0, O_THETA},
        {"help", no_argument, 0, O_HELP},           {0, 0, 0, 0},
    };
    flx_model_config_t cfg = {.rms_eps = 1e-5f, .rope_theta = 10000.0f, .max_ctx = 4096};
    unsigned long long v, seed = 1, shards = 1;
    int have_family = 0, have_layers = 0, have_hidden = 0, have_heads = 0, have_ffn = 0, have_vocab = 0;
    flx_dtype_t dtype = FLX_DT_BF16;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_FAMILY:
            if (!strcmp(a, "llama")) cfg.arch = FLX_ARCH_LLAMA, cfg.qkv_bias = 0;
            else if (!strcmp(a, "qwen2")) cfg.arch = FLX_ARCH_QWEN2, cfg.qkv_bias = 1;
            else {
                fprintf(stderr, "flx-gen-ckpt: --family '%s' is not llama or qwen2\n", a);
                return 2;
            }
            have_family = 1;
            break;
        case O_LAYERS: if (parse_u64("layers", a, 1, FLX_MODEL_MAX_LAYERS, &v)) return 2; cfg.n_layers = (uint32_t)v, have_layers = 1; break;
        case O_HIDDEN: if (parse_u64("hidden", a, 16, 1u << 16, &v)) return 2; cfg.hidden = (uint32_t)v, have_hidden = 1; break;
        case O_HEADS: if (parse_u64("heads", a, 1, 1024, &v)) return 2; cfg.n_heads = (uint32_t)v, have_heads = 1; break;
        case O_KV: if (parse_u64("kv-heads", a, 1, 1024, &v)) return 2; cfg.n_kv_heads = (uint32_t)v; break;
        case O_HD: if (parse_u64("head-dim", a, 16, FLX_MODEL_MAX_HEAD_DIM, &v)) return 2; cfg.head_dim = (uint32_t)v; break;
        case O_FFN: if (parse_u64("ffn", a, 16, 1u << 18, &v)) return 2; cfg.ffn = (uint32_t)v, have_ffn = 1; break;
        case O_VOCAB: if (parse_u64("vocab", a, 1, 1u << 22, &v)) return 2; cfg.vocab = (uint32_t)v, have_vocab = 1; break;
        case O_TIED: cfg.tied_embeddings = 1; break;
        case O_SHARDS: if (parse_u64("shards", a, 1, 999, &shards)) return 2; break;
        case O_SEED: if (parse_u64("seed", a, 0, UINT64_MAX, &seed)) return 2; break;
        case O_CTX: if (parse_u64("max-ctx", a, 1, 1u << 24, &v)) return 2; cfg.max_ctx = (uint32_t)v; break;
        case O_THETA: {
            char *end;
            double t = strtod(a, &end);
            if (!*a || *end || !(t > 1 && t < 1e12)) {
                fprintf(stderr, "flx-gen-ckpt: --rope-theta '%s' is not a number in (1, 1e12)\n", a);
                return 2;
            }
            cfg.rope_theta = (float)t;
            break;
        }
        case O_DTYPE:
            if (!strcmp(a, "bf16")) dtype = FLX_DT_BF16;
            else if (!strcmp(a, "f16")) dtype = FLX_DT_F16;
            else if (!strcmp(a, "f32")) dtype = FLX_DT_F32;
            else {
                fprintf(stderr, "flx-gen-ckpt: --dtype '%s' is not bf16, f16 or f32\n", a);
                return 2;
            }
            break;
        case O_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "flx-gen-ckpt: unknown option or missing value: %s\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    const char *missing = !have_family ? "--family" : !have_layers ? "--layers" : !have_hidden ? "--hidden"
                        : !have_heads ? "--heads" : !have_ffn ? "--ffn" : !have_vocab ? "--vocab" : NULL;
    if (missing) {
        fprintf(stderr, "flx-gen-ckpt: %s is required\n", missing);
        usage(stderr);
        return 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "flx-gen-ckpt: expected exactly one OUT_DIR, got %d arguments\n", argc - optind);
        usage(stderr);
        return 2;
    }
    const char *out = argv[optind];
    if (!cfg.n_kv_heads) cfg.n_kv_heads = cfg.n_heads;
    if (!cfg.head_dim) {
        if (cfg.hidden % cfg.n_heads) {
            fprintf(stderr, "flx-gen-ckpt: --hidden %u is not a multiple of --heads %u; give --head-dim\n", cfg.hidden,
                    cfg.n_heads);
            return 2;
        }
        cfg.head_dim = cfg.hidden / cfg.n_heads;
    }
    snprintf(cfg.name, sizeof cfg.name, "flx-random-%s-%ux%u-seed%llu", cfg.arch == FLX_ARCH_LLAMA ? "llama" : "qwen2",
             cfg.n_layers, cfg.hidden, seed);
    if (flx_model_config_check(&cfg) != FLX_OK) {
        fprintf(stderr, "flx-gen-ckpt: %s\n", flx_error_msg());
        return 2;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "flx-gen-ckpt: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    flx_model_t *m = NULL;
    if (flx_model_init_random(&cfg, seed, &m) != FLX_OK ||
        flx_model_save_hf(m, out, dtype, (uint32_t)shards) != FLX_OK) {
        fprintf(stderr, "flx-gen-ckpt: %s\n", flx_error_msg());
        flx_model_destroy(m);
        return 1;
    }
    printf("%s: %s, %u layers, hidden %u, heads %u/%u of %u, ffn %u, vocab %u, %s%s, %llu shard(s)\n", out, cfg.name,
           cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab,
           flx_dtype_name(dtype), cfg.tied_embeddings ? ", tied" : "", shards);
    flx_model_destroy(m);
    return 0;
}
