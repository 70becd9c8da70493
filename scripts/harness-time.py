"""Summarises GPU_LEAK_TEST_TIMINGS lines: the harness's own time per leak
test (wall time less the body's time, less waiting for other tests' locks,
less CUDA's own start-up), split into its parts, as a Markdown table of
medians and maxima. Given the suite's nextest log with each line stamped
with the seconds since the run began (`--status-level pass`, as
`scripts/gpu-targets.sh suite` writes it), it also lists the suite's first
wave: the tests nextest started first, with when each started and ended,
and for a leak test its CUDA start-up and the harness's own time; then
every test that ran beside each of the slowest leak tests.

    harness-time.py TIMINGS_FILE [TITLE [STAMPED_SUITE_LOG]]
"""
import json
import re
import statistics
import sys

# Timed on a thread of their own beside the test thread's parts (the device
# thread's part on a device's first prewarm, which is every test's under
# nextest): not shares of the harness's own time, nor its largest part.
BESIDE = {"prewarm_nvml_and_cupti", "cuda_state_autograd_worker", "cuda_state_device_queue"}

PARTS = [
    ("prewarm", "prewarm (settings, device, CUDA one-time state, sources, hook), less CUDA's start-up"),
    ("prewarm_settings", "… of it: settings and device, less CUDA's start-up"),
    ("prewarm_libtorch_check", "… of it: the loaded libtorch's version check"),
    ("prewarm_cpu_size_table", "… of it: libtorch's table of profiled CPU blocks grown"),
    ("prewarm_cuda_state", "… of it: CUDA's one-time state (cuBLAS handles, autograd's device thread, its ready queue and the caller's; NVML's and CUPTI's start-ups beside them), less CUDA's start-up"),
    ("cuda_state_cublas_here", "… … of it: the test thread's cuBLAS and cuBLASLt handles and workspaces"),
    ("cuda_state_callers_queue", "… … of it: growing the test thread's own autograd ready queue"),
    ("cuda_state_waiting_beside", "… … of it: waiting for the thread beside, past the two above (on a later prewarm in a process, its part run here)"),
    ("cuda_state_autograd_worker", "… … beside it: autograd's device thread (started by a backward where it had not run) and its cuBLAS state"),
    ("cuda_state_device_queue", "… … beside it, after that: growing the device thread's ready queue"),
    ("prewarm_nvml_and_cupti", "… … beside it: NVML's and CUPTI's start-ups, on a thread of their own that it waits for (CUDA's start-up, which runs meanwhile, not taken out)"),
    ("prewarm_sources", "… of it: the sources (CPU allocator, trace tracker, CUPTI, hook)"),
    ("prewarm_canaries", "… of it: every layer's canary"),
    ("canary_tensors", "… … of them: tensors' (a tensor on the CPU and on the device; the pinned host allocator emptied around a block)"),
    ("canary_host_objects", "… … of them: libtorch's C++ heap's (a CPU tensor's records)"),
    ("canary_outside_libtorch", "… … of them: memory outside libtorch's (a block straight from the CUDA driver)"),
    ("canary_rust_heap", "… … of them: the Rust heap's"),
    ("sampling", "synchronisation and sampling"),
    ("sampling_settle", "… of it: settling the layers (a CUDA test's autograd wake-ups drained)"),
    ("sampling_synchronize", "… of it: synchronising the device"),
    ("sampling_driver", "… of it: the driver's views before and after the window (cudaMemGetInfo, NVML)"),
    ("sampling_host_heap", "… of it: the host heap in use (glibc's count)"),
    ("attribution", "attribution (failing tests only)"),
    ("attribution_naming", "… of it: grouping the survivors by site and naming their frames"),
    ("report_writing", "report writing (JSON, page, plot, index)"),
    ("other", "other (verdicts, building the report)"),
]


def ms(seconds):
    return f"{seconds * 1e3:.1f}"


def depth(part):
    """How far down a part's label is: 0 for a total, 1 for "… of it", 2 for "… … of it"."""
    label, levels = part[1], 0
    while label.startswith("… "):
        label, levels = label[2:], levels + 1
    return levels


def shares(parent):
    """The parts one level below `parent` that are shares of it, not the
    ones timed beside it on a thread of their own."""
    found = []
    for part in PARTS[PARTS.index(parent) + 1:]:
        if depth(part) <= depth(parent):
            break
        label = part[1].lstrip("… ")
        if depth(part) == depth(parent) + 1 and label.startswith(("of it", "of them")):
            found.append(part)
    return found


