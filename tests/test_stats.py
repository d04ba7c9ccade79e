"""Streaming statistics against exact arithmetic on hard data, within the bounds `08_stats` states (so on any machine),
merge invariance (hypothesis), unit health, histograms, schedules, atomic writing. Issue 7 regressions are marked
`# regression (issue 7)`. More exactness tests (running merges, no BLAS, the kernels' bodies) are in test_exact.py."""
import json
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from minitrain_inspect.panels import (Every, LogSchedule, as_schedule, fixed_histogram, histogram_edges,
                                      unit_health)
from minitrain_inspect.stats import (FLOAT64_MAX, MEAN_ERROR, SUM_ERROR, TensorMoments, _moments_of, all_finite,
                                     atomic_output, atomic_write_text, check_int, check_output_path, m2_error_bound, merge,
                                     merge_moments, new_state, scratch_size, summarize, tensor_moments, to_jsonable,
                                     welford_update)
from test_exact import check_exact, exact_root, exact_stats, root_fraction

rng = np.random.default_rng(7)


def feed(chunks):
    state = {}
    for c in chunks:
        welford_update(state, c)
    return state


def test_large_offset_variance():
    x = 1e8 + rng.standard_normal(50_000)
    check_exact(_moments_of(feed(np.array_split(x, 37))), x, merges=37)
    check_exact(tensor_moments(x), x)


def test_float32_input_accumulates_in_float64():
    x = (rng.standard_normal(100_000) * 1e-3 + 5).astype(np.float32)
    check_exact(_moments_of(feed(np.array_split(x, 10))), x, merges=10)
    # float32 deviations (the path this replaced) were off by up to 3 * 2**-24 of M2: far outside the bound
    assert m2_error_bound(1 + 5.0 ** 2 / 1e-6) < 1e-9


def test_nan_inf_are_counted_and_excluded():
    s = summarize(feed([np.array([np.nan, 1.0, -np.inf]), np.array([3.0, np.inf], dtype=np.float32)]))
    assert (s["n"], s["nonfinite"], s["mean"], s["min"], s["max"]) == (2, 3, 2.0, 1.0, 3.0)
    json.dumps(s, allow_nan=False)


def test_all_nonfinite_tensor():
    s = summarize(feed([np.full((2, 2), np.nan)]))
    assert s["n"] == 0 and s["nonfinite"] == 4 and s["mean"] is None and s["var"] is None
    json.dumps(s, allow_nan=False)


def test_empty_and_integer_input():
    state = feed([np.zeros((0, 3)), np.arange(10, dtype=np.int16), np.array([True, True])])
    assert state["n"] == 12 and state["tensors"] == 2
    # 3 tensors (two chained merges): the mean within MEAN_ERROR of the mean |x|, plus 8u of the largest |x| a merge
    assert abs(state["mean"] - 47 / 12) <= MEAN_ERROR * 47 / 12 + 2 * 8 * 2.0 ** -53 * 9


def test_wrong_dtype_rejected():
    with pytest.raises(TypeError, match="real numbers"):
        welford_update({}, np.array(["x"]))
    with pytest.raises(TypeError, match="real numbers"):
        welford_update({}, np.array([1 + 2j]))


def test_l2_and_running_mean_of_l2():
    a, b = rng.standard_normal(100), rng.standard_normal(50)
    state = feed([a, b])
    norm_a, norm_b = (exact_root(exact_stats(v * v)[0]) for v in (a, b))     # exact, never np.linalg.norm (BLAS)
    assert math.isclose(state["l2"], norm_b, rel_tol=3 * SUM_ERROR)
    assert math.isclose(state["l2_mean"], (norm_a + norm_b) / 2, rel_tol=3 * SUM_ERROR + 2.0 ** -51)


def test_single_value_has_undefined_variance():
    s = summarize(feed([np.array([4.0])]))
    assert s["var"] is None and s["mean"] == 4.0


def test_to_jsonable_strict():
    out = to_jsonable({"a": np.float32(np.inf), "b": (np.int8(3), np.bool_(True)), "c": np.array([[1.5]])})
    assert out == {"a": None, "b": [3, True], "c": [[1.5]]}
    json.dumps(out, allow_nan=False)


finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, width=64)
data_arrays = hnp.arrays(np.float64, st.integers(0, 80), elements=finite)


