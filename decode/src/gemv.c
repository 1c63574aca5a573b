/*
 * gemv.c - bf16-weight GEMV / GEMM and the row kernels of the forward pass: scalar references,
 * AVX2+FMA and AVX-512F/BW versions, chosen per call by flx_gemv_level().
 *
 * DESIGN
 * Decode (GEMV, n <= a handful of vectors) is bound by memory bandwidth: the weights are read once
 * per step and nothing else is large. The AVX-512 kernel reads each weight row front to back (one
 * sequential stream for the hardware prefetchers, helped on Intel CPUs by a prefetch into L2 that
 * runs flx_cpu_stream_prefetch() bytes ahead), widens 32 bf16 to fp32 with one masked word permute
 * per 16, and multiplies each widened chunk with up to 8 vectors while it is in registers; the dot
 * products of a group of rows are reduced together (when n exceeds 8 the group's rows are re-read
 * from L1, never from memory).
 * The AVX2 kernel walks 4 rows at a time with vector tiles of 2. Rows of all matrices of a
 * fused call (q|k|v, gate|up) are split across threads by thread index in 16-row units, so small
 * matrices do not leave a thread idle.
 *
 * Prefill (GEMM) is bound by arithmetic. It converts a weight panel (NP rows x KC columns) once to
 * fp32, transposed so that k is the slow index, and runs an outer-product micro-kernel over a
 * token block: MR tokens x NP rows of accumulators in registers, one broadcast per token and one
 * panel load per k (AVX-512: 8 x 32, 16 zmm accumulators). The conversion is amortised over the
 * token block (256 tokens). The same micro-kernel runs the prefill attention (flx_gemm_panels),
 * where forward.c provides K already packed in panels and V in its natural (keys, D) layout.
 *
 * Accumulation is fp32 everywhere; the _ref versions accumulate in double and are the oracles.
 */
#include <math.h>
#include <string.h>
#include <immintrin.h>

#include "flx/simd_exp.h"
#include "flx/cpu.h"
#include "flx/util.h"
#include "gemv.h"
#include "model_internal.h"

#define T2 __attribute__((target("avx2,fma,f16c")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AI inline __attribute__((always_inline))

#define GEMM_KC 256     /* k-depth of a packed weight panel */
#define GEMM_TB 256     /* tokens per block: the panel conversion is amortised over them */
#define GEMV_SMALL_N 4  /* up to this many vectors the dot-product form wins */

flx_gemv_level_t flx_gemv_level(void)
{
    switch (flx_isa_active()) {
    case FLX_ISA_AMX:          /* no tile path: decode GEMV is bandwidth-bound, prefill widens panels once */
    case FLX_ISA_AVX512BF16:   /* no dpbf16 path: likewise */
    case FLX_ISA_AVX512: return FLX_GEMV_AVX512;
    case FLX_ISA_AVX2: return FLX_GEMV_AVX2;
    default: return FLX_GEMV_SCALAR;
    }
}

const char *flx_gemv_level_name(flx_gemv_level_t level)
{
    switch (level) {
    case FLX_GEMV_SCALAR: return "scalar";
    case FLX_GEMV_AVX2: return "avx2";
    case FLX_GEMV_AVX512: return "avx512f";
    }
    return "?";
}

/* ================= references ================= */

void flx_matmul_bf16_ref(const flx_bf16_t *w, size_t rows, size_t cols, const float *x, size_t n, float *y)
{
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double s = 0;
            for (size_t c = 0; c < cols; c++) s += (double)flx_bf16_to_f32(w[r * cols + c]) * x[t * cols + c];
            y[t * rows + r] = (float)s;
        }
}

void flx_gemm_panels_ref(uint32_t m, uint32_t nr, uint32_t K, const float *x, size_t ldx, const float *p,
                         size_t pstride, size_t ldp, uint32_t np, float *y, size_t ldy, int accumulate)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < nr; j++) {
            const float *pj = p + (size_t)(j / np) * pstride + j % np;
            double s = accumulate ? y[(size_t)i * ldy + j] : 0.0;
            for (uint32_t k = 0; k < K; k++) s += (double)x[(size_t)i * ldx + k] * pj[(size_t)k * ldp];
            y[(size_t)i * ldy + j] = (float)s;
        }
}

float flx_max_row_ref(const float *s, uint32_t n)
{
    float m = s[0];
    for (uint32_t i = 1; i < n; i++) m = s[i] > m ? s[i] : m;
    return m;
}

float flx_exp_row_ref(float *s, uint32_t n, float mx)
{
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        s[i] = (float)exp((double)s[i] - mx);
        sum += s[i];
    }
    return (float)sum;
}

void flx_silu_mul_ref(float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) g[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
}

/* ================= GEMV: 4 rows x NB vectors per tile ================= */

/* Column tail (cols % 16) in scalar: shapes of this model family never have one, but the kernel
 * must not read past cols. */
static float dot_tail(const flx_bf16_t *w, const float *x, size_t c0, size_t cols)
{
    float s = 0;
    for (size_t c = c0; c < cols; c++) s += flx_bf16_to_f32(w[c]) * x[c];
    return s;
}

/* A row of a block format dotted with x in the order of dot_tail, its values from the format's
 * scalar definition (flx_wmat_row_f32). */
