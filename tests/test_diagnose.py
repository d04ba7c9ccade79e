"Issue 10: the diagnosis protocol, the Diagnoser observer, early stop, the report's JSON, and bad inputs."
import dataclasses
import json
import math

import numpy as np
import pytest

from minitrain_inspect import diagnose as dg
from minitrain_inspect.data import make_dataset
from minitrain_inspect.inspect import Inspector
from minitrain_inspect.panels import History
from minitrain_inspect.train import PastTenseModel, TrainConfig, params_sha256
from minitrain_inspect.train import train as plain_train

SHORT = TrainConfig(steps=120, progress=False)


@pytest.fixture(scope="module")
def batch():
    data = make_dataset(0.2, seed=0)
    return data.val.inputs[:32], data.val.targets[:32]


def report_of(model, batch, **kw):
    return dg.diagnose(model, *batch, **kw)


# --- observing changes nothing ------------------------------------------------------------------------------------

def test_diagnosis_leaves_parameters_and_inspector_statistics_unchanged():
    a = plain_train(SHORT, inspector=Inspector())
    b = dg.train(dataclasses.replace(SHORT, diagnose_every=10, early_stop=True), inspector=Inspector())
    assert b.early_stop.stopped is False and b.diagnoser.verdict == "trustworthy", b.diagnoser.reasons
    assert b.params_sha256 == a.params_sha256, "a diagnosed run must end with the same parameters"
    assert a.history == b.history
    assert a.inspector.history.series == b.inspector.history.series, "the Inspector must not see the diagnosis"
    assert a.inspector.snapshot() == b.inspector.snapshot()
    assert b.inspector.history.meta["diagnosis"]["verdict"] == "trustworthy"
    assert "diagnosis" not in a.inspector.history.meta


def test_probe_restores_hooks_and_gradients_when_the_loss_fails(batch):
    model = PastTenseModel(seed=0)
    calls = []
    model.mlp["act1"].register_forward_hook(lambda *a: calls.append(1))
    grads = [p.grad.copy() for p in model.parameters()]
    bad_targets = np.full_like(batch[1], 99)                      # out of range: the loss raises
    with pytest.raises(ValueError, match="targets must lie in"):
        dg.probe(model, batch[0], bad_targets)
    assert all((p.grad == g).all() for p, g in zip(model.parameters(), grads)), "gradients restored on error"
    model(batch[0])
    assert calls == [1], "the model's own hooks are back after an error, and ours are gone"
    assert model.training


# --- each check fires when it should, and only then --------------------------------------------------------------

def scaled_model(scale, bias=None):
    model = PastTenseModel(seed=0)
    dg.Sabotage(weight_scale=scale, hidden_bias=bias).begin_run(type("Run", (), {"model": model})())
    return model


def fired(report):
    return {c.name for c in report.fired}


def test_healthy_initialisation_is_trustworthy(batch):
    report = report_of(PastTenseModel(seed=0), batch)
    assert report.verdict == "trustworthy", report.reasons
    assert [c.name for c in report.checks] == list(dg.CHECKS)
    assert report.seconds > 0 and math.isfinite(report.eval_loss)


def test_large_weights_fire_the_growth_check(batch):
    assert fired(report_of(scaled_model(30.0), batch)) == {"hidden_norm_growth"}
    assert "hidden_norm_growth" not in fired(report_of(scaled_model(3.0), batch))


def test_dead_biases_fire_dead_units_and_the_gradient_floor(batch):
    assert {"dead_units", "gradient_floor"} <= fired(report_of(scaled_model(None, bias=-3.0), batch))


def test_tiny_weights_fire_the_gradient_floor(batch):
    report = report_of(scaled_model(1e-4), batch)
    floor = next(c for c in report.checks if c.name == "gradient_floor")
    assert floor.fired and floor.value < 1e-7, floor


