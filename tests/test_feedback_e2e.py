"""Targeted textual feedback end to end (issue 54): ``looprl train`` on the quickstart preset,
tiny settings, with ``grpo.experimental.feedback`` on: hinted continuations are run, distilled,
logged in ``metrics.jsonl`` and saved apart from the rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TINY = ['tasks.train_packages=["inflection==0.5.1"]', "tasks.heldout_packages=[]",
        "tasks.experimental.train_only_packages=[]", "model.experimental.pretrain_steps=0",
        "model.experimental.drills=0", "demos.synthetic=0", "loop.max_steps=2",
        "loop.groups_per_step=1", "rollout.group_size=4", "rollout.max_in_flight=4",
        "tasks.experimental.max_heldout=2", "eval.k=1", "model.experimental.threads=1"]


@pytest.mark.slow
def test_quickstart_with_feedback_runs_and_logs_the_hint_metrics(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "looprl", "train", "-c", str(ROOT / "configs" / "quickstart.toml"),
            "--runs", str(tmp_path), "-o", "name=fb"]
    for o in [*TINY, "grpo.experimental.feedback.coef=0.5",
              "grpo.experimental.feedback.max_per_group=2"]:
        args += ["-o", o]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "fb" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("train/hint_kl" in row and "train/hint_pass_rate" in row
                                  for row in rows)
    assert sum(row["train/hints"] for row in rows) >= 1
    assert any(row["train/hint_kl"] > 0 and row["train/updates"] >= 1 for row in rows)
    hinted = [json.loads(line) for line in
              (tmp_path / "fb" / "trajectories" / "hinted.jsonl").read_text().splitlines()]
    assert len(hinted) == sum(row["train/hints"] for row in rows)
    for t in hinted:
        h = t["hint"]
        assert h["kind"] in ("broken_call", "wrong_location", "failing_test") and h["text"]
        seg = t["segments"][0]
        assert not any(seg["loss_mask_T"][:h["end"]])  # the hint and the prefix: context only
