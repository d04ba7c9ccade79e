"The Inspector: the lab's four tests, then hooks, statistics, panels and invariants."
import json
import math

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.inspect import EVERY_STEP, HookHandle, Inspector, welford_update
from minitrain_inspect.layers import Linear, ReLU
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


# -- on a training run --------------------------------------------------------------------------

def test_observing_changes_nothing():
    "Every module and parameter hooked, every panel every step: the same final parameters."
    plain = train(TrainConfig(steps=60, progress=False))
    watched = Inspector(schedules=EVERY_STEP)
    inspected = train(TrainConfig(steps=60, progress=False), observers=[watched])
    assert inspected.params_sha256 == plain.params_sha256
    assert watched.stats["mlp.act1"]["tensors"] == 60
    assert watched.stats["copy.weight"]["tensors"] == 60


def test_inspect_flag_records_every_panel():
    r = train(TrainConfig(steps=60, progress=False, inspect=True))
    panels = {k.split("/")[0] for k in r.inspector.history.keys()}
    assert panels == {"loss", "activations", "gradients", "act_grads", "updates", "spectral", "units", "per_class"}
    steps, regular = r.inspector.history.get("per_class/regular")
    assert len(steps) == 60 and np.isfinite(regular).all()


# -- regressions found in review ------------------------------------------------------------------

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


def test_budget_guard_does_not_mutate_callers_schedule():
    from minitrain_inspect.panels import Every
    shared = Every(1)
    inspector = Inspector(schedules={p: shared for p in EVERY_STEP}, budget=0.01, budget_window=5)
    train(TrainConfig(steps=40, progress=False), inspector=inspector)
    assert inspector.throttled and shared.n == 1
    inspector.reset()
    assert all(s.n == 1 for s in inspector.schedules.values())     # reset restores the schedules too


def test_reset_between_before_and_after_update_is_harmless(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    inspector.begin_step(0)
    inspector.before_update(0)
    inspector.reset()
    inspector.after_update(0)
    inspector.end_step(0, loss=1.0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(per_class_by="colour"), "per_class_by"),
    (dict(histogram_bins=0), "histogram_bins"),
    (dict(max_points=1), "max_points"),
    (dict(budget_window=0), "budget_window"),
])
def test_inspector_arguments_checked_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Inspector(**kwargs)


def test_nan_activations_do_not_look_healthy(small_net, batch):
    inspector = Inspector(small_net, schedules=EVERY_STEP).attach()
    small_net(np.full_like(batch, np.nan))
    _, frac = inspector.history.get("units/act/fraction")
    assert math.isnan(frac[0])
    assert math.isnan(inspector.stats["act"]["l2"])
