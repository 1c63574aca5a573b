/*
 * flx/util.h - small shared helpers: time, a seeded RNG, checked arithmetic, alignment, a bump
 * arena for workspaces.
 */
#ifndef FLX_UTIL_H
#define FLX_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FLX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FLX_MAX(a, b) ((a) > (b) ? (a) : (b))
#define FLX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FLX_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define FLX_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((size_t)(a)-1))
#define FLX_CACHELINE 64

/* Monotonic clock in nanoseconds. */
uint64_t flx_now_ns(void);

/* One step of a spin wait: tells the core (and a sibling hyperthread) that this thread is waiting. */
static inline void flx_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Checked size arithmetic for sizes that come from outside: return 0 and set *out, or
 * FLX_ERR_INVALID on overflow. */
static inline flx_status_t flx_mul_size(size_t a, size_t b, size_t *out)
{
    if (__builtin_mul_overflow(a, b, out))
        return FLX_ERR_INVALID;
    return FLX_OK;
}
static inline flx_status_t flx_add_size(size_t a, size_t b, size_t *out)
{
    if (__builtin_add_overflow(a, b, out))
        return FLX_ERR_INVALID;
    return FLX_OK;
}

/* Strict decimal parse of a whole string (flags, config values): digits only, no sign, no
 * trailing characters, value in [lo, hi]. FLX_ERR_INVALID otherwise; *out written only on success. */
flx_status_t flx_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Strict parse of a whole string as a finite decimal number (strtod's syntax without leading space;
 * no NaN, no infinity, no overflow, no trailing characters). FLX_ERR_INVALID otherwise; *out written
 * only on success. The caller checks the range. */
flx_status_t flx_parse_f64(const char *s, double *out);

/*
 * Name index: names read from a file (tensor names, metadata keys) sorted once so that a lookup is
 * O(log n) and a repeated name is caught at load; a linear search per lookup would let a file of
 * many names make its loader quadratic. name points at a NUL-terminated string that outlives the
 * index; pos is the caller's position of the named thing.
 */
typedef struct flx_name_ent {
    const char *name;
    size_t pos;
} flx_name_ent_t;

/* Sorts e (n entries) by name. If two entries share a name, returns FLX_ERR_DUPLICATE and sets
 * *dup_p to that name (no message is set: the caller names the file and the field); e is sorted
 * either way. */
flx_status_t flx_names_sort(flx_name_ent_t *e, size_t n, const char **dup_p);
/* The entry called name in a sorted index, or NULL. */
const flx_name_ent_t *flx_names_find(const flx_name_ent_t *e, size_t n, const char *name);

/* Reads the whole regular file path of at most max_bytes bytes (larger files are FLX_ERR_FORMAT, a
 * non-regular one FLX_ERR_IO) into a NUL-terminated buffer *buf_p that the caller frees; *len_p
 * (may be NULL) is its length without the NUL. Messages name the path. For the small text files
 * loaders parse whole (JSON configs, vocabularies), whose cap bounds what parsing them allocates. */
flx_status_t flx_file_read(const char *path, size_t max_bytes, char **buf_p, size_t *len_p);

/* Aligned allocation (alignment a power of two >= sizeof(void*)); free with flx_aligned_free. */
void *flx_aligned_alloc(size_t align, size_t size);
void flx_aligned_free(void *p);
/* Memory streamed every step (weights; the benchmarks' reference reads, so they compare like with
 * like): from 1 MiB up, 2 MiB-aligned, rounded up to 2 MiB and madvise(MADV_HUGEPAGE)'d, so that
 * transparent huge pages back it where the kernel allows them (THP "madvise" mode included: the
 * development VM's). Smaller sizes: 64-byte aligned. Free with flx_aligned_free. */
void *flx_stream_alloc(size_t size);

/*
 * xoshiro256** generator. Seeded, deterministic, not thread-safe (one per thread). Used by tests,
 * benchmarks, the synthetic workload and sampling.
 */
typedef struct flx_rng {
    uint64_t s[4];
} flx_rng_t;

void flx_rng_seed(flx_rng_t *rng, uint64_t seed);
uint64_t flx_rng_u64(flx_rng_t *rng);
/* Uniform in [0, 1). */
double flx_rng_uniform(flx_rng_t *rng);
/* Uniform integer in [0, n); n > 0. */
uint64_t flx_rng_below(flx_rng_t *rng, uint64_t n);
/* Standard normal (Box-Muller). */
double flx_rng_normal(flx_rng_t *rng);
/* A seed for "fresh random inputs every run": FLX_SEED from the environment if set, else the clock.
 * Tests print it so a failure can be replayed. */
uint64_t flx_seed_from_env(void);

/*
 * Bump arena over caller-owned memory: plan-time sizing with a size-only pass (base == NULL),
 * then carving. Not thread-safe; one per worker.
 */
typedef struct flx_arena {
    uint8_t *base; /* NULL during the sizing pass */
    size_t cap;    /* bytes at base */
    size_t used;   /* bytes handed out, alignment included */
} flx_arena_t;

void flx_arena_init(flx_arena_t *a, void *base, size_t cap);
/* Returns 64-byte aligned memory, or NULL when base is NULL (sizing) or the arena is exhausted.
 * In both cases used grows, so after a sizing pass a.used is the capacity to allocate. */
void *flx_arena_alloc(flx_arena_t *a, size_t size);

#ifdef __cplusplus
}
#endif
#endif
