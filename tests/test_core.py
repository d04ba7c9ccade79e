"Hook points of the core: order, removal, snapshots of the registry, errors."
import numpy as np
import pytest

from minitrain_inspect.core import HookHandle, Parameter, Sequential
from minitrain_inspect.layers import Linear, ReLU


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
