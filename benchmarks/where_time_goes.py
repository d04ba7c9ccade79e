"""Where the every-step overhead goes: one panel at a time, and each tensor measurement timed inside training.

    python benchmarks/where_time_goes.py [--steps 300] [--repeats 3] [--torch]

Prints two tables (nothing is asserted on time), and with `--torch` a third:

1. The overhead of the Inspector with only one panel due at every step (the others never due after step 0), next to
   "nothing due" (hooks attached, every panel closed) and "every panel", all advanced in lockstep with the plain
   baseline in one interleaved run, as `minitrain-inspect overhead` does.
2. Each call of `TensorPanel.measure` (activations, output gradients, parameter gradients) timed where it runs, inside
   the training step, by tensor shape: median and mean microseconds per call and per step.
3. (`--torch`) The PyTorch side of `13_overhead`: the two passes of `overhead.torch_moments` (float64 mean, then
   squared deviations summed in float64) against the one call `torch.var_mean` (mean and variance only), median
   microseconds per call on one thread, by shape. This is why the benchmark's PyTorch full set uses two passes.

BLAS is pinned to one thread for every run (threadpoolctl, through `TrainConfig.blas_threads`).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import time

import numpy as np

from minitrain_inspect import overhead
from minitrain_inspect.inspect import PANELS, TensorPanel
from minitrain_inspect.train import TrainConfig, blas_threads, run_data
from minitrain_inspect.twin import INSTALL_HINT, torch_available

NEVER = 10 ** 9  # a schedule due at step 0 only


def ablation_variants() -> dict:
    "Inspector settings by variant name: nothing due, and each panel alone at every step."
    variants = {"nothing_due": dict(schedules=dict.fromkeys(PANELS, NEVER))}
    for panel in PANELS:
        variants[f"only_{panel}"] = dict(schedules={p: 1 if p == panel else NEVER for p in PANELS})
    return variants


@contextlib.contextmanager
def registered(variants: dict):
    "Make `variants` known to `overhead.measure` for the duration of the block."
    clash = set(variants) & set(overhead.VARIANTS)
    if clash:
        raise ValueError(f"variant names already taken: {sorted(clash)}")
    overhead.VARIANTS.update(variants)
    try:
        yield
    finally:
        for name in variants:
            overhead.VARIANTS.pop(name, None)


def panel_table(config: TrainConfig, data, repeats: int) -> list[str]:
    "Overhead of each panel alone at every step, with the spread over repeats, as Markdown lines."
    extra = ablation_variants()
    names = ["baseline", "nothing_due", *(f"only_{p}" for p in PANELS), "every_step"]
    with registered(extra):
        result = overhead.measure(config, data, names, repeats)
    times = result["times"]
    lines = ["| configuration | overhead (median) | lowest to highest |", "|---|---:|---:|"]
    for name in names[1:]:
        paired = [t / b - 1 for t, b in zip(times[name], times["baseline"])]
        lines.append(f"| {name} | {100 * statistics.median(paired):+.1f}% | "
                     f"{100 * min(paired):+.1f}% to {100 * max(paired):+.1f}% |")
    base_ms = statistics.median(times["baseline"])
    steps = repeats * (config.steps - 2)
    costs = ", ".join(f"{p} {100 * s / steps * 1000 / base_ms:.1f}%" for p, s in result["cost"].items())
    lines.append("")
    lines.append(f"Baseline {base_ms:.3f} ms/step. Panel timers with every panel at every step (share of a baseline "
                 f"step): {costs}.")
    return lines


@contextlib.contextmanager
def timed_measurements():
    "Time every `TensorPanel.measure` call in the block; yields {(prefix, shape): [seconds, ...]}."
    calls, original, clock = collections.defaultdict(list), TensorPanel.measure, time.perf_counter

    def measure(self, prefix, name, x, stat=None):
        start = clock()
        try:
            return original(self, prefix, name, x, stat)
        finally:
            calls[prefix, np.shape(x)].append(clock() - start)

    TensorPanel.measure = measure
    try:
        yield calls
    finally:
        TensorPanel.measure = original


def tensor_table(config: TrainConfig, data) -> list[str]:
    "Per call and per step cost of each tensor measurement inside an every-step run, as Markdown lines."
    steps = config.steps - 2
    with timed_measurements() as calls:
        run = overhead.TrainingRun(config, data, "every_step")
        start = time.perf_counter()
        for _ in range(steps):
            run.step()
        step_ms = 1000 * (time.perf_counter() - start) / steps
    lines = ["| kind | shape | calls/step | median µs | mean µs | µs/step |", "|---|---|---:|---:|---:|---:|"]
    total = 0.0
    for (kind, shape), seconds in sorted(calls.items()):
        us = np.array(seconds) * 1e6
        per_step = us.sum() / steps
        total += per_step
        lines.append(f"| {kind} | {shape} | {len(us) / steps:.0f} | {np.median(us):.1f} | {us.mean():.1f} | "
                     f"{per_step:.0f} |")
    lines.append("")
    lines.append(f"All tensor measurements: {total:.0f} µs of a {step_ms:.3f} ms every-step step "
                 "(this run alone, not interleaved).")
    return lines


def _median_us(call, repeats: int) -> float:
    "Median microseconds of `call()` over `repeats` calls, after one call that warms up."
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def torch_moments_table(shapes=((64, 256), (256, 378)), repeats: int = 200) -> list[str]:
    "Median µs per call of `torch_moments`' two passes and of `torch.var_mean`, one PyTorch thread, as Markdown lines."
    from minitrain_inspect.twin import require_torch
    torch = require_torch()
    lines = ["| shape | torch_moments (two passes) µs | torch.var_mean µs | ratio |", "|---|---:|---:|---:|"]
    with overhead.torch_threads(1):
        for shape in shapes:
            x = torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
            two = _median_us(lambda: overhead.torch_moments(x), repeats)
            one = _median_us(lambda: torch.var_mean(x), repeats)
            lines.append(f"| {tuple(shape)} | {two:.1f} | {one:.1f} | {one / two:.1f}x |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--torch", action="store_true", help="also time torch_moments against torch.var_mean")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.repeats < 1:
        parser.error(f"needs steps >= 3 and repeats >= 1, got steps {args.steps}, repeats {args.repeats}")
    if args.torch and not torch_available():
        parser.error(f"--torch needs PyTorch, which is not installed: {INSTALL_HINT}")
    config = TrainConfig(steps=args.steps, progress=False, eval_every=args.steps, blas_threads=1)
    data = run_data(config)
    with blas_threads(1):
        print(f"# Where the every-step overhead goes ({args.repeats} repeats of {args.steps} steps, BLAS: 1 thread)\n")
        print("\n".join(panel_table(config, data, args.repeats)))
        print()
        print("\n".join(tensor_table(config, data)))
        if args.torch:
            print()
            print("\n".join(torch_moments_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
