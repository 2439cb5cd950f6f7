"""Fixtures for sandbox tests: a small real repository, the project's venv, an async runner."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from pathlib import Path

import pytest

from tests.bwrap_support import bwrap_ok, needs_bwrap  # noqa: F401  (re-exported to the tests)


def run(coro):
    return asyncio.run(coro)


def tree_hash(root: Path) -> str:
    """Content + mode hash of a tree (to prove a base or venv was not touched)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}:{st.st_mode}:{st.st_size}".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture()
def base_repo(tmp_path: Path) -> Path:
    """A small package repository with a test, a binary file and a nested directory."""
    base = tmp_path / "repo"
    (base / "pkg" / "sub").mkdir(parents=True)
    (base / "pkg" / "__init__.py").write_text("")
    (base / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (base / "pkg" / "sub" / "data.txt").write_text("one\ntwo\nthree")  # no final newline
    (base / "pkg" / "logo.bin").write_bytes(bytes(range(256)))
    (base / "tests").mkdir()
    (base / "tests" / "test_calc.py").write_text(
        "from pkg.calc import add\n\ndef test_add():\n    assert add(2, 2) == 4\n")
    (base / "README.md").write_text("# repo\n")
    return base


@pytest.fixture()
def venv() -> str:
    """The project's own venv (a real venv with pytest installed)."""
    prefix = Path(sys.prefix)
    assert (prefix / "pyvenv.cfg").exists(), "run the tests with the project's .venv/bin/python"
    return str(prefix)
