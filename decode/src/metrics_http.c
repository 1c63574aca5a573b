/*
 * metrics_http.c - /metrics and /healthz over libmicrohttpd (flx/metrics_http.h).
 *
 * DESIGN
 * libmicrohttpd owns the sockets, HTTP parsing and its polling thread; this file only picks the
 * path and hands over the text, so no HTTP parser of ours ever sees outside bytes. Connections
 * are capped and time out, so a scraper that stalls cannot hold the node's threads.
 */
#include "flx/metrics_http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "flx/log.h"

struct flx_metrics_http {
    struct MHD_Daemon *d;
    flx_metrics_render_fn render;
    flx_metrics_healthy_fn healthy;
    void *ctx;
    int port;
};

static enum MHD_Result answer_text(struct MHD_Connection *conn, unsigned code, const char *type, char *text,
                                   size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
    struct flx_metrics_http *h = cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return answer_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", (char *)"method not allowed\n", 19,
                           MHD_RESPMEM_PERSISTENT);
    if (!strcmp(url, "/metrics")) {
        char *text = NULL;
        size_t len = 0;
        if (h->render(h->ctx, &text, &len))
            return answer_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", (char *)"metrics unavailable\n", 20,
                               MHD_RESPMEM_PERSISTENT);
        return answer_text(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len,
                           MHD_RESPMEM_MUST_FREE);
    }
    if (!strcmp(url, "/healthz")) {
        int ok = !h->healthy || h->healthy(h->ctx);
        return ok ? answer_text(conn, MHD_HTTP_OK, "text/plain", (char *)"ok\n", 3, MHD_RESPMEM_PERSISTENT)
                  : answer_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", (char *)"draining\n", 9,
                                MHD_RESPMEM_PERSISTENT);
    }
    return answer_text(conn, MHD_HTTP_NOT_FOUND, "text/plain", (char *)"not found: try /metrics\n", 24,
                       MHD_RESPMEM_PERSISTENT);
}

flx_status_t flx_metrics_http_start(const char *listen, flx_metrics_render_fn render, flx_metrics_healthy_fn healthy,
                                    void *ctx, flx_metrics_http_h *http_p)
{
    if (!listen || !render || !http_p)
        return flx_error_set(FLX_ERR_INVALID, "metrics http: NULL argument");
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host)
        return flx_error_set(FLX_ERR_INVALID, "metrics address '%s' is not host:port", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    char *h0 = host;
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {   /* [IPv6] */
        host[hl - 1] = '\0';
        h0 = host + 1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(h0, colon + 1, &hints, &ai);
    if (gai)
        return flx_error_set(FLX_ERR_INVALID, "metrics address '%s': %s", listen, gai_strerror(gai));
    struct flx_metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return flx_error_set(FLX_ERR_NOMEM, "metrics http");
    }
    h->render = render;
    h->healthy = healthy;
    h->ctx = ctx;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return flx_error_set(FLX_ERR_IO, "cannot serve metrics on %s (address in use?)", listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : 0;
    flx_log_info("metrics", "serving /metrics on %s (port %d)", listen, h->port);
    *http_p = h;
    return FLX_OK;
}

int flx_metrics_http_port(flx_metrics_http_h h)
{
    return h ? h->port : 0;
}

void flx_metrics_http_stop(flx_metrics_http_h h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}
