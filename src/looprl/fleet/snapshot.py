"""The fleet's state as the dashboard reads it: a JSON snapshot the driver rewrites every poll.

    write_snapshot(RunDir(run_dir).fleet, snap)      # RayFleet, every ``fleet.poll_s``
    snap = read_snapshot(RunDir(run_dir).fleet)      # the dashboard's fleet view

Written whole to a temporary name and renamed, so a reader never sees half of one. Importing
this module imports no Ray (the dashboard runs without it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EngineView:
    """One engine replica, as last sampled."""

    index: int
    in_flight: int
    """Generate requests in the replica now (its queue and its batch)."""
    tokens_in_flight: int
    """Prompt tokens of those requests."""
    tokens_per_s: float
    """Sampled tokens per second since the previous sample."""
    generated_tokens: int
    policy_version: int
    open_trajectories: int
    """Trajectories of the groups routed here that have not finished (what routing balances)."""
    reused_group_tokens: int = 0
    """Prompt tokens a group's rollouts took from its first rollout's KV instead of prefilling
    (TorchEngine; 0 for engines that do not count it)."""


@dataclass(frozen=True)
class NodeView:
    """One Ray node: its fleet member (environment server + engine replicas), if it hosts one."""

    node_id: str
    address: str
    state: str
    """live, starting (actors loading), down (left the cluster), or idle (hosts no rollouts:
    without the resources a member needs, e.g. a head that runs only the trainer)."""
    resources: dict[str, float] = field(default_factory=dict)
    sandboxes: dict[str, float] = field(default_factory=dict)
    """The node's sandbox pool: busy, idle, queued, warm, max_running, exec latency, ..."""
    rollouts_in_flight: int = 0
    engines: tuple[EngineView, ...] = ()
    since_s: float = 0.0
    """Seconds since the member came up (0 when it hosts none)."""


@dataclass(frozen=True)
class FleetSnapshot:
    """The whole fleet at ``written_at`` (Unix time)."""

    written_at: float
    address: str
    policy_version: int
    nodes: tuple[NodeView, ...]
    members_started: int = 0
    members_lost: int = 0
    attempts_lost: int = 0
    """Rollout attempts cut off by a lost actor or node (retried elsewhere, never scored)."""
    events: tuple[str, ...] = ()
    """The newest events last: nodes joining, leaving, failing to start."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetSnapshot:
        nodes = tuple(NodeView(**{**n, "engines": tuple(EngineView(**e) for e in n["engines"])})
                      for n in d["nodes"])
        return cls(**{**d, "nodes": nodes, "events": tuple(d.get("events", ()))})


def write_snapshot(path: Path, snap: FleetSnapshot) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(snap.to_json())
    os.replace(tmp, path)


def read_snapshot(path: Path) -> FleetSnapshot:
    """The snapshot at ``path``; ``ValueError``/``KeyError``/``TypeError`` when it is not one."""
    return FleetSnapshot.from_dict(json.loads(path.read_text()))
