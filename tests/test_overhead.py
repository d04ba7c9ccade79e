"The overhead benchmark: PyTorch's full set equals the Inspector's, watching changes no run, the floor is counted right, the JSON and the note carry every figure, bad input is refused before work. Nothing here is timed."
import argparse
import json
import math
import sys

import numpy as np
import pytest

from minitrain_inspect.data import iterate_batches
from minitrain_inspect.inspect import EVERY_STEP, Inspector
from minitrain_inspect.losses import SoftmaxCrossEntropy
from minitrain_inspect.optim import Adam
from minitrain_inspect.overhead import (FLOOR_PARTS, FastaiHooks, FullSetHooks, TorchRun, TrainingRun, _summarise,
                                        add_overhead_arguments, floor_arrays, floor_bytes, lockstep, measure,
                                        overhead_command, read_seconds, results_markdown, run_benchmark,
                                        torch_training_step, torch_unit_health, with_torch_dropout)
from minitrain_inspect.train import (INPUT_FEATURES, MAX_PAST_LEN, N_SYMBOLS, OUTPUT_FEATURES, PastTenseModel,
                                     TrainConfig, run_data)
from minitrain_inspect.twin import TorchMissingError, torch_available

needs_torch = pytest.mark.skipif(not torch_available(), reason="PyTorch is not installed")
SMALL = TrainConfig(steps=4, hidden=(32, 32), batch_size=16, progress=False, eval_every=4)
JSON_KEYS = {"overhead", "overhead_every_step", "overhead_disabled", "overhead_budget", "overhead_plain",
             "overhead_plain_every_step", "torch_hooks_overhead",
             "torch_full_set_overhead", "torch_baseline_ms", "torch_vs_minitrain", "inspector_ahead_of_torch",
             "floor_fraction", "floor_ratio", "floor_bytes", "floor_ms", "floor_bytes_by_part", "baseline_ms",
             "median_ms", "spread", "scaling", "warnings", "blas_threads", "blas", "torch_threads", "machine", "date",
             "load", "steps", "repeats", "scaling_repeats"}


@pytest.fixture(scope="module")
def data():
    return run_data(SMALL)


def parse(*argv):
    return add_overhead_arguments(argparse.ArgumentParser()).parse_args(list(argv))


# -- the PyTorch side computes what the Inspector computes ------------------------------------------------------------
def _lockstep_pair(data, watcher_cls, steps=2):
    "minitrain with an every-step Inspector and its float32 twin with `watcher_cls`, on the same batches and masks."
    from minitrain_inspect.twin import record_masks, replay_masks, to_torch, torch_optimizer
    model = PastTenseModel(SMALL.hidden, SMALL.activation, SMALL.dropout, seed=0)
    twin = to_torch(model)
    opt = Adam(model.parameters(), lr=SMALL.lr)
    topt = torch_optimizer(opt, twin)
    loss_fn = SoftmaxCrossEntropy()
    inspector = Inspector(model, optimizer=opt, loss_fn=loss_fn, schedules=EVERY_STEP).attach()
    watcher = watcher_cls().attach(twin, topt)
    for batch in iterate_batches(data.train, SMALL.batch_size, steps, seed=0):
        inspector.label_batch(regular=batch.regular)
        with record_masks(model) as masks:
            model.zero_grad()
            n = len(batch.inputs)
            loss_fn(model(batch.inputs).reshape(n, MAX_PAST_LEN, N_SYMBOLS), batch.targets)
            model.backprop(loss_fn.backward().reshape(n, OUTPUT_FEATURES))
            opt.step()
        replay_masks(twin, masks)
        torch_training_step(twin, topt, batch, watcher)
    return model, twin, inspector, watcher


@needs_torch
def test_full_set_hooks_compute_the_inspectors_statistics(data):
    model, twin, inspector, watcher = _lockstep_pair(data, FullSetHooks)
    theirs, ours = set(watcher.history), set(inspector.history.keys())
    assert theirs == ours, f"only PyTorch: {sorted(theirs - ours)}; only the Inspector: {sorted(ours - theirs)}"
    prefixes = {key.split("/")[0] for key in ours}
    assert prefixes == {"loss", "activations", "act_grads", "gradients", "updates", "spectral", "units", "per_class"}
    for key, series in watcher.history.items():
        steps, values = inspector.history.get(key)
        assert [s for s, _ in series] == list(steps) == [0, 1], key
        for (_, theirs_value), our_value in zip(series, values):
            a, b = np.asarray(theirs_value, dtype=float), np.asarray(our_value, dtype=float)
            if key.startswith("spectral/"):     # power iteration on W and on W.T from different vectors (see below)
                np.testing.assert_allclose(a, b, rtol=5e-2, err_msg=key)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=key)


