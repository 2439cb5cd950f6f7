"""The pieces every tool-call format's parser shares: the ``Span`` a parser cuts a turn into and
the guarded JSON decoder (finite numbers of at most ``MAX_NUMBER_CHARS`` characters, nesting of at
most ``MAX_DEPTH``, no NaN/Infinity). A parser never runs ``eval``: JSON goes through
``DECODER``, and everything else is plain string matching.

    value, end = DECODER.raw_decode(text, skip_space(text, i))
    spans.append(Span("call", start, end, {"name": ..., "arguments": ...}))
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of a call's JSON (the object itself is depth 1); tools take flat arguments."""
MAX_NUMBER_CHARS = 100
"""Longest number literal in a call: no argument needs more, and CPython refuses ints of over
4,300 digits (and converts long ones in quadratic time)."""
SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
SURROGATE = re.compile("[\ud800-\udfff]")
ParamTypes = Mapping[str, Mapping[str, str]]
"""Tool name -> parameter -> JSON-schema type: how a format whose values are text (Qwen3-Coder's
XML) types them."""


@dataclass(frozen=True)
class Span:
    """A stretch of a turn's text: ``kind`` is think, content, call, broken or markup (a
    format's structure around content, e.g. harmony's message headers: neither text nor call)."""

    kind: str
    start: int
    end: int
    value: Any = None
    """call: ``{"name": ..., "arguments": ...}`` (decoded JSON, checked by the format module);
    broken: the error message; think: the thought's text when the format has its own markers."""


class BadNumber(ValueError):
    """A number literal no tool argument may hold (the decoder's hooks raise it)."""


def _number(text: str, convert: Callable[[str], float]) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BadNumber(f"a number of {len(text)} characters; numbers in tool calls have at "
                        f"most {MAX_NUMBER_CHARS}")
    value = convert(text)
    if math.isinf(value):
        raise BadNumber(f"the number {text} is too large for a double")
    return value


def _constant(name: str) -> Any:
    raise BadNumber(f"{name} is not a JSON number")


DECODER = json.JSONDecoder(parse_int=lambda s: _number(s, int),
                           parse_float=lambda s: _number(s, float), parse_constant=_constant)


def depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            stack += [(x, d + 1) for x in v if isinstance(x, (dict, list))]
    return deepest


def json_error(e: Exception, start: int) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at character {e.pos - start} of the call"
    if isinstance(e, RecursionError):
        return f"nested deeper than {MAX_DEPTH} levels"
    return str(e)


def skip_space(text: str, i: int) -> int:
    m = SPACE.match(text, i)
    assert m is not None, "SPACE matches the empty string, so it matches at every index"
    return m.end()


def decode_at(text: str, i: int) -> tuple[Any, int] | str:
    """The JSON value at ``text[i]`` (whitespace skipped) and the index after it, or why not."""
    try:
        return DECODER.raw_decode(text, skip_space(text, i))
    except (ValueError, RecursionError) as e:
        return json_error(e, i)


def content_between(spans: list[Span], start: int, end: int) -> None:
    """Append a content span for ``text[start:end]`` when it is not empty."""
    if end > start:
        spans.append(Span("content", start, end))


BlockReader = Callable[[str, int, int], Span]
"""Reads one block: ``(text, at, body)`` with the open marker at ``text[at:body]``; returns its
``call`` or ``broken`` span, whose end is where the scan goes on."""


def marked_blocks(text: str, start: int, open_marker: str, close_marker: str,
                  read_block: BlockReader) -> list[Span]:
    """Content and blocks of ``text[start:]`` for a format whose calls sit between two markers
    (Hermes's JSON, Qwen3-Coder's XML): each ``open_marker`` starts a block ``read_block`` reads;
    a ``close_marker`` outside any block is a broken call; the rest is content."""
    marker = re.compile(f"{re.escape(open_marker)}|{re.escape(close_marker)}")
    spans: list[Span] = []
    pos = start
    while (m := marker.search(text, pos)) is not None:
        if m.start() > pos:
            spans.append(Span("content", pos, m.start()))
        if m.group() == close_marker:
            spans.append(Span("broken", m.start(), m.end(),
                              f"found {close_marker} without a matching {open_marker}"))
        else:
            spans.append(read_block(text, m.start(), m.end()))
        pos = spans[-1].end
    if pos < len(text):
        spans.append(Span("content", pos, len(text)))
    return spans
