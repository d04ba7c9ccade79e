"""One Inspector over a data-parallel run (14b_ddp): the merge across ranks equals the union's statistics, one history
written by rank 0, the collective early stop, a failing rank named, the local gradient norms. The runs with several
ranks are separate processes (subprocess) on 127.0.0.1 with gloo, each bounded in time; `launch` kills what remains."""
import json
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from minitrain_inspect.ddp import (DDP_FLUSH_EVERY, DEMO_SPEC, EMPTY_ROW, cut_gathered, differing, loss_points, loss_spread,
                                   merge_row_block, merge_rows, rank0_rows, row_moments, run_ranks, shard_values, spread_points,
                                   stop_reason, sum_across, worker_result)
from minitrain_inspect.panels import History
from minitrain_inspect.stats import TensorMoments

# Seconds for a whole run of 2 or 3 processes. Budget: a rank costs about 3.3 CPU-s (importing torch most of it), a run
# of 3 about 5 s wall on quiet cores. It must hold on 2 cores shared with ~15 runnable processes (four helpers and busy
# loops, as seen here), where a 3-rank run took up to 147 s (20 s of it the interpreter's teardown, which the workers now
# skip) against the earlier limit of 150 s: that was the flake. The limit is twice the worst run seen under that load.
RUN_TIMEOUT = 240.0


def exact_stats(values) -> tuple[Fraction, Fraction, float]:
    "(mean, sample variance, kappa) of float64 `values`, exactly (fractions); kappa = 1 + mean²/var."
    xs = [Fraction(float(v)) for v in values]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return mean, var, float(1 + mean * mean / var)


def rel(a: float, exact: Fraction) -> float:
    return float(abs(Fraction(a) - exact) / abs(exact))


# ---------------------------------------------------------------- in one process: the rows and their merge
torch = pytest.importorskip("torch")
from minitrain_inspect.ddp import residual_row, DDPInspector          # noqa: E402
from minitrain_inspect.torch_inspect import host_moments, moments_row  # noqa: E402


@pytest.mark.parametrize("offset", [0.0, 1e8, -3e12])
@pytest.mark.parametrize("sizes", [(50, 50), (1, 400, 37), (300, 2, 2, 90)])
def test_merge_rows_equals_union(offset, sizes):
    "Rows merged in rank order equal the union's exact statistics within 1e-12·κ, and are as exact as one process's."
    shards = [shard_values(7, r, 0, n, offset) for r, n in enumerate(sizes)]
    union = np.concatenate(shards)
    mean, var, kappa = exact_stats(union)
    merged = merge_rows([residual_row(torch.from_numpy(s)).tolist() for s in shards])
    single = host_moments(moments_row(torch.from_numpy(union)).tolist())      # one process, the whole union at once
    assert merged.n == union.size
    assert rel(merged.var, var) <= 1e-12 * kappa
    assert float(abs(Fraction(merged.mean) - mean)) <= 1e-12 * float(abs(mean) + var ** 0.5)
    # at least as exact as one process's own statistics of the same values (up to the final rounding of each)
    assert rel(merged.var, var) <= rel(single.var, var) + 4 * 2.0 ** -53
    scale = math.fsum(np.abs(union)) / union.size      # mean(|x|): the scale of a mean's rounding (08_stats, MEAN_ERROR)
    assert float(abs(Fraction(merged.mean) - mean)) <= float(abs(Fraction(single.mean) - mean)) + 4 * 2.0 ** -53 * scale


def test_sum_of_sums_fails_at_offset():
    "The naive all_reduce of (n, Σx, Σx²) is far off at an offset of 1e8, where the rows' merge is exact."
    shards = [shard_values(3, r, 0, n, 1e8) for r, n in enumerate((200, 333))]
    union = np.concatenate(shards)
    _, var, _ = exact_stats(union)
    s1 = sum(float(torch.from_numpy(s).sum()) for s in shards)
    s2 = sum(float(torch.from_numpy(s).square().sum()) for s in shards)
    naive = (s2 - s1 * s1 / union.size) / (union.size - 1)
    assert rel(naive, var) > 0.5
    assert rel(merge_rows([residual_row(torch.from_numpy(s)).tolist() for s in shards]).var, var) <= 1e-12


