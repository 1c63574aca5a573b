/*
 * replay.h - replays the decode of one layer of a KV source (flx/kvsource.h: a real model's KV dump
 * or the synthetic workload) through the real kvstore, for the offline tools: label construction
 * (fluxion-label), the quality benchmark and calibration.
 *
 * DESIGN
 * A layer of the source is pushed into a one-layer store session exactly as a prefill node would:
 * K/V chunks, then the prefill statistics of flx_prefill_stats (so the features see what the
 * decode node sees), then READY -> DECODING. Decode step t (query at position L + t) appends the
 * generated tokens' K/V rows [L, L + t] to the window first, as the decode loop does. One layer at a
 * time keeps memory at one layer of KV (0.5 GiB for 128K tokens, 8 kv heads, D 128) twice (source
 * arrays + store) whatever the model depth.
 *
 * THREAD MODE: one thread drives a replay; the layer generation and the prefill statistics run on
 * r->pool (set by the caller after create; NULL: the driving thread alone).
 */
#ifndef FLX_REPLAY_H
#define FLX_REPLAY_H

#include "flx/features.h"
#include "flx/kvsource.h"
#include "flx/kvstore.h"

typedef struct flx_replay {
    flx_kvsrc_h src;            /* not owned */
    flx_kvsrc_shape_t shape;
    uint32_t sink, local;       /* store segments (64, 256) */
    float tau;                  /* for the prefill bgt* statistics */
    uint32_t layer;             /* source layer loaded (UINT32_MAX: none) */
    uint32_t n_steps_done;      /* window holds generated rows [L, L + n_steps_done) */
    flx_bf16_t *k, *v;          /* (Hkv, T, D) layer arrays */
    float *q;                   /* (Hq, n_steps + 1, D) */
    float *q_step;              /* (Hq, D) gathered queries of one step */
    flx_bf16_t *row_k, *row_v;  /* (Hkv, D) one generated token */
    flx_kv_store_h store;
    flx_kv_session_id_t sid;
    flx_kv_session_h sess;      /* acquired while a layer is loaded */
    flx_kv_session_info_t info;
    flx_kv_head_view_t *views;  /* (Hkv) refreshed by flx_replay_step */
    flx_pool_h pool;            /* borrowed; NULL after create */
} flx_replay_t;

flx_status_t flx_replay_create(flx_kvsrc_h src, float tau, flx_replay_t **r_p);
/* The same with extra flags for its store (FLX_KV_STORE_PIN_CUDA: views with UVA addresses for a
 * GPU worker; ignored without a device). */
flx_status_t flx_replay_create_flags(flx_kvsrc_h src, float tau, uint32_t store_flags, flx_replay_t **r_p);
void flx_replay_destroy(flx_replay_t *r);

/* Generates/reads source layer `layer`, pushes it into a fresh session with its statistics. */
flx_status_t flx_replay_load_layer(flx_replay_t *r, uint32_t layer);

/* Moves to decode step t (0 <= t < n_steps, not below the previous step): appends generated rows
 * up to and including position L + t, refreshes views, gathers the step's queries into q_step
 * (Hq, D). */
flx_status_t flx_replay_step(flx_replay_t *r, uint32_t t);

/* Features of the current step (feat (Hq, 41), optional window partials). ws: NULL for the scalar
 * window partials, or an attention workspace of the source's group and head_dim for the decode
 * loop's kernel path (then o_win and lse_win are required; flx_feat_layer_t.ws). */
flx_status_t flx_replay_features(flx_replay_t *r, float *feat, float *o_win, float *lse_win, flx_attn_ws_t *ws);

/* Opens "dump:PATH" or "synth:layers,q_heads,kv_heads,head_dim,prompt_len,steps[,seed[,share]]"
 * (the default synthetic profile, flx_synth_defaults, with an optional retrieval share). */
flx_status_t flx_replay_open_source(const char *spec, flx_kvsrc_h *src_p);

#endif
