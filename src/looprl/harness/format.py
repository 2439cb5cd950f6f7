"""The chat + tool-call format, token-in/token-out, for any HF tokenizer with a chat template.

    fmt = ChatFormat(tokenizer)
    ids = fmt.prompt_ids(messages, tool_schemas(tools))     # the first context
    ...the policy samples a turn ending with fmt.eot_id...
    ids += fmt.observation_ids(tool_messages)               # tool results + next assistant header
    turn = fmt.parse(fmt.decode(generated_ids))             # content, tool calls, errors

The model's own sampled tokens are never re-tokenized: ``observation_ids`` renders a fixed dummy
conversation with and without the new messages and tokenizes only the string delta, which is
what the chat template would have put after the end-of-turn token.
Tool calls are Hermes/Qwen blocks: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from looprl.types import Message, ToolCall

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_DUMMY_REPLY = "LOOPRL_DUMMY_REPLY"  # a marker that no template rewrites


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant generation, parsed. Parse problems are ``errors``, never exceptions."""

    content: str
    """The text outside tool-call blocks and outside <think>, stripped."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One message per malformed call block (each becomes a broken tool result)."""
    thinking_text: str = ""


def _parse_call(body: str, call_id: str) -> ToolCall | str:
    """A ``ToolCall`` from one block's body, or an error message saying how to fix it."""
    example = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        snippet = body.strip()[:80]
        return f"tool call is not valid JSON ({e}) in {snippet!r}; write e.g. {example}"
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object with name and arguments; write e.g. {example}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"tool call has no \"name\" string; write e.g. {example}"
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return f"arguments of {name} are a string that is not JSON; pass an object"
    if not isinstance(args, dict):
        return f"arguments of {name} must be a JSON object, got {type(args).__name__}"
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return f"tool call has unexpected key(s) {extra}; only name and arguments are allowed"
    return ToolCall(id=call_id, name=name.strip(), arguments=json.dumps(args, ensure_ascii=False))


def parse_turn(text: str, *, call_prefix: str = "call") -> ParsedTurn:
    """Split an assistant generation into thinking, content, tool calls and parse errors."""
    thinking = ""
    t_open, t_close = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if t_close >= 0 and (t_open < 0 or t_open < t_close):
        start = t_open + len(THINK_OPEN) if t_open >= 0 else 0  # templates may pre-open <think>
        thinking = text[start:t_close].strip()
        text = text[:max(t_open, 0)] + text[t_close + len(THINK_CLOSE):]
    calls: list[ToolCall] = []
    errors: list[str] = []
    content_parts: list[str] = []
    pos = 0
    while True:
        i = text.find(TOOL_OPEN, pos)
        stray = text.find(TOOL_CLOSE, pos)
        if 0 <= stray and (i < 0 or stray < i):
            errors.append(f"found {TOOL_CLOSE} without a matching {TOOL_OPEN}")
            content_parts.append(text[pos:stray])
            pos = stray + len(TOOL_CLOSE)
            continue
        if i < 0:
            content_parts.append(text[pos:])
            break
        content_parts.append(text[pos:i])
        j = text.find(TOOL_CLOSE, i)
        nxt = text.find(TOOL_OPEN, i + len(TOOL_OPEN))
        if j < 0 or (0 <= nxt < j):
            end = nxt if nxt >= 0 else len(text)
            errors.append(f"unclosed {TOOL_OPEN} block: end each call with {TOOL_CLOSE}")
            pos = end
            continue
        parsed = _parse_call(text[i + len(TOOL_OPEN):j], f"{call_prefix}_{len(calls) + len(errors)}")
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            errors.append(parsed)
        pos = j + len(TOOL_CLOSE)
    return ParsedTurn("".join(content_parts).strip(), calls, errors, thinking)


