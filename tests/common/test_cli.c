/*
 * test_cli.c - the command-line parser (flx/cli.h) on its own: exact long names (a prefix is never
 * taken), value forms, short options, "--", every value kind with its refusals and their messages,
 * nothing written on a refusal, repeatable and optional-value options, help and version, the
 * checks between options, the environment check (FLX_ISA, FLX_LOG) and the progress meter.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/cli.h"
#include "flx/progress.h"
#include "flx_test.h"

/* The destinations of the test table, reset to sentinels before each parse. */
static const char *g_model, *g_prompt, *g_pfile, *g_data[3], *g_in, *g_out;
static uint64_t g_n, g_gpu, g_seed;
static double g_p, g_temp;
static int g_chat, g_mode;
static uint32_t g_n_data;
static const char *const g_modes[] = {"full", "fixed", "fluxion", NULL};

static flx_cli_opt_t g_opts[] = {
    FLX_CLI_PATH('m', "model", "PATH", &g_model, FLX_CLI_REQUIRED, "the model"),
    FLX_CLI_STR('p', "prompt", "TEXT", &g_prompt, 0, "inline prompt"),
    FLX_CLI_PATH('f', "prompt-file", "FILE", &g_pfile, 0, "prompt file"),
    FLX_CLI_UINT('n', "max-new", "N", &g_n, 1, 1000, 0, "tokens"),
    FLX_CLI_UINT(0, "gpu", "DEVICE", &g_gpu, 0, 7, FLX_CLI_OPTIONAL, "device"),
    FLX_CLI_UINT('s', "seed", "S", &g_seed, 0, UINT64_MAX, 0, "seed"),
    FLX_CLI_FLOAT(0, "top-p", "P", &g_p, 0.0, 1.0, FLX_CLI_LO_OPEN, "nucleus"),
    FLX_CLI_FLOAT(0, "temp", "T", &g_temp, -2.0, 2.0, 0, "temperature\nsecond line"),
    FLX_CLI_FLAG(0, "chat", &g_chat, "chat template"),
    FLX_CLI_ENUM(0, "mode", &g_mode, g_modes, 0, "attention"),
    FLX_CLI_LIST('d', "data", "FILE", g_data, 3, &g_n_data, 0, "datasets"),
};
static flx_cli_pos_t g_pos[] = {
    FLX_CLI_ARG("IN", &g_in, "input"),
    FLX_CLI_ARG_OPT("OUT", &g_out, "output"),
};

static void reset(void)
{
    g_model = g_prompt = g_pfile = g_in = g_out = "unset";
    g_data[0] = g_data[1] = g_data[2] = "unset";
    g_n = g_gpu = g_seed = 99;
    g_p = g_temp = 99.0;
    g_chat = g_mode = 99;
    g_n_data = 99;
}

static int unchanged(void)
{
    return !strcmp(g_model, "unset") && !strcmp(g_prompt, "unset") && !strcmp(g_pfile, "unset") &&
           !strcmp(g_in, "unset") && !strcmp(g_out, "unset") && !strcmp(g_data[0], "unset") && g_n == 99 &&
           g_gpu == 99 && g_seed == 99 && g_p == 99.0 && g_temp == 99.0 && g_chat == 99 && g_mode == 99 &&
           g_n_data == 99;
}

/* Splits a command line on spaces ("" for an empty word) and parses it. */
static flx_status_t parse_line(flx_cli_t *cli, const char *line, flx_cli_action_t *act)
{
    static char buf[1024];
    char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof buf, "%s", line);
    argv[argc++] = "prog";
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w && argc < 63; w = strtok_r(NULL, " ", &save))
        argv[argc++] = strcmp(w, "''") ? w : (char *)"";
    argv[argc] = NULL;
    reset();
    return flx_cli_parse(cli, argc, argv, act);
}

static flx_cli_t make_cli(void)
{
    flx_cli_t cli = FLX_CLI_INIT_POS("prog", "a test tool", g_opts, g_pos);
    return cli;
}

