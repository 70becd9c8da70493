"""Anchor for benches/overhead.rs: the same CUDA training steps in PyTorch,
plain and under PyTorch's own allocation history recording
(torch.cuda.memory._record_memory_history) with Python stacks and with all
(Python and C++) stacks. Prints a Markdown table per model: ratios to plain,
median with min and max over rounds that alternate the variants, and the
cost per allocator event.

    python3 benches/anchors/pytorch_step.py [--model mlp|lstm|all] [--rounds 21] [--steps 40]

Each round runs every variant for about 0.3 s of the plain step (at least
3 steps, at most --steps), as benches/overhead.rs's rounds do. With 40
steps a round for every model, the LSTM step's 21 rounds took most of the
anchor's 170 s on an H100, more than the step section it anchors.

- mlp: MLP 1024-4096-4096-10, batch 256, Adam (GPU-bound, few events).
- lstm: an LSTM cell unrolled over 64 time steps at batch 8, input and
  hidden size 256, a linear head, cross-entropy, Adam: the allocation-heavy
  step of benches/overhead.rs, op for op.
"""
import argparse
import statistics
import time

import torch


def build_mlp(device):
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    y = torch.randint(0, 10, (256,), device=device)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return step, "One training step (MLP 1024-4096-4096-10, batch 256, Adam)"


LSTM_SHAPE = (64, 8, 256, 256)  # time steps, batch, input, hidden


def build_lstm(device):
    steps, batch, inputs, hidden = LSTM_SHAPE
    bound = hidden**-0.5

    def parameter(*shape):
        return torch.nn.Parameter(torch.empty(*shape, device=device).uniform_(-bound, bound))

    w_ih, w_hh, bias = parameter(inputs, 4 * hidden), parameter(hidden, 4 * hidden), parameter(4 * hidden)
    head = torch.nn.Linear(hidden, 10).to(device)
    optimizer = torch.optim.Adam([w_ih, w_hh, bias, *head.parameters()], lr=1e-3)
    x = torch.randn(steps, batch, inputs, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        optimizer.zero_grad()
        h = torch.zeros(batch, hidden, device=device)
        c = torch.zeros(batch, hidden, device=device)
        for t in range(steps):
            gates = x[t] @ w_ih + h @ w_hh + bias
            i, f, g, o = gates.chunk(4, 1)
            i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
            c = f * c + i * g
            h = o * c.tanh()
        loss = torch.nn.functional.cross_entropy(head(h), y)
        loss.backward()
        optimizer.step()

    return step, (
        f"An allocation-heavy step (LSTM cell unrolled over {steps} time steps, batch {batch}, "
        f"input {inputs}, hidden {hidden}, Adam)"
    )


# Seconds of the plain step per variant in a round, as benches/overhead.rs.
ROUND_SECONDS = 0.3


def timed(step, steps, stacks):
    if stacks is not None:
        torch.cuda.memory._record_memory_history(enabled="all", stacks=stacks)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / steps
    if stacks is not None:
        torch.cuda.memory._record_memory_history(enabled=None)
    return elapsed


def events_per_step(step):
    """Allocations and completed frees of one step, from the allocator's own
    trace (the events gpu-leak-test counts)."""
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=1_000_000)
    step()
    torch.cuda.synchronize()
    traces = torch.cuda.memory._snapshot()["device_traces"]
    torch.cuda.memory._record_memory_history(enabled=None)
    return sum(1 for trace in traces for entry in trace if entry["action"] in ("alloc", "free_completed"))


def anchor(build, rounds, most_steps):
    step, description = build("cuda")
    variants = [("plain", None), ('history, stacks="python"', "python"), ('history, stacks="all"', "all")]
    for _, stacks in variants:
        timed(step, 3, stacks)
    steps = min(most_steps, max(3, round(ROUND_SECONDS / timed(step, 3, None))))
    events = events_per_step(step)
    ratios = {name: [] for name, _ in variants[1:]}
    per_event = {name: [] for name, _ in variants[1:]}
    plain_times = []
    for round_index in range(rounds):
        times = {}
        for k in range(len(variants)):
            name, stacks = variants[(k + round_index) % len(variants)]
            times[name] = timed(step, steps, stacks)
        plain_times.append(times["plain"])
        for name in ratios:
            ratios[name].append(times[name] / times["plain"])
            per_event[name].append((times[name] - times["plain"]) * 1e9 / max(events, 1))
    print(f"#### PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: {description}\n")
    print(
        f"{rounds} rounds of {steps} steps per variant, alternating; plain step "
        f"{statistics.median(plain_times) * 1e3:.3f} ms (median); {events} allocator events per step "
        f"(allocations and completed frees).\n"
    )
    print("| variant | ratio to plain: median | min | max | cost per allocator event (median) |")
    print("| --- | --- | --- | --- | --- |")
    print("| plain | 1.000 | | | |")
    for name, values in ratios.items():
        print(
            f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} "
            f"| {statistics.median(per_event[name]):.0f} ns |"
        )
    print()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "lstm", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=40, help="the most steps a round")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("PyTorch anchor skipped: no CUDA device")
        return
    builds = {"mlp": build_mlp, "lstm": build_lstm}
    for name in ["mlp", "lstm"] if args.model == "all" else [args.model]:
        anchor(builds[name], args.rounds, args.steps)


if __name__ == "__main__":
    main()
