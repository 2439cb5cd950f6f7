"""A cycle's window: scored production sessions -> trajectories carrying their reward -> groups.

    trajs = window(store, version=3, signal="edit_outcome")   # untrained, scored, token-exact
    groups = window_groups(trajs, request_history(past), "c4")  # per request (``feedback loop``)
    group = window_group(trajs, "cycle-v4")                     # the batch (``feedback cycle``)

A session is in a window once its user has acted (the signal scores it) and no cycle has
trained on it; infrastructure failures are never scored. Its trajectory holds the tokens and
logprobs the serving engine sampled.

Production has ONE sample of most prompts, so the GRPO group of G runs of one task does not exist
as such. Two baselines replace it:

- ``window_group``: the whole window is one group and each session gets ``A = r - mean(r)`` over
  the window (Dr. GRPO's ``mean_centered``, no std division): a REINFORCE batch baseline, noisier
  than a per-task group because prompts differ in difficulty.
- ``window_groups``: sessions of the same request (repo and prompt) form a group, as the G
  rollouts of one task do; a request seen once gets ``A = r - b`` with ``b`` that request's mean
  reward in earlier traffic, or the window's mean without it when it is new. Any baseline that
  does not depend on the session's own outcome leaves the policy gradient unbiased; a request's
  own past is the lower-variance estimate, as difficulty varies far more between prompts than a
  few cycles move the policy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from looprl.feedback.signals import get_signal
from looprl.feedback.store import FeedbackStore, SessionRecord
from looprl.types import Group, RewardBreakdown, Trajectory


def scored_sessions(store: FeedbackStore, signal: str, *, version: int | None = None,
                    untrained: bool = False, with_trajectory: bool = False
                    ) -> list[tuple[SessionRecord, RewardBreakdown]]:
    """Sessions (of ``version``; only those no cycle trained on when ``untrained``) that
    ``signal`` scores, with their reward; infrastructure failures are never scored."""
    fn, events = get_signal(signal), store.events_by_session()
    out = []
    for s in store.sessions(policy_version=version, untrained=untrained,
                            with_trajectory=with_trajectory):
        if s.is_infra_error:
            continue
        rb = fn(s, events.get(s.id, []))
        if rb is not None:
            out.append((s, rb))
    return out


def window(store: FeedbackStore, version: int, signal: str, untrained: bool = True
           ) -> list[Trajectory]:
    """Sessions of ``version`` with a reward (only those no cycle trained on, unless
    ``untrained`` is False), as trajectories carrying it."""
    out = []
    for s, rb in scored_sessions(store, signal, version=version, untrained=untrained,
                                 with_trajectory=True):
        if s.trajectory is None or not s.trajectory.segments:
            continue
        # the request (prompt and repo) names the task a session attempted
        out.append(dataclasses.replace(s.trajectory, reward=rb, id=s.id, metadata={
            **s.trajectory.metadata, "request": s.request}))
    return out


def window_group(trajs: list[Trajectory], tag: str) -> Group:
    """All of a window's sessions as ONE group: the batch mean is the baseline (module doc)."""
    return Group(task_id="feedback-window", group_id=tag, trajectories=tuple(trajs),
                 metadata={"sessions": len(trajs), "baseline_from": "batch_mean"})


def request_history(sessions: Sequence[tuple[str, float]]) -> dict[str, list[float]]:
    """request -> rewards of earlier scored sessions (the per-request value estimate's data)."""
    out: dict[str, list[float]] = {}
    for request, reward in sessions:
        out.setdefault(request, []).append(reward)
    return out


def window_groups(trajs: Sequence[Trajectory], history: dict[str, list[float]], tag: str
                  ) -> list[Group]:
    """The window as GRPO groups (module docstring): one per request; a request seen once
    carries its baseline in ``metadata["baseline"]`` (``trainer.batch``). E.g. sessions of
    requests x, x, y, z with rewards 1, -1, 1, -1 and a past of y of [0, -1]: one group (x, x;
    its own mean), y against -0.5 (its past), z against 1/3 (the window's mean without z)."""
    by_req: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_req.setdefault(str(t.metadata.get("request", t.id)), []).append(t)
    rewards = {t.id: t.reward.total for t in trajs if t.reward is not None}
    total = math.fsum(rewards.values())
    out = []
    for i, (req, ts) in enumerate(by_req.items()):
        meta: dict[str, Any] = {"request": req, "sessions": len(ts)}
        if len(ts) == 1:
            past = history.get(req)
            if past:
                meta["baseline"], meta["baseline_from"] = math.fsum(past) / len(past), "request"
            elif len(rewards) > 1:  # the window's mean without this session's own reward
                own = rewards.get(ts[0].id, 0.0)
                meta["baseline"] = (total - own) / (len(rewards) - 1)
                meta["baseline_from"] = "window"
            else:
                continue
        out.append(Group(task_id=f"request-{i}", group_id=f"{tag}-{i}", trajectories=tuple(ts),
                         metadata=meta))
    return out
