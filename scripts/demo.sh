#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job, a loopback
# cluster of one decode node and one prefill node:
#   1. fluxion-decoded (the decode node daemon: gRPC control service, UCX KV receiver, /metrics)
#      starts on loopback with the real model (SmolLM2-135M-Instruct) and Fluxion's shipped
#      predictor;
#   2. flx-prefill plays the prefill node, three times: it opens a session over gRPC (OpenSession,
#      as a router would), prefills a long real text (the GPL-3 text every Debian machine has, ~2K
#      tokens, plus a question) with the real model, and pushes the KV and Fluxion's statistics
#      over UCX (shared memory) into the node's host memory;
#   3. a router's client (scripts/fluxion_client.py, python3-grpcio) calls Generate on each
#      session: with Fluxion, with full attention and with the paper's fixed (16, 0.05) baseline.
#      For each: the answer, the transfer (bytes, time to READY, GB/s), TTFT, TPOT, host bytes
#      read per step and Fluxion's statistics; then whether Fluxion's tokens agree with full
#      attention's;
#   4. the node's /metrics page is saved, the node is stopped with SIGTERM (a clean drain);
#   5. fluxion-demo: the attention core at Llama-3.1-8B layer shapes over a 32K-token prompt.
# Output files: ${FLX_DEMO_OUT:-build/demo}/ (metrics.txt, the node's log, token ids, summaries).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
./scripts/setup.sh
./scripts/build.sh build
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
pred="fluxion/weights/predictor-smollm2-135m-instruct.safetensors"
out="${FLX_DEMO_OUT:-build/demo}"
mkdir -p "$out"
rm -f "$out"/*.ids "$out"/*.json "$out"/metrics.txt
prompt="$out/prompt.txt"
head -c 9000 /usr/share/common-licenses/GPL-3 > "$prompt"
printf '\n\nQuestion: according to this license, may I sell copies of a GPL program? Answer briefly.' >> "$prompt"
max_new=64
py=/usr/bin/python3

# Shared memory for the KV, TCP for the listener's connection setup (UCX 1.13 needs tcp for it);
# shared memory has no UCX peer-failure detection, so both sides run error mode none and the node's
# liveness check watches the prefill node.
export UCX_TLS=sm,tcp
node_pid=
cleanup() { [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null || true; }
trap cleanup EXIT

echo "=== the decode node: fluxion-decoded (real model, Fluxion predictor, KV over UCX)"
./build/decode/tools/fluxion-decoded --model "$model" --model-id smollm2 --predictor "$pred" \
  --grpc-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --ucx-listen 127.0.0.1:0 --ucx-err-mode none \
  --kv-capacity 1G --max-new-tokens 256 >"$out/node.out" 2>"$out/node.log" &
node_pid=$!
for _ in $(seq 600); do
  grep -q serving "$out/node.out" 2>/dev/null && break
  kill -0 "$node_pid" 2>/dev/null || { cat "$out/node.log"; echo "demo: the node did not start"; exit 1; }
  sleep 0.1
done
serving=$(head -1 "$out/node.out")
echo "$serving"
grpc=$(sed 's/.*grpc=\([^ ]*\).*/\1/' <<<"$serving")
metrics=$(sed 's/.*metrics=\([^ ]*\).*/\1/' <<<"$serving")

run_mode() {   # NAME, flx-prefill's attention flags
  local name=$1; shift
  echo
  echo "=== $name: flx-prefill --control $grpc (real prefill, KV over UCX) -> Generate"
  local sid
  sid=$(./build/prefill-stub/flx-prefill --control "$grpc" --model "$model" --prompt-file "$prompt" --chat \
          --max-new "$max_new" --err-mode none --pregenerate --quiet "$@" | awk '/^SESSION/{print $2}')
  [ -n "$sid" ] || { echo "demo: the prefill node did not open a session"; exit 1; }
  echo "  session $sid READY; the answer:"
  "$py" scripts/fluxion_client.py --target "$grpc" generate --session "$sid" --max-new "$max_new" \
    --ids-out "$out/$name.ids" --summary-out "$out/$name.json"
}
run_mode fluxion --mode fluxion
run_mode full --mode full
run_mode fixed-16-0.05 --mode fixed --blk 16 --bgt 0.05

echo
echo "=== summary"
"$py" - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = [(n, json.load(open(os.path.join(out, n + ".json")))) for n in ("fluxion", "full", "fixed-16-0.05")]
print("  %-14s %10s %9s %9s %11s %9s %9s %14s" % ("attention", "READY ms", "GB/s", "TTFT ms", "1st dec ms",
                                                   "TPOT ms", "p90 ms", "host MB/step"))
for n, s in rows:
    print("  %-14s %10.0f %9.2f %9.1f %11.1f %9.1f %9.1f %14.2f" % (n, s["time_to_ready_ms"], s["transfer_gbps"],
          s["ttft_ms"], s["first_decoded_ms"], s["tpot_ms_mean"], s["tpot_ms_p90"], s["host_bytes_per_step"] / 1e6))
print("  (READY: OpenSession to READY, the stub's prefill included; TTFT: Generate to the first token after READY,")
print("   the prefill node's; 1st dec: Generate to the first token the node decoded)")
ids = {n: open(os.path.join(out, n + ".ids")).read().split() for n, _ in rows}
a, b = ids["fluxion"], ids["full"]
same = 0
while same < min(len(a), len(b)) and a[same] == b[same]:
    same += 1
if a == b:
    print("  Fluxion's tokens agree with full attention's: yes, all %d" % len(a))
else:
    print("  Fluxion's tokens agree with full attention's: the first %d of %d (full: %d tokens)" % (same, len(a), len(b)))
f, x = rows[0][1], rows[2][1]
if x["host_bytes_per_step"]:
    print("  Fluxion reads %.2f of fixed (16, 0.05)'s host bytes per step" % (f["host_bytes_per_step"] / x["host_bytes_per_step"]))
EOF

"$py" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("http://%s/metrics" % sys.argv[1]).read().decode())' \
  "$metrics" > "$out/metrics.txt"
echo "  the node's /metrics page: $out/metrics.txt ($(grep -c '^fluxion_' "$out/metrics.txt") samples); its log: $out/node.log"
kill -TERM "$node_pid"
rc=0
wait "$node_pid" || rc=$?
node_pid=
echo "  node stopped by SIGTERM: drained, exit $rc"
[ "$rc" = 0 ] || exit 1

echo
echo "=== fluxion-demo: the attention core at Llama-3.1-8B layer shapes"
exec ./build/fluxion/tools/fluxion-demo "$@"
