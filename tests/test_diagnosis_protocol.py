"""Issue 21 §2 and §3: the warning verdict (overfitting) and the Diagnoser on a plain training loop."""
import copy
import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.dashboard import NOT_DIAGNOSED, render_dashboard, verdict_lines
from minitrain_inspect.diagnose import Diagnoser, DiagnosticThresholds, check_overfitting, diagnose, prober_for, train
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


# --- Issue 25: the same diagnosis on a PyTorch model and a plain PyTorch loop ----------------------------------------
try:
    import torch
    from torch import nn
    torch.set_num_threads(1)    # 2 shared cores: more threads only contend (conventions: one thread at this size)
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def torch_toy(seed=0, n=256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def torch_model(seed=0):
    "BatchNorm (running statistics, a batch count) and Dropout (the global generator): what a careless probe would move."
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 16),
                         nn.Tanh(), nn.Linear(16, 2))


def torch_state(model):
    return ([t.clone() for t in model.state_dict().values()], torch.get_rng_state(), [m.training for m in model.modules()],
            [None if p.grad is None else p.grad.clone() for p in model.parameters()])


def same_state(a, b):
    tensors = lambda s: [*s[0], s[1], *[g for g in s[3] if g is not None]]
    return all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b))) and a[2] == b[2] and \
        [g is None for g in a[3]] == [g is None for g in b[3]]


def torch_loop(lr=1e-2, diagnoser=None, inspector=False, steps=60, opt_name="adam", stop=True):
    model, (x, y), (xv, yv) = torch_model(), torch_toy(0), torch_toy(1, 64)
    loss_fn = nn.CrossEntropyLoss()
    opt = (torch.optim.Adam(model.parameters(), lr=lr) if opt_name == "adam" else
           torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn).attach() if inspector else None
    if diagnoser is not None:
        diagnoser.history = insp.history if insp else None
        diagnoser.attach(model, opt, loss_fn, xv, yv)
    ran = 0
    for step in range(steps):
        i = (step * 32) % 256
        opt.zero_grad()
        loss_fn(model(x[i:i + 32]), y[i:i + 32]).backward()
        opt.step()
        ran += 1
        if step % 25 == 24:
            model.eval()
            with torch.no_grad():
                loss_fn(model(xv), yv)           # a held-out evaluation, heard by the Diagnoser
            model.train()
        if stop and diagnoser is not None and diagnoser.should_stop:
            break
    if diagnoser is not None:
        diagnoser.detach()
    if insp:
        insp.remove_all()
    return torch_state(model), ran, insp


@needs_torch
def test_the_torch_probe_leaves_the_model_as_it_found_it():
    model, (x, y) = torch_model(), torch_toy(1, 64)
    nn.CrossEntropyLoss()(model(x), y).backward()        # the gradients of a training step, to be left alone
    model[3].eval()                                       # modes differ between modules: each one's is put back
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn).attach()
    before = torch_state(model)
    report = diagnose(model, x, y, loss_fn=loss_fn)
    assert report.verdict == "trustworthy", report.reasons
    assert same_state(before, torch_state(model)), "parameters, buffers, generator, modes or gradients changed"
    insp.flush()
    assert insp._fired == {} and insp.history.get("loss/val")[0].size == 0, "the Inspector heard the probe"
    insp.remove_all()


@needs_torch
def test_the_torch_probe_measures_what_an_independent_pass_gives():
    model, (x, y) = torch_model(), torch_toy(1, 64)
    pr = prober_for(model).probe(model, x, y)
    twin = copy.deepcopy(model).double().eval()
    outputs = {}
    for name in ("2", "5"):
        twin[int(name)].register_forward_hook(lambda m, a, o, name=name: outputs.__setitem__(name, o))
    loss = nn.CrossEntropyLoss()(twin(x.double()), y)
    loss.backward()
    # float64 twin against float32 probe, both summed in float64: the float32 forward's rounding (2^-24 per operation,
    # a few dozen operations deep) bounds the difference, far below 1e-4 relative.
    assert [n for n, _ in pr.hidden] == ["input", "2", "5"]
    for name, rms in pr.hidden[1:]:
        assert rms == pytest.approx(float(outputs[name].detach().norm() / math.sqrt(64)), rel=1e-4)
    for name, p in twin.named_parameters():
        assert pr.grad_norms[name] == pytest.approx(float(p.grad.norm()), rel=1e-4, abs=1e-9)
    assert pr.first_last == (pr.grad_norms["0.weight"], pr.grad_norms["6.weight"])
    assert pr.loss == pytest.approx(float(loss.detach()), rel=1e-5) and pr.nonfinite == 0
    assert [(n, k) for n, k, _ in pr.stuck] == [("2", "relu"), ("5", "tanh")]


