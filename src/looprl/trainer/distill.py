"""Self-distillation from hinted continuations (issue 54): the policy with a hint in context is
the teacher, the same policy without it the student, on the continuation's model tokens.

    pair = hint_pair(teacher_trajectory)          # None: not a usable hinted continuation
    out = hint_distillation(model, [pair], temperature=1.0)
    (coef * out.loss).backward()                  # added to the GRPO loss (``train_step``)

A hinted continuation (``harness.hinted``) holds the teacher's tokens: the prefix, the hinted
observation (``Trajectory.hint``: tokens ``start:end``), then the continuation, whose tokens are
the only model tokens. The student's row is the same tokens with the unhinted observation
(``HintSpan.student_ids_T``) in place of the hinted one; the continuation's tokens sit
``len(student_ids) - (end - start)`` positions later there.

**The term: the token-level forward KL over the vocabulary, KL(teacher || student), at every
continuation token's position**, ``sum_v p_T(v) (log p_T(v) - log p_S(v))`` with the teacher
detached, averaged over the step's continuation tokens. Why this one and not the reverse KL on
the sampled tokens with importance weights: the continuation was sampled by the engine *with*
the hint, so its positions are the teacher's states, not the student's samples. A sampled-token
estimate of either KL there needs the ratio ``p_S / p_T`` (or its inverse) of the token the
teacher drew, which is unbounded exactly where the hint changed the policy most (the teacher's
likely token is unlikely without the hint), the case the term exists for; it would need the
truncation TIS uses, and be biased by it. The full-vocabulary KL at the same positions is exact
(no sampling variance, no weights), its gradient with respect to the student's logits is
``p_S - p_T`` (bounded: the cross-entropy toward the teacher's soft targets), and the teacher
is the trainer's current policy with the hint (``T`` forward, no gradient), so engine staleness
does not enter it. The cost: one more forward without gradient per continuation, and the
``[T, V]`` logits of the continuation (the span only, not the prefix) for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from looprl.config import Range
from looprl.types import Trajectory


@dataclass(frozen=True)
class FeedbackDistill:
    """Targeted textual feedback (``grpo.experimental.feedback``, issue 54): a research switch,
    off by default. On, each group's first failed trajectories get a hint at their first wrong
    turn (``rewards.hints``), the policy continues from there with it (``harness.hinted``), and
    the step adds ``coef`` x this module's term to the GRPO loss."""

    coef: Annotated[float, Range(0.0, 100.0)] = 0.0
    """Weight of the distillation term; 0 = off (no hinted continuation is run)."""
    max_per_group: Annotated[int, Range(0, 4096)] = 1
    """Hinted continuations per group, at most (each costs a rollout from the hinted turn and
    a grading)."""

    @property
    def hints_per_group(self) -> int:
        """What the rollouts run: 0 when the term is off."""
        return self.max_per_group if self.coef > 0 else 0


@dataclass(frozen=True)
class HintPair:
    """The teacher's and the student's rows of one hinted continuation (``[T]`` long tensors)
    and where the continuation's model tokens are in each (the same count, in order)."""

    teacher_ids_T: torch.Tensor
    student_ids_T: torch.Tensor
    teacher_pos_N: torch.Tensor
    """Indices of the continuation's model tokens in the teacher's row."""
    student_pos_N: torch.Tensor


@dataclass(frozen=True)
class DistillOutput:
    loss: torch.Tensor
    """Mean over continuation tokens of KL(teacher || student) (the student carries the grad)."""
    kl_mean: float
    tokens: int


def hint_pair(traj: Trajectory) -> HintPair | None:
    """The rows of a hinted continuation; None for an ordinary trajectory, an infra error, or a
    continuation that sampled nothing. Hint tokens are context in both rows: only the
    continuation's model tokens (loss mask 1, all after the hint) are distilled."""
    h = traj.hint
    if h is None or traj.is_infra_error or len(traj.segments) != 1:
        return None
    seg = traj.segments[0]
    if len(seg.token_ids_T) < h.end:
        return None
    ids = list(seg.token_ids_T)
    pos = [i for i, m in enumerate(seg.loss_mask_T) if m]
    assert all(p >= h.end for p in pos), (
        f"hinted continuation {traj.id}: a model token inside or before its hint span")
    if not pos:
        return None
    shift = len(h.student_ids_T) - (h.end - h.start)
    student = ids[:h.start] + list(h.student_ids_T) + ids[h.end:]
    return HintPair(torch.tensor(ids), torch.tensor(student), torch.tensor(pos),
                    torch.tensor(pos) + shift)


def forward_kl(teacher_logits_N_V: torch.Tensor, student_logits_N_V: torch.Tensor) -> torch.Tensor:
    """Per position ``KL(softmax(teacher) || softmax(student))``, the teacher detached.

    >>> t = torch.tensor([[0.0, 0.0]]); s = torch.tensor([[0.0, 0.0]]); float(forward_kl(t, s)[0])
    0.0
    """
    log_t = F.log_softmax(teacher_logits_N_V.detach().float(), -1)
    log_s = F.log_softmax(student_logits_N_V.float(), -1)
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def _span_logits(model: nn.Module, ids_T: torch.Tensor, pos_N: torch.Tensor,
                 temperature: float) -> torch.Tensor:
    """The logits that predict the tokens at ``pos_N`` (from the positions before them)."""
    logits = model(input_ids=ids_T[None], use_cache=False).logits[0]
    out = logits[pos_N - 1]
    return out if temperature == 1.0 else out.float() / temperature


def hint_distillation(model: nn.Module, pairs: Sequence[HintPair], *,
                      temperature: float = 1.0) -> DistillOutput:
    """The distillation term over ``pairs`` (see the module docstring): one teacher forward
    without gradient and one student forward with it per pair."""
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    n = 0
    for p in pairs:
        with torch.no_grad():
            t_logits = _span_logits(model, p.teacher_ids_T.to(device), p.teacher_pos_N.to(device),
                                    temperature)
        s_logits = _span_logits(model, p.student_ids_T.to(device), p.student_pos_N.to(device),
                                temperature)
        total = total + forward_kl(t_logits, s_logits).sum()
        n += len(p.teacher_pos_N)
    loss = total / max(n, 1)
    return DistillOutput(loss, float(loss.detach()), n)
