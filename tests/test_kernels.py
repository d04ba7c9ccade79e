"""The compiled kernels (the optional `fast` extra, numba) against the NumPy paths they stand in for: the moment
kernels bit for bit against their own Python bodies and within the stated bounds of exact arithmetic (so on any
machine, whatever BLAS kernel is in force), the speed chapter's unit summary bit for bit, and a whole run watched by the plain Inspector and by
`fast_inspector` (10a_speed): the same weights, and every statistic within its stated bounds.
Skipped when numba is not installed (test_exact.py runs the kernels' bodies uncompiled there)."""
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
from minitrain_inspect.stats import (MEAN_ERROR, SUM_ERROR, _compiled_moments, _deviation_blocks, _moments_of,
                                     _sum_blocks, m2_error_bound, moment_kernels, new_state, one_pass_moments,
                                     tensor_moments, welford_update)
from test_exact import check_exact
from minitrain_inspect.train import TrainConfig, train

pytestmark = pytest.mark.skipif(stats.optional_numba() is None, reason="numba (the extra `fast`) is not installed")

float32_arrays = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
                            elements=st.floats(width=32, allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None)
@given(float32_arrays)
def test_one_pass_moments_agrees_with_the_exact_path(x):
    "Compiled and NumPy summaries: counts and extremes equal, both within the stated bounds of the exact statistics."
    got, want = one_pass_moments(x), tensor_moments(x)
    assert (got.n, got.nonfinite, got.nan) == (want.n, want.nonfinite, want.nan)
    if want.n:
        assert (got.min, got.max) == (want.min, want.max)     # the extremes are exact (±0 compare equal)
        finite = x[np.isfinite(x)]
        check_exact(got, finite)
        check_exact(want, finite)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    "The same float64 bits, value by value, NaN apart (a NaN's sign and payload carry no meaning)."
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and a[~nan].tobytes() == b[~nan].tobytes()


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 9000), elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
       st.floats(-1e30, 1e30))
def test_the_moment_kernels_against_their_python_bodies(x, mean):
    """The first pass (fastmath reassociation: a block's sums in any order) within the block bound, its extremes
    exact; the second pass (no fastmath: the order written) bit for bit."""
    compiled_sums, compiled_deviations = moment_kernels()
    sums, squares, lo, hi = compiled_sums(x, x.view(np.int32))
    with np.errstate(invalid="ignore"):                 # inf - inf in plain Python: NaN, as compiled
        want_sums, want_squares, want_lo, want_hi = _sum_blocks(x, x.view(np.int32))
    if np.isfinite(x).all():
        assert (lo, hi) == (want_lo, want_hi)
        blocks = np.split(np.abs(x.astype(np.float64)), range(4096, x.size, 4096))
        reach = np.array([block.sum() for block in blocks])
        with np.errstate(over="ignore"):
            assert np.all(np.abs(sums - want_sums) <= 2 * SUM_ERROR * reach)
            assert np.all(np.abs(squares - want_squares) <= 2 * SUM_ERROR * want_squares)
    else:
        assert np.array_equal(np.isfinite(sums), np.isfinite(want_sums))      # a block with NaN or inf, either way
    squares, deviations = compiled_deviations(x, mean)
    want_squares, want_deviations = _deviation_blocks(x, mean)
    assert same_bits(squares, want_squares) and same_bits(deviations, want_deviations)
    with np.errstate(invalid="ignore"):
        got, want = _compiled_moments(moment_kernels(), x), _compiled_moments((_sum_blocks, _deviation_blocks), x)
    assert (got is None) == (want is None)
    if got is not None and got.n > 1:
        check_exact(got, x)


@settings(max_examples=200, deadline=None)
@given(float32_arrays, st.sampled_from(("relu", "tanh")), st.integers(1, 60))
def test_unit_summary_is_the_two_functions_bit_for_bit(x, kind, bins):
    (health, hist) = compiled_unit_summary(x, kind, bins)
    want_health, want_hist = unit_health(x, kind), fixed_histogram(x, *ACTIVATION_RANGES[kind], bins)
    np.testing.assert_array_equal(np.asarray(tuple(health), float), np.asarray(tuple(want_health), float))
    np.testing.assert_array_equal(hist.fractions, want_hist.fractions)
    np.testing.assert_array_equal(np.asarray([hist.below, hist.above, hist.nan], float),
                                  np.asarray([want_hist.below, want_hist.above, want_hist.nan], float))


