/*
 * attn_simd.h - SIMD inner loops of the attention kernels (attn_simd.c), shared by the drivers in
 * attn_cpu.c. Not a public header.
 *
 * Two primitives per instruction set (and, at AVX-512 only, top-k's passes: at the end):
 *   dots   scores of up to 16 bf16 rows (width W, row stride in elements) against the prepared
 *          queries of a list of heads: out[i * out_stride + r] for head list entry i, row r. Used
 *          for QK (rows = K rows, W = D) and for Quest scoring (rows = metadata entries, W = 2D).
 *   block  one online-softmax update of a list of heads over a K/V chunk of ntok <= 16 rows:
 *          dots for the scores, then m, l and acc[D] of each head's state (attn_cpu.c's part
 *          layout: st[0] = m, st[1] = l, st + 16 = acc).
 * Query layouts per level (prepared by attn_cpu.c): scalar natural fp32; AVX2 fp32 in even/odd
 * order within each 16-value chunk (bf16 widens into even and odd lanes); AVX-512 the same within
 * each full 32-value chunk ([16 even | 16 odd]), a final 16-value chunk natural; AVX-512 BF16 a
 * bf16 hi + lo split of natural q for _mm512_dpbf16_ps. Accumulators (P.V) follow the AVX2 /
 * AVX-512 order at those levels and at AVX-512 BF16 (which shares the AVX-512 P.V).
 * Rows past ntok are never read: partial tiles use masked loads, which do not touch memory for
 * masked-out elements.
 */
#ifndef FLX_ATTN_SIMD_H
#define FLX_ATTN_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "flx/bf16.h"

/* The prepared queries of one kernel call. */
typedef struct attn_q {
    const float *f32;        /* (G, W) fp32, level-specific order */
    const flx_bf16_t *hi;    /* (G, W) bf16 hi part (AVX-512 BF16 only) */
    const flx_bf16_t *lo;    /* (G, W) bf16 lo part */
    uint32_t W;              /* row width: D for attention, 2D for scoring */
} attn_q_t;

#define ATTN_PART_STRIDE(D) ((size_t)(D) + 16)

/* pf: where the caller will read next (prefetched as the rows are consumed, one row's worth per
 * row), or NULL. */
typedef void (*attn_dots_fn)(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                             const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf);
/* next_k, next_v: the next block the caller will read (prefetched while this one computes), or NULL. */
typedef void (*attn_block_fn)(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D,
                              const attn_q_t *q, const uint8_t *heads, uint32_t nh, float *part,
                              const flx_bf16_t *next_k, const flx_bf16_t *next_v);

void attn_dots_avx2(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q, const uint8_t *heads,
                    uint32_t nh, float *out, size_t out_stride, const void *pf);
void attn_dots_avx512(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                      const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf);
void attn_dots_avx512bf16(const flx_bf16_t *rows, size_t rstride, uint32_t nrows, const attn_q_t *q,
                          const uint8_t *heads, uint32_t nh, float *out, size_t out_stride, const void *pf);

void attn_block_avx2(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D, const attn_q_t *q,
                     const uint8_t *heads, uint32_t nh, float *part,
    const flx_bf16_t *next_k, const flx_bf16_t *next_v);
void attn_block_avx512(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D, const attn_q_t *q,
                       const uint8_t *heads, uint32_t nh, float *part,
    const flx_bf16_t *next_k, const flx_bf16_t *next_v);
void attn_block_avx512bf16(const flx_bf16_t *k, const flx_bf16_t *v, uint32_t ntok, uint32_t D, const attn_q_t *q,
                           const uint8_t *heads, uint32_t nh, float *part,
    const flx_bf16_t *next_k, const flx_bf16_t *next_v);

/* Top-k's streaming passes (flx_topk in attn_task.c; keys are rank keys: NaN -> -inf).
 *   cut   copies every key >= t of s[0..n) to out (in index order); returns how many.
 *   take  writes to idx every i whose key is > tau, ascending, then the n_eq lowest whose key ==
 *         tau, ascending; returns how many. Both write exactly the entries they return. */
uint32_t attn_topk_cut_avx512(const float *s, uint32_t n, float t, float *out);
uint32_t attn_topk_take_avx512(const float *s, uint32_t n, float tau, uint32_t n_eq, uint32_t *idx);
/* A quickselect round over keys f[0..n) (no NaN): count how many are > pv and == pv; keep moves
 * the keys > pv (above) or < pv (!above) to the front of f, in order, and returns how many. */
void attn_topk_count_avx512(const float *f, uint32_t n, float pv, uint32_t *gt, uint32_t *eq);
uint32_t attn_topk_keep_avx512(float *f, uint32_t n, float pv, int above);

#endif
