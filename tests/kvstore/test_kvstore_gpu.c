/*
 * test_kvstore_gpu.c - the store's use of a CUDA device: pinning the KV arena for UVA, and the
 * device addresses (UVA) of the pinned arena and side memory that views carry, the
 * device copy of each session's window (FLX_KV_STORE_WINDOW_DEVICE): uploaded at READY byte for
 * byte equal to the host window, appends landing on both copies, the device budget refusing
 * cleanly, device memory released when the last reference goes, and (injected) device failures:
 * cudaMalloc at open, upload at layer completion, append. Needs a CUDA device: exits 77
 * (skipped) where none is usable, including binaries built without CUDA.
 */
#include <stdio.h>
#include <string.h>

#include "flx/cuda_rt.h"
#include "kv_testutil.h"

static flx_rng_t rng;

static flx_kv_store_h make_store(uint32_t flags, size_t dev_capacity, uint32_t D)
{
    flx_kv_store_params_t p = {0};
    p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_FLAGS |
                   FLX_KV_STORE_FIELD_WINDOW | (dev_capacity ? FLX_KV_STORE_FIELD_DEVICE_CAPACITY : 0);
    p.capacity_bytes = 512u << 20, p.n_layers = 3, p.n_kv_heads = 2, p.n_q_heads = 4, p.head_dim = D;
    p.sink = 64, p.local = 256, p.flags = flags, p.device_capacity_bytes = dev_capacity;
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

static size_t dev_free(void)
{
    size_t f, t;
    CHECK_OK(flx_cuda_mem_info(0, &f, &t));
    return f;
}

/* Rows [0, n_win) of every head's device window equal the host window, byte for byte. */
static void check_device_windows_layer(flx_kv_session_h sess, uint32_t l, uint32_t n_kv, uint32_t want_n_win)
{
    for (uint32_t h = 0; h < n_kv; h++) {
        flx_kv_head_view_t v;
        CHECK_OK(flx_kv_head_view(sess, l, h, &v));
        CHECK(v.win_k_dev && v.win_v_dev && v.win_device == 0);
        CHECK(v.n_win == want_n_win);
        size_t bytes = (size_t)v.n_win * v.head_dim * sizeof(flx_bf16_t);
        flx_bf16_t *k = malloc(bytes), *vv = malloc(bytes);
        CHECK(k && vv);
        memset(k, 0xff, bytes);
        memset(vv, 0xff, bytes);
        CHECK_OK(flx_cuda_copy_dtoh(v.win_device, k, v.win_k_dev, bytes));
        CHECK_OK(flx_cuda_copy_dtoh(v.win_device, vv, v.win_v_dev, bytes));
        CHECK(memcmp(k, v.win_k, bytes) == 0);
        CHECK(memcmp(vv, v.win_v, bytes) == 0);
        free(k);
        free(vv);
    }
}

static void check_device_windows(flx_kv_session_h sess, uint32_t layers, uint32_t n_kv, uint32_t want_n_win)
{
    for (uint32_t l = 0; l < layers; l++) check_device_windows_layer(sess, l, n_kv, want_n_win);
}

/* Bytes at the device (UVA) address dev equal the host bytes at host: copied back through the
 * device's view of the same memory. */
static void check_uva(const void *dev, const void *host, size_t bytes)
{
    void *back = malloc(bytes);
    CHECK(back);
    memset(back, 0xee, bytes);
    CHECK_OK(flx_cuda_copy_dtoh(0, back, dev, bytes));
    CHECK(memcmp(back, host, bytes) == 0);
    free(back);
}

/* PIN_CUDA: the arena and the side memory are page-locked; views carry device addresses of the same
 * bytes (block table, every pyramid level, the K/V blocks); a store without the flag carries none. */
static void test_pinned(void)
{
    const uint32_t layers = 3, n_kv = 2, D = 64, L = 1000;
    flx_kv_store_h s = make_store(FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PIN_CUDA, 0, D);
    flx_kv_store_info_t si;
    flx_kv_store_info(s, &si);
    CHECK(si.pinned == 1 && si.window_on_device == 0);
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 8, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    kv_prompt_t pr;
    kv_prompt_random(&pr, layers, n_kv, D, L, &rng);
    kv_push_random(s, sid, &pr, &rng);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(s, sid, &sess));
    for (uint32_t l = 0; l < layers; l++)
        for (uint32_t h = 0; h < n_kv; h++) {
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(sess, l, h, &v));
            CHECK(v.host_device == 0 && v.pool_base_dev && v.block_table_dev);
            CHECK(flx_cuda_host_is_pinned(v.pool_base) && flx_cuda_host_is_pinned(v.block_table));
            check_uva(v.block_table_dev, v.block_table, v.n_blocks * sizeof *v.block_table);
            for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
                CHECK(v.meta_dev[j]);
                check_uva(v.meta_dev[j], v.meta[j], (size_t)v.meta_n[j] * 2 * D * sizeof(flx_bf16_t));
            }
            for (uint32_t b = 0; b < v.n_blocks; b += 7)
                check_uva(v.pool_base_dev + (size_t)v.block_table[b] * v.block_bytes, flx_kv_block_k(&v, b),
                          v.block_bytes);
        }
    flx_kv_session_release(sess);
    kv_prompt_free(&pr);
    CHECK_OK(flx_kv_session_close(s, sid));
    flx_kv_store_destroy(s);

    s = make_store(FLX_KV_STORE_HUGEPAGES, 0, D);   /* not pinned: no device addresses */
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    kv_prompt_random(&pr, layers, n_kv, D, L, &rng);
    kv_push_random(s, sid, &pr, &rng);
    CHECK_OK(flx_kv_session_acquire(s, sid, &sess));
    flx_kv_head_view_t v;
    CHECK_OK(flx_kv_head_view(sess, 1, 1, &v));
    CHECK(v.host_device == -1 && !v.pool_base_dev && !v.block_table_dev && !v.meta_dev[0] && !v.meta_dev[3]);
    flx_kv_session_release(sess);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(s);
}

