/*
 * test_cpus - the CPU budget behind the pool's worker count: the cgroup v1 / v2 quota read from
 * fixture trees (tests/common/cgroup/<case>: proc/self/cgroup, proc/self/mountinfo and the quota
 * files under the mount points they name), refusals of malformed files naming the file, the
 * cpu.max parser, the worker count and its explanation line, and the placement of workers on a
 * fake topology.
 *
 *   test_cpus FIXTURES_DIR                 the checks
 *   test_cpus FIXTURES_DIR --corpus DIR    writes the fuzz seed corpus (tests/fuzz/fuzz_cgroup.c's
 *                                          format) from the fixture trees instead
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/pool.h"
#include "flx_test.h"
#include "pool_internal.h"

static const char *g_dir;

typedef struct fixture {
    const char *name;
    flx_status_t st;          /* expected status of flx_cpu_budget_read */
    uint32_t mcpu;            /* expected quota */
    int version;
    const char *file;         /* the quota file, or a substring of the error message */
    uint32_t n_aff, n_cpus;   /* affinity given, budget expected */
} fixture_t;

static const fixture_t FIXTURES[] = {
    {"v2-container", FLX_OK, 2000, 2, "/sys/fs/cgroup/cpu.max", 64, 2},
    {"v2-container", FLX_OK, 2000, 2, "/sys/fs/cgroup/cpu.max", 1, 1},
    {"v2-nested", FLX_OK, 1500, 2, "/sys/fs/cgroup/system.slice/app.service/cpu.max", 64, 2},
    {"v2-namespace", FLX_OK, 500, 2, "/sys/fs/cgroup/c1/cpu.max", 8, 1},
    {"v2-escaped", FLX_OK, 5000, 2, "/sys/fs/my cgroup/a/cpu.max", 16, 5},
    {"v1-hybrid", FLX_OK, 0, 0, "", 2, 2},
    {"v1-quota", FLX_OK, 500, 1, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", 32, 1},
    {"none", FLX_OK, 0, 0, "", 3, 3},
    {"bad-cpu-max", FLX_ERR_FORMAT, 0, 0, "/sys/fs/cgroup/cpu.max: 'fast 100000\\x0a' is not", 2, 0},
    {"bad-period", FLX_ERR_FORMAT, 0, 0, "/sys/fs/cgroup/cpu.max: '100000 10\\x0a'", 2, 0},
    {"bad-cgroup-line", FLX_ERR_FORMAT, 0, 0, "/proc/self/cgroup line 1: 'garbage without colons'", 2, 0},
    {"bad-mountinfo", FLX_ERR_FORMAT, 0, 0, "/proc/self/mountinfo line 1:", 2, 0},
    {"bad-v1-no-period", FLX_ERR_FORMAT, 0, 0, "/sys/fs/cgroup/cpu/cpu.cfs_period_us: missing beside", 2, 0},
};

static void test_fixtures(void)
{
    for (size_t i = 0; i < FLX_ARRAY_SIZE(FIXTURES); i++) {
        const fixture_t *f = &FIXTURES[i];
        char root[1024];
        snprintf(root, sizeof root, "%s/%s", g_dir, f->name);
        flx_cpu_budget_t b;
        memset(&b, 0xab, sizeof b);
        flx_error_clear();
        flx_status_t st = flx_cpu_budget_read(root, f->n_aff, &b);
        fprintf(stderr, "%-18s affinity %2u: %s", f->name, f->n_aff, flx_status_name(st));
        if (st) {
            fprintf(stderr, ": %s\n", flx_error_msg());
            CHECK_ST(st, f->st);
            CHECK(strstr(flx_error_msg(), f->file) != NULL);
            CHECK(b.n_affinity == 0xabababab);   /* out-param untouched on failure */
            continue;
        }
        char line[512];
        flx_cpu_budget_format(&b, line, sizeof line);
        fprintf(stderr, ": budget %u (%s)\n", b.n_cpus, line);
        CHECK_ST(st, f->st);
        CHECK(b.quota_mcpu == f->mcpu && b.quota_version == f->version && !strcmp(b.quota_file, f->file));
        CHECK(b.n_affinity == f->n_aff && b.n_cpus == f->n_cpus);
    }
    flx_cpu_budget_t b;
    CHECK_ST(flx_cpu_budget_read(g_dir, 0, &b), FLX_ERR_INVALID);
    CHECK_ST(flx_cpu_budget_read(g_dir, 2, NULL), FLX_ERR_INVALID);
    /* this machine: whatever it is, it must read */
    CHECK_OK(flx_cpu_budget_detect(&b));
    char line[512];
    flx_cpu_budget_format(&b, line, sizeof line);
    fprintf(stderr, "this machine: budget %u (%s)\n", b.n_cpus, line);
    CHECK(b.n_cpus >= 1 && b.n_cpus <= b.n_affinity);
}

static void test_cpu_max(void)
{
    static const struct {
        const char *text;
        int ok;
        uint32_t mcpu;
    } cases[] = {
        {"max 100000", 1, 0},        {"max 100000\n", 1, 0},       {"100000 100000\n", 1, 1000},
        {"1000 1000000", 1, 1},      {"150001 100000", 1, 1501},   {"1000000000000 1000", 1, UINT32_MAX},
        {"max 999", 0, 0},           {"999 100000", 0, 0},         {"max 1000001", 0, 0},
        {"max 100000\n\n", 0, 0},    {"100000 100000 ", 0, 0},     {"0100000 100000", 0, 0},
        {"", 0, 0},                  {"max", 0, 0},                {" max 100000", 0, 0},
        {"max  100000", 0, 0},       {"-5 100000", 0, 0},          {"99999999999999999999 100000", 0, 0},
        {"max\t100000", 0, 0},       {"1e6 100000", 0, 0},
    };
    for (size_t i = 0; i < FLX_ARRAY_SIZE(cases); i++) {
        uint32_t m = 77;
        flx_status_t st = flx_cg_parse_cpu_max(cases[i].text, strlen(cases[i].text), "cpu.max", &m);
        if (cases[i].ok) {
            CHECK_OK(st);
            CHECK(m == cases[i].mcpu);
        } else {
            CHECK_ST(st, FLX_ERR_FORMAT);
            CHECK(m == 77 && strncmp(flx_error_msg(), "cpu.max: '", 10) == 0);
        }
    }
    /* a NUL inside is refused, not read as the end: "max 1000" (valid up to the NUL), NUL, "00" */
    static const char nul_inside[] = "max 1000\0" "00";
    uint32_t m;
    CHECK_ST(flx_cg_parse_cpu_max(nul_inside, sizeof nul_inside - 1, "cpu.max", &m), FLX_ERR_FORMAT);
}

static void test_resolve(void)
{
    flx_cpu_budget_t b = {.n_affinity = 64, .quota_mcpu = 2500, .quota_version = 2, .n_cpus = 3};
    snprintf(b.quota_file, sizeof b.quota_file, "/sys/fs/cgroup/cpu.max");
    char why[512];
    uint32_t n;
    CHECK_OK(pool_resolve_workers(0, NULL, &b, 64, 0, -1, &n, why, sizeof why));
    CHECK(n == 3 && !strcmp(why, "workers 3: affinity 64 CPUs, cgroup quota 2.5 CPUs (v2 /sys/fs/cgroup/cpu.max)"));
    CHECK_OK(pool_resolve_workers(0, NULL, &b, 64, 1, -1, &n, why, sizeof why));
    CHECK(n == 2 && strstr(why, ", 1 reserved"));
    CHECK_OK(pool_resolve_workers(0, NULL, &b, 2, 0, 1, &n, why, sizeof why));   /* node with 2 CPUs */
    CHECK(n == 2 && strstr(why, "numa node 1: 2 CPUs"));
    CHECK_OK(pool_resolve_workers(7, NULL, &b, 64, 0, -1, &n, why, sizeof why));
    CHECK(n == 7 && !strncmp(why, "workers 7: requested (oversubscribed: affinity 64", 49));
    CHECK_OK(pool_resolve_workers(0, "2", &b, 64, 0, -1, &n, why, sizeof why));
    CHECK(n == 2 && !strncmp(why, "workers 2: FLX_THREADS=2 (affinity", 34));
    CHECK_ST(pool_resolve_workers(0, "two", &b, 64, 0, -1, &n, why, sizeof why), FLX_ERR_INVALID);
    b = (flx_cpu_budget_t){.n_affinity = 2, .n_cpus = 2};
    CHECK_OK(pool_resolve_workers(0, NULL, &b, 2, 0, -1, &n, why, sizeof why));
    CHECK(n == 2 && !strcmp(why, "workers 2: affinity 2 CPUs, cgroup quota none"));
    CHECK_OK(pool_resolve_workers(0, NULL, &b, 2, 5, -1, &n, why, sizeof why));   /* never below 1 */
    CHECK(n == 1);
    b.n_cpus = 0;   /* unreadable budget with an explicit count */
    CHECK_OK(pool_resolve_workers(4, NULL, &b, 2, 0, -1, &n, why, sizeof why));
    CHECK(n == 4 && strstr(why, "CPU budget not read"));
}

static void test_place(void)
{
    int cpu[6] = {0, 1, 2, 3, 8, 9}, node[6] = {0, 0, 1, 1, 1, 1};
    pool_topo_t t = {6, cpu, node};
    pool_place_t p;
    CHECK_OK(pool_place(&t, 1, 0, 1, &p));
    CHECK(p.n_cpus == 4 && p.cpus[0] == 2 && p.cpus[3] == 9 && p.bind && p.n_reserved == 0);
    pool_place_free(&p);
    CHECK_OK(pool_place(&t, 1, 2, 1, &p));
    CHECK(p.n_cpus == 2 && p.cpus[1] == 3 && p.n_reserved == 2 && p.reserved[0] == 8 && p.reserved[1] == 9);
    pool_place_free(&p);
    CHECK_OK(pool_place(&t, 1, 2, 0, &p));   /* under a quota nothing is set apart */
    CHECK(p.n_cpus == 4 && p.n_reserved == 0);
    pool_place_free(&p);
    CHECK_OK(pool_place(&t, -1, 0, 1, &p));   /* unbound: nothing to set */
    CHECK(p.n_cpus == 6 && !p.bind);
    pool_place_free(&p);
    CHECK_ST(pool_place(&t, 1, 4, 1, &p), FLX_ERR_INVALID);
    CHECK_ST(pool_place(&t, 2, 0, 1, &p), FLX_ERR_INVALID);
    for (int i = 0; i < 6; i++) node[i] = 0;   /* one node: binding to it changes nothing */
    CHECK_OK(pool_place(&t, 0, 0, 1, &p));
    CHECK(p.n_cpus == 6 && !p.bind);
    pool_place_free(&p);
}

/* ---- the fuzz corpus: "<cgroup>\0<mountinfo>\0" then "<path>\0<contents>\0" per other file ---- */

static void pack_tree(FILE *out, const char *root, const char *rel)
{
    char dir[2048];
    snprintf(dir, sizeof dir, "%s%s", root, rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char r[2048], full[4096];
        snprintf(r, sizeof r, "%s/%s", rel, e->d_name);
        snprintf(full, sizeof full, "%s%s", root, r);
        struct stat s;
        if (stat(full, &s)) continue;
        if (S_ISDIR(s.st_mode)) {
            pack_tree(out, root, r);
        } else if (strcmp(r, "/proc/self/cgroup") && strcmp(r, "/proc/self/mountinfo")) {
            FILE *f = fopen(full, "rb");
            char buf[4096];
            size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f) fclose(f);
            fwrite(r, 1, strlen(r) + 1, out);
            fwrite(buf, 1, n, out);
            fputc(0, out);
        }
    }
    closedir(d);
}

