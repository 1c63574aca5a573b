/*
 * test_prefill_model.c - the real model across processes (label model; 77 without the model):
 *   test_prefill_model FLX_PREFILL FLX_GENERATE DIR [shm|tcp]
 * Two flx-prefill processes prefill a real text (GPL-3 from the Debian common licenses, plus a
 * question; chat template) with SmolLM2-135M-Instruct and push its KV and statistics at once into
 * this process's node over real UCX. Then:
 *   - the received KV, statistics and pyramid are bit for bit those of the in-process prefill
 *     (flx_engine_prefill_with_stats) of the same text;
 *   - decoding one session with full attention (flx_engine_add with the committed first token,
 *     flx_engine_step) gives exactly flx-generate's text for the same prompt, and the same token
 *     ids as decoding the in-process session;
 *   - decoding the other with Fluxion (the shipped predictor) gives exactly flx-generate --mode
 *     fluxion's text.
 */
#include <stdio.h>

#include "flx/cli.h"
#include "flx/engine.h"
#include "flx/model_load.h"
#include "flx/predictor.h"
#include "flx/tokenizer.h"
#include "proc_util.h"
#include "tp_testutil.h"

#define MAX_NEW 16

typedef struct collect {
    int32_t ids[MAX_NEW + 1];
    uint32_t n;
    int done;
} collect_t;

static void on_token(void *ctx, flx_engine_seq_id_t seq, int32_t token, int is_last, flx_engine_finish_t why)
{
    collect_t *c = ctx;
    if (token >= 0 && c->n < MAX_NEW + 1) c->ids[c->n++] = token;
    if (is_last) c->done = 1;
}

/* Decodes READY session sid from first_token with the engine, as flx-generate does (greedy, the
 * tokenizer's end-of-generation ids stop it). */
static void decode(const flx_model_t *m, flx_tok_h tok, flx_kv_store_h store, flx_kv_session_id_t sid,
                   int32_t first_token, flx_engine_attn_mode_t mode, flx_predictor_h pred, collect_t *out)
{
    flx_kv_session_info_t ki;
    CHECK_OK(flx_kv_session_info(store, sid, &ki));
    flx_engine_params_t ep = flx_engine_params_default();
    ep.mode = mode;
    ep.n_threads = 2;
    ep.max_l_cpu = ki.l_cpu;
    ep.close_sessions = 0;
    flx_select_params_t sel;
    if (pred) {
        sel = flx_predictor_select_params(pred);
        ep.predictor = pred;
        ep.select = &sel;
    }
    flx_engine_h e;
    CHECK_OK(flx_engine_create(m, store, &ep, &e));
    int32_t stops[FLX_ENGINE_MAX_STOP];
    uint32_t n_stop = 0;
    for (uint32_t i = 0; i < flx_tok_vocab_size(tok) && n_stop < FLX_ENGINE_MAX_STOP; i++)
        if (flx_tok_is_eog(tok, (int32_t)i)) stops[n_stop++] = (int32_t)i;
    memset(out, 0, sizeof *out);
    flx_gen_params_t gp = {.max_new_tokens = MAX_NEW, .stop_ids = stops, .n_stop = n_stop, .eos_id = flx_tok_eos(tok),
                           .sampling = flx_sampling_greedy(), .on_token = on_token, .ctx = out};
    flx_engine_seq_id_t seq;
    CHECK_OK(flx_engine_add(e, sid, first_token, &gp, &seq));
    CHECK(flx_kv_session_info(store, sid, &ki) == FLX_OK && ki.state == FLX_KV_DECODING); /* the claim */
    flx_status_t st;
    while ((st = flx_engine_step(e)) == FLX_INPROGRESS) {}
    CHECK_OK(st);
    CHECK(out->done && out->n >= 1);
    flx_engine_destroy(e);
}

