/*
 * test_attn_gpu_host - the GPU worker's kernels (flx/attn_gpu.h, HOST PART ON THE DEVICE) against
 * their CPU references (label gpu; exits 77 where no CUDA device is usable, including builds
 * without CUDA). The host-resident KV is read by the device in place from page-locked memory
 * through its device addresses (UVA), as from a pinned store:
 *  (a) Quest scoring of every level vs flx_attn_score_ref (double), G in {1, 4, 8, 9}, D in
 *      {16, 64, 128, 256}; metadata entries only, nothing past meta_n read (NaN rows after them);
 *  (b) top-k vs flx_topk: the same indices in the same order, on normal scores, heavy ties, all
 *      equal, NaN and signed zeros, k in {0, 1, n / 3, n - 1, n}, n up to 20000 (320K tokens at
 *      blk 16); and the same set as flx_topk_ref;
 *  (c) sparse attention over random distinct selections (k 0 .. n per head, heads sharing blocks)
 *      vs flx_attn_sparse_ref; the K/V rows past l_cpu and the unused physical blocks hold NaN, so
 *      a kernel that reads a row it must not fails; heads that read nothing give o = 0, lse = -inf;
 *  (d) the LSE merge vs flx_attn_merge, in place, with -inf partials; and the many-part merge behind
 *      every task (1 to 300 parts, D up to 300) vs a double reference, dropped parts holding NaN;
 *  (e) the whole task on views of a real store pinned with FLX_KV_STORE_PIN_CUDA: SPARSE (budgets
 *      0 and 1 among them), FIXED and FULL at every blk, with and without a window partial, several
 *      tasks in flight on two streams; the selection is flx_topk's on the reference scores up to
 *      near-ties, and (o, lse) equal the reference over that selection merged with the window;
 *      attn_bytes equal flx_attn_host_run's for the same selection;
 *  (f) refusals: a view without device addresses, finishing twice, launching on a busy workspace.
 * Tolerances as test_attn_gpu (fp32 online softmax vs double): o 3e-5 + 2e-4 |ref|, lse
 * 1e-4 + 1e-5 |ref|; scores 1e-4 + 1e-5 |ref| (test_attn_kernels' bound for the CPU fast kernel).
 */
#include <math.h>
#include <string.h>

#include "attn_testutil.h"
#include "flx/attn_gpu.h"
#include "flx/cuda_rt.h"
#include "kvstore/kv_testutil.h"
#ifdef FLX_HAVE_CUDA
#include "attn_gpu_internal.h"   /* the many-part merge's launcher */
#endif

#define O_ATOL 3e-5
#define O_RTOL 2e-4
#define L_ATOL 1e-4
#define L_RTOL 1e-5
#define S_ATOL 1e-4
#define S_RTOL 1e-5

static flx_rng_t rng;
static flx_cuda_stream_t g_stream[2];

static void *dmalloc(size_t bytes)
{
    void *d;
    CHECK_OK(flx_cuda_malloc(0, bytes, &d));
    return d;
}

static void *dev_upload(const void *src, size_t bytes)
{
    void *d = dmalloc(bytes);
    CHECK_OK(flx_cuda_copy_htod(0, d, src, bytes));
    return d;
}

static void dev_download(void *dst, const void *src, size_t bytes)
{
    CHECK_OK(flx_cuda_stream_sync(0, g_stream[0]));
    CHECK_OK(flx_cuda_copy_dtoh(0, dst, src, bytes));
}

static void rand_f(float *x, size_t n, double sd)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(flx_rng_normal(&rng) * sd);
}

/* A hand-built view (attn_testutil: random block table, NaN past l_cpu and in unused blocks) moved
 * into one page-locked buffer, with the device addresses of that buffer. */
typedef struct pinned {
    tkv_t t;
    uint8_t *buf;
    flx_kv_head_view_t view;
    flx_attn_gpu_view_t gv;
} pinned_t;

