"Hook points of the core and the optimisers: order, removal, snapshots of the registry, saved values, errors."
import numpy as np
import pytest

from minitrain_inspect import optim
from minitrain_inspect.core import HookHandle, Module, Parameter, Sequential
from minitrain_inspect.layers import Dropout, Linear, ReLU


def test_forward_hook_receives_args_kwargs_output(small_net, batch):
    seen = []
    small_net["fc1"].register_forward_hook(lambda m, a, k, o: seen.append((m, a[0], k, o)))
    out = small_net(batch)
    (m, arg, kwargs, output), = seen
    assert m is small_net["fc1"] and arg is batch and kwargs == {} and output.shape == (5, 8)
    assert out.shape == (5, 3)


def test_module_called_twice_fires_twice():
    lin = Linear(3, 3, rng=0)
    net = Sequential(lin, ReLU(), lin)
    calls = []
    lin.register_forward_hook(lambda *a: calls.append(1))
    net(np.ones((2, 3), np.float32))
    assert len(calls) == 2


def test_backward_hook_order_and_param_hooks_fire_once(small_net, batch):
    order = []
    for name, m in small_net.named_modules():
        m.register_backward_hook(lambda m, g, name=name: order.append(("module", name, g.shape)))
    for name, p in small_net.named_parameters():
        p.register_hook(lambda p, g, name=name: order.append(("param", name, g.shape)))
    small_net(batch)
    small_net.backprop(np.ones((5, 3), np.float32))
    modules = [o[1] for o in order if o[0] == "module"]
    params = [o[1] for o in order if o[0] == "param"]
    assert modules == ["", "fc2", "act", "fc1"]
    assert params == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert order.index(("param", "fc1.weight", (4, 8))) > order.index(("module", "fc1", (5, 8)))


def test_remove_is_idempotent_and_context_manager(small_net, batch):
    calls = []
    with small_net["act"].register_forward_hook(lambda *a: calls.append(1)) as h:
        small_net(batch)
    h.remove()
    h.remove()
    small_net(batch)
    assert calls == [1] and not h.active


def test_removal_during_a_call_takes_effect_next_call(small_net, batch):
    log = []
    handles = {}

    def remover(*a):
        log.append("remover")
        handles["victim"].remove()
        handles["remover"].remove()

    handles["remover"] = small_net["fc1"].register_forward_hook(remover)
    handles["victim"] = small_net["fc1"].register_forward_hook(lambda *a: log.append("victim"))
    small_net(batch)
    assert log == ["remover", "victim"]
    small_net(batch)
    assert log == ["remover", "victim"]


def test_registration_during_a_call_takes_effect_next_call(small_net, batch):
    log = []

    def adder(*a):
        log.append("adder")
        small_net["fc1"].register_forward_hook(lambda *a: log.append("new"))

    h = small_net["fc1"].register_forward_hook(adder)
    small_net(batch)
    assert log == ["adder"]
    h.remove()
    small_net(batch)
    assert log == ["adder", "new"]


def test_raising_hook_leaves_model_usable(small_net, batch):
    expected = small_net(batch).copy()

    def boom(*a):
        raise RuntimeError("boom")

    bad = small_net["fc2"].register_forward_hook(boom)
    good = small_net["fc2"].register_forward_hook(lambda *a: None)
    with pytest.raises(RuntimeError, match="boom"):
        small_net(batch)
    bad.remove()
    good.remove()
    np.testing.assert_array_equal(small_net(batch), expected)
    assert not small_net["fc2"]._forward_hooks


def test_handle_validation():
    p = Parameter(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="hook kind"):
        HookHandle(p, print, "sideways")
    with pytest.raises(TypeError, match="callable"):
        HookHandle(p, None, "backward")
    with pytest.raises(TypeError, match="does not accept forward hooks"):
        HookHandle(p, print, "forward")


def test_parameter_rejects_integer_data():
    with pytest.raises(TypeError, match="float32 or float64"):
        Parameter(np.arange(3))