@needs_torch
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("inspector", [False, True])
def test_torch_training_is_bit_identical_with_and_without_the_diagnosis(opt_name, inspector):
    plain = torch_loop(opt_name=opt_name, inspector=inspector)[0]
    d = Diagnoser(every=5)
    watched = torch_loop(opt_name=opt_name, inspector=inspector, diagnoser=d)[0]
    assert len(d.reports) == 12, "diagnosed at steps 0, 5, ..., 55"
    assert same_state(plain, watched), "the diagnosis changed the training (parameters, BatchNorm buffers or generator)"


@needs_torch
def test_a_healthy_torch_run_is_trustworthy_and_writes_its_verdict():
    d = Diagnoser(every=10)
    _, ran, insp = torch_loop(diagnoser=d, inspector=True)
    assert d.verdict == "trustworthy" and ran == 60, d.reasons
    assert [r.step for r in d.reports] == [0, 10, 20, 30, 40, 50]
    assert len(d.losses) == 60 and all(math.isfinite(v) for v in d.losses), "every step's loss read, at the end too"
    assert [at for at, _ in d.held_out] == [25, 50], "the two held-out evaluations, at their positions"
    assert insp.history.meta["diagnosis"]["verdict"] == "trustworthy"
    assert verdict_lines(insp.history)[0].startswith("HEALTHY")


@needs_torch
def test_a_failing_torch_run_stops_early():
    d = Diagnoser(every=10)
    _, ran, _ = torch_loop(lr=50.0, diagnoser=d, steps=200)
    assert d.verdict == "failing" and d.should_stop and ran < 200, (d.verdict, ran)
    assert ran == d.failing[0].step + 1, "the loop breaks right after the step whose diagnosis failed"


@needs_torch
def test_dead_relus_fail_at_the_first_diagnosis():
    model, (x, y) = torch_model(), torch_toy(1, 64)
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
        model[1].bias.fill_(-10.0)           # after BatchNorm: every ReLU input below zero
    report = diagnose(model, x, y)
    assert report.verdict == "failing" and {"dead_units", "vanishing_gradient"} <= {c.name for c in report.fired}, \
        report.reasons


@needs_torch
def test_a_nan_loss_on_a_torch_loop_is_seen_at_the_next_diagnosis():
    model, (x, y) = torch_model(), torch_toy(0)
    loss_fn, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.01)
    with Diagnoser(every=5).attach(model, opt, loss_fn, x[:32], y[:32]) as d:
        for step in range(20):
            opt.zero_grad()
            xb = x[:32].clone()
            if step == 7:
                xb[0, 0] = math.nan
            loss_fn(model(xb), y[:32]).backward()
            opt.step()
            if d.should_stop:
                break
    assert d.failing[0].step == 10 and step == 10, "seen at the diagnosis of step 10; the loop breaks after that step"
    assert "non_finite" in [c.name for c in d.failing[0].fired]


@needs_torch
def test_a_torch_loop_adds_no_host_sync_between_diagnoses():
    from test_torch_inspect import HostCalls, ScalarReads

    def counted(diagnoser):
        model, (x, y) = torch_model(), torch_toy(0)
        loss_fn, opt = nn.CrossEntropyLoss(reduction="none"), torch.optim.SGD(model.parameters(), lr=0.01)
        if diagnoser is not None:
            diagnoser.attach(model, opt, loss_fn, x[:32], y[:32])

        def step(i):
            opt.zero_grad()
            loss_fn(model(x[i:i + 32]), y[i:i + 32]).mean().backward()
            opt.step()
        step(0)                                   # step 0: diagnosed
        with HostCalls() as calls, ScalarReads() as reads:
            for i in range(1, 10):                # steps 1 to 9: no diagnosis due
                step(i)
        return calls.count, reads.count

    assert counted(Diagnoser(every=10)) == counted(None)


