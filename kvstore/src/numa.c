/*
 * numa.c - NUMA node discovery and thread binding.
 *
 * DESIGN
 * libnuma is the only source of truth, but two of its behaviours need guarding (measured on this
 * project's machines): numa_alloc_onnode() on a node that does not exist still returns memory, and
 * numa_node_size64() is unreliable. So a node is valid when numa_available() >= 0 and the node is
 * set in numa_all_nodes_ptr (configured nodes with memory); without kernel NUMA support only node 0
 * exists (flx_numa_node_check in common, shared with the worker pool). Threads are bound to a node
 * by the worker pool that runs them (flx/pool.h, numa_node).
 */
#define _GNU_SOURCE
#include <numa.h>
#include <sched.h>

#include "flx/kvstore.h"
#include "flx/pool.h"

int flx_numa_node_count(void)
{
    if (numa_available() < 0) return 1;
    int n = numa_max_node() + 1;
    return n > 0 ? n : 1;
}

flx_status_t flx_numa_check_node(int node)
{
    return flx_numa_node_check(node);
}

int flx_numa_current_node(void)
{
    if (numa_available() < 0) return 0;
    int cpu = sched_getcpu();
    int node = cpu >= 0 ? numa_node_of_cpu(cpu) : 0;
    return node >= 0 ? node : 0;
}
