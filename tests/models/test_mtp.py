"""MTP heads: saved beside a checkpoint and loaded with it, distilled from the model's own
forward (pretraining, or on its samples), and kept apart from the policy's gradient clip."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.models.loading import load_model, save_model
from looprl.models.mtp import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    attach_heads,
    capture_hidden,
    clip_grad_norms,
    distill_loss,
    heads_of,
    new_heads,
    policy_parameters,
    train_heads,
)
from looprl.models.pretrain import pretrain
from looprl.models.tiny import init_default_model
from tests.inference.conftest import make_tiny


def test_heads_are_saved_beside_the_checkpoint_and_loaded_with_it(tmp_path):
    model, tok = make_tiny("llama")
    heads = attach_heads(model, new_heads(model, 2))
    torch.nn.init.normal_(heads.heads[1].down.weight)  # not the init: the load must restore it
    save_model(model, tok, tmp_path)
    assert {WEIGHTS_FILE, CONFIG_FILE, "model.safetensors"} <= {p.name for p in tmp_path.iterdir()}
    assert not [k for k in load_file(tmp_path / "model.safetensors") if k.startswith("mtp_heads")]
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["num_heads"] == 2

    lm = load_model(tmp_path)
    loaded = heads_of(lm.model)
    assert loaded is not None and loaded.num_heads == 2
    for (k, a), b in zip(heads.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert lm.num_params == sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for p in heads.parameters())  # the language model's size, heads not counted
    assert "mtp_heads.heads.0.proj.weight" in lm.model.state_dict()  # published with the weights

    plain, _ = make_tiny("llama")
    save_model(plain, tok, tmp_path)  # stale heads would not fit the new weights
    assert heads_of(load_model(tmp_path).model) is None and not (tmp_path / WEIGHTS_FILE).exists()


def test_bad_heads_files_say_how_to_fix(tmp_path):
    model, tok = make_tiny("llama")
    attach_heads(model, new_heads(model, 1))
    save_model(model, tok, tmp_path)
    (tmp_path / WEIGHTS_FILE).unlink()
    with pytest.raises(ConfigError, match="save the heads"):
        load_model(tmp_path)
    narrower = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1,
                                            intermediate_size=64))
    with pytest.raises(ConfigError, match="hidden size"):
        attach_heads(narrower, heads_of(model))
    with pytest.raises(ConfigError, match="num_heads"):
        new_heads(model, 0)


def test_capture_reads_what_the_lm_head_reads():
    model, _ = make_tiny("llama")
    x = torch.randint(0, 256, (2, 9))
    with torch.no_grad(), capture_hidden(model) as seen:
        logits = model(input_ids=x).logits
    assert len(seen) == 1 and torch.allclose(model.lm_head(seen[0]), logits)


def test_distillation_teaches_heads_the_models_own_next_distributions():
    model, _ = make_tiny("llama")
    attach_heads(model, new_heads(model, 3))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        seqs = model.generate(torch.randint(0, 256, (24, 4), generator=g), do_sample=True, top_k=None,
                              max_new_tokens=40, pad_token_id=0).tolist()
    train, held = seqs[:16], torch.tensor(seqs[16:])

    def held_out():
        with torch.no_grad(), capture_hidden(model) as seen:
            model(input_ids=held)
            return distill_loss(heads_of(model), model, seen[0], held)

    before = held_out()
    outs = train_heads(model, train, steps=40, positions=256, lr=1e-2)
    after = held_out()
    assert outs[-1].loss < outs[0].loss
    for j in range(3):  # every head moves toward the model's distribution at its depth
        assert after.kl_K[j] < 0.7 * before.kl_K[j]
        assert after.accept_K[j] > before.accept_K[j] + 0.05
    assert not any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy_parameters(model))


def test_heads_gradient_does_not_shrink_the_policys():
    model, _ = make_tiny("llama")
    heads = attach_heads(model, new_heads(model, 1))
    x = torch.randint(0, 256, (2, 8))
    model(input_ids=x, labels=x).loss.backward()
    policy = [p.grad.clone() for p in policy_parameters(model)]
    for p in heads.parameters():
        p.grad = torch.full_like(p, 1e3)  # a huge distillation gradient
    norm = clip_grad_norms(model, max_norm=1e9)  # no clipping of the policy at this cap
    assert all(torch.equal(a, p.grad) for a, p in zip(policy, policy_parameters(model), strict=True))
    assert norm == pytest.approx(float(torch.norm(torch.stack([g.norm() for g in policy]))), rel=1e-5)
    assert float(torch.norm(torch.stack([p.grad.norm() for p in heads.parameters()]))) <= 1e9 + 1
    for p in heads.parameters():
        p.grad = torch.full_like(p, float("nan"))
    clip_grad_norms(model, 1.0)
    assert all(p.grad is None for p in heads.parameters())  # no step on a non-finite gradient


def _held_out_accept(model_dir, heads=None) -> tuple[float, ...]:
    lm = load_model(model_dir)
    if heads is not None:
        attach_heads(lm.model, heads)
    x = torch.tensor([lm.tokenizer.encode("def add(a, b):\n    return a + b\n\n\nclass Config:\n    "
                                          "def __init__(self, path):\n        self.path = path\n")])
    with torch.no_grad(), capture_hidden(lm.model) as seen:
        lm.model(input_ids=x)
        return distill_loss(heads_of(lm.model), lm.model, seen[0], x).accept_K


@pytest.mark.slow
def test_pretraining_distills_heads_and_saves_them(tmp_path):
    d = init_default_model(tmp_path / "m", size="tiny", corpus_chars=200_000)
    r = pretrain(d, steps=60, batch=4, seq_len=64, lr=1e-2, corpus_chars=100_000, out_dir=tmp_path / "pre",
                 show_progress=False, num_threads=1, mtp_heads=2)
    assert len(r.mtp_accept_K) == 2
    assert json.loads((tmp_path / "pre" / "pretrain.json").read_text())["mtp_accept"] == list(r.mtp_accept_K)
    trained = _held_out_accept(tmp_path / "pre")
    torch.manual_seed(0)
    fresh = _held_out_accept(tmp_path / "pre", new_heads(load_model(tmp_path / "pre").model, 2))
    assert len(trained) == 2 and all(t > f + 0.1 for t, f in zip(trained, fresh, strict=True))