def split_at(x, cuts):
    return np.split(x, sorted({c % (len(x) + 1) for c in cuts}))


def m2_of(state):
    "M2 itself (states of very small or very large data keep it as m2 * 4**m2_exp)."
    return math.ldexp(state["m2"], 2 * state.get("m2_exp", 0))


def assert_exact_moments(state, values, merges):
    "The state holds the statistics of `values` within the stated bounds for `merges` chained merges."
    assert state["n"] == values.size
    if values.size:
        check_exact(_moments_of(state), values, merges)


@settings(max_examples=200, deadline=None)
@given(data_arrays, st.lists(st.integers(0, 80), max_size=8), st.lists(st.integers(0, 80), max_size=8))
def test_chunking_does_not_matter(x, cuts_a, cuts_b):
    for cuts in (cuts_a, cuts_b):
        assert_exact_moments(feed(split_at(x, cuts)), x, len(cuts) + 1)


def merge_shuffled(parts, random):
    "The states of `parts` (one worker each), merged in a random order; and the states."
    states = [feed([p]) for p in parts]
    random.shuffle(states)
    merged = new_state()
    for s in states:
        merged = merge(merged, s)
    return merged, states


@settings(max_examples=200, deadline=None)
@given(st.lists(data_arrays, min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_merge_of_workers_equals_one_stream(parts, random):
    "Statistics from several workers, merged in any order, equal those of one stream over all the data."
    merged, states = merge_shuffled(parts, random)
    assert_exact_moments(merged, np.concatenate(parts), len(parts))
    assert merged["tensors"] == sum(s["tensors"] for s in states)
    assert merged["nonfinite"] == 0


def test_merge_matches_numpy():
    a, b = rng.standard_normal(300) + 1e6, rng.standard_normal(700) * 2 + 1e6
    m = merge(feed([a]), feed([b]))
    check_exact(_moments_of(m), np.concatenate([a, b]), merges=2)


@pytest.mark.parametrize("n", [1, 2, 4095, 4096, 4097, 8191, 12_289, 24_192, 122_472])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_float32_blocks_of_any_size_are_exact_with_or_without_scratch(n, offset):
    "08's float32 road (equal blocks, zero-padded): within the bounds at sizes around the block length, offset or not."
    x = (offset + rng.standard_normal(n)).astype(np.float32)
    tm = tensor_moments(x)
    check_exact(tm, x)
    scratch = np.full(scratch_size(n), np.nan)                       # a used buffer: the padding must be written
    assert tensor_moments(x, scratch) == tm
    assert not np.isnan(scratch[:n]).any(), "expected the float64 copy written into a scratch that fits"
    shared = np.zeros(2 * scratch_size(n) + 2, np.float32)         # a scratch over the input's own memory: refused
    shared[:n] = x
    assert tensor_moments(shared[:n], shared.view(np.float64)) == tm and np.array_equal(shared[:n], x)


@pytest.mark.parametrize("offset,spread", [(1e3, 1e-3), (1e4, 1e-2), (1e6, 1.0)])
def test_float32_with_large_offset(offset, spread):
    x = (offset + spread * rng.standard_normal(100_000)).astype(np.float32)
    check_exact(_moments_of(feed(np.array_split(x, 9))), x, merges=9)


def test_lab_shaped_state_dict():
    state = {"n": 0}
    welford_update(state, np.array([2.0, 4.0]))
    assert state["mean"] == 3.0 and state["m2"] == 2.0
    assert merge({"n": 0}, state)["n"] == 2


# ---------------------------------------------------------------------------------------------------------------
# Issue 7: no overflow, NaN apart from inf.

def exact_moments(values):
    "Exact mean, M2 and sum of squares of finite floats, as Fractions."
    fr = [Fraction(float(v)) for v in values]
    mean = sum(fr) / len(fr)
    return mean, sum((v - mean) ** 2 for v in fr), sum(v * v for v in fr)


def true_m2(tm: TensorMoments) -> Fraction:
    return Fraction(tm.m2) * Fraction(4) ** tm.m2_exp


def fraction_sqrt(value: Fraction) -> Fraction:
    "sqrt of a non-negative Fraction of any size, to far better than float64 precision."
    return Fraction(math.isqrt(value.numerator * 4 ** 1200 // value.denominator), 2 ** 1200)


def check_against_exact(tm: TensorMoments, values):
    """tm agrees with exact arithmetic within the stated bounds (mean: MEAN_ERROR of the mean |x|; M2: m2_error_bound;
    l2: 3 SUM_ERROR, or saturated), plus what underflow may cost at the ends of float64's range: at most 2**-1072 of
    the largest |x| for the mean, and n * 2**-1060 of M2 (the deviations are scaled so that the largest is about 1)."""
    values = np.asarray(values, dtype=np.float64)
    n, absmax = values.size, float(np.abs(values).max())
    _, mean, m2 = exact_stats(values)
    squares = m2 + n * mean * mean                               # the exact sum of squares
    assert tm.n == n and math.isfinite(tm.mean) and math.isfinite(tm.m2)
    tiny = Fraction(2.0 ** -1074)
    slip = Fraction(MEAN_ERROR) * exact_stats(np.abs(values))[1] + 4 * Fraction(absmax) * tiny + tiny
    assert abs(Fraction(tm.mean) - mean) <= slip
    if m2:
        kappa = float(1 + mean * mean * (n - 1) / m2) if n > 1 else 1.0
        tolerance = Fraction(m2_error_bound(kappa) + n * 2.0 ** -1060) * m2
        assert abs(true_m2(tm) - m2) <= tolerance, (float(abs(true_m2(tm) - m2) / m2), kappa)
    else:
        assert tm.m2 == 0.0
    l2 = fraction_sqrt(squares)
    if l2 > Fraction(FLOAT64_MAX) * Fraction(1 + 6 * SUM_ERROR):
        assert tm.l2 == FLOAT64_MAX                              # saturated, documented, never inf
    elif squares:
        l2 = float(min(l2, Fraction(FLOAT64_MAX)))
        assert abs(tm.l2 - l2) <= 3 * SUM_ERROR * l2 + 2.0 ** -1073
    assert math.isfinite(tm.l2) and (n < 2 or math.isfinite(tm.std))


def test_float32_overflow_of_squares():  # regression (issue 7): l2 was inf, std and l2 null in JSON
    tm = tensor_moments(np.array([1e20, -1e20], np.float32))
    assert tm.l2 == pytest.approx(math.sqrt(2) * 1e20, rel=1e-7)
    assert tm.std == pytest.approx(math.sqrt(2) * 1e20, rel=1e-7)
    s = summarize(feed([np.array([1e20, -1e20], np.float32)]))
    assert s["std"] == pytest.approx(math.sqrt(2) * 1e20, rel=1e-7) and s["l2"] == pytest.approx(math.sqrt(2) * 1e20)
    assert s["saturated"] == ""
    json.dumps(s, allow_nan=False)


@pytest.mark.parametrize("scale", [1e19, 1e25, 1e30, 1e38, float(np.finfo(np.float32).max)])
def test_float32_any_magnitude_is_finite_and_exact(scale):  # regression (issue 7)
    x = (np.random.default_rng(1).uniform(-1, 1, 500) * scale).astype(np.float32)
    check_against_exact(tensor_moments(x), x)
    check_exact(_moments_of(feed(np.array_split(x, 7))), x, merges=7)
    assert summarize(feed(np.array_split(x, 7)))["l2"] is not None


def test_float32_tiny_values_do_not_underflow():  # regression (issue 7): float32 squares of 1e-30 were 0
    x = np.array([1e-30, -1e-30, 2e-30, 0.0], np.float32)
    check_against_exact(tensor_moments(x), x)


def test_float64_extremes():
    check_against_exact(tensor_moments(np.array([1e308, 1e308, -1e308])), [1e308, 1e308, -1e308])
    check_against_exact(tensor_moments(np.array([1e200, -3e200, 5e199])), [1e200, -3e200, 5e199])
    check_against_exact(tensor_moments(np.array([1e-200, -1e-200])), [1e-200, -1e-200])
    check_against_exact(tensor_moments(np.array([5e-324, 0.0, -5e-324])), [5e-324, 0.0, -5e-324])


def test_unrepresentable_values_saturate_and_say_so():
    "The documented choice: a true value beyond float64 is reported as FLOAT64_MAX and named in `saturated`."
    tm = tensor_moments(np.array([1.7e308, 1.7e308]))
    assert tm.l2 == FLOAT64_MAX and tm.std == 0.0
    s = summarize(feed([np.array([1.7e308, -1.7e308])]))
    assert s["var"] == FLOAT64_MAX and s["std"] == FLOAT64_MAX and s["l2"] == FLOAT64_MAX
    assert s["saturated"] == "var,std,l2,l2_mean"
    json.dumps(s, allow_nan=False)


any_float64 = st.floats(allow_nan=False, allow_infinity=False, width=64)
any_float32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 12), elements=any_float64))
def test_any_finite_float64_gives_finite_exact_moments(x):
    check_against_exact(tensor_moments(x), x)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 12), elements=any_float32))
