"""Each class of infrastructure failure injected alone, through the real runner, sandboxes, env
server, engine and grader: every failed attempt lands in that class, the run's ledger counts
exactly what the injector's books say settled, nothing injected reaches a scored trajectory,
and every task still gets its group."""

import asyncio
import contextlib
import copy
import dataclasses
import sys
from pathlib import Path

import pytest

from looprl import faults
from looprl.chat import ChatFormat
from looprl.errors import InfraKind
from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
from looprl.harness.agent import AgentConfig
from looprl.harness.scripted import ScriptedPolicy
from looprl.inference import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.tests import pytest_command
from looprl.rollout.config import RolloutConfig, RolloutExperimental
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_tests_scorer
from looprl.sandbox import SandboxPool
from looprl.sandbox.remote_pool import serving
from looprl.types import Grader, Task
from tests.trainer.test_grpo_loop import _model

pytestmark = [pytest.mark.needs_bwrap, pytest.mark.slow]
VENV = str(Path(sys.executable).parent.parent)
TURNS = ['<tool_call>{"name": "run_terminal", "arguments": {"command": "echo hi"}}</tool_call>',
         '<tool_call>{"name": "finish", "arguments": {}}</tool_call>']
"""A scripted rollout that crosses every sandbox boundary: lease, a command, the diff, grading."""
SILENT = ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>']
"""A rollout that runs no command of its own: only grading runs commands."""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[Task]:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    grader = Grader(pytest_command(), ("test_calc.py::test_add",), (), ("test_calc.py",), timeout_s=60)
    return [Task(f"calc-{i}", str(repo), "add(2, 3) should be 5", grader, VENV) for i in range(6)]


def run_with(kind: InfraKind, tasks: list[Task], rate: float, *, http: bool = False,
             engine: bool = False, turns: list[str] = TURNS):
    """Every task's group through the runner with ``kind`` injected at ``rate``; returns the
    results, the ledger and the injector."""
    tok = build_tokenizer(None)
    inj = FaultInjector(FaultsConfig({kind.value: rate}, seed=7))
    ledger = InfraLedger()
    # retries enough that a group keeps both rollouts at these rates (with 6, one env_server_5xx
    # run lost one on a loaded machine)
    cfg = RolloutConfig(group_size=2, max_in_flight=4,
                        experimental=RolloutExperimental(max_infra_retries=12, min_group_size=1),
                        tools=("run_terminal", "finish"),
                        agent=AgentConfig(max_turns=3, max_new_tokens=12 if engine else 200,
                                          context_window=16384))

    async def main():
        policy = (TorchEngine(copy.deepcopy(_model(tok)), tok, max_len=16384) if engine
                  else ScriptedPolicy(tok, turns))
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(serving(tasks, max_running=4)) if http else \
                SandboxPool(max_running=4)
            try:
                runner = RolloutRunner(policy, ChatFormat(tok), pool, make_tests_scorer(), cfg,
                                       ledger=ledger)
                return [r async for r in runner.run(tasks)]
            finally:
                await pool.close()
                if engine:
                    policy.close()

    before = faults.install(inj)
    try:
        return asyncio.run(main()), ledger, inj
    finally:
        faults.install(before)


@pytest.mark.parametrize("kind,rate,http,engine", [
    # the rate per crossing: lower where an attempt crosses the boundary several times
    (InfraKind.SANDBOX_CREATE, 0.3, False, False), (InfraKind.EXEC_TIMEOUT, 0.3, False, False),
    (InfraKind.GRADER_CRASH, 0.3, False, False), (InfraKind.ENGINE_ERROR, 0.3, False, True),
    (InfraKind.ENV_SERVER_5XX, 0.15, True, False),
    (InfraKind.CONNECTION_DROPPED, 0.15, True, False)],
    ids=lambda v: v.value if isinstance(v, InfraKind) else None)
def test_a_class_injected_alone_lands_in_its_class_and_is_never_scored(tasks, kind, rate, http,
                                                                       engine):
    results, ledger, inj = run_with(kind, tasks, rate, http=http, engine=engine)
    assert sorted(r.task.id for r in results) == sorted(t.id for t in tasks)  # no task lost
    books = inj.books()
    assert books["open"] == {} and books["cut_off"] == {}
    failed = {k: n for k, n in ledger.counts().items() if n}
    assert failed == {kind.value: books["settled"][kind.value]}, (failed, books)
    assert failed[kind.value] >= 1
    scored = [t for r in results if r.group for t in r.group.trajectories]
    assert len(scored) == 2 * len(tasks) and all(t.reward is not None for t in scored)
    assert ledger.attempts == len(scored) + failed[kind.value]  # each failure, one retry
    assert not any(faults.MARK in t.to_json() for t in scored)
    assert all(t.infra_kind == kind.value for r in results for t in r.lost)


def test_without_the_injector_nothing_fails(tasks):
    results, ledger, inj = run_with(InfraKind.SANDBOX_CREATE, tasks, 0.0, http=True)
    assert not any(ledger.counts().values()) and inj.books()["injected"] == {}
    assert ledger.attempts == 2 * len(tasks) and all(r.group for r in results)


def test_a_hung_grading_command_is_infrastructure_not_a_zero(tasks):
    """A policy that only finishes crosses the command boundary in grading alone: a grader's
    command that hangs is an infrastructure failure, retried, never a scored 0."""
    # grades are cached per process by task and diff: new ids, so this run grades afresh
    silent = [dataclasses.replace(t, id=f"{t.id}-silent") for t in tasks]
    results, ledger, inj = run_with(InfraKind.EXEC_TIMEOUT, silent, 0.3, turns=SILENT)
    books = inj.books()
    failed = {k: n for k, n in ledger.counts().items() if n}
    assert failed == {"exec_timeout": books["settled"]["exec_timeout"]} and failed["exec_timeout"] >= 1
    scored = [t for r in results if r.group for t in r.group.trajectories]
    assert len(scored) == 2 * len(silent) and all(t.reward is not None for t in scored)
    assert not any(faults.MARK in t.to_json() for t in scored)
