"""The default model: trained tokenizer, HF-format files, chat format, pretraining, CLI."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from looprl.commands.model import app
from looprl.errors import ConfigError
from looprl.models.config import SIZES
from looprl.models.pretrain import pretrain
from looprl.models.tiny import chat_examples, init_default_model, model_config


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory):
    return init_default_model(tmp_path_factory.mktemp("m") / "default", size="tiny",
                              corpus_chars=300_000)


def test_saved_in_hf_format_that_transformers_loads(default_dir):
    names = {p.name for p in default_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert json.loads((default_dir / "config.json").read_text())["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(default_dir)
    tok = AutoTokenizer.from_pretrained(default_dir)
    assert model.config.vocab_size == len(tok) == 2048
    assert tok.eos_token == "<|im_end|>"
    out = model.generate(torch.tensor([tok.encode("import os\n")]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == len(tok.encode("import os\n")) + 3 or tok.eos_token_id in out[0].tolist()


def test_tokenizer_is_trained_on_code_and_chat_format(default_dir):
    tok = AutoTokenizer.from_pretrained(default_dir)
    code = "def __init__(self, config):\n        return self.config.get(name)\n"
    assert len(code) / len(tok.encode(code)) > 2.0  # bytes-only would be 1.0
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "src/a.py"}}</tool_call>'
    ids = tok.encode(call)
    assert ids[0] == tok.convert_tokens_to_ids("<tool_call>") and tok.decode(ids) == call
    text = chat_examples(n=1)[0]
    assert tok.decode(tok.encode(text)) == text


def test_sizes_are_llama_shaped_and_checked():
    cfg = model_config("small", 2048, 0, 2)
    assert cfg.hidden_size == SIZES["small"].hidden and cfg.tie_word_embeddings
    with pytest.raises(ConfigError, match="choose one of"):
        model_config("huge", 2048, 0, 2)


@pytest.mark.slow
def test_pretrain_lowers_loss_and_writes_curve(default_dir, tmp_path):
    r = pretrain(default_dir, steps=30, batch=4, seq_len=64, lr=1e-2, corpus_chars=100_000,
                 out_dir=tmp_path / "pre", show_progress=False, num_threads=1)
    assert r.final_loss < r.losses_S[0] - 1.0
    assert r.loss_png.stat().st_size > 1000
    assert (tmp_path / "pre" / "model.safetensors").exists()
    assert json.loads((tmp_path / "pre" / "pretrain.json").read_text())["steps"] == 30


def test_cli_init_creates_a_loadable_model(tmp_path):
    res = CliRunner().invoke(app, ["init", str(tmp_path / "cli"), "--size", "tiny", "--corpus-chars", "200000"])
    assert res.exit_code == 0, res.output
    assert "params" in res.output and (tmp_path / "cli" / "model.safetensors").exists()
    res = CliRunner().invoke(app, ["init", str(tmp_path / "x"), "--size", "gigantic"])
    assert res.exit_code != 0 and "choose one of" in str(res.exception)


def _copy_accuracy(model, seed: int = 1) -> float:
    """Top-1 accuracy on the predictable tokens of random-token spans written three times."""
    import random

    rng, V = random.Random(seed), model.config.vocab_size
    rows, masks = [], []
    for _ in range(8):
        toks, mask = [], []
        while len(toks) < 512:
            n = rng.randint(8, 40)
            span = [rng.randrange(3, V) for _ in range(n)]
            # the first copy and the token after it cannot be predicted; the rest can
            toks += span * 3
            mask += [False] * (n + 1) + [True] * (2 * n - 1)
        rows.append(toks[:512])
        masks.append(mask[:512])
    ids, mask_B_T = torch.tensor(rows), torch.tensor(masks)
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
    hit = logits[:, :-1].argmax(-1) == ids[:, 1:]
    return float(hit[mask_B_T[:, 1:]].float().mean())


@pytest.mark.parametrize("size, floor", [("tiny", 0.7), ("small", 0.9)])
def test_the_planted_copy_circuit_copies_before_any_training(size, floor):
    from transformers import LlamaForCausalLM

    from looprl.models.tiny import plant_copy_circuit

    torch.manual_seed(0)
    plain = LlamaForCausalLM(model_config(size, 2048, 0, 2))
    assert _copy_accuracy(plain) < 0.01
    plant_copy_circuit(plain)
    assert _copy_accuracy(plain) > floor


def test_the_copy_circuit_refuses_a_model_without_room_for_it():
    from transformers import LlamaConfig, LlamaForCausalLM

    from looprl.models.tiny import plant_copy_circuit

    one_layer = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             intermediate_size=64, tie_word_embeddings=True))
    with pytest.raises(ConfigError, match="2\\+ layers"):
        plant_copy_circuit(one_layer)


def test_default_model_dir_is_cached_by_recipe(tmp_path, monkeypatch):
    from looprl.models.tiny import INIT_RECIPE, default_model_dir

    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path))
    monkeypatch.setattr("looprl.models.tiny.init_default_model",
                        lambda out, size, seed: (out.mkdir(parents=True),
                                                 (out / "config.json").write_text("{}")))
    path = default_model_dir("tiny", 3)
    assert path.name == f"default-tiny-seed3-{INIT_RECIPE}" and (path / "config.json").exists()
    assert default_model_dir("tiny", 3) == path  # second call: the cache, no rebuild


def test_numbers_tokenize_one_digit_at_a_time():
    """The same number reads the same in a grep line and in a call's arguments."""
    from looprl.models.tokenizer import build_tokenizer

    tok = build_tokenizer(["x = 1234 + 5678\n" * 50, '{"offset": 248}\n' * 50])
    grep = tok.tokenize("pkg/mod.py:248:def f(")
    call = tok.tokenize('{"offset": 248, "limit": 30}')
    digits = ["2", "4", "8"]
    assert any(grep[i:i + 3] == digits for i in range(len(grep)))
    assert any(call[i:i + 3] == digits for i in range(len(call)))
