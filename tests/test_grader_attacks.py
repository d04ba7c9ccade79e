"""A hostile hand-in against `grade` (issue 22): each attack, and its variants, on a real notebook of the course whose
exercise stays stubbed. Each must score 0, leave no process behind, and leave unchanged the places a hand-in must
not touch: the reference package, the instructor's notebooks, $HOME, another student's hand-in, and /tmp outside the
run's own scratch."""
import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
from minitrain_inspect.course import grade, read_notebook, reference_root, stub_notebook  # noqa: E402
from minitrain_inspect.sandbox import isolation_mode, run_in_room  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
STEM = "02_losses"
ROOM = isolation_mode()
needs_room = pytest.mark.skipif(ROOM == "limits only", reason="this machine builds no namespace room (grade warns so)")


def _tree_digest(folder: Path) -> str:
    "A digest of every file's path, size and content under `folder` (symlinks by their target)."
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(folder)).encode())
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        elif path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _top_listing(folder: Path) -> set:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def _marked_processes(mark: str) -> set:
    "Live processes named `mark` (a graded notebook renames itself, and what it forks inherits the name)."
    left = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == mark \
                    and "\nState:\tZ" not in (entry / "status").read_text():
                left.add(entry.name)
        except OSError:
            continue
    return left


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    "Two students' hand-ins of 02_losses, stubbed, and the canaries the attacks aim at."
    base = tmp_path_factory.mktemp("handins")
    stubbed, _ = stub_notebook(read_notebook(NBS / f"{STEM}.ipynb"), STEM)
    for student in ("alice", "bob"):
        (base / student / "nbs").mkdir(parents=True)
        (base / student / "nbs" / f"{STEM}.ipynb").write_text(json.dumps(stubbed))
    tag = uuid.uuid4().hex[:8]
    canaries = {"tmp": Path(tempfile.gettempdir(), f"canary-{tag}"), "home": Path.home() / f".canary-{tag}"}
    for path in canaries.values():
        path.write_text("untouched")
    yield {"base": base, "stubbed": stubbed, "canaries": canaries, "tag": tag}
    for path in canaries.values():
        path.unlink(missing_ok=True)


def _places(course) -> dict:
    package = reference_root() / "minitrain_inspect"
    return {"reference package": _tree_digest(package), "instructor's nbs": _tree_digest(NBS),
            "another hand-in": _tree_digest(course["base"] / "bob"),
            "home": (_top_listing(Path.home()), *(p.read_text() if p.exists() else None for p in course["canaries"].values())),
            "tmp": {n for n in _top_listing(Path(tempfile.gettempdir())) if n.startswith(("pwned", "canary"))}}


def _grade_with(course, *cells, extra_notebooks=None, timeout=60):
    "Grade alice's hand-in with `cells` (sources) put before the graded cells; the report."
    nb = json.loads(json.dumps(course["stubbed"]))
    first_graded = min(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {}).get("grade"))
    for k, source in enumerate(cells):
        nb["cells"].insert(first_graded + k, {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                              "source": source, "id": f"attack{k}"})
    folder = course["base"] / "alice" / "nbs"
    for p in folder.glob("*.ipynb"):
        p.unlink()
    (folder / f"{STEM}.ipynb").write_text(json.dumps(nb))
    for name, extra in (extra_notebooks or {}).items():
        (folder / name).write_text(json.dumps(extra))
    return grade(folder, timeout=timeout, reference=NBS, only=[STEM], workers=1)


