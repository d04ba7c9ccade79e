"Issue 10: the diagnosis protocol, the Diagnoser observer, early stop, the report's JSON, and bad inputs."
import dataclasses
import json
import math

import numpy as np
import pytest
from blas_spy import threads_seen_inside

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




def test_the_probe_runs_on_one_blas_thread_whatever_the_environment_says():
    outside, inside = threads_seen_inside("""
from minitrain_inspect.diagnose import diagnose, probe
from minitrain_inspect.train import PastTenseModel, run_data, TrainConfig
data = run_data(TrainConfig())
model = PastTenseModel(hidden=(8,))
probe(model, data.val.inputs[:8], data.val.targets[:8], loss_fn=SpyLoss())
diagnose(model, data.val.inputs[:8], data.val.targets[:8], loss_fn=SpyLoss())
""")
    assert outside != [1] and inside == [[1]] * 2, (outside, inside)


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


def test_a_diagnoser_watches_one_run_at_a_time():
    "Regression U2: reuse after end_run starts afresh; only two runs at once are refused, saying what to do."
    from minitrain_inspect.train import training_steps
    d = dg.Diagnoser()
    config = TrainConfig(steps=2, progress=False, diagnose_every=1)
    running = training_steps(config, observers=[d])
    next(running)                                             # begun, not ended
    with pytest.raises(ValueError, match=r"has not ended.*its own Diagnoser\(\)"):
        plain_train(config, observers=[d])
    running.close()                                           # ends the run (end_run)
    plain_train(config, observers=[d])
    assert [r.step for r in d.reports] == [0, 1, 2]
    plain_train(dataclasses.replace(config, steps=4, diagnose_every=2), observers=[d])
    assert [r.step for r in d.reports] == [0, 2, 4] and d.every == 2, "the second run starts afresh, with its interval"
    assert d.summary()["planned_steps"] == 4


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


# --- regressions from the second adversarial review ---------------------------------------------------------------

STRICT = dg.DiagnosticThresholds(dead_share=0.01)


def test_train_applies_its_thresholds_to_the_diagnoser_it_adds():
    r = dg.train(TrainConfig(steps=2, progress=False, diagnose_every=1), thresholds=STRICT)
    assert r.diagnoser.thresholds == STRICT and r.diagnoser.verdict == "failing", "dead_share 1% fires at once"


def test_train_refuses_thresholds_it_cannot_apply():
    "Regression S5: thresholds= was ignored silently beside a Diagnoser passed in, and without diagnose_every."
    config = TrainConfig(steps=2, progress=False, diagnose_every=1)
    with pytest.raises(ValueError, match=r"give the thresholds to it, Diagnoser\(thresholds\)"):
        dg.train(config, observers=[dg.Diagnoser()], thresholds=STRICT)
    with pytest.raises(ValueError, match="diagnose_every is None"):
        dg.train(dataclasses.replace(config, diagnose_every=None), thresholds=STRICT)
    with pytest.raises(TypeError, match="DiagnosticThresholds"):
        dg.train(config, thresholds={"growth": 2.0})


@pytest.mark.parametrize("kw", [dict(growth=np.float32(5)), dict(grad_floor=np.float32(1e-6)),
                                dict(dead_share=np.float32(0.5)), dict(spike_factor=np.int64(12)),
                                dict(spike_window=np.int64(20)), dict(exploding_ratio=np.float16(60))])
def test_thresholds_accept_any_real_number_type(kw):
    "Regression U3: np.float32(5) was refused while np.float64 was accepted."
    th = dg.DiagnosticThresholds(**kw)
    (name, value), = kw.items()
    assert getattr(th, name) == float(value) and type(getattr(th, name)) in (int, float)
    json.dumps(th.to_dict(), allow_nan=False)


@pytest.mark.parametrize("value", [True, np.bool_(True), "5", None, 1 + 0j])
def test_thresholds_still_refuse_what_is_not_a_real_number(value):
    with pytest.raises(ValueError, match="growth must be a positive finite number"):
        dg.DiagnosticThresholds(growth=value)


ODD = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 1.7976931348623157e308, 0.1, 3]


