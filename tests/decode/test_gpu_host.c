/*
 * test_gpu_host - the host side of the GPU path, on any machine (label unit; a GPU machine runs it
 * too and checks the device-dependent refusals its own way):
 *  (a) flx_gpu_fwd_plan: sizes grow with the prompt and the batch by at least the buffers the
 *      design needs; bad shapes are refused with messages that name the value;
 *  (b) flx_attn_window_gpu_plan and the argument checks of the window and causal launchers; the
 *      GPU worker's host part: flx_attn_host_gpu_plan (sizes grow with the shape, bad shapes refused),
 *      flx_attn_gpu_view refusing views without device addresses, argument checks of its kernels;
 *  (c) without a device: flx_gpu_model_create, the workspaces, streams and page-locked buffers, and
 *      an engine with use_gpu refuse with FLX_ERR_NO_DEVICE and a message, out-params untouched; with
 *      a device: a device ordinal out of range, host memory that is not page-locked and a store
 *      without device windows are refused instead;
 *  (d) engine params of the GPU path: use_gpu not 0/1, a negative device, a gpu_model without
 *      use_gpu.
 */
#include <string.h>

#include "flx/attn_gpu.h"
#include "flx/cuda_rt.h"
#include "flx/engine.h"
#include "flx/forward_gpu.h"
#include "flx_test.h"

static void check_msg(const char *want)
{
    if (!strstr(flx_error_msg(), want)) {
        fprintf(stderr, "message '%s' does not name '%s'\n", flx_error_msg(), want);
        CHECK(0);
    }
}

static flx_model_config_t small_cfg(void)
{
    flx_model_config_t c = {.arch = FLX_ARCH_QWEN2, .n_layers = 2, .hidden = 128, .n_heads = 8, .n_kv_heads = 2,
                            .head_dim = 64, .ffn = 256, .vocab = 300, .max_ctx = 4096, .rms_eps = 1e-6f,
                            .rope_theta = 1e6f, .qkv_bias = 1};
    snprintf(c.name, sizeof c.name, "test-qwen2-host");
    return c;
}

/* (a) */
static void test_fwd_plan(const flx_model_t *m)
{
    const flx_model_config_t *c = &m->cfg;
    const size_t H = c->hidden, D = c->head_dim, qd = (size_t)c->n_heads * D, kvd = (size_t)c->n_kv_heads * D;
    size_t d0, h0, d1, h1, d2, h2;
    flx_gpu_fwd_shape_t s = {.max_prompt = 0, .max_batch = 1};
    CHECK_OK(flx_gpu_fwd_plan(m, &s, &d0, &h0));
    /* decode only: at least the cuBLAS workspace, the residual stream, q|k|v, o, the logits */
    CHECK(d0 >= ((size_t)32 << 20) + H * 4 + (qd + 2 * kvd) * 4 + qd * 4 + (size_t)c->vocab * 4 * 3);
    CHECK(h0 >= (qd + 2 * kvd) * 4 + qd * 4 + (size_t)c->vocab * 4);
    s.max_prompt = 1000;
    CHECK_OK(flx_gpu_fwd_plan(m, &s, &d1, &h1));
    /* per prompt token: residual H, q (Hq D) fp32, K and V bf16, the RoPE table (D fp32) on the
     * device; K, V bf16 staging on the host */
    CHECK(d1 - d0 >= 1000 * (H * 4 + qd * 4 + 2 * kvd * 2 + D * 4));
    CHECK(h1 - h0 >= 1000 * (2 * kvd * 2));
    s.max_batch = 8;
    CHECK_OK(flx_gpu_fwd_plan(m, &s, &d2, &h2));
    CHECK(h2 - h1 >= 7 * ((qd + 2 * kvd) * 4 + qd * 4 + (size_t)c->vocab * 4));
    s.prefill_chunk = 16;   /* a smaller chunk: smaller product buffers */
    size_t d3, h3;
    CHECK_OK(flx_gpu_fwd_plan(m, &s, &d3, &h3));
    CHECK(d3 < d2 && h3 == h2);
    fprintf(stderr, "gpu forward plan: decode %zu + %zu bytes, 1000-token prefill %zu + %zu, batch 8 %zu + %zu\n", d0,
            h0, d1, h1, d2, h2);

    struct { flx_gpu_fwd_shape_t s; const char *needle; } bad[] = {
        {{.max_prompt = 1, .max_batch = 0}, "max_batch 0"},
        {{.max_prompt = 1, .max_batch = 5000}, "max_batch 5000"},
        {{.max_prompt = (1u << 22) + 1, .max_batch = 1}, "max_prompt 4194305"},
        {{.max_prompt = 4097, .max_batch = 1}, "max_prompt 4097 tokens is longer than the model's context of 4096"},
        {{.max_prompt = 1, .max_batch = 1, .prefill_chunk = 70000}, "prefill_chunk 70000"},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        size_t x = 7, y = 7;
        CHECK_ST(flx_gpu_fwd_plan(m, &bad[i].s, &x, &y), FLX_ERR_INVALID);
        check_msg(bad[i].needle);
        CHECK(x == 7 && y == 7);
    }
    CHECK_ST(flx_gpu_fwd_plan(NULL, &s, &d0, &h0), FLX_ERR_INVALID);
    CHECK_ST(flx_gpu_fwd_plan(m, NULL, &d0, &h0), FLX_ERR_INVALID);
}

