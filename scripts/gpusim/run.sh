#!/usr/bin/env bash
# gpusim: the `gpu` tests without a GPU. Builds an ASan+UBSan CUDA tree (nvcc must exist: the GPU
# code paths are compiled only with CUDA), then compiles the .cu kernels with the host C++ compiler
# against cuda_runtime.h here and relinks the tests against sim_rt.cpp (a CPU stand-in for the
# CUDA runtime, cuBLAS and kernel launches; its header says what it models and what it does not)
# instead of the real runtime and cuBLAS, and runs them at low priority. Slow: every CUDA thread is
# a host thread and every warp shuffle a barrier (tens of minutes for the whole set).
#
#   scripts/gpusim/run.sh [BUILD_DIR] [TEST...]   default: build-gpusim, every gpu test and
#                                                 test_attn_layer (its case with a GPU worker)
#
# A development aid, not a substitute for a device: it checks indexing, shared-memory bounds, the
# structure of barriers and shuffles, host/device pointer use (device and mapped memory are not
# readable through host addresses), stream and event ordering (streams run asynchronously) and the
# orchestration's logic, not races between thread blocks, a kernel reading host memory through its
# host address, real cuBLAS or tensor-core numerics, timing or device limits.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-build-gpusim}
shift || true
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then tests=(test_kvstore_gpu test_attn_gpu test_attn_gpu_host test_sched_gpu test_attn_layer test_forward_gpu test_engine_gpu); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLX_SANITIZE=address,undefined -DFLX_BENCH=OFF \
  > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -q "fluxion: CUDA ON" "$build.configure.log" || { echo "gpusim: needs a CUDA toolkit (nvcc)"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target "${tests[@]}"
python3 "$here/gpusim.py" "$root" "$build" "${tests[@]}"
