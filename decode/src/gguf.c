/*
 * gguf.c - GGUF reader (format table and checks in flx/gguf.h).
 *
 * DESIGN
 * The file is parsed once, eagerly, with a cursor that refuses every read past the end, so a
 * truncated or hostile file fails in open() and the getters can be infallible lookups. Scalars and
 * strings are copied out (they are few and small); arrays stay in the mapping, except that arrays
 * of strings get an offset table so element i is O(1) (tokenizer vocabularies have ~10^5 of them).
 * Every allocation the handle makes is recorded in one list and freed by close.
 */
#include "flx/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flx/util.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_DEPTH 4
#define GGUF_MAX_KEY 65535u

static const struct {
    const char *name;
    uint32_t blck, size;   /* blck 0: not a ggml type */
} ggml_types[FLX_GGML_TYPE_COUNT] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},
};

static const char *const gguf_type_names[FLX_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
/* Bytes of a fixed-size value; 0 for STRING and ARRAY. */
static const uint8_t gguf_type_size[FLX_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *flx_ggml_type_name(uint32_t t)
{
    return t < FLX_GGML_TYPE_COUNT && ggml_types[t].blck ? ggml_types[t].name : "?";
}

flx_status_t flx_ggml_type_block(uint32_t t, uint32_t *blck, uint32_t *size)
{
    if (t >= FLX_GGML_TYPE_COUNT || !ggml_types[t].blck)
        return flx_error_set(FLX_ERR_FORMAT, "unknown ggml type %u", t);
    *blck = ggml_types[t].blck;
    *size = ggml_types[t].size;
    return FLX_OK;
}

const char *flx_gguf_type_name(uint32_t t)
{
    return t < FLX_GGUF_TYPE_COUNT ? gguf_type_names[t] : "?";
}

struct flx_gguf {
    char *path;
    uint8_t *map;
    size_t len;
    uint32_t version;
    uint32_t alignment;
    size_t data_off;
    size_t n_kv;
    flx_gguf_kv_t *kv;          /* (n_kv) */
    size_t n_tensors;
    flx_gguf_tensor_t *tensors; /* (n_tensors) */
    flx_name_ent_t *kv_idx;     /* (n_kv) keys sorted, for O(log n) lookups */
    flx_name_ent_t *t_idx;      /* (n_tensors) tensor names sorted */
    void **allocs;              /* (n_allocs) everything else the handle owns */
    size_t n_allocs, cap_allocs;
};

/* Parse cursor; ctx names what is being read for error messages. */
typedef struct {
    struct flx_gguf *h;
    size_t off;
    const char *ctx_kind;       /* "key" or "tensor" */
    const char *ctx_name;       /* the key or tensor name once known, else NULL */
    uint64_t ctx_index;
} cursor_t;

static void *h_alloc(struct flx_gguf *h, size_t n, size_t size)
{
    if (h->n_allocs == h->cap_allocs) {
        size_t nc = h->cap_allocs ? 2 * h->cap_allocs : 64;
        void **na = realloc(h->allocs, nc * sizeof *na);
        if (!na) return NULL;
        h->allocs = na;
        h->cap_allocs = nc;
    }
    void *p = calloc(n ? n : 1, size);
    if (p) h->allocs[h->n_allocs++] = p;
    return p;
}

static flx_status_t fail(cursor_t *c, flx_status_t st, const char *what)
{
    if (c->ctx_name)
        return flx_error_set(st, "file %s: %s '%s': %s (at byte %zu of %zu)", c->h->path, c->ctx_kind, c->ctx_name,
                             what, c->off, c->h->len);
    return flx_error_set(st, "file %s: %s %llu: %s (at byte %zu of %zu)", c->h->path, c->ctx_kind,
                         (unsigned long long)c->ctx_index, what, c->off, c->h->len);
}

static size_t left(const cursor_t *c) { return c->h->len - c->off; }

static flx_status_t rd(cursor_t *c, void *dst, size_t n, const char *what)
{
    if (n > left(c)) return fail(c, FLX_ERR_FORMAT, what);
    memcpy(dst, c->h->map + c->off, n);
    c->off += n;
    return FLX_OK;
}

static flx_status_t rd_u32(cursor_t *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static flx_status_t rd_u64(cursor_t *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

/* Reads a string header and checks its bytes are in the file; returns the offset of the bytes. */
static flx_status_t rd_str(cursor_t *c, size_t *at, size_t *slen, const char *what)
{
    uint64_t n = 0;
    flx_status_t st = rd_u64(c, &n, what);
    if (st != FLX_OK) return st;
    if (n > left(c)) return fail(c, FLX_ERR_FORMAT, "string length runs past the end of the file");
    *at = c->off;
    *slen = (size_t)n;
    c->off += (size_t)n;
    return FLX_OK;
}

static char *h_strdup(struct flx_gguf *h, size_t at, size_t n)
{
    char *s = h_alloc(h, n + 1, 1);
    if (s) memcpy(s, h->map + at, n);
    return s;
}

static flx_status_t parse_array(cursor_t *c, flx_gguf_array_t *a, int depth);

static flx_status_t parse_value(cursor_t *c, uint32_t type, flx_gguf_kv_t *kv, int depth)
{
    flx_status_t st;
    if (type >= FLX_GGUF_TYPE_COUNT) return fail(c, FLX_ERR_FORMAT, "unknown value type");
    kv->type = (flx_gguf_type_t)type;
    uint8_t b[8] = {0};
    switch (kv->type) {
    case FLX_GGUF_STRING: {
        size_t at, n;
        if ((st = rd_str(c, &at, &n, "truncated string value")) != FLX_OK) return st;
        if (!(kv->str = h_strdup(c->h, at, n))) return fail(c, FLX_ERR_NOMEM, "no memory for string value");
        kv->str_len = n;
        return FLX_OK;
    }
    case FLX_GGUF_ARRAY:
        return parse_array(c, &kv->arr, depth + 1);
    default:
        break;
    }
    if ((st = rd(c, b, gguf_type_size[type], "truncated value")) != FLX_OK) return st;
    switch (kv->type) {
    case FLX_GGUF_U8: kv->v.u = b[0]; break;
    case FLX_GGUF_I8: kv->v.i = (int8_t)b[0]; break;
    case FLX_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); kv->v.u = x; break; }
    case FLX_GGUF_I16: { int16_t x; memcpy(&x, b, 2); kv->v.i = x; break; }
    case FLX_GGUF_U32: { uint32_t x; memcpy(&x, b, 4); kv->v.u = x; break; }
    case FLX_GGUF_I32: { int32_t x; memcpy(&x, b, 4); kv->v.i = x; break; }
    case FLX_GGUF_U64: { uint64_t x; memcpy(&x, b, 8); kv->v.u = x; break; }
    case FLX_GGUF_I64: { int64_t x; memcpy(&x, b, 8); kv->v.i = x; break; }
    case FLX_GGUF_F32: { float x; memcpy(&x, b, 4); kv->v.f = x; break; }
    case FLX_GGUF_F64: { double x; memcpy(&x, b, 8); kv->v.f = x; break; }
    case FLX_GGUF_BOOL:
        if (b[0] > 1) return fail(c, FLX_ERR_FORMAT, "bool value is neither 0 nor 1");
        kv->v.u = b[0];
        break;
    default: return fail(c, FLX_ERR_INTERNAL, "value type");
    }
    return FLX_OK;
}

static flx_status_t parse_array(cursor_t *c, flx_gguf_array_t *a, int depth)
{
    flx_status_t st;
    uint32_t et = 0;
    uint64_t n = 0;
    if (depth > GGUF_MAX_DEPTH) return fail(c, FLX_ERR_FORMAT, "arrays nested more than 4 deep");
    if ((st = rd_u32(c, &et, "truncated array type")) != FLX_OK) return st;
    if ((st = rd_u64(c, &n, "truncated array count")) != FLX_OK) return st;
    if (et >= FLX_GGUF_TYPE_COUNT) return fail(c, FLX_ERR_FORMAT, "unknown array element type");
    a->elem = (flx_gguf_type_t)et;
    a->base = c->h->map;
    /* The least bytes one element can take: a count that cannot fit is refused before allocating. */
    size_t min = et == FLX_GGUF_STRING ? 8 : et == FLX_GGUF_ARRAY ? 12 : gguf_type_size[et];
    if (n > left(c) / min) return fail(c, FLX_ERR_FORMAT, "array count runs past the end of the file");
    a->n = n;
    if (min == gguf_type_size[et] && et != FLX_GGUF_STRING && et != FLX_GGUF_ARRAY) {
        a->data = c->h->map + c->off;
        if (et == FLX_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->h->map[c->off + i] > 1) return fail(c, FLX_ERR_FORMAT, "bool array element neither 0 nor 1");
        c->off += (size_t)n * min;
        return FLX_OK;
    }
    if (et == FLX_GGUF_STRING) {
        uint64_t *offs = h_alloc(c->h, (size_t)n, sizeof *offs);
        if (!offs) return fail(c, FLX_ERR_NOMEM, "no memory for string array");
        for (uint64_t i = 0; i < n; i++) {
            size_t at, sl;
            offs[i] = c->off;
            if ((st = rd_str(c, &at, &sl, "truncated string in array")) != FLX_OK) return st;
        }
        a->str_off = offs;
        return FLX_OK;
    }
    flx_gguf_array_t *sub = h_alloc(c->h, (size_t)n, sizeof *sub);
    if (!sub) return fail(c, FLX_ERR_NOMEM, "no memory for nested array");
    for (uint64_t i = 0; i < n; i++)
        if ((st = parse_array(c, &sub[i], depth + 1)) != FLX_OK) return st;
    a->sub = sub;
    return FLX_OK;
}

static int cmp_offsets(const void *a, const void *b)
{
    uint64_t x = (*(const flx_gguf_tensor_t *const *)a)->offset, y = (*(const flx_gguf_tensor_t *const *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Names must be unique; the sorted index also serves the lookups. */
static flx_status_t index_names(struct flx_gguf *h, flx_name_ent_t *idx, size_t n, const char *kind)
{
    const char *dup;
    if (flx_names_sort(idx, n, &dup) != FLX_OK)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: %s '%s' appears twice", h->path, kind, dup);
    return FLX_OK;
}

static flx_status_t parse_tensor_info(cursor_t *c, flx_gguf_tensor_t *t)
{
    flx_status_t st;
    size_t at, n;
    if ((st = rd_str(c, &at, &n, "truncated tensor name")) != FLX_OK) return st;
    if (n == 0 || n > GGUF_MAX_KEY) return fail(c, FLX_ERR_FORMAT, "empty or over-long tensor name");
    if (!(t->name = h_strdup(c->h, at, n))) return fail(c, FLX_ERR_NOMEM, "no memory for tensor name");
    c->ctx_name = t->name;
    if ((st = rd_u32(c, &t->n_dims, "truncated n_dims")) != FLX_OK) return st;
    if (t->n_dims < 1 || t->n_dims > FLX_GGUF_MAX_DIMS) return fail(c, FLX_ERR_FORMAT, "n_dims not in 1..4");
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < FLX_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (st = rd_u64(c, &t->ne[d], "truncated dims")) != FLX_OK) return st;
        if (t->ne[d] == 0 || t->ne[d] > (UINT64_C(1) << 62) || __builtin_mul_overflow(nelem, t->ne[d], &nelem) ||
            nelem > (UINT64_C(1) << 62))
            return fail(c, FLX_ERR_FORMAT, "a dim is zero or the element count overflows");
    }
    t->nelem = nelem;
    if ((st = rd_u32(c, &t->type, "truncated ggml type")) != FLX_OK) return st;
    if ((st = rd_u64(c, &t->offset, "truncated data offset")) != FLX_OK) return st;
    if (t->type >= FLX_GGML_TYPE_COUNT || !ggml_types[t->type].blck)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s' has unknown ggml type %u", c->h->path, t->name,
                             t->type);
    uint32_t blck = ggml_types[t->type].blck;
    if (t->ne[0] % blck != 0)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s': ne[0] = %llu is not a multiple of the %s block (%u)",
                             c->h->path, t->name, (unsigned long long)t->ne[0], ggml_types[t->type].name, blck);
    uint64_t nb;
    if (__builtin_mul_overflow(nelem / blck, (uint64_t)ggml_types[t->type].size, &nb) || nb > SIZE_MAX)
        return fail(c, FLX_ERR_FORMAT, "byte size overflows");
    t->nbytes = (size_t)nb;
    c->ctx_name = NULL;
    return FLX_OK;
}

flx_status_t flx_gguf_open(const char *path, flx_gguf_h *h_p)
{
    flx_status_t st;
    const flx_gguf_tensor_t **order = NULL;
    struct flx_gguf *h = calloc(1, sizeof *h);
    if (!h) return flx_error_set(FLX_ERR_NOMEM, "gguf handle");
    h->path = strdup(path);
    if (!h->path) {
        free(h);
        return flx_error_set(FLX_ERR_NOMEM, "gguf handle");
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = flx_error_set(flx_status_from_errno(errno), "file %s: cannot open: %s", path, strerror(errno));
        goto err;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        st = flx_error_set(FLX_ERR_IO, "file %s: not a regular file", path);
        goto err;
    }
    if (sb.st_size < 24) {
        close(fd);
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: %lld bytes, too short for a gguf header", path,
                           (long long)sb.st_size);
        goto err;
    }
    h->len = (size_t)sb.st_size;
    void *map = mmap(NULL, h->len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        st = flx_error_set(FLX_ERR_IO, "file %s: mmap of %zu bytes failed: %s", path, h->len, strerror(map_errno));
        goto err;
    }
    h->map = map;
    if (memcmp(h->map, GGUF_MAGIC, 4) != 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: bad magic %02x %02x %02x %02x, not a gguf file", path, h->map[0],
                           h->map[1], h->map[2], h->map[3]);
        goto err;
    }
    cursor_t c = {.h = h, .off = 4, .ctx_kind = "header"};
    uint64_t n_tensors = 0, n_kv = 0;
    rd_u32(&c, &h->version, "version");
    if (h->version == 1) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: gguf version 1 is not supported (only 2 and 3)", path);
        goto err;
    }
    if (h->version != 2 && h->version != 3) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: gguf version %u (0x%08x) is not 2 or 3 (big-endian files are "
                           "not supported)", path, h->version, h->version);
        goto err;
    }
    rd_u64(&c, &n_tensors, "tensor count");
    rd_u64(&c, &n_kv, "kv count");
    /* A key/value takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8: counts that
     * cannot fit in the bytes left are refused before the tables they size are allocated. */
    if (n_kv > left(&c) / 14 || n_tensors > left(&c) / 33 || n_kv * 14 + n_tensors * 33 > left(&c)) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: %llu keys and %llu tensors cannot fit in %zu bytes", path,
                           (unsigned long long)n_kv, (unsigned long long)n_tensors, h->len);
        goto err;
    }
    h->kv = h_alloc(h, (size_t)n_kv, sizeof *h->kv);
    h->tensors = h_alloc(h, (size_t)n_tensors, sizeof *h->tensors);
    h->kv_idx = h_alloc(h, (size_t)n_kv, sizeof *h->kv_idx);
    h->t_idx = h_alloc(h, (size_t)n_tensors, sizeof *h->t_idx);
    if (!h->kv || !h->tensors || !h->kv_idx || !h->t_idx) {
        st = flx_error_set(FLX_ERR_NOMEM, "file %s: %llu keys, %llu tensors", path, (unsigned long long)n_kv,
                           (unsigned long long)n_tensors);
        goto err;
    }
    c.ctx_kind = "key";
    for (uint64_t i = 0; i < n_kv; i++) {
        flx_gguf_kv_t *kv = &h->kv[i];
        size_t at, n;
        uint32_t type = 0;
        c.ctx_index = i;
        c.ctx_name = NULL;
        if ((st = rd_str(&c, &at, &n, "truncated key")) != FLX_OK) goto err;
        if (n == 0 || n > GGUF_MAX_KEY) {
            st = fail(&c, FLX_ERR_FORMAT, "empty or over-long key");
            goto err;
        }
        if (!(kv->key = h_strdup(h, at, n))) {
            st = fail(&c, FLX_ERR_NOMEM, "no memory for key");
            goto err;
        }
        c.ctx_name = kv->key;
        if ((st = rd_u32(&c, &type, "truncated value type")) != FLX_OK) goto err;
        if ((st = parse_value(&c, type, kv, 0)) != FLX_OK) goto err;
        h->kv_idx[i] = (flx_name_ent_t){kv->key, (size_t)i};
        h->n_kv++;
    }
    if ((st = index_names(h, h->kv_idx, h->n_kv, "key")) != FLX_OK) goto err;
    c.ctx_kind = "tensor";
    for (uint64_t i = 0; i < n_tensors; i++) {
        c.ctx_index = i;
        c.ctx_name = NULL;
        if ((st = parse_tensor_info(&c, &h->tensors[i])) != FLX_OK) goto err;
        h->t_idx[i] = (flx_name_ent_t){h->tensors[i].name, (size_t)i};
        h->n_tensors++;
    }
    if ((st = index_names(h, h->t_idx, h->n_tensors, "tensor")) != FLX_OK) goto err;

    h->alignment = FLX_GGUF_DEFAULT_ALIGNMENT;
    if (flx_gguf_find(h, "general.alignment")) {
        uint32_t a;
        if ((st = flx_gguf_get_u32(h, "general.alignment", &a)) != FLX_OK) goto err;
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 20)) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: key 'general.alignment' = %u is not a power of two up to 2^20",
                               path, a);
            goto err;
        }
        h->alignment = a;
    }
    h->data_off = FLX_ALIGN_UP(c.off, (size_t)h->alignment);
    size_t data_len = h->data_off <= h->len ? h->len - h->data_off : 0;
    for (size_t i = 0; i < h->n_tensors; i++) {
        flx_gguf_tensor_t *t = &h->tensors[i];
        if (t->offset % h->alignment != 0) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s': data offset %llu is not a multiple of the "
                               "alignment %u", path, t->name, (unsigned long long)t->offset, h->alignment);
            goto err;
        }
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: tensor '%s': %zu bytes at data offset %llu run past the end "
                               "of the file (%zu data bytes)", path, t->name, t->nbytes,
                               (unsigned long long)t->offset, data_len);
            goto err;
        }
        t->data = h->map + h->data_off + t->offset;
    }
    order = malloc((h->n_tensors + 1) * sizeof *order);
    if (!order) {
        st = flx_error_set(FLX_ERR_NOMEM, "file %s: tensor order", path);
        goto err;
    }
    for (size_t i = 0; i < h->n_tensors; i++) order[i] = &h->tensors[i];
    qsort(order, h->n_tensors, sizeof *order, cmp_offsets);
    for (size_t i = 1; i < h->n_tensors; i++) {
        const flx_gguf_tensor_t *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: tensors '%s' (offset %llu, %zu bytes) and '%s' (offset %llu) "
                               "overlap", path, a->name, (unsigned long long)a->offset, a->nbytes, b->name,
                               (unsigned long long)b->offset);
            goto err;
        }
    }
    free((void *)order);
    *h_p = h;
    return FLX_OK;
