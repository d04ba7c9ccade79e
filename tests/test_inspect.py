"The Inspector: the lab's four tests, then hooks, statistics, panels and invariants."
import json
import math

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.inspect import EVERY_STEP, PANELS, BudgetGuard, HookHandle, Inspector, Panel, welford_update
from minitrain_inspect.layers import Dropout, Linear, ReLU, Tanh
from minitrain_inspect.losses import SoftmaxCrossEntropy
from minitrain_inspect.optim import SGD, Adam
from minitrain_inspect.per_class_loss import partition_batch_loss
from minitrain_inspect.train import TrainConfig, train


# -- the lab's four tests ----------------------------------------------------------------

def test_welford_matches_numpy():
    x = np.random.default_rng(0).standard_normal(1000) * 2.5 - 4
    state = {}
    for chunk in np.array_split(x, 13):
        welford_update(state, chunk)
    assert abs(state["mean"] - np.mean(x)) <= 1e-10
    assert abs(state["m2"] / (state["n"] - 1) - np.var(x, ddof=1)) <= 1e-10


def test_hook_handle_removes_cleanly(small_net, batch):
    inspector = Inspector(small_net, small_net.parameters())
    handle = inspector.register_forward("fc1", small_net["fc1"])
    assert isinstance(handle, HookHandle) and handle in inspector.handles
    small_net(batch)
    assert inspector.stats["fc1"]["n"] == 5 * 8
    frozen = dict(inspector.stats["fc1"])
    handle.remove()
    small_net(batch)
    assert inspector.stats["fc1"] == frozen


def test_snapshot_serializable(small_net, batch):
    inspector = Inspector(small_net, small_net.parameters())
    for name in ("fc1", "act", "fc2"):
        inspector.register_forward(name, small_net[name])
    small_net(batch)
    snap = inspector.snapshot()
    text = json.dumps(snap, allow_nan=False)
    assert set(json.loads(text)) == {"fc1", "act", "fc2"}
    for summary in snap.values():
        for value in summary.values():
            assert value is None or type(value) in (int, float, str)


def test_partition_batch_loss():
    losses = np.array([0.5, 2.0, 1.5, 4.0])
    labels = ["talk", "see", "watch", "write"]
    assert partition_batch_loss(losses, labels) == (pytest.approx(1.0), pytest.approx(3.0))
    regular, irregular = partition_batch_loss(np.array([0.5, 1.5]), ["talk", "watch"])
    assert regular == pytest.approx(1.0) and math.isnan(irregular)


# -- hooks ----------------------------------------------------------------------------------

