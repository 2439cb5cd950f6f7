"""TorchEngine against HF: greedy tokens, logprobs, KV reuse, weight updates, eviction, stops."""

from __future__ import annotations

import asyncio

import pytest
import torch

from looprl.errors import ConfigError, ContextFullError
from looprl.inference.kv_forward import CachedForward
from looprl.inference.sampling import sampling_logprobs_B_V
from looprl.inference.torch_engine import TorchEngine
from looprl.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])  # explicit mask: HF would otherwise mask prompt tokens equal to pad
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def run(coro):
    return asyncio.run(coro)


def test_greedy_equals_hf_generate_concurrently(tiny, engine_of):
    model, tok = tiny
    engine = engine_of(model, tok)
    prompts = [prompt(n, s) for s, n in enumerate([40, 7, 90, 33])]

    async def main():
        return await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])

    gens = run(main())
    for p, g in zip(prompts, gens, strict=True):
        assert list(g.token_ids) == hf_greedy(model, p, GREEDY.max_new_tokens)
        assert g.finish_reason == "length" and set(g.policy_versions) == {0}


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_full_forward(tiny_llama, engine_of, temperature, top_p):
    model, tok = tiny_llama
    engine = engine_of(model, tok)
    p = prompt(50, 1)
    params = SamplingParams(max_new_tokens=40, temperature=temperature, top_p=top_p, seed=3)
    g = run(engine.generate(p, params))
    with torch.no_grad():
        logits_T_V = model(torch.tensor([p + list(g.token_ids)])).logits[0, len(p) - 1:-1]
    n = len(g.token_ids)
    ref_T_V = sampling_logprobs_B_V(logits_T_V, torch.full((n,), temperature), torch.full((n,), top_p))
    ref_T = ref_T_V.gather(1, torch.tensor(g.token_ids).unsqueeze(1)).squeeze(1)
    assert torch.isfinite(ref_T).all(), "a sampled token lies outside the nucleus"
    assert torch.allclose(torch.tensor(g.logprobs), ref_T, atol=1e-4)
    if top_p < 1.0:  # the truncated distribution differs from the plain softmax
        plain = torch.log_softmax(logits_T_V / temperature, -1).gather(
            1, torch.tensor(g.token_ids).unsqueeze(1)).squeeze(1)
        assert not torch.allclose(plain, ref_T, atol=1e-4)


def test_same_seed_same_tokens_different_seed_differs(tiny_llama, engine_of):
    model, tok = tiny_llama
    engine = engine_of(model, tok)
    p = prompt(20, 2)

    async def main():
        ps = [SamplingParams(max_new_tokens=30, temperature=1.0, seed=s) for s in (5, 5, 6)]
        return await asyncio.gather(*[engine.generate(p, x) for x in ps])

    a, b, c = run(main())
    # Same tokens; logprobs equal up to float rounding (the two rows sit at different batch
    # positions, and the matmul kernels may split rows differently).
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert a.token_ids != c.token_ids


def test_session_kv_reuse_matches_fresh_prefill(tiny, engine_of):
    model, tok = tiny
    engine = engine_of(model, tok)
    fresh = engine_of(model, tok)
    p = prompt(60, 4)

    async def main():
        t1 = await engine.generate(p, GREEDY, session_id="traj")
        turn2 = p + list(t1.token_ids) + prompt(30, 5)  # the harness resends the full context
        before = engine.stats.prefilled_tokens
        t2 = await engine.generate(turn2, GREEDY, session_id="traj")
        ref = await fresh.generate(turn2, GREEDY)
        return t2, ref, engine.stats.prefilled_tokens - before

    t2, ref, prefilled = run(main())
    assert t2.token_ids == ref.token_ids
    assert torch.allclose(torch.tensor(t2.logprobs), torch.tensor(ref.logprobs), atol=1e-5)
    assert prefilled == 31  # the last turn-1 token (never fed) + 30 new tokens


