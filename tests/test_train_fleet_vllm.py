"""``looprl train -c configs/smoke.toml -o fleet.backend=ray -o model.engine=vllm`` end to end, as
a user runs it against a Ray cluster: a head raylet (0 CPUs: the trainer's) and two worker raylets
on loopback (``ray.cluster_utils.Cluster``, its own GCS port and ``RAY_TMPDIR``), each worker node
hosting a ``VLLMEngine`` replica actor (its worker process in `make vllm`'s venv, vLLM's CPU build)
and an environment server. SFT and the trainer run in the driver, RL's rollouts on the vLLM
replicas, weights pushed to them each step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bwrap_support import needs_bwrap
from tests.ray_support import loopback_cluster
from tests.rollout.test_ray_fleet import IP
from tests.vllm_support import require_vllm

pytestmark = [*needs_bwrap, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def test_smoke_training_runs_on_a_ray_fleet_of_vllm_replicas(tmp_path):
    require_vllm()
    with loopback_cluster(IP, workers=2, prefix="raytv-") as cluster:
        cmd = [sys.executable, "-m", "looprl", "train", "-c", "configs/smoke.toml",
               "--runs", str(tmp_path), "-o", "fleet.backend=ray", "-o", "model.engine=vllm",
               "-o", f"fleet.address={cluster.address}", "-o", f"fleet.experimental.node_ip={IP}",
               "-o", "fleet.experimental.min_nodes=2",
               "-o", "fleet.experimental.start_timeout_s=900"]
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.monotonic() - t0
        print(f"looprl train on 2 vLLM replicas: rc {done.returncode} in {wall:.0f} s\n"
              f"{done.stdout[-4000:]}")
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        fleet = json.loads((tmp_path / "smoke" / "fleet.json").read_text())
        print(json.dumps(fleet)[:3000])
