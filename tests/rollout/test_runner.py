"""The rollout runner over real sandboxes: oracle groups score 1, null groups 0, infrastructure
failures are retried and never scored, and groups overlap under one in-flight bound."""

import asyncio
import sys
from pathlib import Path

import pytest

from looprl.chat import ChatFormat
from looprl.errors import SandboxError
from looprl.harness.agent import AgentConfig
from looprl.harness.oracle import OracleAgent
from looprl.harness.scripted import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.tests import pytest_command
from looprl.rollout.config import RolloutConfig, RolloutExperimental
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.types import Grader, GroupResult, StopReason, Task

pytestmark = pytest.mark.needs_bwrap
VENV = str(Path(sys.executable).parent.parent)

GOLD = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Task:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\n"
                                       "def test_zero():\n    assert add(0, 0) == 0\n")
    grader = Grader(pytest_command(), ("test_calc.py::test_add",),
                    ("test_calc.py::test_zero",), ("test_calc.py",), timeout_s=60)
    return Task("calc-1", str(repo), "add() gives -1 for add(2, 3)", grader, VENV, GOLD)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(None)


def _runner(policy, tok, pool, g=3, max_in_flight=4, **experimental) -> RolloutRunner:
    cfg = RolloutConfig(group_size=g, max_in_flight=max_in_flight, agent=AgentConfig(max_turns=6),
                        experimental=RolloutExperimental(**experimental))
    return RolloutRunner(policy, ChatFormat(tok), pool, make_scorer(), cfg)


async def _collect(runner, tasks):
    return [r async for r in runner.run(tasks)]


def test_oracle_groups_score_one_and_null_groups_zero(task, tok):
    async def main():
        pool = SandboxPool(max_running=8)
        try:
            oracle = _runner(lambda t: OracleAgent(t, tok), tok, pool)
            null = _runner(ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'] * 9),
                           tok, pool)
            return await _collect(oracle, [task, task]), await _collect(null, [task])
        finally:
            await pool.close()

    oracle_results, null_results = asyncio.run(main())
    assert len(oracle_results) == 2
    for r in oracle_results:
        assert r.group is not None and len(r.group.trajectories) == 3
        assert r.group.rewards_G and all(t.reward.components["tests"] == 1.0 for t in r.group.trajectories)
        assert all(t.stop_reason == StopReason.FINISHED for t in r.group.trajectories)
    (null,) = null_results
    assert null.group is not None
    assert [t.reward.components["tests"] for t in null.group.trajectories] == [0.0, 0.0, 0.0]


class FlakyPool:
    """A test double over the real pool whose first ``failures`` leases crash (an infra failure)."""

    def __init__(self, inner: SandboxPool, failures: int):
        self.inner, self.failures = inner, failures

    def lease(self, base, venv=None, image=None):
        if self.failures > 0:
            self.failures -= 1
            raise SandboxError("sandbox host crashed (injected)")
        return self.inner.lease(base, venv, image=image)


def test_infra_failures_are_retried_then_dropped_never_scored(task, tok):
    async def main(failures, retries):
        pool = SandboxPool(max_running=4)
        try:
            runner = _runner(lambda t: OracleAgent(t, tok), tok, FlakyPool(pool, failures), g=2,
                             max_infra_retries=retries, max_in_flight=1)
            return await runner.run_group(task), runner.stats
        finally:
            await pool.close()

    result, stats = asyncio.run(main(failures=1, retries=1))
    assert result.group is not None and len(result.group.trajectories) == 2
    assert result.infra_errors == 1 and stats.infra_errors == 1
    assert all(t.reward.components["tests"] == 1.0 for t in result.group.trajectories)

    result, stats = asyncio.run(main(failures=3, retries=0))
    assert result.group is None and "infrastructure" in result.dropped
    assert stats.groups_dropped == 1


def test_groups_overlap_under_one_bound(task, tok):
    """Slow and fast rollouts share the slots: total wall ≈ the busiest slot, not the sum of groups."""
    in_flight = []

    class CountingPool(FlakyPool):
        def lease(self, base, venv=None, image=None):
            cm = self.inner.lease(base, venv, image=image)
            outer = self

            class _CM:
                async def __aenter__(self):
                    sb = await cm.__aenter__()
                    outer.now = getattr(outer, "now", 0) + 1
                    in_flight.append(outer.now)
                    return sb

                async def __aexit__(self, *exc):
                    outer.now -= 1
                    return await cm.__aexit__(*exc)
            return _CM()

    async def main():
        pool = SandboxPool(max_running=8)
        try:
            runner = _runner(lambda t: OracleAgent(t, tok), tok, CountingPool(pool, 0), g=2,
                             max_in_flight=4)
            return await _collect(runner, [task] * 4)
        finally:
            await pool.close()

    results = asyncio.run(main())
    assert len(results) == 4 and all(r.group for r in results)
    assert max(in_flight) <= 4
    assert max(in_flight) > 2, "trajectories of different groups should run at the same time"