def test_group_prompt_prefilled_once_and_shared(tiny, engine_of):
    model, tok = tiny
    engine = engine_of(model, tok)
    p = prompt(80, 6)
    G = 4

    async def main():
        return await asyncio.gather(*[engine.generate(p, GREEDY, session_id=f"t{i}", group_id="g")
                                      for i in range(G)])

    gens = run(main())
    ref = hf_greedy(model, p, GREEDY.max_new_tokens)
    assert all(list(g.token_ids) == ref for g in gens)
    assert engine.stats.prefilled_tokens == len(p) + (G - 1)  # the others only rerun the last token
    assert engine.stats.reused_group_tokens == (G - 1) * len(p)


def test_weight_update_mid_generation_switches_version(tiny_llama, engine_of):
    model, tok = tiny_llama
    engine = engine_of(model, tok)
    new_sd = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()
              if k.endswith("mlp.down_proj.weight")}

    async def main():
        task = asyncio.create_task(engine.generate(prompt(30, 7), SamplingParams(
            max_new_tokens=400, temperature=1.0, seed=0), session_id="a"))
        while engine.stats.generated_tokens < 10:
            await asyncio.sleep(0.001)
        await engine.update_weights(new_sd, version=1)
        return await task

    g = run(main())
    v = list(g.policy_versions)
    switch = v.index(1)
    assert 0 < switch < len(v) and v == [0] * switch + [1] * (len(v) - switch)
    assert engine.policy_version == 1
    assert torch.equal(model.state_dict()["model.layers.0.mlp.down_proj.weight"],
                       new_sd["model.layers.0.mlp.down_proj.weight"])
    # tokens after the switch were scored by the new weights (KV of earlier tokens is kept as is)
    full = list(g.token_ids)
    assert len(full) == 400


def test_lru_eviction_recomputes_and_stays_exact(tiny_llama, engine_of):
    model, tok = tiny_llama
    probe = engine_of(model, tok)
    budget_mb = 2.5 * probe.fwd.slot_bytes / 2**20  # room for 2 slots
    engine = engine_of(model, tok, kv_budget_mb=budget_mb)
    assert engine.num_slots == 2
    prompts = {s: prompt(40, 10 + i) for i, s in enumerate("abc")}

    async def main():
        first = {s: await engine.generate(p, GREEDY, session_id=s) for s, p in prompts.items()}
        second = {}
        for s, p in prompts.items():  # 'a' was evicted by 'c': recomputed from scratch
            second[s] = await engine.generate(p + list(first[s].token_ids), GREEDY, session_id=s)
        return first, second

    first, second = run(main())
    assert engine.stats.evictions >= 2
    for s, p in prompts.items():
        ref = hf_greedy(model, p, 2 * GREEDY.max_new_tokens)
        assert list(first[s].token_ids) + list(second[s].token_ids) == ref


def test_release_frees_the_session(tiny_llama, engine_of):
    model, tok = tiny_llama
    engine = engine_of(model, tok)

    async def main():
        await engine.generate(prompt(10, 1), GREEDY, session_id="x")
        await engine.release("x")
        await engine.generate(prompt(10, 1), GREEDY)  # a round trip through the engine thread
        return engine.stats.prefilled_tokens

    assert run(main()) == 20
    assert "s:x" not in engine._entries


def test_stop_string_and_end_of_turn(tiny_llama, engine_of):
    model, tok = tiny_llama
    p = prompt(30, 8)
    ref = hf_greedy(model, p, 24)
    engine = engine_of(model, tok)
    stop_text = tok.decode(ref[5:7])
    g = run(engine.generate(p, SamplingParams(max_new_tokens=24, temperature=0.0, stop=(stop_text,))))
    assert g.finish_reason == "stop" and stop_text in g.text and len(g.token_ids) <= 7
    assert list(g.token_ids) == ref[:len(g.token_ids)]
    eot = engine_of(model, tok, stop_on_eos=True)
    eot.eos_ids = {ref[3]}  # pretend the 4th greedy token is the end-of-turn token
    g = run(eot.generate(p, GREEDY))
    assert g.finish_reason == "stop" and list(g.token_ids) == ref[:ref.index(ref[3]) + 1]


