/*
 * fuzz_seeds.h - the small model and vocabulary that the seed generator (gen_corpus.c) writes and
 * the fuzz targets rebuild, so a seed and the files a target keeps beside it agree.
 *
 *   fuzz_tiny_cfg   a one-layer model of hidden 32 (2 query heads, 1 KV head of 16, ffn 32, vocab
 *                   64): the Hugging Face targets keep its checkpoint (a Qwen2 one with untied
 *                   lm_head, whose tensors serve a Llama config of the same shape too) and fuzz
 *                   config.json or the shard index over it
 *   fuzz_vocab      a byte-level BPE vocabulary: the 256 byte tokens, merged tokens built by a
 *                   fixed merge list, and four added tokens (three special)
 */
#ifndef FLX_FUZZ_SEEDS_H
#define FLX_FUZZ_SEEDS_H

#include <stdio.h>
#include <string.h>

#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "tok_bytes.h"

static inline flx_model_config_t fuzz_tiny_cfg(flx_arch_t arch, int tied)
{
    flx_model_config_t c = {.arch = arch, .n_layers = 1, .hidden = 32, .n_heads = 2, .n_kv_heads = 1,
                            .head_dim = 16, .ffn = 32, .vocab = 64, .max_ctx = 256, .rms_eps = 1e-5f,
                            .rope_theta = 10000.0f, .tied_embeddings = tied, .qkv_bias = arch == FLX_ARCH_QWEN2};
    snprintf(c.name, sizeof c.name, "fuzz-tiny-%s", arch == FLX_ARCH_QWEN2 ? "qwen2" : "llama");
    return c;
}

/* Writes the Hugging Face targets' checkpoint (Qwen2, untied, seed 1) into dir in n_shards shards;
 * 0 on success. */
static inline int fuzz_tiny_checkpoint(const char *dir, uint32_t n_shards)
{
    flx_model_config_t c = fuzz_tiny_cfg(FLX_ARCH_QWEN2, 0);
    flx_model_t *m = NULL;
    if (flx_model_init_random(&c, 1, &m) != FLX_OK) return -1;
    flx_status_t st = flx_model_save_hf(m, dir, FLX_DT_BF16, n_shards);
    flx_model_destroy(m);
    return st == FLX_OK ? 0 : -1;
}

/* Merges in rank order; each part is a byte token or an earlier merge's result. */
static const char *const fuzz_merges[] = {
    "Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "o n", "r e", "Ġ a", "t h", "th e", "i s", "Ġ i", "Ġi s",
    "Ġ w", "h a", "Ġw ha", "a t", "Ġwha t", "1 2", "Ġ 1", "e s", "o r", "Ġ o", "Ġo n", "in g", "Ġ Ġ",
    "ĠĠ ĠĠ", "Ã ©", "c a", "ca f", "caf Ã©", "Ċ Ċ", "' s", "l l", "' ll", "Ġ 2", "+ 2", "Ġ2 +2",
};
#define FUZZ_N_MERGES (sizeof fuzz_merges / sizeof fuzz_merges[0])
#define FUZZ_N_ADDED 4
#define FUZZ_N_TOKENS (256 + FUZZ_N_MERGES + FUZZ_N_ADDED)

static const char fuzz_chatml[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

typedef struct {
    char bytes[256][4];
    char merged[FUZZ_N_MERGES][32];
    const char *tokens[FUZZ_N_TOKENS]; /* id = index */
    uint8_t attrs[FUZZ_N_TOKENS];
} fuzz_vocab_t;

/* Fills v; ids 0..255 are the bytes, then one per merge, then the added tokens. */
static inline void fuzz_vocab(fuzz_vocab_t *v)
{
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        byte_char(b, v->bytes[b]);
        v->tokens[b] = v->bytes[b];
    }
    for (size_t i = 0; i < FUZZ_N_MERGES; i++) {
        const char *m = fuzz_merges[i], *sp = strchr(m, ' ');
        snprintf(v->merged[i], sizeof v->merged[i], "%.*s%s", (int)(sp - m), m, sp + 1);
        v->tokens[256 + i] = v->merged[i];
    }
    static const char *const added[FUZZ_N_ADDED] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<extra>"};
    for (int i = 0; i < FUZZ_N_ADDED; i++) {
        size_t id = 256 + FUZZ_N_MERGES + (size_t)i;
        v->tokens[id] = added[i];
        v->attrs[id] = FLX_TOK_ATTR_ADDED | (i < 3 ? FLX_TOK_ATTR_SPECIAL : 0);
    }
}

/* The ids of the added tokens. */
#define FUZZ_ID_IM_START ((int32_t)(256 + FUZZ_N_MERGES))
#define FUZZ_ID_IM_END (FUZZ_ID_IM_START + 1)

/* The parts of a tokenizer of v with the given pre-tokenizer (Llama-3's ignores merges of whole
 * pieces, Qwen2's normalizes to NFC, as their real files do). */
static inline flx_tok_vocab_t fuzz_tok_parts(const fuzz_vocab_t *v, flx_tok_pre_t pre)
{
    flx_tok_vocab_t p = {.n_tokens = FUZZ_N_TOKENS, .tokens = v->tokens, .attrs = v->attrs,
                         .n_merges = FUZZ_N_MERGES, .merges = fuzz_merges, .pre = pre,
                         .ignore_merges = pre == FLX_TOK_PRE_LLAMA3, .nfc = pre == FLX_TOK_PRE_QWEN2,
                         .bos_id = FUZZ_ID_IM_START, .eos_id = FUZZ_ID_IM_END, .add_bos = 0,
                         .chat_template = fuzz_chatml};
    return p;
}

#endif
