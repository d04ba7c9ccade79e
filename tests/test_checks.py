"""The course's checks (issue 23): a failed `test_eq` names expected and got in a real notebook run, a passing cell says
so in one line, the checks compare as fastcore's do, and checking changes nothing the grader's snapshot compares."""
import builtins
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitrain_inspect.core as core     # not `from ... import test_eq`: pytest would collect it as a test
from minitrain_inspect.course import harness_describe, harness_snapshot, harness_tampered

nbformat = pytest.importorskip("nbformat")
ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    "from minitrain_inspect.core import test_eq, test_close, expect_error",
    "test_eq([0, 6], [0, 3, 6, 9])",                                   # fails: says which side was expected
    "test_eq([1, 2], [1, 2])\ntest_close(1.0, 1.0 + 1e-7)",          # passes: one short line
    "for i in range(3000):\n    test_eq(i % 7, i % 7)",                 # thousands of checks: still one line
    "x = 1 + 1",                                                       # no check: no line
    "_ = expect_error(lambda: int('x'), ValueError)",                  # a graded cell's ending: no value
    "test_close(np.ones(10**6), np.zeros(10**6))" ,                    # a huge failure: a short message
]


def _notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import numpy as np"),
                                         *(nbformat.v4.new_code_cell(c) for c in CELLS)])
    path = folder / "checks.ipynb"
    nbformat.write(nb, path)
    return path


def _check_outputs(cells: list) -> None:
    "The outputs of the notebook's cells (index 1 on: CELLS), as either executor leaves them."
    def outputs(i):
        return cells[i + 1].get("outputs", [])

    def stream(i, name="stdout"):
        return "".join("".join(o.get("text", "")) for o in outputs(i) if o.get("output_type") == "stream" and o.get("name") == name)

    errors = {i: o for i in range(len(CELLS)) for o in outputs(i) if o.get("output_type") == "error"}
    assert set(errors) == {1, 6}, errors
    assert errors[1]["ename"] == "AssertionError" and errors[1]["evalue"] == "expected [0, 3, 6, 9], got [0, 6]", errors[1]
    assert errors[6]["evalue"].startswith("expected array of shape (1000000,), float64: [0.0, 0.0, 0.0, …] within 1e-05, got "), errors[6]
    assert "1,000,000 of 1,000,000 elements differ" in errors[6]["evalue"] and len(errors[6]["evalue"]) < 300, errors[6]
    assert "✓" not in stream(1) and "✓" not in stream(6), "a failed cell shows no pass line"
    assert stream(2) == "✓ 2 checks passed\n"
    assert stream(3) == "✓ 3,000 checks passed\n"
    assert stream(4) == ""
    assert stream(5) == "✓ 1 check passed\n"
    assert not any(o.get("output_type") == "execute_result" for i in range(len(CELLS)) for o in outputs(i))
    assert all(stream(i, "stderr") == "" for i in range(len(CELLS))), "nothing on standard error"


RUN_LIKE_NBDEV_TEST = """
import json, sys
from execnb.nbio import read_nb
from execnb.shell import CaptureShell
nb = read_nb(sys.argv[1])
shell = CaptureShell(sys.argv[1])          # what nbdev_test runs a notebook in
shell.run_all(nb, exc_stop=False)
print(json.dumps([{"outputs": [dict(o) for o in c.get("outputs", [])]} for c in nb.cells]))
"""


