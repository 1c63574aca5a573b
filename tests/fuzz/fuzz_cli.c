/*
 * fuzz_cli - a command line made of the fuzzer's bytes through flx_cli_parse, the parser behind
 * every tool's flx_cli_main, against a table holding every kind of option (flag, string, path,
 * integer, optional integer, float with open and closed ends, enum, repeatable) and positionals;
 * then the checks between options, the help text and the list parsers (flx_cli_u64_list,
 * flx_cli_range_list, flx_cli_enum_list, flx_cli_id_list, flx_cli_hex_list) on each of the same words.
 *
 * Input: words separated by NUL bytes (at most 48; argv[0] is "fuzz"). Properties checked (a
 * broken one aborts, which libFuzzer reports): an accepted line writes each destination inside its
 * declared range or choices and every string points at one of the words; a refused line writes
 * nothing and leaves a non-empty one-line message; parsing the same words twice gives the same
 * outcome.
 */
#include "fuzz_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "flx/cli.h"
#include "flx/log.h"

#define MAX_WORDS 48

typedef struct dst {
    const char *model, *prompt, *list[3], *in, *out;
    uint64_t n, gpu;
    double p, t;
    int flag, mode;
    uint32_t n_list;
} dst_t;

static const char *const modes[] = {"full", "fixed", "fluxion", NULL};

static void table(dst_t *d, flx_cli_opt_t *o, flx_cli_pos_t *p)
{
    const flx_cli_opt_t opts[] = {
        FLX_CLI_PATH('m', "model", "PATH", &d->model, FLX_CLI_REQUIRED, "model"),
        FLX_CLI_STR('p', "prompt", "TEXT", &d->prompt, 0, "prompt"),
        FLX_CLI_LIST('d', "data", "FILE", d->list, 3, &d->n_list, 0, "data"),
        FLX_CLI_UINT('n', "max-new", "N", &d->n, 1, 1000000, 0, "count"),
        FLX_CLI_UINT(0, "gpu", "DEV", &d->gpu, 0, 7, FLX_CLI_OPTIONAL, "device"),
        FLX_CLI_FLOAT(0, "top-p", "P", &d->p, 0.0, 1.0, FLX_CLI_LO_OPEN, "mass"),
        FLX_CLI_FLOAT('T', "temp", "T", &d->t, -2.0, 2.0, FLX_CLI_HI_OPEN, "temperature"),
        FLX_CLI_FLAG('c', "chat", &d->flag, "flag"),
        FLX_CLI_ENUM(0, "mode", &d->mode, modes, 0, "mode"),
    };
    const flx_cli_pos_t pos[] = {FLX_CLI_ARG("IN", &d->in, "in"), FLX_CLI_ARG_OPT("OUT", &d->out, "out")};
    memcpy(o, opts, sizeof opts);
    memcpy(p, pos, sizeof pos);
}

static void sentinels(dst_t *d)
{
    static const char unset[] = "unset";
    d->model = d->prompt = d->in = d->out = d->list[0] = d->list[1] = d->list[2] = unset;
    d->n = d->gpu = 999;
    d->p = d->t = 999.0;
    d->flag = d->mode = 999;
    d->n_list = 999;
}

static int is_word(const char *s, char *const *argv, int argc)
{
    for (int i = 1; i < argc; i++)
        if (s >= argv[i] && s <= argv[i] + strlen(argv[i])) return 1;
    return 0;
}

static flx_status_t parse(char *const *argv, int argc, dst_t *d, flx_cli_t *cli, flx_cli_opt_t *o, flx_cli_pos_t *p,
                          flx_cli_action_t *act)
{
    table(d, o, p);
    sentinels(d);
    *cli = (flx_cli_t){.prog = "fuzz", .summary = "fuzz", .opts = o, .n_opts = 9, .pos = p, .n_pos = 2, .progress = 1};
    return flx_cli_parse(cli, argc, argv, act);
}

