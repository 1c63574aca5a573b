/*
 * safetensors.c - memory-mapped safetensors reader and an atomic writer (format table in the header).
 */
#define _GNU_SOURCE
#include "flx/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flx/util.h"

#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    size_t size;
} dtypes[FLX_DT_COUNT] = {
    [FLX_DT_F32] = {"F32", 4}, [FLX_DT_F16] = {"F16", 2}, [FLX_DT_BF16] = {"BF16", 2},
    [FLX_DT_F64] = {"F64", 8}, [FLX_DT_I8] = {"I8", 1},   [FLX_DT_U8] = {"U8", 1},
    [FLX_DT_I16] = {"I16", 2}, [FLX_DT_I32] = {"I32", 4}, [FLX_DT_I64] = {"I64", 8},
    [FLX_DT_BOOL] = {"BOOL", 1},
};

const char *flx_dtype_name(flx_dtype_t dt)
{
    return (unsigned)dt < FLX_DT_COUNT ? dtypes[dt].name : "?";
}

size_t flx_dtype_size(flx_dtype_t dt)
{
    return (unsigned)dt < FLX_DT_COUNT ? dtypes[dt].size : 0;
}

int flx_dtype_parse(const char *s, flx_dtype_t *dt_p)
{
    for (int i = 0; i < FLX_DT_COUNT; i++)
        if (s && !strcmp(s, dtypes[i].name)) {
            *dt_p = (flx_dtype_t)i;
            return 0;
        }
    return -1;
}

struct flx_st_reader {
    void *map;
    size_t map_len;
    size_t n;
    flx_st_tensor_t *tensors; /* (n); names owned */
    flx_name_ent_t *by_name;  /* (n) tensors sorted by name */
    size_t n_meta;
    char **meta_kv;           /* (2 * n_meta): key, value, ... owned */
    flx_name_ent_t *by_key;   /* (n_meta) metadata sorted by key */
};

void flx_st_close(flx_st_reader_h r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free((char *)r->tensors[i].name);
    for (size_t i = 0; i < 2 * r->n_meta; i++) free(r->meta_kv[i]);
    free(r->tensors);
    free(r->by_name);
    free(r->meta_kv);
    free(r->by_key);
    if (r->map) munmap(r->map, r->map_len);
    free(r);
}

/* A JSON number that is a whole number in [0, max]; safetensors offsets and dims are integers. */
static int json_whole(const cJSON *x, double max, uint64_t *out)
{
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= max) ||
        x->valuedouble != (double)(uint64_t)x->valuedouble)
        return -1;
    *out = (uint64_t)x->valuedouble;
    return 0;
}

static flx_status_t parse_tensor(const char *path, const cJSON *it, const uint8_t *data, size_t data_len,
                                 flx_st_tensor_t *t)
{
    const char *nm = it->string;
    if (!cJSON_IsObject(it))
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s' is not a JSON object", path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || flx_dtype_parse(dt->valuestring, &t->dtype) != 0)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s' has a missing or unknown dtype '%s'", path, nm,
                             cJSON_IsString(dt) ? dt->valuestring : "");
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > FLX_ST_MAX_DIMS)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape missing or over %d dims", path, nm,
                             FLX_ST_MAX_DIMS);
    t->n_dims = cJSON_GetArraySize(sh);
    size_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t x;
        if (json_whole(cJSON_GetArrayItem(sh, d), 9.0e15, &x))
            return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                 path, nm, d);
        t->shape[d] = (int64_t)x;
        if (flx_mul_size(numel, (size_t)x, &numel) != FLX_OK)
            return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, nm);
    }
    uint64_t b, e;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", path, nm);
    if (json_whole(cJSON_GetArrayItem(off, 0), 9.0e15, &b) || json_whole(cJSON_GetArrayItem(off, 1), 9.0e15, &e) ||
        e < b || e > data_len)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': data_offsets are not whole numbers 0 <= begin <= "
                             "end <= %zu (the data bytes)", path, nm, data_len);
    size_t nbytes;
    if (flx_mul_size(numel, flx_dtype_size(t->dtype), &nbytes) != FLX_OK || nbytes != e - b)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': %zu elements of %s do not fill data_offsets [%llu, "
                             "%llu]", path, nm, numel, dtypes[t->dtype].name, (unsigned long long)b,
                             (unsigned long long)e);
    t->data = data + b;
    t->nbytes = nbytes;
    return FLX_OK;
}

