/*
 * save_gguf.c - writes a flx_model_t as a GGUF file with a byte-level vocabulary
 * (flx/model_load.h: flx_model_save_gguf), the inverse of load_gguf.c for generated test models.
 *
 * DESIGN
 * Tests and fuzz seeds need small GGUF files that flx-generate takes as a whole model, tokenizer
 * included, without any file from outside: flx-gen-ckpt --format gguf writes them through this. The
 * vocabulary is GPT-2's 256 byte tokens (the byte-to-unicode map every byte-level BPE starts from),
 * no merges, the control token <|endoftext|> as end of sequence and control tokens <|pad_N|> up to
 * the model's vocabulary (so every id the model can sample decodes), so any text encodes to one
 * token per byte: a prompt's length in tokens is its length in bytes (no BOS).
 * Layout as flx/gguf.h documents it: version 3, alignment 32, matrices as F32, F16 or BF16 with
 * ne = [in, out], norms and biases F32, Llama wq/wk rows permuted into llama.cpp's interleaved
 * RoPE layout (load_gguf.c un-permutes them), so a save and a load give the same weights.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/bf16.h"
#include "flx/gguf.h"
#include "flx/model_load.h"
#include "flx/util.h"
#include "model_internal.h"

#define ALIGN 32u
#define N_BYTE_TOKENS 256u

typedef struct out {
    FILE *f;
    int bad;
} out_t;

static void put(out_t *o, const void *p, size_t n)
{
    if (!o->bad && n && fwrite(p, 1, n, o->f) != n) o->bad = 1;
}
static void put_u32(out_t *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(out_t *o, uint64_t v) { put(o, &v, 8); }
static void put_str(out_t *o, const char *s)
{
    put_u64(o, strlen(s));
    put(o, s, strlen(s));
}
static void kv_u32(out_t *o, const char *k, uint32_t v)
{
    put_str(o, k), put_u32(o, FLX_GGUF_U32), put_u32(o, v);
}
static void kv_f32(out_t *o, const char *k, float v)
{
    put_str(o, k), put_u32(o, FLX_GGUF_F32), put(o, &v, 4);
}
static void kv_str(out_t *o, const char *k, const char *v)
{
    put_str(o, k), put_u32(o, FLX_GGUF_STRING), put_str(o, v);
}

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 + their rank; token b is that code point in UTF-8. */
static void byte_token(uint32_t b, char out[4])
{
    uint32_t cp = b, n = 0;
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (!printable) {
        for (uint32_t x = 0; x < b; x++)
            n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + n;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

typedef struct tensor {
    char name[64];
    uint32_t rows, cols;        /* (out, in); a vector has rows 1 */
    const flx_bf16_t *w;        /* bf16 matrix, or NULL */
    const float *v;             /* f32 vector, or NULL */
    uint32_t permute_hd;        /* Llama q/k: head_dim, else 0 */
    uint32_t type;              /* ggml type written */
    uint64_t offset, nbytes;
} tensor_t;

static uint32_t ggml_of(flx_dtype_t dt)
{
    return dt == FLX_DT_F32 ? FLX_GGML_F32 : dt == FLX_DT_F16 ? FLX_GGML_F16 : FLX_GGML_BF16;
}

static void add_mat(tensor_t *t, uint32_t *n, const char *name, const flx_bf16_t *w, uint32_t rows, uint32_t cols,
                    uint32_t permute_hd, uint32_t type)
{
    tensor_t *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->rows = rows, x->cols = cols, x->w = w, x->v = NULL, x->permute_hd = permute_hd, x->type = type;
    x->nbytes = (uint64_t)rows * cols * (type == FLX_GGML_F32 ? 4 : 2);
}

static void add_vec(tensor_t *t, uint32_t *n, const char *name, const float *v, uint32_t len)
{
    tensor_t *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->rows = 1, x->cols = len, x->w = NULL, x->v = v, x->permute_hd = 0, x->type = FLX_GGML_F32;
    x->nbytes = (uint64_t)len * 4;
}

/* One tensor's data, row by row (GGUF row r of a permuted matrix holds HF row src). */
static void write_data(out_t *o, const tensor_t *t, void *row)
{
    if (t->v) {
        put(o, t->v, (size_t)t->cols * 4);
        return;
    }
    for (uint32_t r = 0; r < t->rows; r++) {
        size_t src = r;
        if (t->permute_hd) {
            const uint32_t hd = t->permute_hd, h = r / hd, i = r % hd;
            src = (size_t)h * hd + (size_t)(i % 2) * (hd / 2) + i / 2;
        }
        const flx_bf16_t *w = t->w + src * t->cols;
        for (uint32_t c = 0; c < t->cols; c++) {
            if (t->type == FLX_GGML_F32) ((float *)row)[c] = flx_bf16_to_f32(w[c]);
            else if (t->type == FLX_GGML_F16) ((uint16_t *)row)[c] = flx_f32_to_f16(flx_bf16_to_f32(w[c]));
            else ((flx_bf16_t *)row)[c] = w[c];
        }
        put(o, row, (size_t)t->cols * (t->type == FLX_GGML_F32 ? 4 : 2));
    }
}

flx_status_t flx_model_save_gguf(const flx_model_t *m, const char *path, flx_dtype_t dtype)
{
    if (!m || !path) return flx_error_set(FLX_ERR_INVALID, "save gguf: NULL argument");
    const flx_model_config_t *c = &m->cfg;
    flx_status_t st = flx_model_config_check(c);
    if (st) return st;
    if ((st = flx_model_check_bf16(m, "save gguf")) != FLX_OK) return st;
    if (dtype != FLX_DT_BF16 && dtype != FLX_DT_F16 && dtype != FLX_DT_F32)
        return flx_error_set(FLX_ERR_INVALID, "save gguf: dtype %s (bf16, f16 or f32)", flx_dtype_name(dtype));
    if (c->rope_scaling != FLX_ROPE_NONE)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "save gguf: llama3 rope scaling is not written (use the Hugging "
                             "Face format)");
    if (c->vocab < N_BYTE_TOKENS + 1)
        return flx_error_set(FLX_ERR_INVALID, "save gguf: vocab %u, the byte-level vocabulary needs %u tokens",
                             c->vocab, N_BYTE_TOKENS + 1);
    const int llama = c->arch == FLX_ARCH_LLAMA;
    const char *arch = llama ? "llama" : "qwen2";
    const uint32_t H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    const uint32_t type = ggml_of(dtype), n_max = 3 + c->n_layers * 12;
    tensor_t *t = calloc(n_max, sizeof *t);
    void *row = malloc((size_t)FLX_MAX(FLX_MAX(H, qd), c->ffn) * 4);
    if (!t || !row) {
        free(t), free(row);
        return flx_error_set(FLX_ERR_NOMEM, "save gguf: %u tensors", n_max);
    }
    uint32_t n = 0;
    add_mat(t, &n, "token_embd.weight", m->tok_embd.p, c->vocab, H, 0, type);
    add_vec(t, &n, "output_norm.weight", m->out_norm, H);
    if (!c->tied_embeddings) add_mat(t, &n, "output.weight", m->lm_head.p, c->vocab, H, 0, type);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const flx_layer_weights_t *w = &m->layers[l];
        char k[64];
#define NAME(s) (snprintf(k, sizeof k, "blk.%u.%s", l, s), k)
        add_vec(t, &n, NAME("attn_norm.weight"), w->attn_norm, H);
        add_mat(t, &n, NAME("attn_q.weight"), w->wq.p, qd, H, llama ? c->head_dim : 0, type);
        add_mat(t, &n, NAME("attn_k.weight"), w->wk.p, kvd, H, llama ? c->head_dim : 0, type);
        add_mat(t, &n, NAME("attn_v.weight"), w->wv.p, kvd, H, 0, type);
        add_mat(t, &n, NAME("attn_output.weight"), w->wo.p, H, qd, 0, type);
        add_vec(t, &n, NAME("ffn_norm.weight"), w->ffn_norm, H);
        add_mat(t, &n, NAME("ffn_gate.weight"), w->w_gate.p, c->ffn, H, 0, type);
        add_mat(t, &n, NAME("ffn_up.weight"), w->w_up.p, c->ffn, H, 0, type);
        add_mat(t, &n, NAME("ffn_down.weight"), w->w_down.p, H, c->ffn, 0, type);
        if (c->qkv_bias) {
            add_vec(t, &n, NAME("attn_q.bias"), w->bq, qd);
            add_vec(t, &n, NAME("attn_k.bias"), w->bk, kvd);
            add_vec(t, &n, NAME("attn_v.bias"), w->bv, kvd);
        }
#undef NAME
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        t[i].offset = off;
        off = FLX_ALIGN_UP(off + t[i].nbytes, ALIGN);
    }

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(t), free(row);
        return flx_error_set(FLX_ERR_INVALID, "save gguf: path %s too long", path);
    }
    out_t o = {.f = fopen(tmp, "wb")};
    if (!o.f) {
        st = flx_error_set(flx_status_from_errno(errno), "file %s: cannot create: %s", tmp, strerror(errno));
        free(t), free(row);
        return st;
    }
    const uint32_t n_kv = 20;   /* the keys below */
    put(&o, "GGUF", 4);
    put_u32(&o, 3);
    put_u64(&o, n);
    put_u64(&o, n_kv);
    char k[96];
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    kv_str(&o, "general.architecture", arch);
    kv_str(&o, "general.name", c->name);
    kv_u32(&o, AK("block_count"), c->n_layers);
    kv_u32(&o, AK("context_length"), c->max_ctx);
    kv_u32(&o, AK("embedding_length"), H);
    kv_u32(&o, AK("feed_forward_length"), c->ffn);
    kv_u32(&o, AK("attention.head_count"), c->n_heads);
    kv_u32(&o, AK("attention.head_count_kv"), c->n_kv_heads);
    kv_u32(&o, AK("attention.key_length"), c->head_dim);
    kv_u32(&o, AK("attention.value_length"), c->head_dim);
    kv_u32(&o, AK("rope.dimension_count"), c->head_dim);
    kv_f32(&o, AK("attention.layer_norm_rms_epsilon"), c->rms_eps);
    kv_f32(&o, AK("rope.freq_base"), c->rope_theta);
    kv_u32(&o, AK("vocab_size"), c->vocab);
