/*
 * fuzz_safetensors - a safetensors file through flx_st_open, the reader behind every safetensors
 * input of the product (Hugging Face shards, predictor weights, datasets, KV dumps, fluxion-attn's
 * input): every tensor's bytes are read, every lookup by name must find the same tensor, and
 * flx_st_expect runs on each.
 */
#include "fuzz_util.h"

#include "flx/safetensors.h"

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_st_reader_h r = NULL;
    if (flx_st_open(fuzz_path(data, size), &r) != FLX_OK) return 0;
    for (size_t i = 0; i < flx_st_count(r); i++) {
        const flx_st_tensor_t *t = flx_st_at(r, i), *u;
        FUZZ_CHECK(flx_st_find(r, t->name) == t);
        FUZZ_CHECK(t->n_dims >= 0 && t->n_dims <= FLX_ST_MAX_DIMS);
        size_t numel = 1;
        for (int d = 0; d < t->n_dims; d++) numel *= (size_t)t->shape[d];
        FUZZ_CHECK(numel * flx_dtype_size(t->dtype) == t->nbytes);
        FUZZ_CHECK(flx_st_expect(r, t->name, t->dtype, t->n_dims, t->shape, &u) == FLX_OK && u == t);
        fuzz_touch(t->data, t->nbytes);
    }
    FUZZ_CHECK(flx_st_at(r, flx_st_count(r)) == NULL);
    static const char *const keys[] = {"format", "mode", "blk", "budget", "n_layers", "__metadata__", ""};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *v = flx_st_metadata(r, keys[i]);
        if (v) fuzz_touch(v, strlen(v) + 1);
    }
    flx_st_close(r);
    return 0;
}
