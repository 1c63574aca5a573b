/*
 * progress.c - the per-thread progress observer and the tools' stderr meter (flx/progress.h).
 */
#include "flx/progress.h"

#include <stdio.h>
#include <string.h>

#include "flx/util.h"

static _Thread_local flx_progress_fn tl_fn;
static _Thread_local void *tl_ctx;

void flx_progress_observe(flx_progress_fn fn, void *ctx)
{
    tl_fn = fn;
    tl_ctx = ctx;
}

void flx_progress_report(const char *stage, uint64_t done, uint64_t total, const char *unit)
{
    if (tl_fn) tl_fn(tl_ctx, stage, done, total, unit);
}

#define TTY_DELAY_NS 500000000ull     /* an operation stays silent on a terminal for its first 0.5 s */
#define TTY_PERIOD_NS 200000000ull    /* then redraws at most 5 times a second */
#define LINE_PERIOD_NS 1000000000ull  /* lines into a log: one a second at most, and the last */

typedef struct meter {
    const char *prog;
    int tty;
    const char *stage;      /* the operation being shown (NULL: none) */
    uint64_t t_start, t_last;
    int drawn;              /* tty: a partial line is on screen */
} meter_t;

static _Thread_local meter_t tl_meter;

static void draw(meter_t *m, uint64_t done, uint64_t total, const char *unit, uint64_t now, int last)
{
    double secs = (double)(now - m->t_start) * 1e-9;
    char line[256];
    int n;
    if (last)
        n = snprintf(line, sizeof line, "%s: %s: %llu/%llu %s in %.1f s", m->prog, m->stage,
                     (unsigned long long)done, (unsigned long long)total, unit, secs);
    else
        n = snprintf(line, sizeof line, "%s: %s: %llu/%llu %s (%.0f%%), %.1f s", m->prog, m->stage,
                     (unsigned long long)done, (unsigned long long)total, unit, 100.0 * (double)done / (double)total,
                     secs);
    if (n < 0) return;
    if (m->tty) fprintf(stderr, "\r%s\033[K%s", line, last ? "\n" : "");
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
    m->drawn = m->tty && !last;
    m->t_last = now;
}

static void meter_fn(void *ctx, const char *stage, uint64_t done, uint64_t total, const char *unit)
{
    meter_t *m = ctx;
    uint64_t now = flx_now_ns();
    if (!stage || total == 0) return;
    if (!m->stage || strcmp(m->stage, stage) != 0) {
        if (m->drawn) fputc('\n', stderr);   /* an unfinished operation's line stays as it was */
        m->stage = stage;
        m->t_start = now;
        m->t_last = 0;
        m->drawn = 0;
    }
    int last = done >= total;
    int show;
    if (m->tty)
        show = now - m->t_start >= TTY_DELAY_NS && (last || now - m->t_last >= TTY_PERIOD_NS);
    else
        show = last || now - m->t_last >= LINE_PERIOD_NS;
    if (last && m->tty && !m->drawn && now - m->t_start < TTY_DELAY_NS) show = 0;
    if (show) draw(m, done, total, unit ? unit : "", now, last);
    if (last) m->stage = NULL;
}

void flx_progress_meter_install(const char *prog, int tty)
{
    memset(&tl_meter, 0, sizeof tl_meter);
    tl_meter.prog = prog;
    tl_meter.tty = tty;
    flx_progress_observe(meter_fn, &tl_meter);
}
