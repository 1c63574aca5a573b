/*
 * flx/model_load.h - build a flx_model_t (flx/model.h) from a checkpoint on disk, and write one.
 *
 * OVERVIEW
 *   flx_model_load       dispatch: a directory is a Hugging Face checkpoint, a file a GGUF file
 *   flx_model_load_gguf  llama.cpp GGUF, architectures "llama" (Llama 2/3.x, SmolLM2) and "qwen2".
 *                        Matrices are dequantized to bf16 at load (F32, F16, BF16, Q8_0, Q4_0,
 *                        Q4_1); norm gains and biases become fp32. Llama wq/wk rows are
 *                        un-permuted from llama.cpp's interleaved RoPE layout to the Hugging Face
 *                        layout (see ROPE LAYOUT in flx/model.h); qwen2 files are not permuted.
 *                        The file is unmapped before returning.
 *   flx_model_load_hf    Hugging Face directory: config.json (model_type llama | qwen2) and
 *                        model.safetensors, or shards listed by model.safetensors.index.json.
 *                        BF16 matrices point straight into the read-only file mappings, which the
 *                        model keeps open until flx_model_destroy; F16/F32 ones are converted.
 *   flx_model_save_hf    the inverse of load_hf for generated test checkpoints (flx-gen-ckpt).
 *
 * Every refusal names the file and the field or tensor at fault: FLX_ERR_NOT_FOUND for a missing
 * file, config field or tensor; FLX_ERR_FORMAT for a malformed file, a wrong shape or dtype;
 * FLX_ERR_UNSUPPORTED for a well-formed file this runtime does not handle (architecture, ggml type,
 * rope scaling kind). *model_p is written only on success; destroy it with flx_model_destroy.
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

/*
 * Writes model as a Hugging Face checkpoint into the existing directory dir: config.json and, for
 * n_shards == 1, model.safetensors, else model-0000i-of-0000n.safetensors plus
 * model.safetensors.index.json. Every tensor is stored as dtype (FLX_DT_BF16, FLX_DT_F16 or
 * FLX_DT_F32), norms and biases included, as transformers does; tied models omit lm_head.weight.
 * Files are written atomically (temporary + rename).
 */
flx_status_t flx_model_save_hf(const flx_model_t *model, const char *dir, flx_dtype_t dtype, uint32_t n_shards);

#ifdef __cplusplus
}
#endif
#endif