def test_layer_input_validation(small_net):
    with pytest.raises(ValueError, match="last axis 4"):
        small_net(np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="float32 input"):
        small_net(np.zeros((2, 4), np.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        ReLU()(np.zeros(3, dtype=np.int32))


def test_train_eval_mode_is_recursive(small_net):
    small_net.eval()
    assert not any(m.training for _, m in small_net.named_modules())
    small_net.train()
    assert all(m.training for _, m in small_net.named_modules())


# -- optimiser step hooks ------------------------------------------------------------------------------

def _param(values=(1.0, 2.0)):
    p = Parameter(np.array(values))
    p.grad[:] = 1.0
    return p


def _optimisers(p):
    return [optim.SGD([p], lr=0.1), optim.SGD([p], lr=0.1, momentum=0.9), optim.Adam([p], lr=0.1)]


@pytest.mark.parametrize("which", range(3), ids=["sgd", "momentum", "adam"])
def test_step_hooks_bracket_the_update_once_per_step(which):
    p = _param()
    opt = _optimisers(p)[which]
    seen = []
    pre = opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(("pre", o, args, kwargs, p.data.copy())))
    post = opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", o, args, kwargs, p.data.copy())))
    assert isinstance(pre, HookHandle) and pre.kind == "step_pre" and post.kind == "step_post"
    for _ in range(3):
        opt.step()
    assert [s[0] for s in seen] == ["pre", "post"] * 3
    assert all(s[1] is opt and s[2] == () and s[3] == {} for s in seen)
    np.testing.assert_array_equal(seen[0][4], [1.0, 2.0])      # before any change
    assert (seen[1][4] < seen[0][4]).all()                     # after every change
    np.testing.assert_array_equal(seen[2][4], seen[1][4])      # nothing between two steps


def test_step_hooks_fire_once_through_super_step_at_any_depth():
    class Half(optim.SGD):
        def step(self):
            self.lr /= 2
            try:
                super().step()
            finally:
                self.lr *= 2

    class Quarter(Half):
        def step(self):
            self.lr /= 2
            try:
                super().step()
            finally:
                self.lr *= 2

    class Plain(Quarter):  # does not write step: inherits the wrapped one
        pass

    for cls, expected in ((Half, 0.95), (Quarter, 0.975), (Plain, 0.975)):
        p = _param((1.0,))
        opt = cls([p], lr=0.1)
        calls = []
        opt.register_step_pre_hook(lambda *a: calls.append("pre"))
        opt.register_step_post_hook(lambda *a: calls.append("post"))
        opt.step()
        assert calls == ["pre", "post"], cls
        np.testing.assert_allclose(p.data, [expected])
        assert opt.steps == 1


def test_student_optimiser_gets_hooks_and_arguments_pass_through():
    class Scaled(optim.Optimizer):
        def step(self, scale=1.0, *, sign=1.0):
            for q in self.params:
                q.data -= sign * scale * self.lr * q.grad
            self.steps += 1

    p = _param((0.0,))
    opt = Scaled([p], lr=1.0)
    seen = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append((args, kwargs)))
    opt.step(2.0, sign=-1.0)
    assert seen == [((2.0,), {"sign": -1.0})]
    np.testing.assert_allclose(p.data, [2.0])
    opt.register_step_pre_hook(lambda o, args, kwargs: ((3.0,), {}))   # PyTorch: a pre hook may replace them
    opt.step(2.0, sign=-1.0)
    np.testing.assert_allclose(p.data, [-1.0])
    assert seen[-1] == ((3.0,), {})


@pytest.mark.parametrize("returned", ["oops", (1, 2), ((), {}, None), ([], {}), ((), [])])
def test_pre_hook_with_a_bad_return_value_is_refused_before_any_change(returned):
    p = _param()
    opt = optim.SGD([p], lr=0.1)
    opt.register_step_pre_hook(lambda *a: returned)
    with pytest.raises(TypeError, match="must return None or a tuple"):
        opt.step()
    np.testing.assert_array_equal(p.data, [1.0, 2.0])
    assert not opt._stepping


def test_raising_step_hooks_and_steps_leave_the_optimiser_usable():
    p = _param()
    opt = optim.SGD([p], lr=0.1)
    post_calls = []
    opt.register_step_post_hook(lambda *a: post_calls.append(1))
    bad = opt.register_step_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("pre failed")))
    with pytest.raises(RuntimeError, match="pre failed"):
        opt.step()
    np.testing.assert_array_equal(p.data, [1.0, 2.0])          # the pre hook runs before any change
    assert post_calls == [] and opt.steps == 0
    bad.remove()
    opt.step()
    assert post_calls == [1] and opt.steps == 1

    class Broken(optim.SGD):
        def step(self):
            raise ValueError("step failed")

    broken = Broken([_param()], lr=0.1)
    fired = []
    broken.register_step_post_hook(lambda *a: fired.append(1))
    for _ in range(2):
        with pytest.raises(ValueError, match="step failed"):
            broken.step()
    assert fired == [] and not broken._stepping


