"""Data-parallel training under torchrun: DDP or FSDP2 (``fully_shard``); gloo on CPU, NCCL on GPUs.

    torchrun --nproc_per_node 2 my_train.py

    dist = init_from_env()                        # a world of 1 without torchrun's env vars
    step = GRPOStep(model, GRPOConfig(parallel="fsdp"), dist=dist)    # wraps the model
    metrics = step.on_groups(my_share_of_the_groups)                   # the whole step's metrics
    weights = step.sharding.state_dict()          # full weights on every rank (a collective)

``parallel``: ``ddp`` keeps a whole replica of the model, optimizer and gradients on every rank
and all-reduces gradients; ``fsdp`` shards parameters, gradients and optimizer state over the
ranks (each decoder layer, then the rest; parameters are all-gathered per layer for the forward
and backward). Both average gradients over ranks, so ``trainer.step.train_step`` divides each
rank's loss by the whole step's sequence count and multiplies it by the world size: the update
equals one process's on all ranks' groups, whatever each rank's share
(``tests/trainer/test_resume_ddp.py``). Ranks may hold different numbers of micro-batches
(zero-variance groups are skipped, a rank may run out of tasks): ``train_step`` pads the shorter
ranks with empty micro-batches (loss mask 0), because under FSDP every forward and backward is a
collective, and under DDP the last backward of every update is.

A LoRA model (``looprl.models.lora``) trains under DDP as any other (only the adapter has
gradients to all-reduce); FSDP refuses it. ``Sharding.state_dict`` gives its merged weights.

Checkpoints have one format whatever the parallelism (``Sharding.save``): rank 0 writes the full
model and an optimizer state laid out as one process's, which one process loads as it is. Under
FSDP rank 0 gathers them into a CPU replica of the model (one more copy of the weights in host
memory and, while saving, of the optimizer state). On resume every rank reads the checkpoint
under DDP; under FSDP rank 0 reads it and broadcasts. Ranks on several machines therefore need
a shared run directory.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as td
from torch import nn

from looprl.errors import ConfigError
from looprl.models.lora import is_lora, merged_state_dict
from looprl.trainer.checkpoint import Resumed, load_checkpoint, save_checkpoint
from looprl.trainer.config import PARALLEL

T = TypeVar("T")


TIMEOUT = timedelta(hours=6)
"""Collectives' timeout. Under ``looprl train`` rank 0 runs the stages before RL (tasks, SFT,
the first evaluation) alone while the other ranks wait at a barrier, so this bounds those
stages' time, not one step's."""


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


ONE_PROCESS = DistInfo()
"""Not distributed: rank 0 of a world of 1."""


def init_from_env(backend: str | None = None, timeout: timedelta = TIMEOUT) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...): NCCL when
    CUDA is present (each rank on ``cuda:LOCAL_RANK``), else gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return ONE_PROCESS
    _die_with_parent()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local)
    if not td.is_initialized():
        td.init_process_group(backend, timeout=timeout)
    return DistInfo(td.get_rank(), td.get_world_size(), local)


def _die_with_parent() -> None:
    """End this process when the torchrun that started it ends: torchrun puts each rank in a
    session of its own and stops them on SIGTERM or SIGINT, but a torchrun killed outright
    (SIGKILL, the OOM killer) would leave them training on, into the run a ``--resume`` then
    continues (Linux only: ``prctl(PR_SET_PDEATHSIG)``)."""
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() == 1:  # torchrun ended before the call
        os._exit(1)


def rank_device(device: torch.device, dist: DistInfo) -> torch.device:
    """The device this rank trains on: ``cuda`` under torchrun is ``cuda:LOCAL_RANK``."""
    if device.type != "cuda" or not dist.enabled:
        return device
    if device.index is not None and device.index != dist.local_rank:
        raise ConfigError(f"model.device={device} under torchrun: each rank trains on "
                          "cuda:LOCAL_RANK; set model.device=cuda (or auto)")
    return torch.device("cuda", dist.local_rank)


def unwrap(model: nn.Module) -> nn.Module:
    """The module a DDP wrapper holds (an FSDP module is its own: ``fully_shard`` works in place)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _fsdp() -> Any:
    """FSDP2's module: public from torch 2.6, ``_composable.fsdp`` before."""
    try:
        import torch.distributed.fsdp as fsdp

        fsdp.fully_shard  # noqa: B018 -- absent before torch 2.6
        return fsdp
    except AttributeError:
        import torch.distributed._composable.fsdp as composable_fsdp

        return composable_fsdp


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, _fsdp().FSDPModule)


def is_wrapped(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel) or is_sharded(model)


