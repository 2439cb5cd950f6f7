"""One error tree, by boundary. Each failure is attributed to exactly one boundary and recorded once.

``is_infra`` separates failures of the system (sandbox, engine, grader, store) from the model's own
mistakes: an infra failure drops a trajectory and is never scored as the model's fault.
Messages say how to fix the problem, not only what went wrong.

``InfraKind`` is the taxonomy of infrastructure failures: every one lands in exactly one class,
set where it is raised (``SandboxError(msg, kind=InfraKind.SANDBOX_CREATE)``) or taken from the
error's boundary (a ``PolicyError`` is an ``ENGINE_ERROR``). ``infra_kind(e)`` is the one helper
that classifies an exception; the run counts each class (``looprl.faults.InfraLedger``) and the
fault injector (``looprl.faults``) fails each boundary as one of them.
"""

from __future__ import annotations

import enum


class InfraKind(str, enum.Enum):
    """The class of an infrastructure failure (the taxonomy; ``docs/faults.md``)."""

    SANDBOX_CREATE = "sandbox_create"
    """A sandbox could not be created or leased (bubblewrap, overlay, disk, the pool closed)."""
    SANDBOX_LOST = "sandbox_lost"
    """A running sandbox failed: crashed, its lease expired or was returned, its launcher died."""
    EXEC_TIMEOUT = "exec_timeout"
    """The sandbox did not answer a command by its deadline. Not a command that ran past its own
    ``timeout_s``: that one returns ``timed_out`` to the model, which caused it."""
    GRADER_CRASH = "grader_crash"
    """The grader could not run or judge (pytest did not start, the scorer raised)."""
    ENGINE_ERROR = "engine_error"
    """The inference engine failed a request (crash, closed, bad response)."""
    WEIGHT_READ = "weight_read"
    """A weight version could not be read from the store."""
    WEIGHT_WRITE = "weight_write"
    """A weight version could not be published to the store."""
    ENV_SERVER_5XX = "env_server_5xx"
    """The environment server answered with a server error (5xx)."""
    CONNECTION_DROPPED = "connection_dropped"
    """The connection to the environment server failed or dropped mid-request."""
    NODE_LOST = "node_lost"
    """A fleet node (its environment server or engine replica) died with rollouts in flight."""
    PROCESS_KILLED = "process_killed"
    """The trainer process ended before its run did (killed, preempted); the run resumed."""
    INTERNAL = "internal"
    """A bug or a misconfiguration of looprl itself: an exception no boundary raised."""


class LooprlError(Exception):
    """Base of all looprl errors. ``kind`` (keyword) names the failure's class in the taxonomy
    where the boundary's default does not say it (``SandboxError``'s is ``SANDBOX_LOST``)."""

    is_infra: bool = True
    """True when the failure is not the model's doing."""
    kind: InfraKind = InfraKind.INTERNAL
    """The class of the failure when it is infrastructure (``InfraKind``)."""

    def __init__(self, *args: object, kind: InfraKind | None = None) -> None:
        super().__init__(*args)
        if kind is not None:
            self.kind = kind


class ConfigError(LooprlError):
    """A config file or override is invalid (unknown key, wrong type, missing value)."""


class TaskError(LooprlError):
    """A task file or task record is malformed, or a task's repository is unusable."""


class SandboxError(LooprlError):
    """The sandbox failed (could not start, crashed, lease expired). Infrastructure."""

    kind = InfraKind.SANDBOX_LOST


class SandboxUnavailableError(SandboxError):
    """Isolation is not possible on this host (bubblewrap missing, user namespaces off)."""

    kind = InfraKind.SANDBOX_CREATE


class PolicyError(LooprlError):
    """The inference engine or policy server failed (crash, timeout, bad response). Infrastructure."""

    kind = InfraKind.ENGINE_ERROR


class RewardError(LooprlError):
    """A reward function or grader failed to run. Infrastructure: the trajectory is not scored."""

    kind = InfraKind.GRADER_CRASH


class WeightStoreError(LooprlError):
    """The weight store is unreachable, or a version is corrupt or missing (a read; a failed
    publish says ``kind=InfraKind.WEIGHT_WRITE``)."""

    kind = InfraKind.WEIGHT_READ


class ToolCallError(LooprlError):
    """The model wrote a call that cannot run: bad JSON, unknown tool, missing/extra/mistyped
    argument. Model error: returned to the model as a tool result and counted as broken."""

    is_infra = False


class ToolError(LooprlError):
    """A well-formed call failed for a reason the model can act on (file not found, 0 matches,
    path outside the workspace). Returned to the model as an error result; not 'broken'."""

    is_infra = False


class PathEscapeError(ToolError):
    """A path that leaves the workspace: absolute, through '..', or through a symlink resolving
    outside. Raised where the path is resolved (the tools' check, the sandbox's open), so callers
    tell it from a missing file by type, never by message text. The model's doing."""


class ContextFullError(LooprlError):
    """A prompt does not fit the engine's context window. The trajectory's own doing (it grew too
    long): the harness should summarize or stop with ``StopReason.CONTEXT_FULL``."""

    is_infra = False


class DiffError(LooprlError):
    """A diff is malformed, or a patch does not apply to the text it is applied to. Raised by
    ``looprl.diffs``; a caller with a boundary re-raises it as its own (a task's gold patch that
    does not apply is a ``TaskError``)."""


def infra_kind(e: BaseException) -> InfraKind:
    """The taxonomy class of ``e``, an infrastructure failure: the innermost infrastructure
    ``LooprlError`` on its ``__cause__`` chain with a class of its own decides, so a wrapper
    keeps the class of what failed first (a ``RewardError`` raised from the ``SandboxError``
    that could not create the grading sandbox is a ``SANDBOX_CREATE``); anything else (a bug,
    an exception no boundary raised) is ``INTERNAL``. A Ray task error stands for its cause.

    >>> infra_kind(PolicyError("engine died")).value
    'engine_error'
    >>> try:
    ...     try:
    ...         raise SandboxError("no overlay", kind=InfraKind.SANDBOX_CREATE)
    ...     except SandboxError as inner:
    ...         raise RewardError("could not start a grading sandbox") from inner
    ... except RewardError as outer:
    ...     infra_kind(outer).value
    'sandbox_create'
    >>> infra_kind(KeyError("bug")).value
    'internal'
    """
    found = InfraKind.INTERNAL
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        cause = getattr(cur, "cause", None)  # ray.exceptions.RayTaskError wraps the remote error
        if isinstance(cause, BaseException) and cause is not cur:
            cur = cause
            continue
        if isinstance(cur, LooprlError) and cur.is_infra and cur.kind != InfraKind.INTERNAL:
            found = cur.kind
        cur = cur.__cause__
    return found