def test_rows_with_nonfinite_values_and_empty_shards():
    "NaN and inf are counted across ranks, a rank with no finite value adds nothing, an empty shard changes nothing."
    a = torch.tensor([1.0, float("nan"), 3.0, float("inf")], dtype=torch.float64)
    b = torch.tensor([float("nan")], dtype=torch.float64)
    c = torch.zeros(0, dtype=torch.float64)
    tm = merge_rows([residual_row(t).tolist() for t in (a, b, c)])
    assert (tm.n, tm.mean, tm.nonfinite, tm.nan, tm.min, tm.max) == (2, 2.0, 3, 2, 1.0, 3.0)
    assert row_moments(residual_row(b).tolist()).n == 0


def test_stop_reason_names_rank_and_step():
    assert stop_reason([0, 0], [(4, [1.0, math.inf])]) == "training loss not finite on rank 1 at step 4"
    assert stop_reason([0, 0, 0], [(4, [1.0, 1.0, 1.0])]) is None


def test_single_process_without_group_is_a_run_of_one(tmp_path):
    "Without a process group the Inspector describes its own process: world size 1, the same panels, no collective."
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with DDPInspector(model, optimizer=opt, loss_fn=torch.nn.CrossEntropyLoss(), flush_every=3).attach() as insp:
        for step in range(7):
            x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
            opt.zero_grad()
            insp.loss_fn(model(x), y).backward()
            opt.step()
    assert insp.world_size == 1 and insp.history.meta["ddp"]["world_size"] == 1
    assert insp.history.get("loss/train")[0].tolist() == list(range(7))
    assert insp.history.get("ranks/grad_norm/rank0")[0].size == insp.history.get("ranks/grad_norm/global")[0].size > 0
    # one rank: its local gradient is the gradient
    np.testing.assert_allclose(insp.history.get("ranks/grad_norm/rank0")[1], insp.history.get("ranks/grad_norm/global")[1],
                               rtol=1e-12)
    with pytest.raises(TypeError, match="DDPOps"):
        DDPInspector(model, optimizer=opt, ops=object())


