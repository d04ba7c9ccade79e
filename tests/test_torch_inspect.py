"""The Inspector on PyTorch models (14a_torch): panels, hygiene, bit-identical training, no host sync between flushes,
and hooks that did not fire."""
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from minitrain_inspect import speed
from minitrain_inspect.inspect import EVERY_STEP, PANELS, Inspector
from minitrain_inspect.stats import fold_moments, new_state, summarize
from minitrain_inspect.torch_inspect import TORCH_SUM_ERROR, TorchInspector, host_moments, moments_row, to_host

N_STEPS = 5
torch.set_num_threads(1)      # 2 shared cores: more threads only contend (conventions: one thread at the reference size)


# ---------------------------------------------------------------- models
class Residual(nn.Module):
    "A residual block that calls one Linear twice."
    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.act, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x):
        h = self.act(self.inp(x))
        h = h + self.act(self.shared(h))
        h = h + self.act(self.shared(h))       # the same module again
        return self.head(h)


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.act, self.head = nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)
        for p in self.body.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.head(self.act(self.body(x)))


class TransformerBlock(nn.Module):
    def __init__(self, d=8, heads=2, classes=3):
        super().__init__()
        self.embed = nn.Linear(6, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, d))
        self.head = nn.Linear(d, classes)

    def forward(self, x):                       # x: (N, 6) -> a sequence of 4 tokens per example
        h = self.embed(x).unsqueeze(1).expand(-1, 4, -1)
        a, _ = self.attn(h, h, h)
        h = self.norm1(h + a)
        h = self.norm2(h + self.ff(h))
        return self.head(h.mean(dim=1))


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(4 * 3 * 2, 3)

    def forward(self, x):                       # x: (N, 6) -> a 1-channel 3 x 2 image
        return self.head(self.act(self.bn(self.conv(x.view(-1, 1, 3, 2)))).flatten(1))


MODELS = {"mlp": mlp, "cnn": CNN, "residual": Residual, "frozen": Frozen, "transformer": TransformerBlock}


def batches(n=N_STEPS, size=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 6, generator=g, dtype=dtype), torch.randint(0, 3, (size,), generator=g)) for _ in range(n)]


def build(kind, dtype=torch.float32, opt="sgd", seed=0):
    torch.manual_seed(seed)
    model = MODELS[kind]().to(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    make = {"sgd": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=1e-2),
            "adamw": lambda: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)}[opt]
    return model, make()


def run(model, opt, loss_fn, data, inspector=None, label=False):
    for xb, yb in data:
        opt.zero_grad()
        if label and inspector is not None:
            inspector.label_batch(yb, names=["a", "b", "c"])
        loss = loss_fn(model(xb), yb)
        (loss.mean() if loss.dim() else loss).backward()
        opt.step()


# ---------------------------------------------------------------- every panel, every model
@pytest.mark.parametrize("kind", list(MODELS))
def test_every_panel_at_every_step(kind, tmp_path):
    model, opt = build(kind)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no hook-fired warning on any of these models (transformer included)
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            run(model, opt, loss_fn, batches(), insp, label=True)
    assert isinstance(insp, TorchInspector) and insp.step == N_STEPS
    h, steps = insp.history, list(range(N_STEPS))
    for prefix in ("loss", "activations", "act_grads", "gradients", "updates", "spectral", "units", "per_class"):
        keys = h.keys(prefix + "/")
        assert keys, f"{kind}: nothing recorded by {prefix}"
        for key in keys:
            if not key.endswith("/nonfinite") and prefix != "per_class":      # a group may be absent from a batch
                assert h.get(key)[0].tolist() == steps, (kind, key, h.get(key)[0])
    assert sorted({s for k in h.keys("per_class/") for s in h.get(k)[0].tolist()}) == steps
    assert "hooks/missing" not in h.series
    from minitrain_inspect.dashboard import save_dashboard
    assert save_dashboard(h, tmp_path / "run.png").stat().st_size > 0
    h.save_jsonl(tmp_path / "run.jsonl")
    assert type(h).load_jsonl(tmp_path / "run.jsonl").keys() == h.keys()


def test_frozen_parameters_have_no_update_ratio():
    model, opt = build("frozen")
    with Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss(), schedules=EVERY_STEP).attach() as insp:
        run(model, opt, insp.loss_fn, batches())
    assert not insp.history.keys("updates/body") and not insp.history.keys("gradients/body")
    assert insp.history.keys("updates/head.weight")
    assert any("body.weight" in n and "frozen" in n for n in insp.history.meta["notes"])


def test_conv_spectral_norm_is_that_of_its_matrix():
    model, opt = build("cnn")
    with Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss(), schedules={"spectral": 1}).attach() as insp:
        run(model, opt, insp.loss_fn, batches(3))
    estimator = insp.panel("spectral")._estimators["conv.weight"]
    for _ in range(2000):                       # the running estimate, continued on the final weights, converges
        sigma = estimator.estimate(model.conv.weight).item()
    exact = np.linalg.svd(model.conv.weight.detach().double().reshape(4, -1).numpy(), compute_uv=False)[0]
    assert abs(sigma - exact) <= 1e-9 * exact, (sigma, exact)


def test_transformer_packed_in_proj_is_one_matrix():
    model, opt = build("transformer")
    with Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss(), schedules=EVERY_STEP).attach() as insp:
        run(model, opt, insp.loss_fn, batches(2))
    assert insp.history.keys("spectral/attn.in_proj_weight/")
    assert insp.history.keys("activations/attn/")           # the attention module is watched as a whole
    assert any("attn.out_proj not called as modules" in n for n in insp.history.meta["notes"])   # learned, not warned


