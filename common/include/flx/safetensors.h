/*
 * flx/safetensors.h - read and write safetensors files.
 *
 * Format (https://huggingface.co/docs/safetensors), as this reader checks it:
 *
 *   offset  size  field
 *   0       8     N, little-endian u64: length of the JSON header
 *   8       N     UTF-8 JSON object: name -> {"dtype": "BF16"|"F16"|"F32"|"F64"|"I32"|"I64"|"U8"|...,
 *                 "shape": [d0, d1, ...], "data_offsets": [begin, end]}; optional "__metadata__"
 *                 object of string -> string
 *   8+N     ...   tensor bytes; data_offsets are relative to 8+N
 *
 * The reader memory-maps the file read-only and checks: N within the file and below 100 MB; the
 * header is one JSON object (trailing whitespace allowed) with at most one "__metadata__" and no
 * tensor name or metadata key twice; every tensor has a known dtype, a shape of at most 8
 * non-negative integer dimensions whose product times the dtype size equals end-begin without
 * overflow, and whole-number offsets 0 <= begin <= end <= file size - 8 - N. Tensor data may start
 * at any byte (the format does not align it): read it through memcpy or byte pointers, never as a
 * typed array. Any violation is refused with FLX_ERR_FORMAT and a message naming the tensor and the
 * field.
 *
 * MEMORY. Besides the mapping (file-backed, not heap), open allocates the reader, a table entry and
 * a name copy per tensor, the metadata strings and, while parsing, cJSON's tree of the header (one
 * 64-byte node per JSON value, and a value takes at least 2 bytes). Measured worst cases
 * (tests/hostile/test_loader_memory.c) stay below 64 x N + 1 MiB however the header is written;
 * tensor data is never copied. Lookups by name are O(log n).
 *
 * Thread mode: a reader is immutable after open; concurrent lookups are safe.
 */
#ifndef FLX_SAFETENSORS_H
#define FLX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_DT_F32 = 0,
    FLX_DT_F16,
    FLX_DT_BF16,
    FLX_DT_F64,
    FLX_DT_I8,
    FLX_DT_U8,
    FLX_DT_I16,
    FLX_DT_I32,
    FLX_DT_I64,
    FLX_DT_BOOL,
    FLX_DT_COUNT,
} flx_dtype_t;

const char *flx_dtype_name(flx_dtype_t dt);   /* safetensors spelling: "F32", "BF16", ... */
size_t flx_dtype_size(flx_dtype_t dt);
int flx_dtype_parse(const char *s, flx_dtype_t *dt_p);

#define FLX_ST_MAX_DIMS 8

typedef struct flx_st_tensor {
    const char *name;               /* owned by the reader */
    flx_dtype_t dtype;
    int n_dims;
    int64_t shape[FLX_ST_MAX_DIMS];
    const void *data;               /* into the mapping; valid until flx_st_close */
    size_t nbytes;
} flx_st_tensor_t;

typedef struct flx_st_reader *flx_st_reader_h;

flx_status_t flx_st_open(const char *path, flx_st_reader_h *reader_p);
void flx_st_close(flx_st_reader_h reader);

size_t flx_st_count(flx_st_reader_h reader);
const flx_st_tensor_t *flx_st_at(flx_st_reader_h reader, size_t i);
/* NULL when absent. */
const flx_st_tensor_t *flx_st_find(flx_st_reader_h reader, const char *name);
/* Value of a "__metadata__" key, or NULL. */
const char *flx_st_metadata(flx_st_reader_h reader, const char *key);

/* Finds name and checks dtype and shape (n_dims entries; -1 in expect_shape matches any size).
 * Refusals name the tensor, the expected and the found value. */
flx_status_t flx_st_expect(flx_st_reader_h reader, const char *name, flx_dtype_t dtype, int n_dims,
                           const int64_t *expect_shape, const flx_st_tensor_t **tensor_p);

/*
 * Writer: collect tensors (the data is copied at add time), then write the file atomically
 * (temporary file + rename). Tensors are written in the order added.
 */
typedef struct flx_st_writer *flx_st_writer_h;

flx_status_t flx_st_writer_create(flx_st_writer_h *writer_p);
void flx_st_writer_destroy(flx_st_writer_h writer);
flx_status_t flx_st_writer_add(flx_st_writer_h writer, const char *name, flx_dtype_t dtype, int n_dims,
                               const int64_t *shape, const void *data);
flx_status_t flx_st_writer_set_metadata(flx_st_writer_h writer, const char *key, const char *value);
flx_status_t flx_st_writer_save(flx_st_writer_h writer, const char *path);

#ifdef __cplusplus
}
#endif
#endif
