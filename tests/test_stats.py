"Streaming statistics against NumPy on hard data, and merge invariance (hypothesis)."
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from minitrain_inspect.stats import merge, new_state, summarize, to_jsonable, welford_update

rng = np.random.default_rng(7)


def feed(chunks):
    state = {}
    for c in chunks:
        welford_update(state, c)
    return state


def rel(a, b):
    return abs(a - b) / abs(b)


def test_large_offset_variance():
    x = 1e8 + rng.standard_normal(50_000)
    s = summarize(feed(np.array_split(x, 37)))
    assert rel(s["var"], np.var(x, ddof=1)) <= 1e-9
    assert rel(s["mean"], x.mean()) <= 1e-15


def test_float32_input_accumulates_in_float64():
    x = (rng.standard_normal(100_000) * 1e-3 + 5).astype(np.float32)
    s = summarize(feed(np.array_split(x, 10)))
    ref = x.astype(np.float64)
    assert rel(s["var"], ref.var(ddof=1)) <= 1e-7
    assert rel(s["mean"], ref.mean()) <= 1e-12


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
    assert state["mean"] == pytest.approx((45 + 2) / 12)


def test_wrong_dtype_rejected():
    with pytest.raises(TypeError, match="real numbers"):
        welford_update({}, np.array(["x"]))
    with pytest.raises(TypeError, match="real numbers"):
        welford_update({}, np.array([1 + 2j]))


def test_l2_and_running_mean_of_l2():
    a, b = rng.standard_normal(100), rng.standard_normal(50)
    state = feed([a, b])
    assert state["l2"] == pytest.approx(np.linalg.norm(b))
    assert state["l2_mean"] == pytest.approx((np.linalg.norm(a) + np.linalg.norm(b)) / 2)


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


def assert_same_moments(a, b):
    assert a["n"] == b["n"]
    if a["n"]:
        scale = max(abs(b["mean"]), 1.0)
        assert abs(a["mean"] - b["mean"]) <= 1e-9 * scale
        assert abs(a["m2"] - b["m2"]) <= 1e-7 * max(b["m2"], 1.0) + 1e-9 * scale * scale
        assert a["min"] == b["min"] and a["max"] == b["max"]


@settings(max_examples=200, deadline=None)
@given(data_arrays, st.lists(st.integers(0, 80), max_size=8), st.lists(st.integers(0, 80), max_size=8))
def test_chunking_does_not_matter(x, cuts_a, cuts_b):
    assert_same_moments(feed(split_at(x, cuts_a)), feed(split_at(x, cuts_b)))


@settings(max_examples=200, deadline=None)
@given(st.lists(data_arrays, min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_merge_of_workers_equals_one_stream(parts, random):
    "Statistics from several workers, merged in any order, equal those of one stream over all the data."
    states = [feed([p]) for p in parts]
    random.shuffle(states)
    merged = new_state()
    for s in states:
        merged = merge(merged, s)
    whole = feed([np.concatenate(parts)])
    assert_same_moments(merged, whole)
    assert merged["tensors"] == sum(s["tensors"] for s in states)
    assert merged["nonfinite"] == 0


def test_merge_matches_numpy():
    a, b = rng.standard_normal(300) + 1e6, rng.standard_normal(700) * 2 + 1e6
    m = merge(feed([a]), feed([b]))
    both = np.concatenate([a, b])
    assert rel(m["m2"] / (m["n"] - 1), np.var(both, ddof=1)) <= 1e-9


@pytest.mark.parametrize("offset,spread", [(1e3, 1e-3), (1e4, 1e-2), (1e6, 1.0)])
def test_float32_with_large_offset(offset, spread):
    x = (offset + spread * rng.standard_normal(100_000)).astype(np.float32)
    s = summarize(feed(np.array_split(x, 9)))
    assert rel(s["var"], x.astype(np.float64).var(ddof=1)) <= 1e-7


def test_lab_shaped_state_dict():
    state = {"n": 0}
    welford_update(state, np.array([2.0, 4.0]))
    assert state["mean"] == 3.0 and state["m2"] == 2.0
    assert merge({"n": 0}, state)["n"] == 2
