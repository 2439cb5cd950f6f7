"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the turn is the call,

    {"name": "read_file", "parameters": {"path": "README.md"}}

optionally after ``<|python_tag|>`` (the model's tool-call token), several calls separated by
``;`` (Llama's own template renders one call a turn; the models write several this way).

How a turn is read. A turn whose text (after leading whitespace) opens with ``{`` is a call
list from there; elsewhere ``<|python_tag|>`` opens one, and the text before it is content. A
call list is JSON values separated by whitespace and ``;``: each is one call, an object with a
``name`` string and ``parameters`` (the template's key; ``arguments`` is taken too, not both).
The list ends where no ``{`` follows; the text after it, up to the next ``<|python_tag|>``, is
content. A value that is not JSON (Llama's built-in ``brave_search.call(query=...)`` syntax
included: it is never evaluated) is a broken call up to the next ``<|python_tag|>`` or the end of
the turn, as its end cannot be known; markers inside a JSON string are data.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.chat.spans import ParamTypes, Span, decode_at, skip_space

PYTHON_TAG = "<|python_tag|>"
EXAMPLE = '{"name": "read_file", "parameters": {"path": "README.md"}}'
_SEP = re.compile(r"[ \t\n\r;]*")


def _call(obj: Any) -> dict[str, Any] | str:
    """A decoded value as ``{"name", "arguments", ...}`` (the shared check does the rest)."""
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object with name and parameters; write e.g. {EXAMPLE}"
    if "parameters" in obj and "arguments" in obj:
        return "tool call has both \"parameters\" and \"arguments\"; give the arguments once"
    out = {k: v for k, v in obj.items() if k != "parameters"}
    if "parameters" in obj:
        out["arguments"] = obj["parameters"]
    return out


def _call_list(text: str, start: int, spans: list[Span]) -> int:
    """Calls from ``text[start]`` on (module docstring); returns where the list ends."""
    pos = start
    while True:
        i = skip_space(text, pos)
        if not text.startswith("{", i):
            return pos
        got = decode_at(text, i)
        if isinstance(got, str):
            nxt = text.find(PYTHON_TAG, i)
            end = nxt if nxt >= 0 else len(text)
            snippet = text[i:end].strip()[:80]
            spans.append(Span("broken", pos, end, f"tool call is not valid JSON ({got}) in "
                              f"{snippet!r}; write e.g. {EXAMPLE}"))
            return end
        sep = _SEP.match(text, got[1])
        assert sep is not None
        call = _call(got[0])
        spans.append(Span("broken" if isinstance(call, str) else "call", pos, sep.end(), call))
        pos = sep.end()


def blocks(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """Content and calls of ``text[start:]`` (the module docstring's rules)."""
    spans: list[Span] = []
    pos = start
    if text.startswith("{", skip_space(text, start)):
        pos = _call_list(text, start, spans)
    while (tag := text.find(PYTHON_TAG, pos)) >= 0:
        if tag > pos:
            spans.append(Span("content", pos, tag))
        first = len(spans)
        after = _call_list(text, tag + len(PYTHON_TAG), spans)
        if len(spans) == first:  # a tag with no call after it
            nxt = text.find(PYTHON_TAG, after)
            end = nxt if nxt >= 0 else len(text)
            snippet = text[after:end].strip()[:80]
            spans.append(Span("broken", tag, end, f"{PYTHON_TAG} is not followed by a JSON call "
                              f"(got {snippet!r}); write e.g. {PYTHON_TAG}{EXAMPLE}"))
            pos = end
            continue
        s = spans[first]  # the tag belongs to the first call after it
        spans[first] = Span(s.kind, tag, s.end, s.value)
        pos = after
    if pos < len(text):
        spans.append(Span("content", pos, len(text)))
    return spans


def render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text a model writes for ``calls``: the template's JSON, ``; ``-separated."""
    return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False)
                     for n, a in calls)


def detect(rendered: str) -> bool:
    return (re.search(r'\{"name":\s*"looprl_probe",\s*"parameters":', rendered) is not None
            and "<tool_call>" not in rendered)
