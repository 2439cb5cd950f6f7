import math

import pytest
import torch

from looprl.errors import ConfigError
from looprl.trainer.losses import LOSSES, LossInputs, LossParams, get_loss, kl_k1, kl_k3

MASK = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")

LP = torch.log(torch.tensor([[0.9, 0.5, 0.25], [0.9, 0.5, 0.8]]))


def inputs(lp=LP, old=None, adv=(1.0, -0.5), mask=MASK, n_seq=2, prox=None, ref=None):
    lp = lp.clone().requires_grad_(True)
    return lp, LossInputs(lp, lp.detach().clone() if old is None else old, mask,
                          torch.tensor(adv), n_seq, prox, ref)


def test_dr_grpo_on_policy_value_and_gradient():
    lp, inp = inputs()
    out = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=10))
    # tokens: row0 two tokens with A=1 -> -1 each; row1 one token with A=-0.5 -> +0.5; / (2*10)
    assert float(out.loss) == pytest.approx(-1.5 / 20)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -0.05, -0.05], [0.0, 0.025, 0.0]]))
    assert out.tokens == 3 and out.is_ratio_mean == pytest.approx(1.0) and out.clip_fraction == 0.0


@pytest.mark.parametrize("name", ["dr_grpo", "cispo"])
def test_token_advantages_credit_each_token(name):
    # row 0's second token is a broken call: its own advantage (-1) against the row's (+1)
    lp, inp = inputs()
    adv_T = torch.tensor([[1.0, 1.0, -1.0], [-0.5, -0.5, -0.5]])
    inp = LossInputs(inp.logprobs_B_T, inp.old_logprobs_B_T, MASK, inp.advantages_B, 2,
                             advantages_B_T=adv_T)
    LOSSES[name](inp, LossParams(norm_tokens=10)).loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -0.05, 0.05], [0.0, 0.025, 0.0]]))


def test_grpo_averages_tokens_per_sequence():
    lp, inp = inputs()
    out = LOSSES["grpo"](inp, LossParams())
    assert float(out.loss) == pytest.approx((-1.0 + 0.5) / 2)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -0.25, -0.25], [0.0, 0.25, 0.0]]))


def test_dr_grpo_has_no_length_division_and_grpo_does():
    short_mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]])
    long_mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0]])
    lp = torch.full((1, 5), math.log(0.5))
    loss = {}
    for name in ("dr_grpo", "grpo"):
        for tag, mask in (("short", short_mask), ("long", long_mask)):
            _, inp = inputs(lp=lp, adv=(1.0,), mask=mask, n_seq=1)
            loss[name, tag] = float(LOSSES[name](inp, LossParams(norm_tokens=8)).loss)
    assert loss["dr_grpo", "long"] == pytest.approx(2 * loss["dr_grpo", "short"])
    assert loss["grpo", "long"] == pytest.approx(loss["grpo", "short"])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_masked_tokens_change_nothing(name):
    lp_a, inp_a = inputs(old=LP.clone())
    lp2, old2 = LP.clone(), LP.clone()
    lp2[1, 2], old2[1, 2], lp2[0, 0], old2[0, 0] = -30.0, -1000.0, -5.0, 0.0  # masked positions
    lp_b, inp_b = inputs(lp=lp2, old=old2)
    out_a, out_b = LOSSES[name](inp_a, LossParams()), LOSSES[name](inp_b, LossParams())
    out_a.loss.backward()
    out_b.loss.backward()
    assert float(out_a.loss) == pytest.approx(float(out_b.loss))
    assert torch.allclose(lp_a.grad, lp_b.grad)
    assert float(lp_b.grad[1, 2]) == 0.0 and float(lp_b.grad[0, 0]) == 0.0
    assert out_a.is_ratio_max == pytest.approx(out_b.is_ratio_max)


def test_tis_weight_is_truncated_at_cap():
    # engine gave every token 1/5 of the trainer's probability: ratio 5, capped at 2
    low_old = LP - math.log(5.0)
    _, inp = inputs(old=low_old)
    out = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=10, tis_cap=2.0))
    assert float(out.loss) == pytest.approx(2 * -1.5 / 20)
    assert out.is_ratio_mean == pytest.approx(5.0) and out.is_ratio_max == pytest.approx(5.0)
    # ratio below the cap is used as is
    _, inp = inputs(old=LP + math.log(2.0))
    out = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=10, tis_cap=2.0))
    assert float(out.loss) == pytest.approx(0.5 * -1.5 / 20)


def test_ppo_clip_zeroes_gradient_outside_the_trust_region():
    prox = LP.clone()
    moved = LP + math.log(1.5)  # pi_theta / pi_prox = 1.5 on every token
    lp, inp = inputs(lp=moved, old=prox, prox=prox)
    out = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=10, clip_eps_high=0.28))
    out.loss.backward()
    # A>0 row: clipped at 1.28, no gradient; A<0 row: min() keeps the unclipped 1.5 * A
    assert float(out.loss) == pytest.approx((-1.28 * 2 + 1.5 * 0.5) / 20)
    assert lp.grad[0].abs().sum() == 0.0
    assert float(lp.grad[1, 1]) == pytest.approx(1.5 * 0.5 / 20)
    assert out.clip_fraction == pytest.approx(2 / 3)
    lp, inp = inputs(lp=moved, old=prox, prox=prox)
    noclip = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=10, clip=False))
    assert float(noclip.loss) == pytest.approx(1.5 * -1.5 / 20) and noclip.clip_fraction == 0.0


def test_kl_estimators_by_hand():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert float(kl_k1(lp, ref)) == pytest.approx(math.log(2))
    assert float(kl_k3(lp, ref)) == pytest.approx(0.5 - 1 + math.log(2))


@pytest.mark.parametrize("est,per_token", [("k1", math.log(2)), ("k3", 0.5 - 1 + math.log(2))])
def test_kl_is_folded_into_the_sequence_advantage(est, per_token):
    lp = torch.log(torch.tensor([[0.9, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.1, 0.25, 0.25]]))  # position 0 is masked: its KL is ignored
    _, inp = inputs(lp=lp, adv=(1.0,), mask=torch.tensor([[0.0, 1.0, 1.0]]), n_seq=1, ref=ref)
    out = LOSSES["dr_grpo"](inp, LossParams(norm_tokens=1, kl_coef=0.1, kl_estimator=est))
    adv = 1.0 - 0.1 * 2 * per_token
    assert float(out.loss) == pytest.approx(-2 * adv)
    assert out.kl_mean == pytest.approx(per_token)


def test_kl_without_reference_is_a_clear_error():
    _, inp = inputs()
    with pytest.raises(ConfigError, match="ref_model"):
        LOSSES["dr_grpo"](inp, LossParams(kl_coef=0.1))


def test_cispo_keeps_gradient_on_every_token_with_clipped_weight():
    lp, inp = inputs(old=LP - math.log(5.0))  # IS weight 5, clipped to 2
    out = LOSSES["cispo"](inp, LossParams(norm_tokens=10, tis_cap=2.0))
    lp_vals = LP * MASK
    expected = -(2.0 * torch.tensor([[1.0], [-0.5]]) * lp_vals).sum() / 20
    assert float(out.loss) == pytest.approx(float(expected))
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -0.1, -0.1], [0.0, 0.05, 0.0]]))
    assert out.clip_fraction == pytest.approx(1.0)


def test_unknown_loss_name():
    with pytest.raises(ConfigError, match="dr_grpo"):
        get_loss("ppo2")
