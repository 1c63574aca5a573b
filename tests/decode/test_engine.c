/*
 * test_engine - the decode loop (flx/engine.h) with the real forward pass on random models
 * (flx_model_init_random: small Llama / Qwen2 shapes, head_dim 64 and 128, GQA 4), prompts long
 * enough that the kvstore's host segment is non-empty (sink 64, local 256, prompts 700-1500):
 *
 *  (a) flx_engine_prefill_into_store + FULL decode equals the plain reference: flx_model_prefill of
 *      prompt + generated tokens, teacher-forced logits_all: every step's logits within tolerance
 *      and every greedy token its argmax;
 *  (b) FIXED with budget 1 (blk 16 and 128) equals FULL: the same tokens and the same logit bits
 *      (the same blocks in the same chunks); FIXED (16, 0.05) runs and reads fewer host bytes;
 *  (c) continuous batching: 4 sequences of different prompt lengths joining at different steps,
 *      max_batch 3, each get exactly the tokens they get alone (greedy);
 *  (e) a session with a small window room ends with CAPACITY while the others continue;
 *  (f) prefill, FULL and FIXED decode steps of a batch of 3 with seeded sampling: the same tokens
 *      and logit bits on pools of 1, 2, 3 and 7 workers (`test_engine workers` runs only this, also
 *      under TSan).
 * Refusals (d), the other endings and seeded sampling are in test_engine_endings (same kind of
 * random model); a few refusals are repeated here.
 *
 * Tolerance: decode vs teacher-forced prefill, as test_forward holds it: 1e-3 x RMS(logits) + 1e-3
 * relative (the decode step's k, v come from the GEMV and are rounded to bf16 for the window; the
 * prefill's from the GEMM).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_testutil.h"
#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx_test.h"

enum { NGEN = 8, MAXP = 1600 + NGEN };

static flx_rng_t rng;
static flx_pool_h g_pool;   /* 2 workers */

typedef struct rec {
    int32_t tok[64];
    float *logits;          /* (NGEN - 1, vocab) when set: each decode step's logits */
    uint32_t n_logits;
    uint32_t n;
    int done;
    flx_engine_finish_t why;
} rec_t;

static void on_logits(void *ctx, flx_engine_seq_id_t seq, const float *logits, uint32_t vocab)
{
    rec_t *r = ctx;
    if (!r->logits) return;
    CHECK(r->n_logits < NGEN - 1);
    memcpy(r->logits + (size_t)r->n_logits++ * vocab, logits, vocab * sizeof *logits);
}

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    rec_t *r = ctx;
    CHECK(!r->done);
    if (token >= 0) {
        CHECK(r->n < 64);
        r->tok[r->n++] = token;
    }
    if (is_last) {
        r->done = 1;
        r->why = why;
    }
}

typedef struct fx {
    flx_model_t *m;
    flx_fwd_ws_t *pws;      /* prefill workspace, MAXP tokens */
    void *pmem;
    flx_kv_store_h store;
} fx_t;

static void fx_init(fx_t *f, const flx_model_config_t *c)
{
    CHECK_OK(flx_model_init_random(c, flx_rng_u64(&rng), &f->m));
    flx_fwd_shape_t s = {.max_prompt = MAXP, .max_batch = 1, .pool = g_pool};
    size_t b;
    CHECK_OK(flx_fwd_plan(f->m, &s, &b));
    f->pmem = flx_aligned_alloc(64, b);
    CHECK(f->pmem);
    CHECK_OK(flx_fwd_ws_init(f->m, &s, f->pmem, b, &f->pws));
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = (size_t)256 << 20, .n_layers = c->n_layers,
                                .n_kv_heads = c->n_kv_heads, .n_q_heads = c->n_heads, .head_dim = c->head_dim};
    CHECK_OK(flx_kv_store_create(&kp, &f->store));
}

