"""Speculative decoding with MTP heads and prompt lookup: exact (greedy tokens identical to plain
decoding, sampled tokens from the same distribution), through sessions, groups and weight swaps;
``auto`` mode."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from looprl.errors import ConfigError
from looprl.inference.spec import Draft, Drafter, NgramIndex, SpecController, accept
from looprl.inference.torch_engine import TorchEngine
from looprl.models.mtp import attach_heads, heads_of, new_heads, train_heads
from looprl.types import SamplingParams

from .conftest import make_tiny

GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit (expected counts >= 5 in every cell)."""
    assert float(expected.min()) >= 5, "merge cells: chi-square needs expected counts >= 5"
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


PROMPTS = [prompt(n, s) for s, n in enumerate([40, 8, 90, 33, 64])]


def with_heads(arch: str = "llama", *, temperature: float = 0.0, steps: int = 40,
               logit_scale: float = 1.0, seed: int = 0):
    """A tiny model with 3 MTP heads distilled briefly on its own continuations of ``PROMPTS``
    (greedy, or sampled at ``temperature``): drafts are accepted often but not always, so the
    accept and the reject paths both run. ``logit_scale`` sharpens (> 1) or flattens the
    model's distributions (these models' LM head is not tied to the embeddings)."""
    model, tok = make_tiny(arch, seed=seed)
    model.get_output_embeddings().weight.data.mul_(logit_scale)
    attach_heads(model, new_heads(model, 3))
    torch.manual_seed(seed)
    seqs = []
    with torch.no_grad():
        for p in PROMPTS:
            x = torch.tensor([p])
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48, pad_token_id=0,
                                 do_sample=temperature > 0, temperature=temperature or None, top_k=None)
            seqs.append(out[0].tolist())
    train_heads(model, seqs, steps=steps, positions=256, lr=1e-2)
    heads_of(model).eval()
    return model, tok


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_heads(request):
    return with_heads(request.param)


def run(coro):
    return asyncio.run(coro)


# -- the acceptance rule -------------------------------------------------------------------------
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_accept_emits_tokens_from_the_target_distribution(temperature, top_p):
    # Many rows, one draft each from a q far from p: the first emitted token (the draft if
    # accepted, else the residual's) must follow p = the distribution plain decoding samples.
    V, N = 6, 60_000
    logits_V = torch.tensor([2.0, 1.5, 0.3, 0.0, -1.0, 0.7])
    q_V = torch.tensor([0.05, 0.05, 0.5, 0.3, 0.05, 0.05])
    g = torch.Generator().manual_seed(0)
    d_N = torch.multinomial(q_V, N, replacement=True, generator=g)
    temps, top_ps = torch.full((N,), temperature), torch.full((N,), top_p)
    out = accept(logits_V.expand(N, 2, V).clone(), Draft(d_N.unsqueeze(1), q_V.expand(N, 1, V).clone()),
                 temps, top_ps, torch.rand(N, 1, generator=g), torch.rand(N, generator=g))
    first = torch.tensor([t[0] for t in out.tokens_B_T])
    from looprl.inference.sampling import sampling_logprobs_B_V
    p_V = sampling_logprobs_B_V(logits_V.unsqueeze(0), temps[:1], top_ps[:1]).exp()[0]
    support = p_V > 0
    counts = torch.bincount(first, minlength=V).float()
    assert counts[~support].sum() == 0, "a token outside the nucleus was emitted"
    assert chi2_pvalue(counts[support], N * p_V[support]) > 1e-3
    # the drafts were accepted at the rate sum_x min(p, q) (= 1 - total variation)
    rate = sum(out.accepted_B) / N
    assert abs(rate - float(torch.minimum(p_V, q_V).sum())) < 0.01
    # without the rejection rule the draft distribution q would come out: the test would see it
    assert chi2_pvalue(torch.bincount(d_N, minlength=V).float()[support], N * p_V[support]) < 1e-6


def test_greedy_accepts_exactly_the_argmax_prefix():
    V = 5
    logits = torch.full((1, 4, V), -1.0)
    for i, t in enumerate([3, 1, 4, 2]):  # target argmax at each position
        logits[0, i, t] = 1.0
    d = torch.tensor([[3, 1, 0]])
    ref = torch.log_softmax(logits[0], -1)
    # the all-greedy fast path (no q) and a batch whose q exists for sampled rows agree
    for q in (None, torch.softmax(torch.randn(1, 3, V), -1)):
        out = accept(logits, Draft(d, q), torch.zeros(1), torch.ones(1), torch.rand(1, 3), torch.rand(1))
        assert out.accepted_B == [2] and out.tokens_B_T == [[3, 1, 4]]  # 3rd draft wrong -> argmax 4
        assert torch.allclose(torch.tensor(out.logprobs_B_T[0]), ref[[0, 1, 2], [3, 1, 4]])


