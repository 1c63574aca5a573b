/*
 * replay_main.c - runs a fuzz target's LLVMFuzzerTestOneInput on every file of the folders (or the
 * files) named on the command line, for builds without libFuzzer: the committed corpus (seeds and
 * every crash found so far) becomes a regression test of the release and sanitizer builds. A
 * missing or empty corpus fails, so the test cannot pass by finding nothing to run.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) abort();
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    fclose(f);
    /* libFuzzer hands inputs in a buffer of exactly their size: copy so ASan sees the end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) abort();
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    size_t done = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i])) return 1;
            done++;
            continue;
        }
        struct dirent **ents = NULL;
        int n = scandir(argv[i], &ents, NULL, alphasort);
        if (n < 0) return 1;
        for (int k = 0; k < n; k++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], ents[k]->d_name);
            if (ents[k]->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (run_file(p)) return 1;
                done++;
            }
            free(ents[k]);
        }
        free(ents);
    }
    if (done == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    fprintf(stderr, "replay: %zu inputs, no crash\n", done);
    return 0;
}