static void pinned_make(pinned_t *p, uint32_t D, uint32_t l_cpu)
{
    tkv_make(&p->t, &rng, D, l_cpu, 8);
    const uint32_t nb = p->t.view.n_blocks, nphys = nb + 3;
    const size_t bb = p->t.view.block_bytes;
    size_t off[2 + FLX_KV_META_LEVELS], len[2 + FLX_KV_META_LEVELS], tot = 0;
    len[0] = nphys * bb;
    len[1] = (nb + 1) * sizeof(uint32_t);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++)
        len[2 + j] = ((size_t)p->t.view.meta_n[j] * 2 + 2) * D * sizeof(flx_bf16_t);   /* + a NaN entry */
    for (int i = 0; i < 2 + FLX_KV_META_LEVELS; i++) {
        off[i] = tot;
        tot = FLX_ALIGN_UP(tot + len[i], 256);
    }
    CHECK_OK(flx_cuda_host_alloc(tot, (void **)&p->buf));
    memcpy(p->buf + off[0], p->t.pool, len[0]);
    memcpy(p->buf + off[1], p->t.table, nb * sizeof(uint32_t));
    p->view = p->t.view;
    p->view.pool_base = p->buf + off[0];
    p->view.block_table = (const uint32_t *)(p->buf + off[1]);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) {
        flx_bf16_t *m = (flx_bf16_t *)(p->buf + off[2 + j]);
        const size_t ne = (size_t)p->t.view.meta_n[j] * 2 * D;
        memcpy(m, p->t.meta[j], ne * sizeof *m);
        for (size_t i = ne; i < ne + 2 * D; i++) m[i] = 0x7fc0;   /* past the last entry: NaN */
        p->view.meta[j] = m;
    }
    const uint8_t *dev;
    CHECK_OK(flx_cuda_host_device_ptr(0, p->buf, (const void **)&dev));
    p->view.pool_base_dev = dev + off[0];
    p->view.block_table_dev = (const uint32_t *)(dev + off[1]);
    for (int j = 0; j < FLX_KV_META_LEVELS; j++) p->view.meta_dev[j] = (const flx_bf16_t *)(dev + off[2 + j]);
    p->view.host_device = 0;
    CHECK_OK(flx_attn_gpu_view(&p->view, &p->gv));
}

static void pinned_free(pinned_t *p)
{
    flx_cuda_host_free(p->buf);
    tkv_free(&p->t);
}

/* (a) */
static void test_score(uint32_t D, uint32_t G, uint32_t l_cpu)
{
    pinned_t p;
    pinned_make(&p, D, l_cpu);
    float *q = malloc((size_t)G * D * sizeof *q);
    rand_f(q, (size_t)G * D, 1.0);
    float *dq = dev_upload(q, (size_t)G * D * sizeof *q);
    for (int level = 0; level < FLX_KV_META_LEVELS; level++) {
        const uint32_t n = p.view.meta_n[level], ld = n + 3;
        float *ref = malloc(((size_t)G * ld + 1) * sizeof *ref), *got = malloc(((size_t)G * ld + 1) * sizeof *got);
        float *ds = dmalloc(((size_t)G * ld + 1) * sizeof(float));
        CHECK_OK(flx_attn_score_gpu(&p.gv, level, G, dq, ds, ld, g_stream[0]));
        dev_download(got, ds, (size_t)G * ld * sizeof *got);
        CHECK_OK(flx_attn_score_ref(&p.view, level, G, q, ref));   /* (G, n) */
        for (uint32_t h = 0; h < G; h++) {
            char lab[96];
            snprintf(lab, sizeof lab, "score D %u G %u l_cpu %u level %d head %u", D, G, l_cpu, level, h);
            CHECK_CLOSE(lab, got + (size_t)h * ld, ref + (size_t)h * n, n, S_ATOL, S_RTOL);
        }
        CHECK_OK(flx_cuda_free(0, ds));
        free(ref), free(got);
    }
    CHECK_OK(flx_cuda_free(0, dq));
    free(q);
    pinned_free(&p);
}

/* (b) */
static void test_topk(uint32_t n, int mode)
{
    const uint32_t G = 5, ld = n + 2;
    float *s = malloc((size_t)G * ld * sizeof *s);
    for (uint32_t i = 0; i < G * ld; i++) {
        if (mode == 0) s[i] = (float)flx_rng_normal(&rng);
        else if (mode == 1) s[i] = (float)flx_rng_below(&rng, 5);   /* heavy ties */
        else if (mode == 2) s[i] = 1.0f;                             /* all equal */
        else {   /* NaN, signed zeros, infinities among small integers */
            const uint64_t r = flx_rng_below(&rng, 10);
            s[i] = r == 0 ? NAN : r == 1 ? -0.0f : r == 2 ? 0.0f : r == 3 ? -INFINITY : r == 4 ? INFINITY
                                                                                           : (float)r - 7.0f;
        }
    }
    const uint32_t k[5] = {0, n ? 1 : 0, n / 3, n ? n - 1 : 0, n};
    float *ds = dev_upload(s, (size_t)G * ld * sizeof *s);
    uint32_t *dk = dev_upload(k, sizeof k), *didx = dmalloc((size_t)G * ld * sizeof(uint32_t));
    uint32_t *idx = malloc((size_t)G * ld * sizeof *idx), *want = malloc(((size_t)n + 1) * sizeof *want);
    uint32_t *ref = malloc(((size_t)n + 1) * sizeof *ref);
    CHECK_OK(flx_topk_gpu(ds, ld, n, G, dk, didx, g_stream[0]));
    dev_download(idx, didx, (size_t)G * ld * sizeof *idx);
    for (uint32_t h = 0; h < G; h++) {
        CHECK_OK(flx_topk(s + (size_t)h * ld, n, k[h], want));
        CHECK_OK(flx_topk_ref(s + (size_t)h * ld, n, k[h], ref));
        for (uint32_t i = 0; i < k[h]; i++) {
            if (idx[(size_t)h * ld + i] != want[i]) {
                fprintf(stderr, "topk n %u mode %d k %u: position %u is %u, flx_topk has %u\n", n, mode, k[h], i,
                        idx[(size_t)h * ld + i], want[i]);
                CHECK(0);
            }
        }
        /* the same set as the sorting reference */
        uint8_t *in = calloc((size_t)n + 1, 1);
        for (uint32_t i = 0; i < k[h]; i++) in[want[i]] = 1;
        for (uint32_t i = 0; i < k[h]; i++) CHECK(in[ref[i]]);
        free(in);
    }
    fprintf(stderr, "topk n %u mode %d: indices equal flx_topk's for k in {%u, %u, %u, %u, %u} -> ok\n", n, mode, k[0],
            k[1], k[2], k[3], k[4]);
    CHECK_OK(flx_cuda_free(0, ds));
    CHECK_OK(flx_cuda_free(0, dk));
    CHECK_OK(flx_cuda_free(0, didx));
    free(s), free(idx), free(want), free(ref);
}

