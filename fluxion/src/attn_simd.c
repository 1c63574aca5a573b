/*
 * attn_simd.c - SIMD inner loops (see attn_simd.h): multi-head dot tiles and the online-softmax
 * block update, for AVX2, AVX-512 and AVX-512 BF16; top-k's passes for AVX-512 (compares, then
 * a compress in a register and a masked store of exactly the lanes kept: a compress straight to
 * memory is microcoded on some CPUs, and a full-width store could write past the output).
 *
 * DESIGN
 * Decode attention reads every K/V byte once and does 2 * G FMAs per element read (G heads of a
 * GQA group), so the work per byte is fixed and what decides whether a kernel keeps up with
 * memory is the overhead around the FMAs. Three choices keep it low:
 *  - a bf16 row is widened to fp32 ONCE per tile and used by every head of the tile (up to 4 with
 *    AVX-512, 2 with AVX2: all accumulators stay in registers);
 *  - a tile is 4 rows x up to 4 heads = 16 independent FMA chains, and its 16 dot products are
 *    reduced together by one transpose-add tree (about 3 shuffles + adds per score instead of a
 *    full horizontal reduction each);
 *  - P.V widens each V row once per group of heads and keeps 2 x (heads) accumulator chains.
 * The AVX-512 BF16 level replaces widen + FMA in the dot tiles by _mm512_dpbf16_ps with q split
 * into bf16 hi + lo (about 16 mantissa bits of q); P.V stays fp32 (p must not be rounded to bf16).
 */
#include "flx/simd_exp.h"
#include "attn_simd.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define FLX_ALIGN8(n) (((n) + 7u) & ~7u)
#define TAVX2 __attribute__((target("avx2,fma,f16c")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

/* ================================ AVX2 ================================ */

/* Lane i of the result = sum of the lanes of a[i]. */
TAVX2 INLINE __m256 reduce8_avx2(const __m256 *a)
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Dots of nr <= 4 rows with NH <= 2 heads: lane hh * 4 + r. A 16-value bf16 chunk widens into its
 * even elements (shift) and odd elements (mask); q is stored in that even/odd order. */
TAVX2 INLINE __m256 tile_avx2(const flx_bf16_t *rows, size_t rstride, uint32_t nr, uint32_t W, const float *q0,
                              const float *q1, const int NH)
{
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i ones = _mm256_set1_epi32(-1), zero = _mm256_setzero_si256();
    const __m256i m1 = nr > 1 ? ones : zero, m2 = nr > 2 ? ones : zero, m3 = nr > 3 ? ones : zero;
    const flx_bf16_t *r1 = nr > 1 ? rows + rstride : rows, *r2 = nr > 2 ? rows + 2 * rstride : rows;
    const flx_bf16_t *r3 = nr > 3 ? rows + 3 * rstride : rows;
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < W; d += 16) {
        __m256i x[4];
        x[0] = _mm256_loadu_si256((const __m256i *)(rows + d));
        x[1] = _mm256_maskload_epi32((const int *)(r1 + d), m1);
        x[2] = _mm256_maskload_epi32((const int *)(r2 + d), m2);
        x[3] = _mm256_maskload_epi32((const int *)(r3 + d), m3);
        __m256 qe0 = _mm256_loadu_ps(q0 + d), qo0 = _mm256_loadu_ps(q0 + d + 8);
        __m256 qe1 = NH > 1 ? _mm256_loadu_ps(q1 + d) : qe0, qo1 = NH > 1 ? _mm256_loadu_ps(q1 + d + 8) : qo0;
        for (int t = 0; t < 4; t++) {
            __m256 ke = _mm256_castsi256_ps(_mm256_slli_epi32(x[t], 16));
            __m256 ko = _mm256_castsi256_ps(_mm256_and_si256(x[t], hi16));
            acc[t] = _mm256_fmadd_ps(qe0, ke, acc[t]);
            acc[t] = _mm256_fmadd_ps(qo0, ko, acc[t]);
            if (NH > 1) {
                acc[4 + t] = _mm256_fmadd_ps(qe1, ke, acc[4 + t]);
                acc[4 + t] = _mm256_fmadd_ps(qo1, ko, acc[4 + t]);
            }
        }
    }
    return reduce8_avx2(acc);
}

