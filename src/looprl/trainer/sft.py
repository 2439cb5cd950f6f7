"""Supervised fine-tuning on harness trajectories (oracle runs, accepted production edits).

    result = sft(model, trajectories, SFTConfig(lr=1e-4, epochs=2))
    result.losses     # mean NLL per model token, one entry per optimizer step

The loss is the negative log-likelihood of the tokens the model is meant to produce
(``Segment.loss_mask_T == 1``); prompt and tool-output tokens are context only. Because the
trajectories come from the same harness the policy serves in, SFT teaches exactly the chat and
tool-call format RL and production use. Infra-error trajectories are skipped. A model with MTP
heads (``looprl.models.mtp``) has them distilled on the same forwards (at the same learning rate).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from looprl.errors import ConfigError
from looprl.models.moe import aux_loss_coef
from looprl.models.mtp import capture_hidden, clip_grad_norms, heads_of
from looprl.models.pretrain import warmup_cosine_lr
from looprl.progress import Bar
from looprl.trainer.batch import pack_segments
from looprl.trainer.config import SFTConfig
from looprl.trainer.losses import mtp_distillation
from looprl.trainer.step import moe_logprobs, shares_prefixes, token_logprobs
from looprl.types import Segment, Trajectory


@dataclass(frozen=True)
class SFTResult:
    losses: list[float]
    """Mean NLL per model token, one per optimizer step."""
    steps: int
    tokens: int
    """Model tokens trained on (summed over steps)."""
    skipped_trajectories: int
    wall_s: float


def _segments(trajectories: Sequence[Trajectory]) -> tuple[list[Segment], int]:
    kept = [t for t in trajectories if not t.is_infra_error]
    segs = [s for t in kept for s in t.segments if s.num_model_tokens > 0]
    return segs, len(trajectories) - len(kept)


def _batches(n: int, cfg: SFTConfig) -> list[list[int]]:
    """Index lists, one per optimizer step, shuffled per epoch."""
    x = cfg.experimental
    steps: list[list[int]] = []
    epoch = 0
    while True:
        order = list(range(n))
        random.Random(x.seed + epoch).shuffle(order)
        for i in range(0, n, x.batch_sequences):
            steps.append(order[i:i + x.batch_sequences])
            if x.max_steps is not None and len(steps) >= x.max_steps:
                return steps
        epoch += 1
        if x.max_steps is None and epoch >= cfg.epochs:
            return steps


def sft_step(model: nn.Module, optimizer: torch.optim.Optimizer, segments: Sequence[Segment],
             cfg: SFTConfig) -> tuple[float, int]:
    """One optimizer step on ``segments``; returns (mean NLL per model token, model tokens)."""
    device = next(model.parameters()).device  # batches are built on the CPU
    mbs = [mb.to(device) for mb in pack_segments(
        segments, [0.0] * len(segments), micro_batch_tokens=cfg.experimental.micro_batch_tokens,
        pad_id=cfg.experimental.pad_id, share_prefix=shares_prefixes(model))]
    n_tok = sum(float(mb.loss_mask_B_T.sum()) for mb in mbs)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    heads = heads_of(model)
    aux_coef = aux_loss_coef(model)
    for mb in mbs:
        hidden: contextlib.AbstractContextManager[list[torch.Tensor]] = (
            capture_hidden(model) if heads is not None else contextlib.nullcontext([]))
        aux = None
        with hidden as seen:
            if aux_coef:  # a MoE model: its routers' load-balancing loss joins the NLL
                lp, tap = moe_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T,
                                       autocast_bf16=cfg.experimental.autocast_bf16)
                aux = tap.aux
            else:
                lp = token_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T,
                                    autocast_bf16=cfg.experimental.autocast_bf16)
        loss = -(lp * mb.loss_mask_B_T).sum() / max(n_tok, 1.0)
        nll = float(loss.detach())
        if aux is not None:
            loss = loss + aux_coef * aux / len(mbs)
        mtp = mtp_distillation(model, seen, mb.tokens_B_T, mb.attention_mask_B_T)
        if mtp is not None:  # the auxiliary term, as in the GRPO step
            loss = loss + mtp.loss / len(mbs)
        loss.backward()
        total += nll
    clip_grad_norms(model, cfg.experimental.max_grad_norm)  # the heads' clipped apart
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, int(n_tok)


def sft(model: nn.Module, trajectories: Sequence[Trajectory], cfg: SFTConfig | None = None,
        optimizer: torch.optim.Optimizer | None = None) -> SFTResult:
    """Fine-tune ``model`` on the model tokens of ``trajectories``."""
    cfg = cfg or SFTConfig()
    segs, skipped = _segments(trajectories)
    if not segs:
        raise ConfigError(f"no trainable segments in {len(trajectories)} trajectories (all infra "
                          "errors or no model tokens); check the trajectory source")
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr,
                                               weight_decay=cfg.experimental.weight_decay)
    plan = _batches(len(segs), cfg)
    model.train()
    t0, losses, tokens = time.perf_counter(), [], 0
    with Bar(disable=not cfg.experimental.progress, transient=False) as bar:
        task = bar.add_task("sft", total=len(plan))
        for step, idx in enumerate(plan):
            if cfg.experimental.schedule == "cosine":
                for g in optimizer.param_groups:
                    g["lr"] = warmup_cosine_lr(step, len(plan), cfg.lr, warmup=max(1, len(plan) // 20))
            loss, n = sft_step(model, optimizer, [segs[i] for i in idx], cfg)
            losses.append(loss)
            tokens += n
            bar.update(task, advance=1, description=f"sft loss {loss:.3f}")
    return SFTResult(losses, len(plan), tokens, skipped, time.perf_counter() - t0)
