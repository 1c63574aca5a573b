/*
 * fluxion-decoded - the decode node daemon: the gRPC control service (fluxion.decode.v1 and
 * grpc.health.v1) in front of a decode node, and its Prometheus metrics page.
 *
 *   fluxion-decoded --model M.gguf [--config FILE] [--grpc-listen HOST:PORT] ...
 *
 * Settings come from the config file (--config; docs/node.md has the format and every key), then
 * from flags of the same names, which win. Once serving it prints one line on stdout:
 *   fluxion-decoded: serving grpc=HOST:PORT metrics=HOST:PORT|off pid=PID
 * (the bound ports, so port 0 works) and logs to stderr (--log-format json for collectors).
 *
 * SIGTERM / SIGINT drain: health turns NOT_SERVING, new sessions and Generate calls are refused
 * with UNAVAILABLE, sessions still receiving fail, running Generate calls finish (or end with
 * UNAVAILABLE after drain-timeout-ms); then the server stops and the process exits 0. A second
 * signal ends the drain at once.
 *
 * Exit codes (flx/cli.h): 0 after a drain, --help, --version, --print-config; 1 when the node cannot
 * start (model, address in use...); 2 for a usage error (unknown flag, bad value, bad config file).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "flx/cli.h"
#include "flx/log.h"
#include "flx/metrics_http.h"
#include "flx/node.h"
#include "flx/node_config.h"
#include "flx/node_service.h"
#include "flx/rpc.h"
#include "flx/util.h"

#define PROG "fluxion-decoded"

static flx_status_t render(void *ctx, char **text_p, size_t *len_p)
{
    return flx_node_metrics_text(ctx, text_p, len_p);
}

static int healthy(void *ctx)
{
    return !flx_node_draining(ctx);
}

/* Flags (and the config file --config names) into cfg, on flx/cli.h: every config key is a flag of
 * the same name. Returns FLX_CLI_PROCEED or the exit code (help, version, usage error). */
static int parse_args(int argc, char **argv, flx_node_config_t *cfg, int *print_p)
{
    const char *const *keys = flx_node_config_keys();
    uint32_t n_keys = 0;
    while (keys[n_keys]) n_keys++;
    flx_cli_opt_t *opts = calloc(n_keys + 2, sizeof *opts);
    const char **vals = calloc(n_keys, sizeof *vals);
    const char *config_path = NULL;
    int rc = FLX_CLI_PROCEED;
    if (!opts || !vals) {
        fprintf(stderr, PROG ": out of memory\n");
        rc = FLX_EXIT_FAILURE;
        goto out;
    }
    opts[0] = (flx_cli_opt_t)FLX_CLI_PATH(0, "config", "FILE", &config_path, 0,
                                          "settings, one 'key = value' per line (docs/node.md); flags win over it");
    opts[1] = (flx_cli_opt_t)FLX_CLI_FLAG(0, "print-config", print_p,
                                          "print the effective settings in the config file format and exit");
    for (uint32_t i = 0; i < n_keys; i++)
        opts[2 + i] = (flx_cli_opt_t)FLX_CLI_STR(0, keys[i], "VALUE", &vals[i], 0, flx_node_config_help(keys[i]));
    flx_cli_t cli = {.prog = PROG, .summary = "The decode node daemon: the gRPC control service, the KV receiver "
                                              "(UCX) and the Prometheus /metrics page.",
                     .synopsis = "--model PATH [--config FILE] [--KEY VALUE ...] [--print-config]",
                     .epilog = "Every setting is a flag --KEY VALUE and a line 'KEY = VALUE' of the config file "
                               "(docs/node.md); flags win.\nSIGTERM drains: sessions in transfer fail, running "
                               "Generate calls finish or end UNAVAILABLE; then exit 0.",
                     .opts = opts, .n_opts = n_keys + 2};
    if ((rc = flx_cli_main(&cli, argc, argv)) != FLX_CLI_PROCEED) goto out;
    flx_node_config_default(cfg);
    if (config_path && flx_node_config_load(cfg, config_path)) {
        rc = flx_cli_usage_error(&cli, "--config: %s", flx_error_msg());
        goto out;
    }
    for (uint32_t i = 0; i < n_keys; i++)
        if (vals[i] && flx_node_config_set(cfg, keys[i], vals[i])) {
            rc = flx_cli_usage_error(&cli, "--%s: %s", keys[i], flx_error_msg());
            goto out;
        }
    if (!*print_p && flx_node_config_check(cfg)) rc = flx_cli_usage_error(&cli, NULL);
out:
    free(opts);
    free(vals);
    return rc;
}