/* Prompt of L tokens pushed in random chunks; READY; device == host; appends on both; close with
 * a view held; memory back on release. pin: pinned host memory as the upload source. */
static void test_window(uint32_t L, uint32_t D, int pin)
{
    const uint32_t layers = 3, n_kv = 2, max_new = 6000;
    flx_kv_store_h s = make_store(FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE |
                                      (pin ? FLX_KV_STORE_PIN_CUDA : 0),
                                  256u << 20, D);
    flx_kv_store_info_t si;
    flx_kv_store_info(s, &si);
    CHECK(si.window_on_device == 1 && si.cuda_device == 0 && si.device_capacity_bytes == (256u << 20));
    CHECK(si.pinned == pin);
    const size_t free0 = dev_free();
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = max_new, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    flx_kv_session_info_t info;
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    const uint32_t n_prompt_win = info.n_sink + info.n_local, win_cap = n_prompt_win + max_new;
    CHECK(info.device_bytes == (size_t)2 * layers * n_kv * win_cap * D * sizeof(flx_bf16_t));
    flx_kv_store_info(s, &si);
    CHECK(si.device_used_bytes == info.device_bytes);
    const size_t free1 = dev_free();
    CHECK(free0 >= free1 + info.device_bytes);

    kv_prompt_t pr;
    kv_prompt_random(&pr, layers, n_kv, D, L, &rng);
    kv_push_random(s, sid, &pr, &rng);
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    CHECK(info.state == FLX_KV_READY);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(s, sid, &sess));
    kv_check_placement(sess, &info, &pr); /* host copy == prompt */
    check_device_windows(sess, layers, n_kv, n_prompt_win);

    /* Appends: random rows, each checked on the device against the source, then all rows again.
     * Odd steps queue the device rows on a stream from page-locked rows (the GPU decode path). */
    CHECK_OK(flx_kv_session_begin_decode(s, sid));
    const uint32_t n_app = 37;
    const size_t row = (size_t)D * sizeof(flx_bf16_t);
    flx_bf16_t *k, *v, *back = malloc(row);
    CHECK_OK(flx_cuda_host_alloc(2 * n_kv * row, (void **)&k));
    v = k + (size_t)n_kv * D;
    flx_cuda_stream_t stream;
    CHECK_OK(flx_cuda_stream_create(0, &stream));
    CHECK(back);
    {   /* pageable rows on a stream: refused, nothing appended */
        flx_kv_head_view_t hv0;
        CHECK_OK(flx_kv_head_view(sess, 0, 0, &hv0));
        flx_bf16_t *pk = calloc(2 * (size_t)n_kv * D, sizeof *pk);
        CHECK_ST(flx_kv_window_append_async(sess, 0, pk, pk + (size_t)n_kv * D, stream), FLX_ERR_INVALID);
        CHECK(strstr(flx_error_msg(), "page-locked"));
        CHECK_ST(flx_kv_window_append_async(sess, 0, k, v, NULL), FLX_ERR_INVALID);
        free(pk);
        flx_kv_head_view_t hv1;
        CHECK_OK(flx_kv_head_view(sess, 0, 0, &hv1));
        CHECK(hv1.n_win == hv0.n_win);
    }
    for (uint32_t t = 0; t < n_app; t++)
        for (uint32_t l = 0; l < layers; l++) {
            for (uint32_t i = 0; i < n_kv * D; i++) {
                k[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
                v[i] = flx_f32_to_bf16((float)flx_rng_normal(&rng));
            }
            if (t & 1) {
                CHECK_OK(flx_kv_window_append_async(sess, l, k, v, stream));
                CHECK_OK(flx_cuda_stream_sync(0, stream));
            } else {
                CHECK_OK(flx_kv_window_append(sess, l, k, v));
            }
            for (uint32_t h = 0; h < n_kv; h++) {
                flx_kv_head_view_t hv;
                CHECK_OK(flx_kv_head_view(sess, l, h, &hv));
                CHECK(hv.n_win == n_prompt_win + t + 1);
                CHECK_OK(flx_cuda_copy_dtoh(0, back, hv.win_k_dev + (size_t)(hv.n_win - 1) * D, row));
                CHECK(memcmp(back, k + (size_t)h * D, row) == 0);
                CHECK_OK(flx_cuda_copy_dtoh(0, back, hv.win_v_dev + (size_t)(hv.n_win - 1) * D, row));
                CHECK(memcmp(back, v + (size_t)h * D, row) == 0);
            }
        }
    check_device_windows(sess, layers, n_kv, n_prompt_win + n_app);
    flx_cuda_stream_destroy(0, stream);

    /* Close with the view held: device memory stays (pointers valid) until the release. */
    flx_kv_head_view_t hv;
    CHECK_OK(flx_kv_head_view(sess, layers - 1, n_kv - 1, &hv));
    CHECK_OK(flx_kv_session_close(s, sid));
    flx_kv_store_info(s, &si);
    CHECK(si.device_used_bytes == info.device_bytes);
    CHECK_OK(flx_cuda_copy_dtoh(0, back, hv.win_k_dev + (size_t)(hv.n_win - 1) * D, row));
    CHECK(memcmp(back, hv.win_k + (size_t)(hv.n_win - 1) * D, row) == 0);
    flx_kv_session_release(sess);
    flx_kv_store_info(s, &si);
    CHECK(si.device_used_bytes == 0 && si.used_bytes == 0);
    const size_t free2 = dev_free();
    fprintf(stderr, "window L %u D %u pin %d: %zu device bytes; free %zu -> %zu -> %zu\n", L, D, pin,
            info.device_bytes, free0, free1, free2);
    CHECK(free2 + (4u << 20) >= free0); /* back, up to the allocator's granularity */
    flx_cuda_host_free(k);
    free(back);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(s);
}

