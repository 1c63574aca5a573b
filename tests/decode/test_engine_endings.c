/*
 * test_engine_endings - the decode loop's refusals and endings with the real forward pass on a small
 * random model (flx_model_init_random: Llama, 2 layers, hidden 256, head_dim 64, GQA 4), over a
 * kvstore with sink 16 / local 64 so prompts of 300-420 tokens leave a non-empty host segment.
 * Complements test_engine (reference, FIXED = FULL, batching, CAPACITY):
 *
 *  (d) refusals of flx_engine_create / flx_engine_add: each status, and the error message names the
 *      offending value; a refused add leaves the session READY and the out-param untouched;
 *  (f) endings: a stop id and EOS end the sequence at the first occurrence (that token delivered),
 *      ignore_eos runs to max_new; cancel reports token -1, is_last, CANCELED; a session closed under
 *      the engine ends its step's batch with ERROR, the engine stays usable and the sequence that was
 *      not in that batch gets all its greedy tokens;
 *  (g) seeded sampling gives the same tokens whatever else is in the batch;
 *  (h) a prompt longer than the model's context: the prefill entry points, the forward plan and
 *      flx_engine_add refuse it naming both lengths, before a session is opened or a layer runs.
 * The stop id is taken from a greedy reference run of the same prompt, so the model does produce it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flx/engine.h"
#include "flx/forward.h"
#include "flx/model.h"
#include "flx/progress.h"
#include "flx_test.h"

enum { NGEN = 10, MAXP = 512 };

static flx_rng_t rng;
static flx_model_t *g_m;
static flx_fwd_ws_t *g_pws;
static uint32_t V;

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
        CHECK((uint32_t)token < V && r->n < 64);
        r->tok[r->n++] = token;
    }
    if (is_last) {
        r->done = 1;
        r->why = why;
    }
}

/* The status is the expected one and the message names the value. */
static void refused(flx_status_t st, flx_status_t want, const char *needle, const char *what)
{
    if (st != want || !strstr(flx_error_msg(), needle)) {
        fprintf(stderr, "%s: status %d (want %d), message '%s' (want '%s' in it)\n", what, (int)st, (int)want,
                flx_error_msg(), needle);
        CHECK(st == want && strstr(flx_error_msg(), needle));
    }
}

static flx_kv_store_h make_store(uint32_t head_dim)
{
    flx_kv_store_params_t p = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                             FLX_KV_STORE_FIELD_WINDOW,
                               .capacity_bytes = (size_t)96 << 20, .n_layers = g_m->cfg.n_layers,
                               .n_kv_heads = g_m->cfg.n_kv_heads, .n_q_heads = g_m->cfg.n_heads,
                               .head_dim = head_dim, .sink = 16, .local = 64};
    flx_kv_store_h s;
    CHECK_OK(flx_kv_store_create(&p, &s));
    return s;
}

static flx_engine_h make_engine(flx_kv_store_h store, uint32_t max_batch, uint32_t max_seqs, int close)
{
    flx_engine_params_t p = flx_engine_params_default();
    p.mode = FLX_ENGINE_ATTN_FULL;
    p.max_batch = max_batch;
    p.max_seqs = max_seqs;
    p.n_threads = 2;
    p.close_sessions = close;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(g_m, store, &p, &e));
    return e;
}

static int32_t *make_prompt(uint32_t n)
{
    int32_t *p = malloc(n * sizeof *p);
    for (uint32_t i = 0; i < n; i++) p[i] = (int32_t)flx_rng_below(&rng, V);
    return p;
}

static void run_all(flx_engine_h e)
{
    flx_status_t st;
    int guard = 0;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) CHECK(++guard < 1000);
    CHECK_OK(st);
}

/* Prefill into the store, add with gp (callbacks set here); first token = argmax of the prefill. */
static void start_gp(flx_engine_h e, flx_kv_store_h store, const int32_t *prompt, uint32_t n, flx_gen_params_t gp,
                     rec_t *r, flx_kv_session_id_t *sid_out)
{
    float *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, n, 64, &sid, lg));
    flx_kv_session_info_t si;
    CHECK_OK(flx_kv_session_info(store, sid, &si));
    CHECK(si.l_cpu > 0);   /* the host segment is exercised */
    gp.on_token = on_token;
    gp.ctx = r;
    memset(r, 0, sizeof *r);
    CHECK_OK(flx_engine_add(e, sid, (int32_t)flx_sample_argmax(lg, V), &gp, &r->id));
    if (sid_out) *sid_out = sid;
    free(lg);
}

