"""Issue 7: a dashboard that does not mislead. Regressions for each defect, on synthetic histories with the Inspector's
keys (so they test the drawing alone), and one plain training loop watched end to end."""
import os
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minitrain_inspect.dashboard import (LayerStyle, output_layers, render_dashboard, save_dashboard, summary_lines,
                                         param_layer)
from minitrain_inspect.panels import History

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"mlp.hidden1": "Linear", "mlp.act1": "ReLU", "mlp.drop1": "Dropout", "mlp.hidden2": "Linear",
          "mlp.act2": "ReLU", "mlp.drop2": "Dropout", "mlp.output": "Linear", "copy": "Linear"}
PARAMS = ["mlp.hidden1.weight", "mlp.hidden1.bias", "mlp.hidden2.weight", "mlp.hidden2.bias", "mlp.output.weight",
          "mlp.output.bias", "copy.weight"]


def synthetic_history(steps=60, every=3, labels=True, nan_from=None, throttled=0):
    "The past-tense model's keys and meta; the output layer's mean drifts to -6, act2 meets NaN from `nan_from`."
    rng = np.random.default_rng(0)
    h = History()
    h.meta.update(module_types=dict(LAYERS), layers=list(LAYERS), params=list(PARAMS),
                  histogram={n: {"kind": "relu", "lo": 0.0, "hi": 4.0, "bins": 20} for n in ("mlp.act1", "mlp.act2")},
                  throttled=[{"step": i, "panel": "units", "from": "every 1", "to": "every 2", "overhead": 0.5}
                             for i in range(throttled)],
                  budget_notes=[], notes=[] if labels else ["per-class loss: no verb labels were given"],
                  title="synthetic run", config={"steps": steps, "lr": 0.001})
    for s in range(steps):
        h.record("loss/train", s, 3.0 / (1 + s) + 0.01 * rng.random())
        if labels:
            h.record("per_class/regular", s, 2.0 / (1 + s))
            h.record("per_class/irregular", s, 4.0 / (1 + s))
        if s % every:
            continue
        for i, name in enumerate(LAYERS):
            bad = 7 if nan_from is not None and name == "mlp.act2" and s >= nan_from else 0
            mean = -6.0 * s / steps if name == "mlp.output" else 0.1 * i + 0.01 * rng.standard_normal()
            for field, value in (("mean", mean), ("std", 1.0 + i), ("absmax", 5.0 + i), ("nonfinite", bad)):
                h.record(f"activations/{name}/{field}", s, value)
            h.record(f"act_grads/{name}/l2", s, 0.1 + 0.01 * i)
            h.record(f"act_grads/{name}/nonfinite", s, 0)
            if LAYERS[name] == "ReLU":
                h.record(f"units/{name}/dead", s, 0.04)
                h.record(f"units/{name}/zero_share", s, 0.52)
                h.record(f"units/{name}/histogram", s, list(np.full(20, 0.97 / 20)))
                h.record(f"units/{name}/below", s, 0.0)
                h.record(f"units/{name}/above", s, 0.03)
        for j, p in enumerate(PARAMS):
            h.record(f"gradients/{p}/l2", s, 1.0 + j)
            h.record(f"gradients/{p}/nonfinite", s, 0)
            h.record(f"updates/{p}/ratio", s, 1e-3 * (1 + j))
            if p.endswith("weight"):
                h.record(f"spectral/{p}/sigma", s, 2.0 + j)
    return h


@pytest.fixture(scope="module")
def history():
    return synthetic_history(nan_from=30)


@pytest.fixture(scope="module")
def figure(history):
    fig = render_dashboard(history)
    FigureCanvasAgg(fig).draw()
    return fig


def series_lines(fig):
    "Every drawn series, by its gid (`panel/name/field`), with the axes it is in."
    return [(line.get_gid(), line, ax) for ax in fig.axes for line in ax.lines if line.get_gid()]


