#!/usr/bin/env bash
# Regenerates the seed files (seed-*) of every committed fuzz corpus (tests/fuzz/corpus/<target>/)
# with the project's own writers, then adds the hostile files of tests/data/bad-inputs to the targets
# that read them:
#   flx-fuzz-seeds OUT            (gen_corpus.c) the model, tokenizer, predictor, dataset, KV dump,
#                                 token id and command-line targets
#   gen_node_corpus OUT           grpc_requests, prefill_replies, node_config
#   test_transport_fuzz --write   transport_header
#   test_cpus FIXTURES --corpus   cgroup (the fixture trees of tests/common/cgroup)
# A target's seed-* files are replaced as a whole; crash inputs found by fuzzing (crash-*, timeout-*,
# oom-* and the like) stay: they are regression inputs. Fails when a writer is missing from the
# build or a target of tests/fuzz/CMakeLists.txt gets no seed.
#   tests/fuzz/make_corpus.sh [BUILD_DIR]      (default build; configured and built as needed)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
cd "$here"
[ -f "$build/CMakeCache.txt" ] || ./scripts/build.sh "$build" > /dev/null
cmake --build "$build" --target flx-fuzz-seeds gen_node_corpus test_transport_fuzz test_cpus -j"$(nproc)" > /dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/tests/fuzz/flx-fuzz-seeds" "$out"
rm -rf "$out"/.scratch-*
"$build/tests/fuzz/gen_node_corpus" "$out"
"$build/tests/transport/test_transport_fuzz" --write "$out/transport_header" > /dev/null
"$build/tests/common/test_cpus" tests/common/cgroup --corpus "$out/cgroup" 2> /dev/null
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
missing=0
while read -r t; do
  [ -n "$t" ] || continue
  if ! compgen -G "$corpus/$t/seed-*" > /dev/null; then echo "make_corpus: target $t has no seed" >&2; missing=1; fi
done < <(sed -n 's/^flx_fuzz_target(\([a-z0-9_]*\) .*/\1/p' tests/fuzz/CMakeLists.txt)
du -sh "$corpus"/* | sed 's/^/make_corpus: /'
exit "$missing"
