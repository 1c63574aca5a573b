/*
 * test_engine_attn - the decode loop (flx/engine.h) over the real kvstore and attention task, with
 * a stand-in forward pass, so the engine's own logic is checked independently of the model:
 *
 *   The stand-in defines flx_fwd_plan / flx_fwd_ws_init / flx_model_prefill / flx_model_decode /
 *   flx_fwd_timing_get (this program compiles engine.c itself and does not link flx_model). Its
 *   "model": per (layer, head, token, position) a seeded bf16-exact random q, k, v; layer l's query
 *   is its random part plus the previous layer's attention output, and the logits are a fixed
 *   random projection of the last layer's output. So every layer's o feeds the tokens, and an
 *   attention error shows up in the next token.
 *
 *   The oracle is a dense double-precision attention over all positions (prompt + fed tokens),
 *   teacher-forced, independent of the kvstore, views and kernels.
 *
 * Checks: (a) prefill_into_store + FULL decode = dense reference (tokens, logits); (b) FIXED with
 * budget 1 at every blk = FULL, a small budget reads fewer host bytes; (c) continuous batching of
 * 4 sequences joining at different steps with max_batch 3 = each alone; (d) refusals; (e) a full
 * window ends its sequence with CAPACITY while the others continue; stop ids, eos, cancel, a session
 * closed under the engine (ERROR for its batch, the engine goes on), statistics.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/engine.h"
#include "flx/util.h"
#include "flx_test.h"

/* ---------------- the stand-in model ---------------- */

enum { NL = 2, HQ = 8, HKV = 2, GQ = HQ / HKV, DH = 64, VOC = 96 };

static float g_wout[VOC][HQ * DH];

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* kind 0 = q, 1 = k, 2 = v. bf16-exact values. */
static void rnd_vec(int kind, uint32_t layer, uint32_t head, int32_t tok, uint32_t pos, float *out)
{
    flx_rng_t r;
    flx_rng_seed(&r, mix(((uint64_t)kind << 60) ^ ((uint64_t)layer << 52) ^ ((uint64_t)head << 44) ^
                         ((uint64_t)(uint32_t)tok << 24) ^ pos));
    float bias = kind == 1 ? 0.3f * (float)((pos / 32) % 3) : 0.0f;   /* some blocks stand out */
    for (uint32_t d = 0; d < DH; d++)
        out[d] = flx_bf16_to_f32(flx_f32_to_bf16((float)flx_rng_normal(&r) + (d % 4 == 0 ? bias : 0.0f)));
}

static void project_logits(const float *o_last, float *logits)
{
    for (uint32_t j = 0; j < VOC; j++) {
        double acc = 0;
        for (uint32_t i = 0; i < HQ * DH; i++) acc += (double)g_wout[j][i] * o_last[i];
        logits[j] = (float)acc;
    }
}

struct flx_fwd_ws {
    uint32_t max_batch;
    float *q, *k, *v, *o; /* (max_batch, H*, D) */
};

static int g_decode_fail_at = -1;   /* make the n-th decode call fail (error-path test) */
static int g_decode_calls;
static float *g_rec_logits;          /* if set: row 0 logits of each decode call appended here */
static uint32_t g_rec_n;

flx_status_t flx_fwd_plan(const flx_model_t *m, const flx_fwd_shape_t *shape, size_t *ws_bytes_p)
{
    *ws_bytes_p = sizeof(struct flx_fwd_ws) + (size_t)shape->max_batch * (2 * HQ + 2 * HKV) * DH * sizeof(float) + 64;
    return FLX_OK;
}

flx_status_t flx_fwd_ws_init(const flx_model_t *m, const flx_fwd_shape_t *shape, void *mem, size_t bytes,
                             flx_fwd_ws_t **ws_p)
{
    struct flx_fwd_ws *w = mem;
    float *f = (float *)(w + 1);
    w->max_batch = shape->max_batch;
    w->q = f;
    w->o = f + (size_t)shape->max_batch * HQ * DH;
    w->k = w->o + (size_t)shape->max_batch * HQ * DH;
    w->v = w->k + (size_t)shape->max_batch * HKV * DH;
    *ws_p = w;
    return FLX_OK;
}

void flx_fwd_timing_get(const flx_fwd_ws_t *ws, flx_fwd_timing_t *timing_p)
{
    memset(timing_p, 0, sizeof *timing_p);
}

