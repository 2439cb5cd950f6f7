"""Records round-trip through JSON and keep their invariants."""

import json

import pytest

from looprl.types import (
    Counters,
    Generation,
    Grader,
    Group,
    RewardBreakdown,
    Segment,
    SelfSummary,
    StopReason,
    Task,
    TokenSpan,
    ToolCall,
    ToolResult,
    Trajectory,
)


def _trajectory(reward: float | None = 1.0) -> Trajectory:
    seg = Segment((1, 2, 3, 4), (0.0, 0.0, -0.5, -1.25), (0, 0, 1, 1), (-1, -1, 3, 4))
    rb = RewardBreakdown.of({"tests": 1.0, "length": -0.1}, flags=("edited_tests",),
                            details={"tests_passed": 3}) if reward is not None else None
    return Trajectory(
        task_id="t1", group_id="g1", segments=(seg, seg),
        messages=({"role": "user", "content": "fix it"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      ToolCall("c1", "read_file", '{"path": "a.py"}').to_openai()]}),
        counters=Counters(turns=2, tool_calls=1, output_tokens=2),
        stop_reason=StopReason.FINISHED, diff="--- a\n+++ b\n", reward=rb, wall_s=1.5, id="t1/0",
        metadata={"k": 1}, summaries=(SelfSummary(0, 4, 2, 1),), broken_spans=(TokenSpan(1, 2, 4),),
    )


def test_trajectory_json_round_trip():
    t = _trajectory()
    back = Trajectory.from_json(json.dumps(json.loads(t.to_json())))
    assert back == t
    assert back.stop_reason is StopReason.FINISHED
    assert back.reward is not None and back.reward.total == pytest.approx(0.9)


def test_a_trajectory_saved_before_the_typed_fields_loads_them_from_its_metadata():
    """Older files hold ``summaries`` and ``broken_spans`` as JSON text in ``metadata``: read once,
    written back as fields, and the same record after another save."""
    d = json.loads(_trajectory().to_json())
    d.pop("summaries"), d.pop("broken_spans")
    d["metadata"] = {"k": 1, "broken_spans": "[[1, 2, 4]]", "summaries": json.dumps([
        {"segment": 0, "tokens_before": 4, "tokens_after": 2, "summary_tokens": 1}])}
    old = Trajectory.from_json(json.dumps(d))
    assert old == _trajectory()
    assert old.broken_spans[0].end == 4 and old.summaries[0].tokens_after == 2
    saved = json.loads(old.to_json())
    assert saved["metadata"] == {"k": 1} and saved["broken_spans"] == [[1, 2, 4]]
    assert Trajectory.from_dict(saved) == old
    d["metadata"] = {"broken_spans": "[]", "summaries": ""}  # none recorded, or an empty string
    none = Trajectory.from_dict(d)
    assert (none.broken_spans, none.summaries, none.metadata) == ((), (), {})


def test_task_round_trip_and_group_rewards():
    task = Task("t1", "/repo", "the sum is off by one", Grader("pytest -q", ("tests/test_a.py::test_x",),
                ("tests/test_a.py::test_y",), ("tests/test_a.py",)), venv="/venv", gold_patch="diff",
                metadata={"package": "toolz", "lines_changed": 2})
    assert Task.from_json(task.to_json()) == task
    g = Group("t1", "g1", (_trajectory(1.0), _trajectory(1.0)))
    assert Group.from_json(g.to_json()) == g
    assert g.rewards_G == pytest.approx([0.9, 0.9])


def test_group_rewards_require_scored_trajectories():
    g = Group("t1", "g1", (_trajectory(None),))
    with pytest.raises(AssertionError, match="has no reward"):
        _ = g.rewards_G


def test_segment_lengths_must_agree():
    with pytest.raises(AssertionError, match="one entry per token"):
        Segment((1, 2), (0.0,), (0, 1), (-1, 0))


def test_small_records_round_trip():
    assert ToolResult.from_json(ToolResult("c", "grep", "x", "broken", 0.1).to_json()).broken
    gen = Generation((5, 6), (-0.1, -0.2), (0, 1), "stop", "hi")
    assert Generation.from_json(gen.to_json()) == gen
    assert Counters.from_dict({"turns": 3, "unknown": 9}).turns == 3
