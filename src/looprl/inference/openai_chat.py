"""OpenAI chat messages <-> looprl's tokens, rendered and parsed exactly as the harness does.

    ids = conversation_ids(fmt, messages, tools)      # the prompt, token for token the harness's
    reply = parse_reply(fmt, gen.token_ids, "call_x") # content, tool_calls, finish_reason
    live = ReplyStream(fmt, "call_x")                 # the same reply as deltas, tokens as they come
    content_delta, new_calls = live.feed(token_ids_so_far)

Rendering (``conversation_ids``): the harness builds a context as ``prompt_ids(system + user,
tools)``, then each model turn's tokens and its end-of-turn token, then ``observation_ids(the
tool results)`` (``looprl.chat``). A request's conversation is rendered the same way, piece by
piece; an assistant message's text is what the chat template puts in its turn (content, then one
``<tool_call>`` block per call), which is what a model trained on that template writes. So a
model trained in looprl sees the tokens it saw in training, not a re-rendering of the whole
conversation (templates such as Qwen3's rewrite earlier turns; the harness never does).

Replies (``parse_reply``): the model's turn is read by the harness's parser
(``looprl.chat.turn_pieces``). Valid calls become ``message.tool_calls`` (OpenAI's shape; ids
``<prefix>_<k>``) and ``finish_reason`` is ``"tool_calls"`` when the turn ended by itself.
``content`` is the harness's: the thinking as ``<think>...</think>\\n`` before the text, so a
client that sends the message back gives the model its own thinking again. A broken block (bad
JSON, no name, unclosed, cut by ``max_tokens``) stays in ``content`` as the model wrote it: the
client sees what went wrong, and the model sees its own text when the message comes back, as it
would in the harness (where the broken call is answered by an error); nothing is dropped.

Streaming (``ReplyStream``): content is sent as soon as it can no longer change, each call as
soon as its block closes; the deltas join to exactly the non-streamed reply. Held back until the
turn ends: everything from the first broken block on (an unfinished JSON string can still end
later and take in the markers after it), a marker cut in half, trailing whitespace, and a
half-decoded UTF-8 character.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from looprl.chat import MARKERS, THINK_CLOSE, THINK_OPEN, ChatFormat, TurnPiece, turn_pieces
from looprl.types import Message, ToolCall

_END = "\ue000"
"""A private-use character appended to a partial turn: the content before it is final."""
_BASE: list[Message] = [{"role": "user", "content": "x"}]


@dataclass(frozen=True)
class Reply:
    """One choice's message, parsed."""

    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    """stop, length, or tool_calls (valid calls in a turn that ended by itself)."""

    def message(self) -> dict[str, Any]:
        """The OpenAI ``message``: content is null when the turn is only calls, as OpenAI's is."""
        msg: dict[str, Any] = {"role": "assistant",
                               "content": self.content or (None if self.tool_calls else "")}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


def conversation_ids(fmt: ChatFormat, messages: list[Message],
                     tools: list[dict[str, Any]] | None) -> list[int]:
    """The tokens of ``messages`` (validated: the last one is not the assistant's) followed by
    the assistant header, built as the harness builds a trajectory's context."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids = fmt.prompt_ids(messages[:turns[0]] if turns else messages, tools)
    for k, i in enumerate(turns):
        text, end = _assistant_turn(fmt, messages[i])
        ids += fmt.encode(text) + [end]
        ids += fmt.observation_ids(messages[i + 1:turns[k + 1] if k + 1 < len(turns) else None])
    return ids


def assistant_text(fmt: ChatFormat, message: Message) -> str:
    """What the chat template writes inside an assistant turn for ``message`` (its content and
    call blocks), without the header and the end-of-turn token."""
    return _assistant_turn(fmt, message)[0]


def _assistant_turn(fmt: ChatFormat, message: Message) -> tuple[str, int]:
    """``assistant_text`` and the id of the end token the template closed the turn with."""
    if fmt.tool_format != "hermes" and message.get("tool_calls"):
        message = _object_arguments(message)
    before = fmt.render(_BASE)
    after = fmt.render(_BASE + [message], add_generation_prompt=False)
    ends = {fmt.eot: fmt.eot_id} if fmt.tool_format == "hermes" else {
        fmt.tokenizer.decode([i], skip_special_tokens=False): i for i in fmt.end_ids}
    end_at, end_id = max((after.rfind(e), i) for e, i in ends.items())
    if not after.startswith(before) or end_at < len(before):
        raise ValueError("the chat template does not render an assistant turn after the "
                         "generation prompt; it cannot be used token-in/token-out")
    return after[len(before):end_at], end_id


def _object_arguments(message: Message) -> Message:
    """``message`` with each call's arguments as an object, as HF templates other than Hermes's
    expect (OpenAI clients send them as JSON text)."""
    calls = []
    for c in message.get("tool_calls") or []:
        fn = dict(c.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"] or "{}")
            except ValueError:
                raise ValueError(f"tool call {fn.get('name')!r} has arguments that are not JSON "
                                 "text; send them as OpenAI does (a JSON object as a string)"
                                 ) from None
        calls.append({**c, "function": fn})
    return {**message, "tool_calls": calls}


def parse_reply(fmt: ChatFormat, token_ids: list[int] | tuple[int, ...], call_prefix: str,
                finish: str = "stop") -> Reply:
    """A sampled turn as an OpenAI reply (module docstring); ``finish``: the engine's reason."""
    text = fmt.decode(token_ids)
    pieces = turn_pieces(text, call_prefix=call_prefix, thinking_open=fmt.thinking_open,
                         tool_format=fmt.tool_format, types=fmt.types)
    calls = [p.value for p in pieces if p.kind == "call"]
    reason = "tool_calls" if calls and finish == "stop" else finish
    return Reply(_content(pieces), calls, reason)  # type: ignore[arg-type]


