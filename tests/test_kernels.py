"""The compiled kernels of the speed chapter (`10a_speed`, the optional `fast` extra, numba) against the NumPy paths
they stand in for, within stated bounds of exact arithmetic (so on any machine, whatever BLAS kernel is in force): the
unit summary bit for bit, the spectral half round compiled and plain (`09_panels`' `power_iteration`, float64 sums),
and a whole run watched by the plain Inspector and by `fast_inspector`: the same weights, and every statistic within
its stated bounds. The tests that need numba are skipped without it; the plain half round's bound is checked either
way (test_speed.py runs the kernels' Python bodies uncompiled)."""
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from minitrain_inspect import speed, stats
from minitrain_inspect.inspect import EVERY_STEP, NORM_ERROR, Inspector
from minitrain_inspect.speed import compiled_unit_summary, fast_inspector, squares_bound
from minitrain_inspect.panels import ACTIVATION_RANGES, fixed_histogram, power_iteration, unit_health
from minitrain_inspect.core import optional_numba
from minitrain_inspect.stats import MEAN_ERROR, SUM_ERROR, m2_error_bound
from minitrain_inspect.train import TrainConfig, train

needs_numba = pytest.mark.skipif(optional_numba() is None, reason="numba (the extra `fast`) is not installed")

float32_arrays = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
                            elements=st.floats(width=32, allow_nan=True, allow_infinity=True))


@needs_numba
@settings(max_examples=200, deadline=None)
@given(float32_arrays, st.sampled_from(("relu", "tanh")), st.integers(1, 60))
def test_unit_summary_is_the_two_functions_bit_for_bit(x, kind, bins):
    (health, hist) = compiled_unit_summary(x, kind, bins)
    want_health, want_hist = unit_health(x, kind), fixed_histogram(x, *ACTIVATION_RANGES[kind], bins)
    np.testing.assert_array_equal(np.asarray(tuple(health), float), np.asarray(tuple(want_health), float))
    np.testing.assert_array_equal(hist.fractions, want_hist.fractions)
    np.testing.assert_array_equal(np.asarray([hist.below, hist.above, hist.nan], float),
                                  np.asarray([want_hist.below, want_hist.above, want_hist.nan], float))


U = 2.0**-53                                        # float64's unit roundoff
GAMMA64 = lambda j: j * U / (1 - j * U)


def exact_half_round(W, x, transposed):
    "‖W x‖₂ (W.T x if transposed), each value correctly rounded (math.fsum of float64 products, exact for float32), and ‖|W||x|‖₂."
    A, v = (W.T if transposed else W).astype(np.float64), x.astype(np.float64)
    y = [math.fsum(row * v) for row in A]
    return math.sqrt(math.fsum(t * t for t in y)), float(np.linalg.norm(np.abs(A) @ np.abs(v)))


def half_round_bounds(k, m, compiled):
    """(a, b): |sigma - ‖W x‖| <= a ‖|W||x|‖ + b ‖W x‖, compiled (10a_speed) or plain (09_panels' `power_iteration`),
    both summing in float64 with no BLAS. Plain: each value y_i = sum_j W_ij x_j is a float64 einsum of k terms, in
    any order: the product of two float32 values is exact in float64, and k - 1 additions (k roundings with the
    product of float64 inputs) put it within GAMMA64(k) sum_j |W_ij x_j| of the exact value, so ‖y - W x‖ <= GAMMA64(k)
    ‖|W||x|‖. Then sigma = sqrt(sum_of_squares(y)) is within NORM_ERROR of ‖y‖ (10_inspect's bound of that norm),
    so |sigma - ‖W x‖| <= GAMMA64(k) (1 + NORM_ERROR) ‖|W||x|‖ + NORM_ERROR ‖W x‖. (Before, float32 sums allowed
    GAMMA32(k), 2**29 times more.)"""
    if compiled:
        a, b = speed.half_round_bound(k, m)
    else:
        a, b = GAMMA64(k) * (1 + NORM_ERROR), NORM_ERROR
    # + the reference's own rounding: each exact value rounded once, squared, fsum'd, sqrt'd (about 3u), and
    # ‖|W||x|‖ summed in float64 (relative GAMMA64(k), all terms positive), which scales a by at most 1 + GAMMA64(k)
    return a * (1 + GAMMA64(k)), b + 4 * U


