/*
 * flx/cpu.h - CPU feature detection and the kernel dispatch level.
 *
 * DESIGN
 * Kernels are compiled for several instruction sets in one binary (per-function target attributes,
 * never a global -march), and one of them is chosen at run time. The level is the best the CPU
 * and the OS (XSAVE state for AVX/AVX-512) support, capped by FLX_ISA in the environment
 * (scalar|avx2|avx512|avx512bf16; any other value is refused by flx_isa_env_check) or by
 * flx_isa_force(). Tests force each level in turn and hold every fast
 * kernel to its scalar reference, so a machine without AVX-512 runs the same code paths CI tested.
 */
#ifndef FLX_CPU_H
#define FLX_CPU_H

#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FLX_ISA_SCALAR = 0,
    FLX_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    FLX_ISA_AVX512 = 2,     /* + AVX-512 F/BW/VL/DQ: bf16 widened by shifts, fp32 FMA (Skylake-X, Ice Lake) */
    FLX_ISA_AVX512BF16 = 3, /* + AVX512_BF16: _mm512_dpbf16_ps for bf16 dot products (Cooper Lake, SPR, Zen 4) */
} flx_isa_t;

enum {
    FLX_CPU_AVX2 = 1u << 0,
    FLX_CPU_FMA = 1u << 1,
    FLX_CPU_F16C = 1u << 2,
    FLX_CPU_AVX512F = 1u << 3,
    FLX_CPU_AVX512BW = 1u << 4,
    FLX_CPU_AVX512VL = 1u << 5,
    FLX_CPU_AVX512DQ = 1u << 6,
    FLX_CPU_AVX512BF16 = 1u << 7,
    FLX_CPU_AVX512VNNI = 1u << 8,
};

/* Feature bits of this CPU, OS support included. Computed once; thread-safe. */
uint32_t flx_cpu_features(void);

/* The best level the hardware supports. */
flx_isa_t flx_isa_best(void);

/* The level kernels use now: min(best, FLX_ISA env, forced). Cheap; read on every kernel call. */
flx_isa_t flx_isa_active(void);

/* Caps the active level (tests use it to exercise each path). Returns the level actually in force
 * (lower than asked when the hardware lacks it). Not meant to be called while kernels run. */
flx_isa_t flx_isa_force(flx_isa_t isa);

/* FLX_ISA of the environment, when set, names a level: FLX_ERR_INVALID naming the value and the valid ones
 * otherwise (flx_isa_active then ignores it). Programs call it once at start (flx_cli_main does). */
flx_status_t flx_isa_env_check(void);

const char *flx_isa_name(flx_isa_t isa);
/* Parses "scalar", "avx2", "avx512", "avx512bf16"; returns 0 on success. */
int flx_isa_parse(const char *s, flx_isa_t *isa_p);

#ifdef __cplusplus
}
#endif
#endif