err:
    free((void *)order);
    flx_gguf_close(h);
    return st;
}

void flx_gguf_close(flx_gguf_h h)
{
    if (!h) return;
    for (size_t i = 0; i < h->n_allocs; i++) free(h->allocs[i]);
    free(h->allocs);
    if (h->map) munmap(h->map, h->len);
    free(h->path);
    free(h);
}

const char *flx_gguf_path(flx_gguf_h h) { return h->path; }
uint32_t flx_gguf_version(flx_gguf_h h) { return h->version; }
uint32_t flx_gguf_alignment(flx_gguf_h h) { return h->alignment; }
size_t flx_gguf_data_offset(flx_gguf_h h) { return h->data_off; }
size_t flx_gguf_kv_count(flx_gguf_h h) { return h->n_kv; }
const flx_gguf_kv_t *flx_gguf_kv_at(flx_gguf_h h, size_t i) { return i < h->n_kv ? &h->kv[i] : NULL; }
size_t flx_gguf_tensor_count(flx_gguf_h h) { return h->n_tensors; }

const flx_gguf_tensor_t *flx_gguf_tensor_at(flx_gguf_h h, size_t i)
{
    return i < h->n_tensors ? &h->tensors[i] : NULL;
}

const flx_gguf_kv_t *flx_gguf_find(flx_gguf_h h, const char *key)
{
    const flx_name_ent_t *e = flx_names_find(h->kv_idx, h->n_kv, key);
    return e ? &h->kv[e->pos] : NULL;
}