TAVX2 void attn_dots_avx2(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                          const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf)
{
    const uint32_t W = q->W;
    float tmp[8] __attribute__((aligned(32)));
    const char *pc = pf;
    for (uint32_t r0 = 0; r0 < nrows; r0 += 4) {
        if (pc) { /* 4 rows' worth of the stream ahead, one line in two */
            for (size_t off = 0; off < (size_t)4 * W * sizeof(flx_bf16_t); off += 128) _mm_prefetch(pc + off, _MM_HINT_T0);
            pc += (size_t)4 * W * sizeof(flx_bf16_t);
        }
        const uint32_t nr = nrows - r0 < 4 ? nrows - r0 : 4;
        const flx_bf16_t *rw = rows + (size_t)r0 * rstride;
        for (uint32_t h0 = 0; h0 < nh; h0 += 2) {
            const float *q0 = q->f32 + (size_t)heads[h0] * W;
            __m256 s;
            if (h0 + 1 < nh) s = tile_avx2(rw, rstride, nr, W, q0, q->f32 + (size_t)heads[h0 + 1] * W, 2);
            else s = tile_avx2(rw, rstride, nr, W, q0, q0, 1);
            if (nr == 4) {   /* 128-bit lane i holds head h0 + i's rows r0..r0+3 */
                _mm_storeu_ps(out + (size_t)h0 * out_stride + r0, _mm256_castps256_ps128(s));
                if (h0 + 1 < nh) _mm_storeu_ps(out + (size_t)(h0 + 1) * out_stride + r0, _mm256_extractf128_ps(s, 1));
                continue;
            }
            _mm256_store_ps(tmp, s);
            for (uint32_t i = 0; i < 2 && h0 + i < nh; i++)
                for (uint32_t r = 0; r < nr; r++) out[(size_t)(h0 + i) * out_stride + r0 + r] = tmp[i * 4 + r];
        }
    }
}

/* acc (even/odd order) = alpha * acc + sum_t p[t] v[t] for NH <= 4 heads. */
TAVX2 INLINE void pv_avx2(const flx_bf16_t *v, uint32_t ntok, uint32_t D, const float *P, const float *alpha,
                          float *const *acc, const int NH)
{
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    for (uint32_t d = 0; d < D; d += 16) {
        __m256 ae[4], ao[4];
        for (int h = 0; h < NH; h++) {
            __m256 va = _mm256_set1_ps(alpha[h]);
            ae[h] = _mm256_mul_ps(_mm256_loadu_ps(acc[h] + d), va);
            ao[h] = _mm256_mul_ps(_mm256_loadu_ps(acc[h] + d + 8), va);
        }
        for (uint32_t t = 0; t < ntok; t++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(v + (size_t)t * D + d));
            __m256 ve = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
            __m256 vo = _mm256_castsi256_ps(_mm256_and_si256(x, hi16));
            for (int h = 0; h < NH; h++) {
                __m256 pb = _mm256_broadcast_ss(P + (size_t)h * 16 + t);
                ae[h] = _mm256_fmadd_ps(pb, ve, ae[h]);
                ao[h] = _mm256_fmadd_ps(pb, vo, ao[h]);
            }
        }
        for (int h = 0; h < NH; h++) {
            _mm256_storeu_ps(acc[h] + d, ae[h]);
            _mm256_storeu_ps(acc[h] + d + 8, ao[h]);
        }
    }
}

