/*
 * rpc_internal.h - helpers shared by the gRPC server and client (transport/src only).
 */
#ifndef FLX_RPC_INTERNAL_H
#define FLX_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "flx/status.h"

/* gRPC core hands a tag from the thread that starts a batch to the thread that takes its
 * completion through its own (abseil) synchronization, which ThreadSanitizer cannot see: the tag's
 * address carries the happens-before edge explicitly in TSan builds (release before the batch,
 * acquire before the tag is read). */
#ifdef FLX_TSAN
#include <sanitizer/tsan_interface.h>
#define FLX_TSAN_RELEASE(p) __tsan_release((void *)(p))
#define FLX_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define FLX_TSAN_RELEASE(p) ((void)(p))
#define FLX_TSAN_ACQUIRE(p) ((void)(p))
#endif

/* A gRPC deadline on flx_now_ns()'s clock (UINT64_MAX: none). */
uint64_t flx_rpc_deadline_to_ns(gpr_timespec deadline);
/* ms from now on gRPC's monotonic clock; 0 = no deadline. */
gpr_timespec flx_rpc_ms_from_now(uint32_t ms);
/* A received message as one malloc'd buffer. */
flx_status_t flx_rpc_bb_read(grpc_byte_buffer *bb, void **data_p, size_t *len_p);
/* A byte buffer holding a copy of msg. */
grpc_byte_buffer *flx_rpc_bb_make(const void *msg, size_t len);

#endif
