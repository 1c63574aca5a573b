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
    flx_st_tensor_t *tensors; /* (n) */
    char **names;             /* (n), owned */
    size_t n_meta;
    char **meta_kv;           /* (2 * n_meta): key, value, ... */
};

void flx_st_close(flx_st_reader_h r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free(r->names[i]);
    for (size_t i = 0; i < 2 * r->n_meta; i++) free(r->meta_kv[i]);
    free(r->names);
    free(r->tensors);
    free(r->meta_kv);
    if (r->map) munmap(r->map, r->map_len);
    free(r);
}

static flx_status_t parse_tensor(const char *path, const cJSON *it, const uint8_t *data, size_t data_len,
                                 flx_st_tensor_t *t)
{
    const char *nm = it->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsObject(it))
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s' is not a JSON object", path, nm);
    if (!cJSON_IsString(dt) || flx_dtype_parse(dt->valuestring, &t->dtype) != 0)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s' has a missing or unknown dtype '%s'", path, nm,
                             cJSON_IsString(dt) ? dt->valuestring : "");
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > FLX_ST_MAX_DIMS)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape missing or over %d dims", path, nm,
                             FLX_ST_MAX_DIMS);
    t->n_dims = cJSON_GetArraySize(sh);
    size_t numel = 1;
    for (int d = 0; d < t->n_dims; d++) {
        const cJSON *x = cJSON_GetArrayItem(sh, d);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
            x->valuedouble != (double)(int64_t)x->valuedouble)
            return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                 path, nm, d);
        t->shape[d] = (int64_t)x->valuedouble;
        if (flx_mul_size(numel, (size_t)t->shape[d], &numel) != FLX_OK)
            return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, nm);
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", path, nm);
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) || b < 0 ||
        e < b || e > (double)data_len)
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the %zu data bytes",
                             path, nm, b, e, data_len);
    size_t nbytes;
    if (flx_mul_size(numel, flx_dtype_size(t->dtype), &nbytes) != FLX_OK || nbytes != (size_t)(e - b))
        return flx_error_set(FLX_ERR_FORMAT, "%s: tensor '%s': %zu elements of %s need %zu bytes, offsets give %.0f",
                             path, nm, numel, dtypes[t->dtype].name, numel * flx_dtype_size(t->dtype), e - b);
    t->data = data + (size_t)b;
    t->nbytes = nbytes;
    return FLX_OK;
}

flx_status_t flx_st_open(const char *path, flx_st_reader_h *reader_p)
{
    flx_status_t st;
    cJSON *root = NULL;
    char *hdr = NULL;
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
        st = flx_error_set(FLX_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes) or the limit", path,
                           (unsigned long long)hlen, r->map_len);
        goto err_close;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) {
        st = flx_error_set(FLX_ERR_NOMEM, "%s: header of %llu bytes", path, (unsigned long long)hlen);
        goto err_close;
    }
    memcpy(hdr, (uint8_t *)r->map + 8, hlen);
    hdr[hlen] = '\0';
    root = cJSON_Parse(hdr);
    if (!cJSON_IsObject(root)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto err_close;
    }
    const uint8_t *data = (const uint8_t *)r->map + 8 + hlen;
    size_t data_len = r->map_len - 8 - hlen;
    size_t cap = (size_t)cJSON_GetArraySize(root);
    r->tensors = calloc(cap ? cap : 1, sizeof *r->tensors);
    r->names = calloc(cap ? cap : 1, sizeof *r->names);
    if (!r->tensors || !r->names) {
        st = flx_error_set(FLX_ERR_NOMEM, "%s: %zu tensors", path, cap);
        goto err_close;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (!strcmp(it->string, "__metadata__")) {
            if (!cJSON_IsObject(it)) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                goto err_close;
            }
            size_t nm = (size_t)cJSON_GetArraySize(it);
            r->meta_kv = calloc(2 * nm + 1, sizeof *r->meta_kv);
            if (!r->meta_kv) {
                st = flx_error_set(FLX_ERR_NOMEM, "%s: metadata", path);
                goto err_close;
            }
            const cJSON *kv;
            cJSON_ArrayForEach(kv, it)
            {
                if (!cJSON_IsString(kv)) {
                    st = flx_error_set(FLX_ERR_FORMAT, "%s: __metadata__['%s'] is not a string", path, kv->string);
                    goto err_close;
                }
                r->meta_kv[2 * r->n_meta] = strdup(kv->string);
                r->meta_kv[2 * r->n_meta + 1] = strdup(kv->valuestring);
                r->n_meta++;
            }
            continue;
        }
        flx_st_tensor_t *t = &r->tensors[r->n];
        st = parse_tensor(path, it, data, data_len, t);
        if (st != FLX_OK) goto err_close;
        r->names[r->n] = strdup(it->string);
        if (!r->names[r->n]) {
            st = flx_error_set(FLX_ERR_NOMEM, "%s: tensor name", path);
            goto err_close;
        }
        t->name = r->names[r->n];
        r->n++;
    }
    cJSON_Delete(root);
    free(hdr);
    *reader_p = r;
    return FLX_OK;

err_close:
    if (fd >= 0) close(fd);
err_free:
    cJSON_Delete(root);
    free(hdr);
    flx_st_close(r);
    return st;
}

size_t flx_st_count(flx_st_reader_h r) { return r->n; }

const flx_st_tensor_t *flx_st_at(flx_st_reader_h r, size_t i) { return i < r->n ? &r->tensors[i] : NULL; }

const flx_st_tensor_t *flx_st_find(flx_st_reader_h r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->tensors[i].name, name)) return &r->tensors[i];
    return NULL;
}

const char *flx_st_metadata(flx_st_reader_h r, const char *key)
{
    for (size_t i = 0; i < r->n_meta; i++)
        if (!strcmp(r->meta_kv[2 * i], key)) return r->meta_kv[2 * i + 1];
    return NULL;
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
    st_wt_t *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->nbytes = numel * dtypes[dtype].size;
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
