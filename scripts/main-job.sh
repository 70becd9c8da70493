#!/usr/bin/env bash
# The main job: the article's scenarios and the YAML scenario fixtures run
# through the harness, printing each verdict and each report. CPU by default;
# on a machine with CUDA the CUDA variants run too.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo test --test article -- --nocapture --test-threads 1 "$@"
cargo test --test fixtures -- --test-threads 1 "$@"
