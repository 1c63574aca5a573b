/*
 * replay.c - one layer of a KV source through the real kvstore (replay.h).
 */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

#include "flx/attn.h"
#include "flx/log.h"
#include "flx/synth.h"
#include "flx/util.h"

void flx_replay_destroy(flx_replay_t *r)
{
    if (!r) return;
    if (r->sess) flx_kv_session_release(r->sess);
    flx_kv_store_destroy(r->store);
    free(r->k);
    free(r->v);
    free(r->q);
    free(r->q_step);
    free(r->row_k);
    free(r->row_v);
    free(r->views);
    free(r);
}

flx_status_t flx_replay_create(flx_kvsrc_h src, float tau, flx_replay_t **r_p)
{
    return flx_replay_create_flags(src, tau, 0, r_p);
}

flx_status_t flx_replay_create_flags(flx_kvsrc_h src, float tau, uint32_t store_flags, flx_replay_t **r_p)
{
    if (!src || !r_p) return flx_error_set(FLX_ERR_INVALID, "replay: NULL argument");
    flx_replay_t *r = calloc(1, sizeof *r);
    if (!r) return flx_error_set(FLX_ERR_NOMEM, "replay: out of memory");
    r->src = src;
    flx_kvsrc_shape(src, &r->shape);
    r->sink = 64;
    r->local = 256;
    r->tau = tau;
    r->layer = UINT32_MAX;
    const flx_kvsrc_shape_t *s = &r->shape;
    size_t T = (size_t)s->prompt_len + s->n_steps, D = s->head_dim;
    r->k = malloc(s->n_kv_heads * T * D * sizeof(flx_bf16_t));
    r->v = malloc(s->n_kv_heads * T * D * sizeof(flx_bf16_t));
    r->q = malloc(s->n_q_heads * (s->n_steps + 1) * D * sizeof(float));
    r->q_step = malloc(s->n_q_heads * D * sizeof(float));
    r->row_k = malloc(s->n_kv_heads * D * sizeof(flx_bf16_t));
    r->row_v = malloc(s->n_kv_heads * D * sizeof(flx_bf16_t));
    r->views = calloc(s->n_kv_heads, sizeof *r->views);
    flx_status_t st;
    if (!r->k || !r->v || !r->q || !r->q_step || !r->row_k || !r->row_v || !r->views) {
        st = flx_error_set(FLX_ERR_NOMEM, "replay: out of memory for a layer of %zu tokens", T);
        goto fail;
    }
    /* Room for one session of one layer: its KV blocks, pyramid and window, with slack for the
     * store's side memory. */
    size_t kv = (size_t)s->n_kv_heads * (T + 16) * D * 2 * sizeof(flx_bf16_t);
    flx_kv_store_params_t sp = {
        .field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE | FLX_KV_STORE_FIELD_WINDOW |
                      FLX_KV_STORE_FIELD_FLAGS | FLX_KV_STORE_FIELD_MAX_SESSIONS,
        .capacity_bytes = kv + kv / 4 + (64u << 20),
        .n_layers = 1,
        .n_kv_heads = s->n_kv_heads,
        .n_q_heads = s->n_q_heads,
        .head_dim = s->head_dim,
        .sink = r->sink,
        .local = r->local,
        .flags = FLX_KV_STORE_HUGEPAGES | store_flags,
        .max_sessions = 2,
    };
    if ((st = flx_kv_store_create(&sp, &r->store))) goto fail;
    *r_p = r;
    return FLX_OK;
fail:
    flx_replay_destroy(r);
    return st;
}