# -- the adaptive switch -------------------------------------------------------------------------
def test_auto_uses_the_draft_length_that_pays_and_follows_changes():
    # A step of 8 rows drafting k tokens costs 1 + cost_k * k (plain = 1) and yields
    # 1 + a + ... + a^k tokens per row (acceptance a per draft). auto must find the best k,
    # turn drafting off when no k pays, and back on when acceptance recovers.
    c = SpecController("auto", max_draft=3, warmup=3, probe_every=20, probe_steps=2)

    def steps(n: int, a: float, cost_k: float) -> list[int]:
        chosen = []
        for _ in range(n):
            k = c.draft_len(8)
            tokens = 8 * sum(a ** i for i in range(k + 1))
            c.record(8, k, round(tokens), 1e-3 * (1 + cost_k * k), accepted=round(tokens) - 8)
            chosen.append(k)
        return chosen

    def best(a: float, cost_k: float) -> int:
        return max(range(4), key=lambda k: sum(a ** i for i in range(k + 1)) / (1 + cost_k * k))

    for a, cost_k in ((0.8, 0.2), (0.1, 0.3), (0.6, 0.25)):  # pays at k=3; never; at k=2
        chosen = steps(150, a, cost_k)[-60:]
        assert sum(k == best(a, cost_k) for k in chosen) >= 50, (a, cost_k, chosen)
    assert best(0.1, 0.3) == 0 and c.counters.switches >= 2
    m = c.metrics()
    assert 0 < m["spec/acceptance"] < 1 and m["spec/tokens_per_verify"] > 1
    assert m["spec/speedup"] > 1  # the last regime pays: drafting beats plain steps
    assert c.draft_len(1) == 0 and SpecController.bucket(1) != SpecController.bucket(8)  # own warm-up


def test_modes_and_bad_config():
    assert SpecController("off", 3).draft_len(4) == 0
    assert SpecController("on", 3).draft_len(4) == 3
    assert SpecController("auto", 0).draft_len(4) == 0  # no heads: plain decoding
    with pytest.raises(ConfigError, match="needs MTP heads"):
        SpecController("on", 0)
    with pytest.raises(ConfigError, match="choose one of"):
        SpecController("sometimes", 3)


def test_engine_on_without_heads_is_a_config_error():
    model, tok = make_tiny("llama")
    with pytest.raises(ConfigError, match="needs MTP heads"):
        TorchEngine(model, tok, speculative="on")


# -- prompt lookup -------------------------------------------------------------------------------
def test_ngram_index_proposes_what_followed_the_longest_earlier_match():
    ix = NgramIndex([1, 2, 3, 9, 2, 3, 4, 5, 7, 3], max_n=3)
    assert ix.propose(2) == [4, 5]  # "3" last occurred before "4 5" (the most recent wins)
    assert ix.propose(2, min_n=2) == []  # "7 3" never occurred before
    ix.extend([4, 5])
    assert ix.propose(3) == [7, 3, 4]  # "3 4 5" occurred before, followed by "7 3 4"
    ix.extend([8])
    assert ix.propose(3) == []  # "8" is new
    assert NgramIndex([]).propose(4) == [] and NgramIndex([6]).propose(4) == []


