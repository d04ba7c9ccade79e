"""Issue 19, §1: every statistic of `08_stats` against exact rational arithmetic on the same values, within the error
bounds the notebook states (`SUM_ERROR`, `MEAN_ERROR`, `m2_error_bound`), which hold on any IEEE machine whatever
BLAS kernel is in force: hard data, running merges, merge order and chunking (hypothesis); no statistic through BLAS;
the statistics never import numba (the compiled kernels live in `10a_speed`); the deprecated names still work."""
import ast
import inspect as pyinspect
import math
import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from minitrain_inspect import stats
from minitrain_inspect.stats import (MEAN_ERROR, SUM_ERROR, TensorMoments, _moments_of, float64_sum, m2_error_bound,
                                     merge, merge_moments, new_state, sum_of_squares, tensor_moments, welford_update)

U = 2.0 ** -53


def exact_stats(values) -> tuple[Fraction, Fraction, Fraction]:
    "Exact sum, mean and M2 of finite `values` (at least one), as Fractions, by integer arithmetic."
    ratios = [v.as_integer_ratio() for v in np.asarray(values, np.float64).reshape(-1).tolist()]
    scale = max(d for _, d in ratios)
    ints = [p * (scale // d) for p, d in ratios]
    n, total, squares = len(ints), sum(ints), sum(i * i for i in ints)
    return Fraction(total, scale), Fraction(total, n * scale), Fraction(n * squares - total * total, n * scale * scale)


def root_fraction(value: Fraction) -> Fraction:
    "sqrt of a non-negative Fraction of any size, as a Fraction within 2**-1200 of itself (relative)."
    k = (value.numerator.bit_length() - value.denominator.bit_length()) // 2 - 1300
    scaled = value / Fraction(4) ** k                        # about 4**1300: an integer square root is precise
    return Fraction(math.isqrt(scaled.numerator // scaled.denominator)) * Fraction(2) ** k


def exact_root(value: Fraction) -> float:
    "sqrt of a non-negative Fraction (its square root within float64's range), as a float (within an ulp)."
    return float(root_fraction(value))


def conditioning(values) -> float:
    "κ = 1 + mean² / var (var with ddof=1) of at least two values, not all equal."
    _, mean, m2 = exact_stats(values)
    return float(1 + mean * mean * (len(values) - 1) / m2)


def check_exact(tm: TensorMoments, values, merges: int = 0) -> None:
    """`tm` summarises the finite `values` within the stated bounds, widened for `merges` chained merges (the
    notebook's running-merge bound); min and max exact; and every bound used lies inside the issue's targets."""
    values = np.asarray(values, np.float64).reshape(-1)
    n = values.size
    assert (tm.n, tm.min, tm.max) == (n, float(values.min()), float(values.max()))
    _, mean, m2 = exact_stats(values)
    absmean, absmax = exact_stats(np.abs(values))[1], float(np.abs(values).max())
    slip = Fraction(MEAN_ERROR) * absmean + Fraction(8 * merges * U * absmax)
    if merges == 0:
        assert slip <= Fraction(1, 10 ** 10) * absmean                      # target: mean within 1e-10 of mean|x|
    slip += (2 * merges + 1) * Fraction(2.0 ** -1074)   # a subnormal mean rounds to an absolute 2**-1075, each merge
    assert abs(Fraction(tm.mean) - mean) <= slip, (tm.mean, float(mean))
    if m2 == 0:
        assert tm.m2 == 0.0
        return
    kappa = conditioning(values)
    allowed = Fraction(m2_error_bound(kappa) + 8 * merges * U) * m2
    if merges:
        allowed += 4 * (Fraction(MEAN_ERROR * absmax) + slip) * root_fraction(n * m2)
    else:
        assert m2_error_bound(kappa) <= 1e-10 * kappa                       # target: M2 within 1e-10 κ, relative
    got = Fraction(tm.m2) * Fraction(4) ** tm.m2_exp
    assert abs(got - m2) <= allowed, (float(abs(got - m2) / m2), float(allowed / m2), kappa)
    rel = float(allowed / m2)
    assert math.isclose(tm.std, exact_root(m2 / (n - 1)), rel_tol=rel / 2 + 2 * 2.0 ** -52)
    if merges == 0:
        squares = m2 + n * mean * mean                                     # the L2 norm: 3 SUM_ERROR
        if 0 < squares < Fraction(sys.float_info.max) ** 2:
            assert math.isclose(tm.l2, exact_root(squares), rel_tol=3 * SUM_ERROR)


rng = np.random.default_rng(19)
HARD = {
    "1e8 + N(0, 1), float64": 1e8 + rng.standard_normal(20_000),
    "1e8 + 64 N(0, 1), float32": (1e8 + 64 * rng.standard_normal(20_000)).astype(np.float32),
    "1e4 + 0.01 N(0, 1), float32": (1e4 + 0.01 * rng.standard_normal(30_000)).astype(np.float32),
    "1e15 + N(0, 1), float64 (κ 1e30)": 1e15 + rng.standard_normal(5_000),
    "N(0, 1), float32, 3 blocks and a tail": rng.standard_normal(3 * 4096 + 17).astype(np.float32),
    "ReLU output": np.maximum(rng.standard_normal((64, 256)), 0).astype(np.float32),
    "cancelling sum": np.concatenate([[1e15, -1e15], rng.standard_normal(999)]),
    "90% of values 0.1, float32": np.where(rng.random(50_000) < 0.9, 0.1, rng.standard_normal(50_000)).astype(np.float32),
    "float32 near its largest": (rng.uniform(-1, 1, 500) * 3.4e38).astype(np.float32),
    "float32 subnormal": np.float32([1e-40, -3e-42, 2e-45, 0.0, 7e-39]),
    "float64 near its largest": np.array([1e308, 1.7e308, -1e308, 5e307]),
    "float64 tiny": np.array([1e-200, -1e-200, 3e-201]),
    "integers": np.arange(-500, 1500, dtype=np.int64),
    "two values": np.array([1e8, 1e8 + 1.0]),
}


@pytest.mark.parametrize("what", HARD)
def test_tensor_moments_within_the_bounds_on_hard_data(what):
    check_exact(tensor_moments(HARD[what]), HARD[what])


def test_nan_inf_and_empty():
    x = np.concatenate([HARD["1e8 + N(0, 1), float64"][:1000], [np.nan, np.inf, -np.inf, np.nan]])
    for tm in (tensor_moments(x), tensor_moments(x.astype(np.float32))):
        assert (tm.nonfinite, tm.nan) == (4, 2)
    check_exact(tensor_moments(x), x[:1000])
    for empty in (np.zeros(0), np.zeros((0, 3), np.float32), np.full(4, np.nan)):
        tm = tensor_moments(empty)
        assert tm.n == 0 and tm.m2 == 0.0 and math.isnan(tm.l2) and math.isnan(tm.std)
        state = new_state()
        welford_update(state, empty)
        assert state["n"] == 0 and state["mean"] == 0.0


def test_the_targets_hold_for_every_conditioning():
    "The stated bounds lie inside the targets for any κ >= 1, so checking against them checks the targets too."
    assert MEAN_ERROR <= 1e-10 and 3 * SUM_ERROR <= 1e-10
    for kappa in [1.0, 2.0, 1e4, 1e8, 1e16, 1e24, 1e32, 1e100, 1e300]:
        assert m2_error_bound(kappa) <= 1e-10 * kappa
        assert m2_error_bound(kappa) / 2 + 2 ** -51 <= 1e-10 * kappa        # the std's


@pytest.mark.parametrize("dtype,offset", [(np.float32, 1e4), (np.float64, 1e8), (np.float32, 0.0)])
def test_running_merges_over_a_thousand_chunks(dtype, offset):
    "welford_update over 1000 chunks, and merge of 1000 states in a shuffled order, against the concatenation."
    local = np.random.default_rng(int(offset) % 97)
    chunks = [(offset + 3 * local.standard_normal(int(k))).astype(dtype) for k in local.integers(1, 40, 1000)]
    stream = new_state()
    states = []
    for chunk in chunks:
        welford_update(stream, chunk)
        one = new_state()
        welford_update(one, chunk)
        states.append(one)
    local.shuffle(states)
    merged = new_state()
    for s in states:
        merged = merge(merged, s)
    whole = np.concatenate(chunks)
    for state in (stream, merged):
        assert state["tensors"] == 1000
        check_exact(_moments_of(state), whole, merges=1000)


def test_merge_moments_of_a_tree_of_summaries():
    "Pairwise merges (depth 10) of 1000 summaries: within the bound for 10 chained merges."
    parts = [1e6 + rng.standard_normal(int(k)) for k in rng.integers(1, 30, 1000)]
    level = [tensor_moments(p) for p in parts]
    depth = 0
    while len(level) > 1:
        level = [merge_moments(*level[i:i + 2]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
        depth += 1
    check_exact(level[0], np.concatenate(parts), merges=depth)


# --- hypothesis: chunking and merge order --------------------------------------------------------------------------

values64 = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=64)
values32 = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
data = st.one_of(hnp.arrays(np.float64, st.integers(1, 80), elements=values64),
                 hnp.arrays(np.float64, st.integers(1, 80), elements=values64.map(lambda v: 1e8 + v / 1e6)),
                 hnp.arrays(np.float32, st.integers(1, 80), elements=values32))


def state_of(pieces) -> dict:
    state = new_state()
    for p in pieces:
        welford_update(state, p)
    return state


@settings(max_examples=200, deadline=None)
@given(data, st.lists(st.integers(0, 80), max_size=8))
def test_any_chunking_is_within_the_bounds(x, cuts):
    pieces = np.split(x, sorted({c % (x.size + 1) for c in cuts}))
    check_exact(_moments_of(state_of(pieces)), x, merges=len(pieces))


@settings(max_examples=200, deadline=None)
@given(st.lists(data, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_any_merge_order_is_within_the_bounds(parts, random):
    if len({p.dtype for p in parts}) > 1:
        parts = [p.astype(np.float64) for p in parts]
    states = [state_of([p]) for p in parts]
    random.shuffle(states)
    merged = new_state()
    for s in states:
        merged = merge(merged, s)
    check_exact(_moments_of(merged), np.concatenate(parts), merges=len(parts))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.integers(0, 9000), elements=st.floats(-1e300, 1e300, width=64)))
def test_float64_sum_within_its_bound(x):
    got = float64_sum(x)
    total, absolute = exact_stats(x)[0] if x.size else Fraction(0), exact_stats(np.abs(x))[0] if x.size else Fraction(0)
    if abs(total) <= Fraction(sys.float_info.max) * Fraction(1, 2) and math.isfinite(got):
        assert abs(Fraction(got) - total) <= Fraction(SUM_ERROR) * absolute


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 9000), elements=st.floats(-2.0 ** 100, 2.0 ** 100, width=32)))
def test_sum_of_squares_within_its_bound(x):
    exact = sum(Fraction(int(v.as_integer_ratio()[0]) ** 2, v.as_integer_ratio()[1] ** 2) for v in x.astype(np.float64).tolist())
    assert abs(Fraction(sum_of_squares(x)) - exact) <= Fraction(SUM_ERROR + 2 * U) * exact


# --- no BLAS, no numba, the deprecated names ---------------------------------------------------------------------------------------

BLAS_NAMES = {"dot", "vdot", "matmul", "inner", "outer", "tensordot", "norm", "multi_dot", "vecdot", "matvec", "vecmat"}


def test_no_statistic_goes_through_blas():
    "No call of a BLAS-backed NumPy function and no `@` in the module; every einsum says optimize=False."
    tree = ast.parse(pyinspect.getsource(stats))
    for node in ast.walk(tree):
        assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)), ast.unparse(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in BLAS_NAMES, ast.unparse(node)
            if node.func.attr == "einsum":
                assert any(k.arg == "optimize" and isinstance(k.value, ast.Constant) and k.value.value is False
                           for k in node.keywords), ast.unparse(node)


def test_no_blas_call_at_run_time(monkeypatch):
    "With NumPy's BLAS-backed functions replaced by traps, every statistic still computes."
    def trap(*args, **kwargs):
        raise AssertionError("a statistic called a BLAS-backed function")
    for name in ("dot", "vdot", "matmul", "inner", "tensordot"):
        monkeypatch.setattr(np, name, trap)
    monkeypatch.setattr(np.linalg, "norm", trap)
    state = new_state()
    for x in HARD.values():
        welford_update(state, x)
    assert stats.summarize(state)["n"] == sum(v.size for v in HARD.values())


def test_the_statistics_never_import_numba():
    "The statistics have one exact way, in NumPy: measuring, folding and merging import no numba."
    script = ("import sys\n"
              "import numpy as np\n"
              "from minitrain_inspect import stats\n"
              "state = stats.new_state()\n"
              "stats.welford_update(state, np.ones(10, np.float32))\n"
              "stats.welford_update(state, np.arange(9000, dtype=np.float32))\n"
              "stats.merge(state, state)\n"
              "assert 'numba' not in sys.modules, 'the statistics imported numba'\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not any(hasattr(stats, name) for name in ("moment_kernels", "_sum_blocks", "_deviation_blocks",
                                                        "_compiled_moments"))


def test_one_pass_moments_is_a_deprecated_alias_of_tensor_moments():
    x = HARD["1e4 + 0.01 N(0, 1), float32"]
    with pytest.warns(DeprecationWarning, match="one_pass_moments is deprecated.*tensor_moments") as caught:
        got = stats.one_pass_moments(x)
    assert got == tensor_moments(x)
    assert [w.filename for w in caught] == [__file__]                      # the warning names the caller's line


@pytest.mark.parametrize("fast", [True, False])
def test_welford_update_accepts_fast_with_a_deprecation_warning_and_ignores_it(fast):
    x = HARD["N(0, 1), float32, 3 blocks and a tail"]
    state, plain = new_state(), new_state()
    with pytest.warns(DeprecationWarning, match=r"welford_update\(fast=\.\.\.\) is deprecated") as caught:
        tm = welford_update(state, x, fast=fast)
    assert [w.filename for w in caught] == [__file__]
    assert tm == welford_update(plain, x) and state == plain


def test_welford_update_without_fast_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        welford_update(new_state(), HARD["ReLU output"])
