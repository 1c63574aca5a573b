/*
 * cpus.c - the CPU budget of the process (affinity mask, cgroup CPU quota), the CPU topology, the
 * placement of a pool's workers and the system calls that bind them (flx/pool.h).
 *
 * DESIGN
 * The cgroup files are outside input: /proc/self/cgroup names the process's cgroup per hierarchy,
 * /proc/self/mountinfo where each hierarchy is mounted (and which part of it: a container sees its
 * own cgroup as "/"), and the quota files hold the limits. Every line is checked against the
 * kernel's format and every number against the kernel's own bounds (period 1 ms .. 1 s, quota at
 * least 1 ms); anything else is refused with the file and the fault, never guessed around. A file
 * that does not exist means "no limit here" (the root cgroup has no cpu.max; a host may have no
 * cgroup v1 cpu controller). The quota is the tightest over the process's cgroup and its ancestors
 * up to the mount point, v2 and v1 alike, because each level limits its whole subtree.
 *
 * Placement and the worker count are pure functions of (topology, budget, request), so tests
 * drive them with fake topologies; the system calls (affinity, NUMA policy) sit behind
 * flx_pool_sys_real, which the tests replace to observe the binding calls.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <numa.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flx/util.h"
#include "pool_internal.h"

#define CG_PATH_MAX 4096
#define CG_FILE_MAX ((size_t)16 << 20)   /* mountinfo of a host with very many mounts */

/* ---------------- reading ---------------- */

static flx_status_t read_whole(const char *path, size_t max, char **data_p, size_t *len_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) return FLX_ERR_NOT_FOUND;
        return flx_error_set(flx_status_from_errno(e), "%s: %s", path, strerror(e));
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    flx_status_t st = FLX_OK;
    while (buf) {
        if (len == cap) {
            if (cap >= max) {
                st = flx_error_set(FLX_ERR_FORMAT, "%s: larger than %zu bytes", path, max);
                break;
            }
            cap = cap * 2 < max ? cap * 2 : max;
            char *nb = realloc(buf, cap + 1);
            if (!nb) break;
            buf = nb;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            st = flx_error_set(flx_status_from_errno(errno), "%s: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (!buf) return flx_error_set(FLX_ERR_NOMEM, "%s: read buffer", path);
    if (st) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *data_p = buf;
    *len_p = len;
    return FLX_OK;
}

typedef struct root_ctx {
    const char *root;
} root_ctx_t;

static flx_status_t read_under_root(void *ctx, const char *path, char **data_p, size_t *len_p)
{
    const root_ctx_t *r = ctx;
    char full[CG_PATH_MAX * 2];
    if ((size_t)snprintf(full, sizeof full, "%s%s", r->root, path) >= sizeof full)
        return flx_error_set(FLX_ERR_INVALID, "path %s%s too long", r->root, path);
    return read_whole(full, CG_FILE_MAX, data_p, len_p);
}

/* A short, printable excerpt of outside text for an error message. */
static const char *excerpt(const char *s, size_t len, char *buf, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < len && j + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            buf[j++] = (char)c;
        } else {
            j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", c);
        }
        if (i + 1 < len && j + 5 >= cap) {
            buf[j - 1] = '.';
            break;
        }
    }
    buf[j < cap ? j : cap - 1] = '\0';
    return buf;
}

/* ---------------- numbers ---------------- */

/* A whole decimal number in [lo, hi] taking all of s[0 .. len), no sign, no leading zero padding
 * beyond "0" itself. */
