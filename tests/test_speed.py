"""The speed chapter's measured subtraction: NumPy's bits, float64 sums within the stated bound of exact rational sums,
the compiled loop in lockstep with its Python body and its NumPy twin (the body runs uncompiled, so these tests hold
without numba), numba imported only on first use, and `UpdateMeasure` against copy-before/subtract-after."""
import math
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain_inspect import speed
from minitrain_inspect.core import Parameter, optional_numba
from minitrain_inspect.optim import SGD, Adam, Optimizer
from minitrain_inspect.speed import (SQUARES_LANES, UpdateMeasure, squares_bound, subtract_kernel, subtract_measuring,
                                     subtract_measuring_numpy)

ROOT = Path(__file__).resolve().parents[1]
needs_numba = pytest.mark.skipif(optional_numba() is None, reason="numba (the `fast` extra) is not installed")
LOOP = speed._subtract_measuring_loop          # the kernel's body, uncompiled


def exact_sums(old, new) -> tuple[float, float]:
    "Exact sums of (new - old)**2 and old**2 over finite values, in rationals, rounded once."
    olds = [Fraction(float(x)) for x in np.ravel(old)]
    news = [Fraction(float(x)) for x in np.ravel(new)]
    return float(sum((b - a) ** 2 for a, b in zip(olds, news))), float(sum(a * a for a in olds))


def within_bound(got, exact, n, factor=1.0) -> bool:
    return abs(got - exact) <= factor * squares_bound(n) * exact


def same_outcome(a, b, n) -> bool:
    "Both NaN, or the same inf, or both finite and within twice the bound of each other (two paths, two orders)."
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b) <= 2 * squares_bound(n) * max(a, b)
    return a == b or (math.isnan(a) and math.isnan(b))


def arrays(seed, n, data_dtype, update_dtype, offset, scale, specials=0):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        w = (offset + rng.standard_normal(n)).astype(data_dtype)
        u = (rng.standard_normal(n) * scale).astype(update_dtype)
    for _ in range(specials if n else 0):
        target = w if rng.random() < 0.5 else u
        target[rng.integers(n)] = rng.choice([np.nan, np.inf, -np.inf])
    return w, u


DTYPES = st.sampled_from([np.float32, np.float64])
CASES = dict(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 2 * SQUARES_LANES + 50), data_dtype=DTYPES,
             update_dtype=DTYPES, offset=st.sampled_from([0.0, 1.0, 1e8, -3e4]),
             scale=st.sampled_from([0.0, 1e-9, 1e-3, 1.0, 1e6]))


# -- the bound --------------------------------------------------------------------------------------------------------

def test_the_bound_counts_the_roundings_a_term_goes_through():
    u = 2.0 ** -53
    for n, k in ((0, 1), (1, 3), (1023, 1025), (1024, 1026), (1025, 1027), (10**6, 1024 + 977 + 1)):
        assert squares_bound(n) == k * u / (1 - k * u), n
    assert squares_bound(10**6) < 2.3e-13
    for bad in (-1, 2.5, "3", True, None):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            squares_bound(bad)


# -- the kernel's Python body, uncompiled, and the NumPy twin ------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(**CASES)
def test_the_loop_and_the_twin_write_numpys_bits_and_sum_within_the_bound(seed, n, data_dtype, update_dtype, offset,
                                                                           scale):
    w, u = arrays(seed, n, data_dtype, update_dtype, offset, scale)
    expected = w.copy(); expected -= u
    looped, twinned = w.copy(), w.copy()
    loop_sums = LOOP(looped, u)
    twin_sums = subtract_measuring_numpy(twinned, u)
    assert looped.tobytes() == expected.tobytes() and twinned.tobytes() == expected.tobytes()
    for got_loop, got_twin, exact in zip(loop_sums, twin_sums, exact_sums(w, expected)):
        assert within_bound(got_loop, exact, n) and within_bound(got_twin, exact, n), (got_loop, got_twin, exact)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), data_dtype=DTYPES, update_dtype=DTYPES,
       specials=st.integers(1, 3))
