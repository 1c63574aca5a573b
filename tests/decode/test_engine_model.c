/*
 * test_engine_model - the decode loop on the real model (SmolLM2-135M-Instruct, GGUF from the setup
 * cache; skipped with 77 when absent): a ~1000-token prompt (the numbers 1..250, so the host
 * segment of the kvstore holds ~700 tokens and the model has something to continue),
 *   (a) prefill into the store + FULL decode = a plain dense-cache decode through the same forward
 *       (tokens exactly; logits of the first step within 1e-3 RMS, later steps looser, see below)
 *       and every token is the argmax of the teacher-forced flx_model_prefill of prompt + tokens;
 *   (b) FIXED(16, bgt 1) = FULL (tokens, logit bits); FIXED(16, 0.05) runs and reads fewer host bytes.
 * The generated text is printed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx_test.h"

enum { NGEN = 8 };

typedef struct rec {
    int32_t tok[NGEN];
    float *logits;   /* (NGEN - 1, vocab) */
    uint32_t n, n_logits, vocab;
    flx_engine_finish_t why;
} rec_t;

static void on_logits(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab)
{
    rec_t *r = ctx;
    CHECK(r->n_logits < NGEN - 1);
    memcpy(r->logits + (size_t)r->n_logits++ * vocab, logits, vocab * sizeof *logits);
}

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    rec_t *r = ctx;
    CHECK(token >= 0 && r->n < NGEN);
    r->tok[r->n++] = token;
    if (is_last) r->why = why;
}

/* A plain dense KV cache for the reference decode: K, V fp32 (n_layers, Hkv, cap, D) holding the
 * bf16 values the kvstore holds (prefill K/V as pushed, decode k/v rounded to bf16). */
typedef struct dense {
    uint32_t L, Hkv, Hq, D, cap, n;   /* n: tokens held (all layers) */
    float *k, *v;
} dense_t;

static flx_status_t dense_on_layer(void *ctx, uint32_t layer, uint32_t n, const flx_bf16_t *k, const flx_bf16_t *v,
                                   const float *q_last)
{
    dense_t *d = ctx;
    for (uint32_t h = 0; h < d->Hkv; h++)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t x = 0; x < d->D; x++) {
                size_t dst = (((size_t)layer * d->Hkv + h) * d->cap + t) * d->D + x, src = ((size_t)h * n + t) * d->D + x;
                d->k[dst] = flx_bf16_to_f32(k[src]);
                d->v[dst] = flx_bf16_to_f32(v[src]);
            }
    if (layer == d->L - 1) d->n = n;
    return FLX_OK;
}

static flx_status_t dense_attn(void *ctx, uint32_t layer, uint32_t B, const float *q, const float *k, const float *v,
                               float *o)
{
    dense_t *d = ctx;
    const uint32_t T = d->n + 1, D = d->D, G = d->Hq / d->Hkv;
    for (uint32_t h = 0; h < d->Hkv; h++)
        for (uint32_t x = 0; x < D; x++) {
            size_t dst = (((size_t)layer * d->Hkv + h) * d->cap + d->n) * D + x;
            d->k[dst] = flx_bf16_to_f32(flx_f32_to_bf16(k[h * D + x]));
            d->v[dst] = flx_bf16_to_f32(flx_f32_to_bf16(v[h * D + x]));
        }
    double *s = malloc(T * sizeof *s);
    for (uint32_t hq = 0; hq < d->Hq; hq++) {
        const float *K = d->k + ((size_t)layer * d->Hkv + hq / G) * d->cap * D;
        const float *V = d->v + ((size_t)layer * d->Hkv + hq / G) * d->cap * D;
        double mx = -INFINITY, sum = 0, acc[256] = {0};
        for (uint32_t t = 0; t < T; t++) {
            double dot = 0;
            for (uint32_t x = 0; x < D; x++) dot += (double)q[hq * D + x] * K[(size_t)t * D + x];
            s[t] = dot / sqrt((double)D);
            mx = s[t] > mx ? s[t] : mx;
        }
        for (uint32_t t = 0; t < T; t++) {
            double p = exp(s[t] - mx);
            sum += p;
            for (uint32_t x = 0; x < D; x++) acc[x] += p * V[(size_t)t * D + x];
        }
        for (uint32_t x = 0; x < D; x++) o[hq * D + x] = (float)(acc[x] / sum);
    }
    free(s);
    if (layer == d->L - 1) d->n++;
    return FLX_OK;
}

