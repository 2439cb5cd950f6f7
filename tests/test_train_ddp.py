"""`looprl train --nproc 2` (torchrun, gloo, FSDP2) end to end, killed mid-RL and resumed; each
rank's rollout engine on its own GPU.

Three train tasks over two ranks: step 1 trains a group from each rank, step 2 rank 0's last one
while rank 1, out of tasks, trains on padding. The run is killed (SIGKILL, every process) once
step 1's checkpoint is written, then resumed with ``--resume``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from looprl.models.loading import load_model
from looprl.trainer.checkpoint import load_checkpoint

SMOKE = Path(__file__).parent.parent / "configs" / "smoke.toml"
TASKS = Path(__file__).parent.parent / "examples" / "extending" / "tasks.jsonl"
# configs/smoke.toml, trained by two FSDP ranks that checkpoint every step
RANKS = """
[grpo.experimental]
parallel = "fsdp"
[loop.experimental]
checkpoint_every = 1
"""
OVERRIDES = ["-o", "name=ranks", "-o", f"tasks.train_file={TASKS}", "-o", "loop.groups_per_step=2",
             "-o", "loop.max_steps=2", "-o", "rollout.max_in_flight=4"]


def running(cfg: Path) -> list[int]:
    """Processes whose command line names ``cfg`` (the launcher, torchrun, the ranks)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and str(cfg).encode() in (d / "cmdline").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:  # ended meanwhile
            continue
    return pids


@pytest.mark.slow
@pytest.mark.needs_bwrap
def test_two_ranks_train_and_resume_after_kill(tmp_path):
    cfg = tmp_path / "ranks.toml"
    cfg.write_text(SMOKE.read_text() + RANKS)
    cmd = [str(Path(sys.executable).parent / "looprl"), "train", "-c", str(cfg), "--runs",
           str(tmp_path), "--nproc", "2", *OVERRIDES]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = tmp_path / "ranks"
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if (run / "ckpt" / "step_00000001" / "meta.json").exists():
            break
        time.sleep(0.05)
    assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and torchrun: the ranks die with it
    proc.wait()
    assert not (run / "ckpt" / "step_00000002").exists(), "step 2 finished before the kill"
    deadline = time.time() + 30
    while running(cfg) and time.time() < deadline:
        time.sleep(0.1)
    assert not running(cfg), "a rank outlived torchrun"

    out = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True,
                         timeout=600, start_new_session=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "resumed RL at step 1" in out.stdout

    train = [json.loads(line)["id"] for line in (run / "tasks" / "train.jsonl").open()]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # each rank's groups reach rank 0's log; every task trained exactly once over the kill
    assert [len(r["tasks"]) for r in rows] == [2, 1]
    assert sorted(t for r in rows for t in r["tasks"]) == sorted(train)
    meta = json.loads((run / "ckpt" / "step_00000002" / "meta.json").read_text())
    assert sorted(meta["sampler_state"]["trained"]) == sorted(train)
    assert meta["weight_version"] == 2
    assert sorted(p.name for p in (run / "weights").iterdir() if p.name.startswith("v")) == \
        ["v0000000001", "v0000000002"]
    # the saved RL model is the gathered FSDP model: the last checkpoint's weights, trained
    rl = load_model(run / "model_rl").model.state_dict()
    start_model = load_model(run / "model_start").model
    start = {k: v.clone() for k, v in start_model.state_dict().items()}
    load_checkpoint(run / "ckpt" / "step_00000002", start_model, restore_rngs=False)
    ckpt = start_model.state_dict()
    assert rl.keys() == ckpt.keys() and all(torch.equal(rl[k], ckpt[k]) for k in rl)
    assert any(not torch.allclose(rl[k], start[k], atol=1e-5) for k in rl)
    assert (run / "report.md").read_text().splitlines()[-1].startswith("heldout_pass1_sft=")


@pytest.mark.parametrize("visible, device, inside", [
    ("3,5", torch.device("cuda", 1), "5"), ("3,5", torch.device("cuda"), "3"),
    ("3,5", torch.device("cpu"), "3,5")])
def test_a_ranks_engine_processes_see_its_gpu_alone(monkeypatch, visible, device, inside):
    from looprl.train.stages import only_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with only_gpu(device):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == inside
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
