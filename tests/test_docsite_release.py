"""The students' site (`build_release_site`, nbs/17_docsite.ipynb): built from the student release, with 11_dashboard
run both ways. Run with the release's own package, the dashboard of the real run needs exercises, so the page says which
in its place and shows no solution; run from the instructor's notebooks (`figures="reference"`), the page shows the
dashboard the finished course draws, and still no solution line. About 30 s on an idle 2-core machine."""
import re
from pathlib import Path

import pytest

pytest.importorskip("nbconvert")            # the dev extra

from minitrain_inspect.course import BEGIN_SOLUTION, distinctive_solution_lines  # noqa: E402
from minitrain_inspect.docsite import build_release_site, solutions_shown  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]
RUN = ["11_dashboard"]
DASHBOARD_PNG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]{100000,})"')   # the dashboard is over 75 kB


@pytest.fixture(scope="module")
def solution_lines():
    return distinctive_solution_lines(PROJECT / "nbs")


@pytest.fixture(scope="module")
def release_run(tmp_path_factory):
    "The students' site with 11_dashboard run on the release's own (stubbed) package."
    pages = build_release_site(tmp_path_factory.mktemp("students") / "_site", PROJECT, execute=RUN)
    return {p.name: p.read_text(encoding="utf-8") for p in pages}, pages[0].parent


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    "The students' site with the outputs of the instructor's 11_dashboard, run."
    pages = build_release_site(tmp_path_factory.mktemp("students-ref") / "_site", PROJECT, execute=RUN, figures="reference")
    return {p.name: p.read_text(encoding="utf-8") for p in pages}, pages[0].parent


def test_no_solution_on_any_page(release_run, reference_run, solution_lines):
    marker = f'<span class="c1">{BEGIN_SOLUTION}</span>'
    for texts, folder in (release_run, reference_run):
        assert not [name for name, text in texts.items() if marker in text], "a page shows a solution region"
        assert solutions_shown(folder, solution_lines) == [], "a page shows a line of a solution in its code or outputs"
        assert "shows the solutions" not in texts["index.html"]


def test_a_missing_figure_says_which_exercise_it_needs(release_run):
    texts, _ = release_run
    page = texts["11_dashboard.html"]
    assert not DASHBOARD_PNG.search(page), "run on the stubs, the real run's dashboard cannot be drawn"
    notes = re.findall(r'<p class="cell-note">(.*?)</p>', page, re.S)
    assert notes, "where an output is missing, the page should say why"
    named = [n for n in notes if re.search(r"needs the exercise <code>\w+</code> of", n)]
    assert named, f"a note should name the exercise the output waits for; notes: {notes[:3]}"
    assert "Traceback" not in page and "\x1b[" not in page, "a note replaces the traceback"
    assert "built from the student release" in texts["index.html"] and "page says so in its place" in texts["index.html"]


def test_reference_figures_show_the_finished_dashboard(reference_run):
    texts, _ = reference_run
    page = texts["11_dashboard.html"]
    assert DASHBOARD_PNG.search(page), "the finished course's dashboard should be on the students' page"
    assert 'class="cell-note"' not in page, "the instructor's notebook runs without errors: nothing is missing"
    assert "NotImplementedError" in page, "the exercises are still stubs on the page"
    assert "come from the finished course" in texts["index.html"]
