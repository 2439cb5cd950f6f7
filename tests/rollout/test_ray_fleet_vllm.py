"""The Ray fleet with vLLM engine replicas (``MemberSpec.engine = "vllm"``) on a real cluster on
this machine: a head raylet (the driver, no CPUs for rollouts) and a worker raylet started as Ray
starts them (``ray.cluster_utils.Cluster``, on loopback, its own port and temp dir), whose replica
actor runs ``VLLMEngine`` — its worker process in `make vllm`'s venv, vLLM's CPU build.

A group is rolled out on it, a new weight version is published to the store and pushed
(``RayFleet.update_weights``: the replica pulls it into vLLM), and a second group follows. The
tokens of each group carry the version that sampled them, the second group's logprobs are those
of a PyTorch forward of the pushed weights (not the starting ones), and vLLM's own counters on
the replica account for every sampled token. One worker node: two vLLM start-ups at once on this
2-core machine would take minutes more and show nothing the torch fleet test does not.
"""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.fleet.config import FleetConfig, FleetExperimental
from looprl.fleet.ray_fleet import MemberSpec, RayFleet
from looprl.harness.agent import AgentConfig
from looprl.models.loading import save_model
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import RewardConfig
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.types import Trajectory
from looprl.weights.store import LocalWeightStore
from tests.bwrap_support import needs_bwrap
from tests.ray_support import loopback_cluster
from tests.rollout.test_ray_fleet import IP, _tasks
from tests.vllm_support import require_vllm

pytestmark = [*needs_bwrap, pytest.mark.slow]
ROLLOUT = RolloutConfig(group_size=2, max_in_flight=2,
                        agent=AgentConfig(max_turns=2, max_new_tokens=16, context_window=4096))
LOGPROB_ATOL = 1e-4
"""vLLM's CPU kernels vs PyTorch's, both fp32 (``tests/inference/test_vllm.py``)."""


@pytest.fixture(scope="module")
def cluster():
    require_vllm()
    with loopback_cluster(IP, workers=1, prefix="rayv-") as c:
        yield c


def _logprobs(model: LlamaForCausalLM, traj: Trajectory) -> tuple[list[float], list[float]]:
    """(the engine's logprobs of the sampled tokens, ``model``'s of the same tokens)."""
    engine, ours = [], []
    for seg in traj.segments:
        ids = torch.tensor([seg.token_ids_T])
        with torch.no_grad():
            logp_T_V = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        for t in range(1, len(seg.token_ids_T)):
            if seg.loss_mask_T[t]:
                engine.append(seg.logprobs_T[t])
                ours.append(float(logp_T_V[t - 1, seg.token_ids_T[t]]))
    return engine, ours


def _sampled(trajs: list[Trajectory]) -> list[int]:
    """The policy version of every sampled token."""
    return [v for t in trajs for s in t.segments
            for v, m in zip(s.policy_version_T, s.loss_mask_T, strict=True) if m]


def _workers_of(model_dir: Path) -> list[int]:
    """Pids of the vLLM worker processes serving ``model_dir``."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if p.name.isdigit() and "vllm_worker.py" in cmd and str(model_dir) in cmd:
            out.append(int(p.name))
    return out


def test_rollouts_on_a_vllm_replica_take_a_weight_push(cluster, tmp_path):
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(  # head size 32: vLLM's CPU attention refuses 8 or 16
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True)).eval()
    model_dir = save_model(model, tok, tmp_path / "model")
    weights = tmp_path / "weights"
    tasks = _tasks(tmp_path, 2)
    cfg = FleetConfig(backend="ray", address=cluster.address, experimental=FleetExperimental(
        node_ip=IP, min_nodes=1, poll_s=0.5, start_timeout_s=900))
    spec = MemberSpec(str(model_dir), tok, str(weights), ROLLOUT, RewardConfig(), engine="vllm")
    moved = copy.deepcopy(model)  # the pushed version: every weight moved (tied ones stay tied)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    pushed = moved.state_dict()
    store = LocalWeightStore(str(weights))

    async def main():
        t0 = time.monotonic()
        fleet = await RayFleet.start(cfg, spec)
        up_s = time.monotonic() - t0
        try:
            [member] = fleet.members.values()
            runner = RolloutRunner.over(fleet, ROLLOUT)
            before = [r async for r in runner.run(tasks[:1])]
            store.publish(pushed, 1)
            t1 = time.monotonic()
            await fleet.update_weights(pushed, 1)
            push_s = time.monotonic() - t1
            after = [r async for r in runner.run(tasks[1:])]
            stats = await member.lanes[0].replica.stats.remote()
            return before, after, stats, up_s, push_s
        finally:
            await fleet.close()

    before, after, stats, up_s, push_s = asyncio.run(main())
    print(f"vLLM replica up in {up_s:.0f} s; weight push {push_s:.1f} s")
    first = [t for r in before for t in r.group.trajectories]
    second = [t for r in after for t in r.group.trajectories]
    assert len(first) == len(second) == 2 and not any(t.is_infra_error for t in first + second)
    assert set(_sampled(first)) == {0} and set(_sampled(second)) == {1}

    # the second group was sampled from the pushed weights (as the store serves them) by vLLM
    served = LlamaForCausalLM(model.config).eval()
    served.load_state_dict({k: v.float() for k, v in store.fetch(1).items()})
    for traj in second:
        engine, ours = _logprobs(served, traj)
        assert engine and max(abs(a - b) for a, b in zip(engine, ours, strict=True)) < LOGPROB_ATOL
        _, start = _logprobs(model, traj)
        assert max(abs(a - b) for a, b in zip(engine, start, strict=True)) > 100 * LOGPROB_ATOL
    # vLLM's own counters, read on the replica: it sampled every token, its prefix cache served
    # each group's shared prompt, and it took the one push
    assert stats["engine/generated_tokens"] == len(_sampled(first + second))
    assert stats["engine/prefix_cached_tokens"] > 0
    assert stats["engine/weight_updates"] == 1 and stats["policy_version"] == 1

    # the killed actor's vLLM worker sees its socket close and shuts vLLM down
    deadline = time.monotonic() + 60
    while _workers_of(model_dir):
        assert time.monotonic() < deadline, f"vLLM workers {_workers_of(model_dir)} outlived the fleet"
        time.sleep(0.5)