def test_one_colour_per_layer_in_every_panel(history, figure):
    style = LayerStyle(history)
    colours = {}
    for gid, line, _ in series_lines(figure):
        name = gid.split("/")[1]
        layer = name if name in LAYERS else param_layer(name, list(LAYERS))
        colours.setdefault(layer, set()).add(line.get_color())
    assert set(colours) == {"mlp.hidden1", "mlp.act1", "mlp.hidden2", "mlp.act2", "mlp.output", "copy"}
    for layer, seen in colours.items():
        assert seen == {style.colour(layer)}, f"{layer} is drawn in {len(seen)} colours: {seen}"
    assert len({style.colour(layer) for layer in colours}) == len(colours), "two layers share a colour"
    # The colours follow the meta's layer order, so another run of the same model gets the same ones.
    assert LayerStyle(synthetic_history(steps=6)).colours == style.colours


def test_panels_in_reading_order(figure):
    "Sorted by position on the page (rows top to bottom, then left to right), the panel numbers never go down."
    numbered = []
    for ax in figure.axes:
        match = re.match(r"(\d) ·", ax.get_title(loc="left"))
        if match:
            box = ax.get_position()
            numbered.append((-round(box.y1, 2), box.x0, int(match.group(1))))
    order = [n for *_, n in sorted(numbered)]
    assert order == sorted(order) and set(order) == set(range(1, 8)), order


def test_dropout_is_treated_the_same_in_every_panel(history, figure):
    drawn = {gid.split("/")[1] for gid, _, _ in series_lines(figure)}
    assert not drawn & {"mlp.drop1", "mlp.drop2"}, "dropout is hidden in one panel, so it must be hidden in all"
    key_text = " ".join(t.get_text() for ax in figure.axes for t in ax.texts)
    assert "drop1" in key_text and "drop2" in key_text, "the key must say which layers are not drawn"
    # And the old way to show one: an activation-gradient series named with a ':grad_output' suffix never appears.
    assert not any(":" in gid for gid, _, _ in series_lines(figure))


def test_legends_never_cover_the_data(figure):
    checked = 0
    for ax in figure.axes:
        legend = ax.get_legend()
        if legend is None or not ax.axison:
            continue
        box, frame = legend.get_window_extent(), ax.get_window_extent()
        overlap_x = min(box.x1, frame.x1) - max(box.x0, frame.x0)
        overlap_y = min(box.y1, frame.y1) - max(box.y0, frame.y0)
        assert overlap_x <= 1 or overlap_y <= 1, f"the legend of {ax.get_title(loc='left')!r} covers its data"
        checked += 1
    assert checked >= 4


def test_mean_of_hidden_layers_is_not_flattened_by_the_logits(history, figure):
    assert output_layers(LayerStyle(history)) == ["mlp.output", "copy"]
    hidden_axes = {ax for gid, _, ax in series_lines(figure) if gid == "activations/mlp.act1/mean"}
    (ax,) = hidden_axes
    assert not any(gid == "activations/mlp.output/mean" for gid, line, a in series_lines(figure) if a is ax)
    lo, hi = ax.get_ylim()
    assert hi - lo < 2, f"the hidden layers' means (0 to 0.8) are squeezed into an axis spanning {lo:.1f}..{hi:.1f}"