TAVX2 void attn_block_avx2(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D, const attn_q_t *q,
                           const uint8_t *heads, uint32_t nh, float *part, const flx_bf16_t *next_k,
                           const flx_bf16_t *next_v)
{
    if (next_k) /* start the next block's K and V streams */
        for (int i = 0; i < 3; i++) {
            _mm_prefetch((const char *)next_k + 128 * i, _MM_HINT_T0);
            _mm_prefetch((const char *)next_v + 128 * i, _MM_HINT_T0);
        }
    float S[64 * 16] __attribute__((aligned(32))), P[64 * 16] __attribute__((aligned(32)));
    float alpha[64] __attribute__((aligned(32))), mold[64] __attribute__((aligned(32)));
    float mnew[64] __attribute__((aligned(32)));
    attn_dots_avx2(k, D, ntok, q, heads, nh, S, 16, NULL);
    for (uint32_t i = 0; i < nh; i++) {
        const float *st = part + heads[i] * ATTN_PART_STRIDE(D);
        float *s = S + 16 * i, mb = -INFINITY;
        for (uint32_t t = 0; t < ntok; t++) mb = s[t] > mb ? s[t] : mb;
        for (uint32_t t = ntok; t < 16; t++) s[t] = mb;   /* finite filler; never summed */
        mold[i] = st[0];
        mnew[i] = st[0] > mb ? st[0] : mb;
        __m256 vm = _mm256_set1_ps(mnew[i]);
        _mm256_store_ps(P + 16 * i, flx_exp_avx2(_mm256_sub_ps(_mm256_load_ps(s), vm)));
        _mm256_store_ps(P + 16 * i + 8, flx_exp_avx2(_mm256_sub_ps(_mm256_load_ps(s + 8), vm)));
    }
    /* alpha = exp(m_old - m_new), 8 heads at a time; m_old = -inf (first block) gives 0. */
    for (uint32_t i = nh; i < FLX_ALIGN8(nh); i++) mold[i] = mnew[i] = 0;
    for (uint32_t i = 0; i < nh; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_load_ps(mold + i), _mm256_load_ps(mnew + i));
        __m256 big = _mm256_cmp_ps(d, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
        _mm256_store_ps(alpha + i, _mm256_and_ps(flx_exp_avx2(d), big));
    }
    for (uint32_t i = 0; i < nh; i++) {
        float *st = part + heads[i] * ATTN_PART_STRIDE(D), l = st[1] * alpha[i];
        for (uint32_t t = 0; t < ntok; t++) l += P[16 * i + t];
        st[0] = mnew[i];
        st[1] = l;
    }
    for (uint32_t h0 = 0; h0 < nh; h0 += 4) {
        float *acc[4];
        const uint32_t n = nh - h0 < 4 ? nh - h0 : 4;
        for (uint32_t i = 0; i < n; i++) acc[i] = part + heads[h0 + i] * ATTN_PART_STRIDE(D) + 16;
        const float *Ph = P + 16 * (size_t)h0, *ah = alpha + h0;
        switch (n) {
        case 1: pv_avx2(v, ntok, D, Ph, ah, acc, 1); break;
        case 2: pv_avx2(v, ntok, D, Ph, ah, acc, 2); break;
        case 3: pv_avx2(v, ntok, D, Ph, ah, acc, 3); break;
        default: pv_avx2(v, ntok, D, Ph, ah, acc, 4); break;
        }
    }
}

/* ================================ AVX-512 ================================ */


T512 INLINE __m512 widen16(__m256i x)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

T512 INLINE __m512 add_pair128(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
}
T512 INLINE __m512 add_lane128(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}
T512 INLINE __m512 add_pair64(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
}
T512 INLINE __m512 add_pair32(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

/* Lane i of the result = sum of the lanes of a[i]: 15 adds, 30 shuffles for 16 sums. The tree
 * leaves sum(a'[4m + L]) in lane 4L + m, so it is fed a'[4m + L] = a[4L + m]. */
T512 INLINE __m512 reduce16_512(const __m512 *a)
{
#define AP(j) a[((j) & 3) * 4 + ((j) >> 2)]
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++) b[i] = add_pair128(AP(2 * i), AP(2 * i + 1));
#undef AP
    for (int j = 0; j < 4; j++) c[j] = add_lane128(b[2 * j], b[2 * j + 1]);
    return add_pair32(add_pair64(c[0], c[1]), add_pair64(c[2], c[3]));
}

/* Dots of nr <= 4 rows with NH <= 4 heads: lane hh * 4 + r. Full 32-channel chunks are loaded as
 * 16 32-bit lanes and widened into even (shift) and odd (mask) elements, q being stored in that
 * order ([16 even | 16 odd] per chunk); a final 16-channel chunk (W % 32 == 16) is natural order.
 * Rows >= nr are masked loads of nothing (no memory access) and give zero. */
