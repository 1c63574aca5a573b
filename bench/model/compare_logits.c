/*
 * compare_logits.c - compares two teacher-forced logit dumps in the FLXL format (see llama_ref.c
 * for the offset table): the reference (llama.cpp, from llama_ref) and a candidate (our runtime's
 * flx-model-dump, or a second llama_ref dump).
 *
 * DESIGN
 * Both dumps must describe the same pass: same vocabulary, same token ids at every compared
 * position (otherwise agreement numbers would be meaningless and the tool refuses). The argmax
 * agreement uses the per-position top-2 table, so it covers every position even when a dump keeps
 * full rows only for the first F; logit differences use the rows both dumps carry in full. Each
 * full row is also checked against its own top table (a writer bug would otherwise hide there).
 * Raw logits are compared, as asked; the shift-invariant log-softmax difference is printed too,
 * because two correct implementations may differ by a constant per row.
 *
 * usage: compare_logits REF.flxl TEST.flxl [-n N] [--all] [--min-agree X] [--max-diff Y] [-q]
 * (--help prints the same; the command line is flx/cli.h's, compiled in by build_llamacpp.sh)
 *   -n N          compare the first N positions (default 512; fewer if a dump is shorter: warned)
 *   --all         print every position, not only the disagreements
 *   --min-agree X exit 1 when the top-1 agreement share is below X
 *   --max-diff Y  exit 1 when the largest absolute logit difference exceeds Y
 *   -q            no per-position output
 * Last line: llamacpp_top1_agree=<share> max_logit_diff=<x>   (x = nan when no full rows overlap)
 * Exit: 0 compared (and thresholds met), 1 thresholds missed, non-finite logits or a bad input file,
 * 2 a usage error.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"

#define FLXL_HDR_BYTES 32

typedef struct {
    int32_t top1, top2;
    float l1, l2;
} flxl_top_t;

typedef struct {
    const char *path;
    FILE *f;
    uint32_t version, n, n_vocab, n_full, flags;
    char producer[9];
    int32_t *tokens; /* (n) */
    flxl_top_t *top; /* (n) */
} flxl_file_t;