/* Dense oracle: logits after the last of seq[0..n) (positions 0..n-1), double precision. */
static void dense_logits(const int32_t *seq, uint32_t n, float *logits)
{
    float *K = malloc((size_t)n * DH * sizeof *K), *V = malloc((size_t)n * DH * sizeof *V);
    double *s = malloc(n * sizeof *s);
    float o_prev[HQ * DH] = {0}, o[HQ * DH];
    for (uint32_t l = 0; l < NL; l++) {
        for (uint32_t g = 0; g < HKV; g++) {
            for (uint32_t t = 0; t < n; t++) {
                rnd_vec(1, l, g, seq[t], t, K + (size_t)t * DH);
                rnd_vec(2, l, g, seq[t], t, V + (size_t)t * DH);
            }
            for (uint32_t hh = 0; hh < GQ; hh++) {
                uint32_t h = g * GQ + hh;
                float q[DH];
                rnd_vec(0, l, h, seq[n - 1], n - 1, q);
                for (uint32_t d = 0; d < DH; d++) q[d] += o_prev[h * DH + d];
                double mx = -INFINITY, sum = 0, acc[DH] = {0};
                for (uint32_t t = 0; t < n; t++) {
                    double dot = 0;
                    for (uint32_t d = 0; d < DH; d++) dot += (double)q[d] * K[(size_t)t * DH + d];
                    s[t] = dot / sqrt((double)DH);
                    mx = s[t] > mx ? s[t] : mx;
                }
                for (uint32_t t = 0; t < n; t++) {
                    double p = exp(s[t] - mx);
                    sum += p;
                    for (uint32_t d = 0; d < DH; d++) acc[d] += p * V[(size_t)t * DH + d];
                }
                for (uint32_t d = 0; d < DH; d++) o[h * DH + d] = (float)(acc[d] / sum);
            }
        }
        memcpy(o_prev, o, sizeof o);
    }
    project_logits(o_prev, logits);
    free(K);
    free(V);
    free(s);
}

flx_status_t flx_model_prefill(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_prefill_args_t *a)
{
    uint32_t n = a->n_tokens;
    flx_bf16_t *K = malloc((size_t)HKV * n * DH * 2), *V = malloc((size_t)HKV * n * DH * 2);
    float row[DH], qlast[HQ * DH] = {0};
    flx_status_t st = FLX_OK;
    for (uint32_t l = 0; l < NL && !st; l++) {
        for (uint32_t g = 0; g < HKV; g++)
            for (uint32_t t = 0; t < n; t++) {
                rnd_vec(1, l, g, a->tokens[t], t, row);
                flx_f32_to_bf16_row(row, K + ((size_t)g * n + t) * DH, DH);
                rnd_vec(2, l, g, a->tokens[t], t, row);
                flx_f32_to_bf16_row(row, V + ((size_t)g * n + t) * DH, DH);
            }
        if (a->on_layer) st = a->on_layer(a->ctx, l, n, K, V, qlast);
    }
    free(K);
    free(V);
    if (!st && a->logits_last) dense_logits(a->tokens, n, a->logits_last);
    return st;
}

flx_status_t flx_model_decode(const flx_model_t *m, flx_fwd_ws_t *ws, const flx_decode_args_t *a)
{
    if (g_decode_calls++ == g_decode_fail_at)
        return flx_error_set(FLX_ERR_INTERNAL, "stand-in forward: planned failure");
    const uint32_t B = a->batch;
    for (uint32_t b = 0; b < B; b++)
        for (uint32_t i = 0; i < HQ * DH; i++) ws->o[(size_t)b * HQ * DH + i] = 0.0f;
    for (uint32_t l = 0; l < NL; l++) {
        for (uint32_t b = 0; b < B; b++) {
            for (uint32_t h = 0; h < HQ; h++) {
                float *q = ws->q + ((size_t)b * HQ + h) * DH;
                rnd_vec(0, l, h, a->tokens[b], a->pos[b], q);
                for (uint32_t d = 0; d < DH; d++) q[d] += ws->o[((size_t)b * HQ + h) * DH + d];
            }
            for (uint32_t g = 0; g < HKV; g++) {
                rnd_vec(1, l, g, a->tokens[b], a->pos[b], ws->k + ((size_t)b * HKV + g) * DH);
                rnd_vec(2, l, g, a->tokens[b], a->pos[b], ws->v + ((size_t)b * HKV + g) * DH);
            }
        }
        /* NaN-fill o: the callee must write every element */
        for (size_t i = 0; i < (size_t)B * HQ * DH; i++) ws->o[i] = NAN;
        flx_status_t st = a->attn(a->ctx, l, B, ws->q, ws->k, ws->v, ws->o);
        if (st) return st;
    }
    for (uint32_t b = 0; b < B; b++) project_logits(ws->o + (size_t)b * HQ * DH, a->logits + (size_t)b * VOC);
    if (g_rec_logits) memcpy(g_rec_logits + (size_t)g_rec_n++ * VOC, a->logits, VOC * sizeof(float));
    return FLX_OK;
}

