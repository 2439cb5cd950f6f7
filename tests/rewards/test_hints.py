"""Hints from the environment (``looprl.rewards.hints``): the right turn, the right kind, and
never the fix."""

from __future__ import annotations

import json

import pytest

from looprl.rewards.hints import find_hint, redact
from looprl.types import Counters, Grader, Message, RewardBreakdown, StopReason, Task, Trajectory

GOLD = ("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,4 +1,4 @@\n import math\n def add(a, b):\n"
        "-    return a - b\n+    return a + b\n \n")


def _task(gold: str | None = GOLD) -> Task:
    return Task("t", "/repo", "fix add", Grader("pytest"), gold_patch=gold)


def _call(name: str, **args: object) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _turn(*calls: dict, results: tuple[str, ...] = ("ok",)) -> list[Message]:
    msgs: list[Message] = [{"role": "assistant", "content": "", "tool_calls": list(calls)}]
    return msgs + [{"role": "tool", "tool_call_id": "c", "name": "x", "content": r} for r in results]


def _traj(*turns: list[Message], tests: float = 0.0, details: dict | None = None) -> Trajectory:
    msgs = [m for t in turns for m in t]
    reward = RewardBreakdown.of({"tests": tests}, details=details or {})
    return Trajectory("t", "g", (), tuple(msgs), Counters(), StopReason.FINISHED, reward=reward)


def test_a_broken_call_is_named_at_its_own_turn() -> None:
    t = _traj(_turn(_call("read_file", path="pkg/calc.py")),
              _turn(_call("edit_file", path="pkg/calc.py"),
                    results=("Invalid tool call: missing required argument 'old_string'",)))
    h = find_hint(_task(), t)
    assert h is not None and (h.turn, h.kind) == (2, "broken_call")
    assert "malformed" in h.text and "old_string" in h.text


def test_an_edit_of_the_wrong_file_names_the_gold_location() -> None:
    t = _traj(_turn(_call("read_file", path="pkg/calc.py")),
              _turn(_call("edit_file", path="pkg/other.py", old_string="a", new_string="b")),
              details={"failed_tests": "tests/test_calc.py::test_add"})
    h = find_hint(_task(), t)
    assert h is not None and (h.turn, h.kind) == (2, "wrong_location")
    assert "pkg/calc.py::add" in h.text


def test_a_failing_test_is_named_after_the_last_edit_with_its_assertion() -> None:
    t = _traj(_turn(_call("edit_file", path="pkg/calc.py", old_string="-", new_string="*")),
              _turn(_call("edit_file", path="./pkg/calc.py", old_string="*", new_string="/")),
              _turn(_call("finish")),
              details={"failed_tests": "tests/test_calc.py::test_add",
                       "grade_assertion": "assert add(1, 2) == 3"})
    h = find_hint(_task(), t)
    assert h is not None and (h.turn, h.kind) == (2, "failing_test")
    assert "tests/test_calc.py::test_add" in h.text and "assert add(1, 2) == 3" in h.text


def test_a_pass_or_an_unscored_run_gets_no_hint() -> None:
    passed = _traj(_turn(_call("edit_file", path="pkg/other.py")), tests=1.0)
    assert find_hint(_task(), passed) is None
    unscored = Trajectory("t", "g", (), tuple(_turn(_call("finish"))), Counters(),
                          StopReason.INFRA_ERROR)
    assert find_hint(_task(), unscored) is None


@pytest.mark.parametrize("leak", [
    "assert source == '    return a + b'",  # an assertion that prints the expected code
    "expected: return a + b\ngot: return a - b",
    "return a + return a + bb",  # a cut that re-forms the secret
])
def test_a_hint_never_contains_the_gold_patchs_added_lines(leak: str) -> None:
    for details, results in (
            ({"failed_tests": "t::x", "grade_assertion": leak}, ("ok",)),
            ({}, (f"Invalid tool call: {leak}",))):
        t = _traj(_turn(_call("edit_file", path="pkg/calc.py"), results=results),
                  details=details)
        h = find_hint(_task(), t)
        assert h is not None
        assert "return a + b" not in h.text, h.text


def test_redact_leaves_a_hint_without_gold_lines_alone() -> None:
    assert redact("the hidden test t::x fails", GOLD) == "the hidden test t::x fails"
    assert redact("x" * 1000, None) == "x" * 400