static flx_status_t parse_metadata(const char *path, const cJSON *it, struct flx_st_reader *r)
{
    if (!cJSON_IsObject(it)) return flx_error_set(FLX_ERR_FORMAT, "%s: __metadata__ is not an object", path);
    size_t nm = (size_t)cJSON_GetArraySize(it);
    r->meta_kv = calloc(2 * nm + 1, sizeof *r->meta_kv);
    r->by_key = calloc(nm + 1, sizeof *r->by_key);
    if (!r->meta_kv || !r->by_key) return flx_error_set(FLX_ERR_NOMEM, "%s: %zu metadata keys", path, nm);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, it)
    {
        if (!cJSON_IsString(kv))
            return flx_error_set(FLX_ERR_FORMAT, "%s: __metadata__['%s'] is not a string", path, kv->string);
        char *k = strdup(kv->string), *v = strdup(kv->valuestring);
        if (!k || !v) {
            free(k), free(v);
            return flx_error_set(FLX_ERR_NOMEM, "%s: metadata", path);
        }
        r->meta_kv[2 * r->n_meta] = k;
        r->meta_kv[2 * r->n_meta + 1] = v;
        r->by_key[r->n_meta] = (flx_name_ent_t){k, r->n_meta};
        r->n_meta++;
    }
    const char *dup;
    if (flx_names_sort(r->by_key, r->n_meta, &dup) != FLX_OK)
        return flx_error_set(FLX_ERR_FORMAT, "%s: __metadata__ key '%s' appears twice", path, dup);
    return FLX_OK;
}

flx_status_t flx_st_open(const char *path, flx_st_reader_h *reader_p)
{
    flx_status_t st;
    cJSON *root = NULL;
    struct flx_st_reader *r = calloc(1, sizeof *r);
    if (!r) return flx_error_set(FLX_ERR_NOMEM, "safetensors reader");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = flx_error_set(flx_status_from_errno(errno), "%s: cannot open: %s", path, strerror(errno));
        goto err_free;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = flx_error_set(FLX_ERR_IO, "%s: not a regular file", path);
        goto err_close;
    }
    if (sb.st_size < 8) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: %lld bytes, too short for a safetensors header", path,
                           (long long)sb.st_size);
        goto err_close;
    }
    r->map_len = (size_t)sb.st_size;
    r->map = mmap(NULL, r->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (r->map == MAP_FAILED) {
        r->map = NULL;
        st = flx_error_set(FLX_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, r->map_len, strerror(errno));
        goto err_close;
    }
    close(fd);
    fd = -1;
    uint64_t hlen;
    memcpy(&hlen, r->map, 8); /* little-endian host assumed (x86-64, aarch64) */
    if (hlen > ST_MAX_HEADER || hlen > r->map_len - 8) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes) or the limit of %u",
                           path, (unsigned long long)hlen, r->map_len, ST_MAX_HEADER);
        goto err_close;
    }
    const char *hdr = (const char *)r->map + 8, *hend = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &hend, 0);
    if (!cJSON_IsObject(root)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: header is not a JSON object (parse stopped at byte %td of %llu)",
                           path, hend ? hend - hdr : (ptrdiff_t)-1, (unsigned long long)hlen);
        goto err_close;
    }
    for (const char *p = hend; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: header has bytes after its JSON object (at byte %td of %llu)",
                               path, p - hdr, (unsigned long long)hlen);
            goto err_close;
        }
    const uint8_t *data = (const uint8_t *)r->map + 8 + hlen;
    size_t data_len = r->map_len - 8 - hlen;
    /* The header names each object once: a second "__metadata__" or a repeated tensor name would
     * make what a reader sees depend on which copy it keeps. */
    const cJSON *it, *meta = NULL;
    size_t cap = 0;
    cJSON_ArrayForEach(it, root)
    {
        if (strcmp(it->string, "__metadata__") != 0) {
            cap++;
        } else if (meta) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: header field '__metadata__' appears twice", path);
            goto err_close;
        } else {
            meta = it;
        }
    }
    if (meta && (st = parse_metadata(path, meta, r)) != FLX_OK) goto err_close;
    r->tensors = calloc(cap + 1, sizeof *r->tensors);
    r->by_name = calloc(cap + 1, sizeof *r->by_name);
    if (!r->tensors || !r->by_name) {
        st = flx_error_set(FLX_ERR_NOMEM, "%s: %zu tensors", path, cap);
        goto err_close;
    }
    cJSON_ArrayForEach(it, root)
    {
        if (it == meta) continue;
        flx_st_tensor_t *t = &r->tensors[r->n];
        if ((st = parse_tensor(path, it, data, data_len, t)) != FLX_OK) goto err_close;
        if (!(t->name = strdup(it->string))) {
            st = flx_error_set(FLX_ERR_NOMEM, "%s: tensor name", path);
            goto err_close;
        }
        r->by_name[r->n] = (flx_name_ent_t){t->name, r->n};
        r->n++;
    }
    const char *dup;
    if (flx_names_sort(r->by_name, r->n, &dup) != FLX_OK) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s' appears twice", path, dup);
        goto err_close;
    }
    cJSON_Delete(root);
    *reader_p = r;
    return FLX_OK;

