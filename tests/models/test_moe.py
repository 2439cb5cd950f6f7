"""The tiny MoE: the engine's forward against HF's, recorded routes, router replay in the trainer,
routes through the trajectory record, the MoE step's metrics."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from looprl.harness.run_state import AgentRun
from looprl.inference.kv_forward import CachedForward
from looprl.inference.torch_engine import TorchEngine
from looprl.models.config import SIZES
from looprl.models.moe import NO_ROUTE, RouterTap, moe_blocks, shifted_routes, upcycle
from looprl.models.tiny import model_config
from looprl.models.tokenizer import build_tokenizer
from looprl.trainer.batch import build_batch
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.step import GRPOStep, moe_logprobs
from looprl.types import (
    Counters,
    Generation,
    Group,
    RewardBreakdown,
    SamplingParams,
    Segment,
    StopReason,
    Trajectory,
)

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


def make_moe(seed: int = 0, layers: int = 2):
    tok = build_tokenizer(None)
    cfg = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                         norm_topk_prob=True, max_position_embeddings=512, initializer_range=0.1,
                         pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return model, tok


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_topk(model, ids: list[int]) -> torch.Tensor:
    """[T, L, K] experts HF's own forward routes each position of ``ids`` to (sorted)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    k = model.config.num_experts_per_tok
    return torch.stack([lg.softmax(-1).topk(k, -1).indices for lg in out.router_logits], 1).sort(-1).values


def generate(model, tok, prompts, params=GREEDY, group: str | None = None) -> list[Generation]:
    engine = TorchEngine(model, tok, stop_on_eos=False)

    async def main():
        return await asyncio.gather(*[
            engine.generate(p, params if group is None else
                            SamplingParams(max_new_tokens=12, temperature=1.0, seed=i), group_id=group)
            for i, p in enumerate(prompts)])
    try:
        return asyncio.run(main())
    finally:
        engine.close()


def test_the_default_moe_size_is_a_qwen3_moe_of_about_5m_params():
    s = SIZES["moe"]
    cfg = model_config("moe", 2048, 0, 2)
    assert isinstance(cfg, Qwen3MoeConfig) and cfg.num_experts == s.experts == 8
    assert cfg.head_dim == 64 and cfg.router_aux_loss_coef > 0 and cfg.output_router_logits
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - experts + experts * s.top_k // s.experts
    assert 4.5e6 < total < 6e6 and 2e6 < active < 2.8e6


def test_engine_forward_equals_hf_forward():
    model, _ = make_moe()
    ids = prompt(37, 1)
    fwd = CachedForward(model, num_slots=2, max_len=128)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].float()
    out = fwd.prefill(ids[:30], slot=0, start=0)
    torch.testing.assert_close(out.logits_B_T_V[0, 0], ref[29], rtol=1e-4, atol=1e-4)
    for j in range(30, 37):  # decode steps, one token each
        out = fwd.decode([[ids[j]]], [j])
        torch.testing.assert_close(out.logits_B_T_V[0, 0], ref[j], rtol=1e-4, atol=1e-4)
    assert out.routes_B_T_L_K is not None and out.routes_B_T_L_K.dtype == torch.uint8
    assert out.routes_B_T_L_K.shape == (1, 1, 2, 2)


def test_greedy_tokens_and_recorded_routes_equal_hf():
    model, tok = make_moe()
    prompts = [prompt(n, s) for s, n in enumerate([25, 9, 60])]
    gens = generate(model, tok, prompts)
    for p, g in zip(prompts, gens, strict=True):
        full = p + list(g.token_ids)
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=len(g.token_ids), do_sample=False, pad_token_id=0)
        assert list(g.token_ids) == ref[0, len(p):].tolist()
        assert g.routes is not None and g.routes.tokens == len(g.token_ids)
        # token j was sampled from position len(p) - 1 + j
        want = hf_topk(model, full)[len(p) - 1:len(full) - 1]
        got = torch.from_numpy(g.routes.array().copy()).long().sort(-1).values
        assert torch.equal(got, want)


