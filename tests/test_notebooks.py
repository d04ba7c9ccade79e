"The notebooks read as lessons: a title and summary, and student regions that leave valid Python when removed."
import json
import re
from pathlib import Path

import pytest

NBS = sorted((Path(__file__).resolve().parents[1] / "nbs").glob("*.ipynb"))
COURSE = [nb for nb in NBS if nb.name != "index.ipynb"]


def cells(nb_path):
    return json.loads(nb_path.read_text(encoding="utf-8"))["cells"]


def strip_solutions(source: str) -> str:
    "Replace each BEGIN/END SOLUTION region by `raise NotImplementedError()` at the same indentation."
    pattern = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION\n?", re.S | re.M)
    return pattern.sub(lambda m: f"{m.group(1)}raise NotImplementedError()\n", source)


@pytest.mark.parametrize("nb", COURSE, ids=lambda p: p.stem)
def test_title_and_summary(nb):
    first = "".join(cells(nb)[0]["source"]).splitlines()
    assert first[0].startswith("# "), f"{nb.name} must open with an H1 title"
    assert any(line.startswith("> ") for line in first[1:4]), f"{nb.name} needs a one-line > summary"


@pytest.mark.parametrize("nb", COURSE, ids=lambda p: p.stem)
def test_exports_one_module(nb):
    defaults = [c for c in cells(nb) if c["cell_type"] == "code" and "#| default_exp" in "".join(c["source"])]
    assert len(defaults) == 1


def test_student_regions_leave_valid_python():
    regions = 0
    for nb in COURSE:
        for cell in cells(nb):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "### BEGIN SOLUTION" not in source:
                continue
            assert source.count("### BEGIN SOLUTION") == source.count("### END SOLUTION"), nb.name
            stripped = strip_solutions(source)
            assert "SOLUTION" not in stripped, nb.name
            compile(stripped.replace("#| export", ""), nb.name, "exec")
            regions += source.count("### BEGIN SOLUTION")
    assert regions >= 15


def test_no_two_notebooks_export_the_same_module():
    modules = []
    for nb in COURSE:
        for cell in cells(nb):
            m = re.search(r"#\| default_exp (\S+)", "".join(cell["source"]))
            if m:
                modules.append(m.group(1))
    assert len(modules) == len(set(modules))
