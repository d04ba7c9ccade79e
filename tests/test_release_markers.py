"""Release never ships an answer (issue 22, section 3): `release` refuses, naming the notebook, the cell (index and id)
and, in code, the line, every malformed, unpaired or misplaced solution marker, marker text anywhere but an exercise
cell's marker lines, and a graded cell of no exercise; and it writes nothing when it refuses. Prose quotes the markers
as `<code>### BEGIN&#32;SOLUTION</code>`, which neither the release nor nbgrader takes for a marker."""
import json
import re
from pathlib import Path

import pytest

from minitrain_inspect.course import (BEGIN_SOLUTION, END_SOLUTION, MARKER_TEXT, CourseError, check_markers,
                                      course_notebooks, is_exercise_cell, read_notebook, release, stub_notebook)

ROOT = Path(__file__).resolve().parents[1]
B, E = BEGIN_SOLUTION, END_SOLUTION
QUOTED = "Write your part between <code>### BEGIN&#32;SOLUTION</code> and <code>### END&#32;SOLUTION</code> lines."
EXERCISE = {"grade": False, "grade_id": "area", "locked": False, "schema_version": 3, "solution": True, "task": False}
TESTS = {"grade": True, "grade_id": "area-tests", "locked": True, "points": 2, "schema_version": 3, "solution": False,
         "task": False}


def lines(*parts):
    return "\n".join(parts) + "\n"


def code(source, nbgrader=None, cell_id="code1", **extra):
    cell = {"cell_type": "code", "execution_count": None, "id": cell_id, "outputs": [],
            "metadata": {"nbgrader": nbgrader} if nbgrader else {}, "source": source}
    return {**cell, **extra}


def text(source, cell_type="markdown", cell_id="text1", **extra):
    return {"cell_type": cell_type, "id": cell_id, "metadata": {}, "source": source, **extra}


GOOD_EXERCISE = lines("def area(w, h):", f"    {B}", "    return w * h", f"    {E}")


