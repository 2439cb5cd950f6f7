"""Every shipped config loads into its typed config and reads as a recipe; a newcomer reads at
most 41 fields; the CLI lists every command."""

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from looprl.cli import SUBCOMMANDS, app
from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.train import TrainConfig
from tests.config_leaves import leaves

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


@pytest.mark.parametrize("old,new", [
    ("grpo.negative_advantage_scale", "grpo.experimental.credit.negative_advantage_scale"),
    ("grpo.kl_coef", "grpo.experimental.objective.kl_coef"),
    ("tasks.max_heldout", "tasks.experimental.max_heldout"),
    ("rollout.agent.max_summaries", "rollout.agent.experimental.max_summaries")])
def test_a_key_that_moved_into_a_section_names_where_it_is_now(old, new):
    with pytest.raises(ConfigError, match=f"unknown config key.*{old}.*did you mean {new}\\?"):
        load_config(TrainConfig, None, [f"{old}=1"])


def test_a_retired_key_says_what_to_do_instead():
    with pytest.raises(ConfigError, match=r"^config key loop.seed was removed: .*top-level `seed`"):
        load_config(TrainConfig, None, ["loop.seed=3"])


def test_an_old_real_time_config_names_where_its_keys_are_now(tmp_path):
    from looprl.feedback.realtime_config import RealtimeConfig

    old = tmp_path / "old.toml"  # the [grpo] table of realtime.toml before the sections
    old.write_text('model = "m"\n[users]\ntasks = "t.jsonl"\n[grpo]\nlr = 3e-4\n'
                   "negative_advantage_scale = 0.0\n")
    with pytest.raises(ConfigError, match=r"grpo.negative_advantage_scale.*did you mean "
                                          r"grpo.experimental.credit.negative_advantage_scale\?"):
        load_config(RealtimeConfig, old)


def test_configs_built_from_cli_flags_check_the_same_ranges():
    """``looprl feedback simulate`` and ``feedback cycle`` build their configs from flags, not
    through ``from_dict``: the declared ranges hold there too."""
    from looprl.config import FieldError
    from looprl.feedback.cycle import CycleConfig
    from looprl.feedback.simulate import SimConfig

    with pytest.raises(FieldError, match=r"^keep_wrong must be in \[0, 1\], got 1.5$"):
        SimConfig(keep_wrong=1.5)
    with pytest.raises(FieldError, match=r"^rate_per_min must be in \(0, "):
        SimConfig(rate_per_min=0.0)
    with pytest.raises(FieldError, match=r"^min_sessions must be in \[1, "):
        CycleConfig(min_sessions=0)
    assert CycleConfig(min_sessions=8).grpo().experimental.objective.norm_tokens == 1024


NEWCOMER_FIELDS = 42
"""At most this many fields outside the ``experimental`` sections (issue 52's 40, plus
``model.lora.rank`` of issue 56: LoRA is what a user of any peer sets first, and
``model.start`` of issue 53: where a user's own run starts): what a newcomer reads to run
training of their own."""


def test_a_newcomer_reads_at_most_42_fields():
    every = leaves(TrainConfig)
    user = [leaf.key for leaf in every if not leaf.experimental]
    assert len(user) <= NEWCOMER_FIELDS, (len(user), user)
    # the split is real: the research switches are most of the config, and what a user sets
    # for their own run is at the top
    assert len(every) - len(user) > 100
    assert {"tasks.train_file", "model.path", "grpo.loss", "loop.max_minutes",
            "rollout.group_size", "fleet.backend"} <= set(user)
    assert {"grpo.experimental.credit.negative_advantage_scale", "loop.experimental.passes",
            "reward.experimental.hacking.no_edit_penalty"} <= {leaf.key for leaf in every}


PRESETS = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))
LAB_NOTES = re.compile(r"\b(?:[A-Z]\d{1,2}[a-z]?\d*'?|stop \d+|table [A-Z]\b|arm [a-z]\w*\d)|"
                       r"[+-]\d+(?:\.\d+)? (?:to|points)")