@needs_torch
def test_fastai_hooks_record_mean_std_near_zero_and_gradient_norms(data):
    _, twin, inspector, watcher = _lockstep_pair(data, FastaiHooks, steps=1)
    leaves = inspector.history.meta["layers"]
    for name in leaves:
        for field in ("mean", "std"):
            np.testing.assert_allclose(watcher.latest(f"activations/{name}/{field}"),
                                       inspector.history.get(f"activations/{name}/{field}")[1][-1], rtol=1e-4)
        assert 0 <= watcher.latest(f"activations/{name}/near_zero") <= 1
    for name in ("mlp.act1", "mlp.act2"):     # near zero (<= 0.05) includes every zero output
        assert watcher.latest(f"activations/{name}/near_zero") >= inspector.history.get(f"units/{name}/zero_share")[1][-1]
    for name, _ in twin.named_parameters():
        np.testing.assert_allclose(watcher.latest(f"gradients/{name}/l2"),
                                   inspector.history.get(f"gradients/{name}/l2")[1][-1], rtol=1e-4)


@needs_torch
def test_watchers_come_off_and_remove_twice_is_safe(data):
    _, twin, _, watcher = _lockstep_pair(data, FullSetHooks, steps=1)
    counts = {k: len(v) for k, v in watcher.history.items()}
    watcher.remove()
    watcher.remove()
    import torch
    with_torch_dropout(twin)(torch.zeros(2, INPUT_FEATURES)).sum().backward()   # a training-mode step, no hooks
    assert twin.training and all(p.grad is not None for p in twin.parameters())
    assert {k: len(v) for k, v in watcher.history.items()} == counts
    with pytest.raises(KeyError, match="nothing recorded"):
        watcher.latest("activations/nope/mean")


@needs_torch
def test_torch_spectral_norm_is_one_cached_power_iteration():
    import torch
    from minitrain_inspect.overhead import TorchSpectralNorm
    W = np.random.default_rng(1).standard_normal((40, 30))
    v = np.random.default_rng(0).standard_normal(30)
    v /= np.linalg.norm(v)
    reference = []
    for _ in range(33):                       # 30 warm-up iterations, then one per call
        u = W @ v
        u /= np.linalg.norm(u)
        v = W.T @ u
        reference.append(np.linalg.norm(v))
        v /= reference[-1]
    estimator = TorchSpectralNorm(warmup=30)
    got = [estimator.estimate(torch.from_numpy(W)) for _ in range(4)]
    np.testing.assert_allclose(got, reference[29:], rtol=1e-12)
    for _ in range(300):
        sigma = estimator.estimate(torch.from_numpy(W))
    assert abs(sigma - np.linalg.norm(W, 2)) / np.linalg.norm(W, 2) < 1e-3


@needs_torch
def test_unit_health_in_torch_counts_outliers_apart():
    import torch
    a = torch.tensor([[-1.0, 0.0, 4.0], [0.5, 9.0, 0.0]])
    dead, zero, hist, below, above = torch_unit_health(a, "relu", bins=4)
    assert (dead, zero, below, above) == (0.0, 0.5, 1 / 6, 1 / 6)
    np.testing.assert_allclose(hist, [3 / 6, 0, 0, 1 / 6])          # 0, 0.5, 0 in the first bin; 4.0 in the last
    assert math.isclose(sum(hist) + below + above, 1.0, rel_tol=1e-6)
    dead, sat, *_ = torch_unit_health(torch.tensor([[0.99, 0.0], [-0.98, 0.5]]), "tanh", bins=4)
    assert (dead, sat) == (0.5, 0.5)


# -- runs: watching changes nothing, steps are what is timed --------------------------------------------------------
@needs_torch
def test_measure_checks_that_watching_changes_no_run(data):
    result = measure(SMALL, data, ("baseline", "every_step", "torch", "torch_hooks", "torch_full"), repeats=1,
                     floor=True)
    assert set(result["times"]) == {"baseline", "every_step", "torch", "torch_hooks", "torch_full"}
    assert all(len(t) == 1 and t[0] > 0 for t in result["times"].values())
    assert result["floor_ms"][0] > 0 and set(result["floor_parts"]) == set(FLOOR_PARTS)
    digests = {h: TorchRun(SMALL, data, h).finish() for h in (None, "fastai", "full")}
    assert len(set(digests.values())) == 1, digests


def test_training_run_takes_its_setup_and_step_zero_before_the_clock(data):
    run = TrainingRun(SMALL, data, "every_step")
    assert run.inspector.step == 1                          # built, attached, and step 0 done in the constructor
    lockstep({"every_step": run}, SMALL.steps - 2, block=1)
    assert run.inspector.step == SMALL.steps - 1
    assert len(run.finish()) == 64


