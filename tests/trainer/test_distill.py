"""The hint self-distillation term (``looprl.trainer.distill``): its value and gradient on a
hand-computed case, and hint tokens never distilled as model tokens."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from looprl.trainer.config import FeedbackDistill, GRPOConfig, GRPOExperimental
from looprl.trainer.distill import forward_kl, hint_distillation, hint_pair
from looprl.trainer.step import GRPOStep
from looprl.types import Counters, Group, HintSpan, Segment, StopReason, Trajectory

from .helpers import group, segment, tiny_llama, trajectory

HINT_TOK = 9


class HintBigram(nn.Module):
    """Logits over 2 tokens = W[previous token] + b once the hint token has been seen."""

    def __init__(self) -> None:
        super().__init__()
        self.W = nn.Embedding(10, 2)
        nn.init.zeros_(self.W.weight)
        self.b = nn.Parameter(torch.tensor([math.log(3.0), 0.0]))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        seen = (torch.cumsum(input_ids == HINT_TOK, -1) > 0).float()[..., None]
        return SimpleNamespace(logits=self.W(input_ids) + seen * self.b)


def _teacher(mask=(0, 0, 0, 1, 1)) -> Trajectory:
    # prefix [5]; hinted observation [9, 5] (tokens 1:3); the unhinted one is [5]; continuation [1, 0]
    seg = Segment((5, HINT_TOK, 5, 1, 0), (0.0,) * 5, mask, (-1, -1, -1, 0, 0))
    return Trajectory("t", "g", (seg,), (), Counters(), StopReason.FINISHED, id="g/0+hint",
                      hint=HintSpan(1, "hint", 1, 3, (5,), "failing_test"))


def test_the_rows_swap_the_hinted_observation_for_the_unhinted_one() -> None:
    p = hint_pair(_teacher())
    assert p is not None
    assert p.teacher_ids_T.tolist() == [5, 9, 5, 1, 0] and p.student_ids_T.tolist() == [5, 5, 1, 0]
    assert p.teacher_pos_N.tolist() == [3, 4] and p.student_pos_N.tolist() == [2, 3]
    assert p.teacher_ids_T[p.teacher_pos_N].tolist() == p.student_ids_T[p.student_pos_N].tolist()


def test_hint_tokens_are_never_distilled_as_model_tokens() -> None:
    with pytest.raises(AssertionError, match="inside or before its hint span"):
        hint_pair(_teacher(mask=(0, 1, 0, 1, 1)))  # a hint token marked as sampled
    assert hint_pair(_teacher(mask=(0, 0, 0, 0, 0))) is None  # nothing sampled after the hint
    ordinary = Trajectory("t", "g", _teacher().segments, (), Counters(), StopReason.FINISHED)
    assert hint_pair(ordinary) is None


def test_value_and_gradient_match_the_hand_computation() -> None:
    # teacher p = softmax([ln 3, 0]) = [3/4, 1/4]; student q = softmax([0, 0]) = [1/2, 1/2]
    # KL(p || q) = 3/4 ln(3/2) + 1/4 ln(1/2) per token; d/d(student logits) = q - p = [-1/4, 1/4]
    model = HintBigram()
    out = hint_distillation(model, [hint_pair(_teacher())])
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert out.tokens == 2 and out.loss.item() == pytest.approx(kl, abs=1e-6)
    assert out.kl_mean == pytest.approx(0.130812, abs=1e-6)
    out.loss.backward()
    g = model.W.weight.grad
    # the mean over 2 tokens, predicted from the student's tokens 5 (position 1) and 1 (position 2)
    assert g[5].tolist() == pytest.approx([-0.125, 0.125]) and g[1].tolist() == pytest.approx(
        [-0.125, 0.125])
    assert g[[0, 2, 3, 4, 6, 7, 8, 9]].abs().sum() == 0
    assert model.b.grad is None or not model.b.grad.any()  # the teacher is detached


def test_forward_kl_is_zero_only_when_the_distributions_agree() -> None:
    t = torch.tensor([[1.0, -1.0, 0.5]])
    assert forward_kl(t, t.clone()).item() == pytest.approx(0.0, abs=1e-7)
    assert forward_kl(t, torch.zeros(1, 3)).item() > 0.01


def _hinted_group(grpo_trains: bool) -> Group:
    """A group whose rewards differ (GRPO trains it) or are equal (GRPO has nothing to train),
    with one hinted continuation: prefix [1, 2, 3, 6], hinted observation [30, 31, 32] (the
    unhinted one: [33]), continuation [4, 5]."""
    rewards = (1.0, 0.0) if grpo_trains else (0.0, 0.0)
    trajs = [trajectory([segment([1, 2, 3], [4, 5])], rewards[0]),
             trajectory([segment([1, 2, 3], [6, 7])], rewards[1])]
    seg = Segment((1, 2, 3, 6, 30, 31, 32, 4, 5), (0.0,) * 9, (0,) * 7 + (1, 1), (-1,) * 7 + (0, 0))
    hinted = Trajectory("t", "g", (seg,), (), Counters(), StopReason.FINISHED, id="g/1+hint",
                        hint=HintSpan(1, "hint", 4, 7, (33,), "failing_test"))
    return dataclasses.replace(group(trajs), hinted=(hinted,))


@pytest.mark.parametrize("grpo_trains", [True, False])
def test_the_step_adds_the_term_with_its_weight_and_logs_it(grpo_trains: bool) -> None:
    def run(coef: float) -> tuple[torch.Tensor, object]:
        model = tiny_llama()
        cfg = GRPOConfig(lr=1e-2, experimental=GRPOExperimental(feedback=FeedbackDistill(coef=coef)))
        m = GRPOStep(model, cfg).on_groups([_hinted_group(grpo_trains)])
        return torch.cat([p.detach().flatten() for p in model.parameters()]), m

    off, m_off = run(0.0)
    on, m_on = run(1.0)
    assert m_on.hints == 1 and m_on.hint_kl > 0 and m_on.updates == 1
    assert m_on.hint_pass_rate == 0.0 and m_off.hint_kl == 0.0
    assert not torch.allclose(on, off)  # the term moved the weights beyond what GRPO did
    start = torch.cat([p.detach().flatten() for p in tiny_llama().parameters()])
    assert torch.equal(off, start) != grpo_trains  # an all-equal group: GRPO alone moves nothing
