/*
 * tp_hash.h - XXH3-64 (seed 0) of payloads, the wire format's one hash, on the fastest kernel the
 * CPU has: xxHash's AVX2 loop compiled here (tp_hash_avx2.c) where flx_isa_active() allows AVX2,
 * Debian's libxxhash (SSE2) otherwise. Both compute the same function; a test holds them equal.
 * Measured on the development VM (Zen 4): 29 GB/s from memory and 46 GB/s from L3 for the AVX2
 * loop against 19.5 GB/s either way for the library.
 */
#ifndef FLX_TP_HASH_H
#define FLX_TP_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "flx/kvstore.h"

/* The hash of the concatenation of iov[0 .. n). */
uint64_t tp_hash_iov(const flx_kv_iov_t *iov, uint32_t n);

/* The AVX2 kernel (call only where AVX2 is available). */
uint64_t tp_hash_iov_avx2(const flx_kv_iov_t *iov, uint32_t n);

#endif