def test_bad_inputs_raise_clear_errors(tiny_llama, engine_of):
    model, tok = tiny_llama
    engine = engine_of(model, tok, max_len=64)
    with pytest.raises(ContextFullError, match="summarize"):
        run(engine.generate(prompt(64, 0), GREEDY))
    with pytest.raises(ConfigError, match="unknown parameter"):
        run(engine.update_weights({"nope.weight": torch.zeros(1)}, version=1))
    g = run(engine.generate(prompt(60, 0), GREEDY))
    assert g.finish_reason == "length" and len(g.token_ids) == 4  # the context filled up


def test_default_eos_is_im_end(tiny_llama):
    model, tok = tiny_llama
    engine = TorchEngine(model, tok)
    try:
        assert tok.convert_tokens_to_ids("<|im_end|>") in engine.eos_ids
    finally:
        engine.close()


def test_cascade_attention_over_group_prefix_matches_plain_attention(tiny, engine_of):
    model, tok = tiny
    p = prompt(120, 20)
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=9)

    async def rollouts(engine):
        async def one(i):
            t1 = await engine.generate(p, params, session_id=f"t{i}", group_id="g")
            ctx = p + list(t1.token_ids) + prompt(10 + 7 * i, 30 + i)  # a different tool output each
            t2 = await engine.generate(ctx, params, session_id=f"t{i}", group_id="g")
            return t1, t2
        return await asyncio.gather(*[one(i) for i in range(3)])

    cascade, plain = engine_of(model, tok), engine_of(model, tok, cascade=False)
    got, ref = run(rollouts(cascade)), run(rollouts(plain))
    for (a1, a2), (b1, b2) in zip(got, ref, strict=True):
        assert a1.token_ids == b1.token_ids and a2.token_ids == b2.token_ids
        assert torch.allclose(torch.tensor(a1.logprobs + a2.logprobs),
                              torch.tensor(b1.logprobs + b2.logprobs), atol=1e-5)
    assert cascade.stats.reused_group_tokens == 2 * len(p)


def test_nan_left_in_freed_memory_does_not_reach_the_logits(tiny_llama, engine_of):
    # A decode step reads every row's cache up to the longest row's position (masked). Memory the
    # allocator hands back can hold NaN from an earlier tensor; NaN survives an additive mask, so
    # the cache must start as zeros. Recycle NaN-filled blocks of exactly the cache's size first.
    model, tok = tiny_llama
    probe = CachedForward(model, 1, 512)
    for _ in range(2 * len(probe.layers) + 2):
        shape = (256, *probe.k_L[0].shape[1:])  # the engine's cache: 256 slots of this shape
        torch.full(shape, float("nan"))
    engine = engine_of(model, tok)
    assert all(torch.isfinite(c).all() for c in engine.fwd.k_L + engine.fwd.v_L)
    prompts = [prompt(n, s) for s, n in enumerate([40, 7, 90, 33])]

    async def main():
        return await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])

    for p, g in zip(prompts, run(main()), strict=True):
        assert list(g.token_ids) == hf_greedy(model, p, GREEDY.max_new_tokens)


def test_num_threads_is_the_decode_threads_own(tiny_llama, engine_of):
    """torch's thread count is per OS thread, and a new thread takes the count last set anywhere
    at its first op: the decode thread must keep the engine's, not pick up the trainer's."""
    model, tok = tiny_llama
    before = torch.get_num_threads()
    try:
        engine = engine_of(model, tok, max_len=64, num_threads=1)
        torch.set_num_threads(3)  # the trainer's count, set after the engine was built
        run(engine.generate(prompt(8, 0), GREEDY))
        assert engine.stats.threads == 1
        assert torch.get_num_threads() == 3  # the caller's count is its own too
    finally:
        torch.set_num_threads(before)