def test_nonfinite_values_are_shown(history, figure):
    crosses = [line for ax in figure.axes for line in ax.lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert crosses, "a NaN in act2 must be marked on the dashboard"
    assert {int(x) for line in crosses for x in line.get_xdata()} == set(range(30, 60, 3))
    lines = summary_lines(history)
    assert "NON-FINITE VALUES (NaN or inf):" in lines
    assert "  act2 output: 70 values at 10 recorded steps, first at step 30" in lines
    assert "non-finite values: none" in summary_lines(synthetic_history(steps=6))


def test_dead_units_and_zero_share_are_apart_and_labelled(history, figure):
    lines = summary_lines(history)
    assert "act1: 4.0% of units dead, 52.0% of outputs ≤ 0" in lines, lines
    assert not any(re.search(r"52\.0% dead", line) for line in lines), "the zero-output share is not the dead share"
    (ax,) = {ax for gid, _, ax in series_lines(figure) if gid == "units/mlp.act1/dead"}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["dead units: ≤ 0 for every example", "outputs ≤ 0, share of all outputs"], labels
    shares = {gid: float(line.get_ydata()[0]) for gid, line, _ in series_lines(figure) if gid.startswith("units/")}
    assert shares["units/mlp.act1/dead"] == pytest.approx(4.0) and shares["units/mlp.act1/zero_share"] == pytest.approx(52.0)


def test_histogram_shows_what_falls_outside_its_range(figure):
    meshes = [(ax, c) for ax in figure.axes if ax.get_label() != "<colorbar>"
              for c in ax.collections if type(c).__name__ == "QuadMesh"]
    assert len(meshes) == 2, "one histogram per ReLU layer"
    for ax, mesh in meshes:
        ticks = [t.get_text() for t in ax.get_yticklabels()]
        assert ticks[0] == "< 0" and ticks[-1] == "> 4", ticks
        cells = mesh.get_array()
        assert cells.shape[0] == 20 + 4                          # bins, two gaps, below, above
        assert float(cells[-1, 0]) == pytest.approx(3.0)         # 3% above the range, in its own row
        assert float(cells[2:-2, 0].sum()) == pytest.approx(97.0)  # not clamped into the top bin


def test_no_text_says_a_dead_unit_is_an_emptied_histogram_row():
    texts = {p.name: p.read_text(encoding="utf-8") for p in
             [ROOT / "README.md", *sorted((ROOT / "nbs").glob("*.ipynb"))]}
    wrong = re.compile(r"dead unit[^.]{0,80}\brow\b[^.]{0,60}\bempt|dead unit[^.]{0,60}\bempt\w*[^.]{0,40}\brow", re.I)
    for name, text in texts.items():
        assert not wrong.search(text), f"{name} says a dead unit shows as an emptied histogram row"


def test_per_class_panel_without_labels_says_so():
    fig = render_dashboard(synthetic_history(steps=9, labels=False))
    (ax,) = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("7 ·")]
    assert not ax.lines, "nothing to draw"
    assert any("no verb labels were given" in t.get_text() for t in ax.texts), "the panel must say why it is empty"
    bare = synthetic_history(steps=9, labels=False)
    bare.meta["notes"] = []                                       # even without a note, the panel explains itself
    (ax,) = [ax for ax in render_dashboard(bare).axes if ax.get_title(loc="left").startswith("7 ·")]
    assert any("verb labels" in t.get_text() for t in ax.texts)


def test_empty_history_draws_every_panel_with_a_reason():
    fig = render_dashboard(History())
    titles = " ".join(ax.get_title(loc="left") for ax in fig.axes)
    for number in range(1, 8):
        assert f"{number} ·" in titles, number
    messages = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(m.startswith("no ") for m in messages) >= 8, messages


def test_summary_stays_short_whatever_the_guard_did():
    lines = summary_lines(synthetic_history(steps=6, throttled=5300))
    assert len(lines) < 25 and "budget guard: 5300 adjustments, the last:" in lines


def test_title_and_config_come_from_the_history(history):
    fig = render_dashboard(history)
    assert fig.get_suptitle() == "synthetic run"
    assert any("steps=60" in t.get_text() for ax in fig.axes for t in ax.texts)
    assert render_dashboard(history, title="given").get_suptitle() == "given"