err_close:
    if (fd >= 0) close(fd);
err_free:
    cJSON_Delete(root);
    flx_st_close(r);
    return st;
}

size_t flx_st_count(flx_st_reader_h r) { return r->n; }

const flx_st_tensor_t *flx_st_at(flx_st_reader_h r, size_t i) { return i < r->n ? &r->tensors[i] : NULL; }

const flx_st_tensor_t *flx_st_find(flx_st_reader_h r, const char *name)
{
    const flx_name_ent_t *e = flx_names_find(r->by_name, r->n, name);
    return e ? &r->tensors[e->pos] : NULL;
}

const char *flx_st_metadata(flx_st_reader_h r, const char *key)
{
    const flx_name_ent_t *e = flx_names_find(r->by_key, r->n_meta, key);
    return e ? r->meta_kv[2 * e->pos + 1] : NULL;
}

flx_status_t flx_st_expect(flx_st_reader_h r, const char *name, flx_dtype_t dtype, int n_dims,
                           const int64_t *expect_shape, const flx_st_tensor_t **tensor_p)
{
    const flx_st_tensor_t *t = flx_st_find(r, name);
    if (!t) return flx_error_set(FLX_ERR_NOT_FOUND, "tensor '%s' is missing", name);
    if (t->dtype != dtype)
        return flx_error_set(FLX_ERR_FORMAT, "tensor '%s' has dtype %s, expected %s", name, flx_dtype_name(t->dtype),
                             flx_dtype_name(dtype));
    if (t->n_dims != n_dims)
        return flx_error_set(FLX_ERR_FORMAT, "tensor '%s' has %d dims, expected %d", name, t->n_dims, n_dims);
    for (int d = 0; d < n_dims; d++)
        if (expect_shape && expect_shape[d] >= 0 && t->shape[d] != expect_shape[d])
            return flx_error_set(FLX_ERR_FORMAT, "tensor '%s' has shape[%d] = %lld, expected %lld", name, d,
                                 (long long)t->shape[d], (long long)expect_shape[d]);
    *tensor_p = t;
    return FLX_OK;
}

/* ---- writer ---- */

