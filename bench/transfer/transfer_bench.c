/*
 * transfer_bench - the KV transfer of a prefill node to this decode node over UCX, against
 * ucx_perftest on the same transport and message size, in the same run.
 *
 *   transfer_bench --prefill FLX_PREFILL [--tls shm,tcp] [--tokens 16384] [--layers 8] [--reps 3]
 *                  [--max-chunk-mib 16] [--long-tokens 131072] [--long-layers 32] [--csv FILE] [--dir DIR]
 *   (transfer_bench --help: the options, flx/cli.h's convention; a missing flx-prefill, ucx_perftest,
 *   scratch folder or CSV file is refused before the first session, exit 1)
 *
 * For each transport (shm: UCX_TLS=sm,tcp and error mode none; tcp: UCX_TLS=tcp on lo and error
 * mode peer), reps rounds of, in rotated order:
 *   perftest   ucx_perftest -t ucp_am_bw with our chunk size as message size and our 104-byte header
 *              (-H 104), error handling (-e) where ours has it, as many iterations as our session has
 *              chunks: its overall bandwidth. It sends every message from one buffer into one buffer,
 *              so where the last-level cache holds both (16 MiB chunks; the AMX Xeon VM has 480 MiB of
 *              L3) it measures a copy between caches, while a session's chunks are distinct memory;
 *   perftest-session  the same with the session's bytes as one message (at most 1 GiB; two
 *              iterations after one warm-up): a working set as large as the session's, read from and
 *              written to memory as ours is; its ratio is printed beside the first one's;
 *   perftest-cold  perftest as the first row but without its warm-up iterations (-w 0): a new
 *              connection moving one session's bytes from its first message, as each flx-prefill
 *              process below does (perftest's own figure excludes its 4 warm-up messages, and over
 *              TCP a new connection's first tens of MiB are the slow ones); its ratio is the third;
 *   flx        this process's node (flx/transport.h) receiving a Llama-3.1-8B-shaped synthetic session
 *              (tokens, layers) from an flx-prefill process that computed it first (--pregenerate):
 *              KV bytes / (last byte landed - first byte claimed), every payload hash checked and
 *              every pyramid built on the node, as in production;
 *   flx-nohash the same without payload hashes (the node's require_payload_hash 0): what hashing costs.
 * Ratios are per pair (flx / perftest of the same round); the table shows median and range. "Last
 * byte to READY" is the node's t_ready - t_last_byte, per GB of the session; SUMMARY's
 * ready_ms_per_gb is the 128K session's when it runs (on a small session fixed wake-up costs weigh
 * on a per-GB figure; ready_ms_per_gb_small reports the rounds' sessions).
 * Then one session at long_tokens (128K) end to end, streamed while the stub computes it (synthetic
 * workload with statistics), with as many of the 32 layers as MemAvailable allows (said when fewer).
 *
 * SUMMARY transfer_vs_perftest_shm=... transfer_vs_perftest_tcp=... ready_ms_per_gb=... (the issue's keys:
 * perftest at our message size) ... transfer_vs_perftest_session_{shm,tcp}=... (against perftest-session)
 * transfer_vs_perftest_cold_{shm,tcp}=... (against perftest-cold)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/bench_stats.h"
#include "flx/cli.h"
#include "flx/log.h"
#include "flx/transport.h"
#include "flx/util.h"

#define NL 32
#define MAX_REPS 1000
#define HQ 32
#define HKV 8
#define HD 128

static const char *prefill;
static FILE *csv;

static void die(const char *what)
{
    fprintf(stderr, "transfer_bench: %s: %s\n", what, flx_error_msg());
    exit(1);
}

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) {
        perror("free port");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

static pid_t spawn(char *const argv[], const char *out)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        FILE *f = freopen(out, "w", stdout);
        if (f) dup2(fileno(f), 2);
        for (int i = 3; i < 1024; i++) close(i); /* not the node's UCX descriptors */
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static int reap(pid_t pid)
{
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *path)
{
    char *buf = NULL;
    size_t len;
    if (flx_cli_read_file(path, 1 << 20, &buf, &len)) return NULL;
    return buf;
}

