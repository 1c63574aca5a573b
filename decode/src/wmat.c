/*
 * wmat.c - the scalar definition of the weight formats of flx/model.h (WEIGHT FORMATS): row
 * sizes, and rows expanded to fp32 or bf16. The GEMV and GEMM kernels (gemv.c) expand blocks their
 * own way and are tested against these.
 */
#include <string.h>

#include "flx/model.h"
#include "flx/util.h"
#include "model_internal.h"

const char *flx_wfmt_name(flx_wfmt_t fmt)
{
    switch (fmt) {
    case FLX_WFMT_BF16: return "bf16";
    case FLX_WFMT_Q4: return "q4";
    case FLX_WFMT_Q8: return "q8";
    }
    return "?";
}

size_t flx_wmat_row_bytes(flx_wfmt_t fmt, size_t cols)
{
    switch (fmt) {
    case FLX_WFMT_Q4: return cols / FLX_WFMT_BLOCK * FLX_WFMT_Q4_BYTES;
    case FLX_WFMT_Q8: return cols / FLX_WFMT_BLOCK * FLX_WFMT_Q8_BYTES;
    case FLX_WFMT_BF16: break;
    }
    return cols * 2;
}

/* bf16(x) as fp32 (round to nearest even, NaN kept a NaN). */
static inline float to_bf16_f32(float x)
{
    return flx_bf16_to_f32(flx_f32_to_bf16(x));
}

void flx_wmat_row_f32(const flx_wmat_t *w, size_t cols, size_t row, size_t c0, size_t n, float *out)
{
    const uint8_t *r = (const uint8_t *)w->p + row * flx_wmat_row_bytes(w->fmt, cols);
    if (w->fmt == FLX_WFMT_BF16) {
        flx_bf16_to_f32_row((const flx_bf16_t *)r + c0, out, n);
        return;
    }
    for (size_t i = 0; i < n;) {   /* block by block: its scale (and minimum) read once */
        const size_t b = (c0 + i) / FLX_WFMT_BLOCK, j0 = (c0 + i) % FLX_WFMT_BLOCK;
        const size_t j1 = FLX_MIN((size_t)FLX_WFMT_BLOCK, j0 + (n - i));
        if (w->fmt == FLX_WFMT_Q4) {
            const uint8_t *blk = r + b * FLX_WFMT_Q4_BYTES;
            const float d = flx_wfmt_rd_f32(blk + 16), m = flx_wfmt_rd_f32(blk + 20);
            for (size_t j = j0; j < j1; j++) out[i++] = to_bf16_f32(d * (float)(j < 16 ? blk[j] & 15u : blk[j - 16] >> 4) + m);
        } else {
            const uint8_t *blk = r + b * FLX_WFMT_Q8_BYTES;
            const float d = flx_wfmt_rd_f32(blk + 32);
            for (size_t j = j0; j < j1; j++) out[i++] = to_bf16_f32(d * (float)(int8_t)blk[j]);
        }
    }
}

void flx_wmat_row_bf16(const flx_wmat_t *w, size_t cols, size_t row, size_t c0, size_t n, flx_bf16_t *out)
{
    if (w->fmt == FLX_WFMT_BF16) {
        memcpy(out, (const flx_bf16_t *)w->p + row * cols + c0, n * 2);
        return;
    }
    float tmp[FLX_WFMT_BLOCK];
    for (size_t i = 0; i < n; i += FLX_WFMT_BLOCK) {
        const size_t k = n - i < FLX_WFMT_BLOCK ? n - i : FLX_WFMT_BLOCK;
        flx_wmat_row_f32(w, cols, row, c0 + i, k, tmp);
        for (size_t j = 0; j < k; j++) out[i + j] = flx_f32_to_bf16(tmp[j]);
    }
}
