#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job.
# Until the decode node lands this is the store + attention-core demo (fluxion-demo): a long
# prompt pushed into the NUMA-aware host KV store, then one decode step of attention per mode.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
./scripts/setup.sh
./scripts/build.sh build
exec ./build/fluxion/tools/fluxion-demo "$@"
