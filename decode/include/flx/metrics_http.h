/*
 * flx/metrics_http.h - the Prometheus scrape endpoint: GET /metrics over HTTP, served by
 * libmicrohttpd on its own thread.
 *
 * Each scrape calls render(ctx) for a fresh malloc'd text (flx_node_metrics_text); the endpoint
 * answers 200 with "text/plain; version=0.0.4", 404 for other paths, 405 for methods other than
 * GET and HEAD, 500 when render fails. GET /healthz answers "ok" (200) or "draining" (503) from
 * healthy(ctx).
 *
 * THREAD MODE
 * start / stop from one thread; render and healthy run on libmicrohttpd's thread.
 */
#ifndef FLX_METRICS_HTTP_H
#define FLX_METRICS_HTTP_H

#include <stddef.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flx_metrics_http *flx_metrics_http_h;

typedef flx_status_t (*flx_metrics_render_fn)(void *ctx, char **text_p, size_t *len_p);
typedef int (*flx_metrics_healthy_fn)(void *ctx);

/* listen: "host:port" (port 0: any free one; host a numeric IPv4 / IPv6 address or a name). */
flx_status_t flx_metrics_http_start(const char *listen, flx_metrics_render_fn render, flx_metrics_healthy_fn healthy,
                                    void *ctx, flx_metrics_http_h *http_p);
int flx_metrics_http_port(flx_metrics_http_h http);
/* Accepts NULL. */
void flx_metrics_http_stop(flx_metrics_http_h http);

#ifdef __cplusplus
}
#endif
#endif
