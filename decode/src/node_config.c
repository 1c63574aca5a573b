/*
 * node_config.c - settings of fluxion-decoded from a config file and flags (flx/node_config.h).
 *
 * DESIGN
 * One table lists every key with its kind, range and field: the file parser, the flags, the help
 * text and --print-config all read it, so a key cannot exist in one and be missing from another.
 * Values are parsed strictly (digits only, no sign, no trailing characters; addresses checked as
 * host:port) because a daemon that silently takes "8x" as 8 is worse than one that refuses to
 * start. The file parser copies each line into a bounded buffer, so no input reaches a string
 * function without a terminator.
 */
#include "flx/node_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/tokenizer.h"
#include "flx/util.h"

typedef enum { K_STR, K_ADDR, K_U32, K_BYTES, K_INT, K_PREFILL, K_ERRMODE, K_LEVEL, K_FORMAT, K_WEIGHTS } kind_t;

typedef struct key {
    const char *name;
    kind_t kind;
    size_t off;          /* offset of the field in flx_node_config_t */
    size_t size;         /* K_STR / K_ADDR: capacity of the char array */
    int64_t lo, hi;      /* numeric range */
    const char *help;
} cfg_key_t;

#define F(field) offsetof(flx_node_config_t, field)
#define S(field) sizeof(((flx_node_config_t *)0)->field)

static const cfg_key_t KEYS[] = {
    {"model", K_STR, F(model), S(model), 0, 0, "model: a .gguf file or a Hugging Face folder (required)"},
    {"weights", K_WEIGHTS, F(weights), 0, 0, 0,
     "compact: a GGUF's Q4/Q8 matrices keep their blocks (2.4x fewer bytes a step); bf16: dequantized (same values)"},
    {"model-id", K_STR, F(model_id), S(model_id), 0, 0, "id OpenSession must name (default: the model's name)"},
    {"predictor", K_STR, F(predictor), S(predictor), 0, 0,
     "Fluxion predictor weights; empty: FLUXION sessions are refused"},
    {"grpc-listen", K_ADDR, F(grpc_listen), S(grpc_listen), 0, 0, "host:port of the gRPC control service"},
    {"metrics-listen", K_ADDR, F(metrics_listen), S(metrics_listen), 0, 0,
     "host:port of the Prometheus /metrics page, or off"},
    {"prefill", K_PREFILL, F(prefill), 0, 0, 0,
     "ucx: prefill nodes push KV over UCX; local: the node prefills OpenSession's local_prefill itself"},
    {"ucx-listen", K_ADDR, F(ucx_listen), S(ucx_listen), 0, 0,
     "host:port the KV receiver listens on (prefill ucx); port 0: a free one, named by OpenSession"},
    {"ucx-advertise", K_STR, F(ucx_advertise), S(ucx_advertise), 0, 0,
     "host OpenSession tells prefill nodes to connect to; empty: ucx-listen's host"},
    {"ucx-err-mode", K_ERRMODE, F(ucx_err_mode), 0, 0, 0,
     "peer: UCX reports dead prefill peers (TCP, RDMA); none: for shared memory (UCX 1.13), liveness only"},
    {"ucx-liveness-ms", K_U32, F(ucx_liveness_ms), 0, 4, 3600000,
     "a prefill connection feeding a session and silent this long is dead"},
    {"kv-capacity", K_BYTES, F(kv_capacity_bytes), 0, 1 << 20, (int64_t)1 << 46, "host KV pool size (K/M/G/T)"},
    {"max-sessions", K_U32, F(max_sessions), 0, 1, 65536, "sessions open at once"},
    {"max-batch", K_U32, F(max_batch), 0, 1, 256, "sequences decoded per step"},
    {"max-prompt-len", K_U32, F(max_prompt_len), 0, 0, 1 << 24, "longest prompt, tokens; 0: the model's context"},
    {"max-new-tokens", K_U32, F(max_new_tokens), 0, 1, 1 << 20, "most tokens a session may reserve to generate"},
    {"threads", K_U32, F(threads), 0, 0, 1024, "workers of the node's pool (prefill and decode); 0: FLX_THREADS, else the CPU budget"},
    {"numa-node", K_INT, F(numa_node), 0, -1, 1023, "NUMA node of the KV pool; -1: the node we start on"},
    {"transfer-timeout-ms", K_U32, F(transfer_timeout_ms), 0, 1, 3600000,
     "default time a session has to become READY"},
    {"lease-ms", K_U32, F(lease_ms), 0, 1, 3600000, "default time a READY session waits for its Generate"},
    {"drain-timeout-ms", K_U32, F(drain_timeout_ms), 0, 0, 3600000,
     "on SIGTERM, how long running Generate calls may finish"},
    {"max-message-bytes", K_BYTES, F(max_message_bytes), 0, 1024, 1 << 30, "largest gRPC request message"},
    {"grpc-threads", K_U32, F(grpc_threads), 0, 1, 64, "gRPC completion-queue threads"},
    {"log-level", K_LEVEL, F(log_level), 0, 0, 0, "error | warn | info | debug"},
    {"log-format", K_FORMAT, F(log_format), 0, 0, 0, "text | json (one JSON object per line)"},
};

