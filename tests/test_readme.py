"""README.md is nbs/index.ipynb rendered: markdown cells as they are, code cells as Python blocks.

Quarto (behind `nbdev_readme`) cannot be installed here, so this test keeps the two in step.
Regenerate with `python tests/test_readme.py --write`."""
import json
import sys
from pathlib import Path

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


def test_readme_matches_index_notebook():
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render_readme(), \
        "README.md is out of date: run `python tests/test_readme.py --write`"


def test_readme_gives_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash .ci/test" in text
    assert "minitrain-inspect demo" in text or "minitrain-inspect train" in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/test" in ci, ".ci/run must call the README's test command"


if __name__ == "__main__" and "--write" in sys.argv:
    (ROOT / "README.md").write_text(render_readme(), encoding="utf-8")
