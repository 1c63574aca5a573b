/*
 * flx/node_config.h - the configuration of the decode node daemon (fluxion-decoded): one table of
 * settings, set from a config file and from command-line flags of the same names.
 *
 * CONFIG FILE FORMAT (docs/node.md has the list of keys)
 *   # a comment                      lines starting with '#' (after blanks) and blank lines
 *   key = value                      one setting per line; blanks around '=' and at both ends of
 *                                    the value are dropped; the value is the rest of the line
 * Keys are the daemon's long flag names without "--" (max-batch, grpc-listen, ...). A key may
 * appear once per file; unknown keys, lines without '=', NUL bytes, lines over 4095 bytes and
 * values out of range are refused with "<origin>:<line>: <what is wrong>". Flags given on the
 * command line are applied after the file and win. Sizes in bytes take an optional K, M, G or T
 * suffix (powers of 1024).
 *
 * THREAD MODE
 * Plain data; functions are reentrant.
 */
#ifndef FLX_NODE_CONFIG_H
#define FLX_NODE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_NODE_PREFILL_UCX = 1,    /* prefill nodes push the KV over UCX: the product */
    FLX_NODE_PREFILL_LOCAL = 2,  /* the node prefills OpenSession's local_prefill tokens itself */
} flx_node_prefill_t;

#define FLX_NODE_PATH_MAX 1024
#define FLX_NODE_ADDR_MAX 256
#define FLX_NODE_ID_MAX 128

typedef struct flx_node_config {
    char model[FLX_NODE_PATH_MAX];      /* model: .gguf file or Hugging Face folder (required) */
    int weights;                        /* weights: flx_weights_t (flx/model_load.h), compact | bf16 */
    char model_id[FLX_NODE_ID_MAX];     /* model-id: what OpenSession must name; "" = the model's name */
    char predictor[FLX_NODE_PATH_MAX];  /* predictor: Fluxion weights; "" = none (FLUXION refused) */
    char grpc_listen[FLX_NODE_ADDR_MAX];    /* grpc-listen: host:port of the control service */
    char metrics_listen[FLX_NODE_ADDR_MAX]; /* metrics-listen: host:port of /metrics; "off" = none */
    flx_node_prefill_t prefill;         /* prefill: ucx | local */
    char ucx_listen[FLX_NODE_ADDR_MAX];     /* ucx-listen: host:port of the KV receiver (prefill ucx); port 0
                                               = a free one (OpenSession names it) */
    char ucx_advertise[FLX_NODE_ADDR_MAX];  /* ucx-advertise: the host OpenSession hands to prefill nodes;
                                               "" = ucx-listen's host (required when that is 0.0.0.0 or ::) */
    int ucx_err_mode;                   /* ucx-err-mode: 0 peer | 1 none (flx_tp_err_mode_t: none for UCX 1.13
                                           shared memory, whose dead peers only the liveness check finds) */
    uint32_t ucx_liveness_ms;           /* ucx-liveness-ms: a prefill connection silent this long is dead */
    uint64_t kv_capacity_bytes;         /* kv-capacity: host KV pool, bytes */
    uint32_t max_sessions;              /* max-sessions: sessions open at once */
    uint32_t max_batch;                 /* max-batch: sequences per decode step */
    uint32_t max_prompt_len;            /* max-prompt-len: tokens; 0 = the model's context */
    uint32_t max_new_tokens;            /* max-new-tokens: most a session may reserve */
    uint32_t threads;                   /* threads: the pool's workers; 0 = FLX_THREADS, else the CPU budget */
    int numa_node;                      /* numa-node: KV pool's node; -1 = the node we run on */
    uint32_t transfer_timeout_ms;       /* transfer-timeout-ms: default READY deadline of a session */
    uint32_t lease_ms;                  /* lease-ms: default lease of a READY session */
    uint32_t drain_timeout_ms;          /* drain-timeout-ms: how long SIGTERM lets Generate calls run */
    uint32_t max_message_bytes;         /* max-message-bytes: largest gRPC request */
    uint32_t grpc_threads;              /* grpc-threads: completion-queue threads */
    int log_level;                      /* log-level: flx_log_level_t */
    int log_format;                     /* log-format: flx_log_format_t */
} flx_node_config_t;

/* Defaults: weights compact, grpc-listen 127.0.0.1:50051, metrics-listen 127.0.0.1:9464, prefill ucx, ucx-listen
 * 127.0.0.1:0, ucx-advertise "", ucx-err-mode peer, ucx-liveness-ms 10000, kv-capacity
 * 4G, max-sessions 256, max-batch 8, max-prompt-len 0, max-new-tokens 4096, threads 0,
 * numa-node -1, transfer-timeout-ms 30000, lease-ms 60000, drain-timeout-ms 30000,
 * max-message-bytes 4M, grpc-threads 2, log-level info, log-format text. */
void flx_node_config_default(flx_node_config_t *cfg);

/* One setting by its key (a flag name without "--"). FLX_ERR_NOT_FOUND for an unknown key,
 * FLX_ERR_INVALID for a bad value; the message names the key, the value and the range. cfg is
 * changed only on success. */
flx_status_t flx_node_config_set(flx_node_config_t *cfg, const char *key, const char *value);

/* Applies a config file's text (len bytes, need not be NUL-terminated) to cfg. origin names the
 * file in messages. On error cfg may hold the settings of the lines before the bad one. */
flx_status_t flx_node_config_parse(flx_node_config_t *cfg, const char *text, size_t len, const char *origin);

/* Reads path (at most 1 MiB) and parses it. */
flx_status_t flx_node_config_load(flx_node_config_t *cfg, const char *path);

/* Cross-field checks after everything is applied (model given, ...). */
flx_status_t flx_node_config_check(const flx_node_config_t *cfg);

/* The keys, in documentation order (NULL-terminated), and a one-line help for each. */
const char *const *flx_node_config_keys(void);
const char *flx_node_config_help(const char *key);

/* Writes the effective configuration in the file format (every key), NUL-terminated; returns
 * the length it needed (snprintf-like). */
size_t flx_node_config_format(const flx_node_config_t *cfg, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
