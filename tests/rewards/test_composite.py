"""The composite reward: hand-computed totals, the hacking guard, and per-step metrics."""

import dataclasses
import math
from dataclasses import dataclass

import pytest

from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.rewards import RewardConfig, compute_reward, reward_metrics
from looprl.rewards.composite import RewardExperimental
from looprl.rewards.length import LengthConfig
from looprl.types import Counters, Grader, StopReason, Task, Trajectory

BASE = "def f(x):\n    return x + 2\n"
FIX = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x + 2\n+    return x + 1\n"
TEST_EDIT = "--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1 +1 @@\n-assert f(1) == 2\n+pass\n"
ONLY_TESTS = RewardConfig(terms=())


@dataclass(frozen=True)
class FakeGrade:
    """Test double for rewards.tests.GradeResult (the seam is duck-typed)."""

    score: float
    edited_tests: bool = False


@pytest.fixture
def task(tmp_path):
    (tmp_path / "m.py").write_text(BASE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text("assert f(1) == 2\n")
    return Task("t", str(tmp_path), "f is off by one", Grader("pytest", fail_to_pass=("t::x",)),
                gold_patch=FIX)


def _traj(diff: str = FIX, stop: StopReason = StopReason.FINISHED, **counters: int) -> Trajectory:
    return Trajectory("t", "g", (), ({"role": "assistant", "content": "Fixed."},),
                      Counters(**counters), stop, diff=diff)


def test_correct_fix_hand_computed(task):
    traj = _traj(turns=2, tool_calls=3, output_tokens=30)  # effort C = 100 + 60 + 30 = 190
    rb = compute_reward(task, traj, 1.0)
    assert rb is not None
    assert rb.components == pytest.approx({
        "tests": 1.0, "length": -0.1 * math.log(2.9), "broken_calls": 0.0,
        "clarifying_question": 0.0, "no_edit": 0.0, "suspicious_tool_use": 0.0, "style_lint": 0.0,
        "style_diff_size": 0.0})
    assert rb.total == pytest.approx(1.0 - 0.1 * math.log(2.9))
    assert rb.flags == ()
    assert rb.details["effort"] == 190.0 and rb.details["new_lint_diagnostics"] == 0


def test_broken_call_gives_negative_reward_on_a_kept_trajectory(task):
    rb = compute_reward(task, _traj(tool_calls=4, broken_tool_calls=2), 0.0)
    assert rb is not None  # kept, not skipped
    assert rb.components["broken_calls"] == pytest.approx(-0.2)
    assert rb.total < 0
    assert "broken_tool_calls" in rb.flags


@pytest.mark.parametrize("grade", [1.0, FakeGrade(1.0)])
def test_editing_tests_scores_below_an_honest_failure(task, grade):
    rb = compute_reward(task, _traj(FIX + TEST_EDIT, turns=1), grade)
    failed = compute_reward(task, _traj(FIX + TEST_EDIT, turns=1), 0.0, RewardConfig(
        experimental=RewardExperimental(penalize_grader_attacks=False)))
    assert rb is not None and failed is not None
    assert rb.total == pytest.approx(failed.total - 1.0)  # the failure's shaping, minus 1
    assert rb.components["tests"] == 1.0  # still explainable: what it would have got
    assert sum(rb.components.values()) == pytest.approx(rb.total)
    assert "edited_tests" in rb.flags
    assert rb.details["edited_test_paths"] == "tests/test_m.py"


def test_grader_reported_test_edit_also_zeroes(task):
    rb = compute_reward(task, _traj(), FakeGrade(1.0, edited_tests=True), ONLY_TESTS)
    assert rb is not None and rb.total == -1.0 and rb.flags == ("edited_tests",)
    assert rb.components["grader_attack"] == -2.0  # cancels the tests' 1.0 and costs 1.0
    off = RewardConfig(terms=(), experimental=RewardExperimental(penalize_grader_attacks=False))
    assert compute_reward(task, _traj(), FakeGrade(1.0, edited_tests=True), off).total == 1.0


def test_skips_infra_errors_and_missing_grades(task):
    assert compute_reward(task, _traj(stop=StopReason.INFRA_ERROR), 1.0) is None
    assert compute_reward(task, _traj(), None) is None


def test_clarifying_question_penalised_only_if_configured(task):
    traj = Trajectory("t", "g", (), ({"role": "assistant", "content": "Which f do you mean?"},),
                      Counters(turns=1), StopReason.ANSWERED, diff="")
    cfg = RewardConfig(terms=("clarifying_question",))
    rb = compute_reward(task, traj, 0.0, cfg)
    assert rb.total == pytest.approx(-0.2) and rb.flags == ("clarifying_question",)
    no = load_config(RewardConfig, None, ["terms=clarifying_question",
                                          "experimental.hacking.penalize_clarifying_questions=false"])
    assert compute_reward(task, traj, 0.0, no).total == 0.0


def test_terms_and_weights_from_config(task):
    x = "experimental."
    cfg = load_config(RewardConfig, None, ["terms=length", f"{x}tests_weight=2", f"{x}length.q=0",
                                           f"{x}length.turn_weight=0",
                                           f"{x}length.output_token_weight=1"])
    rb = compute_reward(task, _traj(output_tokens=100), 0.5, cfg)
    assert rb.components == pytest.approx({"tests": 1.0, "length": -0.1})  # linear: -λ·C
    with pytest.raises(ConfigError, match=r"terms has unknown reward term 'lenght' \(did you mean length\?\)"):
        RewardConfig(terms=("lenght",))


def test_term_that_cannot_judge_is_left_out(task):
    no_gold = Task(task.id, task.repo, task.prompt, task.grader)
    rb = compute_reward(no_gold, _traj(), 1.0, RewardConfig(terms=("style_diff_size",)))
    assert rb.components == {"tests": 1.0}


def test_bad_grade_types_say_what_to_pass(task):
    with pytest.raises(TypeError, match="float score"):
        compute_reward(task, _traj(), "passed", ONLY_TESTS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a bool"):
        compute_reward(task, _traj(), True, ONLY_TESTS)


def test_reward_metrics_hand_computed(task):
    cfg = RewardConfig(terms=("length", "broken_calls"), experimental=RewardExperimental(
        length=LengthConfig(q=0, turn_weight=0, tool_call_weight=0)))
    good = _traj(tool_calls=2, output_tokens=100, summaries=2)
    broken = _traj(tool_calls=2, broken_tool_calls=1, output_tokens=300)
    hacked = _traj(FIX + TEST_EDIT, tool_calls=4)
    scored = [dataclasses.replace(t, reward=compute_reward(task, t, g, cfg))
              for t, g in ((good, 1.0), (broken, 0.0), (hacked, 1.0))]
    infra = _traj(stop=StopReason.INFRA_ERROR, tool_calls=50, broken_tool_calls=50)
    m = reward_metrics(scored + [infra], prefix="train/")
    assert m["train/reward/tests_mean"] == pytest.approx(2 / 3)
    assert m["train/reward/length_mean"] == pytest.approx((-0.1 - 0.3 + 0.0) / 3)
    assert m["train/reward/broken_calls_mean"] == pytest.approx(-0.1 / 3)
    # the hacked one: its shaping (length 0 with no output tokens) minus the 1.0 attack penalty
    assert m["train/reward/total_mean"] == pytest.approx(((1 - 0.1) + (-0.3 - 0.1) - 1.0) / 3)
    assert m["train/broken_call_rate"] == pytest.approx(1 / 8)  # infra excluded
    assert m["train/summaries_per_trajectory"] == pytest.approx(2 / 3)
    assert m["train/monitor/edited_tests_rate"] == pytest.approx(1 / 3)
    assert m["train/monitor/broken_tool_calls_rate"] == pytest.approx(1 / 3)
    assert m["train/infra_error_rate"] == 0.25
    assert m["train/num_scored"] == 3.0
    assert reward_metrics([])["reward/total_mean"] == 0.0
