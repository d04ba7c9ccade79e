"The optimiser's update hooks: order, removal, a hook that takes the write, errors, and training unchanged by them."
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain_inspect import optim
from minitrain_inspect.core import HookHandle, Parameter
from minitrain_inspect.optim import SGD, Adam, Optimizer

OPTIMISERS = [(SGD, {}), (SGD, {"momentum": 0.9}), (Adam, {})]
IDS = ["sgd", "momentum", "adam"]


def _params(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(rng.standard_normal(shape).astype(dtype)) for shape in ((5, 4), (4,), (3, 2, 2))]


def _train(opt_cls, kw, hooks=(), steps=4, dtype=np.float32):
    "Bytes of every parameter after `steps` steps on fixed random gradients, with `hooks` registered; and the optimiser."
    params = _params(dtype)
    opt = opt_cls(params, lr=0.05, **kw)
    for hook in hooks:
        opt.register_update_hook(hook)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        for p in params:
            p.grad[...] = rng.standard_normal(p.data.shape).astype(dtype)
        opt.step()
    return [p.data.tobytes() for p in params], opt


def _numpy_take(optimizer, param, update):
    param.data -= update
    return True


@pytest.mark.parametrize("opt_cls, kw", OPTIMISERS, ids=IDS)
def test_hooks_fire_once_per_parameter_per_step_in_registration_order(opt_cls, kw):
    log = []
    params = _params()
    opt = opt_cls(params, lr=0.1, **kw)
    opt.register_update_hook(lambda o, p, u: log.append(("a", o.params.index(p), o.steps)))
    opt.register_update_hook(lambda o, p, u: log.append(("b", o.params.index(p), o.steps)))
    for p in params:
        p.grad[...] = 1.0
    opt.step(); opt.step()
    expected = [(who, i, step) for step in (1, 2) for i in range(3) for who in "ab"]
    assert log == expected


@pytest.mark.parametrize("opt_cls, kw", OPTIMISERS, ids=IDS)
def test_an_observing_hook_sees_the_weights_before_and_the_update_itself(opt_cls, kw):
    params = _params()
    opt = opt_cls(params, lr=0.1, **kw)
    seen = {}
    opt.register_update_hook(lambda o, p, u: seen.setdefault(id(p), (p.data.copy(), np.array(u, copy=True))) and None)
    before = [p.data.copy() for p in params]
    for p in params:
        p.grad[...] = 0.5
    opt.step()
    for p, old in zip(params, before):
        weights, update = seen[id(p)]
        assert weights.tobytes() == old.tobytes()
        expected = old.copy(); expected -= update
        assert p.data.tobytes() == expected.tobytes()       # the update shown is the update applied


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opt_cls, kw", OPTIMISERS, ids=IDS)
def test_training_is_bit_identical_with_an_observing_or_a_numpy_taking_hook(opt_cls, kw, dtype):
    plain, _ = _train(opt_cls, kw, dtype=dtype)
    sums = []

    def reads(o, p, u):          # reads the weights and the update, changes nothing
        sums.append(float(np.sum(p.data, dtype=np.float64)) + float(np.sum(u, dtype=np.float64)))
    observed, _ = _train(opt_cls, kw, [lambda o, p, u: None, reads], dtype=dtype)
    taken, _ = _train(opt_cls, kw, [lambda o, p, u: None, _numpy_take, lambda o, p, u: None], dtype=dtype)
    assert observed == plain and len(sums) == 12
    assert taken == plain


def test_a_removed_handle_stops_its_hook_and_removing_twice_is_harmless():
    calls = []
    params = _params()
    opt = SGD(params, lr=0.1)
    handle = opt.register_update_hook(lambda o, p, u: calls.append(1))
    assert isinstance(handle, HookHandle) and handle.active and handle.kind == "update"
    assert repr(handle) == "HookHandle(update, SGD, active)"
    opt.step()
    assert len(calls) == 3
    handle.remove(); handle.remove()
    opt.step()
    assert len(calls) == 3 and not handle.active and opt._update_hooks == {}
    with opt.register_update_hook(lambda o, p, u: calls.append(2)):
        opt.step()
    opt.step()
    assert calls.count(2) == 3


def test_the_registry_is_a_snapshot_during_one_update():
    params = _params()[:1]
    opt = SGD(params, lr=0.1)
    calls = []
    later = []

    def first(o, p, u):
        calls.append("first")
        if not later:
            later.append(o.register_update_hook(lambda *a: calls.append("late")))   # takes effect at the next update
        second.remove()                                                              # ... and so does a removal
    opt.register_update_hook(first)
    second = opt.register_update_hook(lambda *a: calls.append("second"))
    opt.step()
    assert calls == ["first", "second"]
    opt.step()
    assert calls == ["first", "second", "first", "late"]


