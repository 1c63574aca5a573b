#!/usr/bin/env bash
# Builds the container images and smoke-tests them (not part of the test command):
#   localhost/fluxion-debian:bookworm   the base: debootstrap --variant=minbase bookworm, podman import
#   localhost/fluxion-node:cpu          docker/Containerfile.node
#   localhost/fluxion-node:cuda         docker/Containerfile.node-cuda (needs a CUDA 13 toolkit at
#                                       $CUDA_HOME, default /usr/local/cuda; skipped without one)
#   localhost/fluxion-prefill:cpu       docker/Containerfile.prefill (the prefill stub flx-prefill)
# with `podman build --isolation=chroot` (no Docker engine here). `podman run` is refused in this
# sandbox, so each image is smoke-tested by mounting a container's filesystem and running the
# binaries in a chroot (with the host's /proc and /sys bound in, as a runtime would give them):
# every library resolves, --version and --print-config work, and the node
# serves for real (--prefill local on a small generated checkpoint: gRPC health over Python's
# grpcio, /metrics over HTTP, SIGTERM drains and exits 0); the stub's image: every library resolves,
# --version and --help, a usage error exits 2, and UCX starts in the image (its transports load) and
# reports a refused connection to a port nothing listens on (exit 1, the reason named). The stub
# pushes into no node there (test_node_ucx checks pushes on the host).
#
#   docker/build.sh [cpu] [cuda] [prefill]      (default: all three)
# Environment: FLX_DEBIAN_MIRROR (default http://deb.debian.org/debian), CUDA_HOME, FLX_REBUILD_BASE=1.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(cpu cuda prefill)
mirror=${FLX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
base=localhost/fluxion-debian:bookworm
work=$(mktemp -d /tmp/flx-docker-XXXXXX)
cleanup() {
  for m in "${mounts[@]:-}"; do [ -n "$m" ] && umount "$m" 2>/dev/null || true; done
  for c in "${containers[@]:-}"; do [ -n "$c" ] && { podman umount "$c" >/dev/null 2>&1 || true; podman rm -f "$c" >/dev/null 2>&1 || true; }; done
  rm -rf "$work"
}
mounts=()
containers=()
trap cleanup EXIT

for t in podman debootstrap python3 curl; do
  command -v "$t" >/dev/null || { echo "build.sh: $t is not installed (scripts/setup.sh installs podman and debootstrap)"; exit 1; }
done

# ---- base image ----
if [ "${FLX_REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$base"; then
  echo "== base: debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log"; echo "build.sh: debootstrap failed (mirror $mirror)"; exit 1; }
  tar -C "$work/rootfs" -c . | podman import - "$base" > /dev/null
  rm -rf "$work/rootfs"
fi

# ---- context: the tracked sources (uncommitted edits of tracked files included) ----
ctx=$work/ctx
mkdir -p "$ctx/src"
git ls-files -z | tar --null -T - -c | tar -x -C "$ctx/src"
cp docker/node.conf "$ctx/"

build() {   # tag containerfile
  echo "== podman build $1 ($2)"
  podman build --isolation=chroot --build-arg BASE="$base" -f "docker/$2" -t "$1" "$ctx" > "$work/build-$2.log" 2>&1 || {
    tail -n 40 "$work/build-$2.log"; echo "build.sh: building $1 failed"; exit 1; }
}

# Mounts a container of image $1 with /proc and /sys bound in, as a runtime would give them
# (libnuma reads the nodes there); checks every binary's libraries resolve. Sets ctr and mnt.
chroot_image() {
  local img=$1
  ctr=$(podman create "$img" --version)
  containers+=("$ctr")
  mnt=$(podman mount "$ctr")
  [ -n "$mnt" ] && [ -d "$mnt/proc" ] && [ "$mnt" != / ] || { echo "build.sh: cannot mount $img"; exit 1; }
  mount --bind /proc "$mnt/proc" && mounts+=("$mnt/proc")
  mount --bind /sys "$mnt/sys" && mounts+=("$mnt/sys")
  local missing
  missing=$(chroot "$mnt" /bin/sh -c 'for f in /opt/fluxion/bin/*; do ldd "$f"; done' | grep 'not found' || true)
  [ -z "$missing" ] || { echo "$missing"; echo "build.sh: $img: unresolved libraries"; exit 1; }
}

chroot_release() {
  umount "$mnt/proc" "$mnt/sys"
  mounts=()
  podman umount "$ctr" > /dev/null
}

# Runs the node from image $1 in a chroot of a container's filesystem and checks it serves.
smoke() {
  local img=$1 ctr mnt
  echo "== smoke test $img"
  chroot_image "$img"
  chroot "$mnt" /opt/fluxion/bin/fluxion-decoded --version
  chroot "$mnt" /opt/fluxion/bin/fluxion-decoded --config /etc/fluxion/decoded.conf --print-config | grep -q '^grpc-listen = 0.0.0.0:50051$'
  chroot "$mnt" /opt/fluxion/bin/flx-gen-ckpt --family llama --layers 2 --hidden 128 --heads 4 --kv-heads 2 \
    --ffn 256 --vocab 512 /tmp/smoke-model > /dev/null
  chroot "$mnt" /opt/fluxion/bin/fluxion-decoded --model /tmp/smoke-model --model-id smoke --prefill local \
    --grpc-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --kv-capacity 64M --threads 1 \
    > "$work/smoke.out" 2> "$work/smoke.err" &
  local pid=$! line=""
  for _ in $(seq 1 300); do
    line=$(grep -m1 'serving' "$work/smoke.out" || true)
    [ -n "$line" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$line" ] || { cat "$work/smoke.err"; echo "build.sh: $img: the node did not start"; exit 1; }
  local grpc metrics
  grpc=$(sed -n 's/.*grpc=\([^ ]*\).*/\1/p' <<< "$line")
  metrics=$(sed -n 's/.*metrics=\([^ ]*\).*/\1/p' <<< "$line")
  curl -fsS "http://$metrics/metrics" | grep -q '^fluxion_build_info{model_id="smoke",prefill="local"} 1$'
  curl -fsS "http://$metrics/healthz" | grep -q '^ok$'
  /usr/bin/python3 - "$grpc" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
# grpc.health.v1.HealthCheckRequest{} is empty; HealthCheckResponse{status: SERVING} is b"\x08\x01"
resp = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
assert resp == b"\x08\x01", resp
PY
  kill -TERM "$pid"
  wait "$pid" || { cat "$work/smoke.err"; echo "build.sh: $img: the node did not exit 0 after SIGTERM"; exit 1; }
  echo "   $img: libraries resolve, serves gRPC health and /metrics, drains on SIGTERM"
  chroot_release
}

# Runs the prefill stub from image $1 in a chroot of a container's filesystem.
smoke_prefill() {
  local img=$1 ctr mnt rc
  echo "== smoke test $img"
  chroot_image "$img"
  chroot "$mnt" /opt/fluxion/bin/flx-prefill --version
  chroot "$mnt" /opt/fluxion/bin/flx-prefill --help | grep -q '^usage: flx-prefill '
  rc=0; chroot "$mnt" /opt/fluxion/bin/flx-prefill --node 127.0.0.1:1 2> "$work/prefill.err" || rc=$?
  [ "$rc" = 2 ] || { cat "$work/prefill.err"; echo "build.sh: $img: a usage error exited $rc, not 2"; exit 1; }
  # UCX in the image: its context and transports come up, the connection to a closed port is refused
  rc=0; chroot "$mnt" /usr/bin/env UCX_TLS=tcp /opt/fluxion/bin/flx-prefill --node 127.0.0.1:1 --session 1 \
    --token 00000000000000000000000000000001 --synthetic --prompt-len 16 --timeout-ms 5000 2> "$work/prefill.err" || rc=$?
  [ "$rc" = 1 ] && grep -q '^flx-prefill: ' "$work/prefill.err" || {
    cat "$work/prefill.err"; echo "build.sh: $img: flx-prefill to a closed port exited $rc, not 1 with a reason"; exit 1; }
  echo "   $img: libraries resolve, --version, --help, usage error 2, UCX up ($(head -c 120 "$work/prefill.err"))"
  chroot_release
}

for w in "${want[@]}"; do
  case "$w" in
    cpu)
      build localhost/fluxion-node:cpu Containerfile.node
      smoke localhost/fluxion-node:cpu ;;
    cuda)
      if [ ! -x "$cuda_home/bin/nvcc" ]; then
        echo "== skipped localhost/fluxion-node:cuda: no CUDA toolkit at $cuda_home"
        continue
      fi
      # the toolkit subset the build stage needs; only cuBLAS reaches the final image
      mkdir -p "$ctx/cuda/lib"
      cp -a "$cuda_home/bin" "$cuda_home/nvvm" "$cuda_home/include" "$ctx/cuda/"
      cp -a "$cuda_home"/lib/libcudart_static.a "$cuda_home"/lib/libcudadevrt.a "$cuda_home"/lib/libcudart.so* \
            "$cuda_home"/lib/libcublas.so* "$cuda_home"/lib/libcublasLt.so* "$ctx/cuda/lib/"
      [ -d "$cuda_home/lib/cmake" ] && cp -a "$cuda_home/lib/cmake" "$ctx/cuda/lib/"
      ln -s lib "$ctx/cuda/lib64"
      build localhost/fluxion-node:cuda Containerfile.node-cuda
      rm -rf "$ctx/cuda"
      smoke localhost/fluxion-node:cuda
      # the GPU path is in the binary (static CUDA runtime), cuBLAS beside it
      mnt=$(podman image mount localhost/fluxion-node:cuda)
      grep -q cudaGetDeviceCount "$mnt/opt/fluxion/bin/fluxion-decoded" && [ -f "$mnt/opt/fluxion/lib/cuda/libcublas.so.13" ] || {
        podman image unmount localhost/fluxion-node:cuda > /dev/null; echo "build.sh: the CUDA image lacks the GPU path"; exit 1; }
      podman image unmount localhost/fluxion-node:cuda > /dev/null ;;
    prefill)
      build localhost/fluxion-prefill:cpu Containerfile.prefill
      smoke_prefill localhost/fluxion-prefill:cpu ;;
    *) echo "build.sh: unknown image '$w' (cpu, cuda, prefill)"; exit 2 ;;
  esac
done
podman images --filter reference='localhost/fluxion-*'
