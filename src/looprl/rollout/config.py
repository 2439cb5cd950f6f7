"""The rollout section (``rollout`` of ``looprl train``), without the harness's heavy imports: a
config is checked before torch loads. Its importers take it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from looprl.config import FieldError, Length, Range
from looprl.harness.run_state import AgentConfig
from looprl.harness.tools import DEFAULT_TOOLS


@dataclass(frozen=True)
class RolloutExperimental:
    """The failure policy and the difficulty screen: research switches and tuning knobs
    (``experimental`` in ``looprl.config``)."""

    max_infra_retries: Annotated[int, Range(0, 1000)] = 2
    """Fresh-sandbox retries of a trajectory that failed for infrastructure reasons."""
    min_group_size: Annotated[int, Range(1, 4096)] = 2
    """A group with fewer scored trajectories than this is dropped (no advantage to compute)."""
    screen: Annotated[int, Range(0, 4096)] = 0
    """Difficulty screen: a group runs this many trajectories first and stops there when none of
    them passed (``GroupResult.screened_out``), so a task the policy cannot solve yet costs
    ``screen`` rollouts instead of ``group_size``; otherwise the rest run and the group has all
    ``group_size``. 0 (or >= ``group_size``): every group runs whole."""
    notes_chars: Annotated[int, Range(0, 100_000)] = 0
    """Memory across trajectories (``harness.notes``): the ``memory`` tool's notes outlive the
    trajectory and head the prompt of the next tasks of the same repository, this many
    characters per repository at most (newest kept); never a task's own function's notes.
    0 = off: each trajectory starts with no notes."""


@dataclass(frozen=True)
class RolloutConfig:
    """How rollouts are run."""

    group_size: Annotated[int, Range(1, 4096)] = 8
    """G: trajectories per task; advantages are computed within a group."""
    max_in_flight: Annotated[int, Range(1, 1_000_000)] = 16
    """Trajectories running at once across all groups (keep above the engine's batch size)."""
    tools: Annotated[tuple[str, ...], Length(1, 256)] = DEFAULT_TOOLS
    """Tool names from the harness registry offered to the model."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Budgets and sampling of each trajectory."""
    experimental: RolloutExperimental = field(default_factory=RolloutExperimental)

    def __post_init__(self) -> None:
        if self.experimental.min_group_size > self.group_size:
            raise FieldError("experimental.min_group_size", f"is "
                             f"{self.experimental.min_group_size}, above group_size "
                             f"{self.group_size}: every group would be dropped; lower it")
        if self.experimental.notes_chars and "memory" not in self.tools:
            raise FieldError("experimental.notes_chars", "keeps the memory tool's notes, but "
                             "rollout.tools has no memory tool; add \"memory\" or set it to 0")