def test_nan_and_inf_give_the_same_non_finite_sums_on_both_paths_silently(seed, n, data_dtype, update_dtype, specials):
    w, u = arrays(seed, n, data_dtype, update_dtype, 0.0, 1.0, specials)
    expected = w.copy()
    with np.errstate(all="ignore"):
        expected -= u
        loop_sums = LOOP(w.copy(), u)           # numpy scalars would warn; the compiled loop cannot
    twinned = w.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twin_sums = subtract_measuring_numpy(twinned, u)
    assert twinned.tobytes() == expected.tobytes()
    assert all(same_outcome(a, b, n) for a, b in zip(loop_sums, twin_sums)), (loop_sums, twin_sums)
    assert not (math.isfinite(loop_sums[0]) and math.isfinite(loop_sums[1]))   # a NaN or inf is never hidden


def test_empty_and_zero_dimensional_arrays():
    assert LOOP(np.zeros(0, np.float32), np.zeros(0, np.float32)) == (0.0, 0.0)
    assert subtract_measuring_numpy(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) == (0.0, 0.0)
    assert subtract_measuring(np.zeros((3, 0), np.float32), np.zeros((3, 0), np.float32)) == (0.0, 0.0)
    scalar = np.array(2.0, np.float32)
    assert subtract_measuring(scalar, np.array(0.5, np.float32)) == (0.25, 4.0) and scalar == 1.5


def test_the_twin_takes_what_numpy_takes_and_raises_numpys_errors():
    w = np.ones((4, 6), np.float32)
    assert subtract_measuring_numpy(w[:, ::2], np.float32(0.25)) == (12 * 0.0625, 12.0)     # strided, broadcast
    assert w[:, 0].tolist() == [0.75] * 4 and w[:, 1].tolist() == [1.0] * 4
    frozen = np.ones(3, np.float32); frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        subtract_measuring(frozen, np.ones(3, np.float32))
    assert frozen.tolist() == [1.0] * 3
    with pytest.raises(TypeError):        # NumPy's own refusal: float into int, in place
        subtract_measuring(np.ones(3, np.int64), np.full(3, 0.5))


# -- the compiled loop --------------------------------------------------------------------------------------------

@needs_numba
@settings(max_examples=25, deadline=None)
@given(**CASES)
def test_the_compiled_loop_is_its_python_body_bit_for_bit(seed, n, data_dtype, update_dtype, offset, scale):
    w, u = arrays(seed, n, data_dtype, update_dtype, offset, scale)
    compiled_w, python_w = w.copy(), w.copy()
    assert subtract_kernel()(compiled_w, u) == subtract_kernel().py_func(python_w, u)
    assert compiled_w.tobytes() == python_w.tobytes()


@needs_numba
@pytest.mark.parametrize("n", [SQUARES_LANES * 300 + 7, 1_000_000])
def test_the_compiled_path_and_the_twin_agree_within_their_bounds_on_large_arrays(n):
    w, u = arrays(n, n, np.float32, np.float32, 2.0, 1e-3)
    compiled_w, twin_w = w.copy(), w.copy()
    compiled = subtract_measuring(compiled_w, u)
    twin = subtract_measuring_numpy(twin_w, u)
    assert compiled_w.tobytes() == twin_w.tobytes()
    old = w.astype(np.float64)
    change = compiled_w.astype(np.float64) - old      # at most one rounding, and one in the square: within gamma_2
    reference = (math.fsum(change * change), math.fsum(old * old))   # fsum: correctly rounded sums of those terms
    for a, b, ref in zip(compiled, twin, reference):
        assert within_bound(a, b, n, 2.0) and within_bound(a, ref, n, 2.0) and within_bound(b, ref, n, 2.0)


@needs_numba
def test_with_nan_and_inf_the_compiled_loop_raises_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        change, before = subtract_measuring(np.float32([np.inf, 1.0, 2.0]), np.float32([np.inf, 0.0, 0.0]))
    assert math.isnan(change) and before == math.inf


