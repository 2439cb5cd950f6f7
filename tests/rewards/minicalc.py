"""The grading tests' task: the example package with a bug in ``clamp``, graded by the project's
own venv (a real pytest) with a real task command."""

from __future__ import annotations

import sys
from pathlib import Path

from looprl.diffs import unified_diff
from looprl.types import Grader, Task
from tests.example_package import write_example_package

CLAMP_TESTS = tuple(f"tests/test_core.py::test_clamp_{x}" for x in ("inside", "low", "high"))
MEAN = ("tests/test_core.py::test_mean", "tests/test_core.py::test_mean_empty")
CORE = "src/minicalc/core.py"
# the project venv has many pytest plugins; skipping their autoload keeps each run fast
CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=src python -m "
       "pytest -p no:cacheprovider -q -rA --tb=short --color=no -o addopts=")
FIX = "sed -i 's/if x < hi:/if x > hi:/' src/minicalc/core.py"
"""The gold patch as a command run in the workspace."""


def clamp_task(home: Path) -> Task:
    repo = write_example_package(home / "minicalc")
    core = repo / CORE
    original = core.read_text()
    core.write_text(original.replace("if x > hi:", "if x < hi:"))
    gold = unified_diff(CORE, core.read_text(), original)
    return Task("minicalc-clamp", str(repo), "clamp is wrong", venv=sys.prefix, gold_patch=gold,
                grader=Grader(CMD, CLAMP_TESTS[1:], (CLAMP_TESTS[0], *MEAN),
                              ("tests/test_core.py", "pyproject.toml"), timeout_s=60))