def test_any_finite_float32_gives_finite_exact_moments(x):
    check_against_exact(tensor_moments(x), x)


@settings(max_examples=300, deadline=None)
@given(st.lists(hnp.arrays(np.float64, st.integers(0, 6), elements=any_float64), min_size=1, max_size=4),
       st.randoms(use_true_random=False))
def test_merging_extreme_states_stays_finite_and_exact(parts, random):
    "States (and merges of states) of any finite data never overflow and agree with exact arithmetic."
    merged, _ = merge_shuffled(parts, random)
    whole = np.concatenate(parts)
    assert merged["n"] == whole.size
    assert all(math.isfinite(merged[k]) for k in ("mean", "m2", "l2_mean"))
    if whole.size:
        moments = TensorMoments(merged["n"], merged["mean"], merged["m2"], merged["min"], merged["max"],
                                m2_exp=merged["m2_exp"])
        n, absmax = whole.size, float(np.abs(whole).max())
        _, mean, m2 = exact_stats(whole)
        tiny, k, u = Fraction(2.0 ** -1074), len(parts), 2.0 ** -53      # the notebook's bound for k chained merges
        # each merge may also round a subnormal mean by an absolute 2**-1075
        slip = Fraction(8 * k * u + 2.0 ** -1070) * Fraction(absmax) + (2 * k + 1) * tiny
        assert abs(Fraction(moments.mean) - mean) <= Fraction(MEAN_ERROR) * exact_stats(np.abs(whole))[1] + slip
        if m2:
            kappa = float(1 + mean * mean * (n - 1) / m2) if n > 1 else 1.0
            allowed = (Fraction(m2_error_bound(kappa) + 8 * k * u + n * 2.0 ** -1060) * m2
                       + 4 * (Fraction(MEAN_ERROR * absmax) + slip) * root_fraction(n * m2))
            assert abs(true_m2(moments) - m2) <= allowed
        assert math.isfinite(moments.std if n > 1 else 0.0)
        summary = summarize(merged)
        json.dumps(summary, allow_nan=False)
        assert summary["mean"] is not None and (n < 2 or summary["std"] is not None)


