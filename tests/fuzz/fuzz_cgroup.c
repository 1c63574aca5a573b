/*
 * fuzz_cgroup - the cgroup CPU-quota parser behind the pool's worker count (flx_cg_quota_parse,
 * the function flx_cpu_budget_read calls), on a fuzzed file system image.
 *
 * Input: "<proc/self/cgroup>\0<proc/self/mountinfo>\0" followed by "<path>\0<contents>\0" pairs;
 * every file the parser asks for is looked up among the pairs (absent: not found, as on a host
 * without that file). Seeds: test_cpus --corpus packs the fixture trees of tests/common/cgroup.
 * Any crash, sanitizer report, leak or hang is a finding; refusals (FLX_ERR_FORMAT) are expected.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

typedef struct image {
    const char *part[64];
    size_t len[64];
    int n;
} image_t;

static flx_status_t image_read(void *ctx, const char *path, char **data_p, size_t *len_p)
{
    const image_t *im = ctx;
    for (int i = 2; i + 1 < im->n; i += 2) {
        if (strlen(path) != im->len[i] || memcmp(path, im->part[i], im->len[i])) continue;
        char *d = malloc(im->len[i + 1] + 1);
        if (!d) return FLX_ERR_NOMEM;
        memcpy(d, im->part[i + 1], im->len[i + 1]);
        d[im->len[i + 1]] = '\0';
        *data_p = d;
        *len_p = im->len[i + 1];
        return FLX_OK;
    }
    return FLX_ERR_NOT_FOUND;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    image_t im = {.n = 0};
    size_t i = 0;
    while (i <= size && im.n < 64) {
        const uint8_t *z = memchr(data + i, 0, size - i);
        size_t n = z ? (size_t)(z - (data + i)) : size - i;
        im.part[im.n] = (const char *)data + i;
        im.len[im.n++] = n;
        if (!z) break;
        i += n + 1;
    }
    if (im.n < 2) return 0;
    flx_cg_quota_t q;
    (void)flx_cg_quota_parse(im.part[0], im.len[0], im.part[1], im.len[1], image_read, &im, &q);
    uint32_t mcpu;
    (void)flx_cg_parse_cpu_max(im.part[0], im.len[0], "cpu.max", &mcpu);
    return 0;
}