"""Run ids (Q45s1, C6, A21), stops, tables, arms and gains: evidence, kept in docs/experiments.md."""


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_a_preset_gives_one_line_of_why_per_value_and_keeps_no_lab_notes(path):
    """Every value has a why: its own comment, or a comment (or commented table header)
    heading its paragraph; the runs behind it are in docs/experiments.md, not here."""
    unexplained, why, in_array = [], False, False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code, _, comment = line.partition("#")
        assert not LAB_NOTES.search(comment), f"{path.name}:{n}: {comment.strip()}"
        if not line.strip():
            why = False
        elif not code.strip() or code.strip().startswith("["):
            why = bool(comment.strip()) or (why and not code.strip())
        elif in_array:
            pass  # the rest of a multi-line value
        elif "=" in code and not (comment.strip() or why):
            unexplained.append(f"{n}: {code.strip()}")
        if "=" in code or in_array:
            in_array = code.count("[") > code.count("]") or (in_array and "]" not in code)
    assert not unexplained, f"{path.name}: values without a why: {unexplained}"


def test_help_lists_every_command():
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for name, _, _ in SUBCOMMANDS:
        assert name in out
    assert "quickstart" in out and "train" in out


@pytest.mark.parametrize("override", [
    ["model.experimental.drills=2", "model.experimental.pretrain_steps=0"],
    ["model.experimental.drills=-1", "model.experimental.pretrain_steps=10"]])
def test_drills_without_pretraining_are_refused_at_load(override):
    with pytest.raises(ConfigError, match="model.experimental.drills"):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)


@pytest.mark.parametrize("override,says", [
    (["model.experimental.mtp_heads=2", "model.experimental.pretrain_steps=0"],
     "model.experimental.mtp_heads .* needs model.experimental.pretrain_steps > 0"),
    (["model.experimental.mtp_heads=-1"], "model.experimental.mtp_heads must be in \\[0, 8\\]"),
    (["model.experimental.speculative=always"],
     "model.experimental.speculative must be one of auto, off, on"),
    (["model.experimental.lookup=-2"], "model.experimental.lookup must be in \\[0, 1024\\]"),
    (["model.experimental.lookup=4", "model.engine=vllm"],
     "model.experimental.lookup drafts in the torch engine only"),
    (["model.experimental.lookup=4", "fleet.backend=ray"],
     "model.experimental.lookup drafts in this process's torch engine")])
def test_mtp_and_speculation_settings_are_checked_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)
    ok = load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"),
                     ["model.experimental.mtp_heads=2", "model.experimental.speculative=off",
                      "model.experimental.lookup=6"]).model.experimental
    assert (ok.mtp_heads, ok.speculative, ok.lookup) == (2, "off", 6)


@pytest.mark.parametrize("override,says", [
    (["demos.experimental.slips=1.5"], "demos.experimental.slips must be in \\[0, 1\\]"),
    (["demos.experimental.renamed=-0.1"], "demos.experimental.renamed must be in \\[0, 1\\]"),
    (["demos.experimental.verifies=0.5", 'rollout.tools=["read_file", "edit_file", "finish"]'],
     "demos.experimental.verifies needs run_tests among rollout.tools"),
    (["sft.experimental.schedule=linear"],
     "sft.experimental.schedule must be one of constant, cosine")])
def test_sft_data_and_schedule_settings_are_checked_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)


@pytest.mark.parametrize("override,says", [
    (["model.experimental.tool_format=llama"], "tool_format must be one of .*did you mean llama3"),
    (["model.experimental.tool_format=llama3"], "tool_format 'llama3' needs model.path"),
    (["model.experimental.tool_format=llama3", "model.path=/nonexistent/llama"],
     "'llama3': the SFT demos .* are written as hermes calls; set demos.oracle = false")])
def test_a_tool_format_that_cannot_work_is_refused_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(TrainConfig, CONFIGS[0].with_name("quickstart.toml"), override)


def test_sft_demos_for_a_model_in_another_tool_format_are_refused():
    from looprl.models.tokenizer import build_tokenizer
    from looprl.train.stages import check_demo_format
    from tests.chat_families import family_tokenizer

    check_demo_format(build_tokenizer(None))  # hermes: the demos' own format
    with pytest.raises(ConfigError, match="writes 'mistral_v11' tool calls; the SFT demos"):
        check_demo_format(family_tokenizer("mistral_v11"))
