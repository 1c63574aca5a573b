/*
 * pyramid.c - the Quest metadata pyramid: per-channel min and max of K for logical blocks of 16,
 * 32, 64 and 128 host tokens.
 *
 * DESIGN
 * One pass over K: for each 128-token superblock, the 16-token entries are computed from the rows
 * (the only pass over KV bytes), and the 32/64/128 entries from the entries just below them, which
 * are still in L1. min/max of bf16 values is exact in fp32, so every level is bit-exact with a
 * direct computation over its tokens. Comparisons follow one rule everywhere (SIMD min_ps/max_ps
 * semantics: keep the running value unless the new one is strictly smaller/greater), so the SIMD
 * and scalar versions agree bit for bit, signed zeros included. The last block covers only rows
 * < l_cpu; no row at or past l_cpu is read.
 */
#include <immintrin.h>

#include "flx/cpu.h"
#include "flx/kvstore.h"
#include "flx/util.h"

/* pf: the next block's K rows (prefetched while these are reduced) or NULL. */
typedef void (*rows_fn)(const flx_bf16_t *k, uint32_t rows, uint32_t d, flx_bf16_t *out, const flx_bf16_t *pf);
typedef void (*pair_fn)(const flx_bf16_t *a, const flx_bf16_t *b, uint32_t d, flx_bf16_t *out);

/* out (2, d): min row, max row of k (rows, d). */
static void rows_minmax_ref(const flx_bf16_t *k, uint32_t rows, uint32_t d, flx_bf16_t *out, const flx_bf16_t *pf)
{
    (void)pf;
    for (uint32_t c = 0; c < d; c++) {
        float mn = flx_bf16_to_f32(k[c]), mx = mn;
        for (uint32_t r = 1; r < rows; r++) {
            float x = flx_bf16_to_f32(k[(size_t)r * d + c]);
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
        }
        out[c] = flx_f32_to_bf16(mn);
        out[d + c] = flx_f32_to_bf16(mx);
    }
}

/* out = elementwise combine of two (2, d) entries; b may be NULL (odd tail: copy a). */
static void pair_minmax_ref(const flx_bf16_t *a, const flx_bf16_t *b, uint32_t d, flx_bf16_t *out)
{
    for (uint32_t c = 0; c < d; c++) {
        float mn = flx_bf16_to_f32(a[c]), mx = flx_bf16_to_f32(a[d + c]);
        if (b) {
            float bn = flx_bf16_to_f32(b[c]), bx = flx_bf16_to_f32(b[d + c]);
            mn = bn < mn ? bn : mn;
            mx = bx > mx ? bx : mx;
        }
        out[c] = flx_f32_to_bf16(mn);
        out[d + c] = flx_f32_to_bf16(mx);
    }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw"))) static inline __m512 load16_bf16(const flx_bf16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
__attribute__((target("avx512f,avx512bw"))) static inline void store16_bf16(flx_bf16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

/* Row-major, so a block's K is read once, in address order, and the hardware streams it. A chunk
 * of 32 bf16 loaded as 16 32-bit lanes holds element 2i in the low half of lane i and element 2i+1
 * in the high half: (lane << 16) is the exact fp32 of the even element, (lane & 0xffff0000) that
 * of the odd one, so min/max need no widening instructions beyond those two. Up to 4 chunks (128
 * channels) are kept in registers per pass over the rows; d is a multiple of 16 (store invariant),
 * a final 16-wide chunk is loaded masked. */
#define T512P __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
T512P static void rows_minmax_avx512(const flx_bf16_t *k, uint32_t rows, uint32_t d, flx_bf16_t *out,
                                     const flx_bf16_t *pf)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (uint32_t c0 = 0; c0 < d; c0 += 128) {
        const uint32_t nc = (FLX_MIN(d - c0, 128u) + 31) / 32;
        __mmask32 m[4];
        __m512 mne[4], mno[4], mxe[4], mxo[4];
        for (uint32_t j = 0; j < nc; j++) {
            m[j] = d - (c0 + 32 * j) >= 32 ? 0xffffffffu : 0x0000ffffu;
            __m512i x = _mm512_maskz_loadu_epi16(m[j], k + c0 + 32 * j);
            mne[j] = mxe[j] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            mno[j] = mxo[j] = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
        }
        for (uint32_t r = 1; r < rows; r++) {
            const flx_bf16_t *row = k + (size_t)r * d + c0;
            if (pf) { /* row r's share of the next block, spread over the rows (the streamer restarts at
                       * every block: only K halves are read) */
                const char *p = (const char *)(pf + (size_t)r * d + c0);
                for (uint32_t j = 0; j < nc; j++) _mm_prefetch(p + 64 * j, _MM_HINT_T0);
            }
            for (uint32_t j = 0; j < nc; j++) {
                __m512i x = _mm512_maskz_loadu_epi16(m[j], row + 32 * j);
                __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
                __m512 o = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
                mne[j] = _mm512_min_ps(e, mne[j]);
                mxe[j] = _mm512_max_ps(e, mxe[j]);
                mno[j] = _mm512_min_ps(o, mno[j]);
                mxo[j] = _mm512_max_ps(o, mxo[j]);
            }
        }
        for (uint32_t j = 0; j < nc; j++) {
            __m512i mn = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(mno[j]), hi),
                                         _mm512_srli_epi32(_mm512_castps_si512(mne[j]), 16));
            __m512i mx = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(mxo[j]), hi),
                                         _mm512_srli_epi32(_mm512_castps_si512(mxe[j]), 16));
            _mm512_mask_storeu_epi16(out + c0 + 32 * j, m[j], mn);
            _mm512_mask_storeu_epi16(out + d + c0 + 32 * j, m[j], mx);
        }
    }
}

