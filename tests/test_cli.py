"The console script, run as a user would: a subprocess."
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The console script installed beside this interpreter (the project's virtual environment), else on PATH.
_beside = Path(sys.executable).with_name("minitrain-inspect")
SCRIPT = str(_beside) if _beside.exists() else shutil.which("minitrain-inspect")


def run(*args):
    assert SCRIPT, "the minitrain-inspect console script is not installed"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=300)


def test_train_json_is_reproducible():
    first = run("train", "--steps", "40", "--seed", "2", "--json", "--quiet")
    second = run("train", "--steps", "40", "--seed", "2", "--json", "--quiet")
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["steps"] == 40 and set(a["accuracy"]) >= {"regular_val", "irregular_train"}
    assert isinstance(a["final_loss"], float) and len(a["params_sha256"]) == 64
    assert a["params_sha256"] == b["params_sha256"]


def test_inspect_flag_adds_snapshot_and_changes_nothing():
    plain = json.loads(run("train", "--steps", "30", "--json", "--quiet").stdout)
    inspected = json.loads(run("train", "--steps", "30", "--json", "--quiet", "--inspect").stdout)
    assert inspected["params_sha256"] == plain["params_sha256"]
    assert "snapshot" in inspected and "snapshot" not in plain
    assert inspected["snapshot"]["mlp.act1"]["kind"] == "activation"


@pytest.mark.parametrize("args,message", [
    (("--steps", "-3"), "steps must be at least 0"),
    (("--batch-size", "999999"), "larger than the data"),
    (("--optimizer", "lbfgs"), "optimizer must be"),
    (("--steps", "many"), "invalid int value"),
    (("--hidden", "0"), "hidden width"),
])
def test_bad_input_is_one_line(args, message):
    r = run("train", "--quiet", *args)
    assert r.returncode != 0
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_help_lists_flags():
    r = run("train", "--help")
    assert r.returncode == 0
    for flag in ("--steps", "--seed", "--json", "--inspect", "--quiet"):
        assert flag in r.stdout
