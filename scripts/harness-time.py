"""Summarises GPU_LEAK_TEST_TIMINGS lines: the harness's own time per leak
test (wall time less the body's time and less waiting for other tests'
locks), split into its parts, as a Markdown table of medians and maxima.

    harness-time.py TIMINGS_FILE [TITLE]
"""
import json
import statistics
import sys

PARTS = [
    ("prewarm", "prewarm (CUDA one-time state, sources, hook)"),
    ("sampling", "synchronisation and sampling"),
    ("attribution", "attribution (failing tests only)"),
    ("report_writing", "report writing (JSON, page, plot, index)"),
    ("other", "other (settings, verdicts, building the report)"),
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
    own = [r["total"] - r["body"] - r["waiting"] for r in rows]
    print(f"#### Harness time per leak test: {title}\n")
    print(
        f"{len(rows)} leak tests; the harness's own time is each test's wall time (from `check*` to its files written) "
        f"less its body's time and less waiting for other tests' locks. Milliseconds.\n"
    )
    print("| part | median | max | share of the harness's total |\n| --- | --- | --- | --- |")
    total_own = sum(own) or 1.0
    for key, name in PARTS:
        values = [r[key] for r in rows]
        print(f"| {name} | {ms(statistics.median(values))} | {ms(max(values))} | {sum(values) / total_own:.0%} |")
    print(f"| **the harness's own, all parts** | **{ms(statistics.median(own))}** | **{ms(max(own))}** | 100% |")
    body = [r["body"] for r in rows]
    waiting = [r["waiting"] for r in rows]
    print(f"| (the body, for scale) | {ms(statistics.median(body))} | {ms(max(body))} | |")
    print(f"| (waiting for other leak tests) | {ms(statistics.median(waiting))} | {ms(max(waiting))} | |")
    slowest = max(rows, key=lambda r: r["total"] - r["body"] - r["waiting"])
    top = max(PARTS, key=lambda p: slowest[p[0]])
    print(
        f"\nSlowest: `{slowest['test']}` on {slowest['device']} ({slowest['verdict']}): "
        f"{ms(slowest['total'] - slowest['body'] - slowest['waiting'])} ms of its own, most of it {top[1]} "
        f"({ms(slowest[top[0]])} ms).\n"
    )


main()