/* A workspace for shape, in device and page-locked memory. */
typedef struct gws {
    flx_attn_host_gpu_ws_t ws;
    void *dev, *host;
} gws_t;

static void gws_make(gws_t *w, uint32_t G, uint32_t D, uint32_t max_l_cpu)
{
    flx_attn_host_gpu_shape_t sh = {.group = G, .head_dim = D, .max_l_cpu = max_l_cpu};
    size_t db, hb;
    CHECK_OK(flx_attn_host_gpu_plan(&sh, &db, &hb));
    CHECK_OK(flx_cuda_malloc(0, db, &w->dev));
    CHECK_OK(flx_cuda_host_alloc(hb, &w->host));
    CHECK_OK(flx_attn_host_gpu_ws_init(&w->ws, &sh, w->dev, db, w->host, hb));
}

static void gws_free(gws_t *w)
{
    CHECK_OK(flx_cuda_free(0, w->dev));
    flx_cuda_host_free(w->host);
}

/* Head h selects k[h] distinct random blocks of n; heads overlap (blocks drawn from a shared pool
 * half the time). */
static void random_sel(uint32_t G, uint32_t n, uint32_t ld, uint32_t *k, uint32_t *sel)
{
    uint32_t *perm = malloc(((size_t)n + 1) * sizeof *perm);
    for (uint32_t h = 0; h < G; h++) {
        const uint64_t r = flx_rng_below(&rng, 6);
        k[h] = r == 0 ? 0 : r == 1 ? n : (uint32_t)flx_rng_below(&rng, (uint64_t)n + 1);
        for (uint32_t i = 0; i < n; i++) perm[i] = i;
        const uint32_t span = flx_rng_below(&rng, 2) && k[h] <= n / 2 ? n / 2 : n;   /* overlap: first half */
        for (uint32_t i = 0; i < k[h]; i++) {
            const uint32_t j = i + (uint32_t)flx_rng_below(&rng, (span > i ? span : n) - i), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
            sel[(size_t)h * ld + i] = perm[i];
        }
    }
    free(perm);
}

