"The training loop: reproducibility, configuration errors, learning, observers, BLAS threads."
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from blas_spy import threads_seen_inside
from threadpoolctl import threadpool_info, threadpool_limits

import minitrain_inspect.train as train_module
from minitrain_inspect.train import TrainConfig, train, training_steps

ROOT = Path(__file__).resolve().parents[1]


def test_same_config_same_parameters():
    cfg = TrainConfig(steps=40, progress=False)
    assert train(cfg).params_sha256 == train(cfg).params_sha256


def test_other_seed_other_parameters():
    a = train(TrainConfig(steps=5, seed=0, progress=False))
    b = train(TrainConfig(steps=5, seed=1, progress=False))
    assert a.params_sha256 != b.params_sha256


def test_sgd_and_tanh_and_float64_run():
    r = train(TrainConfig(steps=30, optimizer="sgd", lr=0.5, activation="tanh", dtype="float64", progress=False))
    assert r.history["loss"][-1] < r.history["loss"][0]
    assert all(p.dtype == np.float64 for p in r.model.parameters())


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=-1), "steps must be at least 0"),
    (dict(batch_size=0), "batch_size must be at least 1"),
    (dict(lr=-0.1), "lr must lie in"),
    (dict(optimizer="rmsprop"), "optimizer must be"),
    (dict(hidden=()), "at least one width"),
    (dict(dropout=1.0), "dropout must lie in"),
    (dict(dtype="float16"), "float32 or float64"),
])
def test_bad_config(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainConfig(**kwargs)


def test_batch_larger_than_data():
    with pytest.raises(ValueError, match="larger than the data"):
        train(TrainConfig(steps=1, batch_size=100_000, progress=False))


def test_divergence_is_reported():
    with pytest.raises(FloatingPointError, match="diverged"), np.errstate(all="ignore"):
        train(TrainConfig(steps=200, optimizer="sgd", lr=1e6, momentum=0.9, progress=False))


def test_history_and_val_schedule():
    r = train(TrainConfig(steps=25, eval_every=10, progress=False))
    assert r.history["step"] == list(range(25))
    assert r.history["val_step"] == [9, 19, 24]
    assert all(math.isfinite(v) for v in r.history["val_loss"])


def blas_threads_now():
    return {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}


class Recorder:
    "An observer that logs its calls, the loss calls with the model's mode, and the optimiser's steps."

    def __init__(self, name="rec", log=None):
        self.name, self.log, self.handles = name, [] if log is None else log, []

    def begin_run(self, run):
        assert isinstance(run, train_module.RunContext)
        self.log.append((self.name, "begin_run"))
        model = run.model
        self.handles = [
            run.loss_fn.register_forward_hook(lambda m, a, k, out: self.log.append((self.name, "loss", model.training))),
            run.optimizer.register_step_pre_hook(lambda o, a, k: self.log.append((self.name, "pre", o.steps))),
            run.optimizer.register_step_post_hook(lambda o, a, k: self.log.append((self.name, "post", o.steps))),
        ]

    def before_step(self, step, batch):
        self.log.append((self.name, "before_step", step, len(batch.lemmas)))

    def end_run(self):
        for handle in self.handles:
            handle.remove()
        self.log.append((self.name, "end_run"))


def test_observers_see_the_run_through_three_calls_and_hooks():
    rec = Recorder()
    result = train(TrainConfig(steps=2, eval_every=2, batch_size=4, progress=False), observers=[rec])
    assert rec.log == [("rec", "begin_run"),
                       ("rec", "before_step", 0, 4), ("rec", "loss", True), ("rec", "pre", 0), ("rec", "post", 1),
                       ("rec", "before_step", 1, 4), ("rec", "loss", True), ("rec", "pre", 1), ("rec", "post", 2),
                       ("rec", "loss", False),                        # the held-out loss, in eval mode
                       ("rec", "end_run")]
    assert result.inspector is None and not any(h.active for h in rec.handles)


def test_inspector_argument_is_one_more_observer_and_is_returned():
    log = []
    first, last = Recorder("first", log), Recorder("inspector", log)
    result = train(TrainConfig(steps=1, progress=False), observers=[first], inspector=last)
    assert result.inspector is last
    assert [e for e in log if e[1] in ("begin_run", "end_run")] == [
        ("first", "begin_run"), ("inspector", "begin_run"), ("inspector", "end_run"), ("first", "end_run")]


def test_old_observer_events_are_not_called():
    called = []

    class Old:
        def begin_step(self, step): called.append("begin_step")
        def before_update(self, step): called.append("before_update")
        def after_update(self, step): called.append("after_update")
        def end_step(self, *a): called.append("end_step")
        def record_val_loss(self, *a): called.append("record_val_loss")

    train(TrainConfig(steps=2, eval_every=1, progress=False), observers=[Old()])
    assert called == []


class Interrupter(Recorder):
    def before_step(self, step, batch):
        super().before_step(step, batch)
        if step == 2:
            raise KeyboardInterrupt


@pytest.mark.parametrize("fault", ["diverges", "interrupt", "observer-error", "closed-early"])
def test_end_run_is_called_when_training_stops_early(fault):
    rec = Interrupter() if fault == "interrupt" else Recorder()
    if fault == "diverges":
        with pytest.raises(FloatingPointError, match="diverged"), np.errstate(all="ignore"):
            train(TrainConfig(steps=200, optimizer="sgd", lr=1e6, momentum=0.9, progress=False), observers=[rec])
    elif fault == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            train(TrainConfig(steps=10, progress=False), observers=[rec])
    elif fault == "observer-error":
        class Boom:
            def before_step(self, step, batch):
                raise RuntimeError("observer failed")
        with pytest.raises(RuntimeError, match="observer failed"):
            train(TrainConfig(steps=10, progress=False), observers=[rec, Boom()])
    else:
        run = training_steps(TrainConfig(steps=10, progress=False), observers=[rec])
        next(run)
        run.close()
    assert rec.log[-1] == ("rec", "end_run") and not any(h.active for h in rec.handles)


def test_a_failing_begin_run_ends_only_the_observers_that_started():
    log = []

    class FailsToStart(Recorder):
        def begin_run(self, run):
            raise ValueError("cannot start")

    started, failing, never = Recorder("started", log), FailsToStart("failing", log), Recorder("never", log)
    with pytest.raises(ValueError, match="cannot start"):
        train(TrainConfig(steps=3, progress=False), observers=[started, failing, never])
    assert log == [("started", "begin_run"), ("started", "end_run")]


def test_every_end_run_runs_even_if_one_raises():
    log = []

    class FailsToEnd(Recorder):
        def end_run(self):
            super().end_run()
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        train(TrainConfig(steps=2, progress=False), observers=[Recorder("a", log), FailsToEnd("b", log), Recorder("c", log)])
    assert [e for e in log if e[1] == "end_run"] == [("c", "end_run"), ("b", "end_run"), ("a", "end_run")]


def test_train_does_not_import_inspect():
    "Issue 7: imports point downward; train knows nothing of the Inspector, not even lazily."
    source = (ROOT / "minitrain_inspect" / "train.py").read_text()
    assert not re.search(r"(from|import)\s+(\.|minitrain_inspect\.)inspect\b", source)
    assert "import_module" not in source and "__import__" not in source
    code = ("import sys, minitrain_inspect.train as t; "
            "t.train(t.TrainConfig(steps=1, progress=False)); "
            "print('minitrain_inspect.inspect' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(TypeError):
        TrainConfig(inspect=True)


# -- BLAS threads ---------------------------------------------------------------------------------------

def test_blas_threads_validates_and_restores():
    before = blas_threads_now()
    with train_module.blas_threads(1) as n:
        assert n == 1 and blas_threads_now() == {1}
    assert blas_threads_now() == before
    for bad, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError)):
        with pytest.raises(error, match="blas_threads must"):
            with train_module.blas_threads(bad):
                pass
        with pytest.raises(error, match="blas_threads must"):
            TrainConfig(blas_threads=bad)