# ---------------------------------------------------------------- observing changes nothing
@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_training_is_bit_identical(opt_name, dtype, kind):
    def final(watch):
        model, opt = build(kind, dtype, opt_name)
        loss_fn = nn.CrossEntropyLoss()
        data = batches(6, dtype=dtype)
        if watch:
            with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP, flush_every=4).attach():
                run(model, opt, loss_fn, data)
        else:
            run(model, opt, loss_fn, data)
        return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]
    for a, b in zip(final(True), final(False)):
        assert torch.equal(a, b), "the Inspector changed the training"


# ---------------------------------------------------------------- hygiene
def hook_count(model, opt, loss_fn):
    modules = list(model.modules()) + [loss_fn]
    total = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in modules)
    total += sum(len(p._backward_hooks or {}) for p in model.parameters())
    return total + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)


def test_hooks_removed_even_after_an_exception_in_forward():
    model, opt = build("cnn")
    loss_fn = nn.CrossEntropyLoss()
    out = None
    with pytest.raises(RuntimeError, match="boom"):
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            run(model, opt, loss_fn, batches(2))
            out = model.conv(batches(1)[0][0].view(-1, 1, 3, 2))   # an output with a tensor hook on it
            assert out._backward_hooks
            model.bn.register_forward_pre_hook(lambda m, a: (_ for _ in ()).throw(RuntimeError("boom")))
            model(batches(1)[0][0])
    model.bn._forward_pre_hooks.clear()
    assert hook_count(model, opt, loss_fn) == 0 and insp.handles == []
    assert not out._backward_hooks, "a tensor hook outlived the Inspector"
    assert insp.history.get("loss/train")[0].tolist() == [0, 1]     # what was measured was flushed


def test_two_inspectors_on_one_model_are_independent():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    a = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach()
    b = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules={"activations": 2}).attach()
    run(model, opt, loss_fn, batches(2))
    b.enabled = False
    run(model, opt, loss_fn, batches(2, seed=1))
    assert a.snapshot()["0"]["tensors"] == 4 and b.snapshot()["0"]["tensors"] == 1
    assert a.step == b.step == 4
    a.remove_all()
    assert hook_count(model, opt, loss_fn) > 0            # b's hooks stay
    b.remove_all()
    assert hook_count(model, opt, loss_fn) == 0



def module_hooks(model, loss_fn) -> int:
    return sum(len(m._forward_hooks) for m in model.modules()) + len(loss_fn._forward_hooks)


def test_a_disabled_inspector_keeps_no_module_hooks():
    model, opt = build("mlp")              # 5 leaf modules
    loss_fn = nn.CrossEntropyLoss()
    data = batches(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no hook-fired warning, even for the step where it was enabled mid-step
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, enabled=False).attach() as insp:
            assert module_hooks(model, loss_fn) == 0 and len(opt._optimizer_step_post_hooks) == 1   # steps still counted
            run(model, opt, loss_fn, data[:2])
            opt.zero_grad()
            loss_fn(model(data[2][0]), data[2][1]).backward()    # this step's forward ran with no hooks on
            insp.enabled = True
            assert module_hooks(model, loss_fn) == 5 + 1
            opt.step()
            run(model, opt, loss_fn, data[3:])
            insp.enabled = False
            assert module_hooks(model, loss_fn) == 0
    assert insp.step == 5 and insp.history.get("loss/train")[0].tolist() == [3, 4]
    assert "hooks/missing" not in insp.history.series and hook_count(model, opt, loss_fn) == 0

def test_no_graph_or_activation_kept_past_the_step():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP, flush_every=1000).attach()
    run(model, opt, loss_fn, batches(3))
    kept = [v for p in insp.panels for _, _, v in p.pending]
    kept = [x for v in kept for x in (v.tensors if hasattr(v, "tensors") else (v,))]
    assert kept and all(type(t) is float or (t.dim() <= 1 and t.grad_fn is None and not t.requires_grad) for t in kept)
    assert any(type(t) is not float for t in kept)    # floats: the update ratios of CPU weights, host numbers at once
    assert insp._tensor_handles == []
    insp.remove_all()


# ---------------------------------------------------------------- no host sync between flushes
HOST_FUNCTIONS = {"item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__", "__complex__"}


class HostCalls(TorchFunctionMode):
    "Counts the ways a tensor's value can reach the host: on CPU these dispatch no copy, so a dispatch mode misses them."
    def __init__(self):
        super().__init__()
        self.count, self.cpu_views = 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = name == "to" and any(str(a) == "cpu" or getattr(a, "type", None) == "cpu"
                                       for a in (*args[1:], *kwargs.values()))
        if name == "numpy" and args[0].device.type == "cpu" and not to_host:
            self.cpu_views += 1         # a view of host memory, no transfer (the compiled moments on the CPU): kept apart
        elif name in HOST_FUNCTIONS or to_host:
            self.count += 1
        return func(*args, **kwargs)


class ScalarReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def counted_steps(kind, opt_name, inspector_args, views=None):
    "(host reads, scalar reads) over 20 steps; in `views`, if given, the zero-copy NumPy views of CPU tensors taken."
    model, opt = build(kind, opt=opt_name)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    data = batches(22)
    insp = None
    if inspector_args is not None:
        insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, **inspector_args).attach()
    run(model, opt, loss_fn, data[:2], insp, label=True)                 # warm up (first step learns the hooks)
    with HostCalls() as calls, ScalarReads() as reads:
        run(model, opt, loss_fn, data[2:], insp, label=True)             # 20 steps
    if insp is not None:
        insp.remove_all()
    if views is not None:
        views.append(calls.cpu_views)
    return calls.count, reads.count


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_no_host_sync_between_flushes(opt_name, lanes, monkeypatch):
    if not lanes:      # the PyTorch route, which every tensor off the CPU takes: not even a view of host memory
        monkeypatch.setattr(speed, "moment_lane_kernels", lambda: None)
    elif speed.moment_lane_kernels() is None:
        pytest.skip("numba is not installed: no compiled moments")
    plain_views, watched_views = [], []
    plain = counted_steps("cnn", opt_name, None, plain_views)
    watched = counted_steps("cnn", opt_name, {"schedules": EVERY_STEP, "flush_every": 1000}, watched_views)
    assert watched == plain, f"the Inspector added host syncs: {watched} against {plain} unobserved"
    assert (watched_views[0] > plain_views[0]) == lanes, (watched_views, plain_views)   # the lanes: zero-copy views only
    if opt_name == "adamw":
        assert plain[0] > 0        # AdamW's default step reads its step count on the host: the comparison sees it


def test_flushes_are_one_transfer_each():
    plain = counted_steps("mlp", "sgd", None)
    watched = counted_steps("mlp", "sgd", {"schedules": EVERY_STEP, "flush_every": 10})
    assert watched[0] - plain[0] == 2, (watched, plain)   # steps 9 and 19 of the 20 counted (2..21): one tolist each


# ---------------------------------------------------------------- statistics: float64, exact to the stated bound
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_moments_against_exact_sums(dtype):
    rng = np.random.default_rng(1)
    data = torch.from_numpy(rng.standard_normal(5000) * 3 + 40).to(dtype)
    values = [float(v) for v in data.double()]
    n = len(values)
    mean = math.fsum(values) / n
    m2 = math.fsum((v - mean) ** 2 for v in values)
    state = new_state()
    for part in (data[:1234], data[1234:]):
        fold_moments(state, host_moments(to_host([moments_row(part)])[0]))
    s = summarize(state)
    scale = math.fsum(abs(v) for v in values) / n
    assert abs(s["mean"] - mean) <= 2 * TORCH_SUM_ERROR(n) * scale
    kappa = 1 + mean ** 2 / (m2 / n)
    assert abs(s["var"] * (n - 1) - m2) <= 1e-10 * kappa * m2     # the rule, M2 within 1e-10 kappa
    assert (s["min"], s["max"]) == (min(values), max(values))


def test_nonfinite_counted_only_where_present():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    data = batches(3)
    data[1][0][0, 0] = float("nan")
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        run(model, opt, loss_fn, data)
    steps, counts = insp.history.get("activations/0/nonfinite")
    assert steps.tolist() and 1 in steps.tolist() and 0 not in steps.tolist()


# ---------------------------------------------------------------- hooks that do not fire
def test_bypassed_module_is_warned_about():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    data = batches(3)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn).attach() as insp:
        run(model, opt, loss_fn, data[:1])
        with pytest.warns(RuntimeWarning, match=r"1 of 5 forward hooks did not fire at step 1"):
            opt.zero_grad()
            h = nn.functional.linear(data[1][0], model[0].weight, model[0].bias)    # module 0 called as a function
            loss_fn(model[1:](h), data[1][1]).backward()
            opt.step()
    assert insp.history.get("hooks/missing")[0].tolist() == [1]
    assert any("did not fire" in n for n in insp.history.meta["notes"])


def test_compiled_model_is_warned_about():
    # PyTorch 2.13: an instance compiled after an unhooked instance of the same class reuses its graph, skipping hooks.
    loss_fn = nn.CrossEntropyLoss()
    unhooked, _ = build("mlp", seed=1)
    torch.compile(unhooked, backend="aot_eager")(batches(1)[0][0])
    model, opt = build("mlp")
    with Inspector(model, optimizer=opt, loss_fn=loss_fn).attach() as insp:
        compiled = torch.compile(model, backend="aot_eager")
        with pytest.warns(RuntimeWarning, match=r"5 of 5 forward hooks did not fire at step 0 \(the model may be compiled\)"):
            run(compiled, opt, loss_fn, batches(2))
    assert insp.step == 2 and insp.history.get("loss/train")[0].tolist() == [0, 1]   # steps and loss still recorded
    assert any("may be compiled" in n for n in insp.history.meta["notes"])


# ---------------------------------------------------------------- checkpoints
def test_a_resumed_run_continues_one_history():
    import json
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    data = batches(8)
    model, opt = build("cnn", opt="adam")
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules={"activations": 3, "spectral": 2}).attach() as whole:
        run(model, opt, loss_fn, data, whole, label=True)

    model, opt = build("cnn", opt="adam")
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules={"activations": 3, "spectral": 2}).attach() as first:
        run(model, opt, loss_fn, data[:5], first, label=True)
        saved = json.loads(json.dumps({"inspector": first.state_dict(), "model": None}))["inspector"]   # plain JSON
        weights, moments = model.state_dict(), opt.state_dict()
    model2, opt2 = build("cnn", opt="adam", seed=7)
    model2.load_state_dict(weights); opt2.load_state_dict(moments)
    with Inspector(model2, optimizer=opt2, loss_fn=loss_fn).attach() as resumed:
        resumed.load_state_dict(saved)
        assert resumed.step == 5 and resumed.schedules["activations"].to_spec() == "every 3"
        run(model2, opt2, loss_fn, data[5:], resumed, label=True)
    assert resumed.step == 8
    for key in whole.history.keys():
        a, b = whole.history.get(key), resumed.history.get(key)
        assert a[0].tolist() == b[0].tolist(), key
        np.testing.assert_allclose(b[1], a[1], rtol=1e-12, err_msg=key)
    assert resumed.snapshot()["conv"]["tensors"] == whole.snapshot()["conv"]["tensors"]


