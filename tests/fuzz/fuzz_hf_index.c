/*
 * fuzz_hf_index - model.safetensors.index.json of a sharded Hugging Face checkpoint through
 * flx_model_load_hf: the folder holds the tiny checkpoint of fuzz_seeds.h in three shards and its
 * config.json, written once by the product's own writer; the input becomes the index (which names
 * the shard of every tensor, so it decides which files the loader opens).
 */
#include "fuzz_util.h"

#include "flx/model.h"
#include "flx/model_load.h"
#include "fuzz_seeds.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    FUZZ_CHECK(fuzz_tiny_checkpoint(fuzz_dir(), 3) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(fuzz_dir(), "model.safetensors.index.json", data, size);
    flx_model_t *m = NULL;
    if (flx_model_load_hf(fuzz_dir(), &m) == FLX_OK) {
        fuzz_touch(m->layers[0].w_down.p, (size_t)m->cfg.hidden * m->cfg.ffn * 2);
        flx_model_destroy(m);
    }
    return 0;
}
