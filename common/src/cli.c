/*
 * cli.c - the command-line parser of every tool (flx/cli.h).
 *
 * DESIGN
 * getopt_long matches a long option by any unambiguous prefix, so "--prompt TEXT" silently became
 * "--prompt-file TEXT" and failed to open a file named after the prompt; hand-written loops in each
 * tool disagreed on -h, on exit codes and on what a number is. One table-driven parser fixes all
 * of it in one place: exact names, values converted and range-checked by kind, messages built the
 * same way for every tool, help generated from the same table the parser reads, so the two can
 * never disagree.
 *
 * The parse runs twice over argv: a checking pass that writes nothing, then, only when the whole
 * command line is valid, a committing pass that writes the destinations. The second pass repeats
 * exactly the first one's decisions, so it cannot fail, and a tool never sees half-applied options.
 */
#include "flx/cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flx/cpu.h"
#include "flx/log.h"
#include "flx/progress.h"
#include "flx/util.h"

#define HELP_COL 30   /* column where option help starts */

/* The word as an option would spell it: "--name" (long) or "-x" (short). */
typedef struct spelled {
    char s[80];
} spelled_t;

static spelled_t spell(const flx_cli_opt_t *o, int as_short)
{
    spelled_t w;
    if (as_short) snprintf(w.s, sizeof w.s, "-%c", o->short_name);
    else snprintf(w.s, sizeof w.s, "--%s", o->name);
    return w;
}

/* A word of the command line as a message shows it: on one line (control bytes and bytes above
 * 0x7e as \xNN), at most 80 bytes of it (then "..."). Messages are one line whatever was typed. */
typedef struct shown {
    char s[4 * 80 + 4];
} shown_t;

static shown_t shown_n(const char *w, size_t len)
{
    shown_t r;
    size_t o = 0;
    for (size_t i = 0; i < len && i < 80; i++) {
        unsigned char c = (unsigned char)w[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') r.s[o++] = (char)c;
        else o += (size_t)snprintf(r.s + o, sizeof r.s - o, "\\x%02x", c);
    }
    if (len > 80) memcpy(r.s + o, "...", 3), o += 3;
    r.s[o] = '\0';
    return r;
}

static shown_t shown(const char *w)
{
    return shown_n(w, strlen(w));
}

/* A word that is an option rather than a value: "-x...", "--x...". "-" alone and negative numbers
 * ("-1", "-0.5", "-.5") are values. */
static int looks_like_option(const char *s)
{
    if (s[0] != '-' || s[1] == '\0') return 0;
    if (s[1] == '-') return s[2] != '\0';
    return !(isdigit((unsigned char)s[1]) || s[1] == '.');
}

static int all_digits(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

static flx_status_t conv_uint(const flx_cli_opt_t *o, const char *who, const char *v, uint64_t *out)
{
    if (flx_parse_u64(v, o->ilo, o->ihi, out) == FLX_OK) return FLX_OK;
    if (o->ihi == UINT64_MAX)
        return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not an integer >= %llu", who, shown(v).s,
                             (unsigned long long)o->ilo);
    return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not an integer in %llu..%llu", who, shown(v).s,
                         (unsigned long long)o->ilo, (unsigned long long)o->ihi);
}

static flx_status_t conv_float(const flx_cli_opt_t *o, const char *who, const char *v, double *out)
{
    double x = NAN;
    flx_status_t st = flx_parse_f64(v, &x);
    int lo_ok = (o->flags & FLX_CLI_LO_OPEN) ? x > o->lo : x >= o->lo;
    int hi_ok = (o->flags & FLX_CLI_HI_OPEN) ? x < o->hi : x <= o->hi;
    if (st || !lo_ok || !hi_ok)
        return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not a number in %s%g, %g%s", who, shown(v).s,
                             (o->flags & FLX_CLI_LO_OPEN) ? "(" : "[", o->lo, o->hi,
                             (o->flags & FLX_CLI_HI_OPEN) ? ")" : "]");
    *out = x;
    return FLX_OK;
}

