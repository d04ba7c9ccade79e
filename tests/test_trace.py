"The trace of a training step: tracing only reads, files round-trip and are validated, compare_traces localises planted bugs."
import argparse
import os
import json
import math

import numpy as np
import pytest
from blas_spy import threads_seen_inside
from threadpoolctl import threadpool_limits

from minitrain_inspect.core import Module, Sequential
from minitrain_inspect.data import IRREGULAR_VERBS, REGULAR_VERBS, iterate_batches, make_dataset
from minitrain_inspect.layers import Dropout, LayerNorm, Linear, ReLU
from minitrain_inspect.optim import SGD, Adam
from minitrain_inspect.trace import (Trace, TraceBuffer, TraceEvent, Tracer, add_trace_arguments, as_sink,
                                     build_run, compare_rounding, compare_traces, copy_optimizer, load_trace,
                                     make_reference, minitrain_copy, minitrain_step, save_trace, sweep, tolerances,
                                     trace_command, trace_pair, _batch_arrays)
from minitrain_inspect.train import TrainConfig, train

torch_missing = not __import__("minitrain_inspect.twin", fromlist=["x"]).torch_available()


# -- helpers -------------------------------------------------------------------------------------------------------
def past_tense_run(dtype="float64", optimizer="adam", steps=2, hidden=(32, 32), activation="relu", seed=0):
    config = TrainConfig(hidden=hidden, batch_size=16, dtype=dtype, optimizer=optimizer, seed=seed, lr=1e-2,
                         activation=activation, progress=False)
    model, opt, loss_fn = build_run(config)
    data = make_dataset(config.val_fraction, seed=seed, keep_in_train=REGULAR_VERBS | IRREGULAR_VERBS, dtype=dtype)
    return model, opt, list(iterate_batches(data.train, config.batch_size, steps, seed=seed))


def layernorm_run(dtype="float64"):
    model = Sequential(fc1=Linear(12, 16, rng=1, dtype=dtype), norm=LayerNorm(16, dtype=dtype), act=ReLU(),
                       fc2=Linear(16, 5, rng=2, dtype=dtype))
    rng = np.random.default_rng(0)
    model["norm"].weight.data[...] = rng.uniform(0.5, 1.5, 16)   # not all ones, so every term of the backward matters
    batches = [(rng.standard_normal((8, 12)).astype(dtype), rng.integers(0, 5, 8)) for _ in range(2)]
    return model, SGD(model.parameters(), lr=0.1, momentum=0.9), batches


def zero_unit_run(dtype="float64", zero=True):
    "A ReLU net whose unit 0 has zero weights and bias: its pre-activation is exactly 0 for every input."
    model = Sequential(fc1=Linear(6, 8, rng=3, dtype=dtype), act=ReLU(), fc2=Linear(8, 4, rng=4, dtype=dtype))
    if zero:
        model["fc1"].weight.data[:, 0] = 0
        model["fc1"].bias.data[0] = 0
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((10, 6)).astype(dtype), rng.integers(0, 4, 10)) for _ in range(2)]
    return model, SGD(model.parameters(), lr=0.1), batches


def clean_then_faulty(make_run, plant, monkeypatch):
    "Trace the clean code first (the reference), then the same run with the fault planted; compare."
    model, opt, batches = make_run()
    clean, _ = trace_pair(model, opt, batches, compare="float64")
    plant(monkeypatch)
    model, opt, batches = make_run()
    faulty, _ = trace_pair(model, opt, batches, compare="float64")
    return compare_traces(faulty, clean)


# -- the planted faults (patched here only) ------------------------------------------------------------------------
def linear_backward_off(monkeypatch):
    clean = Linear.backward
    monkeypatch.setattr(Linear, "backward", lambda self, g: clean(self, g) * 1.001)


def layernorm_missing_term(monkeypatch):
    def backward(self, grad_output):
        x_hat, inv_std = self.saved_for_backward()
        g2 = grad_output.reshape(-1, self.features)
        self.weight.grad += (g2 * x_hat.reshape(-1, self.features)).sum(axis=0)
        self.bias.grad += g2.sum(axis=0)
        gx_hat = grad_output * self.weight.data
        return inv_std * (gx_hat - gx_hat.mean(axis=-1, keepdims=True))   # the x_hat * mean(gx_hat * x_hat) term is gone
    monkeypatch.setattr(LayerNorm, "backward", backward)


def relu_wrong_at_zero(monkeypatch):
    def forward(self, x):
        self.save_for_backward(x)
        return np.maximum(x, 0)
    monkeypatch.setattr(ReLU, "forward", forward)
    monkeypatch.setattr(ReLU, "backward", lambda self, g: g * (self.saved_for_backward()[0] >= 0))  # should be > 0


