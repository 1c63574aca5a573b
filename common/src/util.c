/*
 * util.c - clock, aligned allocation, RNG, arena.
 */
#include "flx/util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

uint64_t flx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *flx_aligned_alloc(size_t align, size_t size)
{
    void *p = NULL;
    if (size == 0) size = 1;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    return p;
}

void flx_aligned_free(void *p)
{
    free(p);
}

void *flx_stream_alloc(size_t size)
{
    const size_t huge = (size_t)2 << 20;
    if (size < huge / 2) return flx_aligned_alloc(64, size);
    const size_t bytes = (size + huge - 1) & ~(huge - 1);
    void *p = flx_aligned_alloc(huge, bytes);
    if (p) (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: without THP the memory works the same */
    return p;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void flx_rng_seed(flx_rng_t *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t flx_rng_u64(flx_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double flx_rng_uniform(flx_rng_t *rng)
{
    return (double)(flx_rng_u64(rng) >> 11) * 0x1.0p-53;
}

uint64_t flx_rng_below(flx_rng_t *rng, uint64_t n)
{
    /* Lemire's nearly-divisionless method would be faster; rejection keeps it exact and simple. */
    uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
    do {
        x = flx_rng_u64(rng);
    } while (x >= lim);
    return x % n;
}

double flx_rng_normal(flx_rng_t *rng)
{
    double u1 = flx_rng_uniform(rng), u2 = flx_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t flx_seed_from_env(void)
{
    const char *s = getenv("FLX_SEED");
    if (s && *s) return strtoull(s, NULL, 0);
    return flx_now_ns() ^ ((uint64_t)clock() << 32);
}

void flx_arena_init(flx_arena_t *a, void *base, size_t cap)
{
    a->base = (uint8_t *)base;
    a->cap = base ? cap : 0;
    a->used = 0;
}

void *flx_arena_alloc(flx_arena_t *a, size_t size)
{
    size_t off = FLX_ALIGN_UP(a->used, FLX_CACHELINE);
    a->used = off + FLX_ALIGN_UP(size, FLX_CACHELINE);
    if (!a->base || a->used > a->cap) return NULL;
    return a->base + off;
}

flx_status_t flx_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') return FLX_ERR_INVALID;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return FLX_ERR_INVALID;
    *out = v;
    return FLX_OK;
}

static int cmp_name_ent(const void *a, const void *b)
{
    return strcmp(((const flx_name_ent_t *)a)->name, ((const flx_name_ent_t *)b)->name);
}

flx_status_t flx_names_sort(flx_name_ent_t *e, size_t n, const char **dup_p)
{
    if (n > 1) qsort(e, n, sizeof *e, cmp_name_ent);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(e[i - 1].name, e[i].name)) {
            *dup_p = e[i].name;
            return FLX_ERR_DUPLICATE;
        }
    return FLX_OK;
}

const flx_name_ent_t *flx_names_find(const flx_name_ent_t *e, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(e[mid].name, name);
        if (c == 0) return &e[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

flx_status_t flx_file_read(const char *path, size_t max_bytes, char **buf_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) return flx_error_set(flx_status_from_errno(errno), "cannot open %s: %s", path, strerror(errno));
    flx_status_t st = FLX_OK;
    char *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = flx_error_set(FLX_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)sb.st_size > max_bytes) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s is %lld bytes, above the %zu this file may have", path,
                           (long long)sb.st_size, max_bytes);
        goto out;
    }
    size_t len = (size_t)sb.st_size;
    if (!(buf = malloc(len + 1))) {
        st = flx_error_set(FLX_ERR_NOMEM, "%s: %zu bytes", path, len);
        goto out;
    }
    if (fread(buf, 1, len, f) != len) {
        st = flx_error_set(FLX_ERR_IO, "%s: short read", path);
        goto out;
    }
    buf[len] = '\0';
    *buf_p = buf;
    if (len_p) *len_p = len;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return st;
}
flx_status_t flx_parse_f64(const char *s, double *out)
{
    if (!s || !*s || isspace((unsigned char)*s)) return FLX_ERR_INVALID;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return FLX_ERR_INVALID;
    *out = v;
    return FLX_OK;
}
