"""The rollout runner: groups of trajectories through the harness, on one engine and a sandbox pool.

    runner = RolloutRunner(engine, ChatFormat(tok), SandboxPool(32), score, RolloutConfig())
    async for result in runner.run(tasks):      # GroupResults, in completion order
        if result.group: queue.put(result.group)

Load balancing: every trajectory of every group is its own coroutine, admitted by one
semaphore of ``max_in_flight`` slots shared across groups. A short rollout frees its slot at once
and the next trajectory (of this group or the next) takes it, so rollouts of very different
lengths never leave the engine's continuous batch idle. Groups are admitted while fewer than one
group's worth of trajectories is waiting, so the queue stays short and policy lag stays low.

Failure policy: an infrastructure failure (sandbox, engine, grader) retries that trajectory in a
fresh sandbox up to ``max_infra_retries`` times and is then dropped — never scored. Each failed
attempt carries its class (``Trajectory.infra_kind``, the taxonomy of ``looprl.errors``) and is
counted in the run's ``InfraLedger`` when there is one; each attempt runs in a fault scope
(``looprl.faults.scope``), so the fault injector's books tell what it injected into attempts that
came back from those cut off. Model errors
(broken calls, timeouts, wrong answers) are kept: they are the signal. A group with fewer than
``min_group_size`` scored trajectories is dropped and counted. No trajectory stops the run:
``run_agent`` turns whatever the policy emits into a trajectory, so what fails around it (the
lease, the tools' set-up, the grader, or a bug) was not the model's doing: the attempt is logged
and counted as an infrastructure failure.

Targeted feedback (``hints_per_group > 0``, issue 54): once a group is complete, its first failed
trajectories that ``rewards.hints`` can blame a turn of are continued from that turn with the
hint (``harness.hinted``, on an executor with ``attempt_hinted``: this module's; a Ray fleet runs
none), scored, and kept in ``Group.hinted`` (never in the group's advantages). They take the same
slots as rollouts but are not fault-scoped nor counted in the ledger (not the run's attempts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from looprl import faults
from looprl.chat import ChatFormat
from looprl.errors import InfraKind, LooprlError, infra_kind
from looprl.faults import InfraLedger
from looprl.harness.agent import run_agent
from looprl.harness.hinted import continue_with_hint
from looprl.harness.notes import Notebook
from looprl.harness.tools import make_tools
from looprl.protocols import Engine
from looprl.rewards.hints import Hint, find_hint
from looprl.rollout.config import RolloutConfig
from looprl.types import (
    Counters,
    Group,
    GroupResult,
    Metadata,
    RewardBreakdown,
    StopReason,
    Task,
    Trajectory,
)

Scorer = Callable[[Task, Trajectory], Awaitable[RewardBreakdown | None]]
"""Grades a finished trajectory; ``None`` = cannot be judged (dropped). Raises ``RewardError``
(infra) when the grader itself fails."""

PolicyFor = Callable[[Task], Engine]
"""Per-task policies (the oracle) are built by a factory; a shared engine is passed as is."""

ResourcesFor = Callable[[Task], dict[str, Any]]
"""Per-task tool resources, e.g. ``{"search_index": ..., "test_command": ...}``."""

log = logging.getLogger(__name__)


@dataclass
class RunnerStats:
    """Counters for dashboards and training logs."""

    trajectories: int = 0
    infra_errors: int = 0
    groups: int = 0
    groups_dropped: int = 0
    groups_screened_out: int = 0
    busy_s: float = 0.0


class Executor(Protocol):
    """Where a trajectory attempt runs: in this process (``LocalExecutor``) or on a node of a Ray
    fleet (``looprl.fleet``). The runner brackets each group with ``open_group``/``close_group``
    so an executor can route all of a group's attempts to one engine replica."""

    def open_group(self, group_id: str, size: int) -> None: ...

    def close_group(self, group_id: str) -> None: ...

    async def attempt(self, task: Task, group_id: str, traj_id: str) -> Trajectory:
        """One attempt, scored, or an ``INFRA_ERROR`` trajectory (raises only for a bad config,
        e.g. an unknown tool)."""
        ...