/* ---------------- helpers ---------------- */

static flx_model_t g_model;

static flx_kv_store_h make_store(uint32_t sink, uint32_t local)
{
    flx_kv_store_params_t p = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                             FLX_KV_STORE_FIELD_WINDOW,
                               .capacity_bytes = (size_t)96 << 20, .n_layers = NL, .n_kv_heads = HKV,
                               .n_q_heads = HQ, .head_dim = DH, .sink = sink, .local = local};
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

static flx_engine_h make_engine(flx_kv_store_h store, flx_engine_attn_mode_t mode, uint32_t blk, float bgt,
                                uint32_t max_batch, uint32_t max_seqs, int close)
{
    flx_engine_params_t p = flx_engine_params_default();
    p.mode = mode;
    p.blk = blk;
    p.bgt = bgt;
    p.max_batch = max_batch;
    p.max_seqs = max_seqs;
    p.n_threads = 2;
    p.close_sessions = close;
    p.bind_numa = 1;   /* one node here: the binding calls run and must succeed */
    flx_engine_h e;
    CHECK_OK(flx_engine_create(&g_model, store, &p, &e));
    return e;
}

typedef struct rec {
    flx_engine_seq_id_t id;
    int32_t tok[64];
    uint32_t n;
    int done;
    flx_engine_finish_t why;
} rec_t;

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    rec_t *r = ctx;
    CHECK(!r->done);
    CHECK(r->id == 0 || r->id == seq);
    CHECK(is_last ? why != FLX_FINISH_NONE : why == FLX_FINISH_NONE);
    if (token >= 0) {
        CHECK(token < VOC && r->n < 64);
        r->tok[r->n++] = token;
    }
    if (is_last) {
        r->done = 1;
        r->why = why;
    }
}

static int32_t *make_prompt(flx_rng_t *rng, uint32_t n)
{
    int32_t *p = malloc(n * sizeof *p);
    for (uint32_t i = 0; i < n; i++) p[i] = (int32_t)flx_rng_below(rng, VOC);
    return p;
}

static flx_fwd_ws_t *g_pws;

/* Prefill into the store and add with greedy sampling; returns the sequence id. */
static flx_engine_seq_id_t start(flx_engine_h e, flx_kv_store_h store, const int32_t *prompt, uint32_t n,
                                 uint32_t win_room, uint32_t max_new, rec_t *r, flx_kv_session_id_t *sid_out)
{
    float logits[VOC];
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, prompt, n, win_room, &sid, logits));
    flx_gen_params_t gp = {.max_new_tokens = max_new, .eos_id = -1, .sampling = flx_sampling_greedy(),
                           .on_token = on_token, .ctx = r};
    memset(r, 0, sizeof *r);
    flx_engine_seq_id_t id;
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(logits, VOC), &gp, &id));
    r->id = id;
    if (sid_out) *sid_out = sid;
    return id;
}

/* Dense greedy reference: n_gen tokens after prompt, and the logits that produced tokens 1..n_gen-1. */
static void reference(const int32_t *prompt, uint32_t n, uint32_t n_gen, int32_t *toks, float *logits_out)
{
    int32_t *seq = malloc((n + n_gen) * sizeof *seq);
    memcpy(seq, prompt, n * sizeof *seq);
    float lg[VOC];
    for (uint32_t i = 0; i < n_gen; i++) {
        dense_logits(seq, n + i, lg);
        if (i > 0 && logits_out) memcpy(logits_out + (size_t)(i - 1) * VOC, lg, sizeof lg);
        toks[i] = seq[n + i] = (int32_t)flx_sample_argmax(lg, VOC);
    }
    free(seq);
}

