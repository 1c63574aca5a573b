/*
 * log.c - one line per event on stderr, written with a single write(2) so lines from different
 * threads never interleave.
 */
#include "flx/log.h"

#include "flx/status.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* The level FLX_LOG names, or -1 (unset: the default; anything else: refused by flx_log_env_check). */
static int level_of(const char *s)
{
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, level_names[i])) return i;
    return -1;
}

static int level_from_env(void)
{
    int l = level_of(getenv("FLX_LOG"));
    return l < 0 ? FLX_LOG_WARN : l;
}

flx_status_t flx_log_env_check(void)
{
    const char *s = getenv("FLX_LOG");
    if (s && *s && level_of(s) < 0)
        return flx_error_set(FLX_ERR_INVALID, "environment FLX_LOG='%.64s' is not error, warn, info or debug", s);
    return FLX_OK;
}

flx_log_level_t flx_log_get_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        l = level_from_env();
        atomic_store_explicit(&g_level, l, memory_order_relaxed);
    }
    return (flx_log_level_t)l;
}

void flx_log_set_level(flx_log_level_t lvl)
{
    atomic_store_explicit(&g_level, (int)lvl, memory_order_relaxed);
}

int flx_log_enabled(flx_log_level_t lvl)
{
    return (int)lvl <= (int)flx_log_get_level();
}

void flx_log_write(flx_log_level_t lvl, const char *module, const char *fmt, ...)
{
    if (!flx_log_enabled(lvl)) return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     level_names[lvl], module);
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof line - (size_t)n - 2 ? (size_t)m : sizeof line - (size_t)n - 2));
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
