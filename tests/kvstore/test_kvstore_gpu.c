/*
 * test_kvstore_gpu.c - pinning the KV arena for UVA. Needs a CUDA device: exits 77 (skipped) where
 * none is usable, including binaries built without CUDA.
 */
#include <stdio.h>

#include "flx/cuda_rt.h"
#include "kv_testutil.h"

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_kvstore_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_kv_store_params_t p = {0};
    p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_FLAGS;
    p.capacity_bytes = 64u << 20, p.n_layers = 2, p.n_kv_heads = 2, p.n_q_heads = 4, p.head_dim = 64;
    p.flags = FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PIN_CUDA;
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    flx_kv_store_info_t si;
    flx_kv_store_info(s, &si);
    CHECK(si.pinned == 1);
    flx_kv_session_params_t sp = {1000, 8, FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    CHECK_OK(flx_kv_session_close(s, sid));
    flx_kv_store_destroy(s);
    printf("test_kvstore_gpu: arena pinned on %d device(s): ok\n", flx_cuda_device_count());
    return 0;
}
