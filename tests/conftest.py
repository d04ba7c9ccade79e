import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.layers import Linear, ReLU


@pytest.fixture
def small_net():
    "A three-layer MLP with named layers, float32."
    return Sequential(fc1=Linear(4, 8, rng=0), act=ReLU(), fc2=Linear(8, 3, rng=1))


@pytest.fixture
def batch():
    return np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
