/*
 * test_tools_cli - every tool and benchmark binary, run as a user types it: -h, --help, --version,
 * an unknown option, a prefix of a real option (never taken), a missing value, a value out of
 * range, a contradictory or ineffective pair, a bad FLX_ISA / FLX_LOG; checks the exit status
 * (0 / 1 / 2, flx/cli.h) and the first line of the message (usage errors: exactly the two lines
 * "TOOL: ..." and "try 'TOOL --help'" on stderr, nothing on stdout). A tool that regresses on
 * any of them fails the test.
 *
 * usage: test_tools_cli SCRATCH_DIR NAME=PATH...   (every tool of the table below except the
 * benchmark binaries must be given: a tool dropped from the build fails the test too)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "flx/cli.h"
#include "flx_test.h"

typedef struct {
    const char *args;   /* after the tool's name; "M", "F", ... are never opened before the failure */
    int rc;
    const char *first;  /* a substring of the first line: stdout for rc 0, stderr otherwise */
} case_t;

typedef struct {
    const char *name;
    int bench;          /* a benchmark binary: absent from builds with FLX_BENCH=OFF */
    const char *valid;  /* a valid command line whose work would fail at once (NULL: none that quick) */
    case_t cases[16];
} tool_t;

#define GEN "flx-generate"
#define TOKEN "00112233445566778899aabbccddeeff"
#define VALID_CKPT "--family llama --layers 1 --hidden 64 --heads 4 --ffn 32 --vocab 300"