static void run_all(flx_engine_h e)
{
    flx_status_t st;
    int guard = 0;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) CHECK(++guard < 1000);
    CHECK_OK(st);
}

/* ---------------- tests ---------------- */

enum { NGEN = 10 };

/* (a) + (b): one sequence, FULL and FIXED(bgt 1) against the dense reference; FIXED small budget. */
static void test_single(flx_rng_t *rng)
{
    flx_kv_store_h store = make_store(64, 256);
    uint32_t n = 700 + (uint32_t)flx_rng_below(rng, 1300);
    int32_t *prompt = make_prompt(rng, n);
    int32_t ref[NGEN];
    float *ref_lg = malloc((size_t)NGEN * VOC * sizeof(float));
    reference(prompt, n, NGEN, ref, ref_lg);
    fprintf(stderr, "single: prompt %u, reference tokens:", n);
    for (int i = 0; i < NGEN; i++) fprintf(stderr, " %d", ref[i]);
    fprintf(stderr, "\n");

    struct { flx_engine_attn_mode_t mode; uint32_t blk; float bgt; } modes[] = {
        {FLX_ENGINE_ATTN_FULL, 16, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 16, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 32, 1.0f},
        {FLX_ENGINE_ATTN_FIXED, 64, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 128, 1.0f},
    };
    float *lg = malloc((size_t)NGEN * VOC * sizeof(float));
    uint64_t full_bytes = 0;
    for (size_t mi = 0; mi < FLX_ARRAY_SIZE(modes); mi++) {
        flx_engine_h e = make_engine(store, modes[mi].mode, modes[mi].blk, modes[mi].bgt, 4, 0, 1);
        rec_t r;
        start(e, store, prompt, n, 64, NGEN, &r, NULL);
        g_rec_logits = lg;
        g_rec_n = 0;
        run_all(e);
        g_rec_logits = NULL;
        CHECK(r.done && r.why == FLX_FINISH_MAX_NEW && r.n == NGEN);
        CHECK(g_rec_n == NGEN - 1);
        for (int i = 0; i < NGEN; i++)
            if (r.tok[i] != ref[i]) {
                fprintf(stderr, "mode %s blk %u: token %d is %d, reference %d\n",
                        flx_engine_attn_mode_name(modes[mi].mode), modes[mi].blk, i, r.tok[i], ref[i]);
                CHECK(r.tok[i] == ref[i]);
            }
        char label[64];
        snprintf(label, sizeof label, "logits %s blk %u", flx_engine_attn_mode_name(modes[mi].mode), modes[mi].blk);
        CHECK_CLOSE(label, lg, ref_lg, (size_t)(NGEN - 1) * VOC, 2e-4, 2e-3);
        flx_engine_stats_t tot;
        flx_engine_total_stats(e, &tot);
        CHECK(tot.n_steps == NGEN - 1 && tot.n_tokens == NGEN - 1);
        CHECK(tot.n_tasks == (uint64_t)(NGEN - 1) * NL * HKV);
        CHECK(tot.host_bytes > 0 && tot.step_ns > 0 && tot.attn_ns > 0);
        if (mi == 0) full_bytes = tot.host_bytes;
        flx_kv_store_info_t si;
        flx_kv_store_info(store, &si);
        CHECK(si.n_sessions == 0);   /* close_sessions: the retired sequence closed its session */
        flx_engine_destroy(e);
    }
    /* FIXED with a small budget: runs, reads far fewer host bytes than FULL. */
    {
        flx_engine_h e = make_engine(store, FLX_ENGINE_ATTN_FIXED, 16, 0.05f, 4, 0, 1);
        rec_t r;
        start(e, store, prompt, n, 64, NGEN, &r, NULL);
        run_all(e);
        CHECK(r.done && r.n == NGEN && r.tok[0] == ref[0]);
        flx_engine_stats_t tot;
        flx_engine_total_stats(e, &tot);
        fprintf(stderr, "host bytes: full %llu, fixed(16, 0.05) %llu\n", (unsigned long long)full_bytes,
                (unsigned long long)tot.host_bytes);
        CHECK(tot.host_bytes * 2 < full_bytes);   /* metadata (1/16) + the union of 4 heads x 5% */
        flx_engine_destroy(e);
    }
    free(lg);
    free(ref_lg);
    free(prompt);
    flx_kv_store_destroy(store);
}

