"Every layer's and the loss's backward pass against centred finite differences in float64."
import numpy as np
import pytest

from minitrain_inspect.core import Module, Sequential
from minitrain_inspect.gradcheck import check_loss_gradient, check_module_gradients, numerical_gradient, relative_error
from minitrain_inspect.layers import Dropout, LayerNorm, Linear, ReLU, Tanh
from minitrain_inspect.losses import MeanSquaredError, SoftmaxCrossEntropy
from minitrain_inspect.train import PastTenseModel

TOL = 1e-7
rng = np.random.default_rng(42)
X = rng.standard_normal((6, 5))


def away_from_zero(x):
    return np.where(np.abs(x) < 0.1, 0.3, x)


@pytest.mark.parametrize("name,module,x", [
    ("linear", Linear(5, 4, rng=1, dtype=np.float64), X),
    ("linear-no-bias", Linear(5, 4, bias=False, rng=2, dtype=np.float64), X),
    ("linear-3d", Linear(5, 4, rng=3, dtype=np.float64), X.reshape(2, 3, 5)),
    ("relu", ReLU(), away_from_zero(X)),
    ("tanh", Tanh(), X),
    ("layernorm", LayerNorm(5, dtype=np.float64), X),
    ("mlp", Sequential(a=Linear(5, 7, rng=4, dtype=np.float64), b=Tanh(), c=Linear(7, 3, rng=5, dtype=np.float64)), X),
])
def test_module_gradients(name, module, x):
    errors = check_module_gradients(module, x)
    assert max(errors.values()) <= TOL, errors


def test_dropout_gradient_uses_the_forward_mask():
    d = Dropout(0.5, rng=0)
    x = X.copy()
    y = d(x)
    g = rng.standard_normal(x.shape)
    np.testing.assert_array_equal(d.backward(g), g * (y / np.where(x == 0, 1, x)))


def test_loss_gradient():
    assert check_loss_gradient(SoftmaxCrossEntropy(), rng.standard_normal((4, 3, 6)), rng.integers(0, 6, (4, 3))) <= TOL
    assert check_loss_gradient(SoftmaxCrossEntropy(), rng.standard_normal((5, 9)), rng.integers(0, 9, 5)) <= TOL


def test_past_tense_model_gradients():
    model = PastTenseModel(hidden=(6,), dropout=0.0, dtype="float64", seed=1)
    x = np.zeros((2, 324))
    x[0, [3, 30, 60]] = 1
    x[1, [5, 40]] = 1
    # Only check a few parameters' worth to keep it fast: the input gradient covers every path.
    errors = check_module_gradients(model.mlp, x)
    assert max(errors.values()) <= TOL, errors


def test_gradient_check_detects_a_wrong_backward():
    class Wrong(Tanh):
        def backward(self, g):
            y, = self.saved_for_backward()
            return g * (1 - y)
    assert check_module_gradients(Wrong(), X)["input"] > 1e-3


def test_relative_error_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(np.zeros(2), np.zeros(3))


# -- modules used several times in one forward (issue 7) -----------------------------------------------

class SameMasks(Module):
    "Resets the dropout generator before each forward, so finite differences see the same masks every time."
    def __init__(self, net, dropout):
        super().__init__()
        self.net, self.dropout = net, dropout

    def forward(self, x):
        self.dropout.rng = np.random.default_rng(0)
        return self.net(x)

    def backward(self, g):
        return self.net.run_backward(g)


def lin(seed, n=5):
    return Linear(n, n, rng=seed, dtype=np.float64)


def reused_stack(depth, seed=7):
    "One Linear and one Tanh, each used `depth` times."
    shared, act = lin(seed, 4), Tanh()
    return Sequential(*[m for _ in range(depth) for m in (shared, act)])


def reuse_cases():
    shared, relu, ln, drop = lin(1), ReLU(), LayerNorm(5, dtype=np.float64), Dropout(0.5, rng=0)
    return {
        "linear-twice": Sequential(shared, ReLU(), shared),
        "linear-three-times-nested": Sequential(Sequential(shared, Tanh()), shared, Tanh(), shared),
        "relu-twice": Sequential(lin(2), relu, lin(3), relu),
        "layernorm-twice": Sequential(ln, lin(4), ln),
        "dropout-twice": SameMasks(Sequential(drop, lin(5), drop), drop),
        **{f"depth-{d}": reused_stack(d) for d in (1, 2, 3, 5)},
    }