static int parse_dec(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (len == 0 || len > 19) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (len > 1 && s[0] == '0') return 0;
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* The kernel's bounds (kernel/sched/core.c): period 1 ms .. 1 s, quota at least 1 ms; quotas are
 * accepted up to 10^12 us (a million CPUs at the longest period). */
#define CG_PERIOD_MIN 1000u
#define CG_PERIOD_MAX 1000000u
#define CG_QUOTA_MIN 1000u
#define CG_QUOTA_MAX 1000000000000ull

static uint32_t quota_mcpu(uint64_t quota, uint64_t period)
{
    uint64_t m = (quota * 1000 + period - 1) / period;   /* <= 10^15, no overflow */
    return m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;
}

/* Strips one trailing newline; refuses any other whitespace or NUL. */
static size_t trim_nl(const char *text, size_t len)
{
    return len && text[len - 1] == '\n' ? len - 1 : len;
}

flx_status_t flx_cg_parse_cpu_max(const char *text, size_t len, const char *file, uint32_t *mcpu_p)
{
    char ex[64];
    size_t n = trim_nl(text, len);
    const char *sp = memchr(text, ' ', n);
    uint64_t quota = 0, period = 0;
    if (!sp) goto bad;
    size_t ql = (size_t)(sp - text), pl = n - ql - 1;
    if (!parse_dec(sp + 1, pl, CG_PERIOD_MIN, CG_PERIOD_MAX, &period)) goto bad;
    if (ql == 3 && !memcmp(text, "max", 3)) {
        *mcpu_p = 0;
        return FLX_OK;
    }
    if (!parse_dec(text, ql, CG_QUOTA_MIN, CG_QUOTA_MAX, &quota)) goto bad;
    *mcpu_p = quota_mcpu(quota, period);
    return FLX_OK;
bad:
    return flx_error_set(FLX_ERR_FORMAT,
                         "%s: '%s' is not \"max <period>\" or \"<quota> <period>\" (quota >= %u us, period %u..%u us)",
                         file, excerpt(text, len, ex, sizeof ex), CG_QUOTA_MIN, CG_PERIOD_MIN, CG_PERIOD_MAX);
}

/* cgroup v1: cpu.cfs_quota_us holds -1 (no limit) or the quota; cpu.cfs_period_us the period. */
static flx_status_t parse_v1_quota(const char *text, size_t len, const char *file, int64_t *quota_p)
{
    char ex[64];
    size_t n = trim_nl(text, len);
    uint64_t q;
    if (n == 2 && !memcmp(text, "-1", 2)) {
        *quota_p = -1;
        return FLX_OK;
    }
    if (!parse_dec(text, n, CG_QUOTA_MIN, CG_QUOTA_MAX, &q))
        return flx_error_set(FLX_ERR_FORMAT, "%s: '%s' is not -1 or a quota of at least %u us", file,
                             excerpt(text, len, ex, sizeof ex), CG_QUOTA_MIN);
    *quota_p = (int64_t)q;
    return FLX_OK;
}

static flx_status_t parse_v1_period(const char *text, size_t len, const char *file, uint64_t *period_p)
{
    char ex[64];
    if (!parse_dec(text, trim_nl(text, len), CG_PERIOD_MIN, CG_PERIOD_MAX, period_p))
        return flx_error_set(FLX_ERR_FORMAT, "%s: '%s' is not a period of %u..%u us", file,
                             excerpt(text, len, ex, sizeof ex), CG_PERIOD_MIN, CG_PERIOD_MAX);
    return FLX_OK;
}

/* ---------------- /proc/self/cgroup and /proc/self/mountinfo ---------------- */

typedef struct cg_self {
    char v2[CG_PATH_MAX];       /* the "0::" path, "" when absent */
    char v1[CG_PATH_MAX];       /* the path of the hierarchy with the cpu controller, "" when absent */
} cg_self_t;

/* Next line of text [*pos, len): sets *line, *n (without the newline); 0 at the end. */
static int next_line(const char *text, size_t len, size_t *pos, const char **line, size_t *n)
{
    if (*pos >= len) return 0;
    const char *s = text + *pos, *e = memchr(s, '\n', len - *pos);
    *n = e ? (size_t)(e - s) : len - *pos;
    *line = s;
    *pos += *n + (e ? 1 : 0);
    return 1;
}

static int has_token(const char *list, size_t n, char sep, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i <= n;) {
        const char *e = memchr(list + i, sep, n - i);
        size_t l = e ? (size_t)(e - (list + i)) : n - i;
        if (l == tl && !memcmp(list + i, tok, tl)) return 1;
        if (!e) break;
        i += l + 1;
    }
    return 0;
}

