"""Issue 21 §4: a regression run (an MLP fitting sin/cos with mean squared error) inspected on a plain loop.

The Inspector's panels, its history, the dashboard and the run's bit-for-bit independence of the Inspector, on a loss
that is not cross-entropy and on targets that are not classes."""
import hashlib
import json

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.dashboard import render_dashboard, save_dashboard
from minitrain_inspect.inspect import Inspector, unlabelled_note
from minitrain_inspect.layers import Linear, ReLU
from minitrain_inspect.losses import MeanSquaredError, SoftmaxCrossEntropy
from minitrain_inspect.optim import SGD, Adam
from minitrain_inspect.panels import History

STEPS, BATCH, EVAL_EVERY = 150, 32, 25
EVERY_STEP = {"loss": 1, "per_class": 1}
REGRESSION_NOTE = "per-class loss: none for a regression (MeanSquaredError has no classes, and no verb labels were given)"


def smooth_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    "x uniform on [-pi, pi]; two smooth targets per example, sin(x) and cos(2x), float32."
    x = np.random.default_rng(seed).uniform(-np.pi, np.pi, (n, 1)).astype(np.float32)
    return x, np.concatenate([np.sin(x), np.cos(2 * x)], axis=1)


def mlp() -> Sequential:
    return Sequential(fc1=Linear(1, 32, rng=1), act1=ReLU(), fc2=Linear(32, 32, rng=2), act2=ReLU(),
                      fc3=Linear(32, 2, rng=3))


def run(inspect: bool, optimizer=Adam, lr=1e-2, steps=STEPS):
    """A plain training loop: minibatches, MSE, the optimiser's step, a held-out evaluation every EVAL_EVERY steps.
    Returns the model, the Inspector (or None), the training losses the loop saw and the held-out ones."""
    model, loss_fn = mlp(), MeanSquaredError()
    opt = optimizer(model.parameters(), lr=lr)
    inspector = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() if inspect else None
    (x, y), (x_val, y_val) = smooth_data(0, 256), smooth_data(1, 64)
    order = np.random.default_rng(5)
    train_losses, val_losses = [], []
    for step in range(steps):
        idx = order.integers(0, len(x), BATCH)
        opt.zero_grad()
        train_losses.append(loss_fn(model(x[idx]), y[idx]).loss)
        model.backprop(loss_fn.backward())
        opt.step()
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            model.eval()
            val_losses.append(loss_fn(model(x_val), y_val).loss)
            model.train()
    return model, inspector, train_losses, val_losses


def params_digest(model) -> str:
    return hashlib.sha256(b"".join(p.data.tobytes() for p in model.parameters())).hexdigest()


@pytest.fixture(scope="module")
def inspected():
    return run(inspect=True)


def test_the_regression_learns(inspected):
    "The task is learnable in 150 steps: otherwise the rest of this file inspects a run that does nothing."
    _, _, train_losses, val_losses = inspected
    assert np.mean(train_losses[:10]) > 0.3 and val_losses[-1] < 0.1 * np.mean(train_losses[:10]), (train_losses[:10], val_losses)


@pytest.mark.parametrize("optimizer,lr", [(Adam, 1e-2), (SGD, 0.05)])
def test_parameters_are_bit_identical_with_and_without_the_inspector(optimizer, lr):
    inspected_model, _, inspected_losses, _ = run(True, optimizer, lr, steps=60)
    plain_model, _, plain_losses, _ = run(False, optimizer, lr, steps=60)
    assert params_digest(inspected_model) == params_digest(plain_model)
    assert inspected_losses == plain_losses


def test_loss_panel_records_the_mse(inspected):
    _, inspector, train_losses, val_losses = inspected
    h = inspector.history
    steps, values = h.get("loss/train")
    assert steps.tolist() == list(range(STEPS))
    assert values.tolist() == train_losses                 # the loss the loop computed, step by step, exactly
    vsteps, vvalues = h.get("loss/val")
    assert vsteps.tolist() == list(range(EVAL_EVERY - 1, STEPS, EVAL_EVERY))   # after step s: recorded at step s
    assert vvalues.tolist() == val_losses
    assert h.meta["loss"] == {"name": "MeanSquaredError", "has_classes": False}