def test_a_bad_checkpoint_is_refused():
    model, opt = build("mlp")
    insp = Inspector(model, optimizer=opt).attach()
    with pytest.raises(ValueError, match="not an Inspector checkpoint"):
        insp.load_state_dict({"format": "something else"})
    good = insp.state_dict()
    with pytest.raises(ValueError, match="'history'"):
        insp.load_state_dict({**good, "history": 3})
    with pytest.raises(ValueError, match="line 1"):
        insp.load_state_dict({**good, "history": "not json\n"})
    insp.remove_all()


# ---------------------------------------------------------------- mixed precision
def test_autocast_bfloat16_statistics_in_float64():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    seen = []
    model[0].register_forward_hook(lambda m, a, o: seen.append(o.detach().clone()))
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        for xb, yb in batches(3):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
    assert seen[-1].dtype == torch.bfloat16
    values = [float(v) for v in seen[-1].double().reshape(-1)]
    exact = math.fsum(values) / len(values)
    assert abs(insp.history.get("activations/0/mean")[1][-1] - exact) <= 2 * TORCH_SUM_ERROR(len(values)) * max(map(abs, values))
    model._forward_hooks.clear()


def test_a_step_skipped_by_the_grad_scaler_is_recorded_as_skipped():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    data = batches(4)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        insp.register_scaler(scaler)
        seen = []
        for i, (xb, yb) in enumerate(data):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            seen.append(loss.item())
            scaler.scale(loss * (math.inf if i == 1 else 1.0)).backward()     # batch 1: inf gradients
            scaler.step(opt)
            scaler.update()
    assert insp.step == 3, "the skipped batch must not count as a step"
    assert insp.history.get("steps/skipped")[0].tolist() == [1]
    steps, losses = insp.history.get("loss/train")
    assert steps.tolist() == [0, 1, 2]
    assert losses.tolist() == pytest.approx([seen[0], seen[2], seen[3]], rel=1e-6)   # the retry's loss, alone
    assert "step" not in vars(scaler), "the scaler's wrapper outlived the Inspector"


# ---------------------------------------------------------------- memory
def test_live_tensors_stay_flat():
    import gc
    model, opt = build("cnn", opt="adamw")
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    data = batches(1)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP, flush_every=50).attach()

    def live():
        gc.collect()
        return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))   # type(): no __class__ lookups
    run(model, opt, loss_fn, data * 100, insp, label=True)
    after_100 = live()
    run(model, opt, loss_fn, data * 400, insp, label=True)
    assert live() <= after_100 + 5, (after_100, live())       # 400 more steps: nothing accumulates
    insp.remove_all()


def test_live_tensors_stay_flat_over_5000_steps():
    """5,000 steps of a tiny MLP at the default schedules (every panel measures 200 to 5,000 times): the live torch
    tensors, counted by gc every 500 steps at a flush boundary, do not grow after a warm-up of 500 steps. The history
    grows by design, but it holds host numbers, no tensors, and each series is capped at `max_points` (checked)."""
    import gc
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    (xb, yb), = batches(1, size=4)
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, flush_every=50).attach()

    def live():
        gc.collect()
        return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))   # type(): no __class__ lookups
    counts = []
    for step in range(1, 5001):
        opt.zero_grad()
        insp.label_batch(yb, names=["a", "b", "c"])
        loss_fn(model(xb), yb).mean().backward()
        opt.step()
        if step % 500 == 0:          # a multiple of flush_every: nothing is waiting for a flush
            counts.append(live())
    insp.remove_all()
    # A leak of one tensor per flush would add 90 between the first count and the last, one per step 4,500: a slack
    # of 2 allows for a tensor that some library caches once, and nothing that grows with the steps.
    assert max(counts) - min(counts) <= 2, counts
    assert insp.history.get("loss/train")[0][-1] == 4999, "every step was recorded"
    for key, series in insp.history.series.items():
        assert len(series.steps) <= insp.history.max_points, key
        assert not any(isinstance(v, torch.Tensor) for v in series.values), key


# ---------------------------------------------------------------- the rest of the Inspector works unchanged
def test_budget_guard_thins_the_torch_panels():
    model, opt = build("cnn")
    loss_fn = nn.CrossEntropyLoss()
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP, budget=0.01, budget_window=5).attach() as insp:
        run(model, opt, loss_fn, batches(40))
    assert insp.throttled, "a 1% budget must thin panels that measure every step"
    assert insp.history.get("loss/train")[0].tolist() == list(range(40))       # the loss is never thinned


def test_gradient_accumulation_and_reattach():
    model, opt = build("mlp")
    loss_fn = nn.CrossEntropyLoss()
    insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach()
    data = batches(4)
    for k in range(2):
        opt.zero_grad()
        for xb, yb in data[2 * k:2 * k + 2]:            # two backward passes per step
            loss_fn(model(xb), yb).backward()
        expected = model[0].weight.grad.double().norm().item()
        opt.step()
    assert insp.step == 2
    insp.flush()                                          # the history is written at flushes (every 10 steps by default)
    assert abs(insp.history.get("gradients/0.weight/l2")[1][-1] - expected) <= 1e-12 * expected   # the summed gradient
    assert insp.snapshot()["0"]["tensors"] == 4
    insp.remove_all(); insp.remove_all()                  # twice: nothing left, nothing raised
    insp.attach()                                         # again on the same model: it goes on counting
    run(model, opt, loss_fn, batches(1))
    assert insp.step == 3 and insp.snapshot()["0"]["tensors"] == 5
    insp.remove_all()


