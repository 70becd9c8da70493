#!/usr/bin/env bash
# Builds the test binaries into a nextest archive that runs on a GPU runner
# with no cargo: the runner needs only the archive, cargo-nextest and its own
# libtorch (a PyTorch 2.11 install) on LD_LIBRARY_PATH. See docs/ci.md,
# "Gating merges on a GPU runner".
#
#   scripts/gpu-archive.sh [OUT_DIR]     (default: .gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu}
. scripts/env.sh
mkdir -p "$out"
cargo nextest archive --workspace --archive-file "$out/tests.tar.zst"
# nextest packs the build scripts' output folders for their shared
# libraries; the static archives and objects in them are link-time only
# and would double the archive's size.
repack=$(mktemp -d)
trap 'rm -rf "$repack"' EXIT
tar --zstd -xf "$out/tests.tar.zst" -C "$repack"
find "$repack/target" -path '*/build/*/out/*' \( -name '*.a' -o -name '*.o' -o -name 'flag_check*' \) -delete
# Long-distance matching finds what the test binaries share (std, tch,
# this crate): half the size. A 128 MiB window (--long=27) is the most any
# zstd decoder, nextest's included, accepts without being told.
(cd "$repack" && tar -I "zstd -19 --long=27 -T0" -cf - *) >"$out/tests.tar.zst"
# A runner without xz can still take the plain binary; gpu-run.sh unpacks it.
xz -9 -T0 -c "$(command -v cargo-nextest)" >"$out/cargo-nextest.xz"
cp scripts/gpu-run.sh "$out/"
ls -la "$out"
