"""The compiled kernels (the optional `fast` extra, numba) against the NumPy paths they stand in for: the one-pass
moments on any float32 array, the unit summary bit for bit, the optimiser's measured subtraction (the weights bit for
bit, the norms and the spectral products close), and a whole Inspector run with and without them. Skipped when numba
is not installed (the NumPy paths are then the only ones, and the other tests cover them)."""
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from minitrain_inspect import optim, panels, stats
from minitrain_inspect.inspect import EVERY_STEP, Inspector
from minitrain_inspect.optim import subtract_update
from minitrain_inspect.panels import ACTIVATION_RANGES, fixed_histogram, unit_health, unit_summary
from minitrain_inspect.stats import new_state, one_pass_moments, tensor_moments, welford_update
from minitrain_inspect.train import TrainConfig, train

pytestmark = pytest.mark.skipif(stats.optional_numba() is None, reason="numba (the extra `fast`) is not installed")

float32_arrays = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
                            elements=st.floats(width=32, allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None)
@given(float32_arrays)
def test_one_pass_moments_agrees_with_the_exact_path(x):
    got, want = one_pass_moments(x), tensor_moments(x)
    assert (got.n, got.nonfinite, got.nan) == (want.n, want.nonfinite, want.nan)
    if want.n:
        assert (got.min, got.max) == (want.min, want.max)     # the extremes are exact (±0 compare equal)
        assert math.isclose(got.mean, want.mean, rel_tol=1e-9, abs_tol=1e-300 + 1e-9 * max(-want.min, want.max))
        assert math.isclose(got.var if want.n > 1 else 0.0, want.var if want.n > 1 else 0.0, rel_tol=1e-6, abs_tol=1e-300)


@settings(max_examples=200, deadline=None)
@given(float32_arrays, st.sampled_from(("relu", "tanh")), st.integers(1, 60))
def test_unit_summary_is_the_two_functions_bit_for_bit(x, kind, bins):
    (health, hist) = unit_summary(x, kind, bins)
    want_health, want_hist = unit_health(x, kind), fixed_histogram(x, *ACTIVATION_RANGES[kind], bins)
    np.testing.assert_array_equal(np.asarray(tuple(health), float), np.asarray(tuple(want_health), float))
    np.testing.assert_array_equal(hist.fractions, want_hist.fractions)
    np.testing.assert_array_equal(np.asarray([hist.below, hist.above, hist.nan], float),
                                  np.asarray([want_hist.below, want_hist.above, want_hist.nan], float))


matrices = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, max_side=70),
                      elements=st.floats(-1e6, 1e6, width=32) | st.sampled_from([0.0, 1e-30, -3e-25, 2e20, np.nan, np.inf]))


@settings(max_examples=300, deadline=None)
@given(matrices, st.floats(-10, 10), st.booleans(), st.booleans())
def test_subtract_update_is_numpy_s_subtraction_with_its_norms(w, scale, with_probe, left):
    with np.errstate(invalid="ignore", over="ignore"):   # inf * 0 and inf - inf: NaN, on purpose
        u = (np.roll(w, 1) * np.float32(scale)).astype(np.float32)
        expected = w.copy()
        expected -= u
    probe = None
    if with_probe and w.ndim == 2:
        probe = (np.linspace(-1, 1, w.shape[0 if left else 1]).astype(np.float32), left)
    before = w.astype(np.float64)
    got = subtract_update(w, u, probe)
    assert w.tobytes() == expected.tobytes()                     # the weights: bit for bit
    for which, norm, exact in zip("uw", got[:2], (np.linalg.norm(u.astype(np.float64)), np.linalg.norm(before))):
        if which == "w" and math.isnan(norm) and not np.isfinite(u).all():
            continue   # weights out of float32 squares' range and an update that is not finite: unknown, said nan
        if math.isfinite(exact):
            assert math.isclose(norm, exact, rel_tol=2e-6, abs_tol=1e-300), (norm, exact)
        else:
            assert norm == exact or (math.isnan(norm) and math.isnan(exact)), (norm, exact)
    if probe is not None:
        matrix = expected.T if left else expected
        with np.errstate(invalid="ignore", over="ignore"):
            exact = matrix.astype(np.float64) @ probe[0].astype(np.float64)
            bound = np.abs(matrix.astype(np.float64)) @ np.abs(probe[0].astype(np.float64))
        finite = np.isfinite(bound)
        assert np.all(np.abs(got[2][finite] - exact[finite]) <= 1e-5 * bound[finite] + 1e-30)