/* The choices as "a, b or c" into buf. */
static void choices_text(const char *const *c, const char *sep_last, char *buf, size_t cap)
{
    size_t n = 0, k = 0;
    while (c[k]) k++;
    buf[0] = '\0';
    for (size_t i = 0; i < k && n < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == k ? sep_last : ", ";
        int w = snprintf(buf + n, cap - n, "%s%s", sep, c[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* Converts v for option o (who: how the user spelled it); writes the destination when commit. */
static flx_status_t take_value(flx_cli_opt_t *o, const char *who, const char *v, int commit)
{
    flx_status_t st = FLX_OK;
    switch (o->kind) {
    case FLX_CLI_KIND_FLAG:
        if (commit) *o->flag = 1;
        return FLX_OK;
    case FLX_CLI_KIND_PATH:
        if (!*v) return flx_error_set(FLX_ERR_INVALID, "%s needs a non-empty path", who);
        /* fall through */
    case FLX_CLI_KIND_STRING:
        if (o->flags & FLX_CLI_REPEAT) {
            if (o->n_given > o->max)
                return flx_error_set(FLX_ERR_INVALID, "--%s given more than %u times", o->name, o->max);
            if (commit) {
                o->str[o->n_given - 1] = v;
                if (o->count) *o->count = o->n_given;
            }
        } else if (commit) {
            *o->str = v;
        }
        return FLX_OK;
    case FLX_CLI_KIND_UINT: {
        uint64_t x;
        if ((st = conv_uint(o, who, v, &x)) == FLX_OK && commit) *o->u = x;
        return st;
    }
    case FLX_CLI_KIND_FLOAT: {
        double x;
        if ((st = conv_float(o, who, v, &x)) == FLX_OK && commit) *o->f = x;
        return st;
    }
    case FLX_CLI_KIND_ENUM:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(v, o->choices[i])) {
                if (commit) *o->flag = i;
                return FLX_OK;
            }
        {
            char list[256];
            choices_text(o->choices, " or ", list, sizeof list);
            return flx_error_set(FLX_ERR_INVALID, "%s '%s' is not %s", who, shown(v).s, list);
        }
    }
    return flx_error_set(FLX_ERR_INTERNAL, "%s: option kind %d", who, (int)o->kind);
}

static flx_cli_opt_t *find_long(flx_cli_t *cli, const char *name, size_t len)
{
    for (uint32_t i = 0; i < cli->n_opts; i++)
        if (strlen(cli->opts[i].name) == len && !memcmp(cli->opts[i].name, name, len)) return &cli->opts[i];
    return NULL;
}

static flx_cli_opt_t *find_short(flx_cli_t *cli, char c)
{
    for (uint32_t i = 0; i < cli->n_opts; i++)
        if (cli->opts[i].short_name && cli->opts[i].short_name == c) return &cli->opts[i];
    return NULL;
}

/* "unknown option --mod", with the options it is a prefix of (prefixes are never taken). */
static flx_status_t unknown_long(const flx_cli_t *cli, const char *name, size_t len)
{
    char near[256] = "";
    size_t n = 0;
    int k = 0;
    static const char *const builtin[] = {"help", "version", "progress"};
    for (uint32_t i = 0; i < cli->n_opts + 3 && k < 4; i++) {
        const char *cand = i < cli->n_opts ? cli->opts[i].name : builtin[i - cli->n_opts];
        if (i == cli->n_opts + 2 && !cli->progress) continue;
        if (len && strlen(cand) > len && !strncmp(cand, name, len)) {
            int w = snprintf(near + n, sizeof near - n, "%s--%s", k ? ", " : "", cand);
            if (w > 0 && (size_t)w < sizeof near - n) n += (size_t)w, k++;
        }
    }
    if (k)
        return flx_error_set(FLX_ERR_INVALID, "unknown option --%s (names are matched exactly: did you mean %s?)",
                             shown_n(name, len).s, near);
    return flx_error_set(FLX_ERR_INVALID, "unknown option --%s", shown_n(name, len).s);
}

static flx_status_t scan(flx_cli_t *cli, int argc, char *const *argv, int commit, flx_cli_action_t *action_p)
{
    for (uint32_t i = 0; i < cli->n_opts; i++) cli->opts[i].n_given = 0;
    for (uint32_t i = 0; i < cli->n_pos; i++) cli->pos[i].given = 0;
    cli->progress_given = 0;
    *action_p = FLX_CLI_RUN;
    uint32_t n_pos = 0;
    int options_done = 0;
    flx_status_t st;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!a) return flx_error_set(FLX_ERR_INVALID, "argument %d is NULL", i);
        if (!options_done && !strcmp(a, "--")) {
            options_done = 1;
            continue;
        }
        if (options_done || !looks_like_option(a)) {
            if (n_pos >= cli->n_pos) {
                if (cli->n_pos == 0)
                    return flx_error_set(FLX_ERR_INVALID, "unexpected argument '%s' (this tool takes options only)",
                                         shown(a).s);
                return flx_error_set(FLX_ERR_INVALID, "unexpected argument '%s' after %s", shown(a).s,
                                     cli->pos[cli->n_pos - 1].name);
            }
            if (commit) *cli->pos[n_pos].dst = a;
            cli->pos[n_pos++].given = 1;
            continue;
        }
        flx_cli_opt_t *o;
        const char *inl = NULL;    /* a value written into the same word */
        int as_short = a[1] != '-';
        if (!as_short) {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            if (eq) inl = eq + 1;
            int is_help = len == 4 && !memcmp(name, "help", 4), is_version = len == 7 && !memcmp(name, "version", 7);
            int is_progress = cli->progress && len == 8 && !memcmp(name, "progress", 8);
            if ((is_help || is_version || is_progress) && eq)
                return flx_error_set(FLX_ERR_INVALID, "--%s takes no value", shown_n(name, len).s);
            if (is_help || is_version) {
                *action_p = is_help ? FLX_CLI_HELP : FLX_CLI_VERSION;
                return FLX_OK;
            }
            if (is_progress) {
                cli->progress_given = 1;
                continue;
            }
            if (!(o = find_long(cli, name, len))) return unknown_long(cli, name, len);
        } else {
            if (a[1] == 'h' && !find_short(cli, 'h')) {
                if (a[2]) return flx_error_set(FLX_ERR_INVALID, "-h takes no value (got '%s')", shown(a).s);
                *action_p = FLX_CLI_HELP;
                return FLX_OK;
            }
            if (!(o = find_short(cli, a[1])))
                return a[2] ? flx_error_set(FLX_ERR_INVALID, "unknown option -%s (in '%s')", shown_n(a + 1, 1).s,
                                            shown(a).s)
                            : flx_error_set(FLX_ERR_INVALID, "unknown option -%s", shown_n(a + 1, 1).s);
            if (a[2]) inl = a + 2;
        }
        const spelled_t who = spell(o, as_short);
        o->n_given++;
        if (o->kind == FLX_CLI_KIND_FLAG) {
            if (inl) return flx_error_set(FLX_ERR_INVALID, "%s takes no value (got '%s')", who.s, shown(a).s);
            if ((st = take_value(o, who.s, "", commit))) return st;
            continue;
        }
        const char *v = inl;
        if (!v && (o->flags & FLX_CLI_OPTIONAL)) {
            if (i + 1 < argc && argv[i + 1] && all_digits(argv[i + 1])) v = argv[++i];
            else continue;   /* given without a value: the destination keeps its default */
        }
        if (!v) {
            if (i + 1 >= argc || !argv[i + 1])
                return flx_error_set(FLX_ERR_INVALID, "%s needs a value", who.s);
            if (looks_like_option(argv[i + 1]))
                return flx_error_set(FLX_ERR_INVALID, "%s needs a value, got the option '%s' (write %s=VALUE for a "
                                     "value that starts with '-')", who.s, shown(argv[i + 1]).s, who.s);
            v = argv[++i];
        }
        if ((st = take_value(o, who.s, v, commit))) return st;
    }
    for (uint32_t i = 0; i < cli->n_opts; i++) {
        const flx_cli_opt_t *o = &cli->opts[i];
        if ((o->flags & FLX_CLI_REQUIRED) && !o->n_given)
            return flx_error_set(FLX_ERR_INVALID, "--%s is required", o->name);
    }
    for (uint32_t i = n_pos; i < cli->n_pos; i++)
        if (!cli->pos[i].optional) return flx_error_set(FLX_ERR_INVALID, "missing argument %s", cli->pos[i].name);
    return FLX_OK;
}

static flx_status_t check_table(const flx_cli_t *cli)
{
    if (!cli->prog || (cli->n_opts && !cli->opts) || (cli->n_pos && !cli->pos))
        return flx_error_set(FLX_ERR_INVALID, "cli: incomplete table");
    for (uint32_t i = 0; i < cli->n_opts; i++) {
        const flx_cli_opt_t *o = &cli->opts[i];
        int ok = o->name && o->name[0] && o->name[0] != '-' && !strchr(o->name, '=');
        switch (o->kind) {
        case FLX_CLI_KIND_FLAG: ok = ok && o->flag; break;
        case FLX_CLI_KIND_STRING:
        case FLX_CLI_KIND_PATH: ok = ok && o->str && (!(o->flags & FLX_CLI_REPEAT) || o->max > 0); break;
        case FLX_CLI_KIND_UINT: ok = ok && o->u && o->ilo <= o->ihi; break;
        case FLX_CLI_KIND_FLOAT: ok = ok && o->f && o->lo <= o->hi; break;
        case FLX_CLI_KIND_ENUM: ok = ok && o->flag && o->choices && o->choices[0]; break;
        default: ok = 0;
        }
        if ((o->flags & FLX_CLI_OPTIONAL) && o->kind != FLX_CLI_KIND_UINT) ok = 0;
        if ((o->flags & FLX_CLI_REPEAT) && o->kind != FLX_CLI_KIND_STRING && o->kind != FLX_CLI_KIND_PATH) ok = 0;
        if (!ok)
            return flx_error_set(FLX_ERR_INTERNAL, "cli: option %u (%s) is declared wrong", i, o->name ? o->name : "?");
    }
    for (uint32_t i = 0; i < cli->n_pos; i++)
        if (!cli->pos[i].name || !cli->pos[i].dst || (i && cli->pos[i - 1].optional && !cli->pos[i].optional))
            return flx_error_set(FLX_ERR_INTERNAL, "cli: argument %u is declared wrong", i);
    return FLX_OK;
}

flx_status_t flx_cli_parse(flx_cli_t *cli, int argc, char *const *argv, flx_cli_action_t *action_p)
{
    if (!cli || !action_p || argc < 0 || (argc > 0 && !argv))
        return flx_error_set(FLX_ERR_INVALID, "cli: NULL argument");
    flx_status_t st = check_table(cli);
    if (st) return st;
    flx_cli_action_t act;
    if ((st = scan(cli, argc, argv, 0, &act))) return st;
    if (act == FLX_CLI_RUN && (st = scan(cli, argc, argv, 1, &act))) return st;   /* cannot fail: see DESIGN */
    *action_p = act;
    return FLX_OK;
}

flx_status_t flx_cli_check_env(void)
{
    flx_status_t st = flx_isa_env_check();
    if (st == FLX_OK) st = flx_log_env_check();
    return st;
}

int flx_cli_main(flx_cli_t *cli, int argc, char *const *argv)
{
    flx_cli_action_t act;
    if (flx_cli_parse(cli, argc, argv, &act) != FLX_OK) return flx_cli_usage_error(cli, NULL);
    if (act == FLX_CLI_HELP) {
        flx_cli_help(cli, stdout);
        return fflush(stdout) == 0 ? FLX_EXIT_OK : FLX_EXIT_FAILURE;
    }
    if (act == FLX_CLI_VERSION) {
        flx_cli_version(cli, stdout);
        return fflush(stdout) == 0 ? FLX_EXIT_OK : FLX_EXIT_FAILURE;
    }
    if (flx_cli_check_env() != FLX_OK) return flx_cli_usage_error(cli, NULL);
    if (cli->progress && (cli->progress_given || isatty(STDERR_FILENO)))
        flx_progress_meter_install(cli->prog, isatty(STDERR_FILENO));
    return FLX_CLI_PROCEED;
}

/* ---- help ---- */

/* " PATH", " [DEVICE]", " full|fixed|fluxion" or "" into buf. */
static void opt_meta(const flx_cli_opt_t *o, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (o->kind == FLX_CLI_KIND_FLAG) return;
    if (o->kind == FLX_CLI_KIND_ENUM && !o->metavar) {
        size_t n = 0;
        for (int i = 0; o->choices[i] && n < cap; i++) {
            int w = snprintf(buf + n, cap - n, "%s%s", i ? "|" : " ", o->choices[i]);
            if (w < 0) break;
            n += (size_t)w;
        }
        return;
    }
    snprintf(buf, cap, (o->flags & FLX_CLI_OPTIONAL) ? " [%s]" : " %s", o->metavar ? o->metavar : "VALUE");
}

static void help_line(FILE *f, const char *head, const char *help, const char *tail)
{
    int w = fprintf(f, "  %s", head);
    if (w >= HELP_COL) {
        fputc('\n', f);
        w = 0;
    }
    fprintf(f, "%*s", HELP_COL - w, "");
    for (const char *p = help ? help : ""; *p; p++) {
        fputc(*p, f);
        if (*p == '\n') fprintf(f, "%*s", HELP_COL, "");
    }
    fprintf(f, "%s\n", tail ? tail : "");
}

void flx_cli_help(const flx_cli_t *cli, FILE *f)
{
    fprintf(f, "usage: %s", cli->prog);
    if (cli->synopsis) {
        fprintf(f, " %s", cli->synopsis);
    } else {
        int any_optional = cli->progress;
        for (uint32_t i = 0; i < cli->n_opts; i++) {
            const flx_cli_opt_t *o = &cli->opts[i];
            if (!(o->flags & FLX_CLI_REQUIRED)) {
                any_optional = 1;
                continue;
            }
            char meta[256];
            opt_meta(o, meta, sizeof meta);
            if (o->short_name) fprintf(f, " -%c%s", o->short_name, meta);
            else fprintf(f, " --%s%s", o->name, meta);
        }
        if (any_optional) fputs(" [options]", f);
        for (uint32_t i = 0; i < cli->n_pos; i++)
            fprintf(f, cli->pos[i].optional ? " [%s]" : " %s", cli->pos[i].name);
    }
    fputc('\n', f);
    if (cli->summary) fprintf(f, "%s\n", cli->summary);
    if (cli->n_pos) {
        fprintf(f, "\narguments:\n");
        for (uint32_t i = 0; i < cli->n_pos; i++) help_line(f, cli->pos[i].name, cli->pos[i].help, NULL);
    }
    fprintf(f, "\noptions:\n");
    for (uint32_t i = 0; i < cli->n_opts; i++) {
        const flx_cli_opt_t *o = &cli->opts[i];
        char meta[256], head[320];
        opt_meta(o, meta, sizeof meta);
        if (o->short_name) snprintf(head, sizeof head, "-%c, --%s%s", o->short_name, o->name, meta);
        else snprintf(head, sizeof head, "    --%s%s", o->name, meta);
        help_line(f, head, o->help,
                  (o->flags & FLX_CLI_REQUIRED) ? " (required)" : (o->flags & FLX_CLI_REPEAT) ? " (repeatable)" : NULL);
    }
    if (cli->progress)
        help_line(f, "    --progress", "show progress on stderr (default: when stderr is a terminal)", NULL);
    help_line(f, "-h, --help", "print this help and exit", NULL);
    help_line(f, "    --version", "print the version and exit", NULL);
    if (cli->epilog) fprintf(f, "\n%s\n", cli->epilog);
    fprintf(f, "\nexit status: 0 success, 1 runtime failure, 2 usage error\n");
}

void flx_cli_version(const flx_cli_t *cli, FILE *f)
{
    const char *git = flx_version_git();
    if (git[0]) fprintf(f, "%s %s (git %s)\n", cli->prog, flx_version(), git);
    else fprintf(f, "%s %s\n", cli->prog, flx_version());
}

/* ---- checks and messages ---- */

uint32_t flx_cli_given(const flx_cli_t *cli, const char *name)
{
    for (uint32_t i = 0; cli && name && i < cli->n_opts; i++)
        if (!strcmp(cli->opts[i].name, name)) return cli->opts[i].n_given;
    return 0;
}

flx_status_t flx_cli_exclusive(const flx_cli_t *cli, const char *a, const char *b, int need_one)
{
    uint32_t na = flx_cli_given(cli, a), nb = flx_cli_given(cli, b);
    if (na && nb) return flx_error_set(FLX_ERR_INVALID, "--%s and --%s exclude each other: give one", a, b);
    if (need_one && !na && !nb) return flx_error_set(FLX_ERR_INVALID, "one of --%s and --%s is required", a, b);
    return FLX_OK;
}

flx_status_t flx_cli_applies(const flx_cli_t *cli, int applies, const char *context, ...)
{
    if (applies) return FLX_OK;
    va_list ap;
    va_start(ap, context);
    flx_status_t st = FLX_OK;
    for (const char *n; !st && (n = va_arg(ap, const char *));)
        if (flx_cli_given(cli, n)) st = flx_error_set(FLX_ERR_INVALID, "--%s has no effect %s", n, context);
    va_end(ap);
    return st;
}

/* "PROG: msg" on stderr as one line: control bytes a tool's message quotes from the command line or
 * a file are shown as \xNN. */
static void print_line(const char *prog, const char *msg)
{
    char line[FLX_ERROR_MSG_MAX * 4 + 8];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && o + 5 < sizeof line; p++) {
        if (*p >= 0x20 && *p != 0x7f) line[o++] = (char)*p;
        else o += (size_t)snprintf(line + o, sizeof line - o, "\\x%02x", *p);
    }
    line[o] = '\0';
    fprintf(stderr, "%s: %s\n", prog, line);
}