static flx_status_t cg_path_copy(char *dst, const char *s, size_t n, const char *file, unsigned lineno)
{
    char ex[64];
    if (n == 0 || s[0] != '/' || n >= CG_PATH_MAX || memchr(s, '\0', n))
        return flx_error_set(FLX_ERR_FORMAT, "%s line %u: cgroup path '%s' is not an absolute path", file, lineno,
                             excerpt(s, n, ex, sizeof ex));
    memcpy(dst, s, n);
    dst[n] = '\0';
    return FLX_OK;
}

static flx_status_t parse_self(const char *text, size_t len, cg_self_t *out)
{
    static const char *file = "/proc/self/cgroup";
    char ex[64];
    out->v2[0] = out->v1[0] = '\0';
    size_t pos = 0, n;
    const char *l;
    unsigned lineno = 0;
    while (next_line(text, len, &pos, &l, &n)) {
        lineno++;
        if (n == 0) continue;
        const char *c1 = memchr(l, ':', n), *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - l)) : NULL;
        uint64_t id;
        if (!c2 || !parse_dec(l, (size_t)(c1 - l), 0, UINT32_MAX, &id))
            return flx_error_set(FLX_ERR_FORMAT, "%s line %u: '%s' is not \"<id>:<controllers>:<path>\"", file,
                                 lineno, excerpt(l, n, ex, sizeof ex));
        const char *ctl = c1 + 1, *path = c2 + 1;
        size_t ctl_n = (size_t)(c2 - ctl), path_n = n - (size_t)(path - l);
        if (id == 0 && ctl_n == 0) {
            if (!out->v2[0]) {
                flx_status_t st = cg_path_copy(out->v2, path, path_n, file, lineno);
                if (st) return st;
            }
        } else if (has_token(ctl, ctl_n, ',', "cpu") && !out->v1[0]) {
            flx_status_t st = cg_path_copy(out->v1, path, path_n, file, lineno);
            if (st) return st;
        }
    }
    return FLX_OK;
}

typedef struct cg_mount {
    char root[CG_PATH_MAX];     /* the part of the hierarchy mounted there */
    char point[CG_PATH_MAX];    /* the mount point */
    int found;
} cg_mount_t;

/* mountinfo fields are space-separated with spaces, tabs, newlines and backslashes octal-escaped. */
static flx_status_t unescape(char *dst, const char *s, size_t n, const char *what, unsigned lineno)
{
    static const char *file = "/proc/self/mountinfo";
    char ex[64];
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\') {
            if (i + 3 >= n) goto bad;   /* three octal digits follow */
            int v = 0;
            for (int k = 1; k <= 3; k++) {
                char d = s[i + (size_t)k];
                if (d < '0' || d > '7') goto bad;
                v = v * 8 + (d - '0');
            }
            if (v == 0 || v > 255) goto bad;
            c = (char)v;
            i += 3;
        } else if (c == '\0') {
            goto bad;
        }
        if (j + 1 >= CG_PATH_MAX) goto bad;
        dst[j++] = c;
    }
    dst[j] = '\0';
    if (j == 0 || dst[0] != '/') goto bad;
    return FLX_OK;
bad:
    return flx_error_set(FLX_ERR_FORMAT, "%s line %u: %s '%s' is not an escaped absolute path", file, lineno, what,
                         excerpt(s, n, ex, sizeof ex));
}

/* Is p inside root (root "/" holds everything)? Sets *rel to the rest ("" or "/..."). */
static int path_under(const char *root, const char *p, const char **rel)
{
    size_t rl = strlen(root);
    if (rl == 1) {
        *rel = p;
        return 1;
    }
    if (strncmp(p, root, rl) || (p[rl] != '\0' && p[rl] != '/')) return 0;
    *rel = p + rl;
    return 1;
}

