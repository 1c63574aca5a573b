/*
 * fuzz_token_ids - bytes through flx_tok_ids_parse, the parser of the token id files flx-model-dump
 * and bench/model's model_bench read (flx_tok_ids_read reads the file and calls it).
 *
 * Properties checked (a broken one aborts, which libFuzzer reports): an accepted input gives at
 * most one id per two bytes of text or exactly one per four raw bytes, and the text form gives back
 * the integers written in it (re-printed, parsed again: the same ids); a refused one writes nothing
 * and names the input.
 */
#include "fuzz_util.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/tokenizer.h"

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = (int32_t *)(uintptr_t)1;
    size_t n = 77;
    if (flx_tok_ids_parse("input", data, size, &ids, &n) != FLX_OK) {
        FUZZ_CHECK(ids == (int32_t *)(uintptr_t)1 && n == 77 && strstr(flx_error_msg(), "input"));
        return 0;
    }
    int text = 1;
    for (size_t i = 0; i < size && text; i++)
        text = (data[i] >= '0' && data[i] <= '9') || data[i] == '-' || data[i] == ' ' ||
               (data[i] >= '\t' && data[i] <= '\r');
    if (!text) {
        FUZZ_CHECK(n * 4 == size && !memcmp(ids, data, size));
    } else {
        FUZZ_CHECK(n <= size / 2 + 1);
        char *again = malloc(n * 12 + 1);
        FUZZ_CHECK(again);
        size_t len = 0;
        for (size_t i = 0; i < n; i++) len += (size_t)sprintf(again + len, "%" PRId32 "\n", ids[i]);
        int32_t *ids2 = NULL;
        size_t n2 = 0;
        FUZZ_CHECK(flx_tok_ids_parse("again", again, len, &ids2, &n2) == FLX_OK);
        FUZZ_CHECK(n2 == n && (n == 0 || !memcmp(ids, ids2, n * sizeof *ids)));
        free(ids2);
        free(again);
    }
    free(ids);
    return 0;
}