int flx_cli_usage_error(const flx_cli_t *cli, const char *fmt, ...)
{
    char msg[FLX_ERROR_MSG_MAX];
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    } else {
        snprintf(msg, sizeof msg, "%s", flx_error_msg());
    }
    print_line(cli->prog, msg);
    fprintf(stderr, "try '%s --help'\n", cli->prog);
    return FLX_EXIT_USAGE;
}

int flx_cli_fail(const flx_cli_t *cli, const char *fmt, ...)
{
    char msg[FLX_ERROR_MSG_MAX * 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    print_line(cli->prog, msg);
    return FLX_EXIT_FAILURE;
}

/* ---- list-valued options ---- */

/* One item of a list: converted (and written at index i when commit) by a list kind below. */
typedef flx_status_t (*item_fn)(void *ctx, const char *opt, const char *list, const char *item, uint32_t i,
                                int commit);

/* Splits s on commas and hands each item to fn: everything checked first, then written, so a
 * refused list writes nothing; *n_p on success only. Items are non-empty and shorter than 64 bytes. */
static flx_status_t list_items(const char *opt, const char *s, uint32_t cap, uint32_t *n_p, item_fn fn, void *ctx)
{
    if (!opt || !s || !n_p) return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument");
    uint32_t n = 0;
    for (int commit = 0; commit < 2; commit++) {
        const char *p = s;
        n = 0;
        for (;;) {
            size_t len = strcspn(p, ",");
            char item[64];
            if (len == 0 || len >= sizeof item)
                return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item %u is empty or too long", opt, shown(s).s,
                                     n + 1);
            if (n == cap)
                return flx_error_set(FLX_ERR_INVALID, "--%s '%s' has more than %u items", opt, shown(s).s, cap);
            memcpy(item, p, len);
            item[len] = '\0';
            flx_status_t st = fn(ctx, opt, s, item, n, commit);
            if (st) return st;
            n++;
            p += len;
            if (!*p) break;
            p++;   /* the comma */
        }
    }
    *n_p = n;
    return FLX_OK;
}