T512 INLINE __m512 tile_512(const flx_bf16_t *rows, size_t rstride, uint32_t nr, uint32_t W, const float *const *qh,
                            const int NH, const char *pf)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __mmask32 m1 = nr > 1 ? 0xffffffffu : 0, m2 = nr > 2 ? 0xffffffffu : 0, m3 = nr > 3 ? 0xffffffffu : 0;
    const flx_bf16_t *r1 = rows + (nr > 1 ? rstride : 0), *r2 = rows + (nr > 2 ? 2 * rstride : 0);
    const flx_bf16_t *r3 = rows + (nr > 3 ? 3 * rstride : 0);
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    uint32_t d = 0;
    for (; d + 32 <= W; d += 32) {
        if (pf) { /* 4 lines of the next block's K per 32 channels x 4 rows: all of it over a block */
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            _mm_prefetch(pf + 128, _MM_HINT_T0);
            _mm_prefetch(pf + 192, _MM_HINT_T0);
            pf += 256;
        }
        __m512i x[4];
        x[0] = _mm512_loadu_si512(rows + d);
        if (nr == 4) {
            x[1] = _mm512_loadu_si512(r1 + d);
            x[2] = _mm512_loadu_si512(r2 + d);
            x[3] = _mm512_loadu_si512(r3 + d);
        } else {
            x[1] = _mm512_maskz_loadu_epi16(m1, r1 + d);
            x[2] = _mm512_maskz_loadu_epi16(m2, r2 + d);
            x[3] = _mm512_maskz_loadu_epi16(m3, r3 + d);
        }
        __m512 e[4], o[4];
        for (int t = 0; t < 4; t++) {
            e[t] = _mm512_castsi512_ps(_mm512_slli_epi32(x[t], 16));
            o[t] = _mm512_castsi512_ps(_mm512_and_si512(x[t], hi));
        }
        for (int h = 0; h < NH; h++) {
            __m512 qe = _mm512_loadu_ps(qh[h] + d), qo = _mm512_loadu_ps(qh[h] + d + 16);
            for (int t = 0; t < 4; t++) {
                acc[h * 4 + t] = _mm512_fmadd_ps(qe, e[t], acc[h * 4 + t]);
                acc[h * 4 + t] = _mm512_fmadd_ps(qo, o[t], acc[h * 4 + t]);
            }
        }
    }
    if (d < W) {
        const __mmask16 n1 = (__mmask16)m1, n2 = (__mmask16)m2, n3 = (__mmask16)m3;
        __m512 k[4];
        k[0] = widen16(_mm256_loadu_si256((const __m256i *)(rows + d)));
        k[1] = widen16(_mm256_maskz_loadu_epi16(n1, r1 + d));
        k[2] = widen16(_mm256_maskz_loadu_epi16(n2, r2 + d));
        k[3] = widen16(_mm256_maskz_loadu_epi16(n3, r3 + d));
        for (int h = 0; h < NH; h++) {
            __m512 qv = _mm512_loadu_ps(qh[h] + d);
            for (int t = 0; t < 4; t++) acc[h * 4 + t] = _mm512_fmadd_ps(qv, k[t], acc[h * 4 + t]);
        }
    }
    return reduce16_512(acc);
}

/* tile_512 for n <= 4 heads, n known only at run time. */
T512 INLINE __m512 tile_n_512(const flx_bf16_t *rows, size_t rstride, uint32_t nr, uint32_t W, const float *const *qh,
                              uint32_t n, const char *pf)
{
    switch (n) {
    case 1: return tile_512(rows, rstride, nr, W, qh, 1, pf);
    case 2: return tile_512(rows, rstride, nr, W, qh, 2, pf);
    case 3: return tile_512(rows, rstride, nr, W, qh, 3, pf);
    default: return tile_512(rows, rstride, nr, W, qh, 4, pf);
    }
}

/* Stores a tile's results (lane hh * 4 + r): 128-bit lane hh holds head hh's rows r0..r0+3. */
T512 INLINE void tile_store(__m512 s, uint32_t nh, uint32_t nr, float *out, size_t out_stride, uint32_t r0)
{
    if (nr == 4) {
        _mm_storeu_ps(out + r0, _mm512_castps512_ps128(s));
        if (nh > 1) _mm_storeu_ps(out + out_stride + r0, _mm512_extractf32x4_ps(s, 1));
        if (nh > 2) _mm_storeu_ps(out + 2 * out_stride + r0, _mm512_extractf32x4_ps(s, 2));
        if (nh > 3) _mm_storeu_ps(out + 3 * out_stride + r0, _mm512_extractf32x4_ps(s, 3));
        return;
    }
    float tmp[16] __attribute__((aligned(64)));
    _mm512_store_ps(tmp, s);
    for (uint32_t i = 0; i < nh; i++)
        for (uint32_t r = 0; r < nr; r++) out[(size_t)i * out_stride + r0 + r] = tmp[i * 4 + r];
}

/* pf: the stream to prefetch over the tiles of the first head group (NULL: none): 4 lines per 32
 * channels of a tile's 4 rows, i.e. as many bytes as the rows themselves. */
