"""Tiny random Llama / Qwen2 models (bytes-only tokenizer) for engine tests: built in ~0.1 s."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from looprl.inference.torch_engine import TorchEngine
from looprl.models.tokenizer import build_tokenizer


def make_tiny(arch: str = "llama", seed: int = 0):
    tok = build_tokenizer(None)
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                  initializer_range=0.1,  # peaky logits: no near-ties to flip greedy argmax
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    model.eval()
    model.generation_config.eos_token_id = None  # HF references run to max_new_tokens
    return model, tok


@pytest.fixture(params=["llama", "qwen2"])
def tiny(request):
    return make_tiny(request.param)


@pytest.fixture
def tiny_llama():
    return make_tiny("llama")


@pytest.fixture
def engine_of():
    """Builds TorchEngines (no stop at EOS unless asked) and closes them after the test."""
    engines = []

    def make(model, tok, **kw):
        kw.setdefault("stop_on_eos", False)
        e = TorchEngine(model, tok, **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()
