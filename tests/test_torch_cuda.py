"""The PyTorch Inspector on a CUDA device (issue 25 §3): no host synchronisation between flushes, checked by CUDA's own
sync debug mode, and device memory flat over many steps. These run only where a GPU is present (CI machines have
none, so they skip there); `tests/test_torch_inspect.py` checks the same rule on CPU by counting every host read."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the sync-debug and device-memory checks need one", allow_module_level=True)
nn = torch.nn

from minitrain_inspect.inspect import EVERY_STEP, Inspector  # noqa: E402
import minitrain_inspect.torch_inspect  # noqa: E402,F401  (registers the adapter)

DEVICE = torch.device("cuda")


def cnn():
    "A small CNN with BatchNorm and an in-place ReLU, on the GPU."
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3)).to(DEVICE)


def batches(n, size=16):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 1, 6, 6, generator=g).to(DEVICE), torch.randint(0, 3, (size,), generator=g).to(DEVICE))
            for _ in range(n)]


def steps(model, opt, loss_fn, data, inspector=None):
    for xb, yb in data:
        opt.zero_grad()
        if inspector is not None:
            inspector.label_batch(yb, names=["a", "b", "c"])
        loss_fn(model(xb), yb).mean().backward()
        opt.step()


def sgd(model):
    # SGD reads nothing on the host; AdamW's default (non-capturable) step does, which would mask the Inspector's
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def test_sync_debug_mode_is_live():
    "The guard itself: a host read under mode 'error' raises, so a silent run below means no sync happened."
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            torch.ones(3, device=DEVICE).sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("inspector_args", [None, {"schedules": EVERY_STEP, "flush_every": 1000}, {"flush_every": 1000}],
                         ids=["unobserved", "every-panel-every-step", "default-schedules"])
def test_no_host_sync_between_flushes_under_cuda_sync_debug_mode(inspector_args):
    model, opt = cnn(), None
    opt = sgd(model)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    data = batches(22)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, **inspector_args).attach() if inspector_args else None
    steps(model, opt, loss_fn, data[:2], insp)             # warm-up: the first step learns which hooks fire
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        steps(model, opt, loss_fn, data[2:], insp)          # 20 steps, no flush due: any host sync raises
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if insp is not None:
        insp.flush()                                         # the one transfer, outside the guarded steps
        steps_seen, _ = insp.history.get("loss/train")
        assert list(steps_seen) == list(range(22)), steps_seen
        insp.remove_all()


def test_device_memory_flat_over_many_steps():
    model = cnn()
    opt = sgd(model)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    data = batches(1)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP, flush_every=50).attach()
    steps(model, opt, loss_fn, data * 200, insp)
    torch.cuda.synchronize()
    after_200 = torch.cuda.memory_allocated()
    steps(model, opt, loss_fn, data * 2000, insp)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= after_200 + (1 << 20), (after_200, torch.cuda.memory_allocated())
    insp.remove_all()
