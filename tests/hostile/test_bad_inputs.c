/*
 * test_bad_inputs - the hostile files of issue 14 (tests/data/bad-inputs, README there), each run
 * through its tool exactly as a user would: exit status, the message naming the field, no sanitizer
 * report (this test runs in the release and in the ASan+UBSan build), and, where the cap is
 * enforced (memcap.h), in an address space of 1 GiB: the sparse tokenizer id once took 10 GB.
 *
 * usage: test_bad_inputs FLX_GENERATE FLUXION_ATTN FLX_GEN_CKPT SCRATCH_DIR
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx_test.h"
#include "memcap.h"

static const char *g_gen, *g_attn, *g_ckpt;
static char g_dir[512];

/* Runs argv (NULL-terminated) capped at 1 GiB; checks the exit code, that stderr names want, and
 * that no sanitizer spoke. */
static void expect(const char *label, char *const argv[], int want_code, const char *want)
{
    char err[600];
    snprintf(err, sizeof err, "%s/%s.err", g_dir, label);
    memcap_result_t r = memcap_exec((size_t)1 << 30, argv, err);
    const char *text = flx_test_slurp(err);
    fprintf(stderr, "%s: exit %d signal %d, peak rss %ld KiB, said: %s", label, r.code, r.sig, r.max_rss_kb,
            text[0] ? text : "(nothing)\n");
    CHECK(r.sig == 0 && r.code == want_code);
    if (want) CHECK(strstr(text, want) != NULL);
    static const char *const sanitizers[] = {"AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                                             "runtime error:"};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(sanitizers); i++) CHECK(strstr(text, sanitizers[i]) == NULL);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) CHECK(fwrite(buf, 1, n, b) == n);
    fclose(a);
    CHECK(fclose(b) == 0);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: test_bad_inputs FLX_GENERATE FLUXION_ATTN FLX_GEN_CKPT SCRATCH_DIR\n");
        return 2;
    }
    g_gen = argv[1], g_attn = argv[2], g_ckpt = argv[3];
    snprintf(g_dir, sizeof g_dir, "%s/bad_inputs.XXXXXX", argv[4]);
    CHECK(mkdtemp(g_dir));
    if (!MEMCAP_ENFORCED) fprintf(stderr, "test_bad_inputs: sanitizer build, address space not capped\n");
    char prompt[600], out[600], hf[600], path[700];
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", g_dir);
    snprintf(out, sizeof out, "%s/out.safetensors", g_dir);
    write_file(prompt, "What is 2+2?\n");
    const char *bi = FLX_TEST_DATA "/bad-inputs/";
    char f01[600], f02[600], f03[600], f04[600];
    snprintf(f01, sizeof f01, "%s01-gguf-rope-freqs-stack-overflow.gguf", bi);
    snprintf(f02, sizeof f02, "%s02-safetensors-duplicate-metadata.safetensors", bi);
    snprintf(f03, sizeof f03, "%s03-fluxion-attn-misaligned-bf16.safetensors", bi);
    snprintf(f04, sizeof f04, "%s04-tokenizer-sparse-vocab-1G.json", bi);

    /* 01: head_dim 512 with a rope_freqs.weight of 256 floats (a stack overflow in the RoPE path) */
    expect("01", (char *[]){(char *)g_gen, "--model", f01, "--prompt-file", prompt, NULL}, 1,
           "key 'llama.attention.key_length' = 512");
    /* 02: two "__metadata__" objects (a heap overflow in flx_st_open) */
    expect("02", (char *[]){(char *)g_attn, f02, out, NULL}, 1, "header field '__metadata__' appears twice");
    /* 03: BF16 data at odd addresses, which the format allows: read correctly (values checked in
     * test_fluxion_attn_tool), no longer a misaligned load */
    expect("03", (char *[]){(char *)g_attn, f03, out, NULL}, 0, NULL);
    /* 04: as the tokenizer.json of a Hugging Face folder, one vocabulary id of 2^30 - 2 */
    snprintf(hf, sizeof hf, "%s/hf", g_dir);
    expect("04-ckpt", (char *[]){(char *)g_ckpt, "--family", "llama", "--layers", "1", "--hidden", "32", "--heads",
                                 "2", "--ffn", "32", "--vocab", "300", hf, NULL}, 0, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.json", hf);
    copy_file(f04, path);
    expect("04", (char *[]){(char *)g_gen, "--model", hf, "--prompt-file", prompt, NULL}, 1,
           "model.vocab id 1073741822 ('a')");
    /* 04b: the same with an added_tokens id of 10^9 */
    write_file(path, "{\"added_tokens\":[{\"id\":1000000000,\"content\":\"<x>\",\"special\":true}],"
                     "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                     "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":true}}");
    expect("04b", (char *[]){(char *)g_gen, "--model", hf, "--prompt-file", prompt, NULL}, 1,
           "added_tokens id 1000000000 ('<x>')");
    nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    fprintf(stderr, "test_bad_inputs: ok\n");
    return 0;
}
