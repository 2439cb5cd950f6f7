import os
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from looprl.errors import ConfigError
from looprl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

from .helpers import tiny_llama


@dataclass(frozen=True)
class Cfg:
    lr: float = 0.01
    name: str = "run"


def trained():
    model = tiny_llama(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 64, (2, 8))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    return model, opt


def test_round_trip_restores_model_optimizer_rngs_and_positions(tmp_path):
    model, opt = trained()
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    path = save_checkpoint(tmp_path, 7, model, opt, sampler_state={"next": 42, "epoch": 1},
                           weight_version=5, config=Cfg())
    after_save = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    fresh = tiny_llama(seed=2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    r = load_checkpoint(latest_checkpoint(tmp_path), fresh, fresh_opt)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == after_save
    assert r.path == path and r.step == 7 and r.weight_version == 5
    assert r.sampler_state == {"next": 42, "epoch": 1} and r.config == {"lr": 0.01, "name": "run"}
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)


def test_latest_skips_interrupted_saves_and_keep_prunes(tmp_path):
    model, opt = trained()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, opt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]
    (tmp_path / ".tmp-step_00000005-999").mkdir()  # killed mid-save
    (tmp_path / "step_00000006").mkdir()  # no meta.json: not complete
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    assert not (tmp_path / ".tmp-step_00000005-999").exists()
    assert latest_checkpoint(tmp_path / "none") is None
    with pytest.raises(ConfigError, match="latest_checkpoint"):
        load_checkpoint(tmp_path / "step_00000006", model)


def test_wrong_model_is_a_clear_error(tmp_path):
    model, opt = trained()
    path = save_checkpoint(tmp_path, 1, model, opt)
    from transformers import LlamaConfig, LlamaForCausalLM
    other = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2))
    with pytest.raises(ConfigError, match="does not fit"):
        load_checkpoint(path, other)


def test_a_resave_killed_between_its_renames_keeps_the_old_checkpoint(tmp_path):
    model, opt = trained()
    save_checkpoint(tmp_path, 2, model, opt, sampler_state={"next": 2})
    os.replace(tmp_path / "step_00000002", tmp_path / ".replaced-step_00000002")  # killed here
    (tmp_path / ".tmp-step_00000002-999").mkdir()
    path = latest_checkpoint(tmp_path)
    assert path.name == "step_00000002"
    assert load_checkpoint(path, tiny_llama(seed=2)).sampler_state == {"next": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002"]
    save_checkpoint(tmp_path, 2, model, opt, sampler_state={"next": 3})  # a completed re-save
    assert load_checkpoint(latest_checkpoint(tmp_path), model).sampler_state == {"next": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002"]


def test_a_running_loop_keeps_three_checkpoints_and_a_finished_one_keeps_the_newest(tmp_path):
    # retention: the newest 3 while the loop runs (a model's size each, 14 MB for the
    # quickstart's 3.5M), only the newest once the run is over; resume reads that one
    from looprl.trainer.config import GRPOConfig, LoopConfig
    from looprl.trainer.grpo import GRPOLoop
    from looprl.trainer.sampler import TaskSampler
    from looprl.trainer.step import GRPOStep

    def loop() -> GRPOLoop:
        return GRPOLoop(GRPOStep(tiny_llama(seed=1), GRPOConfig()), None, None,  # type: ignore[arg-type]
                        TaskSampler([]), LoopConfig(loggers=()), run_dir=tmp_path / "run")

    running = loop()
    for step in (1, 2, 3, 4):
        running.stats.steps = step
        running.checkpoint()
    ckpt = tmp_path / "run" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step_0000000{s}" for s in (2, 3, 4)]
    running.stats.steps = 5
    running.checkpoint(keep=1)  # what ``looprl train`` does after the loop's last step
    assert [p.name for p in ckpt.iterdir()] == ["step_00000005"]
    resumed = loop().resume()
    assert resumed is not None and resumed.step == 5