/* The cgroup2 mount and the cgroup (v1) mount carrying the cpu controller; of several, the one
 * whose root holds the process's path, the deepest such root. */
static flx_status_t parse_mounts(const char *text, size_t len, const cg_self_t *self, cg_mount_t *v2, cg_mount_t *v1)
{
    static const char *file = "/proc/self/mountinfo";
    char ex[64];
    v2->found = v1->found = 0;
    size_t pos = 0, n;
    const char *l;
    unsigned lineno = 0;
    while (next_line(text, len, &pos, &l, &n)) {
        lineno++;
        if (n == 0) continue;
        const char *tok[64];
        size_t tl[64];
        int nt = 0, sep = -1;
        for (size_t i = 0; i < n;) {
            const char *e = memchr(l + i, ' ', n - i);
            size_t k = e ? (size_t)(e - (l + i)) : n - i;
            if (k == 0 || nt == 64) goto bad;
            tok[nt] = l + i, tl[nt] = k;
            if (k == 1 && l[i] == '-' && sep < 0 && nt >= 6) sep = nt;
            nt++;
            i += k + 1;
            if (e && i == n) goto bad;   /* trailing space */
        }
        if (sep < 0 || nt != sep + 4) goto bad;
        uint64_t x;
        if (!parse_dec(tok[0], tl[0], 0, UINT32_MAX, &x) || !parse_dec(tok[1], tl[1], 0, UINT32_MAX, &x)) goto bad;
        const char *fs = tok[sep + 1], *opts = tok[sep + 3];
        size_t fs_n = tl[sep + 1], opts_n = tl[sep + 3];
        cg_mount_t *m = NULL;
        const char *mine = NULL;
        if (fs_n == 7 && !memcmp(fs, "cgroup2", 7)) m = v2, mine = self->v2;
        else if (fs_n == 6 && !memcmp(fs, "cgroup", 6) && has_token(opts, opts_n, ',', "cpu")) m = v1, mine = self->v1;
        if (!m) continue;
        cg_mount_t c;
        flx_status_t st;
        if ((st = unescape(c.root, tok[3], tl[3], "root", lineno)) ||
            (st = unescape(c.point, tok[4], tl[4], "mount point", lineno)))
            return st;
        const char *rel;
        int holds = mine[0] && path_under(c.root, mine, &rel);
        int had = m->found && mine[0] && path_under(m->root, mine, &rel);
        if (!m->found || (holds && (!had || strlen(c.root) > strlen(m->root)))) {
            *m = c;
            m->found = 1;
        }
    }
    return FLX_OK;
bad:
    return flx_error_set(FLX_ERR_FORMAT, "%s line %u: '%s' is not a mountinfo line", file, lineno,
                         excerpt(l, n, ex, sizeof ex));
}

/* The process's cgroup relative to a mount: path - root ("" or "/a/b"); "" (the mount point
 * itself) when the path is not under the mount's root or climbs out of it ("/.." from another
 * cgroup namespace). */
static void cg_rel(const cg_mount_t *m, const char *path, char *rel)
{
    const char *r = "";
    if (!path_under(m->root, path, &r) || strstr(r, "/..") || strstr(r, "//") || !strcmp(r, "/")) r = "";
    strcpy(rel, r);
}

/* point + rel + "/" + name, or 0 when it does not fit CG_PATH_MAX. */
static int cg_file(char *out, const cg_mount_t *m, const char *rel, const char *name)
{
    const size_t pl = strcmp(m->point, "/") ? strlen(m->point) : 0, rl = strlen(rel), nl = strlen(name);
    if (pl + rl + 1 + nl >= CG_PATH_MAX) return 0;
    memcpy(out, m->point, pl);
    memcpy(out + pl, rel, rl);
    out[pl + rl] = '/';
    memcpy(out + pl + rl + 1, name, nl + 1);
    return 1;
}

