#!/usr/bin/env bash
# cmake --install of a build tree into a temporary prefix, then what a user of the install does:
# compile and link tests/install/app.c against fluxion.pc, run it, and run the installed daemon
# and tools (--version, --help, --print-config).
#   test_install.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/flx-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > "$prefix.log" 2>&1 || { cat "$prefix.log"; exit 1; }
rm -f "$prefix.log"
for f in bin/fluxion-decoded bin/flx-generate bin/fluxion-attn include/flx/attn.h include/flx/node.h \
         include/fluxion/decode/v1/decode.pb-c.h share/fluxion/proto/fluxion/decode/v1/decode.proto \
         share/fluxion/weights/predictor-smollm2-135m-instruct.safetensors lib/pkgconfig/fluxion.pc \
         lib/libflx_fluxion.a lib/libflx_node.a; do
  [ -e "$prefix/$f" ] || { echo "test_install: $f is not installed"; exit 1; }
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[ "$(pkg-config --modversion fluxion)" != "" ]
cc -std=gnu11 -Wall -Werror -o "$prefix/app" "$here/app.c" $(pkg-config --cflags --libs fluxion)
"$prefix/app"
"$prefix/bin/fluxion-decoded" --version | grep -q '^fluxion-decoded [0-9]'
"$prefix/bin/fluxion-decoded" --help | grep -q -- '--grpc-listen'
"$prefix/bin/fluxion-decoded" --model /m.gguf --max-batch 2 --print-config | grep -q '^max-batch = 2$'
set +e
"$prefix/bin/fluxion-decoded" --max-batch 2 > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "test_install: fluxion-decoded without --model exited $rc, want 2"; exit 1; }
"$prefix/bin/flx-generate" --help > /dev/null
echo "test_install: ok ($prefix)"
