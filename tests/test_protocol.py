"Issue 21 §1: the frozen baseline, its check, direct feedback alignment and the protocol's gallery rows."
import dataclasses
import json
import math
import types

import numpy as np
import pytest

from minitrain_inspect import protocol as pr
from minitrain_inspect.core import Sequential
from minitrain_inspect.data import iterate_batches
from minitrain_inspect.diagnose import Diagnoser, gallery_summary, probe
from minitrain_inspect.inspect import Inspector
from minitrain_inspect.layers import Dropout, Linear, ReLU, Tanh
from minitrain_inspect.optim import SGD
from minitrain_inspect.train import (PastTenseModel, TrainConfig, blas_threads, build_run, params_sha256, run_data,
                                     run_to_end, step_loss, step_update, train, training_steps)

SHORT = TrainConfig(steps=30, progress=False)


def test_frozen_equals_a_readout_only_sgd_with_momentum():
    "The step pre hook is the same as an optimiser over the readout only, for SGD with momentum too (tanh, float64)."
    cfg = dataclasses.replace(SHORT, optimizer="sgd", lr=0.1, momentum=0.9, activation="tanh", dtype="float64")
    frozen = pr.train_frozen(cfg)
    model, _, loss_fn = build_run(cfg)
    hidden = {id(p) for _, p in pr.hidden_parameters(model)}
    optimizer = SGD([p for p in model.parameters() if id(p) not in hidden], lr=cfg.lr, momentum=cfg.momentum)
    with blas_threads(1):
        for batch in iterate_batches(run_data(cfg).train, cfg.batch_size, cfg.steps, seed=cfg.seed):
            step_loss(model, loss_fn, batch)
            step_update(model, loss_fn, optimizer)
    assert params_sha256(model) == frozen.params_sha256


def test_frozen_hook_is_removed_and_the_optimizer_left_as_found():
    seen = {}

    class Spy:
        def begin_run(self, run):
            seen["optimizer"] = run.optimizer

    pr.train_frozen(SHORT, observers=[Spy()])
    assert seen["optimizer"]._step_pre_hooks == {}


def test_frozen_baseline_is_deterministic_and_json():
    a, b = pr.frozen_baseline(SHORT), pr.frozen_baseline(SHORT)
    assert a["accuracy"] == b["accuracy"] and set(a["accuracy"]) == set(train(SHORT).accuracy)
    json.dumps(a, allow_nan=False)


@pytest.mark.parametrize("head, base, margin, fired", [(0.9, 0.8, 0.02, False), (0.81, 0.8, 0.02, True),
                                                       (0.8, 0.8, 0.0, False), (0.0, 1.0, 0.02, True),
                                                       (1, 0, 0.5, False)])
def test_check_frozen_baseline(head, base, margin, fired):
    c = pr.check_frozen_baseline(np.float32(head), base, pr.BaselineThresholds(margin))
    assert c.fired is fired and c.threshold == margin
    assert math.isclose(c.value, float(np.float32(head)) - base)
    assert (c.detail != "") is fired


def test_check_frozen_baseline_nan_and_bad_input():
    assert not pr.check_frozen_baseline(0.5, math.nan).fired
    for bad in (math.inf, -0.01, 1.01, None, np.bool_(True)):
        with pytest.raises((TypeError, ValueError), match="headline_acc"):
            pr.check_frozen_baseline(bad, 0.5)
    with pytest.raises(TypeError, match="baseline_margin"):
        pr.check_frozen_baseline(0.5, 0.4, object())


def _tiny(dtype="float64"):
    return Sequential(Linear(5, 4, rng=1, dtype=dtype), ReLU(), Linear(4, 4, rng=2, dtype=dtype), Tanh(),
                      Dropout(0.0), Linear(4, 3, rng=3, dtype=dtype))