@pytest.mark.parametrize("name", list(reuse_cases()))
def test_reused_module_gradients_match_finite_differences(name):
    module = reuse_cases()[name]
    x = away_from_zero(X)[:, :4] if name.startswith("depth") else away_from_zero(X)
    errors = check_module_gradients(module, x)
    assert max(errors.values()) <= TOL, errors


def test_shared_linear_regression_value():
    "Issue 7: a Linear used twice got one weight gradient badly wrong; now it matches finite differences."
    shared = Linear(3, 3, rng=0, dtype=np.float64)
    net = Sequential(shared, ReLU(), shared)
    x = np.random.default_rng(1).standard_normal((4, 3))
    R = np.random.default_rng(2).standard_normal((4, 3))
    net.zero_grad()
    net(x)
    net.backprop(R)
    numeric = numerical_gradient(lambda: float((net(x) * R).sum()), shared.weight.data)
    np.testing.assert_allclose(shared.weight.grad, numeric, atol=1e-7)


def test_repeated_forwards_without_backward_then_one_backward():
    "Predictions between steps (or gradcheck's many forwards) leave the next backward correct."
    net = Sequential(a=lin(1), b=Tanh(), c=lin(2))
    x = X[:, :5]
    R = rng.standard_normal((6, 5))
    net.zero_grad(); net(x); reference = net.backprop(R), net["a"].weight.grad.copy()
    for i in range(100):
        net(x + i)          # many forwards of other data
    net.zero_grad(); net(x)
    grad_input = net.backprop(R)
    np.testing.assert_array_equal(grad_input, reference[0])
    np.testing.assert_array_equal(net["a"].weight.grad, reference[1])
    assert all(len(m._saved.entries) <= Module.max_saved_calls for _, m in net.named_modules())


def test_eval_forwards_between_steps_do_not_disturb_training():
    net = Sequential(a=lin(1), d=Dropout(0.5, rng=3), c=lin(2))
    twin = Sequential(a=lin(1), d=Dropout(0.5, rng=3), c=lin(2))
    x, R = X[:, :5], rng.standard_normal((6, 5))
    for step in range(3):
        for model in (net, twin):
            model.zero_grad(); model(x); model.backprop(R)
        net.eval(); net(x * 10); net.train()     # an evaluation between steps, on net only
        for name in ("a", "c"):
            np.testing.assert_array_equal(net[name].weight.grad, twin[name].weight.grad)


def test_repeated_backward_after_one_forward_accumulates_the_same_gradient():
    for module in (lin(1), Sequential(lin(2), ReLU(), lin(3)), LayerNorm(5, dtype=np.float64), Dropout(0.5, rng=0)):
        x, R = away_from_zero(X[:, :5]), rng.standard_normal((6, 5))
        module.zero_grad()
        module(x)
        first = module.backprop(R)
        grads = [p.grad.copy() for p in module.parameters()]
        second = module.backprop(R)
        np.testing.assert_array_equal(first, second)
        for p, g in zip(module.parameters(), grads):
            np.testing.assert_array_equal(p.grad, 2 * g)


# -- mean squared error (issue 21) ----------------------------------------------------------------------

class MSEOverExamples(MeanSquaredError):
    "A wrong backward: divided by the number of examples N instead of all N * F entries."
    def backward(self, grad_output=1.0):
        return 2 * self._cache * grad_output / len(self._cache)


@pytest.mark.parametrize("shape", [(6,), (4, 5), (3, 2, 4)])
def test_mse_gradient(shape):
    "MSE is quadratic: the centred difference has no truncation error, only rounding of about eps*|L|/h ~ 1e-10."
    pred, target = rng.standard_normal(shape), rng.standard_normal(shape)
    assert check_loss_gradient(MeanSquaredError(), pred, target) <= TOL
    assert check_loss_gradient(MeanSquaredError(), pred.astype(np.float32), target.astype(np.float32)) <= TOL


def test_mse_gradient_check_detects_a_wrong_backward():
    pred, target = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    assert abs(check_loss_gradient(MSEOverExamples(), pred, target) - (1 - 1 / 5)) < 1e-6


def test_mse_through_a_model():
    "The whole chain (MLP then MSE) against finite differences of the reduced loss, for every parameter."
    net = Sequential(a=Linear(3, 6, rng=11, dtype=np.float64), b=Tanh(), c=Linear(6, 2, rng=12, dtype=np.float64))
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    loss_fn = MeanSquaredError()
    f = lambda: loss_fn(net(x), y).loss
    net.zero_grad()
    f()
    net.backprop(loss_fn.backward())
    for name, p in net.named_parameters():
        assert relative_error(p.grad, numerical_gradient(f, p.data)) <= TOL, name
