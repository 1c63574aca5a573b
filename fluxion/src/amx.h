/*
 * amx.h - the tile configuration an AMX kernel loads and releases (predictor.c's hidden layers; the
 * attention kernels have none: attn_cpu.c says why). Not a public header.
 *
 * A thread loads a tile configuration before its first tile instruction and releases the tiles
 * when it is done (amx_begin / amx_end around each kernel call): a thread whose tiles are left
 * configured makes every context switch save and restore 8 KiB of tile data. Loading and
 * releasing cost about 55 ns together on the Xeon measured, once per call of a few microseconds.
 * The kernels run only at FLX_ISA_AMX (flx/cpu.h), which is reached only after the kernel granted
 * this process the tile data (cpu.c).
 */
#ifndef FLX_AMX_H
#define FLX_AMX_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define FLX_HAVE_AMX 1
#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

/* LDTILECFG's 64-byte operand, palette 1: tile i has rows[i] rows of colsb[i] bytes (at most 16 x 64). */
typedef struct amx_cfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) amx_cfg_t;

static inline void amx_cfg_init(amx_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->palette = 1;
}

static inline void amx_cfg_tile(amx_cfg_t *c, int tile, uint32_t rows, uint32_t colsb)
{
    c->rows[tile] = (uint8_t)rows;
    c->colsb[tile] = (uint16_t)colsb;
}

TAMX static inline void amx_begin(const amx_cfg_t *c)
{
    _tile_loadconfig(c);
}

TAMX static inline void amx_end(void)
{
    _tile_release();
}
#else
#define FLX_HAVE_AMX 0
#endif

#endif