void flx_node_config_default(flx_node_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->grpc_listen, sizeof c->grpc_listen, "127.0.0.1:50051");
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:9464");
    c->prefill = FLX_NODE_PREFILL_UCX;
    snprintf(c->ucx_listen, sizeof c->ucx_listen, "127.0.0.1:0");
    c->ucx_liveness_ms = 10000;
    c->kv_capacity_bytes = (uint64_t)4 << 30;
    c->max_sessions = 256;
    c->max_batch = 8;
    c->max_new_tokens = 4096;
    c->numa_node = -1;
    c->transfer_timeout_ms = 30000;
    c->lease_ms = 60000;
    c->drain_timeout_ms = 30000;
    c->max_message_bytes = 4u << 20;
    c->grpc_threads = 2;
    c->log_level = FLX_LOG_INFO;
    c->log_format = FLX_LOG_TEXT;
}

static const cfg_key_t *find_key(const char *name)
{
    for (size_t i = 0; i < FLX_ARRAY_SIZE(KEYS); i++)
        if (!strcmp(KEYS[i].name, name))
            return &KEYS[i];
    return NULL;
}

const char *const *flx_node_config_keys(void)
{
    static const char *names[FLX_ARRAY_SIZE(KEYS) + 1];
    for (size_t i = 0; i < FLX_ARRAY_SIZE(KEYS); i++) names[i] = KEYS[i].name;
    return names;
}

const char *flx_node_config_help(const char *key)
{
    const cfg_key_t *k = key ? find_key(key) : NULL;
    return k ? k->help : NULL;
}

/* "host:port": a non-empty host (name, IPv4, or [IPv6]) without blanks, a port 0..65535. */
static flx_status_t check_addr(const char *key, const char *v)
{
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v)
        return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not host:port", key, v);
    for (const char *p = v; p < colon; p++)
        if (*p <= ' ' || *p == '/' || (unsigned char)*p >= 0x7f)
            return flx_error_set(FLX_ERR_INVALID, "%s '%s': the host has a character that no address has", key, v);
    if (v[0] == '[' && colon[-1] != ']')
        return flx_error_set(FLX_ERR_INVALID, "%s '%s': an IPv6 host goes in brackets", key, v);
    uint64_t port;
    if (flx_parse_u64(colon + 1, 0, 65535, &port))
        return flx_error_set(FLX_ERR_INVALID, "%s '%s': port '%s' is not an integer in 0..65535", key, v, colon + 1);
    return FLX_OK;
}

