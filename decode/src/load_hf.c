/*
 * load_hf.c - Hugging Face checkpoint (config.json + safetensors) <-> flx_model_t, and the
 * flx_model_load dispatcher.
 *
 * DESIGN
 * BF16 is both the usual checkpoint dtype and the runtime's weight dtype, so a BF16 matrix is used
 * in place: the weight pointer aims into the read-only mapping of its shard, and the model keeps
 * every shard reader open (a FLX_MEM_RELEASE region) until flx_model_destroy. Pages come in on
 * first touch and are shared with the page cache, so loading is O(header) and two processes
 * serving the same checkpoint share one copy. F16/F32 matrices and all norm/bias vectors (the
 * runtime wants fp32 there) are converted into model-owned heap memory.
 *
 * Files read:
 *   DIR/config.json                       model_type llama | qwen2 (or architectures[0]) and sizes
 *   DIR/model.safetensors.index.json      {"weight_map": {tensor: shard file name}} when sharded,
 *   DIR/<shard>.safetensors               shard names must be plain file names inside DIR
 *   DIR/model.safetensors                 otherwise
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flx/bf16.h"
#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/progress.h"
#include "flx/safetensors.h"
#include "flx/util.h"
#include "model_internal.h"

/* Size caps of the JSON files: cJSON's tree of a document takes up to ~40 bytes per byte of it. */
#define HF_MAX_CONFIG (1u << 20)
#define HF_MAX_INDEX (16u << 20)
#define HF_MAX_SHARDS 4096

static flx_status_t read_json(const char *path, size_t cap, cJSON **out)
{
    char *txt = NULL;
    flx_status_t st = flx_file_read(path, cap, &txt, NULL);
    if (st != FLX_OK) return st;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return flx_error_set(FLX_ERR_FORMAT, "file %s: not a JSON object", path);
    }
    *out = j;
    return FLX_OK;
}

/* Writes text to path atomically (temporary file + rename). */
static flx_status_t write_text(const char *path, const char *text)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return flx_error_set(FLX_ERR_INVALID, "path %s too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return flx_error_set(flx_status_from_errno(errno), "file %s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return flx_error_set(FLX_ERR_IO, "file %s: write failed: %s", path, strerror(errno));
    }
    return FLX_OK;
}

/* ---- config.json ---- */

typedef struct {
    const char *path;   /* config.json path, for messages */
    const cJSON *root;
} jcfg_t;

static flx_status_t j_num(const jcfg_t *j, const char *field, int required, double dflt, double *out)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j->root, field);
    if (!x || cJSON_IsNull(x)) {
        if (required) return flx_error_set(FLX_ERR_NOT_FOUND, "file %s: field '%s' is missing", j->path, field);
        *out = dflt;
        return FLX_OK;
    }
    if (!cJSON_IsNumber(x))
        return flx_error_set(FLX_ERR_FORMAT, "file %s: field '%s' is not a number", j->path, field);
    *out = x->valuedouble;
    return FLX_OK;
}

static flx_status_t j_u32(const jcfg_t *j, const char *field, int required, uint32_t dflt, uint32_t *out)
{
    double v = 0;
    flx_status_t st = j_num(j, field, required, dflt, &v);
    if (st != FLX_OK) return st;
    if (!(v >= 0 && v <= UINT32_MAX) || v != (double)(uint32_t)v)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: field '%s' = %g is not a u32 integer", j->path, field, v);
    *out = (uint32_t)v;
    return FLX_OK;
}

static flx_status_t j_f32(const jcfg_t *j, const char *field, int required, double dflt, float *out)
{
    double v = 0;
    flx_status_t st = j_num(j, field, required, dflt, &v);
    if (st != FLX_OK) return st;
    if (!isfinite((float)v))   /* 1e39 is a JSON number but no float: it would become inf */
        return flx_error_set(FLX_ERR_FORMAT, "file %s: field '%s' is %g, beyond the range of a float", j->path, field, v);
    *out = (float)v;
    return FLX_OK;
}