typedef struct u64_list {
    uint64_t lo, hi;
    uint64_t *out;
} u64_list_t;

static flx_status_t u64_item(void *ctx, const char *opt, const char *list, const char *item, uint32_t i, int commit)
{
    const u64_list_t *c = ctx;
    uint64_t x;
    if (flx_parse_u64(item, c->lo, c->hi, &x))
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is not an integer in %llu..%llu", opt,
                             shown(list).s, shown(item).s, (unsigned long long)c->lo, (unsigned long long)c->hi);
    if (commit) c->out[i] = x;
    return FLX_OK;
}

flx_status_t flx_cli_u64_list(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out, uint32_t cap,
                              uint32_t *n_p)
{
    if (!out) return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument");
    u64_list_t c = {lo, hi, out};
    return list_items(opt, s, cap, n_p, u64_item, &c);
}

typedef struct range_list {
    uint64_t lo, hi;
    uint64_t *out_lo, *out_hi;
} range_list_t;

static flx_status_t range_item(void *ctx, const char *opt, const char *list, const char *item, uint32_t i, int commit)
{
    const range_list_t *c = ctx;
    char a[64];
    const char *dash = strchr(item, '-');
    uint64_t x = 0, y = 0;
    if (dash) {
        memcpy(a, item, (size_t)(dash - item));
        a[dash - item] = '\0';
    }
    if (!dash || flx_parse_u64(a, c->lo, c->hi, &x) || flx_parse_u64(dash + 1, c->lo, c->hi, &y) || x > y)
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is not LO-HI with %llu <= LO <= HI <= %llu",
                             opt, shown(list).s, shown(item).s, (unsigned long long)c->lo, (unsigned long long)c->hi);
    if (commit) c->out_lo[i] = x, c->out_hi[i] = y;
    return FLX_OK;
}