def wrap(model: nn.Module, dist: DistInfo, parallel: str = "ddp") -> nn.Module:
    """``model`` ready for data-parallel training: DDP-wrapped, or sharded in place by FSDP2
    (``fully_shard`` on each of the model's decoder layers, HF's ``_no_split_modules``, then on
    the whole); unchanged in one process or when already wrapped. Build the optimizer after."""
    if parallel not in PARALLEL:
        raise ConfigError(f"parallel={parallel!r}: choose one of {', '.join(PARALLEL)}")
    if not dist.enabled or is_wrapped(model):
        return model
    device = next(model.parameters()).device
    if parallel == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = _fsdp().fully_shard
    mesh = init_device_mesh(device.type, (dist.world_size,))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them (HF's
    activation checkpointing, non-reentrant: DDP and FSDP need that)."""
    m = unwrap(model)
    # transformers 5.24 renamed gradient_checkpointing_enable (kept as a deprecated alias)
    enable = getattr(m, "activation_checkpointing_enable", None)
    kw = "activation_checkpointing_kwargs"
    if enable is None:
        enable, kw = getattr(m, "gradient_checkpointing_enable", None), "gradient_checkpointing_kwargs"
    if enable is None:
        raise ConfigError(f"activation_checkpointing needs a Hugging Face model; "
                          f"{type(m).__name__} is not one: set grpo.experimental.activation_checkpointing=false")
    enable(**{kw: {"use_reentrant": False}})


def checkpoints_activations(model: nn.Module) -> bool:
    """Whether a layer of ``model`` recomputes its activations (``checkpoint_activations``)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _full_options(*, cpu_offload: bool = False, broadcast_from_rank0: bool = False) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload,
                            broadcast_from_rank0=broadcast_from_rank0)