def test_attach_covers_every_leaf_and_parameter(small_net):
    inspector = Inspector(small_net).attach()
    names = set(inspector.stats)
    assert {"fc1", "act", "fc2", "fc1:grad_output", "act:grad_output", "fc2:grad_output"} <= names
    assert {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"} <= names
    assert len(inspector.handles) == 3 + 3 + 4


def test_gradient_statistics_match_the_gradients(small_net, batch):
    inspector = Inspector(small_net).attach()
    small_net.zero_grad()
    out = small_net(batch)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    small_net.backprop(g)
    grad = small_net["fc1"].weight.grad.astype(np.float64)
    s = inspector.snapshot()["fc1.weight"]
    assert s["mean"] == pytest.approx(grad.mean()) and s["l2"] == pytest.approx(np.linalg.norm(grad))
    assert inspector.snapshot()["fc2:grad_output"]["l2"] == pytest.approx(np.linalg.norm(g.astype(np.float64)))


def test_remove_all_twice_and_context_manager(small_net, batch):
    with Inspector(small_net).attach() as inspector:
        small_net(batch)
    inspector.remove_all()
    hooks = sum(len(m._forward_hooks) + len(m._backward_hooks) for _, m in small_net.named_modules())
    hooks += sum(len(p._backward_hooks) for p in small_net.parameters())
    assert hooks == 0


def test_hook_that_raises_leaves_others_removable(small_net, batch):
    inspector = Inspector(small_net).attach()
    boom = small_net["act"].register_forward_hook(lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        small_net(batch)
    boom.remove()
    inspector.remove_all()
    assert not small_net["act"]._forward_hooks
    small_net(batch)


def test_two_inspectors_are_independent(small_net, batch):
    a = Inspector(small_net).attach()
    b = Inspector(small_net).attach()
    small_net(batch)
    b.remove_all()
    small_net(batch)
    assert a.stats["fc1"]["tensors"] == 2 and b.stats["fc1"]["tensors"] == 1
    a.reset()
    assert a.stats["fc1"]["n"] == 0 and b.stats["fc1"]["n"] == 40


def test_disabled_inspector_records_nothing(small_net, batch):
    inspector = Inspector(small_net, enabled=False).attach()
    small_net(batch)
    assert inspector.stats["fc1"]["n"] == 0
    inspector.enabled = True
    small_net(batch)
    assert inspector.stats["fc1"]["n"] == 40


def test_module_called_twice_counts_both_outputs(batch):
    lin = Linear(4, 4, rng=0)
    net = Sequential(lin, ReLU(), lin)
    inspector = Inspector(net).attach()
    net(batch)
    assert inspector.stats["0"]["tensors"] == 2 and inspector.stats["0"]["n"] == 2 * 5 * 4


def test_snapshot_is_a_copy_and_nan_becomes_null(small_net, batch):
    inspector = Inspector(small_net).attach()
    small_net(np.full_like(batch, np.nan))
    inspector.flush()
    snap = inspector.snapshot()
    assert snap["fc1"]["nonfinite"] == 40 and snap["fc1"]["mean"] is None
    json.dumps(snap, allow_nan=False)
    small_net(batch)
    assert snap["fc1"]["n"] == 0


def test_bad_arguments(small_net):
    with pytest.raises(TypeError, match="must be a Module"):
        Inspector("model")
    with pytest.raises(ValueError, match="unknown panel"):
        Inspector(small_net, schedules={"fireworks": 3})
    with pytest.raises(ValueError, match="budget"):
        Inspector(small_net, budget=-1)
    with pytest.raises(ValueError, match="needs a model"):
        Inspector().attach()


# -- any training loop: steps from the optimiser, loss from the loss module ----------------------

def _plain_loop(inspector_kwargs=None, steps=12, seed=0, optimizer="adam", labels=False):
    "A loop a user would write: no step calls. Returns (net, inspector or None)."
    rng = np.random.default_rng(seed)
    net = Sequential(fc1=Linear(6, 16, rng=0), act=ReLU(), drop=Dropout(0.25, rng=1), fc2=Linear(16, 4, rng=2))
    loss_fn = SoftmaxCrossEntropy()
    opt = Adam(net.parameters(), lr=1e-2) if optimizer == "adam" else SGD(net.parameters(), lr=0.1, momentum=0.9)
    inspector = None
    if inspector_kwargs is not None:
        inspector = Inspector(net, optimizer=opt, loss_fn=loss_fn, **inspector_kwargs).attach()
    for _ in range(steps):
        x = rng.standard_normal((8, 6)).astype(np.float32)
        y = rng.integers(0, 4, 8)
        if inspector is not None and labels:
            inspector.label_batch(["walk", "go", "talk", "see", "play", "eat", "want", "be"])
        net.zero_grad()
        loss_fn(net(x), y)
        net.backprop(loss_fn.backward())
        opt.step()
    if inspector is not None:
        inspector.remove_all()
    return net, inspector


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_plain_loop_records_every_panel_at_steps_0_to_n(optimizer):
    _, inspector = _plain_loop({"schedules": EVERY_STEP}, steps=12, optimizer=optimizer, labels=True)
    h = inspector.history
    for key in ("loss/train", "activations/fc1/mean", "activations/drop/std", "act_grads/fc2/l2",
                "act_grads/drop/l2", "gradients/fc1.weight/l2", "updates/fc2.bias/ratio",
                "spectral/fc1.weight/sigma", "units/act/dead", "units/act/zero_share", "units/act/histogram",
                "per_class/regular", "per_class/irregular"):
        steps, _ = h.get(key)
        assert steps.tolist() == list(range(12)), (key, steps.tolist())
    assert inspector.step == 12


def test_plain_loop_default_schedules_record_at_the_schedule_steps():
    _, inspector = _plain_loop({}, steps=30)
    assert inspector.history.get("loss/train")[0].tolist() == list(range(30))
    assert inspector.history.get("activations/fc1/mean")[0].tolist() == [0, 10, 20]
    assert inspector.history.get("updates/fc1.weight/ratio")[0].tolist() == [0, 10, 20]
    assert inspector.history.get("spectral/fc1.weight/sigma")[0].tolist() == [0, 25]


def test_plain_loop_is_not_changed_by_watching():
    plain, _ = _plain_loop(None, steps=15)
    watched, _ = _plain_loop({"schedules": EVERY_STEP}, steps=15, labels=True)
    for p, q in zip(plain.parameters(), watched.parameters()):
        assert p.data.tobytes() == q.data.tobytes()


def test_plain_loop_without_labels_says_so():
    _, inspector = _plain_loop({"schedules": EVERY_STEP}, steps=3)
    assert inspector.history.get("per_class/regular")[0].size == 0
    assert any("no verb labels" in note for note in inspector.history.meta["notes"])


def test_update_ratio_is_measured_across_the_optimiser_step():
    net = Sequential(fc=Linear(3, 2, rng=0))
    opt = SGD(net.parameters(), lr=0.3)
    inspector = Inspector(net, optimizer=opt, schedules=EVERY_STEP).attach()
    ratios = []
    for _ in range(3):
        w0 = net["fc"].weight.data.copy()
        net.zero_grad()
        net.backprop(net(np.ones((2, 3), np.float32)))
        opt.step()
        ratios.append(np.linalg.norm(net["fc"].weight.data - w0) / np.linalg.norm(w0))
    steps, values = inspector.history.get("updates/fc.weight/ratio")
    assert steps.tolist() == [0, 1, 2]
    np.testing.assert_allclose(values, ratios, rtol=1e-6)


def test_without_optimizer_backprop_ends_the_step(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    for _ in range(3):
        small_net.zero_grad()
        small_net.backprop(small_net(batch))
    assert inspector.step == 3
    assert inspector.history.get("gradients/fc1.weight/l2")[0].tolist() == [0, 1, 2]
    assert inspector.history.get("activations/fc2/mean")[0].tolist() == [0, 1, 2]


def test_eval_mode_forwards_are_not_training_steps(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    small_net.eval()
    small_net(batch)
    small_net.train()
    assert inspector.stats["fc1"]["tensors"] == 0


def test_eval_loss_is_recorded_as_held_out_loss():
    rng = np.random.default_rng(0)
    net = Sequential(fc=Linear(3, 2, rng=0))
    loss_fn, opt = SoftmaxCrossEntropy(), SGD(net.parameters(), lr=0.1)
    inspector = Inspector(net, optimizer=opt, loss_fn=loss_fn).attach()
    x, y = rng.standard_normal((4, 3)).astype(np.float32), np.array([0, 1, 0, 1])
    for _ in range(2):
        net.zero_grad(); loss_fn(net(x), y); net.backprop(loss_fn.backward()); opt.step()
    net.eval()
    val = loss_fn(net(x), y).loss
    net.train()
    steps, values = inspector.history.get("loss/val")
    assert steps.tolist() == [1] and values[0] == pytest.approx(val)
    assert inspector.history.get("loss/train")[0].tolist() == [0, 1]


def test_label_batch_checks_its_input():
    _, inspector = _plain_loop({}, steps=1)
    with pytest.raises(ValueError, match="exactly one"):
        inspector.label_batch()
    with pytest.raises(ValueError, match="boolean mask"):
        inspector.label_batch(regular=np.array([1, 0]))
    with pytest.raises(TypeError, match="single string"):
        inspector.label_batch("walk")


def test_wrong_number_of_labels_is_an_error():
    net = Sequential(fc=Linear(3, 2, rng=0))
    loss_fn = SoftmaxCrossEntropy()
    inspector = Inspector(net, loss_fn=loss_fn).attach()
    inspector.label_batch(["walk"])
    with pytest.raises(ValueError, match="1 labels but the loss has 4"):
        loss_fn(net(np.ones((4, 3), np.float32)), np.zeros(4, dtype=int))


def test_unknown_verb_label_is_an_error():
    net = Sequential(fc=Linear(3, 2, rng=0))
    loss_fn = SoftmaxCrossEntropy()
    inspector = Inspector(net, loss_fn=loss_fn).attach()
    with pytest.raises(ValueError, match="flibbertigibbet"):       # refused when given, not inside the loss
        inspector.label_batch(["walk", "flibbertigibbet"])
    with pytest.raises(TypeError, match="must be strings"):
        inspector.label_batch(list(range(2)))
    loss_fn(net(np.ones((2, 3), np.float32)), np.zeros(2, dtype=int))


# -- one name, one statistic -----------------------------------------------------------------------

def test_a_removed_name_cannot_change_kind(small_net, batch):
    inspector = Inspector(small_net)
    handle = inspector.register_forward("x", small_net["fc1"])
    small_net(batch)
    handle.remove()
    with pytest.raises(ValueError, match="holds activation statistics"):
        inspector.register_backward("x", small_net["fc1"].weight)
    assert inspector.kinds["x"] == "activation" and inspector.stats["x"]["n"] == 40


@pytest.mark.parametrize("name", ["a/b", "", "/", "fc1/"])
def test_names_with_a_slash_or_empty_are_refused(small_net, name):
    inspector = Inspector(small_net)
    with pytest.raises(ValueError, match="no '/'"):
        inspector.register_forward(name, small_net["fc1"])
    assert not inspector.handles and name not in inspector.stats


def test_attach_is_all_or_nothing():
    model = Sequential(**{"good": Linear(2, 2, rng=0), "bad/name": ReLU()})
    inspector = Inspector(model)
    with pytest.raises(ValueError, match="no '/'"):
        inspector.attach()
    assert inspector.handles == [] and inspector.stats == {} and inspector.kinds == {}
    assert inspector.history.meta["layers"] == []
    assert sum(len(m._forward_hooks) + len(m._backward_hooks) for _, m in model.named_modules()) == 0
    assert sum(len(p._backward_hooks) for p in model.parameters()) == 0


def test_attach_failing_on_a_taken_name_leaves_the_first_registration(small_net):
    inspector = Inspector(small_net)
    inspector.register_backward("fc2", small_net["fc1"].weight)      # "fc2" is now a gradient's name
    with pytest.raises(ValueError, match="'fc2' is already registered"):
        inspector.attach()
    assert len(inspector.handles) == 1 and inspector.params == list(small_net.named_parameters())


def test_attach_interrupted_leaves_nothing_behind(small_net, monkeypatch):
    inspector = Inspector(small_net)
    calls = []
    real = Inspector.register_grad_output

    def interrupted(self, name, module):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, name, module)

    monkeypatch.setattr(Inspector, "register_grad_output", interrupted)
    with pytest.raises(KeyboardInterrupt):
        inspector.attach()
    assert inspector.handles == [] and inspector.stats == {}


# -- overflow, dead units, histogram range -------------------------------------------------------

def test_exploding_activations_show_as_huge_numbers_not_gaps():
    net = Sequential(fc=Linear(2, 2, rng=0), act=ReLU())
    inspector = Inspector(net, schedules=EVERY_STEP).attach()
    net["fc"].weight.data[...] = np.float32(3e18)
    net(np.array([[1e19, 1e19], [-1e19, -1e19], [1e19, 0], [0, 0]], np.float32))   # outputs up to 6e37: squares overflow
    inspector.flush()                                    # the panels record at the end of a step, or when asked
    for field in ("mean", "std", "absmax"):
        value = inspector.history.get(f"activations/fc/{field}")[1][0]
        assert math.isfinite(value) and value > 1e36, (field, value)
    snap = inspector.snapshot()["fc"]
    assert snap["l2"] is not None and snap["std"] is not None
    json.dumps(inspector.snapshot(), allow_nan=False)


def test_nonfinite_values_are_counted(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    x = batch.copy()
    x[0, 0] = np.nan
    small_net(x)
    inspector.flush()
    assert inspector.history.get("activations/fc1/nonfinite")[1][0] == 8     # one NaN input row spreads to 8 outputs


def test_dead_units_are_units_off_for_every_example():
    net = Sequential(fc=Linear(2, 4, rng=0), act=ReLU())
    net["fc"].weight.data[...] = np.array([[1, -1, 1, 0], [1, -1, -1, 0]], np.float32)
    net["fc"].bias.data[...] = 0
    inspector = Inspector(net, schedules=EVERY_STEP).attach()
    net(np.array([[1, 0], [0, 1]], np.float32))
    inspector.flush()
    # units: 0 -> (1, 1) alive; 1 -> (-1, -1) dead; 2 -> (1, -1) alive; 3 -> (0, 0) dead
    assert inspector.history.get("units/act/dead")[1][0] == pytest.approx(0.5)
    assert inspector.history.get("units/act/zero_share")[1][0] == pytest.approx(5 / 8)


def test_tanh_units_record_saturation(batch):
    net = Sequential(fc=Linear(4, 3, rng=0), act=Tanh())
    inspector = Inspector(net, schedules=EVERY_STEP).attach()
    net(batch * 100)
    inspector.flush()
    assert 0 <= inspector.history.get("units/act/saturated")[1][0] <= 1
    assert inspector.history.get("units/act/saturated_share")[1][0] > 0.5
    assert inspector.history.meta["histogram"]["act"]["kind"] == "tanh"


def test_histogram_reports_values_outside_its_range():
    net = Sequential(fc=Linear(1, 4, rng=0), act=ReLU())
    net["fc"].weight.data[...] = np.array([[1, 2, 10, 100]], np.float32)
    net["fc"].bias.data[...] = 0
    inspector = Inspector(net, schedules=EVERY_STEP).attach()
    net(np.ones((1, 1), np.float32))                     # outputs 1, 2, 10, 100: two above the range [0, 4]
    inspector.flush()
    assert inspector.history.get("units/act/above")[1][0] == pytest.approx(0.5)
    hist = inspector.history.series["units/act/histogram"].values[0]
    assert sum(hist) == pytest.approx(0.5) and hist[-1] == 0


# -- the budget guard cannot run away ---------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


def _simulate(budget, schedule=1, steps=400, window=20, max_stride=400):
    clock = FakeClock()
    costs = {"loss": 2e-5, "per_class": 2e-5, "activations": 2e-3, "gradients": 3e-3, "updates": 2e-3,
             "spectral": 1e-3, "units": 1e-3}
    panels = {}
    for name in PANELS:
        panels[name] = Panel(1 if name in ("loss", "per_class") else schedule, clock)
        panels[name].name, panels[name].reducible = name, name not in ("loss", "per_class")
    guard = BudgetGuard(budget, window, clock, max_stride=max_stride)
    spent = []
    for step in range(steps):
        cost = 0.0
        for name, panel in panels.items():
            if panel.open(step):
                clock.advance(costs[name]); panel.cost += costs[name]; cost += costs[name]
        clock.advance(0.010)
        spent.append(cost / 0.010)
        guard.end_step(step, panels)
    return guard, panels, spent


@pytest.mark.parametrize("budget", [0.30, 0.05, 0.01, 1e-6])
@pytest.mark.parametrize("schedule", [1, "log"])
def test_budget_guard_is_bounded_and_meets_what_it_can(budget, schedule):
    guard, panels, spent = _simulate(budget, schedule)
    assert all(1 <= p.stride <= 400 for p in panels.values())
    assert len(guard.throttled) <= 5 * 400 // 20
    for event in guard.throttled:
        assert set(event) == {"step", "panel", "from", "to", "overhead"}
    settled = float(np.mean(spent[200:]))
    fixed = 4e-5 / 0.010
    if budget > 2 * fixed:
        assert settled <= budget, (budget, settled)
    else:
        assert any("cannot be met" in note for note in guard.notes), guard.notes


def test_budget_guard_relaxes_with_headroom():
    clock = FakeClock()
    panel = Panel(1, clock)
    panel.name, panel.stride = "gradients", 16
    guard = BudgetGuard(0.30, window=4, clock=clock, max_stride=1000)
    for step in range(100):
        if panel.open(step):
            clock.advance(1e-6); panel.cost += 1e-6
        clock.advance(0.01)
        guard.end_step(step, {"gradients": panel})
    assert panel.stride == 1
    assert [e["panel"] for e in guard.throttled] == ["gradients"] * 4


def test_budget_on_a_real_run_stays_bounded():
    "Budget 0.05 on a real run: every adjustment logged, intervals capped at the run's length, nothing runs away."
    inspector = Inspector(schedules=EVERY_STEP, budget=0.05, budget_window=5)
    train(TrainConfig(steps=60, progress=False), inspector=inspector)
    assert inspector.throttled
    assert all(p.stride <= 60 for p in inspector.panels)
    assert len(inspector.throttled) <= 5 * 60 // 5
    assert inspector.history.meta["throttled"] is inspector.throttled


# -- on a training run ---------------------------------------------------------------------------

def test_observing_changes_nothing():
    "Every module and parameter hooked, every panel every step: the same final parameters."
    plain = train(TrainConfig(steps=60, progress=False))
    watched = Inspector(schedules=EVERY_STEP)
    inspected = train(TrainConfig(steps=60, progress=False), observers=[watched])
    assert inspected.params_sha256 == plain.params_sha256
    assert watched.stats["mlp.act1"]["tensors"] == 60
    assert watched.stats["copy.weight"]["tensors"] == 60


def test_train_records_every_panel_at_every_step():
    r = train(TrainConfig(steps=40, progress=False), inspector=Inspector(schedules=EVERY_STEP))
    h = r.inspector.history
    panels = {k.split("/")[0] for k in h.keys()}
    assert panels == {"loss", "activations", "gradients", "act_grads", "updates", "spectral", "units", "per_class"}
    for key in ("loss/train", "per_class/regular", "activations/mlp.act1/mean", "updates/copy.weight/ratio",
                "spectral/mlp.output.weight/sigma", "units/mlp.act2/dead"):
        assert h.get(key)[0].tolist() == list(range(40)), key
    assert np.isfinite(h.get("per_class/regular")[1]).all()
    assert h.get("loss/val")[0].tolist() == [39]
    assert h.meta["config"]["steps"] == 40


def test_an_inspector_reused_for_a_second_run_starts_afresh_and_detaches():
    inspector = Inspector()
    first = train(TrainConfig(steps=12, progress=False), observers=[inspector])
    assert not inspector.handles                                   # end_run took the hooks off
    assert sum(len(m._forward_hooks) for _, m in first.model.named_modules()) == 0
    second = train(TrainConfig(steps=7, progress=False), observers=[inspector])
    assert inspector.model is second.model
    steps, _ = inspector.history.get("loss/train")
    assert list(steps) == list(range(7))                           # no mixing of the two runs
    assert inspector.stats["mlp.act1"]["tensors"] == 1             # step 0 of the second run only


def test_attached_to_another_model_is_an_error(small_net):
    inspector = Inspector(small_net).attach()
    with pytest.raises(ValueError, match="attached to another model"):
        train(TrainConfig(steps=2, progress=False), observers=[inspector])


def test_schedules_given_by_the_caller_are_not_changed():
    from minitrain_inspect.panels import Every
    shared = Every(1)
    inspector = Inspector(schedules={p: shared for p in EVERY_STEP}, budget=0.01, budget_window=5)
    train(TrainConfig(steps=40, progress=False), inspector=inspector)
    assert inspector.throttled and shared.n == 1
    inspector.reset()
    assert all(p.stride == 1 for p in inspector.panels)


@pytest.mark.parametrize("kwargs,message", [
    (dict(per_class_by="colour"), "per_class_by"),
    (dict(histogram_bins=0), "histogram_bins"),
    (dict(max_points=1), "max_points"),
    (dict(budget_window=0), "budget_window"),
    (dict(budget=float("nan")), "budget"),
    (dict(budget=True), "budget"),
    (dict(clock=3), "clock"),
    (dict(optimizer="adam"), "Optimizer"),
    (dict(loss_fn=len), "loss_fn"),
])
def test_inspector_arguments_checked_at_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Inspector(**kwargs)


def test_nan_activations_do_not_look_healthy(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    small_net(np.full_like(batch, np.nan))
    inspector.flush()
    _, dead = inspector.history.get("units/act/dead")
    _, zero = inspector.history.get("units/act/zero_share")
    assert math.isnan(dead[0]) and math.isnan(zero[0])
    assert math.isnan(inspector.stats["act"]["l2"])


class TickingClock(FakeClock):
    "Every reading costs `tick` seconds: a deterministic stand-in for time spent measuring."

    def __init__(self, tick):
        super().__init__()
        self.tick = tick

    def __call__(self):
        self.t += self.tick
        return self.t


@pytest.mark.parametrize("budget", [0.30, 0.05, 0.01, 1e-6])
@pytest.mark.parametrize("schedules", [EVERY_STEP, {**{p: "log" for p in PANELS}, "loss": 1}])
def test_budget_guard_with_an_injected_clock_on_a_plain_loop(budget, schedules):
    """Deterministic: the loop's training advances the clock 10 ms a step, each clock reading 0.5 ms (so each
    measurement costs 0.5 ms: every panel at every step costs about 75% of a step)."""
    clock = TickingClock(5e-4)
    net = Sequential(fc1=Linear(3, 8, rng=0), act=ReLU(), fc2=Linear(8, 2, rng=1))
    loss_fn, opt = SoftmaxCrossEntropy(), SGD(net.parameters(), lr=0.01)
    inspector = Inspector(net, optimizer=opt, loss_fn=loss_fn, schedules=schedules, budget=budget,
                          budget_window=10, clock=clock).attach()
    x, y = np.ones((4, 3), np.float32), np.array([0, 1, 0, 1])
    for _ in range(300):
        net.zero_grad(); loss_fn(net(x), y); net.backprop(loss_fn.backward()); opt.step()
        clock.advance(0.010)
    again = [dict(e) for e in inspector.throttled]
    assert all(1 <= p.stride <= inspector.max_stride for p in inspector.panels)
    assert len(inspector.throttled) <= 5 * 300 // 10
    if budget >= 0.05 and schedules is EVERY_STEP:
        assert inspector.throttled, "an every-step Inspector costing more than the budget must be thinned"
    if budget == 1e-6:
        assert any("cannot be met" in n for n in inspector.history.meta["notes"])
    assert inspector.history.get("loss/train")[0].tolist() == list(range(300))   # the loss is never thinned
    assert again == inspector.throttled


# -- regressions from an adversarial review ---------------------------------------------------------

def _mlp(seed=0):
    return Sequential(fc1=Linear(8, 16, rng=seed), act=ReLU(), fc2=Linear(16, 3, rng=seed + 1))


X8 = np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32)
Y8 = np.arange(16) % 3


def test_gradient_accumulation_measures_each_steps_final_gradient_once():
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m.parameters(), lr=0.1)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules=EVERY_STEP).attach()
    m.zero_grad()
    losses = []
    for part in np.array_split(np.arange(16), 4):        # four micro-batches, one optimiser step
        losses.append(lf(m(X8[part]), Y8[part]).loss)
        m.backprop(lf.backward())
    grad = m["fc1"].weight.grad.astype(np.float64)
    opt.step()
    snap = inspector.snapshot()["fc1.weight"]
    assert snap["tensors"] == 1 and snap["n"] == grad.size
    assert snap["l2"] == pytest.approx(np.linalg.norm(grad), rel=1e-6)
    assert inspector.history.get("loss/train")[1].tolist() == pytest.approx([np.mean(losses)])


def test_a_second_loss_call_in_a_labelled_step_is_not_called_unlabelled():
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m.parameters(), lr=0.1)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules=EVERY_STEP).attach()
    inspector.label_batch(["walk", "go"] * 8)
    logits = m(X8)
    lf(logits, Y8)
    g = lf.backward()
    lf(logits[:2], Y8[:2])                                 # a logging call after the real one
    m.backprop(g)
    opt.step()
    assert inspector.history.meta["notes"] == []


