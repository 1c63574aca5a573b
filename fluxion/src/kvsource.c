/*
 * kvsource.c - KV sources for the offline tools (flx/kvsource.h): a memory-mapped KV dump or the
 * synthetic workload, behind one "give me layer l" call; and the dump writer.
 *
 * DESIGN
 * The reader trusts nothing in the file: open checks the format/version metadata, parses every
 * shape field strictly, then checks that exactly the 3 * n_layers expected tensors exist with the
 * expected dtype and shape (flx_st_expect names the tensor); a stray tensor is refused too, so a
 * dump written for another shape cannot be half-read. After open, a layer read is a memcpy out of
 * the mapping. The writer copies each layer into a flx_st_writer in whatever order it arrives and
 * refuses a second copy of a layer; save refuses while any layer is missing.
 */
#include "flx/kvsource.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/safetensors.h"
#include "flx/synth.h"
#include "flx/util.h"

#define DUMP_FORMAT "fluxion-kv-dump"
#define DUMP_VERSION "1"

struct flx_kvsrc {
    flx_kvsrc_shape_t shape;
    flx_st_reader_h rd;          /* dump, or NULL */
    flx_synth_t *syn;            /* synthetic, or NULL (owned) */
    char desc[512];
};

static void tensor_name(char *buf, size_t cap, uint32_t l, char which)
{
    snprintf(buf, cap, "layers.%u.%c", l, which);
}

static void dims(const flx_kvsrc_shape_t *s, int64_t kv[3], int64_t q[3])
{
    uint64_t T = (uint64_t)s->prompt_len + s->n_steps;
    kv[0] = s->n_kv_heads, kv[1] = (int64_t)T, kv[2] = s->head_dim;
    q[0] = s->n_q_heads, q[1] = (int64_t)s->n_steps + 1, q[2] = s->head_dim;
}

static flx_status_t shape_check(const flx_kvsrc_shape_t *s)
{
    if (!s->n_layers || !s->n_q_heads || !s->n_kv_heads || !s->head_dim || !s->prompt_len)
        return flx_error_set(FLX_ERR_INVALID, "kv shape: n_layers %u, n_q_heads %u, n_kv_heads %u, head_dim %u, "
                             "prompt_len %u must all be positive", s->n_layers, s->n_q_heads, s->n_kv_heads,
                             s->head_dim, s->prompt_len);
    /* T = prompt_len + n_steps and n_steps + 1 are 32-bit quantities in every consumer */
    if ((uint64_t)s->prompt_len + s->n_steps > INT32_MAX)
        return flx_error_set(FLX_ERR_INVALID, "kv shape: prompt_len %u + n_steps %u above 2^31 - 1", s->prompt_len,
                             s->n_steps);
    if (s->n_q_heads % s->n_kv_heads)
        return flx_error_set(FLX_ERR_INVALID, "kv shape: n_q_heads %u not a multiple of n_kv_heads %u", s->n_q_heads,
                             s->n_kv_heads);
    return FLX_OK;
}

static flx_status_t meta_u32(flx_st_reader_h rd, const char *path, const char *key, uint32_t *out)
{
    const char *v = flx_st_metadata(rd, key);
    if (!v) return flx_error_set(FLX_ERR_FORMAT, "%s: kv dump metadata \"%s\" missing", path, key);
    uint64_t x;
    if (flx_parse_u64(v, 0, UINT32_MAX, &x) != FLX_OK)
        return flx_error_set(FLX_ERR_FORMAT, "%s: kv dump metadata \"%s\" = \"%s\" is not a 32-bit decimal", path, key, v);
    *out = (uint32_t)x;
    return FLX_OK;
}

