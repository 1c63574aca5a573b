/*
 * flx/cpu.h - CPU feature detection and the kernel dispatch level.
 *
 * DESIGN
 * Kernels are compiled for several instruction sets in one binary (per-function target attributes,
 * never a global -march), and one of them is chosen at run time. The level is the best the CPU
 * and the OS (XSAVE state for AVX/AVX-512; for AMX also this process's permission, asked for once
 * with arch_prctl(ARCH_REQ_XCOMP_PERM) on first use) support, capped by FLX_ISA in the environment
 * (scalar|avx2|avx512|avx512bf16|amx; any other value is refused by flx_isa_env_check) or by
 * flx_isa_force(). Tests force each level in turn and hold every fast
 * kernel to its scalar reference, so a machine without AVX-512 runs the same code paths CI tested.
 *
 * AMX (Intel Xeon since Sapphire Rapids) is the top level. Its tile unit takes the predictor's
 * hidden layers, the one arithmetic-bound bf16 product of a decode step (tile versions of Quest
 * scoring and QK were no faster from DRAM: attn_cpu.c); everything else at that level runs the
 * AVX-512 fp32 kernels, not the AVX-512 BF16 ones: on the Xeon this was measured on,
 * _mm512_dpbf16_ps retires at a quarter of the rate of _mm512_fmadd_ps (0.56 against 0.14 ns an
 * instruction, 12 chains in flight), so its two-part q (hi + lo) made every dpbf16 kernel slower
 * than widening bf16 and FMA-ing in fp32 (scoring 14.2 against 23.1 GB/s). On AMD Zen 4, where
 * the BF16 level was tuned, the two rates are the same.
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
    FLX_ISA_AMX = 4,        /* + AMX-TILE/AMX-BF16, enabled by the OS for this process (SPR and later) */
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
    FLX_CPU_AMX_BF16 = 1u << 9,   /* AMX-TILE + AMX-BF16, palette 1 of 8 tiles of 16 x 64 bytes, XTILECFG and
                                     XTILEDATA in XCR0, and the kernel granted this process XTILEDATA */
    FLX_CPU_INTEL = 1u << 10,     /* vendor GenuineIntel (kernels tune for it: flx_cpu_stream_prefetch) */
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

/* How far ahead of a sequential stream (bytes) the streaming kernels prefetch into L2: the decode
 * GEMV, which reads every weight once a step. 6144 on Intel CPUs, 0 (the hardware prefetchers alone)
 * elsewhere. Measured: on the AMX Xeon VM (2026-12-01, 2 workers, 141 MB of bf16 weights) the GEMV
 * read 19 to 20 GB/s at batch 1 and 12.5 to 13.3 at batch 4 without it, 31 to 34 and 20 to 22 with
 * it (a plateau from 4 KiB to 16 KiB ahead), where the L2 streamer alone, which stops at every 4 KiB
 * boundary, kept too few lines in flight; on the AMD EPYC VM a prefetch ahead of the stream cost 5
 * to 10 % on two cores (2026-11-24). Computed once; thread-safe. Changes no result. */
uint32_t flx_cpu_stream_prefetch(void);

/* FLX_ISA of the environment, when set, names a level: FLX_ERR_INVALID naming the value and the valid ones
 * otherwise (flx_isa_active then ignores it). Programs call it once at start (flx_cli_main does). */
flx_status_t flx_isa_env_check(void);

const char *flx_isa_name(flx_isa_t isa);
/* Parses "scalar", "avx2", "avx512", "avx512bf16", "amx"; returns 0 on success. */
int flx_isa_parse(const char *s, flx_isa_t *isa_p);

#ifdef __cplusplus
}
#endif
#endif
