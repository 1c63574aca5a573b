/*
 * model_internal.h - backing memory of a flx_model_t, shared by the model constructors (random
 * init, GGUF and Hugging Face loaders). Not a public header.
 */
#ifndef FLX_MODEL_INTERNAL_H
#define FLX_MODEL_INTERNAL_H

#include "flx/model.h"

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
};

/* A model with cfg copied, layers allocated (zeroed) and an empty region list. */
flx_status_t flx_model_alloc(const flx_model_config_t *cfg, flx_model_t **model_p);
/* Records a region the model owns from now on (freed by flx_model_destroy, last added first). */
flx_status_t flx_model_mem_add(flx_model_t *m, void *p, size_t len, flx_mem_kind_t kind);
/* Records an object the model owns from now on, freed by release(p) in flx_model_destroy. On
 * failure the caller still owns p. */
flx_status_t flx_model_mem_add_release(flx_model_t *m, void *p, void (*release)(void *p));
/* 64-byte aligned heap memory owned by the model; NULL (error set) on failure. */
void *flx_model_mem_alloc(flx_model_t *m, size_t bytes);

#endif
