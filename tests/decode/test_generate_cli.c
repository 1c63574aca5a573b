/*
 * test_generate_cli - runs the flx-generate binary.
 *   test_generate_cli TOOL DIR          every bad flag exits 2 with a message naming the flag, before
 *                                       any model is loaded; a missing model file exits 1
 *   test_generate_cli TOOL DIR model    on the real model (77 when absent): a chat prompt in full and
 *                                       fixed mode exits 0, streams text to stdout and timings to
 *                                       stderr; greedy full and fixed(bgt 1) print the same text;
 *                                       --gpu prints that text too where a CUDA device exists, and
 *                                       exits 1 naming the missing device where none does
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flx/cuda_rt.h"
#include "flx_test.h"

static const char *tool, *dir;

static int run(const char *args, const char *out, const char *err)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", tool, args, out, err);
    int r = system(cmd);
    CHECK(r != -1 && WIFEXITED(r));
    return WEXITSTATUS(r);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    CHECK(f);
    static char buf[2][65536];
    static int which;
    char *b = buf[which ^= 1];
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    fclose(f);
    b[n] = 0;
    return b;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3);
    tool = argv[1];
    dir = argv[2];
    char out[1024], err[1024], prompt[1024];
    /* files of their own for the unit and the model run, which ctest -j may run at the same time */
    const char *tag = argc == 3 ? "unit" : "model";
    snprintf(out, sizeof out, "%s/gen_%s.out", dir, tag);
    snprintf(err, sizeof err, "%s/gen_%s.err", dir, tag);
    snprintf(prompt, sizeof prompt, "%s/gen_%s.prompt", dir, tag);
    FILE *pf = fopen(prompt, "w");
    CHECK(pf);
    fputs("What is the capital of France? Answer in one short sentence.", pf);
    fclose(pf);

    if (argc == 3) {
        static const struct { const char *args, *needle; } bad[] = {
            {"", "--model"},
            {"--model /nonexistent.gguf", "--prompt-file"},
            {"--model M --prompt-file P --mode sparse", "sparse"},
            {"--model M --prompt-file P --mode fluxion --predictor /nonexistent.safetensors", "--predictor"},
            {"--model M --prompt-file P --tau 1.5", "--tau"},
            {"--model M --prompt-file P --mode fluxion --stream-threshold 0.3", "--stream-threshold"},
            {"--model M --prompt-file P --mode fluxion --budget-scale 0", "--budget-scale"},
            {"--model M --prompt-file P --mode fluxion --min-blocks 65", "--min-blocks"},
            {"--model M --prompt-file P --blk 24", "--blk"},
            {"--model M --prompt-file P --blk 256", "--blk"},
            {"--model M --prompt-file P --bgt 1.5", "--bgt"},
            {"--model M --prompt-file P --bgt -0.1", "--bgt"},
            {"--model M --prompt-file P --bgt nan", "--bgt"},
            {"--model M --prompt-file P --max-new 0", "--max-new"},
            {"--model M --prompt-file P --max-new 12x", "--max-new"},
            {"--model M --prompt-file P --temp -1", "--temp"},
            {"--model M --prompt-file P --top-k -3", "--top-k"},
            {"--model M --prompt-file P --top-p 0", "--top-p"},
            {"--model M --prompt-file P --top-p 1.01", "--top-p"},
            {"--model M --prompt-file P --seed abc", "--seed"},
            {"--model M --prompt-file P --threads 0", "--threads"},
            {"--model M --prompt-file P --frobnicate", "--frobnicate"},
            {"--model M --prompt-file P --blk", "--blk"},
            {"--model M --prompt-file P stray", "stray"},
            {"--model M --prompt-file P --gpu=x", "--gpu"},
            {"--model M --prompt-file P --gpu 1024", "--gpu"},
            {"--model M --prompt-file P --gpu=2 7", "'7'"},
            {"--model M --prompt-file P --policy fastest", "fastest"},
            {"--model M --prompt-file P --placement cpu-only", "cpu-only"},
            {"--model M --prompt-file P --mode fluxion --fixed-blk 48", "--fixed-blk"},
            {"--model M --prompt-file P --gpu-streams 9", "--gpu-streams"},
        };
        for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
            int rc = run(bad[i].args, out, err);
            const char *msg = slurp(err);
            fprintf(stderr, "flx-generate %s -> %d: %.*s\n", bad[i].args, rc, (int)strcspn(msg, "\n"), msg);
            CHECK(rc == 2);
            CHECK(strstr(msg, bad[i].needle) != NULL);
        }
        char args[4096];
        snprintf(args, sizeof args, "--model %s/missing.gguf --prompt-file %s", dir, prompt);
        CHECK(run(args, out, err) == 1);
        CHECK(strstr(slurp(err), "missing.gguf"));
        snprintf(args, sizeof args, "--model %s/missing.gguf --prompt-file %s/missing.txt", dir, dir);
        CHECK(run(args, out, err) == 1);
        fprintf(stderr, "test_generate_cli: ok\n");
        return 0;
    }

    char model[1024];
    if (!flx_test_model_path("test_generate_cli", model, sizeof model)) return FLX_TEST_SKIP;
    char args[4096], text_full[4096];
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2", model, prompt);
    CHECK(run(args, out, err) == 0);
    snprintf(text_full, sizeof text_full, "%s", slurp(out));
    const char *e = slurp(err);
    fprintf(stderr, "full: \"%s\"\n%s", text_full, e);
    CHECK(strlen(text_full) > 2);
    CHECK(strstr(e, "TPOT") && strstr(e, "prefill") && strstr(e, "host bytes"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --mode fixed --blk 32 --bgt 1", model,
             prompt);
    CHECK(run(args, out, err) == 0);
    fprintf(stderr, "fixed(32, 1): \"%s\"\n", slurp(out));
    CHECK(strcmp(slurp(out), text_full) == 0);
    /* fluxion with the shipped weights: their calibrated operating point, or the one asked for */
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --mode fluxion", model,
             prompt);
    CHECK(run(args, out, err) == 0);
    CHECK(strlen(slurp(out)) > 2);   /* slurp's buffer is reused: the text first, then the report */
    e = slurp(err);
    fprintf(stderr, "fluxion:\n%s", e);
    CHECK(strstr(e, "mode fluxion") && strstr(e, "selector: stream threshold") && strstr(e, "fluxion per step"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 4 --threads 2 --mode fluxion --stream-threshold 0.5 "
             "--budget-scale 1 --min-blocks 0", model, prompt);
    CHECK(run(args, out, err) == 0);
    CHECK(strstr(slurp(err), "stream threshold 0.5, budget scale 1, min blocks 0"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --temp 0.8 --top-k 40 --top-p 0.9 --seed 7",
             model, prompt);
    CHECK(run(args, out, err) == 0);
    fprintf(stderr, "sampled: \"%s\"\n", slurp(out));
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --gpu", model, prompt);
    const int rc_gpu = run(args, out, err);
    e = slurp(err);
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "--gpu without a device -> %d: %s", rc_gpu, e);
        CHECK(rc_gpu == 1 && strstr(e, "--gpu 0") && strstr(e, "no CUDA device"));
    } else {
        fprintf(stderr, "--gpu: \"%s\"\n%s", slurp(out), e);
        CHECK(rc_gpu == 0 && strstr(e, "gpu 0"));
        CHECK(strcmp(slurp(out), text_full) == 0);
    }
    fprintf(stderr, "test_generate_cli model: ok\n");
    return 0;
}
