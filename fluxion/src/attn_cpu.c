/*
 * attn_cpu.c - the fast attention kernels: AVX-512 BF16, AVX2+FMA and scalar inner loops behind one
 * OpenMP driver per kernel, chosen per call from flx_isa_active().
 *
 * DESIGN
 * Decode attention over host KV is bandwidth-bound, so every driver reads each byte once:
 *  - scoring walks metadata entries split by thread index; each entry (min row | max row, 2D bf16)
 *    is dotted with [min(q,0) | max(q,0)] of every head while it is in L1 (this equals
 *    sum_d max(q_d min_d, q_d max_d) because max >= min);
 *  - sparse attention first ORs the heads' selections into a per-block head mask, then threads
 *    take equal slices of the ascending union list; a 16-token physical block is loaded once and
 *    used by every head in its mask, with a per-head online softmax (m, l, acc[D]) per thread;
 *    the per-thread states are merged by LSE at the end (fixed order: deterministic for a fixed
 *    thread count).
 * q is prepared once per call in the workspace: scaled by 1/sqrt(D) for attention, and for the
 * AVX-512 path split into bf16 hi + lo so _mm512_dpbf16_ps keeps ~16 mantissa bits of q.
 * No kernel reads a row at or past l_cpu / n_win: the last block is handled with ntok < 16.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_internal.h"
#include "flx/util.h"

#define PART_STRIDE(D) ((size_t)(D) + 16)   /* per (thread, head): m, l, pad..., acc at +16 */

/* ---------------- thread helpers ---------------- */

static int attn_threads(const flx_attn_ws_t *ws)
{
#ifdef FLX_TSAN
    (void)ws;
    return 1;
#else
    return (int)ws->shape.n_threads;
#endif
}

static void thread_ids(int *tid, int *nth)
{
#ifdef _OPENMP
    *tid = omp_get_thread_num();
    *nth = omp_get_num_threads();
#else
    *tid = 0;
    *nth = 1;
#endif
}

/* ---------------- q preparation ---------------- */

static void prep_split(flx_attn_ws_t *ws, uint32_t G, uint32_t W)
{
    for (size_t i = 0; i < (size_t)G * W; i++) {
        flx_bf16_t hi = flx_f32_to_bf16(ws->q_f32[i]);
        ws->q_hi[i] = hi;
        ws->q_lo[i] = flx_f32_to_bf16(ws->q_f32[i] - flx_bf16_to_f32(hi));
    }
}

/* The AVX2 path widens bf16 with two ops per 16 values (shift for even, mask for odd elements), so it
 * works in "even/odd" order within each 16-value chunk: position j < 8 holds element 2j, position
 * 8 + j holds element 2j + 1. q is stored permuted for it and outputs are permuted back. */
static void perm_eo(float *x, size_t n)
{
    float t[16];
    for (size_t c = 0; c < n; c += 16) {
        for (int j = 0; j < 8; j++) {
            t[j] = x[c + 2 * j];
            t[8 + j] = x[c + 2 * j + 1];
        }
        memcpy(x + c, t, sizeof t);
    }
}

static void unperm_eo(float *x, size_t n)
{
    float t[16];
    for (size_t c = 0; c < n; c += 16) {
        for (int j = 0; j < 8; j++) {
            t[2 * j] = x[c + j];
            t[2 * j + 1] = x[c + 8 + j];
        }
        memcpy(x + c, t, sizeof t);
    }
}

static void prep_q_attn(flx_attn_ws_t *ws, const float *q, flx_isa_t isa)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    float scale = 1.0f / sqrtf((float)D);
    for (size_t i = 0; i < (size_t)G * D; i++) ws->q_f32[i] = q[i] * scale;
    if (isa >= FLX_ISA_AVX512BF16) prep_split(ws, G, D);
    else if (isa == FLX_ISA_AVX2) perm_eo(ws->q_f32, (size_t)G * D);
}

