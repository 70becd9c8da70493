#!/usr/bin/env bash
# Runs a command against another supported tch release than Cargo.lock's:
#
#   scripts/with-tch.sh 0.26.0 scripts/test.sh
#
# Cargo.lock holds the oldest release (tch 0.24, PyTorch 2.11, the GPU
# runners' libtorch); one lock holds one torch-sys, since it declares
# `links`. So the command runs in a copy of this checkout under
# target/tch-VERSION/, whose lock is moved to that release, with that
# release's PyTorch (scripts/env.sh reads GPU_LEAK_TEST_TCH). Its sources
# are laid anew each time; its own target folder is kept between runs (a
# target folder outside the workspace would change the paths the UI tests'
# expected compiler output shows).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/with-tch.sh TCH_VERSION COMMAND [ARG...]" >&2; exit 2; }
version=$1
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
awk -v tch="$version" '!/^#/ && $1 == tch { found=1 } END { exit !found }' "$repo/libtorch-versions.tsv" ||
    { echo "with-tch: tch $version is not a row of libtorch-versions.tsv" >&2; exit 2; }
copy=$repo/target/tch-$version/workspace
mkdir -p "$copy"
find "$copy" -mindepth 1 -maxdepth 1 ! -name target -exec rm -rf {} +
(cd "$repo" && tar --exclude=./target --exclude=./.git --exclude=./.gpu -cf - .) | tar -xf - -C "$copy"
cd "$copy"
# tch pins its torch-sys exactly; both move together.
cargo update --quiet -p tch --precise "$version"
grep -q "^name = \"torch-sys\"" Cargo.lock && [ "$(awk '/^name = "torch-sys"$/ {getline; print $3}' Cargo.lock)" = "\"$version\"" ] ||
    cargo update --quiet -p torch-sys --precise "$version"
export GPU_LEAK_TEST_TCH=$version
unset CARGO_TARGET_DIR
exec "$@"
