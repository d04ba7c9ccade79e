"""Issue 21 §2 and §3: the warning verdict (overfitting) and the Diagnoser on a plain training loop."""
import hashlib

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.dashboard import NOT_DIAGNOSED, render_dashboard, verdict_lines
from minitrain_inspect.diagnose import Diagnoser, DiagnosticThresholds, check_overfitting, train
from minitrain_inspect.inspect import Inspector
from minitrain_inspect.layers import Linear, ReLU
from minitrain_inspect.losses import MeanSquaredError, SoftmaxCrossEntropy
from minitrain_inspect.optim import Adam
from minitrain_inspect.train import TrainConfig, evaluating


# --- §2: warnings ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [2, 3, 4])       # X and K were chosen on seeds 0 and 1
def test_the_default_run_warns_of_overfitting_and_never_fails(seed):
    result = train(TrainConfig(seed=seed, progress=False, diagnose_every=50))
    d = result.diagnoser
    assert d.verdict == "warning" and not d.failing, (d.verdict, d.reasons)
    assert d.reasons[0].startswith("overfitting"), d.reasons
    assert result.config.steps == len(result.history["step"]), "a warning never stops the run"


def test_a_run_built_to_overfit_is_warned_early():
    result = train(TrainConfig(steps=600, val_fraction=0.9, dropout=0.0, eval_every=50, progress=False,
                               diagnose_every=50, early_stop=True))
    d = result.diagnoser
    assert d.verdict == "warning" and d.warned[0].step <= 300, (d.verdict, [r.step for r in d.warned])
    assert not result.early_stop.stopped, "early stop acts on failing only"


def test_stop_on_warning_is_the_users_choice():
    d = Diagnoser(stop_on_warning=True)
    result = train(TrainConfig(steps=600, val_fraction=0.9, dropout=0.0, eval_every=50, progress=False,
                               diagnose_every=50, early_stop=True), observers=[d])
    assert result.early_stop.stopped and result.early_stop.verdict == "warning"


@pytest.mark.parametrize("seed", [5, 6])
def test_a_run_that_does_not_overfit_is_not_warned(seed):
    result = train(TrainConfig(steps=500, seed=seed, eval_every=50, progress=False, diagnose_every=50))
    assert result.diagnoser.verdict == "trustworthy", result.diagnoser.reasons


def test_the_rule_does_not_depend_on_the_scale_of_the_loss():
    th = DiagnosticThresholds()
    evals = [(250 * j, v) for j, v in enumerate([1.0, 0.9, 1.05, 1.1, 1.2], start=1)]
    falling = list(np.linspace(1.0, 0.1, 1500))
    for scale in (1e-6, 1.0, 1e6):
        assert check_overfitting([(a, v * scale) for a, v in evals], [x * scale for x in falling], th).fired


# --- §3: a plain loop ------------------------------------------------------------------------------------------------

def toy(seed=0, n=512):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 20)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


def plain_loop(lr=1e-2, diagnoser=None, inspector=False, steps=96, stop=True):
    model = Sequential(fc1=Linear(20, 32, rng=1), act1=ReLU(), out=Linear(32, 2, rng=2))
    loss_fn, (x, y), (xv, yv) = SoftmaxCrossEntropy(), toy(0), toy(1, 128)
    opt = Adam(model.parameters(), lr=lr)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn).attach() if inspector else None
    if diagnoser is not None:
        diagnoser.history = insp.history if insp else None
        diagnoser.attach(model, opt, loss_fn, xv[:64], yv[:64])
    ran = 0
    for step in range(steps):
        i = (step * 32) % 512
        opt.zero_grad()
        loss_fn(model(x[i:i + 32]), y[i:i + 32])
        model.backprop(loss_fn.backward())
        opt.step()
        ran += 1
        if step % 25 == 24:
            with evaluating(model, loss_fn):
                loss_fn(model(xv), yv)
        if stop and diagnoser is not None and diagnoser.should_stop:
            break
    if diagnoser is not None:
        diagnoser.detach()
    if insp:
        insp.remove_all()
    digest = hashlib.sha256(b"".join(p.data.tobytes() for p in model.parameters())).hexdigest()
    return digest, ran, insp