static void prep_q_score(flx_attn_ws_t *ws, const float *q, flx_isa_t isa)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    for (uint32_t h = 0; h < G; h++)
        for (uint32_t d = 0; d < D; d++) {
            float x = q[(size_t)h * D + d];
            ws->q_f32[(size_t)h * 2 * D + d] = x < 0 ? x : 0.0f;
            ws->q_f32[(size_t)h * 2 * D + D + d] = x > 0 ? x : 0.0f;
        }
    if (isa >= FLX_ISA_AVX512BF16) prep_split(ws, G, 2 * D);
    else if (isa == FLX_ISA_AVX2) perm_eo(ws->q_f32, (size_t)G * 2 * D);
}

/* ---------------- scoring inner loops: entries [e0, e1) ---------------- */

static void score_scalar(const flx_attn_ws_t *ws, const flx_bf16_t *meta, uint32_t n, uint32_t e0, uint32_t e1,
                         float *scores)
{
    uint32_t G = ws->shape.group, W = 2 * ws->shape.head_dim;
    for (uint32_t e = e0; e < e1; e++) {
        const flx_bf16_t *m = meta + (size_t)e * W;
        for (uint32_t h = 0; h < G; h++) {
            const float *qs = ws->q_f32 + (size_t)h * W;
            float s = 0;
            for (uint32_t i = 0; i < W; i++) s += qs[i] * flx_bf16_to_f32(m[i]);
            scores[(size_t)h * n + e] = s;
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static inline __m256 ld8_bf16_avx2(const flx_bf16_t *p)
{
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

__attribute__((target("avx2,fma,f16c"))) static inline float hsum8_avx2(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* Eight entries per pass: eight independent FMA chains (one chain per entry would leave the core
 * waiting on FMA latency) and one hadd-tree reduction into eight scores. The eight entries (4 KiB at
 * D = 128) stay in L1 while every head of the group uses them. */
__attribute__((target("avx2,fma,f16c"))) static void score_avx2(const flx_attn_ws_t *ws, const flx_bf16_t *meta,
                                                                  uint32_t n, uint32_t e0, uint32_t e1, float *scores)
{
    uint32_t G = ws->shape.group, W = 2 * ws->shape.head_dim;
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    uint32_t e = e0;
    for (; e + 8 <= e1; e += 8) {
        const flx_bf16_t *m = meta + (size_t)e * W;
        if (e + 24 <= e1) /* two batches ahead */
            for (size_t off = 0; off < (size_t)8 * W * sizeof(flx_bf16_t); off += 64)
                _mm_prefetch((const char *)(m + (size_t)16 * W) + off, _MM_HINT_T0);
        for (uint32_t h = 0; h < G; h++) {
            const float *qs = ws->q_f32 + (size_t)h * W;
            __m256 a[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
            for (uint32_t i = 0; i < W; i += 16) {
                __m256 qe = _mm256_loadu_ps(qs + i), qo = _mm256_loadu_ps(qs + i + 8);
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(m + (size_t)j * W + i));
                    a[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), qe, a[j]);
                    a[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi16)), qo, a[j]);
                }
            }
            __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            _mm256_storeu_ps(scores + (size_t)h * n + e, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                                                       _mm256_permute2f128_ps(u0, u1, 0x31)));
        }
    }
    for (; e < e1; e++) {
        const flx_bf16_t *m = meta + (size_t)e * W;
        for (uint32_t h = 0; h < G; h++) {
            const float *qs = ws->q_f32 + (size_t)h * W;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (uint32_t i = 0; i < W; i += 16) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(m + i));
                a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), _mm256_loadu_ps(qs + i), a0);
                a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi16)), _mm256_loadu_ps(qs + i + 8), a1);
            }
            scores[(size_t)h * n + e] = hsum8_avx2(_mm256_add_ps(a0, a1));
        }
    }
}

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