static float dot_row_q(const flx_wmat_t *w, size_t cols, size_t r, const float *x)
{
    float s = 0, v[FLX_WFMT_BLOCK];
    for (size_t c = 0; c < cols; c += FLX_WFMT_BLOCK) {
        flx_wmat_row_f32(w, cols, r, c, FLX_WFMT_BLOCK, v);
        for (int k = 0; k < FLX_WFMT_BLOCK; k++) s += v[k] * x[c + k];
    }
    return s;
}

static void gemv_rows_scalar(const flx_wmat_t *w, size_t cols, uint32_t r0, uint32_t r1, const float *x, uint32_t n,
                             float *y, size_t ldy)
{
    const flx_bf16_t *wb = w->p;
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t j = 0; j < n; j++)
            y[(size_t)j * ldy + r] = w->fmt == FLX_WFMT_BF16 ? dot_tail(wb + (size_t)r * cols, x + (size_t)j * cols, 0, cols)
                                                              : dot_row_q(w, cols, r, x + (size_t)j * cols);
}

/* ---- block formats expanded in registers: the bf16 values of flx/model.h (WEIGHT FORMATS) as fp32,
 * bit for bit what widening the same values stored as bf16 gives ---- */

/* fp32 -> nearest-even bf16 -> fp32, for finite lanes (the loader refuses non-finite scales, so
 * every expanded value is finite): flx_f32_to_bf16's rounding, in integer operations. */
T2 static AI __m256 round_bf16_avx2(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Values c .. c + 7 (c a multiple of 8) of a Q4 / Q8 row. */
T2 static AI __m256 ld8_q4_avx2(const uint8_t *row, size_t c)
{
    const uint8_t *blk = row + (c / FLX_WFMT_BLOCK) * FLX_WFMT_Q4_BYTES;
    const size_t j = c % FLX_WFMT_BLOCK;
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + (j & 15))));
    if (j >= 16) q = _mm256_srli_epi32(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi32(15));
    const __m256 d = _mm256_set1_ps(flx_wfmt_rd_f32(blk + 16)), m = _mm256_set1_ps(flx_wfmt_rd_f32(blk + 20));
    return round_bf16_avx2(_mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m));
}

T2 static AI __m256 ld8_q8_avx2(const uint8_t *row, size_t c)
{
    const uint8_t *blk = row + (c / FLX_WFMT_BLOCK) * FLX_WFMT_Q8_BYTES;
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + c % FLX_WFMT_BLOCK))));
    return round_bf16_avx2(_mm256_mul_ps(q, _mm256_set1_ps(flx_wfmt_rd_f32(blk + 32))));
}

T512 static AI __m512 round_bf16_avx512(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* A Q4 block's 32 values as two fp32 vectors (values 0..15, 16..31). A block has at most 16
 * distinct values, d * i + m for i < 16: they are computed and rounded once, as a table in one
 * register, and each nibble picks its entry with a permute (which reads the low 4 bits of an index). */
T512 static AI void deq32_q4_avx512(const uint8_t *blk, __m512 iota, __m512 *w0, __m512 *w1)
{
    const __m512 d = _mm512_set1_ps(flx_wfmt_rd_f32(blk + 16)), m = _mm512_set1_ps(flx_wfmt_rd_f32(blk + 20));
    const __m512 lut = round_bf16_avx512(_mm512_fmadd_ps(iota, d, m));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
    *w0 = _mm512_permutexvar_ps(q, lut);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
}

T512 static AI void deq32_q8_avx512(const uint8_t *blk, __m512 *w0, __m512 *w1)
{
    const __m512 d = _mm512_set1_ps(flx_wfmt_rd_f32(blk + 32));
    *w0 = round_bf16_avx512(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)blk))), d));
    *w1 = round_bf16_avx512(
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 16)))), d));
}

T512 static AI __m512 iota16_avx512(void)
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* 8 bf16 at p as fp32: the 16 bytes broadcast to both lanes (a load, no ALU work), then one byte
 * shuffle puts values 0..3 (lane 0) and 4..7 (lane 1) in the high halves of the dwords and zeros
 * below: one ALU operation where a zero-extend and a shift take two. */
T2 static AI __m256 ld8_bf16_avx2(const flx_bf16_t *p)
{
    const __m256i idx = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                         -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), idx));
}