def test_a_diverging_loss_with_labels_is_recorded_not_raised():
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m.parameters(), lr=0.1)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules=EVERY_STEP).attach()
    inspector.label_batch(regular=Y8 == 0)
    x = X8.copy()
    x[0, 0] = np.nan
    out = lf(m(x), Y8)                                     # the Inspector must not raise inside the user's loss call
    inspector.flush()
    assert math.isnan(out.loss)
    steps, values = inspector.history.get("per_class/regular")
    assert steps.tolist() == [0] and math.isnan(values[0])


def test_a_loss_module_inside_the_model_is_not_measured_as_an_activation():
    from minitrain_inspect.core import Module

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.fc, self.loss_fn = Linear(8, 3, rng=0), SoftmaxCrossEntropy()

        def forward(self, x):
            return self.fc(x)

    net = Net()
    with Inspector(net, schedules=EVERY_STEP).attach() as inspector:
        net.loss_fn(net(X8), Y8)
    assert inspector.stats["loss_fn"]["n"] == 0
    assert any("loss_fn" in note and "not an array" in note for note in inspector.history.meta["notes"])


def test_parameters_outside_the_optimizer_get_no_false_update_ratio():
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m["fc2"].parameters(), lr=0.1)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules=EVERY_STEP).attach()
    for _ in range(2):
        m.zero_grad(); lf(m(X8), Y8); m.backprop(lf.backward()); opt.step()
    assert inspector.history.get("updates/fc1.weight/ratio")[0].size == 0
    assert inspector.history.get("updates/fc2.weight/ratio")[0].tolist() == [0, 1]
    assert any("fc1.weight" in note for note in inspector.history.meta["notes"])


