"""Shared builders for dashboard tests: a run directory whose ``metrics.jsonl`` the real
``GRPOLoop`` wrote (real GRPO steps on a tiny random Llama), a feedback store, a uvicorn helper."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from looprl.feedback.store import FeedbackStore
from looprl.harness.format import ChatFormat
from looprl.models.tokenizer import build_tokenizer
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.trainer.grpo import GRPOLoop, LoopConfig, TaskSampler
from looprl.trainer.step import GRPOConfig, GRPOStep
from tests.feedback.conftest import make_traj
from tests.trainer.helpers import group, segment, tiny_llama, trajectory

STEPS = 3


class RecordingEngine:
    """Engine test double: the loop hands it each new version (nothing is generated here)."""

    policy_version = 0

    async def update_weights(self, state_dict, version: int) -> None:
        self.policy_version = version


def _groups(step: int) -> list:
    """Two groups per step; one trajectory of each passes, so every group has reward variance."""
    out = []
    for g in range(2):
        gid = f"s{step}g{g}"
        out.append(group([trajectory([segment([1, 2, 3], [4 + step, 5, 6])], 1.0, gid),
                          trajectory([segment([1, 2, 3], [7, 8 + g])], -0.5, gid)], gid))
    return out


def write_grpo_run(run_dir: Path, steps: int = STEPS) -> Path:
    """Train ``steps`` real GRPO steps through ``GRPOLoop._train`` -> ``_log`` (the exact code that
    writes ``metrics.jsonl`` in a run); the rollout side is skipped: groups are hand-made."""
    tok = build_tokenizer(None)
    model = tiny_llama()
    step = GRPOStep(model, GRPOConfig(lr=1e-3, norm_tokens=8), pad_id=0)
    runner = RolloutRunner(RecordingEngine(), ChatFormat(tok), None, make_scorer())
    loop = GRPOLoop(step, RecordingEngine(), runner, TaskSampler([]), LoopConfig(groups_per_step=2),
                    run_dir=run_dir)
    loop._t0 = time.monotonic()  # run() sets this; we drive the trainer side directly

    async def train() -> None:
        for i in range(steps):
            await loop._train(_groups(i), None)

    asyncio.run(train())
    loop._finish()
    return run_dir


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory) -> Path:
    run = write_grpo_run(tmp_path_factory.mktemp("runs") / "alpha")
    (run / "report.md").write_text("# looprl quickstart — alpha\n\nheldout_pass1_sft=0.2 "
                                   "heldout_pass1_rl=0.4\n")
    for name, p in (("eval_sft.json", 0.2), ("eval_rl.json", 0.4)):
        (run / name).write_text(json.dumps({"policy": name[5:7], "metrics": {
            "pass@1": p, "mean_output_tokens": 120.0, "mean_tool_calls": 3.0}}))
    return run


@pytest.fixture
def run_copy(grpo_run: Path, tmp_path: Path) -> Path:
    """A private copy of the run (tests that damage it)."""
    dst = tmp_path / "runs" / grpo_run.name
    shutil.copytree(grpo_run, dst, ignore=shutil.ignore_patterns("tb", "ckpt"))
    return dst


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def feedback_db(tmp_path: Path) -> Path:
    """A real store: arm A's edits mostly reverted, arm B's kept, plus one infra failure."""
    path = tmp_path / "fb.db"
    store = FeedbackStore(path)
    for i in range(6):
        for arm, kept in (("A", i < 2), ("B", i < 5)):
            sid = store.add_session(user=f"u{arm}{i}", arm=arm, policy_version=1 if arm == "A" else 2,
                                    prompt="fix it", repo="/srv/repo", trajectory=make_traj(),
                                    latency_s=3.0)
            store.add_event(sid, "kept" if kept else "reverted")
    store.add_session(user="x", arm="B", policy_version=2, prompt="p", repo="/r", trajectory=None,
                      latency_s=1.0)
    store.close()
    return path


def serve(app) -> Iterator[str]:
    """Run ``app`` on a free loopback port in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        t.join(timeout=10)
