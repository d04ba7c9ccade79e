"""README.md is nbs/index.ipynb rendered, and what it says is true: its Python runs verbatim, its commands parse,
its accuracy table reproduces, and the LICENSE matches settings.ini.

Quarto (behind `nbdev_readme`) cannot be installed here, so this test keeps README.md and the notebook in step.
Regenerate with `python tests/test_readme.py --write`."""
import configparser
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def render_readme() -> str:
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text(encoding="utf-8"))
    parts = []
    for cell in nb["cells"]:
        source = "".join(cell["source"]).strip()
        if not source or source.startswith("#| hide"):
            continue
        parts.append(source if cell["cell_type"] == "markdown" else f"```python\n{source}\n```")
    return "\n\n".join(parts) + "\n"


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    "The fenced code blocks of README.md in `language`."
    return re.findall(rf"^```{language}\n(.*?)^```", readme(), flags=re.S | re.M)


def test_readme_matches_index_notebook():
    assert readme() == render_readme(), "README.md is out of date: run `python tests/test_readme.py --write`"


def test_readme_gives_the_two_commands():
    text = readme()
    assert "bash .ci/test" in text
    assert "minitrain-inspect demo" in text or "minitrain-inspect train" in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/test" in ci, ".ci/run must call the README's test command"


PYTHON_BLOCKS = blocks("python")


def test_readme_has_the_plain_loop_example():
    loop = [b for b in PYTHON_BLOCKS if "Inspector(model, optimizer=opt, loss_fn=loss_fn).attach()" in b]
    assert loop, "the README must show the Inspector on a plain loop"
    assert not re.search(r"\.(begin_step|end_step|before_update|after_update)\(", loop[0]), \
        "the plain loop must need no step calls"


@pytest.mark.parametrize("number", range(len(PYTHON_BLOCKS)))
def test_readme_python_runs_verbatim(number, tmp_path, monkeypatch, capsys):
    "Each ```python block of the README, executed as it stands, in a fresh namespace and an empty folder."
    monkeypatch.chdir(tmp_path)
    source = PYTHON_BLOCKS[number]
    if "import torch" in source:
        pytest.importorskip("torch", reason="this block needs the optional torch extra")
    exec(compile(source, f"README.md python block {number + 1}", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    assert printed.strip(), f"block {number + 1} should print something a reader can compare with"
    if ".attach(model, opt, loss_fn," in source:
        # The plain loop diagnosed: the verdict, and the same verdict in the Inspector's history (the banner).
        assert printed.startswith("trustworthy HEALTHY: no check fired"), printed
    elif "import torch" in source:
        # The PyTorch model watched: every one of the 100 steps flushed into the history, and the dashboard written.
        assert printed.startswith("100 steps watched, loss "), printed
        assert (tmp_path / "torch-run.png").read_bytes()[:4] == b"\x89PNG"
    elif "Inspector(model, optimizer=opt, loss_fn=loss_fn)" in source:
        # The plain loop: every step counted from the optimiser, 96 steps, 0..95, and the dashboard written.
        assert printed.startswith("steps 0..95"), printed
        assert (tmp_path / "my-run.png").read_bytes()[:4] == b"\x89PNG"


def test_readme_commands_parse():
    "Every `minitrain-inspect ...` line in the README's bash blocks is accepted by the parser (flags exist)."
    from minitrain_inspect.cli import build_parser
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("minitrain-inspect ")]
    documented = {"--version", "dashboard", "--blas-threads"}
    assert documented <= {word for c in commands for word in c}, "the README must document " + str(documented)
    for argv in commands:
        if "--help" in argv or "--version" in argv:
            continue
        build_parser().parse_args(argv)          # exits (failing the test) on an unknown flag or subcommand


ACCURACY_ROWS = {"held-out regular": "regular_val", "training irregular": "irregular_train",
                 "held-out irregular": "irregular_val"}


def _readme_accuracy() -> dict:
    "The first table: key -> (the value printed, the band's low end, its high end), to two decimals as printed."
    rows = re.findall(r"^\| (held-out regular|training irregular|held-out irregular) verbs[^|]*"
                      r"\| ([0-9.]+) \| ([0-9.]+) to ([0-9.]+) \|$", readme(), flags=re.M)
    assert len(rows) == 3, "README.md: the accuracy table needs three rows: value | low to high"
    return {ACCURACY_ROWS[name]: tuple(float(v) for v in values) for name, *values in rows}


def _readme_kernel_rows() -> list:
    "The table of kernels: (kernels, three accuracies in the first table's order)."
    rows = re.findall(r"^\| ([^|]+) \| [^|]+ \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", readme(), flags=re.M)
    return [(name, tuple(float(v) for v in values)) for name, *values in rows]


def test_readme_accuracy_tables_agree_with_the_band():
    "Each value the README prints lies in its band, and the band is what the float32 kernels measured span."
    table = _readme_accuracy()
    assert all(low <= value <= high for value, low, high in table.values()), table
    float32 = [accs for name, accs in _readme_kernel_rows() if "float64" not in name]
    assert len(float32) >= 4, "README.md: the table of kernels lists the float32 runs measured"
    for i, key in enumerate(ACCURACY_ROWS.values()):
        measured, (low, high) = [accs[i] for accs in float32], table[key][1:]     # three decimals against two
        assert abs(min(measured) - low) <= 0.0051 and abs(max(measured) - high) <= 0.0051, (key, measured, low, high)


def test_readme_accuracy_table_reproduces():
    """The default configuration lands in the README's band (measured over OpenBLAS's kernels): float32 training
    depends on the machine's matrix kernels, so the last digits may move between machines, not out of the band."""
    from minitrain_inspect.train import TrainConfig, train
    result = train(TrainConfig(progress=False))
    for key, (_, low, high) in _readme_accuracy().items():
        assert low <= round(result.accuracy[key], 2) <= high, (key, result.accuracy[key], low, high)


def test_license_matches_settings():
    settings = configparser.ConfigParser()
    settings.read(ROOT / "settings.ini")
    assert settings["DEFAULT"]["license"] == "apache2"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    assert f"Copyright {settings['DEFAULT']['copyright']}" in text
    assert "[yyyy]" not in text, "the appendix's placeholder must carry the project's copyright line"


if __name__ == "__main__" and "--write" in sys.argv:
    (ROOT / "README.md").write_text(render_readme(), encoding="utf-8")
