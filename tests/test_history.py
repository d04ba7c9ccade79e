"""History: ordered recording, bounded memory, atomic saves, and a JSON Lines format that is validated on load
(issue 7). Every corrupt-file case must raise a ValueError that names the file and the line."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minitrain_inspect import panels
from minitrain_inspect.panels import HISTORY_VERSION, MAX_POINTS_LIMIT, BoundedSeries, History
from minitrain_inspect.stats import FLOAT64_MAX

DATA = Path(__file__).parent / "data"


def sample_history(max_points=8):
    h = History(max_points=max_points)
    for step in range(30):
        h.record("loss/train", step, 1.0 / (step + 1))
        if step % 3 == 0:
            h.record("units/act1/histogram", step, [0.25, 0.75])
            h.record("activations/act1/mean", step, step * 0.5)
    h.record("per_class/regular", 2, None)
    h.record("spectral/a.b/with/extra/parts", 0, 3)           # more structure than panel/name/field
    h.meta.update(title="run", config={"lr": 0.1}, histogram={"act1": {"kind": "relu", "lo": 0.0, "hi": 4.0, "bins": 2}})
    return h


@pytest.fixture
def saved(tmp_path):
    h = sample_history()
    path = h.save_jsonl(tmp_path / "h.jsonl")
    return h, path, path.read_text().splitlines()


# ---------------------------------------------------------------------------------------------------------------
# Recording.

def test_same_step_replaces_last_point():  # regression (issue 7): a second value at a step was appended
    h = History()
    h.record("loss/train", 0, 1.0)
    h.record("loss/train", 0, 2.0)
    h.record("loss/train", 1, 3.0)
    steps, values = h.get("loss/train")
    assert list(steps) == [0, 1] and list(values) == [2.0, 3.0]


def test_earlier_step_raises_naming_key_and_steps():  # regression (issue 7): went back in time silently
    h = History()
    h.record("gradients/fc1.weight/l2", 5, 1.0)
    with pytest.raises(ValueError, match=r"'gradients/fc1.weight/l2': step 4 comes before the last recorded step 5"):
        h.record("gradients/fc1.weight/l2", 4, 1.0)


def test_order_is_kept_across_thinning():
    h = History(max_points=4)
    for step in range(0, 40, 2):
        h.record("k", step, float(step))
    s = h.series["k"]
    assert s.stride > 1 and s.last_step == 38
    h.record("k", 38, -1.0)                                    # same as the last offered step: no new point
    assert s.offered == 20
    with pytest.raises(ValueError, match="step 37 comes before the last recorded step 38"):
        h.record("k", 37, 0.0)


@pytest.mark.parametrize("key,step,value,error", [
    ("k", -1, 1.0, ValueError), ("k", 1.0, 1.0, TypeError), ("k", True, 1.0, TypeError), ("k", "3", 1.0, TypeError),
    ("k", 0, "1.0", TypeError), ("k", 0, True, TypeError), ("k", 0, {"a": 1}, TypeError),
    ("k", 0, [[1.0]], TypeError), ("k", 0, object(), TypeError), ("", 0, 1.0, TypeError), (3, 0, 1.0, TypeError),
    (None, 0, 1.0, TypeError)])
def test_bad_records_are_refused_and_leave_nothing(key, step, value, error):
    h = History()
    with pytest.raises(error):
        h.record(key, step, value)
    assert h.keys() == [] and h.points() == 0


def test_values_are_normalised():
    h = History()
    h.record("a", 0, np.float32(1.5)); h.record("b", 0, np.int64(2)); h.record("c", 0, np.array([0.5, 0.5], np.float32))
    h.record("d", 0, None); h.record("e", 0, (1, None)); h.record("f", 0, -math.inf); h.record("g", 0, [math.inf])
    assert h.series["a"].values == [1.5] and h.series["b"].values == [2.0] and h.series["c"].values == [[0.5, 0.5]]
    assert math.isnan(h.series["d"].values[0]) and h.series["e"].values[0][0] == 1.0
    # ±inf is kept as it is (format 4 saves it by name): an overflow is not the largest float.
    assert h.series["f"].values == [-math.inf] and h.series["g"].values == [[math.inf]]


@pytest.mark.parametrize("max_points", [0, 1, -2, MAX_POINTS_LIMIT + 1, 2.5, "512", True, None])
def test_max_points_checked(max_points):
    with pytest.raises((TypeError, ValueError), match="max_points"):
        History(max_points)


def test_public_reading_api_unchanged():
    h = sample_history()
    assert h.keys()[:2] == ["loss/train", "units/act1/histogram"] and h.keys("per_class") == ["per_class/regular"]
    steps, values = h.get("loss/train")
    assert steps.dtype.kind == "i" and values.dtype == float and len(steps) == len(values)
    assert h.get("missing")[0].size == 0 and h.get("missing")[1].size == 0
    assert h.get("units/act1/histogram")[1].shape[1] == 2
    assert h.names("spectral") == ["a.b"] and h.names("units") == ["act1"]
    assert h.points() == sum(len(s) for s in h.series.values())


# ---------------------------------------------------------------------------------------------------------------
# Round trip.

def test_round_trip_is_equal(saved, tmp_path):
    h, path, lines = saved
    back = History.load_jsonl(path)
    assert back == h and back is not h
    head = json.loads(lines[0])
    assert head["version"] == HISTORY_VERSION and head["series"] == len(h.series) == len(lines) - 1
    assert History.load_jsonl(back.save_jsonl(tmp_path / "again.jsonl")) == h


def test_thinning_continues_the_same_after_load(saved):  # regression (issue 7): stride/offered were lost
    h, path, _ = saved
    back = History.load_jsonl(path)
    for step in range(30, 200):
        h.record("loss/train", step, float(step))
        back.record("loss/train", step, float(step))
    assert back == h
    assert back.series["loss/train"].steps == h.series["loss/train"].steps


def test_equality_notices_differences():
    a, b = sample_history(), sample_history()
    assert a == b
    b.record("loss/train", 30, 0.0)
    assert a != b
    c = sample_history(); c.meta["title"] = "other"
    assert a != c
    assert BoundedSeries(4) == BoundedSeries(4) and BoundedSeries(4) != BoundedSeries(5)
    assert a != "history"


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.lists(st.tuples(st.integers(0, 3), st.floats(allow_nan=True, width=64)), max_size=80),
       st.integers(0, 80), st.lists(st.integers(1, 3), min_size=1, max_size=40))
def test_round_trip_property(tmp_path_factory, max_points, points, cut, later_gaps):
    "Any recorded history, saved at any point and loaded, equals the original and keeps evolving identically."
    h = History(max_points)
    step = 0
    for gap, value in points:
        step += gap
        h.record(f"k{gap % 2}/x", step, value)
    path = h.save_jsonl(tmp_path_factory.mktemp("h") / "h.jsonl")
    back = History.load_jsonl(path)
    assert back == h
    for gap in later_gaps:
        step += gap
        for target in (h, back):
            target.record("k0/x", step, float(step))
    assert back == h


# ---------------------------------------------------------------------------------------------------------------
# Corrupt files: each raises ValueError naming the file and the line.

def edit(lines, index, **changes):
    "The lines with JSON fields of line `index` (0-based) changed (a value of ... deletes the field)."
    row = json.loads(lines[index])
    for k, v in changes.items():
        if v is ...:
            row.pop(k)
        else:
            row[k] = v
    return lines[:index] + [json.dumps(row)] + lines[index + 1:]


def series_line(lines, key):
    return next(i for i, line in enumerate(lines) if i and json.loads(line)["key"] == key)


CORRUPTIONS = {
    # name: (function of the good lines -> bad text, expected line number, words in the message)
    "empty file": (lambda L: "", 1, "empty"),
    "only blank lines": (lambda L: "\n\n  \n", 1, "empty"),
    "header not JSON": (lambda L: "{format: history}\n" + "\n".join(L[1:]), 1, "not valid JSON"),
    "header a list": (lambda L: "[1, 2]\n", 1, "expected a JSON object"),
    "old format (no version line)": (lambda L: '{"meta": {}, "max_points": 512}\n', 1, "not a saved history"),
    "unknown version": (lambda L: edit(L, 0, version=99), 1, "version 99"),
    "missing series count": (lambda L: edit(L, 0, series=...), 1, "missing 'series'"),
    "series count a string": (lambda L: edit(L, 0, series="5"), 1, "'series' must be"),
    "truncated: a series missing": (lambda L: L[:-1], 6, "promises 5 series, the file has 4 (truncated?)"),
    "truncated: only the header": (lambda L: L[:1], 2, "promises 5 series, the file has 0"),
    "truncated mid-line": (lambda L: L[:-1] + [L[-1][: len(L[-1]) // 2]], 6, "not valid JSON"),
    "more series than promised": (lambda L: edit(L, 0, series=2), 4, "promises 2 series, the file has more"),
    "non-JSON line": (lambda L: L[:2] + ["hello"] + L[3:], 3, "not valid JSON"),
    "NaN token": (lambda L: L[:1] + [L[1].replace("1.0,", "NaN,", 1)] + L[2:], 2, "not strict JSON"),
    "Infinity token": (lambda L: L[:1] + [L[1].replace("1.0,", "-Infinity,", 1)] + L[2:], 2, "not strict JSON"),
    "blank line in the middle": (lambda L: L[:2] + [""] + L[2:], 3, "not valid JSON"),
    "line is a number": (lambda L: L[:2] + ["42"] + L[3:], 3, "expected a JSON object"),
    "value a string": (lambda L: edit(L, 1, values=["0.5"] + json.loads(L[1])["values"][1:]), 2, "a value must be a number"),
    "value a misspelt NaN": (lambda L: edit(L, 1, values=["nan"] + json.loads(L[1])["values"][1:]), 2,
                             "a value must be a number, null, \"NaN\", \"Infinity\", \"-Infinity\" or a flat list of those, got 'nan'"),
    "value named in version 3": (lambda L: edit(edit(L, 0, version=3), 1, values=["NaN"] + json.loads(L[1])["values"][1:]),
                                 2, "a value must be a number, null or a flat list of those, got 'NaN'"),
    "value a number in a histogram": (lambda L: edit(L, 2, values=[0.5] + json.loads(L[2])["values"][1:]), 3,
                                      "the series holds a number at each step, got a row of 2 values"),
    "rows of two lengths": (lambda L: edit(L, 2, values=[[0.5]] + json.loads(L[2])["values"][1:]), 3,
                            "the series holds a row of 1 values at each step, got a row of 2 values"),
    "meta tag misspelt": (lambda L: edit(L, 0, meta={"config": {"clip": {"$float": "inf"}}}), 1,
                          "meta: '$float' must be 'NaN', 'Infinity' or '-Infinity', got 'inf'"),
    "meta tag not a string": (lambda L: edit(L, 0, meta={"x": [{"$float": 1}]}), 1, "got 1"),
    "value a bool": (lambda L: edit(L, 1, values=[True] + json.loads(L[1])["values"][1:]), 2, "a value must be a number"),
    "value a dict": (lambda L: edit(L, 1, values=[{}] + json.loads(L[1])["values"][1:]), 2, "a value must be a number"),
    "value a nested list": (lambda L: edit(L, 2, values=[[[0.5]]] * len(json.loads(L[2])["values"])), 3,
                            "a value must be a number"),
    "steps not increasing": (lambda L: edit(L, 1, steps=[0, 0] + json.loads(L[1])["steps"][2:]), 2,
                             "strictly increasing"),
    "steps decreasing": (lambda L: edit(L, 1, steps=list(reversed(json.loads(L[1])["steps"]))), 2,
                         "strictly increasing"),
    "step negative": (lambda L: edit(L, 1, steps=[-1] + json.loads(L[1])["steps"][1:]), 2, "strictly increasing"),
    "step a float": (lambda L: edit(L, 1, steps=[0.5] + json.loads(L[1])["steps"][1:]), 2, "strictly increasing"),
    "step a bool": (lambda L: edit(L, 1, steps=[False] + json.loads(L[1])["steps"][1:]), 2, "strictly increasing"),
    "step a string": (lambda L: edit(L, 1, steps=["0"] + json.loads(L[1])["steps"][1:]), 2, "strictly increasing"),
    "steps and values differ in length": (lambda L: edit(L, 1, values=json.loads(L[1])["values"][:-1]), 2,
                                          "steps but"),
    "steps not a list": (lambda L: edit(L, 1, steps=3), 2, "'steps' must be a list"),
    "max_points 1": (lambda L: edit(L, 0, max_points=1), 1, "max_points between 2 and"),
    "max_points huge": (lambda L: edit(L, 0, max_points=10 ** 12), 1, "max_points between 2 and"),
    "max_points negative": (lambda L: edit(L, 0, max_points=-8), 1, "max_points between 2 and"),
    "max_points a float": (lambda L: edit(L, 0, max_points=8.0), 1, "'max_points' must be an integer"),
    "max_points a bool": (lambda L: edit(L, 0, max_points=True), 1, "'max_points' must be an integer"),
    "max_points missing": (lambda L: edit(L, 0, max_points=...), 1, "missing 'max_points'"),
    "max_points smaller than a series": (lambda L: edit(L, 0, max_points=3), 2, "max_points 3 allows at most 3"),
    "meta a list": (lambda L: edit(L, 0, meta=[]), 1, "'meta' must be a JSON object"),
    "meta a string": (lambda L: edit(L, 0, meta="x"), 1, "'meta' must be a JSON object"),
    "meta null": (lambda L: edit(L, 0, meta=None), 1, "'meta' must be a JSON object"),
    "duplicate key": (lambda L: edit(L, 0, series=6) + [L[2]], 7, "duplicate key 'units/act1/histogram'"),
    "key missing": (lambda L: edit(L, 1, key=...), 2, "missing 'key'"),
    "key empty": (lambda L: edit(L, 1, key=""), 2, "empty key"),
    "key a number": (lambda L: edit(L, 1, key=7), 2, "'key' must be a string"),
    "stride not a power of two": (lambda L: edit(L, 1, stride=3), 2, "thinning state"),
    "stride zero": (lambda L: edit(L, 1, stride=0), 2, "thinning state"),
    "offered inconsistent": (lambda L: edit(L, 1, offered=1000), 2, "thinning state"),
    "offered missing": (lambda L: edit(L, 1, offered=...), 2, "missing 'offered'"),
    "last_step before the last point": (lambda L: edit(L, 1, last_step=0), 2, "last_step"),
    "last_step a string": (lambda L: edit(L, 1, last_step="29"), 2, "last_step"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_file_names_file_and_line(saved, tmp_path, name):
    _, _, lines = saved
    assert len(lines) == 6                                     # header + 5 series: the cases below rely on it
    make, line, words = CORRUPTIONS[name]
    text = make(lines)
    if isinstance(text, list):
        text = "\n".join(text) + "\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    with pytest.raises(ValueError) as info:
        History.load_jsonl(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}, line {line}:") and words in message, message


def test_not_utf8(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(ValueError, match=r"bad.jsonl is not a saved history: not UTF-8"):
        History.load_jsonl(bad)


def test_trailing_blank_lines_are_fine(saved, tmp_path):
    h, path, lines = saved
    for tail in ("\n", "\n\n", "\n  \n"):
        p = tmp_path / "tail.jsonl"
        p.write_text("\n".join(lines) + tail)
        assert History.load_jsonl(p) == h
    p.write_text("\n".join(lines))                              # and no final newline at all
    assert History.load_jsonl(p) == h


def test_max_points_enforced_on_load(saved, tmp_path):
    "A series longer than max_points allows is refused, not silently kept beyond the memory bound."
    _, _, lines = saved
    row = json.loads(lines[1])
    row.update(steps=list(range(20)), values=[0.0] * 20, stride=1, offered=20, last_step=19)
    p = tmp_path / "long.jsonl"
    p.write_text("\n".join([lines[0], json.dumps(row)] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match=r"line 2: series 'loss/train' has 20 points; max_points 8 allows at most 8"):
        History.load_jsonl(p)


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        History.load_jsonl(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------------------------------------------------------
# Saving: atomic.

def test_failed_save_leaves_previous_file_intact(saved, monkeypatch):
    "regression (issue 7): a save that failed half way left a half-written file that loaded as valid."
    h, path, _ = saved
    before = path.read_bytes()
    calls = []
    real_dumps = json.dumps

    def failing_dumps(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk trouble while serialising")
        return real_dumps(*args, **kwargs)
    monkeypatch.setattr(panels.json, "dumps", failing_dumps)
    h.record("loss/train", 100, 0.0)
    with pytest.raises(RuntimeError):
        h.save_jsonl(path)
    assert path.read_bytes() == before and os.listdir(path.parent) == [path.name]


def test_interrupted_save_leaves_previous_file_intact(saved, monkeypatch):
    h, path, _ = saved
    before = path.read_bytes()

    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        h.save_jsonl(path)
    assert path.read_bytes() == before and os.listdir(path.parent) == [path.name]


def test_save_to_bad_paths(tmp_path):
    h = sample_history()
    (tmp_path / "file").write_text("x")
    for path, words in [(tmp_path, "it is a folder"), (tmp_path / "no" / "h.jsonl", "does not exist"),
                        (tmp_path / "file" / "h.jsonl", "is not a folder"), ("/proc/h.jsonl", "cannot create")]:
        with pytest.raises(ValueError, match=words):
            h.save_jsonl(path)


def test_unserialisable_meta_fails_before_writing(tmp_path):
    h = sample_history()
    h.meta["bad"] = object()
    with pytest.raises(TypeError, match="cannot convert"):
        h.save_jsonl(tmp_path / "h.jsonl")
    assert os.listdir(tmp_path) == []


def test_saved_file_is_strict_json_lines(saved):
    _, _, lines = saved
    for line in lines:
        json.loads(line, parse_constant=lambda token: pytest.fail(f"non-strict token {token}"))


def test_a_literal_beyond_float64_loads_saturated_not_as_inf(tmp_path):
    "Regression: 1e999 in a hand-edited file parsed as inf, which a re-save would have turned into a gap."
    h = History()
    h.record("loss/train", 0, 1.0)
    path = h.save_jsonl(tmp_path / "h.jsonl")
    path.write_text(path.read_text().replace("1.0", "1e999"))
    loaded = History.load_jsonl(path)
    assert loaded.get("loss/train")[1][0] == FLOAT64_MAX


# ---------------------------------------------------------------------------------------------------------------
# Non-finite values (issue 24): NaN, +inf, -inf and the largest float come back as themselves, told apart, from a file
# that stays strict JSON; format 4, and versions 2 and 3 still load.

ODD = [math.nan, math.inf, -math.inf, FLOAT64_MAX, -FLOAT64_MAX, 0.0, -0.0, 1e-310]


def same(a, b):
    "Equal floats, NaN equal to NaN, and the sign of zero compared too."
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def test_non_finite_values_round_trip_distinctly_in_series_rows_and_meta(tmp_path):
    h = History()
    for step, value in enumerate(ODD):
        h.record("loss/train", step, value)
    h.record("units/act1/histogram", 0, np.array(ODD))
    h.record("units/act1/histogram", 1, np.array(ODD[::-1]))
    h.meta["config"] = {name: value for name, value in zip("abcdefgh", ODD)}
    h.meta["odd"] = [ODD, "NaN", "Infinity", {"$float": "NaN", "second key": 1}]   # strings stay strings
    path = h.save_jsonl(tmp_path / "h.jsonl")
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda token: pytest.fail(f"non-strict token {token}"))
    back = History.load_jsonl(path)
    assert back == h and back.get("loss/train")[1].shape == (len(ODD),)
    got = back.series["loss/train"].values
    assert all(same(g, w) for g, w in zip(got, ODD)) and len(got) == len(ODD)
    row = back.series["units/act1/histogram"].values[1]
    assert all(same(g, w) for g, w in zip(row, ODD[::-1]))
    assert all(same(back.meta["config"][k], w) for k, w in zip("abcdefgh", ODD))
    assert all(same(g, w) for g, w in zip(back.meta["odd"][0], ODD))
    assert back.meta["odd"][1:] == ["NaN", "Infinity", {"$float": "NaN", "second key": 1}]
    assert History.load_jsonl(back.save_jsonl(tmp_path / "again.jsonl")) == h
    assert (tmp_path / "again.jsonl").read_text() == path.read_text()


def test_the_written_spelling(tmp_path):
    "The format as documented: names in a series, tags in meta, numbers as numbers."
    h = History()
    for step, value in enumerate([math.nan, math.inf, -math.inf, FLOAT64_MAX]):
        h.record("k", step, value)
    h.meta["x"] = [math.nan, math.inf, -math.inf, FLOAT64_MAX, "NaN"]
    head, line = h.save_jsonl(tmp_path / "h.jsonl").read_text().splitlines()
    assert json.loads(head)["version"] == 4 == HISTORY_VERSION
    assert json.loads(head)["meta"]["x"] == [{"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"},
                                             FLOAT64_MAX, "NaN"]
    assert json.loads(line)["values"] == ["NaN", "Infinity", "-Infinity", FLOAT64_MAX]


def test_a_meta_dict_that_looks_like_a_tag_is_refused_before_writing(tmp_path):
    h = History()
    h.meta["x"] = {"$float": "NaN"}
    with pytest.raises(ValueError, match=r"only key is '\$float'"):
        h.save_jsonl(tmp_path / "h.jsonl")
    assert os.listdir(tmp_path) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD), st.none()), max_size=30),
       st.dictionaries(st.text(max_size=4), st.one_of(st.floats(), st.sampled_from(ODD), st.text(max_size=9)), max_size=6))
def test_non_finite_round_trip_property(tmp_path_factory, values, meta):
    h = History(64)
    for step, value in enumerate(values):
        h.record("k", step, value)
    h.meta["m"] = meta
    if any(k == "$float" for k in meta) and len(meta) == 1:
        return
    back = History.load_jsonl(h.save_jsonl(tmp_path_factory.mktemp("h") / "h.jsonl"))
    assert back == h
    assert all(same(g, w) for g, w in zip(back.series["k"].values if values else [], h.series["k"].values if values else []))


def test_the_version_3_fixture_loads_as_it_was_written():
    "tests/data/history_v3.jsonl was written by the version-3 code: NaN as null, inf saturated, NaN and inf in meta null."
    h = History.load_jsonl(DATA / "history_v3.jsonl")
    assert h.meta["title"] == "a version-3 history" and h.meta["config"] == {"lr": 0.1, "clip": None, "wd": None}
    steps, values = h.get("loss/val")
    assert steps.tolist() == [0, 5, 10, 11] and math.isnan(values[0])
    assert values[1:].tolist() == [FLOAT64_MAX, -FLOAT64_MAX, 1.797e308]      # what version 3 lost stays lost
    assert h.get("units/mlp.hidden1/histogram")[1].shape == (3, 3)
    h.record("loss/val", 12, math.inf)                                          # and it goes on, in format 4
    assert h.get("loss/val")[1][-1] == math.inf


def test_the_version_2_fixture_still_loads():
    h = History.load_jsonl(DATA / "history_v2.jsonl")
    assert h.meta["title"] == "a version-2 history" and h.get("loss/train")[0].tolist() == [0, 4, 8, 12, 16, 20]


def test_version_3_strings_and_tags_are_not_read_as_numbers(tmp_path):
    lines = (DATA / "history_v3.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["meta"]["config"]["clip"] = {"$float": "Infinity"}                    # a dict like any other in version 3
    path = tmp_path / "v3.jsonl"
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    assert History.load_jsonl(path).meta["config"]["clip"] == {"$float": "Infinity"}


# ---------------------------------------------------------------------------------------------------------------
# One shape per series, so that `get` always gives an array (issue 24: it failed for histogram series in pandas).

def test_get_gives_a_matrix_for_a_histogram_series():
    h = sample_history()
    steps, values = h.get("units/act1/histogram")
    assert values.shape == (len(steps), 2) and values.dtype == float


@pytest.mark.parametrize("first,then,words", [
    (1.0, [1.0], "holds a number at each step, got a row of 1 values"),
    ([1.0, 2.0], 1.0, "holds a row of 2 values at each step, got a number"),
    ([1.0, 2.0], [1.0, 2.0, 3.0], "holds a row of 2 values at each step, got a row of 3 values"),
    (np.zeros(3), np.zeros(2), "holds a row of 3 values at each step, got a row of 2 values")])
def test_a_value_of_another_shape_is_refused(first, then, words):
    h = History()
    h.record("k", 0, first)
    with pytest.raises(ValueError, match=f"'k': the series {words}"):
        h.record("k", 1, then)
    assert h.series["k"].steps == [0]


def test_the_version_4_fixture_reads_and_writes_back_byte_for_byte(tmp_path):
    "tests/data/history_v4.jsonl pins the format: what it holds, and that saving it again gives the same bytes."
    h = History.load_jsonl(DATA / "history_v4.jsonl")
    config = h.meta["config"]
    assert (config["clip"], config["floor"], config["name"]) == (math.inf, -math.inf, "NaN") and math.isnan(config["wd"])
    steps, values = h.get("loss/val")
    assert steps.tolist() == [0, 5, 10, 11] and math.isnan(values[0])
    assert values[1:].tolist() == [math.inf, -math.inf, 1.797e308]
    rows = h.get("units/mlp.hidden1/histogram")[1]
    assert rows.shape == (3, 3) and math.isnan(rows[0, 2]) and rows[1:, 2].tolist() == [0.25, 0.25]
    again = h.save_jsonl(tmp_path / "again.jsonl")
    assert again.read_bytes() == (DATA / "history_v4.jsonl").read_bytes()


def test_a_snapshot_round_trips_told_apart_through_strict_json():
    "The meta encoding is public (to_strict_json, from_strict_json) for any JSON document, an Inspector snapshot say."
    snapshot = {"mlp.fc1": {"kind": "activation", "n": 0, "mean": math.nan, "min": math.inf, "max": -math.inf,
                            "var": FLOAT64_MAX, "saturated": "var", "shape": np.array([2.0, np.inf])}}
    text = json.dumps(panels.to_strict_json(snapshot), allow_nan=False)
    back = panels.from_strict_json(json.loads(text, parse_constant=lambda token: pytest.fail(token)))["mlp.fc1"]
    assert math.isnan(back["mean"]) and (back["min"], back["max"], back["var"]) == (math.inf, -math.inf, FLOAT64_MAX)
    assert back["shape"] == [2.0, math.inf] and back["saturated"] == "var" and back["n"] == 0


def test_a_step_beyond_int64_is_refused_when_recorded_and_when_loaded(tmp_path):
    "A step of 2**63 or more was accepted, saved and loaded, then broke get(), the dashboard and pandas (int64 arrays)."
    h = History()
    h.record("loss/train", 0, 1.0)
    for step in (2 ** 63, 10 ** 30):
        with pytest.raises(ValueError, match=r"a step must be at most 2\*\*63 - 1"):
            h.record("loss/train", step, 2.0)
    h.record("loss/train", 2 ** 63 - 1, 2.0)           # the largest step int64 holds is fine
    assert h.get("loss/train")[0].tolist() == [0, 2 ** 63 - 1]
    path = h.save_jsonl(tmp_path / "run.jsonl")
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["steps"][-1] = row["last_step"] = 2 ** 63
    (tmp_path / "big.jsonl").write_text("\n".join([lines[0], json.dumps(row)] + lines[2:]) + "\n")
    with pytest.raises(ValueError, match=r"big\.jsonl, line 2: series 'loss/train': steps must be .* up to 2\*\*63 - 1, got 9223372036854775808"):
        History.load_jsonl(tmp_path / "big.jsonl")
