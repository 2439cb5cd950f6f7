"""load_model on tiny random Llama and Qwen2 checkpoints saved in HF format (no hub)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from looprl.errors import ConfigError
from looprl.models.loading import load_model
from looprl.models.tokenizer import build_tokenizer


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_load_saved_checkpoint_roundtrips(tmp_path, arch):
    tok = build_tokenizer(None)
    kw = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, intermediate_size=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**kw)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()

    lm = load_model(tmp_path, dtype="float32")
    assert lm.model.config.model_type == arch and not lm.model.training
    ids = torch.tensor([tok.encode("def f(x): return x")])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, model.eval()(ids).logits)
    msgs = [{"role": "user", "content": "hi"}]
    assert lm.tokenizer.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)

    bf = load_model(tmp_path, dtype="bf16")
    assert next(bf.model.parameters()).dtype == torch.bfloat16


def test_missing_model_and_bad_dtype_say_how_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="looprl model init"):
        load_model(tmp_path / "nothing")
    with pytest.raises(ConfigError) as run_ckpt:  # a run's checkpoint: never re-made untrained
        load_model(tmp_path / "runs" / "r" / "model_start")
    assert "model init" not in str(run_ckpt.value) and "save_pretrained" in str(run_ckpt.value)
    from looprl.models.loading import no_model_message

    assert f"resolved against {Path.cwd()}" in no_model_message(Path("runs/r/model_start"))
    with pytest.raises(ConfigError, match="use one of"):
        load_model(tmp_path, dtype="float8")