/* (c) continuous batching: 4 sequences of different prompt lengths, max_batch 3, joining at
 * different steps; each gets exactly its solo (dense reference) tokens. A small store window
 * (sink 16, local 64) so a short prompt still has host tokens. */
static void test_batching(flx_rng_t *rng, flx_engine_attn_mode_t mode)
{
    enum { NS = 4 };
    flx_kv_store_h store = make_store(16, 64);
    uint32_t lens[NS] = {200 + (uint32_t)flx_rng_below(rng, 100), 700 + (uint32_t)flx_rng_below(rng, 300),
                         90 + (uint32_t)flx_rng_below(rng, 60), 1200 + (uint32_t)flx_rng_below(rng, 500)};
    uint32_t max_new[NS] = {NGEN, 6, NGEN, 8};
    uint32_t join_at[NS] = {0, 2, 3, 3};
    int32_t *prompts[NS], ref[NS][NGEN];
    for (int i = 0; i < NS; i++) {
        prompts[i] = make_prompt(rng, lens[i]);
        reference(prompts[i], lens[i], max_new[i], ref[i], NULL);
    }
    flx_engine_h e = make_engine(store, mode, 16, 1.0f, 3, NS, 0);
    rec_t r[NS];
    flx_kv_session_id_t sids[NS];
    uint32_t step = 0, joined = 0;
    for (;;) {
        for (int i = 0; i < NS; i++)
            if (join_at[i] == step) {
                start(e, store, prompts[i], lens[i], 32, max_new[i], &r[i], &sids[i]);
                joined++;
            }
        flx_status_t st = flx_engine_step(e);
        CHECK(st >= 0);
        flx_engine_stats_t last;
        flx_engine_last_stats(e, &last);
        CHECK(last.n_tokens <= 3);   /* never more than max_batch */
        step++;
        if (st == FLX_OK && joined == NS) break;
        CHECK(step < 100);
    }
    for (int i = 0; i < NS; i++) {
        CHECK(r[i].done && r[i].why == FLX_FINISH_MAX_NEW && r[i].n == max_new[i]);
        for (uint32_t t = 0; t < max_new[i]; t++)
            if (r[i].tok[t] != ref[i][t]) {
                fprintf(stderr, "batching (%s): sequence %d (prompt %u) token %u is %d, alone %d\n",
                        flx_engine_attn_mode_name(mode), i, lens[i], t, r[i].tok[t], ref[i][t]);
                CHECK(r[i].tok[t] == ref[i][t]);
            }
        /* close_sessions 0: the sessions are the caller's, still DECODING */
        flx_kv_session_info_t si;
        CHECK_OK(flx_kv_session_info(store, sids[i], &si));
        CHECK(si.state == FLX_KV_DECODING);
        CHECK_OK(flx_kv_session_close(store, sids[i]));
        free(prompts[i]);
    }
    fprintf(stderr, "batching (%s): %u steps, lengths %u %u %u %u ok\n", flx_engine_attn_mode_name(mode), step,
            lens[0], lens[1], lens[2], lens[3]);
    flx_engine_destroy(e);
    flx_kv_store_destroy(store);
}

