"""Fixtures for the harness tests: a small real Python repo, the DirSandbox test double, the
bytes-only tokenizer, a helper to write tool calls and an engine double with a window of its
own."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from looprl.chat import ChatFormat
from looprl.errors import ContextFullError
from looprl.harness.run_state import AgentConfig, AgentExperimental
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import ToolContext
from looprl.models.tokenizer import build_tokenizer
from looprl.types import Grader, Task
from tests.bwrap_support import bwrap_ok, needs_bwrap  # noqa: F401  (re-exported to the tests)

from .dir_sandbox import DirSandbox

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TEST_CALC = ("from pkg.calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
             "def test_sub():\n    assert sub(3, 2) == 1\n")


def calc_repo(root: Path) -> Path:
    """A two-function package whose ``add`` subtracts, with its tests, at ``root``."""
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(CALC)
    (root / "tests" / "test_calc.py").write_text(TEST_CALC)
    return root


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def agent_config(**fields: object) -> AgentConfig:
    """An ``AgentConfig`` from flat keywords: those of ``AgentExperimental`` go to its section."""
    inner = {f.name for f in dataclasses.fields(AgentExperimental)}
    return AgentConfig(**{k: v for k, v in fields.items() if k not in inner},  # type: ignore[arg-type]
                       experimental=AgentExperimental(**{k: v for k, v in fields.items()  # type: ignore[arg-type]
                                                         if k in inner}))


class WindowedPolicy(ScriptedPolicy):
    """The scripted engine with an engine's own context window, smaller than the agent's: a
    prompt longer than ``window`` raises ``ContextFullError``, as a real engine does."""

    def __init__(self, tok, turns, window: int) -> None:
        super().__init__(tok, turns)
        self.window = window

    async def generate(self, prompt_ids, params, **kw):
        if len(prompt_ids) > self.window:
            raise ContextFullError(f"prompt of {len(prompt_ids)} tokens > {self.window}")
        return await super().generate(prompt_ids, params, **kw)


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(None)


@pytest.fixture(scope="session")
def fmt(tok):
    return ChatFormat(tok)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = calc_repo(tmp_path / "repo")
    (root / "README.md").write_text("# calc\n\nA tiny calculator.\n")
    return root


def make_sandbox(kind: str, repo: Path):
    if kind == "dir":
        return DirSandbox(repo)
    from looprl.sandbox import create_sandbox

    return asyncio.run(create_sandbox(repo, venv=sys.prefix))


def ws_root(sb) -> Path:
    """The host directory behind a sandbox's workspace (to plant symlinks in tests)."""
    return sb.root if isinstance(sb, DirSandbox) else Path(sb.workspace.path)


@pytest.fixture(params=["dir", pytest.param("bwrap", marks=needs_bwrap)])
def sandbox(request, repo: Path):
    """Each test using it runs on the DirSandbox double AND on the real bubblewrap sandbox."""
    sb = make_sandbox(request.param, repo)
    yield sb
    asyncio.run(sb.close())


@pytest.fixture
def dsandbox(repo: Path):
    """The DirSandbox double only (for loop-logic tests that do not depend on the sandbox)."""
    sb = DirSandbox(repo)
    yield sb
    asyncio.run(sb.close())


@pytest.fixture
def ctx(sandbox) -> ToolContext:
    return ToolContext(sandbox=sandbox)


@pytest.fixture
def task(repo: Path) -> Task:
    return Task(id="calc-1", repo=str(repo), prompt="add() subtracts; make it add.",
                grader=Grader("python -m pytest", fail_to_pass=("tests/test_calc.py::test_add",)))