static void quota_take(flx_cg_quota_t *q, uint32_t mcpu, int version, const char *file)
{
    if (mcpu && (q->mcpu == 0 || mcpu < q->mcpu)) {
        q->mcpu = mcpu;
        q->version = version;
        snprintf(q->file, sizeof q->file, "%s", file);
    }
}

flx_status_t flx_cg_quota_parse(const char *cgroup, size_t cgroup_len, const char *mountinfo, size_t mountinfo_len,
                                flx_cg_read_fn rd, void *ctx, flx_cg_quota_t *out)
{
    cg_self_t *self = malloc(sizeof *self);
    cg_mount_t *mv2 = malloc(sizeof *mv2), *mv1 = malloc(sizeof *mv1);
    char *dir = malloc(CG_PATH_MAX), *file = malloc(2 * CG_PATH_MAX);
    flx_cg_quota_t q = {0};
    flx_status_t st = FLX_OK;
    if (!self || !mv2 || !mv1 || !dir || !file) {
        st = flx_error_set(FLX_ERR_NOMEM, "cgroup quota: buffers");
        goto out;
    }
    if ((st = parse_self(cgroup, cgroup_len, self)) || (st = parse_mounts(mountinfo, mountinfo_len, self, mv2, mv1)))
        goto out;
    for (int version = 2; version >= 1; version--) {
        const cg_mount_t *m = version == 2 ? mv2 : mv1;
        const char *path = version == 2 ? self->v2 : self->v1;
        if (!m->found || !path[0]) continue;
        cg_rel(m, path, dir);
        for (;;) {
            char *data = NULL;
            size_t len = 0;
            if (!cg_file(file, m, dir, version == 2 ? "cpu.max" : "cpu.cfs_quota_us")) {
                st = flx_error_set(FLX_ERR_FORMAT, "/proc/self/mountinfo: cgroup directory %s%s too long", m->point,
                                   dir);
                goto out;
            }
            st = rd(ctx, file, &data, &len);
            if (st && st != FLX_ERR_NOT_FOUND) goto out;
            if (!st && version == 2) {
                uint32_t mcpu;
                st = flx_cg_parse_cpu_max(data, len, file, &mcpu);
                free(data);
                if (st) goto out;
                quota_take(&q, mcpu, 2, file);
            } else if (!st) {
                int64_t quota;
                st = parse_v1_quota(data, len, file, &quota);
                free(data);
                if (st) goto out;
                if (quota >= 0) {
                    char *pfile = file + CG_PATH_MAX;   /* the quota file's name stays in file */
                    uint64_t period;
                    cg_file(pfile, m, dir, "cpu.cfs_period_us");
                    if ((st = rd(ctx, pfile, &data, &len))) {
                        if (st == FLX_ERR_NOT_FOUND)
                            st = flx_error_set(FLX_ERR_FORMAT, "%s: missing beside a cpu.cfs_quota_us of %lld", pfile,
                                               (long long)quota);
                        goto out;
                    }
                    st = parse_v1_period(data, len, pfile, &period);
                    free(data);
                    if (st) goto out;
                    quota_take(&q, quota_mcpu((uint64_t)quota, period), 1, file);
                }
            }
            st = FLX_OK;
            if (!dir[0]) break;
            *strrchr(dir, '/') = '\0';
        }
    }
out:
    if (!st) *out = q;
    free(self);
    free(mv2);
    free(mv1);
    free(dir);
    free(file);
    return st;
}

/* ---------------- the budget ---------------- */

static flx_status_t affinity_count(uint32_t *n_p);

