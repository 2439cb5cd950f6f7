"""`looprl train` helpers that need no run (the run itself: README's first command)."""

import dataclasses
import doctest
import importlib
import json
import math
import os

import pytest

from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.harness.oracle import oracle_turns
from looprl.train import plots, report, stages
from looprl.train import tasks as train_tasks
from looprl.train.config import TasksExperimental, TasksSection, TrainConfig
from looprl.train.report import loss_ends
from looprl.train.tasks import select_code
from looprl.types import Grader, Task


def test_loss_ends_average_a_tenth_of_the_steps_at_each_end():
    losses = [5.0] * 10 + [3.0] * 80 + [1.0, 2.0] * 5
    assert loss_ends(losses) == (5.0, 1.5)
    assert loss_ends([2.0]) == (2.0, 2.0)
    assert all(math.isnan(x) for x in loss_ends([]))


def test_the_reward_curve_draws_the_loops_rows_with_their_trend(tmp_path):
    """30 steps (the trend line is drawn from 20), one without a pass rate (a gap), the rows as
    ``metrics.jsonl`` holds them (the task ids are no scalar)."""
    rows = [{"step": i, "tasks": ["a", "b"], "reward/total_mean": 0.01 * i, "train/is_ratio_mean": 1.0,
             **({} if i == 7 else {"rollout/pass_rate": (i % 4) / 4})} for i in range(1, 31)]
    png = plots.plot_curves(rows, tmp_path / "reward_curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    res = doctest.testmod(plots)  # rolling_mean skips the steps that logged none
    assert res.attempted > 0 and res.failed == 0


def test_the_report_sums_up_the_train_inference_gap_of_the_steps_that_trained():
    """The per-step engine KL, mismatch share and IS ratio (``engine_line``'s doctest: a skipped
    step's zeros are left out); a run whose every step was skipped says so."""
    res = doctest.testmod(report)
    assert res.attempted > 0 and res.failed == 0
    assert report.engine_line([{"step": 1, "train/tokens": 0}]) == \
        "No step trained: no train–inference measures."


def test_rollouts_and_the_trainer_must_share_one_temperature():
    """Rollouts at 0.5 scored by a trainer at 1.0 would give IS ratios and an engine KL of two
    different distributions: refused at load, in one line; equal temperatures load."""
    with pytest.raises(ConfigError, match=r"^grpo.experimental.temperature is 1 but rollouts "
                       r"sample at rollout.agent.experimental.temperature = 0.5"):
        load_config(TrainConfig, overrides=["rollout.agent.experimental.temperature=0.5"])
    cfg = load_config(TrainConfig, overrides=["rollout.agent.experimental.temperature=0.5",
                                              "grpo.experimental.temperature=0.5"])
    assert cfg.grpo.experimental.temperature == cfg.rollout.agent.experimental.temperature == 0.5


def test_select_code_appends_the_buggy_code_never_the_fix(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(a, b):\n    return a >= b\n")
    patch = ("--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f(a, b):\n"
             "-    return a >= b\n+    return a < b\n")
    task = Task(id="t", repo=str(tmp_path), prompt="fix f", grader=Grader("pytest"),
                gold_patch=patch)
    sel = select_code(task)
    assert sel.prompt == "fix f\n\nselected in ./pkg/m.py, lines 2-2:\n```\n>= b\n```"
    assert "< b" not in sel.prompt and sel.metadata["selection"] == "line"
    # the oracle edits the selection at once: the prompt shows the path and the snippet
    assert oracle_turns(sel) == [
        '<tool_call>{"name": "edit_file", "arguments": {"path": "./pkg/m.py", "old_string": '
        '">= b", "new_string": "< b"}}</tool_call>',
        '<tool_call>{"name": "finish", "arguments": {"summary": "Fixed it."}}</tool_call>']
    # a synthetic bug lives in `files`, over a pristine tree
    files = {"pkg/m.py": "def f(a, b):\n    return a >= b\n"}
    (tmp_path / "pkg" / "m.py").write_text("def f(a, b):\n    return a < b\n")
    assert select_code(task, files).prompt == sel.prompt
    # nothing to point at (a new file): the task as it was
    new_file = "--- /dev/null\n+++ b/pkg/n.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert select_code(dataclasses.replace(task, gold_patch=new_file)) == \
        dataclasses.replace(task, gold_patch=new_file)


def test_train_only_packages_add_train_tasks_and_leave_the_held_out_split_alone(monkeypatch,
                                                                               tmp_path):
    def built(specs, cfg, seed, progress=None):  # the package build is the seam: 3 functions x 4
        return {s: [Task(f"{s}-{f}-{i}", str(tmp_path), "fix it", Grader("pytest"),
                         metadata={"package": s.split("==")[0], "functions": f"f{f}"})
                    for f in range(3) for i in range(4)] for s in specs}

    monkeypatch.setattr(train_tasks, "package_tasks", built)
    base = TasksSection(train_packages=["a==1", "b==1"],
                        experimental=TasksExperimental(heldout_fraction=0.5, max_heldout=8))
    more = dataclasses.replace(base, experimental=dataclasses.replace(
        base.experimental, train_only_packages=["c==1", "d==1"]))
    before, after = train_tasks.build_tasks(base), train_tasks.build_tasks(more)
    assert [t.id for t in after.heldout] == [t.id for t in before.heldout] and before.heldout
    extra = [t for t in after.train if t.metadata["package"] in ("c", "d")]
    assert len(extra) == 24 and {t.metadata["split"] for t in extra} == {"train"}
    assert [t.id for t in after.train if t not in extra] == [t.id for t in before.train]
    # never pretraining text or synthetic demos, like every task package
    assert stages.task_packages(TrainConfig(tasks=more), []) == ["a", "b", "c", "d"]
    with pytest.raises(ConfigError, match="b_c is also in train_packages"):
        TasksSection(train_packages=["a==1", "b-c==1"],
                     experimental=TasksExperimental(train_only_packages=["B_c==2"]))


def test_bf16_autocast_is_kept_only_where_bf16_is_native(monkeypatch):
    import torch

    from looprl.config import load_config

    cfg = load_config(TrainConfig, None, ["sft.experimental.autocast_bf16=true",
                                          "grpo.experimental.autocast_bf16=true"])
    cpu = torch.device("cpu")
    monkeypatch.setattr(stages, "native_bf16", lambda device: True)
    assert stages.fit_precision(cfg, cpu) is cfg
    monkeypatch.setattr(stages, "native_bf16", lambda device: False)
    fitted = stages.fit_precision(cfg, cpu)
    assert (fitted.sft.experimental.autocast_bf16,
            fitted.grpo.experimental.autocast_bf16) == (False, False)
    assert (fitted.sft.lr, fitted.grpo.lr) == (cfg.sft.lr, cfg.grpo.lr)  # nothing else changes


def test_native_bf16_reads_the_cpu_flags(monkeypatch):
    import torch

    for flags, native in [("fpu avx2 avx512f", False), ("avx2 avx512f avx512_bf16", True),
                          ("avx2 amx_bf16 amx_tile", True)]:
        monkeypatch.setattr(stages.Path, "read_text", lambda self, f=flags: f"flags\t: {f}\n")
        assert stages.native_bf16(torch.device("cpu")) is native, flags


def _cfg(*overrides: str):
    from looprl.config import load_config
    from looprl.train import TrainConfig

    return load_config(TrainConfig, None, ["name=r", "tasks.train_file=t.jsonl", *overrides])


def _summary(steps: int = 5, groups: int = 20, no_pass: int = 0, minutes: float = 1.0):
    return stages.RLSummary(steps, groups, 0, 0, 0.0, minutes,
                            [{"step": i + 1, "tasks": ["t"] * (groups // steps)}
                             for i in range(steps)], no_pass_groups=no_pass)


def test_a_run_that_failed_its_input_checks_does_not_keep_its_name(tmp_path):
    from looprl import runstate
    from looprl.config import save_config
    from looprl.rundir import RunDir
    train_run = importlib.import_module("looprl.train.run")

    cfg, rd = _cfg(), RunDir(tmp_path / "r")
    rd.root.mkdir()
    save_config(cfg, rd.config)
    runstate.mark(rd.root, "failed", stage="tasks", error="TaskError: no such file t.jsonl")
    train_run._claim(cfg, rd, resume=False)  # a failed start is taken over: no --fresh needed
    assert not rd.root.exists()
    rd.root.mkdir()
    save_config(cfg, rd.config)
    rd.start_record.write_text("{}")  # the start model was made: that run is worth keeping
    runstate.mark(rd.root, "failed", stage="RL")
    with pytest.raises(ConfigError, match="--resume"):
        train_run._claim(cfg, rd, resume=False)
    runstate.mark(rd.root, "training", stage="RL")  # this process: alive
    state = json.loads(rd.state.read_text())
    rd.state.write_text(json.dumps({**state, "pid": os.getppid(),  # a live other process
                                    "started": runstate._started(os.getppid())}))
    with pytest.raises(ConfigError, match="being trained right now"):
        train_run._claim(cfg, rd, resume=True)
    rd.state.write_text(json.dumps({**state, "pid": os.getppid(), "started": "1"}))
    assert runstate.read(rd.root).status == "killed"  # its pid now names another process
    with pytest.raises(ConfigError, match="holds an earlier run \\(killed\\)"):
        train_run._claim(cfg, rd, resume=False)


def test_resume_with_a_bigger_budget_continues_a_finished_run(tmp_path, capsys):
    from looprl.rundir import RunDir
    train_run = importlib.import_module("looprl.train.run")

    rd = RunDir(tmp_path / "r")
    rd.root.mkdir()
    (rd.model_rl).mkdir()
    rd.rl_record.write_text(json.dumps(dataclasses.asdict(_summary(steps=5, minutes=1.0))))
    rd.evaluation("rl").write_text("{}")
    rd.report.write_text("old")
    assert train_run._reopen_rl(_cfg("loop.max_steps=5"), rd) is None  # the budget it used
    assert rd.rl_record.is_file() and "loop.max_steps=5 allows no more" in " ".join(
        capsys.readouterr().out.split())
    assert train_run._reopen_rl(_cfg("loop.max_steps=50", "loop.max_minutes=0.5"), rd) is None
    assert "loop.max_minutes=0.5 allows no more" in " ".join(capsys.readouterr().out.split())
    assert train_run._reopen_rl(_cfg("loop.max_steps=50"), rd) == 5
    assert not (rd.rl_record.exists() or rd.model_rl.exists() or rd.evaluation("rl").exists()
                or rd.report.exists())  # RL continues from its checkpoint, then evaluates again


def test_rl_without_a_passing_group_says_so():
    assert _summary(groups=20, no_pass=20).learned_from_no_pass
    assert "none of the 20 groups" in _summary(groups=20, no_pass=20).no_pass_warning()
    assert _summary(groups=20, no_pass=19).no_pass_warning() == ""
    assert _summary(groups=0, no_pass=0).no_pass_warning() == ""


def test_ctrl_c_leaves_a_report_that_says_how_to_continue(tmp_path):
    from looprl.train.report import write_stopped_report

    rows = [{"step": 1, "tasks": ["a", "b"], "elapsed_s": 30, "reward/total_mean": -0.5,
             "rollout/pass_rate": 0.0},
            {"step": 2, "tasks": ["c"], "elapsed_s": 90, "reward/total_mean": -0.25,
             "rollout/pass_rate": 0.25}]
    text = write_stopped_report(tmp_path, _cfg(), "RL", rows, "step_00000002").read_text()
    assert "(stopped)" in text and "RL: 2 steps logged, 3 groups, 1.5 min" in text
    assert "-0.500 → -0.250" in text and "ckpt/step_00000002" in text and "--resume" in text


def test_a_model_path_without_a_chat_template_is_one_line_before_the_tasks(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    cfg = _cfg(f"model.path={tmp_path}")
    with pytest.raises(ConfigError, match="no chat template"):
        stages.check_model_path(cfg)
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    stages.check_model_path(cfg)  # transformers' own place for it
    with pytest.raises(ConfigError, match="not a HF checkpoint"):
        stages.check_model_path(_cfg(f"model.path={tmp_path / 'missing'}"))
