"""One GRPO optimizer step on any Hugging Face causal LM.

    cfg = GRPOConfig(lr=1e-5, loss="dr_grpo")
    opt = make_optimizer(model, cfg)
    x = cfg.experimental
    batch = build_batch(groups, x.credit, std_norm=cfg.std_norm,
                        micro_batch_tokens=x.micro_batch_tokens)
    metrics = train_step(model, ref_model, opt, batch, cfg)      # or GRPOStep(...).on_groups(groups)

A step: for every micro-batch, forward, logprobs of the taken tokens, loss from ``LOSSES`` (plus
the auxiliary ``losses.mtp_distillation`` when the model has MTP heads), backward (gradients
accumulate; under DDP only the last micro-batch all-reduces); then gradient clipping and one
optimizer step. Each batch is stepped once (single epoch). With
``mini_batches > 1`` the batch is split into that many consecutive updates, and the policy at the
start of the step is the PPO "proximal" policy the ratio is clipped against.

The trainer keeps fp32 master weights; the engine may sample in bf16 from weights published in
bf16 (``looprl.weights``): the difference between ``Segment.logprobs_T`` and the trainer's
logprobs is what the truncated importance weight corrects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from looprl.errors import ConfigError
from looprl.models.fingerprint import check_trajectories, model_fingerprint
from looprl.models.lora import base_of
from looprl.models.moe import RouterTap, aux_loss_coef, is_moe, shifted_routes
from looprl.models.mtp import DistillOut, capture_hidden, clip_grad_norms, heads_of
from looprl.trainer import ddp
from looprl.trainer.batch import (
    MIN_SHARED_PREFIX,
    MicroBatch,
    TrainBatch,
    build_batch,
    distinct_rows,
)
from looprl.trainer.config import GRPOConfig
from looprl.trainer.distill import hint_distillation, hint_pair
from looprl.trainer.losses import (
    LossInputs,
    LossOutput,
    get_loss,
    mtp_distillation,
)
from looprl.types import Group, Trajectory


@dataclass(frozen=True)
class StepMetrics:
    """What one step did. Token-weighted means over model tokens; ``loss`` summed per update."""

    loss: float
    kl_mean: float
    is_ratio_mean: float
    is_ratio_max: float
    clip_fraction: float
    grad_norm: float
    tokens: int
    """Model (loss-masked) tokens trained on."""
    sequences: int
    micro_batches: int
    updates: int
    """Optimizer updates applied (skipped ones, for a non-finite gradient, are not counted)."""
    skipped_updates: int
    wall_s: float
    zero_variance_groups: int = 0
    dropped_infra: int = 0
    no_pass_groups: int = 0
    mean_reward: float = 0.0
    mean_staleness: float = 0.0
    """Mean (current version - sampling version) over model tokens, when the version is given."""
    mtp_kl: float = 0.0
    """MTP heads: mean KL(policy || head) over heads and positions (0 without heads)."""
    mtp_accept: float = 0.0
    """MTP heads: mean estimated acceptance of a temperature-1 draft, 1 - TV (0 without heads)."""
    silent_rows: int = 0
    """Rows with advantage 0 everywhere left out of the forward (``build_batch``'s
    ``drop_silent``); ``sequences`` counts them."""
    engine_kl: float = 0.0
    """Train-inference KL: mean over model tokens of (engine logprob - the step's starting
    policy's logprob), the k1 estimate of KL(engine || trainer) from the engine's samples
    (tokens sampled at older versions add the policy's drift)."""
    engine_mismatch_frac: float = 0.0
    """Share of model tokens whose two logprobs differ by more than ``ENGINE_MISMATCH_TOL``."""
    router_disagree: float = 0.0
    """MoE models: share of (token, layer) decisions whose experts (as a set) differ from the
    engine's recorded ones, over the tokens with a record (0 with ``router_replay``)."""
    router_disagree_L: tuple[float, ...] = ()
    """The same per MoE layer (``router_disagree_l{i}`` in ``to_dict``)."""
    moe_aux_loss: float = 0.0
    """MoE models: the load-balancing loss (mean over micro-batches; top-k when every
    expert gets the same share of tokens and router probability, more as routing concentrates)."""
    hints: int = 0
    """Hinted continuations distilled this step (``grpo.experimental.feedback``)."""
    hint_kl: float = 0.0
    """Mean KL(teacher || student) over their continuation tokens, before the update."""
    hint_pass_rate: float = 0.0
    """Share of this step's graded hinted continuations that passed (a real user's follow-up
    continuation has no hidden test: not graded, not counted)."""

    def to_dict(self) -> dict[str, float]:
        moe = ("router_disagree_L", "router_disagree", "moe_aux_loss")
        d = {k: float(v) for k, v in self.__dict__.items() if k not in moe}
        if self.router_disagree_L:  # a MoE model's step
            d.update(router_disagree=self.router_disagree, moe_aux_loss=self.moe_aux_loss)
        d.update({f"router_disagree_l{i}": v for i, v in enumerate(self.router_disagree_L)})
        return d


ENGINE_MISMATCH_TOL = 0.1
"""Nats: a token whose engine and trainer logprobs differ by more (an importance ratio off by
over ~10%) counts in ``engine_mismatch_frac``."""


def make_optimizer(model: nn.Module, cfg: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW over the policy (and, in a group of their own at ``mtp_lr``, its MTP heads)."""
    x = cfg.experimental
    heads = heads_of(model)
    own = {id(p) for p in heads.parameters()} if heads is not None else set()
    groups: list[dict[str, Any]] = [
        {"params": [p for p in model.parameters() if p.requires_grad and id(p) not in own]}]
    if heads is not None:
        groups.append({"params": [p for p in heads.parameters() if p.requires_grad],
                       "lr": x.mtp_lr, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(x.adam_beta1, x.adam_beta2),
                             weight_decay=x.weight_decay)


def gather_logprobs(logits_B_T_V: torch.Tensor, targets_B_T: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target], one row at a time so no second [B, T, V] tensor is made."""
    rows = []
    for b in range(logits_B_T_V.shape[0]):
        row = logits_B_T_V[b].float()
        rows.append(row.gather(-1, targets_B_T[b, :, None]).squeeze(-1) - row.logsumexp(-1))
    return torch.stack(rows)


def shared_prefix_len(tokens_B_T: torch.Tensor, attention_mask_B_T: torch.Tensor) -> int:
    """Leading positions where every row has the same real token (0 for a single row).

    >>> t = torch.tensor([[1, 2, 3, 0], [1, 2, 4, 5]]); shared_prefix_len(t, (t > 0).long())
    2
    """
    if tokens_B_T.shape[0] < 2:
        return 0
    same_T = (tokens_B_T == tokens_B_T[:1]).all(0) & (attention_mask_B_T == 1).all(0)
    return int(same_T.long().cumprod(0).sum())


def shares_prefixes(model: nn.Module) -> bool:
    """Whether ``token_logprobs`` runs a prefix its rows share once for ``model`` (not under DDP,
    which expects one forward per backward; nor FSDP, where ranks must run as many forwards; nor
    with activation checkpointing, which turns the KV cache off); packing costs micro-batches
    the same way."""
    return not (ddp.is_wrapped(model) or ddp.checkpoints_activations(model) or is_moe(model))


def token_logprobs(model: nn.Module, tokens_B_T: torch.Tensor, attention_mask_B_T: torch.Tensor,
                   *, temperature: float = 1.0, autocast_bf16: bool = False,
                   share_prefix: bool = True) -> torch.Tensor:
    """Logprob of each token given the ones before it; position 0 (no context) is 0.

    Rows that repeat an earlier row (``distinct_rows``) take its logprobs, so the forward runs
    each distinct row once. With ``share_prefix``, rows that start with the same tokens (the
    system prompt and tool schemas of every trajectory, a group's whole prompt) run that prefix
    once, batch 1, and the rest of each row attends to its KV. Either way the values and
    gradients are the full forward's (gradients flow back through the shared rows and KV), for a
    fraction of the compute."""
    keep_U, of_B = distinct_rows(tokens_B_T, attention_mask_B_T)
    if len(keep_U) < tokens_B_T.shape[0]:
        return token_logprobs(model, tokens_B_T[keep_U], attention_mask_B_T[keep_U],
                              temperature=temperature, autocast_bf16=autocast_bf16,
                              share_prefix=share_prefix)[of_B]
    ctx = (torch.autocast(tokens_B_T.device.type, dtype=torch.bfloat16) if autocast_bf16
           else contextlib.nullcontext())  # on the device the batch is on: CPU or CUDA
    T = tokens_B_T.shape[1]
    P = shared_prefix_len(tokens_B_T, attention_mask_B_T) if share_prefix else 0
    if P < MIN_SHARED_PREFIX or P >= T - 1 or not shares_prefixes(model):
        return _plain_logprobs(model, tokens_B_T, attention_mask_B_T, temperature, ctx)
    B = tokens_B_T.shape[0]
    with ctx:
        pre = model(input_ids=tokens_B_T[:1, :P], use_cache=True)
        # PEFT's wrapper passes the cache on by keyword: the name is the base model's
        kw = _cache_kw(base_of(model).__class__)  # type: ignore[arg-type]  # (a class is hashable)
        cache = pre[kw]
        cache.batch_repeat_interleave(B)
        rest = model(input_ids=tokens_B_T[:, P:], attention_mask=attention_mask_B_T,
                     use_cache=True, **{kw: cache}).logits
    pre_logits = _tempered(pre.logits, temperature)
    lp_prefix = gather_logprobs(pre_logits[:, :-1], tokens_B_T[:1, 1:P]).expand(B, -1)
    lp_first = gather_logprobs(pre_logits[:, -1:].expand(B, -1, -1), tokens_B_T[:, P:P + 1])
    lp_rest = gather_logprobs(_tempered(rest[:, :-1], temperature), tokens_B_T[:, P + 1:])
    return F.pad(torch.cat([lp_prefix, lp_first, lp_rest], dim=1), (1, 0))


def _plain_logprobs(model: nn.Module, tokens_B_T: torch.Tensor, attention_mask_B_T: torch.Tensor,
                    temperature: float, ctx: contextlib.AbstractContextManager) -> torch.Tensor:
    """One forward of every row (``token_logprobs`` without its shortcuts)."""
    with ctx:
        logits = model(input_ids=tokens_B_T, attention_mask=attention_mask_B_T,
                       use_cache=False).logits
    return F.pad(gather_logprobs(_tempered(logits[:, :-1], temperature), tokens_B_T[:, 1:]),
                 (1, 0))


def moe_logprobs(model: nn.Module, tokens_B_T: torch.Tensor, attention_mask_B_T: torch.Tensor,
                 routes_B_T_L_K: torch.Tensor | None = None, *, replay: bool = False,
                 temperature: float = 1.0, autocast_bf16: bool = False
                 ) -> tuple[torch.Tensor, RouterTap]:
    """``token_logprobs`` of a MoE model, one forward of every row, with its routers tapped
    (``models.moe.RouterTap``): per-token ``routes_B_T_L_K`` (``Segment.routes``) are compared
    with the trainer's choice and, with ``replay``, used; the tap has the forward's load-balancing
    loss. Rows are not deduplicated nor prefixes shared: the routes are per row and position."""
    routes = shifted_routes(routes_B_T_L_K) if routes_B_T_L_K is not None else None
    ctx = (torch.autocast(tokens_B_T.device.type, dtype=torch.bfloat16) if autocast_bf16
           else contextlib.nullcontext())
    with RouterTap(model, routes, replay=replay) as tap:
        lp = _plain_logprobs(model, tokens_B_T, attention_mask_B_T, temperature, ctx)
    tap.aux = tap.aux_loss(attention_mask_B_T)
    return lp, tap


@functools.lru_cache(maxsize=16)
def _cache_kw(model_cls: Any) -> str:
    """The name of the KV cache in ``model_cls``'s forward and output: ``cache`` from
    transformers 5.24 (``past_key_values`` there is deprecated, to be removed in 5.40), before
    it ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model_cls.forward).parameters else \
        "past_key_values"


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 1.0 else logits.float() / temperature


def _split(mbs: Sequence[MicroBatch], n: int) -> list[list[MicroBatch]]:
    if not mbs:
        return []
    n = max(1, min(n, len(mbs)))
    size = math.ceil(len(mbs) / n)
    return [list(mbs[i:i + size]) for i in range(0, len(mbs), size)]


def _no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    if not last and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _logprobs(model: nn.Module, mb: MicroBatch, cfg: GRPOConfig,
              taps: list[RouterTap] | None = None) -> torch.Tensor:
    x = cfg.experimental
    if is_moe(model):
        lp, tap = moe_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T, mb.routes_B_T_L_K,
                               replay=x.router_replay, temperature=x.temperature,
                               autocast_bf16=x.autocast_bf16)
        if taps is not None:
            taps.append(tap)
        return lp
    return token_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T,
                          temperature=x.temperature, autocast_bf16=x.autocast_bf16)


@dataclass
class _Acc:
    """Running token-weighted sums of the loss metrics."""

    loss: float = 0.0
    kl: float = 0.0
    ratio: float = 0.0
    ratio_max: float = 0.0
    clip: float = 0.0
    tokens: int = 0
    mtp_kl: float = 0.0
    mtp_accept: float = 0.0
    mtp_positions: int = 0
    engine_kl: float = 0.0
    mismatch: float = 0.0
    aux: float = 0.0
    aux_n: int = 0
    decisions: int = 0
    disagree_L: list[int] = field(default_factory=list)
    """Per MoE layer (reduced over ranks apart: ``_all_reduce``)."""

    def add_engine(self, start_lp: torch.Tensor, mb: MicroBatch, tap: RouterTap | None) -> None:
        """Train-inference agreement of one micro-batch: ``start_lp`` is the step's starting
        policy's logprobs (before any update)."""
        with torch.no_grad():
            d = (mb.old_logprobs_B_T - start_lp.detach()) * mb.loss_mask_B_T
            self.engine_kl += float(d.sum())
            self.mismatch += float(((d.abs() > ENGINE_MISMATCH_TOL) * mb.loss_mask_B_T).sum())
        if tap is None:
            return
        if tap.aux is not None:
            self.aux += float(tap.aux.detach())
            self.aux_n += 1
        self.decisions += tap.decisions
        self.disagree_L = [a + b for a, b in itertools.zip_longest(self.disagree_L, tap.disagree_L,
                                                                    fillvalue=0)]

    def add_mtp(self, d: DistillOut) -> None:
        self.mtp_kl += sum(d.kl_K) / max(len(d.kl_K), 1) * d.positions
        self.mtp_accept += sum(d.accept_K) / max(len(d.accept_K), 1) * d.positions
        self.mtp_positions += d.positions


def _micro_batch_terms(model: nn.Module, ref_model: nn.Module | None, mb: MicroBatch,
                       cfg: GRPOConfig, n_seq: int, prox: torch.Tensor | None, acc: _Acc,
                       first_update: bool) -> tuple[LossOutput, DistillOut | None, torch.Tensor | None]:
    """One forward of a micro-batch and the loss terms it gives: the policy gradient
    (``cfg.loss``, normalised by the update's ``n_seq`` sequences), when the model has MTP
    heads the auxiliary ``mtp_distillation`` of the same forward, and for a MoE model its
    load-balancing loss; ``acc`` gets the train-inference agreement (from the step's starting
    policy: this forward in the first update, else ``prox``)."""
    heads = heads_of(model)
    hidden: contextlib.AbstractContextManager[list[torch.Tensor]] = (
        capture_hidden(model) if heads is not None else contextlib.nullcontext([]))
    taps: list[RouterTap] = []
    with hidden as seen:
        lp = _logprobs(model, mb, cfg, taps)
    tap = taps[0] if taps else None
    if first_update or prox is not None:
        acc.add_engine(lp if prox is None else prox, mb, tap)
    ref = None
    if ref_model is not None and cfg.experimental.objective.kl_coef != 0.0:
        with torch.no_grad():
            ref = _logprobs(ref_model, mb, cfg)
    out = get_loss(cfg.loss)(LossInputs(lp, mb.old_logprobs_B_T, mb.loss_mask_B_T,
                                        mb.advantages_B, n_seq, prox, ref, mb.advantages_B_T),
                             cfg.experimental.objective)
    aux = tap.aux if tap is not None else None
    return out, mtp_distillation(model, seen, mb.tokens_B_T, mb.attention_mask_B_T), aux


def train_step(model: nn.Module, ref_model: nn.Module | None, optimizer: torch.optim.Optimizer,
               batch: TrainBatch, cfg: GRPOConfig, *, current_version: int | None = None,
               dist: ddp.DistInfo = ddp.ONE_PROCESS,
               hinted: Sequence[Trajectory] = ()) -> StepMetrics:
    """Train on ``batch`` once: accumulate gradients over micro-batches, clip, step. Under
    torchrun (``dist``) ``batch`` is this rank's share and the metrics are the whole step's.
    ``hinted`` continuations add ``feedback.coef`` x their distillation term to the first
    update (``trainer.distill``; one process only)."""
    t0 = time.perf_counter()
    device = next(model.parameters()).device  # batches are built on the CPU
    batch = dataclasses.replace(batch, micro_batches=tuple(mb.to(device)
                                                           for mb in batch.micro_batches))
    x = cfg.experimental
    minis, seqs = _updates(batch.micro_batches, x.mini_batches, dist, device, batch.silent_rows)
    model.train()
    prox: dict[int, torch.Tensor] = {}
    if len(minis) > 1:  # the step's starting policy, for PPO clipping across updates
        with torch.no_grad():
            prox = {id(mb): _logprobs(model, mb, cfg) for mini in minis for mb in mini}
    acc, norms, updates, skipped = _Acc(), [], 0, 0
    pairs = [p for t in hinted if (p := hint_pair(t)) is not None]
    assert not (pairs and dist.enabled), "hint distillation runs in one trainer process"
    if pairs and x.feedback.coef > 0 and not minis:  # all groups skipped: the hints still teach
        minis, seqs = [[]], [0]
    hint_kl = 0.0
    graded = [t for t in hinted if t.reward is not None]  # a real user's continuation has no test
    aux_coef = aux_loss_coef(model)
    for j, (mini, n_seq) in enumerate(zip(minis, seqs, strict=True)):
        optimizer.zero_grad(set_to_none=True)
        for i, mb in enumerate(mini):
            with _no_sync(model, i == len(mini) - 1):
                out, mtp, aux = _micro_batch_terms(model, ref_model, mb, cfg, n_seq,
                                                   prox.get(id(mb)), acc, j == 0)
                # DDP and FSDP average gradients over ranks; the loss is normalised by the
                # whole step's sequences, so the ranks' sum is one process's gradient
                loss = out.loss * dist.world_size
                if mtp is not None:  # the auxiliary term: the update's mean over micro-batches
                    loss = loss + mtp.loss / len(mini)
                    acc.add_mtp(mtp)
                if aux is not None and aux_coef:  # MoE load balancing, the same mean
                    loss = loss + aux_coef * aux / len(mini)
                loss.backward()
            acc.loss += float(out.loss.detach()) / len(minis)
            acc.kl += out.kl_mean * out.tokens
            acc.ratio += out.is_ratio_mean * out.tokens
            acc.ratio_max = max(acc.ratio_max, out.is_ratio_max)
            acc.clip += out.clip_fraction * out.tokens
            acc.tokens += out.tokens
        if j == 0 and pairs and x.feedback.coef > 0:
            distilled = hint_distillation(model, pairs, temperature=x.temperature)
            (x.feedback.coef * distilled.loss).backward()
            hint_kl = distilled.kl_mean
        norm = clip_grad_norms(model, x.max_grad_norm)  # the policy's norm (heads clipped apart)
        norms.append(norm)
        if math.isfinite(norm):
            optimizer.step()
            updates += 1
        else:
            skipped += 1
        optimizer.zero_grad(set_to_none=True)
    lag = 0.0
    if current_version is not None:
        lag = sum(float(((current_version - mb.policy_version_B_T) * mb.loss_mask_B_T).sum())
                  for mb in batch.micro_batches)
    c = _Counts(batch.num_sequences, len(batch.micro_batches), batch.zero_variance_groups,
                batch.dropped_infra, batch.no_pass_groups, batch.num_model_tokens, lag,
                batch.mean_reward * batch.groups, batch.groups, batch.silent_rows)
    if dist.enabled:  # this rank's share -> the whole step
        acc, c = _all_reduce(acc, c, dist)
    n = max(acc.tokens, 1)
    return StepMetrics(
        loss=acc.loss, kl_mean=acc.kl / n, is_ratio_mean=acc.ratio / n, is_ratio_max=acc.ratio_max,
        clip_fraction=acc.clip / n, grad_norm=max(norms) if norms else 0.0, tokens=acc.tokens,
        sequences=c.sequences, micro_batches=c.micro_batches, updates=updates,
        skipped_updates=skipped, wall_s=time.perf_counter() - t0,
        zero_variance_groups=c.zero_variance_groups, dropped_infra=c.dropped_infra,
        no_pass_groups=c.no_pass_groups,
        mean_reward=c.reward_sum / c.groups if c.groups else 0.0,
        mean_staleness=c.lag / c.model_tokens if current_version is not None and c.model_tokens
        else 0.0,
        mtp_kl=acc.mtp_kl / max(acc.mtp_positions, 1), mtp_accept=acc.mtp_accept / max(acc.mtp_positions, 1),
        silent_rows=c.silent_rows, engine_kl=acc.engine_kl / max(c.model_tokens, 1),
        engine_mismatch_frac=acc.mismatch / max(c.model_tokens, 1),
        router_disagree=sum(acc.disagree_L) / max(acc.decisions * len(acc.disagree_L), 1),
        router_disagree_L=tuple(d / max(acc.decisions, 1) for d in acc.disagree_L),
        moe_aux_loss=acc.aux / max(acc.aux_n, 1), hints=len(pairs), hint_kl=hint_kl,
        hint_pass_rate=sum(t.passed for t in graded) / len(graded) if graded else 0.0)


@dataclass(frozen=True)
class _Counts:
    """A batch's counters that a distributed step sums over ranks."""

    sequences: int
    micro_batches: int
    zero_variance_groups: int
    dropped_infra: int
    no_pass_groups: int
    model_tokens: int
    lag: float
    """Summed (current version - sampling version) over model tokens."""
    reward_sum: float
    """Mean reward x groups: the step's mean reward is the ranks' means weighted by groups."""
    groups: int
    silent_rows: int


def _all_reduce(acc: _Acc, c: _Counts, dist: ddp.DistInfo) -> tuple[_Acc, _Counts]:
    """The step's sums over ranks (the loss of each rank is already normalised by the whole
    step's sequences, so the losses add up)."""
    fields = [f.name for f in dataclasses.fields(_Acc) if f.name not in ("ratio_max", "disagree_L")]
    summed = ddp.all_reduce([getattr(acc, f) for f in fields] + list(dataclasses.astuple(c)), dist)
    ratio_max = ddp.all_reduce([acc.ratio_max], dist, op="max")[0]
    disagree_L = [int(v) for v in ddp.all_reduce(list(acc.disagree_L), dist)] if acc.disagree_L else []
    out = _Acc(**{f: type(getattr(acc, f))(v) for f, v in zip(fields, summed, strict=False)},
               ratio_max=ratio_max, disagree_L=disagree_L)
    counts = [type(v)(s) for v, s in zip(dataclasses.astuple(c), summed[len(fields):], strict=True)]
    return out, _Counts(*counts)


def _updates(mbs: Sequence[MicroBatch], n: int, dist: ddp.DistInfo, device: torch.device,
             silent: int = 0) -> tuple[list[list[MicroBatch]], list[int]]:
    """The step's ``n`` optimizer updates (consecutive slices of ``mbs``) and the sequences each
    normalises by; ``silent`` rows left out of ``mbs`` (``build_batch``'s ``drop_silent``, which
    ``GRPOStep`` uses with one update only) count in the first. Under torchrun every rank makes
    as many updates, each slice padded with empty micro-batches (loss mask 0) to the longest
    rank's (forwards and backwards are collectives), and the count is the whole update's over
    ranks."""
    if not dist.enabled:
        minis = _split(mbs, n)
        return minis, [sum(mb.num_rows for mb in m) + silent * (j == 0)
                       for j, m in enumerate(minis)]
    n = int(min(n, ddp.all_reduce([len(mbs)], dist, op="max")[0]))
    if n == 0:
        return [], []
    minis = [list(mbs[len(mbs) * j // n:len(mbs) * (j + 1) // n]) for j in range(n)]
    longest = ddp.all_reduce([len(m) for m in minis], dist, op="max")
    seqs = ddp.all_reduce([sum(mb.num_rows for mb in m) + silent * (j == 0)
                           for j, m in enumerate(minis)], dist)
    pad = _empty_micro_batch(device)
    return [m + [pad] * (int(k) - len(m)) for m, k in zip(minis, longest, strict=True)], \
        [int(s) for s in seqs]


def _empty_micro_batch(device: torch.device) -> MicroBatch:
    """One row of two tokens that trains nothing (loss mask 0): a forward and backward that
    keeps a rank with fewer micro-batches in step with the others' collectives."""
    ones = torch.ones(1, 2, dtype=torch.long, device=device)
    zeros = torch.zeros(1, 2, device=device)
    return MicroBatch(ones * 0, ones, zeros, zeros, ones * -1, torch.zeros(1, device=device), zeros)


class GRPOStep:
    """The step with its state: model, optional frozen reference, optimizer, config.

    ``on_groups(groups)`` packs and trains; the async loop calls it with each batch of groups.
    Under torchrun (``dist``) the model is wrapped as ``cfg.experimental.parallel`` says (``self.sharding``:
    full weights and checkpoints) and ``on_groups`` takes this rank's groups; an ``optimizer``
    passed in must be over the wrapped model (``ddp.wrap`` it first).
    """

    def __init__(self, model: nn.Module, cfg: GRPOConfig, *, ref_model: nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, pad_id: int = 0,
                 dist: ddp.DistInfo | None = None) -> None:
        if cfg.experimental.activation_checkpointing:
            ddp.checkpoint_activations(model)
        self.sharding = ddp.Sharding(model, dist, cfg.experimental.parallel)
        if cfg.experimental.feedback.coef > 0 and self.sharding.dist.enabled:
            raise ConfigError("grpo.experimental.feedback.coef > 0 runs in one trainer process; "
                              "run without torchrun or set -o grpo.experimental.feedback.coef=0")
        self.model, self.cfg, self.ref_model, self.pad_id = self.sharding.model, cfg, ref_model, pad_id
        self.optimizer = optimizer or make_optimizer(self.model, cfg)
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        self.tokenizer = model_fingerprint(model)
        """The fingerprint of the tokenizer the model was loaded with (None: built in code)."""
        self.vocab_size: int | None = getattr(getattr(model, "config", None), "vocab_size", None)

    def batch(self, groups: Sequence[Group]) -> TrainBatch:
        # a row with advantage 0 everywhere trains nothing unless a KL term or MTP heads read it
        x = self.cfg.experimental
        silent_ok = (x.mini_batches == 1 and x.objective.kl_coef == 0.0
                     and heads_of(self.model) is None)
        return build_batch(groups, x.credit, std_norm=self.cfg.std_norm,
                           micro_batch_tokens=x.micro_batch_tokens, pad_id=self.pad_id,
                           share_prefix=shares_prefixes(self.model), drop_silent=silent_ok)

    def on_batch(self, batch: TrainBatch, *, current_version: int | None = None,
                 hinted: Sequence[Trajectory] = ()) -> StepMetrics:
        return train_step(self.model, self.ref_model, self.optimizer, batch, self.cfg,
                          current_version=current_version, dist=self.sharding.dist, hinted=hinted)

    def on_groups(self, groups: Sequence[Group], *, current_version: int | None = None) -> StepMetrics:
        """Train on ``groups``; ids another tokenizer made are refused (``ConfigError``)."""
        check_trajectories([t for g in groups for t in g.trajectories], self.tokenizer,
                           vocab_size=self.vocab_size, source="GRPO step")
        hinted = [t for g in groups for t in g.hinted]
        return self.on_batch(self.batch(groups), current_version=current_version, hinted=hinted)