static void ok(const char *line)
{
    flx_cli_t cli = make_cli();
    flx_cli_action_t act;
    flx_status_t st = parse_line(&cli, line, &act);
    if (st) fprintf(stderr, "'%s' refused: %s\n", line, flx_error_msg());
    CHECK(st == FLX_OK && act == FLX_CLI_RUN);
}

/* The line is refused, nothing is written, and the message contains every needle. */
static void bad(const char *line, ...)
{
    flx_cli_t cli = make_cli();
    flx_cli_action_t act;
    flx_status_t st = parse_line(&cli, line, &act);
    fprintf(stderr, "  '%s' -> %s\n", line, st ? flx_error_msg() : "accepted");
    CHECK(st == FLX_ERR_INVALID);
    CHECK(unchanged());
    va_list ap;
    va_start(ap, line);
    for (const char *n; (n = va_arg(ap, const char *));) CHECK(strstr(flx_error_msg(), n));
    va_end(ap);
    CHECK(!strchr(flx_error_msg(), '\n'));
}

static void test_names_and_forms(void)
{
    ok("-m M IN");
    CHECK(!strcmp(g_model, "M") && !strcmp(g_in, "IN") && !strcmp(g_out, "unset") && g_n == 99);
    /* --prompt and --prompt-file are two options; neither is a prefix match of the other */
    ok("--model M --prompt What IN");
    CHECK(!strcmp(g_prompt, "What") && !strcmp(g_pfile, "unset"));
    ok("--model M --prompt-file F IN");
    CHECK(!strcmp(g_pfile, "F") && !strcmp(g_prompt, "unset"));
    bad("--model M --prom X IN", "unknown option --prom", "--prompt", "--prompt-file", NULL);
    bad("--mod M IN", "unknown option --mod", "--model", "--mode", NULL);
    bad("-m M --max IN", "--max-new", NULL);
    bad("-m M --frobnicate IN", "unknown option --frobnicate", NULL);
    bad("-m M -x IN", "unknown option -x", NULL);
    /* --opt=value, --opt value, -o value, -ovalue; an '=' inside a value stays */
    ok("--model=a=b -n 5 --seed=7 IN OUT");
    CHECK(!strcmp(g_model, "a=b") && g_n == 5 && g_seed == 7 && !strcmp(g_out, "OUT"));
    ok("-mM -n12 -pHello IN");
    CHECK(!strcmp(g_model, "M") && g_n == 12 && !strcmp(g_prompt, "Hello"));
    ok("--prompt= -m M IN");
    CHECK(!strcmp(g_prompt, ""));
    /* the last value wins */
    ok("-m A --model B -n 3 -n 4 IN");
    CHECK(!strcmp(g_model, "B") && g_n == 4);
    /* "--" ends the options, "-" is an argument */
    ok("-m M -- --chat");
    CHECK(!strcmp(g_in, "--chat") && g_chat == 99);
    ok("-m M -");
    CHECK(!strcmp(g_in, "-"));
    /* values that look like options are refused; numbers starting with '-' are values */
    bad("--model --chat IN", "--model needs a value", "--chat", NULL);
    bad("-m M IN -n", "-n needs a value", NULL);
    bad("-m M IN --prompt -x", "--prompt needs a value", "--prompt=", NULL);
    ok("-m M --prompt=-x IN");
    CHECK(!strcmp(g_prompt, "-x"));
    ok("-m M --temp -1.5 IN");
    CHECK(g_temp == -1.5);
    ok("-m M --temp -.5 IN");
    CHECK(g_temp == -0.5);
    bad("-m M --chat=1 IN", "--chat takes no value", NULL);
    bad("-m M IN OUT extra", "unexpected argument 'extra'", NULL);
    bad("IN", "--model is required", NULL);
    bad("-m M", "missing argument IN", NULL);
    bad("-m '' IN", "-m needs a non-empty path", NULL);
    bad("--model= IN", "--model needs a non-empty path", NULL);
}

