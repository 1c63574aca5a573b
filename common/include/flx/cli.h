/*
 * flx/cli.h - the one command-line parser of every tool and benchmark binary: options declared in a
 * table, parsed exactly, help and usage generated from the table, one convention for exit codes.
 *
 * OVERVIEW
 *   const char *model = NULL;
 *   uint64_t max_new = 64;
 *   flx_cli_opt_t opts[] = {
 *       FLX_CLI_PATH('m', "model", "PATH", &model, FLX_CLI_REQUIRED, "a .gguf file or a Hugging Face folder"),
 *       FLX_CLI_UINT('n', "max-new", "N", &max_new, 1, 1000000, 0, "tokens to generate"),
 *   };
 *   flx_cli_t cli = FLX_CLI_INIT("flx-generate", "generate text with a model on one machine", opts);
 *   int rc = flx_cli_main(&cli, argc, argv);
 *   if (rc != FLX_CLI_PROCEED) return rc;          // help, version or a usage error was printed
 *   ... checks between options: flx_cli_exclusive, flx_cli_applies, then flx_cli_usage_error ...
 *
 * CONVENTION (every tool; the README's "Command lines" section says the same to users)
 *   exit 0  success; also -h/--help (help on stdout) and --version (name and version on stdout)
 *   exit 1  a runtime failure: a file that cannot be opened or is malformed, a model refused, a
 *           prompt longer than the model's context, out of memory, a missing device. Anything that
 *           needs a file's content to be detected is a runtime failure.
 *   exit 2  a usage error, detected from the command line and the environment alone: an unknown
 *           option, a missing value, a value that is not a number, out of range or not one of the
 *           choices, a missing required option or argument, contradictory options, an option that
 *           has no effect in the chosen mode, a bad FLX_ISA / FLX_LOG. Two lines on stderr:
 *           "PROG: <the option and what is wrong>" and "try 'PROG --help'".
 * Long options match exactly, never by a prefix (--prompt is never --prompt-file). Values: "--opt
 * value" or "--opt=value"; short options "-m value" or "-mvalue". A word that looks like an option
 * ("-x...", "--x...") is never taken as a value: write --opt=-value for a value that starts with a
 * dash (numbers such as -0.5 are taken). "--" ends the options; "-" alone is an argument (stdin).
 * Given twice, an option's last value wins; repeatable options (FLX_CLI_REPEAT) collect every value.
 *
 * VALUES are validated completely: integers are decimal digits only (no sign, no trailing text, no
 * silent wrap) inside [lo, hi]; floats are finite decimal numbers inside their interval (each end
 * open or closed); enums are one of the listed strings, exactly. Nothing is written to any
 * destination unless the whole command line is valid.
 *
 * PROGRESS. A tool whose work can take more than a few seconds sets FLX_CLI_INIT's .progress = 1:
 * it then accepts --progress, and flx_cli_main installs the stderr progress meter (flx/progress.h)
 * on the calling thread when stderr is a terminal or --progress was given. stdout never sees it.
 *
 * THREAD MODE: a flx_cli_t is used by one thread (main). The parser keeps no global state.
 */
#ifndef FLX_CLI_H
#define FLX_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FLX_EXIT_OK = 0,
    FLX_EXIT_FAILURE = 1,   /* runtime failure */
    FLX_EXIT_USAGE = 2,     /* the command line or the environment is wrong */
    FLX_CLI_PROCEED = -1,   /* flx_cli_main: the command line is valid, run the tool */
};

typedef enum {
    FLX_CLI_KIND_FLAG = 0,   /* no value: *flag = 1 */
    FLX_CLI_KIND_STRING,     /* *str = the value (points into argv) */
    FLX_CLI_KIND_PATH,       /* like STRING, but never empty */
    FLX_CLI_KIND_UINT,       /* *u = decimal integer in [ilo, ihi] */
    FLX_CLI_KIND_FLOAT,      /* *f = finite number in lo..hi (ends open with FLX_CLI_LO_OPEN / _HI_OPEN) */
    FLX_CLI_KIND_ENUM,       /* *idx = index of the value in choices (NULL-terminated) */
} flx_cli_kind_t;

enum {
    FLX_CLI_REQUIRED = 1u << 0,   /* must be given */
    FLX_CLI_REPEAT = 1u << 1,     /* STRING/PATH: every value collected into list[0..max) */
    FLX_CLI_OPTIONAL = 1u << 2,   /* UINT: the value may be left out ("--gpu", "--gpu=1", "--gpu 1": a
                                     following all-digit word is the value) */
    FLX_CLI_LO_OPEN = 1u << 3,    /* FLOAT: lo itself excluded */
    FLX_CLI_HI_OPEN = 1u << 4,    /* FLOAT: hi itself excluded */
};

