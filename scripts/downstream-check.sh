#!/usr/bin/env bash
# Sets up examples/downstream exactly as the README tells a user to (the
# README's `# gpu-leak-test: install` block, run in the crate's folder from
# a clean state), then runs its tests with `cargo test` and through a
# nextest archive run from another folder, as a GPU runner would.
#
#   scripts/downstream-check.sh [TCH_VERSION]
#
# With a version (a row of libtorch-versions.tsv; default the example's
# own pin), the crate pins that tch exactly, as a user on it would, and the
# install block gets that row's PyTorch. It runs in a copy of the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
example=$root/examples/downstream
pinned=$(sed -n 's/^tch = "=\(.*\)"$/\1/p' "$example/Cargo.toml")
version=${1:-$pinned}
row=$(awk -v tch="$version" '!/^#/ && $1 == tch' libtorch-versions.tsv)
[ -n "$row" ] || { echo "downstream-check: tch $version is not a row of libtorch-versions.tsv" >&2; exit 1; }
torch=$(echo "$row" | cut -f3)
# The README shows every supported pin.
grep -q "tch = \"=$version\"" README.md ||
    { echo "downstream-check: README.md does not show tch = \"=$version\"" >&2; exit 1; }
# The fenced block that starts with the marker, up to its closing fence,
# with the user's choice of PyTorch for this tch.
block=$(awk '/^# gpu-leak-test: install$/ {found=1} found && /^```$/ {exit} found' README.md)
[ -n "$block" ] || { echo "downstream-check: no install block in README.md" >&2; exit 1; }
grep -q '^torch=' <<<"$block" || { echo "downstream-check: the install block sets no torch=" >&2; exit 1; }
block=$(sed "s/^torch=[^ ]*/torch=$torch/" <<<"$block")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
crate=$work/downstream
mkdir "$crate"
cp -r "$example/Cargo.toml" "$example/src" "$example/tests" "$crate/"
sed -i "s|^tch = \".*\"$|tch = \"=$version\"|; s|path = \"../..\"|path = \"$root\"|" "$crate/Cargo.toml"
cd "$crate"
echo "downstream-check: a crate on tch $version with PyTorch $torch"
# A user's shell: none of this repository's environment.
clean_env=(env -u LIBTORCH -u LIBTORCH_USE_PYTORCH -u LD_LIBRARY_PATH -u CARGO_TARGET_DIR -u GPU_LEAK_TEST_TCH)
"${clean_env[@]}" bash -euo pipefail -c "$block"
"${clean_env[@]}" cargo test --test leaks
# The hostile inputs of issue #35, as a downstream crate meets them. Tests
# whose names clean alike, and one name in two binaries: four tests, four
# baseline files, each passing against its own.
"${clean_env[@]}" GPU_LEAK_TEST_BASELINES=update cargo test -q --test hostile --test hostile_twin
count=$(find memory-baselines -name '*.yaml' | wc -l)
[ "$count" = 4 ] || { echo "downstream-check: $count baseline files for 4 tests:" memory-baselines/* >&2; exit 1; }
"${clean_env[@]}" GPU_LEAK_TEST_BASELINES=require cargo test -q --test hostile --test hostile_twin
# A TMPDIR that does not exist: the test's own process needs none.
"${clean_env[@]}" TMPDIR=/nonexistent cargo test -q --test hostile
"${clean_env[@]}" cargo nextest archive --archive-file target/leaks.tar.zst
elsewhere=$work/elsewhere
mkdir "$elsewhere"
cp -r Cargo.toml src tests .cargo memory-baselines "$elsewhere/"
(cd "$elsewhere" && "${clean_env[@]}" cargo nextest run --archive-file "$crate/target/leaks.tar.zst" --workspace-remap .)
# A crate with its own #[global_allocator] (examples/downstream/allocators):
# default features off, then the documented line, and no line at all.
sed -i 's|^gpu-leak-test = { path = "\(.*\)" }$|gpu-leak-test = { path = "\1", default-features = false }|' Cargo.toml
grep -q 'default-features = false' Cargo.toml || { echo "downstream-check: could not turn default features off" >&2; exit 1; }
cp "$example"/allocators/*.rs tests/
rm -rf target/gpu-leak-test
"${clean_env[@]}" cargo test -q --test wrapped_allocator --test plain_allocator
grep -l 'Rust heap: not counted, because gpu-leak-test' target/gpu-leak-test/a_loop_that_logs_one_f64_per_step_passes.*.json >/dev/null ||
    { echo "downstream-check: the unwrapped allocator's report does not say the Rust heap was not counted" >&2; exit 1; }
