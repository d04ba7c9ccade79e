"""The data-parallel merge's own work per flush, another copy of the package against this one, in one interleaved run.

    git archive BASE minitrain_inspect | tar -x -C /tmp/base && mv /tmp/base/minitrain_inspect /tmp/base/mti_base
    python benchmarks/ddp_merge_before_after.py /tmp/base/mti_base [--steps 1000] [--repeats 3] [--world 2]

Each repeat builds the demo's model (`ddp._demo_model`, same seed) twice, one under each copy's `DDPInspector`
(flush every `DDP_FLUSH_EVERY` steps), and trains them in lockstep, step by step, the order of the two swapped every
repeat. No process group is started: the gather is faked by repeating this rank's packed vector `--world` times, so the
merge does the work of that many ranks without sockets (the collective's own time is not measured here; `ddp-demo`
reports it). The merge's timers read this thread's CPU time (`time.thread_time`), so preemption by other processes on a
shared machine is not counted. PyTorch and BLAS run on one thread (threadpoolctl). Printed per repeat: each copy's
median own work per flush (ms) with its range, and their ratio. Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
import types

import numpy as np
from threadpoolctl import threadpool_limits

from minitrain_inspect import ddp


def load_copy(path: str):
    "The `ddp` module of the copy of the package in folder `path` (a folder name other than the package's own)."
    path = os.path.abspath(path)
    if not os.path.isfile(os.path.join(path, "ddp.py")):
        raise SystemExit(f"{path} does not hold a copy of the package (no ddp.py)")
    if os.path.basename(path) == ddp.__name__.split(".")[0]:
        raise SystemExit(f"{path}: rename the copy's folder (e.g. mti_base): under the package's own name it would be this package")
    sys.path.insert(0, os.path.dirname(path))
    return importlib.import_module(f"{os.path.basename(path)}.ddp")


def fake_world(module, world: int) -> None:
    "Make `module`'s flush gather `world` copies of this rank's packed vector, and time its merge by CPU time."
    local = module.gather_rows

    def gather(packed, collective=True, group=None):
        rows = local(packed, False, group)
        return np.concatenate([rows] * world) if isinstance(rows, np.ndarray) else rows * world
    module.gather_rows = gather
    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    clock.perf_counter = time.thread_time
    module.time = clock


def inspected(module):
    "(module, spec, model, loss_fn, optimizer, batch, inspector): the demo's rank 0, under `module`'s DDPInspector."
    spec = {**module.DEMO_SPEC, "rank": 0}
    model, loss_fn, optimizer, batch = module._demo_model(spec)
    inspector = module.DDPInspector(model, optimizer=optimizer, loss_fn=loss_fn)
    inspector._collective = True          # flush through the (faked) gather, as a rank of a group does
    return module, spec, model, loss_fn, optimizer, batch, inspector.attach()


def own_ms(inspector) -> list[float]:
    "Per flush of the loop (the final forced flush left out): the merge's own work in ms, the gather excluded."
    return [1e3 * (m - g) for m, g in zip(inspector.merge_seconds, inspector.gather_seconds)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("copy", help="folder of the other copy of the package (the 'before')")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args(argv)
    before = load_copy(args.copy)
    torch = ddp.require_torch()
    torch.set_num_threads(1)
    for module in (before, ddp):
        fake_world(module, args.world)
    print(f"ddp merge, own work per flush (ms, CPU time), {args.steps} steps, flush every {ddp.DDP_FLUSH_EVERY}, "
          f"{args.world} ranks faked; load {os.getloadavg()[0]:.2f}")
    with threadpool_limits(1):
        for repeat in range(args.repeats):
            runs = [inspected(before), inspected(ddp)]
            runs = runs if repeat % 2 == 0 else runs[::-1]
            for step in range(args.steps):
                for module, spec, model, loss_fn, optimizer, batch, inspector in runs:
                    module._one_step(spec, step, model, loss_fn, optimizer, inspector, batch)
            ms = {"before" if run[0] is before else "after": own_ms(run[-1]) for run in runs}
            for run in runs:
                run[-1].remove_all()
            b, a = statistics.median(ms["before"]), statistics.median(ms["after"])
            print(f"repeat {repeat}: before {b:.3f} ms ({min(ms['before']):.2f}-{max(ms['before']):.2f}), after {a:.3f} ms "
                  f"({min(ms['after']):.2f}-{max(ms['after']):.2f}), before/after {b / a:.2f}x; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