static flx_status_t parse_bytes(const char *key, const char *v, int64_t lo, int64_t hi, uint64_t *out)
{
    size_t n = strlen(v);
    uint64_t mul = 1;
    char num[32];
    if (n && strchr("KMGT", v[n - 1])) {
        static const char *suf = "KMGT";
        mul = (uint64_t)1 << (10 * (1 + (strchr(suf, v[n - 1]) - suf)));
        n--;
    }
    uint64_t x;
    if (n == 0 || n >= sizeof num)
        goto bad;
    memcpy(num, v, n);
    num[n] = '\0';
    if (flx_parse_u64(num, 0, UINT64_MAX, &x) || (x && mul > UINT64_MAX / x))
        goto bad;
    x *= mul;
    if (x < (uint64_t)lo || x > (uint64_t)hi)
        goto bad;
    *out = x;
    return FLX_OK;
bad:
    return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not a byte count in %lld..%lld (optional suffix K, M, G, T)", key,
                         v, (long long)lo, (long long)hi);
}

flx_status_t flx_node_config_set(flx_node_config_t *c, const char *key, const char *v)
{
    if (!c || !key || !v)
        return flx_error_set(FLX_ERR_INVALID, "config set: NULL argument");
    const cfg_key_t *k = find_key(key);
    if (!k)
        return flx_error_set(FLX_ERR_NOT_FOUND, "unknown setting '%s'", key);
    char *field = (char *)c + k->off;
    uint64_t u;
    int x;
    switch (k->kind) {
    case K_ADDR:
        if (strcmp(key, "metrics-listen") || strcmp(v, "off")) {
            flx_status_t st = check_addr(key, v);
            if (st)
                return st;
        }
        /* fall through */
    case K_STR:
        if (strlen(v) >= k->size)
            return flx_error_set(FLX_ERR_INVALID, "%s is %zu bytes long, at most %zu", key, strlen(v), k->size - 1);
        for (const char *p = v; *p; p++)
            if ((unsigned char)*p < 0x20)
                return flx_error_set(FLX_ERR_INVALID, "%s holds control character 0x%02x", key, (unsigned char)*p);
        if (k->off == F(model_id)) {   /* it goes out in the protocol's strings: UTF-8 only */
            char fixed[3 * FLX_NODE_ID_MAX];
            const size_t len = strlen(v), n = flx_utf8_repair(v, len, fixed, sizeof fixed);
            if (n != len || memcmp(fixed, v, len) != 0)
                return flx_error_set(FLX_ERR_INVALID, "%s is not valid UTF-8", key);
        }
        memcpy(field, v, strlen(v) + 1);
        return FLX_OK;
    case K_U32:
        if (flx_parse_u64(v, (uint64_t)k->lo, (uint64_t)k->hi, &u))
            return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not an integer in %lld..%lld", key, v, (long long)k->lo,
                                 (long long)k->hi);
        *(uint32_t *)field = (uint32_t)u;
        return FLX_OK;
    case K_INT:
        if (!strcmp(v, "-1") && k->lo <= -1) {
            *(int *)field = -1;
            return FLX_OK;
        }
        if (flx_parse_u64(v, 0, (uint64_t)k->hi, &u))
            return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not an integer in %lld..%lld", key, v, (long long)k->lo,
                                 (long long)k->hi);
        *(int *)field = (int)u;
        return FLX_OK;
    case K_BYTES: {
        flx_status_t st = parse_bytes(key, v, k->lo, k->hi, &u);
        if (st)
            return st;
        if (k->off == F(max_message_bytes))
            *(uint32_t *)field = (uint32_t)u;
        else
            *(uint64_t *)field = u;
        return FLX_OK;
    }
    case K_PREFILL:
        if (!strcmp(v, "ucx"))
            c->prefill = FLX_NODE_PREFILL_UCX;
        else if (!strcmp(v, "local"))
            c->prefill = FLX_NODE_PREFILL_LOCAL;
        else
            return flx_error_set(FLX_ERR_INVALID, "prefill '%s' is not ucx or local", v);
        return FLX_OK;
    case K_ERRMODE:
        if (!strcmp(v, "peer"))
            c->ucx_err_mode = 0;
        else if (!strcmp(v, "none"))
            c->ucx_err_mode = 1;
        else
            return flx_error_set(FLX_ERR_INVALID, "ucx-err-mode '%s' is not peer or none", v);
        return FLX_OK;
    case K_LEVEL:
        if ((x = flx_log_level_parse(v)) < 0)
            return flx_error_set(FLX_ERR_INVALID, "log-level '%s' is not error, warn, info or debug", v);
        c->log_level = x;
        return FLX_OK;
    case K_WEIGHTS: {
        flx_weights_t w;
        flx_status_t st = flx_weights_parse(v, &w);   /* its refusal names the key and the value */
        if (st == FLX_OK) c->weights = (int)w;
        return st;
    }
    case K_FORMAT:
        if ((x = flx_log_format_parse(v)) < 0)
            return flx_error_set(FLX_ERR_INVALID, "log-format '%s' is not text or json", v);
        c->log_format = x;
        return FLX_OK;
    }
    return flx_error_set(FLX_ERR_INTERNAL, "setting '%s' has no parser", key);
}

