"""Router replay across a real Ray fleet: a MoE's rollouts on the worker raylets' torch replicas
carry the experts each token was routed to, and those routes reach the trainer in a form it can
replay. Its own loopback cluster (``tests.ray_support.loopback_cluster``): the fleet module's
cluster has nodes killed and added by its tests, and a replica started after those never ran."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from looprl.fleet.config import FleetConfig, FleetExperimental
from looprl.fleet.ray_fleet import MemberSpec, RayFleet
from looprl.models.loading import save_model
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import RewardConfig
from looprl.rollout.runner import RolloutRunner
from looprl.trainer.batch import Credit, build_batch
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.step import GRPOStep
from tests.bwrap_support import needs_bwrap
from tests.ray_support import loopback_cluster
from tests.rollout.test_ray_fleet import IP, ROLLOUT, _tasks

pytestmark = [*needs_bwrap, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster(IP, workers=2, prefix="raym-") as c:
        yield c


def test_a_moes_routes_come_back_through_the_fleet_as_the_trainer_routes(cluster, tmp_path):
    """Every model segment of a group rolled out on the fleet has its routes (one per token, per
    MoE layer, top-k wide), and the trainer's own fp32 routing of those tokens agrees with them:
    the positions survived serialisation and the trip, so replay has the sampler's choices."""
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=16384,
        initializer_range=0.1)).eval()
    save_model(model, tok, tmp_path / "model")
    cfg = FleetConfig(backend="ray", address=cluster.address, experimental=FleetExperimental(
        node_ip=IP, min_nodes=2, poll_s=0.5))
    spec = MemberSpec(str(tmp_path / "model"), tok, str(tmp_path / "weights"), ROLLOUT,
                      RewardConfig())

    async def main():
        fleet = await RayFleet.start(cfg, spec)
        try:
            assert len(fleet.members) == 2
            return [r async for r in RolloutRunner.over(fleet, ROLLOUT).run(_tasks(tmp_path, 2))]
        finally:
            await fleet.close()

    results = asyncio.run(main())
    groups = [r.group for r in results]
    segs = [s for g in groups for t in g.trajectories for s in t.segments if any(s.loss_mask_T)]
    assert segs and all(s.routes is not None and s.routes.tokens == len(s.token_ids_T)
                        and (s.routes.layers, s.routes.top_k) == (2, 2) for s in segs)
    credit = Credit(skip_zero_variance=False)  # an untrained model's groups: every reward alike
    step = GRPOStep(model, GRPOConfig(lr=1e-4, experimental=GRPOExperimental(credit=credit)),
                    pad_id=tok.pad_token_id)
    m = step.on_batch(build_batch(groups, credit, pad_id=tok.pad_token_id)).to_dict()
    assert m["tokens"] > 0 and m["router_disagree"] < 0.02, m  # fp32 on both sides: ties aside