static void fx_free(fx_t *f)
{
    flx_kv_store_destroy(f->store);
    flx_aligned_free(f->pmem);
    flx_model_destroy(f->m);
}

static flx_engine_h make_engine(fx_t *f, flx_engine_attn_mode_t mode, uint32_t blk, float bgt, uint32_t max_batch,
                                uint32_t max_seqs)
{
    flx_engine_params_t p = flx_engine_params_default();
    p.mode = mode;
    p.blk = blk;
    p.bgt = bgt;
    p.max_batch = max_batch;
    p.max_seqs = max_seqs;
    p.n_threads = 2;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(f->m, f->store, &p, &e));
    return e;
}

static int32_t *make_prompt(uint32_t n, uint32_t vocab)
{
    int32_t *p = malloc((n + NGEN) * sizeof *p);
    for (uint32_t i = 0; i < n; i++) p[i] = (int32_t)flx_rng_below(&rng, vocab);
    return p;
}

static void start(fx_t *f, flx_engine_h e, const int32_t *prompt, uint32_t n, uint32_t room, uint32_t max_new,
                  rec_t *r, float *logits_out)
{
    uint32_t V = f->m->cfg.vocab;
    float *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(f->m, f->pws, f->store, prompt, n, room, &sid, lg));
    flx_gen_params_t gp = {.max_new_tokens = max_new, .eos_id = -1, .sampling = flx_sampling_greedy(),
                           .on_token = on_token, .on_logits = on_logits, .ctx = r};
    memset(r, 0, sizeof *r);
    r->logits = logits_out;
    flx_engine_seq_id_t id;
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, V), &gp, &id));
    free(lg);
}

static void run_all(flx_engine_h e)
{
    flx_status_t st;
    int guard = 0;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) CHECK(++guard < 1000);
    CHECK_OK(st);
}

/* (a) The engine against teacher-forced prefill of prompt + its tokens: every token i is the argmax
 * of the reference logits at position n - 1 + i, and the engine's step logits (tokens 1..k-1) are
 * within 1e-3 RMS + 1e-3 relative of them. Returns the smallest top-1 / top-2 margin (in RMS). */
static double check_against_reference(fx_t *f, const int32_t *prompt, uint32_t n, const int32_t *toks, uint32_t k,
                                      const float *eng_logits, const char *label)
{
    uint32_t V = f->m->cfg.vocab, T = n + k - 1;
    int32_t *seq = malloc(T * sizeof *seq);
    memcpy(seq, prompt, n * sizeof *seq);
    memcpy(seq + n, toks, (k - 1) * sizeof *seq);
    float *all = malloc((size_t)T * V * sizeof *all);
    flx_prefill_args_t pa = {.tokens = seq, .n_tokens = T, .logits_all = all};
    CHECK_OK(flx_model_prefill(f->m, f->pws, &pa));
    double min_margin = INFINITY;
    for (uint32_t i = 0; i < k; i++) {
        const float *lg = all + (size_t)(n - 1 + i) * V;
        uint32_t am = flx_sample_argmax(lg, V);
        double rms = 0, second = -INFINITY;
        for (uint32_t j = 0; j < V; j++) {
            rms += (double)lg[j] * lg[j];
            if (j != am && lg[j] > second) second = lg[j];
        }
        rms = sqrt(rms / V);
        if (i > 0) {
            char l2[160];
            snprintf(l2, sizeof l2, "%s logits of token %u", label, i);
            CHECK_CLOSE(l2, eng_logits + (size_t)(i - 1) * V, lg, V, 1e-3 * rms, 1e-3);
        }
        double margin = (lg[am] - second) / rms;
        min_margin = margin < min_margin ? margin : min_margin;
        if ((int32_t)am != toks[i]) {
            fprintf(stderr, "%s: token %u is %d, reference argmax %u (logit %g vs %g, margin %.2e RMS)\n", label, i,
                    toks[i], am, (double)lg[toks[i]], (double)lg[am], margin);
            CHECK((int32_t)am == toks[i]);
        }
    }
    free(all);
    free(seq);
    return min_margin;
}