static int is_blank(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r';
}

flx_status_t flx_node_config_parse(flx_node_config_t *c, const char *text, size_t len, const char *origin)
{
    if (!c || (!text && len))
        return flx_error_set(FLX_ERR_INVALID, "config parse: NULL argument");
    if (!origin)
        origin = "config";
    uint32_t seen_line[FLX_ARRAY_SIZE(KEYS)] = {0};
    char line[4096];
    size_t pos = 0;
    for (uint32_t lineno = 1; pos < len; lineno++) {
        size_t end = pos;
        while (end < len && text[end] != '\n') end++;
        size_t n = end - pos;
        if (n >= sizeof line)
            return flx_error_set(FLX_ERR_INVALID, "%s:%u: line of %zu bytes, at most %zu", origin, lineno, n,
                                 sizeof line - 1);
        if (memchr(text + pos, '\0', n))
            return flx_error_set(FLX_ERR_INVALID, "%s:%u: NUL byte in the line", origin, lineno);
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos = end + 1;

        char *s = line;
        while (is_blank(*s)) s++;
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq)
            return flx_error_set(FLX_ERR_INVALID, "%s:%u: expected 'key = value'", origin, lineno);
        char *kend = eq;
        while (kend > s && is_blank(kend[-1])) kend--;
        *kend = '\0';
        char *v = eq + 1;
        while (is_blank(*v)) v++;
        char *vend = v + strlen(v);
        while (vend > v && is_blank(vend[-1])) vend--;
        *vend = '\0';
        const cfg_key_t *k = find_key(s);
        if (!k)
            return flx_error_set(FLX_ERR_INVALID, "%s:%u: unknown key '%s'", origin, lineno, s);
        size_t ki = (size_t)(k - KEYS);
        if (seen_line[ki])
            return flx_error_set(FLX_ERR_INVALID, "%s:%u: key '%s' already set on line %u", origin, lineno, s,
                                 seen_line[ki]);
        seen_line[ki] = lineno;
        flx_status_t st = flx_node_config_set(c, s, v);
        if (st)
            return flx_error_set(st, "%s:%u: %s", origin, lineno, flx_error_msg());
    }
    return FLX_OK;
}