/* (c) */
static void test_sparse(uint32_t D, uint32_t G, uint32_t l_cpu)
{
    pinned_t p;
    pinned_make(&p, D, l_cpu);
    gws_t w;
    gws_make(&w, G, D, l_cpu + 40);
    float *q = malloc((size_t)G * D * sizeof *q), *o = malloc((size_t)G * D * sizeof *o), *lse = malloc(G * 4);
    float *o_ref = malloc((size_t)G * D * sizeof *o_ref), *lse_ref = malloc(G * 4);
    rand_f(q, (size_t)G * D, 1.0);
    float *dq = dev_upload(q, (size_t)G * D * sizeof *q);
    float *dout = dmalloc(((size_t)G * D + G) * sizeof(float));
    for (int level = 0; level < FLX_KV_META_LEVELS; level++) {
        const uint32_t n = p.view.meta_n[level], ld = n + 1;
        uint32_t k[FLX_ATTN_MAX_GROUP], *sel = malloc(((size_t)G * ld + 1) * sizeof *sel);
        random_sel(G, n, ld, k, sel);
        uint32_t *dsel = dev_upload(sel, ((size_t)G * ld + 1) * sizeof *sel), *dk = dev_upload(k, G * sizeof *k);
        CHECK_OK(flx_attn_sparse_gpu(&w.ws, &p.gv, level, dq, dsel, ld, dk, dout, dout + (size_t)G * D, g_stream[0]));
        dev_download(o, dout, (size_t)G * D * sizeof *o);
        dev_download(lse, dout + (size_t)G * D, G * sizeof *lse);
        CHECK_OK(flx_attn_sparse_ref(&p.view, level, G, q, sel, ld, k, o_ref, lse_ref));
        for (uint32_t h = 0; h < G; h++)
            if (k[h] == 0) {   /* nothing read: exactly o = 0, lse = -inf */
                CHECK(lse[h] == -INFINITY);
                for (uint32_t d = 0; d < D; d++) CHECK(o[(size_t)h * D + d] == 0.0f);
            }
        char lab[128];
        snprintf(lab, sizeof lab, "sparse D %u G %u l_cpu %u blk %u: o", D, G, l_cpu, 16u << level);
        CHECK_CLOSE(lab, o, o_ref, (size_t)G * D, O_ATOL, O_RTOL);
        snprintf(lab, sizeof lab, "sparse D %u G %u l_cpu %u blk %u: lse", D, G, l_cpu, 16u << level);
        CHECK(lse_close(lab, lse, lse_ref, G, L_ATOL, L_RTOL));
        CHECK_OK(flx_cuda_free(0, dsel));
        CHECK_OK(flx_cuda_free(0, dk));
        free(sel);
    }
    CHECK_OK(flx_cuda_free(0, dq));
    CHECK_OK(flx_cuda_free(0, dout));
    free(q), free(o), free(lse), free(o_ref), free(lse_ref);
    gws_free(&w);
    pinned_free(&p);
}

/* (d) */
static void test_merge(void)
{
    const uint32_t rows = 7, D = 48;
    float oa[7 * 48], ob[7 * 48], la[7], lb[7], o_ref[7 * 48], l_ref[7], o[7 * 48], l[7];
    rand_f(oa, rows * D, 1.0);
    rand_f(ob, rows * D, 1.0);
    rand_f(la, rows, 3.0);
    rand_f(lb, rows, 3.0);
    la[1] = -INFINITY;                    /* one part empty */
    lb[2] = -INFINITY;
    la[3] = lb[3] = -INFINITY;            /* both empty */
    memset(oa + 1 * D, 0, D * 4), memset(ob + 2 * D, 0, D * 4), memset(oa + 3 * D, 0, D * 4), memset(ob + 3 * D, 0, D * 4);
    la[4] = 80.0f, lb[4] = -80.0f;        /* far apart */
    flx_attn_merge(rows, D, oa, la, ob, lb, o_ref, l_ref);
    float *d = dev_upload(oa, sizeof oa), *dl = dev_upload(la, sizeof la);
    float *db = dev_upload(ob, sizeof ob), *dlb = dev_upload(lb, sizeof lb);
    CHECK_OK(flx_attn_merge_gpu(rows, D, d, dl, db, dlb, d, dl, g_stream[0]));   /* in place over a */
    dev_download(o, d, sizeof o);
    dev_download(l, dl, sizeof l);
    CHECK(l[3] == -INFINITY);
    for (uint32_t x = 0; x < D; x++) CHECK(o[3 * D + x] == 0.0f);
    CHECK_CLOSE("merge o", o, o_ref, rows * D, 1e-6, 1e-6);
    CHECK(lse_close("merge lse", l, l_ref, rows, 1e-6, 1e-6));
    CHECK_OK(flx_cuda_free(0, d));
    CHECK_OK(flx_cuda_free(0, dl));
    CHECK_OK(flx_cuda_free(0, db));
    CHECK_OK(flx_cuda_free(0, dlb));
}

#ifdef FLX_HAVE_CUDA
/* (d) The many-part merge behind every task (the slices' partials, then the window's), through its
 * internal launcher: S parts of rows x D, a fifth of the (part, row)s at -inf with NaN in their o
 * (a dropped part's o must never reach the result), a row with no part at all, a row whose parts
 * are 160 apart, with or without the extra partial, in place over part 0 or not; D past one pass of
 * columns and S past one stage of weights included. Reference: the LSE merge in double. */
