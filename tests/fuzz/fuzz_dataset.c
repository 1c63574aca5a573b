/*
 * fuzz_dataset - a label dataset file through flx_dataset_load_append (what fluxion-train and
 * fluxion-predict load), twice into one set: the second append exercises the checks against rows
 * already loaded. Every row of a loaded set is read.
 */
#include "fuzz_util.h"

#include "flx/predictor.h"

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_path(data, size);
    flx_dataset_t d = {0};
    if (flx_dataset_load_append(&d, path) == FLX_OK) {
        uint32_t n1 = d.n;
        FUZZ_CHECK(flx_dataset_load_append(&d, path) == FLX_OK && d.n == 2 * n1);
        fuzz_touch(d.features, (size_t)d.n * FLX_PRED_IN * 4);
        fuzz_touch(d.labels, (size_t)d.n * 3 * 4);
        fuzz_touch(d.bgt, (size_t)d.n * 5 * 4);
        fuzz_touch(d.where, (size_t)d.n * 3 * 4);
        for (size_t i = 0; i < (size_t)d.n * 3; i++) FUZZ_CHECK(d.where[i] <= INT32_MAX);
    }
    flx_dataset_free(&d);
    return 0;
}