static flx_status_t parse_rope_scaling(const jcfg_t *j, flx_model_config_t *cfg)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j->root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return FLX_OK;
    if (!cJSON_IsObject(rs)) return flx_error_set(FLX_ERR_FORMAT, "file %s: field 'rope_scaling' is not an object", j->path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : NULL;
    if (!type) return flx_error_set(FLX_ERR_FORMAT, "file %s: field 'rope_scaling.rope_type' is missing", j->path);
    if (!strcmp(type, "default")) return FLX_OK;
    if (strcmp(type, "llama3") != 0)
        return flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: rope_scaling type '%s' (only llama3 is supported)", j->path,
                             type);
    jcfg_t sub = {j->path, rs};
    flx_status_t st;
    if ((st = j_f32(&sub, "factor", 1, 0, &cfg->rope_factor)) != FLX_OK ||
        (st = j_f32(&sub, "low_freq_factor", 1, 0, &cfg->rope_low_freq_factor)) != FLX_OK ||
        (st = j_f32(&sub, "high_freq_factor", 1, 0, &cfg->rope_high_freq_factor)) != FLX_OK ||
        (st = j_u32(&sub, "original_max_position_embeddings", 1, 0, &cfg->rope_orig_ctx)) != FLX_OK)
        return st;
    cfg->rope_scaling = FLX_ROPE_LLAMA3;
    return FLX_OK;
}

static flx_status_t parse_config(const char *dir, const char *path, flx_model_config_t *cfg)
{
    cJSON *root;
    flx_status_t st = read_json(path, HF_MAX_CONFIG, &root);
    if (st != FLX_OK) return st;
    jcfg_t j = {path, root};
    memset(cfg, 0, sizeof *cfg);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    if (!type && !arch) {
        st = flx_error_set(FLX_ERR_NOT_FOUND, "file %s: field 'model_type' is missing (and no 'architectures')", path);
        goto out;
    }
    if (type ? !strcmp(type, "llama") : !strcmp(arch, "LlamaForCausalLM")) {
        cfg->arch = FLX_ARCH_LLAMA;
    } else if (type ? !strcmp(type, "qwen2") : !strcmp(arch, "Qwen2ForCausalLM")) {
        cfg->arch = FLX_ARCH_QWEN2;
        cfg->qkv_bias = 1;
    } else {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: model_type '%s' is not supported (llama, qwen2)", path,
                           type ? type : arch);
        goto out;
    }
    /* Variants this runtime would silently compute wrong: refuse them by name. */
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, no_bias[i]);
        if (cJSON_IsTrue(b) && (i == 1 || cfg->arch == FLX_ARCH_LLAMA)) {
            st = flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: field '%s' is true (not supported)", path, no_bias[i]);
            goto out;
        }
    }
    /* Qwen2's sliding window (layers from max_window_layers on attend to the last sliding_window
     * tokens only): this runtime attends to all of them, so past the window its output would differ */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window"))) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: field 'use_sliding_window' is true (sliding-window "
                                                "attention is not supported)", path);
        goto out;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu"))) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "file %s: field 'hidden_act' is '%s', only silu is supported", path,
                           cJSON_IsString(act) ? act->valuestring : "(not a string)");
        goto out;
    }
    double tie = 0;
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (tj && !cJSON_IsBool(tj) && !cJSON_IsNull(tj)) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: field 'tie_word_embeddings' is not a bool", path);
        goto out;
    }
    tie = cJSON_IsTrue(tj);
    if ((st = j_u32(&j, "hidden_size", 1, 0, &cfg->hidden)) != FLX_OK ||
        (st = j_u32(&j, "intermediate_size", 1, 0, &cfg->ffn)) != FLX_OK ||
        (st = j_u32(&j, "num_hidden_layers", 1, 0, &cfg->n_layers)) != FLX_OK ||
        (st = j_u32(&j, "num_attention_heads", 1, 0, &cfg->n_heads)) != FLX_OK ||
        (st = j_u32(&j, "num_key_value_heads", 0, cfg->n_heads, &cfg->n_kv_heads)) != FLX_OK ||
        (st = j_f32(&j, "rms_norm_eps", 1, 0, &cfg->rms_eps)) != FLX_OK ||
        (st = j_f32(&j, "rope_theta", 0, 10000.0, &cfg->rope_theta)) != FLX_OK ||
        (st = j_u32(&j, "max_position_embeddings", 1, 0, &cfg->max_ctx)) != FLX_OK ||
        (st = j_u32(&j, "vocab_size", 1, 0, &cfg->vocab)) != FLX_OK)
        goto out;
    if (cfg->n_heads == 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: field 'num_attention_heads' is 0", path);
        goto out;
    }
    if ((st = j_u32(&j, "head_dim", 0, cfg->hidden / cfg->n_heads, &cfg->head_dim)) != FLX_OK) goto out;
    if ((st = parse_rope_scaling(&j, cfg)) != FLX_OK) goto out;
    cfg->tied_embeddings = tie != 0;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    if (cJSON_IsString(nm) && nm->valuestring[0]) {
        const char *s = strrchr(nm->valuestring, '/');
        const char *base = s && s[1] ? s + 1 : nm->valuestring;
        flx_model_name_set(cfg, base, strlen(base));
    } else {
        size_t dl = strlen(dir);
        while (dl > 1 && dir[dl - 1] == '/') dl--;
        size_t b = dl;
        while (b > 0 && dir[b - 1] != '/') b--;
        flx_model_name_set(cfg, dir + b, dl - b);
    }
    if ((st = flx_model_config_check(cfg)) != FLX_OK) {
        char why[FLX_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", flx_error_msg());
        st = flx_error_set(st, "file %s: %s", path, why);
    }
out:
    cJSON_Delete(root);
    return st;
}