def adam_bias_correction_slip(monkeypatch):
    def step(self):
        self.steps += 1
        b1, b2, t = self.beta1, self.beta2, self.steps
        step_size = self.lr * math.sqrt(1 - b2**t) / (1 - b1**(t + 1))    # the slip: t + 1 for t
        eps_hat = self.eps * math.sqrt(1 - b2**t)
        for p, m, s in zip(self.params, self.m, self.s):
            m *= b1
            m += (1 - b1) * p.grad
            s *= b2
            s += (1 - b2) * (p.grad * p.grad)
            p.data -= step_size * (m / (np.sqrt(s) + eps_hat))
    slipped = type("SlippedAdam", (Adam,), {"step": step})   # a subclass, so the step hooks still wrap it
    monkeypatch.setattr(Adam, "step", slipped.step)


def dropout_wrong_scale(monkeypatch):
    def forward(self, x):
        if not self.training or self.p == 0.0:
            self.save_for_backward(None)
            return x
        keep = self.rng.random(x.shape, dtype=x.dtype) >= self.p
        mask = keep * x.dtype.type(1.0 + self.p)          # the slip: 1 + p for 1 / (1 - p)
        self.save_for_backward(mask)
        return x * mask
    monkeypatch.setattr(Dropout, "forward", forward)


FAULTS = [  # fault, run, expected first drift (step, probe, phase, written by)
    (linear_backward_off, past_tense_run, (0, "mlp.drop2", "act_grad", "mlp.output")),
    (layernorm_missing_term, layernorm_run, (0, "fc1", "act_grad", "norm")),
    (relu_wrong_at_zero, zero_unit_run, (0, "fc1", "act_grad", "act")),
    (adam_bias_correction_slip, past_tense_run, (0, "mlp.hidden1.weight", "param_after", "optimizer")),
    (dropout_wrong_scale, past_tense_run, (0, "mlp.drop1", "forward", "mlp.drop1")),
]


def _where(comp):
    fd = comp.first_drift
    assert fd is not None, "the planted fault was not found"
    return fd["step"], fd["probe"], fd["phase"], fd["written_by"]


@pytest.mark.parametrize("plant,run,expected", FAULTS, ids=lambda v: getattr(v, "__name__", ""))
def test_planted_fault_is_localised_against_clean_minitrain(plant, run, expected, monkeypatch):
    comp = clean_then_faulty(run, plant, monkeypatch)
    assert _where(comp) == expected, f"{plant.__name__}: first drift {_where(comp)}, expected {expected}"


@pytest.mark.parametrize("resync", [False, True], ids=["free", "resync"])
@pytest.mark.parametrize("plant,run,expected", FAULTS, ids=lambda v: getattr(v, "__name__", ""))
def test_planted_fault_is_localised_against_torch(plant, run, expected, resync, monkeypatch):
    pytest.importorskip("torch")
    plant(monkeypatch)
    model, opt, batches = run()
    a, b = trace_pair(model, opt, batches, compare="torch", resync=resync)
    comp = compare_traces(a, b)
    assert _where(comp) == expected, f"{plant.__name__} ({'resync' if resync else 'free'}): {_where(comp)} != {expected}"


def test_relu_fault_is_invisible_without_exact_zeros(monkeypatch):
    comp = clean_then_faulty(lambda: zero_unit_run(zero=False), relu_wrong_at_zero, monkeypatch)
    assert comp.first_drift is None, "the fault only differs at exactly 0; random pre-activations never hit it"


@pytest.mark.parametrize("resync", [False, True])
@pytest.mark.parametrize("optimizer,activation", [("adam", "relu"), ("sgd", "tanh")])
def test_clean_model_agrees_with_torch_in_float64(optimizer, activation, resync):
    pytest.importorskip("torch")
    model, opt, batches = past_tense_run(optimizer=optimizer, activation=activation, steps=3)
    a, b = trace_pair(model, opt, batches, compare="torch", resync=resync)
    comp = compare_traces(a, b, rtol=1e-7, atol=1e-7)
    assert comp.first_drift is None, f"clean model drifts from PyTorch: {comp.first_drift}"
    worst = max(r["norm_rel"] for r in comp.rows)
    assert worst < 1e-13, f"float64 agreement with PyTorch should be ~1e-15, got {worst:.1e}"


def test_clean_layernorm_model_agrees_with_torch():
    pytest.importorskip("torch")
    model, opt, batches = layernorm_run()
    a, b = trace_pair(model, opt, batches, compare="torch")
    assert compare_traces(a, b).first_drift is None