def _graded_cells_of(nb, points=1000):
    return {"cells": [{"cell_type": "code", "execution_count": None, "outputs": [], "source": "pass", "id": "b",
                       "metadata": {"nbgrader": {"grade": True, "grade_id": "bonus-tests", "points": points,
                                                 "locked": True, "schema_version": 3, "solution": False, "task": False}}}],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


WRONG_ANSWER = """
import numpy as np
class SoftmaxCrossEntropy:          # runs, and is wrong: only a tampered check could pass it
    def __call__(self, logits, targets):
        self.shape = np.shape(logits)
        class Out: pass
        out = Out()
        out.per_example_loss = np.zeros(np.shape(targets)[:1], np.float32)
        out.loss = 0.0
        return out
    def backward(self, grad_output=1.0):
        return np.zeros(self.shape)
"""
TARGETS = "[sys.argv, [str(p) for p in __import__('pathlib').Path('/tmp').glob('minitrain-grade-*/*')]]"
ATTACKS = {
    "forged records on argv paths and every descriptor": WRONG_ANSWER + f"""
import os, sys, json
for group in {TARGETS}:
    for path in group:
        try: open(path, 'a').write(json.dumps({{"index": 11, "ok": True}}) + '\\n')
        except (OSError, TypeError): pass
for fd in range(3, 256):
    for seq in range(40):
        try: os.write(fd, f'{{seq}}\\t{{seq}}\\tok\\t\\t00\\n'.encode() + json.dumps({{"index": seq, "ok": True}}).encode() + b'\\n')
        except OSError: break
""",
    "builtins.exec and compile patched": WRONG_ANSWER + "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: compile('pass', '', 'exec')",
    "builtins.AssertionError patched": WRONG_ANSWER + "import builtins\nclass Quiet(Exception): pass\nbuiltins.AssertionError = Quiet",
    "the notebook's __builtins__ replaced": WRONG_ANSWER + "__builtins__ = dict(vars(__import__('builtins')), AssertionError=KeyError)",
    "the helper rebound in the notebook": WRONG_ANSWER + "test_close = lambda *a, **k: None\ntest_eq = lambda *a, **k: None",
    "the helper patched on its module": WRONG_ANSWER + "import fastcore.test\nfastcore.test.test_close = lambda *a, **k: None\nfrom fastcore.test import test_close",
    "a helper's helper patched": WRONG_ANSWER + "import fastcore.test\nfastcore.test.is_close = lambda *a, **k: True",
    "numpy patched": WRONG_ANSWER + "import numpy\nnumpy.allclose = lambda *a, **k: True\nnumpy.isclose = lambda *a, **k: True",
    "the helper's code replaced": WRONG_ANSWER + "import fastcore.test\nfastcore.test.test_close.__code__ = (lambda *a, **k: None).__code__",
    "the helper's defaults widened": WRONG_ANSWER + "import fastcore.test\nfastcore.test.test_close.__defaults__ = (1e300,)",
    "the course's helper patched on its module": WRONG_ANSWER + "import minitrain_inspect.core as c\nc.test_close = lambda *a, **k: None\nfrom minitrain_inspect.core import test_close",
    "the course's comparison patched": WRONG_ANSWER + "import minitrain_inspect.core as c\nc._close = lambda *a, **k: True",
    "the course's helper's code replaced": WRONG_ANSWER + "import minitrain_inspect.core as c\nc.test_close.__code__ = (lambda *a, **k: None).__code__",
    "the course's helper's defaults widened": WRONG_ANSWER + "import minitrain_inspect.core as c\nc.test_close.__defaults__ = (1e300,)",
    "tampering from inside the student's function": """
import numpy as np, fastcore.test
class SoftmaxCrossEntropy:
    def __call__(self, logits, targets):
        globals()['test_close'] = lambda *a, **k: None
        fastcore.test.test_close = lambda *a, **k: None
        class Out: per_example_loss = np.zeros(len(targets), np.float32); loss = 0.0
        return Out()
    def backward(self, g=1.0):
        return np.zeros(3)
""",
    "the instructor's answer imported": """
from minitrain_inspect.losses import SoftmaxCrossEntropy
""",
    "the instructor's answer loaded by path": """
import importlib.util, pathlib
for root in [pathlib.Path('/work'), pathlib.Path.home(), pathlib.Path('/')]:
    for path in list(root.glob('*/minitrain_inspect/losses.py')) + list(root.glob('*/*/minitrain_inspect/losses.py')):
        spec = importlib.util.spec_from_file_location('answers', path)
        module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
        SoftmaxCrossEntropy = module.SoftmaxCrossEntropy
""",
    "the instructor's notebook executed": f"""
import json, pathlib
for path in [pathlib.Path({str(NBS / (STEM + '.ipynb'))!r})]:
    for cell in json.loads(path.read_text())['cells']:
        if cell['cell_type'] == 'code' and 'class SoftmaxCrossEntropy' in ''.join(cell['source']):
            exec(''.join(l for l in cell['source'] if not l.startswith('#|')))
""",
    "frames of the harness written": WRONG_ANSWER + """
import sys
f = sys._getframe(0)
while f.f_back is not None: f = f.f_back
f.f_locals['status'] = 'ok'
for frame in sys._current_frames().values(): pass
""",
    "the interpreter's objects searched": WRONG_ANSWER + "import gc\nfor o in gc.get_objects(): pass",
    "sitecustomize planted for the next hand-in": f"""
import site, sys, os
for folder in [*sys.path, *site.getsitepackages(), {str(reference_root())!r}, {str(ROOT)!r}, os.path.expanduser('~')]:
    try: open(os.path.join(folder or '.', 'sitecustomize.py'), 'w').write('import builtins; builtins.pwned = True')
    except OSError: pass
""",
    "files outside deleted and a huge file left": f"""
import os, shutil
for target in [{str(reference_root() / 'minitrain_inspect' / 'losses.py')!r}, {str(NBS / (STEM + '.ipynb'))!r}, '/tmp/canary-' + {"TAG"!r}]:
    try: os.remove(target)
    except OSError: pass
try: shutil.rmtree({str(NBS)!r})
except OSError: pass
try:
    with open('/tmp/pwned-big', 'wb') as f:
        for _ in range(400): f.write(bytes(1 << 20))
except OSError: pass
try:
    with open('big-in-scratch', 'wb') as f:
        for _ in range(400): f.write(bytes(1 << 20))
except OSError: pass
""",
    "a setsid daemon that outlives the run": """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3)
        for path in ['/tmp/pwned-daemon', os.path.expanduser('~/pwned-daemon')]:
            try: open(path, 'w').write('still here')
            except OSError: pass
        time.sleep(60)
    os._exit(0)
""",
    "an output flood": "import sys\nfor _ in range(2000): sys.stdout.write('x' * (1 << 20))",
}


@needs_room
@pytest.mark.parametrize("label", list(ATTACKS))
def test_each_attack_scores_zero_and_touches_nothing(course, label):
    before, mark = _places(course), f"atk{uuid.uuid4().hex[:8]}"
    attack = f"open('/proc/self/comm', 'w').write({mark!r})\n" + ATTACKS[label].replace("TAG", course["tag"])
    start = time.monotonic()
    report = _grade_with(course, attack)
    assert (report.points, report.max_points) == (0, 7), (label, report.to_text())
    assert time.monotonic() - start < 120, "a flood or a daemon held the grade up"
    time.sleep(3.5 if "daemon" in label else 0.2)            # the daemon would write after 3 s
    assert _places(course) == before, label
    assert not _marked_processes(mark), "a process of the graded run outlived it"


@needs_room
def test_tampering_is_reported_with_its_reason(course):
    report = _grade_with(course, "import fastcore.test\nfastcore.test.test_close = lambda *a, **k: None")
    messages = {e.message for e in report.exercises}
    assert messages == {"tampering detected: fastcore.test.test_close was replaced"}, messages


@needs_room
def test_tampering_with_the_course_checks_is_reported(course):
    "The course's own checks (minitrain_inspect.core), which the notebooks import now, are trusted the same way."
    report = _grade_with(course, "import minitrain_inspect.core as c\nc.test_close = lambda *a, **k: None")
    messages = {e.message for e in report.exercises}
    assert messages == {"tampering detected: minitrain_inspect.core.test_close was replaced"}, messages


@needs_room
def test_a_bonus_notebook_counts_for_nothing(course):
    report = _grade_with(course, "pass", extra_notebooks={"99_bonus.ipynb": _graded_cells_of(None)})
    assert (report.points, report.max_points) == (0, 7), report.to_text()


@needs_room
def test_the_solution_still_earns_its_points_in_the_room(course):
    "The defences cost an honest hand-in nothing: the instructor's own notebook scores full marks."
    report = grade(NBS, reference=NBS, only=[STEM], workers=1)
    assert (report.points, report.max_points) == (7, 7), report.to_text()


@needs_room
def test_the_room_has_no_network():
    code = """
import socket
for host, port in [('1.1.1.1', 53), ('8.8.8.8', 443), ('pypi.org', 443)]:
    try:
        socket.create_connection((host, port), timeout=2).close(); print('CONNECTED', host)
    except OSError: print('refused', host)
"""
    with tempfile.TemporaryDirectory() as base:
        work, log = Path(base, "w"), Path(base, "log")
        work.mkdir()
        with open(log, "wb") as out:
            assert run_in_room([sys.executable, "-I", "-c", code], work, {}, 30, stdout=out) == 0
        text = log.read_text()
    assert "CONNECTED" not in text and text.count("refused") == 3, text