def test_a_taking_hooks_write_is_the_only_one():
    p = Parameter(np.array([1.0, 2.0], np.float32))
    opt = SGD([p], lr=1.0)
    p.grad[...] = 0.25
    seen_after = []

    def take(o, param, update):
        param.data -= 4 * update          # not what the optimiser would do: its write, not the optimiser's, counts
        return True
    opt.register_update_hook(take)
    opt.register_update_hook(lambda o, param, u: seen_after.append(param.data.copy()))
    opt.step()
    assert p.data.tolist() == [0.0, 1.0]
    assert seen_after[0].tolist() == [0.0, 1.0]   # a hook after the taker sees the written weights


def test_two_taking_hooks_raise_naming_both():
    p = Parameter(np.ones(2))
    opt = SGD([p], lr=0.1)

    def taker_one(o, param, u):
        param.data -= u
        return True

    def taker_two(o, param, u):
        return True
    opt.register_update_hook(taker_one)
    opt.register_update_hook(taker_two)
    with pytest.raises(RuntimeError, match="two update hooks applied one update") as info:
        opt.step()
    assert "taker_one" in str(info.value) and "taker_two" in str(info.value)
    assert opt._stepping is False                        # the failed step leaves the optimiser usable


@pytest.mark.parametrize("returned", [False, 1, "done", (True,), np.bool_(True)])
def test_a_hook_returning_anything_but_none_or_true_is_refused_naming_the_value(returned):
    p = Parameter(np.ones(2))
    opt = SGD([p], lr=0.1)
    opt.register_update_hook(lambda o, param, u: returned)
    with pytest.raises(TypeError, match="must return None or True") as info:
        opt.step()
    assert repr(returned) in str(info.value)
    assert p.data.tolist() == [1.0, 1.0]                  # refused before anything was written


@pytest.mark.parametrize("hook", ["not callable", None, 3])
def test_a_hook_that_is_not_callable_is_refused_naming_its_type(hook):
    opt = SGD([Parameter(np.ones(2))], lr=0.1)
    with pytest.raises(TypeError, match=f"callable, got {type(hook).__name__}"):
        opt.register_update_hook(hook)
    assert opt._update_hooks == {}


def test_apply_update_without_hooks_is_numpys_in_place_subtraction():
    p = Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    data = p.data
    opt = SGD([p], lr=0.1)
    opt.apply_update(p, np.float32(0.5))                  # a broadcast update too
    opt.apply_update(p, np.full((2, 3), 0.25))            # float64: NumPy's same_kind cast
    expected = np.arange(6, dtype=np.float32).reshape(2, 3); expected -= np.float32(0.5); expected -= np.full((2, 3), 0.25)
    assert p.data is data and p.data.tobytes() == expected.tobytes()


def test_an_optimiser_writing_p_data_itself_fires_no_update_hook_but_its_step_hooks():
    class OwnWrite(Optimizer):
        def step(self):
            for p in self.params:
                p.data -= self.lr * p.grad

    p = Parameter(np.ones(3)); p.grad[...] = 1.0
    opt = OwnWrite([p], lr=0.5)
    fired = []
    opt.register_update_hook(lambda *a: fired.append("update"))
    opt.register_step_pre_hook(lambda *a: fired.append("pre"))
    opt.register_step_post_hook(lambda *a: fired.append("post"))
    opt.step()
    assert fired == ["pre", "post"] and p.data.tolist() == [0.5] * 3


def test_the_optimiser_keeps_nothing_for_the_inspector():
    gone = ["update_norms", "update_probes", "update_products", "updates_reach", "updates_last", "observes_only",
            "update_kernels", "subtract_update", "_subtract_measuring", "_subtract_times", "_times", "_norm_before",
            "_squares_norm", "l2_norm"]
    opt = SGD([Parameter(np.ones(2))], lr=0.1)
    for name in gone:
        assert not hasattr(optim, name) and not hasattr(opt, name) and not hasattr(Adam, name), name
    assert set(vars(opt)) == {"params", "lr", "steps", "momentum", "velocity", "_step_pre_hooks", "_step_post_hooks",
                              "_update_hooks"}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([np.float32, np.float64]), st.integers(0, 40), st.floats(-1e6, 1e6, width=32),
       st.integers(0, 2**32 - 1))
def test_a_numpy_taking_hook_gives_numpys_bits_for_any_update(dtype, n, scale, seed):
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(n) * 10).astype(dtype)
    update = (rng.standard_normal(n) * scale).astype(rng.choice([np.float32, np.float64]))
    expected = data.copy(); expected -= update
    p = Parameter(data.copy())
    opt = SGD([p], lr=0.1)
    opt.register_update_hook(_numpy_take)
    opt.apply_update(p, update)
    assert p.data.tobytes() == expected.tobytes()
