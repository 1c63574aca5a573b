#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz, each for a bounded time, and fails on any crash,
# sanitizer report, timeout or out-of-memory. The bounded mode of the test command (scripts/test.sh);
# tests/fuzz/README.md has the long manual mode.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--rss-mb M] [--timeout S] [TARGET...]
#     --seconds N   fuzzing time per target (default 20)
#     --jobs J      targets fuzzed at once, each a single-threaded process (default: the CPU count)
#     --rss-mb M    -rss_limit_mb and -malloc_limit_mb: a larger RSS or one larger malloc is an OOM
#                   (default 2048)
#     --timeout S   one input running longer is a timeout (default 20)
#     TARGET        names from tests/fuzz/CMakeLists.txt (default: all)
#
# Configures and builds the build-fuzz tree when needed (clang, -DFLX_FUZZ=ON, CUDA off). Each target
# starts from its committed corpus (tests/fuzz/corpus/<target>) and writes what it finds into a
# temporary work corpus, never into the committed one. A failing input is kept as
# build-fuzz/fuzz-artifacts/<target>-crash-<sha1> (or -timeout-, -oom-, -leak-): fix the bug, then
# commit the input into tests/fuzz/corpus/<target>/ as a regression input.
# Environment: FLX_FUZZ_BUILD (default build-fuzz), FLX_FUZZ_NICE (prefix, e.g. "nice -n 19").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
secs=20 rss=2048 timeout=20 jobs=$(nproc)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) secs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --rss-mb) rss=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
for v in "$secs" "$jobs" "$rss" "$timeout"; do
  [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "fuzz.sh: '$v' is not a positive integer" >&2; exit 2; }
done

build=${FLX_FUZZ_BUILD:-$here/build-fuzz}
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "fuzz.sh: configuring $build (clang, FLX_FUZZ=ON)"
  CC=clang CXX=clang++ cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLX_FUZZ=ON \
    -DFLX_CUDA=OFF -DFLX_TESTS=OFF -DFLX_BENCH=OFF > "$build.configure.log" 2>&1 || {
    cat "$build.configure.log"; exit 1; }
fi
cmake --build "$build" --target flx_fuzz_targets -j"$(nproc)" > "$build.build.log" 2>&1 || {
  tail -n 60 "$build.build.log"; echo "fuzz.sh: build failed ($build.build.log)"; exit 1; }
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(grep -v '^$' "$build/tests/fuzz/targets.txt")
fi
declare -A named=()   # a target named twice runs once (the runs would share its log)
uniq=()
for t in "${targets[@]}"; do [ -n "${named[$t]:-}" ] || { named[$t]=1; uniq+=("$t"); }; done
targets=("${uniq[@]}")

logs=$build/fuzz-logs
artifacts=$build/fuzz-artifacts
mkdir -p "$logs" "$artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
read -r -a nice_cmd <<< "${FLX_FUZZ_NICE:-}"
# One target: its report (one line, then the failure's details) into $logs/$t.report.
fuzz_one() {
  local t=$1 bin=$build/tests/fuzz/fuzz_$1 seeds=$here/tests/fuzz/corpus/$1 log=$logs/$1.log
  local rc=0 work runs last cov ft found
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "fuzz: $t: FAILED: no such target or no corpus ($bin, $seeds)"; return
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/flx-fuzz-$t.XXXXXX")
  "${nice_cmd[@]}" "$bin" -max_total_time="$secs" -rss_limit_mb="$rss" -malloc_limit_mb="$rss" \
    -timeout="$timeout" -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$work" "$seeds" \
    > "$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  found=$(find "$work" -type f | wc -l)
  rm -rf "$work"
  if [ "$rc" -eq 0 ] && ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$log"; then
    echo "fuzz: $t: ok: ${runs:-?} runs in ${secs} s, cov ${cov:-?} ft ${ft:-?}, ${found} new inputs"
  else
    echo "fuzz: $t: FAILED (exit $rc) after ${runs:-?} runs; log $log"
    grep -E 'ERROR:|runtime error:|SUMMARY:|Test unit written to' "$log" | head -n 12 | sed 's/^/  /' || true
    echo "  reproduce: $bin <input>; once fixed, commit the input into tests/fuzz/corpus/$t/"
  fi
}

# J targets at a time (each is one single-threaded process), reported in the given order
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" > "$logs/$t.report" 2>&1 &
done
wait
fail=0
for t in "${targets[@]}"; do
  cat "$logs/$t.report"
  head -n 1 "$logs/$t.report" | grep -q "^fuzz: $t: ok:" || fail=1
done
if [ "$fail" -ne 0 ]; then echo "fuzz.sh: FAILED"; exit 1; fi
echo "fuzz.sh: ${#targets[@]} targets clean"
