"""Loaders: real GRPOLoop metrics, damaged and missing inputs become messages, never exceptions."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

from looprl.dashboard import data
from looprl.dashboard.data import fetch_fleet, load_feedback, load_run

from .conftest import STEPS, rows


def test_doctests():
    assert doctest.testmod(data).failed == 0


def test_run_from_real_grpo_loop(grpo_run: Path):
    run = load_run(grpo_run)
    assert run.problems == ()
    assert [r["step"] for r in run.rows] == list(range(1, STEPS + 1))
    assert run.last == rows(grpo_run)[-1]
    assert {"reward/total_mean", "rollout/pass_rate", "train/kl_mean", "loop/trainer_idle_fraction",
            "train/tokens_per_s"} <= set(run.last)
    assert run.evals["SFT"]["metrics"]["pass@1"] == 0.2 and run.evals["RL"]["metrics"]["pass@1"] == 0.4
    assert "alpha" in run.report_md


def test_bad_lines_are_reported_and_skipped(run_copy: Path):
    lines = (run_copy / "metrics.jsonl").read_text().splitlines()
    lines.insert(1, '{"step": 9, "reward/total_mean": ')  # truncated mid-file
    lines.insert(2, "[1, 2]")
    (run_copy / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 10, "rew')
    run = load_run(run_copy)
    assert [r["step"] for r in run.rows] == list(range(1, STEPS + 1))
    assert len(run.problems) == 3
    assert "line 2 is not valid JSON" in run.problems[0]
    assert "line 3 is a JSON list" in run.problems[1]
    assert "incomplete" in run.problems[2]  # the last line, still being written


def test_missing_inputs(tmp_path: Path):
    gone = load_run(tmp_path / "nope")
    assert gone.rows == () and "does not exist" in gone.problems[0]
    (tmp_path / "fresh").mkdir()
    fresh = load_run(tmp_path / "fresh")
    assert "no metrics.jsonl" in fresh.problems[0]
    (tmp_path / "fresh" / "metrics.jsonl").write_text("")
    (tmp_path / "fresh" / "eval_rl.json").write_text("{oops")
    fresh = load_run(tmp_path / "fresh")
    assert any("eval_rl.json could not be read" in p for p in fresh.problems)
    assert any("empty" in p for p in fresh.problems)


def test_feedback_store_is_never_created(tmp_path: Path):
    fb = load_feedback(tmp_path / "missing.db")
    assert "no feedback store" in fb.error and not (tmp_path / "missing.db").exists()
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    assert "cannot open feedback store" in load_feedback(tmp_path / "junk.db").error


def test_feedback_ab_from_a_real_store(feedback_db: Path):
    fb = load_feedback(feedback_db, min_sessions=3)
    assert fb.error is None and fb.sessions == 13
    a, b = fb.report.arms["A"], fb.report.arms["B"]
    assert (a.sessions, b.sessions) == (6, 6)  # the infra failure is not counted
    assert abs(a.kept - 2 / 6) < 1e-9 and abs(b.kept - 5 / 6) < 1e-9
    assert fb.report.decision.action in {"promote", "keep"}


def test_fleet_errors_are_messages():
    f = fetch_fleet("http://127.0.0.1:9", None, timeout_s=1.0)  # discard port: nothing listens
    assert f.metrics == {} and "unreachable" in f.error and "--env-server" in f.error


def test_metrics_parse_nan_rows():
    rows_, probs = data.parse_metrics(json.dumps({"step": 1, "train/kl_mean": float("nan")}) + "\n")
    assert probs == [] and rows_[0]["train/kl_mean"] != rows_[0]["train/kl_mean"]