def test_merge_moments_of_opposite_extremes():
    m = merge_moments(tensor_moments(np.array([-1e308])), tensor_moments(np.array([1e308])))
    assert m.mean == 0.0 and m.std == pytest.approx(math.sqrt(2) * 1e308, rel=1e-15)


def test_nan_counted_apart_from_inf():  # regression (issue 7): only a total was kept
    x = np.array([np.nan, np.inf, -np.inf, np.nan, np.nan, 1.0], np.float32)
    tm = tensor_moments(x)
    assert (tm.n, tm.nonfinite, tm.nan, tm.inf) == (1, 5, 3, 2)
    state = feed([x, np.array([np.inf, 2.0])])
    assert (state["nonfinite"], state["nan"]) == (6, 3)
    m = merge(state, feed([np.array([np.nan])]))
    assert (m["nonfinite"], m["nan"]) == (7, 4)
    s = summarize(m)
    assert (s["nonfinite"], s["nan"], s["inf"], s["n"]) == (7, 4, 3, 2)


def test_all_finite_shortcut():
    assert all_finite(np.ones(4, np.float32)) and all_finite(np.arange(3)) and all_finite(np.zeros(0))
    assert all_finite(np.array([1e308, 1e308]))                 # the sum overflows, the values do not
    assert not all_finite(np.array([1.0, np.nan])) and not all_finite(np.array([np.inf], np.float32))
    with pytest.raises(TypeError, match="real numbers"):
        all_finite(np.array(["a"]))


def test_lab_state_still_plain():
    "Ordinary data keeps the lab's meaning of state['m2'] (M2 itself, m2_exp 0)."
    state = feed([np.array([1.0, 2.0, 4.0])])
    assert state["m2_exp"] == 0 and math.isclose(state["m2"], 14 / 3, rel_tol=m2_error_bound(2.0))