def test_float32_passes_the_rounding_check_and_a_bug_does_not(monkeypatch):
    model, opt, batches = past_tense_run("float32", steps=1)
    a, b = trace_pair(model, opt, batches, compare="float64")
    comp = compare_rounding(a, b)
    assert comp.first_drift is None, f"float32 minitrain should be within 20 roundings of float64: {comp.first_drift}"
    linear_backward_off(monkeypatch)
    model, opt, batches = past_tense_run("float32", steps=1)
    a, b = trace_pair(model, opt, batches, compare="float64")   # the reference is patched too: it must not matter
    monkeypatch.undo()
    clean_model, clean_opt, _ = past_tense_run("float32", steps=1)
    _, clean64 = trace_pair(clean_model, clean_opt, batches, compare="float64")
    assert compare_rounding(a, clean64).first_drift["probe"] == "mlp.drop2"


# -- tracing only reads -----------------------------------------------------------------------------------------------
def test_tracer_leaves_params_sha256_unchanged():
    config = TrainConfig(steps=4, batch_size=16, hidden=(32, 32), progress=False, eval_every=2)
    plain = train(config).params_sha256
    buf = TraceBuffer()
    assert train(config, observers=[Tracer(buf)]).params_sha256 == plain, "tracing every step changed the training"
    partial = TraceBuffer()
    assert train(config, observers=[Tracer(partial, steps=[1, 3])]).params_sha256 == plain
    assert buf.trace().steps == [0, 1, 2, 3] and partial.trace().steps == [1, 3]


def test_tracer_ignores_eval_passes_and_records_in_order():
    buf = TraceBuffer()
    config = TrainConfig(steps=2, batch_size=8, hidden=(8,), progress=False, eval_every=1)
    train(config, observers=[Tracer(buf)])
    keys = buf.trace().keys()
    assert len(keys) == len(set(keys)) == 2 * (2 + 6 + 2 + 5 + 5 + 10), "one event per probe, eval passes ignored"
    phases = [ph for s, p, ph in keys if s == 0]
    assert phases.index("loss_grad") < phases.index("act_grad") < phases.index("param_after")


def test_minitrain_step_is_the_training_loops_step():
    "Like with like: the step pins the BLAS threads as `train` does, whatever the caller's setting."
    config = TrainConfig(steps=3, batch_size=16, hidden=(16,), optimizer="sgd", progress=False)
    data = make_dataset(config.val_fraction, seed=0, keep_in_train=REGULAR_VERBS | IRREGULAR_VERBS)
    model, opt, loss_fn = build_run(config)
    with threadpool_limits(2, user_api="blas"):
        for batch in iterate_batches(data.train, 16, 3, seed=0):
            minitrain_step(model, loss_fn, opt, batch.inputs, batch.targets, threads=config.blas_threads)
    from minitrain_inspect.train import params_sha256
    assert params_sha256(model) == train(config, data=data).params_sha256




def test_the_traces_steps_run_on_one_blas_thread_whatever_the_environment_says():
    outside, inside = threads_seen_inside("""
from minitrain_inspect.train import TrainConfig, build_run, run_data, iterate_batches
from minitrain_inspect.trace import minitrain_step, sweep, trace_pair
config = TrainConfig(batch_size=8, hidden=(8,), progress=False)
batches = list(iterate_batches(run_data(config).train, 8, 2, seed=0))
model, opt, _ = build_run(config)
minitrain_step(model, SpyLoss(), opt, batches[0].inputs, batches[0].targets)
for resync in (False, True):
    model, opt, _ = build_run(config)
    trace_pair(model, opt, batches, loss_fn=SpyLoss(), resync=resync)
""")
    assert outside != [1] and inside == [[1]] * 5, (outside, inside)   # one step, then two in each mode


def test_sink_object_and_callable():
    got = []
    with Tracer(got.append).attach(*build_run(TrainConfig(hidden=(4,)))[::2]):
        pass
    class Writer:
        def __init__(self): self.n = 0
        def record(self, event): self.n += 1
    w = Writer()
    model, opt, batches = past_tense_run(steps=1, hidden=(4,))
    loss_fn = build_run(TrainConfig(hidden=(4,)))[2]
    with Tracer(w).attach(model, loss_fn, opt):
        minitrain_step(model, loss_fn, opt, batches[0].inputs, batches[0].targets)
    assert w.n == 2 + 6 + 2 + 5 + 5 + 10


# -- files --------------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    model, opt, batches = past_tense_run(steps=1, hidden=(4,))
    a, b = trace_pair(model, opt, batches, compare="float64", meta={"seed": 0})
    npz, manifest = save_trace(a, tmp_path, "a")
    return a, b, npz, manifest