class SpectralCheck:
    "An observer of train(): each step's recorded sigma against the exact half round from the estimator's last vector."

    def __init__(self, inspector, compiled):
        self.inspector, self.compiled, self.vectors, self.checked = inspector, compiled, {}, 0

    def before_step(self, step, batch):
        estimators = self.inspector.panel("spectral")._estimators
        self.vectors = {name: (e._x.copy(), e._left) for name, e in estimators.items()}

    def after_step(self, step, loss):
        for name, p in self.inspector.params:
            if name in self.vectors:
                x, transposed = self.vectors[name]
                exact, reach = exact_half_round(p.data, x, transposed)
                steps, values = self.inspector.history.get(f"spectral/{name}/sigma")
                assert steps[-1] == step
                rows, cols = p.data.shape
                a, b = half_round_bounds(*((rows, cols) if transposed else (cols, rows)), self.compiled)
                assert abs(values[-1] - exact) <= a * reach + b * exact, (name, step, values[-1], exact)
                self.checked += 1


half_round_cases = dict(rows=st.integers(1, 90), cols=st.integers(1, 90), transposed=st.booleans(),
                        seed=st.integers(0, 2**32 - 1), offset=st.sampled_from([0.0, 1.0, 1e3]))


def half_round_case(rows, cols, transposed, seed, offset):
    "(W, x, k, m, exact, reach): a float32 matrix, a float32 unit vector, and the exact half round's figures."
    rng = np.random.default_rng(seed)
    W = (offset + rng.standard_normal((rows, cols))).astype(np.float32)
    x = rng.standard_normal(rows if transposed else cols).astype(np.float32)
    x /= np.float32(np.linalg.norm(x.astype(np.float64)) or 1.0)
    exact, reach = exact_half_round(W, x, transposed)
    return W, x, *((rows, cols) if transposed else (cols, rows)), exact, reach


@settings(max_examples=100, deadline=None)
@given(**half_round_cases)
def test_the_plain_half_round_is_within_its_float64_bound_of_the_exact_product(rows, cols, transposed, seed, offset):
    "09_panels' `power_iteration`, one half round, needs no numba: float64 sums, within the bound derived above."
    W, x, k, m, exact, reach = half_round_case(rows, cols, transposed, seed, offset)
    sigma, y = power_iteration(W, x, transposed, 1)
    assert y is None or y.dtype == np.float64
    a, b = half_round_bounds(k, m, compiled=False)
    assert abs(sigma - exact) <= a * reach + b * exact, (sigma, exact)


@needs_numba
@settings(max_examples=60, deadline=None)
@given(**half_round_cases)
def test_each_half_round_is_within_its_bound_of_the_exact_product(rows, cols, transposed, seed, offset):
    W, x, k, m, exact, reach = half_round_case(rows, cols, transposed, seed, offset)
    out, body_out = np.empty(m, np.float32), np.empty(m, np.float32)
    sigma = speed.spectral_kernel()(W, x, transposed, out)
    assert sigma == speed._half_round(W, x, transposed, body_out) and out.tobytes() == body_out.tobytes()   # its body's bits
    for got, compiled in ((sigma, True), (power_iteration(W, x, transposed, 1)[0], False)):
        a, b = half_round_bounds(k, m, compiled)
        assert abs(got - exact) <= a * reach + b * exact, (compiled, got, exact)