def test_welford_fast_lane_matches_the_plain_fold():
    rng = np.random.default_rng(3)
    lane, plain = new_state(), new_state()
    for i in range(50):
        x = (rng.standard_normal((16, 33)) * 10.0 ** rng.integers(-5, 6) + rng.integers(-3, 4)).astype(np.float32)
        if i % 7 == 3:
            x[0, 0] = np.nan
        welford_update(lane, x, fast=True)
        welford_update(plain, x, fast=False)
    for key in ("n", "nonfinite", "nan", "min", "max", "tensors", "l2_tensors"):
        assert lane[key] == plain[key], key
    for key in ("mean", "m2", "l2", "l2_mean"):
        assert math.isclose(lane[key], plain[key], rel_tol=2e-6), (key, lane[key], plain[key])


def test_a_run_with_and_without_the_kernels(monkeypatch):
    config = TrainConfig(steps=30, seed=1, progress=False, eval_every=10)
    with_kernels = train(config, inspector=Inspector(schedules=EVERY_STEP))
    monkeypatch.setattr(stats, "moment_kernels", lambda: None)
    monkeypatch.setattr(panels, "unit_kernel", lambda: None)
    monkeypatch.setattr(optim, "update_kernels", lambda: None)
    without = train(config, inspector=Inspector(schedules=EVERY_STEP))
    assert with_kernels.params_sha256 == without.params_sha256      # observing never changes training
    a, b = with_kernels.inspector.history, without.inspector.history
    assert a.keys() == b.keys()
    for key in a.keys():
        (steps_a, va), (steps_b, vb) = a.get(key), b.get(key)
        np.testing.assert_array_equal(steps_a, steps_b)
        if key.startswith(("units/", "loss/", "per_class/")):
            np.testing.assert_array_equal(va, vb, err_msg=key)       # the unit kernel is bit for bit; the rest is not
        elif key.startswith("spectral/"):                             # products summed in another order, iterated
            np.testing.assert_allclose(va, vb, rtol=1e-5, err_msg=key)
        else:
            np.testing.assert_allclose(va, vb, rtol=2e-6, atol=1e-12, err_msg=key)
    sa, sb = with_kernels.inspector.snapshot(), without.inspector.snapshot()
    for name in sa:
        assert (sa[name]["n"], sa[name]["min"], sa[name]["max"]) == (sb[name]["n"], sb[name]["min"], sb[name]["max"])
        assert math.isclose(sa[name]["std"], sb[name]["std"], rel_tol=2e-6), name


@pytest.mark.parametrize("delay", [0.1, 0.35, 0.6, 0.85, 1.1, 1.4])
def test_ctrl_c_while_the_kernels_compile_is_never_lost(delay):
    # LLVM's compiler calls back into Python through ctypes, which drops a KeyboardInterrupt raised there; the kernels
    # are compiled with SIGINT held, so a Ctrl-C at any moment of the import and compilation still interrupts.
    script = ("import os, signal, sys, threading, time\n"
              f"threading.Timer({delay}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
              "try:\n"
              "    from minitrain_inspect import optim, panels, stats\n"
              "    stats.moment_kernels(); panels.unit_kernel(); optim.update_kernels(); time.sleep(5)\n"
              "except KeyboardInterrupt:\n"
              "    sys.exit(7)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 7, (r.returncode, r.stderr[-500:])
