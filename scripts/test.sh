#!/usr/bin/env bash
# The whole test suite, as CI runs it: provisions PyTorch on first use, then
# runs every test (unit, integration, UI, fixtures). CUDA tests skip with a
# message where there is no GPU; set GPU_LEAK_TEST_REQUIRE_CUDA=1 to make
# them fail instead. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo test --workspace "$@"
# The benchmark in smoke mode (tiny counts), so it cannot rot unnoticed.
cargo test --workspace --benches "$@"
