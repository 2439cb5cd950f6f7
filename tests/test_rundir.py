"""The run-directory record: its names are those of the runs already on users' disks."""

import doctest
from pathlib import Path

from looprl import rundir
from looprl.rundir import RunDir

ON_DISK = {
    "config": "config.json", "report": "report.md", "tasks": "tasks", "state": "state.json",
    "clock": "clock.json",
    "model_init": "model_init", "validation_demos": "demos_validation.jsonl",
    "sft_loss": "sft_loss.png", "model_start": "model_start", "model_sft": "model_sft",
    "start_record": "start.json", "metrics": "metrics.jsonl", "tensorboard": "tb",
    "wandb_run_id": "wandb_run_id", "ckpt": "ckpt", "weights": "weights",
    "trajectories": "trajectories", "train_trajectories": "trajectories/train.jsonl",
    "fleet": "fleet.json", "infra_ledger": "infra.json", "fault_books": "faults.jsonl",
    "reward_curve": "reward_curve.png", "rl_record": "rl.json",
    "model_rl": "model_rl", "turn_accuracy": "turn_accuracy.json",
    "dashboard_page": "dashboard.html", "feedback_db": "feedback.db", "policies": "policies",
    "cycles": "cycles.jsonl", "final_ab": "final_ab.json", "result": "result.txt",
    "server_info": "server.json", "users_summary": "users.json", "users_tasks": "users_tasks.jsonl",
    "ab_plot": "ab.png", "gate_plot": "gate.png",
}
"""Renaming one strands every saved run: ``--resume``, the dashboard and the scripts would no
longer find it."""


def test_every_name_is_the_one_saved_runs_hold():
    rd = RunDir("runs/q")  # a str is taken as a path
    assert rd.root == Path("runs/q")
    names = {k for k, v in vars(RunDir).items() if isinstance(v, property)} - {"saved_models"}
    assert names == set(ON_DISK)  # a new name is added here, with the file it names
    assert {k: getattr(rd, k).relative_to(rd.root).as_posix() for k in names} == ON_DISK
    assert rd.task_file("heldout_packages") == rd.root / "tasks" / "heldout_packages.jsonl"
    assert rd.evaluation("v84", packages=True) == rd.root / "eval_v84_packages.json"
    assert rd.eval_trajectories("start") == rd.root / "trajectories" / "eval_start.jsonl"
    assert rd.gate_report(3) == rd.root / "gate" / "v0003.json"
    assert rd.saved_models[0] == rd.model_rl and rd.saved_models[-1] == rd.model_init


def test_doctests():
    res = doctest.testmod(rundir)
    assert res.attempted > 0 and res.failed == 0