/* (d) refusals. */
static void test_refusals(flx_rng_t *rng)
{
    flx_kv_store_h store = make_store(16, 64);
    flx_engine_params_t p = flx_engine_params_default();
    flx_engine_h e = (flx_engine_h)(uintptr_t)0x1;
    p.mode = FLX_ENGINE_ATTN_FLUXION;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_UNSUPPORTED);
    CHECK(strstr(flx_error_msg(), "fluxion"));
    CHECK(e == (flx_engine_h)(uintptr_t)0x1);
    p = flx_engine_params_default();
    p.mode = FLX_ENGINE_ATTN_FIXED;
    p.blk = 24;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    p.blk = 32;
    p.bgt = 1.5f;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    p.bgt = NAN;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    p = flx_engine_params_default();
    p.max_batch = 0;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    p.max_batch = 4;
    p.max_seqs = 2;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    p.max_seqs = 0;
    p.mode = (flx_engine_attn_mode_t)7;
    CHECK_ST(flx_engine_create(&g_model, store, &p, &e), FLX_ERR_INVALID);
    {   /* a store of another shape */
        flx_kv_store_params_t sp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                    .capacity_bytes = (size_t)8 << 20, .n_layers = NL, .n_kv_heads = HKV,
                                    .n_q_heads = HQ, .head_dim = 128};
        flx_kv_store_h other;
        CHECK_OK(flx_kv_store_create(&sp, &other));
        p = flx_engine_params_default();
        CHECK_ST(flx_engine_create(&g_model, other, &p, &e), FLX_ERR_INVALID);
        flx_kv_store_destroy(other);
    }
    flx_engine_attn_mode_t mode;
    CHECK_OK(flx_engine_attn_mode_parse("fixed", &mode));
    CHECK(mode == FLX_ENGINE_ATTN_FIXED);
    CHECK_ST(flx_engine_attn_mode_parse("sparse", &mode), FLX_ERR_INVALID);

    e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 2, 2, 1);
    uint32_t n = 150;
    int32_t *prompt = make_prompt(rng, n);
    float logits[VOC];
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, prompt, n, 8, &sid, logits));
    flx_gen_params_t good = {.max_new_tokens = 4, .eos_id = -1, .sampling = flx_sampling_greedy()};
    flx_engine_seq_id_t id = 777;
    int32_t stops[FLX_ENGINE_MAX_STOP + 1] = {0};
    flx_gen_params_t bad = good;
    bad.max_new_tokens = 0;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    bad = good;
    bad.n_stop = FLX_ENGINE_MAX_STOP + 1;
    bad.stop_ids = stops;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    bad = good;
    bad.n_stop = 2;
    bad.stop_ids = NULL;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    stops[1] = VOC;
    bad.stop_ids = stops;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "96"));
    bad = good;
    bad.eos_id = -2;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    bad = good;
    bad.sampling.temperature = -1.0f;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    bad = good;
    bad.sampling.temperature = 0.7f;
    bad.sampling.top_p = 0.0f;
    CHECK_ST(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID);
    CHECK_ST(flx_engine_add(e, sid, VOC, &good, &id), FLX_ERR_INVALID);
    CHECK_ST(flx_engine_add(e, sid, -1, &good, &id), FLX_ERR_INVALID);
    CHECK_ST(flx_engine_add(e, sid + 1000, 1, &good, &id), FLX_ERR_NOT_FOUND);
    CHECK(id == 777);
    CHECK(flx_engine_n_live(e) == 0);
    {   /* not READY: a session that never got its KV */
        flx_kv_session_params_t sp = {.prompt_len = 100, .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
        flx_kv_session_id_t raw;
        CHECK_OK(flx_kv_session_open(store, &sp, &raw));
        CHECK_ST(flx_engine_add(e, raw, 1, &good, &id), FLX_ERR_STATE);
        CHECK(strstr(flx_error_msg(), "RESERVED") || strstr(flx_error_msg(), "reserved"));
        CHECK_OK(flx_kv_session_close(store, raw));
        CHECK_ST(flx_engine_add(e, raw, 1, &good, &id), FLX_ERR_NOT_FOUND);   /* closed */
    }
    /* the session stayed READY through the refusals: now it is accepted, and a second add is refused */
    CHECK_OK(flx_engine_add(e, sid, 1, &good, &id));
    CHECK(id != 0 && id != 777);
    flx_engine_seq_id_t id2 = 0;
    CHECK_ST(flx_engine_add(e, sid, 1, &good, &id2), FLX_ERR_STATE);   /* DECODING */
    /* max_seqs */
    flx_kv_session_id_t sid2, sid3;
    CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, prompt, n, 8, &sid2, logits));
    CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, prompt, n, 8, &sid3, logits));
    CHECK_OK(flx_engine_add(e, sid2, 1, &good, &id2));
    flx_engine_seq_id_t id3 = 0;
    CHECK_ST(flx_engine_add(e, sid3, 1, &good, &id3), FLX_ERR_CAPACITY);
    /* cancel: token -1, is_last, CANCELED; then unknown */
    rec_t rc = {0};
    CHECK_OK(flx_engine_cancel(e, id2));
    CHECK_ST(flx_engine_cancel(e, id2), FLX_ERR_NOT_FOUND);
    flx_engine_seq_info_t info;
    CHECK_ST(flx_engine_seq_info(e, id2, &info), FLX_ERR_NOT_FOUND);
    CHECK_OK(flx_engine_seq_info(e, id, &info));
    CHECK(info.sid == sid && info.prompt_len == n && info.n_generated == 0 && info.last_token == -1);
    (void)rc;
    /* a host segment larger than the engine planned for */
    {
        flx_engine_params_t q = flx_engine_params_default();
        q.max_l_cpu = 16;
        flx_engine_h small;
        CHECK_OK(flx_engine_create(&g_model, store, &q, &small));
        CHECK_ST(flx_engine_add(small, sid3, 1, &good, &id3), FLX_ERR_CAPACITY);
        flx_engine_destroy(small);
    }
    flx_engine_destroy(e);   /* retires the live one, closes its session */
    flx_kv_session_info_t si;
    CHECK_ST(flx_kv_session_info(store, sid, &si), FLX_ERR_NOT_FOUND);
    CHECK_OK(flx_kv_session_close(store, sid3));
    flx_engine_destroy(NULL);
    free(prompt);
    flx_kv_store_destroy(store);
}