const flx_gguf_tensor_t *flx_gguf_find_tensor(flx_gguf_h h, const char *name)
{
    const flx_name_ent_t *e = flx_names_find(h->t_idx, h->n_tensors, name);
    return e ? &h->tensors[e->pos] : NULL;
}

static int is_signed_int(flx_gguf_type_t t)
{
    return t == FLX_GGUF_I8 || t == FLX_GGUF_I16 || t == FLX_GGUF_I32 || t == FLX_GGUF_I64;
}
static int is_unsigned_int(flx_gguf_type_t t)
{
    return t == FLX_GGUF_U8 || t == FLX_GGUF_U16 || t == FLX_GGUF_U32 || t == FLX_GGUF_U64;
}

static flx_status_t find_kv(flx_gguf_h h, const char *key, const flx_gguf_kv_t **kv)
{
    *kv = flx_gguf_find(h, key);
    if (!*kv) return flx_error_set(FLX_ERR_NOT_FOUND, "file %s: key '%s' is missing", h->path, key);
    return FLX_OK;
}

/* Integer value of kv as a signed 128-bit range check: lo <= v <= hi. */
static flx_status_t get_int(flx_gguf_h h, const char *key, int64_t lo, uint64_t hi, const char *want, uint64_t *u,
                            int64_t *i)
{
    const flx_gguf_kv_t *kv;
    flx_status_t st = find_kv(h, key, &kv);
    if (st != FLX_OK) return st;
    if (is_unsigned_int(kv->type)) {
        if (kv->v.u > hi)
            return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' = %llu does not fit in %s", h->path, key,
                                 (unsigned long long)kv->v.u, want);
        *u = kv->v.u;
        *i = (int64_t)kv->v.u;
        return FLX_OK;
    }
    if (is_signed_int(kv->type)) {
        if (kv->v.i < lo || (kv->v.i >= 0 && (uint64_t)kv->v.i > hi))
            return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' = %lld does not fit in %s", h->path, key,
                                 (long long)kv->v.i, want);
        *u = (uint64_t)kv->v.i;
        *i = kv->v.i;
        return FLX_OK;
    }
    return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' has type %s, expected an integer", h->path, key,
                         flx_gguf_type_name(kv->type));
}

