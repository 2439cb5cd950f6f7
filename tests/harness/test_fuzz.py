"""Seeded fuzzed model outputs (``turn_fuzz``): 10,000 turns through ``parse_turn``, and a few
hundred through the real agent loop and tools. Nothing escapes as an exception; every count is
the one the turn was built with; every trajectory saves as JSON and UTF-8.

    nice -n 15 .venv/bin/python -m pytest -q tests/harness/test_fuzz.py
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from looprl.chat import ChatFormat, parse_turn
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.run_state import AgentExperimental
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools

from .turn_fuzz import AGENT_TOOLS, Turn, check_trajectory, fuzz_turn

PARSE_TURNS = 10_000
BIG = 100_000
"""Characters of the huge string arguments."""


def check_parse(turn: Turn) -> tuple[int, int]:
    """parse_turn on one fuzzed turn: the calls and broken blocks it was built with, calls
    that save as UTF-8 JSON, error messages that are text. (calls, broken) found."""
    parsed = parse_turn(turn.text)
    assert (len(parsed.tool_calls), len(parsed.errors)) == (len(turn.runs), turn.broken), turn.text
    for c in parsed.tool_calls:
        assert isinstance(json.loads(c.arguments), dict)
        (c.name + c.arguments).encode("utf-8")
    for e in parsed.errors:
        e.encode("utf-8")
    assert len({c.id for c in parsed.tool_calls}) == len(parsed.tool_calls)
    return len(parsed.tool_calls), len(parsed.errors)


def check_token_counts(turn: Turn, fmt: ChatFormat, slow: ChatFormat | None) -> None:
    """The token counts are those of the spans the turn was built with (the bytes tokenizer
    encodes each span on its own to the tokens it has in the turn), on both paths."""
    ids = fmt.encode(turn.text) + [fmt.eot_id]
    want = (len(fmt.encode(turn.thinking)), sum(len(fmt.encode(b)) for b in turn.blocks))
    for f in (fmt, slow) if slow is not None else (fmt,):
        got = f.parse_ids(ids)
        assert (got.thinking_tokens, got.tool_call_tokens) == want, turn.text


@pytest.mark.slow  # ~10 s of CPU: 10,000 turns, 300 MB of text
def test_ten_thousand_fuzzed_turns_parse_to_what_they_were_built_from(fmt):
    rng = random.Random(20_230)
    slow = ChatFormat(fmt.tokenizer)
    slow._marker_ids = {}  # markers as if sampled in pieces: the token-by-token path
    calls = broken = thinking = counted = 0
    for i in range(PARSE_TURNS):
        raw = i % 2 == 0  # lone surrogates as characters: parse_turn only (no tokenizer makes them)
        turn = fuzz_turn(rng, big=BIG, raw_surrogates=raw, needs_action=False,
                         many=rng.randint(1000, 3000) if i % 2000 == 999 else 0)
        c, b = check_parse(turn)
        calls, broken, thinking = calls + c, broken + b, thinking + bool(turn.thinking)
        if i % 40 == 1:
            check_token_counts(turn, fmt, slow if i % 200 == 1 else None)
            counted += 1
    # the mix reached every kind of outcome, in numbers
    assert calls > 20_000 and broken > 10_000 and thinking > 2_000 and counted == 250


@pytest.mark.slow  # ~10 s of CPU: 300 turns of real tools
def test_fuzzed_turns_through_the_agent_loop_are_counted_and_saved(task, dsandbox, fmt, tok):
    """300 fuzzed turns through ``run_agent`` with the real tools on the DirSandbox double: no
    trajectory fails, the broken-call counter is the number of broken tool messages the model
    saw, which is the number the turns were built with (calls past the per-turn cap
    included), and each trajectory saves as UTF-8 JSON and reads back equal."""
    rng = random.Random(4321)
    tools = make_tools(AGENT_TOOLS)
    cfg = AgentConfig(max_turns=15, context_window=10**8, max_total_new_tokens=10**8,
                      max_new_tokens=10**7, experimental=AgentExperimental(max_calls_per_turn=128))
    seen = 0
    for episode in range(20):
        turns = [fuzz_turn(rng, big=5_000, many=rng.randint(129, 160) if rng.random() < 0.03 else 0)
                 for _ in range(cfg.max_turns)]
        policy = ScriptedPolicy(tok, [t.text for t in turns])
        traj = asyncio.run(run_agent(task, dsandbox, policy, fmt, tools, cfg, group_id="fuzz",
                                     trajectory_id=f"fuzz/{episode}"))
        check_trajectory(traj, turns, fmt, cfg.experimental.max_calls_per_turn)
        seen += len(turns)
    assert seen == 300
