"""Hermes / Qwen2.5 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one block per call, any number per turn (the default format, and the tiny model's).

The rules (``looprl.chat.format``'s docstring has the whole reading): ``<tool_call>`` opens a
block; when one JSON value follows it (whitespace allowed) and then ``</tool_call>``, that is the
block, so markers inside the JSON's strings are data. Otherwise the block is broken and ends at
the first ``</tool_call>`` after it, just before the next ``<tool_call>``, or at the end of the
turn. A ``</tool_call>`` outside any block is a broken call. The rest is content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.chat.spans import ParamTypes, Span, decode_at, marked_blocks, skip_space

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
EXAMPLE = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'


def _json_block(text: str, body: int) -> tuple[Any, int] | str:
    """The JSON value starting at ``text[body]`` when ``</tool_call>`` follows it, and the
    index after that marker; otherwise why not."""
    got = decode_at(text, body)
    if isinstance(got, str):
        return got
    value, after = got
    after = skip_space(text, after)
    if not text.startswith(TOOL_CLOSE, after):
        return f"extra text after the JSON value, at character {after - body} of the call"
    return value, after + len(TOOL_CLOSE)


def blocks(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """Content and call blocks of ``text[start:]`` (the module docstring's rules)."""
    return marked_blocks(text, start, TOOL_OPEN, TOOL_CLOSE, _read_block)


def _read_block(text: str, at: int, body: int) -> Span:
    block = _json_block(text, body)
    if isinstance(block, tuple):
        return Span("call", at, block[1], block[0])
    close, nxt = text.find(TOOL_CLOSE, body), text.find(TOOL_OPEN, body)
    if close >= 0 and (nxt < 0 or close < nxt):
        snippet = text[body:close].strip()[:80]
        err = f"tool call is not valid JSON ({block}) in {snippet!r}; write e.g. {EXAMPLE}"
        return Span("broken", at, close + len(TOOL_CLOSE), err)
    return Span("broken", at, nxt if nxt >= 0 else len(text),
                f"unclosed {TOOL_OPEN} block: end each call with {TOOL_CLOSE}")


def render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text a model writes for ``calls`` (name, arguments) in this format."""
    return "".join(TOOL_OPEN + json.dumps({"name": n, "arguments": a}, ensure_ascii=False)
                   + TOOL_CLOSE for n, a in calls)


def detect(rendered: str) -> bool:
    """A template's rendering of the probe call (``tool_formats.PROBE``) is in this format."""
    return re.search(r'<tool_call>\s*\{\s*"name":\s*"looprl_probe"', rendered) is not None
