"""make_engine by name, and TorchEngine in bf16 (the fast mode) end to end."""

from __future__ import annotations

import asyncio

import pytest
import torch

from looprl.errors import ConfigError
from looprl.inference import TorchEngine, make_engine
from looprl.protocols import Engine
from looprl.types import SamplingParams

from .conftest import make_tiny


def test_make_engine_torch_from_a_saved_model(tmp_path):
    model, tok = make_tiny("qwen2")
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    engine = make_engine("torch", path=tmp_path, max_len=256)
    try:
        assert isinstance(engine, TorchEngine) and isinstance(engine, Engine)
        g = asyncio.run(engine.generate([5, 6, 7], SamplingParams(max_new_tokens=5, temperature=0.0)))
        assert 1 <= len(g.token_ids) <= 5 and engine.max_len == 256
    finally:
        engine.close()
    with pytest.raises(ConfigError, match="choose one of"):
        make_engine("tgi")


def test_bf16_engine_logprobs_close_to_fp32_forward():
    model, tok = make_tiny("llama")
    bf16 = TorchEngine(make_tiny("llama")[0].to(torch.bfloat16), tok, stop_on_eos=False)
    prompt = list(range(20, 60))
    try:
        b = asyncio.run(bf16.generate(prompt, SamplingParams(max_new_tokens=16, seed=2)))
    finally:
        bf16.close()
    assert len(b.token_ids) == 16 and all(0 <= t < len(tok) for t in b.token_ids)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(b.token_ids)])).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(b.token_ids)[:, None])[:, 0]
    err = (torch.tensor(b.logprobs) - ref).abs()
    assert err.mean() < 0.05, f"bf16 logprobs drift from fp32 by {err.mean():.3f} on average"
