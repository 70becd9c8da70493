#!/usr/bin/env bash
# The performance targets' figures on one GPU machine without cargo, in as
# few calls as a lent device allows. DIR is the folder that both
# `scripts/gpu-archive.sh DIR` and `scripts/bench.sh --gpu DIR` filled on the
# CPU builder; run this from the root of a checkout of the same commit:
#
#   scripts/gpu-targets.sh DIR PART...
#
# Parts, run in the order given:
#   suite   the whole suite under each allocator backend (native,
#           cudaMallocAsync, expandable segments, caching off) with
#           GPU_LEAK_TEST_TIMINGS set: per backend nextest's summary, the
#           harness's own time per leak test (scripts/harness-time.py), the
#           report-consistency check, whether every CUDA test's verdict
#           is the one it had under the first backend, how many CUDA
#           reports show autograd's wake-ups piling up, and the suite's first
#           wave (harness-time.py, from nextest's own lines, each stamped
#           with the seconds since the run began as it came)
#   step    overhead --bench step, every variant, ROUNDS rounds (25)
#   heavy   overhead --bench heavy, likewise
#   queues  overhead --bench queues: growing autograd's ready queues, a
#           first call in a fresh process against later ones, by tasks
#   anchor  PyTorch's own recorder on the same steps (pytorch_step.py)
#   KIND-STEP-DEVICE
#           one target's figure on one step and device, in rounds of its
#           own (blocks of 2 steps, rounds of 1 s) until UNTIL, so that its
#           median's interval can be narrower than the target's margin
#           where the step sections' rounds, shared with every variant, are
#           too few: KIND is count (the counting target: process scope, all
#           layers, against plain, and plain again to check the run) or
#           attribution (attribution forced on, in thread and in process
#           scope); STEP is mlp (the `step` section's MLP) or lstm (the
#           `heavy` section's LSTM x64); DEVICE is cpu or cuda. For example
#           count-lstm-cuda, attribution-mlp-cpu.
#
# Every KIND-STEP-DEVICE part may be given its own limit as
# PART:SECONDS, so that parts after it still run: `attribution-mlp-cuda:60
# count-lstm-cuda`. Every must-show figure of the performance targets fits
# two calls this way (docs/benchmarks.md); `step` and `heavy` give every
# variant's figure where a third call fits.
#
# On the host CPU the bench runs the MLP step with at most four intra-op
# threads and the heavy step with one; OMP_NUM_THREADS lowers them further,
# as libtorch reads it. Each section prints the count it ran with.
#
# UNTIL (seconds after this script starts; 570 by default) cuts off
# whatever part is running then, so a call ends inside a device's limit; the
# bench parts append every finished round to LOGS/rounds_PART.tsv, which
# `overhead --pool-rounds` reads back. Logs go to LOGS (target/gpu-targets),
# and each backend's reports from target/gpu-leak-test to LOGS/reports_BACKEND.
set -uo pipefail
dir=$(cd "${1:?usage: scripts/gpu-targets.sh DIR PART...}" && pwd)
shift
repo=$(pwd)
logs=$(realpath -m "${LOGS:-target/gpu-targets}")
mkdir -p "$logs"
start=$(date +%s)
until=${UNTIL:-570}
# Seconds left before UNTIL, at least 1: `timeout 0` would mean no limit.
left() {
    local n=$((until - ($(date +%s) - start)))
    echo $((n > 1 ? n : 1))
}

# The verdict of each CUDA test's report, one "stem verdict" line each, from
# the report folder's index (a report's newer row supersedes its older
# ones). A row's device is the verdict's; `body` is where the body ran
# when that differs, as for a CUDA test judged on libtorch's host objects.
cuda_verdicts() {
    python3 - "$1/index.rows" <<'PY'
import json, sys
rows = {}
try:
    lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
except OSError:
    lines = []
for line in lines:
    try:
        row = json.loads(line)
    except ValueError:
        continue
    rows[row["stem"]] = row
for stem, row in sorted(rows.items()):
    if (row.get("body") or row["device"]).startswith("cuda"):
        print(stem, row["verdict"])
PY
}