def notebook(*cells, metadata=None):
    "A notebook: a title, the cells given, then a good exercise and its graded test (so only the cells given can be wrong)."
    cells = [text("# Demo", cell_id="title"), *cells, code(GOOD_EXERCISE, EXERCISE, "ex"),
             code("assert area(2, 3) == 6", TESTS, "ex-tests")]
    return {"cells": cells, "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5}


def a_course(tmp_path, bad_nb) -> Path:
    "A course project whose first notebook is fine and whose second is `bad_nb`."
    project = tmp_path / "course"
    (project / "nbs").mkdir(parents=True)
    (project / "minitrain_inspect").mkdir()
    (project / "minitrain_inspect" / "__init__.py").write_text("")
    (project / "settings.ini").write_text("[DEFAULT]\nlib_name = minitrain_inspect\nlib_path = minitrain_inspect\n")
    (project / "nbs" / "00_fine.ipynb").write_text(json.dumps(notebook()))
    (project / "nbs" / "01_demo.ipynb").write_text(json.dumps(bad_nb))
    return project


def other_ex(source, cell_id="other"):
    return code(source, {**EXERCISE, "grade_id": "other"}, cell_id)


# Each case: the cell(s) that make notebook 01_demo wrong, and what the refusal must say after "01_demo.ipynb cell 1 (id X): "
CASES = {
    # the four cases the issue observed
    "four hashes": ([other_ex(lines("def f():", f"    #{B}", "    return 1", f"    #{E}"))],
                    "(id other): line 2: '#### BEGIN SOLUTION' is not a marker"),
    "region in a markdown cell": ([text(lines("Answer:", B, "x = 42", E))],
                                  "(id text1): marker text 'BEGIN SOLUTION' in a markdown cell"),
    "region in a raw cell": ([text(lines(B, "x = 42", E), cell_type="raw")],
                             "(id text1): marker text 'BEGIN SOLUTION' in a raw cell"),
    "region in cell metadata": ([code("x = 1", cell_id="meta1", metadata={"answer": lines(B, "x = 42", E)})],
                                "(id meta1): marker text 'BEGIN SOLUTION' in its metadata"),
    # other spellings
    "two hashes": ([other_ex(lines("##" + B[3:], "x = 1", E))], "(id other): line 1: '## BEGIN SOLUTION' is not a marker"),
    "no space": ([other_ex(lines("###BEGIN SOLUTION", "x = 1", E))], "(id other): line 1: '###BEGIN SOLUTION' is not a marker"),
    "two spaces": ([other_ex(lines("### BEGIN  SOLUTION", "x = 1", E))], "line 1: '### BEGIN  SOLUTION' is not a marker"),
    "lower case": ([other_ex(lines(B.lower(), "x = 1", E.lower()))], "line 1: '### begin solution' is not a marker"),
    "mixed case": ([other_ex(lines("### Begin Solution", "x = 1", E))], "line 1: '### Begin Solution' is not a marker"),
    "no hashes": ([other_ex(lines("BEGIN SOLUTION", "x = 1", E))], "line 1: 'BEGIN SOLUTION' is not a marker"),
    "text after the marker": ([other_ex(lines(B + "  # the answer", "x = 1", E))], "line 1: "),
    "marker in a one-line string": ([other_ex(lines(f"hint = {B!r}", B, "x = 1", E))], "line 1: \"hint = '### BEGIN"),
    "marker lines inside a string": ([other_ex(lines('note = """', B, "x = 1", E, '"""'))],
                                     f"(id other): line 2: {B!r} is inside a string, not a comment line"),
    # pairing
    "BEGIN without END": ([other_ex(lines(B, "x = 1"))], f"(id other): line 1: {B} is never closed by {E}"),
    "END before BEGIN": ([other_ex(lines(E, "x = 1", B))], f"(id other): line 1: {E} without a {B} before it"),
    "two BEGINs": ([other_ex(lines(B, "x = 1", B, "y = 2", E))], f"(id other): line 3: {B} inside the region opened at line 1"),
    # misplaced
    "region in a plain code cell": ([code(lines(B, "x = 1", E), cell_id="plain")],
                                    "(id plain): line 1: a solution marker in a cell that is not an exercise cell"),
    "region in a graded cell": ([code(lines(B, "x = 1", E), {**TESTS, "grade_id": "other-tests"}, "graded")],
                                "(id graded): line 1: a solution marker in a cell that is not an exercise cell"),
    "exercise cell without a region": ([other_ex("def f():\n    return 42\n")],
                                       "(id other): an exercise cell without a solution region"),
    "marker text in outputs": ([code("print(1)", cell_id="out1", outputs=[{"output_type": "stream", "name": "stdout",
                                                                            "text": [B + "\n", "x = 42\n"]}])],
                               "(id out1): marker text 'BEGIN SOLUTION' in its outputs"),
    "marker text in attachments": ([text("![a](attachment:a.txt)", attachments={"a.txt": {"text/plain": B}})],
                                   "(id text1): marker text 'BEGIN SOLUTION' in its attachments"),
    "marker split over two prose lines": ([text("between the BEGIN\nSOLUTION line and the end")], "(id text1): marker text 'BEGIN"),
    "marker with a no-break space": ([text("the line BEGIN\u00a0SOLUTION")], "(id text1): marker text 'BEGIN\\xa0SOLUTION'"),
    # grading metadata
    "graded cell of no exercise": ([code("assert True", {**TESTS, "grade_id": "volume-tests-2"}, "orphan")],
                                   "(id orphan): graded cell 'volume-tests-2' tests exercise 'volume', but no exercise cell"),
    "graded cell without an id": ([code("assert True", {"grade": True, "points": 1}, "noid")],
                                  "(id noid): a graded cell needs a grade_id, got None"),
}


@pytest.mark.parametrize("name", CASES)
def test_release_refuses_and_writes_nothing(tmp_path, name):
    cells, words = CASES[name]
    project = a_course(tmp_path, notebook(*cells))
    out = tmp_path / "student"
    with pytest.raises(CourseError) as caught:
        release(out, project=project)
    message = str(caught.value)
    assert message.startswith("01_demo.ipynb cell 1 "), message
    assert words in message, (words, message)
    assert "\n" not in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["course"], "nothing written, no staging folder left"


def test_marker_text_in_the_notebooks_metadata_is_refused(tmp_path):
    project = a_course(tmp_path, notebook(metadata={"solution": lines(B, "x = 42", E)}))
    with pytest.raises(CourseError, match=r"^01_demo\.ipynb: marker text 'BEGIN SOLUTION' in the notebook's metadata"):
        release(tmp_path / "student", project=project)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["course"]


def test_a_cell_without_an_id_is_named_by_its_index(tmp_path):
    cell = text(lines(B, "x", E))
    del cell["id"]
    with pytest.raises(CourseError, match=r"^01_demo\.ipynb cell 1: marker text"):
        check_markers(notebook(cell), "01_demo")


def test_refused_with_force_leaves_the_old_release_in_place(tmp_path):
    project = a_course(tmp_path, notebook(text(lines(B, "x = 42", E))))
    out = tmp_path / "student"
    out.mkdir()
    (out / "old.txt").write_text("the previous release")
    with pytest.raises(CourseError, match="a markdown cell"):
        release(out, project=project, force=True)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["course", "student"]


def test_the_quoting_convention_passes_and_stubbing_still_works():
    nb = notebook(text(QUOTED), text(QUOTED, cell_type="raw", cell_id="raw1"),
                  code(f"MARK = {B[:9]!r} + {B[9:]!r}", cell_id="split"))      # code builds the marker in two halves
    check_markers(nb, "01_demo")
    stubbed, exercises = stub_notebook(nb, "01_demo")
    assert exercises == ["area"]
    assert "return w * h" not in json.dumps(stubbed)
    assert MARKER_TEXT.search(QUOTED) is None and "BEGIN SOLUTION" not in QUOTED


def nbgrader_sees_a_marker(line: str) -> bool:
    "nbgrader's ClearSolutions test: its delimiter text ('BEGIN SOLUTION' / 'END SOLUTION', exact case) anywhere in a line."
    return "BEGIN SOLUTION" in line or "END SOLUTION" in line


@pytest.mark.parametrize("path", course_notebooks(ROOT / "nbs"), ids=lambda p: p.stem)
def test_every_course_notebook_passes_the_check_and_nbgrader_sees_only_its_regions(path):
    nb = read_notebook(path)
    check_markers(nb, path.stem)
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        seen = [line for line in source.splitlines() if nbgrader_sees_a_marker(line)]
        if is_exercise_cell(cell):
            assert all(line.strip() in (B, E) for line in seen), (path.name, index, seen)
        else:
            assert not seen, f"{path.name} cell {index}: nbgrader would take {seen[0]!r} for a marker"


def test_the_prose_that_quotes_the_markers_uses_the_convention():
    quoting = [p.name for p in course_notebooks(ROOT / "nbs") for c in read_notebook(p)["cells"]
               if c["cell_type"] == "markdown" and "### BEGIN&#32;SOLUTION" in "".join(c["source"])]
    assert {"16_course.ipynb", "index.ipynb"} <= set(quoting), quoting
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<code>### BEGIN&#32;SOLUTION</code>" in readme and not re.search(r"(?i)\bBEGIN\s*SOLUTION\b", readme)
