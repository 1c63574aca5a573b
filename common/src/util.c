/*
 * util.c - clock, aligned allocation, RNG, arena.
 */
#include "flx/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

flx_status_t flx_read_file(const char *path, size_t max_bytes, char **buf_p, size_t *len_p)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return flx_error_set(flx_status_from_errno(errno), "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    flx_status_t st = buf ? FLX_OK : flx_error_set(FLX_ERR_NOMEM, "reading %s", path);
    while (st == FLX_OK) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = flx_error_set(FLX_ERR_NOMEM, "reading %s: %zu bytes", path, cap * 2);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (n > max_bytes) st = flx_error_set(FLX_ERR_CAPACITY, "%s is larger than %zu bytes", path, max_bytes);
        if (r == 0) break;
    }
    if (st == FLX_OK && ferror(f)) st = flx_error_set(FLX_ERR_IO, "reading %s failed", path);
    if (f != stdin) fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *buf_p = buf;
    *len_p = n;
    return FLX_OK;
}