def test_without_the_kernel_subtract_measuring_is_the_twin(monkeypatch):
    monkeypatch.setattr(speed, "subtract_kernel", lambda: None)
    w, u = arrays(1, 3000, np.float32, np.float32, 1.0, 1e-2)
    a, b = w.copy(), w.copy()
    assert subtract_measuring(a, u) == subtract_measuring_numpy(b, u) and a.tobytes() == b.tobytes()


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_importing_speed_imports_no_numba_and_neither_does_input_the_kernel_does_not_take():
    r = _python("import sys, numpy as np\n"
                "from minitrain_inspect import speed\n"
                "assert 'numba' not in sys.modules, 'numba imported by the import'\n"
                "w = np.ones(8, np.float32)\n"
                "speed.subtract_measuring(w[::2], np.float32(1)); speed.UpdateMeasure\n"
                "assert 'numba' not in sys.modules, 'numba imported for input the kernel does not take'\n"
                "print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_everything_works_without_numba():
    r = _python("import sys, math, numpy as np\n"
                "sys.modules['numba'] = None\n"   # `import numba` now raises ImportError
                "from minitrain_inspect import speed\n"
                "from minitrain_inspect.core import Parameter\n"
                "from minitrain_inspect.optim import SGD\n"
                "assert speed.subtract_kernel() is None\n"
                "w = np.arange(5, dtype=np.float32)\n"
                "assert speed.subtract_measuring(w, np.ones(5, np.float32)) == (5.0, 30.0), w\n"
                "p = Parameter(np.ones(4, np.float32)); p.grad[:] = 1.0; opt = SGD([p], lr=0.5)\n"
                "m = speed.UpdateMeasure(opt); opt.step()\n"
                "assert m.pairs[id(p)] == (1.0, 2.0) and m.counts[id(p)] == 1, m.pairs\n"
                "print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# -- UpdateMeasure ----------------------------------------------------------------------------------------------

def _train(opt_cls, kw, measure: bool, dtype=np.float32, steps=3):
    "Train three parameters; with `measure`, check each pair against copy-before/subtract-after. Their bytes."
    rng = np.random.default_rng(7)
    params = [Parameter(rng.standard_normal(shape).astype(dtype)) for shape in ((40, 70), (70,), (3, 3, 3))]
    opt = opt_cls(params, lr=0.05, **kw)
    measurer = UpdateMeasure(opt) if measure else None
    for _ in range(steps):
        for p in params:
            p.grad[...] = rng.standard_normal(p.data.shape).astype(dtype)
        before = [p.data.copy() for p in params]
        opt.step()
        if measure:
            assert set(measurer.pairs) == {id(p) for p in params} and set(measurer.counts.values()) == {1}
            for p, old in zip(params, before):
                exact = [math.sqrt(s) for s in exact_sums(old, p.data)]
                for got, want in zip(measurer.pairs[id(p)], exact):
                    assert within_bound(got, want, old.size), (opt_cls, got, want)
    return [p.data.tobytes() for p in params]


@pytest.mark.parametrize("kernel", ["compiled", "twin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opt_cls, kw", [(SGD, {}), (SGD, {"momentum": 0.9}), (Adam, {})], ids=["sgd", "momentum", "adam"])
def test_update_measure_pairs_are_the_plain_ways_within_the_bound_and_training_is_unchanged(opt_cls, kw, dtype, kernel,
                                                                                          monkeypatch):
    if kernel == "twin":
        monkeypatch.setattr(speed, "subtract_kernel", lambda: None)
    elif optional_numba() is None:
        pytest.skip("numba (the `fast` extra) is not installed")
    assert _train(opt_cls, kw, True, dtype) == _train(opt_cls, kw, False, dtype)


def test_update_measure_marks_a_second_update_and_clears_as_each_step_starts():
    class Twice(SGD):
        def step(self):
            super().step(); super().step()

    p, q = Parameter(np.ones(3, np.float32)), Parameter(np.ones(2, np.float32))
    opt = Twice([p, q], lr=0.1)
    measure = UpdateMeasure(opt)
    opt.step()
    assert measure.pairs == {id(p): None, id(q): None} and measure.counts == {id(p): 2, id(q): 2}
    measure.clear()
    assert measure.pairs == {} and measure.counts == {}
    opt.apply_update(p, np.full(3, 0.5, np.float32))
    assert measure.counts == {id(p): 1} and measure.pairs[id(p)][0] == pytest.approx(math.sqrt(0.75), rel=1e-15)
    opt.step()
    assert measure.counts == {id(p): 2, id(q): 2}          # cleared at the start of the step


def test_update_measure_sees_nothing_of_an_optimiser_that_writes_p_data_itself():
    class OwnWrite(Optimizer):
        def step(self):
            for p in self.params:
                p.data -= self.lr * p.grad

    p = Parameter(np.ones(3, np.float32)); p.grad[...] = 1.0
    opt = OwnWrite([p], lr=0.5)
    measure = UpdateMeasure(opt)
    opt.step()
    assert measure.pairs == {} and measure.counts == {} and p.data.tolist() == [0.5] * 3


def test_update_measure_remove_restores_the_plain_optimiser_and_owns_its_cleanup():
    p = Parameter(np.ones(3, np.float32))
    opt = SGD([p], lr=0.1)
    with UpdateMeasure(opt) as measure:
        assert measure.active and len(opt._update_hooks) == 1 and len(opt._step_pre_hooks) == 1
        opt.step()
        pairs = dict(measure.pairs)
    assert not measure.active and opt._update_hooks == {} and opt._step_pre_hooks == {}
    measure.remove()                                          # idempotent
    opt.step()
    assert measure.pairs == pairs                             # the last step's pairs stay readable


def test_two_measures_on_one_optimiser_are_refused_by_the_optimiser():
    opt = SGD([Parameter(np.ones(2, np.float32))], lr=0.1)
    UpdateMeasure(opt); UpdateMeasure(opt)
    with pytest.raises(RuntimeError, match="two update hooks applied one update"):
        opt.step()


@pytest.mark.parametrize("bad", ["sgd", None, object()])
def test_update_measure_needs_an_optimizer(bad):
    with pytest.raises(TypeError, match=f"got {type(bad).__name__}"):
        UpdateMeasure(bad)


# -- moments and norms in lanes ------------------------------------------------------------------------------------

from minitrain_inspect.inspect import NORM_ERROR, NumpyOps                                   # noqa: E402
from minitrain_inspect.speed import (LANE_ONE_PASS_ERROR, LANE_ONE_PASS_LIMIT, LANE_SUM_ERROR, CompiledOps, compiled_moments, compiled_squares,  # noqa: E402
                                     lane_moments, moment_lane_kernels)
from minitrain_inspect.stats import (MEAN_ERROR, SUM_ERROR, TensorMoments, fold_moments, m2_error_bound, new_state,  # noqa: E402
                                     tensor_moments, welford_update)

BODIES = speed.LANE_BODIES     # the kernels' bodies, uncompiled


def exact_summary(x):
    "Exact mean and M2 (rationals) of the values of `x`, and kappa = 1 + mean**2 / var."
    values = [Fraction(float(v)) for v in np.ravel(x)]
    mean = sum(values) / len(values)
    m2 = sum((v - mean) ** 2 for v in values)
    return mean, m2, (1 + float(mean * mean * (len(values) - 1) / m2) if m2 else 1.0)


def assert_within_08_bounds(tm, x):
    flat = np.ravel(x).astype(np.float64)
    mean, m2, kappa = exact_summary(x)
    assert (tm.n, tm.min, tm.max, tm.nonfinite, tm.nan, tm.m2_exp) == (flat.size, flat.min(), flat.max(), 0, 0, 0)
    assert abs(Fraction(tm.mean) - mean) <= MEAN_ERROR * float(np.mean(np.abs(flat))), (tm.mean, float(mean))
    one_pass = LANE_ONE_PASS_ERROR if np.asarray(x).dtype == np.float32 else 0.0    # float32 may take one pass
    assert abs(Fraction(tm.m2) - m2) <= max(m2_error_bound(kappa), one_pass) * m2, (tm.m2, float(m2), kappa)


def moment_data(seed, n, dtype, offset, scale, repeats):
    rng = np.random.default_rng(seed)
    x = offset + scale * rng.standard_normal(n)
    if repeats:                                   # runs of equal values, and values that cancel
        x[: n // 2] = x[0]
        x[n // 2:] -= 2 * offset if rng.random() < 0.5 else 0.0
    return x.astype(dtype)


MOMENT_CASES = dict(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 700), dtype=DTYPES,
                    offset=st.sampled_from([0.0, 1.0, 1e4, -3e4, 1e8]), scale=st.sampled_from([1e-6, 1e-2, 1.0, 1e3]),
                    repeats=st.booleans())


@settings(max_examples=40, deadline=None)
@given(**MOMENT_CASES, block=st.sampled_from([128, 192, 1024]))
def test_the_lane_route_by_its_python_bodies_is_within_the_bounds_of_08_stats(seed, n, dtype, offset, scale, repeats,
                                                                               block):
    x = moment_data(seed, n, dtype, offset, scale, repeats)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speed, "LANE_BLOCK", block)       # small blocks: several blocks, partial rows and tails
        tm = lane_moments(BODIES, x)
    if tm is None:                                      # float32 data that rounded to one value is never left out
        assert False, x
    if x.min() == x.max():
        assert tm == TensorMoments(n, float(x[0]), 0.0, float(x[0]), float(x[0]))
    else:
        assert_within_08_bounds(tm, x)


@needs_numba
@settings(max_examples=40, deadline=None)
@given(**MOMENT_CASES)
def test_the_compiled_passes_are_within_the_bounds_and_the_deviation_pass_is_its_body_bit_for_bit(seed, n, dtype, offset,
                                                                                                   scale, repeats):
    x = moment_data(seed, n, dtype, offset, scale, repeats)
    kernels = moment_lane_kernels()
    tm = lane_moments(kernels, x)                  # the first pass may reassociate inside a chunk: the bounds, not bits
    assert tm is not None
    if x.min() == x.max():
        assert tm == TensorMoments(n, float(x[0]), 0.0, float(x[0]), float(x[0]))
    else:
        assert_within_08_bounds(tm, x)
    assert speed._blocks_route(kernels, x) == tm   # one block: the same arithmetic either way
    sums = np.empty((4, 1))
    assert kernels.sums(x, sums[0], sums[1]) == (x.min(), x.max())
    BODIES.sums(x, sums[2], sums[3])
    exact = math.fsum(x.astype(np.float64))
    bound = (LANE_SUM_ERROR + 2.0**-52) * math.fsum(np.abs(x.astype(np.float64)))   # and fsum's own rounding
    assert abs(sums[0, 0] - exact) <= bound and abs(sums[2, 0] - exact) <= bound
    blocks = np.empty((4, 1))
    kernels[1](x, 0.0, blocks[0], blocks[1])
    BODIES[1](x, 0.0, blocks[2], blocks[3])
    assert blocks[:2].tobytes() == blocks[2:].tobytes()


@needs_numba
def test_the_compiled_passes_over_several_blocks_are_within_the_bounds():
    rng = np.random.default_rng(4)
    for x in ((5 + rng.standard_normal(speed.LANE_BLOCK * 2 + 77)).astype(np.float32), 1e8 + rng.standard_normal(300_001)):
        tm = compiled_moments(x)
        exact_sum = math.fsum(x.astype(np.float64))
        assert abs(tm.mean * x.size - exact_sum) <= MEAN_ERROR * float(np.sum(np.abs(x.astype(np.float64))))
        dev = x.astype(np.float64) - exact_sum / x.size        # M2 to well within its bound: float64, corrected
        m2 = math.fsum(dev * dev) - math.fsum(dev) ** 2 / x.size
        assert abs(tm.m2 - m2) <= (m2_error_bound(1 + (exact_sum / x.size) ** 2 / (m2 / x.size)) + 1e-12) * m2
        assert (tm.min, tm.max) == (float(x.min()), float(x.max()))


LEFT_ALONE = {"nan and inf": np.float32([1, np.nan, np.inf, -np.inf, 2]), "only nan": np.float32([np.nan, np.nan]),
              "empty": np.zeros((0, 3), np.float32), "one value": np.float32([4.0]), "overflowing sum": np.full(10, 1e308),
              "huge spread": np.float64([1e200, -1e200, 3]), "tiny spread": np.float64([1e-200, 2e-200]),
              "strided": np.ones((4, 6))[:, ::2], "float16": np.ones(4, np.float16), "integers": np.arange(5),
              "a list": [1.0, 2.0, 3.0]}


@pytest.mark.parametrize("what", list(LEFT_ALONE))
def test_what_the_lanes_cannot_guarantee_is_tensor_moments_itself(what):
    x = LEFT_ALONE[what]
    assert compiled_moments(x) == tensor_moments(x)
    if what in ("nan and inf", "only nan", "overflowing sum", "huge spread", "tiny spread"):
        with np.errstate(all="ignore"):
            assert lane_moments(BODIES, x) is None


def test_the_fold_is_welford_updates_bit_for_bit():
    rng = np.random.default_rng(8)
    stream = [rng.standard_normal((8, 9)).astype(np.float32), *LEFT_ALONE.values(), 5e300 * rng.standard_normal(20),
              1e8 + rng.standard_normal(50), np.zeros(0)]
    ours, theirs = new_state(), new_state()
    for x in stream:
        fold_moments(ours, tensor_moments(x))
        welford_update(theirs, x)
        assert ours == theirs or all(ours[k] == theirs[k] or (ours[k] != ours[k] and theirs[k] != theirs[k]) for k in ours)


def test_compiled_ops_without_numba_are_numpy_ops_exactly(monkeypatch):
    monkeypatch.setattr(speed, "optional_numba", lambda: None)
    monkeypatch.setattr(speed, "moment_lane_kernels", lambda: None)
    ops, plain = CompiledOps(), NumpyOps()
    assert not ops.compiled
    rng = np.random.default_rng(2)
    a, b = new_state(), new_state()
    for x in (rng.standard_normal((16, 20)).astype(np.float32), np.float32([1, np.nan]), 1e-3 * rng.standard_normal(99)):
        assert ops.moments(a, x) == plain.moments(b, x) and a == b
        assert ops.norm(x) == plain.norm(x) or math.isnan(plain.norm(x))
    assert compiled_squares(np.ones(3, np.float32)) is None


@needs_numba
def test_compiled_ops_moments_and_norms_are_within_the_bounds_of_the_plain_ones():
    ops, plain = CompiledOps(), NumpyOps()
    rng = np.random.default_rng(3)
    a, b = new_state(), new_state()
    xs = [rng.standard_normal((64, 40)).astype(np.float32), (1e4 + 1e-2 * rng.standard_normal(999)).astype(np.float32),
          np.maximum(rng.standard_normal(500), 0).astype(np.float32), np.float32([1, np.nan, 3]), np.zeros((0, 2), np.float32)]
    for x in xs:
        got, want = ops.moments(a, x), plain.moments(b, x)
        if want.n > 1 and not want.nonfinite:
            assert_within_08_bounds(got, x)
        else:
            assert got == want or (got.n == want.n == 0 and got.nonfinite == want.nonfinite)
    assert (a["n"], a["min"], a["max"], a["tensors"], a["nonfinite"], a["nan"]) == (
        b["n"], b["min"], b["max"], b["tensors"], b["nonfinite"], b["nan"])
    assert abs(a["mean"] - b["mean"]) <= 4 * MEAN_ERROR * 1e4 and abs(a["m2"] - b["m2"]) <= 1e-9 * b["m2"]
    for x in (*xs[:3], 1e-3 * rng.standard_normal(999), np.float64([1e-170, 1e-171]), np.float64([1e200, 1e200]),
              np.float32([np.inf, 1]), np.ones((6, 6), np.float32)[:, ::3], np.zeros(7, np.float32)):
        got, want = ops.norm(x), plain.norm(x)
        assert got == want or abs(got - want) <= 2 * NORM_ERROR * want or (math.isnan(got) and math.isnan(want)), x


@needs_numba
def test_the_lane_norm_is_within_norm_error_of_the_exact_norm():
    rng = np.random.default_rng(6)
    for x in (rng.standard_normal(5000).astype(np.float32), 1e5 * rng.standard_normal(3000), np.float32([3.0, 4.0])):
        exact = sum(Fraction(float(v)) ** 2 for v in x)
        got = CompiledOps().norm(x)
        assert abs(Fraction(got * got) - exact) <= 2.1 * NORM_ERROR * exact
        assert abs(Fraction(compiled_squares(x)) - exact) <= (LANE_SUM_ERROR + 2.0**-52) * exact
    assert LANE_SUM_ERROR < SUM_ERROR


def test_everything_about_the_lanes_works_without_numba():
    r = _python("import sys, math, numpy as np\n"
                "sys.modules['numba'] = None\n"
                "from minitrain_inspect import speed\n"
                "from minitrain_inspect.stats import new_state, tensor_moments\n"
                "ops = speed.CompiledOps(); s = new_state()\n"
                "x = np.arange(10, dtype=np.float32)\n"
                "assert ops.moments(s, x) == tensor_moments(x) and s['n'] == 10\n"
                "assert ops.norm(np.float32([3, 4])) == 5.0 and speed.compiled_squares(x) is None\n"
                "assert speed.moment_lane_kernels() is None and speed.compiled_moments(x) == tensor_moments(x)\n"
                "from minitrain_inspect.panels import SpectralNorm\n"
                "W = np.random.default_rng(0).standard_normal((9, 7)).astype(np.float32)\n"
                "est, plain = ops.spectral(), SpectralNorm()\n"
                "assert type(est) is SpectralNorm and speed.spectral_kernel() is None\n"
                "fast, slow = speed.CompiledSpectralNorm(), SpectralNorm()\n"
                "assert [fast.estimate(W) for _ in range(3)] == [slow.estimate(W) for _ in range(3)]\n"
                "print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_building_compiled_ops_compiles_and_importing_speed_does_not():
    r = _python("import sys, numpy as np\n"
                "from minitrain_inspect import speed\n"
                "assert 'numba' not in sys.modules\n"
                "speed.compiled_moments(np.ones(3, np.float16)); speed.compiled_squares(np.ones(3)[::2])\n"
                "assert 'numba' not in sys.modules, 'numba imported for input the passes do not take'\n"
                "ops = speed.CompiledOps()\n"
                "print(ops.compiled == ('numba' in sys.modules))")   # compiled when built, where numba is installed
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def _watched_weights(make, schedules, steps=9):
    from minitrain_inspect.core import Sequential
    from minitrain_inspect.layers import Linear, ReLU
    from minitrain_inspect.losses import SoftmaxCrossEntropy
    rng = np.random.default_rng(3)
    net = Sequential(fc1=Linear(6, 16, rng=0), act=ReLU(), out=Linear(16, 4, rng=1))
    loss_fn, opt = SoftmaxCrossEntropy(), Adam(net.parameters(), lr=1e-2)
    with make(net, optimizer=opt, loss_fn=loss_fn, schedules=schedules).attach() as insp:
        for _ in range(steps):
            xb, yb = rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8)
            net.zero_grad(); loss_fn(net(xb), yb); net.backprop(loss_fn.backward()); opt.step()
    return insp, b"".join(p.data.tobytes() for p in net.parameters())


@needs_numba
def test_the_fast_update_panel_measures_only_at_the_steps_it_is_due(monkeypatch):
    from minitrain_inspect.inspect import Inspector
    calls = []
    measuring = speed.subtract_measuring
    monkeypatch.setattr(speed, "subtract_measuring", lambda data, update: calls.append(data.shape) or measuring(data, update))
    fast, fast_w = _watched_weights(speed.fast_inspector, {"updates": 3})
    plain, plain_w = _watched_weights(Inspector, {"updates": 3})
    assert fast_w == plain_w                                   # undue steps: the optimiser's own subtraction, same bits
    assert len(calls) == 3 * 4                                 # steps 0, 3, 6: four parameters each, nothing else
    assert fast.history.get("updates/fc1.weight/ratio")[0].tolist() == [0, 3, 6]
    ratios, plain_ratios = fast.history.get("updates/fc1.weight/ratio")[1], plain.history.get("updates/fc1.weight/ratio")[1]
    assert np.all(np.abs(ratios - plain_ratios) <= (2 * NORM_ERROR + 2 * squares_bound(96) + 2.0**-51) * plain_ratios)


def test_a_disarmed_measure_leaves_the_update_to_the_optimiser():
    p = Parameter(np.float32([3.0, 4.0])); p.grad[:] = 1.0
    opt = SGD([p], lr=0.5)
    with UpdateMeasure(opt) as measure:
        measure.armed = False
        opt.step()
        assert measure.pairs == {} and measure.counts == {} and p.data.tolist() == [2.5, 3.5]
        measure.armed = True
        opt.step()
        assert measure.counts == {id(p): 1} and measure.pairs[id(p)] == (math.sqrt(0.5), math.sqrt(2.5**2 + 3.5**2))


def test_float32_data_near_zero_takes_one_pass_and_offsets_take_two(monkeypatch):
    rng = np.random.default_rng(12)
    deviation_passes = []
    counted = lambda *args: deviation_passes.append(1) or BODIES.deviations(*args)
    passes = speed.LaneKernels(BODIES.sums, counted, speed.lane_route(BODIES.sums, counted))
    near_zero = rng.standard_normal(3000).astype(np.float32)
    offset = (1e4 + 1e-2 * rng.standard_normal(3000)).astype(np.float32)
    tm = lane_moments(passes, near_zero)
    assert deviation_passes == [] and tm.m2 > 0
    mean, m2, _ = exact_summary(near_zero)
    assert abs(Fraction(tm.m2) - m2) <= LANE_ONE_PASS_ERROR * m2
    assert_within_08_bounds(lane_moments(passes, offset), offset)
    assert deviation_passes == [1]                              # S2 > 16 M2: the deviations' pass
    assert_within_08_bounds(lane_moments(passes, near_zero.astype(np.float64)), near_zero.astype(np.float64))
    assert deviation_passes == [1, 1]                           # float64: always two passes
    assert LANE_ONE_PASS_LIMIT == 16.0 and LANE_ONE_PASS_ERROR < 25 * SUM_ERROR


def test_without_compiled_ops_the_fast_update_panel_copies(monkeypatch):
    from minitrain_inspect.inspect import Inspector
    monkeypatch.setattr(speed, "optional_numba", lambda: None)       # CompiledOps as without numba
    calls = []
    monkeypatch.setattr(speed, "subtract_measuring", lambda data, update: calls.append(1))
    fast, fast_w = _watched_weights(speed.fast_inspector, {"updates": 1}, steps=3)
    plain, plain_w = _watched_weights(Inspector, {"updates": 1}, steps=3)
    assert calls == [] and fast_w == plain_w                          # the plain copies, never the NumPy twin
    for key in plain.history.keys("updates/"):
        np.testing.assert_array_equal(fast.history.get(key)[1], plain.history.get(key)[1])


@pytest.mark.parametrize("case", ["a parameter listed twice", "a step pre hook that changes the weights"])
def test_the_fast_update_panel_records_what_the_plain_one_does(case):
    "Where the update loop does not see the whole change (a repeated parameter, a pre hook), fast falls back to copies."
    from minitrain_inspect.core import Sequential
    from minitrain_inspect.inspect import EVERY_STEP, Inspector
    from minitrain_inspect.layers import Linear
    from minitrain_inspect.losses import MeanSquaredError

    def decay(opt, args, kwargs):
        for p in opt.params:
            p.data *= np.float32(0.5)

    recorded = {}
    for maker in (Inspector, speed.fast_inspector):
        model, loss = Sequential(fc=Linear(3, 2, rng=0)), MeanSquaredError()
        params = model.parameters()
        opt = SGD(params + [params[0]] if "twice" in case else params, lr=0.1)
        inspector = maker(model, optimizer=opt, loss_fn=loss, schedules=EVERY_STEP).attach()
        if "pre hook" in case:
            opt.register_step_pre_hook(decay)
        model.zero_grad()
        loss(model(np.ones((4, 3), np.float32)), np.zeros((4, 2), np.float32))
        model.backprop(loss.backward())
        before = model["fc"].weight.data.astype(np.float64)
        opt.step()
        truth = np.linalg.norm(model["fc"].weight.data - before) / np.linalg.norm(before)
        recorded[maker.__name__] = inspector.history.get("updates/fc.weight/ratio")[1][0]
        assert abs(recorded[maker.__name__] - truth) <= 1e-12 * truth, (maker.__name__, recorded, truth)


def test_the_fast_update_panel_measures_in_the_update_loop_in_a_plain_run():
    "The conditions hold in `train()`'s own loop: no copy is taken (a fallback there would only cost time)."
    from minitrain_inspect import overhead
    from minitrain_inspect.train import TrainConfig, blas_threads, run_data
    config = TrainConfig(steps=6, hidden=(32, 32), progress=False)
    taken = []
    original = speed.FastUpdatePanel.vouched
    with blas_threads(1):
        run = overhead.TrainingRun(config, run_data(config), "every_step")
        speed.FastUpdatePanel.vouched = staticmethod(lambda o: taken.append(original(o)) or taken[-1])
        try:
            for _ in range(3):
                run.step()
        finally:
            speed.FastUpdatePanel.vouched = staticmethod(original)
    assert taken == [True] * 3 or not speed.optional_numba(), taken