def own(r):
    """The harness's own time of a timing line: its wall time less its
    body's, less waiting for other tests, less CUDA's own start-up."""
    return r["total"] - r["body"] - r["waiting"] - r["cuda_startup"]


# A test's line in a stamped nextest log: the stamp, the status, nextest's
# duration, the binary and the test's name.
TEST_LINE = re.compile(
    r"^\s*([\d.]+)\s+(PASS|FAIL|LEAK|LEAK-FAIL|SIGSEGV|SIGABRT|ABORT|TIMEOUT)\s+\[\s*([\d.]+)s\]\s+"
    r"(?:\(\s*\d+/\d+\)\s+)?(\S+)\s+(.+?)\s*$"
)


# The stamped log's first line: when its stamps count from.
STAMPS_FROM = re.compile(r"^# stamps: seconds since ([\d.]+) on the Unix clock")


def stamped_tests(log_path):
    """Every test line of a stamped suite log: (started, ended, status,
    binary, name), started being when its line came less the duration
    nextest gives, in the order the tests started; and the Unix time the
    stamps count from, where the log says it."""
    tests, stamps_from = [], None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for text in f:
            m = TEST_LINE.match(text)
            if m:
                ended, took = float(m[1]), float(m[3])
                tests.append((ended - took, ended, m[2], m[4].split("::")[-1], m[5]))
            elif stamps_from is None and (m := STAMPS_FROM.match(text)):
                stamps_from = float(m[1])
    if not tests:
        sys.exit(f"{log_path}: no test lines (was the suite run with --status-level pass, its lines stamped?)")
    tests.sort()
    return tests, stamps_from


def placed(r, stamps_from):
    """A timing line's (started, ended) on the log's stamps, where both say
    when: a line of a name several runs share is placed too."""
    if stamps_from is None or "ended_unix" not in r:
        return None
    ended = r["ended_unix"] - stamps_from
    return ended - r["total"], ended


def test_rows(tests, timed, zero):
    """Table rows for `tests`; a test with a timing line is a leak test,
    matched by name: a name two binaries share marks both."""
    print("| started | ended | status | binary | test | leak test: CUDA's start-up, the harness's own |")
    print("| --- | --- | --- | --- | --- | --- |")
    for started, ended, status, binary, name in tests:
        r = timed.get(name)
        leak = f"{ms(r['cuda_startup'])} ms, {ms(own(r))} ms" if r else ""
        print(f"| {started - zero:.2f} | {ended - zero:.2f} | {status} | {binary} | `{name}` | {leak} |")
    print()


def first_wave(log_path, rows, count=24, slowest=3):
    """The first `count` tests of a stamped suite log to start, then for
    each of the `slowest` leak tests by the harness's own time, every test
    that ran while it ran: what its driver calls may have waited on."""
    timed = {r["test"]: r for r in rows}
    tests, stamps_from = stamped_tests(log_path)
    zero = tests[0][0]
    print(f"The first {count} tests to start (seconds since the run's first test started):\n")
    test_rows(tests[:count], timed, zero)
    # Leak tests that a test runs as children write timing lines only.
    suite_names = {t[4] for t in tests}
    for r in sorted(rows, key=own, reverse=True)[:slowest]:
        if (window := placed(r, stamps_from)) is not None:
            started, ended = window
            # Its own suite line holds its window; any other that overlaps it ran beside it.
            beside = [t for t in tests if t[0] < ended and t[1] > started and not (t[4] == r["test"] and t[0] <= started and t[1] >= ended)]
            children = sorted([(w, o) for o in rows if o is not r and o["test"] not in suite_names
                               and (w := placed(o, stamps_from)) and w[0] < ended and w[1] > started],
                              key=lambda child: child[0])
            print(f"Beside `{r['test']}` ({ms(own(r))} ms of its own, CUDA's start-up {ms(r['cuda_startup'])} ms, "
                  f"{started - zero:.2f} to {ended - zero:.2f} s, placed by its timing line): the {len(beside)} tests "
                  f"that ran while it ran, and {len(children)} leak tests run as children.\n")
            test_rows(beside, timed, zero)
            if children:
                print("| started | ended | child leak test | CUDA's start-up | the harness's own |\n| --- | --- | --- | --- | --- |")
                for w, o in children:
                    print(f"| {w[0] - zero:.2f} | {w[1] - zero:.2f} | `{o['test']}` | {ms(o['cuda_startup'])} ms | {ms(own(o))} ms |")
                print()
            continue
        mine = [t for t in tests if t[4] == r["test"]]
        lines = sum(1 for other in rows if other["test"] == r["test"])
        if len(mine) != 1 or lines != 1:
            # The runner-parity tests' children write timing lines under
            # the names nextest runs too, and two binaries may share one.
            print(f"`{r['test']}` ({ms(own(r))} ms of its own): {lines} timing lines and {len(mine)} suite lines of "
                  f"that name, so which run it was is unknown, and none is listed beside it.\n")
            continue
        started, ended = mine[0][0], mine[0][1]
        beside = [t for t in tests if t is not mine[0] and t[0] < ended and t[1] > started]
        print(f"Beside `{r['test']}` ({ms(own(r))} ms of its own, CUDA's start-up {ms(r['cuda_startup'])} ms, "
              f"{started - zero:.2f} to {ended - zero:.2f} s): the {len(beside)} tests that ran while it ran.\n")
        test_rows(beside, timed, zero)


