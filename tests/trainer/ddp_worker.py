"""One GRPO step on a fixed batch, distributed or not; writes loss and parameters.

    python ddp_worker.py OUT                              # one process, the whole batch
    torchrun --nproc_per_node 2 ddp_worker.py OUT         # each rank half the groups (gloo)
"""

import json
import os
import sys

import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.trainer import ddp
from looprl.trainer.step import GRPOConfig, GRPOStep
from looprl.types import Counters, Group, RewardBreakdown, Segment, StopReason, Trajectory


def groups() -> list[Group]:
    out = []
    for g in range(4):
        trajs = []
        for k, n in enumerate((3, 5 + g)):
            ids = tuple([1, 2, 3] + [(7 * g + 5 * k + j) % 60 + 4 for j in range(n)])
            seg = Segment(ids, (0.0,) * 3 + (-3.0,) * n, (0,) * 3 + (1,) * n, (-1,) * 3 + (0,) * n)
            trajs.append(Trajectory("t", f"g{g}", (seg,), (), Counters(), StopReason.FINISHED,
                                    reward=RewardBreakdown.of({"tests": float(k) + 0.1 * g})))
        out.append(Group("t", f"g{g}", tuple(trajs)))
    return out


def main() -> None:
    torch.set_num_threads(1)
    dist = ddp.init_from_env()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2))
    raw = model
    if dist.is_main:
        safetensors.torch.save_model(raw, sys.argv[1] + ".init.safetensors")
    model = ddp.wrap(model, dist)
    cfg = GRPOConfig(micro_batch_tokens=16, max_grad_norm=1e9, norm_tokens=8)
    step = GRPOStep(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    metrics = ddp.all_reduce_mean(step.on_groups(ddp.shard(groups(), dist)).to_dict(), dist)
    if dist.is_main:
        safetensors.torch.save_model(raw, sys.argv[1] + ".safetensors")
        with open(sys.argv[1] + ".json", "w") as f:
            json.dump({"loss": metrics["loss"], "world": dist.world_size,
                       "micro_batches": metrics["micro_batches"]}, f)
    ddp.cleanup()
    # Seen here about one run in four: a gloo worker hangs in interpreter teardown after
    # everything is written. Leave without teardown; the results are already on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