@needs_numba
def test_a_run_with_and_without_the_kernels():
    config = TrainConfig(steps=30, seed=1, progress=False, eval_every=10)
    fast, plain = fast_inspector(schedules=EVERY_STEP), Inspector(schedules=EVERY_STEP)
    checks = SpectralCheck(fast, compiled=True), SpectralCheck(plain, compiled=False)
    with_kernels = train(config, inspector=fast, observers=[checks[0]])
    without = train(config, inspector=plain, observers=[checks[1]])
    assert checks[0].checked == checks[1].checked == 4 * (config.steps - 1)   # every weight matrix, after the warm-up
    assert with_kernels.params_sha256 == without.params_sha256      # observing never changes training
    a, b = with_kernels.inspector.history, without.inspector.history
    sizes = {name: p.data.size for name, p in with_kernels.inspector.params}
    assert a.keys() == b.keys()
    for key in a.keys():
        (steps_a, va), (steps_b, vb) = a.get(key), b.get(key)
        np.testing.assert_array_equal(steps_a, steps_b)
        if key.startswith(("activations/", "act_grads/", "gradients/")):   # TensorPanel: the statistics of 08_stats
            assert_within_the_moment_bounds(key, va, vb, a)
        elif key.startswith(("units/", "loss/", "per_class/")):
            np.testing.assert_array_equal(va, vb, err_msg=key)       # the unit kernel is bit for bit
        elif key.startswith("spectral/"):             # each path within its bound of the exact half round (SpectralCheck)
            assert np.all(np.isfinite(va)) and np.all(np.isfinite(vb)), key
        else:
            assert key.startswith("updates/") and key.endswith("/ratio"), key
            # the update ratios: two norms within NORM_ERROR (plain, 10_inspect), two within squares_bound (fast,
            # 10a_speed), and a division each
            n = sizes[key.split("/")[1]]
            np.testing.assert_allclose(va, vb, rtol=2 * NORM_ERROR + 2 * squares_bound(n) + 2.0 ** -51, err_msg=key)
    sa, sb = with_kernels.inspector.snapshot(), without.inspector.snapshot()
    u = 2.0 ** -53
    for name in sa:
        A, B = sa[name], sb[name]
        assert (A["n"], A["min"], A["max"], A["tensors"]) == (B["n"], B["min"], B["max"], B["tensors"]), name
        if A["n"] > 1 and B["std"]:   # the running-merge bound of 08_stats, over the tensors folded, for each path
            k, reach, n = A["tensors"], max(abs(A["min"]), abs(A["max"])), A["n"]
            kappa = 1 + (B["mean"] / B["std"]) ** 2
            m2_rel = (m2_error_bound(2 * kappa) + 8 * k * u
                      + 4 * (MEAN_ERROR + 8 * k * u) * reach / (B["std"] * math.sqrt((n - 1) / n)))
            assert math.isclose(A["std"], B["std"], rel_tol=2.01 * (m2_rel / 2 + 2 * u)), name


def assert_within_the_moment_bounds(key, va, vb, history):
    """A per-step statistic of one tensor, by the compiled kernels (`va`) and by NumPy (`vb`): each within the stated
    bound of the exact value, so within twice that of each other. The bounds need the tensor's largest |value|
    (recorded as `absmax`, exact on both paths) and its conditioning, from the recorded mean and std."""
    va, vb = np.asarray(va, float), np.asarray(vb, float)
    assert np.array_equal(np.isnan(va), np.isnan(vb)), key
    va, vb = va[~np.isnan(vb)], vb[~np.isnan(vb)]
    prefix, field = key.rsplit("/", 1)
    if field in ("absmax", "nonfinite"):
        np.testing.assert_array_equal(va, vb, err_msg=key)
    elif field == "mean":
        absmax = np.asarray(history.get(f"{prefix}/absmax")[1], float)
        absmax = absmax[~np.isnan(absmax)]
        assert np.all(np.abs(va - vb) <= 2 * MEAN_ERROR * absmax + 2.0 ** -1073), key
    elif field == "std":
        mean = np.asarray(history.get(f"{prefix}/mean")[1], float)
        mean = mean[~np.isnan(mean)]
        kappa = 1 + (mean / np.where(vb > 0, vb, 1.0)) ** 2
        bound = np.array([m2_error_bound(2 * k) / 2 + 2.0 ** -52 for k in kappa])   # n / (n - 1) <= 2 in κ
        assert np.all(np.abs(va - vb) <= 2.01 * bound * vb), key
    elif field == "l2":
        assert np.all(np.abs(va - vb) <= 6.01 * SUM_ERROR * vb), key
    else:
        raise AssertionError(f"no bound stated for {key}")


@needs_numba
@pytest.mark.parametrize("delay", [0.1, 0.35, 0.6, 0.85, 1.1, 1.4])
def test_ctrl_c_while_the_kernels_compile_is_never_lost(delay):
    # LLVM's compiler calls back into Python through ctypes, which drops a KeyboardInterrupt raised there; the kernels
    # are compiled with SIGINT held, so a Ctrl-C at any moment of the import and compilation still interrupts.
    script = ("import os, signal, sys, threading, time\n"
              f"threading.Timer({delay}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
              "try:\n"
              "    from minitrain_inspect import speed\n"
              "    speed.unit_kernel(); speed.subtract_kernel(); time.sleep(5)\n"
              "except KeyboardInterrupt:\n"
              "    sys.exit(7)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 7, (r.returncode, r.stderr[-500:])