FUZZ_QUIET_INIT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1), *argv[MAX_WORDS + 2];
    FUZZ_CHECK(buf);
    memcpy(buf, data, size);
    buf[size] = '\0';
    int argc = 0;
    argv[argc++] = "fuzz";
    for (size_t i = 0; i <= size && argc <= MAX_WORDS; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    argv[argc] = NULL;

    dst_t d, d2;
    flx_cli_opt_t o[9], o2[9];
    flx_cli_pos_t p[2], p2[2];
    flx_cli_t cli, cli2;
    flx_cli_action_t act = FLX_CLI_RUN, act2 = FLX_CLI_RUN;
    flx_status_t st = parse(argv, argc, &d, &cli, o, p, &act);
    char msg[FLX_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", flx_error_msg());
    flx_status_t st2 = parse(argv, argc, &d2, &cli2, o2, p2, &act2);
    FUZZ_CHECK(st == st2 && (st != FLX_OK || act == act2));
    FUZZ_CHECK(st == FLX_OK || !strcmp(msg, flx_error_msg()));
    if (st != FLX_OK || act != FLX_CLI_RUN) {
        dst_t s;
        sentinels(&s);
        FUZZ_CHECK(st == FLX_OK || st == FLX_ERR_INVALID);
        FUZZ_CHECK(st == FLX_OK || (msg[0] && !strchr(msg, '\n')));
        FUZZ_CHECK(!strcmp(d.model, s.model) && !strcmp(d.prompt, s.prompt) && !strcmp(d.in, s.in) &&
                  !strcmp(d.out, s.out) && !strcmp(d.list[0], s.list[0]) && d.n == s.n && d.gpu == s.gpu &&
                  d.p == s.p && d.t == s.t && d.flag == s.flag && d.mode == s.mode && d.n_list == s.n_list);
    } else {
        FUZZ_CHECK(is_word(d.model, argv, argc) && d.model[0]);
        FUZZ_CHECK(is_word(d.in, argv, argc));
        FUZZ_CHECK(!strcmp(d.out, "unset") || is_word(d.out, argv, argc));
        FUZZ_CHECK(!strcmp(d.prompt, "unset") || is_word(d.prompt, argv, argc));
        FUZZ_CHECK(d.n == 999 || (d.n >= 1 && d.n <= 1000000));
        FUZZ_CHECK(d.gpu == 999 || d.gpu <= 7);
        FUZZ_CHECK(d.p == 999.0 || (isfinite(d.p) && d.p > 0.0 && d.p <= 1.0));
        FUZZ_CHECK(d.t == 999.0 || (isfinite(d.t) && d.t >= -2.0 && d.t < 2.0));
        FUZZ_CHECK(d.flag == 999 || d.flag == 1);
        FUZZ_CHECK(d.mode == 999 || (d.mode >= 0 && d.mode <= 2));
        FUZZ_CHECK((d.n_list == 999) == (flx_cli_given(&cli, "data") == 0));
        for (uint32_t i = 0; d.n_list != 999 && i < d.n_list; i++)
            FUZZ_CHECK(d.n_list <= 3 && is_word(d.list[i], argv, argc));
        FUZZ_CHECK(flx_cli_given(&cli, "model") >= 1);
        flx_status_t e = flx_cli_exclusive(&cli, "prompt", "data", 0);
        FUZZ_CHECK((e != FLX_OK) == (flx_cli_given(&cli, "prompt") && flx_cli_given(&cli, "data")));
        e = flx_cli_applies(&cli, 0, "in this mode", "chat", "top-p", NULL);
        FUZZ_CHECK((e != FLX_OK) == (flx_cli_given(&cli, "chat") || flx_cli_given(&cli, "top-p")));
    }
    FILE *sink = fopen("/dev/null", "w");
    if (sink) {
        flx_cli_help(&cli, sink);
        flx_cli_version(&cli, sink);
        fclose(sink);
    }
    /* the list-valued options' parsers on every word: a refused list writes nothing */
    static const char *const kinds[] = {"shm", "tcp", "rdma", NULL};
    for (int i = 1; i < argc; i++) {
        uint64_t a[8], b[8];
        int e[3];
        uint32_t n = 77;
        for (int k = 0; k < 8; k++) a[k] = b[k] = 777;
        if (flx_cli_u64_list("lens", argv[i], 1, UINT32_MAX, a, 8, &n) == FLX_OK) {
            FUZZ_CHECK(n >= 1 && n <= 8);
            for (uint32_t k = 0; k < n; k++) FUZZ_CHECK(a[k] >= 1 && a[k] <= UINT32_MAX);
        } else {
            FUZZ_CHECK(n == 77 && a[0] == 777 && strstr(flx_error_msg(), "--lens '"));
        }
        n = 77, a[0] = 777;
        if (flx_cli_range_list("mixed", argv[i], 1024, 1u << 20, a, b, 8, &n) == FLX_OK) {
            FUZZ_CHECK(n >= 1 && n <= 8);
            for (uint32_t k = 0; k < n; k++) FUZZ_CHECK(a[k] >= 1024 && a[k] <= b[k] && b[k] <= (1u << 20));
        } else {
            FUZZ_CHECK(n == 77 && a[0] == 777 && b[0] == 777 && strstr(flx_error_msg(), "--mixed '"));
        }
        n = 77, e[0] = 777;
        if (flx_cli_enum_list("tls", argv[i], kinds, e, 3, &n) == FLX_OK) {
            FUZZ_CHECK(n >= 1 && n <= 3);
            for (uint32_t k = 0; k < n; k++) {
                FUZZ_CHECK(e[k] >= 0 && e[k] <= 2);
                for (uint32_t j = 0; j < k; j++) FUZZ_CHECK(e[j] != e[k]);
            }
        } else {
            FUZZ_CHECK(n == 77 && e[0] == 777 && strstr(flx_error_msg(), "--tls '"));
        }
        n = 77, a[0] = 777;
        if (flx_cli_id_list("session", argv[i], a, 8, &n) == FLX_OK) {
            FUZZ_CHECK(n >= 1 && n <= 8);
            for (uint32_t k = 0; k < n; k++) {
                FUZZ_CHECK(a[k] != 0);
                for (uint32_t j = 0; j < k; j++) FUZZ_CHECK(a[j] != a[k]);
            }
        } else {
            FUZZ_CHECK(n == 77 && a[0] == 777 && strstr(flx_error_msg(), "--session '"));
        }
        uint8_t h[4 * 3];
        memset(h, 0x77, sizeof h);
        n = 77;
        if (flx_cli_hex_list("token", argv[i], 3, h, 4, &n) == FLX_OK) {
            /* every item is 6 hex digits and comes back as its 3 bytes */
            FUZZ_CHECK(n >= 1 && n <= 4 && strlen(argv[i]) == 7 * n - 1);
            for (uint32_t k = 0; k < n; k++) {
                char back[7];
                snprintf(back, sizeof back, "%02x%02x%02x", h[3 * k], h[3 * k + 1], h[3 * k + 2]);
                FUZZ_CHECK(strncasecmp(back, argv[i] + 7 * k, 6) == 0);
            }
        } else {
            FUZZ_CHECK(n == 77 && h[0] == 0x77 && strstr(flx_error_msg(), "--token '"));
        }
    }
    free(buf);
    return 0;
}