/* ucx_perftest ucp_am_bw: overall bandwidth in bytes/s, or NaN. */
static double perftest(const char *tls, uint64_t msg, uint32_t iters, uint32_t warmup, const char *dir)
{
    char port[16], size[32], n[16], wu[16], srv_out[600], cli_out[600];
    snprintf(port, sizeof port, "%u", free_port());
    snprintf(size, sizeof size, "%" PRIu64, msg);
    snprintf(n, sizeof n, "%u", iters);
    snprintf(wu, sizeof wu, "%u", warmup);
    snprintf(srv_out, sizeof srv_out, "%s/perftest-server.txt", dir);
    snprintf(cli_out, sizeof cli_out, "%s/perftest-client.txt", dir);
    const int peer = !strcmp(tls, "tcp");
    char *srv[] = {"ucx_perftest", "-t", "ucp_am_bw", "-s", size, "-n", n, "-w", wu, "-H", "104", "-p", port, "-f",
                   peer ? "-e" : NULL, NULL};
    char *cli[] = {"ucx_perftest", "127.0.0.1", "-t", "ucp_am_bw", "-s", size, "-n", n, "-w", wu, "-H", "104", "-p",
                   port, "-f", peer ? "-e" : NULL, NULL};
    pid_t s = spawn(srv, srv_out);
    usleep(300000);
    pid_t c = spawn(cli, cli_out);
    int rc_c = reap(c), rc_s = reap(s);
    char *out = slurp(cli_out);
    double mbps = NAN;
    /* the -f line: iterations, 3 overheads (usec), 2 bandwidths (MB/s), 2 message rates */
    for (char *line = out ? strtok(out, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        double v[8];
        if (sscanf(line, " %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) ==
                8 &&
            v[0] == iters)
            mbps = v[5];
    }
    if (rc_c || rc_s || isnan(mbps)) fprintf(stderr, "transfer_bench: ucx_perftest (%s) failed (%d, %d): %s\n", tls,
                                             rc_c, rc_s, out ? out : "");
    free(out);
    return mbps * 1048576.0; /* perftest's MB is 2^20 bytes */
}

typedef struct run {
    double gbps;          /* KV GB/s, first byte claimed to last byte landed */
    double ready_ms;      /* last byte to READY */
    double total_s;       /* open to READY */
    uint64_t bytes;
} run_t;

/* One session of (tokens, layers) pushed by flx-prefill into node; returns its figures. */
static run_t flx_run(flx_tp_node_h node, flx_kv_store_h store, const char *tls, uint32_t tokens, uint32_t layers,
                     uint32_t chunk_mib, int pregenerate, int hash, const char *dir)
{
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    flx_tp_open_params_t op = {.field_mask = FLX_TP_OPEN_FIELD_TIMEOUT | FLX_TP_OPEN_FIELD_LEASE,
                               .n_layers = si.n_layers, .n_kv_heads = HKV, .n_q_heads = HQ, .head_dim = HD,
                               .vocab = 128256, .prompt_len = tokens, .max_new_tokens = 16, .timeout_ms = 3600000,
                               .lease_ms = 3600000};
    flx_tp_session_desc_t d;
    if (flx_tp_session_open(node, &op, &d)) die("session open");
    char nodes[300], sid[32], tok[40], len[16], mib[16], out[600];
    snprintf(nodes, sizeof nodes, "%s:%u", d.host, d.port);
    snprintf(sid, sizeof sid, "%#" PRIx64, d.sid);
    for (uint32_t i = 0; i < FLX_TP_TOKEN_BYTES; i++) sprintf(tok + 2 * i, "%02x", d.token[i]);
    snprintf(len, sizeof len, "%u", tokens);
    snprintf(mib, sizeof mib, "%u", chunk_mib);
    snprintf(out, sizeof out, "%s/flx-prefill.txt", dir);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)prefill;
    argv[n++] = "--node", argv[n++] = nodes, argv[n++] = "--session", argv[n++] = sid, argv[n++] = "--token";
    argv[n++] = tok, argv[n++] = "--synthetic", argv[n++] = "--prompt-len", argv[n++] = len;
    argv[n++] = "--max-chunk-mib", argv[n++] = mib, argv[n++] = "--err-mode";
    argv[n++] = !strcmp(tls, "tcp") ? "peer" : "none";
    argv[n++] = "--progress-ms", argv[n++] = "10000", argv[n++] = "--timeout-ms", argv[n++] = "3600000";
    if (pregenerate) argv[n++] = "--pregenerate";
    if (!hash) argv[n++] = "--no-payload-hash";
    argv[n] = NULL;
    const uint64_t t0 = flx_now_ns();
    pid_t pid = spawn(argv, out);
    int rc = reap(pid);
    flx_tp_session_info_t info;
    flx_status_t st = flx_tp_session_wait(node, d.sid, 60000, &info);
    if (rc || st || info.kv.state != FLX_KV_READY) {
        char *o = slurp(out);
        fprintf(stderr, "transfer_bench: flx-prefill -> %d, session %s (%s)\n%s", rc,
                st ? flx_error_msg() : flx_kv_state_name(info.kv.state), info.kv.fail_reason, o ? o : "");
        free(o);
        exit(1);
    }
    run_t r = {.bytes = info.kv.bytes_expected};
    r.gbps = (double)info.kv.bytes_expected / (double)(info.t_last_data_ns - info.kv.t_first_byte_ns);
    r.ready_ms = (double)(info.kv.t_ready_ns - info.t_last_data_ns) / 1e6;
    r.total_s = (double)(info.kv.t_ready_ns - t0) / 1e9;
    flx_tp_session_close(node, d.sid);
    return r;
}

static flx_kv_store_h make_store(uint32_t layers, size_t capacity)
{
    flx_kv_store_params_t kp = {.field_mask = FLX_KV_STORE_FIELD_CAPACITY | FLX_KV_STORE_FIELD_SHAPE |
                                              FLX_KV_STORE_FIELD_FLAGS,
                                .capacity_bytes = capacity, .n_layers = layers, .n_kv_heads = HKV, .n_q_heads = HQ,
                                .head_dim = HD, .flags = FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PREFAULT}; /* a serving node faults its arena in at start */
    flx_kv_store_h s;
    if (flx_kv_store_create(&kp, &s)) die("kv store");
    return s;
}

static flx_tp_node_h make_node(flx_kv_store_h store, const char *tls, int hash)
{
    if (!strcmp(tls, "tcp")) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
    } else {
        setenv("UCX_TLS", "sm,tcp", 1);
        unsetenv("UCX_NET_DEVICES");
    }
    /* liveness 60 s: the stub computes the synthetic layers for many seconds on a shared machine */
    flx_tp_node_params_t np = {.field_mask = FLX_TP_NODE_FIELD_ERR_MODE | FLX_TP_NODE_FIELD_CHECKSUM |
                                             FLX_TP_NODE_FIELD_LIVENESS,
                               .store = store, .err_mode = !strcmp(tls, "tcp") ? FLX_TP_ERR_PEER : FLX_TP_ERR_NONE,
                               .require_payload_hash = hash, .liveness_ms = 60000};
    flx_tp_node_h node;
    if (flx_tp_node_create(&np, &node)) die("transport node");
    return node;
}

