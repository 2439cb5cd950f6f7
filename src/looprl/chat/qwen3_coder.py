"""Qwen3-Coder tool calls, XML in the block markers Hermes uses:

    <tool_call>
    <function=read_file>
    <parameter=path>
    README.md
    </parameter>
    </function>
    </tool_call>

How a block is read. ``<tool_call>`` opens a block that ends at the first ``</tool_call>`` (XML
has no quoting: a value cannot hold ``</tool_call>`` nor ``</parameter>``, as in Qwen's own
template and parser). Inside: ``<function=NAME>``, then any number of ``<parameter=P>VALUE
</parameter>`` (whitespace between them), then ``</function>``; anything else is a broken call
that says what it expected. A value loses one leading and one trailing newline (the template
writes them). Values are text; a parameter whose tool schema (``types``, learnt from the prompt's
tools) says integer, number, boolean, array or object is decoded as JSON by the guarded decoder
(``True``/``False`` too: the template writes Python's spelling), and one that does not decode
stays text, so the tool's own check tells the model what it expected. Nothing is ever evaluated
(verl's first Qwen3 XML parser ran ``eval`` on model output). A ``</tool_call>`` outside a block
is a broken call; a block never closed is broken up to the next ``<tool_call>`` or the end.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.chat.spans import ParamTypes, Span, decode_at, marked_blocks, skip_space

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
EXAMPLE = ("<tool_call><function=read_file><parameter=path>README.md</parameter></function>"
           "</tool_call>")
"""One line (error messages are one line); the template writes a newline between the tags."""
_FUNCTION = re.compile(r"<function=([^>\n]*)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>")
_PARAM_CLOSE, _FUNCTION_CLOSE = "</parameter>", "</function>"
_TYPED = ("integer", "number", "boolean", "array", "object")


def _value(raw: str, kind: str | None) -> Any:
    """A parameter's text as the schema types it (module docstring); text when it does not fit."""
    text = raw.removeprefix("\n").removesuffix("\n")
    if kind not in _TYPED:
        return text
    if kind == "boolean" and text.strip() in ("True", "False"):
        return text.strip() == "True"
    got = decode_at(text, 0)
    if isinstance(got, str) or skip_space(text, got[1]) != len(text):
        return text
    return got[0]


def _body(text: str, start: int, end: int, types: ParamTypes | None) -> dict[str, Any] | str:
    """The call in ``text[start:end]`` (between the block markers), or what is wrong with it."""
    i = skip_space(text, start)
    m = _FUNCTION.match(text, i)
    if m is None or m.end() > end:
        return f"a tool call block must start with <function=NAME>; write e.g. {EXAMPLE}"
    name = m.group(1).strip()
    kinds = (types or {}).get(name, {})
    args: dict[str, Any] = {}
    i = skip_space(text, m.end())
    while (p := _PARAMETER.match(text, i)) is not None and p.end() <= end:
        close = text.find(_PARAM_CLOSE, p.end(), end)
        if close < 0:
            return f"<parameter={p.group(1)[:40]}> of {name!r} has no </parameter>"
        key = p.group(1).strip()
        if key in args:
            return f"parameter {key[:40]!r} of {name!r} is given twice"
        args[key] = _value(text[p.end():close], kinds.get(key))
        i = skip_space(text, close + len(_PARAM_CLOSE))
    if not text.startswith(_FUNCTION_CLOSE, i) or skip_space(text, i + len(_FUNCTION_CLOSE)) != end:
        return (f"expected <parameter=NAME>...</parameter> or </function> at character "
                f"{i - start} of the call to {name[:40]!r}; write e.g. {EXAMPLE}")
    return {"name": name, "arguments": args}


def blocks(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """Content and call blocks of ``text[start:]`` (the module docstring's rules)."""
    def read_block(text: str, at: int, body: int) -> Span:
        close, nxt = text.find(TOOL_CLOSE, body), text.find(TOOL_OPEN, body)
        if close < 0 or 0 <= nxt < close:
            return Span("broken", at, nxt if nxt >= 0 else len(text),
                        f"unclosed {TOOL_OPEN} block: end each call with {TOOL_CLOSE}")
        call = _body(text, body, close, types)
        return Span("broken" if isinstance(call, str) else "call", at, close + len(TOOL_CLOSE), call)

    return marked_blocks(text, start, TOOL_OPEN, TOOL_CLOSE, read_block)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text a model writes for ``calls`` (name, arguments), as Qwen3-Coder's template does."""
    return "".join(
        f"{TOOL_OPEN}\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{_text(v)}\n</parameter>\n" for k, v in a.items())
        + f"</function>\n{TOOL_CLOSE}" for n, a in calls)


def detect(rendered: str) -> bool:
    return "<function=looprl_probe>" in rendered
