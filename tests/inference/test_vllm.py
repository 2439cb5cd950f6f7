"""VLLMEngine on a GPU machine with vLLM installed (skipped elsewhere: vLLM has no CPU wheel)."""

from __future__ import annotations

import asyncio

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("vLLM needs a CUDA GPU", allow_module_level=True)

from looprl.inference.vllm_engine import VLLMEngine  # noqa: E402
from looprl.models.tiny import init_default_model  # noqa: E402
from looprl.types import SamplingParams  # noqa: E402


def test_vllm_greedy_matches_hf_and_takes_weights(tmp_path):
    from transformers import AutoModelForCausalLM
    path = init_default_model(tmp_path / "m", size="tiny", corpus_chars=200_000)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = list(range(10, 60))

    async def main():
        engine = VLLMEngine(str(path), dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
        g = await engine.generate(ids, SamplingParams(max_new_tokens=16, temperature=0.0))
        sd = {k: v * 1.1 for k, v in model.state_dict().items() if "mlp" in k}
        await engine.update_weights(sd, version=2)
        g2 = await engine.generate(ids, SamplingParams(max_new_tokens=4, temperature=0.0))
        engine.close()
        return g, g2

    g, g2 = asyncio.run(main())
    ref = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, 50:].tolist()
    assert list(g.token_ids)[:len(ref)] == ref[:len(g.token_ids)]
    assert g2.policy_versions == (2,) * len(g2.token_ids)