typedef struct flx_cli_opt {
    /* declared by the tool */
    const char *name;           /* long name without "--" ("prompt-file"); never NULL */
    char short_name;            /* 'f', or 0 for none */
    flx_cli_kind_t kind;
    uint32_t flags;             /* FLX_CLI_REQUIRED | ... */
    const char *metavar;        /* "FILE", "N", ... in help (ENUM: NULL lists the choices) */
    const char *help;           /* one sentence; '\n' starts an indented continuation line */
    int *flag;                  /* FLAG; ENUM: the index */
    const char **str;           /* STRING, PATH (list of max entries with FLX_CLI_REPEAT) */
    uint64_t *u;                /* UINT */
    double *f;                  /* FLOAT */
    uint64_t ilo, ihi;          /* UINT range, inclusive */
    double lo, hi;              /* FLOAT range */
    const char *const *choices; /* ENUM, NULL-terminated */
    uint32_t max;               /* REPEAT: capacity of str[] */
    uint32_t *count;            /* REPEAT: number of values written (may be NULL otherwise) */
    /* written by the parser */
    uint32_t n_given;           /* times the option appeared on the command line */
} flx_cli_opt_t;

typedef struct flx_cli_pos {
    const char *name;           /* "OUT_DIR" */
    const char *help;
    const char **dst;           /* the argument (points into argv) */
    int optional;               /* 1: may be left out (only after the required ones) */
    int given;                  /* written by the parser */
} flx_cli_pos_t;

typedef struct flx_cli {
    const char *prog;           /* "flx-generate": in every message */
    const char *summary;        /* one line under the usage line */
    const char *synopsis;       /* what follows "usage: PROG " (NULL: made from the table) */
    const char *epilog;         /* text after the options (formats, examples); may be NULL */
    flx_cli_opt_t *opts;
    uint32_t n_opts;
    flx_cli_pos_t *pos;
    uint32_t n_pos;
    int progress;               /* 1: the tool has long operations: accept --progress */
    /* written by the parser */
    int progress_given;         /* --progress appeared */
} flx_cli_t;

#define FLX_CLI_COUNT_(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
/* A flx_cli_t over an option array (and FLX_CLI_INIT_POS with positional arguments). */
#define FLX_CLI_INIT(prog_, summary_, opts_) \
    {.prog = (prog_), .summary = (summary_), .opts = (opts_), .n_opts = FLX_CLI_COUNT_(opts_)}
#define FLX_CLI_INIT_POS(prog_, summary_, opts_, pos_)                                                 \
    {.prog = (prog_), .summary = (summary_), .opts = (opts_), .n_opts = FLX_CLI_COUNT_(opts_), \
     .pos = (pos_), .n_pos = FLX_CLI_COUNT_(pos_)}

/* Table entries; the destination's type is checked by the compiler. */
#define FLX_CLI_FLAG(s, l, dst, help_) \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_FLAG, .flag = (dst), .help = (help_)}
#define FLX_CLI_STR(s, l, meta, dst, fl, help_)                                                        \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_STRING, .flags = (fl), .metavar = (meta), .str = (dst), \
     .help = (help_)}
#define FLX_CLI_PATH(s, l, meta, dst, fl, help_)                                                       \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_PATH, .flags = (fl), .metavar = (meta), .str = (dst), \
     .help = (help_)}
#define FLX_CLI_LIST(s, l, meta, list, cap, cnt, fl, help_)                                            \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_PATH, .flags = FLX_CLI_REPEAT | (fl), .metavar = (meta), \
     .str = (list), .max = (cap), .count = (cnt), .help = (help_)}
#define FLX_CLI_UINT(s, l, meta, dst, lo_, hi_, fl, help_)                                             \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_UINT, .flags = (fl), .metavar = (meta), .u = (dst), \
     .ilo = (lo_), .ihi = (hi_), .help = (help_)}
#define FLX_CLI_FLOAT(s, l, meta, dst, lo_, hi_, fl, help_)                                            \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_FLOAT, .flags = (fl), .metavar = (meta), .f = (dst), \
     .lo = (lo_), .hi = (hi_), .help = (help_)}
#define FLX_CLI_ENUM(s, l, dst, choices_, fl, help_)                                                   \
    {.name = (l), .short_name = (s), .kind = FLX_CLI_KIND_ENUM, .flags = (fl), .flag = (dst), .choices = (choices_), \
     .help = (help_)}
#define FLX_CLI_ARG(name_, dst_, help_) {.name = (name_), .dst = (dst_), .help = (help_)}
#define FLX_CLI_ARG_OPT(name_, dst_, help_) {.name = (name_), .dst = (dst_), .help = (help_), .optional = 1}

typedef enum {
    FLX_CLI_RUN = 0,    /* valid: run the tool */
    FLX_CLI_HELP,       /* -h / --help */
    FLX_CLI_VERSION,    /* --version */
} flx_cli_action_t;

