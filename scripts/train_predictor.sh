#!/usr/bin/env bash
# Reproduces the predictor weights shipped in fluxion/weights/ (paper §6.2):
#   scripts/train_predictor.sh real        SmolLM2-135M-Instruct, from KV dumps of documentation, code and prose
#   scripts/train_predictor.sh synthetic   the default synthetic profile, Llama-3.1-8B-like shape
#   scripts/train_predictor.sh all
# Steps: KV dumps (real) or synthetic sources -> fluxion-label (features + labels, dataset files) ->
# fluxion-train (OpenBLAS, single-threaded so the weights are bit-reproducible for the seed), which
# also calibrates the selector's operating point on label files it never trained on (--calib).
# Training texts never overlap the quality benchmark's held-out texts (Debian Reference chapters).
# Env: FLX_CACHE (model, texts, dumps, datasets), FLX_BUILD (build tree, default build-bench).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
what=${1:-all}
case "$what" in real|synthetic|all) ;; *) echo "usage: $0 real|synthetic|all" >&2; exit 2 ;; esac
./scripts/setup.sh >/dev/null
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
build="${FLX_BUILD:-$here/build-bench}"
./scripts/build.sh "$build" -DFLX_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > "$build.build.log" 2>&1 || {
  tail -30 "$build.build.log"; exit 1; }
export OPENBLAS_NUM_THREADS=1
work="$cache/train"
mkdir -p "$work" fluxion/weights
label="$build/fluxion/tools/fluxion-label"
train="$build/fluxion/tools/fluxion-train"

if [ "$what" = real ] || [ "$what" = all ]; then
  model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
  texts="$cache/texts"
  [ -s "$texts/train/manual-vim.txt" ] && [ -s "$texts/train/code-ucx.txt" ] || ./scripts/fetch_texts.sh >/dev/null
  cat "$texts"/docs/policy-*.txt > "$work/policy.txt"
  # dump_label KIND SPEC...: for each name:file:prompt_len:offset (offsets in tokens), a KV dump of 64
  # teacher-forced steps (kept in the cache) and its labels of every 2nd step, KIND-name-L-off;
  # appends the dataset paths to the array `out`.
  dump_label() {
    local kind=$1 spec name file L off dump ds; shift
    for spec in "$@"; do
      IFS=: read -r name file L off <<< "$spec"
      dump="$work/dump-$name-$L-$off.safetensors"
      [ -s "$dump" ] || "$build/decode/tools/flx-kv-dump" --model "$model" --text "$file" --prompt-len "$L" \
          --steps 64 --offset "$off" --out "$dump"
      ds="$work/$kind-$name-$L-$off.safetensors"
      [ -s "$ds" ] || "$label" --source "dump:$dump" --step-every 2 --out "$ds"
      out+=("$ds")
    done
  }
  # Three kinds of text (documentation, C code, a prose manual), prompts of 2K-8K tokens from
  # different places of each (33 windows). A window reads L + 64 tokens from its offset; none reads
  # a token of the calibration windows below.
  out=()
  dump_label ds policy:$work/policy.txt:8000:0 policy:$work/policy.txt:8000:16000 \
                policy:$work/policy.txt:8000:32000 policy:$work/policy.txt:6000:50100 \
                policy:$work/policy.txt:4000:56000 policy:$work/policy.txt:2000:62000 \
                policy:$work/policy.txt:2000:66000 \
                code:$texts/train/code-ucx.txt:8000:0 code:$texts/train/code-ucx.txt:8000:16000 \
                code:$texts/train/code-ucx.txt:4000:32000 code:$texts/train/code-ucx.txt:2000:40000 \
                vim:$texts/train/manual-vim.txt:8000:0 vim:$texts/train/manual-vim.txt:8000:30000 \
                vim:$texts/train/manual-vim.txt:8000:60000 vim:$texts/train/manual-vim.txt:6000:90000 \
                vim:$texts/train/manual-vim.txt:4000:100000 vim:$texts/train/manual-vim.txt:2000:110000 \
                policy:$work/policy.txt:8000:8000 policy:$work/policy.txt:8000:24000 \
                policy:$work/policy.txt:8000:70000 policy:$work/policy.txt:4000:80000 \
                code:$texts/train/code-ucx.txt:8000:8000 code:$texts/train/code-ucx.txt:8000:24000 \
                code:$texts/train/code-ucx.txt:4000:52000 \
                vim:$texts/train/manual-vim.txt:8000:10000 vim:$texts/train/manual-vim.txt:8000:20000 \
                vim:$texts/train/manual-vim.txt:8000:40000 vim:$texts/train/manual-vim.txt:8000:50000 \
                vim:$texts/train/manual-vim.txt:8000:70000 vim:$texts/train/manual-vim.txt:6000:80000 \
                vim:$texts/train/manual-vim.txt:4000:130000 vim:$texts/train/manual-vim.txt:2000:140000 \
                vim:$texts/train/manual-vim.txt:2000:145000
  data=(); for ds in "${out[@]}"; do data+=(--data "$ds"); done
  # Calibration of the selector's operating point (fluxion-train --calib): other windows of the same
  # training texts, never trained on.
  out=()
  dump_label calib policy:$work/policy.txt:8000:42000 code:$texts/train/code-ucx.txt:6000:44000 \
                   vim:$texts/train/manual-vim.txt:8000:118000
  calib=(); for ds in "${out[@]}"; do calib+=(--calib "$ds"); done
  # The plain regression of the labels (--loss mse, the line outputs), 20 epochs: on these calibration
  # rows it reaches the fixed (16, 0.05) within share at 0.65 of its Eq. 3 volume (0.66-0.68 in
  # trial runs with other seeds or row orders); the log-budget loss at quantile 0.5 gave 0.67-0.69,
  # at 0.7-0.95 0.70-0.78.
  "$train" "${data[@]}" "${calib[@]}" --seed 1 --loss mse --epochs 20 \
      --out fluxion/weights/predictor-smollm2-135m-instruct.safetensors \
      --source "SmolLM2-135M-Instruct Q4_1; Debian Policy, UCX headers, Vim user manual; prompts 2K-8K, 64 teacher-forced steps"
