/*
 * model_internal.h - backing memory of a flx_model_t, shared by the model constructors (random
 * init, GGUF and Hugging Face loaders). Not a public header.
 */
#ifndef FLX_MODEL_INTERNAL_H
#define FLX_MODEL_INTERNAL_H

#include <string.h>

#include "flx/model.h"

/* The fp32 field at p of a FLX_WFMT_Q4 / Q8 block (d, m): blocks of 24 and 36 bytes leave it
 * unaligned, so it is read with memcpy. The scalar definition (wmat.c) and the kernels (gemv.c)
 * both read scales through it. */
static inline float flx_wfmt_rd_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

typedef enum {
    FLX_MEM_HEAP = 0,   /* flx_aligned_alloc: freed with flx_aligned_free */
    FLX_MEM_MMAP = 1,   /* a file mapping: munmap(p, len) */
    FLX_MEM_RELEASE = 2, /* an object the weights point into (an open safetensors reader): release(p) */
} flx_mem_kind_t;

typedef struct flx_mem_region {
    void *p;
    size_t len;
    flx_mem_kind_t kind;
    void (*release)(void *p);   /* FLX_MEM_RELEASE only */
} flx_mem_region_t;

struct flx_model_mem {
    flx_mem_region_t *r;   /* (cap), n used */
    size_t n, cap;
    uint8_t *arena;        /* flx_model_mem_reserve's region (one of r), carved by flx_model_mem_alloc */
    size_t arena_len, arena_used;
};

/* cfg->name from the model's own metadata or path (len bytes of name, outside bytes): made valid
 * UTF-8 (a byte that starts no whole character becomes U+FFFD) and cut at a character boundary where
 * it does not fit, with a warning naming the original, which then differs from the node's default
 * model id. */
void flx_model_name_set(flx_model_config_t *cfg, const char *name, size_t len);

/* A model with cfg copied, layers allocated (zeroed) and an empty region list. */
flx_status_t flx_model_alloc(const flx_model_config_t *cfg, flx_model_t **model_p);
/* Records a region the model owns from now on (freed by flx_model_destroy, last added first). */
flx_status_t flx_model_mem_add(flx_model_t *m, void *p, size_t len, flx_mem_kind_t kind);
/* Records an object the model owns from now on, freed by release(p) in flx_model_destroy. On
 * failure the caller still owns p. */
flx_status_t flx_model_mem_add_release(flx_model_t *m, void *p, void (*release)(void *p));
/* FLX_OK when every matrix of m is stored as bf16; else FLX_ERR_UNSUPPORTED naming the first other
 * one, with `what` (the caller) in the message. The savers write bf16 matrices only. */
flx_status_t flx_model_check_bf16(const flx_model_t *m, const char *what);
/* Reserves one region of `bytes` (huge pages from 1 MiB up, flx_stream_alloc) that the following
 * flx_model_mem_alloc calls carve while it lasts: a loader that knows what its matrices need puts
 * them all on huge pages, one stream, however small each one is (SmolLM2's compact matrices are
 * 83 to 663 KB, each below the 1 MiB from which a region of its own gets huge pages). */
flx_status_t flx_model_mem_reserve(flx_model_t *m, size_t bytes);
/* 64-byte aligned memory owned by the model (from the reserved region while it has room, else a
 * region of its own); NULL (error set) on failure. */
void *flx_model_mem_alloc(flx_model_t *m, size_t bytes);

#endif
