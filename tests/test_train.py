"The training loop: reproducibility, configuration errors, learning, observers."
import math

import numpy as np
import pytest

from minitrain_inspect.train import TrainConfig, train


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


def test_observers_are_called_in_order():
    events = []

    class Spy:
        def begin_run(self, model): events.append("run")
        def begin_step(self, step): events.append(("begin", step))
        def before_update(self, step): events.append(("before", step))
        def after_update(self, step): events.append(("after", step))
        def end_step(self, step, loss, per_example_loss, batch):
            assert per_example_loss.shape == (len(batch.lemmas),)
            events.append(("end", step))
        def record_val_loss(self, step, val_loss): events.append(("val", step))

    train(TrainConfig(steps=2, eval_every=2, progress=False), observers=[Spy()])
    assert events == ["run", ("begin", 0), ("before", 0), ("after", 0), ("end", 0),
                      ("begin", 1), ("before", 1), ("after", 1), ("end", 1), ("val", 1)]


def test_default_run_learns():
    "The acceptance numbers of the default configuration (about 10 s here)."
    r = train(TrainConfig(progress=False))
    assert r.accuracy["regular_val"] >= 0.80, r.accuracy
    assert r.accuracy["irregular_train"] >= 0.90, r.accuracy
    assert r.history["loss"][-1] < 0.1