flx_status_t flx_cli_range_list(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out_lo,
                                uint64_t *out_hi, uint32_t cap, uint32_t *n_p)
{
    if (!out_lo || !out_hi) return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument");
    range_list_t c = {lo, hi, out_lo, out_hi};
    return list_items(opt, s, cap, n_p, range_item, &c);
}

typedef struct enum_list {
    const char *const *choices;
    int *out;
    uint32_t seen;   /* bit k: choice k already listed (the checking pass) */
} enum_list_t;

static flx_status_t enum_item(void *ctx, const char *opt, const char *list, const char *item, uint32_t i, int commit)
{
    enum_list_t *c = ctx;
    int k = 0;
    while (c->choices[k] && strcmp(item, c->choices[k])) k++;
    if (!c->choices[k]) {
        char names[256];
        choices_text(c->choices, " or ", names, sizeof names);
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is not %s", opt, shown(list).s, shown(item).s,
                             names);
    }
    if (commit) {
        c->out[i] = k;
    } else {
        if (c->seen & (1u << k))
            return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is listed twice", opt, shown(list).s,
                                 shown(item).s);
        c->seen |= 1u << k;
    }
    return FLX_OK;
}

flx_status_t flx_cli_enum_list(const char *opt, const char *s, const char *const *choices, int *out, uint32_t cap,
                               uint32_t *n_p)
{
    uint32_t k = 0;
    while (choices && choices[k]) k++;
    if (!out || k == 0 || k > 32) return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument or 0 or > 32 choices");
    enum_list_t c = {choices, out, 0};
    return list_items(opt, s, cap, n_p, enum_item, &c);
}