/* ---- weights ---- */

typedef struct {
    const char *dir;
    flx_model_t *m;
    size_t n_shards;
    char **shard_names;            /* (n_shards) file names inside dir */
    flx_st_reader_h *readers;      /* (n_shards); owned by m once opened */
    cJSON *index;                  /* parsed index file, or NULL for a single file */
    size_t n_map;
    flx_name_ent_t *map;           /* (n_map) weight_map's tensor names sorted; pos = shard index */
    char index_path[4096];
    flx_pool_h pool;               /* converts F16 / F32 in parallel; NULL: the caller alone */
} hctx_t;

static void close_reader(void *r) { flx_st_close(r); }

static flx_status_t join(char *buf, size_t cap, const char *dir, const char *name)
{
    if ((size_t)snprintf(buf, cap, "%s/%s", dir, name) >= cap)
        return flx_error_set(FLX_ERR_INVALID, "path %s/%s too long", dir, name);
    return FLX_OK;
}

static flx_status_t add_shard(hctx_t *c, const char *name)
{
    if (c->n_shards == HF_MAX_SHARDS)
        return flx_error_set(FLX_ERR_FORMAT, "file %s: more than %d shards", c->index_path, HF_MAX_SHARDS);
    char **nn = realloc(c->shard_names, (c->n_shards + 1) * sizeof *nn);
    if (!nn) return flx_error_set(FLX_ERR_NOMEM, "shard list");
    c->shard_names = nn;
    if (!(nn[c->n_shards] = strdup(name))) return flx_error_set(FLX_ERR_NOMEM, "shard list");
    c->n_shards++;
    return FLX_OK;
}

/* weight_map {tensor: shard file}: tensor names sorted for lookups (each named once), the distinct
 * shard names collected (sorting them too: a linear search per entry would make a large index
 * quadratic). */
static flx_status_t read_weight_map(hctx_t *c)
{
    flx_status_t st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(c->index, "weight_map");
    if (!cJSON_IsObject(wm))
        return flx_error_set(FLX_ERR_FORMAT, "file %s: field 'weight_map' is missing or not an object", c->index_path);
    size_t n = (size_t)cJSON_GetArraySize(wm);
    flx_name_ent_t *by_shard = calloc(n + 1, sizeof *by_shard);
    size_t *shard_of = calloc(n + 1, sizeof *shard_of);
    c->map = calloc(n + 1, sizeof *c->map);
    if (!by_shard || !shard_of || !c->map) {
        st = flx_error_set(FLX_ERR_NOMEM, "file %s: weight_map of %zu entries", c->index_path, n);
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, wm)
    {
        const char *sh = cJSON_IsString(it) ? it->valuestring : NULL;
        if (!sh) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: weight_map['%s'] is not a string", c->index_path, it->string);
            goto out;
        }
        if (!sh[0] || strchr(sh, '/') || !strcmp(sh, "..") || !strcmp(sh, ".")) {
            st = flx_error_set(FLX_ERR_FORMAT, "file %s: weight_map['%s']: shard name '%s' is not a file name inside "
                               "the checkpoint", c->index_path, it->string, sh);
            goto out;
        }
        c->map[c->n_map] = (flx_name_ent_t){it->string, c->n_map};
        by_shard[c->n_map] = (flx_name_ent_t){sh, c->n_map};
        c->n_map++;
    }
    const char *dup;
    if (flx_names_sort(c->map, c->n_map, &dup) != FLX_OK) {
        st = flx_error_set(FLX_ERR_FORMAT, "file %s: weight_map names tensor '%s' twice", c->index_path, dup);
        goto out;
    }
    (void)flx_names_sort(by_shard, c->n_map, &dup); /* shards repeat: sorted only */
    for (size_t i = 0; i < c->n_map; i++) {
        if (i == 0 || strcmp(by_shard[i - 1].name, by_shard[i].name) != 0)
            if ((st = add_shard(c, by_shard[i].name)) != FLX_OK) goto out;
        shard_of[by_shard[i].pos] = c->n_shards - 1;
    }
    for (size_t i = 0; i < c->n_map; i++) c->map[i].pos = shard_of[c->map[i].pos];
    st = FLX_OK;
