/*
 * fuzz_util.h - what the fuzz targets share: the input as a file that the product's path API
 * opens, a private scratch folder, reading every byte of what a loader hands back, and property
 * checks that crash (so libFuzzer reports them).
 *
 * DESIGN
 * The loaders take paths (they map or read whole files), so a target hands them a path instead of
 * calling a from-memory twin the product never uses: the input goes into a memfd rewritten for
 * every input and named /proc/self/fd/N (a regular file to fstat and mmap, no disk). A loader that
 * reads a folder (Hugging Face checkpoints) gets a private mkdtemp folder, removed at exit. Logging
 * is cut to errors: libFuzzer runs millions of refused inputs.
 */
#ifndef FLX_FUZZ_UTIL_H
#define FLX_FUZZ_UTIL_H

#define _GNU_SOURCE
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flx/log.h"

/* A broken property of the code under test: report it as a crash. */
#define FUZZ_CHECK(c)                                                                    \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static inline void fuzz_write_fd(int fd, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(ftruncate(fd, 0) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t k = pwrite(fd, data + off, size - off, (off_t)off);
        FUZZ_CHECK(k > 0);
        off += (size_t)k;
    }
}

/* A path naming a regular file that holds exactly data: valid until the next call. */
static inline const char *fuzz_path(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("flx-fuzz-input", MFD_CLOEXEC);
        FUZZ_CHECK(fd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    fuzz_write_fd(fd, data, size);
    return path;
}

static char fuzz_dir_path[64];

static inline int fuzz_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static inline void fuzz_dir_remove(void)
{
    if (fuzz_dir_path[0]) nftw(fuzz_dir_path, fuzz_rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* This process's scratch folder (created on first use, removed at exit). */
static inline const char *fuzz_dir(void)
{
    if (!fuzz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/flx-fuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        FUZZ_CHECK(mkdtemp(fuzz_dir_path) != NULL);
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Writes data as the file dir/name. */
static inline void fuzz_write_file(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    FUZZ_CHECK(f != NULL);
    FUZZ_CHECK(fwrite(data, 1, size, f) == size || size == 0);
    FUZZ_CHECK(fclose(f) == 0);
}

/* Reads every byte of n bytes at p, so ASan checks that all of them are the loader's to hand out. */
static inline void fuzz_touch(const void *p, size_t n)
{
    const volatile uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= b[i];
    (void)x;
}

static inline void fuzz_quiet(void)
{
    flx_log_set_level(FLX_LOG_ERROR);
}

/* libFuzzer's entry points (replay_main.c calls them too). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The initializer of a target that has nothing to set up but quiet logs. */
#define FUZZ_QUIET_INIT                                    \
    int LLVMFuzzerInitialize(int *argc, char ***argv)      \
    {                                                      \
        (void)argc, (void)argv;                            \
        fuzz_quiet();                                      \
        return 0;                                          \
    }

#endif
