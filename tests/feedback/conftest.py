"""Shared builders for feedback tests: a store, a trajectory with a two-file diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from looprl.feedback.store import FeedbackStore
from looprl.types import Counters, Segment, StopReason, Trajectory

TWO_FILE_DIFF = ("--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
                 "--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-y = 1\n+y = 2\n")


def make_traj(diff: str = TWO_FILE_DIFF, stop: StopReason = StopReason.FINISHED,
              tokens: tuple[int, ...] = (5, 6, 7, 8)) -> Trajectory:
    seg = Segment(tokens, (0.0, 0.0, -1.0, -2.0), (0, 0, 1, 1), (-1, -1, 0, 0))
    return Trajectory(task_id="t", group_id="g", segments=(seg,),
                      messages=({"role": "user", "content": "fix it"},), counters=Counters(turns=1),
                      stop_reason=stop, diff=diff,
                      error="SandboxError: boom" if stop == StopReason.INFRA_ERROR else None)


@pytest.fixture
def store(tmp_path: Path) -> FeedbackStore:
    s = FeedbackStore(tmp_path / "fb.db")
    yield s
    s.close()


def add(store: FeedbackStore, user: str = "u1", arm: str = "A", version: int = 0,
        diff: str = TWO_FILE_DIFF, stop: StopReason = StopReason.FINISHED,
        latency_s: float = 1.0, tokens: tuple[int, ...] = (5, 6, 7, 8)) -> str:
    return store.add_session(user=user, arm=arm, policy_version=version, prompt="fix it",
                             repo="/srv/repo", trajectory=make_traj(diff, stop, tokens),
                             latency_s=latency_s)