/* Every UCX connection has a worker of its own (docs/transfer.md: about 11 descriptors each over
 * shared memory and TCP), so the soft limit on descriptors is raised to the hard one. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= rl.rlim_max) return;
    const unsigned long long was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        flx_log_info("daemon", "file descriptor limit raised from %llu to %llu", was, (unsigned long long)rl.rlim_cur);
}

int main(int argc, char **argv)
{
    flx_node_config_t cfg;
    int print = 0;
    int prc = parse_args(argc, argv, &cfg, &print);
    if (prc != FLX_CLI_PROCEED)
        return prc;
    if (print) {
        size_t need = flx_node_config_format(&cfg, NULL, 0);
        char *buf = malloc(need + 1);
        if (!buf)
            return 1;
        flx_node_config_format(&cfg, buf, need + 1);
        fputs(buf, stdout);
        free(buf);
        return 0;
    }
    flx_log_set_level((flx_log_level_t)cfg.log_level);
    flx_log_set_format((flx_log_format_t)cfg.log_format);

    /* Signals go to this thread only (sigwait below); every thread started later inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();

    int rc = 1;
    flx_node_h node = NULL;
    flx_node_service_h svc = NULL;
    flx_rpc_server_h srv = NULL;
    flx_metrics_http_h http = NULL;
    if (flx_node_create(&cfg, &node) || flx_node_service_create(node, &svc)) {
        flx_log_error("daemon", "cannot start the node: %s", flx_error_msg());
        goto out;
    }
    uint32_t n_methods;
    const flx_rpc_method_t *methods = flx_node_service_methods(svc, &n_methods);
    flx_rpc_server_params_t sp = {
        .field_mask = FLX_RPC_SERVER_FIELD_LISTEN | FLX_RPC_SERVER_FIELD_METHODS | FLX_RPC_SERVER_FIELD_MAX_RECV |
                      FLX_RPC_SERVER_FIELD_THREADS,
        .listen = cfg.grpc_listen, .methods = methods, .n_methods = n_methods,
        .max_recv_bytes = cfg.max_message_bytes, .n_threads = cfg.grpc_threads};
    if (flx_rpc_server_create(&sp, &srv)) {
        flx_log_error("daemon", "grpc-listen %s: %s", cfg.grpc_listen, flx_error_msg());
        goto out;
    }
    char metrics_at[FLX_NODE_ADDR_MAX + 16] = "off";
    if (strcmp(cfg.metrics_listen, "off")) {
        if (flx_metrics_http_start(cfg.metrics_listen, render, healthy, node, &http)) {
            flx_log_error("daemon", "metrics-listen %s: %s", cfg.metrics_listen, flx_error_msg());
            goto out;
        }
        char host[FLX_NODE_ADDR_MAX];
        snprintf(host, sizeof host, "%s", cfg.metrics_listen);
        *strrchr(host, ':') = '\0';
        snprintf(metrics_at, sizeof metrics_at, "%s:%d", host, flx_metrics_http_port(http));
    }
    {
        char host[FLX_NODE_ADDR_MAX];
        snprintf(host, sizeof host, "%s", cfg.grpc_listen);
        *strrchr(host, ':') = '\0';
        printf(PROG ": serving grpc=%s:%d metrics=%s pid=%d\n", host, flx_rpc_server_port(srv), metrics_at,
               (int)getpid());
        fflush(stdout);
    }

    int sig = 0;
    sigwait(&sigs, &sig);
    flx_log_info("daemon", "signal %d: draining (up to %u ms for running Generate calls)", sig, cfg.drain_timeout_ms);
    flx_node_service_drain(svc);
    flx_node_drain(node, cfg.drain_timeout_ms);
    /* wait for the Generate calls to end (the node ends them at the drain deadline); a second
     * signal shortens the drain to the next step */
    while (flx_node_n_generating(node)) {
        struct timespec ts = {0, 50 * 1000000L};
        if (sigtimedwait(&sigs, NULL, &ts) > 0) {
            flx_log_warn("daemon", "second signal: ending the running Generate calls now");
            flx_node_drain(node, 0);
        }
    }
    rc = 0;
out:
    /* The node outlives the server: handlers still running call it, and calls it holds end first. */
    if (node)
        flx_node_drain(node, 0);
    while (node && flx_node_n_generating(node)) usleep(10000);
    flx_node_service_shutdown(svc);
    flx_rpc_server_destroy(srv, 1000);
    flx_metrics_http_stop(http);
    flx_node_service_destroy(svc);
    flx_node_destroy(node);
    if (rc == 0)
        flx_log_info("daemon", "stopped");
    return rc;
}