@pytest.mark.parametrize("max_ready", [None, 1])
def test_max_ready_stops_admitting_while_finished_groups_wait(task, tok, max_ready):
    """A consumer that holds the first group (a trainer stepping) gets no backlog of groups sampled
    meanwhile when ``max_ready`` is set; without it every task is rolled out at once."""
    runner = _runner(None, tok, None, g=2, max_in_flight=4)
    started, slots = [], asyncio.Semaphore(2)  # 4 in flight / groups of 2

    async def fake_group(t):
        async with slots:
            started.append(t.id)
            runner._pending -= runner.cfg.group_size  # its trajectories took their slots
            await asyncio.sleep(0.01)
            return GroupResult(t, None)

    runner._group = fake_group

    async def main():
        agen = runner.run([task] * 8, max_ready=max_ready)
        first = await agen.__anext__()
        await asyncio.sleep(0.3)  # the trainer steps
        seen = len(started)
        rest = [r async for r in agen]
        return first, seen, rest

    first, seen, rest = asyncio.run(main())
    assert first.task is task and len(rest) == 7 and len(started) == 8
    if max_ready is None:
        assert seen == 8
    else:
        assert seen <= 4, started


def test_the_screen_stops_a_group_none_of_whose_first_rollouts_passed(task, tok):
    """``screen=2`` of 4: a policy that never passes costs 2 rollouts and comes back screened out;
    one that passes runs the other 2 and brings its whole group."""
    null_turns = ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'] * 9

    async def main():
        pool = SandboxPool(max_running=8)
        try:
            oracle = _runner(lambda t: OracleAgent(t, tok), tok, pool, g=4, screen=2)
            null = _runner(ScriptedPolicy(tok, null_turns), tok, pool, g=4, screen=2)
            return (await _collect(oracle, [task]), oracle), (await _collect(null, [task]), null)
        finally:
            await pool.close()

    ([passed], oracle), ([failed], null) = asyncio.run(main())
    assert passed.group is not None and not passed.screened_out
    assert len(passed.group.trajectories) == 4 and all(t.passed for t in passed.group.trajectories)
    assert oracle.stats.trajectories == 4 and oracle.stats.groups_screened_out == 0
    assert failed.group is None and failed.dropped is None
    assert len(failed.screened_out) == 2 and not any(t.passed for t in failed.screened_out)
    assert null.stats.trajectories == 2 and null.stats.groups_screened_out == 1
    assert oracle._pending == 0 and null._pending == 0


def test_notes_persist_across_trajectories_of_one_repository(task, tok):
    """Trajectory 1 (function add) writes a note with the memory tool; a later task of the same
    repository (function zero) starts with it in its prompt; add's own next task does not."""
    import dataclasses
    import json

    note = '<tool_call>{"name": "memory", "arguments": {"action": "add", "note": "calc.py holds add"}}</tool_call>'
    done = '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'
    first = dataclasses.replace(task, metadata={"package": "calc", "functions": "add"})
    other = dataclasses.replace(task, id="calc-2", metadata={"package": "calc", "functions": "zero"})

    async def main(notes_chars):
        pool = SandboxPool(max_running=4)
        try:
            runner = _runner(ScriptedPolicy(tok, [note, done]), tok, pool, g=2, notes_chars=notes_chars)
            a = await _collect(runner, [first])
            b = await _collect(runner, [other, dataclasses.replace(first, id="calc-3")])
            return a, b
        finally:
            await pool.close()

    (a,), later = asyncio.run(main(200))
    assert json.loads(a.group.trajectories[0].metadata["memory"]) == ["calc.py holds add"]
    assert all("Notes you kept" not in m["content"] for t in a.group.trajectories
               for m in t.messages if m["role"] == "user")  # the first task had none to read
    by_id = {r.task.id: r for r in later}
    seen = by_id["calc-2"].group.trajectories[0].messages
    user = next(m["content"] for m in seen if m["role"] == "user")
    assert user.startswith("Notes you kept") and "- calc.py holds add" in user
    own = next(m["content"] for m in by_id["calc-3"].group.trajectories[0].messages if m["role"] == "user")
    assert "calc.py holds add" not in own  # never the notes of its own function
    (_,), later_off = asyncio.run(main(0))  # off: nothing carries over
    assert all("Notes you kept" not in m["content"] for r in later_off
               for m in r.group.trajectories[0].messages if m["role"] == "user")