/* The device budget refuses with FLX_ERR_CAPACITY and leaves nothing reserved; bad device
 * parameters are refused at create. */
static void test_budget(void)
{
    const uint32_t D = 64, L = 1000, max_new = 100;
    flx_kv_store_h s = make_store(FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE, 1u << 20, D);
    size_t one;
    CHECK_OK(flx_kv_session_device_bytes(s, L, max_new, &one));
    CHECK(one > 0 && one < (1u << 20) && 2 * one > (1u << 20));
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = max_new, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t a, b;
    CHECK_OK(flx_kv_session_open(s, &sp, &a));
    flx_kv_store_info_t si0, si;
    flx_kv_store_info(s, &si0);
    CHECK_ST(flx_kv_session_open(s, &sp, &b), FLX_ERR_CAPACITY);
    CHECK(strstr(flx_error_msg(), "device window"));
    flx_kv_store_info(s, &si);
    CHECK(si.used_bytes == si0.used_bytes && si.device_used_bytes == one && si.n_sessions == 1);
    CHECK_OK(flx_kv_session_close(s, a));
    CHECK_OK(flx_kv_session_open(s, &sp, &b));
    CHECK_OK(flx_kv_session_close(s, b));
    flx_kv_store_info(s, &si);
    CHECK(si.used_bytes == 0 && si.device_used_bytes == 0 && si.n_sessions == 0);
    flx_kv_store_destroy(s);

    flx_kv_store_params_t p = {0};
    p.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_FLAGS |
                   FLX_KV_STORE_FIELD_CUDA_DEVICE | FLX_KV_STORE_FIELD_DEVICE_CAPACITY;
    p.capacity_bytes = 64u << 20, p.n_layers = 1, p.n_kv_heads = 1, p.n_q_heads = 1, p.head_dim = 64;
    p.flags = FLX_KV_STORE_WINDOW_DEVICE;
    p.cuda_device = flx_cuda_device_count();
    p.device_capacity_bytes = 1u << 20;
    CHECK_ST(flx_kv_store_create(&p, &s), FLX_ERR_INVALID);
    p.cuda_device = 0;
    size_t f, t;
    CHECK_OK(flx_cuda_mem_info(0, &f, &t));
    p.device_capacity_bytes = t + 1;
    CHECK_ST(flx_kv_store_create(&p, &s), FLX_ERR_CAPACITY);
    CHECK(strstr(flx_error_msg(), "free on device 0"));
    /* Default budget: a quarter of the free memory. */
    p.field_mask &= ~(uint64_t)FLX_KV_STORE_FIELD_DEVICE_CAPACITY;
    CHECK_OK(flx_kv_store_create(&p, &s));
    flx_kv_store_info(s, &si);
    CHECK(si.window_on_device && si.device_capacity_bytes > 0 && si.device_capacity_bytes <= t / 4);
    flx_kv_store_destroy(s);
}

