"""benchmarks/gpu.py without a GPU: it says so and exits 0; its model, step comparison and GRPO
run work on the CPU (the same code runs on CUDA)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from looprl.models.tiny import default_model_dir

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu.py"
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2}
"""A narrow Qwen2 for the CPU: the script's code, at a size a test can afford."""


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def test_without_cuda_it_says_so_and_exits_0():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("no CUDA device")


def test_the_model_is_qwen2_shaped_near_the_size_asked(gpu):
    cfg = gpu.qwen2_config(2048, 0.5e9, 1024)
    n = gpu.count_params(cfg)
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 896 and cfg.tie_word_embeddings
    assert abs(n - 0.5e9) < 0.02 * 0.5e9  # one layer is ~3% of it


def test_step_comparison_finds_bf16_and_nothing_between_equals(gpu):
    model, tok = gpu.build_model(default_model_dir("tiny"), 1.0, 256, seed=0, width=SMALL)
    groups = gpu.fixed_groups(len(tok), 2, 2, 12, 8, seed=0)
    cfg = gpu.GRPOConfig(lr=1e-3, experimental=gpu.GRPOExperimental(
        objective=gpu.LossParams(norm_tokens=8)))
    cpu = torch.device("cpu")
    same = gpu.compare_step(model, groups, cfg, cfg, cpu, cpu, "same", tok.pad_token_id)
    assert same.logprob_max_abs == 0.0 and same.loss_a == same.loss_b != 0.0
    assert same.update_cosine == pytest.approx(1.0, abs=1e-6)
    bf16 = gpu.GRPOConfig(lr=1e-3, experimental=gpu.GRPOExperimental(
        objective=gpu.LossParams(norm_tokens=8), autocast_bf16=True))
    low = gpu.compare_step(model, groups, cfg, bf16, cpu, cpu, "bf16", tok.pad_token_id)
    assert 1e-4 < low.logprob_max_abs < 0.5 and low.loss_a != low.loss_b
    assert 0.5 < low.update_cosine < 1.0


def test_a_short_grpo_run_with_the_torch_engine_on_the_cpu(gpu):
    args = gpu.parse_args(["--steps", "2", "--prompts", "2", "--group-size", "2",
                           "--prompt-tokens", "16", "--max-new-tokens", "8",
                           "--kv-budget-mb", "64"])
    model, tok = gpu.build_model(default_model_dir("tiny"), 1.0, 64, seed=0, width=SMALL)
    r = gpu.engine_run("torch", model, tok, torch.device("cpu"), args)
    assert r.engine == "torch" and r.steps == 2 and r.engine_version == 2  # took both updates
    assert r.rollout_tok_s > 0 and r.train_tok_s > 0 and r.peak_mb > 0