T2 static AI float hsum8_avx2(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* 8 values at column c of a row of format FMT (a compile-time constant where it is inlined). */
T2 static AI __m256 ld8_avx2(const int FMT, const uint8_t *row, size_t c)
{
    if (FMT == FLX_WFMT_Q4) return ld8_q4_avx2(row, c);
    if (FMT == FLX_WFMT_Q8) return ld8_q8_avx2(row, c);
    return ld8_bf16_avx2((const flx_bf16_t *)row + c);
}

/* rows w[0 .. nr) (nr <= R <= 4; missing rows alias the last one and are not stored; rows rb bytes
 * apart) x NB vectors, R * NB <= 8. A (row, vector) dot product is summed the same way whatever R
 * and NB. */
T2 static AI void gv_tile_avx2(const int FMT, const int R, const int NB, const uint8_t *w, size_t rb, size_t cols,
                               uint32_t nr, const float *x, float *y, size_t ldy)
{
    const uint8_t *wr[4];
    for (uint32_t i = 0; i < (uint32_t)R; i++) wr[i] = w + (size_t)(i < nr ? i : nr - 1) * rb;
    __m256 a[4][8];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NB; j++) a[i][j] = _mm256_setzero_ps();
    size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m256 v[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) v[i] = ld8_avx2(FMT, wr[i], c);
#pragma GCC unroll 8
        for (int j = 0; j < NB; j++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)j * cols + c);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) a[i][j] = _mm256_fmadd_ps(v[i], xv, a[i][j]);
        }
    }
    for (uint32_t i = 0; i < nr; i++)
        for (int j = 0; j < NB; j++)   /* block formats have no tail: cols is a multiple of 32 */
            y[(size_t)j * ldy + i] = hsum8_avx2(a[i][j]) +
                                     (FMT == FLX_WFMT_BF16 ? dot_tail((const flx_bf16_t *)wr[i], x + (size_t)j * cols, c, cols) : 0.0f);
}

/* Tiles of R rows x up to JB vectors: 4 x 2 for bf16, and for a block format at batches of 1 or 2.
 * A block format's 8 values cost about ten operations to expand where bf16's cost one shuffle, so
 * at larger batches its tiles are 2 rows x 4 vectors: each expansion feeds twice the vectors (with
 * tiles of 2 vectors, batch 4 expanded every row twice and took 1.2x bf16's time on an AMX Xeon at
 * FLX_ISA=avx2; 0.9 to 0.93x with these). */
T2 static AI void gemv_rows_avx2_fmt(const int FMT, const int R, const uint8_t *w, size_t cols, uint32_t r0,
                                     uint32_t r1, const float *x, uint32_t n, float *y, size_t ldy)
{
    const size_t rb = flx_wmat_row_bytes((flx_wfmt_t)FMT, cols);
    const int JB = 8 / R;
    for (uint32_t r = r0; r < r1; r += (uint32_t)R) {
        const uint32_t nr = FLX_MIN((uint32_t)R, r1 - r);
        const uint8_t *wt = w + (size_t)r * rb;
        for (uint32_t j = 0; j < n; j += (uint32_t)JB) {
            const float *xj = x + (size_t)j * cols;
            float *yj = y + (size_t)j * ldy + r;
            switch (FLX_MIN((uint32_t)JB, n - j)) {
#define TILE(k) case k: if (k <= JB) gv_tile_avx2(FMT, R, k <= JB ? k : 1, wt, rb, cols, nr, xj, yj, ldy); break;
            TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8)
#undef TILE
            }
        }
    }
}

T2 static void gemv_rows_avx2(const flx_wmat_t *w, size_t cols, uint32_t r0, uint32_t r1, const float *x, uint32_t n,
                              float *y, size_t ldy)
{
    const int R = n <= 2 ? 4 : n <= 4 ? 2 : 1;   /* block formats: one expansion for up to 8 vectors */
    if (w->fmt == FLX_WFMT_Q4 && R == 1) gemv_rows_avx2_fmt(FLX_WFMT_Q4, 1, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q4 && R == 2) gemv_rows_avx2_fmt(FLX_WFMT_Q4, 2, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q4) gemv_rows_avx2_fmt(FLX_WFMT_Q4, 4, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q8 && R == 1) gemv_rows_avx2_fmt(FLX_WFMT_Q8, 1, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q8 && R == 2) gemv_rows_avx2_fmt(FLX_WFMT_Q8, 2, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q8) gemv_rows_avx2_fmt(FLX_WFMT_Q8, 4, w->p, cols, r0, r1, x, n, y, ldy);
    else gemv_rows_avx2_fmt(FLX_WFMT_BF16, 4, w->p, cols, r0, r1, x, n, y, ldy);
}

T512 static AI __m512 ld16_bf16_avx512(const flx_bf16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* Word indices for widen32_avx512: word 2k + 1 of the result takes bf16 k (lo) or 16 + k (hi) of
 * the 32 loaded; the even words are zeroed by the mask, so each dword is that bf16 as fp32. */
#define WIDEN_EVEN_ZERO 0xAAAAAAAAu
T512 static AI __m512i widen_idx_lo(void)
{
    return _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0,
                            0, 0);
}

/* 32 bf16 at p as two fp32 vectors (values 0..15, 16..31): one load and one masked word permute
 * each, where widening each half with a zero-extend and a shift costs two (the shifts compete with
 * the FMAs for the same ports once a row feeds several vectors). The values are the same bits. */
T512 static AI void widen32_avx512(const flx_bf16_t *p, __m512i ilo, __m512i ihi, __m512 *w0, __m512 *w1)
{
    const __m512i raw = _mm512_loadu_si512(p);
    *w0 = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(WIDEN_EVEN_ZERO, ilo, raw));
    *w1 = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(WIDEN_EVEN_ZERO, ihi, raw));
}

/* The 16 horizontal sums of a[0..16) in one vector, lane k = sum of a[k]: a transposing add tree
 * (45 ops instead of 16 separate reductions, which cost a quarter of a batched GEMV at hidden 576). */
T512 static AI __m512 hsum16x16_avx512(const __m512 *a)
{
    __m512 u[8], w[4];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) u[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]),
                                                      _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512d d0 = _mm512_castps_pd(u[2 * p]), d1 = _mm512_castps_pd(u[2 * p + 1]);
        w[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)), _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
    }
    __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
    __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xdd));
}