@pytest.mark.parametrize("value, threshold, seconds, eval_loss", [
    (math.nan, math.inf, math.nan, -math.inf), (math.inf, 0.0, 0.0, math.nan), (-math.inf, -math.inf, math.inf, 2.5),
    (1e-300, 1.7976931348623157e308, 1e-9, 0.0)])
def test_report_json_round_trip_table(value, threshold, seconds, eval_loss):
    "Regression C4: NaN seconds broke from_dict; an inf threshold came back as NaN."
    r = dg.DiagnosticReport(3, [dg.CheckResult("x", value, threshold, True, "d")], seconds=seconds, eval_loss=eval_loss)
    text = r.to_json()
    strict = json.loads(text, parse_constant=lambda token: pytest.fail(f"not strict JSON: {token} in {text}"))
    back = dg.DiagnosticReport.from_dict(strict)
    assert back == r
    for got, want in ((back.checks[0].value, value), (back.checks[0].threshold, threshold), (back.seconds, seconds),
                      (back.eval_loss, eval_loss)):
        assert (math.isnan(got) and math.isnan(want)) or got == want, (got, want)


def test_report_json_round_trip_property():
    "Regression C4, as a property: every report of any numbers comes back equal from its strict JSON."
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD))
    check = st.builds(dg.CheckResult, st.sampled_from(dg.CHECKS), number, number, st.booleans(), st.text(max_size=8))

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.integers(0, 10**9), st.lists(check, max_size=8), number, number)
    def round_trip(step, checks, seconds, eval_loss):
        r = dg.DiagnosticReport(step, checks, seconds=seconds, eval_loss=eval_loss)
        back = dg.DiagnosticReport.from_dict(json.loads(r.to_json()))
        assert back == r and back.to_json() == r.to_json()
        assert back.verdict == r.verdict and back.reasons == r.reasons

    round_trip()


def test_real_reports_round_trip(tmp_path):
    "Reports the protocol produced on a diverging run, NaN and inf included, come back equal from diagnosis.json."
    d = dg.Diagnoser()
    with np.errstate(all="ignore"):
        plain_train(TrainConfig(steps=20, optimizer="sgd", lr=1000.0, momentum=0.0, progress=False, diagnose_every=1,
                                early_stop=True), observers=[d])
    d.save(tmp_path / "diagnosis.json")
    saved = json.loads((tmp_path / "diagnosis.json").read_text())["reports"]
    assert [dg.DiagnosticReport.from_dict(r) for r in saved] == d.reports


def test_one_report_per_step_when_a_diagnosed_step_has_a_nan_loss():
    "Regression: a diagnosis at step k, then a NaN loss at step k, gave two reports for step k."
    for every, early_stop in ((5, True), (1, True)):
        d = dg.Diagnoser()
        config = TrainConfig(steps=40, progress=False, diagnose_every=every, early_stop=early_stop)
        r = plain_train(config, observers=[dg.Sabotage(nan_at=10), d])
        steps = [rep.step for rep in d.reports]
        assert len(steps) == len(set(steps)) and steps[-1] == 10, steps
        assert "non_finite" in fired(d.reports[-1]) and r.early_stop.step == 10
        assert d.summary()["stopped_at"] == 10


def test_gallery_at_a_small_length_counts_only_runs_that_can_show_their_fault():
    "Regression: at --steps 60 the NaN run was never broken and the no-learning runs could not fire: '4 of 8 flagged'."
    rows = dg.run_gallery(steps=60, seeds=1, every=50, final=False)
    summary = dg.gallery_summary(rows)
    assert summary["not_applicable"] == ["weights far too small (x1e-3, SGD)", "labels shuffled",
                                         "lr far too low (Adam, lr 1e-7)"], summary
    assert (summary["broken_flagged"], summary["broken"], summary["false_positives"]) == (5, 5, 0), summary
    nan_row = next(r for r in rows if r["name"].startswith("NaN in one batch"))
    assert nan_row["name"] == "NaN in one batch (step 30)" and nan_row["step"] == 30 and nan_row["flagged"]
    table = dg.gallery_table(rows)
    assert table.count("| n/a |") == 3 and "left out of the counts" in table
    assert "| lr far too low (Adam, lr 1e-7) | broken | n/a | - | not applicable: needs 200 steps" in table