static void start(flx_engine_h e, flx_kv_store_h store, const int32_t *prompt, uint32_t n, rec_t *r,
                  flx_kv_session_id_t *sid_out)
{
    flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy()};
    start_gp(e, store, prompt, n, gp, r, sid_out);
}

/* The greedy tokens of prompt alone (test_engine holds these to the teacher-forced reference). */
static void reference(flx_kv_store_h store, const int32_t *prompt, uint32_t n, int32_t *toks)
{
    flx_engine_h e = make_engine(store, 1, 0, 1);
    rec_t r;
    start(e, store, prompt, n, &r, NULL);
    run_all(e);
    CHECK(r.done && r.why == FLX_FINISH_MAX_NEW && r.n == NGEN);
    memcpy(toks, r.tok, NGEN * sizeof *toks);
    flx_engine_destroy(e);
}

/* (d) refusals */
static void test_refusals(void)
{
    flx_kv_store_h store = make_store(g_m->cfg.head_dim);
    flx_engine_params_t p = flx_engine_params_default();
    flx_engine_h e = (flx_engine_h)(uintptr_t)0x1;
    p.mode = FLX_ENGINE_ATTN_FLUXION;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "needs a predictor", "fluxion mode without a predictor");
    CHECK(e == (flx_engine_h)(uintptr_t)0x1);
    p = flx_engine_params_default();
    p.mode = FLX_ENGINE_ATTN_FIXED;
    p.blk = 24;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "blk 24", "blk");
    p.blk = 32;
    p.bgt = 1.5f;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "bgt 1.5", "bgt");
    p.bgt = NAN;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "nan", "bgt nan");
    p = flx_engine_params_default();
    p.max_batch = 0;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "max_batch 0", "max_batch");
    p.max_batch = 4;
    p.max_seqs = 2;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "max_seqs 2", "max_seqs");
    p.max_seqs = 0;
    p.mode = (flx_engine_attn_mode_t)7;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "mode 7", "mode");
    p = flx_engine_params_default();
    p.n_threads = 5000;
    refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "n_threads 5000", "n_threads");
    {   /* a lent pool is sized and placed by its creator */
        flx_pool_h lent = flx_test_pool(1);
        p = flx_engine_params_default();
        p.pool = lent, p.n_threads = 2;
        refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "with a lent pool", "n_threads with pool");
        p.n_threads = 0, p.bind_numa = 1;
        refused(flx_engine_create(g_m, store, &p, &e), FLX_ERR_INVALID, "bind_numa 1", "bind_numa with pool");
        flx_pool_destroy(lent);
    }
    {
        flx_kv_store_h other = make_store(2 * g_m->cfg.head_dim);
        p = flx_engine_params_default();
        char needle[32];
        snprintf(needle, sizeof needle, "head_dim %u)", 2 * g_m->cfg.head_dim);
        refused(flx_engine_create(g_m, other, &p, &e), FLX_ERR_INVALID, needle, "store shape");
        flx_kv_store_destroy(other);
    }
    CHECK(e == (flx_engine_h)(uintptr_t)0x1);
    {   /* the engine's own pool: n_threads workers, on the store's NUMA node with bind_numa */
        flx_kv_store_info_t si;
        flx_kv_store_info(store, &si);
        p = flx_engine_params_default();
        p.n_threads = 3, p.bind_numa = 1;
        CHECK_OK(flx_engine_create(g_m, store, &p, &e));
        flx_pool_info_t pi;
        flx_pool_info(flx_engine_pool(e), &pi);
        CHECK(pi.n_workers == 3 && pi.numa_node == si.numa_node);
        CHECK(strncmp(flx_pool_describe(flx_engine_pool(e)), "workers 3: requested", 20) == 0);
        flx_engine_destroy(e);
        CHECK(flx_engine_pool(NULL) == NULL);
    }

    e = make_engine(store, 2, 2, 1);
    uint32_t n = 200 + (uint32_t)flx_rng_below(&rng, 100);
    int32_t *prompt = make_prompt(n);
    float *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t sid;
    CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, n, 8, &sid, lg));
    flx_gen_params_t good = {.max_new_tokens = 4, .eos_id = -1, .sampling = flx_sampling_greedy()};
    flx_engine_seq_id_t id = 777;
    int32_t stops[FLX_ENGINE_MAX_STOP + 1] = {0};
    char needle[64];
    flx_gen_params_t bad = good;
    bad.max_new_tokens = 0;
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, "max_new_tokens 0", "max_new");
    bad = good;
    bad.n_stop = FLX_ENGINE_MAX_STOP + 1;
    bad.stop_ids = stops;
    snprintf(needle, sizeof needle, "%u stop ids", FLX_ENGINE_MAX_STOP + 1);
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, needle, "too many stop ids");
    bad = good;
    bad.n_stop = 2;
    bad.stop_ids = NULL;
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, "n_stop 2", "NULL stop ids");
    stops[1] = (int32_t)V;
    bad.stop_ids = stops;
    snprintf(needle, sizeof needle, "stop id %u", V);
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, needle, "stop id outside vocab");
    bad = good;
    bad.eos_id = -2;
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, "eos id -2", "eos");
    bad = good;
    bad.sampling.temperature = -1.0f;
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, "temperature -1", "temperature");
    bad = good;
    bad.sampling.temperature = 0.7f;
    bad.sampling.top_p = 0.0f;
    refused(flx_engine_add(e, sid, 1, &bad, &id), FLX_ERR_INVALID, "top_p 0", "top_p");
    snprintf(needle, sizeof needle, "first token %u", V);
    refused(flx_engine_add(e, sid, (int32_t)V, &good, &id), FLX_ERR_INVALID, needle, "first token V");
    refused(flx_engine_add(e, sid, -1, &good, &id), FLX_ERR_INVALID, "first token -1", "first token -1");
    snprintf(needle, sizeof needle, "%#llx", (unsigned long long)(sid + 1000));
    refused(flx_engine_add(e, sid + 1000, 1, &good, &id), FLX_ERR_NOT_FOUND, needle, "unknown session");
    CHECK(id == 777);
    CHECK(flx_engine_n_live(e) == 0);
    {   /* not READY: a session that never got its KV; then closed */
        flx_kv_session_params_t sp = {.prompt_len = 100, .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
        flx_kv_session_id_t raw;
        CHECK_OK(flx_kv_session_open(store, &sp, &raw));
        flx_status_t st = flx_engine_add(e, raw, 1, &good, &id);
        CHECK(st == FLX_ERR_STATE && (strstr(flx_error_msg(), "RESERVED") || strstr(flx_error_msg(), "reserved")));
        CHECK_OK(flx_kv_session_close(store, raw));
        snprintf(needle, sizeof needle, "%#llx", (unsigned long long)raw);
        refused(flx_engine_add(e, raw, 1, &good, &id), FLX_ERR_NOT_FOUND, needle, "closed session");
    }
    CHECK(id == 777);
    /* the session stayed READY through the refusals: accepted now; a second add sees it DECODING */
    CHECK_OK(flx_engine_add(e, sid, 1, &good, &id));
    CHECK(id != 0 && id != 777);
    flx_engine_seq_id_t id2 = 0;
    CHECK_ST(flx_engine_add(e, sid, 1, &good, &id2), FLX_ERR_STATE);
    CHECK(strstr(flx_error_msg(), "DECODING") || strstr(flx_error_msg(), "decoding"));
    /* max_seqs */
    flx_kv_session_id_t sid2, sid3;
    CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, n, 8, &sid2, lg));
    CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, n, 8, &sid3, lg));
    CHECK_OK(flx_engine_add(e, sid2, 1, &good, &id2));
    flx_engine_seq_id_t id3 = 0;
    refused(flx_engine_add(e, sid3, 1, &good, &id3), FLX_ERR_CAPACITY, "max_seqs 2", "max_seqs full");
    CHECK(id3 == 0);
    /* cancel without a callback, then unknown */
    CHECK_OK(flx_engine_cancel(e, id2));
    CHECK_ST(flx_engine_cancel(e, id2), FLX_ERR_NOT_FOUND);
    flx_engine_seq_info_t info;
    CHECK_ST(flx_engine_seq_info(e, id2, &info), FLX_ERR_NOT_FOUND);
    CHECK_OK(flx_engine_seq_info(e, id, &info));
    CHECK(info.sid == sid && info.prompt_len == n && info.n_generated == 0 && info.last_token == -1);
    /* a host segment larger than the engine planned for */
    {
        flx_kv_session_info_t si;
        CHECK_OK(flx_kv_session_info(store, sid3, &si));
        CHECK(si.l_cpu > 16);
        flx_engine_params_t q = flx_engine_params_default();
        q.max_l_cpu = 16;
        q.n_threads = 2;
        flx_engine_h small;
        CHECK_OK(flx_engine_create(g_m, store, &q, &small));
        snprintf(needle, sizeof needle, "%u host tokens", si.l_cpu);
        refused(flx_engine_add(small, sid3, 1, &good, &id3), FLX_ERR_CAPACITY, needle, "max_l_cpu");
        CHECK(strstr(flx_error_msg(), "max_l_cpu 16"));
        flx_engine_destroy(small);
    }
    flx_engine_destroy(e);   /* retires the live one, closes its session */
    flx_kv_session_info_t si;
    CHECK_ST(flx_kv_session_info(store, sid, &si), FLX_ERR_NOT_FOUND);
    CHECK_OK(flx_kv_session_close(store, sid3));
    flx_engine_destroy(NULL);
    free(lg);
    free(prompt);
    flx_kv_store_destroy(store);
    fprintf(stderr, "refusals: ok (prompt %u)\n", n);
}