class LocalExecutor:
    """Attempts in this process: a sandbox leased from ``pool``, the harness on the task's engine,
    then ``score``. Whatever fails around ``run_agent`` becomes an ``INFRA_ERROR`` trajectory."""

    def __init__(self, policy: Engine | PolicyFor, fmt: ChatFormat, pool: Any, score: Scorer,
                 cfg: RolloutConfig, resources_for: ResourcesFor | None = None):
        self.policy = policy
        self.fmt = fmt
        self.pool = pool
        self.score = score
        self.cfg = cfg
        self.resources_for = resources_for or (lambda task: {})

    def open_group(self, group_id: str, size: int) -> None:
        """One engine serves every group here: nothing to route."""

    def close_group(self, group_id: str) -> None:
        """One engine serves every group here: nothing to route."""

    def _engine_for(self, task: Task) -> Engine:
        if hasattr(self.policy, "generate"):
            return self.policy  # type: ignore[return-value]
        return self.policy(task)

    async def attempt(self, task: Task, group_id: str, traj_id: str) -> Trajectory:
        engine = self._engine_for(task)
        tools = make_tools(list(self.cfg.tools), **{"test_command": task.grader.test_command,
                                                      **self.resources_for(task)})
        try:
            async with self.pool.lease(task.repo, task.venv, image=task.image) as sandbox:
                traj = await run_agent(task, sandbox, engine, self.fmt, tools, self.cfg.agent,
                                       group_id=group_id, trajectory_id=traj_id)
        except Exception as e:  # noqa: BLE001 — not the model's: run_agent keeps its doings
            _log_unexpected(e, traj_id, "setting up or leasing")
            return infra_trajectory(task, group_id, traj_id, e)
        return await self._scored(task, traj, traj_id)

    async def attempt_hinted(self, task: Task, group_id: str, traj_id: str, prefix: Trajectory,
                             hint: Hint) -> Trajectory:
        """``prefix`` continued after ``hint.turn`` with the hint (``harness.hinted``), scored."""
        engine = self._engine_for(task)
        tools = make_tools(list(self.cfg.tools), **{"test_command": task.grader.test_command,
                                                      **self.resources_for(task)})
        try:
            async with self.pool.lease(task.repo, task.venv, image=task.image) as sandbox:
                traj = await continue_with_hint(task, sandbox, engine, self.fmt, tools,
                                                self.cfg.agent, prefix, turn=hint.turn,
                                                text=hint.text, kind=hint.kind,
                                                group_id=group_id, trajectory_id=traj_id)
        except Exception as e:  # noqa: BLE001 — not the model's: the harness keeps its doings
            _log_unexpected(e, traj_id, "continuing with a hint")
            return infra_trajectory(task, group_id, traj_id, e)
        return await self._scored(task, traj, traj_id)

    async def _scored(self, task: Task, traj: Trajectory, traj_id: str) -> Trajectory:
        if traj.is_infra_error:
            return traj
        try:
            reward = await self.score(task, traj)
        except Exception as e:  # noqa: BLE001 — the grader failed, not the model
            _log_unexpected(e, traj_id, "grading")
            return dataclasses.replace(traj, stop_reason=StopReason.INFRA_ERROR,
                                       error=f"grading failed: {type(e).__name__}: {e}",
                                       infra_kind=infra_kind(e).value)
        if reward is None:
            return dataclasses.replace(traj, stop_reason=StopReason.INFRA_ERROR,
                                       error="the scorer could not judge this trajectory",
                                       infra_kind=InfraKind.GRADER_CRASH.value)
        return dataclasses.replace(traj, reward=reward)


