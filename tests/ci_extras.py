"""What `.ci/run` installs, for tests that must fail rather than skip in CI when an optional extra is missing."""
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ci_extras() -> set:
    "The extras .ci/run installs (`pip install -e \".[dev,torch,...]\"`), if this is CI (CI=true); else none."
    if os.environ.get("CI") != "true":
        return set()
    found = re.search(r'\.\[([a-z,]+)\]', (ROOT / ".ci" / "run").read_text())
    return set(found.group(1).split(",")) if found else set()
