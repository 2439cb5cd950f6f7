"""Subprocess tests: kill -9 mid-run then resume; torchrun DDP equals one process."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

HERE = Path(__file__).parent
PY = sys.executable


def run(cmd: list[str], timeout: float = 300, **kw) -> None:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (no leftovers)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    try:
        assert proc.wait(timeout=timeout) == 0, f"{cmd} failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def weights(path: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(path))


@pytest.mark.slow
def test_killed_run_resumes_with_no_batch_lost_or_trained_twice(tmp_path):
    worker = [PY, str(HERE / "resume_worker.py")]
    ck, log, out = tmp_path / "ck", tmp_path / "log", tmp_path / "w.safetensors"
    proc = subprocess.Popen([*worker, str(ck), str(log), str(out)])
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().split()) >= 7:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the worker finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = [int(x) for x in log.read_text().split()]
    assert not out.exists() and len(killed) < 16
    run([*worker, str(ck), str(log), str(out)])
    lines = log.read_text().splitlines()
    resume_at = int(lines[len(killed)].split()[1])
    resumed = [int(x) for x in lines[len(killed) + 1:]]
    assert resume_at % 2 == 0 and resume_at <= killed[-1] + 1
    # committed work: what the checkpoint held, then the resumed run -- each batch exactly once
    assert killed[:resume_at] + resumed == list(range(16))
    # and the result is bit-identical to a run that was never interrupted
    ref = tmp_path / "ref.safetensors"
    run([*worker, str(tmp_path / "ck2"), str(tmp_path / "log2"), str(ref)])
    a, b = weights(out), weights(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun not found next to the interpreter"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([PY, str(HERE / "ddp_worker.py"), str(tmp_path / "one")], env=env)
    run([torchrun, "--standalone", "--nproc_per_node", "2", str(HERE / "ddp_worker.py"),
         str(tmp_path / "two")], env=env)
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert one["world"] == 1 and two["world"] == 2
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    a, b = weights(tmp_path / "one.safetensors"), weights(tmp_path / "two.safetensors")
    # float sums in another order differ in the last bits only
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), "DDP update differs"
    init = weights(tmp_path / "one.init.safetensors")
    assert any(not torch.allclose(a[k], init[k], atol=1e-4) for k in a), "the step changed nothing"
