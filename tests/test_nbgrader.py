"""Issue 24, section 1: the course under nbgrader itself, end to end. An nbgrader course in a temporary folder gets
the whole of `nbs/` as one assignment; `generate_assignment` releases it, two students hand it in, `autograde` grades
them and `export` writes the grade book. Their nbgrader scores must be `grade(..., reference=nbs)`'s, notebook by
notebook:

* alice hands in the released notebooks untouched;
* bob hands in the instructor's notebooks, but leaves one exercise as released (stubbed) and rewrites one of its
  graded cells as `pass` (both graders put the instructor's graded cells back).

On the way it checks the habits nbgrader needs (see `16_course`): no marker quoted in prose trips
`generate_assignment`, which stubs exactly the cells our release stubs; no graded cell ends with a value nbgrader
would take for a score; no cell runs into the time limit (a `slow` cell skips itself under nbgrader); hypothesis
leaves no `.hypothesis/` folder in the course.

nbgrader is the optional extra `nbgrader`: without it these tests skip, except under CI=true when .ci/run installs
that extra, where a missing nbgrader is a failure. It costs two full runs of the course under nbgrader (one per
student, side by side) and two runs of `grade` beside them: about 6 minutes of CPU in all (measured on 2 busy cores:
6.3 minutes of wall time, most of it nbgrader's kernels)."""
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from minitrain_inspect.course import BEGIN_SOLUTION, cell_source, course_notebooks, grade, graded_cells, read_notebook
from ci_extras import ci_extras

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
ASSIGNMENT = "course"
STUDENTS = ("alice", "bob")
LEFT_STUBBED = ("03_optim", "sgd_step")     # bob's unsolved exercise (its graded cell `sgd_step-tests` he rewrites)
CELL_TIMEOUT = 120                          # nbgrader's limit per cell, in seconds (its default is 30)
TIMES = {}


try:
    import nbgrader                                                    # noqa: F401
    from nbgrader.api import Gradebook
except ImportError:
    if "nbgrader" in ci_extras():
        pytest.fail("nbgrader is missing, though .ci/run installs the extra 'nbgrader'", pytrace=False)
    pytest.skip("nbgrader is not installed (the optional extra 'nbgrader')", allow_module_level=True)