static void test_merge_parts(uint32_t rows, uint32_t D, uint32_t S, int in_place, int with_x)
{
    const size_t n_o = (size_t)S * rows * D, n_l = (size_t)S * rows;
    float *po = malloc(n_o * sizeof(float)), *pl = malloc(n_l * sizeof(float));
    float *xo = malloc((size_t)rows * D * sizeof(float)), *xl = malloc(rows * sizeof(float));
    float *o = malloc((size_t)rows * D * sizeof(float)), *l = malloc(rows * sizeof(float));
    float *o_ref = malloc((size_t)rows * D * sizeof(float)), *l_ref = malloc(rows * sizeof(float));
    CHECK(po && pl && xo && xl && o && l && o_ref && l_ref);
    rand_f(po, n_o, 1.0);
    rand_f(pl, n_l, 3.0);
    rand_f(xo, (size_t)rows * D, 1.0);
    rand_f(xl, rows, 3.0);
    for (uint32_t i = 0; i < S; i++)
        for (uint32_t r = 0; r < rows; r++)
            if (flx_rng_below(&rng, 5) == 0 || r == 1) {   /* row 1: no part (and no extra below) */
                pl[(size_t)i * rows + r] = -INFINITY;
                for (uint32_t d = 0; d < D; d++) po[((size_t)i * rows + r) * D + d] = NAN;
            }
    if (rows > 2) {   /* row 2: parts 160 apart (their o drawn again: the loop above may have dropped them) */
        pl[2] = 80.0f;
        rand_f(po + 2 * D, D, 1.0);
        if (S > 1) {
            pl[(size_t)(S - 1) * rows + 2] = -80.0f;
            rand_f(po + ((size_t)(S - 1) * rows + 2) * D, D, 1.0);
        }
    }
    xl[1] = -INFINITY;
    for (uint32_t r = 0; r < rows; r++) {   /* the reference */
        double m = with_x ? xl[r] : -INFINITY;
        for (uint32_t i = 0; i < S; i++) m = fmax(m, pl[(size_t)i * rows + r]);
        double w = 0;
        for (uint32_t d = 0; d < D; d++) o_ref[(size_t)r * D + d] = 0.0f;
        if (m == -INFINITY) {
            l_ref[r] = -INFINITY;
            continue;
        }
        double *acc = calloc(D, sizeof(double));
        CHECK(acc);
        for (uint32_t i = 0; i <= S; i++) {   /* i == S: the extra partial */
            const float li = i < S ? pl[(size_t)i * rows + r] : with_x ? xl[r] : -INFINITY;
            if (li == -INFINITY) continue;
            const double c = exp((double)li - m);
            const float *oi = i < S ? po + ((size_t)i * rows + r) * D : xo + (size_t)r * D;
            w += c;
            for (uint32_t d = 0; d < D; d++) acc[d] += c * oi[d];
        }
        for (uint32_t d = 0; d < D; d++) o_ref[(size_t)r * D + d] = (float)(acc[d] / w);
        l_ref[r] = (float)(m + log(w));
        free(acc);
    }
    float *dpo = dev_upload(po, n_o * sizeof(float)), *dpl = dev_upload(pl, n_l * sizeof(float));
    float *dxo = dev_upload(xo, (size_t)rows * D * sizeof(float)), *dxl = dev_upload(xl, rows * sizeof(float));
    float *dout = in_place ? dpo : dmalloc((size_t)rows * D * sizeof(float));
    float *dlse = in_place ? dpl : dmalloc(rows * sizeof(float));
    CHECK_OK(flx_attn_merge_gpu_launch(rows, D, S, dpo, (size_t)rows * D, dpl, rows, with_x ? dxo : NULL,
                                       with_x ? dxl : NULL, dout, dlse, g_stream[0]));
    dev_download(o, dout, (size_t)rows * D * sizeof(float));
    dev_download(l, dlse, rows * sizeof(float));
    char lab[96];
    snprintf(lab, sizeof lab, "merge of %u parts, %u rows, D %u%s%s", S, rows, D, in_place ? ", in place" : "",
             with_x ? ", with the extra" : "");
    CHECK(l[1] == -INFINITY);
    for (uint32_t d = 0; d < D; d++) CHECK(o[D + d] == 0.0f);
    CHECK_CLOSE(lab, o, o_ref, (size_t)rows * D, 1e-5, 1e-5);
    strncat(lab, ": lse", sizeof lab - strlen(lab) - 1);
    CHECK(lse_close(lab, l, l_ref, rows, 1e-5, 1e-6));
    CHECK_OK(flx_cuda_free(0, dpo));
    CHECK_OK(flx_cuda_free(0, dpl));
    CHECK_OK(flx_cuda_free(0, dxo));
    CHECK_OK(flx_cuda_free(0, dxl));
    if (!in_place) {
        CHECK_OK(flx_cuda_free(0, dout));
        CHECK_OK(flx_cuda_free(0, dlse));
    }
    free(po), free(pl), free(xo), free(xl), free(o), free(l), free(o_ref), free(l_ref);
}
#endif

/* (e) One task's expected result: the GPU's own selection checked against the reference scores
 * (flx_topk_ref's set up to near-ties), then sparse_ref over it merged with the window. */