T512 void attn_dots_avx512(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                           const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pfv)
{
    const char *pf = pfv;
    const uint32_t W = q->W;
    for (uint32_t r0 = 0; r0 < nrows; r0 += 4) {
        const uint32_t nr = nrows - r0 < 4 ? nrows - r0 : 4;
        const flx_bf16_t *rw = rows + (size_t)r0 * rstride;
        for (uint32_t h0 = 0; h0 < nh; h0 += 4) {
            const uint32_t n = nh - h0 < 4 ? nh - h0 : 4;
            const float *qh[4];
            for (uint32_t i = 0; i < 4; i++) qh[i] = q->f32 + (size_t)heads[h0 + (i < n ? i : 0)] * W;
            const __m512 s = tile_n_512(rw, rstride, nr, W, qh, n, h0 == 0 ? pf : NULL);
            tile_store(s, n, nr, out + (size_t)h0 * out_stride, out_stride, r0);
        }
        if (pf) pf += (size_t)(W / 32) * 256;
    }
}

/* acc = alpha * acc + sum_t p[t] v[t] for NH <= 4 heads, 32 channels per pass (2 * NH chains). acc
 * is in the dots' order: [16 even | 16 odd] per full 32-channel chunk, a final 16-channel chunk
 * natural. */
T512 INLINE void pv_512(const flx_bf16_t *v, uint32_t ntok, uint32_t D, const float *P, const float *alpha,
                        float *const *acc, const int NH, const char *pf)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    uint32_t d = 0;
    for (; d + 32 <= D; d += 32) {
        __m512 a0[4], a1[4];
        for (int h = 0; h < NH; h++) {
            __m512 va = _mm512_set1_ps(alpha[h]);
            a0[h] = _mm512_mul_ps(_mm512_loadu_ps(acc[h] + d), va);
            a1[h] = _mm512_mul_ps(_mm512_loadu_ps(acc[h] + d + 16), va);
        }
        for (uint32_t t = 0; t < ntok; t++) {
            if (pf) { /* one line of the next block's V per token and 32 channels: all of it */
                _mm_prefetch(pf, _MM_HINT_T0);
                pf += 64;
            }
            __m512i x = _mm512_loadu_si512(v + (size_t)t * D + d);
            __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
            for (int h = 0; h < NH; h++) {
                __m512 pb = _mm512_set1_ps(P[(size_t)h * 16 + t]);
                a0[h] = _mm512_fmadd_ps(pb, ve, a0[h]);
                a1[h] = _mm512_fmadd_ps(pb, vo, a1[h]);
            }
        }
        for (int h = 0; h < NH; h++) {
            _mm512_storeu_ps(acc[h] + d, a0[h]);
            _mm512_storeu_ps(acc[h] + d + 16, a1[h]);
        }
    }
    if (d < D) { /* D % 32 == 16 */
        __m512 a0[4];
        for (int h = 0; h < NH; h++) a0[h] = _mm512_mul_ps(_mm512_loadu_ps(acc[h] + d), _mm512_set1_ps(alpha[h]));
        for (uint32_t t = 0; t < ntok; t++) {
            __m512 v0 = widen16(_mm256_loadu_si256((const __m256i *)(v + (size_t)t * D + d)));
            for (int h = 0; h < NH; h++) a0[h] = _mm512_fmadd_ps(_mm512_set1_ps(P[(size_t)h * 16 + t]), v0, a0[h]);
        }
        for (int h = 0; h < NH; h++) _mm512_storeu_ps(acc[h] + d, a0[h]);
    }
}