/* (e) a full window ends its sequence with CAPACITY; stop ids, eos, cancel-by-callback order, and a
 * session closed under the engine (ERROR for its batch only). */
static void test_endings(flx_rng_t *rng)
{
    flx_kv_store_h store = make_store(16, 64);
    uint32_t n0 = 300, n1 = 420;
    int32_t *p0 = make_prompt(rng, n0), *p1 = make_prompt(rng, n1);
    int32_t ref0[NGEN], ref1[NGEN];
    reference(p0, n0, NGEN, ref0, NULL);
    reference(p1, n1, NGEN, ref1, NULL);

    /* window room 3: tokens 0..3 delivered (3 fed), the 4th flagged CAPACITY; the other runs on */
    flx_engine_h e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 4, 0, 1);
    rec_t r0, r1;
    start(e, store, p0, n0, 3, NGEN, &r0, NULL);
    start(e, store, p1, n1, 64, NGEN, &r1, NULL);
    run_all(e);
    fprintf(stderr, "capacity: sequence 0 ended '%s' after %u tokens, sequence 1 '%s' after %u\n",
            flx_engine_finish_name(r0.why), r0.n, flx_engine_finish_name(r1.why), r1.n);
    CHECK(r0.done && r0.why == FLX_FINISH_CAPACITY && r0.n == 4);
    CHECK(r1.done && r1.why == FLX_FINISH_MAX_NEW && r1.n == NGEN);
    CHECK(memcmp(r0.tok, ref0, 4 * sizeof(int32_t)) == 0);
    CHECK(memcmp(r1.tok, ref1, NGEN * sizeof(int32_t)) == 0);
    flx_engine_destroy(e);

    /* stop id and eos: the sequence ends at the first occurrence, that token delivered */
    {
        int32_t stop = ref0[5];
        uint32_t first = 0;
        while (ref0[first] != stop) first++;
        for (int use_eos = 0; use_eos < 3; use_eos++) {
            e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 4, 0, 1);
            float logits[VOC];
            flx_kv_session_id_t sid;
            CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, p0, n0, 64, &sid, logits));
            int32_t other = (stop + 1) % VOC;
            int32_t stops[2] = {other, stop};
            flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy(),
                                   .on_token = on_token, .ctx = &r0};
            if (use_eos) {
                gp.eos_id = stop;
                gp.ignore_eos = use_eos == 2;
            } else {
                gp.stop_ids = stops + 1;
                gp.n_stop = 1;
            }
            memset(&r0, 0, sizeof r0);
            CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(logits, VOC), &gp, &r0.id));
            run_all(e);
            if (use_eos == 2) {
                CHECK(r0.why == FLX_FINISH_MAX_NEW && r0.n == NGEN);
            } else {
                CHECK(r0.why == (use_eos ? FLX_FINISH_EOS : FLX_FINISH_STOP));
                CHECK(r0.n == first + 1 && r0.tok[first] == stop);
            }
            flx_engine_destroy(e);
        }
    }

    /* a session closed by its owner mid-decode: that batch ends with ERROR, the engine continues */
    {
        e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 1, 2, 0);
        flx_kv_session_id_t s0, s1;
        start(e, store, p0, n0, 64, NGEN, &r0, &s0);
        start(e, store, p1, n1, 64, NGEN, &r1, &s1);
        CHECK_ST(flx_engine_step(e), FLX_INPROGRESS);   /* batch 1: sequence 0 only */
        CHECK(r0.n == 2 && r1.n == 1);
        CHECK_OK(flx_kv_session_close(store, s0));
        CHECK_ST(flx_engine_step(e), FLX_ERR_STATE);
        fprintf(stderr, "closed under the engine: %s\n", flx_error_msg());
        CHECK(r0.done && r0.why == FLX_FINISH_ERROR && r0.n == 2);
        CHECK(flx_engine_n_live(e) == 1);
        run_all(e);
        CHECK(r1.done && r1.why == FLX_FINISH_MAX_NEW && memcmp(r1.tok, ref1, NGEN * sizeof(int32_t)) == 0);
        CHECK_OK(flx_kv_session_close(store, s1));
        flx_engine_destroy(e);
    }
    /* a forward failure: every sequence of the batch ends with ERROR */
    {
        e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 4, 0, 1);
        start(e, store, p0, n0, 64, NGEN, &r0, NULL);
        start(e, store, p1, n1, 64, NGEN, &r1, NULL);
        g_decode_fail_at = g_decode_calls + 1;
        CHECK_ST(flx_engine_step(e), FLX_INPROGRESS);
        CHECK_ST(flx_engine_step(e), FLX_ERR_INTERNAL);
        g_decode_fail_at = -1;
        CHECK(r0.why == FLX_FINISH_ERROR && r1.why == FLX_FINISH_ERROR && r0.n == 2 && r1.n == 2);
        CHECK(flx_engine_n_live(e) == 0);
        CHECK_OK(flx_engine_step(e));
        flx_kv_store_info_t si;
        flx_kv_store_info(store, &si);
        CHECK(si.n_sessions == 0);
        flx_engine_destroy(e);
    }
    free(p0);
    free(p1);
    flx_kv_store_destroy(store);
}

