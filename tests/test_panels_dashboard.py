"Panels on a real run of the past-tense model: what they record, and the dashboard and saved history drawn from it."
import json
import tracemalloc

import numpy as np
import pytest

from matplotlib.backends.backend_agg import FigureCanvasAgg

from minitrain_inspect.dashboard import render_dashboard, save_dashboard, summary_lines
from minitrain_inspect.inspect import EVERY_STEP, Inspector
from minitrain_inspect.panels import BoundedSeries, History, LogSchedule
from minitrain_inspect.train import TrainConfig, train

INSPECTOR_FILES = ("inspect.py", "panels.py", "stats.py", "per_class_loss.py")


@pytest.fixture(scope="module")
def default_run():
    return train(TrainConfig(progress=False), inspector=Inspector())


def test_every_panel_is_recorded(default_run):
    history = default_run.inspector.history
    panels = {k.split("/")[0] for k in history.keys()}
    assert panels == {"loss", "activations", "gradients", "act_grads", "updates", "spectral", "units", "per_class"}
    steps, _ = history.get("activations/mlp.act1/mean")
    assert list(steps[:3]) == [0, 10, 20]                      # default schedule: every 10 steps
    steps, _ = history.get("spectral/mlp.hidden1.weight/sigma")
    assert list(steps[:3]) == [0, 25, 50]


def test_spectral_norm_within_one_percent_after_training(default_run):
    history = default_run.inspector.history
    checked = 0
    for name, p in default_run.model.named_parameters():
        if p.data.ndim == 2:
            estimate = history.get(f"spectral/{name}/sigma")[1][-1]
            exact = np.linalg.norm(p.data.astype(np.float64), 2)
            assert abs(estimate - exact) / exact < 0.01, (name, estimate, exact)
            checked += 1
    assert checked == 4


def test_update_ratio_is_measured_across_the_optimiser_step(default_run):
    history = default_run.inspector.history
    steps, ratio = history.get("updates/mlp.hidden1.weight/ratio")
    assert steps.size > 100 and np.all((ratio > 1e-5) & (ratio < 1e-1))


