#!/usr/bin/env bash
# The harness's own time per leak test over this project's suite: runs the
# tests under cargo nextest (a process per test, as the GPU gate runs them)
# with GPU_LEAK_TEST_TIMINGS set, then prints the median and maximum of each
# part (scripts/harness-time.py). Extra arguments go to nextest.
#
#   scripts/harness-time.sh                    # this machine
#   GPU_LEAK_TEST_TIMINGS=FILE .gpu/gpu-run.sh .gpu; python3 scripts/harness-time.py FILE   # a GPU runner
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
log=$(realpath -m target/harness-time.jsonl)
rm -f "$log"
status=0
GPU_LEAK_TEST_TIMINGS=$log cargo nextest run --workspace --no-fail-fast -E 'not binary(ui)' \
    --status-level none --final-status-level fail "$@" || status=$?
python3 scripts/harness-time.py "$log" "cargo nextest, $(nproc) CPU threads"
exit $status
