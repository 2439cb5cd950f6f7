"""Users' follow-ups as hints (issue 54, from users): a dissatisfied follow-up is the hint for
the turn it answers, and the policy's continuation with it in context is the teacher that the
window's training distils into the unhinted policy (``trainer.distill``), as the environment's
hints are in ``looprl train``.

    hints = follow_up_hints(trajs, store.events_by_session(), gold={sid: task.gold_patch})
    hinted = asyncio.run(continue_follow_ups(engine, fmt, trajs, hints, tasks, agent))
    groups = attach_hinted(groups, hinted, per_group=1)   # Group.hinted: distilled, no advantage

The turn a follow-up answers is the session's last assistant turn: it is the reply the user
read before writing back. The follow-up's text is redacted like any hint (``rewards.hints.redact``:
where the request's task is known, as for simulated users, no line of its gold patch survives;
capped at ``MAX_HINT_CHARS``) and inserted as a user message after that turn's tool results
(``harness.hinted``: loss mask 0, never a model token). Only the first dissatisfied follow-up of
a session is used: a second complaint about the same run says nothing new (as in
``signals.edit_outcome``). A continuation is graded by the task's hidden tests when the task is
known (``hint_pass_rate``); a real user's request has none, so its continuation is distilled
unscored.

Switch: ``grpo.experimental.feedback.follow_ups`` with ``coef > 0`` (``RealtimeConfig``); the
continuations of a cycle go to ``RUN/trajectories/hinted.jsonl`` with their cycle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from looprl.chat import ChatFormat
from looprl.errors import SandboxError
from looprl.feedback.signals import in_order
from looprl.feedback.store import Event
from looprl.harness.hinted import continue_with_hint, turn_messages
from looprl.harness.run_state import AgentConfig
from looprl.harness.tools import make_tools
from looprl.protocols import Engine, Sandbox
from looprl.rewards.hints import Hint, redact
from looprl.types import Group, Task, Trajectory

FOLLOW_UP = "follow_up"
"""``Hint.kind`` of a user's follow-up."""
SERVE_TEST_COMMAND = "python -m pytest -q"
"""What the ``run_tests`` tool runs in a served session (``serve.api.ServeConfig``), so in its
continuation too."""
SandboxFactory = Callable[[str, str | None], Awaitable[Sandbox]]
log = logging.getLogger(__name__)


async def _bwrap_sandbox(repo: str, venv: str | None) -> Sandbox:
    from looprl.sandbox import create_sandbox

    return await create_sandbox(repo, venv)


def follow_up_hint(traj: Trajectory, events: Sequence[Event], gold_patch: str | None = None
                   ) -> Hint | None:
    """The hint a session's first dissatisfied follow-up gives: after its last assistant turn,
    the text redacted against ``gold_patch``; None without one, for a session the agent never
    answered, or for a self-summarized one (``harness.hinted`` continues one segment only).

    >>> from looprl.feedback.store import Event
    >>> from looprl.types import Counters, StopReason, Trajectory
    >>> t = Trajectory("t", "g", (), ({"role": "user", "content": "fix"}, {"role": "assistant",
    ...     "content": "done"}), Counters(), StopReason.FINISHED)
    >>> follow_up_hint(t, [Event(1, "s", "follow_up", {"text": "no, still broken"}, 0.0,
    ...                          sentiment="dissatisfied")])
    Hint(turn=1, kind='follow_up', text='no, still broken')
    """
    if len(traj.segments) > 1 or traj.is_infra_error:
        return None
    turns = len(turn_messages(traj.messages))
    text = next((str(e.payload.get("text", "")) for e in in_order(events)
                 if e.kind == "follow_up" and e.sentiment == "dissatisfied"), "")
    if not turns or not text.strip():
        return None
    return Hint(turns, FOLLOW_UP, redact(text, gold_patch))


def follow_up_hints(trajs: Sequence[Trajectory], events: Mapping[str, Sequence[Event]],
                    gold: Mapping[str, str | None]) -> dict[str, Hint]:
    """Session id -> its follow-up hint, for a window's trajectories (``window.window``: id =
    session id); ``gold``: session id -> the gold patch of the task it asked for, where known."""
    out = {}
    for t in trajs:
        hint = follow_up_hint(t, events.get(t.id, ()), gold.get(t.id))
        if hint is not None:
            out[t.id] = hint
    return out


async def continue_follow_up(engine: Engine, fmt: ChatFormat, traj: Trajectory, hint: Hint,
                             task: Task, agent: AgentConfig,
                             sandbox_factory: SandboxFactory = _bwrap_sandbox) -> Trajectory:
    """The session ``traj`` continued after ``hint.turn`` with the follow-up, in a sandbox over
    ``task.repo`` (the session's), graded by ``task``'s hidden tests when it has some. A sandbox
    that does not start is an infrastructure failure, a grader that cannot run leaves it
    unscored: never the model's doing."""
    from looprl.errors import RewardError
    from looprl.rollout.runner import infra_trajectory
    from looprl.rollout.score import make_tests_scorer

    tid = f"{traj.id}+follow_up"
    try:
        sandbox = await sandbox_factory(task.repo, task.venv)
    except SandboxError as e:
        return infra_trajectory(task, traj.group_id, tid, e)
    try:
        cont = await continue_with_hint(
            task, sandbox, engine, fmt, make_tools(test_command=task.grader.test_command), agent,
            traj, turn=hint.turn, text=hint.text, kind=hint.kind, group_id=traj.group_id,
            trajectory_id=tid)
    finally:
        try:
            await sandbox.close()
        except SandboxError:
            pass  # a leaked workspace is the janitor's
    if cont.is_infra_error or not (task.grader.fail_to_pass or task.grader.pass_to_pass):
        return cont
    try:
        return dataclasses.replace(cont, reward=await make_tests_scorer()(task, cont))
    except RewardError:
        return cont


async def continue_follow_ups(engine: Engine, fmt: ChatFormat, trajs: Sequence[Trajectory],
                              hints: Mapping[str, Hint], tasks: Mapping[str, Task],
                              agent: AgentConfig, *, concurrency: int = 4,
                              sandbox_factory: SandboxFactory = _bwrap_sandbox
                              ) -> list[Trajectory]:
    """``continue_follow_up`` for every hinted session of ``trajs`` (``tasks``: session id ->
    the task it asked for), ``concurrency`` at once; infrastructure failures left out (the
    trainer would drop them), and so are sessions whose record cannot be continued (its turns
    and its runs of model tokens disagree: logged, the window trains on without it)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(t: Trajectory) -> Trajectory | None:
        async with slots:
            try:
                return await continue_follow_up(engine, fmt, t, hints[t.id], tasks[t.id], agent,
                                                sandbox_factory)
            except ValueError as e:
                log.warning("session %s: its follow-up is not used as a hint: %s", t.id, e)
                return None

    done = await asyncio.gather(*(one(t) for t in trajs if t.id in hints))
    return [t for t in done if t is not None and not t.is_infra_error]


def attach_hinted(groups: Sequence[Group], hinted: Sequence[Trajectory], per_group: int
                  ) -> list[Group]:
    """``groups`` with each one's first ``per_group`` continuations (by the session they
    continue, ``metadata["hinted_from"]``) in ``Group.hinted``."""
    by_session: dict[str, Trajectory] = {}
    for h in hinted:
        by_session.setdefault(str(h.metadata.get("hinted_from")), h)
    out = []
    for g in groups:
        mine = [by_session[t.id] for t in g.trajectories if t.id in by_session][:per_group]
        out.append(dataclasses.replace(g, hinted=g.hinted + tuple(mine)) if mine else g)
    return out