flx_status_t flx_cpu_budget_read(const char *root, uint32_t n_affinity, flx_cpu_budget_t *budget_p)
{
    if (!budget_p) return flx_error_set(FLX_ERR_INVALID, "cpu budget: budget_p is NULL");
    if (n_affinity == 0) return flx_error_set(FLX_ERR_INVALID, "cpu budget: affinity mask is empty");
    root_ctx_t rc = {.root = root && strcmp(root, "/") ? root : ""};
    char *cg = NULL, *mi = NULL;
    size_t cg_n = 0, mi_n = 0;
    flx_cg_quota_t q = {0};
    flx_status_t st = read_under_root(&rc, "/proc/self/cgroup", &cg, &cg_n);
    if (!st) st = read_under_root(&rc, "/proc/self/mountinfo", &mi, &mi_n);
    if (st == FLX_ERR_NOT_FOUND) st = FLX_OK;   /* no cgroup information: no quota */
    else if (!st) st = flx_cg_quota_parse(cg, cg_n, mi, mi_n, read_under_root, &rc, &q);
    free(cg);
    free(mi);
    if (st) return st;
    flx_cpu_budget_t b = {.n_affinity = n_affinity, .quota_mcpu = q.mcpu, .quota_version = q.version};
    snprintf(b.quota_file, sizeof b.quota_file, "%s", q.file);
    b.n_cpus = n_affinity;
    if (q.mcpu) {
        uint32_t c = (q.mcpu + 999) / 1000;
        if (c < b.n_cpus) b.n_cpus = c;
    }
    *budget_p = b;
    return FLX_OK;
}

flx_status_t flx_cpu_budget_detect(flx_cpu_budget_t *budget_p)
{
    uint32_t n;
    flx_status_t st = affinity_count(&n);
    if (st) return st;
    return flx_cpu_budget_read(NULL, n, budget_p);
}

void flx_cpu_budget_format(const flx_cpu_budget_t *b, char *buf, size_t cap)
{
    const char *s = b->n_affinity == 1 ? "" : "s";
    if (!b->quota_mcpu)
        snprintf(buf, cap, "affinity %u CPU%s, cgroup quota none", b->n_affinity, s);
    else
        snprintf(buf, cap, "affinity %u CPU%s, cgroup quota %.3g CPU%s (v%d%s%s)", b->n_affinity, s,
                 b->quota_mcpu / 1000.0, b->quota_mcpu == 1000 ? "" : "s", b->quota_version,
                 b->quota_file[0] ? " " : "", b->quota_file);
}

/* ---------------- topology ---------------- */

void pool_topo_free(pool_topo_t *t)
{
    free(t->cpu);
    free(t->node);
    t->cpu = NULL, t->node = NULL, t->n = 0;
}

/* The affinity mask, grown until the kernel's CPU count fits. */
static flx_status_t affinity_set(cpu_set_t **set_p, size_t *size_p, int *ncpu_p)
{
    for (int ncpu = 1024; ncpu <= (1 << 20); ncpu *= 2) {
        size_t sz = CPU_ALLOC_SIZE(ncpu);
        cpu_set_t *set = CPU_ALLOC(ncpu);
        if (!set) return flx_error_set(FLX_ERR_NOMEM, "affinity mask of %d CPUs", ncpu);
        if (sched_getaffinity(0, sz, set) == 0) {
            *set_p = set, *size_p = sz, *ncpu_p = ncpu;
            return FLX_OK;
        }
        int e = errno;
        CPU_FREE(set);
        if (e != EINVAL) return flx_error_set(flx_status_from_errno(e), "sched_getaffinity: %s", strerror(e));
    }
    return flx_error_set(FLX_ERR_UNSUPPORTED, "sched_getaffinity: more than 2^20 CPUs");
}

static flx_status_t affinity_count(uint32_t *n_p)
{
    cpu_set_t *set;
    size_t sz;
    int ncpu;
    flx_status_t st = affinity_set(&set, &sz, &ncpu);
    if (st) return st;
    int n = CPU_COUNT_S(sz, set);
    CPU_FREE(set);
    if (n <= 0) return flx_error_set(FLX_ERR_STATE, "sched_getaffinity: empty affinity mask");
    *n_p = (uint32_t)n;
    return FLX_OK;
}

