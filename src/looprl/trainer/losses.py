"""Policy-gradient losses: named functions in a dict, picked by ``GRPOConfig.loss``, and the
auxiliary term the step adds to them (``mtp_distillation``).

    out = LOSSES["dr_grpo"](LossInputs(...), LossParams(...))
    out.loss.backward()

Notation, per token t of row b (one row = one segment; only ``loss_mask_B_T == 1`` tokens count):

- ``lp``   = log pi_theta(x_t)       the trainer's current policy (carries the gradient)
- ``prox`` = log pi_prox(x_t)        the trainer's policy at the start of this optimizer step
  (detached; equal to ``lp`` unless a step is split into several mini-batch updates)
- ``old``  = log pi_engine(x_t)      what the sampling engine reported (``Segment.logprobs_T``);
  it differs from ``prox`` by numerics (bf16 engine, other kernels) and by staleness (async
  rollouts sampled by an older policy version)
- ``ref``  = log pi_ref(x_t)         a frozen reference policy, only when ``kl_coef > 0``

Pieces:

- **KL to the reference, folded into the reward.** With ``r = pi_ref / pi_theta`` at the sampled
  token, ``k1 = -log r = lp - ref`` (unbiased for KL(pi_theta || pi_ref), can be negative per token)
  and ``k3 = r - 1 - log r`` (>= 0, lower variance, biased as a reward). A sequence's KL is the sum
  of its tokens' estimates; its advantage becomes ``A - kl_coef * KL_seq`` (detached), so the KL
  acts through the policy gradient exactly like a reward term.
- **Truncated importance sampling (TIS).** ``w = min(pi_prox / pi_engine, tis_cap)``, detached,
  multiplies every token's term: it corrects the engine/trainer mismatch without letting one token
  with a tiny engine probability dominate the step.
- **PPO clipping** (``clip=True``): ``rho = pi_theta / pi_prox``; the surrogate is
  ``min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``. With one optimizer step per batch
  ``rho == 1`` and nothing is clipped; it acts when a batch is split into mini-batch updates.
- **Aggregation.** ``dr_grpo`` sums token terms and divides by a constant
  (``num_sequences * norm_tokens``), so no per-sequence length division: a response twice as long
  contributes twice as much, and short wrong answers are not favoured. ``grpo`` averages tokens
  within each sequence, then sequences (the original GRPO length bias). ``num_sequences`` is the
  count in the whole optimizer step, so micro-batches sum to the same loss as one big batch.
- ``cispo``: the IS weight ``pi_theta / pi_engine`` is clipped at ``tis_cap`` and detached, and every
  token keeps its gradient (no PPO zeroing), aggregated like ``dr_grpo``.

Self-summarization chains: every segment of a chain is a row whose advantage is the chain's
(``batch.py`` does that), so all of them are credited with the final reward.

Auxiliary term: a model with MTP heads (the engine's speculative drafters) adds
``mtp_distillation`` of the same forward to each micro-batch's loss, averaged over the update's
micro-batches; it trains the heads alone (their own param group, ``make_optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from looprl.errors import ConfigError
from looprl.models.mtp import DistillOut, distill_spans, heads_of
from looprl.trainer.batch import distinct_rows
from looprl.trainer.config import KL_ESTIMATOR_NAMES, LOSS_NAMES, LossParams


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch of rows. All ``_B_T`` tensors are float and aligned with the tokens."""

    logprobs_B_T: torch.Tensor
    old_logprobs_B_T: torch.Tensor
    loss_mask_B_T: torch.Tensor
    advantages_B: torch.Tensor
    num_sequences: int
    """Rows in the whole optimizer step (the same normalizer for every micro-batch)."""
    prox_logprobs_B_T: torch.Tensor | None = None
    """None: the current policy (detached) is the step's starting policy."""
    ref_logprobs_B_T: torch.Tensor | None = None
    advantages_B_T: torch.Tensor | None = None
    """Per-token advantages where token-level credit makes them differ from the row's
    (``batch.Credit``); None = every token gets ``advantages_B``."""


@dataclass(frozen=True)
class LossOutput:
    """A loss and its metrics (metrics over masked-in tokens of this micro-batch)."""

    loss: torch.Tensor
    kl_mean: float
    is_ratio_mean: float
    is_ratio_max: float
    clip_fraction: float
    tokens: int


LossFn = Callable[[LossInputs, LossParams], LossOutput]


