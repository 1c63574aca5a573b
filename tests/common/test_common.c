/*
 * test_common.c - bf16/f16 conversions, safetensors round trip and refusals, RNG determinism,
 * CPU dispatch capping, the arena's sizing pass, the JSON log format.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "flx/bf16.h"
#include "flx/cpu.h"
#include "flx/log.h"
#include "flx/safetensors.h"
#include "flx/util.h"
#include "flx_test.h"

static void test_bf16(void)
{
    CHECK(flx_bf16_to_f32(flx_f32_to_bf16(1.0f)) == 1.0f);
    CHECK(flx_bf16_to_f32(flx_f32_to_bf16(-2.5f)) == -2.5f);
    /* 1 + 2^-8 is halfway between two bf16 values: ties to even (down to 1.0). */
    CHECK(flx_bf16_to_f32(flx_f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
    CHECK(flx_bf16_to_f32(flx_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
    CHECK(isnan(flx_bf16_to_f32(flx_f32_to_bf16(NAN))));
    CHECK(isinf(flx_bf16_to_f32(flx_f32_to_bf16(INFINITY))));
    /* Every bf16 survives the round trip exactly (NaNs stay NaN). */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = flx_bf16_to_f32((flx_bf16_t)h);
        if (isnan(f)) CHECK(isnan(flx_bf16_to_f32(flx_f32_to_bf16(f))));
        else CHECK(flx_f32_to_bf16(f) == h);
    }
    /* Every finite f16 survives f16 -> f32 -> f16. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = flx_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        CHECK(flx_f32_to_f16(f) == h);
    }
    CHECK(flx_f16_to_f32(0x3c00) == 1.0f);
    CHECK(flx_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(flx_f32_to_f16(65520.0f) == 0x7c00); /* rounds to inf */
}

static void test_safetensors(void)
{
    char path[] = "/tmp/flx_test_st_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    float a[6] = {1, 2, 3, 4, 5, 6};
    flx_bf16_t b[4] = {1, 2, 3, 4};
    int64_t sa[2] = {2, 3}, sb[1] = {4};
    flx_st_writer_h w;
    CHECK_OK(flx_st_writer_create(&w));
    CHECK_OK(flx_st_writer_add(w, "a", FLX_DT_F32, 2, sa, a));
    CHECK_OK(flx_st_writer_add(w, "b.x", FLX_DT_BF16, 1, sb, b));
    CHECK_ST(flx_st_writer_add(w, "a", FLX_DT_F32, 2, sa, a), FLX_ERR_DUPLICATE);
    CHECK_OK(flx_st_writer_set_metadata(w, "format", "pt"));
    CHECK_OK(flx_st_writer_save(w, path));
    flx_st_writer_destroy(w);

    flx_st_reader_h r;
    CHECK_OK(flx_st_open(path, &r));
    CHECK(flx_st_count(r) == 2);
    const flx_st_tensor_t *t;
    CHECK_OK(flx_st_expect(r, "a", FLX_DT_F32, 2, sa, &t));
    CHECK(memcmp(t->data, a, sizeof a) == 0);
    CHECK_ST(flx_st_expect(r, "a", FLX_DT_BF16, 2, sa, &t), FLX_ERR_FORMAT);
    CHECK_ST(flx_st_expect(r, "missing", FLX_DT_F32, 2, sa, &t), FLX_ERR_NOT_FOUND);
    int64_t wrong[1] = {5};
    CHECK_ST(flx_st_expect(r, "b.x", FLX_DT_BF16, 1, wrong, &t), FLX_ERR_FORMAT);
    CHECK(strcmp(flx_st_metadata(r, "format"), "pt") == 0);
    flx_st_close(r);

    /* Truncated file: header says more than there is. */
    FILE *f = fopen(path, "r+b");
    CHECK(f);
    CHECK(ftruncate(fileno(f), 40) == 0);
    fclose(f);
    CHECK_ST(flx_st_open(path, &r), FLX_ERR_FORMAT);

    /* Hand-written headers with one defect each; the message names the field. */
    struct {
        const char *hdr, *msg;
    } bad[] = {
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "do not fill data_offsets"},
        {"{\"t\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", "unknown dtype 'Q4'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,400]}}", "data_offsets"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "shape[0]"},
        {"[1,2,3]", "not a JSON object"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", "data_offsets"},
        /* issue 14: what a reader keeps must not depend on which copy of a name it keeps */
        {"{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\"},\"__metadata__\":{\"c\":\"3\"}}", "'__metadata__' appears twice"},
        {"{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", "key 'a' appears twice"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", "tensor 't' appears twice"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1.5]}}", "data_offsets are not whole"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", "shape[0]"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}xyz", "bytes after its JSON object"},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        f = fopen(path, "wb");
        uint64_t hl = strlen(bad[i].hdr);
        fwrite(&hl, 8, 1, f);
        fwrite(bad[i].hdr, 1, hl, f);
        float pay[2] = {0, 0};
        fwrite(pay, sizeof pay, 1, f);
        fclose(f);
        CHECK_ST(flx_st_open(path, &r), FLX_ERR_FORMAT);
        if (!strstr(flx_error_msg(), bad[i].msg)) fprintf(stderr, "case %zu: '%s'\n", i, flx_error_msg());
        CHECK(strstr(flx_error_msg(), bad[i].msg));
    }
    /* Trailing padding spaces are the format's own. */
    f = fopen(path, "wb");
    const char *padded = "{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}    ";
    uint64_t hl = strlen(padded);
    CHECK(fwrite(&hl, 8, 1, f) == 1 && fwrite(padded, 1, hl, f) == hl && fwrite("xy", 1, 2, f) == 2);
    fclose(f);
    CHECK_OK(flx_st_open(path, &r));
    CHECK(flx_st_find(r, "t") && memcmp(flx_st_find(r, "t")->data, "xy", 2) == 0);
    flx_st_close(r);

    /* The committed bad inputs of issue 14: a duplicated __metadata__ (once a heap overflow), and an
     * odd header length putting BF16 data at odd addresses (legal: read through memcpy). */
    CHECK_ST(flx_st_open(FLX_TEST_DATA "/bad-inputs/02-safetensors-duplicate-metadata.safetensors", &r),
             FLX_ERR_FORMAT);
    CHECK(strstr(flx_error_msg(), "'__metadata__' appears twice"));
    CHECK_OK(flx_st_open(FLX_TEST_DATA "/bad-inputs/03-fluxion-attn-misaligned-bf16.safetensors", &r));
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        const flx_st_tensor_t *tt = flx_st_find(r, names[i]);
        CHECK(tt && tt->dtype == FLX_DT_BF16 && tt->nbytes == 32 && ((uintptr_t)tt->data & 1) == 1);
        for (int j = 0; j < 16; j++) {
            flx_bf16_t h;
            memcpy(&h, (const uint8_t *)tt->data + 2 * j, 2);
            CHECK(flx_bf16_to_f32(h) == 1.0f);
        }
    }
    flx_st_close(r);
    CHECK_ST(flx_st_open("/nonexistent/x.safetensors", &r), FLX_ERR_NOT_FOUND);
    unlink(path);
}

static void test_rng_cpu_arena(void)
{
    flx_rng_t a, b;
    flx_rng_seed(&a, 42);
    flx_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) CHECK(flx_rng_u64(&a) == flx_rng_u64(&b));
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double x = flx_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    CHECK(fabs(s / 1e5) < 0.02 && fabs(s2 / 1e5 - 1) < 0.03);

    flx_isa_t best = flx_isa_best();
    fprintf(stderr, "cpu: best isa %s (features 0x%x)\n", flx_isa_name(best), flx_cpu_features());
    CHECK(flx_isa_force(FLX_ISA_SCALAR) == FLX_ISA_SCALAR);
    CHECK(flx_isa_active() == FLX_ISA_SCALAR);
    CHECK(flx_isa_force(FLX_ISA_AMX) == best);
    flx_isa_t p;
    CHECK(flx_isa_parse("avx2", &p) == 0 && p == FLX_ISA_AVX2);
    CHECK(flx_isa_parse("amx", &p) == 0 && p == FLX_ISA_AMX);
    /* the streaming kernels' L2 prefetch distance: Intel's or none, the same on every call */
    const uint32_t pf = flx_cpu_stream_prefetch();
    fprintf(stderr, "cpu: stream prefetch %u bytes ahead\n", pf);
    CHECK((pf == 0 || pf == 6144) && flx_cpu_stream_prefetch() == pf);
    CHECK(!strcmp(flx_isa_name(FLX_ISA_AMX), "amx"));
    /* AMX counts only with the rest of the ladder under it and the tile data granted */
    if (best == FLX_ISA_AMX) CHECK((flx_cpu_features() & (FLX_CPU_AMX_BF16 | FLX_CPU_AVX512BF16)) == (FLX_CPU_AMX_BF16 | FLX_CPU_AVX512BF16));
    else CHECK(!(flx_cpu_features() & FLX_CPU_AMX_BF16) || !(flx_cpu_features() & FLX_CPU_AVX512BF16));
    CHECK(flx_isa_parse("sse9", &p) != 0);

    flx_arena_t ar;
    flx_arena_init(&ar, NULL, 0);
    CHECK(flx_arena_alloc(&ar, 10) == NULL);
    CHECK(flx_arena_alloc(&ar, 100) == NULL);
    size_t need = ar.used;
    CHECK(need == 64 + 128);
    void *mem = flx_aligned_alloc(64, need);
    flx_arena_init(&ar, mem, need);
    void *p1 = flx_arena_alloc(&ar, 10), *p2 = flx_arena_alloc(&ar, 100);
    CHECK(p1 && p2 && ((uintptr_t)p2 % 64) == 0);
    CHECK(flx_arena_alloc(&ar, 1) == NULL);
    flx_aligned_free(mem);

    uint64_t u = 7;
    CHECK(flx_parse_u64("42", 0, 100, &u) == FLX_OK && u == 42);
    CHECK(flx_parse_u64("18446744073709551615", 0, UINT64_MAX, &u) == FLX_OK && u == UINT64_MAX);
    const char *bad_ints[] = {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "101", "18446744073709551616"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad_ints); i++) {
        u = 7;
        CHECK(flx_parse_u64(bad_ints[i], 0, 100, &u) == FLX_ERR_INVALID && u == 7);
    }
    CHECK(flx_parse_u64(NULL, 0, 1, &u) == FLX_ERR_INVALID);

    CHECK(flx_error_set(FLX_ERR_CAPACITY, "pool full: %d", 7) == FLX_ERR_CAPACITY);
    CHECK(strcmp(flx_error_msg(), "pool full: 7") == 0);
    /* context added to the previous message, which is an argument of the new one */
    CHECK(flx_error_set(FLX_ERR_CAPACITY, "layer %u: %s", 3u, flx_error_msg()) == FLX_ERR_CAPACITY);
    CHECK(strcmp(flx_error_msg(), "layer 3: pool full: 7") == 0);
    CHECK(strcmp(flx_status_name(FLX_ERR_CAPACITY), "capacity") == 0);
}