static const tool_t tools[] = {
    {GEN, 0, "-m /nonexistent/m.gguf -p hi",
     {{"-m M --prompt-fil F", 2,
       "unknown option --prompt-fil (names are matched exactly: did you mean --prompt-file?)"},
      {"-m M -p hi --mod fixed", 2, "unknown option --mod (names are matched exactly: did you mean --model, --mode?)"},
      {"-m M -p hi -n", 2, "-n needs a value"},
      {"-m M -p hi --max-new 0", 2, "--max-new '0' is not an integer in 1..1000000"},
      {"-m M -p hi --top-p 1.5 --temp 1", 2, "--top-p '1.5' is not a number in (0, 1]"},
      {"-m M -p hi -f F", 2, "--prompt and --prompt-file exclude each other"},
      {"-m M", 2, "one of --prompt and --prompt-file is required"},
      {"-p hi", 2, "--model is required"},
      {"-m M -p hi --blk 32", 2, "--blk has no effect with --mode full (only with --mode fixed)"},
      {"-m M -p hi --mode fixed --tau 0.2", 2, "--tau has no effect with --mode fixed (only with --mode fluxion)"},
      {"-m M -p hi --top-k 5", 2, "--top-k has no effect with greedy sampling"},
      {"-m M -p hi --mode sparse", 2, "--mode 'sparse' is not full, fixed or fluxion"},
      {"-m M -p hi --gpu=x", 2, "--gpu 'x'"},
      {"-m /nonexistent/m.gguf -p hi", 1, "flx-generate: loading /nonexistent/m.gguf"},
      {"-m /nonexistent/m.gguf -f /nonexistent/p.txt", 1, "--prompt-file: cannot open /nonexistent/p.txt"}}},
    {"flx-gen-ckpt", 0, VALID_CKPT " /nonexistent/dir/out",
     {{"--famil llama --layers 1 OUT", 2, "unknown option --famil (names are matched exactly: did you mean --family?)"},
      {VALID_CKPT " --layers", 2, "--layers needs a value"},
      {VALID_CKPT " --layers 0 OUT", 2, "--layers '0' is not an integer in 1..256"},
      {VALID_CKPT " --format gguf --shards 2 OUT", 2, "--shards has no effect with --format gguf"},
      {VALID_CKPT " --dtype f8 OUT", 2, "--dtype 'f8' is not bf16, f16 or f32"},
      {VALID_CKPT, 2, "missing argument OUT"},
      {"--family llama --layers 1 OUT", 2, "--hidden is required"},
      {VALID_CKPT " --kv-heads 3 OUT", 2, "n_heads 4 is not a multiple of n_kv_heads 3"},
      {VALID_CKPT " /nonexistent/dir/out", 1, "flx-gen-ckpt: cannot create /nonexistent/dir/out"}}},
    {"flx-model-dump", 0, "-m M --tokens /nonexistent/ids.txt -o O",
     {{"-m M --token T -o O", 2, "unknown option --token (names are matched exactly: did you mean --tokens?)"},
      {"-m M --tokens T -o O --full", 2, "--full needs a value"},
      {"-m M --tokens T -o O -n 0", 2, "-n '0' is not an integer in 1..4194304"},
      {"-m M --tokens T -o O -n 4 --full 8", 2, "--full 8 exceeds --positions 4"},
      {"-m M --tokens T", 2, "--out is required"},
      {"-m M --tokens /nonexistent/ids.txt -o O", 1, "--tokens: cannot open /nonexistent/ids.txt"}}},
    {"flx-kv-dump", 0, "-m M --text /nonexistent/t.txt --prompt-len 10 --steps 2 -o O",
     {{"-m M --text T --prompt 10 --steps 2 -o O", 2,
       "unknown option --prompt (names are matched exactly: did you mean --prompt-len?)"},
      {"-m M --text T --prompt-len 10 -o O --steps", 2, "--steps needs a value"},
      {"-m M --text T --prompt-len 0 --steps 2 -o O", 2, "--prompt-len '0' is not an integer in 1..16777216"},
      {"-m M --text T --prompt-len 10 -o O", 2, "--steps is required"},
      {"-m M --text /nonexistent/t.txt --prompt-len 10 --steps 2 -o O", 1, "--text: cannot open /nonexistent/t.txt"}}},
    {"fluxion-attn", 0, "/nonexistent/in.safetensors OUT",
     {{"--mod full IN OUT", 2, "unknown option --mod (names are matched exactly: did you mean --mode?)"},
      {"IN OUT --blk", 2, "--blk needs a value"},
      {"IN OUT --budget 2", 2, "--budget '2' is not a number in [0, 1]"},
      {"IN OUT --ref --threads 2", 2, "--threads has no effect with --ref"},
      {"IN OUT --mode full --blk 32", 2, "--blk has no effect with --mode full"},
      {"IN OUT --isa sse", 2, "--isa 'sse' is not scalar, avx2, avx512, avx512bf16 or amx"},
      {"IN", 2, "missing argument OUT"},
      {"IN OUT more", 2, "unexpected argument 'more' after OUT"},
      {"/nonexistent/in.safetensors OUT", 1, "fluxion-attn: cannot read /nonexistent/in.safetensors"}}},
    {"fluxion-demo", 0, NULL,
     {{"--token 2000", 2, "unknown option --token (names are matched exactly: did you mean --tokens?)"},
      {"--tokens", 2, "--tokens needs a value"},
      {"--tokens 10", 2, "--tokens '10' is not an integer in 1024..1048576"},
      {"--seed x", 2, "--seed 'x' is not an integer >= 0"},
      {"stray", 2, "unexpected argument 'stray' (this tool takes options only)"}}},
    {"fluxion-label", 0, "--source dump:/nonexistent/d.safetensors -o O",
     {{"--sourc synth:1,4,2,64,1024,8 -o O", 2,
       "unknown option --sourc (names are matched exactly: did you mean --source?)"},
      {"--source S -o", 2, "-o needs a value"},
      {"--source synth:1,4,2,64,1024,8 -o O --tau 1", 2, "--tau '1' is not a number in (0, 1)"},
      {"--source synth:1,4,2,64,1024,8 -o O --crit best", 2, "--crit 'best' is not fluxion, output or score"},
      {"--source file:x -o O", 2, "--source 'file:x' is not dump:FILE or synth:..."},
      {"--source synth:1,4,2,64,1024,8 -o O --layers 1,x", 2, "--layers '1,x': item 'x' is not an integer"},
      {"--source synth:1,4,3,64,1024,8 -o O", 2, "--source: synth knob n_q_heads"},
      {"--source dump:/nonexistent/d.safetensors -o O", 1, "fluxion-label: /nonexistent/d.safetensors"}}},
    {"fluxion-train", 0, "--data /nonexistent/d.safetensors -o W",
     {{"--dat D -o W", 2, "unknown option --dat (names are matched exactly: did you mean --data?)"},
      {"--data D -o", 2, "-o needs a value"},
      {"--data D -o W --epochs 0", 2, "--epochs '0' is not an integer in 1..100000"},
      {"--data D -o W --loss mse --quantile 0.5", 2, "--quantile has no effect with --loss mse"},
      {"--data D -o W --loss l2", 2, "--loss 'l2' is not log-budget or mse"},
      {"-o W", 2, "--data is required"},
      {"--data /nonexistent/d.safetensors -o W", 1, "fluxion-train: --data: /nonexistent/d.safetensors"}}},
    {"fluxion-predict", 0, "--weights W --data /nonexistent/d.safetensors",
     {{"--weight W --data D", 2, "unknown option --weight (names are matched exactly: did you mean --weights?)"},
      {"--weights W --data", 2, "--data needs a value"},
      {"--weights W", 2, "--data is required"},
      {"--weights W --data D --epochs 3", 2, "unknown option --epochs"},
      {"--weights W --data /nonexistent/d.safetensors", 1, "fluxion-predict: --data: /nonexistent/d.safetensors"}}},
    {"flx-synth-calibrate", 0, "--dump /nonexistent/d.safetensors",
     {{"--synt 1,4,2,64,1024,4", 2, "unknown option --synt (names are matched exactly: did you mean --synth?)"},
      {"--dump D --synth 1,4,2,64,1024,4", 2, "--dump and --synth exclude each other"},
      {"--dump D --theta 5", 2, "--theta has no effect with --dump"},
      {"--synth 1,4,2,64,1024,4 --theta 0", 2, "--theta '0' is not a number in (1, 1e+12]"},
      {"--synth 1,4,2,64,1024,4 --csv", 2, "--csv needs a value"},
      {"--synth 1,4,2,64,1024", 2, "--synth '1,4,2,64,1024' needs L,HQ,HKV,D,LEN,STEPS"},
      {"", 2, "one of --dump and --synth is required"},
      {"--dump /nonexistent/d.safetensors", 1, "flx-synth-calibrate: /nonexistent/d.safetensors"}}},
    {"flx-prefill", 0, "-m /nonexistent/m.gguf -f F --node 127.0.0.1:1 --session 1 --token " TOKEN,
     {{"--contro 127.0.0.1:1 --synthetic --prompt-len 16", 2,
       "unknown option --contro (names are matched exactly: did you mean --control?)"},
      {"--control 127.0.0.1:1 --node 127.0.0.1:2 --synthetic --prompt-len 16", 2,
       "--control and --node exclude each other"},
      {"--synthetic --prompt-len 16", 2, "one of --control and --node is required"},
      {"--node 127.0.0.1:1 --synthetic --prompt-len 16", 2, "--node needs --session and --token"},
      {"--control 127.0.0.1:1 --session 1 --synthetic --prompt-len 16", 2,
       "--session has no effect with --control (OpenSession gives them)"},
      {"--node 127.0.0.1:1 --session 1 --token " TOKEN " --synthetic --prompt-len 16 --mode fluxion", 2,
       "--mode has no effect without --control"},
      {"--control 127.0.0.1:1 --synthetic --prompt-len 16 --blk 32", 2, "--blk has no effect unless --mode fixed"},
      {"--control 127.0.0.1:1 --synthetic --prompt-len 16 --mode sparse", 2,
       "--mode 'sparse' is not full, fixed or fluxion"},
      {"--control 127.0.0.1 --synthetic --prompt-len 16", 2, "--control '127.0.0.1' is not HOST:PORT"},
      {"--node 127.0.0.1:1 --session 1 --token abc --synthetic --prompt-len 16", 2, "--token 'abc': item 'abc' is not 32 hex digits"},
      {"--control 127.0.0.1:1 -m M --synthetic", 2, "--model and --synthetic exclude each other"},
      {"--control 127.0.0.1:1 --synthetic --prompt-len 0", 2, "--prompt-len '0' is not an integer"},
      {"--control 127.0.0.1:1 --synthetic --prompt-len 16 -f F", 2, "--prompt-file has no effect with --synthetic"},
      {"--control 127.0.0.1:1 -m M", 2, "--model needs --prompt-file"},
      {"-m /nonexistent/m.gguf -f F --control 127.0.0.1:1", 1, "flx-prefill: loading /nonexistent/m.gguf"}}},
    {"fluxion-decoded", 0, "--model /nonexistent/m.gguf --grpc-listen 127.0.0.1:0 --metrics-listen off",
     {{"--mod M", 2, "unknown option --mod (names are matched exactly: did you mean --model, --model-id?)"},
      {"--model M --max-batch 0", 2, "--max-batch: max-batch '0' is not an integer in 1..256"},
      {"--model M --prefill gpu", 2, "--prefill: prefill 'gpu' is not ucx or local"},
      {"--model M --ucx-err-mode both", 2, "--ucx-err-mode: ucx-err-mode 'both' is not peer or none"},
      {"--model M --ucx-listen 0.0.0.0:0", 2, "ucx-listen 0.0.0.0:0 listens on every address"},
      {"--model M --config /nonexistent/node.conf", 2, "--config: "},
      {"--model M --grpc-listen", 2, "--grpc-listen needs a value"},
      {"", 2, "model is required"},
      {"--model M stray", 2, "unexpected argument 'stray'"},
      {"--model /nonexistent/m.gguf --grpc-listen 127.0.0.1:0 --metrics-listen off", 1, ""}}},
    {"attn_bench", 1, NULL,
     {{"--len 1024", 2, "unknown option --len (names are matched exactly: did you mean --lens?)"},
      {"--lens 100", 2, "--lens '100': item '100' is not an integer in 1024..2097152"},
      {"--batches 1,,2", 2, "--batches '1,,2': item 2 is empty"},
      {"--reps", 2, "--reps needs a value"},
      {"--reps 0", 2, "--reps '0' is not an integer in 1..1000"}}},
    {"kv_bench", 1, "/nonexistent/dir/kv.csv",
     {{"--csv x", 2, "unknown option --csv"},
      {"a b", 2, "unexpected argument 'b' after CSV_PATH"},
      {"/nonexistent/dir/kv.csv", 1, "kv_bench: cannot create /nonexistent/dir/kv.csv"}}},
    {"model_bench", 1, "-m M --tokens /nonexistent/ids.txt",
     {{"-m M --token T", 2, "unknown option --token (names are matched exactly: did you mean --tokens?)"},
      {"-m M --tokens T --steps 2", 2, "--steps '2' is not an integer in 3..100000"},
      {"-m M --tokens T --lens 0", 2, "--lens '0': item '0' is not an integer"},
      {"-m M", 2, "--tokens is required"},
      {"-m M --tokens /nonexistent/ids.txt", 1, "model_bench: --tokens: cannot open /nonexistent/ids.txt"}}},
    {"quality_bench", 1, "--source dump:/nonexistent/d.safetensors --weights W",
     {{"--source S --weights W --n-layer 2", 2,
       "unknown option --n-layer (names are matched exactly: did you mean --n-layers?)"},
      {"--source S --weights W --layers 1 --n-layers 2", 2, "--layers and --n-layers exclude each other"},
      {"--source S --weights W --time-batch 65", 2, "--time-batch '65' is not an integer in 0..64"},
      {"--source S", 2, "--weights is required"}}},
    {"node_bench", 1, "--daemon /nonexistent/fluxion-decoded -m /nonexistent/m.gguf --text T --predictor W",
     {{"--daemon D -m M --text T --predictor W --step 8", 2,
       "unknown option --step (names are matched exactly: did you mean --steps?)"},
      {"--daemon D -m M --text T", 2, "--predictor is required"},
      {"--daemon D -m M --text T --predictor W --batches 0", 2, "--batches '0': item '0' is not an integer in 1..64"},
      {"--daemon D -m M --text T --predictor W --steps 2", 2, "--steps '2' is not an integer in 4..4096"},
      {"--daemon D -m M --text T --predictor W --steps 4 --warm 2", 2,
       "--steps 4 leaves fewer than 2 steps after --warm 2"},
      {"--daemon D -m /nonexistent/m.gguf --text T --predictor W", 1, "node_bench: loading the tokenizer: /nonexistent/m.gguf"}}},
    {"compare_logits", 1, "/nonexistent/a.flxl /nonexistent/b.flxl",
     {{"A B --max-dif 1", 2, "unknown option --max-dif (names are matched exactly: did you mean --max-diff?)"},
      {"A B -q --all", 2, "--all has no effect with --quiet"},
      {"A B --min-agree 2", 2, "--min-agree '2' is not a number in [0, 1]"},
      {"A B -n", 2, "-n needs a value"},
      {"A", 2, "missing argument TEST.flxl"},
      {"/nonexistent/a.flxl /nonexistent/b.flxl", 1, "compare_logits: cannot open /nonexistent/a.flxl"}}},
    {"transfer_bench", 1, "--prefill /nonexistent/flx-prefill",
     {{"--prefill P --token 512", 2, "unknown option --token (names are matched exactly: did you mean --tokens?)"},
      {"--prefill P --tls shm,udp", 2, "--tls 'shm,udp': item 'udp' is not shm or tcp"},
      {"--prefill P --tls tcp,tcp", 2, "--tls 'tcp,tcp': item 'tcp' is listed twice"},
      {"--prefill P --tls shm,", 2, "--tls 'shm,': item 2 is empty"},
      {"--prefill P --layers 33", 2, "--layers '33' is not an integer in 1..32"},
      {"--prefill P --reps", 2, "--reps needs a value"},
      {"--prefill P --long-layers 0 --long-tokens 1024", 2, "--long-tokens has no effect with --long-layers 0"},
      {"--tls shm", 2, "--prefill is required"},
      {"--prefill /nonexistent/flx-prefill", 1, "transfer_bench: --prefill: /nonexistent/flx-prefill:"},
      {"--prefill /bin/true --dir /nonexistent/dir", 1, "transfer_bench: --dir: /nonexistent/dir is not a writable"}}},
    {"sched_bench", 1, "--weights /nonexistent/w.safetensors",
     {{"--weight W", 2, "unknown option --weight (names are matched exactly: did you mean --weights?)"},
      {"--weights W --lens 512", 2, "--lens '512': item '512' is not an integer in 1024..1048576"},
      {"--weights W --layers 1,32", 2, "--layers '1,32': item '32' is not an integer in 0..31"},
      {"--weights W --batches 1,2,3,4,5,6,7,8,9", 2, "--batches '1,2,3,4,5,6,7,8,9' has more than 8 items"},
      {"--weights W --mixed 4096-2048", 2, "--mixed '4096-2048': item '4096-2048' is not LO-HI with 1024 <= LO <= HI"},
      {"--weights W --mixed 2048", 2, "--mixed '2048': item '2048' is not LO-HI"},
      {"--weights W --distinct 17", 2, "--distinct '17' is not an integer in 1..16"},
      {"--lens 16384", 2, "--weights is required"},
      {"--weights W --gpu-streams 9", 2, "--gpu-streams '9' is not an integer in 1..8"},
      {"--weights W --csv /nonexistent/dir/s.csv", 1, "sched_bench: --csv: cannot create /nonexistent/dir/s.csv"},
      {"--weights W --trace /nonexistent/dir/t.csv", 1, "sched_bench: --trace: cannot create /nonexistent/dir/t.csv"},
      {"--weights /nonexistent/w.safetensors", 1, "sched_bench: --weights: "}}},
    {"tpot_bench", 1, "-m M --text /nonexistent/t.txt --predictor W",
     {{"-m M --tex T --predictor W", 2, "unknown option --tex (names are matched exactly: did you mean --text?)"},
      {"-m M --text T --predictor W --steps 3", 2, "--steps '3' is not an integer in 4..10000"},
      {"-m M --text T --predictor W --batch 17", 2, "--batch '17' is not an integer in 1..16"},
      {"-m M --text T --predictor W --instances 0", 2, "--instances '0' is not an integer in 1..8"},
      {"-m M --text T --predictor W --same=1", 2, "--same"},
      {"-m M --text T --predictor W -t 0", 2, "-t '0' is not an integer in 1.."},
      {"-m M --text T --predictor W --gpu 1024", 2, "--gpu '1024' is not an integer in 0..1023"},
      {"-m M --text T", 2, "--predictor is required"},
      {"-m M --text /nonexistent/t.txt --predictor W", 1, "tpot_bench: --text: cannot open /nonexistent/t.txt"},
      {"-m M --text /dev/null --predictor /nonexistent/w.safetensors", 1, "tpot_bench: --predictor: "}}},
    {"step_bench", 1, "-m M --text /nonexistent/t.txt",
     {{"-m M --text T --round 3", 2, "unknown option --round (names are matched exactly: did you mean --rounds?)"},
      {"-m M --text T --rounds 65", 2, "--rounds '65' is not an integer in 1..64"},
      {"-m M --text T --lens 2048,x", 2, "--lens '2048,x': item 'x' is not an integer"},
      {"-m M --text T --mode sparse", 2, "--mode 'sparse' is not full, fixed or fluxion"},
      {"-m M --text T --mode fluxion", 2, "--mode fluxion needs --predictor"},
      {"-m M --text T --predictor W", 2, "--predictor has no effect without --mode fluxion"},
      {"--text T", 2, "--model is required"},
      {"-m M --text /nonexistent/t.txt", 1, "step_bench: --text: cannot open /nonexistent/t.txt"},
      {"-m M --text /dev/null --csv /nonexistent/dir/s.csv", 1, "step_bench: --csv: cannot create"}}},
    {"flx-fuzz-seeds", 0, "/nonexistent/dir/out",
     {{"", 2, "missing argument OUT_DIR"},
      {"a b", 2, "unexpected argument 'b' after OUT_DIR"},
      {"--out a", 2, "unknown option --out"},
      {"/nonexistent/dir/out", 1, "flx-fuzz-seeds: cannot create /nonexistent/dir/out"}}},
    {"gen_node_corpus", 0, "/nonexistent/dir",
     {{"", 2, "missing argument CORPUS_DIR"},
      {"a b", 2, "unexpected argument 'b' after CORPUS_DIR"},
      {"/nonexistent/dir", 1, "gen_node_corpus: cannot create /nonexistent/dir/grpc_requests"}}},
};

