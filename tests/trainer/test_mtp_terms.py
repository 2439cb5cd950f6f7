"""The MTP heads' self-distillation term in the GRPO step and in SFT: the heads follow the policy
from the trainer's own forward, and the policy's update is the same with or without heads."""

from __future__ import annotations

import copy

import torch

from looprl.models.mtp import attach_heads, capture_hidden, distill_loss, heads_of, new_heads
from looprl.trainer.batch import MIN_SHARED_PREFIX, Credit, build_batch
from looprl.trainer.config import GRPOConfig, GRPOExperimental, SFTConfig, SFTExperimental
from looprl.trainer.losses import LossParams
from looprl.trainer.sft import sft
from looprl.trainer.step import make_optimizer, train_step
from looprl.types import Segment

from .helpers import VOCAB, group, tiny_llama, trajectory


def rollout(prompt: list[int], completion: list[int]) -> Segment:
    n, m = len(prompt), len(completion)
    return Segment(tuple(prompt + completion), (0.0,) * n + (-2.0,) * m, (0,) * n + (1,) * m,
                   (-1,) * n + (0,) * m)


def groups(shared_prompt: bool, repeat: bool = False) -> list:
    """Two groups; with ``shared_prompt`` each group's rollouts share a prompt long enough for
    ``token_logprobs`` to run it once (two forwards per micro-batch); with ``repeat`` a group's
    first two rollouts are the same tokens (the forward runs them once)."""
    g = torch.Generator().manual_seed(0)

    def toks(n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=g).tolist()

    out = []
    for gid in ("a", "b"):
        p = toks(MIN_SHARED_PREFIX + 6 if shared_prompt else 8)
        rows = [rollout(p if shared_prompt else toks(8), toks(12)) for _ in range(3)]
        if repeat:
            rows[1] = rows[0]
        out.append(group([trajectory([row], r, gid) for row, r in zip(rows, (1.0, 0.0, 0.5), strict=True)],
                         gid))
    return out


def heads_kl(model, batch) -> float:
    mb = batch.micro_batches[0]
    with torch.no_grad(), capture_hidden(model) as seen:
        model(input_ids=mb.tokens_B_T, attention_mask=mb.attention_mask_B_T)
    d = distill_loss(heads_of(model), model, seen[0], mb.tokens_B_T, mb.attention_mask_B_T)
    return sum(d.kl_K)


def fresh_heads_kl(model, batch) -> float:
    """The same measure for untrained heads on the model as it is now."""
    other = copy.deepcopy(model)
    torch.manual_seed(1)
    attach_heads(other, new_heads(other, heads_of(model).num_heads))
    return heads_kl(other, batch)


def policy_params(model) -> torch.Tensor:
    heads = heads_of(model)
    own = {id(p) for p in heads.parameters()} if heads is not None else set()
    return torch.cat([p.detach().flatten() for p in model.parameters() if id(p) not in own])


def test_grpo_step_distills_heads_and_leaves_the_policy_update_unchanged():
    for shared, repeat in ((False, False), (True, False), (True, True)):
        plain = tiny_llama()
        with_heads = copy.deepcopy(plain)
        attach_heads(with_heads, new_heads(with_heads, 2))
        cfg = GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
            mtp_lr=1e-2, objective=LossParams(norm_tokens=12)))
        batch = build_batch(groups(shared, repeat), cfg.experimental.credit,
                            micro_batch_tokens=cfg.experimental.micro_batch_tokens)
        opt_plain, opt_heads = make_optimizer(plain, cfg), make_optimizer(with_heads, cfg)
        assert [g["lr"] for g in opt_heads.param_groups] == [1e-3, 1e-2]
        metrics = []
        for _ in range(8):
            a = train_step(plain, None, opt_plain, batch, cfg)
            b = train_step(with_heads, None, opt_heads, batch, cfg)
            assert a.grad_norm == b.grad_norm  # the policy's norm, heads clipped apart
            metrics.append(b)
        assert torch.equal(policy_params(plain), policy_params(with_heads)), shared
        assert heads_kl(with_heads, batch) < 0.5 * fresh_heads_kl(with_heads, batch), shared
        assert metrics[-1].mtp_kl < metrics[0].mtp_kl and metrics[-1].mtp_accept > metrics[0].mtp_accept
        assert a.mtp_kl == 0.0 and a.mtp_accept == 0.0  # no heads, no term


def test_sft_distills_heads_and_leaves_the_policy_update_unchanged():
    trajs = [t for g in groups(False) for t in g.trajectories]
    plain = tiny_llama()
    with_heads = copy.deepcopy(plain)
    attach_heads(with_heads, new_heads(with_heads, 2))
    batch = build_batch(groups(False), Credit(), micro_batch_tokens=4096)
    cfg = SFTConfig(lr=1e-2, experimental=SFTExperimental(max_steps=10, batch_sequences=3,
                                                          progress=False))
    a, b = sft(plain, trajs, cfg), sft(with_heads, trajs, cfg)
    assert a.losses == b.losses  # the reported NLL is the policy's alone
    assert torch.equal(policy_params(plain), policy_params(with_heads))
    # the policy moved a lot (lr 1e-2); the heads moved with it
    assert heads_kl(with_heads, batch) < 0.5 * fresh_heads_kl(with_heads, batch)