def test_save_is_atomic(history, tmp_path, monkeypatch):
    path = save_dashboard(history, tmp_path / "dashboard.png")
    before = path.read_bytes()
    assert before[:8] == b"\x89PNG\r\n\x1a\n"

    def broken_savefig(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        save_dashboard(history, path)
    assert path.read_bytes() == before, "a failed save must leave the previous dashboard intact"
    assert os.listdir(tmp_path) == ["dashboard.png"], "and no temporary file behind"


@pytest.mark.parametrize("target,words", [("dashboard.xyz", "suffix must be one of"), ("", "a folder")])
def test_save_refuses_bad_targets(history, tmp_path, target, words):
    with pytest.raises(ValueError, match=words):
        save_dashboard(history, tmp_path / target)
    assert os.listdir(tmp_path) == []


def test_render_rejects_what_is_not_a_history():
    with pytest.raises(TypeError, match="needs a History"):
        render_dashboard({"loss/train": [1.0]})


def test_a_plain_loop_gives_every_panel_at_steps_0_to_n_minus_1(tmp_path):
    "The issue's plain loop, no step calls: every per-step panel drawn at steps 0..N-1, per-class explained."
    from minitrain_inspect.core import Sequential
    from minitrain_inspect.inspect import EVERY_STEP, Inspector
    from minitrain_inspect.layers import Dropout, Linear, ReLU
    from minitrain_inspect.losses import SoftmaxCrossEntropy
    from minitrain_inspect.optim import SGD

    rng = np.random.default_rng(1)
    model = Sequential(fc1=Linear(6, 8), act=ReLU(), drop=Dropout(0.2), out=Linear(8, 3, init="xavier"))
    loss_fn, opt = SoftmaxCrossEntropy(), SGD(model.parameters(), lr=0.1)
    n = 12
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as inspector:
        for _ in range(n):
            x = rng.standard_normal((16, 6)).astype(np.float32)
            y = rng.integers(0, 3, 16)
            model.zero_grad()
            loss_fn(model(x), y)
            model.backprop(loss_fn.backward())
            opt.step()
    h = inspector.history
    for key in ("loss/train", "activations/fc1/mean", "act_grads/act/l2", "gradients/fc1.weight/l2",
                "updates/out.weight/ratio", "spectral/out.weight/sigma", "units/act/dead", "units/act/histogram"):
        assert h.get(key)[0].tolist() == list(range(n)), key
    fig = render_dashboard(h)
    FigureCanvasAgg(fig).draw()
    drawn = {gid.split("/")[0] for gid, line, _ in series_lines(fig) if len(line.get_xdata()) == n}
    assert drawn == {"activations", "act_grads", "gradients", "updates", "spectral", "units"}, drawn
    (ax,) = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("7 ·")]
    assert any("verb labels" in t.get_text() for t in ax.texts)
    save_dashboard(h, tmp_path / "plain.png")


# --- issue 10: the dashboard answers its question ----------------------------------------------------------------

def _diagnosed(verdict, fired=(), reasons=()):
    h = synthetic_history()
    h.meta["diagnosis"] = {"verdict": verdict, "reasons": list(reasons), "step": fired[0] if fired else None,
                           "every": 10, "early_stop": False, "fired": [{"step": s, "checks": ["dead_units"]} for s in fired],
                           "reports": [{"step": s} for s in range(0, 60, 10)]}
    return h


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_verdict_banner_and_summary_lead_with_the_verdict():
    failing = _diagnosed("failing", fired=(20, 30), reasons=["dead_units: act2 95% dead", "loss_spike: 12x"])
    fig = render_dashboard(failing)
    texts = _texts(fig)
    assert any(t.startswith("FAILING from step 20") for t in texts), texts
    assert any("dead_units: act2 95% dead" in t for t in texts)
    assert summary_lines(failing)[0].startswith("FAILING from step 20")
    healthy = _diagnosed("trustworthy")
    assert summary_lines(healthy)[0].startswith("HEALTHY: no check fired")
    assert any(t.startswith("HEALTHY") for t in _texts(render_dashboard(healthy)))
    plain = synthetic_history()
    assert summary_lines(plain)[0].startswith("not diagnosed"), "no verdict is better than a made-up one"


def test_markers_on_every_panel_over_training_steps():
    fig = render_dashboard(_diagnosed("failing", fired=(20, 30), reasons=["x"]))
    marked = [ax for ax in fig.axes if any(l.get_gid() == "diagnosis/fired" for l in ax.lines)]
    assert len(marked) == 11, len(marked)        # loss, 4 activations, 2 gradients, updates, spectral, units, per-class
    for ax in marked:
        xs = sorted(l.get_xdata()[0] for l in ax.lines if l.get_gid() == "diagnosis/fired")
        assert xs == [20, 30], xs
    assert not any(l.get_gid() == "diagnosis/fired" for ax in render_dashboard(_diagnosed("trustworthy")).axes
                   for l in ax.lines)


def test_a_malformed_diagnosis_is_ignored():
    h = synthetic_history()
    h.meta["diagnosis"] = {"verdict": "probably fine", "fired": [{"step": "x"}]}
    assert summary_lines(h)[0].startswith("not diagnosed")
    render_dashboard(h)


# --- regressions from the second adversarial review: a run stopped early at step 7 ---------------------------------

