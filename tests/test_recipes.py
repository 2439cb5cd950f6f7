"""The teaching recipe ``recipes/grpo_minimal.py`` stays runnable: its GRPO update moves the policy
toward the rewarded completion, and the whole loop runs end to end on the offline fixture task."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from looprl.types import Group
from tests.trainer.helpers import group, segment, tiny_llama, trajectory

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "grpo_minimal.py"


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_minimal", RECIPE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grpo_minimal"] = mod  # dataclasses look their module up while building Config
    spec.loader.exec_module(mod)
    return mod


def _completion_logprob(model, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    return float(lp[len(prompt) - 1:].sum())


def test_update_raises_the_rewarded_completion_and_lowers_the_other():
    recipe = _recipe()
    model = tiny_llama()
    prompt, good, bad = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    good_before = _completion_logprob(model, prompt, good)
    bad_before = _completion_logprob(model, prompt, bad)
    groups: list[Group] = [group([trajectory([segment(prompt, good, good_before / 4)], 1.0),
                                  trajectory([segment(prompt, bad, bad_before / 4)], 0.0)])]
    cfg = recipe.Config(lr=1e-2, max_turns=1, max_new_tokens=4)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    for _ in range(3):
        out = recipe.grpo_update(model, opt, groups, cfg, pad_id=0)
    assert out["tokens"] == 8 and out["zero_variance_groups"] == 0
    assert _completion_logprob(model, prompt, good) > good_before + 0.5
    assert _completion_logprob(model, prompt, bad) < bad_before - 0.5


def test_update_skips_a_group_with_equal_rewards():
    recipe = _recipe()
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    same = [group([trajectory([segment([1, 2], [3, 4])], 0.5), trajectory([segment([1, 2], [5, 6])], 0.5)])]
    out = recipe.grpo_update(model, torch.optim.AdamW(model.parameters(), lr=1e-2), same,
                             recipe.Config(), pad_id=0)
    assert out["tokens"] == 0 and out["zero_variance_groups"] == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.needs_bwrap
@pytest.mark.slow
def test_recipe_runs_two_steps_on_the_fixture_task(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    model_dir = tmp_path / "model"
    from looprl.models.tiny import init_default_model
    init_default_model(model_dir, size="tiny", corpus_chars=50_000, vocab_size=512)
    recipe = _recipe()
    history = recipe.main(["--tasks", "fixture", "--model", str(model_dir), "--steps", "2",
                           "--tasks-per-step", "1", "--group-size", "3", "--max-turns", "2",
                           "--max-new-tokens", "24"])
    assert [r["step"] for r in history] == [1, 2]
    for r in history:
        assert r["infra_errors"] == 0
        assert math.isfinite(r["reward"]) and 0.0 <= r["pass_rate"] <= 1.0
        assert r["output_tokens"] > 0  # the engine really sampled
        assert r["tokens"] > 0 or r["zero_variance_groups"] == 1
    out = capsys.readouterr().out
    assert "step   1 | reward" in out and "step   2 | reward" in out