/* The name index: sorted lookups, repeated names caught. */
static void test_names(void)
{
    flx_name_ent_t e[6] = {{"w", 0}, {"a", 1}, {"m.2", 2}, {"m.10", 3}, {"", 4}, {"z", 5}};
    const char *dup = NULL;
    CHECK_OK(flx_names_sort(e, 6, &dup));
    for (size_t i = 1; i < 6; i++) CHECK(strcmp(e[i - 1].name, e[i].name) < 0);
    const char *want[] = {"w", "a", "m.2", "m.10", "", "z"};
    for (size_t i = 0; i < 6; i++) CHECK(flx_names_find(e, 6, want[i]) && flx_names_find(e, 6, want[i])->pos == i);
    CHECK(!flx_names_find(e, 6, "m") && !flx_names_find(e, 6, "zz") && !flx_names_find(e, 0, "a"));
    flx_name_ent_t d[3] = {{"x", 0}, {"y", 1}, {"x", 2}};
    CHECK_ST(flx_names_sort(d, 3, &dup), FLX_ERR_DUPLICATE);
    CHECK(strcmp(dup, "x") == 0);
}

/* A JSON log line is one object per line with the message escaped, whatever it holds. */
static void test_log_json(void)
{
    CHECK(flx_log_format_parse("json") == FLX_LOG_JSON && flx_log_format_parse("xml") == -1);
    CHECK(flx_log_level_parse("info") == FLX_LOG_INFO && flx_log_level_parse("loud") == -1);
    char path[] = "/tmp/flx-test-log-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    int saved = dup(STDERR_FILENO);
    CHECK(dup2(fd, STDERR_FILENO) >= 0);
    flx_log_level_t lvl = flx_log_get_level();
    flx_log_set_level(FLX_LOG_INFO);
    flx_log_set_format(FLX_LOG_JSON);
    flx_log_info("node", "session %d said \"hi\\\n\ttab\x01\" ok", 7);
    flx_log_set_format(FLX_LOG_TEXT);
    flx_log_set_level(lvl);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[2048] = {0};
    CHECK(pread(fd, buf, sizeof buf - 1, 0) > 0);
    close(fd);
    unlink(path);
    char *nl = strchr(buf, '\n');
    CHECK(nl && nl[1] == '\0');   /* one line */
    *nl = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) fprintf(stderr, "not JSON: %s\n", buf);
    CHECK(j);
    CHECK(!strcmp(cJSON_GetObjectItem(j, "level")->valuestring, "info"));
    CHECK(!strcmp(cJSON_GetObjectItem(j, "module")->valuestring, "node"));
    CHECK(!strcmp(cJSON_GetObjectItem(j, "msg")->valuestring, "session 7 said \"hi\\\n\ttab\x01\" ok"));
    CHECK(strlen(cJSON_GetObjectItem(j, "ts")->valuestring) == 24);
    cJSON_Delete(j);
}

int main(void)
{
    test_names();
    test_log_json();
    test_bf16();
    test_safetensors();
    test_rng_cpu_arena();
    printf("test_common: ok\n");
    return 0;
}
