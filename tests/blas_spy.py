"""The BLAS threads a path runs under, seen from inside it (issue 19): shared by the train, trace and diagnose tests."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# In a fresh process whose environment asks for 4 threads.
SPY_PRELUDE = """
import json, numpy, threadpoolctl
from minitrain_inspect.losses import SoftmaxCrossEntropy
def blas():
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"})
class SpyLoss(SoftmaxCrossEntropy):
    "The loss, noting the BLAS threads in force each time it runs: that is inside the path that calls it."
    seen = []
    def forward(self, *args, **kwargs):
        SpyLoss.seen.append(blas())
        return super().forward(*args, **kwargs)
outside = blas()
"""


def threads_seen_inside(body: str) -> tuple[list, list]:
    "Run `body` after SPY_PRELUDE under OPENBLAS_NUM_THREADS=4; (the threads outside, those SpyLoss saw inside)."
    code = SPY_PRELUDE + body + "\nprint(json.dumps([outside, SpyLoss.seen]))"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "4"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    outside, inside = json.loads(out.stdout.strip().splitlines()[-1])
    if outside == [1]:
        pytest.skip("this machine gives OpenBLAS one thread whatever the environment asks: nothing to pin")
    return outside, inside
