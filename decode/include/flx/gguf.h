/*
 * flx/gguf.h - a bounds-checked, memory-mapped reader of GGUF files (llama.cpp's model format).
 *
 * OVERVIEW
 * flx_gguf_open() maps a file read-only, parses the header, every metadata key/value and every
 * tensor info, and checks all of it against the file size before returning. After that, lookups
 * never fail on the file's account: keys, arrays and tensors are plain structs pointing into the
 * handle or the mapping. The model loader (flx/model_load.h) and the tokenizer read from here.
 *
 * FORMAT (versions 2 and 3, little-endian; version 1 used 32-bit counts and is refused)
 *
 *   offset  size  field
 *   0       4     magic "GGUF" (bytes 0x47 0x47 0x55 0x46)
 *   4       4     version u32: 2 or 3
 *   8       8     tensor_count u64
 *   16      8     kv_count u64
 *   24      ...   kv_count key/values:   key: string, value_type u32, value
 *   ...     ...   tensor_count infos:    name: string, n_dims u32 (1..4), ne u64[n_dims] (innermost
 *                                        first: a row-major (out, in) matrix has ne[0] = in),
 *                                        ggml_type u32, offset u64 (relative to the data start)
 *   ...     ...   zero padding up to the next multiple of the alignment
 *   data    ...   tensor bytes; every offset is a multiple of the alignment
 *
 *   string  = len u64, then len bytes of UTF-8, no terminator
 *   value   = by value_type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte, 0/1),
 *             8 string, 9 array, 10 u64, 11 i64, 12 f64
 *   array   = elem_type u32, count u64, count values of elem_type (arrays may nest)
 *
 * The alignment is the u32 key "general.alignment" (a power of two) or 32. A tensor of ggml type t
 * holds ne[0] * ... * ne[3] / block_size(t) blocks of type_size(t) bytes; ne[0] must be a multiple
 * of the block size.
 *
 * CHECKS. Every read is bounded by the file size; a count or length that cannot fit in the bytes
 * left is refused before anything is allocated; arrays nest at most 4 deep; key and tensor names
 * are unique; tensor dims are 1..2^62 with a product that does not overflow; tensor types are known
 * ggml types; tensor data is aligned, inside the file, and no two tensors overlap. Refusals are
 * FLX_ERR_FORMAT with a message naming the file and the key or tensor.
 *
 * MEMORY. The handle holds a table entry, an index entry and a copy of the name per key and per
 * tensor info, copies of string values and an offset per element of string arrays, and parsed
 * sub-arrays; each is sized by bytes the file actually holds (a count is checked against the bytes
 * left before anything is allocated for it), so open allocates at most 16 x the file's size +
 * 64 KiB (measured worst cases in tests/hostile/test_loader_memory.c). Tensor data stays in the
 * mapping. Lookups of keys and tensors by name are O(log n).
 *
 * Thread mode: a handle is immutable after open; any number of threads may read it at once.
 */
#ifndef FLX_GGUF_H
#define FLX_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_GGUF_U8 = 0,
    FLX_GGUF_I8 = 1,
    FLX_GGUF_U16 = 2,
    FLX_GGUF_I16 = 3,
    FLX_GGUF_U32 = 4,
    FLX_GGUF_I32 = 5,
    FLX_GGUF_F32 = 6,
    FLX_GGUF_BOOL = 7,
    FLX_GGUF_STRING = 8,
    FLX_GGUF_ARRAY = 9,
    FLX_GGUF_U64 = 10,
    FLX_GGUF_I64 = 11,
    FLX_GGUF_F64 = 12,
    FLX_GGUF_TYPE_COUNT
} flx_gguf_type_t;

/* ggml tensor types (values as in ggml.h); only the ones the loader names are spelled out. */
typedef enum {
    FLX_GGML_F32 = 0,
    FLX_GGML_F16 = 1,
    FLX_GGML_Q4_0 = 2,
    FLX_GGML_Q4_1 = 3,
    FLX_GGML_Q5_0 = 6,
    FLX_GGML_Q5_1 = 7,
    FLX_GGML_Q8_0 = 8,
    FLX_GGML_Q8_1 = 9,
    FLX_GGML_Q2_K = 10,
    FLX_GGML_Q3_K = 11,
    FLX_GGML_Q4_K = 12,
    FLX_GGML_Q5_K = 13,
    FLX_GGML_Q6_K = 14,
    FLX_GGML_Q8_K = 15,
    FLX_GGML_BF16 = 30,
    FLX_GGML_TYPE_COUNT = 40   /* values below this that are not known ggml types are refused */
} flx_ggml_type_t;

#define FLX_GGUF_MAX_DIMS 4
#define FLX_GGUF_DEFAULT_ALIGNMENT 32

/* An array value. Elements of fixed size lie packed and unaligned at data (little-endian); read
 * them with the flx_gguf_arr_* accessors. */