/* (f) endings */
static void test_endings(void)
{
    flx_kv_store_h store = make_store(g_m->cfg.head_dim);
    uint32_t n0 = 300 + (uint32_t)flx_rng_below(&rng, 50), n1 = 400 + (uint32_t)flx_rng_below(&rng, 50);
    int32_t *p0 = make_prompt(n0), *p1 = make_prompt(n1);
    int32_t ref0[NGEN], ref1[NGEN];
    reference(store, p0, n0, ref0);
    reference(store, p1, n1, ref1);
    rec_t r0, r1;
    flx_engine_h e;

    /* stop id, eos, ignore_eos: the sequence ends at the first occurrence, that token delivered */
    {
        int32_t stop = ref0[5];
        uint32_t first = 0;
        while (ref0[first] != stop) first++;
        for (int use_eos = 0; use_eos < 3; use_eos++) {
            e = make_engine(store, 4, 0, 1);
            int32_t stops[2] = {(stop + 1) % (int32_t)V, stop};
            flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1, .sampling = flx_sampling_greedy()};
            if (use_eos) {
                gp.eos_id = stop;
                gp.ignore_eos = use_eos == 2;
            } else {
                gp.stop_ids = stops;
                gp.n_stop = 2;
            }
            start_gp(e, store, p0, n0, gp, &r0, NULL);
            run_all(e);
            if (use_eos == 2) {
                CHECK(r0.why == FLX_FINISH_MAX_NEW && r0.n == NGEN);
                CHECK(memcmp(r0.tok, ref0, sizeof ref0) == 0);
            } else {
                int ok = r0.why == (use_eos ? FLX_FINISH_EOS : FLX_FINISH_STOP);
                /* the companion stop id may come first */
                uint32_t f = first;
                if (!use_eos)
                    for (uint32_t i = 0; i < first; i++)
                        if (ref0[i] == stops[0]) { f = i; break; }
                if (!ok || r0.n != f + 1 || memcmp(r0.tok, ref0, (f + 1) * sizeof(int32_t)))
                    fprintf(stderr, "ending %d: why %s after %u tokens, want first occurrence at %u\n", use_eos,
                            flx_engine_finish_name(r0.why), r0.n, f);
                CHECK(ok && r0.n == f + 1 && memcmp(r0.tok, ref0, (f + 1) * sizeof(int32_t)) == 0);
            }
            flx_engine_destroy(e);
        }
        fprintf(stderr, "endings: stop id %d (first at token %u): stop, eos, ignore_eos ok\n", stop, first);
    }

    /* cancel of a live sequence: its callback gets token -1, is_last, CANCELED; the other runs on */
    {
        e = make_engine(store, 4, 0, 1);
        start(e, store, p0, n0, &r0, NULL);
        start(e, store, p1, n1, &r1, NULL);
        CHECK_ST(flx_engine_step(e), FLX_INPROGRESS);
        CHECK(r0.n == 2 && r1.n == 2);
        CHECK_OK(flx_engine_cancel(e, r0.id));
        CHECK(r0.done && r0.why == FLX_FINISH_CANCELED && r0.n == 2);
        CHECK_ST(flx_engine_cancel(e, r0.id), FLX_ERR_NOT_FOUND);
        CHECK(flx_engine_n_live(e) == 1);
        run_all(e);
        CHECK(r1.done && r1.why == FLX_FINISH_MAX_NEW && memcmp(r1.tok, ref1, sizeof ref1) == 0);
        flx_kv_store_info_t si;
        flx_kv_store_info(store, &si);
        CHECK(si.n_sessions == 0);
        flx_engine_destroy(e);
    }

    /* a session closed by its owner mid-decode: that batch ends with ERROR, the engine goes on and
     * the sequence that was not in that batch gets all its tokens */
    {
        e = make_engine(store, 1, 2, 0);
        flx_kv_session_id_t s0, s1;
        start(e, store, p0, n0, &r0, &s0);
        start(e, store, p1, n1, &r1, &s1);
        CHECK_ST(flx_engine_step(e), FLX_INPROGRESS);   /* batch 1: sequence 0 only */
        CHECK(r0.n == 2 && r1.n == 1);
        CHECK_OK(flx_kv_session_close(store, s0));
        flx_status_t st = flx_engine_step(e);
        fprintf(stderr, "closed under the engine: status %d, %s\n", (int)st, flx_error_msg());
        CHECK(st == FLX_ERR_STATE && strstr(flx_error_msg(), "CLOSED"));
        CHECK(r0.done && r0.why == FLX_FINISH_ERROR && r0.n == 2);
        CHECK(!r1.done && flx_engine_n_live(e) == 1);
        run_all(e);
        CHECK(r1.done && r1.why == FLX_FINISH_MAX_NEW && memcmp(r1.tok, ref1, sizeof ref1) == 0);
        CHECK_OK(flx_kv_session_close(store, s1));
        flx_engine_destroy(e);
    }
    free(p0);
    free(p1);
    flx_kv_store_destroy(store);
}

