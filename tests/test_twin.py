"The PyTorch twin: optional PyTorch, same names and weights, replayed dropout, reconciled loss and optimisers."
import sys

import numpy as np
import pytest

from minitrain_inspect import twin as twin_mod
from minitrain_inspect.core import Module, Sequential
from minitrain_inspect.data import iterate_batches, make_dataset
from minitrain_inspect.layers import Dropout, LayerNorm, Linear, ReLU, Tanh
from minitrain_inspect.losses import SoftmaxCrossEntropy
from minitrain_inspect.optim import SGD, Adam
from minitrain_inspect.train import PastTenseModel


# -- without PyTorch --------------------------------------------------------------------------------------------------
def test_module_imports_and_fails_clearly_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` now raises ImportError
    assert twin_mod.torch_available() is False
    for call in (lambda: twin_mod.require_torch(), lambda: twin_mod.to_torch(Linear(2, 2)),
                 lambda: twin_mod.torch_loss(None, np.zeros(2, int))):
        with pytest.raises(twin_mod.TorchMissingError, match=r'pip install "minitrain-inspect\[torch\]"') as err:
            call()
        assert "\n" not in str(err.value), "one line"
        assert "torch==2.13.0" in str(err.value)


def test_to_torch_checks_its_argument_before_importing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TypeError, match="minitrain Module"):
        twin_mod.to_torch("a model")


# -- with PyTorch (each test skips cleanly when the extra is absent) ----------------------------------------------
try:
    import torch
except ImportError:
    torch = None


def _step(model, loss_fn, opt, batch):
    model.zero_grad()
    logits = model(batch.inputs)
    loss = loss_fn(logits.reshape(batch.targets.shape + (-1,)), batch.targets).loss
    model.backprop(loss_fn.backward().reshape(logits.shape))
    opt.step()
    return loss


@pytest.mark.parametrize("make_opt", [lambda ps: SGD(ps, lr=0.05, momentum=0.9), lambda ps: SGD(ps, lr=0.05),
                                      lambda ps: Adam(ps, lr=2e-3)], ids=["sgd-momentum", "sgd", "adam"])
@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_twin_trains_like_minitrain(make_opt, activation):
    pytest.importorskip("torch")
    data = make_dataset(dtype="float64")
    model = PastTenseModel(hidden=(24, 16), activation=activation, dropout=0.3, seed=5, dtype="float64")
    opt, loss_fn = make_opt(model.parameters()), SoftmaxCrossEntropy()
    twin = twin_mod.to_torch(model)
    topt = twin_mod.torch_optimizer(opt, twin)
    for batch in iterate_batches(data.train, 16, 6, seed=1):
        with twin_mod.record_masks(model) as masks:
            loss = _step(model, loss_fn, opt, batch)
        twin_mod.replay_masks(twin, masks)
        assert abs(twin_mod.torch_step(twin, topt, batch.inputs, batch.targets) - loss) < 1e-12
    for pair in twin_mod.param_pairs(twin):
        got = twin_mod.to_numpy_layout(pair.tensor, pair.transposed)
        assert np.abs(got - pair.param.data).max() < 1e-12, f"{pair.name} drifted"


def test_names_layouts_and_reuse():
    pytest.importorskip("torch")
    shared = Linear(4, 4, rng=0, dtype="float64")
    model = Sequential(a=shared, norm=LayerNorm(4, dtype="float64"), act=Tanh(), b=shared, drop=Dropout(0.5))
    t = twin_mod.to_torch(model)
    assert t.a is t.b, "a reused minitrain layer is one reused PyTorch layer"
    pairs = twin_mod.param_pairs(t)
    assert [p.name for p in pairs] == [n for n, _ in model.named_parameters()]
    assert [p.transposed for p in pairs] == [True, False, False, False]
    assert t.a.weight.dtype == torch.float64
    assert twin_mod.to_torch(model, "float32").a.weight.dtype == torch.float32
    model.eval()
    assert not twin_mod.to_torch(model).training, "the twin copies train/eval mode"


def test_loss_reduction_is_per_example_then_batch():
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 3 * 4))
    targets = rng.integers(0, 4, (5, 3))
    ours = SoftmaxCrossEntropy()(logits.reshape(5, 3, 4), targets)
    t = torch.tensor(logits, requires_grad=True)
    loss = twin_mod.torch_loss(t, targets)
    loss.backward()
    assert abs(float(loss.detach()) - ours.loss) < 1e-14
    mt_grad = SoftmaxCrossEntropy()
    mt_grad(logits.reshape(5, 3, 4), targets)
    assert np.abs(t.grad.numpy() - mt_grad.backward().reshape(5, 12)).max() < 1e-16, "same 1/(N*L) scaling, no xB factor"


def test_dropout_replays_keep_pattern_with_its_own_scale():
    pytest.importorskip("torch")
    d = Dropout(0.4, rng=1)
    model = Sequential(d=d)
    t = twin_mod.to_torch(model)
    x = np.ones((3, 5))
    with twin_mod.record_masks(model) as masks:
        y = model(x)
    assert masks["d"][0].dtype == bool
    twin_mod.replay_masks(t, masks)
    assert np.array_equal(t(torch.tensor(x)).numpy(), y)
    with pytest.raises(RuntimeError, match="no keep pattern"):
        t(torch.tensor(x))


BAD = [
    ("unsupported layer", lambda: twin_mod.to_torch(Sequential(Linear(2, 2), Module())), TypeError, "supported are"),
    ("float16", lambda: twin_mod.to_torch(Linear(2, 2), "float16"), TypeError, "float32 or float64"),
    ("not a twin", lambda: twin_mod.param_pairs(torch.nn.Linear(2, 2)), TypeError, "made by to_torch"),
    ("float targets", lambda: twin_mod.torch_loss(torch.zeros(2, 3), np.zeros(2)), TypeError, "integers"),
    ("shape mismatch", lambda: twin_mod.torch_loss(torch.zeros(2, 3), np.zeros(3, int)), ValueError, "do not fit"),
    ("optimizer kind", lambda: twin_mod.torch_optimizer(object(), twin_mod.to_torch(Linear(2, 2))), TypeError, "SGD and Adam"),
    ("foreign params", lambda: twin_mod.torch_optimizer(SGD(Linear(2, 2).parameters()), twin_mod.to_torch(Linear(2, 2))),
     ValueError, "not parameters of the twin"),
    ("masks for unknown layer", lambda: twin_mod.replay_masks(twin_mod.to_torch(Linear(2, 2)), {"x": []}), ValueError,
     "no dropout at"),
    ("record non-module", lambda: twin_mod.record_masks("m").__enter__(), TypeError, "minitrain Module"),
    ("mask shape", lambda: _replay_wrong_shape(), ValueError, "keep pattern of shape"),
]


def _replay_wrong_shape():
    t = twin_mod.to_torch(Sequential(d=Dropout(0.5)))
    twin_mod.replay_masks(t, {"d": [np.ones((2, 2), bool)]})
    t(torch.ones(3, 3))


@pytest.mark.parametrize("name,call,exc,message", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments(name, call, exc, message):
    pytest.importorskip("torch")
    with pytest.raises(exc, match=message):
        call()