T512 static void score_avx512(const flx_attn_ws_t *ws, const flx_bf16_t *meta, uint32_t n, uint32_t e0, uint32_t e1,
                              float *scores)
{
    uint32_t G = ws->shape.group, W = 2 * ws->shape.head_dim;   /* W multiple of 32 */
    for (uint32_t e = e0; e < e1; e++) {
        const flx_bf16_t *m = meta + (size_t)e * W;
        if (e + 4 < e1) _mm_prefetch((const char *)(m + 4 * (size_t)W), _MM_HINT_T0);
        for (uint32_t h = 0; h < G; h++) {
            const flx_bf16_t *qh = ws->q_hi + (size_t)h * W, *ql = ws->q_lo + (size_t)h * W;
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            for (uint32_t i = 0; i < W; i += 32) {
                __m512bh kk = (__m512bh)_mm512_loadu_si512(m + i);
                a0 = _mm512_dpbf16_ps(a0, kk, (__m512bh)_mm512_loadu_si512(qh + i));
                a1 = _mm512_dpbf16_ps(a1, kk, (__m512bh)_mm512_loadu_si512(ql + i));
            }
            scores[(size_t)h * n + e] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
    }
}

flx_status_t flx_attn_score(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                            float *scores)
{
    flx_status_t st = flx_attn_check_view(view, "score");
    if (st) return st;
    if (!ws || !q || !scores || level < 0 || level >= FLX_KV_META_LEVELS)
        return flx_error_set(FLX_ERR_INVALID, "score: bad arguments (level %d)", level);
    if (view->head_dim != ws->shape.head_dim || view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "score: view head_dim %u l_cpu %u vs workspace D %u max_l_cpu %u",
                             view->head_dim, view->l_cpu, ws->shape.head_dim, ws->shape.max_l_cpu);
    uint32_t n = view->meta_n[level];
    if (n == 0) return FLX_OK;
    if (!view->meta[level])
        return flx_error_set(FLX_ERR_INVALID, "score: metadata level %d missing", level);
    flx_isa_t isa = flx_isa_active();
    prep_q_score(ws, q, isa);
    const flx_bf16_t *meta = view->meta[level];
#pragma omp parallel num_threads(attn_threads(ws))
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        uint32_t e0 = (uint32_t)((uint64_t)n * tid / nth), e1 = (uint32_t)((uint64_t)n * (tid + 1) / nth);
        if (isa >= FLX_ISA_AVX512BF16) score_avx512(ws, meta, n, e0, e1, scores);
        else if (isa >= FLX_ISA_AVX2) score_avx2(ws, meta, n, e0, e1, scores);
        else score_scalar(ws, meta, n, e0, e1, scores);
    }
    return FLX_OK;
}

/* ---------------- attention inner loops: one chunk of ntok <= 16 rows ---------------- */

/* Online-softmax state of one (thread, head): st[0] = m, st[1] = l, st + 16 = acc[D]. */

static void chunk_scalar(const flx_attn_ws_t *ws, const flx_bf16_t *kp, const flx_bf16_t *vp, uint32_t ntok,
                         uint64_t mask, float *part)
{
    uint32_t D = ws->shape.head_dim;
    for (uint32_t h = 0; mask; h++, mask >>= 1) {
        if (!(mask & 1)) continue;
        float *st = part + h * PART_STRIDE(D), *acc = st + 16;
        const float *q = ws->q_f32 + (size_t)h * D;
        float s[16], mb = -INFINITY;
        for (uint32_t t = 0; t < ntok; t++) {
            float dot = 0;
            for (uint32_t d = 0; d < D; d++) dot += q[d] * flx_bf16_to_f32(kp[(size_t)t * D + d]);
            s[t] = dot;
            mb = dot > mb ? dot : mb;
        }
        float mn = st[0] > mb ? st[0] : mb;
        float alpha = expf(st[0] - mn), l = st[1] * alpha;
        if (alpha != 1.0f)
            for (uint32_t d = 0; d < D; d++) acc[d] *= alpha;
        for (uint32_t t = 0; t < ntok; t++) {
            float p = expf(s[t] - mn);
            l += p;
            for (uint32_t d = 0; d < D; d++) acc[d] += p * flx_bf16_to_f32(vp[(size_t)t * D + d]);
        }
        st[0] = mn;
        st[1] = l;
    }
}

