#!/usr/bin/env bash
# What a leak test's own process costs under `cargo test`: the same clean
# #[gpu_leak_test] run N times (default 10) in a process of its own (the
# parent re-runs the test binary for it) and in the process it starts in
# (as nextest runs it). Prints the medians and their difference.
#
#   scripts/child-cost.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
n=${1:-10}
exe=$(cargo test --no-run --test runners --message-format=json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')
test=shapes::runs_after_a_thread_was_left_running
time_runs() {
    python3 - "$n" "$exe" "$test" "$@" <<'PY'
import os, statistics, subprocess, sys, time
n, exe, test, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
env = {k: v for k, v in os.environ.items() if not k.startswith("NEXTEST")}
if mode == "in-process":
    env.update(NEXTEST="1", NEXTEST_EXECUTION_MODE="process-per-test")
times = []
for _ in range(n):
    start = time.perf_counter()
    subprocess.run([exe, test, "--exact", "--ignored"], env=env, check=True, capture_output=True)
    times.append(time.perf_counter() - start)
print(f"{statistics.median(times) * 1000:.1f}")
PY
}
child=$(time_runs child)
alone=$(time_runs in-process)
python3 -c "import sys; c, a = map(float, sys.argv[1:]); print(f'median of $n: {c:.1f} ms with its own process, {a:.1f} ms without: the child costs {c - a:.1f} ms per leak test')" "$child" "$alone"
