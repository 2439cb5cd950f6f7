import copy

import pytest
import torch

from looprl.trainer.batch import Credit, build_batch
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossInputs, LossParams, dr_grpo
from looprl.trainer.step import GRPOStep, _cache_kw, gather_logprobs, token_logprobs, train_step
from looprl.types import Segment

from .helpers import group, segment, tiny_llama, trajectory

PROMPT = [1, 2, 3, 4]
GOOD, BAD = [5, 6, 7, 8], [9, 10, 11, 12]


def on_policy(model, prompt, completion, version=0) -> Segment:
    """A segment whose engine logprobs are the model's own (as a bit-exact engine would report)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids))[0].tolist()
    n = len(prompt)
    return Segment(tuple(prompt + completion), tuple([0.0] * n + lp[n:]),
                   (0,) * n + (1,) * len(completion), (-1,) * n + (version,) * len(completion))


def completion_logprob(model, completion):
    ids = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        return float(token_logprobs(model, ids, torch.ones_like(ids))[0, len(PROMPT):].sum())


def fixed_groups(model):
    return [group([trajectory([on_policy(model, PROMPT, GOOD)], 1.0),
                   trajectory([on_policy(model, PROMPT, BAD)], 0.0)])]


def test_gather_logprobs_matches_log_softmax():
    logits = torch.randn(2, 5, 11)
    tgt = torch.randint(0, 11, (2, 5))
    want = torch.log_softmax(logits, -1).gather(-1, tgt[..., None]).squeeze(-1)
    assert torch.allclose(gather_logprobs(logits, tgt), want, atol=1e-6)


def test_token_logprobs_divide_logits_by_temperature():
    model = tiny_llama()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1] / 2.0
        want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        got = token_logprobs(model, ids, torch.ones_like(ids), temperature=2.0)
    assert got[0, 0] == 0.0 and torch.allclose(got[:, 1:], want, atol=1e-6)


def test_step_makes_positive_advantage_tokens_likelier_and_lowers_the_surrogate():
    model = tiny_llama()
    groups = fixed_groups(model)
    before_good, before_bad = completion_logprob(model, GOOD), completion_logprob(model, BAD)
    cfg = GRPOConfig(lr=3e-3, experimental=GRPOExperimental(objective=LossParams(norm_tokens=4)))
    batch = build_batch(groups, micro_batch_tokens=cfg.experimental.micro_batch_tokens)
    mb = batch.micro_batches[0]
    surrogate = []
    step = GRPOStep(model, cfg)
    for _ in range(3):
        with torch.no_grad():  # the loss on the fixed batch, against the starting policy
            lp = token_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T)
        surrogate.append(float(dr_grpo(LossInputs(lp, mb.old_logprobs_B_T, mb.loss_mask_B_T,
                                                  mb.advantages_B, 2, mb.old_logprobs_B_T),
                                       LossParams(norm_tokens=4, clip=False)).loss))
        m = step.on_batch(batch)
        assert m.updates == 1 and m.tokens == 8 and m.sequences == 2
    assert surrogate[2] < surrogate[1] < surrogate[0]
    assert completion_logprob(model, GOOD) > before_good + 0.1
    assert completion_logprob(model, BAD) < before_bad - 0.1


def test_micro_batching_gives_the_same_update_as_one_big_batch():
    base = tiny_llama()
    groups = [group([trajectory([on_policy(base, PROMPT, GOOD)], 1.0),
                     trajectory([on_policy(base, PROMPT, BAD + [13, 14])], 0.0),
                     trajectory([on_policy(base, [1, 2], [5, 9])], 0.5)])]
    params = []
    for budget in (1000, 8):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        cfg = GRPOConfig(experimental=GRPOExperimental(micro_batch_tokens=budget,
                                                       max_grad_norm=1e9))
        batch = build_batch(groups, micro_batch_tokens=budget)
        m = train_step(model, None, opt, batch, cfg)
        assert m.micro_batches == (1 if budget == 1000 else 3)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.equal(params[0], torch.cat([p.flatten() for p in base.parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-6)


def test_kl_to_reference_starts_at_zero_and_grows():
    model = tiny_llama()
    ref = copy.deepcopy(model)
    cfg = GRPOConfig(lr=1e-2, experimental=GRPOExperimental(objective=LossParams(kl_coef=0.1)))
    step = GRPOStep(model, cfg, ref_model=ref)
    batch = step.batch(fixed_groups(model))
    first = step.on_batch(batch)
    second = step.on_batch(batch)
    assert first.kl_mean == pytest.approx(0.0, abs=1e-6)
    assert second.kl_mean > 1e-4
    assert all(not p.requires_grad for p in ref.parameters())


def test_mini_batches_update_several_times_and_clip_against_the_step_start():
    model = tiny_llama()
    groups = [group([trajectory([on_policy(model, PROMPT, GOOD)], 1.0),
                     trajectory([on_policy(model, PROMPT, BAD)], 0.0)]) for _ in range(2)]
    cfg = GRPOConfig(lr=5e-2, experimental=GRPOExperimental(
        mini_batches=2, micro_batch_tokens=16,
        objective=LossParams(clip_eps_high=0.01, clip_eps_low=0.01, norm_tokens=4)))
    m = GRPOStep(model, cfg).on_groups(groups, current_version=2)
    assert m.updates == 2 and m.micro_batches == 2
    assert m.clip_fraction > 0.0  # the second update saw a moved policy
    assert m.mean_staleness == pytest.approx(2.0)


def test_empty_batch_and_non_finite_gradient_skip_the_update():
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    step = GRPOStep(model, GRPOConfig())
    equal = [group([trajectory([segment(PROMPT, GOOD)], 1.0), trajectory([segment(PROMPT, BAD)], 1.0)])]
    m = step.on_groups(equal)
    assert m.updates == 0 and m.zero_variance_groups == 1
    nan = [group([trajectory([segment(PROMPT, GOOD)], float("nan")),
                  trajectory([segment(PROMPT, BAD)], 0.0)])]
    m = step.on_groups(nan)
    assert m.skipped_updates == 1 and m.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_kv_cache_goes_by_the_name_the_model_takes():
    class New:  # transformers >= 5.24
        def forward(self, input_ids, cache=None, use_cache=None): ...

    class Old:
        def forward(self, input_ids, past_key_values=None, use_cache=None): ...

    assert (_cache_kw(New), _cache_kw(Old)) == ("cache", "past_key_values")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefix_gives_the_full_forward_values_and_gradients(temperature):
    """Rows that share a long prompt run it once; logprobs and gradients are those of the full
    forward, including a right-padded row."""
    from looprl.trainer.step import MIN_SHARED_PREFIX, shared_prefix_len

    model = tiny_llama(vocab=300)
    model.config.max_position_embeddings = 512
    torch.manual_seed(1)
    prefix = torch.randint(1, 64, (1, MIN_SHARED_PREFIX + 6)).expand(3, -1)
    tokens = torch.cat([prefix, torch.randint(1, 64, (3, 20))], 1)
    mask = torch.ones_like(tokens)
    tokens[1, -7:], mask[1, -7:] = 0, 0
    tokens[2, MIN_SHARED_PREFIX + 6] = tokens[0, MIN_SHARED_PREFIX + 6] + 1  # rows part here
    assert shared_prefix_len(tokens, mask) == MIN_SHARED_PREFIX + 6
    out = []
    for share in (False, True):
        model.zero_grad()
        lp = token_logprobs(model, tokens, mask, temperature=temperature, share_prefix=share)
        (lp * mask).sum().backward()
        out.append((lp * mask, [p.grad.clone() for p in model.parameters()]))
    (lp_full, g_full), (lp_shared, g_shared) = out
    assert torch.allclose(lp_full, lp_shared, atol=1e-5)
    for a, b in zip(g_full, g_shared, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_repeated_rows_run_once_with_the_full_forward_values_and_gradients():
    """A group's passing rollouts are often the same tokens: each distinct row runs once (and
    the distinct rows still share their prompt), giving every row the logprobs and gradients
    that row-by-row forwards give, whatever the order the repeats come in."""
    from looprl.trainer.step import MIN_SHARED_PREFIX

    model = tiny_llama(vocab=300)
    model.config.max_position_embeddings = 512
    torch.manual_seed(2)
    prompt = torch.randint(1, 64, (MIN_SHARED_PREFIX + 4,))
    a, b = torch.randint(1, 64, (12,)), torch.randint(1, 64, (9,))
    rows = [a, b, a, a, b[:5]]  # two copies of a, one of b, a shorter row that ends early
    tokens = torch.zeros(len(rows), len(prompt) + 12, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, r in enumerate(rows):
        n = len(prompt) + len(r)
        tokens[i, :n], mask[i, :n] = torch.cat([prompt, r]), 1
    weights = torch.rand(len(rows), 1)  # each row's own loss weight: gradients reach each copy
    model.zero_grad()
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, a, _o: seen.append(a[0].shape))
    lp = token_logprobs(model, tokens, mask)
    hook.remove()
    assert seen == [(1, len(prompt)), (3, 12)]  # the prompt once, then the 3 distinct rows' rest
    (lp * mask * weights).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want_lp = []
    for i in range(len(rows)):
        n = int(mask[i].sum())
        one = token_logprobs(model, tokens[i:i + 1, :n], mask[i:i + 1, :n])
        (one * weights[i]).sum().backward()
        want_lp.append(torch.nn.functional.pad(one, (0, tokens.shape[1] - n)))
    torch.testing.assert_close(lp * mask, torch.cat(want_lp).detach(), atol=1e-5, rtol=1e-4)
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def test_silent_rows_left_out_give_the_full_batchs_update():
    """With ``negative_advantage_scale = 0`` the failures' rows carry advantage 0 everywhere:
    left out of the forward (``drop_silent``, as ``GRPOStep`` does), the update is the full
    batch's, and the rows are counted. Two passes and two (longer) failures."""
    base = tiny_llama()
    groups = [group([trajectory([on_policy(base, PROMPT, GOOD)], 1.0),
                     trajectory([on_policy(base, PROMPT, GOOD + [13])], 1.0),
                     trajectory([on_policy(base, PROMPT, BAD + [13, 14, 15])], 0.0),
                     trajectory([on_policy(base, PROMPT, BAD + [16, 17])], 0.0)])]
    no_push = Credit(negative_advantage_scale=0.0)
    cfg = GRPOConfig(lr=1e-2, experimental=GRPOExperimental(credit=no_push, max_grad_norm=1e-3))
    params, metrics = [], []
    for drop in (False, True):
        model = copy.deepcopy(base)
        step = GRPOStep(model, cfg)
        batch = build_batch(groups, no_push, drop_silent=drop)
        metrics.append(step.on_batch(batch))
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    full, dropped = metrics
    assert (full.silent_rows, dropped.silent_rows) == (0, 2)
    assert full.sequences == dropped.sequences == 4
    assert dropped.tokens < full.tokens and full.loss == pytest.approx(dropped.loss)
    assert dropped.grad_norm == pytest.approx(full.grad_norm) and full.grad_norm > 1e-3  # clipped
    assert not torch.equal(params[0], torch.cat([p.flatten() for p in base.parameters()]))
    torch.testing.assert_close(params[0], params[1], atol=1e-6, rtol=1e-5)
    assert GRPOStep(copy.deepcopy(base), cfg).batch(groups).silent_rows == 2
    with_kl = GRPOConfig(experimental=GRPOExperimental(credit=no_push,
                                                       objective=LossParams(kl_coef=0.1)))
    assert GRPOStep(copy.deepcopy(base), with_kl
                    ).batch(groups).silent_rows == 0  # the KL term reads every row