def test_attaching_to_another_model_starts_afresh():
    m1, m2 = _mlp(0), _mlp(5)
    inspector = Inspector(m1, schedules=EVERY_STEP).attach()
    m1(X8 * 100)
    inspector.remove_all()
    inspector.attach(m2)
    m2(X8)
    assert inspector.snapshot()["fc1"]["n"] == 16 * 16
    assert inspector.snapshot()["fc1"]["mean"] == pytest.approx(float(m2["fc1"](X8).astype(np.float64).mean()))


def test_an_optimizer_of_another_model_is_refused():
    m1, m2 = _mlp(0), _mlp(5)
    inspector = Inspector(m1, optimizer=SGD(m1.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="not the model's"):
        inspector.attach(m2)
    assert inspector.handles == []


def test_a_subset_of_parameters_is_kept_or_refused():
    m = _mlp()
    inspector = Inspector(m, [("mine", m["fc1"].weight)]).attach()
    assert [n for n, _ in inspector.params] == ["mine"]
    with pytest.raises(ValueError, match="not parameters of the model"):
        train(TrainConfig(steps=2, progress=False), inspector=Inspector(params=[("mine", m["fc1"].weight)]))


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(histogram_bins=10**8), ValueError, "histogram_bins"),
    (dict(schedules="every 1"), TypeError, "schedules must be a dict"),
    (dict(schedules=[("loss", 1)]), TypeError, "schedules must be a dict"),
    (dict(enabled="no"), TypeError, "enabled"),
    (dict(enabled=None), TypeError, "enabled"),
    (dict(exact=1), TypeError, "exact"),
])
def test_more_bad_constructor_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        Inspector(**kwargs)


