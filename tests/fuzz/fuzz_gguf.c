/*
 * fuzz_gguf - a GGUF file through everything the product reads of it: flx_gguf_open and every
 * getter and array accessor on every key, every tensor's bytes, then the model loader
 * (flx_model_load_gguf, which flx_model_load dispatches GGUF files to) and the tokenizer loader
 * (flx_tok_load_gguf, likewise from flx_tok_load), with an encode/decode of a fixed text when the
 * vocabulary loads.
 */
#include "fuzz_util.h"

#include "flx/gguf.h"
#include "flx/model.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"

static void walk_array(const flx_gguf_array_t *a, int depth)
{
    for (uint64_t i = 0; i < a->n; i++) {
        const char *s;
        size_t len;
        int64_t v;
        float f;
        if (flx_gguf_arr_str(a, i, &s, &len) == FLX_OK) fuzz_touch(s, len);
        (void)flx_gguf_arr_int(a, i, &v);
        (void)flx_gguf_arr_f32(a, i, &f);
        const flx_gguf_array_t *sub = flx_gguf_arr_sub(a, i);
        if (sub) {
            FUZZ_CHECK(depth < 8);
            walk_array(sub, depth + 1);
        }
    }
    FUZZ_CHECK(flx_gguf_arr_sub(a, a->n) == NULL);
}

static void walk(flx_gguf_h h)
{
    for (size_t i = 0; i < flx_gguf_kv_count(h); i++) {
        const flx_gguf_kv_t *kv = flx_gguf_kv_at(h, i);
        FUZZ_CHECK(flx_gguf_find(h, kv->key) == kv);
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f;
        int b;
        const char *s;
        const flx_gguf_array_t *a;
        (void)flx_gguf_get_u32(h, kv->key, &u32);
        (void)flx_gguf_get_i32(h, kv->key, &i32);
        (void)flx_gguf_get_u64(h, kv->key, &u64);
        (void)flx_gguf_get_f32(h, kv->key, &f);
        (void)flx_gguf_get_bool(h, kv->key, &b);
        if (flx_gguf_get_str(h, kv->key, &s) == FLX_OK) fuzz_touch(s, kv->str_len + 1);
        if (flx_gguf_get_arr(h, kv->key, &a) == FLX_OK) walk_array(a, 0);
    }
    for (size_t i = 0; i < flx_gguf_tensor_count(h); i++) {
        const flx_gguf_tensor_t *t = flx_gguf_tensor_at(h, i);
        FUZZ_CHECK(flx_gguf_find_tensor(h, t->name) == t);
        fuzz_touch(t->data, t->nbytes);
    }
}

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_path(data, size);
    flx_gguf_h h = NULL;
    if (flx_gguf_open(path, &h) != FLX_OK) return 0;
    walk(h);
    flx_gguf_close(h);

    flx_model_t *m = NULL;
    if (flx_model_load_gguf(path, &m) == FLX_OK) {
        FUZZ_CHECK(flx_model_config_check(&m->cfg) == FLX_OK);
        fuzz_touch(m->tok_embd.p, m->cfg.vocab * flx_wmat_row_bytes(m->tok_embd.fmt, m->cfg.hidden));
        flx_model_destroy(m);
    }
    flx_tok_h tok = NULL;
    if (flx_tok_load_gguf(path, &tok) == FLX_OK) {
        static const char text[] = "What is 2+2? <|im_start|>café 123 it's\n\n";
        int32_t ids[256];
        size_t n = 0, len = 0;
        char out[1024];
        flx_status_t st = flx_tok_encode(tok, text, sizeof text - 1, 0, ids, 256, &n);
        if (st == FLX_OK) {
            for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < flx_tok_vocab_size(tok));
            (void)flx_tok_decode(tok, ids, n, 0, out, sizeof out, &len);
        }
        flx_tok_destroy(tok);
    }
    return 0;
}
