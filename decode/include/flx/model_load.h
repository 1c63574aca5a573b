/*
 * flx/model_load.h - build a flx_model_t (flx/model.h) from a checkpoint on disk, and write one.
 *
 * OVERVIEW
 *   flx_model_load       dispatch: a directory is a Hugging Face checkpoint, a file a GGUF file
 *   flx_model_load_gguf  llama.cpp GGUF, architectures "llama" (Llama 2/3.x, SmolLM2) and "qwen2".
 *                        F32, F16 and BF16 matrices become bf16; Q4_0 / Q4_1 and Q8_0 ones are
 *                        kept as FLX_WFMT_Q4 and FLX_WFMT_Q8 (flx/model.h: the same bf16 values
 *                        the dequantization to bf16 gives, in fewer bytes); norm gains and biases
 *                        become fp32. Llama wq/wk rows are
 *                        un-permuted from llama.cpp's interleaved RoPE layout to the Hugging Face
 *                        layout (see ROPE LAYOUT in flx/model.h); qwen2 files are not permuted.
 *                        The file is unmapped before returning.
 *   flx_model_load_hf    Hugging Face directory: config.json (model_type llama | qwen2) and
 *                        model.safetensors, or shards listed by model.safetensors.index.json.
 *                        BF16 matrices point straight into the read-only file mappings, which the
 *                        model keeps open until flx_model_destroy; F16/F32 ones are converted.
 *   flx_model_save_hf    the inverse of load_hf for generated test checkpoints (flx-gen-ckpt).
 *   flx_model_save_gguf  the inverse of load_gguf for generated test models, with a byte-level
 *                        vocabulary, so the file is a whole model for flx-generate.
 *
 * Every refusal names the file and the field or tensor at fault: FLX_ERR_NOT_FOUND for a missing
 * file, config field or tensor; FLX_ERR_FORMAT for a malformed file, a wrong shape or dtype;
 * FLX_ERR_UNSUPPORTED for a well-formed file this runtime does not handle (architecture, ggml type,
 * rope scaling kind). *model_p is written only on success; destroy it with flx_model_destroy.
 *
 * MEMORY. A loader allocates what the model's declared shape needs, and only after the tensors of
 * that shape were found in the file: weights are never allocated for a tensor the file does not
 * hold, so the heap a load takes is bounded by the files it reads. GGUF: the handle's tables (at
 * most 16 x the file's metadata bytes + 64 KiB, flx/gguf.h) and the converted weights, at most 3.6
 * x the bytes of the tensors they come from (Q4_0 to bf16: 18 bytes per 32 values become 64). Hugging
 * Face: config.json (at most 1 MiB) and the index (at most 16 MiB) parsed by cJSON (up to ~40 x
 * their size while loading), each shard's header (flx/safetensors.h: at most 64 x the header + 1
 * MiB), and converted F16/F32 matrices and norm vectors (at most 2 x their bytes in the shard;
 * aligned BF16 matrices stay in the mapping). Context lengths above FLX_MODEL_MAX_CTX are refused.
 *
 * The loaders report each layer loaded to the calling thread's progress observer (flx/progress.h,
 * stage "loading model").
 *
 * The _pool forms dequantize / convert on the workers of a pool (flx/pool.h); the plain forms run
 * on the caller. The model is the same either way.
 *
 * Thread mode: loaders share nothing; several may run at once (on distinct pools, or the same pool
 * taking turns).
 */
#ifndef FLX_MODEL_LOAD_H
#define FLX_MODEL_LOAD_H

#include <stdint.h>

#include "flx/model.h"
#include "flx/pool.h"
#include "flx/safetensors.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

flx_status_t flx_model_load(const char *path, flx_model_t **model_p);
flx_status_t flx_model_load_gguf(const char *path, flx_model_t **model_p);
flx_status_t flx_model_load_hf(const char *dir, flx_model_t **model_p);
flx_status_t flx_model_load_pool(const char *path, flx_pool_h pool, flx_model_t **model_p);
flx_status_t flx_model_load_gguf_pool(const char *path, flx_pool_h pool, flx_model_t **model_p);
flx_status_t flx_model_load_hf_pool(const char *dir, flx_pool_h pool, flx_model_t **model_p);
/* How a GGUF file's quantized matrices (Q4_0, Q4_1, Q8_0) are held; other matrices are bf16 either
 * way, and so are a Hugging Face checkpoint's. The values are the same (flx/model.h WEIGHT FORMATS).
 *   FLX_WEIGHTS_COMPACT  their blocks, FLX_WFMT_Q4 / Q8: 0.75 and 1.125 bytes a value (default)
 *   FLX_WEIGHTS_BF16     dequantized to bf16: 2 bytes a value; the GEMV's cheaper expansion can
 *                        win where arithmetic, not memory, bounds the dense part (few cores, large
 *                        batches: docs/workers.md) */
typedef enum {
    FLX_WEIGHTS_COMPACT = 0,
    FLX_WEIGHTS_BF16 = 1,
} flx_weights_t;

/* "compact" | "bf16" -> *w; FLX_ERR_INVALID naming the value otherwise. */
flx_status_t flx_weights_parse(const char *s, flx_weights_t *w);
const char *flx_weights_name(flx_weights_t w);

/* flx_model_load_pool / flx_model_load_gguf_pool with the weights held as w. */
flx_status_t flx_model_load_as(const char *path, flx_pool_h pool, flx_weights_t w, flx_model_t **model_p);
flx_status_t flx_model_load_gguf_as(const char *path, flx_pool_h pool, flx_weights_t w, flx_model_t **model_p);

/*
 * Writes model as a Hugging Face checkpoint into the existing directory dir: config.json and, for
 * n_shards == 1, model.safetensors, else model-0000i-of-0000n.safetensors plus
 * model.safetensors.index.json. Every tensor is stored as dtype (FLX_DT_BF16, FLX_DT_F16 or
 * FLX_DT_F32), norms and biases included, as transformers does; tied models omit lm_head.weight.
 * Files are written atomically (temporary + rename).
 */
flx_status_t flx_model_save_hf(const flx_model_t *model, const char *dir, flx_dtype_t dtype, uint32_t n_shards);

/*
 * Writes model as one GGUF file at path (version 3, alignment 32; atomically): metadata keys of its
 * architecture ("llama" or "qwen2", context_length = max_ctx), matrices as dtype (FLX_DT_BF16,
 * FLX_DT_F16 or FLX_DT_F32; Llama wq/wk rows permuted as llama.cpp's converter does), norms and
 * biases as F32, and a tokenizer of the model's vocabulary: GPT-2 byte-level BPE with the 256 byte
 * tokens, no merges, <|endoftext|> (id 256, control) as end of sequence and control tokens
 * <|pad_N|> for the other ids, so text encodes to one token per byte. Needs vocab >= 257; llama3
 * rope scaling is refused (FLX_ERR_UNSUPPORTED).
 */
flx_status_t flx_model_save_gguf(const flx_model_t *model, const char *path, flx_dtype_t dtype);

#ifdef __cplusplus
}
#endif
#endif