static void test_values(void)
{
    /* integers: digits only, in range, no wrap */
    ok("-m M -n 1 IN");
    CHECK(g_n == 1);
    ok("-m M -n 1000 IN");
    CHECK(g_n == 1000);
    ok("-m M -s 18446744073709551615 IN");
    CHECK(g_seed == UINT64_MAX);
    bad("-m M -n 0 IN", "-n '0' is not an integer in 1..1000", NULL);
    bad("-m M --max-new 1001 IN", "--max-new '1001'", NULL);
    bad("-m M -n 12x IN", "'12x'", NULL);
    bad("-m M -n +5 IN", "'+5'", NULL);
    bad("-m M -n -5 IN", "'-5'", NULL);
    bad("-m M -n 0x10 IN", "'0x10'", NULL);
    bad("-m M -n '' IN", "-n ''", NULL);
    bad("-m M -s 18446744073709551616 IN", "-s '18446744073709551616' is not an integer >= 0", NULL);
    bad("-m M -n 99999999999999999999999 IN", "-n", NULL);
    /* floats: finite, inside the interval with its open/closed ends */
    ok("-m M --top-p 1 IN");
    CHECK(g_p == 1.0);
    ok("-m M --top-p 1e-3 IN");
    CHECK(g_p == 1e-3);
    bad("-m M --top-p 0 IN", "--top-p '0' is not a number in (0, 1]", NULL);
    bad("-m M --top-p 1.01 IN", "--top-p '1.01'", NULL);
    bad("-m M --top-p nan IN", "'nan'", NULL);
    bad("-m M --top-p inf IN", "'inf'", NULL);
    bad("-m M --top-p 0.5x IN", "'0.5x'", NULL);
    bad("-m M --top-p=0.5, IN", "'0.5,'", NULL);
    bad("-m M --top-p= IN", "--top-p ''", NULL);
    bad("-m M --temp 1e400 IN", "--temp '1e400' is not a number in [-2, 2]", NULL);
    bad("-m M --temp -3 IN", "--temp '-3'", NULL);
    /* enums: exactly one of the choices */
    ok("-m M --mode fluxion IN");
    CHECK(g_mode == 2);
    bad("-m M --mode sparse IN", "--mode 'sparse' is not full, fixed or fluxion", NULL);
    bad("-m M --mode Full IN", "'Full'", NULL);
    bad("-m M --mode flux IN", "'flux'", NULL);
    /* what was typed is shown on one line, escaped, and cut */
    bad("-m M --mode a\nb IN", "--mode 'a\\x0ab' is not", NULL);
    bad("-m M IN OUT \x1b[2J", "unexpected argument '\\x1b[2J'", NULL);
    bad("-m M IN OUT 01234567890123456789012345678901234567890123456789"
        "01234567890123456789012345678901234567890123456789",
        "'01234567890123456789012345678901234567890123456789012345678901234567890123456789...'", NULL);
    /* repeatable */
    ok("-m M --data a -d b IN");
    CHECK(g_n_data == 2 && !strcmp(g_data[0], "a") && !strcmp(g_data[1], "b") && !strcmp(g_data[2], "unset"));
    bad("-m M -d a -d b -d c -d d IN", "--data given more than 3 times", NULL);
    /* optional value: none, "=N", or a following all-digit word */
    ok("-m M --gpu IN");
    CHECK(g_gpu == 99 && !strcmp(g_in, "IN"));
    ok("-m M --gpu=3 IN");
    CHECK(g_gpu == 3);
    ok("-m M --gpu 5 IN");
    CHECK(g_gpu == 5 && !strcmp(g_in, "IN"));
    bad("-m M --gpu 8 IN", "--gpu '8' is not an integer in 0..7", NULL);
    bad("-m M --gpu=x IN", "--gpu 'x'", NULL);
    bad("-m M --gpu=2 7 IN OUT", "unexpected argument", NULL);
    /* a flag */
    ok("--chat -m M IN");
    CHECK(g_chat == 1);
}