flx_status_t flx_gguf_get_u32(flx_gguf_h h, const char *key, uint32_t *out)
{
    uint64_t u;
    int64_t i;
    flx_status_t st = get_int(h, key, 0, UINT32_MAX, "u32", &u, &i);
    if (st == FLX_OK) *out = (uint32_t)u;
    return st;
}

flx_status_t flx_gguf_get_i32(flx_gguf_h h, const char *key, int32_t *out)
{
    uint64_t u;
    int64_t i;
    flx_status_t st = get_int(h, key, INT32_MIN, INT32_MAX, "i32", &u, &i);
    if (st == FLX_OK) *out = (int32_t)i;
    return st;
}

flx_status_t flx_gguf_get_u64(flx_gguf_h h, const char *key, uint64_t *out)
{
    uint64_t u;
    int64_t i;
    flx_status_t st = get_int(h, key, 0, UINT64_MAX, "u64", &u, &i);
    if (st == FLX_OK) *out = u;
    return st;
}

flx_status_t flx_gguf_get_f32(flx_gguf_h h, const char *key, float *out)
{
    const flx_gguf_kv_t *kv;
    flx_status_t st = find_kv(h, key, &kv);
    if (st != FLX_OK) return st;
    if (kv->type == FLX_GGUF_F32 || kv->type == FLX_GGUF_F64) *out = (float)kv->v.f;
    else if (is_unsigned_int(kv->type)) *out = (float)kv->v.u;
    else if (is_signed_int(kv->type)) *out = (float)kv->v.i;
    else
        return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' has type %s, expected a number", h->path, key,
                             flx_gguf_type_name(kv->type));
    return FLX_OK;
}

