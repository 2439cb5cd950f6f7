"""Fixtures: the offline example package recorded once per session (sandboxed pytest runs), and
LOOPRL_HOME pointed at a temporary directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from looprl.tasks.sources import PackageSnapshot, build_venv, record_snapshot
from tests.example_package import write_example_package


@pytest.fixture(scope="session")
def looprl_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("looprl_home")
    old = os.environ.get("LOOPRL_HOME")
    os.environ["LOOPRL_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("LOOPRL_HOME", None)
    else:
        os.environ["LOOPRL_HOME"] = old


@pytest.fixture(scope="session")
def example_snapshot(looprl_home, tmp_path_factory) -> PackageSnapshot:
    repo = write_example_package(tmp_path_factory.mktemp("pkg") / "minicalc")
    venv = looprl_home / "venv-minicalc"
    build_venv(venv, [])  # a lean venv (pytest only), like a fetched package's
    return asyncio.run(record_snapshot("minicalc", "0.1", "local0000000", repo, venv))


@pytest.fixture(scope="session")
def lean_task(example_snapshot, tmp_path_factory):
    """A task of the example package (the clamp bug) with the snapshot's lean venv (pytest
    only): what export writes and import rebuilds from the package registry."""
    import shutil

    from looprl.diffs import unified_diff
    from looprl.types import Grader, Task
    from tests.rewards.minicalc import CLAMP_TESTS, CORE, MEAN

    repo = tmp_path_factory.mktemp("lean") / "repo"
    shutil.copytree(example_snapshot.repo, repo)
    core = repo / CORE
    original = core.read_text()
    core.write_text(original.replace("if x > hi:", "if x < hi:"))
    return Task("minicalc-clamp", str(repo), "clamp is wrong for values above the range",
                Grader(example_snapshot.test_command, CLAMP_TESTS[1:], (CLAMP_TESTS[0], *MEAN),
                       example_snapshot.test_files, timeout_s=60),
                venv=example_snapshot.venv, gold_patch=unified_diff(CORE, core.read_text(), original),
                metadata={"package": "minicalc", "version": "0.1", "source_kind": "mutation"})
