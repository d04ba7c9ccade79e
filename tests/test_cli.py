"The console script, run as a user would: a subprocess. Bad paths, bad flags, Ctrl-C, thread settings."
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitrain_inspect import __version__

# The console script installed beside this interpreter (the project's virtual environment), else on PATH.
_beside = Path(sys.executable).with_name("minitrain-inspect")
SCRIPT = str(_beside) if _beside.exists() else shutil.which("minitrain-inspect")
RUN_FILES = ["dashboard.png", "diagnosis.json", "history.jsonl", "results.md", "snapshot.json"]
# Far more steps than the timeout allows: a command that reaches training before failing shows up as a timeout.
FOREVER = "10000000"


def run(*args, timeout=300, env=None, cwd=None):
    assert SCRIPT, "the minitrain-inspect console script is not installed"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def assert_one_line_error(r, words=""):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("minitrain-inspect: error:"), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    assert words in r.stderr, (words, r.stderr)


def test_version():
    r = run("--version")
    assert (r.returncode, r.stdout) == (0, f"minitrain-inspect {__version__}\n")


def test_train_json_is_reproducible():
    first = run("train", "--steps", "40", "--seed", "2", "--json", "--quiet")
    second = run("train", "--steps", "40", "--seed", "2", "--json", "--quiet")
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["steps"] == 40 and set(a["accuracy"]) >= {"regular_val", "irregular_train"}
    assert isinstance(a["final_loss"], float) and len(a["params_sha256"]) == 64
    assert a["params_sha256"] == b["params_sha256"]


def test_same_hash_whatever_the_environment_says_about_threads():
    "Training is held to --blas-threads (default 1) inside the package: the environment's setting does not matter."
    digests = set()
    for threads in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        r = run("train", "--steps", "30", "--json", "--quiet", env=env)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["config"]["blas_threads"] == 1
        digests.add(summary["params_sha256"])
    assert len(digests) == 1, digests


