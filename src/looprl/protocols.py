"""The seams: a few small Protocols. Backends sit behind them and are picked by name from config.

- ``Sandbox``: where commands run (``looprl.sandbox``).
- ``Tool``: one harness tool (``looprl.harness.tools``).
- ``Engine``: generates tokens with logprobs, takes new weights (``looprl.inference``);
  ``WeightSink``: the weight-taking half, all the trainer needs (an engine or a Ray fleet).
- ``RewardFn``: ``(task, trajectory) -> float | None`` (``looprl.rewards``).
- ``WeightStore``: publishes and fetches policy weights (``looprl.weights``).
- ``GroupSource``: scored groups for the trainer (``looprl.rollout``'s runner, in process or over
  a Ray fleet); the trainer sees nothing else of the rollouts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from looprl.types import (
    ExecResult,
    FileEntry,
    Generation,
    GroupResult,
    SamplingParams,
    Task,
    Trajectory,
)

if TYPE_CHECKING:  # annotations only: importing the seams costs no torch import
    import torch


@runtime_checkable
class Sandbox(Protocol):
    """An isolated, copy-on-write workspace over a task's repository.

    Paths are workspace-relative ('src/pkg/mod.py'); anything resolving outside the workspace raises
    ``PathEscapeError`` (a ``ToolError``). Commands run with the workspace as the working
    directory, no network.
    """

    tools_dir: str
    """The directory, as commands inside see it, holding the harness's own programs (``ruff``):
    tools that run a program over model-written files run it in the sandbox from there."""

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        """Run ``cmd`` with /bin/sh -c inside the sandbox."""
        ...

    async def read(self, path: str) -> bytes: ...

    async def write(self, path: str, data: bytes) -> None: ...

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        """Entries below ``under``, sorted by path, hidden VCS/cache dirs skipped."""
        ...

    async def diff(self) -> str:
        """Unified diff of the workspace against its base snapshot."""
        ...

    async def close(self) -> None: ...


class ToolContext(Protocol):
    """What a tool may touch while it runs."""

    sandbox: Sandbox


@runtime_checkable
class Tool(Protocol):
    """One harness tool: a name, a JSON schema for its arguments, and ``run``.

    ``read_only`` tools of one turn run concurrently; the others run in call order.
    ``run`` returns the text the model sees; it raises ``ToolError`` for failures the model can
    act on and ``SandboxError`` for infrastructure failures.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str: ...


@runtime_checkable
class Engine(Protocol):
    """Generates tokens with logprobs for many concurrent sessions; takes new weights in flight.

    ``session_id`` lets an engine keep a trajectory's KV across turns (only new tokens prefilled);
    ``group_id`` marks requests sharing a prompt, whose KV may be computed once.
    """

    @property
    def policy_version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation: ...

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap weights between decode steps; running sessions continue on the new version."""
        ...

    async def release(self, session_id: str) -> None:
        """Forget a session's cached state (its trajectory ended)."""
        ...


class WeightSink(Protocol):
    """What the trainer hands each new policy version to: an ``Engine``, or a fleet of engine
    replicas that pull the version from the weight store (``looprl.fleet``)."""

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...


class GroupSource(Protocol):
    """Where the trainer's groups come from: each task it is handed becomes one ``GroupResult``
    (a scored group, or why there is none)."""

    def run(self, tasks: Iterable[Task | None], *, max_ready: int | None = None
            ) -> AsyncIterator[GroupResult]:
        """A group per task, yielded in completion order. A ``None`` from ``tasks`` means no task
        yet: ask again. ``max_ready`` bounds the finished groups not yet taken."""
        ...


class RewardFn(Protocol):
    """A pure reward term. ``None`` means "skip this trajectory" (e.g. cannot be judged)."""

    def __call__(self, task: Task, trajectory: Trajectory) -> float | None: ...


@runtime_checkable
class WeightStore(Protocol):
    """Versioned policy weights in an object store (local dir, s3://, ... through fsspec)."""

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

    def latest(self) -> int | None: ...

    def fetch(self, version: int) -> dict[str, torch.Tensor]: ...

    def rollback(self, version: int, state_dict: Mapping[str, torch.Tensor] | None = None) -> list[int]:
        """Remove the versions above ``version`` (returned); with ``state_dict``, make sure
        ``version`` holds it. A trainer resumed from its checkpoint of ``version`` calls this."""
        ...