static flx_status_t real_topo(void *ctx, pool_topo_t *t)
{
    (void)ctx;
    cpu_set_t *set;
    size_t sz;
    int ncpu;
    flx_status_t st = affinity_set(&set, &sz, &ncpu);
    if (st) return st;
    int n = CPU_COUNT_S(sz, set);
    t->n = 0;
    t->cpu = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->cpu);
    t->node = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->node);
    if (!t->cpu || !t->node) {
        CPU_FREE(set);
        pool_topo_free(t);
        return flx_error_set(FLX_ERR_NOMEM, "topology of %d CPUs", n);
    }
    const int numa = numa_available() >= 0;
    for (int c = 0; c < ncpu && t->n < (uint32_t)n; c++) {
        if (!CPU_ISSET_S((size_t)c, sz, set)) continue;
        int node = numa ? numa_node_of_cpu(c) : 0;
        t->cpu[t->n] = c;
        t->node[t->n++] = node >= 0 ? node : 0;
    }
    CPU_FREE(set);
    if (t->n == 0) {
        pool_topo_free(t);
        return flx_error_set(FLX_ERR_STATE, "sched_getaffinity: empty affinity mask");
    }
    return FLX_OK;
}

/* libnuma says a node with no memory or past numa_max_node does not exist; without NUMA support
 * only node 0 does (measured: numa_alloc_onnode on a missing node still returns memory). */