def test_blas_threads_flag_reaches_the_config():
    r = run("train", "--steps", "3", "--json", "--quiet", "--blas-threads", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["blas_threads"] == 2


def test_inspect_flag_adds_snapshot_and_changes_nothing():
    plain = json.loads(run("train", "--steps", "30", "--json", "--quiet").stdout)
    inspected = json.loads(run("train", "--steps", "30", "--json", "--quiet", "--inspect").stdout)
    assert inspected["params_sha256"] == plain["params_sha256"]
    assert "snapshot" in inspected and "snapshot" not in plain
    assert "mlp.act1" in inspected["snapshot"]
    assert "inspect" not in inspected["config"], "--inspect is a flag of the command line, not of TrainConfig"


@pytest.mark.parametrize("args,message", [
    (("--steps", "-3"), "steps must be at least 0"),
    (("--batch-size", "999999"), "larger than the data"),
    (("--optimizer", "lbfgs"), "optimizer must be"),
    (("--steps", "many"), "invalid int value"),
    (("--hidden", "0"), "hidden width"),
    (("--blas-threads", "0"), "--blas-threads must be at least 1"),
    (("--blas-threads", "two"), "invalid int value"),
])
def test_bad_input_is_one_line(args, message):
    assert_one_line_error(run("train", "--quiet", *args), message)


def test_help_lists_flags():
    r = run("train", "--help")
    assert r.returncode == 0
    for flag in ("--steps", "--seed", "--json", "--inspect", "--quiet", "--blas-threads"):
        assert flag in r.stdout
    top = run("--help")
    for word in ("--version", "train", "demo", "dashboard", "overhead", "release", "grade", "mutants", "docs"):
        assert word in top.stdout


def _bad_outputs(tmp_path):
    "Output paths that cannot be used, by command; each must be refused before any work."
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    cases = [
        ("demo", "--out", "/proc/x"),                           # a folder that cannot be created
        ("demo", "--out", str(a_file)),                         # a file where a folder is wanted
        ("demo", "--out", str(a_file / "sub")),                 # a folder under a file
        ("overhead", "--out", "/proc/x/results.md"),            # a file in a folder that does not exist
        ("overhead", "--out", "/proc/results.md"),              # a folder where no file can be created
        ("overhead", "--out", str(tmp_path)),                   # a folder where a file is wanted
        ("overhead", "--out", str(a_file / "results.md")),      # a file under a file
        ("dashboard", str(a_file), "--out", "/proc/x.png"),
        ("dashboard", str(a_file), "--out", str(tmp_path)),
    ]
    if os.geteuid() != 0:                                       # root writes anywhere; a read-only folder is no test
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases += [("demo", "--out", str(locked / "out")), ("overhead", "--out", str(locked / "r.md"))]
    return cases


def test_every_bad_output_path_is_refused_before_any_work(tmp_path):
    for case in _bad_outputs(tmp_path):
        extra = ("--steps", FOREVER, "--quiet", "--no-benchmark") if case[0] == "demo" else \
                ("--steps", FOREVER) if case[0] == "overhead" else ()
        start = time.perf_counter()
        r = run(*case, *extra, timeout=60)
        elapsed = time.perf_counter() - start
        assert_one_line_error(r, "cannot write")
        print(f"{' '.join(case)}: refused in {elapsed:.2f} s: {r.stderr.strip()}")
    assert sorted(p.name for p in tmp_path.iterdir()) in (["a-file"], ["a-file", "locked"])


REFUSED_IMPORTS = """
import sys
from minitrain_inspect.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(code, 'numba' in sys.modules, 'matplotlib' in sys.modules)
"""


@pytest.mark.parametrize("command", ["demo", "dashboard"])
def test_a_refused_out_compiles_and_imports_nothing_for_the_run(tmp_path, command):
    "Issue 19: the output path is checked before numba (the kernels) or matplotlib (the dashboard) is imported."
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    outs = ["/proc/x", str(a_file), str(a_file / "sub")] if command == "demo" else ["/proc/x.png", str(tmp_path)]
    for out in outs:
        argv = ["demo", "--out", out, "--quiet"] if command == "demo" else ["dashboard", str(a_file), "--out", out]
        r = subprocess.run([sys.executable, "-c", REFUSED_IMPORTS, *argv], capture_output=True, text=True, timeout=120)
        assert r.stdout == "2 False False\n", (out, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("minitrain-inspect: error:"), r.stderr


@pytest.mark.parametrize("flags, words", [(("--budget", "0"), "--budget must be a positive fraction"),
                                          (("--bench-steps", "2"), "at least 3 steps"),
                                          (("--bench-repeats", "0"), "--bench-repeats must be at least 1")])
def test_bad_demo_flags_are_refused_before_the_folder_is_made(tmp_path, flags, words):
    assert_one_line_error(run("demo", "--out", str(tmp_path / "out"), "--steps", FOREVER, *flags, timeout=60), words)
    assert not (tmp_path / "out").exists()


def test_overhead_writes_no_file_unless_asked(tmp_path):
    r = run("overhead", "--steps", "5", "--repeats", "1", "--widths", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "BLAS threads: 1" in r.stdout
    assert list(tmp_path.iterdir()) == [], "overhead must not write ./results.md unasked"
    r = run("overhead", "--steps", "5", "--repeats", "1", "--widths", "--json", "--out", "note.md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert figures["blas_threads"] == 1 and {"overhead", "overhead_every_step", "overhead_disabled"} <= set(figures)
    assert [p.name for p in tmp_path.iterdir()] == ["note.md"]
    assert "BLAS threads: 1" in (tmp_path / "note.md").read_text()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    r = run("demo", "--out", str(out), "--steps", "30", "--quiet", "--no-benchmark")
    assert r.returncode == 0, r.stderr
    return out


def test_demo_writes_a_complete_run_and_nothing_else(demo_run):
    assert sorted(p.name for p in demo_run.iterdir()) == RUN_FILES   # no staging folder left behind
    meta = json.loads((demo_run / "history.jsonl").read_text().splitlines()[0])
    assert "title" in json.dumps(meta) and "30 steps" in json.dumps(meta)


def test_dashboard_redraws_a_saved_run(demo_run, tmp_path):
    r = run("dashboard", str(demo_run / "history.jsonl"), "--out", str(tmp_path / "again.png"))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert (tmp_path / "again.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content,words", [
    (None, "no saved history"),
    ("", "history.jsonl"),
    ("not json\n", "line 1"),
])
def test_dashboard_refuses_a_bad_history_in_one_line(tmp_path, content, words):
    history = tmp_path / "history.jsonl"
    if content is not None:
        history.write_text(content)
    r = run("dashboard", str(history), "--out", str(tmp_path / "d.png"))
    assert_one_line_error(r, words)
    assert not (tmp_path / "d.png").exists()


def test_dashboard_refuses_a_truncated_history(demo_run, tmp_path):
    text = (demo_run / "history.jsonl").read_text()
    (tmp_path / "cut.jsonl").write_text(text[: len(text) // 2])
    assert_one_line_error(run("dashboard", str(tmp_path / "cut.jsonl"), "--out", str(tmp_path / "d.png")), "cut.jsonl")


def _interrupt(args, after: float):
    p = subprocess.Popen([SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:     # never leave it running: kill it, then fail
        p.kill()
        p.communicate()
        raise AssertionError(f"{args[0]} went on for 120 s after SIGINT (was SIGINT ignored where the tests run?)")
    return p.returncode, out, err


@pytest.mark.parametrize("phase,extra", [
    ("training", ("--steps", FOREVER, "--no-benchmark")),
    ("benchmark", ("--steps", "5", "--bench-steps", "5000", "--bench-repeats", "50")),
])
def test_ctrl_c_leaves_the_earlier_run_intact(demo_run, tmp_path, phase, extra):
    out = tmp_path / "out"
    shutil.copytree(demo_run, out)
    before = {name: (out / name).read_bytes() for name in RUN_FILES}
    code, stdout, stderr = _interrupt(["demo", "--out", str(out), "--quiet", *extra], after=4.0)
    assert (code, stderr) == (130, "interrupted\n"), (phase, code, stderr)
    assert sorted(p.name for p in out.iterdir()) == RUN_FILES, "no staging folder, no extra file"
    assert {name: (out / name).read_bytes() for name in RUN_FILES} == before, "never a mix of two runs"


def test_ctrl_c_in_a_fresh_folder_leaves_no_files(tmp_path):
    code, stdout, stderr = _interrupt(["demo", "--out", str(tmp_path / "new"), "--quiet", "--steps", FOREVER,
                                       "--no-benchmark"], after=2.0)
    assert (code, stderr) == (130, "interrupted\n")
    new = tmp_path / "new"   # (a Ctrl-C before the folder was made leaves no folder either)
    assert not new.exists() or list(new.iterdir()) == []


def test_ctrl_c_in_train_is_one_line():
    code, stdout, stderr = _interrupt(["train", "--steps", FOREVER, "--quiet"], after=2.0)
    assert (code, stdout, stderr) == (130, "", "interrupted\n")


# --- issue 10: diagnosis and early stop on the command line -------------------------------------------------------

def test_train_lr5_early_stop_stops_with_a_failing_verdict_and_exits_0():
    r = run("train", "--lr", "5", "--early-stop", "--diagnose-every", "50", "--json", "--quiet")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    out = json.loads(r.stdout)
    es = out["early_stop"]
    assert set(es) == {"stopped", "step", "verdict", "reasons", "compute_saved"}, es
    assert (es["stopped"], es["verdict"]) == (True, "failing"), es
    assert 0 < es["step"] <= 200 and es["reasons"], es
    assert es["compute_saved"]["steps"] == 2000 - es["step"], es
    assert es["compute_saved"]["share"] == pytest.approx((2000 - es["step"]) / 2000), es
    assert es["compute_saved"]["seconds"] > 0, es
    assert out["diagnosis"]["verdict"] == "failing" and out["diagnosis"]["step"] == es["step"], out["diagnosis"]


def test_train_text_output_reports_the_stop():
    r = run("train", "--lr", "5", "--steps", "300", "--early-stop", "--diagnose-every", "50", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "trained 50 of 300 steps" in r.stdout and "stopped early at step 50: failing; saved 250 steps (83% of the run" in r.stdout, r.stdout
    assert "dead_units" in r.stdout


def test_default_run_with_early_stop_completes_unflagged():
    "The default run overfits a little (issue 21): it ends with a warning, never failing, and early stop leaves it be."
    r = run("train", "--early-stop", "--diagnose-every", "50", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    es = out["early_stop"]
    assert (es["stopped"], es["step"], es["verdict"], es["compute_saved"]) == \
        (False, None, "warning", {"steps": 0, "share": 0.0, "seconds": 0.0}), es
    assert [r.split(":")[0] for r in es["reasons"]] == ["overfitting"], es["reasons"]
    plain = json.loads(run("train", "--json", "--quiet").stdout)
    assert out["params_sha256"] == plain["params_sha256"], "the diagnosis must not change the run"


def test_early_stop_alone_turns_a_nan_loss_into_a_clean_stop():
    args = ("train", "--optimizer", "sgd", "--lr", "1000", "--momentum", "0", "--steps", "200", "--quiet")
    assert_one_line_error(run(*args), "training diverged: the loss is nan")
    r = run(*args, "--early-stop", "--json")
    assert r.returncode == 0, r.stderr
    es = json.loads(r.stdout)["early_stop"]
    assert es["stopped"] and es["verdict"] == "failing" and "non-finite training loss" in es["reasons"][0], es


@pytest.mark.parametrize("args, words", [
    (("--diagnose-every", "0"), "--diagnose-every must be at least 1"),
    (("--diagnose-every", "-3"), "--diagnose-every must be at least 1"),
    (("--diagnose-every", "1.5"), "invalid int value"),
    (("--early-stop", "yes"), "unrecognized arguments"),
])
def test_bad_diagnosis_flags_are_one_line_errors(args, words):
    assert_one_line_error(run("train", "--quiet", *args), words)


@pytest.mark.parametrize("args, words", [
    ((), "diagnose needs --gallery"),
    (("--gallery", "--steps", "0"), "--steps must be at least 1"),
    (("--gallery", "--seeds", "0"), "--seeds must be at least 1"),
    (("--gallery", "--every", "0"), "--every must be at least 1"),
])
def test_bad_gallery_flags_are_one_line_errors(args, words):
    assert_one_line_error(run("diagnose", *args), words)


def test_diagnose_gallery_json_and_table():
    r = run("diagnose", "--gallery", "--steps", "60", "--seeds", "1", "--every", "20", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    summary = out["summary"]
    assert len(out["runs"]) == 11 and summary["broken"] + len(summary["not_applicable"]) == 8, summary
    assert summary["healthy"] == 3 and summary["broken_flagged"] == summary["broken"], summary
    row = out["runs"][0]
    assert {"name", "broken", "flagged", "step", "reasons", "compute_saved", "final_accuracy",
            "accuracy_at_stop"} <= set(row), row
    r = run("diagnose", "--gallery", "--steps", "30", "--seeds", "1", "--quiet")
    assert r.returncode == 0 and r.stdout.startswith("| run | kind | flagged | step fired |"), r.stdout[:200]
    assert "false positives" in r.stdout


def test_demo_writes_the_diagnosis(demo_run):
    d = json.loads((demo_run / "diagnosis.json").read_text())
    assert d["verdict"] in ("trustworthy", "warning", "failing") and d["every"] == 50 and d["reports"], d.keys()
    history_head = json.loads((demo_run / "history.jsonl").read_text().split("\n", 1)[0])
    assert history_head["meta"]["diagnosis"]["verdict"] == d["verdict"], "the dashboard reads it from the history"


# --- issue 11: the instructor's commands (release, grade and mutants are tested in test_course.py) ------------------

def test_docs_builds_the_site_or_says_what_is_missing(tmp_path):
    r = run("docs", "--out", str(tmp_path / "site"), timeout=600)
    try:
        import minitrain_inspect.docsite  # noqa: F401
    except ModuleNotFoundError:
        assert_one_line_error(r, "the site builder")
        return
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "index.html").is_file() and "pages in" in r.stdout


@pytest.mark.parametrize("args,words", [
    (("release",), "the following arguments are required: --out"),
    (("grade",), "the following arguments are required: DIR"),
    (("mutants", "--only", "99_nothing"), "no mutations to run"),
    (("mutants", "--timeout", "-1"), "positive number of seconds"),
    (("mutants", "--stubs", "--sample", "3"), "--match and --sample choose among the mutations"),
    (("mutants", "--stubs", "--only", "99_none"), "no notebook '99_none'"),
])
def test_course_commands_refuse_bad_input_in_one_line(args, words):
    assert_one_line_error(run(*args), words)


def test_diagnose_gallery_with_the_protocol_rows():
    "Issue 21 §1: `diagnose --gallery --protocol` adds backprop, DFA and the frozen baseline, each with its baseline check."
    r = run("diagnose", "--gallery", "--steps", "60", "--seeds", "1", "--every", "20", "--protocol", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["protocol"]
    assert [row["rule"] for row in rows] == ["bp", "dfa", "frozen"]
    frozen = rows[2]
    assert frozen["baseline"]["fired"] is True and frozen["baseline"]["value"] == 0.0, frozen["baseline"]
    text = run("diagnose", "--gallery", "--steps", "60", "--seeds", "1", "--every", "20", "--protocol", "--quiet").stdout
    assert "DFA (direct feedback alignment)" in text and "frozen baseline (readout only)" in text


def test_overhead_framework_torch_writes_its_table_to_out_and_refuses_a_bad_out_first(tmp_path):
    pytest.importorskip("torch")
    start = time.monotonic()
    assert_one_line_error(run("overhead", "--framework", "torch", "--steps", "100000", "--out", "/proc/x.md"), "/proc")
    assert time.monotonic() - start < 120                      # refused before any measurement
    out = tmp_path / "torch.md"
    r = run("overhead", "--framework", "torch", "--quick", "--widths", "64", "--quiet", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == r.stdout and "| Inspector, default schedules |" in r.stdout   # the printed table, written


def test_ctrl_c_during_a_failed_numba_import_is_not_lost(tmp_path):
    "Without the `fast` extra, `import numba` fails under `sigint_deferred`: a Ctrl-C held there was dropped, and demo trained on."
    fake = tmp_path / "fake"
    fake.mkdir()
    started = tmp_path / "numba-import-started"
    (fake / "numba.py").write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(3)\n"
                                   "raise ImportError('numba is not installed here (a slow failing import, on purpose)')\n")
    out = tmp_path / "out"
    p = subprocess.Popen([SCRIPT, "demo", "--out", str(out), "--quiet", "--steps", FOREVER, "--no-benchmark"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(fake)})
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the fake numba was never imported"
        p.send_signal(signal.SIGINT)           # during the import: held, then it must interrupt
        out_text, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert (p.returncode, err) == (130, "interrupted\n"), (p.returncode, err[-500:])
    assert not out.exists()