def test_nan_weight_fires_non_finite_and_exploding(batch):
    model = PastTenseModel(seed=0)
    model.mlp["hidden2"].weight.data[0, 0] = np.nan
    with np.errstate(all="ignore"):
        report = report_of(model, batch)
    assert {"non_finite", "exploding_gradient"} <= fired(report), report.reasons
    assert json.loads(report.to_json())["verdict"] == "failing"


def test_inspector_nonfinite_counts_reach_the_check(batch):
    h = History()
    h.record("activations/mlp.act1/nonfinite", 3, 0)
    h.record("activations/mlp.act1/nonfinite", 7, 5)
    model = PastTenseModel(seed=0)
    assert "non_finite" in fired(report_of(model, batch, history=h, since=5))
    assert "non_finite" not in fired(report_of(model, batch, history=h, since=8))


def test_loss_checks_read_the_inspector_history_when_no_losses_are_given(batch):
    h = History()
    for step in range(300):
        h.record("loss/train", step, 1.0)
    report = report_of(PastTenseModel(seed=0), batch, history=h, step=300)
    assert "no_learning" in fired(report), report.reasons


# --- the Diagnoser during training, and early stop ----------------------------------------------------------------

def test_lr5_adam_stops_early_with_a_failing_verdict():
    r = dg.train(TrainConfig(lr=5.0, steps=400, progress=False, diagnose_every=50, early_stop=True))
    es = r.early_stop
    assert (es.stopped, es.step, es.verdict) == (True, 50, "failing"), es
    assert len(r.history["step"]) == 50 and es.compute_saved["steps"] == 350
    assert any("dead_units" in reason for reason in es.reasons), es.reasons
    assert es.reasons == r.diagnoser.reasons


def test_without_early_stop_a_failing_run_trains_to_the_end_with_a_failing_verdict():
    r = dg.train(TrainConfig(lr=5.0, steps=120, progress=False, diagnose_every=50))
    assert not r.early_stop.stopped and len(r.history["step"]) == 120
    assert r.early_stop.verdict == "failing" and r.diagnoser.failing[0].step == 50
    assert [rep.step for rep in r.diagnoser.reports] == [0, 50, 100, 120]


@pytest.mark.parametrize("every", [1, 7, 1000])
def test_a_nan_loss_stops_the_run_whatever_the_interval(every):
    diagnoser = dg.Diagnoser()
    config = TrainConfig(steps=40, progress=False, diagnose_every=every, early_stop=True)
    r = plain_train(config, observers=[dg.Sabotage(nan_at=13), diagnoser])
    es = r.early_stop
    assert (es.stopped, es.step, es.verdict) == (True, 13, "failing"), es
    assert any("non-finite training loss nan" in reason for reason in es.reasons), es.reasons
    assert diagnoser.reports[-1].step == 13 and "non_finite" in fired(diagnoser.reports[-1])


def test_a_nan_loss_without_early_stop_still_raises():
    with pytest.raises(FloatingPointError, match="at step 13"):
        dg.train(TrainConfig(steps=40, progress=False, diagnose_every=10), observers=[dg.Sabotage(nan_at=13)])


def test_diagnose_every_without_a_diagnoser_is_refused():
    with pytest.raises(ValueError, match=r"observers=\[Diagnoser\(\)\]"):
        plain_train(TrainConfig(steps=3, progress=False, diagnose_every=1))
    fake = type("Fake", (), {"diagnoses": "yes"})()           # only `diagnoses = True` counts
    with pytest.raises(ValueError, match="diagnose.train"):
        plain_train(TrainConfig(steps=3, progress=False, diagnose_every=1), observers=[fake])


def test_dg_train_without_diagnose_every_adds_no_diagnoser():
    r = dg.train(TrainConfig(steps=3, progress=False))
    assert r.diagnoser is None and r.early_stop.verdict is None


def test_a_diagnoser_watches_one_run():
    d = dg.Diagnoser()
    config = TrainConfig(steps=2, progress=False, diagnose_every=1)
    plain_train(config, observers=[d])
    with pytest.raises(ValueError, match="watching another run"):
        plain_train(config, observers=[d])