/* Softmax update of nh heads from their scores S (nh, 16), then P.V. */
T512 static void softmax_pv_512(const flx_bf16_t *v, uint32_t ntok, uint32_t D, const uint8_t *heads, uint32_t nh,
                                float *S, float *part, const char *pf_v)
{
    float P[64 * 16] __attribute__((aligned(64))), alpha[64] __attribute__((aligned(64)));
    float mold[64] __attribute__((aligned(64))), mnew[64] __attribute__((aligned(64)));
    const __mmask16 live = (__mmask16)((1u << ntok) - 1u);
    for (uint32_t i = 0; i < nh; i++) {
        const float *st = part + heads[i] * ATTN_PART_STRIDE(D);
        __m512 sv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, S + 16 * i);
        const float mb = _mm512_reduce_max_ps(sv);
        mold[i] = st[0];
        mnew[i] = st[0] > mb ? st[0] : mb;
        _mm512_store_ps(P + 16 * i, _mm512_maskz_mov_ps(live, flx_exp_avx512(_mm512_sub_ps(sv, _mm512_set1_ps(mnew[i])))));
    }
    /* alpha = exp(m_old - m_new) for 16 heads at a time; m_old = -inf (first block) gives 0. */
    for (uint32_t i = 0; i < nh; i += 16) {
        const __mmask16 hm = nh - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nh - i)) - 1u);
        __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(hm, mold + i), _mm512_maskz_loadu_ps(hm, mnew + i));
        __m512 a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(d, _mm512_set1_ps(-104.0f), _CMP_LT_OQ), flx_exp_avx512(d),
                                        _mm512_setzero_ps());
        _mm512_store_ps(alpha + i, a);
    }
    for (uint32_t i = 0; i < nh; i++) {
        float *st = part + heads[i] * ATTN_PART_STRIDE(D);
        st[1] = st[1] * alpha[i] + _mm512_reduce_add_ps(_mm512_load_ps(P + 16 * i));
        st[0] = mnew[i];
    }
    for (uint32_t h0 = 0; h0 < nh; h0 += 4) {
        float *acc[4];
        const uint32_t n = nh - h0 < 4 ? nh - h0 : 4;
        for (uint32_t i = 0; i < n; i++) acc[i] = part + heads[h0 + i] * ATTN_PART_STRIDE(D) + 16;
        const float *Ph = P + 16 * (size_t)h0, *ah = alpha + h0;
        const char *pfv = h0 == 0 ? pf_v : NULL;
        switch (n) {
        case 1: pv_512(v, ntok, D, Ph, ah, acc, 1, pfv); break;
        case 2: pv_512(v, ntok, D, Ph, ah, acc, 2, pfv); break;
        case 3: pv_512(v, ntok, D, Ph, ah, acc, 3, pfv); break;
        default: pv_512(v, ntok, D, Ph, ah, acc, 4, pfv); break;
        }
    }
}

/* attn_dots_avx512 over one block (ntok <= 16 rows, row stride D) for nh <= 4 heads, the same
 * sums, but each head's 16 scores leave as one vector: the four 4-row tiles (lane hh * 4 + r) are
 * transposed by 128-bit lanes in registers. Stored as 4-float pieces, a head's scores came back to
 * softmax_pv_512 through a 64-byte load that no single store could forward. */
