#!/usr/bin/env bash
# Packs the tests and the GPU benchmarks for a GPU host that has CUDA but none of this project's
# packages (no libnuma, UCX, gRPC, ...): scripts/gpu_bundle.sh OUTDIR
#
# Here: builds build-gpu (Release, CUDA for FLX_CUDA_ARCHS, default 90: H100 and H200), then writes
#   OUTDIR/bundle.tar.xz  the build tree's CTest files and executables, and the shared libraries they
#                         load that a CUDA machine may lack (all but glibc's, libgcc's and
#                         libstdc++; cuBLAS is the GPU host's own), UCX's transport modules with them
#   OUTDIR/run.sh         what the GPU host runs, from the root of a checkout of the same commit:
#     bash OUTDIR/run.sh gpu            ctest -L gpu, then compute-sanitizer (memcheck, racecheck)
#     bash OUTDIR/run.sh all            every test but test_install (it builds) and
#                                       test_tokenizer_model (its reference needs the Python venv)
#     bash OUTDIR/run.sh sched ARGS..   sched_bench with the synthetic predictor and ARGS
#     bash OUTDIR/run.sh tpot ARGS..    tpot_bench with the real model's predictor and ARGS
#   Logs and CSV go to $OUT when it is set, else OUTDIR/out. The real-model tests need the GGUF
#   in $FLX_CACHE (default ~/.cache/fluxion), as here; without it they skip (77).
# The executables are built against Debian 12's glibc 2.36 and run on any x86-64 Linux with a newer
# one. CTest files name this checkout's absolute paths: run.sh links that path to the checkout it
# runs in when the path is free there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: scripts/gpu_bundle.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build="$here/build-gpu"
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "gpu_bundle: no CUDA compiler (nvcc): nothing to bundle" >&2; exit 1; }
"$here/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=Release -DFLX_CUDA_ARCHS="${FLX_CUDA_ARCHS:-90}" \
  > "$build.build.log" 2>&1 || { tail -30 "$build.build.log"; exit 1; }
grep -q 'fluxion: CUDA ON' "$build.configure.log" || {
  echo "gpu_bundle: $build was configured without CUDA (see $build.configure.log)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu" "$stage/lib"
(cd "$build" && find . -name CTestTestfile.cmake -not -path '*/CMakeFiles/*' -exec cp --parents {} "$stage/build-gpu/" \;)
mapfile -t elfs < <(cd "$build" && find . -path '*/CMakeFiles' -prune -o -type f -perm -u+x -print |
                    while read -r f; do IFS= read -r -n4 m < "$f" || true; [ "$m" = $'\x7fELF' ] && echo "$f"; done)
(cd "$build" && cp --parents "${elfs[@]}" "$stage/build-gpu/")
# the libraries they load, less the C and C++ runtimes every Linux has (and the CUDA driver's)
(cd "$build" && ldd "${elfs[@]}" 2>/dev/null) | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
ucs=$(ldconfig -p | awk '/libucs\.so\.0 / && !found {print $NF; found = 1}')
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
  mkdir -p "$stage/lib/ucx"
  cp -L "$(dirname "$ucs")"/ucx/*.so.0 "$stage/lib/ucx/"
fi
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
echo "$src" > "$stage/build-gpu/.source-dir"
tar -C "$stage" -cf - build-gpu lib | xz -T0 -6 > "$out/bundle.tar.xz"

cat > "$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Written by scripts/gpu_bundle.sh: runs its bundle on the GPU host (see that script's header).
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
root=$PWD
[ -f "$root/CMakeLists.txt" ] && [ -d "$root/fluxion" ] || { echo "run.sh: run it from the root of a checkout" >&2; exit 2; }
mode=${1:-gpu}; [ $# -gt 0 ] && shift
case $mode in gpu|all|sched|tpot) ;; *) echo "run.sh: mode '$mode' is not gpu, all, sched or tpot" >&2; exit 2 ;; esac
out=${OUT:-$bundle/out}; mkdir -p "$out"
unpacked=$(mktemp -d /tmp/flx-gpu.XXXXXX)
tar -xJf "$bundle/bundle.tar.xz" -C "$unpacked" || exit 1
rm -rf "$root/build-gpu"; mv "$unpacked/build-gpu" "$root/build-gpu"
src=$(cat "$root/build-gpu/.source-dir")
if [ "$src" != "$root" ]; then
  if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
  elif [ "$(cd "$src" && pwd -P)" != "$(pwd -P)" ]; then
    echo "run.sh: the build's source path $src exists and is not this checkout: CTest cannot run" >&2; exit 1
  fi
fi
cublas=$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$unpacked/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/cuda/bin"
cd "$root/build-gpu" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null || echo "run.sh: no nvidia-smi"
case $mode in
  gpu)
    ctest -L gpu --output-on-failure 2>&1 | tee "$out/ctest_gpu.log"; rc=${PIPESTATUS[0]}
    w="$root/fluxion/weights/predictor-synthetic-llama8b.safetensors"
    for c in "memcheck tests/fluxion/test_attn_gpu_host" "memcheck tests/fluxion/test_sched_gpu" \
             "memcheck tests/fluxion/test_attn_gpu" "memcheck tests/kvstore/test_kvstore_gpu" \
             "memcheck tests/decode/test_engine_gpu" "memcheck tests/fluxion/test_attn_layer $w" \
             "racecheck tests/fluxion/test_attn_gpu_host" "racecheck tests/fluxion/test_attn_gpu" \
             "racecheck tests/fluxion/test_sched_gpu"; do
      set -- $c; tool=$1; shift
      log="$out/$(basename "$1")_$tool.log"
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" > "$log" 2>&1
      r=$?; echo "compute-sanitizer $tool $(basename "$1"): exit $r, $(tail -1 "$log")"
      [ $r = 0 ] || rc=1
    done
    exit $rc ;;
  all)
    ctest -j"$(nproc)" -E 'test_install|test_tokenizer_model' --output-on-failure > "$out/ctest_all.log" 2>&1
    rc=$?; grep -E 'tests passed|\*\*\*' "$out/ctest_all.log"; exit $rc ;;
  sched)
    ./bench/sched/sched_bench --weights "$root/fluxion/weights/predictor-synthetic-llama8b.safetensors" \
      --csv "$out/sched.csv" --trace "$out/sched_trace.csv" "$@" 2>&1 | tee "$out/sched.txt"; exit "${PIPESTATUS[0]}" ;;
  tpot)
    ./bench/sched/tpot_bench --predictor "$root/fluxion/weights/predictor-smollm2-135m-instruct.safetensors" \
      --csv "$out/tpot.csv" "$@" 2>&1 | tee "$out/tpot.txt"; exit "${PIPESTATUS[0]}" ;;
esac
EOF
chmod +x "$out/run.sh"
echo "gpu_bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)) and $out/run.sh"