typedef struct st_wt {
    char *name;
    flx_dtype_t dtype;
    int n_dims;
    int64_t shape[FLX_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
} st_wt_t;

struct flx_st_writer {
    st_wt_t *t;
    size_t n, cap;
    cJSON *meta;
};

flx_status_t flx_st_writer_create(flx_st_writer_h *w_p)
{
    struct flx_st_writer *w = calloc(1, sizeof *w);
    if (!w) return flx_error_set(FLX_ERR_NOMEM, "safetensors writer");
    *w_p = w;
    return FLX_OK;
}

void flx_st_writer_destroy(flx_st_writer_h w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    cJSON_Delete(w->meta);
    free(w);
}

flx_status_t flx_st_writer_add(flx_st_writer_h w, const char *name, flx_dtype_t dtype, int n_dims,
                               const int64_t *shape, const void *data)
{
    if (!name || !*name || !strcmp(name, "__metadata__") || n_dims < 0 || n_dims > FLX_ST_MAX_DIMS ||
        (unsigned)dtype >= FLX_DT_COUNT)
        return flx_error_set(FLX_ERR_INVALID, "safetensors writer: bad tensor '%s'", name ? name : "(null)");
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name))
            return flx_error_set(FLX_ERR_DUPLICATE, "safetensors writer: tensor '%s' added twice", name);
    size_t numel = 1;
    for (int d = 0; d < n_dims; d++)
        if (shape[d] < 0 || flx_mul_size(numel, (size_t)shape[d], &numel) != FLX_OK)
            return flx_error_set(FLX_ERR_INVALID, "safetensors writer: tensor '%s' shape[%d]", name, d);
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 16;
        st_wt_t *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return flx_error_set(FLX_ERR_NOMEM, "safetensors writer");
        w->t = nt;
        w->cap = nc;
    }
    size_t nbytes;
    if (flx_mul_size(numel, dtypes[dtype].size, &nbytes) != FLX_OK)
        return flx_error_set(FLX_ERR_INVALID, "safetensors writer: tensor '%s' byte size overflows", name);
    st_wt_t *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->nbytes = nbytes;
    t->name = strdup(name);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return flx_error_set(FLX_ERR_NOMEM, "safetensors writer: %zu bytes for '%s'", t->nbytes, name);
    }
    if (t->nbytes) memcpy(t->data, data, t->nbytes);
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->shape[d] = shape[d];
    w->n++;
    return FLX_OK;
}

flx_status_t flx_st_writer_set_metadata(flx_st_writer_h w, const char *key, const char *value)
{
    if (!w->meta && !(w->meta = cJSON_CreateObject())) return flx_error_set(FLX_ERR_NOMEM, "metadata");
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    if (!cJSON_AddStringToObject(w->meta, key, value)) return flx_error_set(FLX_ERR_NOMEM, "metadata");
    return FLX_OK;
}

static flx_status_t write_all(int fd, const void *buf, size_t len, const char *path)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            return flx_error_set(FLX_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += k;
        len -= (size_t)k;
    }
    return FLX_OK;
}

flx_status_t flx_st_writer_save(flx_st_writer_h w, const char *path)
{
    flx_status_t st = FLX_OK;
    cJSON *root = cJSON_CreateObject();
    char *js = NULL, *tmp = NULL;
    int fd = -1;
    if (!root) return flx_error_set(FLX_ERR_NOMEM, "safetensors header");
    if (w->meta && !cJSON_AddItemReferenceToObject(root, "__metadata__", w->meta)) {
        cJSON_Delete(root);
        return flx_error_set(FLX_ERR_NOMEM, "safetensors header");
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *of = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "dtype", dtypes[w->t[i].dtype].name);
        for (int d = 0; d < w->t[i].n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)w->t[i].shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + w->t[i].nbytes)));
        cJSON_AddItemToObject(o, "data_offsets", of);
        cJSON_AddItemToObject(root, w->t[i].name, o);
        off += w->t[i].nbytes;
    }
    js = cJSON_PrintUnformatted(root);
    if (!js) {
        st = flx_error_set(FLX_ERR_NOMEM, "safetensors header");
        goto out;
    }
    size_t jl = strlen(js), padded = FLX_ALIGN_UP(jl, 8);
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) {
        tmp = NULL;
        st = flx_error_set(FLX_ERR_NOMEM, "path");
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = flx_error_set(flx_status_from_errno(errno), "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    uint64_t hl = padded;
    char spaces[8] = "        ";
    if ((st = write_all(fd, &hl, 8, path)) || (st = write_all(fd, js, jl, path)) ||
        (st = write_all(fd, spaces, padded - jl, path)))
        goto out;
    for (size_t i = 0; i < w->n; i++)
        if ((st = write_all(fd, w->t[i].data, w->t[i].nbytes, path))) goto out;
    if (fsync(fd) != 0 || close(fd) != 0) {
        fd = -1;
        st = flx_error_set(FLX_ERR_IO, "%s: flush failed: %s", path, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) st = flx_error_set(FLX_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
out:
    if (fd >= 0) close(fd);
    if (st != FLX_OK && tmp) unlink(tmp);
    free(tmp);
    free(js);
    /* The reference item (and its key) belongs to root; the referenced object stays the writer's:
     * cJSON_Delete frees a reference without following it. */
    cJSON_Delete(root);
    return st;
}
