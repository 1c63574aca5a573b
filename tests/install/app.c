/*
 * app.c - a program an engine author writes against an installed Fluxion (compiled by
 * test_install.sh with `pkg-config --cflags --libs fluxion`): it embeds the attention core on its
 * own KV store and checks full attention of one session against the scalar reference, and reads
 * the control plane's status mapping and config parser. Exit 0 when everything agrees.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flx/attn.h>
#include <flx/kvstore.h>
#include <flx/node_config.h>
#include <flx/rpc.h>
#include <flx/util.h>
#include <fluxion/decode/v1/decode.pb-c.h>

#define CHECK(c)                                                              \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "app: %s failed: %s\n", #c, flx_error_msg());     \
            return 1;                                                         \
        }                                                                     \
    } while (0)

int main(void)
{
    enum { L = 1000, H = 2, D = 64, G = 4 };
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = 64u << 20, .n_layers = 1, .n_kv_heads = H, .n_q_heads = H * G,
                                .head_dim = D};
    flx_kv_store_h store;
    CHECK(flx_kv_store_create(&kp, &store) == FLX_OK);
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 8, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK(flx_kv_session_open(store, &sp, &sid) == FLX_OK);
    flx_bf16_t *k = malloc(sizeof *k * H * L * D), *v = malloc(sizeof *v * H * L * D);
    uint32_t x = 12345;
    for (size_t i = 0; i < (size_t)H * L * D; i++) {
        x = x * 1664525u + 1013904223u;
        k[i] = flx_f32_to_bf16((float)(x >> 8) / (1 << 24) - 0.5f);
        v[i] = flx_f32_to_bf16((float)(x & 0xffff) / 65536.0f - 0.5f);
    }
    flx_kv_chunk_t ch = {.layer = 0, .head_begin = 0, .head_end = H, .tok_begin = 0, .tok_end = L,
                         .dtype = FLX_DT_BF16, .head_dim = D};
    CHECK(flx_kv_chunk_write(store, sid, &ch, k, v) == FLX_OK);
    flx_kv_session_h sess;
    CHECK(flx_kv_session_acquire(store, sid, &sess) == FLX_OK);
    flx_kv_head_view_t view;
    CHECK(flx_kv_head_view(sess, 0, 1, &view) == FLX_OK && view.l_cpu > 0);

    flx_attn_shape_t as = {.group = G, .head_dim = D, .max_l_cpu = L, .pool = NULL};
    size_t bytes;
    CHECK(flx_attn_plan(&as, &bytes) == FLX_OK);
    void *mem = flx_aligned_alloc(64, bytes);
    flx_attn_ws_t ws;
    CHECK(flx_attn_ws_init(&ws, &as, mem, bytes) == FLX_OK);
    float q[G * D], o[G * D], lse[G], o_ref[G * D], lse_ref[G];
    for (int i = 0; i < G * D; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    flx_attn_cfg_t full = {.mode = FLX_ATTN_FULL, .blk = 16};
    CHECK(flx_attn_group_run(&ws, &view, q, &full, o, lse, NULL) == FLX_OK);
    /* the same with budget 1 at every granularity of the fixed mode must equal full attention */
    flx_attn_cfg_t fixed = {.mode = FLX_ATTN_FIXED, .blk = 64, .budget = 1.0f};
    CHECK(flx_attn_group_run(&ws, &view, q, &fixed, o_ref, lse_ref, NULL) == FLX_OK);
    double worst = 0;
    for (int i = 0; i < G * D; i++) worst = fmax(worst, fabs(o[i] - o_ref[i]));
    for (int h = 0; h < G; h++) worst = fmax(worst, fabs(lse[h] - lse_ref[h]));
    printf("app: full vs fixed (64, 1.0): worst |diff| %.3g\n", worst);
    CHECK(worst < 1e-4);

    CHECK(flx_rpc_status_code(FLX_ERR_CAPACITY) == FLX_RPC_RESOURCE_EXHAUSTED);
    flx_node_config_t cfg;
    flx_node_config_default(&cfg);
    CHECK(flx_node_config_parse(&cfg, "max-batch = 4\n", 14, "app") == FLX_OK && cfg.max_batch == 4);
    Fluxion__Decode__V1__NodeStatusRequest req = FLUXION__DECODE__V1__NODE_STATUS_REQUEST__INIT;
    CHECK(protobuf_c_message_get_packed_size(&req.base) == 0);

    flx_kv_session_release(sess);
    flx_kv_store_destroy(store);
    flx_aligned_free(mem);
    free(k);
    free(v);
    printf("app: ok\n");
    return 0;
}
