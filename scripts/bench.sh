#!/usr/bin/env bash
# Regenerates every figure in benches/RESULTS.md on this machine: the
# harness's overhead and sensitivity (CPU, and CUDA where present), then the
# PyTorch anchor where CUDA is present. Prints Markdown.
#
#   scripts/bench.sh [SECTION...]   build and run here (every section, or
#                                   the ones named: step heavy events
#                                   host-objects
#                                   capture index sensitivity false-alarms
#                                   shapes)
#   scripts/bench.sh --gpu DIR      build here into DIR/ (bench binary,
#                                   anchor, runner script) to run on a GPU
#                                   machine with DIR/bench-run.sh [SECTION...]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
binary=$(cargo bench --bench overhead --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "overhead" and m.get("executable"):
        print(m["executable"])')
if [ "${1:-}" = "--gpu" ]; then
    dir=${2:?usage: scripts/bench.sh --gpu DIR}
    mkdir -p "$dir"
    cp "$binary" "$dir/overhead"
    cp benches/anchors/pytorch_step.py "$dir/"
    cat >"$dir/bench-run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the benchmark and the PyTorch anchor with the runner's libtorch.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$dir/overhead" --bench "$@"
python3 "$dir/pytorch_step.py"
RUN
    chmod +x "$dir/bench-run.sh"
    echo "built $dir/overhead; run $dir/bench-run.sh on the GPU machine" >&2
    exit 0
fi
"$binary" --bench "$@"
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    python3 benches/anchors/pytorch_step.py
else
    echo "PyTorch anchor skipped: no CUDA device"
fi
