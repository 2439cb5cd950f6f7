import functools

import pytest
import torch

from looprl.config import FieldError
from looprl.errors import ConfigError
from looprl.trainer.config import SFTConfig, SFTExperimental
from looprl.trainer.sft import sft
from looprl.trainer.step import token_logprobs
from looprl.types import Segment, StopReason

from .helpers import tiny_llama, trajectory

QUIET = functools.partial(SFTExperimental, progress=False)

# prompt, model tokens, tool output (masked), model tokens again: one harness segment
TOKENS = [1, 2, 3, 10, 11, 12, 40, 41, 42, 43, 20, 21]
MASK = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]


def seg(shift: int = 0) -> Segment:
    ids = tuple(t + shift if m else t for t, m in zip(TOKENS, MASK, strict=True))
    return Segment(ids, (0.0,) * len(ids), tuple(MASK), tuple(0 if m else -1 for m in MASK))


def test_first_loss_is_the_nll_of_model_tokens_only():
    model = tiny_llama()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids))[0]
    want = -float(sum(lp[i] for i, m in enumerate(MASK) if m)) / sum(MASK)
    res = sft(model, [trajectory([seg()], None)], SFTConfig(lr=1e-3, experimental=QUIET(max_steps=1)))
    assert res.losses[0] == pytest.approx(want, rel=1e-5)
    assert res.tokens == sum(MASK)


def test_sft_learns_the_model_tokens_and_counts_steps():
    model = tiny_llama()
    trajs = [trajectory([seg(s)], None) for s in (0, 1, 2, 3, 4)]
    trajs.append(trajectory([seg()], None, stop=StopReason.INFRA_ERROR))
    res = sft(model, trajs, SFTConfig(lr=1e-2, epochs=4, experimental=QUIET(batch_sequences=2)))
    assert res.steps == 4 * 3 and res.skipped_trajectories == 1
    assert res.losses[-1] < 0.6 * res.losses[0]
    capped = sft(tiny_llama(), trajs, SFTConfig(experimental=QUIET(max_steps=5, batch_sequences=2)))
    assert capped.steps == 5 and len(capped.losses) == 5


def test_no_trainable_data_is_a_clear_error():
    with pytest.raises(ConfigError, match="no trainable segments"):
        sft(tiny_llama(), [trajectory([seg()], None, stop=StopReason.INFRA_ERROR)])


class _RecordingAdamW(torch.optim.AdamW):
    """AdamW that remembers the learning rate of every step it takes."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.lrs: list[float] = []

    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        self.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_the_schedule_sets_every_steps_learning_rate(schedule: str):
    model = tiny_llama()
    opt = _RecordingAdamW(model.parameters(), lr=1e-2)
    trajs = [trajectory([seg(s)], None) for s in range(4)]
    sft(model, trajs, SFTConfig(lr=1e-2, experimental=QUIET(
        max_steps=40, batch_sequences=2, schedule=schedule)), optimizer=opt)
    assert len(opt.lrs) == 40
    if schedule == "constant":
        assert opt.lrs == [1e-2] * 40
    else:  # 2 warmup steps (5% of 40) up to the peak, then a cosine decay to near 0
        assert opt.lrs[:3] == pytest.approx([5e-3, 1e-2, 1e-2])
        assert opt.lrs == sorted(opt.lrs[:2]) + sorted(opt.lrs[2:], reverse=True)
        assert opt.lrs[-1] < 2e-5 and opt.lrs[21] == pytest.approx(5e-3, rel=0.05)


def test_an_unknown_schedule_is_a_clear_error():
    with pytest.raises(FieldError, match="schedule must be one of constant, cosine"):
        SFTExperimental(schedule="linear")
