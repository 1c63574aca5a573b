/*
 * flx/status.h - the one status type of the project, error messages, asserts.
 *
 * DESIGN
 * Every function that can fail returns flx_status_t: 0 is success, a positive value means "in
 * progress / try again later", a negative value is an error. Foreign codes (errno, UCX, gRPC, CUDA)
 * are translated in exactly one function each, next to the module that talks to that library
 * (flx_status_from_errno lives here).
 *
 * Library code never exits. A function that refuses input records a human-readable message with
 * flx_error_set() (thread-local, so concurrent requests do not mix) and returns the status; the
 * caller that answers the request (a gRPC handler, a CLI main) reads it with flx_error_msg().
 * Messages start with nothing but the facts: lowercase, values that explain the refusal.
 *
 * Three levels of checking:
 *   FLX_DEBUG_ASSERT(c)  debug builds only; for invariants that are expensive to check.
 *   FLX_NEVER(c)         always compiled; if an invariant is broken, logs and evaluates to true so
 *                        the caller can return FLX_ERR_INTERNAL instead of crashing a serving node.
 *   FLX_CORRUPTION(c)    always-on abort, only for memory corruption where continuing would
 *                        spread damage to other sessions.
 * Input that arrives from outside (files, flags, network) is validated with ordinary if + status.
 */
#ifndef FLX_STATUS_H
#define FLX_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int flx_status_t;

enum {
    FLX_OK               = 0,
    FLX_INPROGRESS       = 1,   /* not an error: the operation continues */
    FLX_ERR_INVALID      = -1,  /* an argument or input value is malformed or out of range */
    FLX_ERR_NOMEM        = -2,  /* the process could not get memory */
    FLX_ERR_CAPACITY     = -3,  /* a configured pool or limit is full: try later / elsewhere */
    FLX_ERR_STATE        = -4,  /* the object is in a state where this operation is illegal */
    FLX_ERR_NOT_FOUND    = -5,  /* no such session, tensor, key, file */
    FLX_ERR_IO           = -6,  /* read/write/open failed */
    FLX_ERR_FORMAT       = -7,  /* a file or message does not follow its format */
    FLX_ERR_UNSUPPORTED  = -8,  /* well-formed but not supported (dtype, architecture, ...) */
    FLX_ERR_DUPLICATE    = -9,  /* the thing already exists / the range was already written */
    FLX_ERR_TIMEOUT      = -10,
    FLX_ERR_NO_DEVICE    = -11, /* no usable GPU */
    FLX_ERR_DEVICE       = -12, /* a GPU call failed */
    FLX_ERR_CANCELED     = -13,
    FLX_ERR_INTERNAL     = -14, /* an invariant of this program was broken: a bug */
    FLX_ERR_UNAVAILABLE  = -15, /* the service is draining or shutting down: go elsewhere */
};

/* Short machine-readable name ("FLX_ERR_CAPACITY" -> "capacity"); never NULL. */
const char *flx_status_name(flx_status_t st);

/* Records the message for this thread and returns st, so refusals read:
 *     return flx_error_set(FLX_ERR_INVALID, "layer %u out of range (n_layers %u)", l, n);
 * The message is truncated to FLX_ERROR_MSG_MAX-1 bytes. It is also logged at debug level. */
#define FLX_ERROR_MSG_MAX 512
void flx_error_record(flx_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A statement expression rather than a function, so the compiler sees that the value is st itself:
 * callers write out-params only on success, and an opaque return would make every such
 * "if (st) return st; use(*out)" look like a maybe-uninitialized read. st is evaluated once. */
#define flx_error_set(st, ...)                    \
    __extension__({                               \
        flx_status_t flx_st_ = (st);              \
        flx_error_record(flx_st_, __VA_ARGS__);   \
        flx_st_;                                  \
    })

/* The last message recorded by this thread (empty string if none). Valid until the next
 * flx_error_set or flx_error_clear on this thread. */
const char *flx_error_msg(void);
void flx_error_clear(void);

/* errno -> status (ENOMEM -> NOMEM, ENOENT -> NOT_FOUND, EINVAL -> INVALID, else IO). */
flx_status_t flx_status_from_errno(int err);

void flx_never_report(const char *cond, const char *file, int line);
void flx_corruption_abort(const char *cond, const char *file, int line) __attribute__((noreturn));

#define FLX_NEVER(c) \
    (__builtin_expect(!!(c), 0) ? (flx_never_report(#c, __FILE__, __LINE__), 1) : 0)
#define FLX_CORRUPTION(c) \
    do { if (__builtin_expect(!!(c), 0)) flx_corruption_abort(#c, __FILE__, __LINE__); } while (0)
#ifdef NDEBUG
#define FLX_DEBUG_ASSERT(c) ((void)0)
#else
#define FLX_DEBUG_ASSERT(c) \
    do { if (!(c)) flx_corruption_abort(#c, __FILE__, __LINE__); } while (0)
#endif

#ifdef __cplusplus
}
#endif
#endif