flx_status_t flx_gguf_get_bool(flx_gguf_h h, const char *key, int *out)
{
    const flx_gguf_kv_t *kv;
    flx_status_t st = find_kv(h, key, &kv);
    if (st != FLX_OK) return st;
    if (kv->type != FLX_GGUF_BOOL)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' has type %s, expected bool", h->path, key,
                             flx_gguf_type_name(kv->type));
    *out = (int)kv->v.u;
    return FLX_OK;
}

flx_status_t flx_gguf_get_str(flx_gguf_h h, const char *key, const char **out)
{
    const flx_gguf_kv_t *kv;
    flx_status_t st = find_kv(h, key, &kv);
    if (st != FLX_OK) return st;
    if (kv->type != FLX_GGUF_STRING)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' has type %s, expected string", h->path, key,
                             flx_gguf_type_name(kv->type));
    *out = kv->str;
    return FLX_OK;
}

flx_status_t flx_gguf_get_arr(flx_gguf_h h, const char *key, const flx_gguf_array_t **out)
{
    const flx_gguf_kv_t *kv;
    flx_status_t st = find_kv(h, key, &kv);
    if (st != FLX_OK) return st;
    if (kv->type != FLX_GGUF_ARRAY)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: key '%s' has type %s, expected array", h->path, key,
                             flx_gguf_type_name(kv->type));
    *out = &kv->arr;
    return FLX_OK;
}