def _content(pieces: list[TurnPiece]) -> str:
    """The harness's assistant content (``harness.agent.assistant_message``), broken blocks kept."""
    thinking = "\n".join(p.value if isinstance(p.value, str) else
                          p.text.removeprefix(THINK_OPEN).removesuffix("</think>").strip()
                          for p in pieces if p.kind == "think")
    text = "".join(p.text for p in pieces if p.kind in ("content", "broken")).strip()
    return (f"<think>{thinking}</think>\n" if thinking else "") + text


class ReplyStream:
    """A reply built while its tokens arrive: ``feed`` the whole turn so far, get what is new."""

    def __init__(self, fmt: ChatFormat, call_prefix: str) -> None:
        self.fmt, self.call_prefix = fmt, call_prefix
        self.sent = ""
        """The content sent so far (always a prefix of the final content)."""
        self.calls_sent = 0

    def feed(self, token_ids: list[int]) -> tuple[str, list[ToolCall]]:
        """The content delta and the calls completed since the last ``feed``."""
        text = self.fmt.decode(token_ids).rstrip("\ufffd")  # a UTF-8 character still arriving
        markers = MARKERS if self.fmt.tool_format == "hermes" else (
            self.fmt.tf.markers + (THINK_OPEN, THINK_CLOSE))
        for m in markers:  # a marker cut in half could still open a block
            for k in range(len(m) - 1, 0, -1):
                if text.endswith(m[:k]):
                    text = text[:-k]
                    break
        pieces = turn_pieces(text + _END, call_prefix=self.call_prefix,
                             thinking_open=self.fmt.thinking_open,
                             tool_format=self.fmt.tool_format, types=self.fmt.types)
        # A broken block may be one JSON value still arriving (its strings can hold markers and
        # end later), which would take in what follows it: wait for the end of the turn.
        broken = [k for k, p in enumerate(pieces) if p.kind == "broken"]
        pieces = pieces[:broken[0]] if broken else pieces
        calls = [p.value for p in pieces if p.kind == "call"]
        content = _content(pieces)
        if broken and pieces and pieces[-1].kind == "think" and not pieces[-1].text.endswith(
                THINK_CLOSE):  # a call in thinking not closed yet: a later </think> takes it in
            content = content.removesuffix(THINK_CLOSE + "\n")
        stable = content[:content.index(_END)] if _END in content else content
        stable = stable.rstrip()
        if stable == THINK_OPEN:  # an empty thinking is dropped from the content, tags and all
            stable = ""
        return self._delta(stable), self._new_calls(calls)  # type: ignore[arg-type]

    def finish(self, token_ids: list[int], finish: str) -> tuple[str, list[ToolCall], Reply]:
        """The last content delta and calls, and the whole reply (as ``parse_reply`` gives it)."""
        reply = parse_reply(self.fmt, token_ids, self.call_prefix, finish)
        return self._delta(reply.content), self._new_calls(reply.tool_calls), reply

    def _delta(self, content: str) -> str:
        """What ``content`` adds to what was sent (both are prefixes of the final content)."""
        short, long = sorted((content, self.sent), key=len)
        assert long.startswith(short), f"streamed {self.sent[-40:]!r}, now {content[-40:]!r}"
        delta, self.sent = content[len(self.sent):], long
        return delta

    def _new_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        new, self.calls_sent = calls[self.calls_sent:], max(self.calls_sent, len(calls))
        return new


def tool_call_delta(index: int, call: ToolCall) -> dict[str, Any]:
    """One whole call as a streamed ``tool_calls`` entry (OpenAI's chunk shape)."""
    return {"index": index, **call.to_openai()}

