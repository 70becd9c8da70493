#!/usr/bin/env bash
# Sets up examples/downstream exactly as the README tells a user to (the
# README's `# gpu-leak-test: install` block, run in the crate's folder from
# a clean state), then runs its tests with `cargo test` and through a
# nextest archive run from another folder, as a GPU runner would.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
crate=$root/examples/downstream
# The README's dependency lines and the example's must agree.
grep -q '^tch = "=0.24.0"$' "$crate/Cargo.toml" && grep -q '^tch = "=0.24.0"$' README.md ||
    { echo "downstream-check: README and examples/downstream disagree on the tch pin" >&2; exit 1; }
# The fenced block that starts with the marker, up to its closing fence.
block=$(awk '/^# gpu-leak-test: install$/ {found=1} found && /^```$/ {exit} found' README.md)
[ -n "$block" ] || { echo "downstream-check: no install block in README.md" >&2; exit 1; }
cd "$crate"
rm -rf .cargo target Cargo.lock
# A user's shell: none of this repository's environment.
env -u LIBTORCH -u LIBTORCH_USE_PYTORCH -u LD_LIBRARY_PATH bash -euo pipefail -c "$block"
env -u LIBTORCH -u LIBTORCH_USE_PYTORCH -u LD_LIBRARY_PATH cargo test --test leaks
env -u LIBTORCH -u LIBTORCH_USE_PYTORCH -u LD_LIBRARY_PATH cargo nextest archive --archive-file target/leaks.tar.zst
elsewhere=$(mktemp -d)
trap 'rm -rf "$elsewhere"' EXIT
cp -r Cargo.toml src tests .cargo "$elsewhere/"
(cd "$elsewhere" && env -u LIBTORCH -u LIBTORCH_USE_PYTORCH -u LD_LIBRARY_PATH \
    cargo nextest run --archive-file "$crate/target/leaks.tar.zst" --workspace-remap .)