flx_status_t flx_kvsrc_open_dump(const char *path, flx_kvsrc_h *src_p)
{
    if (!path || !src_p) return flx_error_set(FLX_ERR_INVALID, "kv dump: NULL argument");
    flx_st_reader_h rd;
    flx_status_t st = flx_st_open(path, &rd);
    if (st) return st;
    const char *fmt = flx_st_metadata(rd, "format"), *ver = flx_st_metadata(rd, "version");
    flx_kvsrc_shape_t s;
    if (!fmt || strcmp(fmt, DUMP_FORMAT)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: metadata \"format\" is %s%s%s, not \"" DUMP_FORMAT "\"", path,
                           fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "");
        goto fail;
    }
    if (!ver || strcmp(ver, DUMP_VERSION)) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "%s: kv dump version %s, this reader knows \"" DUMP_VERSION "\"", path,
                           ver ? ver : "missing");
        goto fail;
    }
    if ((st = meta_u32(rd, path, "n_layers", &s.n_layers)) || (st = meta_u32(rd, path, "n_q_heads", &s.n_q_heads)) ||
        (st = meta_u32(rd, path, "n_kv_heads", &s.n_kv_heads)) || (st = meta_u32(rd, path, "head_dim", &s.head_dim)) ||
        (st = meta_u32(rd, path, "prompt_len", &s.prompt_len)) || (st = meta_u32(rd, path, "n_steps", &s.n_steps)))
        goto fail;
    if ((st = shape_check(&s))) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: %s", path, flx_error_msg());
        goto fail;
    }
    int64_t kv[3], q[3];
    dims(&s, kv, q);
    char name[64];
    for (uint32_t l = 0; l < s.n_layers; l++) {
        const flx_st_tensor_t *t;
        tensor_name(name, sizeof name, l, 'k');
        if ((st = flx_st_expect(rd, name, FLX_DT_BF16, 3, kv, &t))) goto fail;
        tensor_name(name, sizeof name, l, 'v');
        if ((st = flx_st_expect(rd, name, FLX_DT_BF16, 3, kv, &t))) goto fail;
        tensor_name(name, sizeof name, l, 'q');
        if ((st = flx_st_expect(rd, name, FLX_DT_F32, 3, q, &t))) goto fail;
    }
    if (flx_st_count(rd) != (size_t)s.n_layers * 3) {
        for (size_t i = 0; i < flx_st_count(rd); i++) {
            const char *n = flx_st_at(rd, i)->name;
            unsigned l;
            char c, tail;
            if (sscanf(n, "layers.%u.%c%c", &l, &c, &tail) != 2 || l >= s.n_layers || (c != 'k' && c != 'v' && c != 'q')) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: unexpected tensor \"%s\" in a kv dump of %u layers", path, n,
                                   s.n_layers);
                goto fail;
            }
        }
        st = flx_error_set(FLX_ERR_FORMAT, "%s: %zu tensors, expected %u", path, flx_st_count(rd), s.n_layers * 3);
        goto fail;
    }
    struct flx_kvsrc *src = calloc(1, sizeof *src);
    if (!src) {
        st = flx_error_set(FLX_ERR_NOMEM, "kv dump: source");
        goto fail;
    }
    src->shape = s;
    src->rd = rd;
    snprintf(src->desc, sizeof src->desc, "dump:%s", path);
    *src_p = src;
    return FLX_OK;
fail:
    flx_st_close(rd);
    return st;
}

flx_status_t flx_kvsrc_from_synth(struct flx_synth *syn, flx_kvsrc_h *src_p)
{
    if (!syn || !src_p) return flx_error_set(FLX_ERR_INVALID, "kv source: NULL argument");
    struct flx_kvsrc *src = calloc(1, sizeof *src);
    if (!src) return flx_error_set(FLX_ERR_NOMEM, "kv source");
    const flx_synth_params_t *p = flx_synth_params(syn);
    src->shape = (flx_kvsrc_shape_t){p->n_layers, p->n_q_heads, p->n_kv_heads, p->head_dim, p->prompt_len, p->n_steps};
    src->syn = syn;
    snprintf(src->desc, sizeof src->desc,
             "synth:default,seed=%" PRIu64 ",layers=%u,q=%u,kv=%u,d=%u,len=%u,steps=%u,theta=%g,retrieval=%g", p->seed,
             p->n_layers, p->n_q_heads, p->n_kv_heads, p->head_dim, p->prompt_len, p->n_steps, (double)p->rope_theta,
             (double)p->retrieval_share);
    *src_p = src;
    return FLX_OK;
}

void flx_kvsrc_close(flx_kvsrc_h src)
{
    if (!src) return;
    flx_st_close(src->rd);
    flx_synth_destroy(src->syn);
    free(src);
}

void flx_kvsrc_shape(flx_kvsrc_h src, flx_kvsrc_shape_t *shape_p) { *shape_p = src->shape; }

const char *flx_kvsrc_describe(flx_kvsrc_h src) { return src->desc; }

struct flx_synth *flx_kvsrc_synth(flx_kvsrc_h src) { return src ? src->syn : NULL; }