static int hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

typedef struct id_list {
    uint64_t *out;
    uint64_t seen[64];   /* the items checked so far (the checking pass) */
} id_list_t;

static flx_status_t id_item(void *ctx, const char *opt, const char *list, const char *item, uint32_t i, int commit)
{
    id_list_t *c = ctx;
    uint64_t x = 0;
    const int hex = item[0] == '0' && (item[1] == 'x' || item[1] == 'X');
    const uint64_t base = hex ? 16 : 10;
    const char *digits = item + (hex ? 2 : 0);
    int ok = *digits != '\0';
    for (const char *q = digits; ok && *q; q++) {
        const int d = hex_digit(*q);
        if (d < 0 || (uint64_t)d >= base || x > (UINT64_MAX - (uint64_t)d) / base) ok = 0;
        else x = x * base + (uint64_t)d;
    }
    if (!ok || x == 0)
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is not a non-zero id (decimal or 0x hex)", opt,
                             shown(list).s, shown(item).s);
    if (commit) {
        c->out[i] = x;
        return FLX_OK;
    }
    for (uint32_t j = 0; j < i; j++)
        if (c->seen[j] == x)
            return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is listed twice", opt, shown(list).s,
                                 shown(item).s);
    c->seen[i] = x;
    return FLX_OK;
}

