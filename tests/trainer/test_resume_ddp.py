"""Subprocess tests: kill -9 mid-run then resume; torchrun DDP and FSDP2 equal one process."""

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


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """``ddp_worker.py`` in one process: the reference the ranks must reproduce."""
    out = tmp_path_factory.mktemp("one") / "one"
    run([PY, str(HERE / "ddp_worker.py"), str(out), "ddp"], env=ENV)
    return out



@pytest.mark.slow
@pytest.mark.parametrize("mode", [["ddp"], ["fsdp", "ac"]], ids=["ddp", "fsdp+activation_ckpt"])
def test_torchrun_two_ranks_match_one_process(tmp_path, one_process, mode):
    """Per-step loss within 1e-6 relative and weights within 1e-6 of one process's, over two
    steps, a checkpoint saved and loaded into other weights, and a third step; the groups split
    unevenly and one rank trains a step on padding alone (``ddp_worker.py``)."""
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun not found next to the interpreter"
    two = tmp_path / "two"
    run([torchrun, "--standalone", "--nproc_per_node", "2", str(HERE / "ddp_worker.py"),
         str(two), *mode], env=ENV)
    ref, got = (json.loads(Path(f"{p}.json").read_text()) for p in (one_process, two))
    assert ref["world"] == 1 and got["world"] == 2
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-6)
    a, b = weights(Path(f"{one_process}.safetensors")), weights(Path(f"{two}.safetensors"))
    assert a.keys() == b.keys()
    # float sums in another order differ in the last bits only
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a), "the update differs"
    init = weights(Path(f"{one_process}.init.safetensors"))
    assert any(not torch.allclose(a[k], init[k], atol=1e-3) for k in a), "the steps changed nothing"
    # rank 0 wrote the checkpoint as one process does: the same optimizer state, by index
    opt_a, opt_b = (torch.load(Path(f"{p}.ckpt") / "step_00000002" / "optimizer.pt")
                    for p in (one_process, two))
    assert opt_a["param_groups"] == opt_b["param_groups"] and opt_a["state"].keys() == opt_b["state"].keys()
    assert all(torch.allclose(opt_a["state"][i]["momentum_buffer"],
                              opt_b["state"][i]["momentum_buffer"], rtol=0, atol=1e-6)
               for i in opt_a["state"])


@pytest.mark.slow
def test_torchrun_lora_matches_one_process(tmp_path):
    """A LoRA adapter under DDP: two ranks give one process's losses and merged weights (only
    the adapter trains: the merged weights of untargeted layers stay the initial ones)."""
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun not found next to the interpreter"
    one, two = tmp_path / "one", tmp_path / "two"
    run([PY, str(HERE / "ddp_worker.py"), str(one), "ddp", "lora"], env=ENV)
    run([torchrun, "--standalone", "--nproc_per_node", "2", str(HERE / "ddp_worker.py"),
         str(two), "ddp", "lora"], env=ENV)
    ref, got = (json.loads(Path(f"{p}.json").read_text()) for p in (one, two))
    assert got["world"] == 2 and got["losses"] == pytest.approx(ref["losses"], rel=1e-6)
    a, b = weights(Path(f"{one}.safetensors")), weights(Path(f"{two}.safetensors"))
    init = weights(Path(f"{one}.init.safetensors"))
    assert a.keys() == b.keys() == init.keys()
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a), "the update differs"
    moved = {k for k in a if not torch.equal(a[k], init[k])}
    assert moved and all(k.endswith("proj.weight") for k in moved)
