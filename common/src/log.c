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
static atomic_int g_format = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

flx_status_t flx_log_env_check(void)
{
    const char *s = getenv("FLX_LOG");
    if (s && *s && flx_log_level_parse(s) < 0)
        return flx_error_set(FLX_ERR_INVALID, "environment FLX_LOG='%.64s' is not error, warn, info or debug", s);
    s = getenv("FLX_LOG_FORMAT");
    if (s && *s && flx_log_format_parse(s) < 0)
        return flx_error_set(FLX_ERR_INVALID, "environment FLX_LOG_FORMAT='%.64s' is not text or json", s);
    return FLX_OK;
}

int flx_log_level_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "error")) return FLX_LOG_ERROR;
    if (!strcmp(s, "warn")) return FLX_LOG_WARN;
    if (!strcmp(s, "info")) return FLX_LOG_INFO;
    if (!strcmp(s, "debug")) return FLX_LOG_DEBUG;
    return -1;
}

int flx_log_format_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "text")) return FLX_LOG_TEXT;
    if (!strcmp(s, "json")) return FLX_LOG_JSON;
    return -1;
}

static int level_from_env(void)
{
    int l = flx_log_level_parse(getenv("FLX_LOG"));
    return l < 0 ? FLX_LOG_WARN : l;
}

void flx_log_set_format(flx_log_format_t fmt)
{
    atomic_store_explicit(&g_format, (int)fmt, memory_order_relaxed);
}

static int log_format(void)
{
    int f = atomic_load_explicit(&g_format, memory_order_relaxed);
    if (f < 0) {
        f = flx_log_format_parse(getenv("FLX_LOG_FORMAT"));
        if (f < 0) f = FLX_LOG_TEXT;
        atomic_store_explicit(&g_format, f, memory_order_relaxed);
    }
    return f;
}

/* Appends s to out[*n, cap - reserve) as the inside of a JSON string. */
static void json_escape(char *out, size_t *n, size_t cap, size_t reserve, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[7];
        size_t k = 0;
        if (c == '"' || c == '\\') {
            esc[k++] = '\\';
            esc[k++] = (char)c;
        } else if (c == '\n') {
            esc[k++] = '\\';
            esc[k++] = 'n';
        } else if (c < 0x20) {
            memcpy(esc, "\\u00", 4);
            k = 4;
            esc[k++] = hex[c >> 4];
            esc[k++] = hex[c & 15];
        } else {
            esc[k++] = (char)c;
        }
        if (*n + k + reserve > cap) return;
        memcpy(out + *n, esc, k);
        *n += k;
    }
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
    char when[80];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    if (log_format() == FLX_LOG_JSON) {
        char msg[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        size_t n = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",\"module\":\"", when, level_names[lvl]);
        json_escape(line, &n, sizeof line, 16, module);
        memcpy(line + n, "\",\"msg\":\"", 9);
        n += 9;
        json_escape(line, &n, sizeof line, 4, msg);
        memcpy(line + n, "\"}\n", 3);
        n += 3;
        ssize_t w = write(STDERR_FILENO, line, n);
        (void)w;
        return;
    }
    int n = snprintf(line, sizeof line, "%s %-5s %s: ", when, level_names[lvl], module);
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