def test_in_nbdev_tests_executor(tmp_path):
    "execnb's CaptureShell, which `nbdev_test` uses: the failure names both sides, a passing cell says so once."
    path = _notebook(tmp_path)
    done = subprocess.run([sys.executable, "-c", RUN_LIKE_NBDEV_TEST, str(path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    _check_outputs(json.loads(done.stdout.splitlines()[-1]))


def test_in_a_jupyter_kernel(tmp_path):
    "nbclient with a real kernel (as Jupyter, nbgrader and `docs --execute` run a notebook): the same outputs."
    nbclient = pytest.importorskip("nbclient")
    path = _notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env={**os.environ, "PYTHONPATH": str(ROOT)})
    _check_outputs(nb.cells)


def test_grade_reports_read_expected_and_got():
    "The grader keeps a message's first line: ours is one line, expected first."
    source = "test_eq([1, 2], [1, 3])"
    with pytest.raises(AssertionError) as info:
        core.test_eq([1, 2], [1, 3])
    assert harness_describe(info.value, source, 4) == "AssertionError: expected [1, 3], got [1, 2]"


def test_checking_changes_nothing_the_grader_compares():
    "A counter kept on the module or a class would read as tampering: the snapshot must be unchanged after checks."
    IPython = pytest.importorskip("IPython")
    owners, functions = harness_snapshot(("minitrain_inspect.core",))
    ns = {"__builtins__": builtins}
    shell = IPython.core.interactiveshell.InteractiveShell.instance()    # checks count on a shell's tally
    try:
        for check in (lambda: core.test_eq([1], [1]), lambda: core.test_close(1.0, 1.0), lambda: core.test_eq(1, 2),
                      lambda: core.test_fail(lambda: 1 / 0), lambda: core.expect_error(lambda: int("x"), ValueError)):
            try:
                check()
            except AssertionError:
                pass
        assert core.check_tally(shell).passed == 4
    finally:
        IPython.core.interactiveshell.InteractiveShell.clear_instance()
    for _ in range(3):
        core.test_eq(np.arange(3), [0, 1, 2])                             # outside IPython: silent, nothing kept
    assert harness_tampered(owners, functions, {}, builtins, ns, []) == ""


values = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.just(float("nan")) | st.text(max_size=3)
                      | st.builds(np.array, st.lists(st.floats(-2, 2) | st.just(float("nan")), max_size=4)),
                      lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=8)


def _fastcore_answer(compare, *args):
    "fastcore's answer, or None where fastcore raises instead of answering."
    try:
        with np.errstate(all="ignore"):
            return bool(compare(*args))
    except (ValueError, TypeError):
        return None


@settings(max_examples=300, deadline=None, database=None)
@given(values, values)
def test_same_answers_as_fastcore(got, expected):
    """Wherever fastcore's comparisons answer, ours give the same answer, except that `test_close` refuses values of
    different shapes (fastcore zips lists to the shorter and broadcasts arrays); a failure's message is one bounded line."""
    from fastcore.imports import equals
    from fastcore.test import is_close
    for ours, theirs, args in [(core._equal, equals, (got, expected)), (core._equal, equals, (got, got)),
                               (core._close, is_close, (got, expected, 0.5))]:
        answer = _fastcore_answer(theirs, *args)
        if ours is core._close and not core._same_shape(got, expected):
            answer = False
        if answer is not None:
            assert ours(*args) == answer, (args, answer)
    if not core._equal(got, expected):
        message = core._failure(got, expected)
        assert message.startswith("expected ") and "\n" not in message and len(message) < 400, message


def test_huge_values_give_short_messages():
    for got, expected in [(np.zeros((3000, 3000), np.float32), np.ones((3000, 3000))), (list(range(10**6)), [0]),
                          ("a" * 10**6, "b"), ({i: i for i in range(10**5)}, {})]:
        with pytest.raises(AssertionError) as info:
            core.test_eq(got, expected)
        assert len(str(info.value)) < 400 and "\n" not in str(info.value), str(info.value)[:500]


def test_the_notebooks_use_the_course_checks():
    "No notebook imports fastcore's test helpers any more (the course's own compare the same and say more)."
    users = [p.name for p in sorted((ROOT / "nbs").glob("*.ipynb"))
             for c in json.loads(p.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code" and p.stem != "00_core"
             and any(line.startswith("from fastcore.test import") for line in "".join(c["source"]).splitlines())]
    assert not users, users


def test_close_refuses_a_shape_fastcore_would_zip_or_broadcast():
    "A wrong-length or wrong-shape answer fails `test_close` (fastcore's `is_close` passes each of these)."
    from fastcore.test import is_close
    for got, expected in [([1.0, 2.0, 3.0], [1.0, 2.0]), (np.array([]), 5.0), (np.array([1.0]), np.ones(3)),
                          ((1.0,), [1.0, 99.0]), (np.ones((3, 1)), np.ones(3))]:
        assert is_close(got, expected, 1e-5)
        with pytest.raises(AssertionError, match="expected"):
            core.test_close(got, expected)
    core.test_close(np.zeros((2, 3)), 0.0)           # one expected number: every element of a non-empty array