static void test_help_version(void)
{
    flx_cli_t cli = make_cli();
    flx_cli_action_t act;
    CHECK_OK(parse_line(&cli, "--help", &act));
    CHECK(act == FLX_CLI_HELP && unchanged());
    CHECK_OK(parse_line(&cli, "-m M -h", &act));
    CHECK(act == FLX_CLI_HELP && unchanged());
    CHECK_OK(parse_line(&cli, "--version", &act));
    CHECK(act == FLX_CLI_VERSION && unchanged());
    bad("--help=yes", "--help takes no value", NULL);
    bad("-m M --progress IN", "unknown option --progress", NULL);   /* only where the tool allows it */
    cli.progress = 1;
    CHECK_OK(parse_line(&cli, "-m M --progress IN", &act));
    CHECK(act == FLX_CLI_RUN && cli.progress_given == 1);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f);
    flx_cli_help(&cli, f);
    fclose(f);
    fprintf(stderr, "%s", text);
    CHECK(!strncmp(text, "usage: prog -m PATH [options] IN [OUT]\na test tool\n", 50));
    const char *want[] = {"-m, --model PATH", "(required)", "-p, --prompt TEXT", "--prompt-file FILE",
                          "--gpu [DEVICE]", "--mode full|fixed|fluxion", "(repeatable)", "-h, --help",
                          "--version", "--progress", "exit status: 0 success, 1 runtime failure, 2 usage error",
                          "temperature\n                              second line"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(want); i++) {
        if (!strstr(text, want[i])) fprintf(stderr, "help lacks '%s'\n", want[i]);
        CHECK(strstr(text, want[i]));
    }
    free(text);
    f = open_memstream(&text, &len);
    flx_cli_version(&cli, f);
    fclose(f);
    fprintf(stderr, "%s", text);
    CHECK(!strncmp(text, "prog ", 5) && strstr(text, flx_version()) && text[len - 1] == '\n');
    CHECK(strcmp(flx_version(), "unknown") != 0);
    free(text);
}