T512 static void dots16_512(const flx_bf16_t *k, uint32_t D, uint32_t ntok, const attn_q_t *q, const uint8_t *heads,
                            uint32_t nh, float *S, const char *pf)
{
    const uint32_t W = q->W;
    const float *qh[4];
    for (uint32_t i = 0; i < 4; i++) qh[i] = q->f32 + (size_t)heads[i < nh ? i : 0] * W;
    __m512 s[4];
    for (uint32_t t = 0; t < 4; t++) {
        const uint32_t r0 = 4 * t, nr = ntok > r0 ? (ntok - r0 < 4 ? ntok - r0 : 4) : 0;
        if (!nr) {
            s[t] = _mm512_setzero_ps();
            continue;
        }
        s[t] = tile_n_512(k + (size_t)r0 * D, D, nr, W, qh, nh, pf);
        if (pf) pf += (size_t)(W / 32) * 256;
    }
    const __m512 t0 = _mm512_shuffle_f32x4(s[0], s[1], 0x44), t1 = _mm512_shuffle_f32x4(s[0], s[1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(s[2], s[3], 0x44), t3 = _mm512_shuffle_f32x4(s[2], s[3], 0xEE);
    _mm512_store_ps(S, _mm512_shuffle_f32x4(t0, t2, 0x88));
    if (nh > 1) _mm512_store_ps(S + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    if (nh > 2) _mm512_store_ps(S + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
    if (nh > 3) _mm512_store_ps(S + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
}

/* next: the next block to read (its K, V halves are prefetched while this one is computed) or NULL. */
T512 void attn_block_avx512(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D, const attn_q_t *q,
                            const uint8_t *heads, uint32_t nh, float *part, const flx_bf16_t *next_k,
                            const flx_bf16_t *next_v)
{
    float S[64 * 16] __attribute__((aligned(64)));
    if (nh <= 4) dots16_512(k, D, ntok, q, heads, nh, S, (const char *)next_k);
    else attn_dots_avx512(k, D, ntok, q, heads, nh, S, 16, next_k);
    softmax_pv_512(v, ntok, D, heads, nh, S, part, (const char *)next_v);
}

/* ============================ AVX-512 BF16 ============================ */

/* As tile_512 with _mm512_dpbf16_ps on the raw bf16 rows and q = hi + lo (32 channels a step; a
 * final 16-channel step when W % 32 == 16 loads zeros in the upper half). */
T512BF INLINE __m512 tile_bf16(const flx_bf16_t *rows, size_t rstride, uint32_t nr, uint32_t W,
                               const flx_bf16_t *const *qhi, const flx_bf16_t *const *qlo, const int NH)
{
    const flx_bf16_t *r1 = rows + (nr > 1 ? rstride : 0), *r2 = rows + (nr > 2 ? 2 * rstride : 0);
    const flx_bf16_t *r3 = rows + (nr > 3 ? 3 * rstride : 0);
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (uint32_t d = 0; d < W; d += 32) {
        const __mmask32 mc = W - d >= 32 ? 0xffffffffu : 0x0000ffffu;
        __m512bh k[4];
        k[0] = (__m512bh)_mm512_maskz_loadu_epi16(mc, rows + d);
        k[1] = (__m512bh)_mm512_maskz_loadu_epi16(nr > 1 ? mc : 0, r1 + d);
        k[2] = (__m512bh)_mm512_maskz_loadu_epi16(nr > 2 ? mc : 0, r2 + d);
        k[3] = (__m512bh)_mm512_maskz_loadu_epi16(nr > 3 ? mc : 0, r3 + d);
        for (int h = 0; h < NH; h++) {
            __m512bh qh = (__m512bh)_mm512_maskz_loadu_epi16(mc, qhi[h] + d);
            __m512bh ql = (__m512bh)_mm512_maskz_loadu_epi16(mc, qlo[h] + d);
            for (int t = 0; t < 4; t++) {
                acc[h * 4 + t] = _mm512_dpbf16_ps(acc[h * 4 + t], k[t], qh);
                acc[h * 4 + t] = _mm512_dpbf16_ps(acc[h * 4 + t], k[t], ql);
            }
        }
    }
    return reduce16_512(acc);
}

T512BF void attn_dots_avx512bf16(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                                 const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf)
{
    const uint32_t W = q->W;
    const char *pc = pf;
    for (uint32_t r0 = 0; r0 < nrows; r0 += 4) {
        if (pc) { /* 4 rows' worth of the stream ahead */
            for (size_t off = 0; off < (size_t)4 * W * sizeof(flx_bf16_t); off += 64) _mm_prefetch(pc + off, _MM_HINT_T0);
            pc += (size_t)4 * W * sizeof(flx_bf16_t);
        }
        const uint32_t nr = nrows - r0 < 4 ? nrows - r0 : 4;
        const flx_bf16_t *rw = rows + (size_t)r0 * rstride;
        for (uint32_t h0 = 0; h0 < nh; h0 += 4) {
            const uint32_t n = nh - h0 < 4 ? nh - h0 : 4;
            const flx_bf16_t *qh[4], *ql[4];
            for (uint32_t i = 0; i < 4; i++) {
                size_t off = (size_t)heads[h0 + (i < n ? i : 0)] * W;
                qh[i] = q->hi + off;
                ql[i] = q->lo + off;
            }
            __m512 s;
            switch (n) {
            case 1: s = tile_bf16(rw, rstride, nr, W, qh, ql, 1); break;
            case 2: s = tile_bf16(rw, rstride, nr, W, qh, ql, 2); break;
            case 3: s = tile_bf16(rw, rstride, nr, W, qh, ql, 3); break;
            default: s = tile_bf16(rw, rstride, nr, W, qh, ql, 4); break;
            }
            tile_store(s, n, nr, out + (size_t)h0 * out_stride, out_stride, r0);
        }
    }
}

T512BF void attn_block_avx512bf16(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D,
                                  const attn_q_t *q, const uint8_t *heads, uint32_t nh, float *part,
                                  const flx_bf16_t *next_k, const flx_bf16_t *next_v)
{
    float S[64 * 16] __attribute__((aligned(64)));
    attn_dots_avx512bf16(k, D, ntok, q, heads, nh, S, 16, next_k);
    softmax_pv_512(v, ntok, D, heads, nh, S, part, (const char *)next_v);
}

/* ================================ top-k passes (AVX-512) ================================ */

/* Rank keys of up to 16 scores at s (lanes outside `live` read nothing): NaN -> -inf. */
T512 INLINE __m512 rank_keys16(const float *s, __mmask16 live)
{
    const __m512 x = _mm512_maskz_loadu_ps(live, s);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), _mm512_set1_ps(-INFINITY), x);
}

T512 INLINE __mmask16 live16(uint32_t i, uint32_t n)
{
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

/* The lanes of x in keep, packed, to out: exactly that many written (compressed in a register, then
 * a masked store); returns how many. */
T512 INLINE uint32_t store_kept_ps(float *out, __mmask16 keep, __m512 x)
{
    const uint32_t c = (uint32_t)__builtin_popcount(keep);
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << c) - 1), _mm512_maskz_compress_ps(keep, x));
    return c;
}

T512 INLINE uint32_t store_kept_epi32(uint32_t *out, __mmask16 keep, __m512i x)
{
    const uint32_t c = (uint32_t)__builtin_popcount(keep);
    _mm512_mask_storeu_epi32(out, (__mmask16)((1u << c) - 1), _mm512_maskz_compress_epi32(keep, x));
    return c;
}

T512 uint32_t attn_topk_cut_avx512(const float *s, uint32_t n, float t, float *out)
{
    const __m512 tv = _mm512_set1_ps(t);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 live = live16(i, n);
        const __m512 x = rank_keys16(s + i, live);
        m += store_kept_ps(out + m, _mm512_mask_cmp_ps_mask(live, x, tv, _CMP_GE_OQ), x);
    }
    return m;
}