static const char *g_dir;

/* Runs `env path args`; returns the exit status; *out_p and *err_p: the two streams (flx_test_slurp's
 * buffers, valid until the next run). */
static int run(const char *env, const char *path, const char *args, const char **out_p, const char **err_p)
{
    char cmd[4096], fo[1024], fe[1024];
    snprintf(fo, sizeof fo, "%s/cli.out", g_dir);
    snprintf(fe, sizeof fe, "%s/cli.err", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s %s </dev/null >%s 2>%s", env, path, args, fo, fe);
    const int rc = flx_test_sh(cmd);
    *out_p = flx_test_slurp(fo);
    *err_p = flx_test_slurp(fe);
    return rc;
}

static int failures;

/* One expectation; reports every mismatch (the test fails at the end, after all tools ran). */
static void expect(const char *name, const char *env, const char *path, const char *args, int rc, const char *first)
{
    const char *out, *err;
    int got = run(env, path, args, &out, &err);
    const char *text = rc == 0 ? out : err;
    size_t l1 = strcspn(text, "\n");
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)FLX_MIN(l1, sizeof line - 1), text);
    int ok = got == rc && strstr(line, first) != NULL;
    if (ok && rc == 2) {   /* exactly "TOOL: ...\ntry 'TOOL --help'\n", nothing on stdout */
        char want[256], prefix[128];
        snprintf(prefix, sizeof prefix, "%s: ", name);
        snprintf(want, sizeof want, "try '%s --help'\n", name);
        ok = !strncmp(line, prefix, strlen(prefix)) && !strcmp(err + l1 + 1, want) && out[0] == 0;
    }
    if (ok && rc == 0) ok = err[0] == 0;
    fprintf(stderr, "%-5s %s%s %s -> %d: %s\n", ok ? "ok" : "FAIL", env[0] ? env : "", name, args, got, line);
    if (!ok) {
        fprintf(stderr, "      want exit %d and a first line containing \"%s\"\n      stdout: %.300s\n      stderr: "
                "%.300s\n", rc, first, out, err);
        failures++;
    }
}

