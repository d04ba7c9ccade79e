"""Issue 24, section 3: the history where analysts look. Tidy tables (`History.to_frame`, `histogram_frame`) checked
against pandas, CSV and TensorBoard exports read back by pandas and by TensorBoard's own event reader, and `--follow`
exporting a run while a thread trains it.

pandas, tensorboardX and tensorboard are optional extras: without them these tests skip, except under CI=true for
the extras that .ci/run installs, where a missing package is a failure."""
import importlib
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import minitrain_inspect.export as export_module
from minitrain_inspect.export import (EVENT_SUFFIX, CsvSink, SaveHistory, export_history, export_main, histogram_proto_args,
                                     run_state)
from minitrain_inspect.inspect import Inspector
from minitrain_inspect.panels import FLOAT64_MAX, History
from minitrain_inspect.train import TrainConfig, train
from ci_extras import ci_extras

ROOT = Path(__file__).resolve().parents[1]


def need(module: str, extra: str):
    "The module, or a skip saying which extra is missing; under CI with that extra installed by .ci/run, a failure."
    try:
        return importlib.import_module(module)
    except ImportError:
        if extra in ci_extras():
            pytest.fail(f"{module} is missing, though .ci/run installs the extra {extra!r}")
        pytest.skip(f"{module} is not installed (the optional extra {extra!r})")


def event_accumulator(folder):
    "TensorBoard's own reader of event files, loaded with every event kept."
    need("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (HISTOGRAMS, SCALARS, EventAccumulator)
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0, HISTOGRAMS: 0})
    events.Reload()
    return events


@pytest.fixture(scope="module")
def run_history(tmp_path_factory):
    "A small real run's history, with the awkward values added: NaN, +inf, -inf, the largest float, a NaN row."
    result = train(TrainConfig(steps=40, hidden=(16,), progress=False, eval_every=10), inspector=Inspector(max_points=16))
    h = result.inspector.history
    for step, value in enumerate([math.nan, math.inf, -math.inf, FLOAT64_MAX, -0.0, 1e-310]):
        h.record("odd/values/x", step, value)
    last = h.get("units/mlp.act1/histogram")[0][-1]
    h.record("units/mlp.act1/histogram", int(last) + 1, [math.nan] * h.meta["histogram"]["mlp.act1"]["bins"])
    path = h.save_jsonl(tmp_path_factory.mktemp("run") / "history.jsonl")
    return History.load_jsonl(path), path


def float32(value: float) -> float:
    "What a TensorBoard scalar (a float32 `simple_value`) holds for `value`: beyond float32's range, ±inf."
    with np.errstate(over="ignore"):
        return float(np.float32(value))


# ---------------------------------------------------------------------------------------------------------------
# Tidy tables.

def test_to_frame_is_the_tidy_table_of_every_scalar_series(run_history):
    pd = need("pandas", "pandas")
    h, _ = run_history
    frame = h.to_frame()
    assert list(frame.columns) == ["series", "step", "value"]
    assert str(frame["step"].dtype) == "int64" and str(frame["value"].dtype) == "float64"
    histograms = set(h.histogram_keys())
    assert histograms == {"units/mlp.act1/histogram"}
    assert list(dict.fromkeys(frame["series"])) == [k for k in h.keys() if k not in histograms]
    for key, group in frame.groupby("series", sort=False):
        steps, values = h.get(key)
        assert group["step"].tolist() == steps.tolist()
        np.testing.assert_array_equal(group["value"].to_numpy(), values)     # NaN where NaN, inf where inf
    odd = frame[frame["series"] == "odd/values/x"]["value"].tolist()
    assert math.isnan(odd[0]) and odd[1:4] == [math.inf, -math.inf, FLOAT64_MAX]


def test_histogram_frame_has_a_row_per_bin_with_its_edges(run_history):
    need("pandas", "pandas")
    h, _ = run_history
    frame = h.histogram_frame()
    assert list(frame.columns) == ["series", "step", "bin", "lo", "hi", "value"]
    steps, rows = h.get("units/mlp.act1/histogram")              # a matrix: the failure issue 24 reports is gone
    bins = h.meta["histogram"]["mlp.act1"]["bins"]
    assert rows.shape == (len(steps), bins) and len(frame) == rows.size
    np.testing.assert_array_equal(frame["value"].to_numpy().reshape(rows.shape), rows)
    edges = np.linspace(0.0, 4.0, bins + 1)
    first = frame[frame["step"] == steps[0]]
    assert first["bin"].tolist() == list(range(bins))
    np.testing.assert_array_equal(first["lo"].to_numpy(), edges[:-1])
    np.testing.assert_array_equal(first["hi"].to_numpy(), edges[1:])


