"""Hinted continuations (``looprl.harness.hinted``): the teacher's context is the recorded
prefix, the tool results and the hint, token-exact; the hint is never a model token; the
workspace is the one the prefix left."""

from __future__ import annotations

import asyncio

import pytest

from looprl.harness.agent import run_agent
from looprl.harness.hinted import continue_with_hint
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.types import Trajectory

from .conftest import agent_config, call
from .dir_sandbox import DirSandbox

HINT = "Turn 2: this call is malformed: not valid JSON"
TURNS = [call("edit_file", path="pkg/calc.py", old_string="def sub(a, b):\n    return a - b",
              new_string="def sub(a, b):\n    return b - a"),
         "<tool_call>{oops</tool_call>",
         call("finish", summary="done")]
CONTINUATION = [call("edit_file", path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
                     new_string="def add(a, b):\n    return a + b"),
                call("finish", summary="fixed")]


def _continue(task, repo, fmt, tok, turn: int):
    sb = DirSandbox(repo)
    prefix = asyncio.run(run_agent(task, sb, ScriptedPolicy(tok, TURNS), fmt, make_tools(),
                                   agent_config(context_window=100_000), group_id="g",
                                   trajectory_id="g/0"))
    asyncio.run(sb.close())
    teacher_policy, sb2 = ScriptedPolicy(tok, CONTINUATION), DirSandbox(repo)
    teacher = asyncio.run(continue_with_hint(
        task, sb2, teacher_policy, fmt, make_tools(), agent_config(context_window=100_000), prefix,
        turn=turn, text=HINT, kind="broken_call", group_id="g", trajectory_id="g/0+hint"))
    asyncio.run(sb2.close())
    return prefix, teacher, teacher_policy


@pytest.mark.parametrize("turn", [2, 3])
def test_the_teacher_continues_token_exact_after_the_hint(task, repo, fmt, tok, turn) -> None:
    prefix, teacher, policy = _continue(task, repo, fmt, tok, turn)
    (seg,), (tseg,) = prefix.segments, teacher.segments
    spans = seg.model_turns()
    h = teacher.hint
    assert h is not None and (h.turn, h.text, h.kind) == (turn, HINT, "broken_call")
    # the recorded prefix up to the end of turn `turn`, then the hinted observation
    assert h.start == spans[turn - 1][1]
    assert tseg.token_ids_T[:h.start] == seg.token_ids_T[:h.start]
    assert HINT in fmt.decode(tseg.token_ids_T[h.start:h.end])
    assert HINT not in fmt.decode(h.student_ids_T)
    if turn < len(spans):  # the unhinted context is what the policy saw then, exactly
        assert h.student_ids_T == seg.token_ids_T[h.start:spans[turn][0]]
    # the policy was prompted with exactly that context; every model token is the continuation's
    assert policy.prompts[0] == list(tseg.token_ids_T[:h.end])
    model_at = [i for i, m in enumerate(tseg.loss_mask_T) if m]
    assert model_at and min(model_at) == h.end and sum(tseg.loss_mask_T) == sum(
        len(fmt.encode(t)) + 1 for t in CONTINUATION)
    assert all(m == 0 for m in tseg.loss_mask_T[h.start:h.end])
    # the workspace is the prefix's (turn 1's edit of sub replayed), then the continuation's
    assert "return b - a" in teacher.diff and "return a + b" in teacher.diff
    assert teacher.stop_reason.value == "finished" and teacher.messages[-5]["content"] == HINT
    assert Trajectory.from_json(teacher.to_json()) == teacher  # the hint's span saves and reads back


def test_a_turn_out_of_range_is_refused(task, repo, fmt, tok) -> None:
    with pytest.raises(ValueError, match="turn 9 is not one of its 3 turns"):
        _continue(task, repo, fmt, tok, 9)