def test_a_minitrain_model_still_gets_the_plain_inspector():
    from minitrain_inspect.core import Sequential
    from minitrain_inspect.layers import Linear
    assert type(Inspector(Sequential(fc=Linear(2, 2)))) is Inspector
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        Inspector(mlp(), optimizer=object())


def test_per_group_loss_from_logits_and_targets_of_a_reducing_cross_entropy():
    def per_class(loss_fn):
        model, opt = build("mlp")
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            run(model, opt, loss_fn, batches(3), insp, label=True)
        return insp.history
    none, mean = per_class(nn.CrossEntropyLoss(reduction="none")), per_class(nn.CrossEntropyLoss())
    assert mean.keys("per_class/") and sorted(mean.keys("per_class/")) == sorted(none.keys("per_class/"))
    for key in none.keys("per_class/"):
        np.testing.assert_allclose(mean.get(key)[1], none.get(key)[1], rtol=1e-6)
    assert any("recomputed from the logits" in n for n in mean.meta["notes"])
    reduced = per_class(nn.MultiMarginLoss())
    assert not reduced.keys("per_class/") and any("reduction='none'" in n for n in reduced.meta["notes"])


# ---------------------------------------------------------------- the fast paths against plain computations
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_mask_free_moments_match_the_masked_reference(dtype, monkeypatch):
    import minitrain_inspect.torch_inspect as ti
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal(4000) * 2 + 30).to(dtype)
    x[rng.choice(4000, 60, replace=False)] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype).repeat(20)
    fast = [t.item() for t in ti.torch_moments(x)]
    slow = [t.item() for t in ti.masked_moments(x.double())]
    n = 4000 - 60
    assert fast[0] == slow[0] == n and fast[3:] == slow[3:] and fast[5:] == [60, 20]
    scale = 32.0                                    # above mean |x| of this data: every value lies in (20, 40)
    assert abs(fast[1] - slow[1]) <= 4 * TORCH_SUM_ERROR(n) * scale      # both within TORCH_SUM_ERROR of the exact mean
    assert abs(fast[2] - slow[2]) <= 1e-10 * slow[2]
    monkeypatch.setattr(ti, "MASK_FREE_LIMIT", 16)      # a large tensor takes the masked path: same figures
    assert [t.item() for t in ti.torch_moments(x)] == slow
    assert x.isnan().sum().item() == 20               # the input itself is never written (the passes work on a copy)


def test_update_ratios_match_a_plain_float64_computation():
    model, opt = build("mlp", opt="adam")
    loss_fn = nn.CrossEntropyLoss()
    data = batches(3)
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        run(model, opt, loss_fn, data[:2])
        before = {n: p.detach().double().clone() for n, p in model.named_parameters()}
        run(model, opt, loss_fn, data[2:])
    for name, p in model.named_parameters():
        expected = (torch.linalg.vector_norm(p.detach().double() - before[name]) /
                    torch.linalg.vector_norm(before[name])).item()
        assert insp.history.get(f"updates/{name}/ratio")[1][-1] == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------- reused float64 buffers (TorchScratch)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_scratch_moments_are_bit_identical_to_fresh_copies(dtype):
    from minitrain_inspect.torch_inspect import TorchScratch, torch_moments
    rng = np.random.default_rng(11)
    scratch = TorchScratch()
    shapes = [(300, 7), (5,), (0, 4), (64, 64), (3, 4, 5), (5,)]     # grow, shrink, grow, an empty one, a shape again
    for shape in shapes:
        x = torch.from_numpy(rng.standard_normal(shape) * 4 + 25).to(dtype)
        if x.numel() > 3:
            x.view(-1)[:3] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)
        for view in (x, x.transpose(0, -1) if x.dim() > 1 else x):        # contiguous and not
            fresh = torch.stack(torch_moments(view))
            reused = torch.stack(torch_moments(view, scratch))
            assert torch.equal(fresh.nan_to_num(-7.0), reused.nan_to_num(-7.0)), (shape, fresh, reused)
            if x.numel() > 3:
                assert reused[5:].tolist() == [3, 1]                     # NaN, inf, -inf: 3 non-finite, 1 NaN
                assert x.view(-1)[0].isnan()                             # the input is never written


def test_scratch_is_kept_by_the_ops_and_bounded(monkeypatch):
    import minitrain_inspect.torch_inspect as ti
    ops = ti.TorchOps()
    ops.lanes = None        # the scratch serves the PyTorch route (the compiled lanes copy nothing)
    ops.moments_row(torch.ones(10, 10))
    kept = ops.scratch.buffers.data_ptr()
    ops.moments_row(torch.ones(4, 3))
    assert ops.scratch.buffers.data_ptr() == kept and ops.scratch.buffers.shape == (2, 100)
    monkeypatch.setattr(ti, "SCRATCH_LIMIT", 50)     # past the limit: fresh buffers, the scratch untouched
    x = torch.arange(60.0)
    assert torch.equal(ops.moments_row(x), ti.moments_row(x)) and ops.scratch.buffers.shape == (2, 100)


