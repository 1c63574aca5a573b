/*
 * fuzz_kvdump - a KV dump file through flx_kvsrc_open_dump (what fluxion-label, the quality
 * benchmark and flx-synth-calibrate open), then every layer read into arrays sized by the shape the
 * reader reports, as those tools do.
 */
#include "fuzz_util.h"

#include "flx/kvsource.h"

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_kvsrc_h src = NULL;
    if (flx_kvsrc_open_dump(fuzz_path(data, size), &src) != FLX_OK) return 0;
    flx_kvsrc_shape_t s;
    flx_kvsrc_shape(src, &s);
    const size_t T = (size_t)s.prompt_len + s.n_steps, D = s.head_dim;
    const size_t kv_n = (size_t)s.n_kv_heads * T * D, q_n = (size_t)s.n_q_heads * (s.n_steps + 1) * D;
    FUZZ_CHECK(kv_n * 4 + q_n * 4 <= size); /* the shape was checked against tensors the file holds */
    flx_bf16_t *k = malloc(kv_n * 2 + 1), *v = malloc(kv_n * 2 + 1);
    float *q = malloc(q_n * 4 + 1);
    FUZZ_CHECK(k && v && q);
    for (uint32_t l = 0; l < s.n_layers; l++) FUZZ_CHECK(flx_kvsrc_layer(src, l, k, v, q, NULL) == FLX_OK);
    FUZZ_CHECK(flx_kvsrc_layer(src, s.n_layers, k, v, q, NULL) == FLX_ERR_INVALID);
    free(k), free(v), free(q);
    flx_kvsrc_close(src);
    return 0;
}