/* (a) + (b): FULL against the reference; FIXED budget 1 against FULL (tokens and logits); FIXED
 * (16, 0.05) reads fewer host bytes. */
static void test_single(const flx_model_config_t *c, const char *name)
{
    fx_t f;
    fx_init(&f, c);
    uint32_t n = 700 + (uint32_t)flx_rng_below(&rng, 800);
    int32_t *prompt = make_prompt(n, c->vocab);
    struct { flx_engine_attn_mode_t mode; uint32_t blk; float bgt; } modes[] = {
        {FLX_ENGINE_ATTN_FULL, 16, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 16, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 128, 1.0f},
        {FLX_ENGINE_ATTN_FIXED, 16, 0.05f},
    };
    int32_t full[NGEN];
    uint64_t full_bytes = 0;
    float *lg_full = malloc((size_t)NGEN * c->vocab * sizeof(float));
    float *lg = malloc((size_t)NGEN * c->vocab * sizeof(float));
    for (size_t mi = 0; mi < FLX_ARRAY_SIZE(modes); mi++) {
        flx_engine_h e = make_engine(&f, modes[mi].mode, modes[mi].blk, modes[mi].bgt, 2, 0);
        rec_t r;
        start(&f, e, prompt, n, 64, NGEN, &r, mi == 0 ? lg_full : lg);
        run_all(e);
        CHECK(r.done && r.why == FLX_FINISH_MAX_NEW && r.n == NGEN && r.n_logits == NGEN - 1);
        flx_engine_stats_t tot;
        flx_engine_total_stats(e, &tot);
        CHECK(tot.n_steps == NGEN - 1 && tot.n_tasks == (uint64_t)(NGEN - 1) * c->n_layers * c->n_kv_heads);
        CHECK(tot.dense_ns > 0 && tot.attn_ns > 0 && tot.host_bytes > 0);
        /* Quest metadata is read only where blocks are ranked: not at budget 1, part of the bytes else */
        if (modes[mi].bgt == 1.0f) CHECK(tot.host_meta_bytes == 0);
        else CHECK(tot.host_meta_bytes > 0 && tot.host_meta_bytes < tot.host_bytes);
        char label[96];
        snprintf(label, sizeof label, "%s %s(%u, %g) prompt %u", name, flx_engine_attn_mode_name(modes[mi].mode),
                 modes[mi].blk, (double)modes[mi].bgt, n);
        if (mi == 0) {
            double margin = check_against_reference(&f, prompt, n, r.tok, NGEN, lg_full, label);
            fprintf(stderr, "%s: tokens = teacher-forced argmax, smallest margin %.3f RMS\n", label, margin);
            memcpy(full, r.tok, sizeof full);
            full_bytes = tot.host_bytes;
        } else if (modes[mi].bgt == 1.0f) {
            for (int i = 0; i < NGEN; i++)
                if (r.tok[i] != full[i]) {
                    fprintf(stderr, "%s: token %d is %d, FULL gave %d\n", label, i, r.tok[i], full[i]);
                    CHECK(r.tok[i] == full[i]);
                }
            /* the same blocks in the same chunks: the same bits */
            CHECK_SAME(label, lg, lg_full, (size_t)(NGEN - 1) * c->vocab);
        } else {
            fprintf(stderr, "%s: host bytes %llu vs FULL %llu\n", label, (unsigned long long)tot.host_bytes,
                    (unsigned long long)full_bytes);
            CHECK(tot.host_bytes * 2 < full_bytes);
            CHECK(r.tok[0] == full[0]);   /* the first token comes from the prefill */
        }
        flx_engine_destroy(e);
    }
    flx_kv_store_info_t si;
    flx_kv_store_info(f.store, &si);
    CHECK(si.n_sessions == 0);   /* close_sessions: every retired sequence closed its session */
    free(lg);
    free(lg_full);
    free(prompt);
    fx_free(&f);
}