static const char *text_of(flx_tok_h tok, const collect_t *c)
{
    static char buf[8192];
    size_t len = 0;
    CHECK_OK(flx_tok_decode(tok, c->ids, c->n, FLX_TOK_SKIP_SPECIAL, buf, sizeof buf - 2, &len));
    buf[len] = '\n'; /* flx-generate ends its stream with a newline */
    buf[len + 1] = 0;
    return buf;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 4);
    const char *prefill = argv[1], *generate = argv[2], *dir = argv[3], *tls = argc > 4 ? argv[4] : "shm";
    char model[1024];
    if (!flx_test_model_path("test_prefill_model", model, sizeof model)) return FLX_TEST_SKIP;
    const flx_tp_err_mode_t em = tp_test_transport(tls);

    /* The prompt: a real text longer than the window (so the pyramid exists), and a question. */
    char prompt[1024];
    snprintf(prompt, sizeof prompt, "%s/model.prompt", dir);
    {
        FILE *in = fopen("/usr/share/common-licenses/GPL-3", "r"), *out = fopen(prompt, "w");
        CHECK(in && out);
        char buf[1600];
        size_t n = fread(buf, 1, sizeof buf, in);
        fwrite(buf, 1, n, out);
        fputs("\n\nQuestion: may I sell copies of a program under this license? Answer briefly.", out);
        fclose(in);
        fclose(out);
    }
    /* flx-generate's texts, full and Fluxion. */
    char want_full[8192], want_flux[8192];
    for (int flux = 0; flux < 2; flux++) {
        char out[1024], cmd[8192];
        snprintf(out, sizeof out, "%s/model.gen%d", dir, flux);
        snprintf(cmd, sizeof cmd, "%s --model %s --prompt-file %s --chat --max-new %d --threads 2%s >%s 2>%s.err",
                 generate, model, prompt, MAX_NEW, flux ? " --mode fluxion" : "", out, out);
        int r = system(cmd);
        CHECK(r != -1 && WIFEXITED(r) && WEXITSTATUS(r) == 0);
        proc_t p = {0};
        snprintf(p.log, sizeof p.log, "%s", out);
        snprintf(flux ? want_flux : want_full, 8192, "%s", proc_output(&p));
    }
    fprintf(stderr, "flx-generate full:    \"%s\"\nflx-generate fluxion: \"%s\"\n", want_full, want_flux);

    flx_model_t *m;
    flx_tok_h tok;
    CHECK_OK(flx_model_load(model, &m));
    CHECK_OK(flx_tok_load(model, &tok));
    const flx_model_config_t *cfg = &m->cfg;
    char *text;
    size_t text_len, n_ids;
    int32_t *ids;
    CHECK_OK(flx_cli_read_file(prompt, 1 << 20, &text, &text_len));
    CHECK_OK(flx_tok_encode_prompt(tok, text, text_len, 1, &ids, &n_ids));
    const uint32_t L = (uint32_t)n_ids;
    fprintf(stderr, "prompt: %u tokens\n", L);
    CHECK(L > 64 + 256 + 16); /* host-resident tokens exist: the pyramid is compared too */

    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE,
                                .capacity_bytes = 256u << 20, .n_layers = cfg->n_layers,
                                .n_kv_heads = cfg->n_kv_heads, .n_q_heads = cfg->n_heads, .head_dim = cfg->head_dim};
    flx_kv_store_h store, ref;
    CHECK_OK(flx_kv_store_create(&kp, &store));
    CHECK_OK(flx_kv_store_create(&kp, &ref));
    flx_tp_node_h node = tp_test_node(store, em, 30000, 1000);
    /* deadline and lease long enough for a loaded machine: the second session waits through the
     * first one's decode and the local reference before it is claimed */
    flx_tp_open_params_t op = {.field_mask = FLX_TP_OPEN_FIELD_TIMEOUT | FLX_TP_OPEN_FIELD_LEASE,
                               .lease_ms = 1800000, .n_layers = cfg->n_layers,
                               .n_kv_heads = cfg->n_kv_heads, .n_q_heads = cfg->n_heads, .head_dim = cfg->head_dim,
                               .vocab = cfg->vocab, .prompt_len = L, .max_new_tokens = MAX_NEW + 1,
                               .timeout_ms = 300000};
    flx_tp_session_desc_t d[2];
    proc_t p[2];
    for (int i = 0; i < 2; i++) CHECK_OK(flx_tp_session_open(node, &op, &d[i]));
    for (int i = 0; i < 2; i++) {
        char log[600];
        snprintf(log, sizeof log, "%s/model-prefill%d-%s.log", dir, i, tls);
        p[i] = prefill_start(prefill, log, &d[i], em, "--model", model, "--prompt-file", prompt, "--chat", "--threads",
                             "2", "--max-chunk-mib", "1", (const char *)NULL);
    }
    for (int i = 0; i < 2; i++) {
        int rc = proc_wait(&p[i], 300000);
        fprintf(stderr, "flx-prefill %d -> %d\n%s", i, rc, proc_output(&p[i]));
        CHECK(rc == 0);
    }
    flx_tp_session_info_t info[2];
    for (int i = 0; i < 2; i++) {
        CHECK_OK(flx_tp_session_wait(node, d[i].sid, 10000, &info[i]));
        CHECK(info[i].kv.state == FLX_KV_READY && info[i].kv.first_token >= 0);
    }
    CHECK(info[0].kv.first_token == info[1].kv.first_token);

    /* The in-process prefill of the same tokens: the reference bytes and the reference decode. */
    flx_pool_h fpool = flx_test_pool(2);
    flx_fwd_shape_t fs = {.max_prompt = L, .max_batch = 1, .pool = fpool};
    size_t pbytes;
    CHECK_OK(flx_fwd_plan(m, &fs, &pbytes));
    void *pmem = flx_aligned_alloc(64, pbytes);
    flx_fwd_ws_t *ws;
    CHECK(pmem);
    CHECK_OK(flx_fwd_ws_init(m, &fs, pmem, pbytes, &ws));
    float *logits = malloc((size_t)cfg->vocab * sizeof *logits);
    flx_kv_session_id_t local;
    CHECK_OK(flx_engine_prefill_with_stats(m, ws, ref, ids, L, MAX_NEW + 1, 0.1f, &local, logits));
    const int32_t local_first = (int32_t)flx_sample_argmax(logits, cfg->vocab);
    CHECK(local_first == info[0].kv.first_token);
    for (int i = 0; i < 2; i++) {
        uint32_t parts = tp_test_same_session(store, d[i].sid, ref, local);
        fprintf(stderr, "session %d: %u (layer, kv head) parts bit for bit equal to the local prefill\n", i, parts);
        CHECK(parts == cfg->n_layers * cfg->n_kv_heads);
    }

    collect_t got_full, got_local, got_flux;
    decode(m, tok, store, d[0].sid, info[0].kv.first_token, FLX_ENGINE_ATTN_FULL, NULL, &got_full);
    decode(m, tok, ref, local, local_first, FLX_ENGINE_ATTN_FULL, NULL, &got_local);
    CHECK(got_full.n == got_local.n && memcmp(got_full.ids, got_local.ids, got_full.n * sizeof(int32_t)) == 0);
    const char *t = text_of(tok, &got_full);
    fprintf(stderr, "over UCX, full:    \"%s\"\n", t);
    CHECK(strcmp(t, want_full) == 0);
    flx_predictor_h pred;
    CHECK_OK(flx_predictor_load(FLX_DEFAULT_PREDICTOR, &pred));
    decode(m, tok, store, d[1].sid, info[1].kv.first_token, FLX_ENGINE_ATTN_FLUXION, pred, &got_flux);
    t = text_of(tok, &got_flux);
    fprintf(stderr, "over UCX, fluxion: \"%s\"\n", t);
    CHECK(strcmp(t, want_flux) == 0);

    for (int i = 0; i < 2; i++) CHECK_OK(flx_tp_session_close(node, d[i].sid));
    CHECK_OK(flx_kv_session_close(ref, local));
    flx_tp_node_destroy(node);
    flx_predictor_destroy(pred);
    flx_kv_store_destroy(store);
    flx_kv_store_destroy(ref);
    free(logits);
    flx_aligned_free(pmem);
    flx_pool_destroy(fpool);
    free(ids);
    free(text);
    flx_tok_destroy(tok);
    flx_model_destroy(m);
    printf("test_prefill_model %s: ok\n", tls);
    return 0;
}
