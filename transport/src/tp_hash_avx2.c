/*
 * tp_hash_avx2.c - xxHash's XXH3 compiled inline with its AVX2 accumulate loop (this file is built
 * with -mavx2; tp_hash_iov calls it only when flx_isa_active() allows AVX2).
 */
#include "tp_hash.h"

#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

uint64_t tp_hash_iov_avx2(const flx_kv_iov_t *iov, uint32_t n)
{
    if (n == 1) return XXH3_64bits(iov[0].dst, iov[0].len);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < n; i++) XXH3_64bits_update(&st, iov[i].dst, iov[i].len);
    return XXH3_64bits_digest(&st);
}
#endif