# ---------------------------------------------------------------------------------------------------------------
# Unit health, histograms, schedules.

def test_dead_units_are_units_dead_for_every_example():  # regression (issue 7): "dead" was the share of zero outputs
    rng = np.random.default_rng(3)
    healthy = np.maximum(rng.standard_normal((64, 50)), 0)
    dead, zero_share = unit_health(healthy, "relu")
    assert dead == 0.0 and 0.4 < zero_share < 0.6                # half the outputs zero, no dead unit
    healthy[:, :10] = 0.0                                        # kill 10 of 50 units
    healthy[0, 10] = 0.0                                         # one zero output of a live unit changes no unit
    dead, zero_share = unit_health(healthy, "relu")
    assert dead == pytest.approx(0.2) and zero_share == pytest.approx(np.mean(healthy <= 0))


def test_tanh_saturated_units():
    out = np.tanh(np.array([[5.0, 0.1, -5.0], [-6.0, 4.0, 0.2], [7.0, 3.0, 0.0]]))
    assert unit_health(out, "tanh") == pytest.approx((1 / 3, 6 / 9))   # only unit 0 saturated throughout


def test_unit_health_edge_inputs():
    assert unit_health(np.array([-1.0, 0.0, 2.0]), "relu") == pytest.approx((2 / 3, 2 / 3))   # 1-D: one example
    assert unit_health(np.float32(-1.0), "relu") == (1.0, 1.0)                              # a scalar: one unit
    assert unit_health(np.zeros((2, 3, 4)), "relu") == (1.0, 1.0)
    assert unit_health(np.array([[np.nan, -1.0], [np.nan, 1.0]]), "relu") == (0.0, 0.5)     # NaN unit left out
    assert unit_health(np.array([[np.nan, -1.0], [0.0, np.nan]]), "relu") == (1.0, 1.0)     # dead where defined
    for empty in (np.zeros((0, 4)), np.zeros((4, 0)), np.zeros(0), np.full((2, 2), np.nan)):
        assert all(math.isnan(v) for v in unit_health(empty, "relu"))
    with pytest.raises(ValueError, match="'relu' and 'tanh'"):
        unit_health(np.ones(3), "sigmoid")
    with pytest.raises(TypeError, match="real numbers"):
        unit_health(np.array(["x"]), "relu")


def test_histogram_counts_outliers_apart():  # regression (issue 7): outliers were clamped into the edge bins
    h = fixed_histogram(np.array([-5.0, 0.5, 1.5, 2.0, 9.0, 11.0, np.nan]), 0.0, 2.0, 2)
    assert list(h.fractions) == pytest.approx([1 / 6, 2 / 6])    # 2.0 is the top edge: last bin
    assert (h.below, h.above, h.nan) == (pytest.approx(1 / 6), pytest.approx(2 / 6), 1)
    exploded = fixed_histogram(np.full(100, 50.0, np.float32), 0.0, 4.0, 40)
    assert exploded.above == 1.0 and exploded.fractions.sum() == 0.0


def test_histogram_bad_arguments():
    for args, match in [((0.0, 1.0, 0), "at least 1"), ((1.0, 0.0, 4), "finite lo < hi"),
                        ((0.0, math.inf, 4), "finite lo < hi"), ((math.nan, 1.0, 4), "finite lo < hi"),
                        ((0.0, 1.0, 2.5), "integer")]:
        with pytest.raises((TypeError, ValueError), match=match):
            fixed_histogram(np.ones(3), *args)
    with pytest.raises(ValueError, match="'relu' and 'tanh'"):
        histogram_edges("gelu")


def test_schedules_validate_and_round_trip():
    for schedule in (Every(1), Every(250), LogSchedule(), LogSchedule(1.0001, 0), LogSchedule(3, 100)):
        assert as_schedule(schedule.to_spec()) == schedule
    assert not hasattr(Every(2), "stretch") and not hasattr(LogSchedule(), "stretch")
    bad = [0, -3, True, 2.5, "often", "every", "every 0", "every -1", "log 1", "log x", "log 2 dense -1",
           "log 2 sparse 3", None, [5]]
    for spec in bad:
        with pytest.raises((TypeError, ValueError)):
            as_schedule(spec)
    for ratio in (1.0, 0.5, math.nan, math.inf, 10 ** 400, "2", True):
        with pytest.raises((TypeError, ValueError)):
            LogSchedule(ratio)
    for step in (-1, 1.5, "3", None, True):
        with pytest.raises((TypeError, ValueError)):
            Every(3).due(step)