/* (g) seeded sampling: a seed replays the same tokens whatever else is in the batch */
static void test_seeded(void)
{
    flx_kv_store_h store = make_store(g_m->cfg.head_dim);
    uint32_t n = 250 + (uint32_t)flx_rng_below(&rng, 50);
    int32_t *p = make_prompt(n), *q = make_prompt(n + 37);
    int32_t toks[3][NGEN];
    for (int run = 0; run < 3; run++) {
        flx_engine_h e = make_engine(store, 4, 0, 1);
        rec_t r[3];
        /* run 0: alone; run 1: a companion with another seed; run 2: two companions, one joined first */
        int k0 = run == 2 ? 1 : 0;
        for (int k = 0; k <= run; k++) {
            int mine = k == k0;
            flx_gen_params_t gp = {.max_new_tokens = NGEN, .eos_id = -1,
                                   .sampling = {.temperature = 1.5f, .top_k = 20, .top_p = 0.95f,
                                                .seed = mine ? 42 : 1000 + (uint64_t)k}};
            start_gp(e, store, mine ? p : q, mine ? n : n + 37, gp, &r[k], NULL);
        }
        run_all(e);
        CHECK(r[k0].n == NGEN);
        memcpy(toks[run], r[k0].tok, sizeof toks[run]);
        flx_engine_destroy(e);
    }
    int differs_from_greedy = 0;
    int32_t greedy[NGEN];
    reference(store, p, n, greedy);
    for (int i = 1; i < NGEN; i++) differs_from_greedy |= toks[0][i] != greedy[i];
    CHECK(differs_from_greedy);   /* the sampling is really sampled at temperature 1.5 */
    CHECK(memcmp(toks[0], toks[1], sizeof toks[0]) == 0);
    CHECK(memcmp(toks[0], toks[2], sizeof toks[0]) == 0);
    fprintf(stderr, "seeded: same tokens alone and in batches of 2 and 3\n");
    free(p);
    free(q);
    flx_kv_store_destroy(store);
}