flx_status_t flx_cli_id_list(const char *opt, const char *s, uint64_t *out, uint32_t cap, uint32_t *n_p)
{
    if (!out || cap > 64) return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument or cap above 64");
    id_list_t c = {.out = out};
    return list_items(opt, s, cap, n_p, id_item, &c);
}

typedef struct hex_list {
    uint8_t *out;
    uint32_t bytes;
} hex_list_t;

static flx_status_t hex_item(void *ctx, const char *opt, const char *list, const char *item, uint32_t i, int commit)
{
    const hex_list_t *c = ctx;
    int ok = strlen(item) == 2 * (size_t)c->bytes;
    for (const char *q = item; ok && *q; q++) ok = hex_digit(*q) >= 0;
    if (!ok)
        return flx_error_set(FLX_ERR_INVALID, "--%s '%s': item '%s' is not %u hex digits", opt, shown(list).s,
                             shown(item).s, 2 * c->bytes);
    if (commit)
        for (uint32_t k = 0; k < c->bytes; k++)
            c->out[(size_t)i * c->bytes + k] = (uint8_t)(hex_digit(item[2 * k]) << 4 | hex_digit(item[2 * k + 1]));
    return FLX_OK;
}

flx_status_t flx_cli_hex_list(const char *opt, const char *s, uint32_t bytes, uint8_t *out, uint32_t cap,
                              uint32_t *n_p)
{
    if (!out || bytes == 0 || bytes > 31)
        return flx_error_set(FLX_ERR_INVALID, "cli list: NULL argument or 0 or > 31 bytes");
    hex_list_t c = {out, bytes};
    return list_items(opt, s, cap, n_p, hex_item, &c);
}

