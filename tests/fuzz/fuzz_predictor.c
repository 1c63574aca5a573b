/*
 * fuzz_predictor - a predictor weights file through flx_predictor_load (flx_mlp_load + prepare),
 * what flx-generate --mode fluxion and the engine load; loaded weights run on one row of features.
 */
#include "fuzz_util.h"

#include "flx/predictor.h"

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_predictor_h p = NULL;
    if (flx_predictor_load(fuzz_path(data, size), &p) != FLX_OK) return 0;
    float feat[FLX_PRED_IN];
    for (int i = 0; i < FLX_PRED_IN; i++) feat[i] = (float)i / FLX_PRED_IN;
    size_t bytes = flx_predictor_scratch_bytes(1);
    void *scratch = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    FUZZ_CHECK(scratch != NULL);
    flx_head_pred_t out;
    FUZZ_CHECK(flx_predictor_run(p, feat, 1, &out, scratch, bytes, NULL) == FLX_OK);
    free(scratch);
    flx_select_params_t sp = flx_predictor_select_params(p);
    FUZZ_CHECK(flx_select_params_check(&sp) == FLX_OK);
    flx_predictor_destroy(p);
    return 0;
}
