/*
 * fluxion-attn - run Fluxion's attention core on q, K, V from a safetensors file, so an engineer can
 * check the kernels against their own framework.
 *
 * usage: fluxion-attn IN.safetensors OUT.safetensors [--mode full|sparse|fixed] [--blk N]
 *                     [--budget X] [--sink N] [--local N] [-t N] [--isa scalar|avx2|avx512|avx512bf16|amx] [--ref]
 *
 * INPUT tensors
 *   q        F32 or BF16  (H, D)          one decode query per query head
 *   k, v     BF16 or F32  (H_kv, L, D)    the prompt's keys and values; H a multiple of H_kv,
 *                                         D a multiple of 16 in 16..256, L >= 1 (F32 is rounded to bf16)
 *   budgets  F32          (H)             optional; per-head budget in [0, 1] (mode sparse)
 * INPUT "__metadata__" keys (strings; command-line flags override them)
 *   mode     full | sparse | fixed        default: sparse when "budgets" exists, else full
 *   blk      16 | 32 | 64 | 128           default 16 (sparse, fixed)
 *   budget   number in [0, 1]             fixed mode: every head's budget
 *   sink     default 64;  local  default 256
 * The KV is laid out exactly as the kvstore holds it: window = the first min(sink, L) tokens and the
 * last local ones; the l_cpu tokens between are host-resident; budget = fraction of l_cpu a head reads
 * beyond its window: k = ceil(budget * l_cpu / blk) blocks (see flx/attn.h).
 * OUTPUT tensors: o F32 (H, D), lse F32 (H) (natural log of the softmax denominator over the tokens
 * read, scale 1/sqrt(D)); metadata records mode, blk, sink, local, isa.
 * Exit status (flx/cli.h): 0 ok, 1 a malformed or inconsistent input (the message names the tensor
 * or key) or another runtime failure, 2 a usage error.
 * -t N: workers of the pool the kernels run on (absent: FLX_THREADS, else the CPU budget; printed
 * on stderr as "workers N: <why>"); the output does not depend on it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn_layout.h"
#include "flx/cli.h"
#include "flx/safetensors.h"
#include "flx/util.h"

typedef struct {
    const flx_st_tensor_t *k, *v;
    uint32_t L, D, head;
} rows_ctx_t;

/* Tensor data may start at any byte (safetensors does not align it): read through byte pointers. */
static void load_row(const flx_st_tensor_t *t, size_t off, uint32_t D, flx_bf16_t *dst)
{
    const uint8_t *p = t->data;
    if (t->dtype == FLX_DT_BF16)
        memcpy(dst, p + off * 2, D * sizeof *dst);
    else
        for (uint32_t d = 0; d < D; d++) {
            float x;
            memcpy(&x, p + (off + d) * 4, 4);
            dst[d] = flx_f32_to_bf16(x);
        }
}

static void rows(void *ctx, uint32_t i, flx_bf16_t *k, flx_bf16_t *v)
{
    rows_ctx_t *c = ctx;
    size_t off = ((size_t)c->head * c->L + i) * c->D;
    load_row(c->k, off, c->D, k);
    load_row(c->v, off, c->D, v);
}

static float get_f(const flx_st_tensor_t *t, size_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == FLX_DT_BF16) {
        flx_bf16_t h;
        memcpy(&h, p + i * 2, 2);
        return flx_bf16_to_f32(h);
    }
    float x;
    memcpy(&x, p + i * 4, 4);
    return x;
}

static int check_dt(const flx_st_tensor_t *t, const char *name, int n_dims)
{
    if (t->dtype != FLX_DT_F32 && t->dtype != FLX_DT_BF16) {
        fprintf(stderr, "fluxion-attn: tensor \"%s\" has dtype %s; expected F32 or BF16\n", name,
                flx_dtype_name(t->dtype));
        return -1;
    }
    if (t->n_dims != n_dims) {
        fprintf(stderr, "fluxion-attn: tensor \"%s\" has %d dimensions; expected %d\n", name, t->n_dims, n_dims);
        return -1;
    }
    return 0;
}