out:
    free(by_shard);
    free(shard_of);
    return st;
}

static flx_status_t open_shards(hctx_t *c)
{
    flx_status_t st;
    struct stat sb;
    if ((st = join(c->index_path, sizeof c->index_path, c->dir, "model.safetensors.index.json")) != FLX_OK) return st;
    if (stat(c->index_path, &sb) == 0) {
        if ((st = read_json(c->index_path, HF_MAX_INDEX, &c->index)) != FLX_OK) return st;
        if ((st = read_weight_map(c)) != FLX_OK) return st;
    } else {
        if ((st = add_shard(c, "model.safetensors")) != FLX_OK) return st;
    }
    c->readers = calloc(c->n_shards ? c->n_shards : 1, sizeof *c->readers);
    if (!c->readers) return flx_error_set(FLX_ERR_NOMEM, "shard readers");
    for (size_t i = 0; i < c->n_shards; i++) {
        char p[4096];
        if ((st = join(p, sizeof p, c->dir, c->shard_names[i])) != FLX_OK) return st;
        if ((st = flx_st_open(p, &c->readers[i])) != FLX_OK) {
            if (c->index) {
                char why[FLX_ERROR_MSG_MAX];
                snprintf(why, sizeof why, "%s", flx_error_msg());
                return flx_error_set(st, "shard '%s' named by %s: %s", c->shard_names[i], c->index_path, why);
            }
            return st;
        }
        if ((st = flx_model_mem_add_release(c->m, c->readers[i], close_reader)) != FLX_OK) {
            flx_st_close(c->readers[i]);
            return st;
        }
    }
    return FLX_OK;
}

/* The tensor called name, and the path of its file for messages. */
static flx_status_t find(hctx_t *c, const char *name, const flx_st_tensor_t **t_p, const char **file_p)
{
    size_t s = 0;
    if (c->index) {
        const flx_name_ent_t *e = flx_names_find(c->map, c->n_map, name);
        if (!e) return flx_error_set(FLX_ERR_NOT_FOUND, "checkpoint %s: tensor '%s' is missing from %s", c->dir, name,
                                     c->index_path);
        s = e->pos;
    }
    const flx_st_tensor_t *t = flx_st_find(c->readers[s], name);
    if (!t)
        return flx_error_set(c->index ? FLX_ERR_FORMAT : FLX_ERR_NOT_FOUND, "checkpoint %s: tensor '%s' is missing%s%s",
                             c->dir, name, c->index ? " from shard " : "", c->index ? c->shard_names[s] : "");
    *t_p = t;
    *file_p = c->shard_names[s];
    return FLX_OK;
}

typedef struct convert_job {
    const uint8_t *src;
    flx_dtype_t dtype;        /* F32 or F16 */
    flx_bf16_t *dst;
} convert_job_t;

static flx_status_t convert_range(void *ctx, const flx_pool_worker_t *w, uint64_t i0, uint64_t i1)
{
    (void)w;
    const convert_job_t *j = ctx;
    for (uint64_t i = i0; i < i1; i++) {
        if (j->dtype == FLX_DT_F32) {
            float f;
            memcpy(&f, j->src + 4 * i, 4);
            j->dst[i] = flx_f32_to_bf16(f);
        } else {
            uint16_t h;
            memcpy(&h, j->src + 2 * i, 2);
            j->dst[i] = flx_f32_to_bf16(flx_f16_to_f32(h));
        }
    }
    return FLX_OK;
}