/* exp for x <= 0 (scores minus their running max); lanes below -87 give ~1e-38, callers zero
 * masked lanes themselves. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 exp_avx2(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma,f16c"))) static inline __m256i ld_row16_avx2(const flx_bf16_t *p, int live)
{
    return live ? _mm256_loadu_si256((const __m256i *)p) : _mm256_setzero_si256();
}

/* bf16 is widened in registers where it is used (shift = even elements, mask = odd elements), so
 * the block is read straight from the pool with no staging stores; q and acc are in even/odd order. */
__attribute__((target("avx2,fma,f16c"))) static void chunk_avx2(const flx_attn_ws_t *ws, const flx_bf16_t *kp,
                                                                  const flx_bf16_t *vp, uint32_t ntok, uint64_t mask,
                                                                  float *part)
{
    uint32_t D = ws->shape.head_dim;
    const __m256i hi16 = _mm256_set1_epi32((int)0xffff0000u);
    for (uint32_t h = 0; mask; h++, mask >>= 1) {
        if (!(mask & 1)) continue;
        float *st = part + h * PART_STRIDE(D), *acc = st + 16;
        const float *q = ws->q_f32 + (size_t)h * D;
        float s[16] __attribute__((aligned(32)));
        /* 8 tokens at a time: 8 independent accumulators sharing each q load, then one
         * transpose-reduce (hadd tree) into 8 scores. Rows >= ntok are never loaded. */
        for (uint32_t t0 = 0; t0 < ntok; t0 += 8) {
            __m256 a[8];
            int nl = (int)(ntok - t0);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            const flx_bf16_t *k = kp + (size_t)t0 * D;
            if (nl >= 8) {
                for (uint32_t d = 0; d < D; d += 16) {
                    __m256 qe = _mm256_loadu_ps(q + d), qo = _mm256_loadu_ps(q + d + 8);
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        __m256i x = _mm256_loadu_si256((const __m256i *)(k + (size_t)i * D + d));
                        a[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), qe, a[i]);
                        a[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi16)), qo, a[i]);
                    }
                }
            } else {
                for (uint32_t d = 0; d < D; d += 16) {
                    __m256 qe = _mm256_loadu_ps(q + d), qo = _mm256_loadu_ps(q + d + 8);
                    for (int i = 0; i < 8; i++) {
                        __m256i x = ld_row16_avx2(k + (size_t)i * D + d, i < nl);
                        a[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), qe, a[i]);
                        a[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(x, hi16)), qo, a[i]);
                    }
                }
            }
            __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            _mm256_store_ps(s + t0, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                                  _mm256_permute2f128_ps(u0, u1, 0x31)));
        }
        float mb = -INFINITY;
        for (uint32_t t = 0; t < ntok; t++) mb = s[t] > mb ? s[t] : mb;
        for (uint32_t t = ntok; t < 16; t++) s[t] = -INFINITY;
        float mn = st[0] > mb ? st[0] : mb;
        float alpha = expf(st[0] - mn);
        __m256 vm = _mm256_set1_ps(mn);
        float p[16] __attribute__((aligned(32)));
        _mm256_store_ps(p, exp_avx2(_mm256_sub_ps(_mm256_load_ps(s), vm)));
        _mm256_store_ps(p + 8, exp_avx2(_mm256_sub_ps(_mm256_load_ps(s + 8), vm)));
        float l = st[1] * alpha;
        for (uint32_t t = 0; t < ntok; t++) l += p[t];
        __m256 va = _mm256_set1_ps(alpha);
        uint32_t d = 0;
        for (; d + 64 <= D; d += 64) {
            __m256 a[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * i), va);
            for (uint32_t t = 0; t < ntok; t++) {
                __m256 pb = _mm256_set1_ps(p[t]);
                const flx_bf16_t *v = vp + (size_t)t * D + d;
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(v + 16 * c));
                    a[2 * c] = _mm256_fmadd_ps(pb, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), a[2 * c]);
                    a[2 * c + 1] = _mm256_fmadd_ps(pb, _mm256_castsi256_ps(_mm256_and_si256(x, hi16)), a[2 * c + 1]);
                }
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + d + 8 * i, a[i]);
        }
        for (; d < D; d += 16) {
            __m256 ae = _mm256_mul_ps(_mm256_loadu_ps(acc + d), va), ao = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), va);
            for (uint32_t t = 0; t < ntok; t++) {
                __m256 pb = _mm256_set1_ps(p[t]);
                __m256i x = _mm256_loadu_si256((const __m256i *)(vp + (size_t)t * D + d));
                ae = _mm256_fmadd_ps(pb, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), ae);
                ao = _mm256_fmadd_ps(pb, _mm256_castsi256_ps(_mm256_and_si256(x, hi16)), ao);
            }
            _mm256_storeu_ps(acc + d, ae);
            _mm256_storeu_ps(acc + d + 8, ao);
        }
        st[0] = mn;
        st[1] = l;
    }
}