flx_status_t flx_kvsrc_layer(flx_kvsrc_h src, uint32_t layer, flx_bf16_t *k, flx_bf16_t *v, float *q,
                             flx_pool_h pool)
{
    if (!src || !k || !v || !q) return flx_error_set(FLX_ERR_INVALID, "kv source layer: NULL argument");
    if (layer >= src->shape.n_layers)
        return flx_error_set(FLX_ERR_INVALID, "kv source layer %u out of range (n_layers %u)", layer, src->shape.n_layers);
    if (src->syn) return flx_synth_layer(src->syn, layer, k, v, q, pool);
    char name[64];
    void *dst[3] = {k, v, q};
    const char which[3] = {'k', 'v', 'q'};
    for (int i = 0; i < 3; i++) {
        tensor_name(name, sizeof name, layer, which[i]);
        const flx_st_tensor_t *t = flx_st_find(src->rd, name);
        if (FLX_NEVER(!t)) return flx_error_set(FLX_ERR_INTERNAL, "kv dump tensor %s vanished", name);
        memcpy(dst[i], t->data, t->nbytes);
    }
    return FLX_OK;
}

/* ---- writer ---- */

struct flx_kvdump_writer {
    flx_kvsrc_shape_t shape;
    flx_st_writer_h st;
    uint8_t *have;               /* (n_layers) */
};

flx_status_t flx_kvdump_writer_create(const flx_kvsrc_shape_t *shape, const char *model, const char *text,
                                      flx_kvdump_writer_h *w_p)
{
    if (!shape || !w_p) return flx_error_set(FLX_ERR_INVALID, "kv dump writer: NULL argument");
    flx_status_t st = shape_check(shape);
    if (st) return st;
    struct flx_kvdump_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->have = calloc(shape->n_layers, 1))) {
        free(w);
        return flx_error_set(FLX_ERR_NOMEM, "kv dump writer");
    }
    w->shape = *shape;
    if ((st = flx_st_writer_create(&w->st))) goto fail;
    const char *keys[6] = {"n_layers", "n_q_heads", "n_kv_heads", "head_dim", "prompt_len", "n_steps"};
    const uint32_t vals[6] = {shape->n_layers, shape->n_q_heads, shape->n_kv_heads,
                              shape->head_dim, shape->prompt_len, shape->n_steps};
    char buf[32];
    if ((st = flx_st_writer_set_metadata(w->st, "format", DUMP_FORMAT)) ||
        (st = flx_st_writer_set_metadata(w->st, "version", DUMP_VERSION)))
        goto fail;
    for (int i = 0; i < 6; i++) {
        snprintf(buf, sizeof buf, "%u", vals[i]);
        if ((st = flx_st_writer_set_metadata(w->st, keys[i], buf))) goto fail;
    }
    if (model && (st = flx_st_writer_set_metadata(w->st, "model", model))) goto fail;
    if (text && (st = flx_st_writer_set_metadata(w->st, "text", text))) goto fail;
    *w_p = w;
    return FLX_OK;
fail:
    flx_kvdump_writer_destroy(w);
    return st;
}

flx_status_t flx_kvdump_writer_layer(flx_kvdump_writer_h w, uint32_t layer, const flx_bf16_t *k, const flx_bf16_t *v,
                                     const float *q)
{
    if (!w || !k || !v || !q) return flx_error_set(FLX_ERR_INVALID, "kv dump writer layer: NULL argument");
    if (layer >= w->shape.n_layers)
        return flx_error_set(FLX_ERR_INVALID, "kv dump writer: layer %u out of range (n_layers %u)", layer, w->shape.n_layers);
    if (w->have[layer]) return flx_error_set(FLX_ERR_DUPLICATE, "kv dump writer: layer %u added twice", layer);
    int64_t kv[3], qd[3];
    dims(&w->shape, kv, qd);
    char name[64];
    flx_status_t st;
    tensor_name(name, sizeof name, layer, 'k');
    if ((st = flx_st_writer_add(w->st, name, FLX_DT_BF16, 3, kv, k))) return st;
    tensor_name(name, sizeof name, layer, 'v');
    if ((st = flx_st_writer_add(w->st, name, FLX_DT_BF16, 3, kv, v))) return st;
    tensor_name(name, sizeof name, layer, 'q');
    if ((st = flx_st_writer_add(w->st, name, FLX_DT_F32, 3, qd, q))) return st;
    w->have[layer] = 1;
    return FLX_OK;
}

flx_status_t flx_kvdump_writer_save(flx_kvdump_writer_h w, const char *path)
{
    if (!w || !path) return flx_error_set(FLX_ERR_INVALID, "kv dump writer save: NULL argument");
    for (uint32_t l = 0; l < w->shape.n_layers; l++)
        if (!w->have[l]) return flx_error_set(FLX_ERR_STATE, "kv dump writer: layer %u was never added", l);
    return flx_st_writer_save(w->st, path);
}

void flx_kvdump_writer_destroy(flx_kvdump_writer_h w)
{
    if (!w) return;
    flx_st_writer_destroy(w->st);
    free(w->have);
    free(w);
}