/* (c) + (e): 4 sequences joining at steps 0, 1, 3, 3 with max_batch 3 against each alone; then
 * one with window room 2 among them. */
static void test_batching(const flx_model_config_t *c, const char *name)
{
    enum { NS = 4 };
    fx_t f;
    fx_init(&f, c);
    uint32_t lens[NS] = {700 + (uint32_t)flx_rng_below(&rng, 200), 350 + (uint32_t)flx_rng_below(&rng, 100),
                         1000 + (uint32_t)flx_rng_below(&rng, 400), 20 + (uint32_t)flx_rng_below(&rng, 40)};
    uint32_t max_new[NS] = {NGEN, 5, NGEN, 6}, join_at[NS] = {0, 1, 3, 3};
    int32_t *prompts[NS];
    rec_t alone[NS], r[NS];
    for (int i = 0; i < NS; i++) {
        prompts[i] = make_prompt(lens[i], c->vocab);
        flx_engine_h e = make_engine(&f, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 1, 0);
        start(&f, e, prompts[i], lens[i], 32, max_new[i], &alone[i], NULL);
        run_all(e);
        CHECK(alone[i].n == max_new[i]);
        flx_engine_destroy(e);
    }
    for (int pass = 0; pass < 2; pass++) {
        /* pass 1: sequence 1 gets window room 2, so it ends after 3 tokens with CAPACITY */
        flx_engine_h e = make_engine(&f, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 3, NS);
        uint32_t step = 0, joined = 0;
        for (;;) {
            for (int i = 0; i < NS; i++)
                if (join_at[i] == step) {
                    start(&f, e, prompts[i], lens[i], pass && i == 1 ? 2 : 32, max_new[i], &r[i], NULL);
                    joined++;
                }
            flx_status_t st = flx_engine_step(e);
            CHECK(st >= 0);
            step++;
            if (st == FLX_OK && joined == NS) break;
            CHECK(step < 100);
        }
        for (int i = 0; i < NS; i++) {
            uint32_t want = pass && i == 1 ? 3 : max_new[i];
            CHECK(r[i].done && r[i].n == want);
            CHECK(r[i].why == (pass && i == 1 ? FLX_FINISH_CAPACITY : FLX_FINISH_MAX_NEW));
            for (uint32_t t = 0; t < want; t++)
                if (r[i].tok[t] != alone[i].tok[t]) {
                    fprintf(stderr, "%s batching pass %d: sequence %d (prompt %u) token %u is %d, alone %d\n", name,
                            pass, i, lens[i], t, r[i].tok[t], alone[i].tok[t]);
                    CHECK(r[i].tok[t] == alone[i].tok[t]);
                }
        }
        fprintf(stderr, "%s batching pass %d: %u steps, prompts %u %u %u %u: each = alone%s\n", name, pass, step,
                lens[0], lens[1], lens[2], lens[3], pass ? "; room-2 sequence ended with capacity after 3" : "");
        flx_engine_destroy(e);
    }
    /* refusals on a real model: a session that is not READY; gen params out of range */
    {
        flx_engine_h e = make_engine(&f, FLX_ENGINE_ATTN_FULL, 16, 1.0f, 1, 0);
        flx_kv_session_params_t sp = {.prompt_len = 64, .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
        flx_kv_session_id_t raw;
        CHECK_OK(flx_kv_session_open(f.store, &sp, &raw));
        flx_gen_params_t gp = {.max_new_tokens = 4, .eos_id = -1, .sampling = flx_sampling_greedy()};
        flx_engine_seq_id_t id;
        CHECK_ST(flx_engine_add(e, raw, 0, &gp, &id), FLX_ERR_STATE);
        gp.eos_id = (int32_t)c->vocab;
        CHECK_ST(flx_engine_add(e, raw, 0, &gp, &id), FLX_ERR_INVALID);
        CHECK_OK(flx_kv_session_close(f.store, raw));
        flx_engine_destroy(e);
    }
    for (int i = 0; i < NS; i++) free(prompts[i]);
    fx_free(&f);
}

/* (f) one run of 3 sequences (seeded sampling) on a pool, prefilled with ws (planned for that pool)
 * or, where pre is not NULL, landed from pre[3]: tokens (3, NGEN) and logits (3, NGEN - 1, V). */
static void run_on_pool(fx_t *f, flx_pool_h pool, flx_fwd_ws_t *ws, const flx_test_prefilled_t *pre,
                        flx_engine_attn_mode_t mode, uint32_t blk, float bgt, int32_t *const *prompts,
                        const uint32_t *lens, int32_t *tok, float *logits)
{
    const uint32_t V = f->m->cfg.vocab;
    flx_engine_params_t p = flx_engine_params_default();
    p.mode = mode, p.blk = blk, p.bgt = bgt, p.max_batch = 3, p.pool = pool;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(f->m, f->store, &p, &e));
    CHECK(flx_engine_pool(e) == pool);
    rec_t r[3];
    float *lg = malloc(V * sizeof *lg);
    for (int i = 0; i < 3; i++) {
        flx_kv_session_id_t sid;
        if (pre) sid = flx_test_prefilled_land(f->store, &pre[i], 64, lg);
        else CHECK_OK(flx_engine_prefill_into_store(f->m, ws, f->store, prompts[i], lens[i], 64, &sid, lg));
        flx_sampling_params_t sp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7 + (uint64_t)i};
        flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = sp, .on_token = on_token,
                               .on_logits = on_logits, .ctx = &r[i]};
        memset(&r[i], 0, sizeof r[i]);
        r[i].logits = logits + (size_t)i * (NGEN - 1) * V;
        flx_engine_seq_id_t id;
        CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, V), &gp, &id));
    }
    run_all(e);
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].n == NGEN && r[i].n_logits == NGEN - 1);
        memcpy(tok + i * NGEN, r[i].tok, NGEN * sizeof *tok);
    }
    flx_engine_destroy(e);
    free(lg);
}

