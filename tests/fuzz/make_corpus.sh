#!/usr/bin/env bash
# Regenerates the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with the
# project's own writers (flx-fuzz-seeds, gen_corpus.c) and adds the hostile files of
# tests/data/bad-inputs to the targets that read them. Crash inputs found by fuzzing (crash-*,
# timeout-*, oom-* and the like) stay: they are regression inputs.
#   tests/fuzz/make_corpus.sh [BUILD_DIR]      (default build; configured and built as needed)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
cd "$here"
[ -f "$build/CMakeCache.txt" ] || ./scripts/build.sh "$build" > /dev/null
cmake --build "$build" --target flx-fuzz-seeds -j"$(nproc)" > /dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/tests/fuzz/flx-fuzz-seeds" "$out"
rm -rf "$out"/.scratch-*
corpus=tests/fuzz/corpus
for dir in "$out"/*/; do
  t=$(basename "$dir")
  mkdir -p "$corpus/$t"
  find "$corpus/$t" -maxdepth 1 -type f -name 'seed-*' -delete
  for f in "$dir"*; do cp "$f" "$corpus/$t/seed-$(basename "$f")"; done
done
bi=tests/data/bad-inputs
cp "$bi/01-gguf-rope-freqs-stack-overflow.gguf" "$corpus/gguf/seed-bad-input-01.gguf"
cp "$bi/02-safetensors-duplicate-metadata.safetensors" "$corpus/safetensors/seed-bad-input-02.safetensors"
cp "$bi/03-fluxion-attn-misaligned-bf16.safetensors" "$corpus/safetensors/seed-bad-input-03.safetensors"
cp "$bi/04-tokenizer-sparse-vocab-1G.json" "$corpus/tokenizer_json/seed-bad-input-04.json"
du -sh "$corpus"/* | sed 's/^/make_corpus: /'
