/*
 * cpu.c - CPUID/XGETBV feature detection and the dispatch level.
 *
 * A feature counts only if the OS saves its register state (XCR0): AVX needs XMM|YMM, AVX-512
 * also needs opmask|ZMM_Hi256|Hi16_ZMM. Otherwise the first AVX-512 instruction would fault.
 * AMX needs XTILECFG|XTILEDATA in XCR0 and, on Linux (5.16 and later), the process's permission
 * for XTILEDATA: without it the first tile load raises SIGILL. The permission is asked for once,
 * here, and holds for every thread of the process. Granting it makes the kernel's signal frames
 * about 8 KiB larger; a process whose alternate signal stacks are too small for that is refused
 * (ENOSPC), and then AMX simply does not count.
 */
#include "flx/cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Palette 1 as the kernels configure it: 8 tiles of up to 16 rows x 64 bytes (CPUID leaf 0x1D). */
static int amx_palette_ok(void)
{
    uint32_t a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 0x1d) return 0;
    __cpuid_count(0x1d, 0, a, b, c, d);
    if (a < 1) return 0;
    __cpuid_count(0x1d, 1, a, b, c, d);
    const uint32_t bytes_per_tile = a >> 16, bytes_per_row = b & 0xffff, names = b >> 16, rows = c & 0xffff;
    return bytes_per_tile >= 1024 && bytes_per_row >= 64 && names >= 8 && rows >= 16;
}

/* This process may use XTILEDATA (Linux: ARCH_GET/REQ_XCOMP_PERM; feature number 18). */
static int amx_permit(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    uint64_t perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) == 0 && (perm >> XFEATURE_XTILEDATA) & 1) return 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) == 0 && ((perm >> XFEATURE_XTILEDATA) & 1);
#else
    return 0;
#endif
}

static uint32_t detect(void)
{
    uint32_t a, b, c, d, f = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    if (b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu) f |= FLX_CPU_INTEL;   /* "GenuineIntel" */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return f;
    uint64_t xcr0 = xgetbv0();
    int ymm_ok = (xcr0 & 0x6) == 0x6;
    int zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
    if (!ymm_ok) return f;
    if (__get_cpuid_max(0, NULL) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    if ((b >> 5) & 1) f |= FLX_CPU_AVX2;
    if (fma) f |= FLX_CPU_FMA;
    if (f16c) f |= FLX_CPU_F16C;
    if (zmm_ok) {
        if ((b >> 16) & 1) f |= FLX_CPU_AVX512F;
        if ((b >> 17) & 1) f |= FLX_CPU_AVX512DQ;
        if ((b >> 30) & 1) f |= FLX_CPU_AVX512BW;
        if ((b >> 31) & 1) f |= FLX_CPU_AVX512VL;
        if ((c >> 11) & 1) f |= FLX_CPU_AVX512VNNI;
        const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 5) & 1) f |= FLX_CPU_AVX512BF16;
        if (amx_bf16 && amx_tile && (xcr0 & 0x60000) == 0x60000 && amx_palette_ok() && amx_permit())
            f |= FLX_CPU_AMX_BF16;
    }
    return f;
}
#else
static uint32_t detect(void) { return 0; }
#endif

static atomic_uint g_features;       /* bit 31 marks "computed" */
static atomic_int g_forced = -1;     /* -1: none */
static atomic_int g_env_cap = -2;    /* -2: not read yet, -1: none */

uint32_t flx_cpu_features(void)
{
    unsigned v = atomic_load_explicit(&g_features, memory_order_acquire);
    if (!(v & 0x80000000u)) {
        v = detect() | 0x80000000u;
        atomic_store_explicit(&g_features, v, memory_order_release);
    }
    return v & 0x7fffffffu;
}

uint32_t flx_cpu_stream_prefetch(void)
{
    return (flx_cpu_features() & FLX_CPU_INTEL) ? 6144 : 0;
}

flx_isa_t flx_isa_best(void)
{
    uint32_t f = flx_cpu_features();
    const uint32_t need2 = FLX_CPU_AVX2 | FLX_CPU_FMA | FLX_CPU_F16C;
    const uint32_t need512 = need2 | FLX_CPU_AVX512F | FLX_CPU_AVX512BW | FLX_CPU_AVX512VL | FLX_CPU_AVX512DQ;
    if ((f & need512) == need512) {
        if (!(f & FLX_CPU_AVX512BF16)) return FLX_ISA_AVX512;
        return (f & FLX_CPU_AMX_BF16) ? FLX_ISA_AMX : FLX_ISA_AVX512BF16;
    }
    if ((f & need2) == need2) return FLX_ISA_AVX2;
    return FLX_ISA_SCALAR;
}

int flx_isa_parse(const char *s, flx_isa_t *isa_p)
{
    if (!s) return -1;
    if (!strcmp(s, "scalar")) { *isa_p = FLX_ISA_SCALAR; return 0; }
    if (!strcmp(s, "avx2")) { *isa_p = FLX_ISA_AVX2; return 0; }
    if (!strcmp(s, "avx512")) { *isa_p = FLX_ISA_AVX512; return 0; }
    if (!strcmp(s, "avx512bf16")) { *isa_p = FLX_ISA_AVX512BF16; return 0; }
    if (!strcmp(s, "amx")) { *isa_p = FLX_ISA_AMX; return 0; }
    return -1;
}

flx_status_t flx_isa_env_check(void)
{
    const char *s = getenv("FLX_ISA");
    flx_isa_t isa;
    if (s && *s && flx_isa_parse(s, &isa) != 0)
        return flx_error_set(FLX_ERR_INVALID, "environment FLX_ISA='%.64s' is not scalar, avx2, avx512, avx512bf16 or amx",
                             s);
    return FLX_OK;
}

flx_isa_t flx_isa_active(void)
{
    int cap = atomic_load_explicit(&g_env_cap, memory_order_relaxed);
    if (cap == -2) {
        /* A value flx_isa_env_check refuses caps nothing here (that check is the caller's, once at
         * start: a kernel call has no status to refuse with); it is logged once. */
        flx_isa_t e;
        const char *s = getenv("FLX_ISA");
        cap = flx_isa_parse(s, &e) == 0 ? (int)e : -1;
        if (s && *s && cap < 0)
            flx_log_warn("cpu", "FLX_ISA='%.64s' is not scalar, avx2, avx512, avx512bf16 or amx: ignored", s);
        atomic_store_explicit(&g_env_cap, cap, memory_order_relaxed);
    }
    int lvl = (int)flx_isa_best();
    if (cap >= 0 && cap < lvl) lvl = cap;
    int forced = atomic_load_explicit(&g_forced, memory_order_relaxed);
    if (forced >= 0 && forced < lvl) lvl = forced;
    return (flx_isa_t)lvl;
}

flx_isa_t flx_isa_force(flx_isa_t isa)
{
    atomic_store_explicit(&g_forced, (int)isa, memory_order_relaxed);
    return flx_isa_active();
}

const char *flx_isa_name(flx_isa_t isa)
{
    switch (isa) {
    case FLX_ISA_SCALAR: return "scalar";
    case FLX_ISA_AVX2: return "avx2";
    case FLX_ISA_AVX512: return "avx512";
    case FLX_ISA_AVX512BF16: return "avx512bf16";
    case FLX_ISA_AMX: return "amx";
    }
    return "?";
}