static flx_status_t load_mat(hctx_t *c, const char *name, uint32_t rows, uint32_t cols, flx_wmat_t *dst_p)
{
    const flx_st_tensor_t *t;
    const char *file;
    flx_status_t st = find(c, name, &t, &file);
    if (st != FLX_OK) return st;
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return flx_error_set(FLX_ERR_FORMAT, "file %s/%s: tensor '%s' has %d dims [%lld, %lld], expected [%u, %u]",
                             c->dir, file, name, t->n_dims, (long long)t->shape[0],
                             (long long)(t->n_dims > 1 ? t->shape[1] : 0), rows, cols);
    const size_t n = (size_t)rows * cols;
    if (t->dtype == FLX_DT_BF16 && ((uintptr_t)t->data & 1) == 0) {
        *dst_p = (flx_wmat_t){t->data, FLX_WFMT_BF16};
        return FLX_OK;
    }
    if (t->dtype != FLX_DT_BF16 && t->dtype != FLX_DT_F16 && t->dtype != FLX_DT_F32)
        return flx_error_set(FLX_ERR_FORMAT, "file %s/%s: tensor '%s' has dtype %s, expected BF16, F16 or F32", c->dir,
                             file, name, flx_dtype_name(t->dtype));
    flx_bf16_t *dst = flx_model_mem_alloc(c->m, n * 2);
    if (!dst) return FLX_ERR_NOMEM;
    if (t->dtype == FLX_DT_BF16) {
        memcpy(dst, t->data, n * 2);
    } else {
        convert_job_t j = {.src = t->data, .dtype = t->dtype, .dst = dst};
        (void)flx_pool_for(n >= (1u << 18) ? c->pool : NULL, n, 1u << 16, convert_range, &j);
    }
    *dst_p = (flx_wmat_t){dst, FLX_WFMT_BF16};
    return FLX_OK;
}

static flx_status_t load_vec(hctx_t *c, const char *name, uint32_t len, const float **dst_p)
{
    const flx_st_tensor_t *t;
    const char *file;
    flx_status_t st = find(c, name, &t, &file);
    if (st != FLX_OK) return st;
    if (t->n_dims != 1 || t->shape[0] != len)
        return flx_error_set(FLX_ERR_FORMAT, "file %s/%s: tensor '%s' has %d dims [%lld], expected [%u]", c->dir, file,
                             name, t->n_dims, (long long)(t->n_dims ? t->shape[0] : 0), len);
    if (t->dtype != FLX_DT_BF16 && t->dtype != FLX_DT_F16 && t->dtype != FLX_DT_F32)
        return flx_error_set(FLX_ERR_FORMAT, "file %s/%s: tensor '%s' has dtype %s, expected BF16, F16 or F32", c->dir,
                             file, name, flx_dtype_name(t->dtype));
    float *dst = flx_model_mem_alloc(c->m, (size_t)len * 4);
    if (!dst) return FLX_ERR_NOMEM;
    const uint8_t *src = t->data;
    for (uint32_t i = 0; i < len; i++) {
        uint16_t h;
        if (t->dtype == FLX_DT_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else {
            memcpy(&h, src + 2 * i, 2);
            dst[i] = t->dtype == FLX_DT_BF16 ? flx_bf16_to_f32(h) : flx_f16_to_f32(h);
        }
    }
    *dst_p = dst;
    return FLX_OK;
}

static flx_status_t load_weights(hctx_t *c)
{
    flx_model_t *m = c->m;
    const flx_model_config_t *cfg = &m->cfg;
    const uint32_t H = cfg->hidden, qd = cfg->n_heads * cfg->head_dim, kvd = cfg->n_kv_heads * cfg->head_dim;
    flx_status_t st;
    if ((st = load_mat(c, "model.embed_tokens.weight", cfg->vocab, H, &m->tok_embd)) != FLX_OK ||
        (st = load_vec(c, "model.norm.weight", H, &m->out_norm)) != FLX_OK)
        return st;
    if (cfg->tied_embeddings) m->lm_head = m->tok_embd;
    else if ((st = load_mat(c, "lm_head.weight", cfg->vocab, H, &m->lm_head)) != FLX_OK) return st;
    for (uint32_t l = 0; l < cfg->n_layers; l++) {
        flx_layer_weights_t *w = &m->layers[l];
        char n[12][96];
        static const char *const sfx[12] = {
            "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
            "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias"};
        for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "model.layers.%u.%s", l, sfx[i]);
        if ((st = load_vec(c, n[0], H, &w->attn_norm)) != FLX_OK || (st = load_mat(c, n[1], qd, H, &w->wq)) != FLX_OK ||
            (st = load_mat(c, n[2], kvd, H, &w->wk)) != FLX_OK || (st = load_mat(c, n[3], kvd, H, &w->wv)) != FLX_OK ||
            (st = load_mat(c, n[4], H, qd, &w->wo)) != FLX_OK || (st = load_vec(c, n[5], H, &w->ffn_norm)) != FLX_OK ||
            (st = load_mat(c, n[6], cfg->ffn, H, &w->w_gate)) != FLX_OK ||
            (st = load_mat(c, n[7], cfg->ffn, H, &w->w_up)) != FLX_OK ||
            (st = load_mat(c, n[8], H, cfg->ffn, &w->w_down)) != FLX_OK)
            return st;
        if (cfg->qkv_bias &&
            ((st = load_vec(c, n[9], qd, &w->bq)) != FLX_OK || (st = load_vec(c, n[10], kvd, &w->bk)) != FLX_OK ||
             (st = load_vec(c, n[11], kvd, &w->bv)) != FLX_OK))
            return st;
        flx_progress_report("loading model", l + 1, cfg->n_layers, "layers");
    }
    return FLX_OK;
}