typedef struct flx_gguf_array {
    flx_gguf_type_t elem;             /* element type */
    uint64_t n;                       /* element count */
    const void *data;                 /* fixed-size elements: n * size bytes in the mapping */
    const uint64_t *str_off;          /* STRING elements: (n) offsets of each string's len field in
                                       * the mapping; owned by the handle */
    const struct flx_gguf_array *sub; /* ARRAY elements: (n) parsed sub-arrays; owned by the handle */
    const uint8_t *base;              /* the mapping (for str_off) */
} flx_gguf_array_t;

typedef struct flx_gguf_kv {
    const char *key;          /* NUL-terminated, owned by the handle */
    flx_gguf_type_t type;
    union {
        uint64_t u;           /* U8..U64, BOOL */
        int64_t i;            /* I8..I64 */
        double f;             /* F32, F64 */
    } v;
    const char *str;          /* STRING: NUL-terminated copy owned by the handle (may hold NULs) */
    size_t str_len;           /* STRING: bytes, terminator excluded */
    flx_gguf_array_t arr;     /* ARRAY */
} flx_gguf_kv_t;

typedef struct flx_gguf_tensor {
    const char *name;         /* NUL-terminated, owned by the handle */
    uint32_t n_dims;          /* 1..FLX_GGUF_MAX_DIMS */
    uint64_t ne[FLX_GGUF_MAX_DIMS]; /* innermost first; dims past n_dims are 1 */
    uint32_t type;            /* flx_ggml_type_t value */
    uint64_t offset;          /* from the data start */
    uint64_t nelem;
    size_t nbytes;
    const void *data;         /* into the mapping; valid until flx_gguf_close */
} flx_gguf_tensor_t;

typedef struct flx_gguf *flx_gguf_h;

/* Maps and checks path. On success *h_p owns the mapping until flx_gguf_close. */
flx_status_t flx_gguf_open(const char *path, flx_gguf_h *h_p);
/* Accepts NULL. Every pointer obtained from the handle dies with it. */
void flx_gguf_close(flx_gguf_h h);

const char *flx_gguf_path(flx_gguf_h h);
uint32_t flx_gguf_version(flx_gguf_h h);
uint32_t flx_gguf_alignment(flx_gguf_h h);
size_t flx_gguf_data_offset(flx_gguf_h h);     /* file offset of the data section */

size_t flx_gguf_kv_count(flx_gguf_h h);
const flx_gguf_kv_t *flx_gguf_kv_at(flx_gguf_h h, size_t i);
/* NULL when absent; never sets an error. */
const flx_gguf_kv_t *flx_gguf_find(flx_gguf_h h, const char *key);

/*
 * Typed getters: FLX_ERR_NOT_FOUND when the key is absent, FLX_ERR_FORMAT when its type does not
 * convert or the value does not fit; both messages name the key. Integer getters accept any
 * integer type whose value fits; get_f32 accepts F32, F64 and integers; get_str returns the
 * handle's NUL-terminated copy. *out is written only on success.
 */
flx_status_t flx_gguf_get_u32(flx_gguf_h h, const char *key, uint32_t *out);
flx_status_t flx_gguf_get_i32(flx_gguf_h h, const char *key, int32_t *out);
flx_status_t flx_gguf_get_u64(flx_gguf_h h, const char *key, uint64_t *out);
flx_status_t flx_gguf_get_f32(flx_gguf_h h, const char *key, float *out);
flx_status_t flx_gguf_get_bool(flx_gguf_h h, const char *key, int *out);
flx_status_t flx_gguf_get_str(flx_gguf_h h, const char *key, const char **out);
flx_status_t flx_gguf_get_arr(flx_gguf_h h, const char *key, const flx_gguf_array_t **out);

/* Array element accessors; i < a->n is the caller's to ensure (checked: FLX_ERR_INVALID).
 * arr_str gives a pointer into the mapping and the length: the bytes are NOT NUL-terminated.
 * arr_int accepts any integer or BOOL element type, arr_f32 F32/F64. */
flx_status_t flx_gguf_arr_str(const flx_gguf_array_t *a, uint64_t i, const char **s, size_t *len);
flx_status_t flx_gguf_arr_int(const flx_gguf_array_t *a, uint64_t i, int64_t *out);
flx_status_t flx_gguf_arr_f32(const flx_gguf_array_t *a, uint64_t i, float *out);
/* NULL unless a holds arrays and i < n. */
const flx_gguf_array_t *flx_gguf_arr_sub(const flx_gguf_array_t *a, uint64_t i);

size_t flx_gguf_tensor_count(flx_gguf_h h);
const flx_gguf_tensor_t *flx_gguf_tensor_at(flx_gguf_h h, size_t i);
/* NULL when absent; never sets an error. */
const flx_gguf_tensor_t *flx_gguf_find_tensor(flx_gguf_h h, const char *name);

/* "F32", "Q4_1", ...; "?" for unknown values. */
const char *flx_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block of a known ggml type; FLX_ERR_FORMAT when unknown. */
flx_status_t flx_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
const char *flx_gguf_type_name(uint32_t type);

#ifdef __cplusplus
}
#endif
#endif
