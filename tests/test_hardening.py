"""Issue 20: sixteen inputs that broke or misled. One regression test (or a small group) per item, in the issue's order."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from matplotlib.text import Text

from minitrain_inspect.cli import main
import minitrain_inspect.dashboard as dashboard_module
from minitrain_inspect.data import make_dataset
import minitrain_inspect.panels as panels_module
from minitrain_inspect.dashboard import render_dashboard, save_dashboard
from minitrain_inspect.panels import HISTORY_VERSION, BoundedSeries, History
from minitrain_inspect.per_class_loss import mean_by_class, partition_batch_loss
from minitrain_inspect.stats import tensor_moments, to_jsonable
import minitrain_inspect.train as train_module
from minitrain_inspect.train import TrainConfig, train

DATA = Path(__file__).parent / "data"
DRAWABLE = getattr(dashboard_module, "DRAWABLE", 1e300)
MAX_CURVES = getattr(dashboard_module, "MAX_CURVES", 20)
MAX_HISTOGRAMS = getattr(dashboard_module, "MAX_HISTOGRAMS", 4)
MAX_HISTORY_BYTES = getattr(panels_module, "MAX_HISTORY_BYTES", 256 * 2 ** 20)
import minitrain_inspect.stats as stats_module
MAX_META_DEPTH = getattr(stats_module, "MAX_JSON_DEPTH", 100)
MAX_STEPS = getattr(train_module, "MAX_STEPS", 10_000_000)
MAX_BLAS_THREADS = getattr(train_module, "MAX_BLAS_THREADS", 1024)


def one_line_error(capsys, code, *words):
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("minitrain-inspect: error:"), (code, err)
    for word in words:
        assert word in err, (word, err)
    return err


# --- stats ----------------------------------------------------------------------------------------------------------

def test_scratch_that_is_the_input_itself_leaves_the_input_alone():
    x = np.random.default_rng(0).standard_normal(1000) + 5.0
    before = x.copy()
    got = tensor_moments(x, scratch=x)
    assert np.array_equal(x, before), "the input was overwritten"
    assert got == tensor_moments(before)
    view = np.zeros(2000)                     # a scratch that overlaps the input only in part
    view[:1000] = before
    assert tensor_moments(view[:1000], scratch=view[500:]) == tensor_moments(before)
    assert np.array_equal(view[:1000], before)


@pytest.mark.skipif(np.finfo(np.longdouble).max <= np.finfo(np.float64).max, reason="longdouble is float64 here")
@pytest.mark.parametrize("values", [["1e4000", 1], [1.0, 2.0]])
def test_longdouble_is_refused_by_name_with_the_way_out(values):
    "Beyond float64's range or not, a longdouble array is refused naming the dtype and the conversion to make."
    from minitrain_inspect.stats import new_state, summarize, welford_update
    x = np.array(values, dtype=np.longdouble)
    from minitrain_inspect.stats import float64_sum, sum_of_squares
    for measure in (tensor_moments, lambda v: summarize(welford_update(new_state(), v)), float64_sum, sum_of_squares):
        with pytest.raises(TypeError, match=r"longdouble.*\.astype\(np\.float64\)"):
            measure(x)


def test_to_jsonable_refuses_keys_that_collide_as_strings():
    with pytest.raises(ValueError, match="'1'"):
        to_jsonable({1: "a", "1": "b"})
    assert to_jsonable({1: "a", 2: "b"}) == {"1": "a", "2": "b"}


@pytest.mark.parametrize("losses", [[1e308, 1e308], [1.7e308] * 5, [1.7e308, -1.7e308, 1.7e308]])
def test_a_finite_loss_mean_stays_finite(losses):
    regular, irregular = partition_batch_loss(np.array(losses), ["walk"] * len(losses))
    assert regular == pytest.approx(math.fsum(v / len(losses) for v in losses), rel=1e-15) and math.isnan(irregular)
    mask = np.ones(len(losses), bool)
    assert math.isfinite(mean_by_class(np.array(losses), mask, ~mask)[0])


# --- history --------------------------------------------------------------------------------------------------------

def test_two_points_keep_the_first_and_the_newest():
    s = BoundedSeries(2)
    for step in range(100):
        s.append(step, float(step))
        assert s.steps == ([0, step] if step else [0]) and s.values[-1] == step


@pytest.mark.parametrize("max_points", [2, 3, 4, 7, 64])
@pytest.mark.parametrize("offers", [1, 2, 5, 63, 64, 65, 1000])
def test_the_newest_point_is_always_kept_and_memory_stays_bounded(max_points, offers):
    s = BoundedSeries(max_points)
    for step in range(offers):
        s.append(3 * step, step)
        assert s.steps[-1] == 3 * step and s.values[-1] == step
        assert s.steps[0] == 0 and len(s.steps) <= max_points
        assert s.steps == sorted(set(s.steps))


def test_a_repeated_step_replaces_the_newest_point():
    s = BoundedSeries(4)
    for step in range(11):
        s.append(step, step)
    s.append(10, -1.0)
    assert s.steps[-1] == 10 and s.values[-1] == -1.0


def test_a_history_keeps_its_newest_points_through_a_save(tmp_path):
    h = History(4)
    for step in range(23):
        h.record("loss/train", step, float(step))
    assert h.get("loss/train")[0][-1] == 22
    back = History.load_jsonl(h.save_jsonl(tmp_path / "h.jsonl"))
    assert back == h
    back.record("loss/train", 23, 23.0)
    h.record("loss/train", 23, 23.0)
    assert back == h and back.get("loss/train")[0][-1] == 23


def test_a_version_2_history_still_loads():
    h = History.load_jsonl(DATA / "history_v2.jsonl")
    assert HISTORY_VERSION == 4 and h.meta["title"] == "a version-2 history"
    steps, values = h.get("loss/train")
    assert steps.tolist() == [0, 4, 8, 12, 16, 20] and values[0] == 1.0   # version 2 had dropped steps 21, 22
    h.record("loss/train", 23, 0.5)
    assert h.get("loss/train")[0][-1] == 23


def test_a_huge_history_file_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(800 * 2 ** 20)             # sparse: 800 MB on paper, nothing on disk
    with pytest.raises(ValueError, match=r"MB.*max_bytes") as info:
        History.load_jsonl(big)
    assert str(MAX_HISTORY_BYTES // 2 ** 20) in str(info.value)
    small = tmp_path / "small.jsonl"
    History(4).save_jsonl(small)
    with pytest.raises(ValueError, match="max_bytes"):
        History.load_jsonl(small, max_bytes=10)
    assert History.load_jsonl(small, max_bytes=10_000) == History(4)


def test_the_dashboard_command_refuses_a_huge_history_in_one_line(tmp_path, capsys):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(800 * 2 ** 20)
    one_line_error(capsys, main(["dashboard", str(big), "--out", str(tmp_path / "d.png")]), "big.jsonl", "MB")
    assert not (tmp_path / "d.png").exists()


# --- dashboard ------------------------------------------------------------------------------------------------------

def _texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(Text))


def test_ten_thousand_series_draw_a_stated_subset():
    n = 10_000
    h = History(8)
    for i in range(n):
        for step in (0, 5):
            h.record(f"activations/l{i}/mean", step, float(i))
            h.record(f"units/l{i}/dead", step, 0.1)
            h.record(f"gradients/l{i}.weight/l2", step, 1.0 + i)
    fig = render_dashboard(h)
    drawn = [line.get_gid() for ax in fig.axes for line in ax.lines if line.get_gid()]
    per_panel = {}
    for gid in drawn:
        per_panel[gid.split("/")[0]] = per_panel.get(gid.split("/")[0], 0) + 1
    assert 0 < max(per_panel.values()) <= 2 * MAX_CURVES, per_panel        # unit health: two lines per layer
    text = _texts(fig)
    assert f"{n - MAX_CURVES}" in text and "left out" in text
    assert len([ax for ax in fig.axes if ax.get_title().startswith("6 · l")]) <= MAX_HISTOGRAMS


def test_deeply_nested_meta_is_refused_on_load_and_on_save(tmp_path):
    deep = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    h = History(4)
    h.meta["deep"] = deep
    with pytest.raises(ValueError, match=f"{MAX_META_DEPTH}"):
        h.save_jsonl(tmp_path / "h.jsonl")
    assert not (tmp_path / "h.jsonl").exists()
    head = '{"format": "minitrain-inspect history", "version": 3, "series": 0, "max_points": 4, "meta": '
    (tmp_path / "deep.jsonl").write_text(head + '{"x": ' * 100_000 + "{}" + "}" * 100_000 + "}\n")
    with pytest.raises(ValueError, match="deep.jsonl, line 1"):
        History.load_jsonl(tmp_path / "deep.jsonl")


def test_the_dashboard_command_refuses_deep_meta_in_one_line(tmp_path, capsys):
    head = '{"format": "minitrain-inspect history", "version": 3, "series": 0, "max_points": 4, "meta": '
    (tmp_path / "deep.jsonl").write_text(head + '{"x": ' * 100_000 + "{}" + "}" * 100_000 + "}\n")
    one_line_error(capsys, main(["dashboard", str(tmp_path / "deep.jsonl"), "--out", str(tmp_path / "d.png")]),
                   "line 1")


def test_values_at_the_ends_of_float64_draw(tmp_path):
    h = History(16)
    for i in range(30):
        for step in range(4):
            sign = (-1) ** (i + step)
            h.record(f"activations/l{i}/mean", step, sign * 1.797e308)
            h.record(f"extra/l{i}/value", step, sign * 1.797e308)
            h.record(f"gradients/l{i}.weight/l2", step, 1.797e308)
        h.record("loss/train", i, 1.797e308 * (-1) ** i)
    h.meta["panels"] = {"extra": {"title": "mine"}}
    save_dashboard(h, tmp_path / "d.png")
    fig = render_dashboard(h)
    for ax in fig.axes:
        for line in ax.lines:
            y = np.asarray(line.get_ydata(), float)
            assert np.all(np.abs(y[np.isfinite(y)]) <= DRAWABLE)
    assert "beyond" in _texts(fig)


# --- CLI and config -------------------------------------------------------------------------------------------------

def test_a_huge_blas_thread_count_is_refused_in_one_line(capsys):
    code = main(["train", "--steps", "1", "--quiet", "--blas-threads", "99999999999999999999"])
    one_line_error(capsys, code, "99999999999999999999", str(MAX_BLAS_THREADS))
    with pytest.raises(ValueError, match=str(MAX_BLAS_THREADS)):
        TrainConfig(blas_threads=MAX_BLAS_THREADS + 1)


@pytest.mark.parametrize("argv,limit", [
    (["train", "--steps", "100000000000000000000"], "--steps"),
    (["train", "--eval-every", "100000000000000000000"], "--eval-every"),
    (["demo", "--out", "{tmp}/d", "--bench-steps", "100000000000000000000"], "--bench-steps"),
    (["demo", "--out", "{tmp}/d", "--bench-repeats", "100000000000"], "--bench-repeats"),
    (["demo", "--out", "{tmp}/d", "--bench-widths", "100000000000"], "--bench-widths"),
    (["diagnose", "--gallery", "--seeds", "99999999999"], "--seeds"),
    (["diagnose", "--gallery", "--steps", "99999999999"], "--steps"),
    (["overhead", "--repeats", "100000000000", "--quiet"], "repeats"),
    (["overhead", "--scaling-repeats", "100000000000", "--quiet"], "scaling repeats"),
    (["overhead", "--steps", "100000000000", "--quiet"], "steps"),
])
def test_counts_beyond_their_documented_limit_are_refused(tmp_path, capsys, argv, limit):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    err = one_line_error(capsys, main(argv), limit, "at most")
    bound = err.rsplit("at most ", 1)[1].split()[0].rstrip(",;")
    with pytest.raises(SystemExit):
        main([argv[0], "--help"])
    assert bound in capsys.readouterr().out, f"the limit {bound} of {limit} is not in --help"
    assert not (tmp_path / "d").exists()


def test_train_config_limits():
    with pytest.raises(ValueError, match=f"{MAX_STEPS}"):
        TrainConfig(steps=MAX_STEPS + 1)
    assert TrainConfig(steps=MAX_STEPS).steps == MAX_STEPS


@pytest.mark.parametrize("bad", ["walk", b"walk", [b"walk"], ["walk", 3]])
def test_keep_in_train_as_a_single_string_is_refused(bad):
    with pytest.raises(TypeError, match="walk|3"):
        make_dataset(keep_in_train=bad)


def test_keep_in_train_as_a_collection_keeps_every_verb():
    for keep, kept in ((["walk"], {"walk"}), (("walk", "go"), {"walk", "go"}), ({"go"}, {"go"}),
                       ((v for v in ["walk"]), {"walk"})):
        data = make_dataset(keep_in_train=keep, val_fraction=0.9)
        assert kept <= set(data.train.lemmas) and not kept & set(data.val.lemmas)


@pytest.mark.parametrize("field,value", [("eval_every", 0), ("steps", -1), ("blas_threads", 0), ("lr", math.nan),
                                         ("hidden", ()), ("optimizer", "adamw"), ("diagnose_every", 0)])
def test_a_bad_value_set_on_an_existing_config_is_refused_when_set(field, value):
    config = TrainConfig(steps=1, progress=False)
    with pytest.raises((ValueError, TypeError), match=field):
        setattr(config, field, value)
    assert train(config).config.steps == 1


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (BYTES, BYTES))
    from minitrain_inspect.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("limit", [0, 4096, 200_000])
def test_demo_on_a_full_disk_leaves_no_folder_behind(tmp_path, limit):
    out = tmp_path / "new" / "run"
    r = subprocess.run([sys.executable, "-c", FULL_DISK.replace("BYTES", str(limit)), "demo", "--out", str(out),
                        "--steps", "3", "--no-benchmark", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "error" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not (tmp_path / "new").exists(), "a failed run left folders behind"


def test_demo_on_a_full_disk_keeps_an_earlier_folder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    r = subprocess.run([sys.executable, "-c", FULL_DISK.replace("BYTES", "4096"), "demo", "--out", str(out),
                        "--steps", "3", "--no-benchmark", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"


INTERRUPT_AT = textwrap.dedent("""
    import importlib.abc, sys
    class Interrupt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == sys.argv[1]:
                raise KeyboardInterrupt           # Ctrl-C, exactly while this module is being imported
    sys.meta_path.insert(0, Interrupt())
    from minitrain_inspect.cli import main
    assert "numpy" not in sys.modules, "the entry point imports numpy before main() starts"
    sys.exit(main(sys.argv[2:]))
""")


@pytest.mark.parametrize("module", ["numpy", "minitrain_inspect.stats", "minitrain_inspect.train",
                                    "minitrain_inspect.course", "nbformat"])
def test_ctrl_c_during_releases_imports_is_one_line(tmp_path, module):
    out = tmp_path / "release"
    r = subprocess.run([sys.executable, "-c", INTERRUPT_AT, module, "release", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "interrupted\n"), (module, r.stderr[-2000:])
    assert not out.exists()