typedef struct task {
    uint32_t layer, g;
    flx_attn_cfg_t cfg;
    float budgets[FLX_ATTN_MAX_GROUP];
    int with_win;
    float q[FLX_ATTN_MAX_GROUP * 128];
    float o_win[FLX_ATTN_MAX_GROUP * 128], lse_win[FLX_ATTN_MAX_GROUP];
} task_t;

static void check_task(const char *lab, const gws_t *w, const flx_kv_head_view_t *v, const task_t *t, uint32_t G,
                       const float *o, const float *lse, uint64_t attn_bytes, flx_attn_ws_t *cws)
{
    const uint32_t D = v->head_dim;
    int level = 0;
    uint32_t k[FLX_ATTN_MAX_GROUP];
    const uint32_t n_max = w->ws.n_max;
    uint32_t *sel = malloc(((size_t)G * n_max + 1) * sizeof *sel);
    float o_ref[FLX_ATTN_MAX_GROUP * 128], lse_ref[FLX_ATTN_MAX_GROUP];
    if (t->cfg.mode == FLX_ATTN_FULL) {
        for (uint32_t h = 0; h < G; h++) {
            k[h] = v->n_blocks;
            for (uint32_t i = 0; i < k[h]; i++) sel[(size_t)h * n_max + i] = i;
        }
    } else {
        level = flx_attn_blk_level(t->cfg.blk);
        const uint32_t n = v->meta_n[level];
        for (uint32_t h = 0; h < G; h++)
            k[h] = flx_attn_budget_blocks(t->cfg.mode == FLX_ATTN_FIXED ? t->cfg.budget : t->budgets[h], v->l_cpu,
                                          t->cfg.blk);
        CHECK_OK(flx_cuda_copy_dtoh(0, sel, w->ws.sel, (size_t)G * n_max * sizeof *sel));
        float *sc = malloc(((size_t)G * n + 1) * sizeof *sc);
        uint32_t *ref = malloc(((size_t)n + 1) * sizeof *ref);
        CHECK_OK(flx_attn_score_ref(v, level, G, t->q, sc));
        for (uint32_t h = 0; h < G; h++) {
            if (k[h] == 0) continue;
            CHECK_OK(flx_topk_ref(sc + (size_t)h * n, n, k[h], ref));
            const float kth = sc[(size_t)h * n + ref[k[h] - 1]];
            uint8_t *seen = calloc((size_t)n + 1, 1);
            for (uint32_t i = 0; i < k[h]; i++) {
                const uint32_t b = sel[(size_t)h * n_max + i];
                CHECK(b < n && !seen[b]);
                seen[b] = 1;
                if (sc[(size_t)h * n + b] < kth - S_ATOL - S_RTOL * fabsf(kth)) {
                    fprintf(stderr, "%s: head %u selected block %u scoring %g below the k-th %g\n", lab, h, b,
                            (double)sc[(size_t)h * n + b], (double)kth);
                    CHECK(0);
                }
            }
            free(seen);
        }
        free(sc), free(ref);
    }
    CHECK_OK(flx_attn_sparse_ref(v, level, G, t->q, sel, n_max, k, o_ref, lse_ref));
    if (t->with_win) flx_attn_merge(G, D, t->o_win, t->lse_win, o_ref, lse_ref, o_ref, lse_ref);
    char l2[160];
    snprintf(l2, sizeof l2, "%s: o", lab);
    CHECK_CLOSE(l2, o, o_ref, (size_t)G * D, O_ATOL, O_RTOL);
    snprintf(l2, sizeof l2, "%s: lse", lab);
    CHECK(lse_close(l2, lse, lse_ref, G, L_ATOL, L_RTOL));
    /* bytes: the union of the selection, as the CPU task counts it */
    uint64_t tok = 0;
    const uint32_t blk = 16u << level, n = flx_kv_meta_count(v->l_cpu, level);
    uint8_t *u = calloc((size_t)n + 1, 1);
    for (uint32_t h = 0; h < G; h++)
        for (uint32_t i = 0; i < k[h]; i++) u[sel[(size_t)h * n_max + i]] = 1;
    for (uint32_t b = 0; b < n; b++)
        if (u[b]) tok += (b + 1) * blk <= v->l_cpu ? blk : v->l_cpu - b * blk;
    CHECK(attn_bytes == tok * D * 4);
    /* the CPU task (flx_attn_host_run): where it selected the same blocks, the same result and bytes */
    flx_attn_timing_t tim = {0};
    float oc[FLX_ATTN_MAX_GROUP * 128], lc[FLX_ATTN_MAX_GROUP];
    CHECK_OK(flx_attn_host_run(cws, v, t->q, &t->cfg, oc, lc, &tim));
    int same = 1;
    if (t->cfg.mode != FLX_ATTN_FULL) {
        uint8_t *c = calloc((size_t)n + 1, 1);
        for (uint32_t h = 0; h < G && same; h++) {
            memset(c, 0, n);
            same = cws->k[h] == k[h];
            for (uint32_t i = 0; i < k[h] && same; i++) c[cws->sel[(size_t)h * cws->n_max + i]] = 1;
            for (uint32_t i = 0; i < k[h] && same; i++) same = c[sel[(size_t)h * n_max + i]];
        }
        free(c);
    }
    if (same) {
        if (t->with_win) flx_attn_merge(G, D, t->o_win, t->lse_win, oc, lc, oc, lc);
        snprintf(l2, sizeof l2, "%s: o vs the CPU task", lab);
        CHECK_CLOSE(l2, o, oc, (size_t)G * D, O_ATOL, O_RTOL);
        CHECK(tim.attn_bytes == attn_bytes);
    } else {
        fprintf(stderr, "%s: the CPU task chose other blocks at a near-tie: compared with the reference only\n", lab);
    }
    free(u);
    free(sel);
}

