"""The PyTorch Inspector's overhead, by part: its variants against PyTorch alone, and aten operations counted per step.

    python benchmarks/torch_overhead_parts.py [--steps 120] [--repeats 5] [--widths 64 256] [--old PATH] [--clock wall|cpu]

Variants, each on the PyTorch twin of the reference model (`13_overhead`'s `TorchRun`), advanced in lockstep with
PyTorch alone (`overhead.lockstep`, blocks of 20 steps, rotating order), PyTorch and BLAS pinned to one thread
(`torch_threads`, `threadpoolctl`): the Inspector at default schedules, with every panel at every step, and disabled.
`--old PATH` adds the same three variants of another copy of `torch_inspect.py` (for example the module before a
change, copied to a scratch folder), so old and new are measured side by side in one run. `--clock cpu` times the main
thread's CPU time (`13_overhead`'s `CLOCKS`), steadier on a shared machine.

Printed: per width, the median overhead over PyTorch alone with the lowest and highest repeat, the load average before
and after; and the aten operations per training step of each variant (counted by a `TorchDispatchMode` over steps 3..52, the period of every default schedule:
a deterministic figure that the machine's load does not move). Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
from dataclasses import replace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minitrain_inspect import torch_inspect
from minitrain_inspect.inspect import EVERY_STEP, register_adapter
from minitrain_inspect.overhead import CLOCKS, TorchRun, lockstep, torch_threads
from minitrain_inspect.train import TrainConfig, blas_threads, run_data

OPTIONS = {"default": {}, "every_step": {"schedules": EVERY_STEP}, "disabled": {"enabled": False}}


def load_old(path: str):
    "The module at `path` as `minitrain_inspect._old_torch_inspect` (its relative imports resolve in the package)."
    spec = importlib.util.spec_from_file_location("minitrain_inspect._old_torch_inspect", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    register_adapter("torch", torch_inspect.is_torch_module, torch_inspect.TorchInspector)   # the new one stays registered
    return module


class Watcher:
    "An Inspector of class `cls` as a `TorchRun` watcher (as `torch_inspect.InspectorWatcher`, class fixed)."

    def __init__(self, cls, **options):
        self.cls, self.options, self.inspector = cls, options, None

    def attach(self, model, optimizer):
        register_adapter("torch", torch_inspect.is_torch_module, self.cls)     # `Inspector.__new__` builds the registered class
        try:
            self.inspector = self.cls(model, optimizer=optimizer, **self.options).attach()
        finally:
            register_adapter("torch", torch_inspect.is_torch_module, torch_inspect.TorchInspector)
        return self

    def loss(self, value, per_example, regular) -> None:
        if not self.inspector.enabled:
            return
        if regular is not None:
            self.inspector.label_batch(torch.from_numpy(np.asarray(regular, dtype=np.int64)), names=("irregular", "regular"))
        self.inspector.record_loss(per_example.mean(), per_example)

    def remove(self) -> None:
        self.inspector.remove_all()


class CountOps(TorchDispatchMode):
    "Counts the aten operations dispatched while active."

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def variants(old) -> dict:
    "{name: watcher factory or None}: PyTorch alone, then the new module's variants, then the old one's if given."
    out = {"torch": None}
    for label, module in (("new", torch_inspect), ("old", old)):
        if module is not None:
            out.update({f"{label}_{k}": functools.partial(Watcher, module.TorchInspector, **o) for k, o in OPTIONS.items()})
    return out


class Run(TorchRun):
    WATCHERS = {}


def ops_per_step(config, data, name, factory, steps: int = 50) -> float:
    "Aten operations per training step of one variant, over `steps` steps after 3 warm-up steps (50: every default schedule's period)."
    Run.WATCHERS = {name: factory}
    run = Run(config, data, name)
    for _ in range(2):
        run.step()
    steps = min(steps, config.steps - 4)     # as many as the run has left
    with CountOps() as counter:
        for _ in range(steps):
            run.step()
    return counter.count / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats (0: count the operations only)")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--old", default=None, help="path of another torch_inspect.py to measure beside this one")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall", help="wall: elapsed time; cpu: the main thread's CPU time")
    args = parser.parse_args(argv)
    old = load_old(args.old) if args.old else None
    table = variants(old)
    config = TrainConfig(steps=args.steps, progress=False, eval_every=args.steps, blas_threads=1)
    data = run_data(config)
    print(f"torch {torch.__version__}, 1 torch thread, BLAS 1 thread (threadpoolctl); {args.repeats} interleaved repeats "
          f"of {args.steps} steps, clock {args.clock}; load before {os.getloadavg()}")
    with blas_threads(1), torch_threads(1):
        for width in args.widths:
            point = replace(config, hidden=(width, width))
            counts = {name: ops_per_step(point, data, name, factory) for name, factory in table.items()}
            times = {name: [] for name in table}
            if not args.repeats:
                print(f"\nwidth {width}: aten ops per step, steps 3..52 (or to the run's end): " + ", ".join(f"{k} {v:.1f}" for k, v in counts.items()))
                continue
            for _ in range(args.repeats):
                Run.WATCHERS = table
                runs = {name: Run(point, data, name) for name in table}
                ms = lockstep(runs, args.steps - 2, 20, clock=CLOCKS[args.clock][0])
                digests = {name: run.finish() for name, run in runs.items()}
                if len(set(digests.values())) > 1:
                    raise AssertionError(f"watching changed the training: {digests}")
                for name in table:
                    times[name].append(ms[name])
            print(f"\nwidth {width}: PyTorch alone {statistics.median(times['torch']):.2f} ms/step (median); "
                  f"load now {os.getloadavg()}")
            print(f"{'variant':<16} {'overhead (median, low..high)':>32} {'aten ops/step':>14}")
            for name in table:
                ratios = [v / b - 1 for v, b in zip(times[name], times["torch"])]
                cell = "" if name == "torch" else (f"{100 * statistics.median(ratios):+.1f}% "
                                                   f"({100 * min(ratios):+.1f}..{100 * max(ratios):+.1f})")
                print(f"{name:<16} {cell:>32} {counts[name]:>14.0f}")


if __name__ == "__main__":
    main()
