"""Per-call cost of the Inspector's measurements, plain against compiled: the moments of one tensor (`tensor_moments`,
08_stats's one exact way, against the speed chapter's lanes `compiled_moments`), the running fold (`NumpyOps.moments`
against `CompiledOps.moments`) and the norm (`NumpyOps.norm` against `CompiledOps.norm`), and the spectral panel's half
round of power iteration (`SpectralNorm.estimate`, float64 `einsum`, against `CompiledSpectralNorm.estimate`, float64
sums), with a copy of the same array for scale.

Medians of interleaved repeats, with the 10th and 90th percentiles; BLAS pinned to one thread (threadpoolctl), although
none of these calls uses BLAS. Prints the machine's load average: the figures are only comparable within one run.

    python benchmarks/fast_paths.py [repeats]
"""
import os
import platform
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from minitrain_inspect.inspect import NumpyOps
from minitrain_inspect.panels import SpectralNorm
from minitrain_inspect.speed import CompiledOps, CompiledSpectralNorm, compiled_moments
from minitrain_inspect.stats import new_state, tensor_moments

SHAPES = ((64, 256), (256, 256), (64, 2000))


def candidates(x, plain, fast):
    "name -> a call on `x`."
    calls = {"copy": lambda: x.copy(), "tensor_moments": lambda: tensor_moments(x),
             "compiled_moments (lanes)": lambda: compiled_moments(x),
             "NumpyOps.moments (fold)": lambda: plain.moments(new_state(), x),
             "CompiledOps.moments (fold)": lambda: fast.moments(new_state(), x),
             "NumpyOps.norm": lambda: plain.norm(x), "CompiledOps.norm": lambda: fast.norm(x)}
    plain_sigma, fast_sigma = SpectralNorm(), CompiledSpectralNorm()
    calls["SpectralNorm.estimate"] = lambda: plain_sigma.estimate(x)          # the first call warms up (30 rounds)
    calls["CompiledSpectralNorm.estimate"] = lambda: fast_sigma.estimate(x)
    return calls


def measure(calls, repeats: int, inner: int = 20) -> dict:
    "Microseconds a call: for each repeat, every candidate in turn (interleaved), `inner` calls each."
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(inner):
                call()
            times[name].append((time.perf_counter() - start) / inner * 1e6)
    return times


def main(repeats: int = 50) -> None:
    plain, fast = NumpyOps(), CompiledOps()                 # compiled here, before any timing
    rng = np.random.default_rng(0)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; numba compiled: {fast.compiled}; BLAS 1 thread")
    print(f"float32 arrays, median µs a call over {repeats} interleaved repeats (10th-90th percentile)")
    with threadpool_limits(1):
        for shape in SHAPES:
            x = rng.standard_normal(shape).astype(np.float32)
            calls = candidates(x, plain, fast)
            for call in calls.values():
                call()                                       # warm
            times = measure(calls, repeats)
            print(f"\n{shape}:")
            for name, values in times.items():
                deciles = statistics.quantiles(values, n=10)
                print(f"  {name:28s} {statistics.median(values):8.1f}  ({deciles[0]:.1f}-{deciles[-1]:.1f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