# ---------------------------------------------------------------- compiled moments on the CPU (10a_speed's lanes)
def test_lane_rows_are_within_08_bounds_and_leave_training_alone():
    from fractions import Fraction
    from minitrain_inspect.stats import MEAN_ERROR, m2_error_bound
    from minitrain_inspect.torch_inspect import TorchOps, lane_row, moments_row
    lanes = speed.moment_lane_kernels()
    if lanes is None:
        pytest.skip("numba is not installed: no compiled moments")
    rng = np.random.default_rng(21)
    for x in (torch.from_numpy(rng.standard_normal((33, 65)) * 1e-3 + 2.5).float(),      # kappa about 6e6
              torch.from_numpy(rng.standard_normal(200_000) * 5 - 1e3)):                  # several lane blocks
        row = TorchOps().moments_row(x)
        assert torch.equal(row, lane_row(x, lanes)) and row.dtype == torch.float64
        values = [Fraction(float(v)) for v in x.reshape(-1)]
        n, mean = len(values), sum(values) / len(values)
        m2 = sum((v - mean) ** 2 for v in values)
        got = row.tolist()
        assert got[0] == n and got[3:] == [x.min().item(), x.max().item(), 0, 0]
        assert abs(Fraction(got[1]) - mean) <= MEAN_ERROR * x.double().abs().mean().item()
        one_pass = speed.LANE_ONE_PASS_ERROR if x.dtype == torch.float32 else 0.0
        bound = max(m2_error_bound(1 + float(mean * mean * n / m2)), one_pass) + 4 * 2.0 ** -53   # + the root, then the square
        assert abs(Fraction(got[2]) ** 2 - m2) <= bound * m2          # the row keeps the norm, whose square is M2
    x = torch.from_numpy(rng.standard_normal((20, 30))).float()
    for other in (x.T, x.half(), x.bfloat16(), torch.tensor([0.0, math.inf]), x[:1, :1], torch.empty(5, device="meta")):
        assert lane_row(other, lanes) is None       # the PyTorch route for these, as before


def test_without_numba_the_torch_route_is_unchanged(monkeypatch):
    from minitrain_inspect.torch_inspect import TorchOps, moments_row
    x = torch.from_numpy(np.random.default_rng(22).standard_normal((40, 50)) + 7).float()
    with_lanes = TorchOps()
    monkeypatch.setattr(speed, "moment_lane_kernels", lambda: None)
    ops = TorchOps()
    assert ops.lanes is None and torch.equal(ops.moments_row(x), moments_row(x))
    histories = []
    for lanes in (None, with_lanes.lanes):       # the same run without and with the compiled moments
        model, opt = build("mlp")
        loss_fn = nn.CrossEntropyLoss()
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            insp.ops.lanes = lanes
            run(model, opt, loss_fn, batches(3))
        histories.append((insp.history.get("activations/fc1/mean")[1], [p.detach().clone() for p in model.parameters()]))
    (plain_means, plain_params), (lane_means, lane_params) = histories
    assert all(torch.equal(a, b) for a, b in zip(plain_params, lane_params))     # training itself is the same
    assert plain_means == pytest.approx(lane_means, rel=1e-12)                  # the figures: by rounding only


def test_a_sparse_gradient_is_measured_as_the_dense_tensor_it_stands_for():
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Flatten(), nn.Linear(8, 3))
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()
    x, y = torch.randint(0, 10, (5, 2), generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0, 1])
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        dense = model[0].weight.grad.to_dense()
        opt.step()                               # crashed in the gradient panel before: copy_() of a sparse tensor
        insp.flush()
        (l2,) = insp.history.get("gradients/0.weight/l2")[1].tolist()
    assert l2 == pytest.approx(float(torch.linalg.vector_norm(dense.double())), rel=1e-12)


def test_snapshot_strict_as_a_minitrain_inspector_gives_it():
    "`snapshot(strict=True)` keeps NaN told apart (`{'$float': 'NaN'}`), as the shared interface says."
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inspector = Inspector(model, optimizer=opt, loss_fn=torch.nn.MSELoss()).attach()
    x = torch.randn(4, 3)
    x[0, 0] = float("nan")
    opt.zero_grad()
    inspector.loss_fn(model(x), torch.zeros(4, 2)).backward()
    opt.step()
    loose, strict = inspector.snapshot(), inspector.snapshot(strict=True)
    assert set(loose) == set(strict) and loose
    assert any(isinstance(v, dict) and v.get("$float") == "NaN" for stats in strict.values() for v in stats.values())
    inspector.remove_all()


@pytest.mark.parametrize("route", ["host", "device"])
@pytest.mark.parametrize("scale", [1e-200, 1.0, 1e200])
def test_update_ratios_of_float64_weights_at_the_ends_of_the_range(route, scale):
    "Float64 weights whose squares leave float64 (1e±200): the ratio is still ‖Δw‖/‖w‖ to a few roundings, on both routes."
    from fractions import Fraction
    torch.manual_seed(0)
    model = nn.Linear(30, 4).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Inspector(model, optimizer=opt, schedules=EVERY_STEP).attach() as insp:
        if route == "device":
            insp.ops.differences = None          # the _foreach route, as on a GPU or without numba
        elif insp.ops.differences is None:
            pytest.skip("numba is not installed: no compiled difference pass")
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        for p in model.parameters():
            p.grad = p.detach() * torch.randn_like(p)       # a step of about 1e-3 of each weight
        opt.step()
    for name, p in model.named_parameters():
        change = [Fraction(a) - Fraction(b) for a, b in zip(p.detach().view(-1).tolist(), before[name].view(-1).tolist())]
        weights = [Fraction(b) for b in before[name].view(-1).tolist()]
        exact = math.sqrt(float(sum(d * d for d in change) / sum(w * w for w in weights)))
        assert insp.history.get(f"updates/{name}/ratio")[1][-1] == pytest.approx(exact, rel=1e-12)
    from minitrain_inspect.torch_inspect import TorchNorms
    ops = TorchNorms()
    w = before["weight"]
    squares = sum((Fraction(v) / Fraction(scale)) ** 2 for v in w.view(-1).tolist())     # in units of `scale`: a float
    assert ops.norm(w).item() / scale == pytest.approx(math.sqrt(float(squares)), rel=1e-12)