@pytest.fixture(scope="module")
def stopped_run():
    "`demo --lr 1000 --optimizer sgd --momentum 0 --early-stop`: the loss is NaN at step 7, the run stops cleanly."
    from minitrain_inspect.diagnose import train as diagnosed_train
    from minitrain_inspect.inspect import Inspector
    from minitrain_inspect.train import TrainConfig
    config = TrainConfig(steps=2000, optimizer="sgd", lr=1000.0, momentum=0.0, early_stop=True, diagnose_every=50,
                         progress=False)
    with np.errstate(all="ignore"):
        result = diagnosed_train(config, inspector=Inspector())
    assert result.early_stop.step == 7, result.early_stop
    history = result.inspector.history
    history.meta["title"] = "Past-tense model"
    fig = render_dashboard(history)
    FigureCanvasAgg(fig).draw()
    return history, fig


def test_a_stopped_run_says_how_far_it_went(stopped_run):
    "Regression: the title and banner of a run stopped at step 7 read like a full 2000-step run."
    history, fig = stopped_run
    assert fig.get_suptitle() == "Past-tense model\n7 of 2000 steps, stopped early"
    head = summary_lines(history)[0]
    assert head == "FAILING from step 7 (checks fired at 1 diagnosis, every 50 steps); 7 of 2000 steps, stopped early"


def test_counts_are_in_good_grammar(stopped_run):
    "Regression: 'checks fired at 1 diagnoses', 'loss not finite (1 steps)', 'not finite at 1 steps'."
    history, fig = stopped_run
    words = _texts(fig) + summary_lines(history) + [t.get_text() for ax in fig.axes if ax.get_legend()
                                                    for t in ax.get_legend().get_texts()]
    assert not [w for w in words if re.search(r"\b1 (diagnoses|steps|values)\b", w)], words
    assert any("loss not finite (1 step)" in w for w in words)


def test_panels_measured_once_show_the_point_and_say_why(stopped_run):
    "Regression: panels 2-6 measured only step 0, drew one-point lines (invisible) and looked empty, saying nothing."
    history, fig = stopped_run
    panels = [ax for ax in fig.axes if ax.get_xlabel().startswith("training step")
              and any(str(l.get_gid()).split("/")[0] in ("activations", "gradients", "act_grads", "updates", "spectral",
                                                        "units") for l in ax.lines)]
    assert len(panels) == 9, len(panels)          # 4 activations, 2 gradients, updates, spectral, unit health
    for ax in panels:
        drawn = [l for l in ax.lines if l.get_gid() and "/" in l.get_gid() and l.get_gid() != "diagnosis/fired"]
        assert drawn and all(l.get_marker() == "o" for l in drawn), (ax.get_ylabel(), [l.get_marker() for l in drawn])
        assert "only step 0 measured: the run ended\nat step 7" in ax.get_xlabel(), ax.get_xlabel()
        assert ax.get_xlim()[1] >= 7, "the step axis spans the whole run"
    histograms = [ax for ax in fig.axes if ax.get_title(loc="left").endswith(": output values")]
    assert len(histograms) == 2
    for ax in histograms:
        assert ax.get_xlim() == (-0.5, 7.5), "one measurement is a narrow column, not the whole run"
        assert "only step 0 measured" in ax.get_xlabel()


def test_a_run_measured_throughout_gets_no_note(figure):
    assert not any("measured:" in ax.get_xlabel() for ax in figure.axes)


def test_a_complete_run_with_a_thinned_loss_series_is_not_called_short():
    "Regression: 2,000 steps thinned to every 4th point read as '1997 of 2000 steps recorded' on a complete run."
    from minitrain_inspect.dashboard import run_length
    from minitrain_inspect.panels import History
    h = History(max_points=512)
    h.meta["config"] = {"steps": 2000}
    for step in range(2000):
        h.record("loss/train", step, 1.0)
    assert h.get("loss/train")[0][-1] == 1999         # history version 3 keeps the newest point through thinning
    assert run_length(h) is None
    short = History()
    short.meta["config"] = {"steps": 2000}
    for step in range(30):
        short.record("loss/train", step, 1.0)
    assert run_length(short) == "30 of 2000 steps recorded"