class RolloutRunner:
    """Runs groups concurrently through ``run_agent``; see the module docstring."""

    def __init__(self, policy: Engine | PolicyFor, fmt: ChatFormat, pool: Any, score: Scorer,
                 cfg: RolloutConfig | None = None, resources_for: ResourcesFor | None = None,
                 *, ledger: InfraLedger | None = None, hints_per_group: int = 0,
                 notebook: Notebook | None = None):
        cfg = cfg or RolloutConfig()
        self._setup(LocalExecutor(policy, fmt, pool, score, cfg, resources_for), cfg, ledger,
                    notebook)
        self.hints_per_group = hints_per_group

    @classmethod
    def over(cls, executor: Executor, cfg: RolloutConfig, *, ledger: InfraLedger | None = None,
             notebook: Notebook | None = None) -> RolloutRunner:
        """A runner whose attempts run on ``executor`` (a Ray fleet: ``looprl.fleet``); the
        admission, slots, retries and group assembly are this class's, whatever runs them."""
        runner = cls.__new__(cls)
        runner._setup(executor, cfg, ledger, notebook)
        return runner

    def _setup(self, executor: Executor, cfg: RolloutConfig, ledger: InfraLedger | None,
               notebook: Notebook | None = None) -> None:
        self.executor = executor
        n = cfg.experimental.notes_chars
        self.notebook = notebook if notebook is not None else Notebook(n) if n else None
        """Notes across trajectories (``harness.notes``): None = off; read-only in evaluation."""
        self.cfg = cfg
        self.ledger = ledger
        """Where every attempt that comes back is counted (the run's, ``looprl.faults``)."""
        self.stats = RunnerStats()
        self._slots = asyncio.Semaphore(self.cfg.max_in_flight)
        self._pending = 0
        """Admitted trajectory attempts that have not got a slot yet."""
        self.hints_per_group = 0
        """Hinted continuations per complete group (``grpo.experimental.feedback``)."""

    async def run_trajectory(self, task: Task, group_id: str, index: int) -> tuple[Trajectory, int]:
        """One scored trajectory (or an INFRA_ERROR one after the retries) and its failed attempts."""
        failures = 0
        while True:
            traj = await self._attempt(task, group_id, f"{group_id}/{index}.{failures}")
            if not traj.is_infra_error or failures >= self.cfg.experimental.max_infra_retries:
                return traj, failures + int(traj.is_infra_error)
            failures += 1
            self._pending += 1

    async def _attempt(self, task: Task, group_id: str, traj_id: str) -> Trajectory:
        try:
            await self._slots.acquire()
        finally:
            self._pending -= 1
        t0 = time.monotonic()
        try:
            with faults.scope(traj_id):
                traj = await self.executor.attempt(task, group_id, traj_id)
                if self.ledger is not None:  # counted as the scope settles: the books agree
                    self.ledger.attempt(traj)
                return traj
        finally:
            self.stats.busy_s += time.monotonic() - t0
            self._slots.release()

    @property
    def _first_stage(self) -> int:
        """Trajectories a group runs before it may stop: the screen's, or all of them."""
        G, screen = self.cfg.group_size, self.cfg.experimental.screen
        return screen if 0 < screen < G else G

    async def run_group(self, task: Task) -> GroupResult:
        """G trajectories of ``task``, concurrently; infra failures dropped, the rest scored (the
        first ``screen`` of them alone when none of those passed)."""
        self._pending += self._first_stage
        return await self._group(task)

    async def _group(self, task: Task) -> GroupResult:
        t0 = time.monotonic()
        group_id = f"{task.id}@{uuid.uuid4().hex[:8]}"
        G, first = self.cfg.group_size, self._first_stage
        shown = self.notebook.show(task) if self.notebook is not None else task
        self.executor.open_group(group_id, G)
        try:
            results = await asyncio.gather(*(self.run_trajectory(shown, group_id, i)
                                             for i in range(first)))
            screened = [t for t, _ in results if not t.is_infra_error]
            if first < G and screened and not any(t.passed for t in screened):
                self._remember(task, screened)
                self.stats.groups_screened_out += 1
                return GroupResult(task, None, self._count(results),
                                   wall_s=time.monotonic() - t0, screened_out=tuple(screened),
                                   lost=tuple(t for t, _ in results if t.is_infra_error))
            if first < G:
                self._pending += G - first
                results += await asyncio.gather(*(self.run_trajectory(shown, group_id, i)
                                                  for i in range(first, G)))
        finally:
            self.executor.close_group(group_id)
        kept = tuple(t for t, _ in results if not t.is_infra_error)
        self._remember(task, kept)
        lost = tuple(t for t, _ in results if t.is_infra_error)
        infra = self._count(results)
        wall = time.monotonic() - t0
        if len(kept) < self.cfg.experimental.min_group_size:
            self.stats.groups_dropped += 1
            errors = sorted({t.error or "" for t in lost})
            return GroupResult(task, None, infra, f"only {len(kept)} of {len(results)} trajectories "
                               f"survived infrastructure failures: {errors[:3]}", wall, lost=lost)
        self.stats.groups += 1
        versions = [v for t in kept for s in t.segments for v in s.policy_version_T if v >= 0]
        meta: Metadata = {"min_policy_version": min(versions, default=-1),
                "max_policy_version": max(versions, default=-1), "wall_s": round(wall, 3)}
        hinted = await self._hinted(task, group_id, kept)
        return GroupResult(task, Group(task.id, group_id, kept, meta, hinted), infra, None, wall,
                           lost=lost)

    async def _hinted(self, task: Task, group_id: str, kept: tuple[Trajectory, ...]
                      ) -> tuple[Trajectory, ...]:
        """Up to ``hints_per_group`` hinted continuations of ``kept``'s failed trajectories
        (one-segment ones a hint can be found for); those lost to infrastructure are left out."""
        attempt = getattr(self.executor, "attempt_hinted", None)
        if self.hints_per_group <= 0 or attempt is None:
            return ()
        chosen = [(t, h) for t in kept if len(t.segments) == 1
                  and (h := find_hint(task, t)) is not None][:self.hints_per_group]

        async def one(t: Trajectory, h: Hint) -> Trajectory:
            async with self._slots:
                return await attempt(task, group_id, f"{t.id}+hint", t, h)

        outs = await asyncio.gather(*(one(t, h) for t, h in chosen))
        return tuple(o for o in outs if not o.is_infra_error)

    def _remember(self, task: Task, trajs: Iterable[Trajectory]) -> None:
        """Keep the notes ``trajs`` wrote for the next tasks of ``task``'s repository."""
        if self.notebook is not None:
            self.notebook.add(task, [json.loads(str(t.metadata.get("memory") or "[]")) for t in trajs])

    def _count(self, results: list[tuple[Trajectory, int]]) -> int:
        """Count ``results``' trajectories and infrastructure failures; return the failures."""
        infra = sum(n for _, n in results)
        self.stats.trajectories += len(results)
        self.stats.infra_errors += infra
        return infra

    async def run(self, tasks: Iterable[Task | None], *, max_ready: int | None = None
                  ) -> AsyncIterator[GroupResult]:
        """Run a group per task, admitting groups as slots free up; yield in completion order.
        A ``None`` from ``tasks`` means no task yet, ask again (a sampler waiting for tasks it
        handed out to come back screened out).

        ``max_ready`` bounds the finished groups the consumer has not taken yet: no new group is
        admitted while that many wait (a trainer slower than its rollouts then gets fresh groups,
        not a backlog sampled from old weights). None: admit whenever a slot frees up."""
        done: asyncio.Queue[GroupResult | BaseException] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def one(task: Task) -> None:
            try:
                await done.put(await self._group(task))
            except BaseException as e:  # noqa: BLE001 — surfaced to the consumer below
                await done.put(e)

        async def admit() -> None:
            for task in tasks:
                if task is None:
                    await asyncio.sleep(0.05)
                    continue
                # Admit the next group once fewer than a group's worth of trajectories is queued.
                while self._pending >= self.cfg.group_size or (
                        max_ready is not None and done.qsize() >= max_ready):
                    await asyncio.sleep(0.005)
                self._pending += self._first_stage
                t = asyncio.create_task(one(task))
                running.add(t)
                t.add_done_callback(running.discard)
                await asyncio.sleep(0)

        admitter = asyncio.create_task(admit())
        try:
            while not (admitter.done() and not running and done.empty()):
                try:
                    item = await asyncio.wait_for(done.get(), timeout=0.05)
                except asyncio.TimeoutError:
                    if admitter.done() and admitter.exception():
                        raise admitter.exception() from None  # type: ignore[misc]
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            admitter.cancel()
            for t in list(running):
                t.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(admitter, *running, return_exceptions=True)


def _log_unexpected(e: Exception, traj_id: str, during: str) -> None:
    """Log a failure that is no ``LooprlError`` with its traceback (a bug to fix, not weather)."""
    if not isinstance(e, LooprlError):
        log.error("trajectory %s: internal error while %s", traj_id, during, exc_info=e)


def infra_trajectory(task: Task, group_id: str, traj_id: str, e: Exception) -> Trajectory:
    """The attempt ``traj_id`` lost to ``e``, not the model's doing: dropped, never scored."""
    return Trajectory(task_id=task.id, group_id=group_id, segments=(), messages=(),
                      counters=Counters(), stop_reason=StopReason.INFRA_ERROR,
                      error=f"{type(e).__name__}: {e}", id=traj_id,
                      infra_kind=infra_kind(e).value)