static void count_layers(void *ctx, const char *stage, uint64_t done, uint64_t total, const char *unit)
{
    (void)stage, (void)done, (void)total, (void)unit;
    ++*(int *)ctx;
}

/* (h) the same weights under a config whose context is 100 tokens */
static void test_context(void)
{
    flx_model_t sm = *g_m;   /* shares the weights; never destroyed */
    sm.cfg.max_ctx = 100;
    flx_kv_store_h store = make_store(g_m->cfg.head_dim);
    int32_t *prompt = make_prompt(150);
    float *lg = malloc(V * sizeof *lg);
    flx_kv_session_id_t sid = 12345;
    int layers_run = 0;
    flx_progress_observe(count_layers, &layers_run);
    refused(flx_engine_prefill_into_store(&sm, g_pws, store, prompt, 101, 8, &sid, lg), FLX_ERR_INVALID,
            "a prompt of 101 tokens is longer than the model's context of 100 tokens", "prefill into store");
    refused(flx_engine_prefill_with_stats(&sm, g_pws, store, prompt, 150, 8, 0.1f, &sid, lg), FLX_ERR_INVALID,
            "150 tokens is longer than the model's context of 100", "prefill with stats");
    flx_prefill_args_t pa = {.tokens = prompt, .n_tokens = 101, .logits_last = lg};
    refused(flx_model_prefill(&sm, g_pws, &pa), FLX_ERR_INVALID, "101 tokens is longer than the model's context of 100",
            "model prefill");
    flx_fwd_shape_t fs = {.max_prompt = 101, .max_batch = 1, .pool = NULL};
    size_t bytes = 7;
    refused(flx_fwd_plan(&sm, &fs, &bytes), FLX_ERR_INVALID, "max_prompt 101 tokens is longer than the model's context "
            "of 100", "plan");
    CHECK(bytes == 7 && sid == 12345 && layers_run == 0);
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    CHECK(si.n_sessions == 0);   /* refused before a session took memory */
    /* the context itself is accepted, and the prefill reports each layer */
    CHECK_OK(flx_engine_prefill_into_store(&sm, g_pws, store, prompt, 100, 8, &sid, lg));
    CHECK(layers_run == (int)g_m->cfg.n_layers);
    flx_progress_observe(NULL, NULL);
    CHECK_OK(flx_kv_session_close(store, sid));
    /* a session made by a prefill node for a longer context is refused by the engine */
    CHECK_OK(flx_engine_prefill_into_store(g_m, g_pws, store, prompt, 150, 8, &sid, lg));
    flx_engine_params_t p = flx_engine_params_default();
    p.n_threads = 1;
    flx_engine_h e;
    CHECK_OK(flx_engine_create(&sm, store, &p, &e));
    flx_gen_params_t good = {.max_new_tokens = 4, .eos_id = -1, .sampling = flx_sampling_greedy()};
    flx_engine_seq_id_t id = 777;
    refused(flx_engine_add(e, sid, 1, &good, &id), FLX_ERR_INVALID, "prompt of 150 tokens, longer than the model's "
            "context of 100", "engine add");
    CHECK(id == 777);
    flx_engine_destroy(e);
    CHECK_OK(flx_kv_session_close(store, sid));
    free(lg);
    free(prompt);
    flx_kv_store_destroy(store);
    fprintf(stderr, "context: ok\n");
}