def test_frames_of_an_empty_history_have_their_columns():
    need("pandas", "pandas")
    assert list(History().to_frame().columns) == ["series", "step", "value"] and len(History().to_frame()) == 0
    assert list(History().histogram_frame().columns) == ["series", "step", "bin", "lo", "hi", "value"]


def test_without_pandas_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)          # import pandas now raises ImportError
    with pytest.raises(ImportError, match=re.escape('pip install "minitrain-inspect[pandas]"')):
        History().to_frame()


# ---------------------------------------------------------------------------------------------------------------
# CSV.

def test_csv_read_back_by_pandas_equals_the_frames(run_history, tmp_path):
    pd = need("pandas", "pandas")
    h, path = run_history
    summary = export_history(path, "csv", tmp_path / "csv")
    assert summary.stopped == "once" and summary.points == len(h.scalar_rows())
    assert sorted(os.listdir(tmp_path / "csv")) == ["histograms.csv", "scalars.csv"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "csv" / "scalars.csv"), h.to_frame(), check_exact=True)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "csv" / "histograms.csv"), h.histogram_frame(), check_exact=True)


def test_a_failed_csv_write_leaves_the_previous_files(run_history, tmp_path, monkeypatch):
    _, path = run_history
    export_history(path, "csv", tmp_path)
    before = (tmp_path / "scalars.csv").read_bytes()

    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_history(path, "csv", tmp_path)
    assert (tmp_path / "scalars.csv").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["histograms.csv", "scalars.csv"]


# ---------------------------------------------------------------------------------------------------------------
# TensorBoard.

def test_tensorboard_reads_back_every_scalar_series_and_the_histograms(run_history, tmp_path):
    need("tensorboardX", "tensorboard")
    h, path = run_history
    summary = export_history(path, "tensorboard", tmp_path / "tb")
    events = event_accumulator(tmp_path / "tb")
    tags = events.Tags()
    scalar_keys = [k for k in h.keys() if k not in h.histogram_keys()]
    assert set(tags["scalars"]) == set(scalar_keys) and len(scalar_keys) > 20
    for key in scalar_keys:
        steps, values = h.get(key)
        got = events.Scalars(key)
        assert [e.step for e in got] == steps.tolist(), key
        np.testing.assert_array_equal([e.value for e in got], [float32(v) for v in values], err_msg=key)
    assert set(tags["histograms"]) == {"units/mlp.act1/histogram"}
    steps, rows = h.get("units/mlp.act1/histogram")
    finite = np.isfinite(rows).all(axis=1)
    assert not finite[-1] and finite[:-1].all()               # the NaN row (nothing measured) is left out
    got = events.Histograms("units/mlp.act1/histogram")
    assert [e.step for e in got] == steps[finite].tolist() and summary.histograms == finite.sum()   # rows written
    bins = rows.shape[1]
    for event, row in zip(got, rows[finite]):
        value = event.histogram_value
        np.testing.assert_allclose(value.bucket, row, rtol=1e-15, atol=0)
        np.testing.assert_allclose(value.bucket_limit, np.linspace(0.0, 4.0, bins + 1)[1:], rtol=1e-15)
        assert (value.min, value.max) == (0.0, 4.0) and value.num == pytest.approx(row.sum(), rel=1e-12)


def test_tensorboard_export_again_replaces_the_earlier_one_and_leaves_other_runs(run_history, tmp_path):
    need("tensorboardX", "tensorboard")
    _, path = run_history
    (tmp_path / "tb").mkdir()
    other = tmp_path / "tb" / "events.out.tfevents.1.host"          # a user's own run in the same folder: kept
    other.write_bytes(b"")
    export_history(path, "tensorboard", tmp_path / "tb")
    time.sleep(1.1)                                                  # a new event file name (it holds the time in seconds)
    export_history(path, "tensorboard", tmp_path / "tb")
    ours = [n for n in os.listdir(tmp_path / "tb") if n.endswith(EVENT_SUFFIX)]
    assert len(ours) == 1 and other.exists(), os.listdir(tmp_path / "tb")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []                      # no staging folder left
    os.unlink(other)
    steps, _ = History.load_jsonl(path).get("loss/train")
    assert [e.step for e in event_accumulator(tmp_path / "tb").Scalars("loss/train")] == steps.tolist()   # once each


