"""Every lesson has the teaching module's frame (issue 23): learning objectives at the top and a summary at the end.

A lesson is a notebook `nbs/NN_*.ipynb` (a letter after the number included, as in `10a_speed`); the index is not one.
The objectives are a markdown cell holding "**Learning objectives.**" among the first four cells (after the title and
the introduction), and the summary a markdown cell holding "**Summary.**" among the last three. The failure lists
every lesson that lacks either, so one run shows all that is left to write.
"""
import json
import re
from pathlib import Path

NBS = Path(__file__).resolve().parents[1] / "nbs"
LESSON = re.compile(r"^\d\d[a-z]?_.+\.ipynb$")
OBJECTIVES, FIRST = "**Learning objectives.**", 4
SUMMARY, LAST = "**Summary.**", 3


def lessons() -> list[Path]:
    return sorted(p for p in NBS.glob("*.ipynb") if LESSON.match(p.name))


def markdown_holding(cells: list, text: str) -> bool:
    "Whether one of `cells` is a markdown cell whose source contains `text`."
    return any(c.get("cell_type") == "markdown" and text in "".join(c.get("source", "")) for c in cells)


def missing_parts(path: Path) -> list[str]:
    "What the lesson at `path` lacks: its objectives near the top, its summary at the end."
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    missing = []
    if not markdown_holding(cells[:FIRST], OBJECTIVES):
        missing.append(f"a markdown cell with {OBJECTIVES!r} among its first {FIRST} cells")
    if not markdown_holding(cells[-LAST:], SUMMARY):
        missing.append(f"a markdown cell with {SUMMARY!r} among its last {LAST} cells")
    return missing


def test_lessons_are_found():
    names = [p.name for p in lessons()]
    assert "00_core.ipynb" in names and "10a_speed.ipynb" in names and "index.ipynb" not in names, names


def test_every_lesson_has_objectives_and_a_summary():
    lacking = {p.name: gaps for p in lessons() if (gaps := missing_parts(p))}
    assert not lacking, f"{len(lacking)} lesson(s) lack the module format:\n" + "\n".join(
        f"  {name}: needs {' and '.join(gaps)}" for name, gaps in lacking.items())


def test_the_check_sees_a_missing_part(tmp_path):
    "The check itself: a lesson whose summary sits too early, or whose objectives are plain text, is caught."
    def cell(kind, text):
        return {"cell_type": kind, "metadata": {}, "source": text}
    good = [cell("markdown", "# T\n\n> s"), cell("markdown", f"{OBJECTIVES} After this lesson you can"),
            cell("code", "x = 1"), cell("code", "x"), cell("markdown", f"{SUMMARY} We built x.")]
    cases = {"good": good,
             "summary too early": good[:-1] + [cell("markdown", SUMMARY)] + [cell("code", "y")] * 3,
             "objectives in code": [good[0], cell("code", f"# {OBJECTIVES}")] + good[2:]}
    found = {}
    for name, cells in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.ipynb"
        path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        found[name] = len(missing_parts(path))
    assert found == {"good": 0, "summary too early": 1, "objectives in code": 1}, found