static int check_finite(const flx_st_tensor_t *t, const char *name)
{
    size_t n = t->nbytes / flx_dtype_size(t->dtype);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(get_f(t, i))) {
            fprintf(stderr, "fluxion-attn: tensor \"%s\" element %zu is not finite\n", name, i);
            return -1;
        }
    return 0;
}

/* The integer metadata key of the input in [lo, hi] into *out, unless the command line gave the
 * option of that name (or the key is absent): -1 with the message printed when it is malformed. */
static int meta_u32(const flx_cli_t *cli, flx_st_reader_h rd, const char *in, const char *key, uint64_t lo,
                    uint64_t hi, uint32_t *out)
{
    const char *s = flx_st_metadata(rd, key);
    uint64_t v;
    if (flx_cli_given(cli, key) || !s) return 0;
    if (flx_parse_u64(s, lo, hi, &v)) {
        fprintf(stderr, "fluxion-attn: %s: metadata \"%s\" = \"%.64s\" is not an integer in %llu..%llu\n", in, key, s,
                (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const char *const modes[] = {"full", "sparse", "fixed", NULL},
                             *const blks[] = {"16", "32", "64", "128", NULL},
                             *const isas[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx", NULL};
    const char *in = NULL, *out = NULL;
    int mode_i = 0, blk_i = 0, isa_i = 0, use_ref = 0;
    uint64_t sink_u = 64, local_u = 256, threads_u = 0;
    double budget_d = 0;
    flx_cli_opt_t opts[] = {
        FLX_CLI_ENUM(0, "mode", &mode_i, modes, 0,
                     "full, sparse (per-head \"budgets\") or fixed (one --budget); default: the input's\n"
                     "\"mode\" metadata, else sparse when it has \"budgets\", else full"),
        FLX_CLI_ENUM(0, "blk", &blk_i, blks, 0, "sparse, fixed: logical block size (default: metadata, else 16)"),
        FLX_CLI_FLOAT(0, "budget", "X", &budget_d, 0.0, 1.0, 0, "fixed: every head's budget (default: metadata)"),
        FLX_CLI_UINT(0, "sink", "N", &sink_u, 0, UINT32_MAX, 0, "window sink tokens (default: metadata, else 64)"),
        FLX_CLI_UINT(0, "local", "N", &local_u, 0, UINT32_MAX, 0, "window local tokens (default: metadata, else 256)"),
        FLX_CLI_UINT('t', "threads", "N", &threads_u, 1, 1024, 0, "worker threads (default: all)"),
        FLX_CLI_ENUM(0, "isa", &isa_i, isas, 0, "cap the kernels' instruction set (default: the best the CPU has)"),
        FLX_CLI_FLAG(0, "ref", &use_ref, "run the scalar reference kernels end to end"),
    };
    flx_cli_pos_t pos[] = {FLX_CLI_ARG("IN", &in, "safetensors: q (H, D), k and v (H_kv, L, D), optional budgets (H)"),
                           FLX_CLI_ARG("OUT", &out, "safetensors written: o (H, D) and lse (H)")};
    flx_cli_t cli = FLX_CLI_INIT_POS("fluxion-attn", "Runs Fluxion's attention core on your q, K, V.", opts, pos);
    cli.epilog = "Options override the input's \"__metadata__\" keys mode, blk, budget, sink and local.";
    int rc = flx_cli_main(&cli, argc, argv);
    if (rc != FLX_CLI_PROCEED) return rc;
    if (flx_cli_applies(&cli, !use_ref, "with --ref (the scalar references run on one thread)", "isa", "threads", NULL))
        return flx_cli_usage_error(&cli, NULL);
    if (flx_cli_given(&cli, "mode") &&
        (flx_cli_applies(&cli, mode_i == 2, "without --mode fixed", "budget", NULL) ||
         flx_cli_applies(&cli, mode_i != 0, "with --mode full (it reads every block)", "blk", NULL)))
        return flx_cli_usage_error(&cli, NULL);
    if (flx_cli_given(&cli, "isa")) flx_isa_force((flx_isa_t)isa_i);
    flx_st_reader_h rd = NULL;
    flx_status_t st = flx_st_open(in, &rd);
    if (st) return flx_cli_fail(&cli, "cannot read %s: %s", in, flx_error_msg());
    rc = FLX_EXIT_FAILURE;
    flx_attn_layout_t *lays = NULL;
    void *mem = NULL;
    flx_pool_h pool = NULL;
    float *q = NULL, *o = NULL, *lse = NULL, *budgets = NULL;
    uint32_t H_kv = 0;
    flx_st_writer_h wr = NULL;

    const flx_st_tensor_t *tq = flx_st_find(rd, "q"), *tk = flx_st_find(rd, "k"), *tv = flx_st_find(rd, "v"),
                          *tb = flx_st_find(rd, "budgets");
    if (!tq || !tk || !tv) {
        fprintf(stderr, "fluxion-attn: %s: missing tensor \"%s\"\n", in, !tq ? "q" : !tk ? "k" : "v");
        goto out;
    }
    if (check_dt(tq, "q", 2) || check_dt(tk, "k", 3) || check_dt(tv, "v", 3)) goto out;
    int64_t H = tq->shape[0], D = tq->shape[1];
    H_kv = (uint32_t)tk->shape[0];
    int64_t L = tk->shape[1];
    if (tk->shape[0] < 1 || tk->shape[0] > 4096 || H < 1 || H % tk->shape[0]) {
        fprintf(stderr, "fluxion-attn: q has %lld heads, k has %lld kv heads: need H a multiple of H_kv >= 1\n",
                (long long)H, (long long)tk->shape[0]);
        goto out;
    }
    if (D < 16 || D > FLX_ATTN_MAX_HEAD_DIM || D % 16) {
        fprintf(stderr, "fluxion-attn: q head_dim %lld not a multiple of 16 in 16..%d\n", (long long)D,
                FLX_ATTN_MAX_HEAD_DIM);
        goto out;
    }
    if (tk->shape[2] != D || L < 1 || L > 0x7fffffff) {
        fprintf(stderr, "fluxion-attn: k shape (%lld, %lld, %lld) inconsistent with q head_dim %lld (need L >= 1)\n",
                (long long)tk->shape[0], (long long)L, (long long)tk->shape[2], (long long)D);
        goto out;
    }
    for (int d = 0; d < 3; d++)
        if (tv->shape[d] != tk->shape[d]) {
            fprintf(stderr, "fluxion-attn: v shape dim %d is %lld, k's is %lld\n", d, (long long)tv->shape[d],
                    (long long)tk->shape[d]);
            goto out;
        }
    uint32_t G = (uint32_t)(H / H_kv);
    if (G > FLX_ATTN_MAX_GROUP) {
        fprintf(stderr, "fluxion-attn: group size %u above %d\n", G, FLX_ATTN_MAX_GROUP);
        goto out;
    }
    if (check_finite(tq, "q") || check_finite(tk, "k") || check_finite(tv, "v")) goto out;

    /* configuration: the command line over the input's metadata over the defaults; the metadata's
     * values are checked here (the command line's were by the parser) */
    const char *m_mode = flx_st_metadata(rd, "mode"), *m_bud = flx_st_metadata(rd, "budget");
    if (!flx_cli_given(&cli, "mode")) {
        for (mode_i = 0; m_mode && modes[mode_i] && strcmp(m_mode, modes[mode_i]); mode_i++) continue;
        if (m_mode && !modes[mode_i]) {
            fprintf(stderr, "fluxion-attn: %s: metadata \"mode\" = \"%.64s\" is not full, sparse or fixed\n", in,
                    m_mode);
            goto out;
        }
        if (!m_mode) mode_i = tb ? 1 : 0;
    }
    const char *mode_s = modes[mode_i];
    flx_attn_cfg_t cfg = {.mode = mode_i == 0 ? FLX_ATTN_FULL : mode_i == 1 ? FLX_ATTN_SPARSE : FLX_ATTN_FIXED};
    uint32_t blk = 16u << blk_i, sink = (uint32_t)sink_u, local = (uint32_t)local_u, threads = (uint32_t)threads_u;
    if (meta_u32(&cli, rd, in, "blk", 16, 128, &blk) || meta_u32(&cli, rd, in, "sink", 0, UINT32_MAX, &sink) ||
        meta_u32(&cli, rd, in, "local", 0, UINT32_MAX, &local))
        goto out;
    if (flx_attn_blk_level(blk) < 0) {
        fprintf(stderr, "fluxion-attn: %s: metadata \"blk\" = %u is not 16, 32, 64 or 128\n", in, blk);
        goto out;
    }
    if (cfg.mode != FLX_ATTN_FIXED && flx_cli_given(&cli, "budget")) {
        fprintf(stderr, "fluxion-attn: --budget has no effect: %s sets mode %s (only fixed reads it)\n", in, mode_s);
        goto out;
    }
    if (cfg.mode == FLX_ATTN_FULL && flx_cli_given(&cli, "blk")) {
        fprintf(stderr, "fluxion-attn: --blk has no effect: %s sets mode full (it reads every block)\n", in);
        goto out;
    }
    cfg.blk = blk;
    if (cfg.mode == FLX_ATTN_FIXED) {
        double b = budget_d;
        if (!flx_cli_given(&cli, "budget") && (!m_bud || flx_parse_f64(m_bud, &b) || !(b >= 0 && b <= 1))) {
            fprintf(stderr, "fluxion-attn: fixed mode needs a budget in [0, 1]: give --budget X (%s's metadata "
                    "\"budget\" is \"%.64s\")\n", in, m_bud ? m_bud : "absent");
            goto out;
        }
        cfg.budget = (float)b;
    }
    budgets = malloc(H * sizeof *budgets);
    q = malloc(H * D * sizeof *q);
    o = malloc(H * D * sizeof *o);
    lse = malloc(H * sizeof *lse);
    lays = calloc(H_kv, sizeof *lays);
    if (!budgets || !q || !o || !lse || !lays) {
        fprintf(stderr, "fluxion-attn: out of memory\n");
        goto out;
    }
    if (cfg.mode == FLX_ATTN_SPARSE) {
        if (!tb) {
            fprintf(stderr, "fluxion-attn: sparse mode needs tensor \"budgets\" F32 (%lld)\n", (long long)H);
            goto out;
        }
        if (tb->dtype != FLX_DT_F32 || tb->n_dims != 1 || tb->shape[0] != H) {
            fprintf(stderr, "fluxion-attn: tensor \"budgets\" must be F32 (%lld); found %s with %d dims\n",
                    (long long)H, flx_dtype_name(tb->dtype), tb->n_dims);
            goto out;
        }
        for (int64_t h = 0; h < H; h++) {
            budgets[h] = get_f(tb, h);
            if (!(budgets[h] >= 0 && budgets[h] <= 1)) {
                fprintf(stderr, "fluxion-attn: tensor \"budgets\" element %lld is %g, not in [0, 1]\n", (long long)h,
                        (double)budgets[h]);
                goto out;
            }
        }
    }
    for (int64_t i = 0; i < H * D; i++) q[i] = get_f(tq, i);

    flx_pool_params_t pp = {.field_mask = threads ? FLX_POOL_FIELD_N_WORKERS : 0, .n_workers = threads};
    if ((st = flx_pool_create(&pp, &pool))) {
        fprintf(stderr, "fluxion-attn: worker pool: %s\n", flx_error_msg());
        goto out;
    }
    fprintf(stderr, "fluxion-attn: %s\n", flx_pool_describe(pool));
    flx_attn_shape_t shape = {.group = G, .head_dim = (uint32_t)D, .max_l_cpu = (uint32_t)L, .pool = pool};
    size_t bytes;
    if ((st = flx_attn_plan(&shape, &bytes))) {
        fprintf(stderr, "fluxion-attn: %s\n", flx_error_msg());
        goto out;
    }
    mem = flx_aligned_alloc(64, bytes);
    flx_attn_ws_t ws;
    if (!mem || flx_attn_ws_init(&ws, &shape, mem, bytes)) {
        fprintf(stderr, "fluxion-attn: workspace of %zu bytes: %s\n", bytes, flx_error_msg());
        goto out;
    }
    for (uint32_t g = 0; g < H_kv; g++) {
        rows_ctx_t ctx = {.k = tk, .v = tv, .L = (uint32_t)L, .D = (uint32_t)D, .head = g};
        if ((st = flx_attn_layout_build(&lays[g], (uint32_t)L, (uint32_t)D, sink, local, rows, &ctx))) {
            fprintf(stderr, "fluxion-attn: kv head %u: %s\n", g, flx_error_msg());
            goto out;
        }
        const flx_kv_head_view_t *view = &lays[g].view;
        float *qg = q + (size_t)g * G * D, *og = o + (size_t)g * G * D, *lg = lse + (size_t)g * G;
        cfg.budgets = budgets + (size_t)g * G;
        if (!use_ref) {
            st = flx_attn_group_run(&ws, view, qg, &cfg, og, lg, NULL);
        } else {
            /* the scalar references end to end: window, scores, sorting top-k, sparse, merge */
            float *ow = malloc(G * D * sizeof *ow), lw[FLX_ATTN_MAX_GROUP];
            int level = cfg.mode == FLX_ATTN_FULL ? 0 : flx_attn_blk_level(cfg.blk);
            uint32_t n = view->meta_n[level], *sel = malloc(((size_t)G * n + 1) * 4), kk[FLX_ATTN_MAX_GROUP];
            float *sc = malloc(((size_t)G * n + 1) * 4);
            st = ow && sel && sc ? flx_attn_window_ref(view, G, qg, ow, lw) : FLX_ERR_NOMEM;
            if (!st && cfg.mode != FLX_ATTN_FULL) st = flx_attn_score_ref(view, level, G, qg, sc);
            for (uint32_t h = 0; h < G && !st; h++) {
                float b = cfg.mode == FLX_ATTN_FULL ? 1.0f : cfg.mode == FLX_ATTN_FIXED ? cfg.budget : cfg.budgets[h];
                kk[h] = flx_attn_budget_blocks(b, view->l_cpu, 16u << level);
                if (cfg.mode == FLX_ATTN_FULL)
                    for (uint32_t i = 0; i < n; i++) sel[(size_t)h * n + i] = i;
                else
                    st = flx_topk_ref(sc + (size_t)h * n, n, kk[h], sel + (size_t)h * n);
            }
            if (!st) st = flx_attn_sparse_ref(view, level, G, qg, sel, n, kk, og, lg);
            if (!st) flx_attn_merge(G, (uint32_t)D, ow, lw, og, lg, og, lg);
            free(ow);
            free(sel);
            free(sc);
        }
        flx_attn_layout_free(&lays[g]);
        if (st) {
            fprintf(stderr, "fluxion-attn: kv head %u: %s\n", g, flx_error_msg());
            goto out;
        }
    }
    int64_t so[2] = {H, D}, sl[1] = {H};
    char buf[32];
    if ((st = flx_st_writer_create(&wr)) || (st = flx_st_writer_add(wr, "o", FLX_DT_F32, 2, so, o)) ||
        (st = flx_st_writer_add(wr, "lse", FLX_DT_F32, 1, sl, lse)) ||
        (st = flx_st_writer_set_metadata(wr, "mode", mode_s)) ||
        (snprintf(buf, sizeof buf, "%u", blk), st = flx_st_writer_set_metadata(wr, "blk", buf)) ||
        (snprintf(buf, sizeof buf, "%u", sink), st = flx_st_writer_set_metadata(wr, "sink", buf)) ||
        (snprintf(buf, sizeof buf, "%u", local), st = flx_st_writer_set_metadata(wr, "local", buf)) ||
        (st = flx_st_writer_set_metadata(wr, "isa", use_ref ? "ref" : flx_isa_name(flx_isa_active()))) ||
        (st = flx_st_writer_save(wr, out))) {
        fprintf(stderr, "fluxion-attn: writing %s: %s\n", out, flx_error_msg());
        goto out;
    }
    rc = 0;
out:
    if (lays)
        for (uint32_t g = 0; g < H_kv; g++) flx_attn_layout_free(&lays[g]);
    free(lays);
    flx_st_writer_destroy(wr);
    flx_aligned_free(mem);
    free(q);
    free(o);
    free(lse);
    free(budgets);
    flx_st_close(rd);
    flx_pool_destroy(pool);
    return rc;
}