flx_status_t flx_numa_node_check(int node)
{
    if (node < 0) return flx_error_set(FLX_ERR_INVALID, "numa node %d is negative", node);
    if (numa_available() < 0) {
        if (node != 0)
            return flx_error_set(FLX_ERR_INVALID, "numa node %d does not exist (no NUMA support: only node 0)", node);
        return FLX_OK;
    }
    if (node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
        return flx_error_set(FLX_ERR_INVALID, "numa node %d does not exist or has no memory (max node %d)", node,
                             numa_max_node());
    return FLX_OK;
}

static flx_status_t real_check_node(void *ctx, int node)
{
    (void)ctx;
    return flx_numa_node_check(node);
}

static flx_status_t real_budget(void *ctx, flx_cpu_budget_t *b)
{
    (void)ctx;
    return flx_cpu_budget_detect(b);
}

static flx_status_t real_bind(void *ctx, uint32_t worker, const int *cpus, uint32_t n, int node)
{
    (void)ctx;
    if (n) {
        int maxc = 0;
        for (uint32_t i = 0; i < n; i++) maxc = cpus[i] > maxc ? cpus[i] : maxc;
        cpu_set_t *set = CPU_ALLOC(maxc + 1);
        if (!set) return flx_error_set(FLX_ERR_NOMEM, "affinity mask");
        size_t sz = CPU_ALLOC_SIZE(maxc + 1);
        CPU_ZERO_S(sz, set);
        for (uint32_t i = 0; i < n; i++) CPU_SET_S((size_t)cpus[i], sz, set);
        int rc = sched_setaffinity(0, sz, set), e = errno;
        CPU_FREE(set);
        if (rc)
            return flx_error_set(flx_status_from_errno(e), "worker %u: sched_setaffinity to %u CPUs (%d..%d): %s",
                                 worker, n, cpus[0], cpus[n - 1], strerror(e));
    }
    if (node >= 0 && numa_available() >= 0) numa_set_preferred(node);
    return FLX_OK;
}

const pool_sys_t flx_pool_sys_real = {.topo = real_topo, .check_node = real_check_node, .budget = real_budget,
                                      .bind = real_bind, .ctx = NULL};

/* ---------------- placement and the worker count ---------------- */

void pool_place_free(pool_place_t *p)
{
    free(p->cpus);
    free(p->reserved);
    memset(p, 0, sizeof *p);
}

flx_status_t pool_place(const pool_topo_t *t, int node, uint32_t reserve, int concrete, pool_place_t *out)
{
    pool_place_t p = {0};
    p.cpus = malloc((size_t)(t->n ? t->n : 1) * sizeof *p.cpus);
    p.reserved = malloc((size_t)(t->n ? t->n : 1) * sizeof *p.reserved);
    if (!p.cpus || !p.reserved) {
        pool_place_free(&p);
        return flx_error_set(FLX_ERR_NOMEM, "placement of %u CPUs", t->n);
    }
    int nodes_seen = 0, first_node = -1;
    for (uint32_t i = 0; i < t->n; i++) {
        if (first_node < 0) first_node = t->node[i];
        nodes_seen |= t->node[i] != first_node;
        if (node < 0 || t->node[i] == node) p.cpus[p.n_cpus++] = t->cpu[i];
    }
    if (p.n_cpus == 0) {
        pool_place_free(&p);
        return flx_error_set(FLX_ERR_INVALID,
                             "numa node %d has none of the %u CPUs of the process's affinity mask (%d..%d)", node,
                             t->n, t->n ? t->cpu[0] : -1, t->n ? t->cpu[t->n - 1] : -1);
    }
    /* binding matters when it narrows the mask: a node of a multi-node mask, or reserved CPUs */
    p.bind = node >= 0 && nodes_seen;
    if (concrete && reserve) {
        if (reserve >= p.n_cpus) {
            uint32_t nc = p.n_cpus;
            pool_place_free(&p);
            return flx_error_set(FLX_ERR_INVALID, "reserve_cpus %u leaves no CPU for the pool (%u CPUs%s)", reserve, nc,
                                 node >= 0 ? " on its numa node" : "");
        }
        p.n_cpus -= reserve;
        memcpy(p.reserved, p.cpus + p.n_cpus, reserve * sizeof *p.reserved);
        p.n_reserved = reserve;
        p.bind = 1;
    }
    *out = p;
    return FLX_OK;
}

flx_status_t pool_resolve_workers(uint32_t requested, const char *env, const flx_cpu_budget_t *budget,
                                  uint32_t place_cpus, uint32_t reserve, int node, uint32_t *n_p, char *reason,
                                  size_t cap)
{
    char bud[400], where[96] = "";
    if (budget->n_cpus) flx_cpu_budget_format(budget, bud, sizeof bud);
    else snprintf(bud, sizeof bud, "CPU budget not read");
    if (node >= 0) snprintf(where, sizeof where, ", numa node %d: %u CPUs", node, place_cpus);
    if (reserve) snprintf(where + strlen(where), sizeof where - strlen(where), ", %u reserved", reserve);
    uint32_t avail = budget->n_cpus && budget->n_cpus < place_cpus ? budget->n_cpus : place_cpus;
    avail = avail > reserve ? avail - reserve : 1;
    uint32_t n;
    if (requested) {
        n = requested;
        snprintf(reason, cap, "workers %u: requested (%s%s%s)", n, n > avail ? "oversubscribed: " : "", bud, where);
    } else if (env) {
        uint64_t v;
        if (flx_parse_u64(env, 1, FLX_POOL_MAX_WORKERS, &v)) {
            char ex[64];
            return flx_error_set(FLX_ERR_INVALID, "FLX_THREADS '%s' is not a whole number in 1..%u",
                                 excerpt(env, strlen(env), ex, sizeof ex), FLX_POOL_MAX_WORKERS);
        }
        n = (uint32_t)v;
        snprintf(reason, cap, "workers %u: FLX_THREADS=%u (%s%s%s)", n, n, n > avail ? "oversubscribed: " : "", bud,
                 where);
    } else {
        n = avail > FLX_POOL_MAX_WORKERS ? FLX_POOL_MAX_WORKERS : avail;
        snprintf(reason, cap, "workers %u: %s%s", n, bud, where);
    }
    *n_p = n;
    return FLX_OK;
}