def test_welford_fast_lane_matches_the_plain_fold():
    "50 tensors folded by the compiled kernels and by NumPy: both within the running-merge bound of the exact figures."
    rng = np.random.default_rng(3)
    lane, plain = new_state(), new_state()
    tensors = []
    for i in range(50):
        x = (rng.standard_normal((16, 33)) * 10.0 ** rng.integers(-5, 6) + rng.integers(-3, 4)).astype(np.float32)
        if i % 7 == 3:
            x[0, 0] = np.nan
        tensors.append(x[np.isfinite(x)])
        welford_update(lane, x, fast=True)
        welford_update(plain, x, fast=False)
    for key in ("n", "nonfinite", "nan", "min", "max", "tensors", "l2_tensors"):
        assert lane[key] == plain[key], key
    whole = np.concatenate(tensors)
    for state in (lane, plain):
        check_exact(_moments_of(state), whole, merges=50)
    assert math.isclose(lane["l2"], plain["l2"], rel_tol=6 * SUM_ERROR)     # each within 3 SUM_ERROR of the exact
    assert math.isclose(lane["l2_mean"], plain["l2_mean"], rel_tol=6 * SUM_ERROR + 50 * 2.0 ** -52)


GAMMA32 = lambda j: j * 2.0**-24 / (1 - j * 2.0**-24)


def exact_half_round(W, x, transposed):
    "‖W x‖₂ (W.T x if transposed), each value correctly rounded (math.fsum of float64 products, exact for float32), and ‖|W||x|‖₂."
    A, v = (W.T if transposed else W).astype(np.float64), x.astype(np.float64)
    y = [math.fsum(row * v) for row in A]
    return math.sqrt(math.fsum(t * t for t in y)), float(np.linalg.norm(np.abs(A) @ np.abs(v)))


def half_round_bounds(k, m, compiled):
    "(a, b): |sigma - ‖W x‖| <= a ‖|W||x|‖ + b ‖W x‖, compiled (float64 sums, 10a_speed) or plain (float32 einsum, 09_panels)."
    if compiled:
        a, b = speed.half_round_bound(k, m)
    else:   # k float32 roundings a value (a product and the additions), then float64 squares summed (NORM_ERROR)
        a, b = GAMMA32(k), 2 * NORM_ERROR
    return a, b + 2.0**-52          # + the reference's own rounding


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


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 90), cols=st.integers(1, 90), transposed=st.booleans(), seed=st.integers(0, 2**32 - 1),
       offset=st.sampled_from([0.0, 1.0, 1e3]))
def test_each_half_round_is_within_its_bound_of_the_exact_product(rows, cols, transposed, seed, offset):
    rng = np.random.default_rng(seed)
    W = (offset + rng.standard_normal((rows, cols))).astype(np.float32)
    x = rng.standard_normal(rows if transposed else cols).astype(np.float32)
    x /= np.float32(np.linalg.norm(x.astype(np.float64)) or 1.0)
    exact, reach = exact_half_round(W, x, transposed)
    k, m = (rows, cols) if transposed else (cols, rows)
    out, body_out = np.empty(m, np.float32), np.empty(m, np.float32)
    sigma = speed.spectral_kernel()(W, x, transposed, out)
    assert sigma == speed._half_round(W, x, transposed, body_out) and out.tobytes() == body_out.tobytes()   # its body's bits
    for got, compiled in ((sigma, True), (power_iteration(W, x, transposed, 1)[0], False)):
        a, b = half_round_bounds(k, m, compiled)
        assert abs(got - exact) <= a * reach + b * exact, (compiled, got, exact)


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


@pytest.mark.parametrize("delay", [0.1, 0.35, 0.6, 0.85, 1.1, 1.4])
def test_ctrl_c_while_the_kernels_compile_is_never_lost(delay):
    # LLVM's compiler calls back into Python through ctypes, which drops a KeyboardInterrupt raised there; the kernels
    # are compiled with SIGINT held, so a Ctrl-C at any moment of the import and compilation still interrupts.
    script = ("import os, signal, sys, threading, time\n"
              f"threading.Timer({delay}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
              "try:\n"
              "    from minitrain_inspect import speed, stats\n"
              "    stats.moment_kernels(); speed.unit_kernel(); speed.subtract_kernel(); time.sleep(5)\n"
              "except KeyboardInterrupt:\n"
              "    sys.exit(7)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 7, (r.returncode, r.stderr[-500:])