static void test_task_store(uint32_t D, uint32_t G, uint32_t L)
{
    const uint32_t n_kv = 2, layers = 2;
    flx_kv_store_h s = kv_make_store_flags(layers, n_kv, n_kv * G, D, 64, 256, 256u << 20,
                                           FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_PIN_CUDA);
    flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 8, .flags = FLX_KV_SESSION_NO_STATS};
    flx_kv_session_id_t sid;
    CHECK_OK(flx_kv_session_open(s, &sp, &sid));
    kv_prompt_t pr;
    kv_prompt_random(&pr, layers, n_kv, D, L, &rng);
    kv_push_random(s, sid, &pr, &rng);
    flx_kv_session_h sess;
    CHECK_OK(flx_kv_session_acquire(s, sid, &sess));
    flx_kv_session_info_t info;
    CHECK_OK(flx_kv_session_info(s, sid, &info));
    gws_t w[2];
    gws_make(&w[0], G, D, info.l_cpu);
    gws_make(&w[1], G, D, info.l_cpu);
    flx_attn_shape_t cs = {.group = G, .head_dim = D, .max_l_cpu = info.l_cpu, .pool = NULL};
    size_t cb;
    CHECK_OK(flx_attn_plan(&cs, &cb));
    void *cmem = malloc(cb);
    flx_attn_ws_t cws;
    CHECK_OK(flx_attn_ws_init(&cws, &cs, cmem, cb));

    enum { N_TASKS = 10 };
    task_t *tk = calloc(N_TASKS, sizeof *tk);
    const uint32_t blks[4] = {16, 32, 64, 128};
    for (uint32_t i = 0; i < N_TASKS; i++) {
        task_t *t = &tk[i];
        t->layer = i % layers, t->g = (i / layers) % n_kv;
        t->with_win = (int)(i % 3 != 2);
        rand_f(t->q, (size_t)G * D, 1.0);
        rand_f(t->o_win, (size_t)G * D, 1.0);
        rand_f(t->lse_win, G, 2.0);
        if (i == 9) {
            t->cfg.mode = FLX_ATTN_FULL;
        } else if (i % 4 == 3) {
            t->cfg.mode = FLX_ATTN_FIXED, t->cfg.blk = blks[i % 4], t->cfg.budget = 0.05f + 0.1f * (float)(i % 3);
        } else {
            t->cfg.mode = FLX_ATTN_SPARSE, t->cfg.blk = blks[i % 4], t->cfg.budgets = t->budgets;
            for (uint32_t h = 0; h < G; h++) {
                const uint64_t r = flx_rng_below(&rng, 5);
                t->budgets[h] = r == 0 ? 0.0f : r == 1 ? 1.0f : (float)flx_rng_uniform(&rng) * 0.3f;
            }
        }
    }
    /* two tasks in flight at a time, one per stream; each finished after its stream is synchronised */
    for (uint32_t i = 0; i < N_TASKS; i += 2) {
        flx_kv_head_view_t v[2];
        for (uint32_t j = 0; j < 2 && i + j < N_TASKS; j++) {
            const task_t *t = &tk[i + j];
            CHECK_OK(flx_kv_head_view(sess, t->layer, t->g, &v[j]));
            CHECK_OK(flx_attn_host_gpu(&w[j].ws, &v[j], t->q, &t->cfg, t->with_win ? t->o_win : NULL,
                                       t->with_win ? t->lse_win : NULL, g_stream[j]));
        }
        for (uint32_t j = 0; j < 2 && i + j < N_TASKS; j++) {
            const task_t *t = &tk[i + j];
            float o[FLX_ATTN_MAX_GROUP * 128], lse[FLX_ATTN_MAX_GROUP];
            flx_attn_timing_t tim = {0};
            CHECK_OK(flx_cuda_stream_sync(0, g_stream[j]));
            CHECK_OK(flx_attn_host_gpu_finish(&w[j].ws, o, lse, &tim));
            char lab[128];
            snprintf(lab, sizeof lab, "task D %u G %u L %u #%u mode %d blk %u win %d", D, G, L, i + j, (int)t->cfg.mode,
                     t->cfg.blk, t->with_win);
            check_task(lab, &w[j], &v[j], t, G, o, lse, tim.attn_bytes, &cws);
        }
    }
    /* (f) refusals */
    {
        flx_kv_head_view_t v;
        CHECK_OK(flx_kv_head_view(sess, 0, 0, &v));
        float o[FLX_ATTN_MAX_GROUP * 128], lse[FLX_ATTN_MAX_GROUP];
        CHECK_ST(flx_attn_host_gpu_finish(&w[0].ws, o, lse, NULL), FLX_ERR_STATE);    /* nothing in flight */
        CHECK_OK(flx_attn_host_gpu(&w[0].ws, &v, tk[0].q, &tk[0].cfg, NULL, NULL, g_stream[0]));
        CHECK_ST(flx_attn_host_gpu(&w[0].ws, &v, tk[0].q, &tk[0].cfg, NULL, NULL, g_stream[0]), FLX_ERR_STATE);
        CHECK_OK(flx_cuda_stream_sync(0, g_stream[0]));
        CHECK_OK(flx_attn_host_gpu_finish(&w[0].ws, o, lse, NULL));
        flx_kv_head_view_t nodev = v;
        nodev.pool_base_dev = NULL;
        CHECK_ST(flx_attn_host_gpu(&w[0].ws, &nodev, tk[0].q, &tk[0].cfg, NULL, NULL, g_stream[0]), FLX_ERR_INVALID);
        nodev = v;
        nodev.meta_dev[2] = NULL;
        CHECK_ST(flx_attn_host_gpu(&w[0].ws, &nodev, tk[0].q, &tk[0].cfg, NULL, NULL, g_stream[0]), FLX_ERR_INVALID);
        flx_attn_cfg_t bad = {.mode = FLX_ATTN_FIXED, .blk = 24, .budget = 0.1f};
        CHECK_ST(flx_attn_host_gpu(&w[0].ws, &v, tk[0].q, &bad, NULL, NULL, g_stream[0]), FLX_ERR_INVALID);
        CHECK_ST(flx_attn_host_gpu(&w[0].ws, &v, tk[0].q, &tk[0].cfg, tk[0].o_win, NULL, g_stream[0]),
                 FLX_ERR_INVALID);
    }
    fprintf(stderr, "task D %u G %u L %u (l_cpu %u): %u tasks on 2 streams -> ok\n", D, G, L, info.l_cpu, N_TASKS);
    free(tk);
    free(cmem);
    gws_free(&w[0]);
    gws_free(&w[1]);
    flx_kv_session_release(sess);
    kv_prompt_free(&pr);
    flx_kv_store_destroy(s);
}