def test_looked_up_drafts_are_accepted_with_the_targets_probability():
    # A looked-up token d is a point-mass draft: accepted with probability p(d), and the
    # emitted token (d, or the residual's when rejected) follows p, through Drafter and accept.
    model, _ = make_tiny("llama")
    drafter = Drafter(model, None, lookup=1)
    V, N, d = model.config.vocab_size, 40_000, 7
    logits_V = torch.full((V,), -30.0)
    logits_V[:6] = torch.tensor([2.0, 1.5, 0.3, 0.0, -1.0, 0.7])
    logits_V[d] = 1.0
    g = torch.Generator().manual_seed(0)
    temps, top_ps = torch.ones(N), torch.ones(N)
    draft = drafter.draft(torch.zeros(N, 64), [0] * N, temps, top_ps, torch.rand(N, 1, generator=g),
                          [[d]] * N)
    assert draft.tokens_B_K.unique().tolist() == [d] and torch.equal(draft.probs_B_K_V.sum(-1), torch.ones(N, 1))
    out = accept(logits_V.expand(N, 2, V).clone(), draft, temps, top_ps, torch.rand(N, 1, generator=g),
                 torch.rand(N, generator=g))
    p_V = torch.softmax(logits_V, -1)
    assert abs(sum(out.accepted_B) / N - float(p_V[d])) < 0.01
    first = torch.bincount(torch.tensor([t[0] for t in out.tokens_B_T]), minlength=V).float()
    support = p_V > 1e-6
    assert first[~support].sum() == 0
    assert chi2_pvalue(first[support], N * p_V[support]) > 1e-3


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lookup_without_heads_is_exact_over_turns_and_saves_steps(arch, engine_of):
    # Tiny random models fall into loops when decoding greedily: their own output repeats, which
    # is what lookup drafts from. Same tokens and logprobs as plain decoding, fewer steps.
    model, tok = make_tiny(arch)
    assert heads_of(model) is None

    async def rollouts(engine):
        async def one(i):
            out, ctx = [], list(PROMPTS[i])
            for _ in range(2):
                g = await engine.generate(ctx, SamplingParams(max_new_tokens=40, temperature=0.0),
                                          session_id=f"t{i}", group_id="g" if i < 2 else None)
                out.append(g)
                ctx += list(g.token_ids) + PROMPTS[i][:5]  # a "tool output" that repeats the prompt
            return out
        return await asyncio.gather(*[one(i) for i in range(4)])

    spec = engine_of(model, tok, speculative="on", lookup=4)
    plain = engine_of(model, tok, speculative="off")
    got, ref = run(rollouts(spec)), run(rollouts(plain))
    for a_turns, b_turns in zip(got, ref, strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    m = spec.metrics()
    # rows whose lookup came up shorter than the longest pad theirs with filler
    assert m["engine/spec/looked_up_fraction"] > 0.3 and 0 < m["engine/spec/acceptance"] < 1
    assert spec.stats.decode_steps < plain.stats.decode_steps


def test_lookup_config_errors():
    model, tok = make_tiny("llama")
    with pytest.raises(ConfigError, match="lookup=-1"):
        TorchEngine(model, tok, lookup=-1)
    e = TorchEngine(model, tok, speculative="on", lookup=3)  # no heads needed
    try:
        assert e.spec.max_draft == 3
    finally:
        e.close()


# -- the engine ----------------------------------------------------------------------------------
@pytest.mark.parametrize("lookup", [0, 4])
def test_greedy_identical_with_and_without_speculation(tiny_heads, engine_of, lookup):
    model, tok = tiny_heads
    spec = engine_of(model, tok, speculative="on", lookup=lookup)
    plain = engine_of(model, tok, speculative="off")
    prompts = PROMPTS

    async def gens(engine):
        return await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])

    got, ref = run(gens(spec)), run(gens(plain))
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason == "length"
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    m = spec.metrics()
    assert m["engine/spec/on_fraction"] == 1.0
    assert 0.1 < m["engine/spec/acceptance"] < 0.9  # drafts both accepted and rejected
    assert spec.stats.decode_steps < plain.stats.decode_steps
    if lookup:  # looked-up tokens took some positions, the heads the others
        assert 0 < m["engine/spec/looked_up_fraction"] < 1