static void put_file(FILE *out, const char *path)
{
    FILE *f = fopen(path, "rb");
    char buf[8192];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    fwrite(buf, 1, n, out);
    fputc(0, out);
}

static int write_corpus(const char *outdir)
{
    mkdir(outdir, 0755);
    DIR *d = opendir(g_dir);
    if (!d) return 1;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char root[2048], path[4096];
        snprintf(root, sizeof root, "%s/%s", g_dir, e->d_name);
        snprintf(path, sizeof path, "%s/%s", outdir, e->d_name);
        FILE *out = fopen(path, "wb");
        if (!out) return 1;
        snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
        put_file(out, path);
        snprintf(path, sizeof path, "%s/proc/self/mountinfo", root);
        put_file(out, path);
        pack_tree(out, root, "");
        fclose(out);
        n++;
    }
    closedir(d);
    fprintf(stderr, "test_cpus: %d corpus files in %s\n", n, outdir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_cpus FIXTURES_DIR [--corpus OUTDIR]\n");
        return 2;
    }
    g_dir = argv[1];
    if (argc == 4 && !strcmp(argv[2], "--corpus")) return write_corpus(argv[3]);
    test_fixtures();
    test_cpu_max();
    test_resolve();
    test_place();
    fprintf(stderr, "test_cpus: ok\n");
    return 0;
}