flx_status_t flx_cli_read_file(const char *path, size_t max_bytes, char **buf_p, size_t *len_p)
{
    if (!path || !buf_p || !len_p) return flx_error_set(FLX_ERR_INVALID, "read file: NULL argument");
    int from_stdin = !strcmp(path, "-");
    struct stat sb;
    if (!from_stdin && stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        return flx_file_read(path, max_bytes, buf_p, len_p);   /* sized up front */
    /* stdin, a pipe or a process substitution: read until the end, at most max_bytes */
    FILE *f = from_stdin ? stdin : fopen(path, "rb");
    if (!f) return flx_error_set(flx_status_from_errno(errno), "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    flx_status_t st = buf ? FLX_OK : flx_error_set(FLX_ERR_NOMEM, "reading %s: out of memory", path);
    while (!st) {
        if (n + 1 >= cap) {
            char *nb = cap <= max_bytes ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                st = cap > max_bytes
                         ? flx_error_set(FLX_ERR_CAPACITY, "%s is larger than %zu bytes", path, max_bytes)
                         : flx_error_set(FLX_ERR_NOMEM, "reading %s: out of memory at %zu bytes", path, cap);
                break;
            }
            buf = nb, cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) st = flx_error_set(FLX_ERR_IO, "reading %s failed: %s", path, strerror(errno));
            break;
        }
    }
    if (!from_stdin) fclose(f);
    if (!st && n > max_bytes) st = flx_error_set(FLX_ERR_CAPACITY, "%s is larger than %zu bytes", path, max_bytes);
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *buf_p = buf;
    *len_p = n;
    return FLX_OK;
}
