"""The rollout runner under fuzzed policies (``tests/harness/turn_fuzz.py``) with the real tools
on the DirSandbox double: nothing a policy emits stops the run or loses a trajectory; each
trajectory is scored with the counts its turns were built with and saves as UTF-8 JSON; a
summary that outgrows the engine's window ends the trajectory as CONTEXT_FULL, scored.

    nice -n 15 .venv/bin/python -m pytest -q tests/rollout/test_runner_fuzz.py
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from looprl.chat import ChatFormat
from looprl.harness.run_state import AgentConfig, AgentExperimental
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools, tool_schemas
from looprl.models.tokenizer import build_tokenizer
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.types import Grader, Image, RewardBreakdown, StopReason, Task, Trajectory
from tests.harness.conftest import CALC, WindowedPolicy, call
from tests.harness.dir_sandbox import DirSandbox
from tests.harness.turn_fuzz import AGENT_TOOLS, check_trajectory, fuzz_turn


class DirPool:
    """``SandboxPool`` test double: every lease is a fresh DirSandbox over the task's repo."""

    @contextlib.asynccontextmanager
    async def lease(self, base: str, venv: str | None = None, *,
                    image: Image | None = None) -> AsyncIterator[DirSandbox]:
        sb = DirSandbox(base)
        try:
            yield sb
        finally:
            await sb.close()


async def score(task: Task, traj: Trajectory) -> RewardBreakdown:
    """Scorer double: what a grader needs of a trajectory is that it saves."""
    traj.to_json().encode("utf-8")
    return RewardBreakdown.of({"tests": 0.0})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "calc.py").write_text(CALC)
    (root / "README.md").write_text("# calc\n")
    (root / "notes.txt").write_text("".join(f"note {i:02d}: " + "x" * 20 + "\n" for i in range(10)))
    return root


async def collect(runner: RolloutRunner, tasks: list[Task]) -> list:
    return [r async for r in runner.run(tasks)]


@pytest.mark.slow  # ~8 s of CPU: 200 turns of real tools
def test_fuzzed_policies_never_stop_the_runner(repo: Path) -> None:
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    rng = random.Random(77)
    agent = AgentConfig(max_turns=10, context_window=10**8, max_total_new_tokens=10**8,
                        max_new_tokens=10**7, experimental=AgentExperimental(max_calls_per_turn=128))
    scripts = {f"fuzz-{k}": [fuzz_turn(rng, big=5_000,
                                       many=rng.randint(129, 160) if rng.random() < 0.03 else 0)
                             for _ in range(agent.max_turns)] for k in range(10)}
    tasks = [Task(tid, str(repo), "add() subtracts; make it add.", Grader("python -m pytest"))
             for tid in scripts]
    runner = RolloutRunner(lambda t: ScriptedPolicy(tok, [x.text for x in scripts[t.id]]), fmt,
                           DirPool(), score, RolloutConfig(group_size=2, max_in_flight=4,
                                                           tools=AGENT_TOOLS, agent=agent))
    results = asyncio.run(collect(runner, tasks))
    assert sorted(r.task.id for r in results) == sorted(scripts)
    assert runner.stats.infra_errors == 0 and runner.stats.groups_dropped == 0
    turns = 0
    for r in results:
        assert r.group is not None and len(r.group.trajectories) == 2
        for traj in r.group.trajectories:
            check_trajectory(traj, scripts[r.task.id], fmt, agent.experimental.max_calls_per_turn)
            assert traj.reward is not None
            turns += traj.counters.turns
    assert turns == 200


def test_the_engines_window_filling_in_a_summary_is_scored_not_a_crash(repo: Path) -> None:
    """``ContextFullError`` while the model writes a summary: the run goes on, the trajectory
    ends as CONTEXT_FULL and is scored (the model's doing), never dropped as infrastructure."""
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    tools = ("read_file", "finish")
    p = len(fmt.prompt_ids([{"role": "user", "content": "read the notes"}],
                           tool_schemas(make_tools(tools))))
    read = call("read_file", path="notes.txt")
    agent = AgentConfig(context_window=p + 1600, experimental=AgentExperimental(
        summarize_at_tokens=p + 700, max_summaries=3))
    runner = RolloutRunner(lambda t: WindowedPolicy(tok, [read, read, "summary", call("finish")],
                                                    window=p + 780),
                           fmt, DirPool(), score,
                           RolloutConfig(group_size=2, tools=tools, agent=agent))
    task = Task("long", str(repo), "read the notes", Grader("python -m pytest"))
    (result,) = asyncio.run(collect(runner, [task]))
    assert result.group is not None and runner.stats.infra_errors == 0
    for traj in result.group.trajectories:
        assert traj.stop_reason == StopReason.CONTEXT_FULL and traj.error is None
        assert traj.reward is not None and traj.counters.turns == 2