flx_status_t flx_replay_load_layer(flx_replay_t *r, uint32_t layer)
{
    const flx_kvsrc_shape_t *s = &r->shape;
    if (layer >= s->n_layers)
        return flx_error_set(FLX_ERR_INVALID, "replay: layer %u out of range (n_layers %u)", layer, s->n_layers);
    if (r->sess) {
        flx_kv_session_release(r->sess);
        r->sess = NULL;
        flx_kv_session_close(r->store, r->sid);
    }
    r->layer = UINT32_MAX;
    flx_status_t st = flx_kvsrc_layer(r->src, layer, r->k, r->v, r->q, r->pool);
    if (st) return st;
    uint32_t L = s->prompt_len, T = s->prompt_len + s->n_steps, D = s->head_dim;
    flx_kv_session_params_t pp = {.prompt_len = L, .max_new_tokens = s->n_steps};
    if ((st = flx_kv_session_open(r->store, &pp, &r->sid))) return st;
    /* Chunks of one kv head and up to 4096 tokens, straight from the (Hkv, T, D) arrays. */
    for (uint32_t g = 0; g < s->n_kv_heads && !st; g++)
        for (uint32_t t0 = 0; t0 < L && !st; t0 += 4096) {
            uint32_t t1 = t0 + 4096 < L ? t0 + 4096 : L;
            flx_kv_chunk_t c = {.layer = 0, .head_begin = g, .head_end = g + 1, .tok_begin = t0, .tok_end = t1,
                                .dtype = FLX_DT_BF16, .head_dim = D};
            size_t off = ((size_t)g * T + t0) * D;
            st = flx_kv_chunk_write(r->store, r->sid, &c, r->k + off, r->v + off);
        }
    flx_head_stats_t *stats = NULL;
    float *mean_k = NULL, *qa = malloc((size_t)s->n_q_heads * D * sizeof(float));
    if (!st) {
        stats = malloc(s->n_q_heads * sizeof *stats);
        mean_k = malloc((size_t)s->n_q_heads * D * sizeof(float));
        if (!stats || !mean_k || !qa) st = flx_error_set(FLX_ERR_NOMEM, "replay: out of memory for statistics");
    }
    if (!st) {
        for (uint32_t h = 0; h < s->n_q_heads; h++)   /* row 0 of each head = q' */
            memcpy(qa + (size_t)h * D, r->q + (size_t)h * (s->n_steps + 1) * D, D * sizeof(float));
        flx_prefill_layer_t pl = {.n_q_heads = s->n_q_heads, .n_kv_heads = s->n_kv_heads, .head_dim = D,
                                  .prompt_len = L, .sink = r->sink, .local = r->local, .k = r->k, .v = r->v,
                                  .tok_stride = T, .q_anchor = qa, .tau = r->tau, .pool = r->pool};
        if (!(st = flx_prefill_stats(&pl, stats, mean_k, qa)))
            st = flx_kv_stats_write(r->store, r->sid, 0, stats, mean_k, qa);
    }
    free(stats);
    free(mean_k);
    free(qa);
    if (!st) st = flx_kv_session_begin_decode(r->store, r->sid);
    if (!st) st = flx_kv_session_info(r->store, r->sid, &r->info);
    if (!st) st = flx_kv_session_acquire(r->store, r->sid, &r->sess);
    if (st) {
        flx_kv_session_close(r->store, r->sid);
        return st;
    }
    r->layer = layer;
    r->n_steps_done = 0;
    return FLX_OK;
}

flx_status_t flx_replay_step(flx_replay_t *r, uint32_t t)
{
    const flx_kvsrc_shape_t *s = &r->shape;
    if (r->layer == UINT32_MAX) return flx_error_set(FLX_ERR_STATE, "replay: no layer loaded");
    if (t >= s->n_steps || t + 1 < r->n_steps_done)
        return flx_error_set(FLX_ERR_INVALID, "replay: step %u (steps %u, window already at %u)", t, s->n_steps,
                             r->n_steps_done);
    uint32_t L = s->prompt_len, T = L + s->n_steps, D = s->head_dim;
    flx_status_t st;
    while (r->n_steps_done <= t) {
        size_t pos = L + r->n_steps_done;
        for (uint32_t g = 0; g < s->n_kv_heads; g++) {
            memcpy(r->row_k + (size_t)g * D, r->k + ((size_t)g * T + pos) * D, D * sizeof(flx_bf16_t));
            memcpy(r->row_v + (size_t)g * D, r->v + ((size_t)g * T + pos) * D, D * sizeof(flx_bf16_t));
        }
        if ((st = flx_kv_window_append(r->sess, 0, r->row_k, r->row_v))) return st;
        r->n_steps_done++;
    }
    for (uint32_t g = 0; g < s->n_kv_heads; g++)
        if ((st = flx_kv_head_view(r->sess, 0, g, &r->views[g]))) return st;
    for (uint32_t h = 0; h < s->n_q_heads; h++)
        memcpy(r->q_step + (size_t)h * D, r->q + ((size_t)h * (s->n_steps + 1) + 1 + t) * D, D * sizeof(float));
    return FLX_OK;
}