__attribute__((target("avx512f,avx512bw"))) static void pair_minmax_avx512(const flx_bf16_t *a, const flx_bf16_t *b,
                                                                          uint32_t d, flx_bf16_t *out)
{
    for (uint32_t c = 0; c < d; c += 16) {
        __m512 mn = load16_bf16(a + c), mx = load16_bf16(a + d + c);
        if (b) {
            mn = _mm512_min_ps(load16_bf16(b + c), mn);
            mx = _mm512_max_ps(load16_bf16(b + d + c), mx);
        }
        store16_bf16(out + c, mn);
        store16_bf16(out + d + c, mx);
    }
}

__attribute__((target("avx2"))) static inline __m256 load8_bf16(const flx_bf16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
__attribute__((target("avx2"))) static inline void store8_bf16(flx_bf16_t *p, __m256 v)
{
    __m256i s = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(lo, hi));
}

__attribute__((target("avx2"))) static void rows_minmax_avx2(const flx_bf16_t *k, uint32_t rows, uint32_t d,
                                                             flx_bf16_t *out, const flx_bf16_t *pf)
{
    (void)pf;
    for (uint32_t c = 0; c < d; c += 8) {
        __m256 mn = load8_bf16(k + c), mx = mn;
        for (uint32_t r = 1; r < rows; r++) {
            __m256 x = load8_bf16(k + (size_t)r * d + c);
            mn = _mm256_min_ps(x, mn);
            mx = _mm256_max_ps(x, mx);
        }
        store8_bf16(out + c, mn);
        store8_bf16(out + d + c, mx);
    }
}

__attribute__((target("avx2"))) static void pair_minmax_avx2(const flx_bf16_t *a, const flx_bf16_t *b, uint32_t d,
                                                             flx_bf16_t *out)
{
    for (uint32_t c = 0; c < d; c += 8) {
        __m256 mn = load8_bf16(a + c), mx = load8_bf16(a + d + c);
        if (b) {
            mn = _mm256_min_ps(load8_bf16(b + c), mn);
            mx = _mm256_max_ps(load8_bf16(b + d + c), mx);
        }
        store8_bf16(out + c, mn);
        store8_bf16(out + d + c, mx);
    }
}
#endif