def test_imports_without_torch():
    "The module imports without PyTorch, and its host-side merge works."
    code = ("import sys; sys.modules['torch'] = None\n"
            "import minitrain_inspect.ddp as d\n"
            "print(d.merge_rows([[2, 1.0, 2.0, 0.0, 2.0, 0, 0, 0.0], [1, 4.0, 0.0, 4.0, 4.0, 0, 0, 0.0]]).n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"


# ---------------------------------------------------------------- several processes on loopback
def run(spec: dict) -> list:
    "Run the workers of `spec`; (rc, result, stderr) per rank."
    return [(rc, worker_result(out), err) for rc, out, err in run_ranks(spec, RUN_TIMEOUT)]


def ok(results) -> list:
    for rank, (rc, result, err) in enumerate(results):
        assert rc == 0 and result is not None, f"rank {rank} exited {rc}: {err[-3000:]}"
    return [r for _, r, _ in results]


@pytest.mark.parametrize("world,batch,offset", [(2, [64, 64], 0.0), (2, [1, 150], 1e8), (3, [40, 7, 91], 1e8)])
def test_merged_snapshot_equals_union(tmp_path, world, batch, offset):
    "The snapshot rank 0 writes equals the statistics of every rank's data together (equal and uneven shards)."
    spec = {"world": world, "batch": batch, "offset": offset, "model": "probe", "steps": 1, "seed": 5,
            "schedules": {"activations": 1, "gradients": 1}, "out": str(tmp_path)}
    ok(run(spec))
    snapshot = json.loads((tmp_path / "snapshot.json").read_text())
    union = np.concatenate([shard_values(5, r, 0, n, offset) for r, n in enumerate(batch)])
    mean, var, kappa = exact_stats(union)
    got = snapshot["Probe"]
    assert got["n"] == union.size
    assert rel(got["var"], var) <= 1e-12 * kappa
    single = host_moments(moments_row(torch.from_numpy(union)).tolist())
    assert rel(got["var"], var) <= rel(single.var, var) + 4 * 2.0 ** -53       # as exact as one process's own
    scale = math.fsum(np.abs(union)) / union.size
    assert float(abs(Fraction(got["mean"]) - mean)) <= float(abs(Fraction(single.mean) - mean)) + 4 * 2.0 ** -53 * scale


def test_a_step_of_accumulated_batches_is_one_point_of_them_all(tmp_path):
    "Two batches per step on each rank (gradient accumulation): the step's point is the statistics of all four together."
    spec = {"world": 2, "batch": [5, 9], "offset": 1e8, "model": "probe", "steps": 1, "seed": 5, "accum": 2,
            "schedules": {"activations": 1, "gradients": 1}, "out": str(tmp_path)}
    ok(run(spec))
    union = np.concatenate([shard_values(5, r, step, n, 1e8) for r, n in enumerate(spec["batch"]) for step in (0, 1)])
    mean, var, kappa = exact_stats(union)
    history = History.load_jsonl(tmp_path / "history.jsonl")
    steps, means = history.get("activations/Probe/mean")
    _, stds = history.get("activations/Probe/std")
    assert steps.tolist() == [0]
    scale = math.fsum(np.abs(union)) / union.size
    assert float(abs(Fraction(means[0]) - mean)) <= 1e-10 * scale
    assert rel(stds[0] ** 2, var) <= 1e-10 * kappa
    assert json.loads((tmp_path / "snapshot.json").read_text())["Probe"]["n"] == union.size


def test_ranks_that_call_a_module_a_different_number_of_times_get_a_named_error():
    "Rank 0 calls its model once more per step: the gathered layouts differ, and every rank says so, none aborts or hangs."
    spec = {"world": 2, "batch": [4, 4], "model": "probe", "steps": 3, "flush_every": 1, "extra_calls": [1, 0],
            "schedules": {"activations": 1}}
    results = run(spec)
    for rank, (rc, _, err) in enumerate(results):
        assert rc not in (0, -6), f"rank {rank} exited {rc}"                  # -6: SIGABRT, gloo's size mismatch
        assert "packed a different layout from rank 0" in err and "called a different number of times" in err, err[-2000:]


def test_one_history_from_rank_zero(tmp_path):
    "Rank 0 writes history, snapshot and dashboard; the other ranks write nothing; the history has the world and the spread."
    results = ok(run({"world": 2, "batch": [16, 48], "steps": 12, "flush_every": 5, "out": str(tmp_path)}))
    assert results[1]["wrote"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dashboard.png", "history.jsonl", "snapshot.json"]
    history = History.load_jsonl(tmp_path / "history.jsonl")
    assert history.meta["ddp"]["world_size"] == 2
    lo, hi = history.get("ranks/train/min")[1], history.get("ranks/train/max")[1]
    mean = history.get("loss/train")[1]
    assert lo.size == mean.size == 12 and (lo <= mean).all() and (mean <= hi).all() and (lo < hi).any()
    assert any(n.startswith("ranks: 2 workers; rank ") for n in history.meta["notes"])
    # the histogram of the ReLU layer, summed over ranks: every seen output falls in a bin, below or above
    hist, below, above = (history.get(f"units/1/{f}")[1] for f in ("histogram", "below", "above"))
    assert hist.shape[0] > 0
    np.testing.assert_allclose(hist.sum(axis=1) + below + above, 1.0, rtol=0, atol=1e-12)
    # every rank holds the same merged loss
    assert results[0]["loss"] == results[1]["loss"]
    # local norms, one series per rank, differ from the averaged gradient's norm, which is at most their mean
    local = [history.get(f"ranks/grad_norm/rank{r}")[1] for r in range(2)]
    total = history.get("ranks/grad_norm/global")[1]
    assert total.size == local[0].size > 0 and not np.allclose(local[0], local[1])
    assert (total <= (local[0] + local[1]) / 2 * (1 + 1e-12)).all()


@pytest.mark.parametrize("world", [2, 3])
def test_nan_on_one_rank_stops_every_rank_at_the_same_step(world):
    "A NaN injected into one rank's batch stops every rank at the next flush, the same step, no rank left waiting."
    spec = {"world": world, "batch": [8] * world, "steps": 40, "flush_every": 10, "nan_at": [world - 1, 5]}
    results = ok(run(spec))
    assert {r["steps_run"] for r in results} == {10}
    assert {r["stopped"]["step"] for r in results} == {9}
    assert {r["stopped"]["reason"] for r in results} == {f"training loss not finite on rank {world - 1} at step 5"}


@pytest.mark.parametrize("failing, at", [(1, 3), (0, 3), (1, 6)])
def test_a_raising_rank_is_named_and_nobody_hangs(failing, at):
    """A rank that raises mid-run ends the run within the timeout; the other rank's error names it. At step 6, after the
    loop of 6 steps, the other rank is in the closing flush (which gave a raw gloo error before)."""
    results = run({"world": 2, "batch": [8, 8], "steps": 30 if at < 6 else 6, "raise_at": [failing, at], "timeout": 20.0})
    (rc_bad, _, err_bad), (rc_other, _, err_other) = results[failing], results[1 - failing]
    assert rc_bad not in (0, None) and f"injected failure on rank {failing} at step {at}" in err_bad
    assert rc_other not in (0, None), "the surviving rank did not fail"
    assert rc_other != -9, "the surviving rank hung until launch killed it"
    assert "RankFailure" in err_other and f"rank {failing}" in err_other.split("RankFailure")[-1]


def test_ranks_of_very_different_speeds_agree():
    "A slow rank (its steps 20x longer) and a fast one flush and merge in step: same history, no deadlock."
    results = ok(run({"world": 2, "batch": [8, 8], "steps": 25, "flush_every": 5, "sleep": [1, 0.02]}))
    assert results[0]["loss"] == results[1]["loss"] and len(results[0]["flush_ms"]) == len(results[1]["flush_ms"]) > 0


# ---------------------------------------------------------------- properties of the merge, and the command
from hypothesis import given, settings, strategies as st  # noqa: E402


@given(st.lists(st.integers(0, 60), min_size=1, max_size=6).filter(lambda s: sum(s) >= 2),
       st.sampled_from([0.0, 1e8, -7.5e5]), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=40, deadline=None)
def test_any_split_merges_to_the_union(sizes, offset, seed):
    "However the data is split across ranks (empty ranks included), the merge equals the union's exact statistics."
    shards = [shard_values(seed, r, 0, n, offset) for r, n in enumerate(sizes)]
    union = np.concatenate(shards)
    mean, var, kappa = exact_stats(union)
    merged = merge_rows([residual_row(torch.from_numpy(s)).tolist() for s in shards])
    assert merged.n == union.size
    assert rel(merged.var, var) <= 1e-12 * kappa
    single = host_moments(moments_row(torch.from_numpy(union)).tolist())
    assert rel(merged.var, var) <= rel(single.var, var) + 4 * 2.0 ** -53


@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=60, deadline=None)
def test_block_merge_is_merge_rows_bit_for_bit(world, tensors, seed):
    "The vectorised merge of a flush gives the very bits `merge_rows` gives tensor by tensor: empty, non-finite, extreme."
    rng = np.random.default_rng(seed)
    block = []
    for _ in range(world):
        rows = []
        for _ in range(tensors):
            x = torch.from_numpy(rng.choice([0.0, 1e8, -3e12, 1e200, -1e300]) + rng.choice([1.0, 1e-3, 1e-200])
                                 * rng.standard_normal(int(rng.integers(0, 12))))
            if x.numel() and rng.random() < 0.2:
                x[0] = rng.choice([math.nan, math.inf])
            rows.append(residual_row(x).tolist())
        block.append(rows)
    assert repr(merge_row_block(block)) == repr([merge_rows([rank[t] for rank in block]) for t in range(tensors)])


@given(st.integers(1, 5), st.integers(0, 30), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=60, deadline=None)
def test_loss_spread_of_a_flush_is_loss_points_step_by_step(world, steps, seed):
    "Every step's mean, min, max and worst rank computed at once are `loss_points`' own (NaN, inf, ties and signed zeros)."
    rng = np.random.default_rng(seed)
    block = rng.choice([0.25, 1.0, 3.5, 0.0, -0.0, 1e308, math.nan, math.inf, -math.inf], size=(world, steps),
                       p=[0.2, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])
    keys = [rng.choice(["loss/train", "loss/val"]) for _ in range(steps)]
    try:
        expected = [loss_points(key, column) for key, column in zip(keys, block.T.tolist())]
    except OverflowError:        # math.fsum of 1e308 + 1e308: both raise alike
        with pytest.raises(OverflowError):
            loss_spread(block)
        return
    assert repr(spread_points(keys, loss_spread(block))) == repr(expected)


@given(st.integers(1, 5), st.integers(0, 6), st.integers(0, 2 ** 32 - 1))
@settings(max_examples=40, deadline=None)
def test_other_ranks_made_empty_merge_to_rank_zeros_own(world, tensors, seed):
    "The gradients' rows (equal on every rank) ride in the one block merge as rank 0's row beside empty ones: rank 0's bits."
    rng = np.random.default_rng(seed)
    block = np.array([[residual_row(torch.from_numpy(rng.choice([0.0, 1e8, -1e300]) + rng.standard_normal(int(rng.integers(0, 9)))
                                                     * rng.choice([1.0, 1e-200]))).tolist() for _ in range(tensors)]
                      for _ in range(world)]).reshape(world, -1)
    assert repr(merge_row_block(rank0_rows(block))) == repr(merge_row_block(block[:1]))
    assert repr(merge_row_block(block[:1])) == repr([merge_rows([block[0, 8 * t:8 * t + 8].tolist()]) for t in range(tensors)])
    assert rank0_rows(block)[1:].tolist() == [list(EMPTY_ROW) * tensors] * (world - 1)


def test_unpacked_moments_fold_the_merged_moments_into_the_panels_state():
    "Every merged tensor goes back as merged_points of the panel's own state and keys: TensorMoments from the merged row, or merge_rows' where extreme."
    from minitrain_inspect.ddp import DDPReplace, merged_numbers, merged_points, numbers_moments
    from minitrain_inspect.stats import fold_moments, new_state
    from minitrain_inspect.torch_inspect import Later, moment_points
    import functools

    class Kept:
        pending = []
    panel, keys = Kept(), [("activations/a/mean", lambda tm: tm.mean), ("activations/a/n", lambda tm: tm.n)]
    ordinary = [residual_row(torch.tensor(v, dtype=torch.float64)).tolist() for v in ([1.0, 2.0, 4.0], [3.0, float("nan")])]
    extreme = [[1, 1e300, 0.0, 1e300, 1e300, 0, 0, 0.0], [1, -1e300, 0.0, -1e300, -1e300, 0, 0, 0.0]]   # means 2e300 apart
    states = [new_state(), new_state()]
    panel.pending = [(None, 7, Later(functools.partial(moment_points, st, keys, "activations/a/nonfinite"), (None,)))
                     for st in states]
    entries = [(panel, i, None, 7, value) for i, (_, _, value) in enumerate(panel.pending)]
    block = np.array([ordinary[r] + extreme[r] for r in range(2)])
    DDPReplace()._unpack_moments(entries, block)
    numbers, through = merged_numbers(block)
    assert list(through) == [1]
    plain, far = (value for _, _, value in panel.pending)
    assert plain.tensors == far.tensors == () and plain.finish.func is far.finish.func is merged_points
    assert plain.finish.args[:3] == (states[0], keys, "activations/a/nonfinite") and plain.finish.args[3] == numbers_moments(numbers[0])
    assert far.finish.args[3] == merge_rows([extreme[0], extreme[1]])
    points = plain.finish()                          # what 14a's flush does with it: folds it, gives the points
    assert [key for key, _ in points] == ["activations/a/mean", "activations/a/n", "activations/a/nonfinite"]
    assert points[1:] == [("activations/a/n", 4), ("activations/a/nonfinite", 1)] and points[0][1] == pytest.approx(2.5, rel=4 * 2.0 ** -52)   # a few roundings of a Chan step
    expected = new_state()
    fold_moments(expected, numbers_moments(numbers[0]))
    assert states[0] == expected
    assert far.finish()[1] == ("activations/a/n", 2) and states[1]["n"] == 2


def test_merge_keeps_m2_beyond_float64_range():
    "Ranks whose data lie at 1e±200: each row's norm squares beyond float64; the merge keeps M2 scaled, the std exact."
    from fractions import Fraction
    rng = np.random.default_rng(3)
    for scale in (1e-200, 1e200):
        shards = [rng.standard_normal(size) * scale + 0.5 * scale for size in (40, 25, 1)]
        block = np.array([residual_row(torch.from_numpy(s)).tolist() for s in shards])
        union = [Fraction(float(v)) for s in shards for v in s]
        mean = sum(union) / len(union)
        exact_var = sum((v - mean) ** 2 for v in union) / (len(union) - 1)
        for tm in (merge_rows(block.tolist()), merge_row_block(block[:, None, :].reshape(3, 8))[0]):
            assert tm.n == 66 and tm.m2_exp != 0
            assert abs(Fraction(tm.std) ** 2 / exact_var - 1) <= 1e-12, (scale, tm)


def test_gathered_array_cut_and_compared_by_column():
    "The gathered array is cut into consecutive blocks of columns; a value differs if any rank's numbers differ (NaN too)."
    ranks = np.arange(24.0).reshape(2, 12)
    assert [b.shape for b in cut_gathered(ranks, 2, [8, 0, 1, 1])] == [(2, 8), (2, 0), (2, 1), (2, 1)]
    assert cut_gathered(ranks, 2, [8, 0, 1, 1])[3].tolist() == [[11.0], [23.0]]
    same = np.array([[1.0] * 8 + [2.0] * 8 + [math.nan] * 8, [1.0] * 8 + [2.0] * 7 + [3.0] + [math.nan] * 8])
    assert differing(same) == [1, 2] and differing(same[:1]) == [] and differing(np.zeros((3, 0))) == []


def test_sums_added_in_rank_order_and_default_cadence():
    assert sum_across([[1.0, 2.0], [0.5, 4.0]]) == [1.5, 6.0] and sum_across([[], []]) == []
    model = torch.nn.Linear(2, 2)
    assert DDPInspector(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).flush_every == DDP_FLUSH_EVERY == 50


def test_ddp_demo_command(tmp_path, capsys):
    "ddp-demo --world 2 writes one dashboard of the whole run and prints merged and per-rank figures; bad flags: one line."
    from minitrain_inspect.ddp import ddp_demo_main
    assert ddp_demo_main(["--world", "2", "--steps", "12", "--batch", "8", "24", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks on 127.0.0.1" in out and "per rank rank 0 " in out and "rank 1 " in out and "merge cost" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dashboard.png", "history.jsonl", "snapshot.json"]
    for argv, words in ((["--world", "0"], "--world"), (["--world", "2", "--batch", "1", "2", "3"], "--batch"),
                        (["--world", "2", "--nan-at", "5", "1"], "--nan-at"),
                        (["--world", "2", "--steps", "3", "--nan-at", "1", "50"], "--nan-at step 50")):
        assert ddp_demo_main(argv + ["--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1


def test_budget_guard_thins_collectively():
    "Ranks whose panels cost very differently (batches of 4 and 2048) thin to the same strides, at the same steps."
    results = ok(run({"world": 2, "batch": [4, 2048], "steps": 120, "flush_every": 10, "budget": 0.02, "width": 64,
                      "schedules": {"activations": 1, "gradients": 1, "units": 1}}))
    assert results[0]["strides"] == results[1]["strides"]
    assert results[0]["throttled"] == results[1]["throttled"] and results[0]["throttled"], "the guard never thinned"
    assert max(results[0]["strides"].values()) > 1


def test_per_group_loss_goes_through_the_summed_path():
    "Per-group sums and counts travel in the all_reduce part: one process gives each group's mean loss, as 14a_torch does."
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 3, 0, 1])
    groups = torch.tensor([0, 0, 1, 1, 1, 0])
    with DDPInspector(model, optimizer=opt, loss_fn=loss_fn, flush_every=2).attach() as insp:
        for _ in range(2):
            insp.label_batch(groups, names=("a", "b"))
            opt.zero_grad()
            per_example = loss_fn(model(x), y)
            per_example.mean().backward()
            opt.step()
    per_example = per_example.detach().double()
    for g, name in enumerate(("a", "b")):
        steps, values = insp.history.get(f"per_class/{name}")
        assert steps.tolist() == [0, 1]
        np.testing.assert_allclose(values, float(per_example[groups == g].mean()), rtol=1e-14)


def test_merge_row_block_refuses_what_is_not_rows():
    "No ranks, or rows that are not whole rows of ROW_WIDTH numbers, are refused in one line naming the shape."
    for block in ([], [[1.0, 2.0, 3.0]]):
        with pytest.raises(ValueError, match="one row of 8 numbers"):
            merge_row_block(block)


def test_worker_command_exits_at_once_but_ddp_worker_main_returns():
    "Only the worker process skips the interpreter's teardown; `ddp_worker_main` itself returns to its caller."
    import inspect
    from minitrain_inspect.ddp import ddp_worker_main, worker_command
    assert "os._exit(0)" in worker_command({"rank": 0})[2]
    assert "_exit" not in inspect.getsource(ddp_worker_main)


@pytest.mark.parametrize("n", [-1.0, 2.5, math.nan])
def test_rows_with_counts_that_are_not_counts_are_refused(n):
    "A corrupted row (n = -1, 2.5 or NaN) was merged into nonsense; both merges refuse it by name."
    row = [n, 1.0, 0.0, 1.0, 1.0, 0, 0, 0.0]
    with pytest.raises(ValueError, match="must be whole numbers >= 0"):
        merge_rows([row])
    with pytest.raises(ValueError, match="must be whole numbers >= 0"):
        merge_row_block(np.array([row]))