def test_no_optimizer_and_no_parameters_says_so():
    net = Sequential(act=ReLU())
    inspector = Inspector(net).attach()
    assert any("no parameters" in note for note in inspector.history.meta["notes"])
    net2 = _mlp()
    inspector = Inspector(net2).attach()
    assert any("no optimizer" in note for note in inspector.history.meta["notes"])


def test_guard_with_log_schedules_and_an_impossible_budget_does_not_oscillate():
    clock = TickingClock(1.0)
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m.parameters(), lr=0.01)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules={p: "log" for p in PANELS}, budget=1e-6,
                          clock=clock).attach()
    for _ in range(4000):
        m.zero_grad(); lf(m(X8), Y8); m.backprop(lf.backward()); opt.step()
        clock.advance(100.0)
    assert len(inspector.throttled) <= 5 * 20, len(inspector.throttled)    # bounded, not growing with the run
    assert len(inspector.history.meta["notes"]) <= 4
    assert all(p.stride <= 4000 for p in inspector.panels)


def test_plain_loop_strides_never_exceed_the_steps_so_far():
    clock = TickingClock(5e-4)
    m, lf = _mlp(), SoftmaxCrossEntropy()
    opt = SGD(m.parameters(), lr=0.01)
    inspector = Inspector(m, optimizer=opt, loss_fn=lf, schedules=EVERY_STEP, budget=1e-6, budget_window=10,
                          clock=clock).attach()
    for step in range(60):
        m.zero_grad(); lf(m(X8), Y8); m.backprop(lf.backward()); opt.step()
        clock.advance(0.01)
        assert all(p.stride <= max(step + 1, 10) for p in inspector.panels)