static int flxl_open(flxl_file_t *d, const char *path)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    d->f = fopen(path, "rb");
    if (!d->f) {
        fprintf(stderr, "compare_logits: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned char h[FLXL_HDR_BYTES];
    if (fread(h, 1, sizeof h, d->f) != sizeof h) {
        fprintf(stderr, "compare_logits: %s: shorter than the %d-byte header\n", path, FLXL_HDR_BYTES);
        return -1;
    }
    if (memcmp(h, "FLXL", 4) != 0) {
        fprintf(stderr, "compare_logits: %s: bad magic %02x%02x%02x%02x (want \"FLXL\")\n", path, h[0], h[1], h[2],
                h[3]);
        return -1;
    }
    uint32_t w[5];
    memcpy(w, h + 4, sizeof w);
    d->version = w[0];
    d->n = w[1];
    d->n_vocab = w[2];
    d->n_full = w[3];
    d->flags = w[4];
    memcpy(d->producer, h + 24, 8);
    d->producer[8] = '\0';
    if (d->version != 1) {
        fprintf(stderr, "compare_logits: %s: format version %u, this tool reads 1\n", path, d->version);
        return -1;
    }
    if (d->n == 0 || d->n_vocab == 0 || d->n_full > d->n || d->n > (1u << 26) || d->n_vocab > (1u << 24)) {
        fprintf(stderr, "compare_logits: %s: implausible header n_tokens %u n_vocab %u n_full %u\n", path, d->n,
                d->n_vocab, d->n_full);
        return -1;
    }
    uint64_t want = FLXL_HDR_BYTES + 20ull * d->n + 4ull * d->n_full * d->n_vocab;
    if (fseeko(d->f, 0, SEEK_END) != 0) return -1;
    uint64_t have = (uint64_t)ftello(d->f);
    if (have != want) {
        fprintf(stderr,
                "compare_logits: %s: %llu bytes, the header (n_tokens %u, n_vocab %u, n_full %u) implies %llu\n",
                path, (unsigned long long)have, d->n, d->n_vocab, d->n_full, (unsigned long long)want);
        return -1;
    }
    fseeko(d->f, FLXL_HDR_BYTES, SEEK_SET);
    d->tokens = malloc(sizeof *d->tokens * d->n);
    d->top = malloc(sizeof *d->top * d->n);
    if (!d->tokens || !d->top || fread(d->tokens, sizeof *d->tokens, d->n, d->f) != d->n ||
        fread(d->top, sizeof *d->top, d->n, d->f) != d->n) {
        fprintf(stderr, "compare_logits: %s: cannot read the token and top tables\n", path);
        return -1;
    }
    for (uint32_t t = 0; t < d->n; t++) {
        if (d->tokens[t] < 0 || (uint32_t)d->tokens[t] >= d->n_vocab || d->top[t].top1 < 0 ||
            (uint32_t)d->top[t].top1 >= d->n_vocab) {
            fprintf(stderr, "compare_logits: %s: position %u: token %d / argmax %d outside the vocabulary %u\n", path,
                    t, d->tokens[t], d->top[t].top1, d->n_vocab);
            return -1;
        }
    }
    return 0;
}

static void flxl_close(flxl_file_t *d)
{
    if (d->f) fclose(d->f);
    free(d->tokens);
    free(d->top);
}

/* log-sum-exp of a row in double; NaN if the row has a NaN */
static double row_lse(const float *r, uint32_t n)
{
    double mx = -INFINITY;
    for (uint32_t v = 0; v < n; v++)
        if (r[v] > mx) mx = r[v];
    double z = 0.0;
    for (uint32_t v = 0; v < n; v++) z += exp((double)r[v] - mx);
    return mx + log(z);
}

int main(int argc, char **argv)
{
    const char *pa = NULL, *pb = NULL;
    uint64_t n_u = 512;
    int all = 0, quiet = 0;
    double min_agree = -1.0, max_diff = -1.0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_UINT('n', "positions", "N", &n_u, 1, INT32_MAX, 0,
                     "compare the first N positions (default 512; fewer if a dump is shorter: warned)"),
        FLX_CLI_FLAG(0, "all", &all, "print every position, not only the disagreements"),
        FLX_CLI_FLOAT(0, "min-agree", "X", &min_agree, 0.0, 1.0, 0, "exit 1 when the top-1 agreement share is below X"),
        FLX_CLI_FLOAT(0, "max-diff", "Y", &max_diff, 0.0, 1e30, 0,
                      "exit 1 when the largest absolute logit difference exceeds Y"),
        FLX_CLI_FLAG('q', "quiet", &quiet, "no per-position output"),
    };
    flx_cli_pos_t pos[] = {FLX_CLI_ARG("REF.flxl", &pa, "the reference dump (llama_ref)"),
                           FLX_CLI_ARG("TEST.flxl", &pb, "the candidate dump (flx-model-dump, or another llama_ref)")};
    flx_cli_t cli = FLX_CLI_INIT_POS("compare_logits", "Compares two teacher-forced logit dumps (FLXL) of the same "
                                     "token ids.", opts, pos);
    cli.epilog = "Last line: llamacpp_top1_agree=<share> max_logit_diff=<x>. Exit 1 also when a threshold is missed or "
                 "a logit is not finite.";
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_applies(&cli, !quiet, "with --quiet", "all", NULL)) return flx_cli_usage_error(&cli, NULL);
    const long n_want = (long)n_u;
    flxl_file_t A, B;
    memset(&A, 0, sizeof A);
    memset(&B, 0, sizeof B);
    rc = FLX_EXIT_FAILURE;
    float *ra = NULL, *rb = NULL;
    if (flxl_open(&A, pa) != 0 || flxl_open(&B, pb) != 0) goto out_b;
    if (A.n_vocab != B.n_vocab) {
        fprintf(stderr, "compare_logits: vocabularies differ: %s has %u, %s has %u\n", pa, A.n_vocab, pb, B.n_vocab);
        goto out_b;
    }
    uint32_t n = (uint32_t)n_want;
    if (A.n < n) n = A.n;
    if (B.n < n) n = B.n;
    if (n < (uint64_t)n_want)
        fprintf(stderr, "compare_logits: warning: only %u positions in common (%s: %u, %s: %u), %ld asked\n", n, pa,
                A.n, pb, B.n, n_want);
    for (uint32_t t = 0; t < n; t++) {
        if (A.tokens[t] != B.tokens[t]) {
            fprintf(stderr,
                    "compare_logits: token ids differ at position %u (%s: %d, %s: %d): not the same teacher-forced "
                    "input; feed both the same ids (llama_ref --tokens-out / --tokens)\n",
                    t, pa, A.tokens[t], pb, B.tokens[t]);
            goto out_b;
        }
    }
    printf("ref  %s: producer %s, %u positions (%u full rows), vocab %u\n", pa, A.producer, A.n, A.n_full, A.n_vocab);
    printf("test %s: producer %s, %u positions (%u full rows), vocab %u\n", pb, B.producer, B.n, B.n_full, B.n_vocab);

    /* top-1 agreement over every compared position */
    uint32_t agree = 0;
    for (uint32_t t = 0; t < n; t++) agree += A.top[t].top1 == B.top[t].top1;
    if (!quiet) {
        printf("argmax agreement map, 64 positions a line ('.' same, 'x' different):\n");
        for (uint32_t t = 0; t < n; t += 64) {
            printf("  %6u ", t);
            for (uint32_t u = t; u < n && u < t + 64; u++) putchar(A.top[u].top1 == B.top[u].top1 ? '.' : 'x');
            putchar('\n');
        }
        printf("  %6s %8s %8s %10s %8s %10s\n", "pos", "ref_top1", "test_top1", "ref_margin", "ref_top2", "test_margin");
        for (uint32_t t = 0; t < n; t++) {
            const flxl_top_t *x = &A.top[t], *y = &B.top[t];
            if (all || x->top1 != y->top1)
                printf("  %6u %8d %8d %10.4f %8d %10.4f%s\n", t, x->top1, y->top1, x->l1 - x->l2, x->top2,
                       y->l1 - y->l2, x->top1 != y->top1 ? "  DIFF" : "");
        }
    }

    /* logit differences over the rows both carry in full */
    uint32_t nf = n;
    if (A.n_full < nf) nf = A.n_full;
    if (B.n_full < nf) nf = B.n_full;
    ra = malloc(sizeof *ra * A.n_vocab);
    rb = malloc(sizeof *rb * A.n_vocab);
    if (!ra || !rb) goto out_b;
    double max_abs = 0.0, sum_abs = 0.0, max_lp = 0.0;
    uint32_t max_t = 0, max_v = 0;
    long n_nonfinite = 0, n_inconsistent = 0;
    const uint64_t off_a = FLXL_HDR_BYTES + 20ull * A.n, off_b = FLXL_HDR_BYTES + 20ull * B.n;
    fseeko(A.f, (off_t)off_a, SEEK_SET);
    fseeko(B.f, (off_t)off_b, SEEK_SET);
    for (uint32_t t = 0; t < nf; t++) {
        if (fread(ra, sizeof *ra, A.n_vocab, A.f) != A.n_vocab || fread(rb, sizeof *rb, B.n_vocab, B.f) != B.n_vocab) {
            fprintf(stderr, "compare_logits: short read of row %u of %s or %s\n", t, pa, pb);
            goto out_b;
        }
        double la = row_lse(ra, A.n_vocab), lb = row_lse(rb, B.n_vocab);
        for (uint32_t v = 0; v < A.n_vocab; v++) {
            if (!isfinite(ra[v]) || !isfinite(rb[v])) {
                n_nonfinite++;
                continue;
            }
            double d = fabs((double)ra[v] - (double)rb[v]);
            sum_abs += d;
            if (d > max_abs) max_abs = d, max_t = t, max_v = v;
            double dl = fabs(((double)ra[v] - la) - ((double)rb[v] - lb));
            if (dl > max_lp) max_lp = dl;
        }
        /* the row's own argmax must be the one its top table names (up to ties) */
        if (ra[A.top[t].top1] != A.top[t].l1 || rb[B.top[t].top1] != B.top[t].l1) n_inconsistent++;
        for (uint32_t v = 0; v < A.n_vocab; v++)
            if (ra[v] > A.top[t].l1 || rb[v] > B.top[t].l1) {
                n_inconsistent++;
                break;
            }
    }
    double share = (double)agree / (double)n;
    printf("positions compared       %u (first %ld asked)\n", n, n_want);
    printf("top-1 agreement          %u / %u = %.4f\n", agree, n, share);
    if (nf > 0) {
        printf("full rows compared       %u x %u logits\n", nf, A.n_vocab);
        printf("max |logit diff|         %.6g (position %u, token %u)\n", max_abs, max_t, max_v);
        printf("mean |logit diff|        %.6g\n", sum_abs / ((double)nf * A.n_vocab - (double)n_nonfinite));
        printf("max |log-softmax diff|   %.6g\n", max_lp);
    } else {
        printf("full rows compared       0 (a dump has no full rows: logit difference unknown)\n");
    }
    rc = 0;
    if (n_nonfinite) {
        printf("NON-FINITE logits        %ld\n", n_nonfinite);
        rc = 1;
    }
    if (n_inconsistent) {
        printf("INCONSISTENT rows        %ld (a full row's argmax is not its top table's)\n", n_inconsistent);
        rc = 1;
    }
    if (min_agree >= 0 && share < min_agree) {
        printf("FAIL: top-1 agreement %.4f < %.4f\n", share, min_agree);
        rc = 1;
    }
    if (max_diff >= 0 && nf > 0 && max_abs > max_diff) {
        printf("FAIL: max logit diff %.6g > %.6g\n", max_abs, max_diff);
        rc = 1;
    }
    if (nf > 0)
        printf("llamacpp_top1_agree=%.4f max_logit_diff=%.6g\n", share, max_abs);
    else
        printf("llamacpp_top1_agree=%.4f max_logit_diff=nan\n", share);
out_b:
    free(ra);
    free(rb);
    flxl_close(&A);
    flxl_close(&B);
    return rc;
}
