#!/usr/bin/env bash
# Self-test of the reference tooling (llama_ref + compare_logits) on the real model; no project
# build needed. Exits non-zero on the first check that fails.
#   1. two llama.cpp dumps of the same ids, made differently (text vs id file, 2 threads vs 1,
#      one pass vs chunks of 128 through the KV cache): agreement 1.0, max diff 0
#   2. a deliberately perturbed copy (one position's argmax moved, +100 on one logit; small noise
#      on another row): exactly one disagreement, max diff 100
#   3. refusals (exit 1, a message naming the file): other token ids, bad magic, truncated file
#   4. a genuinely different computation (f16 KV cache): high agreement, small non-zero diff
# Env: FLX_CACHE; FLX_SELFTEST_DIR (scratch, default a temp dir removed at the end).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
ref=$("$here/build_llamacpp.sh")
cmp="$(dirname "$ref")/compare_logits"
[ -s "$cache/texts/bench.txt" ] || "$root/scripts/fetch_texts.sh" >&2
[ -s "$gguf" ] || { echo "selftest: $gguf missing (scripts/setup.sh fetches it)" >&2; exit 1; }
if [ -n "${FLX_SELFTEST_DIR:-}" ]; then d=$FLX_SELFTEST_DIR; mkdir -p "$d"; else d=$(mktemp -d); trap 'rm -rf "$d"' EXIT; fi
n=256
fail() { echo "selftest: FAIL: $*" >&2; exit 1; }
last() { tail -1 "$1"; }

"$ref" -m "$gguf" --text "$cache/texts/bench.txt" -n $n --full all --show 0 --tokens-out "$d/ids.txt" -o "$d/a.flxl" -t 2 2>"$d/a.log"
head -n $n "$d/ids.txt" | /usr/bin/python3 -c 'import sys,struct; v=[int(x) for x in sys.stdin]; sys.stdout.buffer.write(struct.pack("<%di" % len(v), *v))' > "$d/ids.i32"
"$ref" -m "$gguf" --tokens "$d/ids.i32" --full all --show 0 --ubatch 128 -o "$d/b.flxl" -t 1 2>"$d/b.log"
"$cmp" "$d/a.flxl" "$d/b.flxl" -n $n > "$d/ab.txt" || fail "compare of two llama.cpp dumps returned $?"
[ "$(last "$d/ab.txt")" = "llamacpp_top1_agree=1.0000 max_logit_diff=0" ] || fail "self-compare: $(last "$d/ab.txt")"
echo "selftest: ok  llama.cpp vs llama.cpp (text/2 threads/one pass vs ids/1 thread/chunks of 128): $(last "$d/ab.txt")"

/usr/bin/python3 - "$d/a.flxl" "$d/p.flxl" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n, V, F = struct.unpack_from("<3I", b, 8)
top = 32 + 4 * n
full = 32 + 20 * n
t = 5                                   # move position 5's argmax to token 7
l1 = struct.unpack_from("<f", b, top + 16 * t + 8)[0]
new = struct.unpack_from("<f", b, full + 4 * (t * V + 7))[0] + 100.0
assert new > l1
struct.pack_into("<f", b, full + 4 * (t * V + 7), new)
struct.pack_into("<iiff", b, top + 16 * t, 7, struct.unpack_from("<i", b, top + 16 * t)[0], new, l1)
for v in range(0, V, 97):               # row 0: small noise, argmax unchanged
    o = full + 4 * v
    struct.pack_into("<f", b, o, struct.unpack_from("<f", b, o)[0] + 1e-3)
open(sys.argv[2], "wb").write(b)
PY
"$cmp" "$d/a.flxl" "$d/p.flxl" -n $n > "$d/ap.txt" || fail "compare with the perturbed copy returned $?"
grep -q "^top-1 agreement *$((n - 1)) / $n" "$d/ap.txt" || fail "perturbed: $(grep '^top-1' "$d/ap.txt")"
grep -q "^ *5 .*DIFF" "$d/ap.txt" || fail "perturbed: position 5 not reported"
grep -q "max_logit_diff=100$" "$d/ap.txt" || fail "perturbed: $(last "$d/ap.txt")"
echo "selftest: ok  perturbed copy: $(last "$d/ap.txt") (position 5 reported)"
"$cmp" "$d/a.flxl" "$d/p.flxl" -n $n -q --min-agree 1 > /dev/null && fail "--min-agree 1 did not fail"
echo "selftest: ok  --min-agree 1 fails on it"

/usr/bin/python3 - "$d/a.flxl" "$d" <<'PY'
import struct, sys
src, d = sys.argv[1], sys.argv[2]
b = bytearray(open(src, "rb").read())
c = bytearray(b); struct.pack_into("<i", c, 32 + 4 * 3, 1234); open(d + "/tok.flxl", "wb").write(c)
c = bytearray(b); c[0:4] = b"XXXX"; open(d + "/magic.flxl", "wb").write(c)
open(d + "/short.flxl", "wb").write(b[:-4])
PY
for bad in tok magic short; do
  set +e; "$cmp" "$d/a.flxl" "$d/$bad.flxl" -n $n > /dev/null 2> "$d/$bad.err"; rc=$?; set -e
  [ $rc = 1 ] || fail "$bad: exit $rc, want 1"
  grep -q "$bad.flxl" "$d/$bad.err" || fail "$bad: the message does not name the file: $(head -1 "$d/$bad.err")"
  echo "selftest: ok  refuses $bad: $(head -1 "$d/$bad.err")"
done

"$ref" -m "$gguf" --tokens "$d/ids.txt" -n $n --full all --show 0 --kv f16 -o "$d/h.flxl" 2>"$d/h.log"
"$cmp" "$d/a.flxl" "$d/h.flxl" -n $n -q > "$d/ah.txt" || fail "compare with the f16-KV dump returned $?"
echo "selftest: ok  f32 KV vs f16 KV (a real, small numerical difference): $(last "$d/ah.txt")"
echo "selftest: all passed"