def _cpu_replica(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every parameter and buffer on the CPU, made without a second
    copy on the model's device (tied parameters stay tied)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to("cpu", copy=True), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = b.detach().to("cpu", copy=True)
    return copy.deepcopy(model, memo)


def check_lora_parallel(lora: bool, dist: DistInfo, parallel: str) -> None:
    """A LoRA model trains under DDP, not FSDP: a one-line ``ConfigError`` for that pair."""
    if lora and dist.enabled and parallel == "fsdp":
        raise ConfigError("model.lora does not run under FSDP; set grpo.experimental.parallel=ddp "
                          "(the adapter is small: every rank keeps it whole) or model.lora.rank=0")


class Sharding:
    """A trainer's model spread over the ranks (module docstring): the wrapped model, its full
    weights, and checkpoints in the one-process format."""

    def __init__(self, model: nn.Module, dist: DistInfo | None = None, parallel: str = "ddp"
                 ) -> None:
        self.dist = dist or ONE_PROCESS
        self.parallel = parallel
        check_lora_parallel(is_lora(model), self.dist, parallel)
        will_shard = self.dist.enabled and parallel == "fsdp" and not is_wrapped(model)
        # the copy checkpoints go through; made before fully_shard turns the weights to shards
        self._replica = _cpu_replica(model) if will_shard and self.dist.is_main else None
        self._replica_opt: torch.optim.Optimizer | None = None
        self.model = wrap(model, self.dist, parallel)

    @property
    def module(self) -> nn.Module:
        """The model without a DDP wrapper."""
        return unwrap(self.model)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights the policy computes with, keyed as ``module.state_dict()`` (a LoRA
        model's merged weights, keyed as its base model's: ``models.lora``): under FSDP a
        collective that every rank calls, and every rank gets them (their engines take them)."""
        if not is_sharded(self.model):
            return merged_state_dict(self.module)
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        # cast: full_state_dict gathers plain tensors; torch's return type covers sharded ones too
        return cast(dict[str, torch.Tensor],
                    get_model_state_dict(self.model, options=_full_options()))

    def gathered(self) -> nn.Module | None:
        """The trained model as one plain module on rank 0 (``save_pretrained`` it): the model
        itself, or under FSDP the CPU replica given the full weights (a collective); None on
        the other ranks."""
        if not is_sharded(self.model):
            return self.module if self.dist.is_main else None
        weights = _full_weights_on_rank0(self.model)
        if not self.dist.is_main:
            return None
        assert self._replica is not None, "rank 0 of a sharded model holds the replica"
        self._replica.load_state_dict(weights)
        return self._replica

    def save(self, root: Path, step: int, optimizer: torch.optim.Optimizer, **meta: Any
             ) -> Path | None:
        """``checkpoint.save_checkpoint`` of the full model and optimizer, written by rank 0
        (its path; None on the other ranks). A collective under FSDP: every rank calls it."""
        if not is_sharded(self.model):
            return save_checkpoint(root, step, self.module, optimizer, **meta) \
                if self.dist.is_main else None
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        weights = _full_weights_on_rank0(self.model)
        opt_state = get_optimizer_state_dict(self.model, optimizer,
                                             options=_full_options(cpu_offload=True))
        if not self.dist.is_main:
            return None
        replica, replica_opt = self._replica_pair(optimizer)
        _set_full_state(replica, replica_opt, weights, opt_state, broadcast=False)
        return save_checkpoint(root, step, replica, replica_opt, **meta)

    def load(self, path: Path, optimizer: torch.optim.Optimizer) -> Resumed:
        """``checkpoint.load_checkpoint`` into the wrapped model and ``optimizer`` on every rank
        (all ranks call it; under FSDP rank 0 reads and broadcasts)."""
        if not is_sharded(self.model):
            return load_checkpoint(path, self.module, optimizer)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        resumed, weights, opt_state = None, {}, {}
        if self.dist.is_main:
            replica, replica_opt = self._replica_pair(optimizer)
            resumed = load_checkpoint(path, replica, replica_opt)
            weights = replica.state_dict()
            opt_state = get_optimizer_state_dict(replica, replica_opt, options=_full_options())
        _set_full_state(self.model, optimizer, weights, opt_state, broadcast=True)
        resumed = broadcast_object(resumed, self.dist)
        assert resumed is not None, "rank 0 loaded the checkpoint and sent what it resumed"
        return resumed

    def _replica_pair(self, optimizer: torch.optim.Optimizer
                      ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The CPU replica and an optimizer over it with ``optimizer``'s class and param groups
        (parameters matched by name, in the same order, so its ``state_dict`` is laid out as one
        process's)."""
        assert self._replica is not None, "only rank 0 of a sharded model holds the replica"
        if self._replica_opt is None:
            names = {id(p): n for n, p in self.model.named_parameters()}
            mine = dict(self._replica.named_parameters())
            groups = [{**{k: v for k, v in g.items() if k != "params"},
                       "params": [mine[names[id(p)]] for p in g["params"]]}
                      for g in optimizer.param_groups]
            # cast: an optimizer class takes its param groups alone (the base class's signature,
            # which torch gives type(optimizer), also asks for the defaults each subclass fills in)
            make = cast(Callable[[list[dict[str, Any]]], torch.optim.Optimizer], type(optimizer))
            self._replica_opt = make(groups)
        return self._replica, self._replica_opt


def _full_weights_on_rank0(model: nn.Module) -> dict[str, torch.Tensor]:
    """A sharded model's full weights on rank 0's CPU (a collective; empty on other ranks)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    # cast: as in Sharding.state_dict, full_state_dict gives plain tensors
    return cast(dict[str, torch.Tensor],
                get_model_state_dict(model, options=_full_options(cpu_offload=True)))


def _set_full_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                    weights: dict[str, torch.Tensor], opt_state: dict[str, Any], *,
                    broadcast: bool) -> None:
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = _full_options(broadcast_from_rank0=broadcast)
    # torch types the dict it only reads as dict[str, ValueType], invariant: Tensor values are
    # ValueType ones, but a dict[str, Tensor] is not a dict[str, ValueType]
    set_model_state_dict(model, weights, options=opts)  # type: ignore[arg-type]
    set_optimizer_state_dict(model, optimizer, opt_state, options=opts)


def all_reduce(values: Sequence[float], dist: DistInfo, op: str = "sum") -> list[float]:
    """Elementwise sum (or ``max``) of ``values`` over ranks (unchanged in one process)."""
    if not dist.enabled:
        return [float(v) for v in values]
    device = torch.device("cuda", dist.local_rank) if td.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    td.all_reduce(t, op=td.ReduceOp.MAX if op == "max" else td.ReduceOp.SUM)
    return t.tolist()


def any_rank(flag: bool, dist: DistInfo) -> bool:
    """Whether ``flag`` holds on some rank."""
    return all_reduce([float(flag)], dist, op="max")[0] > 0


def broadcast_object(obj: T, dist: DistInfo) -> T:
    """Rank 0's ``obj`` on every rank."""
    if not dist.enabled:
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: T, dist: DistInfo) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not dist.enabled:
        return [obj]
    out: list[Any] = [None] * dist.world_size
    td.all_gather_object(out, obj)
    return out


def per_rank(n: int, dist: DistInfo, field: str) -> int:
    """Each rank's share of ``n`` (the ``field`` of a config); a clear error unless it divides."""
    if n % dist.world_size:
        raise ConfigError(f"{field}={n} does not split over {dist.world_size} ranks; make it a "
                          "multiple of the number of ranks")
    return n // dist.world_size


def barrier(dist: DistInfo) -> None:
    if not dist.enabled:
        return
    if td.get_backend() == "nccl":
        td.barrier(device_ids=[dist.local_rank])
    else:
        td.barrier()


def cleanup() -> None:
    if td.is_initialized():
        td.destroy_process_group()
