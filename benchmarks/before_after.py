"""Before and after a change, in one interleaved run: the Inspector's overhead from another copy of the package against
this one's, each against the same baseline, advanced in lockstep.

    git archive BASE minitrain_inspect | tar -x -C /tmp/base && mv /tmp/base/minitrain_inspect /tmp/base/mti_base
    python benchmarks/before_after.py /tmp/base/mti_base [--variants every_step plain_every_step] [--steps 100]
                                      [--repeats 5] [--clock cpu|wall]

The copy of the package is imported under its folder's name (the package's modules import each other relatively, so
any name works). Each repeat builds the baseline (this package, no Inspector) and, for each variant of
`overhead.VARIANTS`, a run of the copy and a run of this package; all of them advance in lockstep (blocks of 5 steps,
rotating order), BLAS pinned to one thread by threadpoolctl (`TrainConfig.blas_threads`). Printed: each run's median
overhead with the lowest and highest repeat, and the median of the paired differences (after - before) in points of a
baseline step. `--clock cpu` (default) times the main thread's CPU time, steadier on a shared machine. Nothing is
asserted on time.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

from minitrain_inspect import overhead
from minitrain_inspect.train import TrainConfig, blas_threads, run_data


def load_copy(path: str):
    "The `overhead` module of the copy of the package in folder `path`."
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "overhead.py")):
        raise SystemExit(f"{path} does not hold a copy of the package (no overhead.py)")
    if os.path.basename(path) == overhead.__name__.split(".")[0]:   # it would import this package again, not the copy
        raise SystemExit(f"{path}: rename the copy's folder (e.g. minitrain_inspect_before); under the package's own "
                         "name it would be this package, compared with itself")
    sys.path.insert(0, os.path.dirname(path))
    before = importlib.import_module(f"{os.path.basename(path)}.overhead")
    if before is overhead:
        raise SystemExit(f"{path} imported as this package itself; give the copy a folder name of its own")
    return before


def measure(before, config: TrainConfig, data, variants, repeats: int, clock) -> dict[str, list[float]]:
    "ms per step of every run, one value per repeat."
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        runs = {"baseline": overhead.TrainingRun(config, data, "baseline")}
        for variant in variants:
            runs[f"before {variant}"] = before.TrainingRun(config, data, variant)
            runs[f"after {variant}"] = overhead.TrainingRun(config, data, variant)
        for name, ms in overhead.lockstep(runs, config.steps - 2, block=5, clock=clock).items():
            times.setdefault(name, []).append(ms)
    return times


def table(times: dict[str, list[float]], variants) -> list[str]:
    "Markdown lines: each run's overhead, and each variant's paired change."
    base = times["baseline"]
    share = lambda name: [t / b - 1 for t, b in zip(times[name], base)]
    lines = ["| variant | before | after | after - before (median of pairs) |", "|---|---:|---:|---:|"]
    for variant in variants:
        b, a = share(f"before {variant}"), share(f"after {variant}")
        diff = [y - x for x, y in zip(b, a)]
        cell = lambda p: f"{100 * statistics.median(p):+.1f}% ({100 * min(p):+.1f} to {100 * max(p):+.1f})"
        lines.append(f"| {variant} | {cell(b)} | {cell(a)} | {100 * statistics.median(diff):+.1f} pts "
                     f"({100 * min(diff):+.1f} to {100 * max(diff):+.1f}) |")
    lines += ["", f"Baseline {statistics.median(base):.3f} ms/step (median of {len(base)} repeats)."]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="folder of the other copy of the package (imported under its folder's name)")
    parser.add_argument("--variants", nargs="+", default=["every_step", "plain_every_step"],
                        choices=[v for v in overhead.VARIANTS if v != "baseline"])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: the main thread's CPU time (default); wall: elapsed time")
    args = parser.parse_args(argv)
    if args.steps < 5 or args.repeats < 1:
        parser.error(f"needs steps >= 5 and repeats >= 1, got steps {args.steps}, repeats {args.repeats}")
    before = load_copy(args.before)
    config = TrainConfig(steps=args.steps + 2, progress=False, eval_every=args.steps + 2, blas_threads=1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    load = os.getloadavg()[0]
    with blas_threads(1):
        times = measure(before, config, run_data(config), args.variants, args.repeats, clock)
    print(f"# Before ({args.before}) and after (this package), {args.repeats} interleaved repeats of {args.steps} steps, "
          f"{args.clock} clock, BLAS: 1 thread\n")
    print("\n".join(table(times, args.variants)))
    print(f"\nLoad average (1 min): {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
