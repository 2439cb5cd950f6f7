"""Every shipped config loads into its typed config, and the CLI lists every command."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from looprl.cli import SUBCOMMANDS, app
from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.train import TrainConfig

LOOP_CONFIGS = ("realtime.toml",)
"""Configs of ``looprl feedback loop`` (``RealtimeConfig``); the others are ``looprl train``'s."""
CONFIGS = sorted(p for p in (Path(__file__).parent.parent / "configs").glob("*.toml")
                 if p.name not in LOOP_CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(TrainConfig, path, ["loop.max_minutes=1"])
    assert cfg.loop.max_minutes == 1.0 and (cfg.tasks.train_packages or cfg.tasks.train_file)
    assert cfg.grpo.std_norm == "never"  # Composer's choice: no std normalisation


@pytest.mark.parametrize("name", LOOP_CONFIGS)
def test_shipped_loop_configs_load(name):
    from looprl.feedback.realtime_config import RealtimeConfig

    cfg = load_config(RealtimeConfig, Path(__file__).parent.parent / "configs" / name,
                      ["cycles=1"])
    assert cfg.cycles == 1 and cfg.users.tasks and cfg.grpo.std_norm == "never"


def test_unknown_key_in_a_config_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop]\nmax_minute = 3\n")
    with pytest.raises(ConfigError, match=r"loop.max_minute.*valid keys under loop"):
        load_config(TrainConfig, bad)


def test_help_lists_every_command():
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for name, _, _ in SUBCOMMANDS:
        assert name in out
    assert "quickstart" in out and "train" in out


@pytest.mark.parametrize("override", [["model.drills=2", "model.pretrain_steps=0"],
                                      ["model.drills=-1", "model.pretrain_steps=10"]])
def test_drills_without_pretraining_are_refused_at_load(override):
    with pytest.raises(ConfigError, match="model.drills"):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)


@pytest.mark.parametrize("override,says", [
    (["model.mtp_heads=2", "model.pretrain_steps=0"], "model.mtp_heads"),
    (["model.mtp_heads=-1"], "model.mtp_heads"),
    (["model.speculative=always"], "model.speculative must be one of auto, off, on"),
    (["model.lookup=-2"], "model.lookup .* must be >= 0"),
    (["model.lookup=4", "model.engine=vllm"], "model.lookup drafts in the torch engine only"),
    (["model.lookup=4", "fleet.backend=ray"], "model.lookup drafts in this process's torch engine")])
def test_mtp_and_speculation_settings_are_checked_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)
    ok = load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"),
                     ["model.mtp_heads=2", "model.speculative=off", "model.lookup=6"])
    assert (ok.model.mtp_heads, ok.model.speculative, ok.model.lookup) == (2, "off", 6)


@pytest.mark.parametrize("override,says", [
    (["demos.slips=1.5"], "demos.slips must be a share in \\[0, 1\\]"),
    (["demos.renamed=-0.1"], "demos.renamed must be a share in \\[0, 1\\]"),
    (["sft.schedule=linear"], "sft.schedule must be one of constant, cosine")])
def test_sft_data_and_schedule_settings_are_checked_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)