/* Device failures (injected): a failed cudaMalloc refuses the open and leaves nothing reserved; a
 * failed upload makes the session FAILED with the reason, never READY; a failed append appends
 * nothing, and the next append lands in the same row. */
static void test_faults(void)
{
    const uint32_t layers = 3, n_kv = 2, D = 64, L = 700, max_new = 8;
    flx_kv_store_h s = make_store(FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE, 64u << 20, D);
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = max_new, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    flx_kv_store_info_t si;
    flx_cuda_inject_faults(1);
    CHECK_ST(flx_kv_session_open(s, &sp, &sid), FLX_ERR_DEVICE);
    CHECK(strstr(flx_error_msg(), "device window") && strstr(flx_error_msg(), "injected fault"));
    flx_kv_store_info(s, &si);
    CHECK(si.used_bytes == 0 && si.device_used_bytes == 0 && si.n_sessions == 0);

    kv_prompt_t pr;
    kv_prompt_random(&pr, layers, n_kv, D, L, &rng);
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    CHECK_OK(kv_push_chunk(s, sid, &pr, 0, 0, n_kv, 0, L));
    flx_cuda_inject_faults(1);
    CHECK_ST(kv_push_chunk(s, sid, &pr, 1, 0, n_kv, 0, L), FLX_ERR_DEVICE);
    flx_kv_session_info_t info;
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    CHECK(info.state == FLX_KV_FAILED && strstr(info.fail_reason, "device window upload of layer 1"));
    CHECK_ST(kv_push_chunk(s, sid, &pr, 2, 0, n_kv, 0, L), FLX_ERR_STATE);
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    CHECK(info.state == FLX_KV_FAILED);
    CHECK_OK(flx_kv_session_close(s, sid));
    flx_kv_store_info(s, &si);
    CHECK(si.used_bytes == 0 && si.device_used_bytes == 0);

    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    for (uint32_t l = 0; l < layers; l++) CHECK_OK(kv_push_chunk(s, sid, &pr, l, 0, n_kv, 0, L));
    CHECK_OK(flx_kv_session_begin_decode(s, sid));
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(s, sid, &sess));
    flx_bf16_t k[2 * 64], v[2 * 64];
    for (int i = 0; i < 2 * 64; i++) k[i] = flx_f32_to_bf16(1.0f + (float)i), v[i] = flx_f32_to_bf16(-1.0f - (float)i);
    flx_kv_head_view_t hv;
    CHECK_OK(flx_kv_head_view(sess, 1, 0, &hv));
    const uint32_t n0 = hv.n_win;
    flx_cuda_inject_faults(1);
    CHECK_ST(flx_kv_window_append(sess, 1, k, v), FLX_ERR_DEVICE);
    CHECK(strstr(flx_error_msg(), "window append"));
    CHECK_OK(flx_kv_head_view(sess, 1, 0, &hv));
    CHECK(hv.n_win == n0);
    CHECK_OK(flx_kv_window_append(sess, 1, k, v));
    check_device_windows_layer(sess, 1, n_kv, n0 + 1);
    flx_kv_session_release(sess);
    CHECK_OK(flx_kv_session_close(s, sid));
    flx_cuda_inject_faults(0);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(s);
}

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_kvstore_gpu: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_kvstore_gpu"));
    test_pinned();
    test_window(1000, 64, 0);   /* sink + local + host segment */
    test_window(200, 128, 1);   /* the prompt fits the window: l_cpu 0; pinned upload source */
    test_window(333, 128, 0);   /* partial last granule */
    test_budget();
    test_faults();
    printf("test_kvstore_gpu: arena pinning and device windows on %d device(s): ok\n", flx_cuda_device_count());
    return 0;
}
