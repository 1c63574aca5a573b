/*
 * status.c - status names, the thread-local error message, errno translation, invariant reports.
 */
#include "flx/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"

static _Thread_local char tl_msg[FLX_ERROR_MSG_MAX];

const char *flx_status_name(flx_status_t st)
{
    switch (st) {
    case FLX_OK: return "ok";
    case FLX_INPROGRESS: return "in_progress";
    case FLX_ERR_INVALID: return "invalid";
    case FLX_ERR_NOMEM: return "no_memory";
    case FLX_ERR_CAPACITY: return "capacity";
    case FLX_ERR_STATE: return "state";
    case FLX_ERR_NOT_FOUND: return "not_found";
    case FLX_ERR_IO: return "io";
    case FLX_ERR_FORMAT: return "format";
    case FLX_ERR_UNSUPPORTED: return "unsupported";
    case FLX_ERR_DUPLICATE: return "duplicate";
    case FLX_ERR_TIMEOUT: return "timeout";
    case FLX_ERR_NO_DEVICE: return "no_device";
    case FLX_ERR_DEVICE: return "device";
    case FLX_ERR_CANCELED: return "canceled";
    case FLX_ERR_INTERNAL: return "internal";
    case FLX_ERR_UNAVAILABLE: return "unavailable";
    default: return st > 0 ? "in_progress" : "unknown";
    }
}

void flx_error_record(flx_status_t st, const char *fmt, ...)
{
    /* Formatted aside first: callers add context to the previous message with
     * flx_error_set(st, "layer %u: %s", l, flx_error_msg()), and vsnprintf into the buffer it is
     * reading from is undefined (glibc garbles it). */
    char buf[FLX_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(tl_msg, buf, sizeof tl_msg);
    flx_log_debug("error", "%s: %s", flx_status_name(st), tl_msg);
}

const char *flx_error_msg(void)
{
    return tl_msg;
}

void flx_error_clear(void)
{
    tl_msg[0] = '\0';
}

flx_status_t flx_status_from_errno(int err)
{
    switch (err) {
    case 0: return FLX_OK;
    case ENOMEM: return FLX_ERR_NOMEM;
    case ENOENT: return FLX_ERR_NOT_FOUND;
    case EINVAL: return FLX_ERR_INVALID;
    case EEXIST: return FLX_ERR_DUPLICATE;
    case ETIMEDOUT: return FLX_ERR_TIMEOUT;
    case EAGAIN: return FLX_INPROGRESS;
    case ENOSPC: return FLX_ERR_CAPACITY;
    case ENOTSUP: return FLX_ERR_UNSUPPORTED;
    default: return FLX_ERR_IO;
    }
}

void flx_never_report(const char *cond, const char *file, int line)
{
    flx_log_error("invariant", "broken invariant '%s' at %s:%d", cond, file, line);
}

void flx_corruption_abort(const char *cond, const char *file, int line)
{
    flx_log_error("invariant", "fatal: '%s' at %s:%d; aborting to protect other sessions", cond, file, line);
    abort();
}
