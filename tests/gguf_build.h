/*
 * gguf_build.h - GGUF files built byte by byte (format table in decode/include/flx/gguf.h), for
 * tests of the GGUF reader, the model and tokenizer loaders, and for the fuzz seeds
 * (tests/fuzz/gen_corpus.c). Written independently of the reader; a failed write or a full
 * table stops the program through CHECK (flx_test.h).
 *
 *   gguf_b_t g = {0};
 *   kv_str(&g, "general.architecture", "llama");
 *   add_t(&g, "token_embd.weight", FLX_GGML_F16, 2, hidden, vocab, data);
 *   gguf_save(&g, path, "GGUF", 3);
 *   gguf_free(&g);
 *
 * Raw key/values (any type, nested arrays, bad values) go straight into g.kv with put_* and
 * g.n_kv++.
 */
#ifndef FLX_GGUF_BUILD_H
#define FLX_GGUF_BUILD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/gguf.h"
#include "flx/util.h"
#include "flx_test.h"

#define GGUF_B_MAX_TENSORS 64

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf_t;

static inline void put(buf_t *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
        CHECK(b->b);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static inline void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static inline void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static inline void put_str(buf_t *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

typedef struct {
    buf_t kv;
    uint64_t n_kv;
    struct {
        char name[64];
        uint32_t n_dims, type;
        uint64_t ne[2];
        uint8_t *data;
        size_t nbytes;
        int64_t force_offset;  /* >= 0: written instead of the computed offset */
    } t[GGUF_B_MAX_TENSORS];
    int n_t;
} gguf_b_t;

static inline void kv_u32(gguf_b_t *g, const char *k, uint32_t v)
{
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_U32), put_u32(&g->kv, v), g->n_kv++;
}
static inline void kv_f32(gguf_b_t *g, const char *k, float v)
{
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_F32), put(&g->kv, &v, 4), g->n_kv++;
}
static inline void kv_bool(gguf_b_t *g, const char *k, int v)
{
    uint8_t b = v ? 1 : 0;
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_BOOL), put(&g->kv, &b, 1), g->n_kv++;
}
static inline void kv_str(gguf_b_t *g, const char *k, const char *v)
{
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_STRING), put_str(&g->kv, v), g->n_kv++;
}
/* An array of n strings. */
static inline void kv_strs(gguf_b_t *g, const char *k, const char *const *v, size_t n)
{
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_ARRAY), put_u32(&g->kv, FLX_GGUF_STRING), put_u64(&g->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&g->kv, v[i]);
    g->n_kv++;
}
/* An array of n i32. */
static inline void kv_i32s(gguf_b_t *g, const char *k, const int32_t *v, size_t n)
{
    put_str(&g->kv, k), put_u32(&g->kv, FLX_GGUF_ARRAY), put_u32(&g->kv, FLX_GGUF_I32), put_u64(&g->kv, n);
    put(&g->kv, v, 4 * n);
    g->n_kv++;
}

static inline size_t type_bytes(uint32_t type, uint64_t n)
{
    uint32_t be, bb;
    CHECK_OK(flx_ggml_type_block(type, &be, &bb));
    return (size_t)(n / be * bb);
}

/* Adds a tensor of ne0 x ne1 elements (ne0 innermost); data (the type's bytes) is copied. */
static inline void add_t(gguf_b_t *g, const char *name, uint32_t type, uint32_t n_dims, uint64_t ne0, uint64_t ne1,
                         const void *data)
{
    CHECK(g->n_t < GGUF_B_MAX_TENSORS);
    typeof(g->t[0]) *t = &g->t[g->n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims, t->type = type, t->ne[0] = ne0, t->ne[1] = ne1, t->force_offset = -1;
    t->nbytes = type_bytes(type, ne0 * ne1);
    t->data = malloc(t->nbytes);
    CHECK(t->data);
    memcpy(t->data, data, t->nbytes);
}

static inline void gguf_free(gguf_b_t *g)
{
    free(g->kv.b);
    for (int i = 0; i < g->n_t; i++) free(g->t[i].data);
    memset(g, 0, sizeof *g);
}

/* Writes the file with the given magic and version; tensor data aligned to 32 bytes. */
static inline void gguf_save(const gguf_b_t *g, const char *path, const char *magic, uint32_t version)
{
    buf_t b = {0};
    put(&b, magic, 4);
    put_u32(&b, version);
    put_u64(&b, (uint64_t)g->n_t);
    put_u64(&b, g->n_kv);
    put(&b, g->kv.b, g->kv.n);
    uint64_t off = 0, offs[GGUF_B_MAX_TENSORS];
    for (int i = 0; i < g->n_t; i++) {
        offs[i] = off;
        off = FLX_ALIGN_UP(off + g->t[i].nbytes, 32);
        put_str(&b, g->t[i].name);
        put_u32(&b, g->t[i].n_dims);
        for (uint32_t d = 0; d < g->t[i].n_dims; d++) put_u64(&b, g->t[i].ne[d]);
        put_u32(&b, g->t[i].type);
        put_u64(&b, g->t[i].force_offset >= 0 ? (uint64_t)g->t[i].force_offset : offs[i]);
    }
    static const uint8_t zeros[32];
    put(&b, zeros, FLX_ALIGN_UP(b.n, 32) - b.n);
    size_t base = b.n;
    for (int i = 0; i < g->n_t; i++) {
        put(&b, zeros, base + offs[i] - b.n);
        put(&b, g->t[i].data, g->t[i].nbytes);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b.b, 1, b.n, f) == b.n && fclose(f) == 0);
    free(b.b);
}

#endif