flx_status_t flx_replay_features(flx_replay_t *r, float *feat, float *o_win, float *lse_win, flx_attn_ws_t *ws)
{
    if (r->layer == UINT32_MAX) return flx_error_set(FLX_ERR_STATE, "replay: no layer loaded");
    const flx_bf16_t *wk[FLX_ATTN_MAX_GROUP * 4], *wv[FLX_ATTN_MAX_GROUP * 4];
    if (r->shape.n_kv_heads > FLX_ATTN_MAX_GROUP * 4)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "replay: %u kv heads", r->shape.n_kv_heads);
    flx_feat_layer_t in;
    flx_status_t st = flx_features_layer_from_session(r->sess, 0, r->q_step, wk, wv, &in);
    if (st) return st;
    in.layer = r->layer;   /* the store holds one layer; the feature is the model's layer index */
    in.ws = ws;
    return flx_features_decode(&in, feat, o_win, lse_win);
}

flx_status_t flx_replay_open_source(const char *spec, flx_kvsrc_h *src_p)
{
    if (!spec || !src_p) return flx_error_set(FLX_ERR_INVALID, "source: NULL argument");
    if (!strncmp(spec, "dump:", 5)) return flx_kvsrc_open_dump(spec + 5, src_p);
    if (strncmp(spec, "synth:", 6))
        return flx_error_set(FLX_ERR_INVALID, "source '%s': expected dump:PATH or synth:...", spec);
    /* synth:layers,q_heads,kv_heads,head_dim,prompt_len,steps[,seed[,retrieval_share]] */
    uint64_t f[7] = {0, 0, 0, 0, 0, 0, 1};
    float share = -1.0f;
    const char *p = spec + 6;
    for (int i = 0; i < 8; i++) {
        char tok[64];
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof tok) {
            if (i >= 6 && *p == 0) break;
            return flx_error_set(FLX_ERR_INVALID, "source '%s': field %d empty or too long", spec, i + 1);
        }
        memcpy(tok, p, n);
        tok[n] = 0;
        if (i < 7) {
            flx_status_t st = flx_parse_u64(tok, 1, i == 6 ? UINT64_MAX : (1u << 22), &f[i]);
            if (st) return flx_error_set(st, "source '%s': field %d: %s", spec, i + 1, flx_error_msg());
        } else {
            char *end;
            share = strtof(tok, &end);
            if (*end || !(share >= 0.0f && share <= 1.0f))
                return flx_error_set(FLX_ERR_INVALID, "source '%s': retrieval share '%s' not in [0, 1]", spec, tok);
        }
        p += n;
        if (*p == ',') p++;
        else if (*p == 0) {
            if (i < 5) return flx_error_set(FLX_ERR_INVALID, "source '%s': needs at least 6 fields", spec);
            break;
        }
    }
    flx_synth_params_t sp;
    flx_synth_defaults(&sp, (uint32_t)f[0], (uint32_t)f[1], (uint32_t)f[2], (uint32_t)f[3], (uint32_t)f[4],
                       (uint32_t)f[5], f[6]);
    if (share >= 0.0f) sp.retrieval_share = share;
    flx_synth_t *syn;
    flx_status_t st = flx_synth_create(&sp, &syn);
    if (st) return st;
    if ((st = flx_kvsrc_from_synth(syn, src_p))) flx_synth_destroy(syn);
    return st;
}
