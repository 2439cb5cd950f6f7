"""Tokenizer identity: trajectories and saved models carry the fingerprint of the tokenizer that
made their ids, and training refuses ids another tokenizer made (``looprl.models.fingerprint``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.chat import ChatFormat
from looprl.cli import app as looprl_app
from looprl.errors import ConfigError
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.models.fingerprint import METADATA_KEY, model_fingerprint, tokenizer_fingerprint
from looprl.models.loading import load_model
from looprl.models.tokenizer import build_tokenizer
from looprl.trainer.checkpoint import load_checkpoint, save_checkpoint
from looprl.trainer.config import GRPOConfig
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Task
from tests.harness.dir_sandbox import DirSandbox
from tests.trainer.helpers import group, segment, trajectory

CODE = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n"] * 20


def save_model_dir(path, tok):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def harness_trajectory(tmp_path, tok):
    """A real harness run (scripted turns) with ``tok``'s chat format."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "README.md").write_text("# calc\n")
    task = Task(id="t", repo=str(tmp_path), prompt="Read the README.", grader=Grader("true"))
    turns = ['<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>',
             "Done."]
    return asyncio.run(run_agent(task, DirSandbox(tmp_path), ScriptedPolicy(tok, turns),
                                 ChatFormat(tok), make_tools(["read_file"]), AgentConfig(),
                                 group_id="g", trajectory_id="t0"))


def test_the_fingerprint_tells_tokenizers_apart():
    byte, again, bpe = build_tokenizer(None), build_tokenizer(None), build_tokenizer(CODE, 300)
    assert tokenizer_fingerprint(byte) == tokenizer_fingerprint(again)  # same definition
    assert tokenizer_fingerprint(byte) != tokenizer_fingerprint(bpe)
    templated = build_tokenizer(None)
    templated.chat_template = templated.chat_template.replace("system", "System")
    assert tokenizer_fingerprint(templated) != tokenizer_fingerprint(byte)  # other prompts


def test_trajectories_and_saved_models_carry_it(tmp_path):
    tok = build_tokenizer(None)
    traj = harness_trajectory(tmp_path / "repo", tok)
    assert traj.metadata[METADATA_KEY] == tokenizer_fingerprint(tok)
    assert json.loads(traj.to_json())["metadata"][METADATA_KEY] == tokenizer_fingerprint(tok)
    lm = load_model(save_model_dir(tmp_path / "m", tok))
    assert model_fingerprint(lm.model) == tokenizer_fingerprint(tok)
    lm.model.save_pretrained(tmp_path / "copy")
    saved = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert saved["looprl_tokenizer"] == tokenizer_fingerprint(tok)


def test_sft_refuses_byte_ids_for_a_bpe_model(tmp_path):
    """The issue's case: SFT of a BPE model on trajectories the byte tokenizer made."""
    from typer.testing import CliRunner

    data = tmp_path / "byte.jsonl"
    data.write_text(harness_trajectory(tmp_path / "repo", build_tokenizer(None)).to_json() + "\n")
    bpe_model = save_model_dir(tmp_path / "bpe", build_tokenizer(CODE, 300))
    runner = CliRunner()
    r = runner.invoke(looprl_app, ["trainer", "sft", str(bpe_model), str(data), "--out",
                                   str(tmp_path / "out"), "-o", "experimental.progress=false"])
    assert r.exit_code == 2, r.output
    assert "was tokenized by tokenizer sha256:" in r.output and "model's tokenizer is" in r.output
    assert not (tmp_path / "out").exists()
    byte_model = save_model_dir(tmp_path / "byte", build_tokenizer(None))
    r = runner.invoke(looprl_app, ["trainer", "sft", str(byte_model), str(data), "--out",
                                   str(tmp_path / "out"), "-o", "experimental.progress=false"])
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["looprl_tokenizer"] == tokenizer_fingerprint(build_tokenizer(None))


def test_the_grpo_step_and_resume_refuse_another_tokenizer(tmp_path):
    lm = load_model(save_model_dir(tmp_path / "m", build_tokenizer(None)))
    step = GRPOStep(lm.model, GRPOConfig(), pad_id=0)
    trajs = [trajectory([segment([1, 2, 3], [40 + i, 41])], float(i)) for i in range(2)]
    stamped = [dataclasses.replace(t, metadata={METADATA_KEY: "sha256:0123456789abcdef"})
               for t in trajs]
    with pytest.raises(ConfigError, match="GRPO step: trajectory .* tokenized by tokenizer "
                                          "sha256:0123456789abcdef"):
        step.on_groups([group(stamped)])
    huge = [trajectory([segment([1, 2, 3], [5000, 41])], float(i)) for i in range(2)]
    with pytest.raises(ConfigError, match="token id 5000, beyond the model's vocabulary"):
        step.on_groups([group(huge)])
    step.on_groups([group(trajs)])  # unstamped and in range: trained
    ckpt = save_checkpoint(tmp_path / "ckpt", 1, lm.model, step.optimizer)
    other = load_model(save_model_dir(tmp_path / "bpe", build_tokenizer(CODE, 300)))
    with pytest.raises(ConfigError, match="trained with tokenizer sha256:"):
        load_checkpoint(ckpt, other.model)
