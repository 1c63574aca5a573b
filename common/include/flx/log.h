/*
 * flx/log.h - logging.
 *
 * One line per event on stderr, in one of two formats:
 *   text  "<iso time> <level> <module>: <message>"                          (default, for people)
 *   json  {"ts":"<iso time>","level":"<level>","module":"<module>","msg":"<message>"}
 *         one JSON object per line (for log collectors; the message is escaped, never split)
 * The level threshold comes from the environment variable FLX_LOG (error|warn|info|debug; default
 * warn) on first use, or from flx_log_set_level(); the format from FLX_LOG_FORMAT (text|json) or
 * flx_log_set_format(). Thread-safe: each line is formatted into a local buffer and written with
 * one write(2). Log an error once, where it is first detected, with the values that explain it.
 */
#ifndef FLX_LOG_H
#define FLX_LOG_H

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FLX_LOG_ERROR = 0, FLX_LOG_WARN = 1, FLX_LOG_INFO = 2, FLX_LOG_DEBUG = 3 } flx_log_level_t;

/* FLX_LOG of the environment, when set, names a level (and FLX_LOG_FORMAT a format): FLX_ERR_INVALID naming the value and the valid
 * ones otherwise (the level then stays warn). Programs call it once at start (flx_cli_main does). */
flx_status_t flx_log_env_check(void);

typedef enum { FLX_LOG_TEXT = 0, FLX_LOG_JSON = 1 } flx_log_format_t;

/* Parses "error" | "warn" | "info" | "debug" and "text" | "json"; -1 for anything else. */
int flx_log_level_parse(const char *s);
int flx_log_format_parse(const char *s);
void flx_log_set_format(flx_log_format_t fmt);
void flx_log_set_level(flx_log_level_t lvl);
flx_log_level_t flx_log_get_level(void);
int flx_log_enabled(flx_log_level_t lvl);
void flx_log_write(flx_log_level_t lvl, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define flx_log_error(mod, ...) flx_log_write(FLX_LOG_ERROR, mod, __VA_ARGS__)
#define flx_log_warn(mod, ...)  flx_log_write(FLX_LOG_WARN, mod, __VA_ARGS__)
#define flx_log_info(mod, ...)  flx_log_write(FLX_LOG_INFO, mod, __VA_ARGS__)
#define flx_log_debug(mod, ...) \
    do { if (flx_log_enabled(FLX_LOG_DEBUG)) flx_log_write(FLX_LOG_DEBUG, mod, __VA_ARGS__); } while (0)

#ifdef __cplusplus
}
#endif
#endif
