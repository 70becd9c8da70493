"""Summarises GPU_LEAK_TEST_TIMINGS lines: the harness's own time per leak
test (wall time less the body's time, less waiting for other tests' locks,
less CUDA's own start-up), split into its parts, as a Markdown table of
medians and maxima.

    harness-time.py TIMINGS_FILE [TITLE]
"""
import json
import statistics
import sys

PARTS = [
    ("prewarm", "prewarm (settings, device, CUDA one-time state, sources, hook), less CUDA's start-up"),
    ("prewarm_settings", "… of it: settings and device, less CUDA's start-up"),
    ("prewarm_libtorch_check", "… of it: the loaded libtorch's version check"),
    ("prewarm_cuda_state", "… of it: CUDA's one-time state (cuBLAS handles, autograd's device thread; NVML's and CUPTI's start-ups beside them), less CUDA's start-up"),
    ("prewarm_sources", "… of it: the sources (CPU allocator, trace tracker, CUPTI, hook)"),
    ("prewarm_canaries", "… of it: every layer's canary"),
    ("sampling", "synchronisation and sampling"),
    ("attribution", "attribution (failing tests only)"),
    ("attribution_naming", "… of it: grouping the survivors by site and naming their frames"),
    ("report_writing", "report writing (JSON, page, plot, index)"),
    ("other", "other (verdicts, building the report)"),
]


def ms(seconds):
    return f"{seconds * 1e3:.1f}"


def main():
    path = sys.argv[1]
    title = sys.argv[2] if len(sys.argv) > 2 else path
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        sys.exit(f"{path}: no timing lines (was GPU_LEAK_TEST_TIMINGS set for the run?)")
    for r in rows:
        r.setdefault("cuda_startup", 0.0)
        r.setdefault("attribution_naming", 0.0)
        r.setdefault("waited_in_parent", 0.0)
        r["prewarm"] -= r["cuda_startup"]
        # CUDA's start-up falls in whichever part first touched CUDA: the
        # device's resolution, else the one-time state.
        for key in ("prewarm_settings", "prewarm_libtorch_check", "prewarm_cuda_state", "prewarm_sources", "prewarm_canaries"):
            r.setdefault(key, 0.0)
        left = r["cuda_startup"]
        for key in ("prewarm_settings", "prewarm_cuda_state"):
            taken = min(left, r[key])
            r[key] -= taken
            left -= taken
    own = [r["total"] - r["body"] - r["waiting"] - r["cuda_startup"] for r in rows]
    print(f"#### Harness time per leak test: {title}\n")
    print(
        f"{len(rows)} leak tests; the harness's own time is each test's wall time (from `check*` to its files written) "
        f"less its body's time, less waiting for other tests' locks, and less CUDA's own start-up (libtorch's CUDA "
        f"library, the driver, the device's context: what the body would pay in its first iteration). Milliseconds.\n"
    )
    print("| part | median | max | share of the harness's total |\n| --- | --- | --- | --- |")
    total_own = sum(own) or 1.0
    # The prewarm's parts are shares of it, not of the total on top.
    for key, name in PARTS:
        values = [r[key] for r in rows]
        print(f"| {name} | {ms(statistics.median(values))} | {ms(max(values))} | {sum(values) / total_own:.0%} |")
    print(f"| **the harness's own, all parts** | **{ms(statistics.median(own))}** | **{ms(max(own))}** | 100% |")
    for key, name in [("cuda_startup", "(CUDA's start-up, where the test paid it)"), ("body", "(the body, for scale)"),
                      ("waiting", "(waiting for other leak tests)"),
                      ("waited_in_parent", "(waiting for a CUDA turn under plain cargo test, before the test's process started)")]:
        values = [r[key] for r in rows]
        print(f"| {name} | {ms(statistics.median(values))} | {ms(max(values))} | |")
    slowest = max(rows, key=lambda r: r["total"] - r["body"] - r["waiting"] - r["cuda_startup"])
    top = max(PARTS, key=lambda p: slowest[p[0]])
    print(
        f"\nSlowest: `{slowest['test']}` on {slowest['device']} ({slowest['verdict']}): "
        f"{ms(slowest['total'] - slowest['body'] - slowest['waiting'] - slowest['cuda_startup'])} ms of its own, "
        f"most of it {top[1]} ({ms(slowest[top[0]])} ms).\n"
    )
    # A CUDA test pays CUDA's one-time state in its own process under
    # nextest; a CPU test never does: their medians apart.
    print("| tests on | count | the harness's own: median | max | of it, CUDA's one-time state: median |\n| --- | --- | --- | --- | --- |")
    # Attribution runs only after a leak: passing tests apart from failing.
    groups = [
        ("the CPU", lambda r: r["device"] == "cpu"),
        ("CUDA", lambda r: r["device"] != "cpu"),
        ("CUDA, passing (no attribution)", lambda r: r["device"] != "cpu" and r["attribution"] == 0),
        ("CUDA, failing (attribution)", lambda r: r["device"] != "cpu" and r["attribution"] > 0),
        # Where many processes start CUDA at once, every driver call waits.
        ("CUDA, passing, CUDA's start-up under 1 s", lambda r: r["device"] != "cpu" and r["attribution"] == 0 and r["cuda_startup"] < 1.0),
        ("CUDA, failing, CUDA's start-up under 1 s", lambda r: r["device"] != "cpu" and r["attribution"] > 0 and r["cuda_startup"] < 1.0),
        ("every test whose process started CUDA in under 1 s, or never", lambda r: r["cuda_startup"] < 1.0),
    ]
    for label, member in groups:
        group = [(r, o) for r, o in zip(rows, own) if member(r)]
        if group:
            values = [o for _, o in group]
            state = [r["prewarm_cuda_state"] for r, _ in group]
            print(f"| {label} | {len(group)} | {ms(statistics.median(values))} | {ms(max(values))} | {ms(statistics.median(state))} |")
    print()


main()