def test_fast_and_exact_inspectors_agree():
    results = {}
    for exact in (False, True):
        inspector = Inspector(schedules=EVERY_STEP, exact=exact)
        train(TrainConfig(steps=30, progress=False), inspector=inspector)
        results[exact] = inspector.snapshot()
    for name, fast in results[False].items():
        exact = results[True][name]
        for field in ("n", "min", "max"):
            assert fast[field] == exact[field] or fast[field] == pytest.approx(exact[field], rel=1e-12), (name, field)
        # The fast mean (BLAS float32 row sums) is within 4e-6 of the data's root mean square, not of the mean.
        rms = math.sqrt((exact["var"] or 0.0) * (exact["n"] - 1) / exact["n"] + exact["mean"] ** 2)
        assert abs(fast["mean"] - exact["mean"]) <= 4e-6 * rms, (name, fast["mean"], exact["mean"], rms)
        for field in ("var", "l2"):
            if exact[field]:
                assert fast[field] == pytest.approx(exact[field], rel=5e-6), (name, field)


def test_a_second_optimizer_is_refused_not_double_counted():
    m = _mlp()
    p = m.parameters()
    opt1, opt2 = SGD(p[:2], lr=0.1), SGD(p[2:], lr=0.1)
    inspector = Inspector(m, optimizer=opt1).attach()
    with pytest.raises(ValueError, match="already watches an optimizer"):
        inspector.register_optimizer(opt2)


