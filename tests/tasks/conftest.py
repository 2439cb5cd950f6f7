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
