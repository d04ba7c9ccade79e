"""Where the every-step overhead goes: one panel at a time, and each tensor measurement timed inside training.

    python benchmarks/where_time_goes.py [--steps 300] [--repeats 3]

Prints two tables (nothing is asserted on time):

1. The overhead of the Inspector with only one panel due at every step (the others never due after step 0), next to
   "nothing due" (hooks attached, every panel closed) and "every panel", all advanced in lockstep with the plain
   baseline in one interleaved run, as `minitrain-inspect overhead` does.
2. Each call of `TensorPanel.measure` (activations, output gradients, parameter gradients) timed where it runs, inside
   the training step, by tensor shape: median and mean microseconds per call and per step.

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.repeats < 1:
        parser.error(f"needs steps >= 3 and repeats >= 1, got steps {args.steps}, repeats {args.repeats}")
    config = TrainConfig(steps=args.steps, progress=False, eval_every=args.steps, blas_threads=1)
    data = run_data(config)
    with blas_threads(1):
        print(f"# Where the every-step overhead goes ({args.repeats} repeats of {args.steps} steps, BLAS: 1 thread)\n")
        print("\n".join(panel_table(config, data, args.repeats)))
        print()
        print("\n".join(tensor_table(config, data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