T512 uint32_t attn_topk_take_avx512(const float *s, uint32_t n, float tau, uint32_t n_eq, uint32_t *idx)
{
    const __m512 tv = _mm512_set1_ps(tau);
    const __m512i step = _mm512_set1_epi32(16), iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                                         13, 14, 15);
    uint32_t c = 0;
    __m512i iv = iota;
    for (uint32_t i = 0; i < n; i += 16, iv = _mm512_add_epi32(iv, step)) {   /* above tau */
        const __mmask16 live = live16(i, n);
        c += store_kept_epi32(idx + c, _mm512_mask_cmp_ps_mask(live, rank_keys16(s + i, live), tv, _CMP_GT_OQ), iv);
    }
    iv = iota;
    for (uint32_t i = 0; i < n && n_eq; i += 16, iv = _mm512_add_epi32(iv, step)) {   /* the lowest equal to it */
        const __mmask16 live = live16(i, n);
        __mmask16 eq = _mm512_mask_cmp_ps_mask(live, rank_keys16(s + i, live), tv, _CMP_EQ_OQ), take = 0;
        for (; eq && n_eq; n_eq--) {
            take |= (__mmask16)(eq & -eq);
            eq &= (__mmask16)(eq - 1);
        }
        c += store_kept_epi32(idx + c, take, iv);
    }
    return c;
}

T512 void attn_topk_count_avx512(const float *f, uint32_t n, float pv, uint32_t *gt, uint32_t *eq)
{
    const __m512 pvv = _mm512_set1_ps(pv);
    uint32_t g = 0, e = 0;
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 live = live16(i, n);
        const __m512 x = _mm512_maskz_loadu_ps(live, f + i);
        g += (uint32_t)__builtin_popcount(_mm512_mask_cmp_ps_mask(live, x, pvv, _CMP_GT_OQ));
        e += (uint32_t)__builtin_popcount(_mm512_mask_cmp_ps_mask(live, x, pvv, _CMP_EQ_OQ));
    }
    *gt = g, *eq = e;
}

T512 uint32_t attn_topk_keep_avx512(float *f, uint32_t n, float pv, int above)
{
    const __m512 pvv = _mm512_set1_ps(pv);
    uint32_t w = 0;
    for (uint32_t i = 0; i < n; i += 16) {
        const __mmask16 live = live16(i, n);
        const __m512 x = _mm512_maskz_loadu_ps(live, f + i);
        const __mmask16 keep = above ? _mm512_mask_cmp_ps_mask(live, x, pvv, _CMP_GT_OQ)
                                     : _mm512_mask_cmp_ps_mask(live, x, pvv, _CMP_LT_OQ);
        w += store_kept_ps(f + w, keep, x);   /* w <= i: the store ends within the vector just loaded */
    }
    return w;
}