/*
 * Parses argv[1..argc) against cli without printing anything. On FLX_OK, *action_p says what to
 * do; with FLX_CLI_RUN every given option's destination (and every positional's) is written, the
 * others keep the tool's defaults. On FLX_ERR_INVALID nothing is written and flx_error_msg() is the
 * one-line message naming the option (or argument) and the problem. -h/--help and --version stop
 * the parse where they appear. The environment is not read.
 */
flx_status_t flx_cli_parse(flx_cli_t *cli, int argc, char *const *argv, flx_cli_action_t *action_p);

/*
 * What a tool's main calls: flx_cli_parse, then the environment check (flx_cli_check_env), then
 * the progress meter (PROGRESS above). Prints help or the version to stdout and returns 0, prints a
 * usage error (flx_cli_usage_error) and returns 2, or returns FLX_CLI_PROCEED.
 */
int flx_cli_main(flx_cli_t *cli, int argc, char *const *argv);

/* The FLX_* environment variables every tool reads (FLX_ISA: flx_isa_env_check, FLX_LOG:
 * flx_log_env_check): FLX_ERR_INVALID naming the variable, its value and the valid ones. */
flx_status_t flx_cli_check_env(void);

/* Help: usage line, summary, positionals, options (with -h, --help, --version, --progress), the
 * epilog and the exit statuses. */
void flx_cli_help(const flx_cli_t *cli, FILE *f);
/* "PROG VERSION" (+ " (git DESCRIBE)" when built from a git checkout), one line. */
void flx_cli_version(const flx_cli_t *cli, FILE *f);

/* Times the long option `name` appeared (0 for an unknown name). */
uint32_t flx_cli_given(const flx_cli_t *cli, const char *name);

/* Checks between options, after a successful parse; each returns FLX_ERR_INVALID with the message
 * set, for flx_cli_usage_error to print:
 *   flx_cli_exclusive  at most one of options a and b, or (need_one) exactly one
 *   flx_cli_applies    when applies is 0, none of the NULL-terminated option names may be given:
 *                      "--NAME has no effect CONTEXT" (context: "with --mode full (only with --mode
 *                      fixed)") */
flx_status_t flx_cli_exclusive(const flx_cli_t *cli, const char *a, const char *b, int need_one);
flx_status_t flx_cli_applies(const flx_cli_t *cli, int applies, const char *context, ...)
    __attribute__((sentinel));

/* "PROG: <printf>" and "try 'PROG --help'" on stderr; returns FLX_EXIT_USAGE. With fmt NULL the
 * message is flx_error_msg(). */
int flx_cli_usage_error(const flx_cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "PROG: <printf>" on stderr; returns FLX_EXIT_FAILURE. Runtime failures: append flx_error_msg(). */
int flx_cli_fail(const flx_cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A comma-separated list of decimal integers in [lo, hi] ("2048,4096"), at most cap of them, for
 * list-valued options: FLX_ERR_INVALID naming opt and the bad item ("--OPT 'LIST': item ..."); *n_p
 * and out written only on success (the whole list is checked first). */
flx_status_t flx_cli_u64_list(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out, uint32_t cap,
                              uint32_t *n_p);
/* The same for a list of ranges "LO-HI,LO-HI" (lo <= LO <= HI <= hi): out_lo[i], out_hi[i]. */
flx_status_t flx_cli_range_list(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out_lo,
                                uint64_t *out_hi, uint32_t cap, uint32_t *n_p);
/* The same for a list of choices ("shm,tcp"; choices NULL-terminated, at most 32), each listed at
 * most once: out[i] is the index of item i in choices. */
flx_status_t flx_cli_enum_list(const char *opt, const char *s, const char *const *choices, int *out, uint32_t cap,
                               uint32_t *n_p);
/* The same for a list of non-zero ids, decimal or 0x hex ("1,0x2a"), each listed at most once;
 * cap at most 64. */
flx_status_t flx_cli_id_list(const char *opt, const char *s, uint64_t *out, uint32_t cap, uint32_t *n_p);
/* The same for a list of byte strings written as exactly 2 * bytes hex digits each (bytes 1..31; a
 * list item is shorter than 64 characters): item i into out[i * bytes ..]. */
flx_status_t flx_cli_hex_list(const char *opt, const char *s, uint32_t bytes, uint8_t *out, uint32_t cap,
                              uint32_t *n_p);

/* Reads a whole file (path "-": stdin; a regular file through flx_file_read, a pipe to its end) into
 * a new NUL-terminated buffer (free() it): for prompts, texts and id lists the tools take. FLX_ERR_NOT_FOUND / FLX_ERR_IO naming the path and the system's
 * reason; FLX_ERR_CAPACITY above max_bytes; *buf_p and *len_p written only on success. */
flx_status_t flx_cli_read_file(const char *path, size_t max_bytes, char **buf_p, size_t *len_p);

/* The project's version (CMake's PROJECT_VERSION) and `git describe` of the checkout it was built
 * from ("" when it was not built from one). */
const char *flx_version(void);
const char *flx_version_git(void);

#ifdef __cplusplus
}
#endif
#endif
