"""gpt-oss "harmony" messages: a turn is one or more assistant messages, each a header, a body
and an end token; thinking is the ``analysis`` channel, a call is a message to ``functions.NAME``:

    <|channel|>analysis<|message|>Look at the file first.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>{"path": "README.md"}<|call|>

(the engine stops on ``<|call|>`` or ``<|return|>``, which ``ChatFormat.decode`` drops).

How a turn is read. A message runs from its header (``<|start|>ROLE``, or the turn's start: the
prompt ends with ``<|start|>assistant``) to ``<|message|>``, then its body to the first ``<|end|>``, ``<|call|>`` or ``<|return|>``, or
the end of the turn. A header naming a recipient (``to=functions.NAME``, before or after the
channel) makes the message a call: its body must be one JSON object followed by an end token or
the end of the turn (markers inside the JSON's strings are data); any other body, or a recipient
outside ``functions.`` (gpt-oss's built-in browser and python tools are not looprl's), is a broken
call up to the next end token. Without a recipient, an ``analysis`` message is thinking and any
other channel's body is content (its header and end token are markup). Text outside any message
is content; a ``<|call|>`` in it, or a header never reaching ``<|message|>`` (a turn of bare
text included), is a broken call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.chat.spans import ParamTypes, Span, decode_at, skip_space

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
EXAMPLE = ("<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>"
           '{"path": "README.md"}<|call|>')
_ENDS = re.compile(f"{re.escape(END)}|{re.escape(CALL)}|{re.escape(RETURN)}")
_OUTSIDE = re.compile(f"{re.escape(START)}|{re.escape(CHANNEL)}|{re.escape(CALL)}")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


def _body_end(text: str, i: int) -> tuple[int, int]:
    """(end of the body, end of its end token) from ``text[i]``: the next end token, or the end."""
    m = _ENDS.search(text, i)
    return (m.start(), m.end()) if m else (len(text), len(text))


def _call(text: str, start: int, body: int, recipient: str) -> tuple[Span, int]:
    """The call message from ``start`` whose body starts at ``body``, and where it ends."""
    name = recipient.removeprefix("functions.")
    err = ""
    if not recipient.startswith("functions.") or not name:
        err = (f"the recipient {recipient[:40]!r} is not a function; call tools as "
               "to=functions.NAME")
    else:
        got = decode_at(text, body)
        if isinstance(got, str):
            err = f"the arguments of {name[:40]!r} are not valid JSON ({got})"
        else:
            after = skip_space(text, got[1])
            m = _ENDS.match(text, after)
            if m is not None or after == len(text):
                end = m.end() if m else after
                return Span("call", start, end, {"name": name, "arguments": got[0]}), end
            err = f"extra text after the arguments of {name[:40]!r}, at character {after - body}"
    end = _body_end(text, body)[1]
    return Span("broken", start, end, f"{err}; write e.g. {EXAMPLE}"), end


def _message(text: str, start: int, header: int, spans: list[Span]) -> int:
    """The message whose header starts at ``header`` (``start``: its first character)."""
    msg, nxt = text.find(MESSAGE, header), text.find(START, header)
    if msg < 0 or 0 <= nxt < msg:
        end = nxt if nxt >= 0 else len(text)
        spans.append(Span("broken", start, end, f"a message header without {MESSAGE} in "
                          f"{text[start:end][:80]!r}; write e.g. {EXAMPLE}"))
        return end
    head, body = text[header:msg], msg + len(MESSAGE)
    if (r := _RECIPIENT.search(head)) is not None:
        span, end = _call(text, start, body, r.group(1))
        spans.append(span)
        return end
    body_end, end = _body_end(text, body)
    channel = _CHANNEL_NAME.search(head)
    if channel is not None and channel.group(1) == "analysis":
        spans.append(Span("think", start, end, text[body:body_end].strip()))
        return end
    spans.append(Span("markup", start, body))
    if body_end > body:
        spans.append(Span("content", body, body_end))
    if end > body_end:
        spans.append(Span("markup", body_end, end))
    return end


def blocks(text: str, start: int, types: ParamTypes | None = None) -> list[Span]:
    """Thinking, content and calls of ``text[start:]`` (the module docstring's rules)."""
    spans: list[Span] = []
    pos = start
    if text.strip() and not text.startswith(START, start):  # the prompt ended at <|start|>assistant
        pos = _message(text, start, start, spans)
    while (m := _OUTSIDE.search(text, pos)) is not None:
        if m.start() > pos:
            spans.append(Span("content", pos, m.start()))
        if m.group() == CALL:
            spans.append(Span("broken", m.start(), m.end(), f"found {CALL} outside a message to "
                              f"a function; write e.g. {EXAMPLE}"))
            pos = m.end()
        else:
            pos = _message(text, m.start(), m.end() if m.group() == START else m.start(), spans)
    if pos < len(text):
        spans.append(Span("content", pos, len(text)))
    return spans


def render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text of a turn making ``calls`` (one message each; the last one's ``<|call|>`` is
    the stop token, which the engine adds)."""
    return (CALL + START + "assistant").join(
        f"{CHANNEL}commentary to=functions.{n} {CONSTRAIN}json{MESSAGE}"
        + json.dumps(a, ensure_ascii=False) for n, a in calls)


def detect(rendered: str) -> bool:
    return "to=functions.looprl_probe" in rendered