/* (b) */
static void test_window_plan_and_args(void)
{
    size_t d, h;
    flx_attn_gpu_shape_t s = {.group = 4, .head_dim = 128, .max_items = 100};
    CHECK_OK(flx_attn_window_gpu_plan(&s, &d, &h));
    CHECK(d >= 100 * sizeof(flx_attn_gpu_item_t) && h >= 100 * sizeof(flx_attn_gpu_item_t));
    struct { flx_attn_gpu_shape_t s; const char *needle; } bad[] = {
        {{0, 64, 1}, "group 0"},         {{65, 64, 1}, "group 65"},       {{4, 8, 1}, "head_dim 8"},
        {{4, 72, 1}, "head_dim 72"},     {{4, 272, 1}, "head_dim 272"},   {{4, 64, 0}, "max_items 0"},
        {{4, 64, (1u << 20) + 1}, "max_items 1048577"},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        CHECK_ST(flx_attn_window_gpu_plan(&bad[i].s, &d, &h), FLX_ERR_INVALID);
        check_msg(bad[i].needle);
    }
    flx_attn_gpu_shape_t ok80 = {4, 80, 1};   /* any multiple of 16 */
    CHECK_OK(flx_attn_window_gpu_plan(&ok80, &d, &h));

    flx_attn_gpu_ws_t ws;
    memset(&ws, 0, sizeof ws);
    flx_attn_gpu_item_t it = {0};
    CHECK_ST(flx_attn_window_gpu(&ws, &it, 1, NULL), FLX_ERR_INVALID);   /* not initialised */
    check_msg("initialised");
    /* a workspace whose pointers are set (never dereferenced: the checks refuse first) */
    ws.shape = s;
    ws.items_dev = (flx_attn_gpu_item_t *)(uintptr_t)0x1000, ws.items_host = &it;
    float dummy[4];
    flx_attn_gpu_item_t items[2] = {{.k = NULL, .v = NULL, .n_win = 5, .q = dummy, .o = dummy, .lse = dummy},
                                    {.q = dummy, .o = dummy, .lse = dummy}};
    CHECK_ST(flx_attn_window_gpu(&ws, items, 2, NULL), FLX_ERR_INVALID);
    check_msg("item 0 has n_win 5 but no window");
    CHECK_ST(flx_attn_window_gpu(&ws, items, 0, NULL), FLX_ERR_INVALID);
    check_msg("0 items");
    CHECK_ST(flx_attn_window_gpu(&ws, items, 101, NULL), FLX_ERR_INVALID);
    check_msg("101 items");
    items[0].k = (const flx_bf16_t *)(uintptr_t)0x1002, items[0].v = (const flx_bf16_t *)(uintptr_t)0x2000;
    CHECK_ST(flx_attn_window_gpu(&ws, items, 1, NULL), FLX_ERR_INVALID);
    check_msg("16-byte aligned");
    items[1].lse = NULL;
    items[0].k = (const flx_bf16_t *)(uintptr_t)0x1000;
    CHECK_ST(flx_attn_window_gpu(&ws, items, 2, NULL), FLX_ERR_INVALID);
    check_msg("item 1 has a NULL");

    const flx_bf16_t *kv = (const flx_bf16_t *)(uintptr_t)0x10000;
    flx_attn_causal_gpu_args_t ca = {.q = dummy, .q_stride = 8 * 64, .k = kv, .v = kv, .kv_stride = 10, .t0 = 4,
                                     .nq = 6, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .o = dummy,
                                     .o_stride = 8 * 64};
    flx_attn_causal_gpu_args_t b = ca;
    b.nq = 7;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    check_msg("kv_stride 10");
    b = ca, b.nq = 0;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    b = ca, b.n_heads = 7;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    check_msg("7 query heads over 2");
    b = ca, b.head_dim = 40;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    check_msg("head_dim 40");
    b = ca, b.q_stride = 100;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    check_msg("q_stride 100");
    b = ca, b.v = NULL;
    CHECK_ST(flx_attn_causal_gpu(&b, NULL), FLX_ERR_INVALID);
    /* well-formed: only the device is missing (or, on a GPU machine, these are not device pointers:
     * not launched here) */
    if (flx_cuda_device_count() == 0) {
        CHECK_ST(flx_attn_causal_gpu(&ca, NULL), FLX_ERR_NO_DEVICE);
        check_msg("no CUDA device");
        items[1].lse = dummy;
        CHECK_ST(flx_attn_window_gpu(&ws, items, 2, NULL), FLX_ERR_NO_DEVICE);
    }
}

