"""TorchEngine runs where the model's weights are: the cache and every tensor a forward makes live
on the model's device, and a CUDA engine decodes the CPU engine's greedy tokens."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from looprl.inference.kv_forward import CachedForward
from looprl.inference.torch_engine import TorchEngine
from looprl.types import SamplingParams

from .conftest import make_tiny
from .test_spec_decode import prompt, with_heads

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.mark.parametrize("device", DEVICES)
def test_cached_forward_keeps_every_tensor_on_the_models_device(device):
    model, _ = make_tiny("qwen2")  # q|k|v biases: the fused bias is checked too
    fwd = CachedForward(model.to(torch.device(device)), num_slots=3, max_len=64)
    assert fwd.device.type == device
    first = fwd.prefill(prompt(10, 0), slot=2, start=0)
    for row in (0, 1):
        fwd.copy_slot(2, row, 10)
    # two rows sharing slot 2's first 9 positions, two tokens each: cascade attention, T > 1
    step = fwd.decode([[5, 6], [7, 8]], [10, 10], prefix_B=[(2, 9), (2, 9)])
    made = [*fwd.k_L, *fwd.v_L, *fwd.wqkv_L, *fwd.bqkv_L, *fwd.wgu_L,
            first.logits_B_T_V, first.hidden_B_T_H, step.logits_B_T_V, step.hidden_B_T_H]
    assert {t.device.type for t in made} == {device}


def greedy_rollouts(engine: TorchEngine, new_weights: dict[str, torch.Tensor]) -> list:
    """Three rollouts of one group, two turns each, then a weight update and one more round."""
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    p = prompt(60, 1)

    async def one(i: int, round_: int):
        sid = f"t{round_}.{i}"
        t1 = await engine.generate(p, params, session_id=sid, group_id=f"g{round_}")
        ctx = p + list(t1.token_ids) + prompt(5 + 3 * i, 10 + i)
        t2 = await engine.generate(ctx, params, session_id=sid, group_id=f"g{round_}")
        return t1, t2

    async def main():
        out = await asyncio.gather(*[one(i, 0) for i in range(3)])
        await engine.update_weights(new_weights, version=1)  # CPU tensors into the engine's model
        return out + list(await asyncio.gather(*[one(i, 1) for i in range(3)]))

    try:
        return [g for pair in asyncio.run(main()) for g in pair]
    finally:
        engine.close()


@needs_cuda
@pytest.mark.parametrize("speculative", ["off", "on"])
def test_cuda_engine_decodes_the_cpu_engines_greedy_tokens(speculative):
    model, tok = with_heads("llama", steps=20)
    new_weights = make_tiny("llama", seed=1)[0].state_dict()  # main weights only: the heads stay
    kw = dict(stop_on_eos=False, speculative=speculative)
    on_cuda = TorchEngine(copy.deepcopy(model).to("cuda"), tok, **kw)
    assert on_cuda.fwd.device.type == "cuda"
    got = greedy_rollouts(on_cuda, new_weights)
    ref = greedy_rollouts(TorchEngine(model, tok, **kw), new_weights)
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids == b.token_ids and a.policy_versions == b.policy_versions
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
