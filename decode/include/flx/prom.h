/*
 * flx/prom.h - the Prometheus text exposition format (version 0.0.4): a growing text buffer,
 * sample lines, and histograms with fixed buckets.
 *
 * Names follow Prometheus conventions (base units in the name: _seconds, _bytes; counters end in
 * _total); the caller picks them. A histogram renders <name>_bucket{le="..."} (cumulative, +Inf
 * last), <name>_sum and <name>_count.
 *
 * THREAD MODE
 * A buffer belongs to one thread. A histogram may be observed and rendered from any thread (its
 * own mutex).
 */
#ifndef FLX_PROM_H
#define FLX_PROM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_prom_buf {
    char *p;          /* NUL-terminated text, malloc'd */
    size_t len, cap;
    int failed;       /* an allocation failed: the text is incomplete */
} flx_prom_buf_t;

void flx_prom_printf(flx_prom_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "# HELP name help" and "# TYPE name type" (type: counter, gauge, histogram). */
void flx_prom_header(flx_prom_buf_t *b, const char *name, const char *type, const char *help);
/* A label value as the format writes it: \ " and newline escaped (\\ \" \n), into out (cap > 0,
 * NUL-terminated; cut at cap - 1 bytes, never inside an escape). */
void flx_prom_escape(const char *in, char *out, size_t cap);
/* "name{labels} value"; labels NULL or "" for none, else 'key="value",...' (already escaped). */
void flx_prom_sample(flx_prom_buf_t *b, const char *name, const char *labels, double v);
/* header + one unlabelled sample. */
void flx_prom_metric(flx_prom_buf_t *b, const char *name, const char *type, const char *help, double v);

#define FLX_PROM_MAX_BUCKETS 24

typedef struct flx_prom_hist {
    pthread_mutex_t mu;
    uint32_t n;                                  /* finite bucket bounds */
    double bounds[FLX_PROM_MAX_BUCKETS];         /* ascending upper bounds */
    uint64_t counts[FLX_PROM_MAX_BUCKETS + 1];   /* per bucket (not cumulative); [n] = above all */
    double sum;
    uint64_t count;
} flx_prom_hist_t;

/* bounds ascending and finite, 1 <= n <= FLX_PROM_MAX_BUCKETS. */
flx_status_t flx_prom_hist_init(flx_prom_hist_t *h, const double *bounds, uint32_t n);
void flx_prom_hist_destroy(flx_prom_hist_t *h);
void flx_prom_hist_observe(flx_prom_hist_t *h, double v);
void flx_prom_hist_render(flx_prom_buf_t *b, const char *name, const char *help, flx_prom_hist_t *h);

#ifdef __cplusplus
}
#endif
#endif
