"""docs/extending.md's example, run as the page says: a custom tool, a custom reward term and a
task file of one's own, trained for a few steps with `looprl train`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.harness.tools import make_tools

pytestmark = [pytest.mark.slow, pytest.mark.needs_bwrap]
EXAMPLE = Path(__file__).parent.parent / "examples" / "extending"


def test_the_extending_example_trains_with_its_own_tool_reward_and_tasks(tmp_path):
    looprl = Path(sys.executable).parent / "looprl"
    out = subprocess.run([str(looprl), "train", "-c", "train.toml", "--runs", str(tmp_path)],
                         cwd=EXAMPLE, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "extending"
    assert json.loads((run / "start.json").read_text())["demos"] == 3  # all three train tasks
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows and "reward/my_plugins:small_diff_mean" in rows[-1]  # the plugin term scored
    assert json.loads((run / "eval_rl.json").read_text())["n_tasks"] == 1  # the held-out task
    assert (run / "reward_curve.png").stat().st_size > 10_000  # the report's picture
    report = (run / "report.md").read_text().splitlines()
    assert report[-1].startswith("heldout_pass1_sft=")
    assert re.search(r"; [1-3] of the 3 train tasks rolled out; schedule a?sync\.$", report[2]), report[2]
    # the task file's relative repo paths were taken relative to the file
    task = json.loads((run / "tasks" / "train.jsonl").read_text().splitlines()[0])
    assert task["repo"].startswith(str(EXAMPLE / "repos"))

    # An RL arm from this run's start (scripts/rl_arm.py): RL again with another learning rate,
    # the start stages taken as they are.
    script = EXAMPLE.parent.parent / "scripts" / "rl_arm.py"
    refused = subprocess.run([sys.executable, str(script), str(run), "--name", "arm",
                              "-o", "sft.experimental.max_steps=5"], cwd=EXAMPLE, capture_output=True, text=True)
    assert refused.returncode != 0 and "may not change" in refused.stderr
    assert not (tmp_path / "arm").exists()
    out = subprocess.run([sys.executable, str(script), str(run), "--name", "arm",
                          "-o", "grpo.lr=2e-4", "-o", "loop.max_steps=1", "-o", "model.experimental.threads=1"],
                         cwd=EXAMPLE, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    arm = tmp_path / "arm"
    assert json.loads((arm / "config.json").read_text())["grpo"]["lr"] == 2e-4
    assert (arm / "eval_start.json").read_text() == (run / "eval_start.json").read_text()
    assert "SFT on" not in out.stdout  # the start model was taken, not trained again
    assert [json.loads(x)["step"] for x in (arm / "metrics.jsonl").read_text().splitlines()
            if "step" in json.loads(x)] == [1]
    assert out.stdout.splitlines()[-1].startswith("arm_minus_base=")


def test_the_plugin_tool_runs_in_a_real_sandbox(tmp_path):
    from looprl.harness.tools.base import ToolContext
    from looprl.sandbox import create_sandbox

    sys.path.insert(0, str(EXAMPLE))
    try:
        (tool,) = make_tools(["my_plugins:CountLines"])
    finally:
        sys.path.remove(str(EXAMPLE))

    async def main() -> str:
        sb = await create_sandbox(str(EXAMPLE / "repos" / "clamp"))
        try:
            return await tool.run({"path": "textstats.py"}, ToolContext(sandbox=sb))
        finally:
            await sb.close()

    assert asyncio.run(main()) == "textstats.py: 3 lines"
