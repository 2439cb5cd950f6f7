"""LoRA RL: the adapter the trainer steps is what the rollout engine serves (``models.lora``)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.inference.torch_engine import TorchEngine
from looprl.models.config import LoraExperimental, LoraSettings
from looprl.models.lora import ADAPTER_DIR, merged_state_dict, save_merged, with_lora
from looprl.models.tokenizer import build_tokenizer
from looprl.trainer import ddp
from looprl.trainer.config import GRPOConfig
from looprl.trainer.step import GRPOStep, token_logprobs
from looprl.types import SamplingParams
from looprl.weights.store import LocalWeightStore
from tests.trainer.helpers import group, segment, trajectory

PROMPT = [5, 6, 7, 8, 9, 10]
RANK8 = LoraSettings(rank=8)


def tiny(seed: int = 0) -> tuple[LlamaForCausalLM, object]:
    tok = build_tokenizer(None)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval(), tok


def logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    t = torch.tensor([ids])
    with torch.no_grad():
        return token_logprobs(model.eval(), t, torch.ones_like(t))[0]


def one_step(policy: torch.nn.Module) -> GRPOStep:
    """One GRPO step on a group whose two completions got rewards 1 and 0 (an lr large enough
    that the adapter's effect stands far above float round-off)."""
    good, bad = PROMPT + [20, 21, 22, 23], PROMPT + [30, 31, 32, 33]
    trajs = [trajectory([segment(PROMPT, ids[len(PROMPT):], float(logprobs(policy, ids)[-1]))], r)
             for ids, r in ((good, 1.0), (bad, 0.0))]
    step = GRPOStep(policy, GRPOConfig(lr=1e-2))
    assert step.on_groups([group(trajs)]).updates == 1
    return step


def test_after_one_lora_step_the_engine_serves_the_adapter(tmp_path):
    """The failure this guards: an adapter that never reaches the engine (its weights keep the
    base model's, and its samples "look stale"). After one step and a sync through the weight
    store, the engine holds the merged weights and its logprobs equal the trainer's (with the
    adapter), and differ from the base model's."""
    base, tok = tiny()
    untouched = copy.deepcopy(base)
    engine = TorchEngine(copy.deepcopy(base), tok, stop_on_eos=False, num_threads=1,
                         kv_budget_mb=16, max_slots=4)
    policy = with_lora(base, RANK8)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable), "only the adapter trains"
    step = one_step(policy)
    store = LocalWeightStore(str(tmp_path / "w"), dtype="float32")
    store.publish(step.sharding.state_dict(), 1)

    async def sync_and_sample():
        try:
            await engine.update_weights(store.fetch(1), 1)
            return await engine.generate(PROMPT, SamplingParams(max_new_tokens=16, seed=0))
        finally:
            engine.close()

    gen = asyncio.run(sync_and_sample())
    merged = merged_state_dict(policy)
    served = engine.model.state_dict()
    assert served.keys() == merged.keys() == untouched.state_dict().keys()
    assert all(torch.equal(served[k], merged[k]) for k in merged)
    ids = PROMPT + list(gen.token_ids)
    got = torch.tensor(gen.logprobs)
    assert gen.policy_versions == (1,) * len(gen.token_ids)
    trainer = logprobs(policy, ids)[len(PROMPT):]
    assert torch.allclose(got, trainer, atol=1e-4), (got - trainer).abs().max()
    without = logprobs(untouched, ids)[len(PROMPT):]
    assert (got - without).abs().max() > 1e-2, "the step must move the served policy"


