"""The scorer the runner calls after each trajectory: hidden tests in a fresh sandbox, then the
composite shaped reward (length/effort, broken calls, style, hacking monitors).

    score = make_scorer(RewardConfig())
    reward = await score(task, trajectory)     # RewardBreakdown, or raises RewardError (infra)
    bench_score = make_tests_scorer()          # the hidden tests alone (benchmarks, gates)
"""

from __future__ import annotations

import asyncio

from looprl import faults
from looprl.errors import InfraKind
from looprl.rewards.composite import RewardConfig, compute_reward
from looprl.rewards.hacking import ATTACK_FLAGS
from looprl.rewards.tests import grade
from looprl.rollout.runner import Scorer
from looprl.types import RewardBreakdown, Task, Trajectory


def make_scorer(cfg: RewardConfig | None = None) -> Scorer:
    """A ``Scorer``: grade the final diff by the task's hidden tests, then shape the reward."""
    cfg = cfg or RewardConfig()

    async def score(task: Task, trajectory: Trajectory) -> RewardBreakdown | None:
        faults.maybe_raise(InfraKind.GRADER_CRASH, "the scorer")
        g = await grade(task, trajectory.diff)
        # compute_reward runs ruff for the style terms: keep it off the event loop.
        rb = await asyncio.to_thread(compute_reward, task, trajectory, g, cfg)
        if rb is not None:
            rb = RewardBreakdown(rb.components, rb.total, rb.flags, {**rb.details, **g.details()})
        return rb

    return score


def make_tests_scorer() -> Scorer:
    """A ``Scorer`` of the hidden tests alone: ``components == {"tests": 1.0 | 0.0}``, the grade's
    per-test details and flags kept. An attempt on the grader (``hacking.ATTACK_FLAGS``) scores
    0 whatever the tests said: a benchmark never counts it as solved."""

    async def score(task: Task, trajectory: Trajectory) -> RewardBreakdown:
        faults.maybe_raise(InfraKind.GRADER_CRASH, "the tests scorer")
        g = await grade(task, trajectory.diff)
        flags = tuple(dict.fromkeys((("edited_tests",) if g.edited_tests else ()) + tuple(g.flags)))
        attacked = bool(set(flags) & ATTACK_FLAGS)
        return RewardBreakdown.of({"tests": 0.0 if attacked else g.score}, flags, g.details())

    return score
