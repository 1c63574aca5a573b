/*
 * bf16.c - half-precision conversions (scalar; these are not on any hot path: kernels convert in
 * registers).
 */
#include "flx/bf16.h"

float flx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t flx_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* overflow (after rounding) -> inf */
    if (abs < 0x38800000u) {                                     /* result subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                                /* 14..24 */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

void flx_bf16_to_f32_row(const flx_bf16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = flx_bf16_to_f32(src[i]);
}

void flx_f32_to_bf16_row(const float *src, flx_bf16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = flx_f32_to_bf16(src[i]);
}
