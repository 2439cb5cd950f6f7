"""Seeded fuzzed turns in every tool-call format (``format_fuzz``; Hermes: ``turn_fuzz``, as
``tests/harness/test_fuzz.py`` runs it): 4,000 turns per format through ``parse_turn`` and one
in ten through ``ChatFormat.parse_ids`` with the family's tokenizer. Nothing escapes as an
exception; every count, name and argument is the one the turn was built with; every call
saves as UTF-8 JSON; every error is one line.

    nice -n 15 .venv/bin/python -m pytest -q tests/chat/test_tool_format_fuzz.py
"""

from __future__ import annotations

import json
import random
import traceback

import pytest

from looprl.chat import ChatFormat, parse_turn
from looprl.harness.tools import make_tools, tool_schemas
from tests.chat_families import NAMES, family_tokenizer
from tests.harness.turn_fuzz import AGENT_TOOLS, fuzz_turn

from .format_fuzz import fuzz_format_turn

TURNS = 4_000
BIG = 20_000
SCHEMAS = tool_schemas(make_tools(AGENT_TOOLS))
TYPES = {s["function"]["name"]: {k: v.get("type") for k, v in
                                 s["function"]["parameters"]["properties"].items()}
         for s in SCHEMAS}


def check_turn(name: str, turn, fmt: ChatFormat | None) -> None:
    """One fuzzed turn: the calls and broken calls it was built with, from text and (``fmt``)
    from tokens."""
    want_calls, want_broken = len(turn.runs), turn.broken
    parsed = parse_turn(turn.text, tool_format=name, types=TYPES, call_prefix="f")
    got = (len(parsed.tool_calls), len(parsed.errors))
    assert got == (want_calls, want_broken), (got, want_calls, want_broken, turn.text[:3000])
    for c in parsed.tool_calls:
        assert isinstance(json.loads(c.arguments), dict)
        (c.name + c.arguments).encode("utf-8")
    for e in parsed.errors:
        assert "\n" not in e, e
    assert len({c.id for c in parsed.tool_calls}) == len(parsed.tool_calls)
    if name != "hermes":
        for c, (n, args) in zip(parsed.tool_calls, turn.calls, strict=True):
            assert c.name == n.strip(), (c.name, n)
            if args is not None:
                assert json.loads(c.arguments) == args, (c.arguments[:300], args)
        if name == "harmony":
            assert parsed.thinking_text == "\n".join(turn.thinking)
    if fmt is not None:
        ids = fmt.encode(turn.text) + [fmt.eot_id]
        t = fmt.parse_ids(ids, call_prefix="f")
        assert (len(t.tool_calls), len(t.errors)) == got
        assert [c.arguments for c in t.tool_calls] == [c.arguments for c in parsed.tool_calls]
        spans = sorted(t.call_token_spans + t.error_token_spans)
        assert len(spans) == sum(got) and all(0 <= a <= b <= len(ids) for a, b in spans)
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
        assert t.tool_call_tokens == sum(b - a for a, b in spans)


@pytest.mark.slow  # ~4,000 turns a format, ~10-30 s each on one core
@pytest.mark.parametrize("name", NAMES)
def test_fuzzed_turns_parse_to_what_they_were_built_from(name, capsys):
    rng = random.Random(56 + NAMES.index(name))
    fmt = ChatFormat(family_tokenizer(name))
    fmt.types.update(TYPES)
    exceptions, calls, broken = [], 0, 0
    for i in range(TURNS):
        many = rng.randint(150, 400) if i % 1000 == 999 else 0
        turn = (fuzz_turn(rng, big=BIG, many=many, needs_action=False) if name == "hermes"
                else fuzz_format_turn(rng, name, big=BIG, many=many, needs_action=False))
        try:
            check_turn(name, turn, fmt if i % 10 == 3 else None)
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 — counted: the parser must never raise
            exceptions.append(traceback.format_exc())
        calls, broken = calls + len(turn.runs), broken + turn.broken
    with capsys.disabled():
        print(f"\n[fuzz {name}] turns {TURNS}, calls {calls}, broken {broken}, "
              f"exceptions {len(exceptions)}")
    assert not exceptions, exceptions[0]
    assert calls > TURNS and broken > TURNS // 2  # the mix reached both outcomes, in numbers
