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
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from looprl.config import FieldError, check_choice
from looprl.errors import ConfigError
from looprl.models.mtp import capture_hidden, clip_grad_norms, distill_spans, heads_of
from looprl.models.pretrain import warmup_cosine_lr
from looprl.progress import Bar
from looprl.trainer.batch import pack_segments
from looprl.trainer.step import shares_prefixes, token_logprobs
from looprl.types import Segment, Trajectory


@dataclass(frozen=True)
class SFTConfig:
    """Knobs of supervised fine-tuning."""

    lr: float = 1e-4
    schedule: str = "constant"
    """``constant``: ``lr`` throughout. ``cosine``: linear warmup over the first 5% of the steps,
    then a cosine decay to 0, as pretraining does: the last steps move the weights little, so
    the model SFT ends on is not wherever a full-size step's noise left it."""
    epochs: int = 1
    """Passes over the segments (ignored when ``max_steps`` is set)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (cycling over the data as needed)."""
    batch_sequences: int = 8
    """Segments per optimizer step."""
    micro_batch_tokens: int = 4096
    """Tokens per forward pass: rows x longest row, a prefix the rows share counted once
    (``trainer.batch``); bounds activation memory. Gradients accumulate across micro-batches."""
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    """Shuffling seed (each epoch reshuffles with seed + epoch)."""
    progress: bool = True
    """Show a rich progress bar."""
    pad_id: int = 0
    autocast_bf16: bool = False
    """Forward under bf16 autocast (fp32 master weights): ~1.8x faster on CPUs with AMX."""

    def __post_init__(self) -> None:
        if not 0.0 < self.lr < math.inf:
            raise FieldError("lr", f"must be a finite number > 0, got {self.lr!r}")
        check_choice("schedule", self.schedule, ("constant", "cosine"))
        if not self.max_grad_norm > 0.0:
            raise FieldError("max_grad_norm", f"must be > 0 (inf = no clip), got {self.max_grad_norm!r}")
        if not 0.0 <= self.weight_decay < math.inf:
            raise FieldError("weight_decay", f"must be a finite number >= 0, got {self.weight_decay!r}")
        for name in ("epochs", "batch_sequences", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be >= 1, got {getattr(self, name)!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise FieldError("max_steps", f"must be >= 1 or none, got {self.max_steps!r}")


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
    steps: list[list[int]] = []
    epoch = 0
    while True:
        order = list(range(n))
        random.Random(cfg.seed + epoch).shuffle(order)
        for i in range(0, n, cfg.batch_sequences):
            steps.append(order[i:i + cfg.batch_sequences])
            if cfg.max_steps is not None and len(steps) >= cfg.max_steps:
                return steps
        epoch += 1
        if cfg.max_steps is None and epoch >= cfg.epochs:
            return steps


def sft_step(model: nn.Module, optimizer: torch.optim.Optimizer, segments: Sequence[Segment],
             cfg: SFTConfig) -> tuple[float, int]:
    """One optimizer step on ``segments``; returns (mean NLL per model token, model tokens)."""
    device = next(model.parameters()).device  # batches are built on the CPU
    mbs = [mb.to(device) for mb in pack_segments(
        segments, [0.0] * len(segments), micro_batch_tokens=cfg.micro_batch_tokens,
        pad_id=cfg.pad_id, share_prefix=shares_prefixes(model))]
    n_tok = sum(float(mb.loss_mask_B_T.sum()) for mb in mbs)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    heads = heads_of(model)
    for mb in mbs:
        # the forward's hidden states and logits also distill the model's MTP heads, if any
        with capture_hidden(model) if heads is not None else contextlib.nullcontext([]) as seen:
            lp = token_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T,
                                autocast_bf16=cfg.autocast_bf16)
        loss = -(lp * mb.loss_mask_B_T).sum() / max(n_tok, 1.0)
        nll = float(loss.detach())
        if heads is not None:
            loss = loss + distill_spans(heads, model, seen, mb.tokens_B_T, mb.attention_mask_B_T).loss / len(mbs)
        loss.backward()
        total += nll
    clip_grad_norms(model, cfg.max_grad_norm)  # the heads' gradients are clipped apart
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
                                               weight_decay=cfg.weight_decay)
    plan = _batches(len(segs), cfg)
    model.train()
    t0, losses, tokens = time.perf_counter(), [], 0
    with Bar(disable=not cfg.progress, transient=False) as bar:
        task = bar.add_task("sft", total=len(plan))
        for step, idx in enumerate(plan):
            if cfg.schedule == "cosine":
                for g in optimizer.param_groups:
                    g["lr"] = warmup_cosine_lr(step, len(plan), cfg.lr, warmup=max(1, len(plan) // 20))
            loss, n = sft_step(model, optimizer, [segs[i] for i in idx], cfg)
            losses.append(loss)
            tokens += n
            bar.update(task, advance=1, description=f"sft loss {loss:.3f}")
    return SFTResult(losses, len(plan), tokens, skipped, time.perf_counter() - t0)