flx_status_t flx_gguf_arr_str(const flx_gguf_array_t *a, uint64_t i, const char **s, size_t *len)
{
    if (a->elem != FLX_GGUF_STRING || i >= a->n)
        return flx_error_set(FLX_ERR_INVALID, "gguf array of %s[%llu]: no string element %llu",
                             flx_gguf_type_name(a->elem), (unsigned long long)a->n, (unsigned long long)i);
    uint64_t n = 0;
    memcpy(&n, a->base + a->str_off[i], 8);
    *s = (const char *)a->base + a->str_off[i] + 8;
    *len = (size_t)n;
    return FLX_OK;
}

flx_status_t flx_gguf_arr_int(const flx_gguf_array_t *a, uint64_t i, int64_t *out)
{
    if (i >= a->n || a->elem >= FLX_GGUF_TYPE_COUNT || !gguf_type_size[a->elem] || a->elem == FLX_GGUF_F32 ||
        a->elem == FLX_GGUF_F64)
        return flx_error_set(FLX_ERR_INVALID, "gguf array of %s[%llu]: no integer element %llu",
                             flx_gguf_type_name(a->elem), (unsigned long long)a->n, (unsigned long long)i);
    const uint8_t *p = (const uint8_t *)a->data + i * gguf_type_size[a->elem];
    switch (a->elem) {
    case FLX_GGUF_U8: case FLX_GGUF_BOOL: *out = p[0]; break;
    case FLX_GGUF_I8: *out = (int8_t)p[0]; break;
    case FLX_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); *out = x; break; }
    case FLX_GGUF_I16: { int16_t x; memcpy(&x, p, 2); *out = x; break; }
    case FLX_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); *out = x; break; }
    case FLX_GGUF_I32: { int32_t x; memcpy(&x, p, 4); *out = x; break; }
    case FLX_GGUF_I64: { int64_t x; memcpy(&x, p, 8); *out = x; break; }
    case FLX_GGUF_U64: {
        uint64_t x;
        memcpy(&x, p, 8);
        if (x > INT64_MAX) return flx_error_set(FLX_ERR_FORMAT, "gguf array element %llu = %llu exceeds i64",
                                                (unsigned long long)i, (unsigned long long)x);
        *out = (int64_t)x;
        break;
    }
    default: return flx_error_set(FLX_ERR_INTERNAL, "gguf array element type %d", (int)a->elem);
    }
    return FLX_OK;
}

flx_status_t flx_gguf_arr_f32(const flx_gguf_array_t *a, uint64_t i, float *out)
{
    if (i >= a->n || (a->elem != FLX_GGUF_F32 && a->elem != FLX_GGUF_F64))
        return flx_error_set(FLX_ERR_INVALID, "gguf array of %s[%llu]: no float element %llu",
                             flx_gguf_type_name(a->elem), (unsigned long long)a->n, (unsigned long long)i);
    if (a->elem == FLX_GGUF_F32) {
        memcpy(out, (const uint8_t *)a->data + 4 * i, 4);
    } else {
        double d;
        memcpy(&d, (const uint8_t *)a->data + 8 * i, 8);
        *out = (float)d;
    }
    return FLX_OK;
}

const flx_gguf_array_t *flx_gguf_arr_sub(const flx_gguf_array_t *a, uint64_t i)
{
    return a->elem == FLX_GGUF_ARRAY && i < a->n ? &a->sub[i] : NULL;
}
