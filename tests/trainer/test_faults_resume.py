"""A training run under every fault the in-process composition root can meet — sandbox create,
grader crash, engine error, weight write, env-server 5xx and dropped connections at 5% of their
crossings, and the trainer killed (SIGKILL) at 30% of its steps — relaunched with resume until it
finishes: every task is trained exactly once, no injected failure reaches a trained trajectory,
and at the last row each class's count in ``metrics.jsonl`` equals what the injector's books say
settled (``faults.reconcile``), the kills included."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from looprl import faults
from looprl.trainer.checkpoint import latest_checkpoint
from tests.trainer.faults_worker import N_TASKS

pytestmark = [pytest.mark.needs_bwrap, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_under_injected_faults_and_kills_finishes_exactly(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lives = []
    for _ in range(12):
        p = subprocess.run([sys.executable, "-m", "tests.trainer.faults_worker", str(run)],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}/src:{ROOT}"},
                           timeout=900, capture_output=True, text=True)
        lives.append(p.returncode)
        if p.returncode != -signal.SIGKILL:
            break
    assert lives[-1] == 0, p.stderr[-3000:]
    kills = len(lives) - 1
    assert kills >= 1, "the seed's first life is killed"

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = Counter(t for r in rows for t in r["tasks"])
    assert trained == Counter({f"calc-{i}": 1 for i in range(N_TASKS)}), trained  # none lost or twice
    ckpt = json.loads((latest_checkpoint(run / "ckpt") / "meta.json").read_text())
    assert sorted(ckpt["sampler_state"]["trained"]) == sorted(trained)

    books = faults.reconcile(run)
    assert all(v["metrics"] == v["settled"] for v in books.values()), books
    assert books["process_killed"]["metrics"] == kills == books["process_killed"]["injected"]
    assert sum(v["metrics"] > 0 for v in books.values()) >= 4, books
    assert books["weight_write"]["metrics"] + books["sandbox_create"]["metrics"] >= 1
    text = (run / "trajectories" / "train.jsonl").read_text()
    assert faults.MARK not in text and '"infra_error"' not in text  # nothing injected was scored
    last = rows[-1]
    assert {f"infra_rate/{k}" for k in books} <= set(last)