@pytest.mark.parametrize("lookup", [0, 4])
def test_multi_turn_sessions_and_group_prefix_identical(tiny_heads, engine_of, lookup):
    model, tok = tiny_heads
    p = PROMPTS[0]

    async def rollouts(engine):
        async def one(i):
            turns, ctx = [], list(p)
            for t in range(3):
                g = await engine.generate(ctx, SamplingParams(max_new_tokens=25, temperature=0.0),
                                          session_id=f"t{i}", group_id="g")
                turns.append(g)
                ctx += list(g.token_ids) + prompt(6 + 5 * i, 100 * i + t)  # a tool output each
            await engine.release(f"t{i}")
            return turns
        return await asyncio.gather(*[one(i) for i in range(3)])

    spec = engine_of(model, tok, speculative="on", lookup=lookup)
    plain = engine_of(model, tok, speculative="off")
    got, ref = run(rollouts(spec)), run(rollouts(plain))
    for a_turns, b_turns in zip(got, ref, strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.token_ids == b.token_ids
    # the KV reuse worked the same way: only the new tokens of each turn were prefilled
    assert spec.stats.prefilled_tokens == plain.stats.prefilled_tokens
    assert spec.stats.reused_group_tokens == 2 * len(p)


@pytest.mark.parametrize("lookup", [0, 4])
def test_weight_swap_mid_generation_swaps_heads_and_stays_exact(tiny_heads, engine_of, lookup):
    model, tok = tiny_heads
    new_sd = {k: v + 0.02 * torch.randn_like(v) for k, v in model.state_dict().items()
              if k.endswith("mlp.down_proj.weight") or k.startswith("mtp_heads.")}
    p = PROMPTS[2]
    spec = engine_of(copy.deepcopy(model), tok, speculative="on", lookup=lookup)

    async def swapped():
        task = asyncio.create_task(spec.generate(p, SamplingParams(max_new_tokens=120, temperature=0.0),
                                                 session_id="a"))
        while spec.stats.generated_tokens < 20:
            await asyncio.sleep(0.001)
        await spec.update_weights(new_sd, version=1)
        return await task

    g = run(swapped())
    v = list(g.policy_versions)
    n = v.index(1)
    assert 0 < n < len(v) and v == [0] * n + [1] * (len(v) - n)
    assert torch.equal(spec.model.state_dict()["mtp_heads.heads.0.proj.weight"],
                       new_sd["mtp_heads.heads.0.proj.weight"])
    # Reference: plain decoding of the first n tokens on the old weights, the swap, then the
    # rest on the new ones with the session's KV (the n-th token is fed after the swap, as above).
    plain = engine_of(copy.deepcopy(model), tok, speculative="off")

    async def reference():
        a = await plain.generate(p, SamplingParams(max_new_tokens=n, temperature=0.0), session_id="a")
        await plain.update_weights(new_sd, version=1)
        b = await plain.generate(p + list(a.token_ids), SamplingParams(max_new_tokens=120 - n,
                                 temperature=0.0), session_id="a")
        return list(a.token_ids) + list(b.token_ids)

    assert list(g.token_ids) == run(reference())


def test_auto_engine_measures_every_draft_length_and_stays_exact(tiny_heads, engine_of):
    model, tok = tiny_heads
    auto, plain = engine_of(model, tok, speculative="auto"), engine_of(model, tok, speculative="off")

    async def gens(engine):
        return await asyncio.gather(*[engine.generate(p, GREEDY) for p in PROMPTS[:2]])

    got, ref = run(gens(auto)), run(gens(plain))
    assert [g.token_ids for g in got] == [g.token_ids for g in ref]
    arms = auto.spec.buckets[SpecController.bucket(2)].arms
    assert all(arm.steps >= auto.spec.warmup for arm in arms)  # plain and draft lengths 1..3
    m = auto.metrics()
    assert 0 < m["engine/spec/on_fraction"] < 1 and m["engine/spec/speedup"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,lookup", [(1.0, 1.0, 0), (0.8, 0.9, 0), (1.0, 1.0, 2)])
def test_sampled_tokens_follow_the_models_distribution(temperature, top_p, lookup, engine_of):
    # N rollouts of 3 tokens from one prompt: token 1 comes from the prefill, tokens 2-3 from
    # one speculative step (drafted, verified, accepted or resampled). Their joint law must be
    # the model's: p(x1) p(x2 | x1) p(x3 | x1 x2), each tempered and nucleus-truncated.
    # logits x3: a few sequences carry enough mass for expected counts >= 5 at N = 2000
    model, tok = with_heads(temperature=1.0, logit_scale=3.0)
    engine = engine_of(model, tok, speculative="on", max_batch=64, lookup=lookup)
    p, N = PROMPTS[1], 2000
    if lookup:  # the prompt holds its likely continuation: a row that samples it looks it up
        with torch.no_grad():
            x = torch.tensor([p])
            cont = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8,
                                  do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        p = p + cont + p
    params = [SamplingParams(max_new_tokens=3, temperature=temperature, top_p=top_p, seed=i) for i in range(N)]

    async def sample():
        return await asyncio.gather(*[engine.generate(p, x, group_id="g") for x in params])

    seqs = [tuple(g.token_ids) for g in run(sample())]
    m = engine.metrics()
    assert 0.1 < m["engine/spec/acceptance"] < 0.9  # both paths of the rule run
    assert (m["engine/spec/looked_up_fraction"] > 0.1) == bool(lookup)
    from looprl.inference.sampling import sampling_logprobs_B_V

    def law(ctx_B_T: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=ctx_B_T).logits[:, -1]
        n = logits.shape[0]
        return sampling_logprobs_B_V(logits, torch.full((n,), temperature), torch.full((n,), top_p)).exp()

    distinct = sorted(set(seqs))
    ctx = torch.tensor([p + list(s) for s in distinct])
    L = len(p)
    prob = law(ctx[:, :L])[torch.arange(len(distinct)), ctx[:, L]] \
        * law(ctx[:, :L + 1])[torch.arange(len(distinct)), ctx[:, L + 1]] \
        * law(ctx[:, :L + 2])[torch.arange(len(distinct)), ctx[:, L + 2]]
    assert float(prob.min()) > 0, "a sequence of probability 0 under the model was sampled"
    counts = torch.tensor([seqs.count(s) for s in distinct], dtype=torch.float64)
    expected = N * prob.double()
    big = expected >= 5
    obs = torch.cat([counts[big], (N - counts[big].sum()).view(1)])
    exp = torch.cat([expected[big], (N - expected[big].sum()).view(1)])
    assert int(big.sum()) >= 10, "too few likely sequences for a meaningful test"
    pvalue = chi2_pvalue(obs, exp)
    print(f"chi-square over {int(big.sum()) + 1} cells: p = {pvalue:.3f}")
    assert pvalue > 1e-3