/* On pools of 1, 2, 3 and 7 workers: each prompt's prefill (the forward pass on the pool) gives the
 * same bits, and every mode's decode the same tokens and logits. A prompt is prefilled once per pool
 * and landed into each mode's run (engine_testutil.h; under TSan the prefills were nearly all of
 * this test's time); the first run prefills into the store itself, so the landed copies are held
 * to that path too. */
static void test_workers(const flx_model_config_t *c, const char *name)
{
    fx_t f;
    fx_init(&f, c);
    /* the longest: 2 host chunks (>= 32 blocks each) and 2 window chunks late in the run */
    const uint32_t V = c->vocab, lens[3] = {600 + (uint32_t)flx_rng_below(&rng, 300), 400, 1300};
    int32_t *prompts[3];
    for (int i = 0; i < 3; i++) prompts[i] = make_prompt(lens[i], V);
    struct { flx_engine_attn_mode_t mode; uint32_t blk; float bgt; } modes[] = {
        {FLX_ENGINE_ATTN_FULL, 16, 1.0f}, {FLX_ENGINE_ATTN_FIXED, 16, 0.05f}, {FLX_ENGINE_ATTN_FIXED, 64, 0.3f}};
    enum { NM = FLX_ARRAY_SIZE(modes) };
    const size_t nl = (size_t)3 * (NGEN - 1) * V;
    float *lg_ref = malloc(NM * nl * sizeof(float)), *lg = malloc(nl * sizeof(float));
    int32_t tok_ref[NM][3 * NGEN], tok[3 * NGEN];
    flx_test_prefilled_t pre[4][3];
    for (int wi = 0; wi < 4; wi++) {
        flx_pool_h pool = flx_test_pool(FLX_TEST_WORKERS[wi]);
        flx_fwd_shape_t fs = {.max_prompt = MAXP, .max_batch = 1, .pool = pool};
        size_t b;
        CHECK_OK(flx_fwd_plan(f.m, &fs, &b));
        void *mem = flx_aligned_alloc(64, b);
        flx_fwd_ws_t *ws;
        CHECK_OK(flx_fwd_ws_init(f.m, &fs, mem, b, &ws));
        for (int i = 0; i < 3; i++) {
            flx_test_prefill_keep(f.m, ws, prompts[i], lens[i], -1.0f, 0, 0, &pre[wi][i]);
            if (wi && !flx_test_prefilled_same(&pre[wi][i], &pre[0][i])) {
                fprintf(stderr, "%s: prefill of prompt %d (%u tokens) on %u workers differs from 1\n", name, i,
                        lens[i], FLX_TEST_WORKERS[wi]);
                CHECK(0);
            }
        }
        for (int mi = 0; mi < NM; mi++) {
            run_on_pool(&f, pool, ws, wi || mi ? pre[wi] : NULL, modes[mi].mode, modes[mi].blk, modes[mi].bgt,
                        prompts, lens, wi ? tok : tok_ref[mi], wi ? lg : lg_ref + mi * nl);
            if (!wi) continue;
            char label[128];
            snprintf(label, sizeof label, "%s %s(%u, %g) on %u workers vs 1", name,
                     flx_engine_attn_mode_name(modes[mi].mode), modes[mi].blk, (double)modes[mi].bgt,
                     FLX_TEST_WORKERS[wi]);
            CHECK(memcmp(tok, tok_ref[mi], sizeof tok) == 0);
            CHECK_SAME(label, lg, lg_ref + mi * nl, nl);
        }
        flx_aligned_free(mem);
        flx_pool_destroy(pool);
    }
    fprintf(stderr, "%s: prefill, FULL and FIXED, batch 3, sampled: the same bits, tokens and logits at 1, 2, 3 "
                    "and 7 workers\n", name);
    for (int wi = 0; wi < 4; wi++)
        for (int i = 0; i < 3; i++) flx_test_prefilled_free(&pre[wi][i]);
    for (int i = 0; i < 3; i++) free(prompts[i]);
    free(lg_ref), free(lg);
    fx_free(&f);
}