def test_trace_round_trips_and_compares_from_files(saved, tmp_path):
    a, b, npz, manifest = saved
    save_trace(b, tmp_path, "b")
    a2, b2 = load_trace(manifest), load_trace(tmp_path / "b.npz")
    assert a2.keys() == a.keys() and a2.meta["graph"] == a.meta["graph"]
    assert all(np.array_equal(a2[k], a[k]) and a2[k].dtype == a[k].dtype for k in a.keys())
    rows = compare_traces(a2, b2).rows
    assert [r["max_abs"] for r in rows] == [r["max_abs"] for r in compare_traces(a, b).rows]
    data = json.loads(manifest.read_text())
    assert {"format", "version", "arrays", "events", "meta"} <= set(data)
    assert data["events"][0] == {"step": 0, "probe": "inputs", "phase": "batch", "key": "e0", "shape": [16, 324],
                                 "dtype": "<f8"}


def _edit(field, value):
    def change(m):
        m["events"][2][field] = value
    return change


MANIFEST_CORRUPTIONS = [
    ("format", lambda m: m.update(format="other"), "manifest"),
    ("version", lambda m: m.update(version=2), "version"),
    ("events not a list", lambda m: m.update(events={}), "'events' must be a list"),
    ("meta not an object", lambda m: m.update(meta=[]), "'meta' an object"),
    ("arrays name", lambda m: m.update(arrays="other.npz"), "'arrays' must name"),
    ("entry not an object", lambda m: m["events"].__setitem__(2, 5), "event 2: expected an object"),
    ("entry missing field", lambda m: m["events"][2].pop("dtype"), "event 2: expected an object"),
    ("entry extra field", lambda m: m["events"][2].update(x=1), "event 2: expected an object"),
    ("negative step", _edit("step", -1), "event 2: step"),
    ("bool step", _edit("step", True), "event 2: step"),
    ("float step", _edit("step", 0.0), "event 2: step"),
    ("empty probe", _edit("probe", ""), "event 2: probe"),
    ("probe not a string", _edit("probe", 3), "event 2: probe"),
    ("unknown phase", _edit("phase", "sideways"), "event 2: phase"),
    ("shape not a list", _edit("shape", "16"), "event 2: shape"),
    ("negative shape", _edit("shape", [-1]), "event 2: shape"),
    ("wrong shape", _edit("shape", [3, 3]), "event 2: the array has shape"),
    ("bad dtype", _edit("dtype", "float99"), "event 2: dtype"),
    ("wrong dtype", _edit("dtype", "<f4"), "event 2: the array has shape"),
    ("missing key", _edit("key", "e999"), "event 2: array 'e999' is missing"),
    ("duplicate event", lambda m: m["events"].__setitem__(3, dict(m["events"][2], key="e3", shape=m["events"][3]["shape"],
                                                                   dtype=m["events"][3]["dtype"])), "recorded twice"),
    ("array not in manifest", lambda m: m["events"].pop(), "not in the manifest"),
]


@pytest.mark.parametrize("name,corrupt,message", MANIFEST_CORRUPTIONS, ids=[c[0] for c in MANIFEST_CORRUPTIONS])
def test_bad_manifest_names_file_and_event(saved, name, corrupt, message):
    _, _, _, manifest = saved
    data = json.loads(manifest.read_text())
    corrupt(data)
    manifest.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"a\.(json|npz)") as err:
        load_trace(manifest)
    assert message in str(err.value), f"{name}: {err.value}"


@pytest.mark.parametrize("case", ["no manifest", "not json", "no arrays", "corrupt arrays", "not utf8"])
def test_bad_files_are_named(saved, case):
    _, _, npz, manifest = saved
    if case == "no manifest":
        manifest.unlink()
    elif case == "not json":
        manifest.write_text("{not json")
    elif case == "no arrays":
        npz.unlink()
    elif case == "corrupt arrays":
        npz.write_bytes(b"PK\x03\x04 garbage")
    else:
        manifest.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"a\.(json|npz)"):
        load_trace(manifest)


def test_pickled_arrays_are_refused(saved):
    _, _, npz, manifest = saved
    with open(npz, "wb") as f:
        np.savez(f, **{f"e{i}": np.array([{"x": 1}], dtype=object) for i in range(len(json.loads(manifest.read_text())["events"]))})
    with pytest.raises(ValueError, match="a.npz"):
        load_trace(manifest)


