"""The agent loop driven by ScriptedPolicy over a real (DirSandbox) workspace."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import pytest

from looprl.errors import ConfigError, SandboxError
from looprl.harness.agent import AgentConfig, AgentRun, run_agent
from looprl.harness.policies import ScriptedPolicy
from looprl.harness.tools import make_tools, tool_schemas
from looprl.harness.tools.base import obj_schema
from looprl.types import StopReason, Trajectory

from .conftest import call


def agent(task, sandbox, fmt, tok, turns, tools=None, **cfg):
    policy = ScriptedPolicy(tok, turns)
    traj = asyncio.run(run_agent(task, sandbox, policy, fmt, tools or make_tools(),
                                 AgentConfig(**cfg), group_id="g", trajectory_id="g/0"))
    return traj, policy


def tool_msgs(traj):
    return [m for m in traj.messages if m["role"] == "tool"]


def assert_token_exact(traj, policy, fmt):
    """Every prompt the policy saw is a prefix of the (single) segment, and the segment is
    exactly those prompts + the sampled tokens + the observation tokens."""
    (seg,) = traj.segments
    ids = list(seg.token_ids_T)
    for p in policy.prompts:
        assert ids[: len(p)] == p
    assert ids[len(policy.prompts[-1]):] == list(fmt.encode(policy.turns[len(policy.prompts) - 1])
                                                 + [fmt.eot_id])[: len(ids) - len(policy.prompts[-1])]
    model = [t for t, m in zip(seg.token_ids_T, seg.loss_mask_T, strict=True) if m]
    assert len(model) == traj.counters.output_tokens
    assert all(v == 0 for v, m in zip(seg.policy_version_T, seg.loss_mask_T, strict=True) if m)
    assert all(v == -1 for v, m in zip(seg.policy_version_T, seg.loss_mask_T, strict=True) if not m)


def test_every_tool_in_one_episode(task, sandbox, fmt, tok):
    turns = [
        "Look around." + call("read_file", path="pkg/calc.py", limit=2) + call("list_dir")
        + call("glob", pattern="*.py") + call("grep", pattern="return") + call("run_tests")
        + call("read_lints"),
        call("edit_file", path="pkg/calc.py", old_string="return a - b", new_string="return a + b")
        + call("edit_file", path="pkg/calc.py", old_string="return a * b", new_string="x")
        + call("edit_file", path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
               new_string="def add(a, b):\n    return a + b")
        + call("write_file", path="NOTES.md", content="fixed add\n")
        + call("memory", action="add", note="add() fixed"),
        call("run_terminal", command="sleep 5", timeout_s=1) + call("run_terminal", command="seq 1 50000")
        + call("read_file", path="../etc/passwd") + call("teleport", to="mars")
        + call("read_file", path=1) + "<tool_call>{oops</tool_call>",
        "<think>all good</think>" + call("run_tests") + call("finish", summary="fixed add"),
    ]
    traj, policy = agent(task, sandbox, fmt, tok, turns, context_window=100_000)
    assert traj.stop_reason == StopReason.FINISHED and traj.error is None
    statuses = [m["content"].split(":")[0].split("\n")[0] for m in tool_msgs(traj)]
    names = [m["name"] for m in tool_msgs(traj)]
    assert names == ["read_file", "list_dir", "glob", "grep", "run_tests", "read_lints",
                     "edit_file", "edit_file", "edit_file", "write_file", "memory",
                     "run_terminal", "run_terminal", "read_file", "teleport", "read_file",
                     "invalid_tool_call", "run_tests", "finish"]
    out = [m["content"] for m in tool_msgs(traj)]
    assert out[0].startswith("     1\tdef add(a, b):") and "pytest: 1 failed, 1 passed" in out[4]
    assert "matches 2 times" in out[6] and "0 matches" in out[7] and out[8].startswith("Edited")
    assert out[11].startswith("Command timed out after 1 s") and "characters omitted" in out[12]
    assert "leaves the workspace" in out[13] and "unknown tool 'teleport'" in out[14]
    assert "must be string" in out[15] and "not valid JSON" in out[16]
    assert out[17] == "pytest: 2 passed (exit code 0)" and out[18] == "Finished."
    assert statuses.count("Invalid tool call") == 3
    c = traj.counters
    assert (c.turns, c.tool_calls, c.broken_tool_calls) == (4, 19, 3)
    assert c.thinking_tokens == len(fmt.encode("<think>all good</think>"))
    assert c.tool_call_tokens > 0 and c.tool_output_tokens > 0
    assert "+    return a + b" in traj.diff and "NOTES.md" in traj.diff
    assert json.loads(traj.metadata["memory"]) == ["add() fixed"]
    assert traj.metadata["finish_summary"] == "fixed add" and policy.released == ["g/0"]
    assert_token_exact(traj, policy, fmt)


def test_segment_decodes_to_the_rendered_conversation(task, dsandbox, fmt, tok):
    turns = [call("read_file", path="README.md"), call("glob", pattern="*.md") + call("finish")]
    traj, policy = agent(task, dsandbox, fmt, tok, turns)
    msgs = list(traj.messages)
    # the segment ends with the finishing turn: render everything before it
    rendered = fmt.render(msgs[:-3], tool_schemas(make_tools()), add_generation_prompt=True)
    seg_text = tok.decode(list(traj.segments[0].token_ids_T))
    assert seg_text.startswith(rendered)
    assert seg_text[len(rendered):] == fmt.decode(policy.tokenizer.encode(turns[1])) + "<|im_end|>"
    assert_token_exact(traj, policy, fmt)


def test_trajectory_json_round_trip(task, dsandbox, fmt, tok):
    traj, _ = agent(task, dsandbox, fmt, tok, [call("read_file", path="pkg/calc.py"), "Done, no changes."])
    assert traj.stop_reason == StopReason.ANSWERED
    assert Trajectory.from_json(traj.to_json()) == traj


def test_a_trajectory_holding_invalid_unicode_still_saves(task, dsandbox, fmt, tok):
    """Text that is not valid Unicode (an error naming a file whose name is not UTF-8) is
    written with ASCII escapes: the JSON is UTF-8 and reads back to the same trajectory."""
    traj, _ = agent(task, dsandbox, fmt, tok, [call("read_file", path="pkg/calc.py"), "Done."])
    bad = dataclasses.replace(traj, error="cannot read 'a\udcffb'",
                              metadata={**traj.metadata, "note": "\ud800"})
    text = bad.to_json()
    assert text.isascii() and Trajectory.from_json(text) == bad
    assert '"error": "é漢"' in dataclasses.replace(traj, error="é漢").to_json()  # valid text stays


class Sleepy:
    """A test-double tool that sleeps, to observe concurrency."""

    description = "sleep"
    parameters = obj_schema({}, [])

    def __init__(self, name: str, read_only: bool) -> None:
        self.name, self.read_only, self.spans = name, read_only, []

    async def run(self, args: dict[str, Any], ctx) -> str:
        t = time.monotonic()
        await asyncio.sleep(0.3)
        self.spans.append((t, time.monotonic()))
        return "slept"


def test_broken_calls_are_recorded_as_their_own_token_spans(task, dsandbox, fmt, tok):

    good = call("read_file", path="pkg/calc.py")
    unparsable = '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>'
    unknown = call("teleport", to="mars")
    turns = [good, good + unparsable + " and " + unknown + good, good]
    traj, policy = agent(task, dsandbox, fmt, tok, turns, max_turns=3)
    (seg,) = traj.segments
    assert traj.counters.broken_tool_calls == 2
    spans = traj.broken_spans
    assert len(spans) == 2 and {s[0] for s in spans} == {0}
    # each span is exactly one broken block of the second turn, not the valid calls around it
    got = sorted(fmt.decode(list(seg.token_ids_T[a:b])) for _, a, b in spans)
    assert got == sorted([unknown, unparsable])
    turn_start = len(policy.prompts[1])
    assert all(a >= turn_start and all(seg.loss_mask_T[a:b]) for _, a, b in spans)


def test_read_only_calls_run_concurrently_mutating_in_order(task, dsandbox, fmt, tok):
    ro, rw = Sleepy("peek", True), Sleepy("poke", False)
    turns = [call("peek") * 3, call("poke") * 3, call("finish")]
    traj, _ = agent(task, dsandbox, fmt, tok, turns, tools=[ro, rw] + make_tools(["finish"]))
    assert traj.stop_reason == StopReason.FINISHED
    assert max(s for s, _ in ro.spans) < min(e for _, e in ro.spans)  # all three overlapped
    assert all(rw.spans[i][1] <= rw.spans[i + 1][0] for i in range(2))  # one after another


def test_write_then_read_in_one_turn_sees_the_write(task, dsandbox, fmt, tok):
    turns = [call("write_file", path="a.txt", content="v1\n") + call("read_file", path="a.txt")
             + call("edit_file", path="a.txt", old_string="v1", new_string="v2")
             + call("read_file", path="a.txt"), "ok"]
    traj, _ = agent(task, dsandbox, fmt, tok, turns)
    out = [m["content"] for m in tool_msgs(traj)]
    assert out[1] == "     1\tv1" and out[3] == "     1\tv2"


def test_budgets(task, dsandbox, fmt, tok, repo):
    loop = [call("list_dir")] * 10
    assert agent(task, dsandbox, fmt, tok, loop, max_turns=3)[0].stop_reason == StopReason.MAX_TURNS
    t, _ = agent(task, dsandbox, fmt, tok, loop, max_total_new_tokens=50)
    assert t.stop_reason == StopReason.MAX_TOKENS and t.counters.output_tokens == 50
    t, _ = agent(task, dsandbox, fmt, tok, ["x" * 100], max_new_tokens=20)
    assert t.stop_reason == StopReason.MAX_TOKENS
    window = len(fmt.prompt_ids([{"role": "user", "content": task.prompt}],
                                tool_schemas(make_tools()))) + 400
    t, p = agent(task, dsandbox, fmt, tok, loop, context_window=window)
    assert t.stop_reason == StopReason.CONTEXT_FULL and 1 <= t.counters.turns < 10
    assert len(t.segments[0].token_ids_T) <= window
    assert_token_exact(t, p, fmt)
    t, _ = agent(task, dsandbox, fmt, tok, [call("run_terminal", command="sleep 10")] * 3, wall_time_s=1)
    assert t.stop_reason == StopReason.WALL_TIME and t.wall_s < 5


def test_cut_turn_is_closed_before_the_tool_output(task, dsandbox, fmt, tok):
    turns = [call("list_dir") + "<tool_call>" + "x" * 200, "ok"]
    n = len(fmt.encode(call("list_dir"))) + 20
    traj, policy = agent(task, dsandbox, fmt, tok, turns, max_new_tokens=n)
    assert traj.stop_reason == StopReason.ANSWERED and traj.counters.broken_tool_calls == 1
    seg = traj.segments[0]
    first_gen_end = len(policy.prompts[0]) + n
    assert seg.token_ids_T[first_gen_end] == fmt.eot_id and seg.loss_mask_T[first_gen_end] == 0


def test_context_hook_starts_a_new_segment(task, dsandbox, fmt, tok):
    """The self-summarization hook point: a hook that restarts from the prompt makes room."""
    calls = []

    async def restart(run: AgentRun) -> bool:
        calls.append(len(run.token_ids))
        run.close_segment()
        run.add_context(prompt)
        return True

    prompt = fmt.prompt_ids([{"role": "user", "content": task.prompt}], tool_schemas(make_tools()))

    policy = ScriptedPolicy(tok, [call("list_dir", depth=3)] * 6 + [call("finish")])
    traj = asyncio.run(run_agent(task, dsandbox, policy, fmt, make_tools(), AgentConfig(context_window=len(prompt) + 600),
                                 group_id="g", trajectory_id="t", on_context_full=restart))
    assert traj.stop_reason == StopReason.FINISHED and calls and len(traj.segments) == len(calls) + 1
    sampled = [t for s in traj.segments for t, m in zip(s.token_ids_T, s.loss_mask_T, strict=True) if m]
    assert sampled == [t for text in policy.turns for t in fmt.encode(text) + [fmt.eot_id]]
    # every prompt the policy got is a prefix of one segment; each segment ends with its last turn
    for p in policy.prompts:
        assert any(list(s.token_ids_T[: len(p)]) == p for s in traj.segments)
    assert all(s.loss_mask_T[-1] == 1 for s in traj.segments)


class BrokenSandbox:
    """Sandbox double whose exec fails like a crashed container."""

    def __init__(self, inner):
        self.inner = inner

    async def exec(self, cmd, *, timeout_s=60.0, env=None):
        raise SandboxError("container died")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_infra_failures_end_as_infra_error(task, dsandbox, fmt, tok):
    t, policy = agent(task, dsandbox, fmt, tok, [call("list_dir")])  # script runs out -> PolicyError
    assert t.stop_reason == StopReason.INFRA_ERROR and "PolicyError" in t.error and t.is_infra_error
    assert policy.released == ["g/0"]
    t, _ = agent(task, BrokenSandbox(dsandbox), fmt, tok, [call("run_terminal", command="ls"), "x"])
    assert t.stop_reason == StopReason.INFRA_ERROR and "container died" in t.error
    assert t.counters.broken_tool_calls == 0


class Buggy:
    name, description, read_only = "buggy", "raises", True
    parameters = obj_schema({}, [])

    async def run(self, args, ctx) -> str:
        raise RuntimeError("bug in the tool")


def test_a_bug_in_a_tool_is_not_the_models_fault(task, dsandbox, fmt, tok):
    t, _ = agent(task, dsandbox, fmt, tok, [call("buggy"), "x"], tools=[Buggy()])
    assert t.stop_reason == StopReason.INFRA_ERROR and "RuntimeError: bug in the tool" in t.error
    assert t.counters.broken_tool_calls == 0


def test_a_prompt_that_cannot_fit_is_a_config_failure_not_the_models(task, dsandbox, fmt, tok):
    t, policy = agent(task, dsandbox, fmt, tok, [call("finish")], context_window=64)
    assert t.stop_reason == StopReason.INFRA_ERROR and t.counters.turns == 0
    assert "raise agent.context_window" in t.error and policy.prompts == []
    assert policy.released == ["g/0"]


def test_calls_past_the_per_turn_cap_are_broken_calls(task, dsandbox, fmt, tok):
    turn = "".join(call("read_file", path="README.md", limit=1) for _ in range(7))
    traj, _ = agent(task, dsandbox, fmt, tok, [turn, call("finish")], max_calls_per_turn=5)
    outs = [m["content"] for m in tool_msgs(traj)]
    assert len(set(outs[:5])) == 1 and outs[0].startswith("     1\t# calc")
    assert all(o.startswith("Invalid tool call: this turn made 7 calls and at most 5 run")
               for o in outs[5:7])
    assert (traj.counters.tool_calls, traj.counters.broken_tool_calls) == (8, 2)
    with pytest.raises(ConfigError, match="max_calls_per_turn must be >= 1"):
        AgentConfig(max_calls_per_turn=0)


class Crashing(ScriptedPolicy):
    """An engine double with a bug of its own (not a ``LooprlError``)."""

    async def generate(self, prompt_ids, params, **kw):
        raise KeyError("bug in the engine")


def test_an_unexpected_exception_ends_the_trajectory_not_the_run(task, dsandbox, fmt, tok):
    policy = Crashing(tok, [call("finish")])
    traj = asyncio.run(run_agent(task, dsandbox, policy, fmt, make_tools(), AgentConfig(),
                                 group_id="g", trajectory_id="g/0"))
    assert traj.stop_reason == StopReason.INFRA_ERROR and "KeyError" in traj.error
    assert policy.released == ["g/0"]