T512 static inline __m512 exp_avx512(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

T512 static inline __m512 ld16_bf16_avx512(const flx_bf16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

T512 static void chunk_avx512(const flx_attn_ws_t *ws, const flx_bf16_t *kp, const flx_bf16_t *vp, uint32_t ntok,
                              uint64_t mask, float *part)
{
    uint32_t D = ws->shape.head_dim;
    float vf[16 * FLX_ATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
    /* V converted once per block for all heads of the mask. */
    for (uint32_t t = 0; t < ntok; t++)
        for (uint32_t d = 0; d < D; d += 16)
            _mm512_store_ps(vf + (size_t)t * D + d, ld16_bf16_avx512(vp + (size_t)t * D + d));
    __mmask16 live = (__mmask16)((1u << ntok) - 1u);
    for (uint32_t h = 0; mask; h++, mask >>= 1) {
        if (!(mask & 1)) continue;
        float *st = part + h * PART_STRIDE(D), *acc = st + 16;
        const flx_bf16_t *qh = ws->q_hi + (size_t)h * D, *ql = ws->q_lo + (size_t)h * D;
        float s[16] __attribute__((aligned(64)));
        for (uint32_t t = 0; t < ntok; t++) {
            const flx_bf16_t *k = kp + (size_t)t * D;
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            for (uint32_t d = 0; d < D; d += 32) {
                __m512bh kk = (__m512bh)_mm512_loadu_si512(k + d);
                a0 = _mm512_dpbf16_ps(a0, kk, (__m512bh)_mm512_loadu_si512(qh + d));
                a1 = _mm512_dpbf16_ps(a1, kk, (__m512bh)_mm512_loadu_si512(ql + d));
            }
            s[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        }
        __m512 sv = _mm512_mask_load_ps(_mm512_set1_ps(-INFINITY), live, s);
        float mb = _mm512_reduce_max_ps(sv);
        float mn = st[0] > mb ? st[0] : mb;
        float alpha = expf(st[0] - mn);
        __m512 p = _mm512_maskz_mov_ps(live, exp_avx512(_mm512_sub_ps(sv, _mm512_set1_ps(mn))));
        float l = st[1] * alpha + _mm512_reduce_add_ps(p);
        float pa[16] __attribute__((aligned(64)));
        _mm512_store_ps(pa, p);
        __m512 va = _mm512_set1_ps(alpha);
        for (uint32_t d = 0; d < D; d += 16) {
            __m512 a = _mm512_mul_ps(_mm512_loadu_ps(acc + d), va);
            for (uint32_t t = 0; t < ntok; t++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(pa[t]), _mm512_load_ps(vf + (size_t)t * D + d), a);
            _mm512_storeu_ps(acc + d, a);
        }
        st[0] = mn;
        st[1] = l;
    }
}

typedef void (*chunk_fn)(const flx_attn_ws_t *, const flx_bf16_t *, const flx_bf16_t *, uint32_t, uint64_t, float *);

static chunk_fn pick_chunk(flx_isa_t isa)
{
    return isa >= FLX_ISA_AVX512BF16 ? chunk_avx512 : isa >= FLX_ISA_AVX2 ? chunk_avx2 : chunk_scalar;
}

static void part_reset(float *part, uint32_t G, uint32_t D)
{
    for (uint32_t h = 0; h < G; h++) {
        float *st = part + h * PART_STRIDE(D);
        st[0] = -INFINITY;
        st[1] = 0;
        memset(st + 16, 0, D * sizeof(float));
    }
}

/* Merges the per-thread states of heads in mask into o, lse (thread order fixed). */
static void part_finish(const flx_attn_ws_t *ws, int nth, flx_isa_t isa, float *o, float *lse)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim;
    for (uint32_t h = 0; h < G; h++) {
        float M = -INFINITY;
        for (int t = 0; t < nth; t++) {
            const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
            if (st[1] > 0 && st[0] > M) M = st[0];
        }
        float *oh = o + (size_t)h * D;
        if (M == -INFINITY) {
            memset(oh, 0, D * sizeof *oh);
            lse[h] = -INFINITY;
            continue;
        }
        double L = 0;
        for (int t = 0; t < nth; t++) {
            const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
            if (st[1] > 0) L += st[1] * exp((double)st[0] - M);
        }
        for (uint32_t d = 0; d < D; d++) {
            double a = 0;
            for (int t = 0; t < nth; t++) {
                const float *st = ws->part + ((size_t)t * G + h) * PART_STRIDE(D);
                if (st[1] > 0) a += st[16 + d] * exp((double)st[0] - M);
            }
            oh[d] = (float)(a / L);
        }
        lse[h] = (float)(M + log(L));
        if (isa == FLX_ISA_AVX2) unperm_eo(oh, D);
    }
}

flx_status_t flx_attn_window(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q, float *o,
                             float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "window");
    if (st) return st;
    if (!ws || !q || !o || !lse)
        return flx_error_set(FLX_ERR_INVALID, "window: NULL argument");
    if (view->head_dim != ws->shape.head_dim)
        return flx_error_set(FLX_ERR_INVALID, "window: view head_dim %u vs workspace %u", view->head_dim,
                             ws->shape.head_dim);
    uint32_t n = view->n_win, G = ws->shape.group, D = ws->shape.head_dim;
    if (n && (!view->win_k || !view->win_v))
        return flx_error_set(FLX_ERR_INVALID, "window: n_win %u but no window arrays", n);
    flx_isa_t isa = flx_isa_active();
    prep_q_attn(ws, q, isa);
    chunk_fn fn = pick_chunk(isa);
    uint64_t all = G == 64 ? ~0ull : ((1ull << G) - 1);
    uint32_t nchunk = (n + 15) / 16;
    int used = 1;
#pragma omp parallel num_threads(attn_threads(ws))
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        if (tid == 0) used = nth;
        float *part = ws->part + (size_t)tid * G * PART_STRIDE(D);
        part_reset(part, G, D);
        uint32_t c0 = (uint32_t)((uint64_t)nchunk * tid / nth), c1 = (uint32_t)((uint64_t)nchunk * (tid + 1) / nth);
        for (uint32_t c = c0; c < c1; c++) {
            uint32_t nt = n - c * 16 < 16 ? n - c * 16 : 16;
            fn(ws, view->win_k + (size_t)c * 16 * D, view->win_v + (size_t)c * 16 * D, nt, all, part);
        }
    }
    part_finish(ws, used, isa, o, lse);
    return FLX_OK;
}

/* Union of the heads' selections -> ws->mask / ws->list; returns the list length or an error. */
static flx_status_t build_union(flx_attn_ws_t *ws, uint32_t n, const uint32_t *sel, uint32_t sel_stride,
                                const uint32_t *k, uint32_t *n_list_p)
{
    uint32_t G = ws->shape.group;
    memset(ws->mask, 0, (size_t)n * sizeof *ws->mask);
    for (uint32_t h = 0; h < G; h++) {
        if (k[h] > n)
            return flx_error_set(FLX_ERR_INVALID, "sparse: k[%u] = %u exceeds %u blocks", h, k[h], n);
        const uint32_t *sh = sel + (size_t)h * sel_stride;
        uint64_t bit = 1ull << h;
        for (uint32_t i = 0; i < k[h]; i++) {
            uint32_t b = sh[i];
            if (b >= n)
                return flx_error_set(FLX_ERR_INVALID, "sparse: head %u block index %u out of range (n %u)", h, b, n);
            if (ws->mask[b] & bit)
                return flx_error_set(FLX_ERR_INVALID, "sparse: head %u selects block %u twice", h, b);
            ws->mask[b] |= bit;
        }
    }
    uint32_t m = 0;
    for (uint32_t b = 0; b < n; b++)
        if (ws->mask[b]) ws->list[m++] = b;
    *n_list_p = m;
    return FLX_OK;
}

static inline void prefetch_block(const flx_kv_head_view_t *view, uint32_t pb)
{
    const char *p = (const char *)flx_kv_block_k(view, pb);
    for (size_t off = 0; off < view->block_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

/* Attention over ws->list[0..n_list) (masks in ws->mask) at blk = 16 << level; q already prepared. */
static void sparse_run(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, uint32_t n_list,
                       flx_isa_t isa, float *o, float *lse)
{
    uint32_t G = ws->shape.group, D = ws->shape.head_dim, ppb = 1u << level, l_cpu = view->l_cpu;
    chunk_fn fn = pick_chunk(isa);
    int used = 1;
#pragma omp parallel num_threads(attn_threads(ws))
    {
        int tid, nth;
        thread_ids(&tid, &nth);
        if (tid == 0) used = nth;
        float *part = ws->part + (size_t)tid * G * PART_STRIDE(D);
        part_reset(part, G, D);
        uint32_t u0 = (uint32_t)((uint64_t)n_list * tid / nth), u1 = (uint32_t)((uint64_t)n_list * (tid + 1) / nth);
        /* Walk the slice's physical blocks in order, prefetching PF_AHEAD blocks ahead (the hardware
         * prefetcher does not cross the 8 KiB block boundaries of a gathered selection). */
        enum { PF_AHEAD = 2 };
        uint32_t pu = u0, ppb_i = 0;   /* prefetch cursor: list position and block within it */
        for (int a = 0; a < PF_AHEAD && pu < u1; a++) {
            uint32_t pb = ws->list[pu] * ppb + ppb_i;
            if (pb < view->n_blocks) prefetch_block(view, pb);
            if (++ppb_i == ppb || ws->list[pu] * ppb + ppb_i >= view->n_blocks) { pu++; ppb_i = 0; }
        }
        for (uint32_t u = u0; u < u1; u++) {
            uint32_t b = ws->list[u];
            uint64_t mask = ws->mask[b];
            uint32_t p1 = (b + 1) * ppb < view->n_blocks ? (b + 1) * ppb : view->n_blocks;
            for (uint32_t pb = b * ppb; pb < p1; pb++) {
                uint32_t nt = l_cpu - pb * 16 < 16 ? l_cpu - pb * 16 : 16;
                if (pu < u1) {
                    uint32_t nb = ws->list[pu] * ppb + ppb_i;
                    if (nb < view->n_blocks) prefetch_block(view, nb);
                    if (++ppb_i == ppb || ws->list[pu] * ppb + ppb_i >= view->n_blocks) { pu++; ppb_i = 0; }
                }
                fn(ws, flx_kv_block_k(view, pb), flx_kv_block_v(view, pb), nt, mask, part);
            }
        }
    }
    part_finish(ws, used, isa, o, lse);
}

flx_status_t flx_attn_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                             const uint32_t *sel, uint32_t sel_stride, const uint32_t *k, float *o, float *lse)
{
    flx_status_t st = flx_attn_check_view(view, "sparse");
    if (st) return st;
    if (!ws || !q || !o || !lse || !k || level < 0 || level >= FLX_KV_META_LEVELS)
        return flx_error_set(FLX_ERR_INVALID, "sparse: bad arguments (level %d)", level);
    if (view->head_dim != ws->shape.head_dim || view->l_cpu > ws->shape.max_l_cpu)
        return flx_error_set(FLX_ERR_INVALID, "sparse: view head_dim %u l_cpu %u vs workspace D %u max_l_cpu %u",
                             view->head_dim, view->l_cpu, ws->shape.head_dim, ws->shape.max_l_cpu);
    uint32_t n = flx_kv_meta_count(view->l_cpu, level), n_list;
    if (!sel && n) {
        for (uint32_t h = 0; h < ws->shape.group; h++)
            if (k[h]) return flx_error_set(FLX_ERR_INVALID, "sparse: sel is NULL but k[%u] = %u", h, k[h]);
    }
    if ((st = build_union(ws, n, sel, sel_stride, k, &n_list))) return st;
    flx_isa_t isa = flx_isa_active();
    prep_q_attn(ws, q, isa);
    sparse_run(ws, view, level, n_list, isa, o, lse);
    return FLX_OK;
}

/* All host blocks for every head (FULL mode), through the same driver. */
flx_status_t flx_attn_internal_full_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                         float *o, float *lse, uint64_t *bytes_p);
flx_status_t flx_attn_internal_full_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, const float *q,
                                         float *o, float *lse, uint64_t *bytes_p)
{
    uint32_t G = ws->shape.group, n = view->n_blocks;
    uint64_t all = G == 64 ? ~0ull : ((1ull << G) - 1);
    for (uint32_t b = 0; b < n; b++) {
        ws->mask[b] = all;
        ws->list[b] = b;
    }
    flx_isa_t isa = flx_isa_active();
    prep_q_attn(ws, q, isa);
    sparse_run(ws, view, 0, n, isa, o, lse);
    *bytes_p = (uint64_t)view->l_cpu * view->head_dim * 4;
    return FLX_OK;
}