int main(int argc, char **argv)
{
    CHECK(argc >= 2);
    g_dir = argv[1];
    char version[128];
    snprintf(version, sizeof version, " %s", flx_version());
    int n_run = 0;
    for (size_t t = 0; t < FLX_ARRAY_SIZE(tools); t++) {
        const tool_t *tl = &tools[t];
        const char *path = NULL;
        size_t nl = strlen(tl->name);
        for (int i = 2; i < argc; i++)
            if (!strncmp(argv[i], tl->name, nl) && argv[i][nl] == '=') path = argv[i] + nl + 1;
        if (!path) {
            fprintf(stderr, "%s %s: not given%s\n", tl->bench ? "skip" : "FAIL", tl->name,
                    tl->bench ? " (benchmarks not built)" : ": every tool must be in this test");
            failures += !tl->bench;
            continue;
        }
        n_run++;
        char usage[128], ver[160];
        snprintf(usage, sizeof usage, "usage: %s ", tl->name);
        snprintf(ver, sizeof ver, "%s%s", tl->name, version);
        expect(tl->name, "", path, "-h", 0, usage);
        expect(tl->name, "", path, "--help", 0, usage);
        expect(tl->name, "", path, "--version", 0, ver);
        expect(tl->name, "", path, "--help=1", 2, "--help takes no value");
        expect(tl->name, "", path, "--no-such-option", 2, "unknown option --no-such-option");
        if (tl->valid) {
            expect(tl->name, "FLX_ISA=bogus", path, tl->valid, 2,
                   "environment FLX_ISA='bogus' is not scalar, avx2, avx512, avx512bf16 or amx");
            expect(tl->name, "FLX_LOG=loud", path, tl->valid, 2, "environment FLX_LOG='loud' is not error, warn");
        }
        for (int c = 0; c < 16 && tl->cases[c].args; c++)
            expect(tl->name, "", path, tl->cases[c].args, tl->cases[c].rc, tl->cases[c].first);
    }
    fprintf(stderr, "test_tools_cli: %d tools, %d failure(s)\n", n_run, failures);
    return failures ? 1 : 0;
}