def kl_k1(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """-log r with r = pi_ref / pi_theta."""
    return lp - ref


def kl_k3(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """r - 1 - log r with r = pi_ref / pi_theta."""
    log_r = ref - lp
    return torch.exp(log_r) - 1.0 - log_r


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "k3": kl_k3}
assert tuple(KL_ESTIMATORS) == KL_ESTIMATOR_NAMES, "trainer.config.KL_ESTIMATOR_NAMES is stale"


@dataclass(frozen=True)
class _Terms:
    """Shared per-token pieces every loss builds on (all masked: 0 outside the loss mask)."""

    mask: torch.Tensor
    lp: torch.Tensor
    prox: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    """[B, 1] or [B, T]: each token's advantage, the sequence KL folded in (detached)."""
    kl_B_T: torch.Tensor


def _terms(inp: LossInputs, p: LossParams) -> _Terms:
    m = inp.loss_mask_B_T > 0
    zero = torch.zeros((), dtype=inp.logprobs_B_T.dtype)
    # Masked positions get logprob 0 everywhere, so exp() of differences there is exactly 1.
    lp = torch.where(m, inp.logprobs_B_T, zero)
    prox = lp.detach() if inp.prox_logprobs_B_T is None else torch.where(m, inp.prox_logprobs_B_T, zero)
    old = torch.where(m, inp.old_logprobs_B_T.to(lp.dtype), zero)
    kl = torch.zeros_like(lp)
    if p.kl_coef != 0.0:
        if inp.ref_logprobs_B_T is None:
            raise ConfigError("kl_coef > 0 needs reference logprobs: pass a ref_model to train_step "
                              "or set -o grpo.experimental.objective.kl_coef=0")
        ref = torch.where(m, inp.ref_logprobs_B_T.to(lp.dtype), zero)
        kl = torch.where(m, KL_ESTIMATORS[p.kl_estimator](lp.detach(), ref), zero)
    base = inp.advantages_B[:, None] if inp.advantages_B_T is None else inp.advantages_B_T
    adv = base.to(lp.dtype) - p.kl_coef * kl.sum(-1, keepdim=True)
    return _Terms(m.to(lp.dtype), lp, prox, old, adv.detach(), kl)


def _metrics(t: _Terms, loss: torch.Tensor, clipped: torch.Tensor) -> LossOutput:
    n = t.mask.sum()
    ratio = torch.exp(t.prox - t.old)
    sel = t.mask > 0
    return LossOutput(
        loss=loss,
        kl_mean=float(t.kl_B_T.sum() / n.clamp(min=1)),
        is_ratio_mean=float((ratio * t.mask).sum() / n.clamp(min=1)),
        is_ratio_max=float(ratio[sel].max()) if bool(sel.any()) else 1.0,
        clip_fraction=float((clipped.to(t.mask.dtype) * t.mask).sum() / n.clamp(min=1)),
        tokens=int(n),
    )


def _clipped_token_loss(t: _Terms, p: LossParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-w * surrogate`` and where the clipped branch was taken."""
    w = torch.exp(t.prox - t.old).clamp(max=p.tis_cap).detach()
    rho = torch.exp(t.lp - t.prox)
    s1 = rho * t.adv
    if not p.clip:
        return -w * s1, torch.zeros_like(s1, dtype=torch.bool)
    s2 = rho.clamp(1.0 - p.clip_eps_low, 1.0 + p.clip_eps_high) * t.adv
    return -w * torch.minimum(s1, s2), s2 < s1


def dr_grpo(inp: LossInputs, p: LossParams) -> LossOutput:
    """Token sum over the step divided by ``num_sequences * norm_tokens`` (no length division)."""
    t = _terms(inp, p)
    tok, clipped = _clipped_token_loss(t, p)
    loss = (tok * t.mask).sum() / (inp.num_sequences * p.norm_tokens)
    return _metrics(t, loss, clipped)


def grpo(inp: LossInputs, p: LossParams) -> LossOutput:
    """Mean over each sequence's tokens, then sum over sequences / ``num_sequences``."""
    t = _terms(inp, p)
    tok, clipped = _clipped_token_loss(t, p)
    per_seq_B = (tok * t.mask).sum(-1) / t.mask.sum(-1).clamp(min=1)
    return _metrics(t, per_seq_B.sum() / inp.num_sequences, clipped)


def cispo(inp: LossInputs, p: LossParams) -> LossOutput:
    """``-sg(min(pi_theta / pi_engine, tis_cap)) * A * lp``, summed like ``dr_grpo``."""
    t = _terms(inp, p)
    w = torch.exp(t.lp.detach() - t.old).clamp(max=p.tis_cap)
    tok = -w * t.adv * t.lp
    loss = (tok * t.mask).sum() / (inp.num_sequences * p.norm_tokens)
    return _metrics(t, loss, torch.exp(t.lp.detach() - t.old) > p.tis_cap)


LOSSES: dict[str, LossFn] = {"dr_grpo": dr_grpo, "grpo": grpo, "cispo": cispo}
assert tuple(LOSSES) == LOSS_NAMES, "trainer.config.LOSS_NAMES names what grpo.loss may be"


def mtp_distillation(model: nn.Module, hidden: Sequence[torch.Tensor], tokens_B_T: torch.Tensor,
                     attention_mask_B_T: torch.Tensor) -> DistillOut | None:
    """Auxiliary term: the model's MTP heads (``looprl.models.mtp``) distilled from the forward
    that recorded ``hidden`` (``capture_hidden``) on these rows: KL(policy || head) with the
    policy detached, so the policy's gradient is the same with or without heads while the
    engine's drafts keep up with it. The forward ran each distinct row once
    (``batch.distinct_rows``), and so does the term. None when the model has no heads."""
    heads = heads_of(model)
    if heads is None:
        return None
    keep_U, _ = distinct_rows(tokens_B_T, attention_mask_B_T)
    return distill_spans(heads, model, hidden, tokens_B_T[keep_U], attention_mask_B_T[keep_U])


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)} "
                          f"(e.g. -o grpo.loss=dr_grpo)")
    return LOSSES[name]