def test_check_int_messages():
    assert check_int(np.int32(4), "n", 1) == 4
    with pytest.raises(TypeError, match="bins must be an integer, got True"):
        check_int(True, "bins")
    with pytest.raises(ValueError, match="between 2 and 9, got 10"):
        check_int(10, "max_points", 2, 9)


# ---------------------------------------------------------------------------------------------------------------
# Atomic writing.

def test_atomic_write_replaces_and_cleans_up(tmp_path):
    target = tmp_path / "out.txt"
    assert atomic_write_text(target, "one") == target and target.read_text() == "one"
    atomic_write_text(str(target), "two")
    assert target.read_text() == "two" and os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("fault", [KeyboardInterrupt, RuntimeError, OSError])
def test_failed_write_leaves_previous_file_intact(tmp_path, fault):
    target = tmp_path / "out.txt"
    target.write_text("previous")
    with pytest.raises(fault):
        with atomic_output(target) as tmp:
            tmp.write_text("half of the n")
            raise fault()
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["out.txt"]


def test_failed_rename_leaves_previous_file_intact(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("previous")

    def no_rename(src, dst):
        raise KeyboardInterrupt  # Ctrl-C at the worst moment
    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    assert target.read_text() == "previous" and os.listdir(tmp_path) == ["out.txt"]


def test_atomic_output_keeps_suffix_and_permissions(tmp_path):
    target = tmp_path / "fig.png"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    with atomic_output(target) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o640


def test_bad_output_paths(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path, "it is a folder"), (tmp_path / "missing" / "f.txt", "does not exist"),
             (tmp_path / "file" / "f.txt", "is not a folder"), ("/proc/minitrain-x", "cannot create a file")]
    for path, match in cases:
        with pytest.raises(ValueError, match=match):
            atomic_write_text(path, "x")
    with pytest.raises(TypeError, match="writes a str"):
        atomic_write_text(tmp_path / "a", b"bytes")
    with pytest.raises(TypeError, match="str or os.PathLike"):
        atomic_write_text(3, "x")
    for path, match in cases:
        with pytest.raises(ValueError, match=match):
            check_output_path(path)
    assert check_output_path(tmp_path / "ok.txt") == tmp_path / "ok.txt"
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot create a file in folder"):
            atomic_write_text(locked / "f.txt", "x")
    finally:
        locked.chmod(0o700)


def test_spectral_norm_of_huge_float32_weights_is_a_number():
    "Regression: sigma above about 1.8e19 overflowed float32 and came back as NaN (a gap in the panel)."
    from minitrain_inspect.panels import SpectralNorm
    W = (np.random.default_rng(0).standard_normal((20, 10)) * 1e20).astype(np.float32)
    sigma = SpectralNorm(warmup=200).estimate(W)
    assert sigma == pytest.approx(np.linalg.norm(W.astype(np.float64), 2), rel=1e-4)


def test_scratch_size_refuses_a_bad_count():
    from minitrain_inspect.stats import scratch_size
    for bad, error in [(-5, ValueError), (2.5, TypeError), ("7", TypeError), (True, TypeError)]:
        with pytest.raises(error, match="n must"):
            scratch_size(bad)
    assert scratch_size(0) == 1 and scratch_size(4096) == 4096 and scratch_size(4097) == 4098


@pytest.mark.parametrize("values, dtype", [([2 ** 53 + 1, 5], np.int64), ([-(2 ** 62) - 1, 0], np.int64),
                                           ([2 ** 64 - 1, 2 ** 64 - 2], np.uint64)])
def test_64_bit_integers_float64_cannot_hold_are_refused(values, dtype):
    "Their extremes would come back rounded (2**53 + 1 as 2**53): refused by name, not silently rounded."
    with pytest.raises(ValueError, match="exactly only up to 2\\*\\*53"):
        tensor_moments(np.array(values, dtype=dtype))


def test_64_bit_integers_within_2_to_the_53_are_exact():
    tm = tensor_moments(np.array([2 ** 53, -(2 ** 53), 7], dtype=np.int64))
    assert (tm.min, tm.max, tm.n) == (-(2 ** 53), 2 ** 53, 3)
