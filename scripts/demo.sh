#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job.
#   1. the decode node's model runtime on the real model (SmolLM2-135M-Instruct): a long real
#      prompt (the GPL-3 text every Debian machine has, ~2K tokens, plus a question) is prefilled
#      into the NUMA-aware host KV store and decoded by the engine with full attention, the
#      paper's fixed (16, 0.05) sparse baseline and Fluxion (shipped predictor, calibrated
#      selector): text, TPOT, attention share, host bytes read per step, predictor time; each run
#      first says how many workers run the step and why ("workers 2: affinity 2 CPUs, ...");
#   2. the attention core at Llama-3.1-8B layer shapes over a 32K-token prompt (fluxion-demo).
# The loopback cluster (prefill stub -> decode node over UCX + gRPC) replaces this as it lands.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
./scripts/setup.sh
./scripts/build.sh build
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
head -c 9000 /usr/share/common-licenses/GPL-3 > "$prompt"
printf '\n\nQuestion: according to this license, may I sell copies of a GPL program? Answer briefly.' >> "$prompt"
for mode in "--mode full" "--mode fixed --blk 16 --bgt 0.05" "--mode fluxion"; do
  echo
  echo "=== flx-generate $mode (real model, GPL-3 prompt)"
  ./build/decode/tools/flx-generate --model "$model" --prompt-file "$prompt" --chat --max-new 64 $mode
done
echo
echo "=== fluxion-demo: the attention core at Llama-3.1-8B layer shapes"
exec ./build/fluxion/tools/fluxion-demo "$@"
