"""Users' follow-ups as hints (issue 54, from users): a dissatisfied follow-up is the hint for
the turn it answers, and the policy's continuation with it in context is the teacher that the
window's training distils into the unhinted policy (``trainer.distill``), as the environment's
hints are in ``looprl train``.

    out = hint_window(store, trajs, groups, policy_path, agent, known=tasks, per_group=1)
    out.groups    # Group.hinted: the continuations, distilled, no advantage
    # its parts: follow_up_hints -> continue_follow_ups -> attach_hinted

``hint_window`` is the one path both ``looprl feedback loop`` (``loop_cycle.Loop``) and
``looprl feedback cycle`` (``cycle.run_cycle``) take from a window to its hinted groups.

The turn a follow-up answers is the agent reply the user wrote back to: the one its ``turn``
names (1-based, counted in assistant turns, as the serve API's ``turns``; checked against the
session when stored), else the session's last one, the reply a user reads once the session
returns. The follow-up's text is redacted like any hint (``rewards.hints.redact``:
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
from dataclasses import dataclass
from pathlib import Path

from looprl.chat import ChatFormat
from looprl.errors import SandboxError
from looprl.feedback.signals import in_order
from looprl.feedback.store import Event, FeedbackStore, request_key
from looprl.harness.hinted import continue_with_hint, turn_messages
from looprl.harness.run_state import AgentConfig
from looprl.harness.tools import make_tools
from looprl.protocols import Engine, Sandbox
from looprl.rewards.hints import Hint, redact
from looprl.types import Grader, Group, Task, Trajectory

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
    """The hint a session's first dissatisfied follow-up gives: after the turn it answers (its
    ``turn``, else the last assistant turn), the text redacted against ``gold_patch``; None
    without one, for a session the agent never answered, a turn the session does not have, or a
    self-summarized session (``harness.hinted`` continues one segment only).

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
    first = next((e for e in in_order(events)
                  if e.kind == "follow_up" and e.sentiment == "dissatisfied"), None)
    if first is None or not turns:
        return None
    text, turn = str(first.payload.get("text", "")), int(first.payload.get("turn", turns))
    if not text.strip() or not 1 <= turn <= turns:
        return None
    return Hint(turn, FOLLOW_UP, redact(text, gold_patch))


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


def session_tasks(store: FeedbackStore, trajs: Sequence[Trajectory], known: Sequence[Task]
                  ) -> dict[str, Task]:
    """Session id -> the task its continuation runs: the ``known`` task of the same request
    (simulated users': its gold patch redacts, its hidden tests grade), else one over the
    session's repo and prompt with no hidden tests (a real user's)."""
    by_request = {request_key(str(Path(k.repo).resolve()), k.prompt): k for k in known}
    out = {}
    for t in trajs:
        s = store.session(t.id, with_trajectory=False)
        out[t.id] = by_request.get(s.request) or Task(
            id=f"serve-{t.id}", repo=s.repo, prompt=s.prompt, grader=Grader(SERVE_TEST_COMMAND))
    return out


@dataclass(frozen=True)
class WindowHints:
    """What ``hint_window`` made of a window."""

    groups: list[Group]
    """The window's groups, each carrying its sessions' continuations (``Group.hinted``)."""
    hints: int
    """Sessions with a dissatisfied follow-up usable as a hint."""
    hinted: list[Trajectory]
    """The continuations (every one, also those past ``per_group``)."""


def hint_window(store: FeedbackStore, trajs: Sequence[Trajectory], groups: Sequence[Group],
                policy_path: str | Path, agent: AgentConfig, *, known: Sequence[Task] = (),
                per_group: int, concurrency: int = 4,
                sandbox_factory: SandboxFactory = _bwrap_sandbox) -> WindowHints:
    """A window's dissatisfied follow-ups as hints (module docstring): each hinted session of
    ``trajs`` (``window.window``) continued by the policy at ``policy_path`` (the one that
    served them, with the ``agent`` budgets it served them with), at most ``per_group``
    continuations attached to each of ``groups``."""
    from looprl.inference.torch_engine import TorchEngine

    tasks = session_tasks(store, trajs, known)
    hints = follow_up_hints(trajs, store.events_by_session(),
                            {sid: task.gold_patch for sid, task in tasks.items()})
    if not hints:
        return WindowHints(list(groups), 0, [])
    engine = TorchEngine.from_path(policy_path)
    try:
        hinted = asyncio.run(continue_follow_ups(engine, ChatFormat(engine.tokenizer), trajs,
                                                 hints, tasks, agent, concurrency=concurrency,
                                                 sandbox_factory=sandbox_factory))
    finally:
        engine.close()
    return WindowHints(attach_hinted(groups, hinted, per_group), len(hints), hinted)


def save_hinted(path: Path, hinted: Sequence[Trajectory], **meta: int) -> None:
    """Append the continuations to ``path`` (JSONL, the trajectory viewer's), each with
    ``meta`` (e.g. its cycle) in its metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.writelines(dataclasses.replace(h, metadata={**h.metadata, **meta}).to_json() + "\n"
                      for h in hinted)
