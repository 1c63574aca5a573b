/*
 * prom.c - Prometheus text exposition (flx/prom.h).
 *
 * DESIGN
 * Rendering is a scrape-time job (a few KiB every few seconds), so the buffer simply doubles;
 * an allocation failure marks the buffer failed instead of returning an error from every line,
 * and the HTTP layer answers 500 for a failed buffer. Integral values print exactly (counters of
 * bytes up to 2^53), others with 9 significant digits.
 */
#include "flx/prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void flx_prom_printf(flx_prom_buf_t *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = b->p ? vsnprintf(b->p + b->len, room, fmt, ap) : -2;
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        if (n == -1) {
            b->failed = 1;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (n >= 0 && cap - b->len <= (size_t)n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
        b->p[b->len] = '\0';
    }
}

void flx_prom_escape(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (; *in; in++) {
        const char c = *in == '\n' ? 'n' : *in;
        const size_t w = (*in == '\\' || *in == '"' || *in == '\n') ? 2 : 1;
        if (o + w > cap - 1)
            break;
        if (w == 2)
            out[o++] = '\\';
        out[o++] = c;
    }
    out[o] = '\0';
}

void flx_prom_header(flx_prom_buf_t *b, const char *name, const char *type, const char *help)
{
    flx_prom_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void value(flx_prom_buf_t *b, double v)
{
    if (isnan(v))
        flx_prom_printf(b, "NaN\n");
    else if (isinf(v))
        flx_prom_printf(b, v > 0 ? "+Inf\n" : "-Inf\n");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        flx_prom_printf(b, "%.0f\n", v);
    else
        flx_prom_printf(b, "%.9g\n", v);
}

void flx_prom_sample(flx_prom_buf_t *b, const char *name, const char *labels, double v)
{
    if (labels && *labels)
        flx_prom_printf(b, "%s{%s} ", name, labels);
    else
        flx_prom_printf(b, "%s ", name);
    value(b, v);
}

void flx_prom_metric(flx_prom_buf_t *b, const char *name, const char *type, const char *help, double v)
{
    flx_prom_header(b, name, type, help);
    flx_prom_sample(b, name, NULL, v);
}

flx_status_t flx_prom_hist_init(flx_prom_hist_t *h, const double *bounds, uint32_t n)
{
    if (!h || !bounds || n < 1 || n > FLX_PROM_MAX_BUCKETS)
        return flx_error_set(FLX_ERR_INVALID, "histogram: %u bounds, want 1..%d", n, FLX_PROM_MAX_BUCKETS);
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1]))
            return flx_error_set(FLX_ERR_INVALID, "histogram: bound %u (%g) not finite and ascending", i, bounds[i]);
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    h->n = n;
    memcpy(h->bounds, bounds, n * sizeof *bounds);
    return FLX_OK;
}

void flx_prom_hist_destroy(flx_prom_hist_t *h)
{
    if (h)
        pthread_mutex_destroy(&h->mu);
}

void flx_prom_hist_observe(flx_prom_hist_t *h, double v)
{
    if (isnan(v))
        return;
    uint32_t i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    pthread_mutex_lock(&h->mu);
    h->counts[i]++;
    h->sum += v;
    h->count++;
    pthread_mutex_unlock(&h->mu);
}

void flx_prom_hist_render(flx_prom_buf_t *b, const char *name, const char *help, flx_prom_hist_t *h)
{
    pthread_mutex_lock(&h->mu);
    uint64_t counts[FLX_PROM_MAX_BUCKETS + 1];
    memcpy(counts, h->counts, sizeof counts);
    double sum = h->sum;
    uint64_t count = h->count;
    pthread_mutex_unlock(&h->mu);
    flx_prom_header(b, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t i = 0; i < h->n; i++) {
        cum += counts[i];
        flx_prom_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    flx_prom_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)count);
    flx_prom_printf(b, "%s_sum ", name);
    value(b, sum);
    flx_prom_printf(b, "%s_count %llu\n", name, (unsigned long long)count);
}
