/*
 * flx/bf16.h - bfloat16 and float16 helpers.
 *
 * bf16 is the upper half of an IEEE fp32. Conversion fp32 -> bf16 rounds to nearest even and keeps
 * NaN a (quiet) NaN; bf16 -> fp32 is exact. Host KV, metadata and weights are bf16; every
 * accumulation is fp32.
 */
#ifndef FLX_BF16_H
#define FLX_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t flx_bf16_t;

static inline float flx_bf16_to_f32(flx_bf16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline flx_bf16_t flx_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)           /* NaN: keep sign, force quiet bit */
        return (flx_bf16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);               /* round to nearest even; inf stays inf */
    return (flx_bf16_t)(u >> 16);
}

/* IEEE binary16 <-> fp32 (for GGUF/safetensors F16 tensors). */
float flx_f16_to_f32(uint16_t h);
uint16_t flx_f32_to_f16(float f);

/* Row conversions; n elements, no alignment or padding requirements. */
void flx_bf16_to_f32_row(const flx_bf16_t *src, float *dst, size_t n);
void flx_f32_to_bf16_row(const float *src, flx_bf16_t *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