/* name found as an executable in one of PATH's folders (as execvp will look for it). */
static int in_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[4096];
    for (const char *p = path ? path : ""; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)len, len ? p : ".", name);
        if (!access(dir, X_OK)) return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *tls_s = NULL, *csv_path = NULL, *dir = "/tmp";
    uint64_t tokens = 16384, layers = 8, reps = 3, chunk_mib = 16, long_tokens = 131072, long_layers = NL;
    flx_cli_opt_t opts[] = {
        FLX_CLI_PATH(0, "prefill", "FLX_PREFILL", &prefill, FLX_CLI_REQUIRED, "the flx-prefill binary that pushes the "
                     "sessions"),
        FLX_CLI_STR(0, "tls", "T,T", &tls_s, 0, "transports, each of shm and tcp at most once (default shm,tcp)"),
        FLX_CLI_UINT(0, "tokens", "N", &tokens, 512, 1u << 21, 0, "tokens of each round's session (default 16384)"),
        FLX_CLI_UINT(0, "layers", "N", &layers, 1, NL, 0, "layers of each round's session (default 8)"),
        FLX_CLI_UINT(0, "reps", "N", &reps, 1, MAX_REPS, 0, "rounds per transport (default 3)"),
        FLX_CLI_UINT(0, "max-chunk-mib", "N", &chunk_mib, 1, 4096, 0, "largest chunk flx-prefill sends, MiB "
                     "(default 16)"),
        FLX_CLI_UINT(0, "long-tokens", "N", &long_tokens, 512, 1u << 21, 0, "tokens of the end-to-end session "
                     "(default 131072)"),
        FLX_CLI_UINT(0, "long-layers", "N", &long_layers, 0, NL, 0, "its layers, fewer when MemAvailable is short "
                     "(default 32; 0 skips it)"),
        FLX_CLI_PATH(0, "csv", "FILE", &csv_path, 0, "CSV written (default: none)"),
        FLX_CLI_PATH(0, "dir", "DIR", &dir, 0, "scratch folder for the child processes' output (default /tmp)"),
    };
    flx_cli_t cli = FLX_CLI_INIT("transfer_bench", "KV transfer flx-prefill -> this node over UCX against "
                                 "ucx_perftest on the same transport and message size, shm and TCP; last byte to "
                                 "READY; a 128K session end to end.", opts);
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    static const char *const TLS[] = {"shm", "tcp", NULL};
    int tls_ix[2] = {0, 1};
    uint32_t n_tls = 2;
    if (tls_s && flx_cli_enum_list("tls", tls_s, TLS, tls_ix, 2, &n_tls)) return flx_cli_usage_error(&cli, NULL);
    if (flx_cli_applies(&cli, long_layers > 0, "with --long-layers 0", "long-tokens", NULL))
        return flx_cli_usage_error(&cli, NULL);
    /* what cannot work, refused before the first session */
    if (access(prefill, X_OK)) return flx_cli_fail(&cli, "--prefill: %s: %s", prefill, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode) || access(dir, W_OK | X_OK))
        return flx_cli_fail(&cli, "--dir: %s is not a writable folder", dir);
    if (!in_path("ucx_perftest"))
        return flx_cli_fail(&cli, "ucx_perftest is not in PATH (Debian ucx-utils; scripts/setup.sh installs it)");
    if (csv_path && !(csv = fopen(csv_path, "w"))) return flx_cli_fail(&cli, "--csv: cannot create %s: %s", csv_path,
                                                                        strerror(errno));
    flx_log_set_level(FLX_LOG_ERROR);
    if (csv) fprintf(csv, "transport,rep,kind,bytes,msg_bytes,gbps,ready_ms,ready_ms_per_gb,total_s,layers,tokens\n");

    /* The chunk the planner cuts (and so the perftest message): host parts of whole heads up to the cap. */
    flx_tp_welcome_t w = {.n_layers = (uint32_t)layers, .n_kv_heads = HKV, .n_q_heads = HQ, .head_dim = HD,
                          .prompt_len = (uint32_t)tokens, .n_sink = 64, .n_local = 256, .heartbeat_ms = 1};
    flx_tp_plan_chunk_t plan[4096];
    const uint32_t n_plan = flx_tp_plan_layer(&w, 0, chunk_mib << 20, plan, 4096);
    const uint64_t msg = flx_kv_chunk_bytes(&plan[0].chunk);
    uint32_t n_rndv = 0;
    for (uint32_t i = 0; i < n_plan && i < 4096; i++) n_rndv += plan[i].send_flags == FLX_TP_SEND_RNDV;
    const uint64_t session_bytes = 4ull * HKV * HD * tokens * layers;
    printf("KV transfer, Llama-3.1-8B shape (%u kv heads x %u dims, bf16), %" PRIu64 " tokens x %" PRIu64
           " layers = %.1f MiB per session; chunks of %.2f MiB (%u rendezvous per layer), %" PRIu64 " rounds\n",
           HKV, HD, tokens, layers, session_bytes / 1048576.0, msg / 1048576.0, n_rndv, reps);
    const uint64_t big = session_bytes < (1ull << 30) ? session_bytes : (1ull << 30);   /* perftest-session */
    printf("%-5s %-16s %10s %10s %10s %12s %12s %12s\n", "tls", "kind", "GB/s med", "min", "max", "vs perftest",
           "vs -session", "vs -cold");

    double sum_ratio[2] = {NAN, NAN}, ses_ratio[2] = {NAN, NAN}, cold_ratio[2] = {NAN, NAN}, ready_per_gb_all[64];
    int n_ready = 0;
    for (uint32_t k = 0; k < n_tls; k++) {
        const int ti = tls_ix[k];
        const char *tls = TLS[ti];
        flx_kv_store_h store = make_store((uint32_t)layers, (size_t)(session_bytes * 1.25) + (256u << 20));
        flx_tp_node_h node[2] = {make_node(store, tls, 1), make_node(store, tls, 0)}; /* hashes required, not */
        double pt[MAX_REPS], ps[MAX_REPS], fx[MAX_REPS], fn[MAX_REPS], r_hash[MAX_REPS], r_nohash[MAX_REPS];
        double s_hash[MAX_REPS], s_nohash[MAX_REPS], pc[MAX_REPS], c_hash[MAX_REPS], c_nohash[MAX_REPS];
        const uint32_t n_msgs = (uint32_t)(session_bytes / msg);
        for (uint64_t r = 0; r < reps; r++) {
            run_t a, b;
            double p, q, c;
            /* rotated order: the perftests first on even rounds, ours first on odd ones */
            if (r % 2 == 0) {
                p = perftest(tls, msg, n_msgs, 4, dir);
                q = perftest(tls, big, 2, 1, dir);
                c = perftest(tls, msg, n_msgs, 0, dir);
            }
            a = flx_run(node[0], store, tls, (uint32_t)tokens, (uint32_t)layers, (uint32_t)chunk_mib, 1, 1, dir);
            b = flx_run(node[1], store, tls, (uint32_t)tokens, (uint32_t)layers, (uint32_t)chunk_mib, 1, 0, dir);
            if (r % 2 == 1) {
                c = perftest(tls, msg, n_msgs, 0, dir);
                q = perftest(tls, big, 2, 1, dir);
                p = perftest(tls, msg, n_msgs, 4, dir);
            }
            pt[r] = p / 1e9;
            ps[r] = q / 1e9;
            pc[r] = c / 1e9;
            c_hash[r] = a.gbps / pc[r];
            c_nohash[r] = b.gbps / pc[r];
            fx[r] = a.gbps;
            fn[r] = b.gbps;
            r_hash[r] = a.gbps / pt[r];
            r_nohash[r] = b.gbps / pt[r];
            s_hash[r] = a.gbps / ps[r];
            s_nohash[r] = b.gbps / ps[r];
            ready_per_gb_all[n_ready++ % 64] = a.ready_ms / (a.bytes / 1e9);
            if (csv) {
                fprintf(csv, "%s,%" PRIu64 ",perftest,%" PRIu64 ",%" PRIu64 ",%.4f,,,,%" PRIu64 ",%" PRIu64 "\n", tls, r,
                        session_bytes, msg, pt[r], layers, tokens);
                fprintf(csv, "%s,%" PRIu64 ",perftest-session,%" PRIu64 ",%" PRIu64 ",%.4f,,,,%" PRIu64 ",%" PRIu64 "\n",
                        tls, r, 2 * big, big, ps[r], layers, tokens);
                fprintf(csv, "%s,%" PRIu64 ",perftest-cold,%" PRIu64 ",%" PRIu64 ",%.4f,,,,%" PRIu64 ",%" PRIu64 "\n", tls,
                        r, session_bytes, msg, pc[r], layers, tokens);
                fprintf(csv, "%s,%" PRIu64 ",flx,%" PRIu64 ",%" PRIu64 ",%.4f,%.3f,%.3f,%.3f,%" PRIu64 ",%" PRIu64 "\n",
                        tls, r, a.bytes, msg, a.gbps, a.ready_ms, a.ready_ms / (a.bytes / 1e9), a.total_s, layers,
                        tokens);
                fprintf(csv, "%s,%" PRIu64 ",flx-nohash,%" PRIu64 ",%" PRIu64 ",%.4f,%.3f,%.3f,%.3f,%" PRIu64
                             ",%" PRIu64 "\n",
                        tls, r, b.bytes, msg, b.gbps, b.ready_ms, b.ready_ms / (b.bytes / 1e9), b.total_s, layers,
                        tokens);
                fflush(csv);
            }
        }
        flx_tp_node_destroy(node[0]);
        flx_tp_node_destroy(node[1]);
        const int n = (int)reps;
        double lo_p = pt[0], hi_p = pt[0], lo_s = ps[0], hi_s = ps[0], lo_c = pc[0], hi_c = pc[0], lo_x = fx[0],
               hi_x = fx[0], lo_n = fn[0], hi_n = fn[0];
        for (int i = 1; i < n; i++) {
            lo_p = fmin(lo_p, pt[i]), hi_p = fmax(hi_p, pt[i]);
            lo_c = fmin(lo_c, pc[i]), hi_c = fmax(hi_c, pc[i]);
            lo_s = fmin(lo_s, ps[i]), hi_s = fmax(hi_s, ps[i]);
            lo_x = fmin(lo_x, fx[i]), hi_x = fmax(hi_x, fx[i]);
            lo_n = fmin(lo_n, fn[i]), hi_n = fmax(hi_n, fn[i]);
        }
        const double rh = flx_bench_median(r_hash, n), rn = flx_bench_median(r_nohash, n);
        const double sh = flx_bench_median(s_hash, n), sn = flx_bench_median(s_nohash, n);
        const double ch = flx_bench_median(c_hash, n), cn = flx_bench_median(c_nohash, n);
        printf("%-5s %-16s %10.3f %10.3f %10.3f %12s %12s %12s\n", tls, "perftest", flx_bench_median(pt, n), lo_p, hi_p,
               "1", "", "");
        printf("%-5s %-16s %10.3f %10.3f %10.3f %12s %12s %12s\n", tls, "perftest-session", flx_bench_median(ps, n),
               lo_s, hi_s, "", "1", "");
        printf("%-5s %-16s %10.3f %10.3f %10.3f %12s %12s %12s\n", tls, "perftest-cold", flx_bench_median(pc, n), lo_c,
               hi_c, "", "", "1");
        printf("%-5s %-16s %10.3f %10.3f %10.3f %12.3f %12.3f %12.3f\n", tls, "flx", flx_bench_median(fx, n), lo_x, hi_x,
               rh, sh, ch);
        printf("%-5s %-16s %10.3f %10.3f %10.3f %12.3f %12.3f %12.3f\n", tls, "flx-nohash", flx_bench_median(fn, n), lo_n,
               hi_n, rn, sn, cn);
        sum_ratio[ti] = rh;
        ses_ratio[ti] = sh;
        cold_ratio[ti] = ch;
        flx_kv_store_destroy(store);
    }
    const double ready_ms_per_gb = flx_bench_median(ready_per_gb_all, FLX_MIN(n_ready, 64));
    printf("last byte to READY: %.2f ms per GB (median over the flx sessions)\n", ready_ms_per_gb);

    /* A 128K session end to end: streamed while the stub computes it, statistics included. */
    double long_ready_s = NAN, long_gbps = NAN, long_ready_ms_per_gb = NAN;
    uint32_t used_layers = (uint32_t)long_layers;
    if (long_layers) {
        const uint64_t per_layer = 4ull * HKV * HD * long_tokens;
        const uint64_t avail = (uint64_t)FLX_MAX(flx_bench_mem_available_kb(), 0) * 1024;
        /* the node's session (KV + window, pyramid and side tables: within 20 %), the stub's source arrays
         * and two packed layers, 1 GiB slack */
        while (used_layers > 1 && per_layer * used_layers * 120 / 100 + 4 * per_layer + (1ull << 30) > avail)
            used_layers--;
        const char *shm = tls_ix[0] == 0 || tls_ix[n_tls - 1] == 0 ? "shm" : "tcp";   /* shm when listed */
        printf("%s session: %" PRIu64 " tokens x %u of %" PRIu64 " layers (%.1f GiB of KV)%s; MemAvailable %.1f GiB\n",
               shm, long_tokens, used_layers, long_layers, per_layer * used_layers / 1073741824.0,
               used_layers < long_layers ? ": FEWER LAYERS THAN ASKED, MemAvailable is short" : "",
               avail / 1073741824.0);
        flx_kv_store_h store = make_store(used_layers, per_layer * used_layers * 12 / 10 + (256u << 20));
        flx_tp_node_h node = make_node(store, shm, 1);
        run_t r = flx_run(node, store, shm, (uint32_t)long_tokens, used_layers, (uint32_t)chunk_mib, 0, 1, dir);
        long_ready_s = r.total_s;
        long_gbps = r.gbps;
        long_ready_ms_per_gb = r.ready_ms / (r.bytes / 1e9);
        printf("  open to READY %.2f s (the stub computing the synthetic layers and their statistics while it\n"
               "  pushes: %.3f GB/s of KV over the whole transfer), last byte to READY %.2f ms (%.2f ms per GB)\n",
               r.total_s, r.gbps, r.ready_ms, long_ready_ms_per_gb);
        if (csv)
            fprintf(csv, "%s,0,long,%" PRIu64 ",%" PRIu64 ",%.4f,%.3f,%.3f,%.3f,%u,%" PRIu64 "\n", shm, r.bytes, msg,
                    r.gbps, r.ready_ms, long_ready_ms_per_gb, r.total_s, used_layers, long_tokens);
        flx_tp_node_destroy(node);
        flx_kv_store_destroy(store);
    }
    if (csv) fclose(csv);
    /* The per-GB figure of the long session when it ran (fixed wake-up costs weigh on small sessions'
     * per-GB figure: both are printed above), else that of the rounds' sessions. */
    printf("SUMMARY transfer_vs_perftest_shm=%.3f transfer_vs_perftest_tcp=%.3f ready_ms_per_gb=%.2f "
           "ready_ms_per_gb_small=%.2f long_tokens=%" PRIu64 " long_layers=%u long_open_to_ready_s=%.2f "
           "transfer_vs_perftest_session_shm=%.3f transfer_vs_perftest_session_tcp=%.3f "
           "transfer_vs_perftest_cold_shm=%.3f transfer_vs_perftest_cold_tcp=%.3f\n",
           sum_ratio[0], sum_ratio[1], long_layers ? long_ready_ms_per_gb : ready_ms_per_gb, ready_ms_per_gb,
           long_tokens, used_layers, long_ready_s, ses_ratio[0], ses_ratio[1], cold_ratio[0], cold_ratio[1]);
    (void)long_gbps;
    return 0;
}