int main(int argc, char **argv)
{
    flx_rng_seed(&rng, flx_test_seed("test_engine"));
    g_pool = flx_test_pool(2);
    flx_model_config_t a = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 256, .n_heads = 4, .n_kv_heads = 1,
                            .head_dim = 64, .ffn = 512, .vocab = 512, .max_ctx = 4096, .rms_eps = 1e-5f,
                            .rope_theta = 10000.0f};
    flx_model_config_t b = {.arch = FLX_ARCH_QWEN2, .n_layers = 3, .hidden = 192, .n_heads = 8, .n_kv_heads = 2,
                            .head_dim = 128, .ffn = 384, .vocab = 640, .max_ctx = 4096, .rms_eps = 1e-6f,
                            .rope_theta = 1000000.0f, .qkv_bias = 1};
    snprintf(a.name, sizeof a.name, "llama-2x256-d64-g4");
    snprintf(b.name, sizeof b.name, "qwen2-3x192-d128-g4");
    if (argc > 1 && !strcmp(argv[1], "workers")) {
        test_workers(&b, b.name);
        flx_pool_destroy(g_pool);
        fprintf(stderr, "test_engine workers: ok\n");
        return 0;
    }
    test_single(&a, a.name);
    test_single(&b, b.name);
    test_batching(&a, a.name);
    flx_pool_destroy(g_pool);
    fprintf(stderr, "test_engine: ok\n");
    return 0;
}
