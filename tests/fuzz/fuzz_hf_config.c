/*
 * fuzz_hf_config - config.json of a Hugging Face checkpoint through flx_model_load_hf (what
 * flx_model_load runs for a folder): the folder holds the tiny checkpoint of fuzz_seeds.h (a Qwen2
 * shard with an untied lm_head; its tensors also serve a Llama config of the same shape), written
 * once by the product's own writer, and the input becomes its config.json, so a seed config loads
 * the whole model and a mutated one goes as far as it stays consistent.
 */
#include "fuzz_util.h"

#include "flx/model.h"
#include "flx/model_load.h"
#include "fuzz_seeds.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    FUZZ_CHECK(fuzz_tiny_checkpoint(fuzz_dir(), 1) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write_file(fuzz_dir(), "config.json", data, size);
    flx_model_t *m = NULL;
    if (flx_model_load_hf(fuzz_dir(), &m) == FLX_OK) {
        FUZZ_CHECK(flx_model_config_check(&m->cfg) == FLX_OK);
        fuzz_touch(m->lm_head.p, (size_t)m->cfg.vocab * m->cfg.hidden * 2);
        flx_model_destroy(m);
    }
    return 0;
}
