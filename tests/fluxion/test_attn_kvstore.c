/*
 * test_attn_kvstore - the attention task on views of the real kvstore: a one-layer store, a session
 * pushed in chunks, the store's own pyramid and window; FULL and SPARSE (budget 0 and 1 included)
 * against a dense softmax over the raw prompt arrays (window = first sink + last local tokens).
 * Also runs the kernels on a pool bound to the store's NUMA node, and addresses tasks by (session, layer,
 * kv group).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/kvstore.h"
#include "flx/util.h"
#include "flx_test.h"

enum { HKV = 2, HQ = 8, G = HQ / HKV, D = 64 };

static void oracle(const float *q, const float *K, const float *V, const uint32_t *tok, size_t n, float *o, float *lse)
{
    double m = -INFINITY, l = 0, acc[D] = {0};
    double *s = malloc((n + 1) * sizeof *s);
    for (size_t i = 0; i < n; i++) {
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * K[(size_t)tok[i] * D + d];
        s[i] = dot / sqrt((double)D);
        m = s[i] > m ? s[i] : m;
    }
    for (size_t i = 0; i < n; i++) {
        double p = exp(s[i] - m);
        l += p;
        for (int d = 0; d < D; d++) acc[d] += p * V[(size_t)tok[i] * D + d];
    }
    for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / l);
    *lse = (float)(m + log(l));
    free(s);
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_attn_kvstore"));
    uint32_t L = 700 + (uint32_t)flx_rng_below(&rng, 900);
    flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                              FLX_KV_STORE_FIELD_WINDOW,
                                .capacity_bytes = (size_t)64 << 20, .n_layers = 1, .n_kv_heads = HKV,
                                .n_q_heads = HQ, .head_dim = D, .sink = 64, .local = 256};
    flx_kv_store_h store;
    CHECK_OK(flx_kv_store_create(&sp, &store));
    flx_kv_session_params_t ssp = {.prompt_len = L, .max_new_tokens = 8, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(store, &ssp, &sid));
    /* raw prompt, bf16-exact, as (head, L, D) */
    size_t nel = (size_t)HKV * L * D;
    float *K = malloc(nel * 4), *V = malloc(nel * 4);
    flx_bf16_t *kb = malloc(nel * 2), *vb = malloc(nel * 2);
    for (size_t i = 0; i < nel; i++) {
        uint32_t pos = (uint32_t)((i / D) % L);
        K[i] = flx_bf16_to_f32(flx_f32_to_bf16((float)flx_rng_normal(&rng) + (float)((pos / 16 * 7919) % 101) / 25.0f));
        V[i] = flx_bf16_to_f32(flx_f32_to_bf16((float)flx_rng_normal(&rng)));
        kb[i] = flx_f32_to_bf16(K[i]);
        vb[i] = flx_f32_to_bf16(V[i]);
    }
    /* push in 256-token chunks of all heads: payload (heads, tokens, D) */
    flx_bf16_t *ck = malloc((size_t)HKV * 256 * D * 2), *cv = malloc((size_t)HKV * 256 * D * 2);
    for (uint32_t t0 = 0; t0 < L; t0 += 256) {
        uint32_t t1 = t0 + 256 < L ? t0 + 256 : L;
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t t = t0; t < t1; t++) {
                memcpy(ck + ((size_t)h * (t1 - t0) + (t - t0)) * D, kb + ((size_t)h * L + t) * D, D * 2);
                memcpy(cv + ((size_t)h * (t1 - t0) + (t - t0)) * D, vb + ((size_t)h * L + t) * D, D * 2);
            }
        flx_kv_chunk_t c = {.layer = 0, .head_begin = 0, .head_end = HKV, .tok_begin = t0, .tok_end = t1,
                            .dtype = FLX_DT_BF16, .head_dim = D};
        CHECK_OK(flx_kv_chunk_write(store, sid, &c, ck, cv));
    }
    flx_kv_session_info_t si;
    CHECK_OK(flx_kv_session_info(store, sid, &si));
    CHECK(si.state == FLX_KV_READY);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(store, sid, &sess));
    flx_kv_store_info_t info;
    flx_kv_store_info(store, &info);
    /* the workers run on the store's NUMA node, next to the KV they read */
    flx_pool_params_t pp = {.field_mask = FLX_POOL_FIELD_N_WORKERS | FLX_POOL_FIELD_NUMA_NODE, .n_workers = 2,
                            .numa_node = info.numa_node};
    flx_pool_h pool;
    CHECK_OK(flx_pool_create(&pp, &pool));
    flx_pool_info_t pi;
    flx_pool_info(pool, &pi);
    CHECK(pi.numa_node == info.numa_node);

    flx_attn_shape_t shape = {.group = G, .head_dim = D, .max_l_cpu = si.l_cpu, .pool = pool};
    size_t bytes;
    CHECK_OK(flx_attn_plan(&shape, &bytes));
    void *mem = malloc(bytes);
    flx_attn_ws_t ws;
    CHECK_OK(flx_attn_ws_init(&ws, &shape, mem, bytes));
    uint32_t *tok = malloc((size_t)(L + 1) * 4);
    float q[G * D], o[G * D], lse[G], o_or[G * D], lse_or[G];
    for (uint32_t g = 0; g < HKV; g++) {
        flx_kv_head_view_t view;
        CHECK_OK(flx_kv_head_view(sess, 0, g, &view));
        CHECK(view.l_cpu == si.l_cpu && view.n_win == si.n_sink + si.n_local);
        for (int i = 0; i < G * D; i++) q[i] = (float)flx_rng_normal(&rng);
        const float *Kh = K + (size_t)g * L * D, *Vh = V + (size_t)g * L * D;
        for (int mode = 0; mode < 2; mode++) {
            float bud[G] = {0.0f, 1.0f, 0.1f, 0.25f};
            flx_attn_cfg_t cfg = mode ? (flx_attn_cfg_t){.mode = FLX_ATTN_SPARSE, .blk = 32, .budgets = bud}
                                      : (flx_attn_cfg_t){.mode = FLX_ATTN_FULL};
            if (g == 0) CHECK_OK(flx_attn_group_run(&ws, &view, q, &cfg, o, lse, NULL));
            else CHECK_OK(flx_attn_session_run(&ws, sess, 0, g, q, &cfg, o, lse, NULL));
            for (uint32_t h = 0; h < G; h++) {
                size_t n = 0;
                for (uint32_t t = 0; t < si.n_sink; t++) tok[n++] = t;
                for (uint32_t t = L - si.n_local; t < L; t++) tok[n++] = t;
                if (mode == 0) {
                    for (uint32_t t = 0; t < si.l_cpu; t++) tok[n++] = si.n_sink + t;
                } else {
                    const uint32_t *sel = ws.sel + (size_t)h * ws.n_max;
                    for (uint32_t i = 0; i < ws.k[h]; i++)
                        for (uint32_t t = sel[i] * 32; t < (sel[i] + 1) * 32 && t < si.l_cpu; t++) tok[n++] = si.n_sink + t;
                    if (h == 0) CHECK(ws.k[h] == 0);
                    if (h == 1) CHECK(ws.k[h] == view.meta_n[1]);
                }
                oracle(q + h * D, Kh, Vh, tok, n, o_or + h * D, lse_or + h);
            }
            CHECK_CLOSE(mode ? "kvstore SPARSE o" : "kvstore FULL o", o, o_or, G * D, 3e-5, 2e-4);
            CHECK_CLOSE(mode ? "kvstore SPARSE lse" : "kvstore FULL lse", lse, lse_or, G, 1e-4, 1e-5);
        }
    }
    /* addressing errors name the value */
    flx_attn_cfg_t full = {.mode = FLX_ATTN_FULL};
    CHECK_ST(flx_attn_session_run(&ws, sess, 1, 0, q, &full, o, lse, NULL), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "layer 1") != NULL);
    CHECK_ST(flx_attn_session_run(&ws, sess, 0, HKV, q, &full, o, lse, NULL), FLX_ERR_INVALID);
    flx_kv_session_release(sess);
    CHECK_OK(flx_kv_session_close(store, sid));
    flx_kv_store_destroy(store);
    flx_pool_destroy(pool);
    free(K);
    free(V);
    free(kb);
    free(vb);
    free(ck);
    free(cv);
    free(tok);
    free(mem);
    fprintf(stderr, "test_attn_kvstore: ok (L %u, l_cpu %u)\n", L, si.l_cpu);
    return 0;
}
