"""Loaders: real GRPOLoop metrics and trajectories, skipped steps as gaps, damaged and missing
inputs become messages, never exceptions."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

from looprl.dashboard import data
from looprl.dashboard.data import (
    TrajectoryIndex,
    expand_runs,
    fetch_fleet,
    load_feedback,
    load_run,
    load_tokenizer,
    metric_values,
)

from .conftest import LOOP_CYCLES, SKIPPED_STEP, STEPS, rows


def test_doctests():
    assert doctest.testmod(data).failed == 0


def test_run_from_real_grpo_loop(grpo_run: Path):
    run = load_run(grpo_run)
    assert run.problems == ()
    assert [r["step"] for r in run.rows] == list(range(1, STEPS + 1))
    assert run.last == rows(grpo_run)[-1]
    assert {"reward/total_mean", "rollout/pass_rate", "train/kl_mean", "loop/trainer_idle_fraction",
            "train/tokens_per_s"} <= set(run.last)
    held_out = run.evals["held-out functions"]
    assert held_out["start"]["metrics"]["pass@1"] == 0.2 and held_out["RL"]["metrics"]["pass@1"] == 0.4
    assert "alpha" in run.report_md
    assert run.config["name"] == "alpha" and run.config["loop"]["loggers"] == ["tensorboard"]
    assert run.trajectory_files == ("eval_rl", "train")


def test_skipped_steps_are_gaps_not_zeros(grpo_run: Path):
    run = load_run(grpo_run)
    raw = rows(grpo_run)
    assert raw[SKIPPED_STEP - 1]["train/tokens"] == 0  # what GRPOLoop logs for such a step
    assert raw[SKIPPED_STEP - 1]["train/is_ratio_mean"] == 0.0
    assert run.skipped_steps == [SKIPPED_STEP]
    ratio = metric_values(run.rows, "train/is_ratio_mean")
    assert ratio[SKIPPED_STEP - 1] is None
    assert all(v is not None and v > 0 for i, v in enumerate(ratio) if i != SKIPPED_STEP - 1)
    for key in ("train/loss", "train/grad_norm", "train/kl_mean"):
        assert metric_values(run.rows, key)[SKIPPED_STEP - 1] is None
    # the rollout side of that step was measured: its reward is a value
    assert metric_values(run.rows, "reward/total_mean")[SKIPPED_STEP - 1] == raw[SKIPPED_STEP - 1][
        "reward/total_mean"]
    assert run.latest("train/loss") == (raw[-1]["train/loss"], STEPS)


def test_trajectory_index_reads_what_the_loop_wrote(grpo_run: Path):
    idx = TrajectoryIndex(grpo_run / "trajectories" / "train.jsonl")
    items = idx.refresh()
    assert len(items) == 4 * STEPS and idx.problems == []  # 2 groups x 2 trajectories a step
    assert [s.step for s in items] == [s for s in range(1, STEPS + 1) for _ in range(4)]
    assert sum(s.passed for s in items) == 2 * (STEPS - 1)  # none passes at the skipped step
    assert {s.versions for s in items} == {(0,), (1,), (2,)}
    t = idx.read(5)
    assert t is not None and t.metadata["train_step"] == 2 and idx.read(99) is None
    evals = TrajectoryIndex(grpo_run / "trajectories" / "eval_rl.jsonl").refresh()
    (s,) = evals
    assert s.task_id == "calc-1" and s.passed and s.flags == ("broken_tool_calls",)
    assert s.versions == (1, 2) and s.broken_tool_calls == 1


def test_trajectory_index_follows_a_growing_and_rewritten_file(grpo_run: Path, tmp_path: Path):
    lines = (grpo_run / "trajectories" / "train.jsonl").read_text().splitlines(keepends=True)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(lines[:2]) + lines[2][:50])  # a line being written
    idx = TrajectoryIndex(path)
    assert len(idx.refresh()) == 2
    with open(path, "a") as f:
        f.write(lines[2][50:] + "not json\n" + lines[3])
    assert [s.n for s in idx.refresh()] == [0, 1, 2, 4]
    assert "line 4 is not a trajectory" in idx.problems[0]
    assert idx.read(4).id == json.loads(lines[3])["id"]
    path.write_text(lines[0])  # a resume trimmed it
    assert [s.id for s in idx.refresh()] == [json.loads(lines[0])["id"]] and idx.problems == []


def test_runs_folder_lists_its_runs_and_tokenizer_lookup(grpo_run: Path, tmp_path: Path):
    assert expand_runs([grpo_run.parent]) == [grpo_run]
    assert expand_runs([grpo_run, tmp_path / "nope"]) == [grpo_run, tmp_path / "nope"]
    tok = load_tokenizer(load_run(grpo_run))  # from the model the run saved
    assert tok.decode(tok.encode("def add(a, b):").ids) == "def add(a, b):"
    (tmp_path / "bare").mkdir()
    assert load_tokenizer(load_run(tmp_path / "bare")) is None  # the viewer then shows ids


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
    (tmp_path / "fresh" / "config.json").write_text("[]")
    fresh = load_run(tmp_path / "fresh")
    assert any("eval_rl.json could not be read" in p for p in fresh.problems)
    assert any("empty" in p for p in fresh.problems)
    assert any("config.json is not a JSON object" in p for p in fresh.problems)


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


def test_loop_run_is_read_as_a_loop(loop_run: Path):
    run = load_run(loop_run)
    assert run.is_loop and run.problems == ()  # no "no metrics.jsonl" for a loop
    assert [c["status"] for c in run.cycles] == ["promoted", "rolled_back", "rejected"]
    assert run.final_ab["final"] is True and run.final_ab["b"] == 1
    kept = run.final_ab["diffs"]["kept"]
    assert run.result["cycles"] == LOOP_CYCLES and run.result["rollback_ok"] == 1
    assert run.result["kept_ci_low"] == round(kept["lo"], 4)
    fresh = loop_run.parent / "starting"  # a loop in its first cycle: the store, no cycle yet
    fresh.mkdir()
    (fresh / "feedback.db").touch()
    started = load_run(fresh)
    assert started.is_loop and started.cycles == () and started.result is None
    assert started.problems == ()


def test_loop_files_being_written_or_damaged(loop_run: Path):
    text = (loop_run / "cycles.jsonl").read_text()
    (loop_run / "cycles.jsonl").write_text(text + text.splitlines()[0][:70])  # cycle 4, mid-line
    (loop_run / "result.txt").unlink()  # the loop has not ended
    run = load_run(loop_run)
    assert [c["cycle"] for c in run.cycles] == list(range(1, LOOP_CYCLES + 1))
    assert run.result is None
    (p,) = run.problems
    assert p.startswith(f"cycles.jsonl line {LOOP_CYCLES + 1} is incomplete")
    (loop_run / "final_ab.json").write_text('{"arms": ')
    (loop_run / "result.txt").write_text("cycles=3 kept_delta=oops\n")
    run = load_run(loop_run)
    assert any(p.startswith("final_ab.json could not be read") for p in run.problems)
    assert "result.txt: 'kept_delta=oops' is not key=number; skipped" in run.problems
    assert run.final_ab is None and run.result == {"cycles": 3.0}


def test_a_runs_state_shows_finished_stopped_failed_or_killed(run_copy: Path, tmp_path: Path):
    import subprocess
    import sys

    from looprl import runstate
    from looprl.dashboard import render

    runstate.mark(run_copy, "finished", stage="report")
    assert load_run(run_copy).state.status == "finished"
    assert render.train_status(load_run(run_copy)) == "finished"
    runstate.mark(run_copy, "stopped", stage="RL")
    run = load_run(run_copy)
    assert render.train_status(run) == "stopped (RL)"
    assert any("stopped in its RL stage" in p and "--resume" in p for p in run.problems)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    early = tmp_path / "early"
    runstate.mark(early, "training", stage="SFT")
    state = json.loads((early / "state.json").read_text())
    (early / "state.json").write_text(json.dumps({**state, "pid": int(dead.stdout)}))
    run = load_run(early)  # its process is gone: killed, not "training" forever
    assert run.state.status == "killed" and render.train_status(run) == "killed (SFT)"
    assert any("killed in its SFT stage, before its first training step" in p for p in run.problems)
    assert not any("refreshes by itself" in p for p in run.problems)
    runstate.mark(early, "training", stage="SFT")  # this process: alive
    assert "refreshes by itself" in load_run(early).problems[0]


def test_rl_without_a_passing_group_is_a_problem(run_copy: Path):
    lines = (run_copy / "metrics.jsonl").read_text().splitlines()
    no_pass = [json.dumps({**json.loads(line), "train/no_pass_groups": len(json.loads(line)
                                                                             ["tasks"])})
               for line in lines]
    (run_copy / "metrics.jsonl").write_text("\n".join(no_pass) + "\n")
    assert any("RL had no test signal" in p for p in load_run(run_copy).problems)
    some = [json.dumps({**json.loads(line), "train/no_pass_groups": 0}) for line in lines]
    (run_copy / "metrics.jsonl").write_text("\n".join(some) + "\n")
    assert not any("no test signal" in p for p in load_run(run_copy).problems)
