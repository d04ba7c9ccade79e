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
