/*
 * fluxion-attn - run Fluxion's attention core on q, K, V from a safetensors file, so an engineer can
 * check the kernels against their own framework.
 *
 * usage: fluxion-attn IN.safetensors OUT.safetensors [--mode full|sparse|fixed] [--blk N]
 *                     [--budget X] [--sink N] [--local N] [--threads N] [--isa scalar|avx2|avx512|avx512bf16] [--ref]
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
 * --threads N: workers of the pool the kernels run on (0 or absent: FLX_THREADS, else the CPU
 * budget; printed on stderr as "workers N: <why>"); the output does not depend on it.
 * Exit status: 0 ok, 2 malformed/inconsistent input or arguments (message names the tensor or key),
 * 1 other failures.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/attn_layout.h"
#include "flx/safetensors.h"
#include "flx/util.h"

typedef struct {
    const flx_st_tensor_t *k, *v;
    uint32_t L, D, head;
} rows_ctx_t;

static void load_row(const flx_st_tensor_t *t, size_t off, uint32_t D, flx_bf16_t *dst)
{
    if (t->dtype == FLX_DT_BF16)
        memcpy(dst, (const flx_bf16_t *)t->data + off, D * sizeof *dst);
    else
        for (uint32_t d = 0; d < D; d++) {
            float x;
            memcpy(&x, (const char *)t->data + (off + d) * 4, 4);
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
    if (t->dtype == FLX_DT_BF16) return flx_bf16_to_f32(((const flx_bf16_t *)t->data)[i]);
    float x;
    memcpy(&x, (const char *)t->data + i * 4, 4);
    return x;
}

static int fail(int code, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "fluxion-attn: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return code;
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long x = strtoul(s, &end, 10);
    if (!*s || *end || errno || x > 0xffffffffu || s[0] == '-') return -1;
    *out = (uint32_t)x;
    return 0;
}

static int parse_f(const char *s, float *out)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (!*s || *end || errno) return -1;
    *out = (float)x;
    return 0;
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

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *mode_s = NULL, *blk_s = NULL, *bud_s = NULL, *sink_s = NULL,
               *local_s = NULL, *thr_s = NULL, *isa_s = NULL;
    int use_ref = 0;
    for (int i = 1; i < argc; i++) {
        const char **dst = NULL;
        if (!strcmp(argv[i], "--mode")) dst = &mode_s;
        else if (!strcmp(argv[i], "--blk")) dst = &blk_s;
        else if (!strcmp(argv[i], "--budget")) dst = &bud_s;
        else if (!strcmp(argv[i], "--sink")) dst = &sink_s;
        else if (!strcmp(argv[i], "--local")) dst = &local_s;
        else if (!strcmp(argv[i], "--threads")) dst = &thr_s;
        else if (!strcmp(argv[i], "--isa")) dst = &isa_s;
        else if (!strcmp(argv[i], "--ref")) use_ref = 1;
        else if (argv[i][0] == '-' && argv[i][1]) return fail(2, "unknown option %s%s", argv[i], "");
        else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return fail(2, "unexpected argument %s%s", argv[i], "");
        if (dst) {
            if (i + 1 >= argc) return fail(2, "option %s needs a value%s", argv[i], "");
            *dst = argv[++i];
        }
    }
    if (!in || !out) {
        fprintf(stderr, "usage: fluxion-attn IN.safetensors OUT.safetensors [--mode full|sparse|fixed] [--blk N]\n"
                        "       [--budget X] [--sink N] [--local N] [--threads N] [--isa scalar|avx2|avx512|avx512bf16] [--ref]\n");
        return 2;
    }
    flx_st_reader_h rd = NULL;
    flx_status_t st = flx_st_open(in, &rd);
    if (st) return fail(2, "cannot read %s: %s", in, flx_error_msg());
    int rc = 2;
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

    /* configuration: flags over metadata over defaults */
    if (!mode_s) mode_s = flx_st_metadata(rd, "mode");
    if (!blk_s) blk_s = flx_st_metadata(rd, "blk");
    if (!bud_s) bud_s = flx_st_metadata(rd, "budget");
    if (!sink_s) sink_s = flx_st_metadata(rd, "sink");
    if (!local_s) local_s = flx_st_metadata(rd, "local");
    if (!mode_s) mode_s = tb ? "sparse" : "full";
    flx_attn_cfg_t cfg = {0};
    if (!strcmp(mode_s, "full")) cfg.mode = FLX_ATTN_FULL;
    else if (!strcmp(mode_s, "sparse")) cfg.mode = FLX_ATTN_SPARSE;
    else if (!strcmp(mode_s, "fixed")) cfg.mode = FLX_ATTN_FIXED;
    else {
        fprintf(stderr, "fluxion-attn: mode \"%s\" is not full, sparse or fixed\n", mode_s);
        goto out;
    }
    uint32_t blk = 16, sink = 64, local = 256, threads = 0;
    if (blk_s && (parse_u32(blk_s, &blk) || flx_attn_blk_level(blk) < 0)) {
        fprintf(stderr, "fluxion-attn: blk \"%s\" is not 16, 32, 64 or 128\n", blk_s);
        goto out;
    }
    if ((sink_s && parse_u32(sink_s, &sink)) || (local_s && parse_u32(local_s, &local))) {
        fprintf(stderr, "fluxion-attn: sink \"%s\" / local \"%s\" must be non-negative integers\n",
                sink_s ? sink_s : "", local_s ? local_s : "");
        goto out;
    }
    if (thr_s && (parse_u32(thr_s, &threads) || threads > FLX_POOL_MAX_WORKERS)) {
        fprintf(stderr, "fluxion-attn: threads \"%s\" invalid (0..%u; 0: FLX_THREADS, else the CPU budget)\n", thr_s,
                FLX_POOL_MAX_WORKERS);
        goto out;
    }
    if (isa_s) {
        flx_isa_t isa;
        if (flx_isa_parse(isa_s, &isa)) {
            fprintf(stderr, "fluxion-attn: isa \"%s\" is not scalar, avx2, avx512 or avx512bf16\n", isa_s);
            goto out;
        }
        flx_isa_force(isa);
    }
    cfg.blk = blk;
    if (cfg.mode == FLX_ATTN_FIXED) {
        if (!bud_s || parse_f(bud_s, &cfg.budget) || !(cfg.budget >= 0 && cfg.budget <= 1)) {
            fprintf(stderr, "fluxion-attn: fixed mode needs budget in [0, 1] (got \"%s\")\n", bud_s ? bud_s : "none");
            goto out;
        }
    }
    budgets = malloc(H * sizeof *budgets);
    q = malloc(H * D * sizeof *q);
    o = malloc(H * D * sizeof *o);
    lse = malloc(H * sizeof *lse);
    lays = calloc(H_kv, sizeof *lays);
    if (!budgets || !q || !o || !lse || !lays) {
        fprintf(stderr, "fluxion-attn: out of memory\n");
        rc = 1;
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
        rc = 1;
        goto out;
    }
    rc = 1;
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
            rc = st == FLX_ERR_INVALID ? 2 : 1;
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
