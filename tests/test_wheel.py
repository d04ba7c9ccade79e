"""The package as users install it (issue 24 §2): a wheel built with `pip wheel .`, installed into a fresh virtual
environment, its command line run from outside the source tree; and output folders that follow the umask."""
import json
import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel installed (without its dependencies, which come from this environment through a
    .pth file, so the test needs no network): the path of its `minitrain-inspect` script."""
    base = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(base / "dist")], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((base / "dist").glob("minitrain_inspect-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True, timeout=120)
    venv_python = base / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "no such option: --python" in done.stderr:
        pytest.skip("this pip cannot install into another environment (pip >= 22.3 can)")
    assert done.returncode == 0, done.stderr[-2000:]
    work = base / "elsewhere"
    work.mkdir()
    return base / "venv" / "bin" / "minitrain-inspect", work


def run(installed, *args, timeout=600):
    script, work = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")     # nbconvert's templates: data files of this env
    return subprocess.run([str(script), *map(str, args)], cwd=work, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_wheel_is_the_package_and_not_the_checkout(installed):
    script, work = installed
    where = subprocess.run([str(script.with_name("python")), "-c", "import minitrain_inspect; print(minitrain_inspect.__file__)"],
                           cwd=work, capture_output=True, text=True, check=True).stdout.strip()
    assert "site-packages" in where and not where.startswith(str(ROOT)), where


def test_the_main_commands_work_outside_the_tree(installed):
    _, work = installed
    r = run(installed, "train", "--steps", "30", "--json")
    assert r.returncode == 0, r.stderr
    assert {"params_sha256", "accuracy"} <= set(json.loads(r.stdout)), r.stdout[:300]
    r = run(installed, "demo", "--out", work / "demo", "--steps", "40", "--quiet", "--no-benchmark")
    assert r.returncode == 0 and (work / "demo" / "history.jsonl").is_file(), r.stderr
    r = run(installed, "dashboard", work / "demo" / "history.jsonl", "--out", work / "again.png")
    assert r.returncode == 0 and (work / "again.png").stat().st_size > 10_000, r.stderr
    r = run(installed, "export", work / "demo" / "history.jsonl", "--to", "csv", "--out", work / "csv")
    assert r.returncode == 0 and (work / "csv" / "scalars.csv").is_file(), r.stderr
    r = run(installed, "trace", "--compare", "float64", "--out", work / "trace")
    assert r.returncode in (0, 1) and (work / "trace" / "comparison.json").is_file(), r.stderr


@pytest.mark.parametrize("command", [("release", "--out", "R"), ("docs", "--out", "D"), ("mutants", "--only", "02_losses")])
def test_the_course_commands_say_they_need_a_checkout(installed, command):
    r = run(installed, *command)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--course DIR" in r.stderr and "installed package carries no notebooks" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["release", "docs", "mutants"])
def test_the_course_commands_say_in_their_help_what_they_need(installed, command):
    r = run(installed, command, "--help")
    assert r.returncode == 0 and "--course DIR" in r.stdout and "settings.ini and nbs/" in " ".join(r.stdout.split())


def test_release_and_docs_with_a_named_checkout(installed):
    _, work = installed
    r = run(installed, "release", "--course", ROOT, "--out", work / "student")
    assert r.returncode == 0 and (work / "student" / "nbs" / "02_losses.ipynb").is_file(), r.stderr
    r = run(installed, "docs", "--course", ROOT, "--out", work / "site")
    assert r.returncode == 0 and (work / "site" / "index.html").is_file(), r.stderr
    r = run(installed, "release", "--course", work, "--out", work / "x")
    assert r.returncode == 2 and "not a course checkout" in r.stderr, r.stderr


def test_missing_extras_are_named_as_an_installed_package_needs_them():
    from minitrain_inspect import course, export, panels, twin
    for hint in (course.DEV_HINT, course.TORCH_HINT, export.TENSORBOARD_HINT, panels.PANDAS_HINT, twin.INSTALL_HINT):
        assert 'pip install "minitrain-inspect[' in hint and "-e" not in hint.split(), hint


def test_output_folders_follow_the_umask(tmp_path):
    "release, trace and docs stage in a private folder; the folder they leave has the mode the umask gives."
    script = Path(sys.executable).with_name("minitrain-inspect")
    commands = {"release": ["release", "--out", tmp_path / "release"],
                "trace": ["trace", "--compare", "float64", "--out", tmp_path / "trace"],
                "docs": ["docs", "--out", tmp_path / "docs"],
                "demo": ["demo", "--out", tmp_path / "demo", "--steps", "20", "--quiet", "--no-benchmark"]}
    for name, args in commands.items():
        r = subprocess.run(["sh", "-c", 'umask 027 && exec "$@"', "sh", str(script), *map(str, args)],
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert r.returncode in (0, 1), (name, r.stderr)
        assert stat.S_IMODE(args[args.index("--out") + 1].stat().st_mode) == 0o750, name
