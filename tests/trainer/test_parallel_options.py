"""GRPOConfig's parallel options in one process: activation checkpointing changes memory, not the
step; a bad ``parallel`` is refused at load (torchrun runs: ``test_resume_ddp.py``)."""

import copy
import dataclasses

import pytest
import torch

from looprl.config import FieldError
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.trainer.step import GRPOStep, shares_prefixes

from .helpers import group, segment, tiny_llama, trajectory


def _groups():
    prompt = list(range(3, 20))  # a prefix the rows share: run once without checkpointing
    return [group([trajectory([segment(prompt, [20 + k, 30 + j, 40 + k])], float(k), f"g{j}")
                   for k in range(3)], f"g{j}") for j in range(2)]


def test_activation_checkpointing_gives_the_same_step():
    plain, ckpt = tiny_llama(), tiny_llama()
    cfg = GRPOConfig(lr=1e-2, experimental=GRPOExperimental(objective=LossParams(norm_tokens=4)))
    a = GRPOStep(plain, cfg)
    b = GRPOStep(ckpt, dataclasses.replace(cfg, experimental=dataclasses.replace(
        cfg.experimental, activation_checkpointing=True)))
    assert shares_prefixes(a.model) and not shares_prefixes(b.model)  # no KV cache when recomputing
    before = copy.deepcopy(plain.state_dict())
    ma, mb = a.on_groups(_groups()), b.on_groups(_groups())
    assert mb.loss == pytest.approx(ma.loss, rel=1e-5) and ma.loss != 0.0
    assert mb.grad_norm == pytest.approx(ma.grad_norm, rel=1e-4)
    wa, wb = plain.state_dict(), ckpt.state_dict()
    assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6) for k in wa)
    assert any(not torch.equal(wa[k], before[k]) for k in wa)


def test_an_unknown_parallel_mode_is_refused_at_load():
    with pytest.raises(FieldError, match=r"parallel must be one of ddp, fsdp; got 'fdsp' \(did you mean fsdp\?\)"):
        GRPOExperimental(parallel="fdsp")