flx_status_t flx_model_load_hf(const char *dir, flx_model_t **model_p)
{
    return flx_model_load_hf_pool(dir, NULL, model_p);
}

flx_status_t flx_model_load_hf_pool(const char *dir, flx_pool_h pool, flx_model_t **model_p)
{
    flx_model_config_t cfg;
    char path[4096];
    hctx_t c = {.dir = dir, .pool = pool};
    flx_status_t st;
    if ((st = join(path, sizeof path, dir, "config.json")) != FLX_OK) return st;
    if ((st = parse_config(dir, path, &cfg)) != FLX_OK) return st;
    if ((st = flx_model_alloc(&cfg, &c.m)) != FLX_OK) return st;
    if ((st = open_shards(&c)) != FLX_OK) goto out;
    if ((st = load_weights(&c)) != FLX_OK) goto out;
    flx_log_info("model", "loaded %s (%u layers, hidden %u, %u/%u heads of %u) from %s, %zu shard(s)", cfg.name,
                 cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, dir, c.n_shards);
    *model_p = c.m;
    c.m = NULL;
out:
    flx_model_destroy(c.m); /* closes the readers it was given */
    for (size_t i = 0; i < c.n_shards; i++) free(c.shard_names[i]);
    free(c.shard_names);
    free(c.readers);
    free(c.map);
    cJSON_Delete(c.index);
    return st;
}

flx_status_t flx_model_load(const char *path, flx_model_t **model_p)
{
    return flx_model_load_pool(path, NULL, model_p);
}

flx_status_t flx_weights_parse(const char *s, flx_weights_t *w)
{
    if (s && !strcmp(s, "compact")) *w = FLX_WEIGHTS_COMPACT;
    else if (s && !strcmp(s, "bf16")) *w = FLX_WEIGHTS_BF16;
    else return flx_error_set(FLX_ERR_INVALID, "weights '%s' is not compact or bf16", s ? s : "(null)");
    return FLX_OK;
}

const char *flx_weights_name(flx_weights_t w)
{
    return w == FLX_WEIGHTS_COMPACT ? "compact" : w == FLX_WEIGHTS_BF16 ? "bf16" : "?";
}

flx_status_t flx_model_load_pool(const char *path, flx_pool_h pool, flx_model_t **model_p)
{
    return flx_model_load_as(path, pool, FLX_WEIGHTS_COMPACT, model_p);
}

flx_status_t flx_model_load_as(const char *path, flx_pool_h pool, flx_weights_t w, flx_model_t **model_p)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return flx_error_set(flx_status_from_errno(errno), "model %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return flx_model_load_hf_pool(path, pool, model_p);
    size_t n = strlen(path);
    char magic[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, magic, 4) != 4) memset(magic, 0, 4);
        close(fd);
    }
    if ((n >= 5 && !strcmp(path + n - 5, ".gguf")) || !memcmp(magic, "GGUF", 4))
        return flx_model_load_gguf_as(path, pool, w, model_p);
    return flx_error_set(FLX_ERR_UNSUPPORTED, "model %s: neither a checkpoint directory nor a gguf file", path);
}

/* ---- writer ---- */

static flx_status_t add_tensor(flx_st_writer_h w, const char *name, flx_dtype_t dt, int n_dims, const int64_t *shape,
                               const void *src, int src_is_f32)
{
    size_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= (size_t)shape[d];
    void *buf = malloc(n * flx_dtype_size(dt) + 1);
    if (!buf) return flx_error_set(FLX_ERR_NOMEM, "tensor '%s'", name);
    for (size_t i = 0; i < n; i++) {
        float f = src_is_f32 ? ((const float *)src)[i] : flx_bf16_to_f32(((const flx_bf16_t *)src)[i]);
        if (dt == FLX_DT_F32) ((float *)buf)[i] = f;
        else if (dt == FLX_DT_F16) ((uint16_t *)buf)[i] = flx_f32_to_f16(f);
        else ((flx_bf16_t *)buf)[i] = flx_f32_to_bf16(f);
    }
    flx_status_t st = flx_st_writer_add(w, name, dt, n_dims, shape, buf);
    free(buf);
    return st;
}