/* A group of nr rows x NB vectors (nr * NB <= 16): each row is read front to back, one sequential
 * stream (interleaving rows, as an earlier tile did, left the prefetchers a fraction of the
 * bandwidth: 0.55 to 0.72 of a plain read on one core, against 0.9 and more this way; a software
 * prefetch ahead of the stream cost 0.05 to 0.1 of the bandwidth on two cores and is left out), every
 * widened 16-value chunk feeding its NB vectors. Each (row, vector) dot product has two
 * accumulators (even and odd 16-value chunks, so two FMA chains are in flight even for one vector),
 * added the same way whatever NB: a sequence's result does not depend on the batch around it
 * (test_forward: batch vs alone). The group's nr * NB dot products are reduced together
 * (hsum16x16, which sums every accumulator's lanes in the same order whatever its place); the
 * accumulator of (row g, vector v) is a[g * NB + v]. */
T512 static AI void gv_group_avx512(const int FMT, const int NB, const uint8_t *w, size_t rb, size_t cols, uint32_t nr,
                                    const float *x, float *y, size_t ldy, size_t pf)
{
    __m512 a[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) a[k] = _mm512_setzero_ps();
    const size_t c16 = cols & ~(size_t)15, c32 = cols & ~(size_t)31;
    const __m512i ilo = widen_idx_lo(), ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    const __m512 iota = iota16_avx512();
    const size_t bb = FMT == FLX_WFMT_Q4 ? FLX_WFMT_Q4_BYTES : FMT == FLX_WFMT_Q8 ? FLX_WFMT_Q8_BYTES : 64;
    for (uint32_t g = 0; g < nr; g++) {
        const uint8_t *wr = w + (size_t)g * rb;
        __m512 e[8], o[8];
#pragma GCC unroll 8
        for (int v = 0; v < NB; v++) e[v] = o[v] = _mm512_setzero_ps();
        size_t c = 0;
        for (; c < c32; c += 32) {   /* 32 values a step: one prefetch a line, pf bytes on */
            const uint8_t *blk = wr + (c / 32) * bb;
            if (FMT == FLX_WFMT_BF16) {   /* a block is a line */
                if (pf) _mm_prefetch((const char *)blk + pf, _MM_HINT_T1);
            } else if (pf && ((((uintptr_t)blk + pf) ^ ((uintptr_t)blk + pf + bb)) & ~(uintptr_t)63)) {
                _mm_prefetch((const char *)blk + pf + bb, _MM_HINT_T1);   /* the line the next block enters */
            }
            __m512 w0, w1;
            if (FMT == FLX_WFMT_Q4) deq32_q4_avx512(blk, iota, &w0, &w1);
            else if (FMT == FLX_WFMT_Q8) deq32_q8_avx512(blk, &w0, &w1);
            else widen32_avx512((const flx_bf16_t *)blk, ilo, ihi, &w0, &w1);
#pragma GCC unroll 8
            for (int v = 0; v < NB; v++) {
                e[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)v * cols + c), e[v]);
                o[v] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)v * cols + c + 16), o[v]);
            }
        }
        if (FMT == FLX_WFMT_BF16 && c < c16) {   /* block formats: cols is a multiple of 32 */
            const __m512 w0 = ld16_bf16_avx512((const flx_bf16_t *)wr + c);
#pragma GCC unroll 8
            for (int v = 0; v < NB; v++) e[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)v * cols + c), e[v]);
        }
#pragma GCC unroll 8
        for (int v = 0; v < NB; v++) a[g * NB + v] = _mm512_add_ps(e[v], o[v]);
    }
    float sums[16];
    _mm512_storeu_ps(sums, hsum16x16_avx512(a));
    for (uint32_t g = 0; g < nr; g++)
        for (int v = 0; v < NB; v++)
            y[(size_t)v * ldy + g] = sums[g * NB + v] +
                                     (FMT == FLX_WFMT_BF16 ? dot_tail((const flx_bf16_t *)(w + (size_t)g * rb), x + (size_t)v * cols, c16, cols) : 0.0f);
}

/* Rows [r0, r1) in groups of G (16 for one vector, 8 for two, 4 for three or four, 2 for more,
 * vectors taken 8 at a time: a group's rows are re-read from L1 for the next 8). Widened once, a
 * chunk of weights feeds up to 8 vectors (16 accumulators), so a batch of 8 costs half the widening
 * and reduction it did in two passes of 4. r0 is a multiple of 16, so a row's place in its group,
 * hence its result, does not depend on how the rows were cut into chunks (nor on G and the passes:
 * a (row, vector) dot product is summed the same way in every group). */