@needs_torch
def test_torch_attach_and_probe_refuse_what_they_cannot_use():
    model, (x, y) = torch_model(), torch_toy(0, 8)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        Diagnoser(every=5).attach(model, Adam([Linear(2, 2).weight], lr=1.0), nn.CrossEntropyLoss(), x, y)
    with pytest.raises(ValueError, match="as many targets as inputs"):
        diagnose(model, x, y[:3])
    with pytest.raises(ValueError, match="weight matrix"):
        diagnose(nn.Sequential(nn.ReLU()), x, y)


def test_the_diagnosis_imports_and_works_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np\n"
            "from minitrain_inspect.diagnose import diagnose, prober_for, MINITRAIN_PROBER\n"
            "from minitrain_inspect.train import PastTenseModel\n"
            "from minitrain_inspect.data import make_dataset\n"
            "m, d = PastTenseModel(seed=0), make_dataset(0.2, seed=0)\n"
            "assert prober_for(m) is MINITRAIN_PROBER and prober_for('x') is MINITRAIN_PROBER\n"
            "print(diagnose(m, d.val.inputs[:16], d.val.targets[:16]).verdict)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "trustworthy", out.stderr[-2000:]


@needs_torch
@pytest.mark.parametrize("kind", ["mlp", "cnn", "residual", "frozen", "transformer"])
def test_the_torch_probe_on_every_model_of_the_issue(kind):
    "The models of 14a_torch's tests: in-place ReLU after BatchNorm, a module called twice, frozen layers, attention."
    from test_torch_inspect import MODELS, batches
    torch.manual_seed(0)
    model = MODELS[kind]()
    (x, y), = batches(1, size=16)
    before = torch_state(model)
    report = diagnose(model, x, y)
    assert same_state(before, torch_state(model))
    assert report.verdict != "failing", report.reasons
    pr = prober_for(model).probe(model, x, y)
    assert pr.nonfinite == 0 and all(math.isfinite(g) for g in pr.grad_norms.values())
    learning = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(pr.grad_norms) == learning, "every parameter that learns, and only those"
    if kind == "residual":
        assert [n for n, _ in pr.hidden] == ["input", "act", "act (call 2)", "act (call 3)"]


@needs_torch
@pytest.mark.parametrize("lr, verdict", [(1e-2, "trustworthy"), (1e-7, "warning")])
def test_the_update_ratio_is_read_from_the_torch_inspectors_history(lr, verdict):
    "Ratios recorded every step by the PyTorch Inspector, flushed every 10: a learning rate of 1e-7 moves weights ~1e-6 of their size."
    model, (x, y) = torch_model(), torch_toy(0)
    loss_fn, opt = nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=lr)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules={"updates": 1}).attach() as insp:
        with Diagnoser(every=20, history=insp.history).attach(model, opt, loss_fn, x[:64], y[:64]) as d:
            for step in range(41):
                i = (step * 32) % 256
                opt.zero_grad()
                loss_fn(model(x[i:i + 32]), y[i:i + 32]).backward()
                opt.step()
    ratio = next(c for c in d.reports[-1].checks if c.name == "update_ratio")
    assert [r.step for r in d.reports] == [0, 20, 40] and math.isfinite(ratio.value), ratio
    assert d.verdict == verdict and ratio.fired == (verdict == "warning"), (d.verdict, d.reasons)


# --- the reviewer's defects of the torch probe (each test failed before its fix) ---------------------------------

