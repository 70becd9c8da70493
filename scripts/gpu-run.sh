#!/usr/bin/env bash
# Runs the archive from gpu-archive.sh on a GPU runner, from the root of a
# checkout of the same commit:
#
#   .gpu/gpu-run.sh [ARCHIVE_DIR] [nextest arguments...]
#
# A filterset given (-E EXPR) runs the tests it matches, UI tests aside.
#
# It finds libtorch in the runner's Python (python3 -c 'import torch'), and
# sets GPU_LEAK_TEST_REQUIRE_CUDA=1 so a runner without a usable GPU fails
# instead of skipping. The UI tests compile code, so they need cargo and are
# left to the CPU job.
set -euo pipefail
dir=${1:-.gpu}
shift || true
if [ ! -x "$dir/cargo-nextest" ] && [ -f "$dir/cargo-nextest.xz" ]; then
    # Python's lzma where the runner has no xz.
    { xz -dc "$dir/cargo-nextest.xz" 2>/dev/null ||
        python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$dir/cargo-nextest.xz"; } \
        >"$dir/cargo-nextest" && chmod +x "$dir/cargo-nextest"
fi
torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPU_LEAK_TEST_REQUIRE_CUDA=${GPU_LEAK_TEST_REQUIRE_CUDA:-1}
# nextest joins its -E filters with "or": a filter given here narrows the
# default (every test but the UI tests) instead of adding the whole suite.
filters=()
rest=()
while [ $# -gt 0 ]; do
    case $1 in
        -E | --filterset | --filter-expr)
            filters+=("(${2:?$1 needs a filterset})")
            shift 2
            ;;
        --filterset=* | --filter-expr=*)
            filters+=("(${1#*=})")
            shift
            ;;
        --)
            rest+=("$@")
            break
            ;;
        *)
            rest+=("$1")
            shift
            ;;
    esac
done
filter='not binary(ui)'
if [ ${#filters[@]} -gt 0 ]; then
    joined=$(printf ' | %s' "${filters[@]}")
    filter="$filter & (${joined:3})"
fi
# Reports land in this checkout's target/gpu-leak-test (the workspace
# nextest remaps to), not in nextest's temporary archive folder.
exec "$dir/cargo-nextest" nextest run --archive-file "$dir/tests.tar.zst" --workspace-remap . --no-fail-fast \
    -E "$filter" ${rest[@]+"${rest[@]}"}
