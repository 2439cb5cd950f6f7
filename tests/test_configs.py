"""Every shipped config loads into its typed config, and the CLI lists every command."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from looprl.cli import SUBCOMMANDS, app
from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.quickstart import QuickstartConfig

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(QuickstartConfig, path, ["loop.max_minutes=1"])
    assert cfg.loop.max_minutes == 1.0 and cfg.tasks.train_packages
    assert cfg.grpo.std_norm == "never"  # Composer's choice: no std normalisation


def test_unknown_key_in_a_config_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop]\nmax_minute = 3\n")
    with pytest.raises(ConfigError, match=r"loop.max_minute.*valid keys under loop"):
        load_config(QuickstartConfig, bad)


def test_help_lists_every_command():
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for name, _, _ in SUBCOMMANDS:
        assert name in out
    assert "quickstart" in out


@pytest.mark.parametrize("override", [["model.drills=2", "model.pretrain_steps=0"],
                                      ["model.drills=-1", "model.pretrain_steps=10"]])
def test_drills_without_pretraining_are_refused_before_any_work(tmp_path, override):
    from looprl.quickstart import run

    cfg = load_config(QuickstartConfig, CONFIGS[0].with_name("quickstart.toml"), override)
    with pytest.raises(ConfigError, match="model.drills"):
        run(cfg, runs_root=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing built, nothing written