def test_per_class_panel_has_nothing_to_split_and_says_why(inspected):
    h = inspected[1].history
    assert not any(key.startswith("per_class/") for key in h.series)
    assert h.meta["notes"] == [REGRESSION_NOTE]
    assert "label_batch" not in h.meta["notes"][0]          # no advice that only fits verbs


def test_per_class_panel_still_splits_a_labelled_regression_batch():
    "label_batch(regular=mask) splits any per-example loss in two groups, regression or not."
    model, loss_fn = mlp(), MeanSquaredError()
    opt = SGD(model.parameters(), lr=0.01)
    x, y = smooth_data(3, 8)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as inspector:
        mask = x[:, 0] > 0
        inspector.label_batch(regular=mask)
        per_example = loss_fn(model(x), y).per_example_loss
        model.backprop(loss_fn.backward())
        opt.step()
    assert inspector.history.get("per_class/regular")[1][0] == pytest.approx(per_example[mask].mean(), rel=1e-6)
    assert inspector.history.get("per_class/irregular")[1][0] == pytest.approx(per_example[~mask].mean(), rel=1e-6)
    assert inspector.history.meta["notes"] == []


def test_model_panels_are_recorded(inspected):
    h = inspected[1].history
    for key in ("activations/fc3/mean", "act_grads/fc3/l2", "gradients/fc1.weight/l2", "updates/fc2.weight/ratio",
                "spectral/fc3.weight/sigma", "units/act1/dead"):
        steps, values = h.get(key)
        assert steps.size > 0 and np.isfinite(values).all(), key


def test_unlabelled_note():
    assert unlabelled_note({"name": "MeanSquaredError", "has_classes": False}) == REGRESSION_NOTE
    assert "label_batch" in unlabelled_note(None)
    assert unlabelled_note({"name": "SoftmaxCrossEntropy", "has_classes": True}) == unlabelled_note(None)


def test_a_failed_attach_forgets_the_loss():
    "Attach is all or nothing: the loss a failed attach described is not left in the history."
    model, other = mlp(), mlp()
    inspector = Inspector(model, loss_fn=MeanSquaredError(), optimizer=SGD(other.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="not the model's"):
        inspector.attach()
    assert "loss" not in inspector.history.meta


def test_a_classification_loss_is_described_too():
    inspector = Inspector(mlp(), loss_fn=SoftmaxCrossEntropy()).attach()
    assert inspector.history.meta["loss"] == {"name": "SoftmaxCrossEntropy", "has_classes": True}


def test_history_round_trip_keeps_the_loss(inspected, tmp_path):
    h = inspected[1].history
    path = h.save_jsonl(tmp_path / "run.jsonl")
    loaded = History.load_jsonl(path)
    assert loaded.meta["loss"] == h.meta["loss"] and loaded.get("loss/train")[1].tolist() == h.get("loss/train")[1].tolist()
    json.dumps(loaded.meta, allow_nan=False)


def test_dashboard_renders_and_saves(inspected, tmp_path):
    h = inspected[1].history
    fig = render_dashboard(h)
    texts = [" ".join(t.get_text().split()) for ax in fig.axes for t in ax.texts]      # a message wraps to its panel
    assert REGRESSION_NOTE in texts                         # panel 7 says why it is empty
    path = save_dashboard(h, tmp_path / "regression.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000


def _loss_axis(fig):
    return next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("1 ") or ax.get_title().startswith("1 "))


def test_dashboard_names_the_loss_it_plots(inspected):
    assert _loss_axis(render_dashboard(inspected[1].history)).get_ylabel() == "mean squared error (log)"


def test_diagnose_a_regression_run(inspected):
    from minitrain_inspect.diagnose import diagnose
    model, inspector, _, _ = inspected
    x_val, y_val = smooth_data(1, 64)
    report = diagnose(model, x_val, y_val, step=STEPS, history=inspector.history, loss_fn=MeanSquaredError())
    assert not report.fired, report