typedef struct {
    char name[96];
    int n_dims;
    int64_t shape[2];
    const void *src;
    int is_f32;
} save_item_t;

static void item(save_item_t *it, size_t *k, const char *name, int n_dims, int64_t s0, int64_t s1, const void *src,
                 int is_f32)
{
    save_item_t *x = &it[(*k)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n_dims = n_dims, x->shape[0] = s0, x->shape[1] = s1, x->src = src, x->is_f32 = is_f32;
}

static cJSON *config_json(const flx_model_config_t *cfg, flx_dtype_t dt)
{
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    int llama = cfg->arch == FLX_ARCH_LLAMA;
    cJSON *archs = cJSON_AddArrayToObject(r, "architectures");
    if (archs) cJSON_AddItemToArray(archs, cJSON_CreateString(llama ? "LlamaForCausalLM" : "Qwen2ForCausalLM"));
    cJSON_AddStringToObject(r, "model_type", llama ? "llama" : "qwen2");
    cJSON_AddStringToObject(r, "_name_or_path", cfg->name);
    cJSON_AddNumberToObject(r, "hidden_size", cfg->hidden);
    cJSON_AddNumberToObject(r, "intermediate_size", cfg->ffn);
    cJSON_AddNumberToObject(r, "num_hidden_layers", cfg->n_layers);
    cJSON_AddNumberToObject(r, "num_attention_heads", cfg->n_heads);
    cJSON_AddNumberToObject(r, "num_key_value_heads", cfg->n_kv_heads);
    cJSON_AddNumberToObject(r, "head_dim", cfg->head_dim);
    cJSON_AddNumberToObject(r, "rms_norm_eps", cfg->rms_eps);
    cJSON_AddNumberToObject(r, "rope_theta", cfg->rope_theta);
    cJSON_AddNumberToObject(r, "max_position_embeddings", cfg->max_ctx);
    cJSON_AddNumberToObject(r, "vocab_size", cfg->vocab);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", cfg->tied_embeddings);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddStringToObject(r, "torch_dtype", dt == FLX_DT_BF16 ? "bfloat16" : dt == FLX_DT_F16 ? "float16" : "float32");
    if (llama) cJSON_AddBoolToObject(r, "attention_bias", 0);
    if (cfg->rope_scaling == FLX_ROPE_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(r, "rope_scaling");
        if (rs) {
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
            cJSON_AddNumberToObject(rs, "factor", cfg->rope_factor);
            cJSON_AddNumberToObject(rs, "low_freq_factor", cfg->rope_low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", cfg->rope_high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", cfg->rope_orig_ctx);
        }
    } else {
        cJSON_AddNullToObject(r, "rope_scaling");
    }
    return r;
}

flx_status_t flx_model_save_hf(const flx_model_t *m, const char *dir, flx_dtype_t dt, uint32_t n_shards)
{
    if (!m || !dir) return flx_error_set(FLX_ERR_INVALID, "save_hf: model or dir is NULL");
    if (dt != FLX_DT_BF16 && dt != FLX_DT_F16 && dt != FLX_DT_F32)
        return flx_error_set(FLX_ERR_INVALID, "save_hf: dtype %s (expected BF16, F16 or F32)", flx_dtype_name(dt));
    flx_status_t st = flx_model_check_bf16(m, "save_hf");
    if (st != FLX_OK) return st;
    const flx_model_config_t *cfg = &m->cfg;
    const int64_t H = cfg->hidden, qd = (int64_t)cfg->n_heads * cfg->head_dim,
                  kvd = (int64_t)cfg->n_kv_heads * cfg->head_dim, F = cfg->ffn, V = cfg->vocab;
    const size_t per_layer = cfg->qkv_bias ? 12 : 9, n_items = 3 + per_layer * cfg->n_layers;
    if (n_shards == 0 || n_shards > n_items)
        return flx_error_set(FLX_ERR_INVALID, "save_hf: %u shards for %zu tensors", n_shards, n_items);
    save_item_t *it = calloc(n_items, sizeof *it);
    cJSON *cfgj = config_json(cfg, dt), *index = cJSON_CreateObject(), *wmap = NULL;
    char *txt = NULL;
    flx_st_writer_h w = NULL;
    if (!it || !cfgj || !index) {
        st = flx_error_set(FLX_ERR_NOMEM, "save_hf");
        goto out;
    }
    size_t k = 0;
    char nm[96];
    item(it, &k, "model.embed_tokens.weight", 2, V, H, m->tok_embd.p, 0);
    for (uint32_t l = 0; l < cfg->n_layers; l++) {
        const flx_layer_weights_t *lw = &m->layers[l];
#define LAYER(sfx) (snprintf(nm, sizeof nm, "model.layers.%u.%s", l, sfx), nm)
        item(it, &k, LAYER("input_layernorm.weight"), 1, H, 0, lw->attn_norm, 1);
        item(it, &k, LAYER("self_attn.q_proj.weight"), 2, qd, H, lw->wq.p, 0);
        item(it, &k, LAYER("self_attn.k_proj.weight"), 2, kvd, H, lw->wk.p, 0);
        item(it, &k, LAYER("self_attn.v_proj.weight"), 2, kvd, H, lw->wv.p, 0);
        if (cfg->qkv_bias) {
            item(it, &k, LAYER("self_attn.q_proj.bias"), 1, qd, 0, lw->bq, 1);
            item(it, &k, LAYER("self_attn.k_proj.bias"), 1, kvd, 0, lw->bk, 1);
            item(it, &k, LAYER("self_attn.v_proj.bias"), 1, kvd, 0, lw->bv, 1);
        }
        item(it, &k, LAYER("self_attn.o_proj.weight"), 2, H, qd, lw->wo.p, 0);
        item(it, &k, LAYER("post_attention_layernorm.weight"), 1, H, 0, lw->ffn_norm, 1);
        item(it, &k, LAYER("mlp.gate_proj.weight"), 2, F, H, lw->w_gate.p, 0);
        item(it, &k, LAYER("mlp.up_proj.weight"), 2, F, H, lw->w_up.p, 0);
        item(it, &k, LAYER("mlp.down_proj.weight"), 2, H, F, lw->w_down.p, 0);
#undef LAYER
    }
    item(it, &k, "model.norm.weight", 1, H, 0, m->out_norm, 1);
    if (!cfg->tied_embeddings) item(it, &k, "lm_head.weight", 2, V, H, m->lm_head.p, 0);
    const size_t n = k;
    if (n_shards > n) {
        st = flx_error_set(FLX_ERR_INVALID, "save_hf: %u shards for %zu tensors", n_shards, n);
        goto out;
    }
    char path[4096], fname[64];
    double total = 0;
    wmap = cJSON_AddObjectToObject(index, "weight_map");
    if (!wmap) {
        st = flx_error_set(FLX_ERR_NOMEM, "save_hf index");
        goto out;
    }
    for (uint32_t s = 0; s < n_shards; s++) {
        size_t b = s * n / n_shards, e = (s + 1) * n / n_shards;
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05u-of-%05u.safetensors", s + 1, n_shards);
        if ((st = flx_st_writer_create(&w)) != FLX_OK) goto out;
        if ((st = flx_st_writer_set_metadata(w, "format", "pt")) != FLX_OK) goto out;
        for (size_t i = b; i < e; i++) {
            if ((st = add_tensor(w, it[i].name, dt, it[i].n_dims, it[i].shape, it[i].src, it[i].is_f32)) != FLX_OK)
                goto out;
            cJSON_AddStringToObject(wmap, it[i].name, fname);
            total += (double)(it[i].shape[0] * (it[i].n_dims == 2 ? it[i].shape[1] : 1)) * (double)flx_dtype_size(dt);
        }
        if ((st = join(path, sizeof path, dir, fname)) != FLX_OK) goto out;
        if ((st = flx_st_writer_save(w, path)) != FLX_OK) goto out;
        flx_st_writer_destroy(w);
        w = NULL;
    }
    if (n_shards > 1) {
        cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
        if (meta) cJSON_AddNumberToObject(meta, "total_size", total);
        if (!(txt = cJSON_Print(index))) {
            st = flx_error_set(FLX_ERR_NOMEM, "save_hf index");
            goto out;
        }
        if ((st = join(path, sizeof path, dir, "model.safetensors.index.json")) != FLX_OK ||
            (st = write_text(path, txt)) != FLX_OK)
            goto out;
        free(txt);
        txt = NULL;
    }
    if (!(txt = cJSON_Print(cfgj))) {
        st = flx_error_set(FLX_ERR_NOMEM, "save_hf config");
        goto out;
    }
    if ((st = join(path, sizeof path, dir, "config.json")) != FLX_OK || (st = write_text(path, txt)) != FLX_OK)
        goto out;
out:
    flx_st_writer_destroy(w);
    free(txt);
    cJSON_Delete(cfgj);
    cJSON_Delete(index);
    free(it);
    return st;
}