static void test_checks(void)
{
    flx_cli_t cli = make_cli();
    flx_cli_action_t act;
    CHECK_OK(parse_line(&cli, "-m M -p x -f y IN", &act));
    CHECK(flx_cli_given(&cli, "prompt") == 1 && flx_cli_given(&cli, "max-new") == 0);
    CHECK(flx_cli_given(&cli, "prompt-fil") == 0);
    CHECK_ST(flx_cli_exclusive(&cli, "prompt", "prompt-file", 1), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "--prompt and --prompt-file exclude each other"));
    CHECK_OK(parse_line(&cli, "-m M IN", &act));
    CHECK_OK(flx_cli_exclusive(&cli, "prompt", "prompt-file", 0));
    CHECK_ST(flx_cli_exclusive(&cli, "prompt", "prompt-file", 1), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "one of --prompt and --prompt-file is required"));
    CHECK_OK(parse_line(&cli, "-m M --top-p 0.5 IN", &act));
    CHECK_OK(flx_cli_applies(&cli, 1, "with greedy sampling", "top-p", "temp", NULL));
    CHECK_OK(flx_cli_applies(&cli, 0, "with greedy sampling", "temp", "seed", NULL));
    CHECK_ST(flx_cli_applies(&cli, 0, "with greedy sampling", "temp", "top-p", NULL), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--top-p has no effect with greedy sampling"));

    uint64_t v[4] = {0};
    uint32_t n = 0;
    CHECK_OK(flx_cli_u64_list("lens", "2048,4096", 1, 1 << 20, v, 4, &n));
    CHECK(n == 2 && v[0] == 2048 && v[1] == 4096);
    const char *badl[] = {"", "1,", ",1", "1,,2", "1,x", "0", "1,2,3,4,5", "1048577", "-1", "1 ,2"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(badl); i++) {
        n = 77;
        CHECK_ST(flx_cli_u64_list("lens", badl[i], 1, 1 << 20, v, 4, &n), FLX_ERR_INVALID);
        CHECK(n == 77 && strstr(flx_error_msg(), "--lens"));
    }
    uint64_t lo[4] = {0}, hi[4] = {0};
    CHECK_OK(flx_cli_range_list("mixed", "16384-32768,1024-1024", 1024, 1 << 20, lo, hi, 4, &n));
    CHECK(n == 2 && lo[0] == 16384 && hi[0] == 32768 && lo[1] == 1024 && hi[1] == 1024);
    const char *badr[] = {"", "1024", "1024-", "-2048", "2048-1024", "1023-2048", "1024-1048577", "1024-2048,",
                          "1024--2048", "1024-2048-4096", "1024-2048,x-2048", "1-2,3-4,5-6,7-8,9-10"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(badr); i++) {
        n = 77, lo[0] = 5;
        CHECK_ST(flx_cli_range_list("mixed", badr[i], 1024, 1 << 20, lo, hi, 4, &n), FLX_ERR_INVALID);
        CHECK(n == 77 && lo[0] == 5 && strstr(flx_error_msg(), "--mixed '"));
    }
    CHECK_ST(flx_cli_range_list("mixed", "2048-1024", 1024, 1 << 20, lo, hi, 4, &n), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--mixed '2048-1024': item '2048-1024' is not LO-HI with 1024 <= LO <= HI <= "
                                   "1048576"));
    static const char *const tls[] = {"shm", "tcp", NULL};
    int ix[2] = {0};
    CHECK_OK(flx_cli_enum_list("tls", "tcp,shm", tls, ix, 2, &n));
    CHECK(n == 2 && ix[0] == 1 && ix[1] == 0);
    CHECK_OK(flx_cli_enum_list("tls", "shm", tls, ix, 2, &n));
    CHECK(n == 1 && ix[0] == 0);
    const char *bade[] = {"", "shm,", "udp", "shm,tcp,shm", "shm,shm", "SHM", "shm tcp"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(bade); i++) {
        n = 77, ix[0] = 9;
        CHECK_ST(flx_cli_enum_list("tls", bade[i], tls, ix, 2, &n), FLX_ERR_INVALID);
        CHECK(n == 77 && ix[0] == 9 && strstr(flx_error_msg(), "--tls '"));
    }
    CHECK_ST(flx_cli_enum_list("tls", "shm,shm", tls, ix, 4, &n), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--tls 'shm,shm': item 'shm' is listed twice"));
    CHECK_ST(flx_cli_enum_list("tls", "shm,udp", tls, ix, 4, &n), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--tls 'shm,udp': item 'udp' is not shm or tcp"));
    CHECK_OK(flx_cli_id_list("session", "7,0x2A,0XfF,18446744073709551615", v, 4, &n));
    CHECK(n == 4 && v[0] == 7 && v[1] == 42 && v[2] == 255 && v[3] == UINT64_MAX);
    const char *badi[] = {"", "0", "0x", "0x0", "1,1", "1,0x1", "x1", "0xg", "-1", "1 ", "18446744073709551616",
                          "0x10000000000000000", "1,2,3,4,5"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(badi); i++) {
        n = 77, v[0] = 5;
        CHECK_ST(flx_cli_id_list("session", badi[i], v, 4, &n), FLX_ERR_INVALID);
        CHECK(n == 77 && v[0] == 5 && strstr(flx_error_msg(), "--session '"));
    }
    CHECK_ST(flx_cli_id_list("session", "3,0x3", v, 4, &n), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--session '3,0x3': item '0x3' is listed twice"));
    uint8_t hx[3 * 2];
    CHECK_OK(flx_cli_hex_list("token", "00aBff,102030", 3, hx, 2, &n));
    CHECK(n == 2 && hx[0] == 0 && hx[1] == 0xab && hx[2] == 0xff && hx[3] == 0x10 && hx[4] == 0x20 && hx[5] == 0x30);
    const char *badh[] = {"", "00aBf", "00aBff0", "00aBfg", "00aBff,", "00aBff,00aBff,00aBff", " 0aBff"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(badh); i++) {
        n = 77, hx[0] = 9;
        CHECK_ST(flx_cli_hex_list("token", badh[i], 3, hx, 2, &n), FLX_ERR_INVALID);
        CHECK(n == 77 && hx[0] == 9 && strstr(flx_error_msg(), "--token '"));
    }
    CHECK_ST(flx_cli_hex_list("token", "abc", 3, hx, 2, &n), FLX_ERR_INVALID);
    CHECK(!strcmp(flx_error_msg(), "--token 'abc': item 'abc' is not 6 hex digits"));
    /* a table declared wrong is a bug of the tool, not a usage error */
    flx_cli_opt_t wrong[] = {FLX_CLI_UINT(0, "n", "N", NULL, 1, 2, 0, "no destination")};
    flx_cli_t wc = FLX_CLI_INIT("prog", "", wrong);
    CHECK_ST(flx_cli_parse(&wc, 1, (char *const[]){"prog", NULL}, &act), FLX_ERR_INTERNAL);
}

static void test_env(void)
{
    unsetenv("FLX_ISA");
    unsetenv("FLX_LOG");
    CHECK_OK(flx_cli_check_env());
    setenv("FLX_ISA", "bogus", 1);
    CHECK_ST(flx_cli_check_env(), FLX_ERR_INVALID);
    fprintf(stderr, "  FLX_ISA=bogus -> %s\n", flx_error_msg());
    CHECK(strstr(flx_error_msg(), "FLX_ISA='bogus'") && strstr(flx_error_msg(), "scalar, avx2, avx512, avx512bf16 or amx"));
    setenv("FLX_ISA", "avx2", 1);
    CHECK_OK(flx_cli_check_env());
    unsetenv("FLX_ISA");
    setenv("FLX_LOG", "loud", 1);
    CHECK_ST(flx_cli_check_env(), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "FLX_LOG='loud'") && strstr(flx_error_msg(), "error, warn, info or debug"));
    setenv("FLX_LOG", "error", 1);
    CHECK_OK(flx_cli_check_env());
}

typedef struct seen {
    int calls;
    uint64_t last_done, last_total;
} seen_t;

static void observer(void *ctx, const char *stage, uint64_t done, uint64_t total, const char *unit)
{
    seen_t *s = ctx;
    CHECK(!strcmp(stage, "work") && !strcmp(unit, "steps"));
    s->calls++;
    s->last_done = done, s->last_total = total;
}

static void test_progress(const char *dir)
{
    seen_t s = {0};
    flx_progress_report("work", 1, 2, "steps");   /* nobody listens: nothing happens */
    flx_progress_observe(observer, &s);
    flx_progress_report("work", 1, 2, "steps");
    flx_progress_report("work", 2, 2, "steps");
    CHECK(s.calls == 2 && s.last_done == 2 && s.last_total == 2);
    flx_progress_observe(NULL, NULL);
    flx_progress_report("work", 1, 2, "steps");
    CHECK(s.calls == 2);

    /* the meter into a file (not a terminal): the first step and the final line, on stderr only */
    char path[1024];
    snprintf(path, sizeof path, "%s/test_cli_progress.txt", dir);
    const int saved = flx_test_capture_begin(2, path);
    flx_progress_meter_install("prog", 0);
    for (uint64_t i = 1; i <= 30; i++) flx_progress_report("prefill", i, 30, "layers");
    flx_progress_report("loading", 1, 1, "tensors");
    flx_progress_observe(NULL, NULL);
    flx_test_capture_end(2, saved);
    const char *text = flx_test_slurp(path);
    fprintf(stderr, "meter wrote:\n%s", text);
    CHECK(!strncmp(text, "prog: prefill: 1/30 layers (3%), ", 33));
    CHECK(strstr(text, "\nprog: prefill: 30/30 layers in ") && strstr(text, "\nprog: loading: 1/1 tensors in "));
    CHECK(!strchr(text, '\r'));
}

int main(int argc, char **argv)
{
    test_names_and_forms();
    test_values();
    test_help_version();
    test_checks();
    test_env();
    test_progress(argc > 1 ? argv[1] : ".");
    fprintf(stderr, "test_cli: ok\n");
    return 0;
}