def test_save_is_atomic_and_checks_names(saved, tmp_path, monkeypatch):
    a, _, npz, manifest = saved
    before = manifest.read_text()
    monkeypatch.setattr(json, "dumps", lambda *args, **kw: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_trace(a, tmp_path, "a")
    monkeypatch.undo()
    assert manifest.read_text() == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    for bad in ("", "x/y", ".hidden", 3):
        with pytest.raises(ValueError, match="plain file name"):
            save_trace(a, tmp_path, bad)
    with pytest.raises(TypeError, match="needs a Trace"):
        save_trace([], tmp_path, "x")
    with pytest.raises(ValueError, match="does not exist"):
        save_trace(a, tmp_path / "missing", "x")


# -- bad arguments -----------------------------------------------------------------------------------------------------
BAD_CALLS = [
    ("sink int", lambda: as_sink(42), TypeError, "record(event)"),
    ("sink None", lambda: Tracer(None), TypeError, "record(event)"),
    ("negative step", lambda: Tracer(print, steps=[-1]), ValueError, "non-negative"),
    ("bool step", lambda: Tracer(print, steps=[True]), ValueError, "non-negative"),
    ("str step", lambda: Tracer(print, steps=["1"]), ValueError, "non-negative"),
    ("attach non-module", lambda: Tracer(print).attach("model"), TypeError, "minitrain Module"),
    ("event not TraceEvent", lambda: Trace([(0, "x", "forward", np.zeros(1))]), TypeError, "TraceEvent"),
    ("event negative step", lambda: Trace([TraceEvent(-1, "x", "forward", np.zeros(1))]), ValueError, "step"),
    ("event empty probe", lambda: Trace([TraceEvent(0, "", "forward", np.zeros(1))]), ValueError, "probe"),
    ("event list value", lambda: Trace([TraceEvent(0, "x", "forward", [1.0])]), TypeError, "NumPy array"),
    ("event object value", lambda: Trace([TraceEvent(0, "x", "forward", np.array([None]))]), TypeError, "NumPy array"),
    ("compare non-trace", lambda: compare_traces([], Trace()), TypeError, "must be a Trace"),
    ("tolerance dtype", lambda: tolerances("float16"), ValueError, "float32 or float64"),
    ("negative rtol", lambda: tolerances("float32", rtol=-1), ValueError, "rtol"),
    ("nan atol", lambda: tolerances("float32", atol=float("nan")), ValueError, "atol"),
    ("inf atol", lambda: tolerances("float64", atol=float("inf")), ValueError, "atol"),
    ("bool rtol", lambda: tolerances("float64", rtol=True), ValueError, "rtol"),
    ("zero multiplier", lambda: compare_rounding(Trace(), Trace(), multiplier=0), ValueError, "multiplier"),
    ("inf multiplier", lambda: compare_rounding(Trace(), Trace(), multiplier=math.inf), ValueError, "multiplier"),
    ("str multiplier", lambda: compare_rounding(Trace(), Trace(), multiplier="2"), ValueError, "multiplier"),
    ("unknown reference", lambda: make_reference("jax", *past_tense_run(hidden=(4,))[:2]), ValueError, "compare must be one of"),
    ("copy unknown module", lambda: minitrain_copy(Sequential(Linear(2, 2), Module())), TypeError, "cannot copy module"),
    ("copy unknown optimizer", lambda: copy_optimizer(object(), Linear(2, 2), Linear(2, 2)), TypeError, "SGD and Adam"),
    ("batch not arrays", lambda: _batch_arrays(([1.0], [0])), TypeError, "a batch must be"),
    ("batch a dict", lambda: _batch_arrays({"inputs": 1}), TypeError, "a batch must be"),
    ("sweep zero batches", lambda: sweep(TrainConfig(), batches=0), ValueError, "at least 1"),
    ("sweep str batches", lambda: sweep(TrainConfig(), batches="2"), TypeError, "integer"),
    ("sweep zero steps", lambda: sweep(TrainConfig(), steps=0), ValueError, "at least 1"),
    ("sweep too many batches", lambda: sweep(TrainConfig(batch_size=64), batches=100), ValueError, "the training set has"),
    ("load non-path", lambda: load_trace(3), TypeError, "needs a path"),
]


@pytest.mark.parametrize("name,call,exc,message", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_are_refused_clearly(name, call, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_attach_twice_and_remove_twice():
    model, opt, _ = past_tense_run(hidden=(4,), steps=1)
    tracer = Tracer(print).attach(model)
    with pytest.raises(RuntimeError, match="already attached"):
        tracer.attach(model)
    tracer.remove(); tracer.remove()
    assert not model.mlp["hidden1"]._forward_hooks, "every hook came off"


def test_resync_refuses_a_reused_layer():
    layer = Linear(4, 4, rng=0, dtype="float64")
    model = Sequential(a=layer, act=ReLU(), b=layer)
    batches = [(np.ones((2, 4)), np.array([0, 1]))]
    with pytest.raises(ValueError, match="every layer called once"):
        trace_pair(model, SGD(model.parameters(), lr=0.1), batches, compare="float64", resync=True)


def test_reused_layer_traces_each_call_free_running():
    layer = Linear(4, 4, rng=0, dtype="float64")
    model = Sequential(a=layer, act=ReLU(), b=layer)
    batches = [(np.random.default_rng(0).standard_normal((3, 4)), np.array([0, 1, 2]))]
    a, b = trace_pair(model, SGD(model.parameters(), lr=0.1), batches, compare="float64")
    assert (0, "a#1", "forward") in a and (0, "a#1", "act_grad") in a
    assert compare_traces(a, b).first_drift is None


# -- command line -------------------------------------------------------------------------------------------------
def _args(tmp_path, *extra):
    return add_trace_arguments(argparse.ArgumentParser()).parse_args(
        ["--compare", "float64", "--hidden", "8", "--batch-size", "8", "--out", str(tmp_path / "out"), *extra])


def test_trace_command_exit_codes_and_files(tmp_path, capsys, monkeypatch):
    assert trace_command(_args(tmp_path, "--json", "--batches", "2", "--steps", "2")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["first_drift"] is None and report["criterion"] == "float32 rounding" and report["rows"]
    assert (tmp_path / "out" / "comparison.json").is_file() and (tmp_path / "out" / "minitrain-b01.json").is_file()
    dropout_wrong_scale(monkeypatch)   # the float64 reference replays its own dropout: the bug shows
    assert trace_command(_args(tmp_path, "--json", "--dtype", "float64")) == 1
    fd = json.loads(capsys.readouterr().out)["first_drift"]
    assert (fd["probe"], fd["phase"]) == ("mlp.drop1", "forward") and set(fd) >= {"probe", "phase", "max_abs", "max_rel"}
    assert trace_command(_args(tmp_path, "--dtype", "float64")) == 1
    assert "first drift: batch 0 step 0 mlp.drop1 forward" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (("--batches", "0"), "batches must be at least 1"),
    (("--steps", "0"), "steps must be at least 1"),
    (("--dtype", "float16"), "float32 or float64"),
    (("--rtol", "-1"), "rtol"),
    (("--multiplier", "0"), "multiplier"),
    (("--optimizer", "lbfgs"), "optimizer"),
    (("--batch-size", "0"), "batch_size"),
    (("--batches", "500"), "the training set has"),
])
def test_trace_command_errors_are_one_line(tmp_path, capsys, extra, message):
    assert trace_command(_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_trace_command_out_is_a_file(tmp_path, capsys):
    (tmp_path / "out").write_text("x")
    assert trace_command(_args(tmp_path)) == 2
    assert "is a file" in capsys.readouterr().err


def test_compare_torch_without_torch_says_how_to_install(tmp_path, capsys, monkeypatch):
    import minitrain_inspect.trace as trace_mod
    monkeypatch.setattr(trace_mod, "torch_available", lambda: False)
    args = _args(tmp_path)
    args.compare = "torch"
    assert trace_command(args) == 2
    err = capsys.readouterr().err
    assert 'pip install "minitrain-inspect[torch]"' in err and err.count("\n") == 1


# -- regressions from the second adversarial review ----------------------------------------------------------------
def _one(values, dtype=np.float64, probe="mlp.hidden1", phase="forward"):
    return Trace([TraceEvent(0, probe, phase, np.asarray(values, dtype))])


NONFINITE_DRIFTS = [([1.0, 1.0], [1.0, np.inf]), ([np.inf], [-np.inf]), ([1e30], [-np.inf]), ([-np.inf], [np.inf]),
                    ([np.nan, 1.0], [1.0, np.nan]), ([np.nan], [1.0]), ([1.0], [np.nan]), ([np.inf], [np.nan])]
NONFINITE_AGREE = [([np.nan, 1.0], [np.nan, 1.0]), ([np.inf, -np.inf, 2.0], [np.inf, -np.inf, 2.0])]


@pytest.mark.parametrize("got,ref", NONFINITE_DRIFTS, ids=str)
def test_s1_compare_traces_sees_nonfinite_drifts(got, ref):
    comp = compare_traces(_one(got), _one(ref))
    assert comp.first_drift is not None, f"{got} against reference {ref} must drift"
    assert comp.first_drift["ratio"] == math.inf and comp.first_drift["norm_rel"] == math.inf


@pytest.mark.parametrize("got,ref", NONFINITE_AGREE, ids=str)
def test_s1_same_nans_and_signed_infs_agree(got, ref):
    assert compare_traces(_one(got), _one(ref)).first_drift is None
    assert compare_rounding(_one(got, np.float32), _one(ref)).first_drift is None


@pytest.mark.parametrize("got,ref", [([np.nan, 1.0], [np.nan, 100.0]),      # a shared NaN hides nothing else
                                     ([np.nan, 1.0], [1.0, np.nan]),        # NaNs at different positions
                                     ([1.0, 1.0], [1.0, np.inf]),           # finite against a reference inf
                                     ([-np.inf, 1.0], [np.inf, 1.0]),       # infs of opposite signs
                                     ([np.nan, 1.0, 2.0], [np.nan, 1.0, 2.5])], ids=str)
def test_s2_compare_rounding_nonfinite_elementwise(got, ref):
    comp = compare_rounding(_one(got, np.float32), _one(ref))
    assert comp.first_drift is not None, f"float32 {got} against float64 {ref} must drift"


def test_s3_rounding_mode_has_an_absolute_floor_and_reports_it(tmp_path, capsys):
    a, b = _one([1e-9, 2e-9], np.float32), _one([1.1e-9, 2e-9])          # 10% off, but far below any floor
    assert compare_rounding(a, b).first_drift is None, "near-zero values must not drift on rounding alone"
    assert compare_rounding(a, b, atol=0.0).first_drift is not None, "with no floor the relative test decides"
    comp = compare_rounding(a, b, multiplier=10, atol=3e-7)
    assert (comp.atol, comp.rtol, comp.criterion, comp.multiplier) == (3e-7, 10 * 2.0**-24, "float32 rounding", 10.0)
    assert trace_command(_args(tmp_path, "--json", "--atol", "3e-6", "--multiplier", "15")) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["atol"], report["rtol"], report["multiplier"]) == (3e-6, 15 * 2.0**-24, 15.0), report
    assert json.loads((tmp_path / "out" / "comparison.json").read_text())["atol"] == 3e-6


@pytest.mark.parametrize("extra,message", [
    (("--rtol", "1e-3"), "--rtol does not apply to float32 against --compare float64"),
    (("--dtype", "float64", "--multiplier", "5"), "--multiplier applies only to float32 against"),
])
def test_s3_flags_that_do_not_apply_are_refused(tmp_path, capsys, extra, message):
    assert trace_command(_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists(), "nothing is created before the flags are checked"


@pytest.fixture(scope="module")
def adam_float32_sweep():
    "Six batches of the reference model in float32 with Adam: batch 5 has near-zero gradients that Adam amplifies."
    return sweep(TrainConfig(progress=False), compare="float64", batches=6)


def test_s4_clean_float32_adam_is_not_blamed(adam_float32_sweep):
    res = adam_float32_sweep
    for a, b in res.traces:
        for comp in (compare_traces(a, b), compare_rounding(a, b)):
            assert comp.first_drift is None, f"clean float32 Adam blamed: {comp.first_drift}"
    rows = [r for a, b in res.traces for r in compare_traces(a, b).rows if r["phase"] == "param_after"]
    free = max(r["free_running"]["max_abs"] for r in rows)
    judged = max(r["max_abs"] for r in rows)
    assert free > 1e-5 > 50 * judged, f"the case must be the amplified one: free-running {free:.1e}, judged {judged:.1e}"
    assert all(r["note"] and "param_resync" in r["note"] for r in rows)


@pytest.mark.parametrize("compare", ["float64", "torch"])
def test_s4_adam_slip_is_still_found_in_float32(compare, monkeypatch):
    if compare == "torch":
        pytest.importorskip("torch")
    model, opt, batches = past_tense_run("float32", steps=2)
    clean_a, clean_b = trace_pair(model, opt, batches, compare=compare)
    assert compare_traces(clean_a, clean_b).first_drift is None
    adam_bias_correction_slip(monkeypatch)
    model, opt, batches = past_tense_run("float32", steps=2)
    a, b = trace_pair(model, opt, batches, compare=compare)
    for comp in ([compare_traces(a, clean_b)] + ([compare_rounding(a, clean_b)] if compare == "float64" else [])):
        assert _where(comp) == (0, "mlp.hidden1.weight", "param_after", "optimizer"), comp.first_drift


def test_s4_shadow_optimizer_changes_nothing():
    model, opt, batches = past_tense_run("float64", steps=2)
    twin_model, twin_opt, _ = past_tense_run("float64", steps=2)
    trace_pair(model, opt, batches, compare="float64")
    for batch in batches:
        minitrain_step(twin_model, build_run(TrainConfig())[2], twin_opt, batch.inputs, batch.targets)
    from minitrain_inspect.train import params_sha256
    assert params_sha256(model) == params_sha256(twin_model), "the shadow step must not touch the traced run"
    assert opt.steps == twin_opt.steps == 2 and all(np.array_equal(m1, m2) for m1, m2 in zip(opt.m, twin_opt.m))


def test_s6_eval_mode_is_refused():
    model, opt, batches = past_tense_run(hidden=(4,), steps=1)
    model.eval()
    with pytest.raises(ValueError, match="evaluation mode"):
        trace_pair(model, opt, batches)
    model.train()
    model.mlp["drop1"].eval()
    with pytest.raises(ValueError, match="mlp.drop1"):
        trace_pair(model, opt, batches)


def _listing(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_c1_rerun_replaces_the_whole_folder(tmp_path):
    assert trace_command(_args(tmp_path, "--json", "--batches", "2")) == 0
    assert trace_command(_args(tmp_path, "--json", "--batches", "1")) == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["comparison.json", "float64-b00.json", "float64-b00.npz", "minitrain-b00.json",
                     "minitrain-b00.npz"], f"stale files of the older run: {names}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging folder left behind"


def test_c1_interrupted_save_keeps_the_previous_run(tmp_path, monkeypatch):
    import minitrain_inspect.trace as trace_mod
    assert trace_command(_args(tmp_path, "--json", "--batches", "2")) == 0
    before = _listing(tmp_path / "out")
    calls = []
    real_save = trace_mod.save_trace

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_save(*args, **kw)

    monkeypatch.setattr(trace_mod, "save_trace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trace_command(_args(tmp_path, "--json", "--batches", "2", "--seed", "1"))
    assert _listing(tmp_path / "out") == before, "--out must hold the previous complete run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no staging folder left behind"


def test_c1_sigint_is_deferred_during_publication():
    import os
    import signal
    from minitrain_inspect.stats import sigint_deferred as _sigint_deferred
    done = []
    with pytest.raises(KeyboardInterrupt):
        with _sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("finished")
    assert done == ["finished"], "the block must complete before the interrupt is raised"


@pytest.mark.parametrize("extra", [("--batches", "0"), ("--batches", "100000"), ("--atol", "-1")])
def test_c1_failed_validation_creates_nothing(tmp_path, capsys, extra):
    args = _args(tmp_path, *extra)
    args.out = tmp_path / "new" / "deeper" / "out"
    assert trace_command(args) == 2
    assert not (tmp_path / "new").exists(), "a refused run must create no folder"


def test_c1_and_u1_diverging_run_one_line_nothing_created(tmp_path, capsys):
    import warnings
    args = _args(tmp_path, "--optimizer", "sgd", "--lr", "1000", "--momentum", "0", "--steps", "20",
                 "--hidden", "256", "256", "--batch-size", "64")
    args.out = tmp_path / "new" / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a NumPy RuntimeWarning would escape as an exception
        assert trace_command(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training diverged at batch 0, step " in err and "loss is nan" in err, err
    assert not (tmp_path / "new").exists(), "a failed run must leave no folder"


def test_c1_foreign_files_in_out_are_refused_not_deleted(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert trace_command(_args(tmp_path)) == 2
    assert "not a trace run's" in capsys.readouterr().err
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_c2_optimizer_over_another_model_is_a_clear_error():
    model, _, batches = past_tense_run(hidden=(4,), steps=1)
    other, _, _ = past_tense_run(hidden=(4,), steps=1)
    with pytest.raises(ValueError, match="not parameters of the model"):
        trace_pair(model, Adam(other.parameters()), batches)


def test_c3_compare_rounding_with_mismatched_shapes_is_a_noted_drift():
    comp = compare_rounding(_one([1.0, 2.0], np.float32), _one([1.0, 2.0, 3.0]))
    fd = comp.first_drift
    assert fd is not None and "shapes differ" in fd["note"] and fd["rounding_ratio"] == math.inf
    assert "shapes differ" in compare_traces(_one([1.0]), _one([1.0, 2.0])).first_drift["note"]


def test_u4_tracer_steps_must_be_iterable():
    with pytest.raises(TypeError, match="iterable of step numbers"):
        Tracer(TraceBuffer(), steps=5)


@pytest.mark.parametrize("value", [np.array(["abc"]), np.array([1 + 2j])], ids=["string", "complex"])
def test_u4_load_trace_names_the_dtype(tmp_path, value):
    save_trace(Trace([TraceEvent(0, "x", "forward", np.zeros(1))]), tmp_path, "t")
    manifest = json.loads((tmp_path / "t.json").read_text())
    manifest["events"][0].update(dtype=value.dtype.str, shape=list(value.shape))
    (tmp_path / "t.json").write_text(json.dumps(manifest))
    np.savez(tmp_path / "t.npz", e0=value)
    with pytest.raises(ValueError, match="t.json") as err:
        load_trace(tmp_path / "t.json")
    assert str(value.dtype) in str(err.value) and "not numeric" in str(err.value), err.value
    with pytest.raises(TypeError, match=f"dtype {value.dtype}"):
        Trace([TraceEvent(0, "x", "forward", value)])
