"""What the Inspector adds to each kind of step: the steps where only the every-step panels are due, and the steps
where the every-10 or every-25 panels are due too.

    python benchmarks/step_kinds.py [--variant default] [--steps 600]

One run of the baseline and one of the variant (`overhead.VARIANTS`, or `nothing_due`: hooks attached, no panel ever
due after step 0) advance one step at a time, alternately (the order swapped every step). Each step is timed alone by
the main thread's CPU time (`time.thread_time`), BLAS on one thread. For each kind of step, the median of the
baseline's and of the variant's steps and their difference are printed. Medians of single steps are robust to the
noise of a shared machine, where the spread of whole-run averages is often wider than the default overhead itself.
Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import statistics
import time

from minitrain_inspect import overhead
from minitrain_inspect.inspect import PANELS
from minitrain_inspect.train import TrainConfig, blas_threads, run_data

NEVER = 10 ** 9   # a schedule due at step 0 only
KINDS = {         # by the step's number: which of the default schedules (every 1, 10 and 25) are due
    "every-step panels only": lambda s: s % 10 and s % 25,
    "every-10 panels due too": lambda s: s % 10 == 0 and s % 25,
    "every-25 panels due too": lambda s: s % 25 == 0 and s % 10,
    "both due (every 50)": lambda s: s % 50 == 0,
}


def step_times(config: TrainConfig, data, variant: str) -> dict[str, list[float]]:
    "Seconds of CPU time of each timed step (1 to steps - 2) of the baseline and of `variant`, advanced alternately."
    runs = {"baseline": overhead.TrainingRun(config, data, "baseline"),
            variant: overhead.TrainingRun(config, data, variant)}
    times = {name: [] for name in runs}
    for step in range(1, config.steps - 1):
        for name in (list(runs) if step % 2 else list(runs)[::-1]):
            start = time.thread_time()
            runs[name].step()
            times[name].append(time.thread_time() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="default", help="a variant of overhead.VARIANTS, or nothing_due")
    parser.add_argument("--steps", type=int, default=600, help="steps per run (default 600)")
    args = parser.parse_args(argv)
    overhead.VARIANTS.setdefault("nothing_due", dict(schedules=dict.fromkeys(PANELS, NEVER)))
    config = TrainConfig(steps=args.steps, progress=False)
    with blas_threads(1):
        times = step_times(config, run_data(config), args.variant)
    print(f"{args.variant} against the baseline, {args.steps} steps each, BLAS on 1 thread, CPU time of single steps:")
    for kind, due in KINDS.items():
        picked = {name: [t for step, t in enumerate(ts, start=1) if due(step)] for name, ts in times.items()}
        if not picked["baseline"]:
            continue
        base, mine = (1e6 * statistics.median(picked[name]) for name in ("baseline", args.variant))
        print(f"  {kind:24s} ({len(picked['baseline']):3d} steps): baseline {base:7.0f} µs, {args.variant} {mine:7.0f} µs, "
              f"{mine - base:+6.0f} µs ({100 * (mine / base - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