def test_a_layer_unfrozen_later_is_measured_from_then_on():
    "Gradual unfreezing: a frozen layer (no gradient, not in the optimiser) unfrozen mid-run, added by add_param_group."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss(), schedules=EVERY_STEP).attach() as insp:
        for step in range(6):
            if step == 3:
                model[0].requires_grad_(True)
                opt.add_param_group({"params": model[0].parameters()})
            opt.zero_grad()
            insp.loss_fn(model(x), y).backward()
            opt.step()
    for key in ("updates/0.weight/ratio", "gradients/0.weight/l2"):
        steps, values = insp.history.get(key)
        assert steps.tolist() == [3, 4, 5] and np.all(values > 0), (key, steps, values)
    assert insp.history.get("updates/2.weight/ratio")[0].tolist() == list(range(6))


# ---------------------------------------------------------------- found by an adversarial test (this session)
def test_group_labels_and_losses_are_checked_by_name():
    model, opt = build("mlp")
    insp = Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="distinct, got 'a' more than once"):
        insp.label_batch(torch.tensor([0, 1, 2, 0]), names=["a", "a", "c"])     # two groups would share per_class/a
    with pytest.raises(TypeError, match="not one string"):
        insp.label_batch(torch.tensor([0, 1]), names="ab")
    insp.attach()
    for bad, shown in ((torch.tensor([0, 1, 3]), "got 3"), (torch.tensor([0, -1, 1]), "got -1")):
        insp.label_batch(bad, names=["a", "b", "c"])      # checked where they are used, with no host sync in the step
        with pytest.raises(ValueError, match=f"must lie in 0..2, .* {shown}"):
            insp.record_loss(torch.tensor(1.0), torch.ones(3))
    insp.remove_all()
    for bad in (1.5, torch.tensor([1.0, 2.0])):
        with pytest.raises(TypeError, match="tensor of one value"):
            insp.record_loss(bad)
    with pytest.raises(TypeError, match="schedules must be a dict"):
        Inspector(model, optimizer=opt, schedules="every")


def test_a_module_kept_in_eval_mode_is_not_reported_missing():
    "A BatchNorm frozen in eval mode inside a training model still fires: no 'did not fire' warning."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 6), torch.randint(0, 2, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with Inspector(model, optimizer=opt, loss_fn=nn.CrossEntropyLoss()).attach() as insp:
            for step in range(5):
                if step == 2:
                    model[1].eval()
                opt.zero_grad()
                insp.loss_fn(model(x), y).backward()
                opt.step()
    assert not insp.history.keys("hooks/missing")


def test_hooks_that_never_fire_are_recorded_missing_at_every_step():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with pytest.warns(RuntimeWarning, match="3 of 3 forward hooks did not fire at step 0"):
        with Inspector(model, optimizer=opt).attach() as insp:
            for _ in range(4):
                opt.zero_grad()
                nn.functional.cross_entropy(model[2].forward(model[1].forward(model[0].forward(x))), y).backward()   # no module called
                opt.step()
    assert insp.history.get("hooks/missing")[0].tolist() == [0, 1, 2, 3]


def test_steps_the_scaler_skips_leave_no_per_group_loss_behind():
    "Two steps skipped at step 0: counted 2, and per_class/a at step 0 is the retry's own group mean (was all three batches')."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(reduction="none")
    scaler = torch.amp.GradScaler("cpu", init_scale=1e38)          # float32 gradients overflow: the first steps are skipped
    group_a = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            insp.register_scaler(scaler)
            for i in range(4):
                x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
                insp.label_batch(y, names=["a", "b", "c"])
                opt.zero_grad()
                per = loss_fn(model(x), y)
                group_a.append(per.detach().double()[[0, 3]].mean().item())
                scaler.scale(per.mean() * (1e3 if i < 2 else 1)).backward()
                scaler.step(opt)
                scaler.update()
    steps, counts = insp.history.get("steps/skipped")
    assert steps.tolist() == [0] and counts.tolist() == [2.0]
    steps, values = insp.history.get("per_class/a")
    assert steps.tolist() == [0, 1] and values.tolist() == pytest.approx([group_a[2], group_a[3]], rel=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_examples_the_loss_ignores_do_not_count_in_their_group(reduction):
    "ignore_index: an ignored example's loss is 0; counted in its group it halved per_class/g here (was 0.6408 for 1.2817)."
    torch.manual_seed(0)
    model, loss_fn = nn.Linear(4, 3), nn.CrossEntropyLoss(ignore_index=-100, reduction=reduction)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, -100, -100, -100])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
            insp.label_batch(torch.tensor([0, 1, 0, 0, 1, 1]), names=["g", "h"])
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            (loss.mean() if reduction == "none" else loss).backward()
            opt.step()
    per = nn.functional.cross_entropy(model(x)[:3], y[:3], reduction="none").double()
    assert insp.history.get("per_class/g")[1].tolist() == pytest.approx([per[[0, 2]].mean().item()], rel=1e-12)
    assert insp.history.get("per_class/h")[1].tolist() == pytest.approx([per[1].item()], rel=1e-12)


