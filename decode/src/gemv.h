/*
 * gemv.h - bf16-weight matrix kernels of the forward pass (internal to flx_model).
 *
 * Every kernel has a scalar _ref twin (double accumulation: the test oracle) and a fast version
 * that runs at the level flx_gemv_level() picks per call:
 *   FLX_GEMV_SCALAR   plain C, fp32 accumulation (FLX_ISA=scalar)
 *   FLX_GEMV_AVX2     AVX2 + FMA
 *   FLX_GEMV_AVX512   AVX-512 F/BW/VL/DQ, at FLX_ISA_AVX512, FLX_ISA_AVX512BF16 and FLX_ISA_AMX (so Ice Lake, which
 *                     lacks AVX512_BF16, gets 512-bit code)
 * There is no _mm512_dpbf16_ps path: the decode GEMV is bound by memory bandwidth (bf16 -> fp32 by a
 * shift is free there), and the prefill GEMM converts each weight panel to fp32 once per token block,
 * so a dot-bf16 path would add untestable code (this CPU has no AVX512_BF16) for no measurable gain.
 *
 * Conventions: W is row-major (rows, cols), y = W x, stored as bf16 or in a block format of
 * flx/model.h (FLX_WFMT_Q4, FLX_WFMT_Q8): the GEMV expands a block's 32 values in registers into
 * exactly the fp32 vectors the bf16 kernel widens from the same values, and feeds them to the same
 * FMA sequence, so the result is bit for bit the bf16 matrix's whatever the format (test_forward
 * checks it at every level); the GEMM expands rows into its fp32 panels. Batched forms take n vectors x (n, cols)
 * and write y (n, rows) (token-major, like the activations of the forward pass). No kernel reads
 * past rows, cols or n: tails are handled, nothing needs padding.
 */
#ifndef FLX_GEMV_H
#define FLX_GEMV_H

#include <stddef.h>
#include <stdint.h>

#include "flx/bf16.h"
#include "flx/model.h"
#include "flx/pool.h"

#define FLX_GEMM_PANEL_MAX 32   /* widest panel of any level (flx_gemm_panel) */

typedef enum {
    FLX_GEMV_SCALAR = 0,
    FLX_GEMV_AVX2 = 1,
    FLX_GEMV_AVX512 = 2,
} flx_gemv_level_t;

/* The level kernels use now, from flx_isa_active() (tests force each with flx_isa_force). */
flx_gemv_level_t flx_gemv_level(void);
const char *flx_gemv_level_name(flx_gemv_level_t level);

/* ---- matrix x vectors (decode batches, tiny prefills): dot-product form, weights read once ---- */

/* y (n, rows) = x (n, cols) . W^T, double accumulation. */
void flx_matmul_bf16_ref(const flx_bf16_t *w, size_t rows, size_t cols, const float *x, size_t n, float *y);

/* One matrix of a fused GEMV: all share x and cols. y (n, rows). */
typedef struct flx_gemv_mat {
    flx_wmat_t w;         /* (rows, cols), any format (flx/model.h WEIGHT FORMATS) */
    uint32_t rows;
    float *y;             /* (n, rows) */
} flx_gemv_mat_t;

/* y_m = x . W_m^T for n_mats matrices (1..3) in one pool run (pool NULL: the caller alone): the
 * rows of all matrices, in 16-row units, are claimed in chunks by the pool's workers; each weight
 * row is loaded once for all n vectors. n >= 1. Results do not depend on the pool's size. */
void flx_gemv_bf16(const flx_gemv_mat_t *mats, int n_mats, uint32_t cols, const float *x, uint32_t n, flx_pool_h pool);

/* ---- GEMM (prefill): weight panels converted to fp32 once per token block ---- */

/* Floats of per-worker scratch flx_gemm_bf16 needs (times the pool's size). */
size_t flx_gemm_pack_floats(void);

/* y_m (n, rows_m) = x (n, cols) . W_m^T for n_mats matrices (1..3) and any n, in one pool run (the
 * matrices' (token block, row group) items together); small n goes to flx_gemv_bf16. pack:
 * flx_pool_size(pool) * flx_gemm_pack_floats() floats, 64-byte aligned (worker i packs into its
 * own slice). Results do not depend on the pool's size. */
void flx_gemm_bf16(const flx_gemv_mat_t *mats, int n_mats, uint32_t cols, const float *x, uint32_t n,
                   flx_pool_h pool, float *pack);

/* ---- packed-panel micro-GEMM (prefill attention; serial, one thread) ----
 * P is an fp32 (K, nr) matrix stored as column panels of width flx_gemm_panel(level): panel j
 * (columns j*NP ..) starts at p + j * pstride and holds element (k, c) at k * ldp + c - j*NP. The
 * kernel reads the panel's columns in whole vectors of 16 (8 on AVX2): each k row of a panel must
 * have min(NP, nr - j*NP) rounded up to 16 readable floats (forward.c's K panels are zero-padded to
 * NP; V rows have D, a multiple of 16, floats). Columns past nr are never written.
 * Y (m, nr) = X (m, K) . P, or Y += X . P when accumulate. */
uint32_t flx_gemm_panel(flx_gemv_level_t level);
void flx_gemm_panels(flx_gemv_level_t level, uint32_t m, uint32_t nr, uint32_t K, const float *x, size_t ldx,
                     const float *p, size_t pstride, size_t ldp, float *y, size_t ldy, int accumulate);
void flx_gemm_panels_ref(uint32_t m, uint32_t nr, uint32_t K, const float *x, size_t ldx, const float *p,
                         size_t pstride, size_t ldp, uint32_t np, float *y, size_t ldy, int accumulate);

/* ---- row kernels of the softmax and the FFN ---- */

/* max of s[0 .. n), n >= 1. */
float flx_max_row(flx_gemv_level_t level, const float *s, uint32_t n);
float flx_max_row_ref(const float *s, uint32_t n);
/* s[i] = exp(s[i] - mx) for i < n; returns the sum. mx >= max s (so every exponent is <= 0). */
float flx_exp_row(flx_gemv_level_t level, float *s, uint32_t n, float mx);
float flx_exp_row_ref(float *s, uint32_t n, float mx);
/* g[i] = silu(g[i]) * u[i]. */
void flx_silu_mul(flx_gemv_level_t level, float *g, const float *u, size_t n);
void flx_silu_mul_ref(float *g, const float *u, size_t n);

#endif
