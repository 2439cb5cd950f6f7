"""Mistral tool calls, after the ``[TOOL_CALLS]`` token, in the two forms its tokenizers use:

    pre-v11 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Codestral):
        [TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "README.md"}, "id": "a1b2c3d4e"}]
    v11+ (Mistral-Small-3.1+, Devstral, Ministral-3; v13 adds [CALL_ID]):
        [TOOL_CALLS]read_file[ARGS]{"path": "README.md"}[TOOL_CALLS]glob[ARGS]{"pattern": "*"}

How a turn is read. Text before a ``[TOOL_CALLS]`` is content. Pre-v11: the token is followed
by one JSON array; each element is one call, an object with ``name``, ``arguments`` and
optionally the ``id`` string the template writes (dropped: looprl names calls itself). An array
that does not parse is one broken call up to the next ``[TOOL_CALLS]`` or the end; an element
that is no call is a broken call of its own. v11: the token is followed by the tool's name (one
word), optionally ``[CALL_ID]`` and an id, ``[ARGS]`` and one JSON object; anything else is a
broken call up to the next ``[TOOL_CALLS]`` or the end. A stray ``[ARGS]`` or ``[CALL_ID]`` is
broken too. After the calls, text up to the next ``[TOOL_CALLS]`` is content.

Call ids are nine letters and digits (``call_id``): Mistral's templates refuse any other id on
a tool message.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any

from looprl.chat.spans import ParamTypes, Span, decode_at, skip_space

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
EXAMPLE = '[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "README.md"}}]'
EXAMPLE_V11 = '[TOOL_CALLS]read_file[ARGS]{"path": "README.md"}'
_ALNUM = string.ascii_letters + string.digits
_NAME = re.compile(r"[^\s\[\]{}]+")
_STRAY = re.compile(f"{re.escape(ARGS)}|{re.escape(CALL_ID)}")


def call_id(prefix: str, k: int) -> str:
    """A nine-character alphanumeric id, stable for (``prefix``, ``k``)."""
    digest = int.from_bytes(hashlib.sha256(f"{prefix}_{k}".encode()).digest()[:8], "big")
    out = ""
    for _ in range(9):
        digest, r = divmod(digest, len(_ALNUM))
        out += _ALNUM[r]
    return out


def _element(obj: Any) -> dict[str, Any] | str:
    if isinstance(obj, dict) and isinstance(obj.get("id", ""), str):
        return {k: v for k, v in obj.items() if k != "id"}
    return f"tool call must be a JSON object with name and arguments; write e.g. {EXAMPLE}"


def _end(text: str, i: int) -> int:
    nxt = text.find(TOOL_CALLS, i)
    return nxt if nxt >= 0 else len(text)


def _array(text: str, tag: int, spans: list[Span]) -> int:
    """Pre-v11: the calls of the array after the ``[TOOL_CALLS]`` at ``tag``; where they end."""
    i = skip_space(text, tag + len(TOOL_CALLS))
    items: list[tuple[int, Any]] = []
    err = "" if text.startswith("[", i) else f"expected a JSON array after {TOOL_CALLS}"
    i += 1
    while not err:
        i = skip_space(text, i)
        if text.startswith("]", i) and not items:
            i += 1
            break
        got = decode_at(text, i)
        if isinstance(got, str):
            err = got
            break
        items.append((got[1], got[0]))
        i = skip_space(text, got[1])
        if text.startswith(",", i):
            i += 1
        elif text.startswith("]", i):
            i += 1
            break
        else:
            err = f"expected , or ] at character {i - tag} of the call list"
    if err or not items:
        end = _end(text, tag + 1)
        why = err or f"{TOOL_CALLS} holds an empty list"
        spans.append(Span("broken", tag, end, f"tool calls are not a valid JSON list ({why}) in "
                          f"{text[tag:end][:80]!r}; write e.g. {EXAMPLE}"))
        return end
    begin = tag
    for k, (after, obj) in enumerate(items):
        stop = i if k == len(items) - 1 else after
        call = _element(obj)
        spans.append(Span("broken" if isinstance(call, str) else "call", begin, stop, call))
        begin = stop
    return i


def _v11(text: str, tag: int, spans: list[Span]) -> int:
    """v11: the one call after the ``[TOOL_CALLS]`` at ``tag``; where it ends."""
    i = tag + len(TOOL_CALLS)
    m = _NAME.match(text, i)
    err = ""
    if m is None:
        err = "no tool name after it"
    else:
        i = m.end()
        if text.startswith(CALL_ID, i):
            idm = _NAME.match(text, i + len(CALL_ID))
            i = idm.end() if idm else i + len(CALL_ID)
        if not text.startswith(ARGS, i):
            err = f"the name {m.group()[:40]!r} is not followed by {ARGS}"
        else:
            got = decode_at(text, i + len(ARGS))
            if isinstance(got, str):
                err = f"the arguments are not valid JSON ({got})"
            else:
                spans.append(Span("call", tag, got[1], {"name": m.group(), "arguments": got[0]}))
                return got[1]
    end = _end(text, tag + 1)
    spans.append(Span("broken", tag, end, f"tool call after {TOOL_CALLS}: {err} in "
                      f"{text[tag:end][:80]!r}; write e.g. {EXAMPLE_V11}"))
    return end


def _blocks(text: str, start: int, one: Any, stray: bool) -> list[Span]:
    spans: list[Span] = []
    pos = start
    while True:
        tag = text.find(TOOL_CALLS, pos)
        upto = tag if tag >= 0 else len(text)
        while stray and (m := _STRAY.search(text, pos, upto)) is not None:
            if m.start() > pos:
                spans.append(Span("content", pos, m.start()))
            spans.append(Span("broken", m.start(), m.end(),
                              f"found {m.group()} outside a call; write e.g. {EXAMPLE_V11}"))
            pos = m.end()
        if upto > pos:
            spans.append(Span("content", pos, upto))
        if tag < 0:
            return spans
        pos = one(text, tag, spans)


def blocks(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """Pre-v11 content and calls of ``text[start:]`` (the module docstring's rules)."""
    return _blocks(text, start, _array, False)


def blocks_v11(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """v11 content and calls of ``text[start:]`` (the module docstring's rules)."""
    return _blocks(text, start, _v11, True)


def render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return TOOL_CALLS + " " + json.dumps([{"name": n, "arguments": a} for n, a in calls],
                                         ensure_ascii=False)


def render_v11(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(f"{TOOL_CALLS}{n}{ARGS}{json.dumps(a, ensure_ascii=False)}" for n, a in calls)


def detect(rendered: str) -> bool:
    return re.search(r'\[TOOL_CALLS\]\s*\[\s*\{\s*"name":\s*"looprl_probe"', rendered) is not None


def detect_v11(rendered: str) -> bool:
    return re.search(r"\[TOOL_CALLS\]looprl_probe(\[CALL_ID\]\w+)?\[ARGS\]", rendered) is not None