@pytest.mark.parametrize("ignored", [False, True])
def test_a_weighted_loss_splits_into_groups_as_it_is_normalised(ignored):
    "CrossEntropyLoss(weight=w): a group's loss is sum(w_y * l) / sum(w_y), as the loss itself (was 3.4413 for 1.4240)."
    torch.manual_seed(0)
    weight = torch.tensor([0.5, 2.0, 4.0])
    model, loss_fn = nn.Linear(4, 3), nn.CrossEntropyLoss(weight=weight, ignore_index=-1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 2, -1 if ignored else 1, 0])
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        insp.label_batch(["all"] * 6)                 # one group: its loss must be the batch loss
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        insp.label_batch(torch.tensor([0, 1, 0, 1, 0, 1]), names=["g", "h"])
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    assert insp.history.get("per_class/all")[1].tolist() == pytest.approx([loss.item()], rel=1e-6)
    per = nn.functional.cross_entropy(model(x), y, weight=weight, reduction="none", ignore_index=-1).double()
    kept = (y != -1)
    w = torch.where(kept, weight.double()[torch.where(kept, y, 0)], 0.0)
    for name, rows in (("g", [0, 2, 4]), ("h", [1, 3, 5])):
        expected = (per[rows].sum() / w[rows].sum()).item()
        assert insp.history.get(f"per_class/{name}")[1].tolist() == pytest.approx([expected], rel=1e-12)


def test_unit_shares_are_float64():
    "int64 / int64 is float32 in PyTorch: the shares were 0.8333333134651184 for 5/6."
    from minitrain_inspect.torch_inspect import torch_histogram, torch_unit_health
    out = torch.tensor([[0.0, 1.0, -2.0], [0.0, -3.0, -0.5]])
    dead, share = torch_unit_health(out, "relu")
    assert (dead.dtype, share.dtype) == (torch.float64, torch.float64) and share.item() == 5 / 6
    fractions, below, above = torch_histogram(torch.tensor([-1.0, 0.5, 1.5, 5.0, 0.1, 0.2]), "relu", 4)
    assert {fractions.dtype, below.dtype, above.dtype} == {torch.float64} and below.item() == 1 / 6


@pytest.mark.parametrize("scale", [1e-170, 1e-90, 1e80, 1e155, 1e300])
def test_spectral_norm_of_float64_weights_of_any_scale(scale):
    "The power iteration's squares left float64: sigma was 0, NaN or inf for weights near 1e80 or 1e-170."
    from minitrain_inspect.torch_inspect import TorchSpectralNorm
    W = torch.from_numpy(np.random.default_rng(3).standard_normal((6, 4))) * scale
    sigma = TorchSpectralNorm(warmup=200).estimate(W).item()
    assert sigma == pytest.approx(np.linalg.svd((W / scale).numpy(), compute_uv=False)[0] * scale, rel=1e-9)


def test_clear_errors_for_a_module_name_string_and_a_second_attach():
    model = nn.Sequential(nn.Linear(5, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"a list of module names, got the string '0'"):
        Inspector(model, optimizer=opt, modules="0").attach()
    insp = Inspector(model, optimizer=opt).attach()
    with pytest.raises(ValueError, match="attached already"):
        insp.attach()
    insp.remove_all()
    insp.attach().remove_all()                        # after remove_all it attaches again
    with pytest.raises(TypeError, match=r"an Optimizer, got SGD.*with its model"):
        Inspector(optimizer=opt)


def test_a_step_with_a_closure_says_what_it_measures():
    "LBFGS evaluates its closure several times inside step(), after the gradients are read: said once, training unchanged."
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def run(watch: bool):
        torch.manual_seed(1)
        model, loss_fn = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)), nn.CrossEntropyLoss()
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
        insp = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() if watch else None

        def closure():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss
        for _ in range(3):
            opt.step(closure)
        return model, insp
    with pytest.warns(RuntimeWarning, match="closure") as caught:
        watched, insp = run(True)
    assert sum("closure" in str(w.message) for w in caught) == 1
    plain, _ = run(False)
    assert all(torch.equal(a, b) for a, b in zip(watched.parameters(), plain.parameters()))
    insp.flush()
    assert any("step(closure)" in n for n in insp.history.meta["notes"])
    assert insp.history.get("loss/train")[0].tolist() == [0, 1, 2]


class Signal(nn.Module):
    "A Conv1d over (N, 2, 3) signals whose channel 2 never fires (weight 0, bias -1), then a ReLU module."

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.head = nn.Conv1d(2, 4, 2), nn.ReLU(), nn.Linear(4 * 2, 3)
        with torch.no_grad():
            self.conv.weight[2], self.conv.bias[2] = 0.0, -1.0

    def forward(self, x):
        return self.head(self.act(self.conv(x.view(-1, 2, 3))).flatten(1))


def test_dead_channels_of_a_conv1d_are_its_units():
    "A Conv1d's (N, C, L) output was read with its units last: 0 dead units where 1 channel of 4 is dead."
    torch.manual_seed(0)
    model = Signal()
    params = [p for p in model.parameters()]
    opt = torch.optim.SGD(params, lr=0.0)         # the dead channel stays dead: lr 0
    loss_fn = nn.CrossEntropyLoss()
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        run(model, opt, loss_fn, batches(3))
    steps, dead = insp.history.get("units/act/dead")
    assert steps.tolist() == [0, 1, 2] and dead.tolist() == [0.25, 0.25, 0.25]


def test_an_activation_module_used_twice_says_its_unit_health_is_its_last_call():
    "torchvision's BasicBlock calls one self.relu twice: the unit panel kept the second call's units, silently."
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.relu, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.relu(self.b(self.relu(self.a(x)))))

    torch.manual_seed(0)
    model = Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    with Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach() as insp:
        run(model, opt, loss_fn, batches(3))
    notes = [n for n in insp.history.meta["notes"] if n.startswith("units/relu: the module ran more than once")]
    assert len(notes) == 1 and insp.history.get("units/relu/dead")[0].tolist() == [0, 1, 2]