int main(void)
{
    char path[1024];
    if (!flx_test_model_path("test_engine_model", path, sizeof path)) return FLX_TEST_SKIP;
    flx_model_t *m;
    flx_tok_h tok;
    CHECK_OK(flx_model_load(path, &m));
    CHECK_OK(flx_tok_load(path, &tok));
    const uint32_t V = m->cfg.vocab;

    char text[4096];
    size_t len = 0;
    for (int i = 1; i <= 250; i++) len += (size_t)snprintf(text + len, sizeof text - len, "%d, ", i);
    text[--len] = 0;   /* ends with "250," */
    size_t n_ids;
    int32_t *ids = malloc((2048 + NGEN) * sizeof *ids);
    CHECK_OK(flx_tok_encode(tok, text, len, 0, ids, 2048, &n_ids));
    const uint32_t n = (uint32_t)n_ids;

    flx_pool_h pool = flx_test_pool(2);
    flx_fwd_shape_t fs = {.max_prompt = n + NGEN, .max_batch = 1, .pool = pool};
    size_t pb;
    CHECK_OK(flx_fwd_plan(m, &fs, &pb));
    void *pmem = flx_aligned_alloc(64, pb);
    flx_fwd_ws_t *pws;
    CHECK_OK(flx_fwd_ws_init(m, &fs, pmem, pb, &pws));
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = (size_t)512 << 20, .n_layers = m->cfg.n_layers,
                                .n_kv_heads = m->cfg.n_kv_heads, .n_q_heads = m->cfg.n_heads,
                                .head_dim = m->cfg.head_dim};
    flx_kv_store_h store;
    CHECK_OK(flx_kv_store_create(&kp, &store));

    struct { flx_engine_attn_mode_t mode; float bgt; } modes[] = {
        {FLX_ENGINE_ATTN_FULL, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 0.05f}};
    rec_t r[3];
    uint64_t bytes[3];
    float *first = malloc(V * sizeof *first);
    for (int mi = 0; mi < 3; mi++) {
        flx_engine_params_t ep = flx_engine_params_default();
        ep.mode = modes[mi].mode;
        ep.blk = 16;
        ep.bgt = modes[mi].bgt;
        ep.max_batch = 1;
        ep.pool = pool;
        flx_engine_h e;
        CHECK_OK(flx_engine_create(m, store, &ep, &e));
        flx_kv_session_id_t sid;
        CHECK_OK(flx_engine_prefill_into_store(m, pws, store, ids, n, 32, &sid, first));
        memset(&r[mi], 0, sizeof r[mi]);
        r[mi].logits = malloc((size_t)(NGEN - 1) * V * sizeof(float));
        flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy(),
                               .on_token = on_token, .on_logits = on_logits, .ctx = &r[mi]};
        flx_engine_seq_id_t id;
        CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(first, V), &gp, &id));
        flx_kv_session_info_t si;
        CHECK_OK(flx_kv_session_info(store, sid, &si));
        CHECK(si.l_cpu > 0);
        flx_status_t st;
        while ((st = flx_engine_step(e)) == FLX_INPROGRESS) {}
        CHECK_OK(st);
        CHECK(r[mi].n == NGEN && r[mi].n_logits == NGEN - 1 && r[mi].why == FLX_FINISH_MAX_NEW);
        flx_engine_stats_t tot;
        flx_engine_total_stats(e, &tot);
        bytes[mi] = tot.host_bytes;
        char out[512];
        size_t ol;
        CHECK_OK(flx_tok_decode(tok, r[mi].tok, NGEN, FLX_TOK_SKIP_SPECIAL, out, sizeof out, &ol));
        fprintf(stderr, "%s(16, %g): prompt %u (host %u): \"...250,\" -> \"%s\"; TPOT %.1f ms, host bytes/step %.2f MiB\n",
                flx_engine_attn_mode_name(modes[mi].mode), (double)modes[mi].bgt, n, si.l_cpu, out,
                (double)tot.step_ns / tot.n_steps / 1e6, (double)tot.host_bytes / tot.n_steps / (1 << 20));
        flx_engine_destroy(e);
    }
    /* (a) FULL vs a plain dense-cache decode through the same forward (flx_model_decode with a
     * dense attention callback): the engine's kvstore window, views and attention task must not
     * change the logits beyond fp32-vs-double accumulation. */
    {
        dense_t d = {.L = m->cfg.n_layers, .Hkv = m->cfg.n_kv_heads, .Hq = m->cfg.n_heads, .D = m->cfg.head_dim,
                     .cap = n + NGEN};
        size_t nel = (size_t)d.L * d.Hkv * d.cap * d.D;
        d.k = malloc(nel * sizeof *d.k);
        d.v = malloc(nel * sizeof *d.v);
        CHECK(d.k && d.v);
        flx_prefill_args_t pa = {.tokens = ids, .n_tokens = n, .on_layer = dense_on_layer, .ctx = &d,
                                 .logits_last = first};
        CHECK_OK(flx_model_prefill(m, pws, &pa));
        CHECK((int32_t)flx_sample_argmax(first, V) == r[0].tok[0]);
        float *lg = malloc(V * sizeof *lg);
        for (uint32_t i = 1; i < NGEN; i++) {
            uint32_t pos = n + i - 1;
            flx_decode_args_t da = {.batch = 1, .tokens = &r[0].tok[i - 1], .pos = &pos, .attn = dense_attn,
                                    .ctx = &d, .logits = lg};
            CHECK_OK(flx_model_decode(m, pws, &da));
            CHECK((int32_t)flx_sample_argmax(lg, V) == r[0].tok[i]);
            double rms = 0;
            for (uint32_t j = 0; j < V; j++) rms += (double)lg[j] * lg[j];
            rms = sqrt(rms / V);
            /* Token 1: only the attention differs (fp32 kernels, q as a bf16 hi+lo pair on AVX-512, vs
             * double), held to 1e-3 RMS. From token 2 on, the fed token's k, v come from hidden states
             * that already differ by ~1e-4 relative, some round to the neighbouring bf16, and this
             * trained model's peaked copy heads amplify that over the steps (~1e-2 RMS by token 5):
             * held to 3e-2 RMS + 1e-2 relative, tokens exactly. A wrong head, position or block moves
             * logits by O(RMS). */
            char label[64];
            snprintf(label, sizeof label, "full vs dense-cache decode, token %u", i);
            double atol = i == 1 ? 1e-3 : 3e-2, rtol = i == 1 ? 1e-3 : 1e-2;
            CHECK_CLOSE(label, r[0].logits + (size_t)(i - 1) * V, lg, V, atol * rms, rtol);
        }
        free(lg);
        free(d.k);
        free(d.v);
    }
    /* ... and the tokens are the argmax of the teacher-forced prefill of prompt + tokens. The logits
     * are only reported: the decode step's k, v come from the GEMV and the prefill's from the GEMM,
     * and on this trained model (peaked copy heads) that difference grows over the steps to ~1e-2. */
    memcpy(ids + n, r[0].tok, (NGEN - 1) * sizeof *ids);
    float *all = malloc((size_t)(n + NGEN - 1) * V * sizeof *all);
    flx_prefill_args_t pa = {.tokens = ids, .n_tokens = n + NGEN - 1, .logits_all = all};
    CHECK_OK(flx_model_prefill(m, pws, &pa));
    for (uint32_t i = 0; i < NGEN; i++) {
        const float *ref = all + (size_t)(n - 1 + i) * V;
        CHECK((int32_t)flx_sample_argmax(ref, V) == r[0].tok[i]);
        if (i == 0) continue;
        double worst = 0;
        for (uint32_t j = 0; j < V; j++) worst = fmax(worst, fabs((double)r[0].logits[(size_t)(i - 1) * V + j] - ref[j]));
        fprintf(stderr, "teacher-forced prefill, token %u: same argmax, max |logit diff| %.2e\n", i, worst);
    }
    /* (b) FIXED budget 1 = FULL */
    CHECK(memcmp(r[1].tok, r[0].tok, sizeof r[0].tok) == 0);
    CHECK_SAME("fixed(16, 1) vs full", r[1].logits, r[0].logits, (size_t)(NGEN - 1) * V);   /* same chunks */
    CHECK(r[2].tok[0] == r[0].tok[0]);
    CHECK(bytes[2] * 2 < bytes[0]);
    for (int mi = 0; mi < 3; mi++) free(r[mi].logits);
    free(all);
    free(first);
    free(ids);
    flx_kv_store_destroy(store);
    flx_aligned_free(pmem);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    flx_pool_destroy(pool);
    fprintf(stderr, "test_engine_model: ok\n");
    return 0;
}