static void build(const flx_kv_head_view_t *v, flx_bf16_t *const meta[FLX_KV_META_LEVELS], rows_fn rows,
                  pair_fn pair)
{
    const uint32_t d = v->head_dim, l = v->l_cpu;
    const size_t esz = 2 * (size_t)d; /* bf16 elements per entry */
    uint32_t n[FLX_KV_META_LEVELS];
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) n[j] = flx_kv_meta_count(l, j);
    for (uint32_t sb = 0; sb < n[3]; sb++) {
        /* Level 0: 8 physical blocks of this 128-token superblock. */
        for (uint32_t b = sb * 8; b < n[0] && b < sb * 8 + 8; b++) {
            uint32_t r = l - b * FLX_KV_BLOCK_TOKENS;
            rows(flx_kv_block_k(v, b), r < FLX_KV_BLOCK_TOKENS ? r : FLX_KV_BLOCK_TOKENS, d, meta[0] + b * esz,
                 b + 1 < n[0] ? flx_kv_block_k(v, b + 1) : NULL);
        }
        /* Levels 1..3 from the level below. */
        for (int j = 1; j < FLX_KV_META_LEVELS; j++) {
            uint32_t per = 8u >> j;
            for (uint32_t b = sb * per; b < n[j] && b < sb * per + per; b++) {
                const flx_bf16_t *a = meta[j - 1] + (size_t)(2 * b) * esz;
                const flx_bf16_t *c = 2 * b + 1 < n[j - 1] ? a + esz : NULL;
                pair(a, c, d, meta[j] + b * esz);
            }
        }
    }
}

/* Level 0 of blocks [b0, b1) only. */
static void build_level0(const flx_kv_head_view_t *v, flx_bf16_t *meta0, uint32_t b0, uint32_t b1, rows_fn rows)
{
    const uint32_t d = v->head_dim, l = v->l_cpu, n0 = flx_kv_meta_count(l, 0);
    const size_t esz = 2 * (size_t)d;
    for (uint32_t b = b0; b < b1 && b < n0; b++) {
        uint32_t r = l - b * FLX_KV_BLOCK_TOKENS;
        rows(flx_kv_block_k(v, b), r < FLX_KV_BLOCK_TOKENS ? r : FLX_KV_BLOCK_TOKENS, d, meta0 + b * esz,
             b + 1 < b1 && b + 1 < n0 ? flx_kv_block_k(v, b + 1) : NULL);
    }
}

/* Levels 1..3 from level 0 (the same pairs, in the same order, as build's). */
static void build_upper(const flx_kv_head_view_t *v, flx_bf16_t *const meta[FLX_KV_META_LEVELS], pair_fn pair)
{
    const uint32_t d = v->head_dim, l = v->l_cpu;
    const size_t esz = 2 * (size_t)d;
    for (int j = 1; j < FLX_KV_META_LEVELS; j++) {
        const uint32_t nj = flx_kv_meta_count(l, j), nb = flx_kv_meta_count(l, j - 1);
        for (uint32_t b = 0; b < nj; b++) {
            const flx_bf16_t *a = meta[j - 1] + (size_t)(2 * b) * esz;
            pair(a, 2 * b + 1 < nb ? a + esz : NULL, d, meta[j] + b * esz);
        }
    }
}

void flx_kv_pyramid_build_ref(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS])
{
    build(view, meta, rows_minmax_ref, pair_minmax_ref);
}

/* The kernels flx_isa_active() picks. */
static void kernels(rows_fn *rows, pair_fn *pair)
{
    *rows = rows_minmax_ref, *pair = pair_minmax_ref;
#if defined(__x86_64__)
    switch (flx_isa_active()) {
    case FLX_ISA_AMX:
    case FLX_ISA_AVX512BF16:
    case FLX_ISA_AVX512: *rows = rows_minmax_avx512, *pair = pair_minmax_avx512; break;
    case FLX_ISA_AVX2: *rows = rows_minmax_avx2, *pair = pair_minmax_avx2; break;
    default: break;
    }
#endif
}

void flx_kv_pyramid_build_blocks(const flx_kv_head_view_t *view, flx_bf16_t *meta0, uint32_t b0, uint32_t b1)
{
    rows_fn rows;
    pair_fn pair;
    kernels(&rows, &pair);
    build_level0(view, meta0, b0, b1, rows);
}

void flx_kv_pyramid_build_upper(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS])
{
    rows_fn rows;
    pair_fn pair;
    kernels(&rows, &pair);
    build_upper(view, meta, pair);
}

void flx_kv_pyramid_build(const flx_kv_head_view_t *view, flx_bf16_t *const meta[FLX_KV_META_LEVELS])
{
    rows_fn rows;
    pair_fn pair;
    kernels(&rows, &pair);
    build(view, meta, rows, pair);
}
