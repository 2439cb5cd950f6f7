"""The import contract of ``pyproject.toml`` (``[tool.importlinter]``): arrows point down and no
package or module circles, imports inside functions included. CI runs ``lint-imports`` on the
tree; these tests check that it holds here and that it would catch a break."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contract over the ``looprl`` package under ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run([str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "src" / "looprl", tree / "src" / "looprl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_tree_keeps_the_contract():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def _break(copy: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    path = copy / "src" / "looprl" / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + f"\n\ndef _deliberate():\n    {line}\n", encoding="utf-8")
        return _lint(copy)
    finally:
        path.write_text(original, encoding="utf-8")


def test_an_upward_import_inside_a_function_breaks_it(copy: Path):
    out = _break(copy, "sandbox/pool.py", "from looprl.train import run  # noqa")
    assert out.returncode != 0
    assert "looprl.sandbox.pool -> looprl.train" in out.stdout


def test_a_circle_between_two_modules_of_a_package_breaks_it(copy: Path):
    out = _break(copy, "harness/run_state.py", "from looprl.harness import agent  # noqa")
    assert out.returncode != 0
    assert "No cycles" in out.stdout and "BROKEN" in out.stdout


def test_docs_architecture_lists_the_contract_s_layers():
    """docs/architecture.md's layer table and the contract are one table, in one order."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    want = [sorted(m.strip() for m in layer.split("|")) for layer in contract["layers"]]
    rows = [line.split("|") for line in (ROOT / "docs" / "architecture.md").read_text(
        encoding="utf-8").splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    documented = [sorted(m.strip(" `") for m in row[2].split("·")) for row in rows]
    assert documented == want