T512 static AI void gemv_rows_avx512_fmt(const int FMT, const uint8_t *w, size_t cols, uint32_t r0, uint32_t r1,
                                         const float *x, uint32_t n, float *y, size_t ldy)
{
    const size_t pf = flx_cpu_stream_prefetch(), rb = flx_wmat_row_bytes((flx_wfmt_t)FMT, cols);
    const uint32_t G = n == 1 ? 16 : n == 2 ? 8 : n <= 4 ? 4 : 2;
    for (uint32_t r = r0; r < r1; r += G) {
        const uint8_t *wr = w + (size_t)r * rb;
        const uint32_t nr = FLX_MIN(G, r1 - r);
        for (uint32_t j = 0; j < n; j += 8) {
            const float *xj = x + (size_t)j * cols;
            float *yj = y + (size_t)j * ldy + r;
            const size_t pfj = j ? 0 : pf;   /* the next 8 vectors re-read the group's rows from L1 */
            switch (FLX_MIN(8, n - j)) {
            case 1: gv_group_avx512(FMT, 1, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 2: gv_group_avx512(FMT, 2, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 3: gv_group_avx512(FMT, 3, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 4: gv_group_avx512(FMT, 4, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 5: gv_group_avx512(FMT, 5, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 6: gv_group_avx512(FMT, 6, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            case 7: gv_group_avx512(FMT, 7, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            default: gv_group_avx512(FMT, 8, wr, rb, cols, nr, xj, yj, ldy, pfj); break;
            }
        }
    }
}

T512 static void gemv_rows_avx512(const flx_wmat_t *w, size_t cols, uint32_t r0, uint32_t r1, const float *x,
                                  uint32_t n, float *y, size_t ldy)
{
    if (w->fmt == FLX_WFMT_Q4) gemv_rows_avx512_fmt(FLX_WFMT_Q4, w->p, cols, r0, r1, x, n, y, ldy);
    else if (w->fmt == FLX_WFMT_Q8) gemv_rows_avx512_fmt(FLX_WFMT_Q8, w->p, cols, r0, r1, x, n, y, ldy);
    else gemv_rows_avx512_fmt(FLX_WFMT_BF16, w->p, cols, r0, r1, x, n, y, ldy);
}

static void gemv_rows(flx_gemv_level_t lv, const flx_wmat_t *w, size_t cols, uint32_t r0, uint32_t r1, const float *x,
                      uint32_t n, float *y, size_t ldy)
{
    if (r0 >= r1) return;
    if (lv == FLX_GEMV_AVX512) gemv_rows_avx512(w, cols, r0, r1, x, n, y, ldy);
    else if (lv == FLX_GEMV_AVX2) gemv_rows_avx2(w, cols, r0, r1, x, n, y, ldy);
    else gemv_rows_scalar(w, cols, r0, r1, x, n, y, ldy);
}

/* A fused GEMV's rows are cut per matrix into 16-row units (so every row sits at the same position
 * in its tile however the work is split: results do not depend on the chunking), and units into
 * chunks the pool's workers claim: about 8 per worker (few enough that each stays one long
 * sequential stream for the prefetchers, enough that a worker that loses its core leaves little
 * behind), never below GEMV_MIN_CHUNK_BYTES of weights. */
#define GEMV_MIN_CHUNK_BYTES 65536u
#define GEMV_CHUNKS_PER_WORKER 8u

typedef struct gemv_job {
    const flx_gemv_mat_t *mats;
    int n_mats;
    uint32_t units[3];   /* per matrix: ceil(rows / 16) */
    uint32_t cols, n;
    const float *x;
    flx_gemv_level_t lv;
} gemv_job_t;

static flx_status_t gemv_chunk(void *ctx, const flx_pool_worker_t *w, uint64_t ub, uint64_t ue)
{
    (void)w;
    const gemv_job_t *j = ctx;
    uint64_t off = 0;
    for (int i = 0; i < j->n_mats && off < ue; i++) {
        const uint64_t a = FLX_MAX(ub, off), b = FLX_MIN(ue, off + j->units[i]);
        if (a < b) {
            const flx_gemv_mat_t *m = &j->mats[i];
            const uint32_t r0 = (uint32_t)(a - off) * 16, r1 = FLX_MIN(m->rows, (uint32_t)(b - off) * 16);
            gemv_rows(j->lv, &m->w, j->cols, r0, r1, j->x, j->n, m->y, m->rows);
        }
        off += j->units[i];
    }
    return FLX_OK;
}

void flx_gemv_bf16(const flx_gemv_mat_t *mats, int n_mats, uint32_t cols, const float *x, uint32_t n, flx_pool_h pool)
{
    gemv_job_t j = {.mats = mats, .n_mats = n_mats, .cols = cols, .n = n, .x = x, .lv = flx_gemv_level()};
    uint64_t total = 0;
    for (int i = 0; i < n_mats; i++) {
        FLX_DEBUG_ASSERT(mats[i].w.fmt == FLX_WFMT_BF16 || cols % FLX_WFMT_BLOCK == 0);
        total += j.units[i] = FLX_DIV_UP(mats[i].rows, 16);
    }
    const uint64_t min_units =
        FLX_MAX(1, GEMV_MIN_CHUNK_BYTES / (16u * FLX_MAX(flx_wmat_row_bytes(mats[0].w.fmt, cols), 1u)));
    const uint64_t per = FLX_MAX(min_units, total / ((uint64_t)GEMV_CHUNKS_PER_WORKER * flx_pool_size(pool)));
    (void)flx_pool_for(pool, total, per, gemv_chunk, &j);   /* the body cannot fail */
}

/* ================= GEMM micro-kernels: MR tokens x (one panel) ================= */

uint32_t flx_gemm_panel(flx_gemv_level_t level)
{
    return level == FLX_GEMV_AVX512 ? 32 : 16;
}

static void mk_scalar(uint32_t mr, uint32_t nc, uint32_t K, const float *x, size_t ldx, const float *p, size_t ldp,
                      float *y, size_t ldy, int acc)
{
    for (uint32_t i = 0; i < mr; i++) {
        float c[16];
        for (uint32_t j = 0; j < nc; j++) c[j] = acc ? y[(size_t)i * ldy + j] : 0.0f;
        for (uint32_t k = 0; k < K; k++) {
            float a = x[(size_t)i * ldx + k];
            const float *pk = p + (size_t)k * ldp;
            for (uint32_t j = 0; j < nc; j++) c[j] += a * pk[j];
        }
        memcpy(y + (size_t)i * ldy, c, nc * sizeof(float));
    }
}

/* AVX2: MR <= 6 tokens x NV <= 2 vectors of 8 (panel 16): 12 accumulators. Partial panels go
 * through a stack tile so no lane past nc is read or written in y. */
T2 static AI void mk_avx2(const int MR, const int NV, uint32_t nc, uint32_t K, const float *x, size_t ldx,
                          const float *p, size_t ldp, float *y, size_t ldy, int acc)
{
    __m256 c[6][2];
    float tmp[6][16];
    const int full = nc == 16;
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) c[i][0] = c[i][1] = _mm256_setzero_ps();
    if (acc) {
        for (int i = 0; i < MR; i++) {
            const float *yi = y + (size_t)i * ldy;
            if (!full) {
                memset(tmp[i], 0, sizeof tmp[i]);
                memcpy(tmp[i], yi, nc * sizeof(float));
                yi = tmp[i];
            }
            c[i][0] = _mm256_loadu_ps(yi);
            if (NV > 1) c[i][1] = _mm256_loadu_ps(yi + 8);
        }
    }
    for (uint32_t k = 0; k < K; k++) {
        const float *pk = p + (size_t)k * ldp;
        __m256 b0 = _mm256_loadu_ps(pk), b1 = NV > 1 ? _mm256_loadu_ps(pk + 8) : _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(x + (size_t)i * ldx + k);
            c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
            if (NV > 1) c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < MR; i++) {
        float *yi = y + (size_t)i * ldy;
        if (full) {
            _mm256_storeu_ps(yi, c[i][0]);
            _mm256_storeu_ps(yi + 8, c[i][1]);
        } else {
            _mm256_storeu_ps(tmp[i], c[i][0]);
            _mm256_storeu_ps(tmp[i] + 8, c[i][1]);
            memcpy(yi, tmp[i], nc * sizeof(float));
        }
    }
}

#define MK2_CASE(MR)                                                                        \
    case MR:                                                                                \
        if (nc > 8) mk_avx2(MR, 2, nc, K, x, ldx, p, ldp, y, ldy, acc);                     \
        else mk_avx2(MR, 1, nc, K, x, ldx, p, ldp, y, ldy, acc);                            \
        break;

T2 static void mk_avx2_any(uint32_t mr, uint32_t nc, uint32_t K, const float *x, size_t ldx, const float *p,
                           size_t ldp, float *y, size_t ldy, int acc)
{
    switch (mr) {
        MK2_CASE(6) MK2_CASE(5) MK2_CASE(4) MK2_CASE(3) MK2_CASE(2) default : MK2_CASE(1)
    }
}

/* AVX-512: MR <= 8 tokens x NV <= 2 vectors of 16 (panel 32): 16 accumulators, masked tails. */
T512 static AI void mk_avx512(const int MR, const int NV, uint32_t nc, uint32_t K, const float *x, size_t ldx,
                              const float *p, size_t ldp, float *y, size_t ldy, int acc)
{
    const __mmask16 m0 = nc >= 16 ? 0xffff : (__mmask16)((1u << nc) - 1);
    const __mmask16 m1 = nc >= 32 ? 0xffff : nc > 16 ? (__mmask16)((1u << (nc - 16)) - 1) : 0;
    __m512 c[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    if (acc)
        for (int i = 0; i < MR; i++) {
            c[i][0] = _mm512_maskz_loadu_ps(m0, y + (size_t)i * ldy);
            if (NV > 1) c[i][1] = _mm512_maskz_loadu_ps(m1, y + (size_t)i * ldy + 16);
        }
    for (uint32_t k = 0; k < K; k++) {
        const float *pk = p + (size_t)k * ldp;
        __m512 b0 = _mm512_loadu_ps(pk), b1 = NV > 1 ? _mm512_loadu_ps(pk + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(x[(size_t)i * ldx + k]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            if (NV > 1) c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < MR; i++) {
        _mm512_mask_storeu_ps(y + (size_t)i * ldy, m0, c[i][0]);
        if (NV > 1) _mm512_mask_storeu_ps(y + (size_t)i * ldy + 16, m1, c[i][1]);
    }
}

#define MK5_CASE(MR)                                                                        \
    case MR:                                                                                \
        if (nc > 16) mk_avx512(MR, 2, nc, K, x, ldx, p, ldp, y, ldy, acc);                  \
        else mk_avx512(MR, 1, nc, K, x, ldx, p, ldp, y, ldy, acc);                          \
        break;

T512 static void mk_avx512_any(uint32_t mr, uint32_t nc, uint32_t K, const float *x, size_t ldx, const float *p,
                               size_t ldp, float *y, size_t ldy, int acc)
{
    switch (mr) {
        MK5_CASE(8) MK5_CASE(7) MK5_CASE(6) MK5_CASE(5) MK5_CASE(4) MK5_CASE(3) MK5_CASE(2) default : MK5_CASE(1)
    }
}

void flx_gemm_panels(flx_gemv_level_t level, uint32_t m, uint32_t nr, uint32_t K, const float *x, size_t ldx,
                     const float *p, size_t pstride, size_t ldp, float *y, size_t ldy, int accumulate)
{
    const uint32_t np = flx_gemm_panel(level);
    const uint32_t mr_max = level == FLX_GEMV_AVX512 ? 8 : level == FLX_GEMV_AVX2 ? 6 : 4;
    for (uint32_t j0 = 0; j0 < nr; j0 += np) {
        const float *pj = p + (size_t)(j0 / np) * pstride;
        uint32_t nc = FLX_MIN(np, nr - j0);
        for (uint32_t i0 = 0; i0 < m; i0 += mr_max) {
            uint32_t mr = FLX_MIN(mr_max, m - i0);
            const float *xi = x + (size_t)i0 * ldx;
            float *yi = y + (size_t)i0 * ldy + j0;
            if (level == FLX_GEMV_AVX512) mk_avx512_any(mr, nc, K, xi, ldx, pj, ldp, yi, ldy, accumulate);
            else if (level == FLX_GEMV_AVX2) mk_avx2_any(mr, nc, K, xi, ldx, pj, ldp, yi, ldy, accumulate);
            else mk_scalar(mr, nc, K, xi, ldx, pj, ldp, yi, ldy, accumulate);
        }
    }
}

/* ================= GEMM driver (prefill projections) ================= */

size_t flx_gemm_pack_floats(void)
{
    return (size_t)GEMM_KC * FLX_GEMM_PANEL_MAX;
}

/* Values [c0, c0 + n) of a block-format row (c0, n multiples of 32) as fp32, at level lv. */
T512 static void expand_row_avx512(flx_wfmt_t fmt, const uint8_t *row, size_t c0, size_t n, float *out)
{
    const __m512 iota = iota16_avx512();
    const size_t bb = fmt == FLX_WFMT_Q4 ? FLX_WFMT_Q4_BYTES : FLX_WFMT_Q8_BYTES;
    for (size_t c = 0; c < n; c += 32) {
        const uint8_t *blk = row + (c0 + c) / 32 * bb;
        __m512 w0, w1;
        if (fmt == FLX_WFMT_Q4) deq32_q4_avx512(blk, iota, &w0, &w1);
        else deq32_q8_avx512(blk, &w0, &w1);
        _mm512_storeu_ps(out + c, w0);
        _mm512_storeu_ps(out + c + 16, w1);
    }
}

T2 static void expand_row_avx2(flx_wfmt_t fmt, const uint8_t *row, size_t c0, size_t n, float *out)
{
    for (size_t c = 0; c < n; c += 8)
        _mm256_storeu_ps(out + c, fmt == FLX_WFMT_Q4 ? ld8_q4_avx2(row, c0 + c) : ld8_q8_avx2(row, c0 + c));
}

/* dst (kc, np) fp32 = rows [r0, r0 + pw) x cols [k0, k0 + kc) of w (cols columns), transposed;
 * zero past pw. Block-format rows are expanded a row at a time (kc <= GEMM_KC). */
static void pack_panel(flx_gemv_level_t lv, const flx_wmat_t *w, size_t cols, uint32_t r0, uint32_t pw, uint32_t k0,
                       uint32_t kc, uint32_t np, float *dst)
{
    float row[GEMM_KC];
    for (uint32_t r = 0; r < pw; r++) {
        if (w->fmt == FLX_WFMT_BF16) {
            const flx_bf16_t *s = (const flx_bf16_t *)w->p + (size_t)(r0 + r) * cols + k0;
            for (uint32_t k = 0; k < kc; k++) dst[(size_t)k * np + r] = flx_bf16_to_f32(s[k]);
            continue;
        }
        const uint8_t *src = (const uint8_t *)w->p + (size_t)(r0 + r) * flx_wmat_row_bytes(w->fmt, cols);
        if (lv == FLX_GEMV_AVX512) expand_row_avx512(w->fmt, src, k0, kc, row);
        else if (lv == FLX_GEMV_AVX2) expand_row_avx2(w->fmt, src, k0, kc, row);
        else flx_wmat_row_f32(w, cols, r0 + r, k0, kc, row);
        for (uint32_t k = 0; k < kc; k++) dst[(size_t)k * np + r] = row[k];
    }
    if (pw < np)
        for (uint32_t k = 0; k < kc; k++) memset(dst + (size_t)k * np + pw, 0, (np - pw) * sizeof(float));
}

typedef struct gemm_job {
    const flx_gemv_mat_t *mats;
    int n_mats;
    uint32_t cols, n, np, rg;
    size_t nrg[4];       /* row groups before matrix i (nrg[n_mats]: all of them) */
    const float *x;
    float *pack;
    flx_gemv_level_t lv;
} gemm_job_t;

/* One item: a token block x a row group of one matrix; items are token-block major, so a worker's
 * consecutive items tend to share their token block in L2. Each output element is one item's: no
 * reduction crosses items. */
static flx_status_t gemm_item(void *ctx, const flx_pool_worker_t *wk, uint64_t ib, uint64_t ie)
{
    const gemm_job_t *j = ctx;
    float *pk = j->pack + (size_t)wk->index * flx_gemm_pack_floats();
    const size_t nrg = j->nrg[j->n_mats];
    for (uint64_t it = ib; it < ie; it++) {
        const uint32_t t0 = (uint32_t)(it / nrg) * GEMM_TB, tn = FLX_MIN(GEMM_TB, j->n - t0);
        const size_t g = it % nrg;
        int mi = 0;
        while (g >= j->nrg[mi + 1]) mi++;
        const flx_gemv_mat_t *m = &j->mats[mi];
        const uint32_t r0 = (uint32_t)(g - j->nrg[mi]) * j->rg, r1 = FLX_MIN(m->rows, r0 + j->rg);
        for (uint32_t k0 = 0; k0 < j->cols; k0 += GEMM_KC) {
            const uint32_t kc = FLX_MIN(GEMM_KC, j->cols - k0);
            for (uint32_t pr = r0; pr < r1; pr += j->np) {
                const uint32_t pw = FLX_MIN(j->np, r1 - pr);
                pack_panel(j->lv, &m->w, j->cols, pr, pw, k0, kc, j->np, pk);
                flx_gemm_panels(j->lv, tn, pw, kc, j->x + (size_t)t0 * j->cols + k0, j->cols, pk, 0, j->np,
                                m->y + (size_t)t0 * m->rows + pr, m->rows, k0 > 0);
            }
        }
    }
    return FLX_OK;
}

void flx_gemm_bf16(const flx_gemv_mat_t *mats, int n_mats, uint32_t cols, const float *x, uint32_t n,
                   flx_pool_h pool, float *pack)
{
    if (n <= GEMV_SMALL_N) {
        flx_gemv_bf16(mats, n_mats, cols, x, n, pool);
        return;
    }
    gemm_job_t j = {.mats = mats, .n_mats = n_mats, .cols = cols, .n = n, .x = x, .pack = pack,
                    .lv = flx_gemv_level()};
    j.np = flx_gemm_panel(j.lv);
    j.rg = 4 * j.np;
    for (int i = 0; i < n_mats; i++) j.nrg[i + 1] = j.nrg[i] + FLX_DIV_UP(mats[i].rows, j.rg);
    (void)flx_pool_for(pool, FLX_DIV_UP(n, GEMM_TB) * j.nrg[n_mats], 1, gemm_item, &j);
}

/* ================= row kernels ================= */


T2 static float max_row_avx2(const float *s, uint32_t n)
{
    __m256 m = _mm256_set1_ps(s[0]);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    float r = _mm_cvtss_f32(a);
    for (; i < n; i++) r = s[i] > r ? s[i] : r;
    return r;
}

T512 static float max_row_avx512(const float *s, uint32_t n)
{
    __m512 m = _mm512_set1_ps(s[0]);
    for (uint32_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + i));
    }
    return _mm512_reduce_max_ps(m);
}

float flx_max_row(flx_gemv_level_t level, const float *s, uint32_t n)
{
    if (level == FLX_GEMV_AVX512) return max_row_avx512(s, n);
    if (level == FLX_GEMV_AVX2) return max_row_avx2(s, n);
    return flx_max_row_ref(s, n);
}

T2 static float exp_row_avx2(float *s, uint32_t n, float mx)
{
    __m256 vm = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = flx_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8_avx2(acc);
    for (; i < n; i++) sum += (s[i] = expf(s[i] - mx));
    return sum;
}

T512 static float exp_row_avx512(float *s, uint32_t n, float mx)
{
    __m512 vm = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (uint32_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, flx_exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), vm)));
        _mm512_mask_storeu_ps(s + i, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

float flx_exp_row(flx_gemv_level_t level, float *s, uint32_t n, float mx)
{
    if (level == FLX_GEMV_AVX512) return exp_row_avx512(s, n, mx);
    if (level == FLX_GEMV_AVX2) return exp_row_avx2(s, n, mx);
    float sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += (s[i] = expf(s[i] - mx));
    return sum;
}

/* silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) <= 1 so no lane overflows:
 * sigmoid = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0. */
T2 static void silu_mul_avx2(float *g, const float *u, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = flx_exp_avx2(_mm256_or_ps(x, sign));
        __m256 num = _mm256_blendv_ps(one, e, x);   /* sign bit of x picks e */
        __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

T512 static void silu_mul_avx512(float *g, const float *u, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        __m512 e = flx_exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
        __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 num = _mm512_mask_blend_ps(neg, one, e);
        __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(g + i, k, _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_maskz_loadu_ps(k, u + i)));
    }
}

void flx_silu_mul(flx_gemv_level_t level, float *g, const float *u, size_t n)
{
    if (level == FLX_GEMV_AVX512) silu_mul_avx512(g, u, n);
    else if (level == FLX_GEMV_AVX2) silu_mul_avx2(g, u, n);
    else
        for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