def test_summary_is_strict_json_and_saved_atomically(tmp_path):
    d = dg.Diagnoser()
    plain_train(TrainConfig(lr=5.0, steps=60, progress=False, diagnose_every=20), observers=[d])
    path = tmp_path / "diagnosis.json"
    d.save(path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads(text)
    assert summary["verdict"] == "failing" and [f["step"] for f in summary["fired"]] == [20, 40, 60]
    reports = [dg.DiagnosticReport.from_dict(r) for r in summary["reports"]]
    assert [r.to_dict() for r in reports] == summary["reports"]
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(ValueError, match="folder"):
        d.save(tmp_path / "missing" / "diagnosis.json")


# --- bad inputs --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    ({"growth": -1}, "growth must be a positive finite number"),
    ({"growth": math.inf}, "growth must be a positive finite number"),
    ({"grad_floor": "1e-7"}, "grad_floor must be a positive finite number"),
    ({"exploding_ratio": True}, "exploding_ratio must be a positive finite number"),
    ({"dead_share": 0}, "dead_share must lie in (0, 1]"),
    ({"no_learning_factor": 1.5}, "no_learning_factor must lie in (0, 1]"),
    ({"spike_window": 1}, "spike_window must be at least 2"),
    ({"no_learning_after": 0}, "no_learning_after must be at least 1"),
    ({"vanishing_ratio": 80.0}, "must be below exploding_ratio"),
])
def test_bad_thresholds(kw, words):
    with pytest.raises((ValueError, TypeError)) as info:
        dg.DiagnosticThresholds(**kw)
    assert words in str(info.value)


@pytest.mark.parametrize("call, error, words", [
    (lambda b: dg.diagnose(PastTenseModel(seed=0), b[0], b[1][:5]), ValueError, "as many targets as inputs"),
    (lambda b: dg.diagnose(PastTenseModel(seed=0), b[0][:0], b[1][:0]), ValueError, "at least one"),
    (lambda b: dg.diagnose(PastTenseModel(seed=0), *b, step=1.5), TypeError, "step must be an integer"),
    (lambda b: dg.diagnose(PastTenseModel(seed=0), *b, losses=[1.0], new=2), ValueError, "new must be between"),
    (lambda b: dg.diagnose(object(), *b), TypeError, "diagnose needs a Module"),
    (lambda b: dg.diagnose(PastTenseModel(seed=0), *b, thresholds=0.5), TypeError, "DiagnosticThresholds"),
    (lambda b: dg.Diagnoser(eval_size=0), ValueError, "eval_size must be at least 1"),
    (lambda b: dg.Diagnoser(thresholds={}), TypeError, "DiagnosticThresholds"),
    (lambda b: dg.Sabotage(nan_at=-1), ValueError, "nan_at must be at least 0"),
    (lambda b: dg.gallery(seeds=0), ValueError, "seeds must be at least 1"),
])
def test_bad_arguments(batch, call, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(batch)


def test_a_model_without_a_trunk_is_refused(batch):
    from minitrain_inspect.layers import Linear
    with pytest.raises(ValueError, match="has none"):
        dg.diagnose(Linear(324, 378), *batch)


@pytest.mark.parametrize("bad, words", [
    ([], "is a JSON object"),
    ({"checks": []}, "needs the field 'step'"),
    ({"step": "3", "checks": []}, "report step must be an integer"),
    ({"step": 3, "checks": {}}, "checks must be a list"),
    ({"step": 3, "checks": [{"name": "x", "value": 1}]}, "exactly the fields"),
    ({"step": 3, "checks": [{"name": "x", "value": "1", "threshold": 1, "fired": False, "detail": ""}]},
     "value must be a number"),
    ({"step": 3, "checks": [{"name": "x", "value": 1, "threshold": 1, "fired": 1, "detail": ""}]}, "fired a bool"),
    ({"step": 3, "checks": [], "verdict": "failing"}, "disagrees"),
])
def test_report_from_bad_json(bad, words):
    with pytest.raises((ValueError, TypeError), match=words):
        dg.DiagnosticReport.from_dict(bad)