@pytest.mark.parametrize("configured", [1, 2])
def test_training_runs_under_its_own_blas_limit_and_gives_the_callers_back(configured):
    "Issue 7: the run sets its BLAS threads itself; between steps the caller's own setting is in force."
    during, between = [], []

    class Probe:
        def before_step(self, step, batch):
            during.append(blas_threads_now())

    caller = 3 - configured                    # the other setting
    with threadpool_limits(caller, user_api="blas"):
        for _ in training_steps(TrainConfig(steps=3, blas_threads=configured, progress=False), observers=[Probe()]):
            between.append(blas_threads_now())
    assert during == [{configured}] * 3
    assert between == [{caller}] * 3


def _sha_under(env_threads):
    code = ("from minitrain_inspect.train import TrainConfig, train; "
            "r = train(TrainConfig(steps=40, batch_size=256, progress=False)); print(r.params_sha256)")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(env_threads)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return out.stdout.strip()


def test_same_hash_whatever_the_environment_thread_setting():
    assert _sha_under(1) == _sha_under(2)




def test_train_runs_on_one_blas_thread_whatever_the_environment_says():
    outside, inside = threads_seen_inside("""
from minitrain_inspect.train import TrainConfig, build_run, train
class SpyRun:
    def begin_run(self, run):
        run.loss_fn.__class__ = SpyLoss          # the run's own loss object, now noting the threads
train(TrainConfig(steps=3, batch_size=8, hidden=(8,), eval_every=3, progress=False), observers=[SpyRun()])
""")
    assert outside != [1] and inside == [[1]] * 4, (outside, inside)     # 3 steps and the held-out loss


