"""The instructor's tools on the real course: the release ships no solution and scores 0, the instructor's notebooks
score full marks, filling one notebook raises the score by exactly its points, and the mutation check kills the
required mutants. Plus the stubbing rules and the command line's refusals."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitrain_inspect.course import (BEGIN_SOLUTION, END_SOLUTION, STUB, CourseError, apply_mutation,
                                      course_notebooks, distinctive_solution_lines, exercises_without_mutation,
                                      find_leaks, grade, graded_cells, load_mutations, read_notebook, release,
                                      run_mutants, run_stub_checks, solution_cells, stub_notebook, stub_source,
                                      torch_installed)

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
MUTATIONS = ROOT / "tests" / "mutations"
_beside = Path(sys.executable).with_name("minitrain-inspect")
SCRIPT = str(_beside) if _beside.exists() else shutil.which("minitrain-inspect")
TIMES = {}          # figures printed at the end (pytest -s shows them)


def cli(*args, timeout=600, cwd=None):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def assert_one_line_error(r, words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("minitrain-inspect: error:"), r.stderr
    assert "Traceback" not in r.stderr and words in r.stderr, (words, r.stderr)


def lines(*parts):
    return "\n".join(parts) + "\n"


# --- stubbing -------------------------------------------------------------------------------------------------------

def test_stub_keeps_each_regions_indentation_and_names_the_exercise():
    source = lines("def f(x):", f"    {BEGIN_SOLUTION}", "    y = x", "    return y", f"    {END_SOLUTION}",
                   "class A:", "    def g(self):", "\tif True:", f"\t\t{BEGIN_SOLUTION}", "\t\tpass", f"\t\t{END_SOLUTION}",
                   "        return 1")
    stub = STUB.format(exercise="ex", stem="07_x")
    assert stub == 'raise NotImplementedError("Exercise ex (07_x): write this part; see the TODO above")'
    assert stub_source(source, "ex", "07_x") == lines("def f(x):", f"    {stub}", "class A:", "    def g(self):",
                                                      "\tif True:", f"\t\t{stub}", "        return 1")


def test_markers_are_whole_lines_only():
    "stub_source stubs whole marker lines only; the release's check (tests/test_release_markers.py) refuses the rest."
    source = lines(f'text = "{BEGIN_SOLUTION}"', f"# {END_SOLUTION} is how a region ends")
    assert stub_source(source, "e", "s") == source


@pytest.mark.parametrize("source,words", [
    (lines("def f():", f"    {BEGIN_SOLUTION}", "    return 1"), "line 2: ### BEGIN SOLUTION is never closed"),
    (lines("def f():", f"    {END_SOLUTION}"), "line 2: ### END SOLUTION without"),
])
def test_unbalanced_markers_name_the_notebook_cell_and_line(source, words):
    with pytest.raises(CourseError, match="03_optim.ipynb cell 7: " + words):
        stub_source(source, "e", "03_optim", where="03_optim.ipynb cell 7")


def test_a_stub_that_breaks_the_cell_is_named():
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# T"},
                    {"cell_type": "code", "id": "ab12", "outputs": [], "execution_count": None,
                     "metadata": {"nbgrader": {"grade": False, "grade_id": "x", "solution": True}},
                     "source": lines("x = [", f"{BEGIN_SOLUTION}", "1]", f"{END_SOLUTION}")}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    with pytest.raises(CourseError, match=r"^99_x.ipynb cell 1 \(id ab12\): line \d+: (invalid syntax|'\[' was never closed)"):
        stub_notebook(nb, "99_x")


@pytest.mark.parametrize("path", course_notebooks(NBS), ids=lambda p: p.stem)
def test_every_notebook_stubs_into_valid_python_with_exercise_ids(path):
    nb = read_notebook(path)
    stubbed, exercises = stub_notebook(nb, path.stem)         # raises, naming the cell, if a cell does not compile
    assert not [i for i, c in enumerate(stubbed["cells"]) if c["cell_type"] == "code" and solution_regions_in(c)]
    text = json.dumps(stubbed)
    for exercise in exercises:
        assert f"Exercise {exercise} ({path.stem})" in text
    solved = set(solution_cells(nb, path.stem))
    tested = {c.exercise for c in graded_cells(nb, path.name)}
    assert tested <= solved, f"{path.name}: graded cells of no exercise: {sorted(tested - solved)}"
    assert solved <= tested, f"{path.name}: exercises without graded cells: {sorted(solved - tested)}"


# --- the release ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "release"
    start = time.perf_counter()
    r = cli("release", "--out", str(out))
    TIMES["release"] = time.perf_counter() - start
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert f"in {out}" in r.stdout
    return out


def test_release_holds_the_course_and_nothing_else(release_dir):
    assert sorted(p.name for p in release_dir.iterdir()) == sorted(
        ["LICENSE", "README.md", "minitrain_inspect", "nbs", "pyproject.toml", "settings.ini", "setup.py"])
    assert [p.name for p in course_notebooks(release_dir / "nbs")] == [p.name for p in course_notebooks(NBS)]
    assert not list(release_dir.parent.glob(".release*")), "no staging folder left behind"
    readme = (release_dir / "README.md").read_text()
    for words in ('pip install -e ".[dev,lab]"', "jupyter lab nbs/", "nbdev_test --path", "nbdev_export", "TODO"):
        assert words in readme, words
    modules = sorted(p.name for p in (ROOT / "minitrain_inspect").glob("*.py"))
    assert sorted(p.name for p in (release_dir / "minitrain_inspect").glob("*.py")) == modules


def test_release_notebooks_are_stubbed_clean_and_keep_grading_metadata(release_dir):
    for path in course_notebooks(NBS):
        original, released = read_notebook(path), read_notebook(release_dir / "nbs" / path.name)
        assert len(original["cells"]) == len(released["cells"]), path.name
        for a, b in zip(original["cells"], released["cells"]):
            assert a["metadata"] == b["metadata"], path.name
            if b["cell_type"] == "code":
                assert b["outputs"] == [] and b["execution_count"] is None, path.name
                assert not solution_regions_in(b), path.name
        assert [c.grade_id for c in graded_cells(original)] == [c.grade_id for c in graded_cells(released)]


def solution_regions_in(cell):
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    return [line for line in source.splitlines() if line.strip() in (BEGIN_SOLUTION, END_SOLUTION)]


def test_no_solution_line_ships_anywhere_in_the_release(release_dir):
    distinctive = distinctive_solution_lines(NBS)
    assert len(distinctive) >= 50, f"only {len(distinctive)} distinctive solution lines: is the search broken?"
    leaks = find_leaks(release_dir, distinctive)
    assert not leaks, f"{len(leaks)} solution lines in the release, e.g. {leaks[:3]}"
    # and the search does find a solution line where there is one
    assert find_leaks(ROOT / "minitrain_inspect", distinctive), "the instructor's package should hold the solutions"


def test_every_module_of_the_stubbed_package_imports(release_dir):
    code = ("import importlib, json, pkgutil, minitrain_inspect as m\n"
            "bad = {}\n"
            "for info in pkgutil.iter_modules(m.__path__):\n"
            "    try:\n"
            "        importlib.import_module('minitrain_inspect.' + info.name)\n"
            "    except Exception as exc:\n"
            "        bad[info.name] = f'{type(exc).__name__}: {exc}'\n"
            "print(json.dumps({'file': m.__file__, 'bad': bad}))\n")
    env = dict(os.environ, PYTHONPATH=str(release_dir))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=release_dir, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["file"].startswith(str(release_dir)), out["file"]
    assert out["bad"] == {}, out["bad"]


def test_release_refuses_a_non_empty_folder_and_replaces_it_with_force(tmp_path):
    out = tmp_path / "student"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert_one_line_error(cli("release", "--out", str(out)), "is not empty")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert_one_line_error(cli("release", "--out", str(out / "notes.txt")), "is a file, not a folder")
    assert_one_line_error(cli("release", "--out", str(ROOT)), "would replace the instructor's project")
    assert_one_line_error(cli("release", "--out", str(NBS / "x")), "inside the instructor's nbs/")
    r = cli("release", "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert not (out / "notes.txt").exists() and (out / "nbs").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student"], "nothing left beside it"


def test_release_refuses_a_folder_it_cannot_stage_beside(tmp_path):
    assert_one_line_error(cli("release", "--out", str(tmp_path / "missing" / "student")), "does not exist")
    (tmp_path / "a-file").write_text("x")
    assert_one_line_error(cli("release", "--out", str(tmp_path / "a-file" / "student")), "is not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing left behind"


# --- grading: the command line on a small synthetic course ----------------------------------------------------------

def _nb(*cells):
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": meta, "outputs": [], "source": src}
                      for src, meta in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _graded(grade_id, points):
    return {"nbgrader": {"grade": True, "grade_id": grade_id, "points": points, "locked": True, "solution": False,
                         "schema_version": 3, "task": False}}


def test_grade_json_and_text_on_a_synthetic_course(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    (nbs / "00_a.ipynb").write_text(json.dumps(_nb(("x = 2", {}), ("assert x == 2, f'got {x}'", _graded("ok-tests", 2)),
                                                   ("assert x == 3, f'expected 3, got {x}'", _graded("bad-tests", 1)),
                                                   ("1 / 0", {}))))
    (nbs / "01_b.ipynb").write_text(json.dumps(_nb(("import time; time.sleep(60)", {}), ("pass", _graded("late-tests", 3)))))
    r = cli("grade", str(tmp_path), "--json", "--timeout", "3")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["points"], report["max_points"]) == (2, 6)
    assert [(e["notebook"], e["exercise"], e["passed"], e["points"], e["max_points"], e["message"]) for e in report["exercises"]] == [
        ("00_a", "ok", True, 2, 2, ""), ("00_a", "bad", False, 0, 1, "bad-tests: AssertionError: expected 3, got 2"),
        ("01_b", "late", False, 0, 3, "late-tests: timed out after 3 s")]
    notebooks = {n["notebook"]: n for n in report["notebooks"]}
    assert notebooks["00_a"]["ungraded_errors"] == 1 and "ZeroDivisionError" in notebooks["00_a"]["first_ungraded_error"]
    assert notebooks["01_b"]["status"] == "timed out after 3 s" and 2.5 < notebooks["01_b"]["seconds"] < 30
    text = cli("grade", str(nbs), "--timeout", "3", "--only", "00_a")
    assert text.returncode == 0 and "total: 2 of 3 points (1 of 2 exercises passed)" in text.stdout, text.stdout


def _graded_notebook_processes() -> list[str]:
    "Host pids of the graded notebooks running now (the harness's program is in their command line)."
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            program = argv[argv.index(b"-c") + 1] if b"-c" in argv[:-1] else b""
            if program.startswith(b"import _thread") and "\nState:\tZ" not in (entry / "status").read_text():
                found.append(entry.name)
        except OSError:
            pass
    return found


def test_ctrl_c_stops_grading_at_once_and_leaves_no_notebook_running(tmp_path):
    import signal
    for name in ("00_a", "01_b"):       # a notebook cannot write outside its room: the grader's process table tells
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(_nb(("import time; time.sleep(120)", {}), ("pass", _graded("x-tests", 1)))))
    before = set(_graded_notebook_processes())
    p = subprocess.Popen([SCRIPT, "grade", str(tmp_path), "--timeout", "100"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(set(_graded_notebook_processes()) - before) < 2 and time.time() < deadline:
        time.sleep(0.2)
    running = set(_graded_notebook_processes()) - before
    assert len(running) == 2, "both notebooks should be running"
    time.sleep(1.0)                     # both are inside their first cell
    p.send_signal(signal.SIGINT)
    start = time.perf_counter()
    out, err = p.communicate(timeout=30)
    assert (p.returncode, err) == (130, "interrupted\n") and time.perf_counter() - start < 10, (p.returncode, err)
    time.sleep(0.5)
    assert not running & set(_graded_notebook_processes()), "a notebook still runs after Ctrl-C"


@pytest.mark.parametrize("args,words", [
    (("/no/such/folder",), "no folder at /no/such/folder"),
    (("{empty}",), "no notebooks in"),
    (("{nbs}", "--timeout", "0"), "positive number of seconds, got 0.0"),
    (("{nbs}", "--timeout", "soon"), "invalid float value"),
    (("{nbs}", "--only", "99_none"), "no notebook '99_none'"),
    (("{nbs}", "--workers", "0"), "--workers must be at least 1, got 0"),
])
def test_grade_bad_input_is_one_line(tmp_path, args, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / "00_a.ipynb").write_text(json.dumps(_nb(("pass", _graded("a-tests", 1)))))
    args = [a.format(empty=tmp_path / "empty", nbs=tmp_path / "nbs") for a in args]
    assert_one_line_error(cli("grade", *args), words)


def test_a_missing_development_tool_is_one_line():
    code = ("import sys; sys.modules['nbformat'] = None\n"          # `import nbformat` now fails, as if not installed
            "from minitrain_inspect.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "grade", str(NBS)], capture_output=True, text=True, timeout=60)
    assert_one_line_error(r, 'the course tools need nbformat, a development tool: pip install "minitrain-inspect[dev]"')


# --- grading the real course ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def instructor_grade():
    start = time.perf_counter()
    report = grade(NBS)
    TIMES["grade nbs"] = time.perf_counter() - start
    return report


def test_the_instructors_notebooks_score_full_marks(instructor_grade):
    report = instructor_grade
    print(report.to_text())
    assert report.max_points > 0 and report.exercises
    failed = [(e.notebook, e.exercise, e.message) for e in report.exercises if e.graded and not e.passed]
    assert not failed, failed
    if torch_installed():     # without PyTorch its exercises are 'not graded' (and out of the totals), never passed
        assert all(e.graded for e in report.exercises), [e.exercise for e in report.exercises if not e.graded]
    assert report.points == report.max_points
    assert [n.notebook for n in report.notebooks if n.status != "ok"] == []
    errors = {n.notebook: n.first_ungraded_error for n in report.notebooks if n.ungraded_errors}
    assert not errors, f"ungraded cells fail in the instructor's notebooks: {errors}"


def _smallest(report):
    "The graded notebook with points to earn here that ran fastest (small, so filling it in is a cheap test)."
    return min((n for n in report.notebooks if n.max_points > 0), key=lambda n: n.seconds).notebook


def test_untouched_release_scores_zero_and_filling_one_notebook_adds_exactly_its_points(instructor_grade, release_dir,
                                                                                         tmp_path):
    chosen = _smallest(instructor_grade)
    maximum = {n.notebook: n.max_points for n in instructor_grade.notebooks}
    # the untouched release, that notebook alone: 0 of its points
    alone = grade(release_dir, only=[chosen])
    assert (alone.points, alone.max_points) == (0, maximum[chosen]), alone.to_text()
    # the release with that one notebook replaced by the instructor's: exactly its points, the others stay at 0
    filled = tmp_path / "filled"
    shutil.copytree(release_dir, filled)
    shutil.copy2(NBS / f"{chosen}.ipynb", filled / "nbs" / f"{chosen}.ipynb")
    start = time.perf_counter()
    report = grade(filled)
    TIMES["grade release (one notebook filled)"] = time.perf_counter() - start
    print(report.to_text())
    assert report.max_points == instructor_grade.max_points
    by_notebook = {n.notebook: n.points for n in report.notebooks}
    assert by_notebook == {n: (maximum[n] if n == chosen else 0) for n in maximum}, by_notebook
    assert report.points == maximum[chosen]
    passed = {e.exercise for e in report.exercises if e.passed and e.notebook != chosen}
    assert not passed, f"exercises passing in the untouched notebooks of the release: {passed}"
    assert all(e.passed for e in report.exercises if e.notebook == chosen)


def test_grading_against_the_reference_ignores_edited_tests(instructor_grade, release_dir, tmp_path):
    chosen = _smallest(instructor_grade)
    hand_in = tmp_path / "hand-in"
    shutil.copytree(release_dir / "nbs", hand_in)
    nb = json.loads((hand_in / f"{chosen}.ipynb").read_text())
    for c in graded_cells(nb, chosen):
        nb["cells"][c.index]["source"] = "pass"                  # every test of the stubbed notebook edited to pass
    (hand_in / f"{chosen}.ipynb").write_text(json.dumps(nb))
    maximum = next(n.max_points for n in instructor_grade.notebooks if n.notebook == chosen)
    as_is = json.loads(cli("grade", str(hand_in), "--only", chosen, "--json").stdout)
    locked = json.loads(cli("grade", str(hand_in), "--only", chosen, "--json", "--reference", str(NBS)).stdout)
    assert (as_is["points"], locked["points"], locked["max_points"]) == (maximum, 0, maximum), (as_is, locked)


# --- the mutation check ---------------------------------------------------------------------------------------------

REQUIRED_MUTANTS = {   # (notebook, words one of the mutation's name must contain): the four kinds issue 11 names
    "a hook that does nothing": ("10_inspect", ("nothing", "no-op", "noop", "does not")),
    "a hook that ignores the due flag": ("10_inspect", ("due",)),
    "a Welford merge without the cross term": ("08_stats", ("cross",)),
    "a Linear backward off by its transpose": ("01_layers", ("transpose",)),
}


def _required_mutations():
    found, missing = [], []
    for kind, (stem, words) in REQUIRED_MUTANTS.items():
        path = MUTATIONS / f"{stem}.json"
        candidates = [m for m in (load_mutations(MUTATIONS, only=[stem]) if path.exists() else [])
                      if any(w in m.name.lower() for w in words)]
        (found.append(candidates[0]) if candidates else missing.append(f"{kind} ({stem}.json)"))
    return found, missing


def test_mutation_files_are_valid():
    mutations = load_mutations(MUTATIONS)
    notebooks = {}
    for m in mutations:                                   # exercise known, `old` exactly once in its solution
        nb = notebooks.setdefault(m.notebook, read_notebook(NBS / f"{m.notebook}.ipynb"))
        apply_mutation(nb, m)


def test_the_required_mutants_and_a_sample_are_killed():
    found, missing = _required_mutations()
    if not found:
        pytest.skip(f"no mutation file holds the required mutants yet: {missing}")
    every = load_mutations(MUTATIONS)
    import random
    rest = [m for m in every if m not in found]
    sample = found + random.Random(int(time.strftime("%j"))).sample(rest, min(20, len(rest)))   # 20 more, new each day
    start = time.perf_counter()
    results = run_mutants(sample, ROOT)
    TIMES[f"mutants ({len(sample)})"] = time.perf_counter() - start
    for r in results:
        print(f"{r.outcome:>8s} {r.notebook}/{r.exercise}: {r.name} ({r.seconds:.1f} s) {r.message}")
    assert [r for r in results if r.outcome not in ("killed", "not checked")] == []
    if missing:
        pytest.skip(f"killed {len(found)} required mutants; not written yet: {missing}")


def test_each_exercise_stubbed_alone_fails_all_its_graded_cells_and_nothing_before_it():
    start = time.perf_counter()
    results = run_stub_checks(ROOT)
    TIMES[f"stub check ({len(results)} exercises)"] = time.perf_counter() - start
    assert results, "no exercise to check"
    bad = [(r.notebook, r.exercise, r.outcome, r.message) for r in results if r.outcome not in ("killed", "not checked")]
    assert not bad, bad


def test_every_exercise_has_a_mutation():
    uncovered = exercises_without_mutation(ROOT)
    assert not uncovered, f"exercises with no mutation: {uncovered}"


def test_mutants_command_line(tmp_path):
    r = cli("mutants", "--only", "18_cli", "--match", "hidden", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(m["exercise"], m["outcome"]) for m in out["mutants"]] == [("staging_folder", "killed")]
    assert out["without_mutation"] == []
    assert_one_line_error(cli("mutants", "--only", "18_cli", "--match", "no such mutation"), "no mutations to run")
    assert_one_line_error(cli("mutants", "--sample", "0"), "--sample must be at least 1, got 0")
    r = cli("mutants", "--stubs", "--only", "18_cli", "--json")
    assert r.returncode == 0, r.stderr
    assert [(m["exercise"], m["name"], m["outcome"]) for m in json.loads(r.stdout)["mutants"]] == [
        ("staging_folder", "solution stubbed", "killed")]


def test_times():
    "Prints the measured times (run with -s to see them)."
    for name, seconds in TIMES.items():
        print(f"{name}: {seconds:.1f} s")


def test_with_a_reference_only_the_references_notebooks_and_points_count(tmp_path):
    "Issue 22 §1: a hand-in's own notebook, absent from the reference, scores nothing, however many points it claims."
    ref, hand_in = tmp_path / "ref", tmp_path / "hand-in" / "nbs"
    ref.mkdir()
    hand_in.mkdir(parents=True)
    course = _nb(("x = 2", {}), ("assert x == 3", _graded("real-tests", 7)))
    (ref / "00_a.ipynb").write_text(json.dumps(course))
    (hand_in / "00_a.ipynb").write_text(json.dumps(course))
    (hand_in / "99_bonus.ipynb").write_text(json.dumps(_nb(("pass", _graded("bonus-tests", 1000)))))
    r = cli("grade", str(hand_in.parent), "--json", "--reference", str(ref))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["points"], report["max_points"]) == (0, 7), report
    assert [n["notebook"] for n in report["notebooks"]] == ["00_a"]
    alone = json.loads(cli("grade", str(hand_in.parent), "--json").stdout)       # without a reference: its own course
    assert alone["max_points"] == 1007
    from minitrain_inspect.sandbox import isolation_mode
    room = isolation_mode()                                  # the line names the room; a weaker one is a warning
    assert r.stderr.startswith("minitrain-inspect: " + ("warning: isolation: WEAKER" if room == "limits only" else f"isolation: {room}")), r.stderr


def test_the_students_check_agrees_with_the_grade_where_it_is_not_waiting(release_dir, tmp_path):
    """Issue 23: a student who finished 10_inspect but not 01_layers or 08_stats checks it in their release, whose
    package has the stubs; the instructor grades it with the reference package. Every exercise the student's check
    does not report as waiting scores the same in both, and the stubs of earlier notebooks show as waiting."""
    student = tmp_path / "student"
    shutil.copytree(release_dir, student)
    shutil.copy2(NBS / "10_inspect.ipynb", student / "nbs" / "10_inspect.ipynb")
    own = grade(student, only=["10_inspect"], package=student / "minitrain_inspect")      # in the student's venv
    instructor = grade(student, only=["10_inspect"], reference=NBS)
    print(own.to_text(), instructor.to_text(), sep="\n\n")
    theirs = {e.exercise: (e.passed, e.points) for e in instructor.exercises}
    waiting = [e for e in own.exercises if e.waiting]
    assert waiting, "the release's stubbed earlier modules should leave some exercise waiting"
    assert all(e.message.startswith("waiting on `") and "(0" in e.waiting for e in waiting), [e.message for e in waiting]
    disagree = [(e.exercise, (e.passed, e.points), theirs[e.exercise]) for e in own.exercises
                if not e.waiting and (e.passed, e.points) != theirs[e.exercise]]
    assert not disagree, disagree
    assert all(passed for passed, _ in theirs.values()), instructor.to_text()