def test_step_hook_handles_remove_idempotently_and_as_context_managers():
    p = _param()
    opt = optim.Adam([p], lr=0.1)
    calls = []
    with opt.register_step_pre_hook(lambda *a: calls.append("ctx")) as h:
        opt.step()
    h.remove()
    h.remove()
    opt.step()
    assert calls == ["ctx"] and not h.active and not opt._step_pre_hooks


def test_step_hooks_registered_or_removed_during_a_step_apply_from_the_next():
    opt = optim.SGD([_param()], lr=0.1)
    log, handles = [], {}

    def first(*a):
        log.append("first")
        handles["second"].remove()
        opt.register_step_pre_hook(lambda *a: log.append("late"))

    handles["first"] = opt.register_step_pre_hook(first)
    handles["second"] = opt.register_step_pre_hook(lambda *a: log.append("second"))
    opt.step()
    assert log == ["first", "second"]
    handles["first"].remove()
    opt.step()
    assert log == ["first", "second", "late"]


def test_step_hook_registration_errors():
    opt = optim.SGD([_param()], lr=0.1)
    with pytest.raises(TypeError, match="callable"):
        opt.register_step_pre_hook(None)
    with pytest.raises(TypeError, match="callable"):
        opt.register_step_post_hook("not a function")
    with pytest.raises(TypeError, match="does not accept step_pre hooks"):
        HookHandle(Parameter(np.zeros(1)), print, "step_pre")
    with pytest.raises(TypeError, match="does not accept forward hooks"):
        HookHandle(opt, print, "forward")


def test_two_optimisers_do_not_share_hooks():
    a, b = optim.SGD([_param()], lr=0.1), optim.SGD([_param()], lr=0.1)
    calls = []
    a.register_step_post_hook(lambda o, *r: calls.append(o))
    b.step()
    a.step()
    assert calls == [a]


# -- values saved for backward ------------------------------------------------------------------------

def test_reused_module_fires_backward_hooks_per_call_last_call_first():
    lin = Linear(3, 3, rng=0, dtype=np.float64)
    net = Sequential(lin, ReLU(), lin)
    seen = []
    lin.register_backward_hook(lambda m, g: seen.append(g.copy()))
    x = np.random.default_rng(0).standard_normal((2, 3))
    out = net(x)
    net.backprop(np.ones_like(out))
    assert len(seen) == 2
    np.testing.assert_array_equal(seen[0], np.ones_like(out))   # the second call's output gradient first


def test_backward_before_forward_is_an_error():
    for module in (Linear(2, 2), ReLU(), Dropout(0.5)):
        with pytest.raises(RuntimeError, match="backward called before forward"):
            module.backward(np.ones((1, 2), np.float32))


def test_backpropagating_a_reused_forward_twice_is_an_error_not_a_wrong_gradient():
    lin = Linear(3, 3, rng=0, dtype=np.float64)
    net = Sequential(lin, ReLU(), lin)
    x = np.ones((2, 3))
    net(x)
    net.backprop(np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="more often in this backward pass"):
        net.backprop(np.ones((2, 3)))
    net(x)                              # a new forward starts afresh
    net.backprop(np.ones((2, 3)))


def test_eval_forward_between_a_training_forward_and_its_backward_is_an_error():
    drop = Dropout(0.5, rng=0)
    net = Sequential(Linear(3, 3, rng=0), drop)
    x = np.ones((4, 3), np.float32)
    net(x)
    net.eval()
    net(x)
    net.train()
    with pytest.raises(RuntimeError, match="came between this module's forward and its backward"):
        net.backprop(np.ones((4, 3), np.float32))


def test_saved_values_stay_bounded_without_backward():
    lin = Linear(3, 3, rng=0)
    x = np.ones((1, 3), np.float32)
    for _ in range(10 * Module.max_saved_calls):
        lin(x)
    assert len(lin._saved.entries) == Module.max_saved_calls
    lin.backprop(np.ones((1, 3), np.float32))
    lin(x)
    assert len(lin._saved.entries) == 1     # a forward after a backward starts afresh
    lin.eval()
    lin(x)
    lin.train()
    lin(x)
    assert len(lin._saved.entries) == 1     # and so does a forward after a mode change


def test_reuse_deeper_than_the_bound_is_a_clear_error():
    lin = Linear(2, 2, rng=0, dtype=np.float64)
    lin.max_saved_calls = 3
    net = Sequential(*[lin] * 5)
    net(np.ones((1, 2)))
    with pytest.raises(RuntimeError, match="max_saved_calls=3"):
        net.backprop(np.ones((1, 2)))