def test_held_out_loss_runs_in_eval_mode_and_restores_training_mode():
    modes = []

    class Watch:
        def begin_run(self, run):
            self.model, self.loss_fn = run.model, run.loss_fn
            run.loss_fn.register_forward_hook(lambda m, a, k, o: modes.append((self.model.training, m.training)))

        def before_step(self, step, batch):
            assert self.model.training and self.loss_fn.training

    train(TrainConfig(steps=4, eval_every=2, progress=False), observers=[Watch()])
    assert modes == [(True, True), (True, True), (False, False), (True, True), (True, True), (False, False)]


def test_default_run_learns():
    "The acceptance numbers of the default configuration (about 10 s here)."
    r = train(TrainConfig(progress=False))
    assert r.accuracy["regular_val"] >= 0.80, r.accuracy
    assert r.accuracy["irregular_train"] >= 0.90, r.accuracy
    assert r.history["loss"][-1] < 0.1


# --- issue 10: stopping a run cleanly at an observer's request ---------------------------------------------------

class _StopAfter:
    "Asks to stop in after_step(at): steps 0..at run, then the loop ends."

    def __init__(self, at, verdict="failing"):
        self.at, self.verdict, self.events = at, verdict, []

    def begin_run(self, run):
        self.control = run.control

    def after_step(self, step, loss):
        self.events.append(("after", step, math.isfinite(loss)))
        if step == self.at:
            self.control.request_stop([f"enough at {step}"], verdict=self.verdict)

    def end_run(self):
        self.events.append(("end",))


def test_stop_requested_in_after_step_ends_after_that_step():
    obs = _StopAfter(4)
    r = train(TrainConfig(steps=10, progress=False), observers=[obs])
    assert r.history["step"] == [0, 1, 2, 3, 4] and obs.events[-1] == ("end",)
    es = r.early_stop
    assert (es.stopped, es.step, es.reasons) == (True, 5, ["enough at 4"])
    assert es.compute_saved["steps"] == 5 and es.compute_saved["share"] == 0.5
    assert json.loads(json.dumps(es.to_dict(), allow_nan=False))["stopped"] is True


def test_a_stop_asked_after_the_last_step_saves_nothing_and_is_not_an_early_stop():
    r = train(TrainConfig(steps=3, progress=False), observers=[_StopAfter(2)])
    assert len(r.history["step"]) == 3
    assert (r.early_stop.stopped, r.early_stop.verdict) == (False, "failing")


def test_a_stop_before_the_first_step_has_no_step_time_to_estimate_seconds():
    class AtOnce:
        def begin_run(self, run):
            run.control.request_stop(["broken from the start"])
    r = train(TrainConfig(steps=10, progress=False), observers=[AtOnce()])
    es = r.early_stop
    assert (es.stopped, es.step, es.compute_saved["share"]) == (True, 0, 1.0)
    assert math.isnan(es.compute_saved["seconds"]) and es.to_dict()["compute_saved"]["seconds"] is None
    assert r.history["step"] == []


def test_early_stop_on_a_nan_loss_with_no_observer_at_all():
    config = TrainConfig(steps=50, optimizer="sgd", lr=1e6, momentum=0.9, progress=False, early_stop=True)
    with np.errstate(all="ignore"):
        r = train(config)
    es = r.early_stop
    assert es.stopped and es.verdict == "failing" and es.step == len(r.history["step"]) < 50, es
    assert es.reasons == [f"non-finite training loss (nan) at step {es.step}"], es.reasons


@pytest.mark.parametrize("kw, error, words", [
    ({"diagnose_every": 0}, ValueError, "diagnose_every must be at least 1"),
    ({"diagnose_every": 2.0}, TypeError, "diagnose_every must be an integer"),
    ({"early_stop": 1}, TypeError, "early_stop must be True or False"),
    ({"early_stop": None}, TypeError, "early_stop must be True or False"),
])
def test_bad_early_stop_settings(kw, error, words):
    with pytest.raises(error, match=words):
        TrainConfig(**kw)


def test_run_control_rejects_bad_verdicts_and_reasons():
    control = train_module.RunControl()
    with pytest.raises(ValueError, match="a verdict is one of"):
        control.request_stop(["x"], verdict="bad")
    with pytest.raises(TypeError, match="not a single string"):
        control.report("failing", "one string")
    assert not control.stop_requested
