"""``looprl rewards`` commands on real JSONL files."""

import json

from typer.testing import CliRunner

from looprl.cli import app as looprl
from looprl.commands.rewards import app
from looprl.rewards.composite import RewardConfig, compute_reward
from looprl.types import Counters, Grader, StopReason, Task, Trajectory

runner = CliRunner()
TEST_EDIT = "--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1 +1 @@\n-assert f(1) == 2\n+pass\n"


def test_curve_applies_overrides():
    out = runner.invoke(app, ["curve", "--effort", "300", "-o", "experimental.length.q=0", "-o",
                              "experimental.length.max_penalty=none"])
    assert out.exit_code == 0, out.output
    assert "penalty=-0.300000" in out.output
    bad = runner.invoke(looprl, ["rewards", "curve", "-o", "experimental.length.k=0"])
    assert bad.exit_code == 2 and "q=0" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_metrics_and_flags_from_jsonl(tmp_path):
    task = Task("t1", "/nonexistent", "fix", Grader("pytest", fail_to_pass=("x",)))
    trajs = [Trajectory("t1", "g", (), (), Counters(tool_calls=2, broken_tool_calls=1),
                        StopReason.FINISHED, diff=TEST_EDIT, id="t1/0"),
             Trajectory("t1", "g", (), (), Counters(tool_calls=2), StopReason.FINISHED, id="t1/1")]
    scored = [Trajectory.from_dict({**t.to_dict(), "reward": compute_reward(
        task, t, 1.0, RewardConfig(terms=())).to_dict()}) for t in trajs]
    (tmp_path / "tasks.jsonl").write_text(task.to_json() + "\n")
    (tmp_path / "trajs.jsonl").write_text("".join(t.to_json() + "\n" for t in scored))
    out = runner.invoke(app, ["metrics", str(tmp_path / "trajs.jsonl")])
    assert out.exit_code == 0, out.output
    m = json.loads(out.output)
    assert m["reward/total_mean"] == 0.0 and m["broken_call_rate"] == 0.25  # (-1 + 1) / 2
    out = runner.invoke(app, ["flags", str(tmp_path / "tasks.jsonl"), str(tmp_path / "trajs.jsonl")])
    assert out.exit_code == 0, out.output
    assert "t1/0\tbroken_tool_calls,edited_tests\n" in out.output
    assert "t1/1\tfinish_without_edit" in out.output
