"""Three GRPO steps on fixed batches, in one process or under torchrun; writes losses and weights.

    python ddp_worker.py OUT ddp                            # one process, every group
    torchrun --nproc_per_node 2 ddp_worker.py OUT fsdp [ac] # each rank its share (gloo)
    python ddp_worker.py OUT ddp lora                       # a LoRA adapter trains (models.lora)

Steps 1 and 2 train, a checkpoint is saved (``Sharding.save``), a model with other weights
loads it (``Sharding.load``: weights and the SGD momentum) and trains step 3. The groups split
unevenly over 2 ranks (3 per step, the odd one to rank 0), and in step 2 rank 1's only group
has equal rewards (skipped): that rank trains on padding alone. ``ac`` turns on activation
checkpointing; ``lora`` puts a rank-4 adapter on both models (the weights written are the
merged ones, ``Sharding.state_dict``). Rank 0 writes ``OUT.json`` (losses), ``OUT.init.safetensors`` and
``OUT.safetensors`` (weights before and after), and the checkpoint under ``OUT.ckpt/``.
"""

import json
import os
import sys
from pathlib import Path

import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.models.config import LoraSettings
from looprl.models.lora import merged_state_dict, with_lora
from looprl.trainer import ddp
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.trainer.step import GRPOStep
from looprl.types import Counters, Group, RewardBreakdown, Segment, StopReason, Trajectory


def groups(step: int) -> list[Group]:
    out = []
    for g in range(3):
        equal = step == 2 and g == 1  # rank 1's share of step 2
        trajs = []
        for k, n in enumerate((3, 5 + g + step)):
            ids = tuple([1, 2, 3] + [(7 * g + 5 * k + 3 * step + j) % 60 + 4 for j in range(n)])
            seg = Segment(ids, (0.0,) * 3 + (-3.0,) * n, (0,) * 3 + (1,) * n, (-1,) * 3 + (0,) * n)
            reward = 1.0 if equal else float(k) + 0.1 * g
            trajs.append(Trajectory("t", f"g{g}", (seg,), (), Counters(), StopReason.FINISHED,
                                    reward=RewardBreakdown.of({"tests": reward})))
        out.append(Group(f"t{step}-{g}", f"s{step}g{g}", tuple(trajs)))
    return out


def model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2))


def make_step(m: LlamaForCausalLM, cfg: GRPOConfig, dist: ddp.DistInfo) -> GRPOStep:
    step = GRPOStep(m, cfg, dist=dist)
    # SGD keeps the update linear in the gradient (AdamW's first step is about lr * sign(g),
    # which magnifies round-off where g is near 0); momentum gives the checkpoint a state
    step.optimizer = torch.optim.SGD(step.model.parameters(), lr=1.0, momentum=0.9)
    return step


def main() -> None:
    out, parallel = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist = ddp.init_from_env()
    cfg = GRPOConfig(experimental=GRPOExperimental(
        micro_batch_tokens=16, max_grad_norm=1e9, objective=LossParams(norm_tokens=8),
        parallel=parallel, activation_checkpointing="ac" in sys.argv[3:]))
    adapt = (lambda m: with_lora(m, LoraSettings(rank=4))) if "lora" in sys.argv[3:] \
        else (lambda m: m)
    first = adapt(model(0))
    if dist.is_main:
        safetensors.torch.save_file({k: v.contiguous() for k, v in merged_state_dict(first).items()},
                                    out + ".init.safetensors")
    step = make_step(first, cfg, dist)
    losses = [step.on_groups(groups(s)[dist.rank::dist.world_size]).loss for s in (1, 2)]
    ckpt = step.sharding.save(Path(out + ".ckpt"), 2, step.optimizer)
    ckpt = ddp.broadcast_object(ckpt, dist)
    other = make_step(adapt(model(1)), cfg, dist)  # other weights: the checkpoint must replace them
    other.sharding.load(ckpt, other.optimizer)
    losses.append(other.on_groups(groups(3)[dist.rank::dist.world_size]).loss)
    weights = other.sharding.state_dict()
    if dist.is_main:
        safetensors.torch.save_file({k: v.contiguous() for k, v in weights.items()},
                                    out + ".safetensors")
        Path(out + ".json").write_text(json.dumps({"losses": losses, "world": dist.world_size}))
    ddp.cleanup()
    # Seen here about one run in four: a gloo worker hangs in interpreter teardown after
    # everything is written. Leave without teardown; the results are already on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
