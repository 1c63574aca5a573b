#!/usr/bin/env bash
# about: builds llama.cpp's libllama (CPU only) from PyPI's llama-cpp-python sdist into the cache,
# once, and the reference tools (llama_ref, compare_logits) against it; prints the llama_ref path.
#
# llama.cpp's code stays in the cache; nothing of it enters the repository. Idempotent: a second
# run with the same version and flags only recompiles llama_ref/compare_logits when their sources
# changed. Serialized with flock, so two benchmarks starting at once do not build twice.
#
# Environment:
#   FLX_CACHE                cache root (default ~/.cache/fluxion); everything goes to $FLX_CACHE/llamacpp
#   FLX_LLAMACPP_VERSION     llama-cpp-python version to take from PyPI (default below)
#   FLX_LLAMACPP_NATIVE      1 = -march=native build (GGML_NATIVE=ON); default 0: a portable x86-64
#                            build with AVX/AVX2/FMA/F16C/BMI2 switched on explicitly by ggml's
#                            defaults, which runs on any x86-64-v3 machine the cache is carried to
#   FLX_LLAMACPP_JOBS        parallel compile jobs (default 2: the dev VM has 2 shared cores)
#   FLX_PYTHON               python with pip used for "pip download" (default: .venv/bin/python of
#                            the repository if present, else python3)
#
# Logs: $FLX_CACHE/llamacpp/logs/{download,cmake,build,llama_ref,compare_logits}.log. stdout: only the llama_ref path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ver=${FLX_LLAMACPP_VERSION:-0.3.36}
native=${FLX_LLAMACPP_NATIVE:-0}
jobs=${FLX_LLAMACPP_JOBS:-2}
cache="${FLX_CACHE:-$HOME/.cache/fluxion}/llamacpp"
top="$cache/llama_cpp_python-$ver"
src="$top/vendor/llama.cpp"
bld="$cache/build-$ver-native$native"
logs="$cache/logs"

say() { echo "build_llamacpp: $*" >&2; }
die() { echo "build_llamacpp: ERROR: $*" >&2; exit 1; }
fail_log() { # $1 = log file, $2 = what failed
  echo "build_llamacpp: ERROR: $2 failed; last lines of $1:" >&2
  tail -n 25 "$1" | sed 's/^/  | /' >&2
  exit 1
}

command -v cmake >/dev/null || die "cmake not found (Debian: apt-get install cmake)"
command -v cc >/dev/null || die "no C compiler (Debian: apt-get install build-essential)"
command -v c++ >/dev/null || die "no C++ compiler (Debian: apt-get install g++)"
mkdir -p "$cache" "$logs"

exec 9>"$cache/.lock"
flock 9

# 1. the source distribution (PyPI, through pip); unpacked into a temporary folder and renamed,
#    so an interrupted run never leaves a half tree that looks complete
find_sdist() { ls "$cache"/sdist/llama[-_]cpp[-_]python-"$ver".tar.gz 2>/dev/null | head -1 || true; }
if [ ! -f "$src/CMakeLists.txt" ]; then
  sdist=$(find_sdist)
  if [ -z "$sdist" ]; then
    py=${FLX_PYTHON:-}
    if [ -z "$py" ]; then
      if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
    fi
    "$py" -m pip --version >/dev/null 2>&1 ||
      die "$py has no pip (Debian: apt-get install python3-pip, or run scripts/setup.sh for .venv)"
    say "downloading llama-cpp-python==$ver sdist from PyPI (pip prepares its metadata: a few minutes)"
    "$py" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
      "llama-cpp-python==$ver" -d "$cache/sdist" > "$logs/download.log" 2>&1 ||
      fail_log "$logs/download.log" "pip download of llama-cpp-python==$ver (does that version exist on PyPI?)"
    sdist=$(find_sdist)
    [ -n "$sdist" ] || die "pip did not leave llama_cpp_python-$ver.tar.gz in $cache/sdist (see $logs/download.log)"
  fi
  say "unpacking $sdist"
  tmp=$(mktemp -d "$cache/.unpack.XXXXXX")
  tar xzf "$sdist" -C "$tmp" || { rm -rf "$tmp"; die "cannot unpack $sdist"; }
  got=$(ls -d "$tmp"/*/vendor/llama.cpp 2>/dev/null | head -1)
  [ -n "$got" ] && [ -f "$got/CMakeLists.txt" ] || { rm -rf "$tmp"; die "$sdist has no vendor/llama.cpp"; }
  rm -rf "$top"
  mv "$(dirname "$(dirname "$got")")" "$top"
  rm -rf "$tmp"
fi

# 2. libllama + libggml (shared), CPU only
stamp="$bld/.flx-built"
want="ver=$ver native=$native"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if [ "$native" = 1 ]; then nat=ON; else nat=OFF; fi
  say "configuring llama.cpp (llama-cpp-python $ver, GGML_NATIVE=$nat) in $bld"
  cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$nat -DGGML_CCACHE=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=ON > "$logs/cmake.log" 2>&1 ||
    fail_log "$logs/cmake.log" "cmake configure"
  say "building libllama with -j$jobs (10-25 minutes on 2 shared cores); log: $logs/build.log"
  t0=$(date +%s)
  cmake --build "$bld" -j"$jobs" --target llama > "$logs/build.log" 2>&1 ||
    fail_log "$logs/build.log" "libllama build"
  [ -f "$bld/bin/libllama.so" ] || die "build finished but $bld/bin/libllama.so is missing"
  echo "$want" > "$stamp"
  say "libllama built in $(( $(date +%s) - t0 )) s"
fi

# 3. our tools, linked against it (rpath into the cache), with the project's command-line parser
#    (common/src: flx/cli.h and what it uses; no project build needed)
common_src=()
for f in cli status log cpu progress util version; do common_src+=("$root/common/src/$f.c"); done
proj_ver=$(sed -n 's/^project(fluxion VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
git_desc=$(git -C "$root" describe --always --dirty --tags 2>/dev/null | tr -cd 'A-Za-z0-9._+-' || true)
cflags=(-O2 -std=gnu11 -Wall -Wextra -I"$root/common/include" "-DFLX_VERSION=\"$proj_ver\""
        "-DFLX_GIT_DESCRIBE=\"$git_desc\"")
newer() { # $1 = target: missing or older than any source given after it
  local t=$1 f; shift
  [ -x "$t" ] || return 0
  for f in "$@"; do [ "$f" -nt "$t" ] && return 0; done
  return 1
}
exe="$cache/llama_ref"
if newer "$exe" "$here/llama_ref.c" "$stamp" "${common_src[@]}" "$root/common/include/flx/cli.h"; then
  say "compiling llama_ref"
  cc "${cflags[@]}" -I"$src/include" -I"$src/ggml/include" "$here/llama_ref.c" "${common_src[@]}" \
    -o "$exe" -L"$bld/bin" -lllama -lggml -lggml-base -lm -lpthread -Wl,-rpath,"$bld/bin" \
    > "$logs/llama_ref.log" 2>&1 || fail_log "$logs/llama_ref.log" "compiling llama_ref.c"
fi
cmp="$cache/compare_logits"
if newer "$cmp" "$here/compare_logits.c" "${common_src[@]}" "$root/common/include/flx/cli.h"; then
  say "compiling compare_logits"
  cc "${cflags[@]}" "$here/compare_logits.c" "${common_src[@]}" -o "$cmp" -lm -lpthread \
    > "$logs/compare_logits.log" 2>&1 || fail_log "$logs/compare_logits.log" "compiling compare_logits.c"
fi
echo "$exe"