def test_dfa_hidden_gradients_by_hand_two_hidden_layers():
    rng = np.random.default_rng(1)
    net, x, e = _tiny(), rng.standard_normal((7, 5)), rng.standard_normal((7, 3))
    feedback = [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]
    net.zero_grad(); net(x); pr.dfa_backward(net, e, feedback)
    W1, b1, W2, b2 = (p.data for p in net.parameters()[:4])
    a1 = x @ W1 + b1
    h1 = np.maximum(a1, 0)
    h2 = np.tanh(h1 @ W2 + b2)
    d1, d2 = (e @ feedback[0]) * (a1 > 0), (e @ feedback[1]) * (1 - h2 ** 2)
    # float64 sums of at most 7 products of O(1) numbers, summed in possibly another order: within 1e-12 of the largest
    for got, want in ((net[0].weight.grad, x.T @ d1), (net[2].weight.grad, h1.T @ d2), (net[2].bias.grad, d2.sum(0))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_dfa_accumulates_like_backward():
    "Like every backward pass, DFA adds to .grad: two passes without zero_grad give twice one pass."
    rng = np.random.default_rng(2)
    net, x, e = _tiny(), rng.standard_normal((3, 5)), rng.standard_normal((3, 3))
    fb = pr.feedback_matrices(net)
    net.zero_grad(); net(x); pr.dfa_backward(net, e, fb)
    once = [p.grad.copy() for p in net.parameters()]
    net(x); pr.dfa_backward(net, e, fb)
    assert all(np.array_equal(p.grad, 2 * g) for p, g in zip(net.parameters(), once))


def test_feedback_matrices_ignore_the_global_rng():
    net = _tiny("float32")
    np.random.seed(1); a = pr.feedback_matrices(net, seed=5)
    np.random.seed(2); b = pr.feedback_matrices(net, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and a[0].dtype == np.float32
    with pytest.raises((TypeError, ValueError), match="seed"):
        pr.feedback_matrices(net, seed=-1)


def test_dfa_run_probe_measures_the_true_gradient():
    "The Diagnoser's probe in a DFA run sees backprop's gradients of the DFA-trained network, not DFA's."
    cfg = dataclasses.replace(SHORT, steps=10, diagnose_every=10, early_stop=True)
    diagnoser = Diagnoser()
    result = run_to_end(training_steps(cfg, observers=[pr.DirectFeedbackAlignment(), diagnoser]))
    last = diagnoser.reports[-1]
    assert last.step == 10
    floor = next(c for c in last.checks if c.name == "gradient_floor")
    assert floor.value == probe(result.model, diagnoser.inputs, diagnoser.targets).first_last[1]


def test_dfa_run_with_an_inspector_and_restored_after_an_error():
    result = run_to_end(training_steps(SHORT, observers=[pr.DirectFeedbackAlignment()], inspector=Inspector()))
    assert "backprop" not in vars(result.model) and result.inspector.history is not None
    seen = {}

    class Boom:
        def begin_run(self, run):
            seen["model"] = run.model

        def after_step(self, step, loss):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_to_end(training_steps(SHORT, observers=[pr.DirectFeedbackAlignment(), Boom()]))
    assert "backprop" not in vars(seen["model"])


def test_dfa_learns_but_differently():
    "DFA lowers the training loss (it is a learning rule) yet does not follow backprop's path."
    cfg = dataclasses.replace(SHORT, steps=150)
    dfa = run_to_end(training_steps(cfg, observers=[pr.DirectFeedbackAlignment()]))
    losses = dfa.history["loss"]
    assert np.median(losses[-20:]) < 0.8 * np.median(losses[:10])
    assert dfa.params_sha256 != train(cfg).params_sha256


def test_protocol_gallery_rows_are_gallery_rows():
    rows = pr.protocol_gallery(steps=60, every=30)
    json.dumps(rows, allow_nan=False)
    summary = gallery_summary(rows)
    assert summary["broken"] == 1 and summary["healthy"] == 2
    assert all(r["frozen_baseline_acc"] == rows[2]["final_accuracy"]["regular_val"] for r in rows)
    assert len(pr.protocol_table(rows).splitlines()) == 5


def test_run_protocol_entry_refuses_bad_input():
    with pytest.raises(ValueError, match="rule"):
        pr.run_protocol_entry("x", "feedback", False, steps=5, every=5)
    with pytest.raises(ValueError, match="every"):
        pr.run_protocol_entry("x", "bp", False, steps=5, every=0)