def test_lora_sync_is_a_delta_whose_untargeted_tensors_are_unchanged(tmp_path):
    """Untargeted tensors (embeddings, norms) sync as all-zero deltas; the adapted layers'
    merged weights change and rebuild bit-exactly."""
    policy = with_lora(tiny()[0], RANK8)
    store = LocalWeightStore(str(tmp_path / "w"), dtype="float32")
    store.publish(merged_state_dict(policy), 0)
    before = {k: v.clone() for k, v in merged_state_dict(policy).items()}
    step = one_step(policy)
    store.publish(step.sharding.state_dict(), 1)
    m = json.loads((tmp_path / "w" / "v0000000001" / "manifest.json").read_text())
    assert m["kind"] == "delta" and m["parent"] == 0
    after = merged_state_dict(policy)
    entries = {e["name"]: e for e in m["tensors"] if "alias" not in e}
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)
    for name in set(entries) - changed:  # a zstd frame of zeros: a few dozen bytes
        assert entries[name]["delta"] and entries[name]["length"] < 100, name
    assert max(entries[k]["length"] for k in changed) > 1000
    fetched = store.fetch(1)
    assert all(torch.equal(fetched[k], after[k]) for k in after)


def test_rank_0_leaves_the_model_as_it_is():
    model = tiny()[0]
    assert with_lora(model, LoraSettings()) is model
    sd = model.state_dict()
    assert merged_state_dict(model).keys() == sd.keys()


def test_saved_lora_model_is_merged_with_its_adapter_beside_it(tmp_path):
    from peft import PeftModel

    from looprl.models.loading import load_model

    base, tok = tiny()
    policy = with_lora(base, RANK8)
    one_step(policy)
    out = save_merged(policy, tok, tmp_path / "model_rl")
    assert (out / ADAPTER_DIR / "adapter_config.json").is_file()
    ids = PROMPT + [40, 41, 42]
    want = logprobs(policy, ids)
    assert torch.allclose(logprobs(load_model(out).model, ids), want, atol=1e-5)
    # PEFT reads the adapter back onto a fresh base model: the same policy
    again = PeftModel.from_pretrained(tiny()[0], str(out / ADAPTER_DIR))
    assert torch.allclose(logprobs(again, ids), want, atol=1e-5)


def test_targets_that_match_nothing_say_what_can_be_adapted():
    bad = LoraSettings(rank=4, experimental=LoraExperimental(target_modules=["qkv"]))
    with pytest.raises(ConfigError, match=r"target_modules=\['qkv'\].*q_proj.*all-linear"):
        with_lora(tiny()[0], bad)


def test_an_adapted_embedding_merges_and_a_tied_one_is_refused():
    model, _ = tiny()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    targets = LoraExperimental(target_modules=["embed_tokens", "q_proj"])
    policy = with_lora(model, LoraSettings(rank=4, experimental=targets))
    for p in (p for n, p in policy.named_parameters() if "lora_embedding_B" in n or "lora_B" in n):
        torch.nn.init.normal_(p, std=0.1)  # a trained adapter: B is no longer 0
    plain = tiny()[0]
    plain.config.tie_word_embeddings = False
    plain.lm_head.weight = torch.nn.Parameter(plain.lm_head.weight.detach().clone())
    plain.load_state_dict(merged_state_dict(policy))
    ids = PROMPT + [40, 41, 42]
    assert torch.allclose(logprobs(plain, ids), logprobs(policy, ids), atol=1e-5)
    with pytest.raises(ConfigError, match="ties to its output head"):
        with_lora(tiny()[0], LoraSettings(rank=4, experimental=targets))


def test_fsdp_refuses_lora_in_one_line():
    two = ddp.DistInfo(0, 2, 0)
    with pytest.raises(ConfigError, match="parallel=ddp"):
        ddp.Sharding(with_lora(tiny()[0], RANK8), two, "fsdp")
    ddp.check_lora_parallel(True, two, "ddp")  # DDP takes it
    ddp.check_lora_parallel(True, ddp.ONE_PROCESS, "fsdp")  # one process ignores parallel


def test_lora_with_mtp_heads_is_refused_at_load():
    from looprl.config import load_config
    from looprl.train.config import TrainConfig

    with pytest.raises(ConfigError, match="mtp_heads"):
        load_config(TrainConfig, None, ["model.lora.rank=8", "model.experimental.mtp_heads=2",
                                        "model.experimental.pretrain_steps=10"])
    cfg = load_config(TrainConfig, None, ["model.lora.rank=8",
                                          "model.lora.experimental.target_modules=q_proj,v_proj"])
    assert cfg.model.lora.rank == 8 and cfg.model.lora.experimental.target_modules == ["q_proj", "v_proj"]
