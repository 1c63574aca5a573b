#define _GNU_SOURCE
#include <unistd.h>
/*
 * test_kvdump - KV dump round trip (bit-exact) and refusals of the reader and the writer.
 */
#include <stdlib.h>
#include <string.h>

#include "flx/kvsource.h"
#include "flx/safetensors.h"
#include "flx/synth.h"
#include "flx_test.h"

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/test_kvdump.kvd", dir);
    snprintf(bad, sizeof bad, "%s/test_kvdump_bad.kvd", dir);
    flx_synth_params_t p;
    flx_synth_defaults(&p, 2, 4, 2, 16, 600, 3, 7);
    flx_synth_t *syn;
    CHECK_OK(flx_synth_create(&p, &syn));
    flx_kvsrc_h src;
    CHECK_OK(flx_kvsrc_from_synth(syn, &src));
    flx_kvsrc_shape_t sh;
    flx_kvsrc_shape(src, &sh);
    const size_t nkv = (size_t)sh.n_kv_heads * (sh.prompt_len + sh.n_steps) * sh.head_dim;
    const size_t nq = (size_t)sh.n_q_heads * (sh.n_steps + 1) * sh.head_dim;
    flx_bf16_t *k = malloc(nkv * 2), *v = malloc(nkv * 2), *k2 = malloc(nkv * 2), *v2 = malloc(nkv * 2);
    float *q = malloc(nq * 4), *q2 = malloc(nq * 4);
    CHECK(k && v && k2 && v2 && q && q2);
    flx_kvdump_writer_h w;
    CHECK_OK(flx_kvdump_writer_create(&sh, "synthetic", "none", &w));
    CHECK_OK(flx_kvsrc_layer(src, 1, k, v, q, NULL));
    CHECK_OK(flx_kvdump_writer_layer(w, 1, k, v, q));
    CHECK_ST(flx_kvdump_writer_layer(w, 1, k, v, q), FLX_ERR_DUPLICATE);
    CHECK_ST(flx_kvdump_writer_layer(w, 2, k, v, q), FLX_ERR_INVALID);
    CHECK_ST(flx_kvdump_writer_save(w, path), FLX_ERR_STATE);
    CHECK_OK(flx_kvsrc_layer(src, 0, k, v, q, NULL));
    CHECK_OK(flx_kvdump_writer_layer(w, 0, k, v, q));
    CHECK_OK(flx_kvdump_writer_save(w, path));
    flx_kvdump_writer_destroy(w);
    flx_kvsrc_h d;
    CHECK_OK(flx_kvsrc_open_dump(path, &d));
    flx_kvsrc_shape_t dsh;
    flx_kvsrc_shape(d, &dsh);
    CHECK(!memcmp(&dsh, &sh, sizeof sh));
    CHECK(flx_kvsrc_synth(d) == NULL);
    for (uint32_t l = 0; l < 2; l++) {
        CHECK_OK(flx_kvsrc_layer(src, l, k, v, q, NULL));
        CHECK_OK(flx_kvsrc_layer(d, l, k2, v2, q2, NULL));
        CHECK(!memcmp(k, k2, nkv * 2) && !memcmp(v, v2, nkv * 2) && !memcmp(q, q2, nq * 4));
    }
    CHECK_ST(flx_kvsrc_layer(d, 2, k2, v2, q2, NULL), FLX_ERR_INVALID);
    flx_kvsrc_close(d);

    /* refusals: hand-built files with one defect each */
    int64_t kv[3] = {sh.n_kv_heads, sh.prompt_len + sh.n_steps, sh.head_dim}, qs[3] = {sh.n_q_heads, sh.n_steps + 1, sh.head_dim};
    for (int defect = 0; defect < 5; defect++) {
        flx_st_writer_h sw;
        CHECK_OK(flx_st_writer_create(&sw));
        CHECK_OK(flx_st_writer_set_metadata(sw, "format", defect == 0 ? "other" : "fluxion-kv-dump"));
        CHECK_OK(flx_st_writer_set_metadata(sw, "version", "1"));
        const char *keys[6] = {"n_layers", "n_q_heads", "n_kv_heads", "head_dim", "prompt_len", "n_steps"};
        uint32_t vals[6] = {1, sh.n_q_heads, sh.n_kv_heads, sh.head_dim, sh.prompt_len, sh.n_steps};
        for (int i = 0; i < 6; i++) {
            char b[32];
            snprintf(b, sizeof b, defect == 1 && i == 3 ? "x%u" : "%u", vals[i]);
            CHECK_OK(flx_st_writer_set_metadata(sw, keys[i], b));
        }
        CHECK_OK(flx_st_writer_add(sw, "layers.0.k", FLX_DT_BF16, 3, kv, k));
        if (defect != 2) CHECK_OK(flx_st_writer_add(sw, "layers.0.v", FLX_DT_BF16, 3, kv, v));
        if (defect == 3) CHECK_OK(flx_st_writer_add(sw, "layers.0.q", FLX_DT_BF16, 3, qs, k));
        else if (defect == 4) {
            int64_t q3[3] = {qs[0], qs[1] - 1, qs[2]};
            CHECK_OK(flx_st_writer_add(sw, "layers.0.q", FLX_DT_F32, 3, q3, q));
        } else CHECK_OK(flx_st_writer_add(sw, "layers.0.q", FLX_DT_F32, 3, qs, q));
        CHECK_OK(flx_st_writer_save(sw, bad));
        flx_st_writer_destroy(sw);
        flx_kvsrc_h x = NULL;
        flx_status_t st = flx_kvsrc_open_dump(bad, &x);
        fprintf(stderr, "defect %d: %s\n", defect, flx_error_msg());
        CHECK(st < 0 && x == NULL);
        if (defect == 2) CHECK(strstr(flx_error_msg(), "layers.0.v"));
        if (defect >= 3) CHECK(strstr(flx_error_msg(), "layers.0.q"));
    }
    /* truncated file */
    FILE *f = fopen(path, "r+b");
    CHECK(f);
    fclose(f);
    CHECK(truncate(path, 100) == 0);
    flx_kvsrc_h x = NULL;
    CHECK(flx_kvsrc_open_dump(path, &x) < 0 && !x);
    flx_kvsrc_close(src);
    free(k), free(v), free(k2), free(v2), free(q), free(q2);
    return 0;
}