# How many CUDA reports in a report folder show autograd's wake-ups piling
# up in the caller's queue: host-object levels that drop by three or more
# GraphTask blocks (1,128 B each on libtorch 2.11) at once. The drain
# before each sample (the host-objects layer's settle) should leave none.
wake_up_drops() {
    python3 - "$1" <<'PY'
import glob, json, os, sys
graph_task = 1128
seen, dropped = 0, []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        report = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError):
        continue
    if not str(report.get("device", "")).startswith("cuda"):
        continue
    for layer in report.get("devices", []):
        if layer.get("layer") != "host-objects":
            continue
        seen += 1
        levels = [v for v in layer.get("levels") or [] if isinstance(v, (int, float))]
        drops = [a - b for a, b in zip(levels, levels[1:]) if a - b >= 3 * graph_task]
        if drops:
            dropped.append(f"{os.path.basename(path)} ({', '.join(f'-{d} B' for d in drops)})")
print(f"host-object levels that drop by 3 or more GraphTask blocks at once (autograd's wake-ups piled up): {len(dropped)} of {seen} CUDA reports")
for line in dropped:
    print(f"  {line}")
PY
}

suite() {
    local first=""
    # Whether the child that aborts on purpose (runners) could write a
    # core here, had it not turned its own off: the suite's slowest test
    # has run beside it.
    echo "core files: ulimit -c $(ulimit -c), pattern $(cat /proc/sys/kernel/core_pattern 2>/dev/null)"
    for backend in native async expandable nocache; do
        local setting
        case $backend in
            native) setting= ;;
            async) setting=PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
            expandable) setting=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
            nocache) setting=PYTORCH_NO_CUDA_MEMORY_CACHING=1 ;;
        esac
        # Each backend's reports apart, so the check reads only its own.
        rm -rf target/gpu-leak-test
        local t0=$(date +%s)
        # Every test's line, stamped as it comes, for the first wave.
        env $setting GPU_LEAK_TEST_TIMINGS="$logs/timings_$backend.jsonl" timeout "$(left)" \
            "$dir/gpu-run.sh" "$dir" --status-level pass --final-status-level fail 2>&1 |
            python3 -u -c 'import sys, time
t0 = time.time()
print(f"# stamps: seconds since {t0:.3f} on the Unix clock", flush=True)
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - t0:9.3f} {line}")' >"$logs/suite_$backend.log"
        local status=${PIPESTATUS[0]}
        echo "## $backend ${setting:+($setting)}: exit $status, $(($(date +%s) - t0)) s"
        # Less the stamps, so a FAIL line and its repeat in the summary are one.
        sed -E 's/^ *[0-9.]+ //' "$logs/suite_$backend.log" | grep -E '^ *(Summary|FAIL) ' | sort -u | head -20
        if [ "$status" = 124 ]; then
            echo "cut off at UNTIL: no timings, verdicts or check for this backend"
            continue
        fi
        python3 scripts/harness-time.py "$logs/timings_$backend.jsonl" "$backend, $(nproc) CPU threads" "$logs/suite_$backend.log"
        GPU_LEAK_TEST_REPORT_DIR="$repo/target/gpu-leak-test" timeout "$(left)" \
            "$dir/gpu-run.sh" "$dir" -E 'binary(report_consistency)' --run-ignored only >"$logs/consistency_$backend.log" 2>&1
        echo "report-consistency check: exit $?"
        cuda_verdicts target/gpu-leak-test >"$logs/verdicts_$backend.txt"
        if [ -s "$logs/verdicts_$backend.txt" ]; then
            echo "CUDA verdicts: $(awk '{print $2}' "$logs/verdicts_$backend.txt" | sort | uniq -c | awk '{printf "%s %s; ", $2, $1}')"
            if [ -z "$first" ]; then
                first=$backend
            elif diff "$logs/verdicts_$first.txt" "$logs/verdicts_$backend.txt" >"$logs/verdicts_diff_$backend.txt"; then
                echo "every CUDA verdict as under $first"
            else
                echo "CUDA verdicts that differ from $first's:"
                cat "$logs/verdicts_diff_$backend.txt"
            fi
        else
            echo "CUDA verdicts: none (no CUDA test wrote a report)"
        fi
        wake_up_drops target/gpu-leak-test
        rm -rf "$logs/reports_$backend"
        mv target/gpu-leak-test "$logs/reports_$backend"
    done
}