/* (b) the GPU worker's host part */
static void test_host_gpu_plan_and_args(void)
{
    size_t d1, h1, d2, h2;
    flx_attn_host_gpu_shape_t s = {.group = 4, .head_dim = 128, .max_l_cpu = 32768};
    CHECK_OK(flx_attn_host_gpu_plan(&s, &d1, &h1));
    /* at least the scores and selections of every head over 2048 blocks, and the staging of q */
    CHECK(d1 >= 4 * 2048 * 8 && h1 >= 4 * 128 * 4 * 2);
    flx_attn_host_gpu_shape_t s2 = {.group = 8, .head_dim = 128, .max_l_cpu = 65536};
    CHECK_OK(flx_attn_host_gpu_plan(&s2, &d2, &h2));
    CHECK(d2 > 2 * d1 && h2 > h1);
    struct { flx_attn_host_gpu_shape_t s; const char *needle; } bad[] = {
        {{0, 64, 100}, "group 0"}, {{65, 64, 100}, "group 65"}, {{4, 40, 100}, "head_dim 40"},
        {{4, 64, 0}, "max_l_cpu 0"}, {{4, 64, (1u << 26) + 1}, "max_l_cpu 67108865"},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
        CHECK_ST(flx_attn_host_gpu_plan(&bad[i].s, &d1, &h1), FLX_ERR_INVALID);
        check_msg(bad[i].needle);
    }
    /* a view of an unpinned layout: no device addresses */
    flx_kv_head_view_t v;
    memset(&v, 0, sizeof v);
    v.head_dim = 64, v.l_cpu = 40, v.n_blocks = 3, v.block_bytes = 64 * 64, v.host_device = -1;
    uint32_t table[3] = {0, 1, 2};
    static uint8_t pool[3 * 64 * 64];
    v.block_table = table, v.pool_base = pool;
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) v.meta_n[j] = flx_kv_meta_count(40, j);
    flx_attn_gpu_view_t gv;
    CHECK_ST(flx_attn_gpu_view(&v, &gv), FLX_ERR_INVALID);
    check_msg("no device addresses");
    v.host_device = 0, v.pool_base_dev = (const uint8_t *)(uintptr_t)0x10000,
    v.block_table_dev = (const uint32_t *)(uintptr_t)0x20000;
    CHECK_ST(flx_attn_gpu_view(&v, &gv), FLX_ERR_INVALID);   /* levels without device addresses */
    check_msg("metadata level 0");
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) v.meta_dev[j] = (const flx_bf16_t *)(uintptr_t)(0x30000 + 0x1000 * j);
    v.meta_dev[2] = (const flx_bf16_t *)(uintptr_t)0x32008;
    CHECK_ST(flx_attn_gpu_view(&v, &gv), FLX_ERR_INVALID);
    check_msg("16-byte aligned");
    v.meta_dev[2] = (const flx_bf16_t *)(uintptr_t)0x32000;
    CHECK_OK(flx_attn_gpu_view(&v, &gv));
    CHECK(gv.l_cpu == 40 && gv.n_blocks == 3 && gv.pool == v.pool_base_dev && gv.meta[3] == v.meta_dev[3]);
    /* the kernels' argument checks (nothing is launched: they refuse first) */
    float dummy[4];
    uint32_t kk[4] = {0};
    CHECK_ST(flx_attn_score_gpu(&gv, 4, 4, dummy, dummy, 100, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_attn_score_gpu(&gv, 0, 4, dummy, dummy, 2, NULL), FLX_ERR_INVALID);   /* ld below 3 blocks */
    check_msg("ld 2");
    CHECK_ST(flx_topk_gpu(dummy, 2, 3, 4, kk, kk, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_topk_gpu(dummy, 3, 3, 0, kk, kk, NULL), FLX_ERR_INVALID);
    CHECK_ST(flx_attn_merge_gpu(0, 64, dummy, dummy, dummy, dummy, dummy, dummy, NULL), FLX_ERR_INVALID);
    flx_attn_host_gpu_ws_t ws;
    memset(&ws, 0, sizeof ws);
    CHECK_ST(flx_attn_sparse_gpu(&ws, &gv, 0, dummy, kk, 3, kk, dummy, dummy, NULL), FLX_ERR_INVALID);
    check_msg("initialised");
    float o[4 * 64], lse[4];
    CHECK_ST(flx_attn_host_gpu_finish(&ws, o, lse, NULL), FLX_ERR_INVALID);
    if (flx_cuda_device_count() == 0) {
        CHECK_ST(flx_attn_score_gpu(&gv, 0, 4, dummy, dummy, 3, NULL), FLX_ERR_NO_DEVICE);
        CHECK_ST(flx_topk_gpu(dummy, 3, 3, 4, kk, kk, NULL), FLX_ERR_NO_DEVICE);
        CHECK_ST(flx_attn_merge_gpu(4, 64, dummy, dummy, dummy, dummy, dummy, dummy, NULL), FLX_ERR_NO_DEVICE);
        CHECK_ST(flx_attn_host_gpu_ws_init(&ws, &s, dummy, d2, dummy, h2), FLX_ERR_NO_DEVICE);
    }
}

static flx_kv_store_h make_store(const flx_model_config_t *c, uint32_t flags)
{
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                              FLX_KV_STORE_FIELD_FLAGS,
                                .capacity_bytes = (size_t)16 << 20, .n_layers = c->n_layers,
                                .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads, .head_dim = c->head_dim,
                                .flags = flags};
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&kp, &s));
    return s;
}

