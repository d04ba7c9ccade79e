import signal

import numpy as np
import pytest

from minitrain_inspect.core import Sequential
from minitrain_inspect.layers import Linear, ReLU

# The Ctrl-C tests need SIGINT to reach Python. A test run started in the background of a non-interactive shell
# (`cmd &`, nohup, some CI runners) inherits SIGINT *ignored*, and then Python never installs its KeyboardInterrupt
# handler, neither here nor in the subprocesses these tests start (an ignored signal stays ignored across exec):
# a `demo` sent SIGINT trained on. Restored once here, so both are as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def small_net():
    "A three-layer MLP with named layers, float32."
    return Sequential(fc1=Linear(4, 8, rng=0), act=ReLU(), fc2=Linear(8, 3, rng=1))


@pytest.fixture
def batch():
    return np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
