"""1,000+ seeded malformed model outputs through the real loop: no exception escapes, every
broken call is counted (the expected count is known from how each output was built)."""

from __future__ import annotations

import asyncio
import json
import random

from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.format import parse_turn
from looprl.harness.policies import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.types import StopReason

from .conftest import call

TOOLS = ("read_file", "list_dir", "glob", "grep", "edit_file", "memory")
JUNK = "{}[]\":,\\ntrue null 0 -1e9 é漢\x00\t<>/ name arguments"


def _garbage(rng: random.Random) -> str:
    return "".join(rng.choice(JUNK) for _ in range(rng.randint(0, 30))).replace("<", "")


def fragment(rng: random.Random) -> tuple[str, int]:
    """One piece of model output and how many broken calls it must produce."""
    kind = rng.randrange(12)
    name = rng.choice(TOOLS)
    if kind == 0:
        return call("read_file", path=rng.choice(["pkg/calc.py", "nope.py", "../x", "/etc/passwd"])), 0
    if kind == 1:
        return call("grep", pattern=rng.choice(["def", "(", "[a-"]), path="."), 0
    if kind == 2:
        return "<tool_call>" + _garbage(rng) + "</tool_call>", 1
    if kind == 3:
        return '<tool_call>{"name": "' + name + '", "arguments": ' + _garbage(rng) + "</tool_call>", 1
    if kind == 4:
        return call(rng.choice(["", "rm_rf", "READ_FILE", "read file"])), 1
    if kind == 5:  # wrong argument types / missing / extra
        bad = rng.choice([{"path": 7}, {}, {"path": "a", "bogus": 1}, {"path": ["a"]}, {"path": None}])
        return call("read_file", **bad), 1
    if kind == 6:
        return "<tool_call>" + json.dumps({"name": name, "arguments": rng.choice([[1], 3, "x y", None])}) + "</tool_call>", 1
    if kind == 7:
        return "</tool_call>", 1
    if kind == 8:
        return "<think>" + _garbage(rng) + "</think>", 0
    if kind == 9:
        return _garbage(rng), 0
    if kind == 10:
        return call("memory", action=rng.choice(["add", "list", "delete"]), note=_garbage(rng)) if rng.random() < .5 else call("memory", action="add", note=_garbage(rng) + "n"), 0
    return "<tool_call>" + json.dumps({"arguments": {}, "nam": name}) + "</tool_call>", 1


def fuzz_turn(rng: random.Random) -> tuple[str, int]:
    parts, broken = [], 0
    for _ in range(rng.randint(1, 4)):
        text, b = fragment(rng)
        parts.append(text)
        broken += b
    text, b = "<tool_call>" + _garbage(rng), 1  # always one broken call so the turn is not an answer
    if rng.random() < 0.5:  # an unclosed block, only ever at the end of a turn
        parts.append(text)
    else:
        parts.insert(rng.randrange(len(parts) + 1), "</tool_call>")
    return "".join(parts), broken + b


def _expected_broken(text: str, built: int) -> int:
    # the "memory delete" case is a broken enum value; count it from the parsed calls
    extra = sum(1 for c in parse_turn(text).tool_calls
                if c.name == "memory" and json.loads(c.arguments).get("action") == "delete")
    return built + extra


def test_fuzzed_outputs_never_escape_and_are_counted(task, dsandbox, fmt, tok):
    rng = random.Random(1234)
    tools = make_tools(TOOLS)
    total = 0
    for episode in range(20):
        turns, expected = [], 0
        for _ in range(55):
            text, broken = fuzz_turn(rng)
            turns.append(text)
            expected += _expected_broken(text, broken)
        policy = ScriptedPolicy(tok, turns)
        traj = asyncio.run(run_agent(task, dsandbox, policy, fmt, tools,
                                     AgentConfig(max_turns=len(turns), context_window=10**7,
                                                 max_total_new_tokens=10**7, max_new_tokens=10**5),
                                     group_id="fuzz", trajectory_id=f"fuzz/{episode}"))
        assert traj.stop_reason == StopReason.MAX_TURNS, traj.error
        assert traj.counters.broken_tool_calls == expected
        assert traj.counters.turns == len(turns)
        broken_msgs = [m for m in traj.messages if m["role"] == "tool"
                       and m["content"].startswith("Invalid tool call")]
        assert len(broken_msgs) == expected
        total += len(turns)
    assert total >= 1000
