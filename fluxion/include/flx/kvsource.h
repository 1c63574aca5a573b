/*
 * flx/kvsource.h - where a layer's KV and queries come from for the offline tools (labels,
 * training data, the quality benchmark, calibration): a KV dump of a real model, or the synthetic
 * workload (flx/synth.h). Both give, per layer, the same arrays:
 *
 *   k, v  bf16 (Hkv, T, D)   T = prompt_len + n_steps: the prompt's K/V then the K/V of the
 *                            n_steps decoded tokens, RoPE applied to K (as attention sees it)
 *   q     f32  (Hq, n_steps + 1, D): row 0 = the anchor q' (the prompt's last query, position
 *                            prompt_len - 1); row 1 + t = the query of decode step t (position
 *                            prompt_len + t), which attends to tokens [0, prompt_len + t]
 *                            (the window holds the generated tokens [prompt_len, prompt_len + t])
 *
 * KV DUMP FILE (safetensors; written by flx-kv-dump, readable and writable from PyTorch)
 *   layers.{l}.k  BF16 (Hkv, T, D)     layers.{l}.v  BF16 (Hkv, T, D)
 *   layers.{l}.q  F32  (Hq, n_steps + 1, D)                              for l in [0, n_layers)
 *   metadata: "format" = "fluxion-kv-dump", "version" = "1", "n_layers", "n_q_heads",
 *             "n_kv_heads", "head_dim", "prompt_len", "n_steps" (decimal strings), optional
 *             "model", "text" (what was dumped). The reader checks every tensor's name, dtype and
 *             shape against the metadata and refuses the file otherwise, naming the tensor.
 * MEMORY. Opening a dump allocates only the safetensors reader's bound (flx/safetensors.h); the
 * shape it reports was checked against tensors the file holds, so arrays a caller sizes by it are
 * bounded by the file (one layer's k, v, q at a time).
 * Teacher-forced: the "decoded" tokens are the text's next tokens, so a dump is one prefill of
 * prompt_len + n_steps tokens.
 */
#ifndef FLX_KVSOURCE_H
#define FLX_KVSOURCE_H

#include <stdint.h>

#include "flx/bf16.h"
#include "flx/pool.h"
#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_kvsrc_shape {
    uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    uint32_t prompt_len, n_steps;
} flx_kvsrc_shape_t;

typedef struct flx_kvsrc *flx_kvsrc_h;

/* Opens a dump file (memory-mapped). */
flx_status_t flx_kvsrc_open_dump(const char *path, flx_kvsrc_h *src_p);
/* Wraps a synthetic workload (flx/synth.h); the source owns it after this call. */
struct flx_synth;
flx_status_t flx_kvsrc_from_synth(struct flx_synth *syn, flx_kvsrc_h *src_p);
void flx_kvsrc_close(flx_kvsrc_h src);

void flx_kvsrc_shape(flx_kvsrc_h src, flx_kvsrc_shape_t *shape_p);
const char *flx_kvsrc_describe(flx_kvsrc_h src);   /* "dump:<path>" or "synth:<profile,seed,...>" */

/* Fills caller arrays with layer l: k, v (Hkv, T, D), q (Hq, n_steps + 1, D); a synthetic source
 * generates on pool's workers (NULL: the caller alone), a dump is read. */
flx_status_t flx_kvsrc_layer(flx_kvsrc_h src, uint32_t layer, flx_bf16_t *k, flx_bf16_t *v, float *q,
                             flx_pool_h pool);

/* Ground truth of synthetic sources (NULL / 0 for dumps): see flx/synth.h. */
struct flx_synth *flx_kvsrc_synth(flx_kvsrc_h src);

/* Dump writer: layers added in any order, each exactly once; save checks all are present. */
typedef struct flx_kvdump_writer *flx_kvdump_writer_h;
flx_status_t flx_kvdump_writer_create(const flx_kvsrc_shape_t *shape, const char *model, const char *text,
                                      flx_kvdump_writer_h *w_p);
/* Copies the arrays (layouts as above). */
flx_status_t flx_kvdump_writer_layer(flx_kvdump_writer_h w, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v,
                                     const float *q);
flx_status_t flx_kvdump_writer_save(flx_kvdump_writer_h w, const char *path);
void flx_kvdump_writer_destroy(flx_kvdump_writer_h w);

#ifdef __cplusplus
}
#endif
#endif
