/*
 * flx/progress.h - progress of long operations: reported by the library, shown by the tools.
 *
 * DESIGN
 * A prefill of a long prompt, a model load, a KV dump, labelling or training can take minutes; a
 * person at a terminal should see that it moves, and a script's stdout must never see it. Library
 * code reports its natural steps (a layer of a prefill, a tensor of a load, an epoch) with
 * flx_progress_report(), which costs one thread-local load when nobody listens. Whoever drives
 * the operation decides whether anything is shown by installing an observer on its own thread:
 * the tools install flx_progress_meter (through flx_cli_main) when stderr is a terminal or
 * --progress was given, a server installs none (or its own, to stream progress to a client).
 * The observer is per thread because the operations are: a prefill reports from the thread that
 * called it (never from its OpenMP workers), and two requests on two threads never mix.
 *
 * THE METER draws on stderr only. On a terminal: one line redrawn in place ("\r") at most 5 times a
 * second, and only once an operation has run 0.5 s (quick ones stay silent); the finished line is
 * kept. Not on a terminal (--progress into a log): one line per second at most, and always the
 * final line of each operation ("PROG: prefill: 30/30 layers in 12.3 s").
 *
 * THREAD MODE: the observer and the meter's state are per thread.
 */
#ifndef FLX_PROGRESS_H
#define FLX_PROGRESS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* stage: what runs ("prefill", "loading model"), a string that lives through the operation;
 * done of total units (total >= 1; done == total reports the end); unit: "layers", "tensors". */
typedef void (*flx_progress_fn)(void *ctx, const char *stage, uint64_t done, uint64_t total, const char *unit);

/* Installs fn (NULL: none) as the calling thread's observer. */
void flx_progress_observe(flx_progress_fn fn, void *ctx);

/* Library side: tells the calling thread's observer, if any. Cheap without one. */
void flx_progress_report(const char *stage, uint64_t done, uint64_t total, const char *unit);

/* The stderr meter of the tools (THE METER above); prog prefixes each line (not owned; must live
 * while the meter is installed). tty: 1 when stderr is a terminal. */
void flx_progress_meter_install(const char *prog, int tty);

#ifdef __cplusplus
}
#endif
#endif
