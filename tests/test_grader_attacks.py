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


def _exercise_index(nb) -> int:
    "The index of the notebook's one exercise cell: the only cell of a hand-in whose code is graded as the student's."
    found = [i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert len(found) == 1, found
    return found[0]


def _write_handin(course, nb, extra_notebooks=None) -> Path:
    folder = course["base"] / "alice" / "nbs"
    for p in folder.iterdir():
        p.unlink()
    (folder / f"{STEM}.ipynb").write_text(json.dumps(nb))
    for name, extra in (extra_notebooks or {}).items():
        (folder / name).write_text(json.dumps(extra))
    return folder


def _grade_with(course, *cells, extra_notebooks=None, timeout=60):
    "Grade alice's hand-in whose exercise cell holds `cells` (sources, one after the other); the report."
    nb = json.loads(json.dumps(course["stubbed"]))
    nb["cells"][_exercise_index(nb)]["source"] = "\n".join(cells)
    folder = _write_handin(course, nb, extra_notebooks)
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
FORGE = """
import sys, os, _thread
MAIN = _thread.get_ident()
def forge():
    "From a finalizer run in the trusted thread: its frame's key and plan, signed ok records for every cell left."
    f = sys._current_frames()[_thread.get_ident()]
    while f is not None and f.f_code.co_name != "harness_trusted":
        f = f.f_back
    L = f.f_locals
    for s in range(L["seq"], len(L["plan"]["cells"])):
        body = f"{s}\\t{L['plan']['cells'][s]['index']}\\tok\\t"
        L["write"](L["plan"]["fd"], (body + "\\t" + L["digest"](L["key"], body.encode(), "sha256").hex() + "\\n").encode())
    os._exit(0)
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
    "a flood on every descriptor (the results channel among them)": """
import os
for fd in range(3, 64):
    for _ in range(40):
        try: os.write(fd, b'x' * (4 << 20))
        except OSError: break
""",
    "the harness's plan rewritten through its frame": """
import sys
frame = sys._getframe(0)
while frame is not None:
    for value in list(frame.f_locals.values()):
        cells = value.get('cells') if isinstance(value, dict) else None
        for cell in cells if isinstance(cells, list) else ():
            if isinstance(cell, dict): cell['source'] = 'pass'
    frame = frame.f_back
""",
    "the harness's overlay rewritten through its frame": WRONG_ANSWER + """
import sys
frame = sys._getframe(0)
while frame is not None:
    for value in list(frame.f_locals.values()):
        if isinstance(value, dict) and 'test_close' in value:
            for name in ('test_close', 'test_eq', 'test_fail'): value[name] = lambda *a, **k: None
    frame = frame.f_back
""",
    "builtins.vars patched to show the tamper check old copies": """
import builtins, sys
import minitrain_inspect.core as core
real_vars = builtins.vars
saved = {id(m): dict(real_vars(m)) for m in list(sys.modules.values()) if m is not None}
builtins.vars = lambda *a: saved[id(a[0])] if len(a) == 1 and id(a[0]) in saved else real_vars(*a)
core._close = lambda *a, **k: True
core._equal = lambda *a, **k: True
""" + WRONG_ANSWER,
    "sys.modules entries of the lazily imported comparisons replaced": """
import sys, types
for name, attr in (("fastcore.test", "is_close"), ("fastcore.imports", "equals")):
    fake = types.ModuleType(name)
    setattr(fake, attr, lambda *a, **k: True)
    sys.modules[name] = fake
""" + WRONG_ANSWER,
    "a finalizer run by the collector in the trusted thread forges the records": FORGE + """
import gc, time
class Bomb:
    def __init__(self):
        self.me = self
    def __del__(self):
        if _thread.get_ident() == MAIN:
            Bomb(); return
        forge()
Bomb()
gc.set_threshold(1)
time.sleep(2)
""",
    "a finalizer freed by the trusted thread's own reference forges the records": FORGE + """
import time
class Bomb:
    def __del__(self):
        if _thread.get_ident() != MAIN:
            forge()
def hold():
    b = Bomb()
    time.sleep(0.05)
for _ in range(20):
    hold()
""",
    "the harness's main code run again by a function given its code, against fake globals": """
import sys, types, builtins
real = sys._getframe().f_back                       # the harness's main frame: its code, and its locals to read
L = real.f_locals
go, park, overlay, k = L["go"], L["park"], L["overlay"], L["seq"]
rest = list(L["cells"])[k:]
fake_thread = types.SimpleNamespace(allocate_lock=lambda: go, get_ident=lambda: 0,
    start_new_thread=lambda f, args: args[1].put({"cells": [{"index": i, "source": "pass", "graded": True,
                                                            "names": list(overlay)} for i, *_ in rest],
                                                  "trusted": [], "roots": []}))
fake_sys = types.SimpleNamespace(modules={"__main__": types.SimpleNamespace()}, _getframe=sys._getframe,
                                 addaudithook=lambda h: None)
G = {"__builtins__": builtins, "sys": fake_sys, "_thread": fake_thread, "harness_park": park,
     "harness_trusted": lambda: None, "harness_tampered": None, "harness_snapshot": lambda r: ((), ()),
     "harness_guard": lambda *a: None, "harness_describe": None, "harness_overlay": lambda i: overlay,
     "enumerate": lambda cells: ((k + i, c) for i, c in builtins.enumerate(cells))}
f = eval("lambda: None", G)
f.__code__ = real.f_code          # refused; before the fix, every park of the copy was genuine and every cell passed
go.release()
f()
""",
    "a fake pyplot that undoes a patch before the check": """
import sys, types, numpy as np
import minitrain_inspect.core as core
original = core._close
fake = types.ModuleType('matplotlib.pyplot')
fake.close = lambda *a, **k: setattr(core, '_close', original)    # the harness closes figures after each cell
sys.modules['matplotlib.pyplot'] = fake
class SoftmaxCrossEntropy:
    def __call__(self, logits, targets):
        core._close = lambda *a, **k: True
        class Out: per_example_loss = np.zeros(len(targets), np.float32); loss = 0.0
        return Out()
    def backward(self, grad_output=1.0):
        core._close = lambda *a, **k: True
        return np.zeros(3)
""",
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


@needs_room
def test_the_tests_and_their_fixtures_are_the_references(course):
    """Every cell but the exercise is the instructor's: a wrong answer with the fixtures rewritten to agree with it, and
    cells added to redefine them, earns nothing; a right answer with every other cell gutted earns full marks."""
    reference = read_notebook(NBS / f"{STEM}.ipynb")
    wrong = json.loads(json.dumps(course["stubbed"]))
    wrong["cells"][_exercise_index(wrong)]["source"] = WRONG_ANSWER
    fixtures = [i for i, c in enumerate(wrong["cells"]) if "two_losses =" in "".join(c["source"])]
    assert fixtures, "the notebook's fixture cell moved: update this test"
    rigged = "two_losses = np.zeros(2)\nreference_per_example = lambda logits, targets: np.zeros(len(targets))\n"
    wrong["cells"][fixtures[0]]["source"] += "\n" + rigged
    wrong["cells"].insert(fixtures[0] + 1, {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                                             "source": rigged, "id": "added"})
    report = grade(_write_handin(course, wrong), timeout=60, reference=NBS, only=[STEM], workers=1)
    assert (report.points, report.max_points) == (0, 7), report.to_text()
    right = json.loads(json.dumps(course["stubbed"]))
    k = _exercise_index(right)
    right["cells"][k]["source"] = reference["cells"][k]["source"]
    for i, cell in enumerate(right["cells"]):
        if cell["cell_type"] == "code" and i != k:
            cell["source"] = "assert False, 'a gutted cell'"
    report = grade(_write_handin(course, right), timeout=60, reference=NBS, only=[STEM], workers=1)
    assert (report.points, report.max_points) == (7, 7), report.to_text()


@needs_room
@pytest.mark.parametrize("kind", ["link to the instructor's notebook", "link to /dev/zero", "FIFO"])
def test_a_handin_that_is_not_a_file_of_its_own_scores_zero_at_once(course, kind):
    folder = course["base"] / "alice" / "nbs"
    for p in folder.iterdir():
        p.unlink()
    target = folder / f"{STEM}.ipynb"
    if kind == "FIFO":
        os.mkfifo(target)
    else:
        target.symlink_to(NBS / f"{STEM}.ipynb" if "instructor" in kind else "/dev/zero")
    start = time.monotonic()
    report = grade(folder, timeout=30, reference=NBS, only=[STEM], workers=1)
    assert (report.points, report.max_points) == (0, 7) and time.monotonic() - start < 20, report.to_text()
    assert report.notebooks[0].status.startswith("not graded: cannot read notebook"), report.notebooks[0].status


@needs_room
def test_a_message_cannot_move_the_terminals_cursor(course):
    "Control characters in a failure's message (here an exception's type name) are shown as escapes, never sent."
    attack = "raise type('Fake\\x1b[2A\\rpassed 7/7\\x1b[8m', (Exception,), {})('\\x1b[2K\\r\\nforged')"
    report = _grade_with(course, WRONG_ANSWER, attack)
    text = report.to_text()
    assert "\x1b" not in text and "\r" not in text and (report.points, report.max_points) == (0, 7), repr(text)


@pytest.mark.parametrize("code", [124, 125])
def test_a_program_cannot_pass_for_the_rooms_own_exit_status(tmp_path, code):
    "124 (time limit) and 125 (no room) are the launcher's own: a program that exits with one reports 1 instead."
    work, log = tmp_path / "w", tmp_path / "log"
    work.mkdir()
    with open(log, "wb") as out:
        assert run_in_room([sys.executable, "-I", "-c", f"import os; os._exit({code})"], work, {}, 30, stdout=out) == 1
    assert f"the program exited with status {code}" in log.read_text()


@needs_room
def test_what_a_program_writes_is_capped_by_the_rooms_tmp(tmp_path):
    "The scratch folder lives in the room's /tmp (a tmpfs): 40 files of 60 MiB stop at its size, not at the disk's."
    from minitrain_inspect.sandbox import Limits
    work, log = tmp_path / "w", tmp_path / "log"
    work.mkdir()
    code = ("import os\nn = 0\ntry:\n    for i in range(40):\n        open(f'f{i}', 'wb').write(bytes(60 << 20)); n += 1\n"
            "except OSError as e:\n    print('stopped after', n, e.errno)\n")
    with open(log, "wb") as out:
        assert run_in_room([sys.executable, "-I", "-c", code], work, {}, 60, stdout=out) == 0
    assert "stopped after" in log.read_text() and " 28" in log.read_text(), log.read_text()      # ENOSPC
    assert sum(p.stat().st_size for p in work.iterdir()) <= Limits().tmp_bytes