/* (c) + (d) */
static void test_refusals(const flx_model_t *m)
{
    const int n_dev = flx_cuda_device_count();
    fprintf(stderr, "CUDA devices: %d\n", n_dev);
    flx_gpu_model_h gm = (flx_gpu_model_h)(uintptr_t)0x5a5a;
    flx_engine_params_t ep = flx_engine_params_default();
    CHECK(ep.use_gpu == 0 && ep.cuda_device == 0 && ep.gpu_model == NULL);
    ep.n_threads = 1;
    flx_engine_h e = (flx_engine_h)(uintptr_t)0x7777;
    void *p = (void *)(uintptr_t)0x3333;
    flx_cuda_stream_t stream = (flx_cuda_stream_t)(uintptr_t)0x4444;

    if (n_dev == 0) {
        CHECK_ST(flx_gpu_model_create(m, 0, &gm), FLX_ERR_NO_DEVICE);
        check_msg("no CUDA device");
        CHECK(gm == (flx_gpu_model_h)(uintptr_t)0x5a5a);
        CHECK_ST(flx_cuda_stream_create(0, &stream), FLX_ERR_NO_DEVICE);
        CHECK(stream == (flx_cuda_stream_t)(uintptr_t)0x4444);
        CHECK_ST(flx_cuda_host_alloc(4096, &p), FLX_ERR_NO_DEVICE);
        CHECK(p == (void *)(uintptr_t)0x3333);
        CHECK(!flx_cuda_host_is_pinned(&ep));
        /* WINDOW_DEVICE without a device falls back to host windows: the engine refuses on the
         * device first, with the way out in the message */
        flx_kv_store_h s = make_store(&m->cfg, FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE);
        ep.use_gpu = 1;
        CHECK_ST(flx_engine_create(m, s, &ep, &e), FLX_ERR_NO_DEVICE);
        check_msg("use_gpu asks for CUDA device 0 but there is none");
        check_msg("use_gpu 0");
        CHECK(e == (flx_engine_h)(uintptr_t)0x7777);
        ep.use_gpu = 0;
        CHECK_OK(flx_engine_create(m, s, &ep, &e));   /* the same store on the CPU path */
        flx_engine_destroy(e);
        flx_kv_store_destroy(s);
    } else {
        CHECK_ST(flx_gpu_model_create(m, n_dev, &gm), FLX_ERR_INVALID);
        check_msg("out of range");
        CHECK(gm == (flx_gpu_model_h)(uintptr_t)0x5a5a);
        CHECK_OK(flx_gpu_model_create(m, 0, &gm));
        flx_gpu_fwd_shape_t s = {.max_prompt = 4, .max_batch = 1};
        size_t db, hb;
        CHECK_OK(flx_gpu_fwd_plan(m, &s, &db, &hb));
        void *dmem, *hmem = malloc(hb);
        CHECK_OK(flx_cuda_malloc(0, db, &dmem));
        flx_gpu_fwd_ws_h ws = (flx_gpu_fwd_ws_h)(uintptr_t)0x6666;
        CHECK_ST(flx_gpu_fwd_ws_create(gm, &s, dmem, db, hmem, hb, &ws), FLX_ERR_INVALID);
        check_msg("not page-locked");
        CHECK(ws == (flx_gpu_fwd_ws_h)(uintptr_t)0x6666);
        free(hmem);
        CHECK_OK(flx_cuda_host_alloc(hb, &hmem));
        CHECK(flx_cuda_host_is_pinned(hmem));
        CHECK_ST(flx_gpu_fwd_ws_create(gm, &s, dmem, db - 300, hmem, hb, &ws), FLX_ERR_INVALID);
        check_msg("needed");
        CHECK_OK(flx_gpu_fwd_ws_create(gm, &s, dmem, db, hmem, hb, &ws));
        flx_gpu_fwd_ws_destroy(ws);
        flx_cuda_host_free(hmem);
        CHECK_OK(flx_cuda_free(0, dmem));
        /* a store keeping its windows on the host only */
        flx_kv_store_h st = make_store(&m->cfg, FLX_KV_STORE_HUGEPAGES);
        ep.use_gpu = 1;
        CHECK_ST(flx_engine_create(m, st, &ep, &e), FLX_ERR_INVALID);
        check_msg("FLX_KV_STORE_WINDOW_DEVICE");
        CHECK(e == (flx_engine_h)(uintptr_t)0x7777);
        flx_kv_store_destroy(st);
        /* device windows, but the arena not pinned: the GPU worker could not read KV through UVA */
        st = make_store(&m->cfg, FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE);
        CHECK_ST(flx_engine_create(m, st, &ep, &e), FLX_ERR_INVALID);
        check_msg("FLX_KV_STORE_PIN_CUDA");
        CHECK(e == (flx_engine_h)(uintptr_t)0x7777);
        flx_kv_store_destroy(st);
        flx_gpu_model_destroy(gm);
    }
    /* (d) */
    flx_kv_store_h s = make_store(&m->cfg, FLX_KV_STORE_HUGEPAGES);
    ep = flx_engine_params_default();
    e = (flx_engine_h)(uintptr_t)0x7777;
    ep.use_gpu = 2;
    CHECK_ST(flx_engine_create(m, s, &ep, &e), FLX_ERR_INVALID);
    check_msg("use_gpu 2");
    ep.use_gpu = 1, ep.cuda_device = -1;
    CHECK_ST(flx_engine_create(m, s, &ep, &e), FLX_ERR_INVALID);
    check_msg("cuda_device -1");
    ep.use_gpu = 0, ep.cuda_device = 0, ep.gpu_model = (flx_gpu_model_h)(uintptr_t)0x1234;
    CHECK_ST(flx_engine_create(m, s, &ep, &e), FLX_ERR_INVALID);
    check_msg("gpu_model given but use_gpu is 0");
    CHECK(e == (flx_engine_h)(uintptr_t)0x7777);
    flx_kv_session_id_t sid = 99;
    float lg[300];
    int32_t toks[3] = {1, 2, 3};
    CHECK_ST(flx_engine_prefill_gpu(NULL, NULL, NULL, s, toks, 3, 4, -1.0f, &sid, lg), FLX_ERR_INVALID);
    CHECK(sid == 99);
    flx_kv_store_destroy(s);
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_gpu_host"));
    flx_model_config_t c = small_cfg();
    flx_model_t *m;
    CHECK_OK(flx_model_init_random(&c, flx_rng_u64(&rng), &m));
    test_fwd_plan(m);
    test_window_plan_and_args();
    test_host_gpu_plan_and_args();
    test_refusals(m);
    flx_model_destroy(m);
    fprintf(stderr, "test_gpu_host: ok\n");
    return 0;
}
