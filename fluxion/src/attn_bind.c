/*
 * attn_bind.c - binding the OpenMP worker pool to the KV's NUMA node (needs the kvstore library).
 *
 * DESIGN
 * libgomp keeps its pool threads alive between parallel regions, so binding them once (here)
 * holds for every later kernel call with the same thread count; kernels never pay for it per call.
 */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "flx/attn.h"

flx_status_t flx_attn_bind_threads(int numa_node, uint32_t n_threads)
{
    flx_status_t st = flx_numa_check_node(numa_node);
    if (st) return st;
    if (n_threads == 0) {
#ifdef _OPENMP
        n_threads = (uint32_t)omp_get_max_threads();
#else
        n_threads = 1;
#endif
    }
    flx_status_t worst = FLX_OK;
#pragma omp parallel num_threads(n_threads)
    {
        flx_status_t s = flx_numa_bind_thread(numa_node);
        if (s) {
#pragma omp critical
            worst = s;
        }
    }
    return worst;
}