/* Sampled (temperature) decoding: a seed replays the same tokens whatever the batch. */
static void test_seeded(flx_rng_t *rng)
{
    flx_kv_store_h store = make_store(16, 64);
    uint32_t n = 250;
    int32_t *p = make_prompt(rng, n);
    int32_t toks[2][NGEN];
    for (int run = 0; run < 2; run++) {
        flx_engine_h e = make_engine(store, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 4, 0, 1);
        float logits[VOC];
        rec_t r[2];
        for (int k = 0; k <= run; k++) {   /* run 1 adds a companion sequence with another seed */
            flx_kv_session_id_t sid;
            CHECK_OK(flx_engine_prefill_into_store(&g_model, g_pws, store, p, n, 64, &sid, logits));
            flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1,
                                   .sampling = {.temperature = 1.5f, .top_k = 20, .top_p = 0.95f, .seed = 42 + k},
                                   .on_token = on_token, .ctx = &r[k]};
            memset(&r[k], 0, sizeof r[k]);
            CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(logits, VOC), &gp, &r[k].id));
        }
        run_all(e);
        CHECK(r[0].n == NGEN);
        memcpy(toks[run], r[0].tok, sizeof toks[run]);
        flx_engine_destroy(e);
    }
    CHECK(memcmp(toks[0], toks[1], sizeof toks[0]) == 0);
    free(p);
    flx_kv_store_destroy(store);
}

int main(void)
{
    flx_rng_t rng;
    flx_rng_seed(&rng, flx_test_seed("test_engine_attn"));
    for (uint32_t j = 0; j < VOC; j++)
        for (uint32_t i = 0; i < HQ * DH; i++) g_wout[j][i] = (float)flx_rng_normal(&rng) * 0.5f;
    g_model.cfg = (flx_model_config_t){.arch = FLX_ARCH_LLAMA, .n_layers = NL, .hidden = HQ * DH, .n_heads = HQ,
                                       .n_kv_heads = HKV, .head_dim = DH, .ffn = 4 * HQ * DH, .vocab = VOC,
                                       .max_ctx = 4096, .rms_eps = 1e-5f, .rope_theta = 10000.0f};
    static uint8_t pmem[1 << 16];
    flx_fwd_shape_t ps = {.max_prompt = 4096, .max_batch = 1};
    CHECK_OK(flx_fwd_ws_init(&g_model, &ps, pmem, sizeof pmem, &g_pws));

    test_refusals(&rng);
    test_single(&rng);
    test_batching(&rng, FLX_ENGINE_ATTN_FULL);
    test_batching(&rng, FLX_ENGINE_ATTN_FIXED);
    test_endings(&rng);
    test_seeded(&rng);
    fprintf(stderr, "test_engine_attn: ok\n");
    return 0;
}