bench() {
    timeout "$(left)" "$dir/overhead" --bench "$1" --rounds="${ROUNDS:-25}" --save-rounds="$logs/rounds_$1.tsv" >"$logs/$1.md" 2>&1
    echo "## overhead --bench $1: exit $? ($(left) s left)"
    cat "$logs/$1.md"
}

# As many rounds of one bench section as fit before UNTIL, or within
# SECONDS where given (blocks of 2 steps, rounds of 1 s), each kept in
# LOGS/rounds_PART.tsv as it ends; then the table of every round that file
# holds, so a call that reuses LOGS pools the part's rounds of every call:
#   until_cut_off SECONDS|"" PART SECTION OVERHEAD-ARGS...
until_cut_off() {
    local seconds=$1 part=$2 section=$3
    shift 3
    local limit=$(left)
    if [ -n "$seconds" ] && [ "$seconds" -lt "$limit" ]; then
        limit=$seconds
    fi
    timeout "$limit" "$dir/overhead" --bench "$section" "$@" --rounds=1000 --round-seconds=1 --block-steps=2 \
        --save-rounds="$logs/rounds_$part.tsv" >"$logs/$part.md" 2>&1
    echo "## $part: exit $? (124: cut off at UNTIL or its own limit, as planned); every round in $logs/rounds_$part.tsv:"
    if [ -s "$logs/rounds_$part.tsv" ]; then
        "$dir/overhead" --pool-rounds "$logs/rounds_$part.tsv" 2>&1
    else
        echo "none: no round finished (or no such device here: $logs/$part.md)"
    fi
}

# The parts with a section of their own, and the pattern of those that run
# one target until UNTIL or PART:SECONDS.
parts=" suite step heavy queues anchor "
one_target='^(count|attribution)-(mlp|lstm)-(cpu|cuda)$'
for part in "$@"; do
    if [[ ${part%%:*} =~ $one_target ]]; then
        if [[ $part == *:* ]] && ! [[ ${part#*:} =~ ^[1-9][0-9]*$ ]]; then
            echo "scripts/gpu-targets.sh: $part: the seconds after the colon must be a whole number above 0" >&2
            exit 2
        fi
    elif [[ $part == *:* || $parts != *" $part "* ]]; then
        echo "scripts/gpu-targets.sh: no part named $part (${parts:1:-1}, or KIND-STEP-DEVICE[:SECONDS]: count or attribution, mlp or lstm, cpu or cuda)" >&2
        exit 2
    fi
done
# libtorch's libraries, from the Python that has torch, once the parts are known.
export LD_LIBRARY_PATH="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for part in "$@"; do
    if [ "$(left)" -le 5 ]; then
        echo "## $part: not run, no time left before UNTIL=$until"
        continue
    fi
    seconds=
    if [[ $part == *:* ]]; then
        seconds=${part#*:}
        part=${part%%:*}
    fi
    case $part in
        suite) suite ;;
        step | heavy | queues) bench "$part" ;;
        anchor)
            PYTHONUNBUFFERED=1 timeout "$(left)" python3 "$dir/pytorch_step.py" >"$logs/anchor.md" 2>&1
            echo "## PyTorch's anchor: exit $?"
            cat "$logs/anchor.md"
            ;;
        *)
            [[ $part =~ $one_target ]]
            kind=${BASH_REMATCH[1]} step=${BASH_REMATCH[2]} device=${BASH_REMATCH[3]}
            only=--target-only section=step
            [ "$kind" = attribution ] && only=--attribution-only
            [ "$step" = lstm ] && section=heavy
            until_cut_off "$seconds" "$part" "$section" "$only" --devices="$device" \
                --save-blocks="$logs/blocks_$part.tsv"
            ;;
    esac
done