flx_status_t flx_node_config_load(flx_node_config_t *c, const char *path)
{
    if (!c || !path)
        return flx_error_set(FLX_ERR_INVALID, "config load: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return flx_error_set(flx_status_from_errno(errno), "cannot open config file %s: %s", path, strerror(errno));
    enum { MAX = 1 << 20 };
    char *buf = malloc(MAX + 1);
    if (!buf) {
        fclose(f);
        return flx_error_set(FLX_ERR_NOMEM, "config file %s", path);
    }
    size_t n = fread(buf, 1, MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    flx_status_t st;
    if (err)
        st = flx_error_set(FLX_ERR_IO, "reading config file %s failed", path);
    else if (n > MAX)
        st = flx_error_set(FLX_ERR_INVALID, "config file %s is larger than %d bytes", path, MAX);
    else
        st = flx_node_config_parse(c, buf, n, path);
    free(buf);
    return st;
}

flx_status_t flx_node_config_check(const flx_node_config_t *c)
{
    if (!c)
        return flx_error_set(FLX_ERR_INVALID, "config check: NULL config");
    if (!c->model[0])
        return flx_error_set(FLX_ERR_INVALID, "model is required (--model or 'model = ...' in the config file)");
    if (c->prefill != FLX_NODE_PREFILL_UCX && c->prefill != FLX_NODE_PREFILL_LOCAL)
        return flx_error_set(FLX_ERR_INVALID, "prefill mode %d is not ucx or local", (int)c->prefill);
    if (c->prefill == FLX_NODE_PREFILL_UCX && !c->ucx_advertise[0]) {
        const char *colon = strrchr(c->ucx_listen, ':');
        size_t hl = colon ? (size_t)(colon - c->ucx_listen) : 0;
        if ((hl == 7 && !strncmp(c->ucx_listen, "0.0.0.0", 7)) || (hl == 4 && !strncmp(c->ucx_listen, "[::]", 4)))
            return flx_error_set(FLX_ERR_INVALID, "ucx-listen %s listens on every address: set ucx-advertise to the "
                                                  "host prefill nodes should connect to", c->ucx_listen);
    }
    if (c->prefill == FLX_NODE_PREFILL_LOCAL) {   /* the KV receiver is not started: its settings do nothing */
        flx_node_config_t d;
        flx_node_config_default(&d);
        const char *set = strcmp(c->ucx_listen, d.ucx_listen)           ? "ucx-listen"
                          : strcmp(c->ucx_advertise, d.ucx_advertise)   ? "ucx-advertise"
                          : c->ucx_err_mode != d.ucx_err_mode           ? "ucx-err-mode"
                          : c->ucx_liveness_ms != d.ucx_liveness_ms     ? "ucx-liveness-ms"
                                                                        : NULL;
        if (set) return flx_error_set(FLX_ERR_INVALID, "%s applies only with prefill ucx (prefill is local)", set);
    }
    if (c->max_batch > c->max_sessions)
        return flx_error_set(FLX_ERR_INVALID, "max-batch %u exceeds max-sessions %u", c->max_batch, c->max_sessions);
    return FLX_OK;
}

size_t flx_node_config_format(const flx_node_config_t *c, char *buf, size_t cap)
{
    size_t n = 0;
#define OUT(...)                                                                       \
    do {                                                                               \
        int w_ = snprintf(buf ? buf + FLX_MIN(n, cap) : NULL, buf && n < cap ? cap - n : 0, __VA_ARGS__); \
        if (w_ > 0) n += (size_t)w_;                                                   \
    } while (0)
    static const char *levels[] = {"error", "warn", "info", "debug"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(KEYS); i++) {
        const cfg_key_t *k = &KEYS[i];
        const char *field = (const char *)c + k->off;
        switch (k->kind) {
        case K_STR:
        case K_ADDR: OUT("%s = %s\n", k->name, field); break;
        case K_U32: OUT("%s = %u\n", k->name, *(const uint32_t *)field); break;
        case K_INT: OUT("%s = %d\n", k->name, *(const int *)field); break;
        case K_BYTES:
            OUT("%s = %llu\n", k->name,
                k->off == F(max_message_bytes) ? (unsigned long long)*(const uint32_t *)field
                                               : (unsigned long long)*(const uint64_t *)field);
            break;
        case K_PREFILL: OUT("%s = %s\n", k->name, c->prefill == FLX_NODE_PREFILL_LOCAL ? "local" : "ucx"); break;
        case K_ERRMODE: OUT("%s = %s\n", k->name, c->ucx_err_mode ? "none" : "peer"); break;
        case K_LEVEL: OUT("%s = %s\n", k->name, levels[c->log_level & 3]); break;
        case K_FORMAT: OUT("%s = %s\n", k->name, c->log_format == FLX_LOG_JSON ? "json" : "text"); break;
        case K_WEIGHTS: OUT("%s = %s\n", k->name, flx_weights_name((flx_weights_t)c->weights)); break;
        }
    }
#undef OUT
    if (buf && cap)
        buf[FLX_MIN(n, cap - 1)] = '\0';
    return n;
}