# -- the floor ------------------------------------------------------------------------------------------------------
def test_floor_bytes_counted_for_a_small_model():
    config = TrainConfig(hidden=(4,), batch_size=2, steps=3, progress=False)
    parts = floor_arrays(config)
    outputs = 3 * 2 * 4 + 2 * 2 * OUTPUT_FEATURES     # hidden1, act1, drop1: 2x4; output, copy: 2xOUT
    params = INPUT_FEATURES * 4 + 4 + 4 * OUTPUT_FEATURES + OUTPUT_FEATURES + INPUT_FEATURES * OUTPUT_FEATURES
    assert {k: sum(a.size for a in v) for k, v in parts.items()} == {
        "leaf outputs": outputs, "output gradients": outputs, "parameter gradients": params, "parameters": params}
    assert floor_bytes(parts) == 4 * 2 * (outputs + params)
    bigger = floor_arrays(TrainConfig(hidden=(4,), batch_size=6, steps=3, progress=False, dtype="float64"))
    assert floor_bytes(bigger) == 8 * 2 * (3 * outputs + params)   # float64, and the batch scales the outputs only
    assert read_seconds(parts["parameters"], passes=3) > 0


def test_summary_floor_figures_and_spread_warning():
    times = {"baseline": [2.0, 2.0, 2.0], "default": [2.1, 2.1, 2.1], "every_step": [2.4, 3.0, 2.6]}
    main = {"times": times, "cost": {}, "throttled": [], "floor_ms": [0.04, 0.05, 0.04],
            "floor_parts": {p: 1 << 20 for p in FLOOR_PARTS}}
    head = dict(steps=10, repeats=3, scaling_repeats=1, seed=0, blas_threads=1, blas="test: 1 thread", against=None,
                load=(0.5, 0.5))
    bench = _summarise(main, {"width": {}, "batch": {}}, head)
    assert math.isclose(bench["overhead_every_step"], 0.3) and math.isclose(bench["overhead"], 0.05)
    assert math.isclose(bench["floor_fraction"], 0.02) and bench["floor_bytes"] == 4 << 20
    assert math.isclose(bench["floor_ratio"], 15.0)          # per repeat 0.4/0.04, 1.0/0.05, 0.6/0.04: 10, 20, 15
    assert bench["warnings"] and "every_step (30.0)" in bench["warnings"][0] and "default" not in bench["warnings"][0]
    note = results_markdown(bench)
    assert note.count("Warning:") == 1 and "**BLAS threads: 1**" in note and "1.0% of a baseline step" not in note
    assert "Floor." in note and "4.00 MiB" in note and "Load average" in note
    assert bench["torch_full_set_overhead"] is None and bench["inspector_ahead_of_torch"] is None


# -- the command line -----------------------------------------------------------------------------------------------
TINY = ("--steps", "4", "--repeats", "1", "--widths", "--batches", "16", "--scaling-repeats", "1")


@needs_torch
def test_json_carries_every_figure_with_torch(capsys):
    assert overhead_command(parse(*TINY, "--against", "torch", "--json", "--quiet")) == 0
    out, err = capsys.readouterr()
    bench = json.loads(out)
    assert JSON_KEYS <= set(bench), sorted(JSON_KEYS - set(bench))
    for key in ("overhead", "overhead_every_step", "overhead_disabled", "torch_hooks_overhead",
                "torch_full_set_overhead", "floor_fraction", "floor_ratio"):
        assert isinstance(bench[key], float), (key, bench[key])
    assert 0 < bench["floor_fraction"] < 1 and bench["torch_threads"] == 1 and err == ""
    assert set(bench["scaling"]["batch"]) == {"16"} and bench["scaling"]["width"] == {}
    assert isinstance(bench["inspector_ahead_of_torch"], bool)


def test_without_against_the_torch_figures_are_null_and_progress_shows(capsys, tmp_path):
    note = tmp_path / "note.md"
    assert overhead_command(parse(*TINY, "--batches", "--json", "--out", str(note))) == 0
    out, err = capsys.readouterr()
    bench = json.loads(out)
    assert bench["torch_full_set_overhead"] is None and bench["torch_hooks_overhead"] is None
    assert "overhead" in err and f"written to {note}" in err        # the progress line, then where the note went
    assert note.read_text().startswith("# Inspector overhead")