class ChatFormat:
    """Renders messages through ``tokenizer``'s chat template and parses generations."""

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; use looprl.models.tokenizer."
                             "build_tokenizer or a chat/instruct checkpoint's tokenizer")
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        self.eot = end_of_turn or ("<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token)
        eot_ids = tokenizer.encode(self.eot, add_special_tokens=False)
        assert len(eot_ids) == 1, f"end-of-turn {self.eot!r} must be a single token, got {eot_ids}"
        self.eot_id: int = eot_ids[0]
        self._marker_ids = {m: self._single_id(m) for m in
                            (TOOL_OPEN, TOOL_CLOSE, THINK_OPEN, THINK_CLOSE)}
        self._obs_cache: dict[str, list[int]] = {}

    def _single_id(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tools=tools or None, tokenize=False,
            add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """Model tokens to text, end-of-turn token dropped, markers like <tool_call> kept."""
        ids = list(ids)
        if ids and ids[-1] == self.eot_id:
            ids = ids[:-1]
        # no clean-up: HF's space clean-up would rewrite ' ,' inside the model's JSON arguments
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Tokens of the first context: system + tools + user, then the assistant header."""
        return self.encode(self.render(messages, tools))

    def observation_ids(self, messages: list[Message]) -> list[int]:
        """Tokens to append after a model turn that ended with ``eot_id``: the rendered
        tool/user ``messages`` and the next assistant header."""
        base: list[Message] = [{"role": "user", "content": "x"},
                               {"role": "assistant", "content": _DUMMY_REPLY}]
        before = self.render(base, add_generation_prompt=False)
        after = self.render(base + list(messages), add_generation_prompt=True)
        cut = before.rindex(_DUMMY_REPLY) + len(_DUMMY_REPLY)
        if not before[cut:].startswith(self.eot):
            raise ValueError(f"the chat template does not end assistant turns with {self.eot!r}; "
                             "pass end_of_turn= to ChatFormat")
        cut += len(self.eot)
        if not after.startswith(before[:cut]):
            raise ValueError("the chat template renders earlier turns differently when messages "
                             "follow them; it cannot be used token-in/token-out")
        delta = after[cut:]
        if delta not in self._obs_cache:
            if len(self._obs_cache) > 256:  # observations rarely repeat; keep the cache small
                self._obs_cache.clear()
            self._obs_cache[delta] = self.encode(delta)
        return list(self._obs_cache[delta])

    def parse(self, text: str, *, call_prefix: str = "call") -> ParsedTurn:
        return parse_turn(text, call_prefix=call_prefix)

    def count_span_tokens(self, ids: list[int] | tuple[int, ...], open_text: str,
                          close_text: str) -> int:
        """Tokens from ``open_text`` to ``close_text`` inclusive (an unclosed span runs to the
        end). Fast path on single-token markers; otherwise decoded token by token."""
        o, c = self._marker_ids.get(open_text), self._marker_ids.get(close_text)
        if o is not None and c is not None:
            n, inside = 0, False
            for t in ids:
                if t == o:
                    inside = True
                if inside:
                    n += 1
                if t == c:
                    inside = False
            return n
        n, inside, text = 0, False, ""
        for t in ids:
            piece = self.tokenizer.decode([t], skip_special_tokens=False)
            text += piece
            if not inside and open_text in text[-(len(open_text) + len(piece)):]:
                inside = True
            if inside:
                n += 1
                if close_text in text[-(len(close_text) + len(piece)):]:
                    inside = False
        return n

    def thinking_tokens(self, ids: list[int] | tuple[int, ...]) -> int:
        """Model tokens spent in <think>...</think> (markers included)."""
        return self.count_span_tokens(ids, THINK_OPEN, THINK_CLOSE)

    def tool_call_tokens(self, ids: list[int] | tuple[int, ...]) -> int:
        """Model tokens inside <tool_call>...</tool_call> blocks (markers included)."""
        return self.count_span_tokens(ids, TOOL_OPEN, TOOL_CLOSE)