def main():
    path = sys.argv[1]
    title = sys.argv[2] if len(sys.argv) > 2 else path
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        sys.exit(f"{path}: no timing lines (was GPU_LEAK_TEST_TIMINGS set for the run?)")
    for r in rows:
        # Lines from older builds lack the parts added since.
        for key in ["cuda_startup", "waited_in_parent"] + [key for key, _ in PARTS]:
            r.setdefault(key, 0.0)
        r["prewarm"] -= r["cuda_startup"]
        # CUDA's start-up falls in whichever part first touched CUDA: the
        # device's resolution, else the one-time state.
        left = r["cuda_startup"]
        for key in ("prewarm_settings", "prewarm_cuda_state"):
            taken = min(left, r[key])
            r[key] -= taken
            left -= taken
    owns = [own(r) for r in rows]
    print(f"#### Harness time per leak test: {title}\n")
    print(
        f"{len(rows)} leak tests; the harness's own time is each test's wall time (from `check*` to its files written) "
        f"less its body's time, less waiting for other tests' locks, and less CUDA's own start-up (libtorch's CUDA "
        f"library, the driver, the device's context: what the body would pay in its first iteration). Milliseconds.\n"
    )
    print("| part | median | max | share of the harness's total |\n| --- | --- | --- | --- |")
    total_own = sum(owns) or 1.0
    # The prewarm's parts are shares of it, not of the total on top.
    for key, name in PARTS:
        values = [r[key] for r in rows]
        share = "beside, not a share" if key in BESIDE else f"{sum(values) / total_own:.0%}"
        print(f"| {name} | {ms(statistics.median(values))} | {ms(max(values))} | {share} |")
    print(f"| **the harness's own, all parts** | **{ms(statistics.median(owns))}** | **{ms(max(owns))}** | 100% |")
    for key, name in [("cuda_startup", "(CUDA's start-up, where the test paid it)"), ("body", "(the body, for scale)"),
                      ("waiting", "(waiting for other leak tests)"),
                      ("waited_in_parent", "(waiting for a CUDA turn under plain cargo test, before the test's process started)")]:
        values = [r[key] for r in rows]
        print(f"| {name} | {ms(statistics.median(values))} | {ms(max(values))} | |")
    slowest = max(rows, key=own)
    top = max((p for p in PARTS if depth(p) == 0), key=lambda p: slowest[p[0]])
    # Its largest share one level down, and that one's, while they have
    # shares: which call waited. Lines from older builds lack the parts
    # added since, all zero, and a share of nothing names nothing.
    below, parent = "", top
    for lead in (", the largest share of which", "; most of that"):
        part = max(shares(parent), key=lambda p: slowest[p[0]], default=None)
        if part is None or slowest[part[0]] <= 0:
            break
        below += f"{lead} {part[1].split(': ', 1)[1]} ({ms(slowest[part[0]])} ms)"
        parent = part
    print(
        f"\nSlowest: `{slowest['test']}` on {slowest['device']} ({slowest['verdict']}): "
        f"{ms(own(slowest))} ms of its own, "
        f"most of it {top[1]} ({ms(slowest[top[0]])} ms){below}.\n"
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
        group = [(r, o) for r, o in zip(rows, owns) if member(r)]
        if group:
            values = [o for _, o in group]
            state = [r["prewarm_cuda_state"] for r, _ in group]
            print(f"| {label} | {len(group)} | {ms(statistics.median(values))} | {ms(max(values))} | {ms(statistics.median(state))} |")
    print()
    if len(sys.argv) > 3:
        first_wave(sys.argv[3], rows)


main()
