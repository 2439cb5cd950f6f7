"""``model.start``: where ``looprl train`` starts (``looprl.train.start``), on a real tiny
default model saved where a quickstart run leaves its models."""

import shutil
from pathlib import Path

import pytest
import torch

from looprl.config import FieldError, load_config, save_config
from looprl.errors import ConfigError
from looprl.models.loading import load_model
from looprl.models.tiny import init_default_model
from looprl.rundir import RunDir
from looprl.train import TrainConfig
from looprl.train.run import _start_model
from looprl.train.start import QUICKSTART_RUN, ModelStart, demos_config, resolve_start
from looprl.train.tasks import TaskSets

CONFIGS = Path(__file__).parent.parent / "configs"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return init_default_model(tmp_path_factory.mktemp("m") / "tiny", size="tiny",
                              corpus_chars=200_000)


def _cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["name=mine", "tasks.train_file=t.jsonl",
                                           "model.size=tiny", *overrides])


def _quickstart(runs, ckpt, *models: str) -> RunDir:
    rd = RunDir(runs / QUICKSTART_RUN)
    rd.root.mkdir(parents=True)
    save_config(_cfg(), rd.config)  # a run directory holds its run's config.json
    for m in models:
        shutil.copytree(ckpt, rd.root / m)
    return rd


def test_auto_starts_from_the_quickstarts_rl_model_or_its_sft_model_before_rl(tmp_path, tiny_ckpt):
    runs = tmp_path / "runs"
    rd = _quickstart(runs, tiny_ckpt, "model_start")
    assert resolve_start(_cfg("model.start=auto"), runs) == ModelStart("quickstart", rd.model_start)
    shutil.copytree(tiny_ckpt, rd.model_rl)
    for start in ("auto", "quickstart"):
        assert resolve_start(_cfg(f"model.start={start}"), runs) == \
            ModelStart("quickstart", rd.model_rl)


def test_a_named_run_or_checkpoint_directory_is_a_start(tmp_path, tiny_ckpt):
    runs = tmp_path / "runs"
    rd = _quickstart(runs, tiny_ckpt, "model_rl")
    assert resolve_start(_cfg(f"model.start={rd.root}"), tmp_path) == ModelStart("dir", rd.model_rl)
    assert resolve_start(_cfg(f"model.start={tiny_ckpt}"), runs) == ModelStart("dir", tiny_ckpt)


def test_auto_without_a_quickstart_model_is_scratch_and_says_how_to_get_one(tmp_path, capsys):
    assert resolve_start(_cfg("model.start=auto"), tmp_path / "runs") == ModelStart("scratch", None)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(lines) == 1 and "from scratch" in lines[0] and "`make quickstart`" in lines[0]
    with pytest.raises(ConfigError, match=r"^model.start=quickstart: .* holds no model yet; run "
                       r"`make quickstart` first"):
        resolve_start(_cfg("model.start=quickstart"), tmp_path / "runs")


def test_a_start_that_is_no_model_is_one_line_saying_what_to_give(tmp_path, tiny_ckpt):
    half = RunDir(tmp_path / "half")  # a model_rl/ without a checkpoint in it is no model
    half.model_rl.mkdir(parents=True)
    save_config(_cfg(), half.config)
    for where, says in ((tmp_path / "missing", "no such directory"),
                        (half.root, "holds no model")):
        with pytest.raises(ConfigError, match=f"^model.start={where}:? .*{says}") as e:
            resolve_start(_cfg(f"model.start={where}"), tmp_path / "runs")
        assert "\n" not in str(e.value)
    # a checkpoint of another size than the config's: the size to set
    with pytest.raises(ConfigError, match=r"is not a model.size=small default model .*; set "
                       r"model.size=tiny"):
        resolve_start(_cfg(f"model.start={tiny_ckpt}", "model.size=small"), tmp_path)
    with pytest.raises(ConfigError, match="carries no MTP heads"):
        resolve_start(_cfg(f"model.start={tiny_ckpt}", "model.experimental.pretrain_steps=1",
                           "model.experimental.mtp_heads=1"), tmp_path)
    broken = tmp_path / "notok"
    shutil.copytree(tiny_ckpt, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="has no tokenizer with a chat template"):
        resolve_start(_cfg(f"model.start={broken}"), tmp_path)


def test_model_start_is_checked_at_load():
    with pytest.raises(FieldError, match=r"^model.start is empty"):
        _cfg("model.start= ")
    with pytest.raises(FieldError, match=r"^model.start is 'quickstart': it starts the default model, "
                       r"but model.path trains its own"):
        _cfg("model.start=quickstart", "model.path=some/dir")
    assert _cfg().model.start == "scratch"  # the quickstart itself starts from scratch
    assert load_config(TrainConfig, CONFIGS / "train_cpu.toml").model.start == "auto"
    assert load_config(TrainConfig, CONFIGS / "quickstart.toml").name == QUICKSTART_RUN


def test_a_checkpoint_start_skips_pretraining_and_synthetic_demos_and_is_recorded(tmp_path,
                                                                                   tiny_ckpt):
    runs = tmp_path / "runs"
    rd = _quickstart(runs, tiny_ckpt, "model_rl")
    cfg = _cfg("model.start=auto", "model.experimental.pretrain_steps=5", "demos.synthetic=7")
    origin = resolve_start(cfg, runs)
    assert demos_config(cfg, origin).demos.synthetic == 0
    assert demos_config(cfg, ModelStart("scratch", None)) is cfg
    mine = RunDir(runs / cfg.name)
    mine.root.mkdir()
    cfg = demos_config(cfg, origin)  # no demos at all: no oracle, none synthetic: no SFT
    start = _start_model(cfg, mine.root, TaskSets([], [], []), torch.device("cpu"), origin)
    assert start.origin == origin and start.sft is None and not mine.model_init.exists()
    a, b = load_model(rd.model_rl).model.state_dict(), load_model(mine.model_start).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # not pretrained: RL starts from it as it is
    again = _start_model(cfg, mine.root, TaskSets([], [], []), torch.device("cpu"), None)
    assert again.origin == origin  # --resume reads it from start.json