def small_torch(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def small_batch(n=16):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.arange(n) % 4


@needs_torch
def test_the_torch_probe_keeps_forward_pre_hooks_running_so_a_pruned_weight_is_current():
    import torch.nn.utils.prune as prune
    model, (x, y) = small_torch(), small_batch()
    prune.l1_unstructured(model[0], "weight", 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    pr = prober_for(model).probe(model, x, y)
    loss = nn.functional.cross_entropy(model(x), y)          # model in train mode: no dropout or BatchNorm here
    true = float(torch.autograd.grad(loss, [model[0].weight_orig])[0].double().norm())
    # float32 gradients of the same graph; the norm is read in float64 of the same float32 values: equal to rounding
    assert pr.grad_norms["0.weight_orig"] == pytest.approx(true, rel=1e-6)


@needs_torch
def test_the_torch_probe_fires_no_tensor_hook_of_a_parameter():
    model, (x, y) = small_torch(), small_batch()
    fired = []
    for p in model.parameters():
        p.register_hook(lambda g: fired.append(1))
    prober_for(model).probe(model, x, y)
    assert fired == []


@needs_torch
def test_the_torch_probe_handles_tied_weights():
    model, (x, y) = small_torch(), small_batch()
    model[2] = nn.Linear(4, 4)
    model[0] = nn.Linear(4, 4)
    model[2].weight = model[0].weight
    pr = prober_for(model).probe(model, x, y)
    assert "0.weight" in pr.grad_norms and "2.weight" not in pr.grad_norms
    assert pr.first_last[0] == pr.first_last[1] == pr.grad_norms["0.weight"]


@needs_torch
def test_freezing_a_layer_after_attach_does_not_break_the_step():
    model, (x, y) = small_torch(), small_batch(32)
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()
    with Diagnoser(every=1).attach(model, opt, loss_fn, x, y) as d:
        for step in range(3):
            if step == 1:
                model[0].requires_grad_(False)
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    assert len(d.reports) == 3, "a diagnosis at each step, none raised from opt.step()"


@needs_torch
def test_a_training_loop_in_eval_mode_is_heard_as_training_and_a_no_grad_loss_as_held_out():
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.arange(64) % 2
    model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()
    model.eval()                                         # frozen BatchNorm fine-tuning: training in eval mode
    with Diagnoser(every=5).attach(model, opt, loss_fn, x[:32], y[:32]) as d:
        for step in range(20):
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            if step == 9:
                with torch.no_grad():
                    loss_fn(model(x[32:]), y[32:])       # a held-out evaluation
            if d.should_stop:
                break
    assert step == 19 and len(d.losses) == 20 and all(math.isfinite(v) for v in d.losses)
    assert [at for at, _ in d.held_out] == [10]
    assert "non_finite" not in " ".join(d.reasons)


@needs_torch
def test_a_step_with_no_loss_heard_is_not_a_non_finite_loss():
    model, (x, y) = small_torch(), small_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Diagnoser(every=2).attach(model, opt, nn.CrossEntropyLoss(), x, y) as d:
        for _ in range(4):                               # the loss is computed by a function, not the attached module
            opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    assert "non_finite" not in " ".join(d.reasons) and d.verdict != "failing"


@needs_torch
def test_the_torch_batch_takes_the_models_dtype_and_device():
    model = small_torch()
    xs, ys = np.random.default_rng(0).standard_normal((16, 4)), np.arange(16) % 4     # NumPy's float64 default
    d = diagnose(model, xs, ys)
    assert math.isfinite(d.eval_loss)
    inputs, targets = prober_for(model).check_batch(xs, ys, model)
    assert inputs.dtype == torch.float32 and inputs.device == model[0].weight.device and targets.dtype == torch.int64


@needs_torch
def test_the_ddp_inspectors_local_gradient_norm_is_the_same_with_the_diagnoser():
    from minitrain_inspect.ddp import DDPInspector
    x, y = small_batch()

    def norms(with_diagnoser):
        model = small_torch()
        opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()
        with DDPInspector(model, optimizer=opt, loss_fn=loss_fn, flush_every=1, schedules={"gradients": 1}).attach() as ins:
            d = Diagnoser(every=1).attach(model, opt, ins.loss_fn, x, y) if with_diagnoser else None
            for _ in range(4):
                opt.zero_grad(); ins.loss_fn(model(x), y).backward(); opt.step()
            if d:
                d.detach()
        return ins.history.get("ranks/grad_norm/rank0")[1].tolist()
    assert norms(True) == norms(False), "bit-identical: the probe's backward reaches no tensor hook of a parameter"


@needs_torch
def test_the_torch_probe_puts_back_a_pruned_modules_weight_attribute():
    import torch.nn.utils.prune as prune
    model, (x, y) = small_torch(), small_batch()
    prune.l1_unstructured(model[0], "weight", 0.5)
    before = model[0].weight
    prober_for(model).probe(model, x, y)
    assert model[0].weight is before, "the pre-hook's weight from the probe's graph is not left on the module"