int main(void)
{
    flx_rng_seed(&rng, flx_test_seed("test_engine_endings"));
    flx_model_config_t c = {.arch = FLX_ARCH_LLAMA, .n_layers = 2, .hidden = 256, .n_heads = 4, .n_kv_heads = 1,
                            .head_dim = 64, .ffn = 512, .vocab = 512, .max_ctx = 4096, .rms_eps = 1e-5f,
                            .rope_theta = 10000.0f};
    snprintf(c.name, sizeof c.name, "llama-2x256-d64-g4");
    CHECK_OK(flx_model_init_random(&c, flx_rng_u64(&rng), &g_m));
    V = c.vocab;
    flx_pool_h pool = flx_test_pool(2);
    flx_fwd_shape_t s = {.max_prompt = MAXP, .max_batch = 1, .pool = pool};
    size_t b;
    CHECK_OK(flx_fwd_plan(g_m, &s, &b));
    void *pmem = flx_aligned_alloc(64, b);
    CHECK(pmem);
    CHECK_OK(flx_fwd_ws_init(g_m, &s, pmem, b, &g_pws));
    test_refusals();
    test_endings();
    test_seeded();
    test_context();
    flx_aligned_free(pmem);
    flx_model_destroy(g_m);
    flx_pool_destroy(pool);
    fprintf(stderr, "test_engine_endings: ok\n");
    return 0;
}