def nbgrader_env(tmp: Path) -> dict:
    """The environment nbgrader runs in: one BLAS thread, as `grade` gives its notebooks. nbgrader calls the `alembic`
    command by name (to set up its grade book): a shim runs this interpreter's alembic, so a venv that is not
    activated works too."""
    shim = tmp / "bin" / "alembic"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f"#!{sys.executable}\nimport sys\nfrom alembic.config import main\nsys.exit(main())\n")
    shim.chmod(0o755)
    return dict(os.environ, PATH=os.pathsep.join([str(shim.parent), str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")]),
                MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def nbgrader_cmd(course: Path, env: dict, *args, log: Path):
    "Run `nbgrader ARGS` in the course folder, its output into `log`; fail with the log's tail if it fails."
    with open(log, "w", encoding="utf-8") as out:
        r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, stdout=out,
                           stderr=subprocess.STDOUT, timeout=1800)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert r.returncode == 0, f"nbgrader {' '.join(args)} exited with {r.returncode}:\n{text[-3000:]}"
    return text


def graded_notebooks() -> list[str]:
    return [p.stem for p in course_notebooks(NBS) if graded_cells(read_notebook(p), p.name)]


def bobs_notebook(stem: str, source: Path, release: Path) -> dict:
    "bob's copy of notebook `stem`: the instructor's, except in LEFT_STUBBED's notebook (its exercise as released)."
    nb = json.loads(source.read_text(encoding="utf-8"))
    if stem != LEFT_STUBBED[0]:
        return nb
    released = json.loads(release.read_text(encoding="utf-8"))
    exercise = LEFT_STUBBED[1]
    for cell, rel in zip(nb["cells"], released["cells"]):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == exercise:
            cell["source"] = rel["source"]                            # the stub nbgrader released
        elif meta.get("grade_id") == f"{exercise}-tests":
            cell["source"] = "pass  # an edited test: both graders put the instructor's back\n"
    return nb


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The nbgrader course, released, handed in by both students and autograded; `grade`'s reports of the two
    hand-ins (against the instructor's notebooks) are computed while nbgrader works."""
    tmp = tmp_path_factory.mktemp("nbgrader")
    course, env = tmp / "course", nbgrader_env(tmp)
    source = course / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    for p in course_notebooks(NBS):
        shutil.copy2(p, source / p.name)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'minitrain'\n"
        f"c.Execute.timeout = {CELL_TIMEOUT}\n", encoding="utf-8")
    start = time.perf_counter()
    logs = {"generate": nbgrader_cmd(course, env, "generate_assignment", ASSIGNMENT, log=tmp / "generate.log")}
    TIMES["generate_assignment"] = time.perf_counter() - start
    release = course / "release" / ASSIGNMENT
    for student in STUDENTS:
        hand_in = course / "submitted" / student / ASSIGNMENT
        hand_in.mkdir(parents=True)
        for p in sorted(release.glob("*.ipynb")):
            nb = (json.loads(p.read_text(encoding="utf-8")) if student == "alice"
                  else bobs_notebook(p.stem, source / p.name, p))
            (hand_in / p.name).write_text(json.dumps(nb, indent=1), encoding="utf-8")
    reports, failed = {}, []

    def our_grades():
        try:
            for student in STUDENTS:
                reports[student] = grade(course / "submitted" / student / ASSIGNMENT, reference=NBS)
        except BaseException as exc:      # re-raised in the test's thread
            failed.append(exc)

    def autograde(student):
        try:
            logs[f"autograde {student}"] = nbgrader_cmd(course, env, "autograde", ASSIGNMENT, "--student", student,
                                                        log=tmp / f"autograde-{student}.log")
            TIMES[f"autograde {student}"] = time.perf_counter() - start
        except BaseException as exc:      # re-raised in the test's thread
            failed.append(exc)

    # Each student's autograde, and our grades, side by side: nbgrader's time is mostly its kernels, one at a time.
    start = time.perf_counter()
    threads = [threading.Thread(target=our_grades), *(threading.Thread(target=autograde, args=(s,)) for s in STUDENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    TIMES["autograde and grade, side by side"] = time.perf_counter() - start
    if failed:
        raise failed[0]
    start = time.perf_counter()
    logs["export"] = nbgrader_cmd(course, env, "export", "--to", str(tmp / "grades.csv"), log=tmp / "export.log")
    TIMES["export"] = time.perf_counter() - start
    return {"dir": course, "logs": logs, "reports": reports, "csv": tmp / "grades.csv"}


def test_generate_assignment_stubs_exactly_the_cells_our_release_stubs(course):
    errors = [line for line in course["logs"]["generate"].splitlines() if "| ERROR]" in line]
    assert not errors, errors
    release = course["dir"] / "release" / ASSIGNMENT
    assert sorted(p.name for p in release.glob("*.ipynb")) == sorted(p.name for p in course_notebooks(NBS))
    for p in course_notebooks(NBS):
        ours = read_notebook(p)["cells"]
        theirs = json.loads((release / p.name).read_text(encoding="utf-8"))["cells"]
        assert len(theirs) == len(ours), p.name
        changed = [i for i, (a, b) in enumerate(zip(ours, theirs)) if cell_source(a) != cell_source(b)]
        with_regions = [i for i, c in enumerate(ours) if c["cell_type"] == "code"
                        and any(line.strip() == BEGIN_SOLUTION for line in cell_source(c).splitlines())]
        assert changed == with_regions, f"{p.name}: nbgrader changed cells {changed}, the regions are in {with_regions}"


def test_no_graded_cell_ends_with_a_value_and_no_cell_times_out(course):
    log = "\n".join(course["logs"][f"autograde {student}"] for student in STUDENTS)
    values = [line for line in log.splitlines() if "cannot be converted to" in line]
    assert not values, "graded cells whose last line gives a value nbgrader reads as a score:\n" + "\n".join(
        v[:300] for v in values)
    # nbgrader's own errors (not those of kernels the notebooks start): a cell past the time limit, a dead kernel
    errors = [line for line in log.splitlines() if line.startswith("[AutogradeApp | ERROR]")]
    assert not errors, "nbgrader's errors (a slow cell that does not skip itself?):\n" + "\n".join(errors[:20])


def test_nbgrader_saw_the_edited_test_and_put_the_instructors_back(course):
    warnings = {student: [line for line in course["logs"][f"autograde {student}"].splitlines()
                          if line.startswith("[AutogradeApp | WARNING]")] for student in STUDENTS}
    assert warnings["alice"] == []
    assert len(warnings["bob"]) == 1 and f"cell {LEFT_STUBBED[1]}-tests has changed" in warnings["bob"][0], warnings
    autograded = course["dir"] / "autograded" / "bob" / ASSIGNMENT / f"{LEFT_STUBBED[0]}.ipynb"
    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): cell_source(c)
             for c in json.loads(autograded.read_text(encoding="utf-8"))["cells"]}
    instructor = {c["metadata"].get("nbgrader", {}).get("grade_id"): cell_source(c)
                  for c in read_notebook(NBS / f"{LEFT_STUBBED[0]}.ipynb")["cells"]}
    assert cells[f"{LEFT_STUBBED[1]}-tests"] == instructor[f"{LEFT_STUBBED[1]}-tests"]


def test_no_hypothesis_database_in_the_course(course):
    found = sorted(str(p.relative_to(course["dir"])) for p in course["dir"].rglob(".hypothesis"))
    assert not found, f"hypothesis wrote its database into the course: {found}"


def nbgrader_scores(course_dir: Path, student: str) -> dict:
    "{notebook stem: (score, max score)} of the student's autograded notebooks that have points, from the grade book."
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gb:
        submission = gb.find_submission(ASSIGNMENT, student)
        return {nb.name: (nb.score, nb.max_score) for nb in submission.notebooks if nb.max_score}


@pytest.mark.parametrize("student", STUDENTS)
def test_nbgrader_scores_each_notebook_as_grade_does(course, student):
    report = course["reports"][student]
    print(report.to_text())
    ours = {n.notebook: (n.points, n.max_points) for n in report.notebooks}
    theirs = nbgrader_scores(course["dir"], student)
    assert set(theirs) == set(ours) == set(graded_notebooks())
    differ = {stem: {"nbgrader": theirs[stem], "grade": ours[stem]} for stem in ours if theirs[stem] != ours[stem]}
    assert not differ, f"{student}: nbgrader and grade --reference disagree: {differ}"
    if student == "alice":
        assert report.points == 0
    else:          # bob: everything but his unsolved exercise (and what needs it)
        assert 0 < report.points < report.max_points
        assert ours[LEFT_STUBBED[0]][0] < ours[LEFT_STUBBED[0]][1]
        assert all(points == maximum for stem, (points, maximum) in ours.items() if stem != LEFT_STUBBED[0])


def test_export_writes_each_students_total(course):
    with open(course["csv"], newline="", encoding="utf-8") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(STUDENTS)
    for student in STUDENTS:
        report = course["reports"][student]
        assert rows[student]["assignment"] == ASSIGNMENT
        assert (float(rows[student]["score"]), float(rows[student]["max_score"])) == (report.points, report.max_points)


def test_times():
    "Prints the measured times (run with -s to see them)."
    for name, seconds in TIMES.items():
        print(f"{name}: {seconds:.1f} s")
