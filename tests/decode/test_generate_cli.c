/*
 * test_generate_cli - runs the flx-generate binary.
 *   test_generate_cli TOOL DIR GEN      every bad flag exits 2 with a message naming the flag, before
 *                                       any model is loaded; a missing model file exits 1; on a tiny
 *                                       GGUF written by GEN (flx-gen-ckpt --format gguf, context 256):
 *                                       an inline prompt and a prompt file give the same text on
 *                                       stdout, --progress reports on stderr only; bad input 05 (a
 *                                       1 MiB prompt file against the 256-token context) exits 1 at
 *                                       once naming both lengths, no layer of a prefill having run
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
    return flx_test_sh(cmd);
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

    if (argc == 4 && strcmp(argv[3], "model") != 0) {
        static const struct { const char *args, *needle; } bad[] = {
            {"", "--model is required"},
            {"--model /nonexistent.gguf", "one of --prompt and --prompt-file is required"},
            {"--model M --prompt-file P --mode sparse", "--mode 'sparse'"},
            {"--model M --prompt-file P --tau 1.5 --mode fluxion", "--tau '1.5'"},
            {"--model M --prompt-file P --tau 0.2", "--tau has no effect with --mode full"},
            {"--model M --prompt-file P --mode fluxion --stream-threshold 0.3", "--stream-threshold '0.3'"},
            {"--model M --prompt-file P --mode fluxion --budget-scale 0", "--budget-scale '0'"},
            {"--model M --prompt-file P --mode fluxion --min-blocks 65", "--min-blocks '65'"},
            {"--model M --prompt-file P --mode fixed --min-blocks 6", "--min-blocks has no effect with --mode fixed"},
            {"--model M --prompt-file P --mode fixed --blk 24", "--blk '24' is not 16, 32, 64 or 128"},
            {"--model M --prompt-file P --mode fixed --blk 256", "--blk '256'"},
            {"--model M --prompt-file P --mode fixed --bgt 1.5", "--bgt '1.5'"},
            {"--model M --prompt-file P --mode fixed --bgt -0.1", "--bgt '-0.1'"},
            {"--model M --prompt-file P --mode fixed --bgt nan", "--bgt 'nan'"},
            {"--model M --prompt-file P --bgt 0.1", "--bgt has no effect with --mode full"},
            {"--model M --prompt-file P --max-new 0", "--max-new '0'"},
            {"--model M --prompt-file P --max-new 12x", "--max-new '12x'"},
            {"--model M --prompt-file P --temp -1", "--temp '-1'"},
            {"--model M --prompt-file P --temp 1 --top-k -3", "--top-k '-3'"},
            {"--model M --prompt-file P --temp 1 --top-p 0", "--top-p '0'"},
            {"--model M --prompt-file P --temp 1 --top-p 1.01", "--top-p '1.01'"},
            {"--model M --prompt-file P --temp 1 --seed abc", "--seed 'abc'"},
            {"--model M --prompt-file P --seed 3", "--seed has no effect with greedy sampling"},
            {"--model M --prompt-file P --threads 0", "--threads '0'"},
            {"--model M --prompt-file P --frobnicate", "unknown option --frobnicate"},
            {"--model M --prompt-file P --prompt x", "--prompt and --prompt-file exclude each other"},
            {"--model M --prompt-file P --mode fixed --blk", "--blk needs a value"},
            {"--model M --prompt-file P stray", "unexpected argument 'stray'"},
            {"--model M --prompt-file P --gpu=x", "--gpu 'x'"},
            {"--model M --prompt-file P --gpu 1024", "--gpu '1024'"},
            {"--model M --prompt-file P --gpu=2 7", "unexpected argument '7'"},
            {"--model M --prompt \"What is 2+2?\" --prompt-fil P", "unknown option --prompt-fil"},
            {"--model M --prompt-file P --policy fastest", "--policy 'fastest'"},
            {"--model M --prompt-file P --weights q4", "--weights 'q4'"},
            {"--model M --prompt-file P --gpu --placement cpu-only", "--placement 'cpu-only'"},
            {"--model M --prompt-file P --placement gpu-only", "--placement has no effect without --gpu"},
            {"--model M --prompt-file P --mode fluxion --fixed-blk 48", "--fixed-blk '48'"},
            {"--model M --prompt-file P --fixed-blk 32", "--fixed-blk has no effect with --mode full"},
            {"--model M --prompt-file P --no-skip-streaming", "--no-skip-streaming has no effect with --mode full"},
            {"--model M --prompt-file P --gpu --gpu-streams 9", "--gpu-streams '9'"},
        };
        for (size_t i = 0; i < FLX_ARRAY_SIZE(bad); i++) {
            int rc = run(bad[i].args, out, err);
            const char *msg = flx_test_slurp(err);
            fprintf(stderr, "flx-generate %s -> %d: %.*s\n", bad[i].args, rc, (int)strcspn(msg, "\n"), msg);
            CHECK(rc == 2);
            CHECK(strstr(msg, bad[i].needle) != NULL && strstr(msg, bad[i].needle) < msg + strcspn(msg, "\n"));
            CHECK(strstr(msg, "try 'flx-generate --help'"));
        }
        char args[4096];
        snprintf(args, sizeof args, "--model %s/missing.gguf --prompt-file %s", dir, prompt);
        CHECK(run(args, out, err) == 1);
        CHECK(strstr(flx_test_slurp(err), "missing.gguf"));
        snprintf(args, sizeof args, "--model %s/missing.gguf --prompt-file %s/missing.txt", dir, dir);
        CHECK(run(args, out, err) == 1);
        CHECK(strstr(flx_test_slurp(err), "missing.txt"));   /* the prompt file is read before the model */
        /* a predictor file that cannot be read is a runtime failure like a bad model (issue 14) */
        snprintf(args, sizeof args, "--model M --prompt-file %s --mode fluxion --predictor %s/missing.safetensors", prompt, dir);
        CHECK(run(args, out, err) == 1);
        CHECK(strstr(flx_test_slurp(err), "--predictor"));

        /* a tiny model with a 256-token context, tokenizer included (one token per byte) */
        char tiny[1024], cmd[4096];
        snprintf(tiny, sizeof tiny, "%s/tiny.gguf", dir);
        snprintf(cmd, sizeof cmd,
                 "%s --family llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 300 "
                 "--max-ctx 256 --format gguf %s > /dev/null",
                 argv[3], tiny);
        CHECK(system(cmd) == 0);
        char text_inline[4096];
        snprintf(args, sizeof args, "-m %s -p \"%s\" -n 8 -t 1", tiny, "What is the capital of France? Answer in one "
                 "short sentence.");
        CHECK(run(args, out, err) == 0);
        snprintf(text_inline, sizeof text_inline, "%s", flx_test_slurp(out));
        snprintf(args, sizeof args, "-m %s -f %s -n 8 -t 1 --progress", tiny, prompt);
        CHECK(run(args, out, err) == 0);
        CHECK(!strcmp(flx_test_slurp(out), text_inline) && strlen(text_inline) > 0);   /* the same prompt, the same text */
        const char *e = flx_test_slurp(err);
        fprintf(stderr, "tiny model, --progress:\n%s", e);
        CHECK(strstr(e, "flx-generate: loading model: 2/2 layers in ") &&
              strstr(e, "flx-generate: prefill: 2/2 layers in "));
        CHECK(!strstr(text_inline, "prefill") && !strstr(text_inline, "layers"));   /* stdout: the text only */
        snprintf(args, sizeof args, "-m %s -f %s -n 8 -t 1", tiny, prompt);   /* not a terminal, not asked: none */
        CHECK(run(args, out, err) == 0 && !strstr(flx_test_slurp(err), "prefill: "));

        /* bad input 05: a 1 MiB prompt file against the 256-token context */
        char big[1024];
        snprintf(big, sizeof big, "%s/big.txt", dir);
        FILE *bf = fopen(big, "w");
        CHECK(bf);
        for (size_t i = 0; i < (1u << 20); i++) fputc("The quick brown fox jumps over the lazy dog.\n"[i % 45], bf);
        CHECK(fclose(bf) == 0);
        snprintf(args, sizeof args, "--model %s --prompt-file %s --max-new 2 --progress", tiny, big);
        int rc = run(args, out, err);
        e = flx_test_slurp(err);
        fprintf(stderr, "bad input 05 -> %d: %s", rc, e);
        CHECK(rc == 1);
        CHECK(strstr(e, "flx-generate: the prompt is 1048576 tokens, longer than the model's context of 256 tokens"));
        CHECK(!strstr(e, "prefill: ") && flx_test_slurp(out)[0] == 0);   /* refused before a layer ran, nothing generated */
        fprintf(stderr, "test_generate_cli: ok\n");
        return 0;
    }

    char model[1024];
    if (!flx_test_model_path("test_generate_cli", model, sizeof model)) return FLX_TEST_SKIP;
    char args[4096], text_full[4096];
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2", model, prompt);
    CHECK(run(args, out, err) == 0);
    snprintf(text_full, sizeof text_full, "%s", flx_test_slurp(out));
    const char *e = flx_test_slurp(err);
    fprintf(stderr, "full: \"%s\"\n%s", text_full, e);
    CHECK(strlen(text_full) > 2);
    CHECK(strstr(e, "TPOT") && strstr(e, "prefill") && strstr(e, "host bytes"));
    CHECK(strstr(e, "weights compact: ") && strstr(e, "(matrices as q4, head as q8)"));
    /* the GGUF's Q4_1 / Q8_0 matrices dequantized to bf16 hold the same values: the same tokens */
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --weights bf16", model,
             prompt);
    CHECK(run(args, out, err) == 0);
    fprintf(stderr, "--weights bf16: \"%s\"\n", flx_test_slurp(out));
    CHECK(strcmp(flx_test_slurp(out), text_full) == 0);
    CHECK(strstr(flx_test_slurp(err), "weights bf16: ") && strstr(flx_test_slurp(err), "(matrices as bf16, head as bf16)"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --mode fixed --blk 32 --bgt 1", model,
             prompt);
    CHECK(run(args, out, err) == 0);
    fprintf(stderr, "fixed(32, 1): \"%s\"\n", flx_test_slurp(out));
    CHECK(strcmp(flx_test_slurp(out), text_full) == 0);
    /* fluxion with the shipped weights: their calibrated operating point, or the one asked for */
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --mode fluxion", model,
             prompt);
    CHECK(run(args, out, err) == 0);
    CHECK(strlen(flx_test_slurp(out)) > 2);   /* slurp's buffer is reused: the text first, then the report */
    e = flx_test_slurp(err);
    fprintf(stderr, "fluxion:\n%s", e);
    CHECK(strstr(e, "mode fluxion") && strstr(e, "selector: stream threshold") && strstr(e, "fluxion per step"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 4 --threads 2 --mode fluxion --stream-threshold 0.5 "
             "--budget-scale 1 --min-blocks 0", model, prompt);
    CHECK(run(args, out, err) == 0);
    CHECK(strstr(flx_test_slurp(err), "stream threshold 0.5, budget scale 1, min blocks 0"));
    snprintf(args, sizeof args,
             "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --temp 0.8 --top-k 40 --top-p 0.9 --seed 7",
             model, prompt);
    CHECK(run(args, out, err) == 0);
    fprintf(stderr, "sampled: \"%s\"\n", flx_test_slurp(out));
    snprintf(args, sizeof args, "--model %s --prompt-file %s --chat --max-new 12 --threads 2 --gpu", model, prompt);
    const int rc_gpu = run(args, out, err);
    e = flx_test_slurp(err);
    if (flx_cuda_device_count() == 0) {
        fprintf(stderr, "--gpu without a device -> %d: %s", rc_gpu, e);
        CHECK(rc_gpu == 1 && strstr(e, "--gpu 0") && strstr(e, "no CUDA device"));
    } else {
        fprintf(stderr, "--gpu: \"%s\"\n%s", flx_test_slurp(out), e);
        CHECK(rc_gpu == 0 && strstr(e, "gpu 0"));
        CHECK(strcmp(flx_test_slurp(out), text_full) == 0);
    }
    fprintf(stderr, "test_generate_cli model: ok\n");
    return 0;
}
