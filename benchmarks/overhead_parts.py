"""What the every-step overhead of `fast_inspector` is made of, found by taking its parts away one at a time.

    python benchmarks/overhead_parts.py [--steps 150] [--repeats 7] [--clock cpu|wall]

Each variant is `fast_inspector(schedules=EVERY_STEP)` with more of its work replaced by a stand-in that returns fixed
values at once (the training itself is untouched: the weights come out the same):

1. `every_step`: nothing replaced;
2. `no_moment_kernels`: `CompiledOps.moments` folds a fixed summary instead of running the lane kernel (the fold, the
   records and everything around them still run);
3. `no_kernels`: also the unit pass and the spectral half round replaced;
4. `no_records`: also every panel's `record` dropped (nothing kept, nothing flushed into the history);
5. `no_tensor_measure`: also `TensorPanel.measure` replaced (no fold, no fields);
6. `no_update_panel`: also the update panel never due after step 0 (no measure in the optimiser's step): what is left is
   the hooks' dispatch, the loss and per-class panels, and the unit and spectral panels' own Python.

The differences between neighbours say what each part costs inside training, caches as they are there (a kernel's
figure in a micro benchmark, on an array it has just read, is half or less of that). All runs advance in lockstep with
the baseline (`overhead.lockstep`, blocks of 20 steps, rotating order), BLAS on one thread. `--clock cpu` (default) times
the main thread's CPU time, which leaves out the time other jobs hold the core. Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from minitrain_inspect import overhead
from minitrain_inspect.inspect import EVERY_STEP, TensorPanel
from minitrain_inspect.panels import Histogram, UnitHealth
from minitrain_inspect.speed import CompiledOps, fast_inspector
from minitrain_inspect.stats import TensorMoments, fold_moments
from minitrain_inspect.train import TrainConfig, blas_threads, run_data, training_steps

FIXED = TensorMoments(16, 0.5, 4.0, -1.0, 2.0)   # the stand-in summary of any tensor
NO_UPDATES = {**EVERY_STEP, "updates": 10**9}     # the update panel due at step 0 only


class NoMomentKernels(CompiledOps):
    "CompiledOps whose moments fold a fixed summary: no pass over the array."

    def moments(self, state: dict, x):
        return fold_moments(state, FIXED)


class FixedSpectral:
    "A spectral estimator that reads nothing."

    def estimate(self, W) -> float:
        return 1.0


class NoKernels(NoMomentKernels):
    "Also no unit pass and no spectral half round."

    def units(self, output, kind: str, bins: int):
        return UnitHealth(0.1, 0.2), Histogram(np.full(bins, 1 / bins), 0.0, 0.0, 0)

    def spectral(self):
        return FixedSpectral()


def _with_ops(inspector, ops):
    "`inspector` measuring through `ops` (every panel)."
    inspector.ops = ops
    for panel in inspector.panels:
        panel.ops = ops
    return inspector


def _drop_records(inspector):
    for panel in inspector.panels:
        panel.record = lambda key, value, step=None: None
    return inspector


def _drop_measure(inspector):
    for panel in inspector.panels:
        if isinstance(panel, TensorPanel):
            panel.measure = lambda prefix, name, x, stat=None: FIXED
    return inspector


VARIANTS = {
    "baseline": None,
    "every_step": lambda: fast_inspector(schedules=EVERY_STEP),
    "no_moment_kernels": lambda: _with_ops(fast_inspector(schedules=EVERY_STEP), NoMomentKernels()),
    "no_kernels": lambda: _with_ops(fast_inspector(schedules=EVERY_STEP), NoKernels()),
    "no_records": lambda: _drop_records(_with_ops(fast_inspector(schedules=EVERY_STEP), NoKernels())),
    "no_tensor_measure": lambda: _drop_measure(_drop_records(_with_ops(fast_inspector(schedules=EVERY_STEP), NoKernels()))),
    "no_update_panel": lambda: _drop_measure(_drop_records(_with_ops(fast_inspector(schedules=NO_UPDATES), NoKernels()))),
}
PARTS = (("the moment kernels (activations, gradients)", "every_step", "no_moment_kernels"),
         ("the unit pass and the spectral half round", "no_moment_kernels", "no_kernels"),
         ("recording (record, flush, history)", "no_kernels", "no_records"),
         ("the tensor measurements' Python (fold, fields)", "no_records", "no_tensor_measure"),
         ("the update panel (its measure inside the optimiser's step)", "no_tensor_measure", "no_update_panel"),
         ("the rest (dispatch, loss, per-class, the unit and spectral panels' Python)", "no_update_panel", "baseline"))


class Run:
    "A training run with the Inspector of `make()` (None: no Inspector), built and step 0 run before any timing."

    def __init__(self, config: TrainConfig, data, make):
        self.inspector = make() if make is not None else None
        self._run = training_steps(config, data=data, inspector=self.inspector)
        next(self._run)

    def step(self) -> None:
        next(self._run)


def measure(steps: int, repeats: int, clock) -> dict[str, list[float]]:
    "ms per step of each variant, one value per repeat, all variants advanced in lockstep within a repeat."
    config = TrainConfig(steps=steps + 2, progress=False, eval_every=steps + 2, blas_threads=1)
    data = run_data(config)
    times = {name: [] for name in VARIANTS}
    with blas_threads(1):
        for _ in range(repeats):
            runs = {name: Run(config, data, make) for name, make in VARIANTS.items()}
            for name, ms in overhead.lockstep(runs, steps, clock=clock).items():
                times[name].append(ms)
    return times


def table(times: dict[str, list[float]]) -> list[str]:
    "Each variant's overhead, then each part's share of a baseline step, as Markdown lines."
    base = times["baseline"]
    paired = {name: [t / b - 1 for t, b in zip(values, base)] for name, values in times.items()}
    lines = ["| variant | overhead (median) | lowest to highest |", "|---|---:|---:|"]
    for name in list(VARIANTS)[1:]:
        p = paired[name]
        lines.append(f"| {name} | {100 * statistics.median(p):+.1f}% | {100 * min(p):+.1f}% to {100 * max(p):+.1f}% |")
    lines += ["", "| part | share of a baseline step (median of paired differences) |", "|---|---:|"]
    for label, more, less in PARTS:
        diff = [a - b for a, b in zip(paired[more], paired[less])]
        lines.append(f"| {label} | {100 * statistics.median(diff):+.1f} pts |")
    lines += ["", f"Baseline {statistics.median(base):.3f} ms/step."]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run (default 150)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (default 7)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: the main thread's CPU time (default); wall: elapsed time")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error(f"needs steps >= 1 and repeats >= 1, got steps {args.steps}, repeats {args.repeats}")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    times = measure(args.steps, args.repeats, clock)
    print(f"# What the every-step overhead is made of ({args.repeats} repeats of {args.steps} steps, BLAS: 1 thread, "
          f"clock: {args.clock})\n")
    print("\n".join(table(times)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
