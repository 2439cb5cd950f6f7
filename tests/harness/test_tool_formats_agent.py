"""The agent loop in each model family's tool-call format: a scripted model writing calls as
that family does, through a tokenizer with the family's chat template, fixes the calc repo on
the DirSandbox double; broken calls come back with the format's own example; and fuzzed turns
(``tests/chat/format_fuzz.py``) through the real tools are counted exactly."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from looprl.chat import FORMATS, ChatFormat
from looprl.harness.agent import run_agent
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools, tool_schemas
from looprl.types import StopReason
from tests.chat.format_fuzz import fuzz_format_turn
from tests.chat_families import FAMILIES, NAMES, family_tokenizer

from .conftest import agent_config
from .turn_fuzz import AGENT_TOOLS


def run(task, sandbox, name, turns, tools=None, **cfg):
    tok = family_tokenizer(name)
    fmt = ChatFormat(tok)
    policy = ScriptedPolicy(tok, turns, end_of_turn=fmt.eot)
    traj = asyncio.run(run_agent(task, sandbox, policy, fmt, tools or make_tools(),
                                 agent_config(**cfg), group_id="g", trajectory_id="g/0"))
    return traj, policy, fmt


@pytest.mark.parametrize("name", NAMES)
def test_a_scripted_model_fixes_the_repo_in_its_own_format(name, task, dsandbox):
    render = FORMATS[name].render
    turns = [render([("read_file", {"path": "pkg/calc.py", "limit": 2})]),
             render([("edit_file", {"path": "pkg/calc.py", "old_string": "return a - b\n\n\ndef sub",
                                    "new_string": "return a + b\n\n\ndef sub"})]),
             render([("finish", {"summary": "add adds"})])]
    traj, policy, fmt = run(task, dsandbox, name, turns, context_window=100_000)
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    tool = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["name"] for m in tool] == ["read_file", "edit_file", "finish"]
    assert tool[0]["content"].startswith("     1\tdef add(a, b):"), tool[0]["content"]
    assert traj.counters.broken_tool_calls == 0 and traj.counters.tool_calls == 3
    assert "+    return a + b" in traj.diff
    (seg,) = traj.segments  # token-in/token-out: every prompt extends the one before it
    ids = list(seg.token_ids_T)
    assert all(ids[:len(p)] == p for p in policy.prompts)
    head = fmt.tokenizer.decode(policy.prompts[0])  # the template's header frames the turn
    assert head == fmt.render([m for m in traj.messages if m["role"] in ("system", "user")][:2],
                              tool_schemas(make_tools()))
    if name != "hermes":  # the family's own special tokens frame the turns
        assert FAMILIES[name]["special"][0] in fmt.tokenizer.get_vocab()
    assert fmt.tool_format == name


@pytest.mark.parametrize("name", NAMES)
def test_a_broken_call_is_answered_with_the_formats_own_example(name, task, dsandbox):
    broken = {"hermes": "<tool_call>{oops</tool_call>", "qwen3_coder": "<tool_call>oops</tool_call>",
              "llama3": "<|python_tag|>oops(1)", "mistral": "[TOOL_CALLS] oops",
              "mistral_v11": "[TOOL_CALLS]oops", "harmony": "<|channel|>commentary to=python"
              "<|message|>oops"}[name]
    traj, _, _ = run(task, dsandbox, name, [broken, FORMATS[name].render([("finish", {})])],
                     context_window=100_000)
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    first = [m for m in traj.messages if m["role"] == "tool"][0]
    assert first["content"].startswith("Invalid tool call")
    assert FORMATS[name].example.splitlines()[0][:20] in first["content"], first["content"]
    assert traj.counters.broken_tool_calls == 1


@pytest.mark.slow  # ~5-15 s a format: real tools on 40 turns
@pytest.mark.parametrize("name", [n for n in NAMES if n != "hermes"])  # hermes: test_fuzz.py
def test_fuzzed_turns_through_the_agent_loop_are_counted(name, task, dsandbox):
    rng = random.Random(7 + NAMES.index(name))
    max_turns, cap = 10, 64
    for _ in range(4):
        turns = [fuzz_format_turn(rng, name, big=2_000, many=rng.randint(65, 90)
                                  if rng.random() < 0.05 else 0) for _ in range(max_turns)]
        traj, _, _ = run(task, dsandbox, name, [t.text for t in turns], tools=make_tools(AGENT_TOOLS),
                         max_turns=max_turns, context_window=10**8, max_total_new_tokens=10**8,
                         max_new_tokens=10**7, max_calls_per_turn=cap)
        assert traj.stop_reason == StopReason.MAX_TURNS, traj.error
        c = traj.counters
        shown = [m for m in traj.messages if m["role"] == "tool"
                 and m["content"].startswith("Invalid tool call")]
        assert c.broken_tool_calls == len(shown) == sum(t.broken_results(cap) for t in turns)
        assert c.tool_calls == sum(len(t.runs) + t.broken for t in turns)
        json.loads(traj.to_json())
