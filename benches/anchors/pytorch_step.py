"""Anchor for benches/overhead.rs: the same CUDA training step in PyTorch,
plain and under PyTorch's own allocation history recording
(torch.cuda.memory._record_memory_history) with Python stacks and with all
(Python and C++) stacks. Prints a Markdown table of ratios to plain, median
with min and max over rounds that alternate the variants.

    python3 benches/anchors/pytorch_step.py [--rounds 21] [--steps 40]
"""
import argparse
import statistics
import time

import torch


def build(device):
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

    return step


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("PyTorch anchor skipped: no CUDA device")
        return
    step = build("cuda")
    variants = [("plain", None), ('history, stacks="python"', "python"), ('history, stacks="all"', "all")]
    for _, stacks in variants:
        timed(step, 3, stacks)
    ratios = {name: [] for name, _ in variants[1:]}
    plain_times = []
    for round_index in range(args.rounds):
        times = {}
        for k in range(len(variants)):
            name, stacks = variants[(k + round_index) % len(variants)]
            times[name] = timed(step, args.steps, stacks)
        plain_times.append(times["plain"])
        for name in ratios:
            ratios[name].append(times[name] / times["plain"])
    print(f"### PyTorch {torch.__version__} anchor on {torch.cuda.get_device_name()}\n")
    print(
        f"{args.rounds} rounds of {args.steps} steps per variant, alternating; "
        f"plain step {statistics.median(plain_times) * 1e3:.3f} ms (median).\n"
    )
    print("| variant | ratio to plain: median | min | max |\n| --- | --- | --- | --- |")
    print("| plain | 1.000 | | |")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    print()


if __name__ == "__main__":
    main()