/* Selected distinct blocks after build_union, for the timing counters. */
uint64_t flx_attn_internal_union_bytes(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level,
                                       uint32_t n_list);
uint64_t flx_attn_internal_union_bytes(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level,
                                       uint32_t n_list)
{
    uint64_t tok = 0;
    uint32_t blk = 16u << level;
    for (uint32_t u = 0; u < n_list; u++) {
        uint32_t b = ws->list[u], t1 = (b + 1) * blk < view->l_cpu ? (b + 1) * blk : view->l_cpu;
        tok += t1 - b * blk;
    }
    return tok * view->head_dim * 4;
}

/* Host sparse attention for the task: union + run, returning the list length. */
flx_status_t flx_attn_internal_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                      float *o, float *lse, uint64_t *bytes_p);
flx_status_t flx_attn_internal_sparse(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                      float *o, float *lse, uint64_t *bytes_p)
{
    uint32_t n = flx_kv_meta_count(view->l_cpu, level), n_list;
    flx_status_t st = build_union(ws, n, ws->sel, ws->n_max, ws->k, &n_list);
    if (st) return st;
    flx_isa_t isa = flx_isa_active();
    prep_q_attn(ws, q, isa);
    sparse_run(ws, view, level, n_list, isa, o, lse);
    *bytes_p = flx_attn_internal_union_bytes(ws, view, level, n_list);
    return FLX_OK;
}