int main(void)
{
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "test_attn_gpu_host: no CUDA device: skipped\n");
        return FLX_TEST_SKIP;
    }
    flx_rng_seed(&rng, flx_test_seed("test_attn_gpu_host"));
    CHECK_OK(flx_cuda_stream_create(0, &g_stream[0]));
    CHECK_OK(flx_cuda_stream_create(0, &g_stream[1]));

    test_merge();
#ifdef FLX_HAVE_CUDA
    test_merge_parts(4, 128, 256, 0, 1);   /* a G = 4 task's slices and its window */
    test_merge_parts(3, 300, 300, 1, 0);   /* two passes of columns, two stages of weights */
    test_merge_parts(7, 48, 1, 1, 1);
    test_merge_parts(5, 64, 3, 0, 0);
#endif
    fprintf(stderr, "merge: ok\n");
    const uint32_t ns[] = {0, 1, 7, 300, 2000, 20000};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(ns); i++)
        for (int mode = 0; mode < 4; mode++) test_topk(ns[i], mode);
    test_score(16, 1, 333);
    test_score(64, 4, 1000);
    test_score(128, 9, 500);
    test_score(256, 8, 290);
    fprintf(stderr, "score: ok\n");
    test_sparse(64, 4, 1000);
    test_sparse(16, 9, 413);
    test_sparse(128, 8, 300);
    test_sparse(256, 3, 170);
    test_sparse(48, 1, 47);
    fprintf(stderr, "sparse: ok\n");
    test_task_store(64, 4, 1800);
    test_task_store(128, 8, 700);
    fprintf(stderr, "task: ok\n");

    flx_cuda_stream_destroy(0, g_stream[0]);
    flx_cuda_stream_destroy(0, g_stream[1]);
    fprintf(stderr, "test_attn_gpu_host: ok\n");
    return 0;
}