def test_group_and_sampled_requests_record_routes_per_token():
    model, tok = make_moe(seed=1)
    p = prompt(70, 3)  # a group's shared prompt: copied KV, cascade attention
    gens = generate(model, tok, [p] * 4, group="g")
    assert len({g.token_ids for g in gens}) > 1
    for g in gens:
        full = p + list(g.token_ids)
        want = hf_topk(model, full)[len(p) - 1:len(full) - 1]
        got = torch.from_numpy(g.routes.array().copy()).long().sort(-1).values
        assert (got == want).all(-1).float().mean() > 0.99  # fp32: ties aside, identical


def _seg_with_routes(model, tok, seed: int = 0) -> tuple[Segment, torch.Tensor]:
    p = prompt(20, seed)
    g = generate(model, tok, [p])[0]
    run = AgentRun(messages=[])
    run.add_context(p)
    run.add_generation(g)
    run.add_context([5, 6, 7])
    run.seen = len(run.token_ids)
    run.close_segment()
    seg = run.segments[0]
    return seg, torch.from_numpy(seg.routes.array().copy())


def test_routes_travel_with_the_segment_and_survive_save_and_load():
    model, tok = make_moe()
    seg, routes = _seg_with_routes(model, tok)
    n_p = 20
    assert seg.routes is not None and seg.routes.tokens == len(seg.token_ids_T)
    assert (routes[:n_p] == NO_ROUTE).all() and (routes[-3:] == NO_ROUTE).all()
    assert (routes[n_p:-3] != NO_ROUTE).all()
    traj = Trajectory("t", "g", (seg,), (), Counters(), StopReason.FINISHED)
    back = Trajectory.from_json(traj.to_json())
    assert back == traj and back.segments[0].routes.rows() == seg.routes.rows()
    old = json.loads(traj.to_json())
    del old["segments"][0]["routes"]  # a file saved before routes were recorded
    assert Trajectory.from_dict(old).segments[0].routes is None


def _used_experts(model):
    """Hooks recording the experts each MoE block's experts module was given."""
    seen: list[torch.Tensor] = []
    handles = [b.experts.register_forward_pre_hook(lambda m, a: seen.append(a[1].clone()))
               for b in moe_blocks(model)]
    return seen, handles


@pytest.mark.parametrize("replay", [True, False])
def test_replay_routes_the_trainer_to_the_recorded_experts(replay):
    model, tok = make_moe()
    seg, routes_T_L_K = _seg_with_routes(model, tok)
    # perturb: every recorded token goes to two experts the router did not pick
    ids = torch.tensor([seg.token_ids_T])
    own = hf_topk(model, list(seg.token_ids_T))  # [T, L, K] per position
    has = routes_T_L_K[:, 0, 0] != NO_ROUTE
    perturbed = routes_T_L_K.clone()
    for t in torch.nonzero(has).flatten().tolist():
        for layer in range(routes_T_L_K.shape[1]):
            free = [e for e in range(8) if e not in own[t - 1, layer].tolist()]
            perturbed[t, layer] = torch.tensor(free[:2], dtype=torch.uint8)
    seen, handles = _used_experts(model)
    try:
        lp, tap = moe_logprobs(model.train(), ids, torch.ones_like(ids), perturbed[None], replay=replay)
    finally:
        for h in handles:
            h.remove()
    want = shifted_routes(perturbed[None])[0]  # per position
    pos = torch.nonzero(want[:, 0, 0] != NO_ROUTE).flatten()
    used = torch.stack(seen, 1)  # [T, L, K]
    # the check fails without replay: the trainer's routers pick their own experts
    assert torch.equal(used[pos].sort(-1).values, want[pos].long().sort(-1).values) == replay
    assert tap.decisions == len(pos)
    assert tap.disagree_L == [0, 0] if replay else min(tap.disagree_L) == len(pos)
    # the gate weights are the trainer's own: the router gets a gradient through them
    lp[0, 1:].sum().backward()
    assert all(b.gate.weight.grad is not None and b.gate.weight.grad.abs().sum() > 0
               for b in moe_blocks(model))


