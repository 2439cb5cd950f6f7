"""One error tree, by boundary. Each failure is attributed to exactly one boundary and recorded once.

``is_infra`` separates failures of the system (sandbox, engine, grader, store) from the model's own
mistakes: an infra failure drops a trajectory and is never scored as the model's fault.
Messages say how to fix the problem, not only what went wrong.
"""

from __future__ import annotations


class LooprlError(Exception):
    """Base of all looprl errors."""

    is_infra: bool = True
    """True when the failure is not the model's doing."""


class ConfigError(LooprlError):
    """A config file or override is invalid (unknown key, wrong type, missing value)."""


class TaskError(LooprlError):
    """A task file or task record is malformed, or a task's repository is unusable."""


class SandboxError(LooprlError):
    """The sandbox failed (could not start, crashed, lease expired). Infrastructure."""


class SandboxUnavailableError(SandboxError):
    """Isolation is not possible on this host (bubblewrap missing, user namespaces off)."""


class PolicyError(LooprlError):
    """The inference engine or policy server failed (crash, timeout, bad response). Infrastructure."""


class RewardError(LooprlError):
    """A reward function or grader failed to run. Infrastructure: the trajectory is not scored."""


class WeightStoreError(LooprlError):
    """The weight store is unreachable, or a version is corrupt or missing."""


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