def test_per_class_loss_skips_absent_classes_and_irregular_lags(default_run):
    history = default_run.inspector.history
    steps_r, regular = history.get("per_class/regular")
    steps_i, irregular = history.get("per_class/irregular")
    assert np.isfinite(regular).all() and np.isfinite(irregular).all()
    late = slice(len(regular) // 2, None)
    assert irregular[late].mean() > regular[late].mean()


def test_dead_units_are_fewer_than_zero_outputs_and_histograms_sum_to_one(default_run):
    history = default_run.inspector.history
    _, dead = history.get("units/mlp.act1/dead")
    _, zero = history.get("units/mlp.act1/zero_share")
    assert np.all((dead >= 0) & (dead <= zero) & (zero <= 1)), "a dead unit's outputs are all zero outputs"
    assert zero.mean() > 0.2 and dead.mean() < zero.mean() / 2, (dead.mean(), zero.mean())
    _, hist = history.get("units/mlp.act1/histogram")
    _, below = history.get("units/mlp.act1/below")
    _, above = history.get("units/mlp.act1/above")
    assert hist.shape[1] == 40
    np.testing.assert_allclose(hist.sum(axis=1) + below + above, 1.0, atol=1e-9)


def test_tanh_saturation_is_recorded():
    r = train(TrainConfig(steps=30, activation="tanh", progress=False),
              inspector=Inspector(schedules=EVERY_STEP))
    meta = r.inspector.history.meta["histogram"]["mlp.act1"]
    assert meta["kind"] == "tanh" and (meta["lo"], meta["hi"]) == (-1.0, 1.0)
    _, saturated = r.inspector.history.get("units/mlp.act1/saturated")
    _, share = r.inspector.history.get("units/mlp.act1/saturated_share")
    assert saturated.size == 30 and np.all((saturated >= 0) & (saturated <= share) & (share <= 1))


def test_dashboard_png_and_jsonl_round_trip(default_run, tmp_path):
    history = default_run.inspector.history
    saved = history.save_jsonl(tmp_path / "history.jsonl")
    for line in saved.read_text().splitlines():
        json.loads(line)                                         # strict JSON Lines
    back = History.load_jsonl(saved)
    assert back == history, "save then load gives an equal History"
    png = save_dashboard(back, tmp_path / "dashboard.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = render_dashboard(back)
    titles = " ".join(ax.get_title(loc="left") for ax in fig.axes)
    for number in range(1, 8):
        assert f"{number} ·" in titles, number
    for ax in fig.axes:
        if ax.axison and ax.get_label() != "<colorbar>":
            assert ax.get_ylabel(), ax.get_title(loc="left")


def test_one_histogram_per_activation_layer_at_the_right_steps():
    inspector = Inspector(schedules={"units": LogSchedule(ratio=1.5, dense=4)})
    train(TrainConfig(steps=60, hidden=(16, 16, 16), progress=False), inspector=inspector)
    history = inspector.history
    assert history.names("units") == ["mlp.act1", "mlp.act2", "mlp.act3"]
    fig = render_dashboard(history)
    meshes = [c for ax in fig.axes if ax.get_label() != "<colorbar>"
              for c in ax.collections if type(c).__name__ == "QuadMesh"]
    assert len(meshes) == 3
    steps, _ = history.get("units/mlp.act1/dead")
    x_edges = meshes[0].get_coordinates()[0, :, 0]
    assert len(x_edges) == len(steps) + 1
    assert np.all((x_edges[:-1] < steps) & (steps < x_edges[1:]))   # each column sits at its own (uneven) step


def test_summary_reports_the_lag(default_run):
    assert any("irregular verbs lag" in line for line in summary_lines(default_run.inspector.history))


def test_dashboard_of_a_real_run_draws_every_panel(default_run):
    fig = render_dashboard(default_run.inspector.history)
    FigureCanvasAgg(fig).draw()
    drawn = {line.get_gid().split("/")[0] for ax in fig.axes for line in ax.lines if line.get_gid()}
    assert drawn == {"activations", "act_grads", "gradients", "updates", "spectral", "units"}
    per_class = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("7 ·")][0]
    assert len(per_class.lines) == 4                             # raw and average, regular and irregular


def test_bounded_series_memory():
    s = BoundedSeries(64)
    for step in range(100_000):
        s.append(step, 1.0)
    assert len(s) < 64 and s.steps[0] == 0 and s.steps[-1] >= 100_000 - s.stride


def _inspector_bytes(snapshot):
    stats = snapshot.filter_traces([tracemalloc.Filter(True, f"*{name}") for name in INSPECTOR_FILES])
    return sum(stat.size for stat in stats.statistics("filename"))


def test_memory_stays_flat_over_10000_steps():
    "10,000 steps with every panel every step: the Inspector's memory at the end equals that at step 2,000."
    inspector = Inspector(schedules=EVERY_STEP, max_points=256)
    marks = {}

    class Probe:
        def before_step(self, step, batch):
            if step in (2_000, 9_999):
                marks[step] = (_inspector_bytes(tracemalloc.take_snapshot()), inspector.history.points())

    config = TrainConfig(steps=10_000, hidden=(8,), batch_size=8, dropout=0.0, eval_every=10_000, progress=False)
    tracemalloc.start()
    try:
        train(config, inspector=inspector, observers=[Probe()])
    finally:
        tracemalloc.stop()
    (bytes_2k, points_2k), (bytes_10k, points_10k) = marks[2_000], marks[9_999]
    print(f"Inspector memory: {bytes_2k / 1024:.0f} KiB at step 2,000, {bytes_10k / 1024:.0f} KiB at step 10,000; "
          f"{points_2k} and {points_10k} stored points")
    assert points_10k <= points_2k * 1.05
    assert bytes_10k <= bytes_2k * 1.10 + 64 * 1024


def test_a_users_panel_shows_points_between_nans_and_marks_the_nans():
    "Finite points separated by NaN get a dot each (a line would draw nothing); each NaN step gets the top-edge cross."
    import math
    from minitrain_inspect.dashboard import render_dashboard
    from minitrain_inspect.panels import History
    history = History()
    history.meta["panels"] = {"mine": {"title": "Mine", "ylabel": "", "log": False}}
    for step in range(10):
        history.record("mine/layer/value", step, 1.0 + step if step % 2 == 0 else math.nan)
    fig = render_dashboard(history)
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "Mine")
    data = [line for line in ax.lines if line.get_gid() == "mine/layer/value"]
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert data and data[0].get_marker() == "o", [l.get_marker() for l in ax.lines]
    assert crosses and sorted(crosses[0].get_xdata().tolist()) == [1, 3, 5, 7, 9]