def test_a_plain_loop_with_the_diagnoser_ends_with_the_same_parameters():
    assert plain_loop()[0] == plain_loop(diagnoser=Diagnoser(every=10))[0]
    assert plain_loop(inspector=True)[0] == plain_loop(diagnoser=Diagnoser(every=10), inspector=True)[0]


def test_the_plain_loops_dashboard_shows_the_verdict():
    d = Diagnoser(every=10)
    _, ran, insp = plain_loop(diagnoser=d, inspector=True)
    assert d.verdict == "trustworthy" and [r.step for r in d.reports][:3] == [0, 10, 20]
    lines = verdict_lines(insp.history)
    assert lines[0].startswith("HEALTHY") and NOT_DIAGNOSED not in lines[0]
    assert insp.history.meta["diagnosis"]["verdict"] == "trustworthy"
    fig = render_dashboard(insp.history)
    assert any(t.get_text().startswith("HEALTHY") for t in fig.axes[0].texts)


def test_a_failing_plain_loop_stops_as_the_seed_does():
    d = Diagnoser(every=10)
    _, ran, _ = plain_loop(lr=50.0, diagnoser=d, steps=200)
    assert d.verdict == "failing" and d.should_stop and ran < 200, (d.verdict, ran)
    assert ran == d.failing[0].step + 1, "the loop breaks right after the step whose diagnosis failed"


def test_attach_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="every=N"):
        Diagnoser().attach(Sequential(fc=Linear(2, 2)), Adam([Linear(2, 2).weight], lr=1.0), SoftmaxCrossEntropy(),
                           np.zeros((1, 2), np.float32), np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="Optimizer"):
        Diagnoser(every=5).attach(Sequential(fc=Linear(2, 2)), "adam", SoftmaxCrossEntropy(),
                                  np.zeros((1, 2), np.float32), np.zeros(1, np.int64))


def test_a_regression_on_a_plain_loop_is_diagnosed_end_to_end():
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (256, 1)).astype(np.float32)
    y = np.concatenate([np.sin(x), np.cos(2 * x)], axis=1)
    model = Sequential(fc1=Linear(1, 32, rng=1), act1=ReLU(), fc2=Linear(32, 2, rng=2))
    loss_fn, opt = MeanSquaredError(), Adam(model.parameters(), lr=1e-2)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn).attach() as insp:
        with Diagnoser(every=20, history=insp.history).attach(model, opt, loss_fn, x[:64], y[:64]) as d:
            for step in range(120):
                i = (step * 32) % 256
                opt.zero_grad()
                loss_fn(model(x[i:i + 32]), y[i:i + 32])
                model.backprop(loss_fn.backward())
                opt.step()
    assert d.verdict == "trustworthy", d.reasons
    assert verdict_lines(insp.history)[0].startswith("HEALTHY")
    render_dashboard(insp.history)


def test_the_probe_leaves_dropout_rng_grads_and_modes_as_it_found_them():
    "A plain loop with dropout: the Diagnoser's probe draws nothing from dropout's generator and restores every .grad."
    from minitrain_inspect.layers import Dropout

    def loop(diagnoser):
        model = Sequential(fc1=Linear(20, 32, rng=1), act1=ReLU(), drop=Dropout(0.3, rng=7), out=Linear(32, 2, rng=2))
        loss_fn, (x, y) = SoftmaxCrossEntropy(), toy(0)
        opt = Adam(model.parameters(), lr=1e-2)
        grads = hashlib.sha256()
        if diagnoser is not None:
            diagnoser.attach(model, opt, loss_fn, x[:64], y[:64])     # its pre-step hook runs the probe first
        def seen(optimizer, args, kwargs):
            for p in model.parameters():
                grads.update(p.grad.tobytes())
        opt.register_step_pre_hook(seen)
        for step in range(30):
            opt.zero_grad()
            loss_fn(model(x[step:step + 32]), y[step:step + 32])
            model.backprop(loss_fn.backward())
            opt.step()
        modes = [m.training for _, m in model.named_modules()] + [loss_fn.training]
        state = model["drop"].rng.bit_generator.state
        params = hashlib.sha256(b"".join(p.data.tobytes() for p in model.parameters())).hexdigest()
        return params, grads.hexdigest(), modes, state

    plain, watched = loop(None), loop(Diagnoser(every=5))
    assert plain == watched
