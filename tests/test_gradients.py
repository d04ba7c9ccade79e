"Every layer's and the loss's backward pass against centred finite differences in float64."
import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.gradcheck import check_loss_gradient, check_module_gradients, relative_error
from minitrain_inspect.layers import Dropout, LayerNorm, Linear, ReLU, Tanh
from minitrain_inspect.losses import SoftmaxCrossEntropy
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
            return g * (1 - self._y)
    assert check_module_gradients(Wrong(), X)["input"] > 1e-3


def test_relative_error_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(np.zeros(2), np.zeros(3))