def test_cpu_clock_times_the_main_thread_and_says_so(capsys, monkeypatch):
    "--clock cpu times the lockstep blocks by time.thread_time, and the note names that clock; it needs one BLAS thread."
    import minitrain_inspect.overhead as overhead
    calls = []
    def counting_thread_time():
        calls.append(1)
        return real()
    real = overhead.time.thread_time
    monkeypatch.setitem(overhead.CLOCKS, "cpu", (counting_thread_time, "CPU time of the main thread (time.thread_time)"))
    assert overhead_command(parse(*TINY, "--batches", "--clock", "cpu", "--quiet")) == 0
    note = capsys.readouterr().out
    assert calls and "t = mean CPU time of the main thread (time.thread_time) per timed step" in note
    with pytest.raises(ValueError, match="one BLAS thread"):
        run_benchmark(steps=4, repeats=1, widths=(), batches=(), clock="cpu", blas_threads=2)
    with pytest.raises(ValueError, match="'wall' or 'cpu'"):
        run_benchmark(steps=4, repeats=1, widths=(), batches=(), clock="sundial")


def test_against_torch_without_torch_prints_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)               # `import torch` now fails
    assert overhead_command(parse("--against", "torch", "--out", str(tmp_path / "r.md"))) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert 'pip install "minitrain-inspect[torch]"' in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TorchMissingError, match="minitrain-inspect"):
        run_benchmark(steps=4, repeats=1, widths=(), batches=(), against="torch")


def test_quick_settings_yield_to_explicit_flags():
    args = parse("--quick", "--steps", "7")
    assert args.quick and args.steps == 7 and args.repeats is None


BAD_CALLS = [
    dict(steps=2), dict(steps=True), dict(steps=3.5), dict(repeats=0), dict(width_repeats=0), dict(widths=(0,)),
    dict(widths=(1.5,)), dict(widths=(True,)), dict(batches=(-1,)), dict(batches=(10**6,)), dict(against="tf"),
    dict(variants=("default",)), dict(variants=("baseline", "nope")), dict(blas_threads=0),
]


@pytest.mark.parametrize("kwargs", BAD_CALLS, ids=lambda k: ",".join(f"{a}={b!r}" for a, b in k.items()))
def test_bad_benchmark_arguments_are_refused(kwargs):
    args = dict(steps=4, repeats=1, widths=(), batches=(), width_repeats=1) | kwargs
    with pytest.raises(ValueError):
        run_benchmark(**args)


def test_other_bad_inputs_are_refused(data, tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        lockstep({}, 0)
    with pytest.raises(ValueError, match="unknown variant"):
        TrainingRun(SMALL, data, "sometimes")
    with pytest.raises(ValueError, match="at least 1 pass"):
        read_seconds([np.ones(3)], passes=0)
    with pytest.raises(TypeError, match="TrainConfig"):
        floor_arrays({"hidden": (4,)})
    with pytest.raises(ValueError, match="steps"):
        overhead_command(parse("--steps", "2", "--quiet"))
    with pytest.raises(ValueError, match="folder"):
        overhead_command(parse(*TINY, "--out", str(tmp_path)))
    with pytest.raises(SystemExit):
        parse("--against", "tensorflow")
    if torch_available():
        import torch
        with pytest.raises(ValueError, match="hooks"):
            TorchRun(SMALL, data, "tensorboard")
        with pytest.raises(ValueError, match="unit health"):
            torch_unit_health(torch.zeros(2, 2), "sigmoid")


def _where_time_goes():
    "The benchmark script benchmarks/where_time_goes.py, imported by path (benchmarks/ is not a package)."
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "where_time_goes.py"
    spec = importlib.util.spec_from_file_location("where_time_goes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_where_time_goes_prints_both_tables_and_leaves_the_variants_as_they_were(capsys):
    from minitrain_inspect.overhead import VARIANTS
    before = dict(VARIANTS)
    script = _where_time_goes()
    assert script.main(["--steps", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("| nothing_due |", "| only_units |", "| every_step |", "| gradients | (256, 256) |",
                "| activations | (64, 256) |", "| act_grads |"):
        assert row in out, f"expected a row starting {row!r} in the benchmark's tables, got:\n{out}"
    assert VARIANTS == before, "the script must take its extra variants away again"
    from minitrain_inspect.inspect import TensorPanel
    assert TensorPanel.measure.__name__ == "measure" and TensorPanel.measure.__qualname__ == "TensorPanel.measure", \
        "the script must put TensorPanel.measure back"
    with pytest.raises(SystemExit):
        script.main(["--steps", "2"])


@pytest.mark.skipif(not torch_available(), reason="needs PyTorch")
def test_where_time_goes_times_torch_moments_against_var_mean():
    script = _where_time_goes()
    lines = script.torch_moments_table(shapes=((4, 8), (3, 5)), repeats=3)
    assert lines[0].startswith("| shape | torch_moments (two passes)") and len(lines) == 2 + 2, lines
    assert lines[2].startswith("| (4, 8) | ") and lines[3].startswith("| (3, 5) | ") and lines[3].endswith("x |"), lines