def test_without_replay_the_tap_counts_disagreement_per_layer():
    model, tok = make_moe()
    seg, routes = _seg_with_routes(model, tok)
    flipped = routes.clone()
    rec = flipped[:, 0, 0] != NO_ROUTE
    flipped[rec, 1] = (flipped[rec, 1] + 1) % 8  # layer 1 only
    ids = torch.tensor([seg.token_ids_T])
    with RouterTap(model, shifted_routes(flipped[None])) as tap, torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    assert tap.decisions == int(rec.sum())
    assert tap.disagree_L[0] == 0 and tap.disagree_L[1] > 0.5 * tap.decisions
    # the tap's load-balancing loss is HF's own (which pretraining adds through labels=)
    want = load_balancing_loss_func(out.router_logits, 8, 2)
    torch.testing.assert_close(tap.aux_loss(), want)


def _group(model, tok) -> Group:
    trajs = []
    for i in range(2):
        seg, _ = _seg_with_routes(model, tok, seed=i)
        trajs.append(Trajectory("t", "g", (seg,), (), Counters(), StopReason.FINISHED,
                                reward=RewardBreakdown.of({"tests": float(i)}), id=f"r{i}"))
    return Group("t", "g", tuple(trajs))


@pytest.mark.parametrize("replay", [False, True])
def test_a_grpo_step_on_the_moe_logs_engine_agreement_and_the_aux_loss(replay):
    model, tok = make_moe()
    group = _group(model, tok)
    step = GRPOStep(model, GRPOConfig(lr=1e-4, experimental=GRPOExperimental(router_replay=replay)))
    batch = build_batch([group])
    assert batch.micro_batches[0].routes_B_T_L_K is not None
    m = step.on_batch(batch).to_dict()
    assert m["tokens"] > 0 and m["updates"] == 1
    # fp32 engine and fp32 trainer: the same routes and logprobs up to rounding
    assert m["router_disagree"] < 0.02 and m["router_disagree_l0"] <= m["router_disagree"] * 2 + 1e-9
    assert abs(m["engine_kl"]) < 1e-3 and m["engine_mismatch_frac"] < 0.05
    assert m["moe_aux_loss"] > 1.0  # top-2: 2 when balanced


def make_dense(seed: int = 0):
    tok = build_tokenizer(None)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512,
                      initializer_range=0.1, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return model, tok


def test_an_upcycled_moe_is_the_dense_models_function_with_routes_of_its_own():
    dense, tok = make_dense()
    moe = upcycle(dense, experts=8, top_k=2, seed=3)
    assert isinstance(moe, MixtralForCausalLM) and len(moe_blocks(moe)) == 2
    ids = torch.tensor([prompt(40, 1)])
    with torch.no_grad():
        torch.testing.assert_close(moe(input_ids=ids).logits, dense(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    # the router is random, not collapsed: positions go to different experts
    assert len(set(hf_topk(moe, prompt(40, 1))[:, 0].flatten().tolist())) > 2
    # tied embeddings stay tied; experts are copies that train apart (not one shared tensor)
    assert moe.lm_head.weight.data_ptr() == moe.model.embed_tokens.weight.data_ptr()
    w = moe.model.layers[0].mlp.experts.gate_up_proj
    w.data[0].add_(1.0)
    assert not torch.equal(w[0], w[1])
    # the engine samples it as HF does and records its routes
    moe2 = upcycle(dense, experts=8, top_k=2, seed=3)
    moe2.generation_config.eos_token_id = None
    p = prompt(25, 2)
    (gen,) = generate(moe2, tok, [p])
    (ref,) = generate(dense, tok, [p])
    assert gen.token_ids == ref.token_ids  # the same function: the same greedy tokens
    want = hf_topk(moe2, p + list(gen.token_ids))[len(p) - 1:len(p) + len(gen.token_ids) - 1]
    assert torch.equal(torch.from_numpy(gen.routes.array().copy()).long().sort(-1).values, want)


def test_upcycle_refuses_what_it_cannot_copy_in_one_line():
    moe, _ = make_moe()
    with pytest.raises(ValueError, match="upcycle takes a Llama without biases"):
        upcycle(moe)
    dense, _ = make_dense()
    with pytest.raises(ValueError, match=r"need 1 <= top_k \(3\) <= experts \(2\)"):
        upcycle(dense, experts=2, top_k=3)