def test_an_interrupted_tensorboard_export_leaves_the_earlier_one_whole(run_history, tmp_path, monkeypatch):
    need("tensorboardX", "tensorboard")
    from tensorboardX import SummaryWriter
    _, path = run_history
    export_history(path, "tensorboard", tmp_path / "tb")
    before = {n: (tmp_path / "tb" / n).read_bytes() for n in os.listdir(tmp_path / "tb")}
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 30:
            raise KeyboardInterrupt
    monkeypatch.setattr(SummaryWriter, "add_scalar", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_history(path, "tensorboard", tmp_path / "tb")
    assert {n: (tmp_path / "tb" / n).read_bytes() for n in os.listdir(tmp_path / "tb")} == before
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_keys_that_tensorboard_would_merge_are_refused(tmp_path):
    need("tensorboardX", "tensorboard")
    h = History()
    h.record("a b/x", 1, 1.0)
    h.record("a_b/x", 2, 2.0)
    path = h.save_jsonl(tmp_path / "h.jsonl")
    with pytest.raises(ValueError, match="'a b/x' and 'a_b/x' would both be TensorBoard's tag 'a_b/x'"):
        export_history(path, "tensorboard", tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_values_beyond_float32_are_counted_and_said(tmp_path, capsys):
    need("tensorboardX", "tensorboard")
    h = History()
    top = float(np.finfo(np.float32).max)
    values = [0.5, 1e300, -1e-320, 0.0, math.inf, math.nan, 3.0e38,
              top * (1 + 1e-9), 2.0 ** -150, 2.0 ** -149]     # rounds to max (kept), to 0 (a tie, to even), the least subnormal
    for step, value in enumerate(values):
        h.record("odd/x", step, value)
    path = h.save_jsonl(tmp_path / "h.jsonl")
    assert export_history(path, "tensorboard", tmp_path / "tb").overflows == 3
    assert export_main([str(path), "--to", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    assert "3 values lie beyond float32's range" in capsys.readouterr().out
    got = [e.value for e in event_accumulator(tmp_path / "tb").Scalars("odd/x")]
    assert sum((v != 0 and math.isfinite(v)) and (math.isinf(g) or g == 0) for v, g in zip(values, got)) == 3


def test_an_interrupted_csv_export_leaves_both_files_of_the_earlier_one(run_history, tmp_path, monkeypatch):
    _, path = run_history
    export_history(path, "csv", tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in CsvSink.FILES}
    h = History()
    h.record("other/x", 0, 1.0)
    other = h.save_jsonl(tmp_path / "other.jsonl")
    real, calls = export_module.atomic_write_text, []

    def write_then_interrupt(target, text):       # Ctrl-C arrives while the first file is written
        calls.append(1)
        result = real(target, text)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return result
    monkeypatch.setattr(export_module, "atomic_write_text", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        export_history(other, "csv", tmp_path)
    after = {n: (tmp_path / n).read_bytes() for n in CsvSink.FILES}
    assert len(calls) == 2 and after != before                     # both written: the pair is the new export's
    assert b"other/x" in after["scalars.csv"] and after["histograms.csv"].count(b"\n") == 1


def test_histogram_fields_by_hand():
    fields = histogram_proto_args([0.5, 0.25, 0.25], np.array([-1.0, 0.0, 1.0, 2.0]))
    assert fields["bucket_limits"] == [0.0, 1.0, 2.0] and fields["bucket_counts"] == [0.5, 0.25, 0.25]
    assert fields["sum"] == pytest.approx(0.5 * -0.5 + 0.25 * 0.5 + 0.25 * 1.5)
    assert fields["sum_squares"] == pytest.approx(0.5 * 0.25 + 0.25 * 0.25 + 0.25 * 2.25)


def test_without_tensorboardx_the_command_says_which_extra(run_history, tmp_path, monkeypatch, capsys):
    _, path = run_history
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    assert export_main([str(path), "--to", "tensorboard", "--out", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "minitrain-inspect[tensorboard]"' in err, err


# ---------------------------------------------------------------------------------------------------------------
# Following a run that is still writing its history.

def train_in_a_thread(path: Path, steps: int, every: int):
    "A thread training with a SaveHistory panel; `thread.result` holds the run's result (or `thread.error`)."
    def run():
        try:
            thread.result = train(TrainConfig(steps=steps, hidden=(16,), progress=False, eval_every=25),
                                  inspector=Inspector(panels=[SaveHistory(path, every=every)], max_points=16))
        except BaseException as exc:     # reported by the test, not lost in the thread
            thread.error = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.result = thread.error = None
    return thread


@pytest.mark.parametrize("to", ["tensorboard", "csv"])
def test_follow_exports_a_run_while_it_trains(tmp_path, to):
    if to == "tensorboard":
        need("tensorboardX", "tensorboard")
        need("tensorboard", "tensorboard")
    else:
        pd = need("pandas", "pandas")
    path = tmp_path / "history.jsonl"
    thread = train_in_a_thread(path, steps=120, every=4)
    thread.start()
    summary = export_history(path, to, tmp_path / "out", follow=True, poll=0.01, timeout=120, idle=60)
    thread.join(60)
    assert thread.error is None and not thread.is_alive()
    assert summary.stopped == "ended" and summary.reads >= 2, summary
    final = History.load_jsonl(path)
    assert run_state(final) == "ended" and final.meta["live"]["step"] == 120
    assert final == History.load_jsonl(path) and final.series["loss/train"].stride > 1    # thinned: 120 steps, 16 points
    scalar_keys = [k for k in final.keys() if k not in final.histogram_keys()]
    if to == "tensorboard":
        events = event_accumulator(tmp_path / "out")
        exported = {key: [e.step for e in events.Scalars(key)] for key in events.Tags()["scalars"]}
        assert "units/mlp.act1/histogram" in events.Tags()["histograms"]
    else:
        frame = pd.read_csv(tmp_path / "out" / "scalars.csv")
        exported = {key: group["step"].tolist() for key, group in frame.groupby("series", sort=False)}
    assert set(exported) == set(scalar_keys)
    for key in scalar_keys:
        steps = exported[key]
        assert steps == sorted(set(steps)), f"{key}: each point exported once, in order"
        assert set(final.get(key)[0].tolist()) <= set(steps), key   # every point of the final history ...
    assert len(exported["loss/train"]) > len(final.get("loss/train")[0])   # ... and those thinned away since


def test_follow_waits_for_the_file_and_stops_when_idle(tmp_path):
    ticks = iter(range(0, 10_000, 5))
    summary = export_history(tmp_path / "none.jsonl", "csv", tmp_path / "out", follow=True, idle=20,
                             sleep=lambda seconds: None, clock=lambda: next(ticks))
    assert (summary.stopped, summary.reads, summary.points) == ("idle", 0, 0)


def test_a_history_saved_by_hand_is_followed_until_idle(run_history, tmp_path):
    "A history without SaveHistory's mark never says it ended: the idle limit stops the export."
    _, path = run_history
    ticks = iter(range(0, 10_000, 5))
    summary = export_history(path, "csv", tmp_path, follow=True, idle=30, sleep=lambda s: None, clock=lambda: next(ticks))
    assert (summary.stopped, summary.reads) == ("idle", 1)


def test_save_history_keeps_the_inspector_running(tmp_path):
    "A run with the panel gives the same statistics as one without, and the last save holds the whole history."
    config = TrainConfig(steps=30, hidden=(16,), progress=False, eval_every=10)
    plain = train(config, inspector=Inspector()).inspector
    saving = train(config, inspector=Inspector(panels=[SaveHistory(tmp_path / "h.jsonl", every=7)])).inspector
    assert saving.snapshot() == plain.snapshot()
    saved = History.load_jsonl(tmp_path / "h.jsonl")
    assert saved == saving.history and saved.meta["live"] == {"state": "ended", "step": 30, "saves": 6}
    assert "save_history" not in saved.meta["panels"]              # no dashboard panel of its own


@pytest.mark.parametrize("args,words", [
    (["--to", "parquet"], "invalid choice"), (["--to", "csv", "--poll", "0", "--follow"], "positive finite"),
    (["--to", "csv", "--idle", "nan", "--follow"], "positive finite")])
def test_the_command_refuses_bad_arguments_in_one_line(run_history, tmp_path, capsys, args, words):
    _, path = run_history
    try:
        code = export_main([str(path), *args, "--out", str(tmp_path)])
    except SystemExit as exit:                                      # argparse's own refusal
        code = exit.code
    assert code == 2
    assert words in capsys.readouterr().err


def test_a_refused_history_leaves_no_export_folder_behind(tmp_path):
    "A truncated history is refused with its line, and the folder export made for it is gone; one that was there stays."
    from minitrain_inspect.panels import History
    history = History()
    history.record("loss/train", 0, 1.0)
    good = history.save_jsonl(tmp_path / "h.jsonl")
    text = Path(good).read_text()
    (tmp_path / "cut.jsonl").write_text(text[:-20])
    with pytest.raises(ValueError, match="line 2"):
        export_history(tmp_path / "cut.jsonl", "csv", tmp_path / "made")
    assert not (tmp_path / "made").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError, match="line 2"):
        export_history(tmp_path / "cut.jsonl", "csv", tmp_path / "kept")
    assert (tmp_path / "kept").is_dir()
    with pytest.raises(ValueError, match="is a file, not a folder"):
        export_history(good, "csv", tmp_path / "cut.jsonl" / "sub")