#undef AK
    kv_str(&o, "tokenizer.ggml.model", "gpt2");
    kv_str(&o, "tokenizer.ggml.pre", "gpt2");
    put_str(&o, "tokenizer.ggml.tokens");
    put_u32(&o, FLX_GGUF_ARRAY), put_u32(&o, FLX_GGUF_STRING), put_u64(&o, c->vocab);
    for (uint32_t b = 0; b < N_BYTE_TOKENS; b++) {
        char tok[4];
        byte_token(b, tok);
        put_str(&o, tok);
    }
    put_str(&o, "<|endoftext|>");
    for (uint32_t i = N_BYTE_TOKENS + 1; i < c->vocab; i++) {
        char tok[32];
        snprintf(tok, sizeof tok, "<|pad_%u|>", i);
        put_str(&o, tok);
    }
    put_str(&o, "tokenizer.ggml.token_type");   /* 1 normal (the bytes), 3 control */
    put_u32(&o, FLX_GGUF_ARRAY), put_u32(&o, FLX_GGUF_I32), put_u64(&o, c->vocab);
    for (uint32_t i = 0; i < c->vocab; i++) put_u32(&o, i < N_BYTE_TOKENS ? 1 : 3);
    put_str(&o, "tokenizer.ggml.merges");
    put_u32(&o, FLX_GGUF_ARRAY), put_u32(&o, FLX_GGUF_STRING), put_u64(&o, 0);
    kv_u32(&o, "tokenizer.ggml.eos_token_id", N_BYTE_TOKENS);
    for (uint32_t i = 0; i < n; i++) {
        put_str(&o, t[i].name);
        put_u32(&o, t[i].rows == 1 ? 1 : 2);
        put_u64(&o, t[i].cols);
        if (t[i].rows != 1) put_u64(&o, t[i].rows);
        put_u32(&o, t[i].type);
        put_u64(&o, t[i].offset);
    }
    static const uint8_t zeros[ALIGN];
    long pos = ftell(o.f);
    if (pos < 0) o.bad = 1;
    else put(&o, zeros, (ALIGN - (size_t)pos % ALIGN) % ALIGN);
    uint64_t at = 0;
    for (uint32_t i = 0; i < n && !o.bad; i++) {
        put(&o, zeros, (size_t)(t[i].offset - at));
        write_data(&o, &t[i], row);
        at = t[i].offset + t[i].nbytes;
    }
    int err = errno;
    if (fclose(o.f) != 0) o.bad = 1;
    free(t), free(row);
    if (o.bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return flx_error_set(FLX_ERR_IO, "file %s: write failed: %s", path, strerror(o.bad ? err : errno));
    }
    return FLX_OK;
}