# -- a panel of the user's own, end to end (issue 19 §4) ----------------------------------------------------------------

class GradientToWeight(Panel):
    "A user's panel: ‖∂L/∂w‖ / ‖w‖ of every parameter, from the gradient read before the step and the weights."

    name, title, ylabel, log = "grad_to_weight", "Gradient-to-weight ratio", "‖g‖ / ‖w‖", True

    def reset(self):
        super().reset()
        self._grads = {}

    def on_grad(self, name, param, grad):
        self._grads[name] = self.ops.norm(grad)

    def on_step_end(self, params):
        for name, p in params:
            if name in self._grads:
                self.record(f"grad_to_weight/{name}/ratio", self._grads.pop(name) / self.ops.norm(p.data))


def test_a_users_panel_records_is_thinned_saved_and_drawn(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from minitrain_inspect.dashboard import render_dashboard
    from minitrain_inspect.panels import History
    config = TrainConfig(steps=40, progress=False, eval_every=40)
    mine = GradientToWeight(4)
    result = train(config, inspector=Inspector(schedules={"gradients": 4}, panels=[mine]))
    history = result.inspector.history
    steps, ratios = history.get("grad_to_weight/mlp.hidden1.weight/ratio")
    assert steps.tolist() == list(range(0, 40, 4)) and np.all(ratios > 0), (steps, ratios)
    assert result.inspector.cost["grad_to_weight"] > 0                 # timed like the built-in panels
    assert train(config).params_sha256 == result.params_sha256         # watching changed nothing
    again = History.load_jsonl(history.save_jsonl(tmp_path / "h.jsonl"))
    fig = render_dashboard(again)
    FigureCanvasAgg(fig).draw()
    axes = [ax for ax in fig.axes if ax.get_title(loc="left") == "Gradient-to-weight ratio"]
    assert len(axes) == 1 and axes[0].get_yscale() == "log"
    drawn = {line.get_gid() for line in axes[0].lines}
    assert "grad_to_weight/mlp.hidden1.weight/ratio" in drawn, drawn


def test_a_users_panel_is_thinned_by_the_guard_like_the_others():
    clock = FakeClock()
    mine = GradientToWeight(1)
    guard = BudgetGuard(0.05, window=5, clock=clock, max_stride=64)
    panels = {"grad_to_weight": mine}
    for step in range(40):
        if mine.open(step):
            clock.advance(5e-3); mine.cost += 5e-3          # half of a 10 ms step: far over a 5% budget
        clock.advance(0.01)
        guard.end_step(step, panels)
    assert mine.stride > 1 and guard.throttled[0]["panel"] == "grad_to_weight", guard.throttled


def test_a_strict_snapshot_tells_nan_from_inf_and_reads_back(small_net, batch):
    "Issue 24 §3: snapshot(strict=True) keeps NaN and +-inf told apart in strict JSON, as the history does."
    from minitrain_inspect.panels import from_strict_json
    inspector = Inspector(small_net).attach()
    small_net(np.full_like(batch, np.nan))
    inspector.flush()
    strict = inspector.snapshot(strict=True)
    text = json.dumps(strict, allow_nan=False)
    assert strict["fc1"]["mean"] == {"$float": "NaN"}
    back = from_strict_json(json.loads(text))
    assert math.isnan(back["fc1"]["mean"]) and back["fc1"]["nonfinite"] == 40


def test_a_point_the_history_refuses_does_not_jam_the_inspector():
    "One refused point raises once, at its step; later steps record, and remove_all still takes every hook off."
    from minitrain_inspect.core import Sequential
    from minitrain_inspect.layers import Linear
    from minitrain_inspect.losses import MeanSquaredError
    from minitrain_inspect.optim import SGD
    from minitrain_inspect.inspect import Inspector, Panel

    class Flaky(Panel):
        name, title = "flaky", "Flaky"

        def on_step_end(self, params):
            self.record("flaky/x/value", [1.0, 2.0] if self.step == 1 else 1.0)   # a row where a number was

    class Failing(Panel):
        name = "failing"

        def detach(self):
            raise OSError("the panel's folder is gone")

    model, loss = Sequential(fc=Linear(3, 2, rng=0)), MeanSquaredError()
    opt = SGD(model.parameters(), lr=0.1)
    inspector = Inspector(model, optimizer=opt, loss_fn=loss, panels=[Flaky(), Failing()]).attach()
    outcomes = []
    for _ in range(4):
        model.zero_grad()
        loss(model(np.ones((4, 3), np.float32)), np.zeros((4, 2), np.float32))
        model.backprop(loss.backward())
        try:
            opt.step()
            outcomes.append("ok")
        except ValueError as exc:
            assert "flaky/x/value" in str(exc)
            outcomes.append("refused")
    assert outcomes == ["ok", "refused", "ok", "ok"] and inspector.step == 4
    assert inspector.history.get("loss/train")[0].tolist() == [0, 1, 2, 3]
    assert inspector.history.get("flaky/x/value")[0].tolist() == [0, 2, 3]
    with pytest.raises(OSError, match="folder is gone"):
        inspector.remove_all()
    assert not inspector.handles and not model["fc"]._forward_hooks and not opt._step_pre_hooks and not opt._step_post_hooks


def test_an_ops_without_the_array_interface_is_refused_at_once():
    with pytest.raises(TypeError, match=r"ops must give the panels' array interface.*lacks \['moments'"):
        Inspector(ops=object())


def test_fast_inspector_takes_the_users_update_panel_as_inspector_does():
    from minitrain_inspect.inspect import UpdatePanel
    from minitrain_inspect.speed import fast_inspector

    class Mine(UpdatePanel):
        pass
    assert type(fast_inspector(panels=[Mine(1)]).panel("updates")) is Mine
    assert type(Inspector(panels=[Mine(1)]).panel("updates")) is Mine


def test_a_numpy_number_is_a_budget_and_a_numpy_bool_is_not():
    assert Inspector(budget=np.float32(0.25)).guard.budget == 0.25
    assert Inspector(budget=np.int64(1)).guard.budget == 1.0
    with pytest.raises(ValueError, match="positive fraction"):
        Inspector(budget=np.True_)


def test_a_users_panel_cannot_write_over_another_panels_series():
    "A panel's points under another panel's prefix (here the loss panel's) are refused, naming both; its own are kept."
    class Rogue(Panel):
        name, title = "rogue", "Rogue"

        def on_step_end(self, params):
            self.record("loss/train", 999.0)
            self.record("act_grads/fc/l2", 999.0)     # the gradient panel's second prefix
            self.record("rogue/x", 1.0)
    model = Sequential(fc=Linear(4, 3, rng=0), act=ReLU())
    opt, loss_fn = SGD(model.parameters(), lr=0.1), SoftmaxCrossEntropy()
    inspector = Inspector(model, optimizer=opt, loss_fn=loss_fn, panels=[Rogue()]).attach()
    x, y = np.ones((2, 4), np.float32), np.array([0, 1])
    for _ in range(2):
        model.zero_grad()
        loss_fn(model(x), y)
        model.backprop(loss_fn.backward())
        with pytest.raises(ValueError, match="panel 'rogue' may not record 'loss/train': the series loss/... belong to the panel 'loss'"):
            opt.step()
    assert 999.0 not in inspector.history.get("loss/train")[1] and 999.0 not in inspector.history.get("act_grads/fc/l2")[1]
    assert inspector.history.get("rogue/x")[1].tolist() == [1.0, 1.0] and inspector.step == 2
