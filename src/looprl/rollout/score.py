"""The scorer the runner calls after each trajectory: hidden tests in a fresh sandbox, then the
composite shaped reward (length/effort, broken calls, style, hacking monitors).

    score = make_scorer(RewardConfig())
    reward = await score(task, trajectory)     # RewardBreakdown, or raises RewardError (infra)
    bench_score = make_tests_scorer()          # the hidden tests alone (benchmarks, gates)
"""

from __future__ import annotations

import asyncio

from looprl.rewards.composite import RewardConfig, compute_reward
from looprl.rewards.tests import grade
from looprl.rollout.runner import Scorer
from looprl.types import RewardBreakdown, Task, Trajectory


def make_scorer(cfg: RewardConfig | None = None) -> Scorer:
    """A ``Scorer``: grade the final diff by the task's hidden tests, then shape the reward."""
    cfg = cfg or RewardConfig()

    async def score(task: Task, trajectory: Trajectory) -> RewardBreakdown | None:
        g = await grade(task, trajectory.diff)
        # compute_reward runs ruff for the style terms: keep it off the event loop.
        rb = await asyncio.to_thread(compute_reward, task, trajectory, g, cfg)
        if rb is not None:
            rb = RewardBreakdown(rb.components, rb.total, rb.flags, {**rb.details, **g.details()})
        return rb

    return score


def make_tests_scorer() -> Scorer:
    """A ``Scorer`` of the hidden tests alone: ``components == {"tests": 1.0 | 0.0}``, the grade's
    per-test details kept, ``edited_tests`` raised as a flag."""

    async def score(task: Task, trajectory: Trajectory) -> RewardBreakdown:
        g = await grade(task, trajectory.diff)
        return RewardBreakdown.of({"tests": g.score}, ("edited_tests",) if g.edited_tests else (),
                                  g.details())

    return score