fi

if [ "$what" = synthetic ] || [ "$what" = all ]; then
  data=()
  # Llama-3.1-8B-like shape (32 layers, 32 q heads, 8 kv heads, D 128), every layer, prompts 8K-64K;
  # retrieval shares 25/50/75 % so the predictor does not learn one share; four sequences (seeds) of
  # each, seeds 1..48 (the benchmark uses seeds >= 1000).
  seed=1
  for rep in 1 2 3 4; do
    for L in 8192 16384 32768 65536; do
      for share in 0.25 0.5 0.75; do
        ds="$work/ds-synth32-$L-$share-$seed.safetensors"
        [ -s "$ds" ] || "$label" --source "synth:32,32,8,128,$L,32,$seed,$share" --step-every 2 --out "$ds"
        data+=(--data "$ds")
        seed=$((seed + 1))
      done
    done
  done
  # calibration: seeds 101..110, never trained on, 8K-128K (the operating point is chosen over the
  # lengths the node serves, 128K included, though training stops at 64K)
  calib=()
  for spec in 8192:0.5:101 16384:0.25:102 32768:0.75:103 65536:0.5:104 \
              8192:0.75:105 16384:0.5:106 32768:0.25:107 65536:0.75:108 131072:0.5:109 131072:0.25:110; do
    IFS=: read -r L share seed <<< "$spec"
    ds="$work/calib-synth-$L-$share-$seed.safetensors"
    [ -s "$ds" ] || "$label" --source "synth:32,32,8,128,$L,32,$seed,$share" \
        --layers 1,7,13,19,25,29 --step-every 2 --out "$ds"
    calib+=(--calib "$ds")
  done
  # The log-budget pinball loss (log-ends outputs) at quantile 0.98, 10 epochs, the streaming BCE at
  # half weight: on the calibration rows it reaches the fixed (16, 0.05) within share at 0.41 of its
  # Eq. 3 volume (0.42 with the grid's old α steps of 0.25). Chosen with that old grid on the
  # calibration seeds 101-108 (8K-64K), where it read 0.45, against BCE weight 1: 0.48, 2: 0.48;
  # quantile 0.95: 0.50, 0.99: 0.49; 20 epochs: 0.49; seed 2: 0.48 (with 24 sequences and seeds
  # 101-104, quantile 0.95: 0.50-0.57 over three seeds).
  "$train" "${data[@]}" "${calib[@]}" --seed 1 --epochs 10 --quantile 0.98 --bce-weight 0.5 \
      --out fluxion/weights/predictor-synthetic-llama8b.safetensors \
      --source "synthetic default profile, 32x32x8x128, prompts 8K-64K, retrieval share 0.25/0.5/0.75, seeds 1-48"
fi
