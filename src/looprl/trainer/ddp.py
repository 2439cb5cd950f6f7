"""Data-parallel training helpers (torch.distributed; gloo on CPU, nccl on GPUs).

    torchrun --nproc_per_node 2 my_train.py

    dist = init_from_env()                    # no-op (world of 1) without torchrun's env vars
    model = wrap(model, dist)
    groups = shard(groups, dist)              # each rank trains its share of the batch
    metrics = all_reduce_mean(step_metrics.to_dict(), dist)

Each rank packs and trains its shard; DDP averages gradients, and the losses normalise by the
rank's own sequence count, so equal shards give the same gradient as one process on the whole
batch. ``train_step`` skips the all-reduce on all but the last micro-batch (``no_sync``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as td
from torch import nn

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(backend: str | None = None) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not td.is_initialized():
        td.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return DistInfo(td.get_rank(), td.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def wrap(model: nn.Module, dist: DistInfo) -> nn.Module:
    """DDP-wrap ``model`` when running distributed (returned unchanged otherwise)."""
    if not dist.enabled:
        return model
    return nn.parallel.DistributedDataParallel(model)


def shard(items: Sequence[T], dist: DistInfo) -> list[T]:
    """This rank's contiguous share; raises unless ``items`` divides evenly (equal shards keep
    the averaged gradient equal to the single-process one)."""
    n = len(items)
    if n % dist.world_size:
        raise ValueError(f"{n} items do not split evenly over {dist.world_size} ranks; make the "
                         "number of groups per step a multiple of the world size")
    k = n // dist.world_size
    return list(items[dist.rank * k:(dist.rank + 1) * k])


def all_reduce_mean(metrics: dict[str, float], dist: DistInfo) -> dict[str, float]:
    """Mean of each metric over ranks (unchanged when not distributed)."""
    if not dist.enabled:
        return dict(metrics)
    keys = sorted(metrics)
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    td.all_reduce(t, op=td.ReduceOp.SUM)
    return {k: float(v) / dist.world_size for k, v in zip(keys, t.tolist(), strict=True)}


def cleanup() -> None:
    if td.is_initialized():
        td.destroy_process_group()
