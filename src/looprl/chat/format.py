"""The chat + tool-call format, token-in/token-out, for any HF tokenizer with a chat template.

    fmt = ChatFormat(tokenizer)
    ids = fmt.prompt_ids(messages, tool_schemas(tools))     # the first context
    ...the policy samples a turn ending with fmt.eot_id...
    turn = fmt.parse_ids(generated_ids)                     # content, calls, errors, token counts
    ids += fmt.observation_ids(tool_messages)               # tool results + next assistant header

The model's own sampled tokens are never re-tokenized: ``observation_ids`` renders a fixed dummy
conversation with and without the new messages and tokenizes only the string delta, which is
what the chat template would have put after the end-of-turn token.
Tool calls are Hermes/Qwen blocks: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

How a turn is read (``parse_turn``). The four markers are single tokens of our tokenizer and of
Qwen's, and the encoder makes a marker's text that token wherever it stands, inside a JSON
string too: the text cannot tell a marker the model meant from one it quoted, so the rule reads
the JSON instead.

1. Thinking comes first. A turn that opens with ``<think>`` (only whitespace before it), or
   whose chat template opened it in the prompt (``thinking_open``), thinks up to the first
   ``</think>``; a turn cut while thinking is all thinking, up to a ``<tool_call>`` in it: from
   there the turn is one broken call (a call written in thinking that never closed ran nothing,
   and the model is told so). Markers inside closed thinking are thought, not calls. Any other ``<think>`` or ``</think>`` is plain text: it neither hides nor
   breaks the calls around it.
2. After the thinking, ``<tool_call>`` opens a block. When one JSON value follows it (whitespace
   allowed) and then ``</tool_call>``, that is the block: markers inside the JSON's strings are
   data (``{"content": "a </tool_call> b"}`` is one valid call). Otherwise the block is broken
   and ends at the first ``</tool_call>`` after it, just before the next ``<tool_call>``, or at
   the end of the turn.
3. A ``</tool_call>`` outside any block is a broken call. The rest is content.

A block is a call only if its JSON is an object with a ``name`` string and an ``arguments``
object (or a JSON string holding one) and nothing else, whose strings are valid Unicode (no
lone surrogate such as ``"\\ud800"``: it could not be saved as UTF-8 nor used as a file name),
whose numbers are finite and at most ``MAX_NUMBER_CHARS`` long and whose nesting is at most
``MAX_DEPTH`` deep. Every other block is one error: a broken call, never an exception.

``ParsedTurn.thinking_tokens`` / ``tool_call_tokens`` (``ChatFormat.parse_ids``) count the
sampled tokens of the same spans, markers included: the thinking, and every block, valid or
broken. Span edges are marker edges, so the tokens are split at the marker tokens; where a
marker was sampled as several tokens, at the token holding each edge's character.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from looprl.chat import tool_formats
from looprl.chat.hermes import EXAMPLE as _EXAMPLE
from looprl.chat.hermes import TOOL_CLOSE, TOOL_OPEN
from looprl.chat.spans import DECODER as _DECODER
from looprl.chat.spans import MAX_DEPTH, MAX_NUMBER_CHARS, ParamTypes
from looprl.chat.spans import SURROGATE as _SURROGATE
from looprl.chat.spans import Span as _Span
from looprl.chat.spans import depth as _depth
from looprl.chat.spans import json_error as _json_error
from looprl.chat.spans import skip_space as _skip_space
from looprl.chat.tool_formats import ToolFormat
from looprl.types import Message, ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MARKERS = (TOOL_OPEN, TOOL_CLOSE, THINK_OPEN, THINK_CLOSE)
_DUMMY_REPLY = "LOOPRL_DUMMY_REPLY"  # a marker that no template rewrites
_MARKER = re.compile("|".join(re.escape(m) for m in MARKERS))
_UNCLOSED = (f"{TOOL_OPEN} inside a {THINK_OPEN} that never closes was not run: end the "
             f"thinking with {THINK_CLOSE} before calling a tool")
HERMES = tool_formats.FORMATS["hermes"]
__all__ = ["MARKERS", "MAX_DEPTH", "MAX_NUMBER_CHARS", "THINK_CLOSE", "THINK_OPEN", "TOOL_CLOSE",
           "TOOL_OPEN", "ChatFormat", "ParsedTurn", "TurnPiece", "parse_turn", "turn_pieces"]


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant generation, parsed. Parse problems are ``errors``, never exceptions."""

    content: str
    """The text outside tool-call blocks and outside the thinking, stripped."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One message per malformed call block (each becomes a broken tool result)."""
    thinking_text: str = ""
    thinking_tokens: int = 0
    """Sampled tokens of the thinking, markers included (``ChatFormat.parse_ids``; 0 from text)."""
    tool_call_tokens: int = 0
    """Sampled tokens of the call blocks, valid or broken, markers included (as above)."""
    call_token_spans: tuple[tuple[int, int], ...] = ()
    """(start, end) token offsets in the turn of each of ``tool_calls``' blocks, in order
    (``ChatFormat.parse_ids``; empty when parsed from text)."""
    error_token_spans: tuple[tuple[int, int], ...] = ()
    """The same for each of ``errors``' blocks: the trainer credits a broken call's own tokens."""
    error_ids: tuple[str, ...] = ()
    """The id of each of ``errors``' broken results, where the format needs its own (Mistral's
    templates take nine alphanumerics only); empty: the harness names them."""


def _to_call(obj: Any, call_id: str, example: str = _EXAMPLE) -> ToolCall | str:
    """A ``ToolCall`` from one block's decoded JSON, or an error message saying how to fix it."""
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object with name and arguments; write e.g. {example}"
    if _depth(obj) > MAX_DEPTH:
        return f"tool call nests deeper than {MAX_DEPTH} levels; tools take flat arguments"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"tool call has no \"name\" string; write e.g. {example}"
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = _DECODER.decode(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            return f"arguments of {name!r} are a string that is not JSON ({_json_error(e, 0)})"
        if _depth(args) >= MAX_DEPTH:
            return f"tool call nests deeper than {MAX_DEPTH} levels; tools take flat arguments"
    if not isinstance(args, dict):
        return f"arguments of {name!r} must be a JSON object, got {type(args).__name__}"
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return (f"tool call has unexpected key(s) {[k[:40] for k in extra[:5]]}; only name and "
                "arguments are allowed")
    arguments = json.dumps(args, ensure_ascii=False)
    bad = _SURROGATE.search(name) or _SURROGATE.search(arguments)
    if bad:
        return (f"tool call holds invalid Unicode ({ascii(bad.group())}, a lone surrogate); "
                "write characters as plain text or as valid \\u escapes")
    return ToolCall(id=call_id, name=name.strip(), arguments=arguments)


def _split_turn(text: str, *, thinking_open: bool = False, tf: ToolFormat = HERMES,
                types: ParamTypes | None = None) -> list[_Span]:
    """The spans of a turn's text, in order and covering it (the module docstring's rules)."""
    if tf.own_thinking:
        return tf.blocks(text, 0, types)
    lead = _skip_space(text, 0)
    if not thinking_open and not text.startswith(THINK_OPEN, lead):
        return tf.blocks(text, 0, types)
    start = 0 if thinking_open else lead
    body = start if thinking_open else start + len(THINK_OPEN)
    close = text.find(THINK_CLOSE, body)
    head = [_Span("content", 0, start)] if start else []
    if close < 0:
        calls = [i for i in (text.find(m, body) for m in tf.opens) if i >= 0]
        if calls:  # a call the model wrote in thinking it never closed would run nothing
            call = min(calls)
            why = _UNCLOSED if tf is HERMES else _UNCLOSED.replace(TOOL_OPEN, text[call:][:20])
            return head + [_Span("think", start, call), _Span("broken", call, len(text), why)]
    end = len(text) if close < 0 else close + len(THINK_CLOSE)
    return head + [_Span("think", start, end)] + tf.blocks(text, end, types)


@dataclass(frozen=True)
class TurnPiece:
    """A stretch of a turn's text, cut and resolved as ``parse_turn`` reads it (``turn_pieces``)."""

    kind: str
    """think, content, call, broken (a block that is no valid call, a stray close marker), or
    markup (a format's structure around content: harmony's headers and end tokens)."""
    text: str
    value: ToolCall | str | None = None
    """call: its ``ToolCall``; broken: the error message; think: the thought, for a format
    with its own thinking markers (harmony)."""


def _pieces(text: str, spans: list[_Span], call_prefix: str, tf: ToolFormat = HERMES
            ) -> list[TurnPiece]:
    pieces: list[TurnPiece] = []
    blocks = 0  # calls and broken blocks are numbered together, in order
    for s in spans:
        value: ToolCall | str | None = (s.value if s.kind == "think"
                                        and isinstance(s.value, str) else None)
        if s.kind in ("call", "broken"):
            value = (_to_call(s.value, tf.call_id(call_prefix, blocks), tf.example)
                     if s.kind == "call" else s.value)
            blocks += 1
        kind = "broken" if s.kind == "call" and isinstance(value, str) else s.kind
        pieces.append(TurnPiece(kind, text[s.start:s.end], value))
    return pieces


def _thought(p: TurnPiece) -> str:
    if isinstance(p.value, str):
        return p.value
    return p.text.removeprefix(THINK_OPEN).removesuffix(THINK_CLOSE).strip()


def _turn(text: str, spans: list[_Span], call_prefix: str, tf: ToolFormat = HERMES) -> ParsedTurn:
    pieces = _pieces(text, spans, call_prefix, tf)
    thinking = "\n".join(_thought(p) for p in pieces if p.kind == "think")
    content = "".join(p.text for p in pieces if p.kind == "content")
    errors: list[str] = [p.value for p in pieces if p.kind == "broken"]  # type: ignore[misc]
    error_ids = () if tf.call_id is HERMES.call_id else tuple(
        tf.call_id(f"{call_prefix}_err", k) for k in range(len(errors)))
    return ParsedTurn(content.strip(), [p.value for p in pieces if p.kind == "call"],  # type: ignore[misc]
                      errors, thinking, error_ids=error_ids)


def parse_turn(text: str, *, call_prefix: str = "call", thinking_open: bool = False,
               tool_format: str = "hermes", types: ParamTypes | None = None) -> ParsedTurn:
    """Split an assistant generation into thinking, content, tool calls and parse errors.
    ``thinking_open``: the chat template opened ``<think>`` in the prompt; ``tool_format``: a
    name of ``tool_formats.FORMATS``; ``types``: the tools' parameter types (Qwen3-Coder)."""
    tf = tool_formats.get(tool_format)
    return _turn(text, _split_turn(text, thinking_open=thinking_open, tf=tf, types=types),
                 call_prefix, tf)


def turn_pieces(text: str, *, call_prefix: str = "call", thinking_open: bool = False,
                tool_format: str = "hermes", types: ParamTypes | None = None) -> list[TurnPiece]:
    """A turn's text in order (the pieces join to ``text``), as ``parse_turn`` reads it: for an
    API that returns the calls apart from the text around them (``inference.openai_chat``)."""
    tf = tool_formats.get(tool_format)
    return _pieces(text, _split_turn(text, thinking_open=thinking_open, tf=tf, types=types),
                   call_prefix, tf)


class ChatFormat:
    """Renders messages through ``tokenizer``'s chat template and parses generations."""

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None,
                 tool_format: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; use looprl.models.tokenizer."
                             "build_tokenizer or a chat/instruct checkpoint's tokenizer")
        self.tokenizer = tokenizer
        self.tool_format = self._choose_format(tool_format)
        """The name of the tool-call format (``tool_formats.FORMATS``) this template writes."""
        self.tf = tool_formats.get(self.tool_format)
        vocab = tokenizer.get_vocab()
        own = self.tf.end_of_turn if self.tf.end_of_turn in vocab else None
        self.eot = end_of_turn or ("<|im_end|>" if "<|im_end|>" in vocab else own
                                   or tokenizer.eos_token)
        eot_ids = tokenizer.encode(self.eot, add_special_tokens=False)
        assert len(eot_ids) == 1, f"end-of-turn {self.eot!r} must be a single token, got {eot_ids}"
        self.eot_id: int = eot_ids[0]
        self.end_ids = frozenset([self.eot_id] + [i for e in self.tf.extra_ends
                                                  if (i := self._single_id(e)) is not None])
        """Every token that ends a turn (the engine's stop tokens): ``eot_id`` and, for
        harmony, ``<|return|>``."""
        self._marker_ids = {m: self._single_id(m) for m in MARKERS}
        self._obs_cache: dict[str, list[int]] = {}
        self._piece: dict[int, str] = {}
        """Token id -> its text alone (``_token_text``; at most one entry per vocabulary id)."""
        self.types: dict[str, dict[str, str]] = {}
        """Tool name -> parameter -> schema type, from the tools of ``prompt_ids``: how a format
        whose values are text (Qwen3-Coder) types them."""
        prompt = self.render([{"role": "user", "content": "x"}])
        self.thinking_open = prompt.rstrip().endswith(THINK_OPEN)
        """The template opens ``<think>`` in the generation prompt (DeepSeek-R1 style): each
        turn starts inside its thinking."""

    def _choose_format(self, named: str | None) -> str:
        """The format the template writes (probed); ``named`` is checked against it."""
        if named is not None:
            tool_formats.get(named)  # an unknown name: a one-line error listing the names
        found = tool_formats.probe(lambda msgs: self.render(msgs,  # type: ignore[arg-type]
                                                            add_generation_prompt=False))
        if named not in (None, "hermes") and found is None:
            raise ValueError(f"tool_format {named!r}: this tokenizer's chat template renders no "
                             "tool calls, so looprl cannot check it writes them that way; use "
                             "the checkpoint's own chat template")
        if named is not None and found is not None and found != named:
            raise ValueError(f"tool_format {named!r} does not match this tokenizer's chat "
                             f"template, which writes tool calls as {found!r}; set tool_format "
                             f"to {found!r} or leave it unset")
        return named or found or "hermes"

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
        if ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        # no clean-up: HF's space clean-up would rewrite ' ,' inside the model's JSON arguments
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Tokens of the first context: system + tools + user, then the assistant header.
        The tools' parameter types are kept for parsing (``types``)."""
        for t in tools or ():
            f = t.get("function", t)
            props = (f.get("parameters") or {}).get("properties") or {}
            self.types[str(f.get("name"))] = {k: str(v.get("type")) for k, v in props.items()
                                             if isinstance(v, dict)}
        return self.encode(self.render(messages, tools))

    def observation_ids(self, messages: list[Message]) -> list[int]:
        """Tokens to append after a model turn that ended with ``eot_id``: the rendered
        tool/user ``messages`` and the next assistant header."""
        base: list[Message] = [{"role": "user", "content": "x"},
                               {"role": "assistant", "content": _DUMMY_REPLY}]
        if self.tf.call_before_result:  # the template names the tool from the call before
            name = next((m["name"] for m in messages if m.get("name")), "tool")
            base[1] = {"role": "assistant", "content": "", "tool_calls": [{
                "id": tool_formats.PROBE_ID, "type": "function",
                "function": {"name": name, "arguments": {}}}]}
        before = self.render(base, add_generation_prompt=False)
        after = self.render(base + list(messages), add_generation_prompt=True)
        cut = (before.rindex(self.eot) if self.tf.call_before_result
               else before.rindex(_DUMMY_REPLY) + len(_DUMMY_REPLY))
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
        """A decoded turn, parsed (no token counts: ``parse_ids`` has them)."""
        return _turn(text, self._split(text), call_prefix, self.tf)

    def _split(self, text: str) -> list[_Span]:
        return _split_turn(text, thinking_open=self.thinking_open, tf=self.tf, types=self.types)

    def parse_ids(self, ids: list[int] | tuple[int, ...], *, call_prefix: str = "call") -> ParsedTurn:
        """A sampled turn (end-of-turn token optional), parsed, with its thinking and tool-call
        tokens counted over the same spans."""
        ids = list(ids)
        if ids and ids[-1] in self.end_ids:
            ids = ids[:-1]
        # one end token is dropped, not two: harmony's turn may hold a stray <|call|> at its end
        text = self.decode(ids) if self.tf is HERMES else self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        spans = self._split(text)
        turn = _turn(text, spans, call_prefix, self.tf)
        # the fast path needs every span edge at a marker token: Hermes's, not bare-JSON formats'
        edge = self._marker_edges(ids, text) if self.tf is HERMES else None
        if edge is None:  # a marker sampled in pieces: split by each token's own text
            text, ends = self._token_text(ids)
            spans = self._split(text)
            edge = {c: bisect.bisect_right(ends, c) for s in spans for c in (s.start, s.end)}
        edge[0], edge[len(text)] = 0, len(ids)

        def tokens(*kinds: str) -> int:
            return sum(edge[s.end] - edge[s.start] for s in spans if s.kind in kinds)

        # a block's piece kind (a call whose JSON is not a valid call is broken) per span
        kinds = [p.kind for p in _pieces(text, spans, call_prefix, self.tf)]

        def blocks(kind: str) -> tuple[tuple[int, int], ...]:
            return tuple((edge[s.start], edge[s.end])
                         for s, k in zip(spans, kinds, strict=True) if k == kind)

        return dataclasses.replace(turn, thinking_tokens=tokens("think"),
                                   tool_call_tokens=tokens("call", "broken"),
                                   call_token_spans=blocks("call"),
                                   error_token_spans=blocks("broken"))

    def _marker_edges(self, ids: list[int], text: str) -> dict[int, int] | None:
        """Character offset -> token index of every marker edge of ``text``, when each marker
        in it is one marker token of ``ids`` (the fast path); else None."""
        kind = {i: m for m, i in self._marker_ids.items() if i is not None}
        if len(kind) < len(MARKERS):
            return None
        at = [(k, kind[t]) for k, t in enumerate(ids) if t in kind]
        found = list(_MARKER.finditer(text))
        if [m for _, m in at] != [f.group() for f in found]:
            return None
        edges: dict[int, int] = {}
        for (k, _), f in zip(at, found, strict=True):
            edges.setdefault(f.start(), k)
            edges[f.end()] = k + 1
        return edges

    def _token_text(self, ids: list[int]) -> tuple[str, list[int]]:
        """The turn's text decoded token by token, and the end offset of each token in it."""
        for t in set(ids) - self._piece.keys():  # each id decodes alike wherever it stands
            self._piece[t] = self.tokenizer.decode([t], skip_special_tokens=False,
                                                   clean_up_tokenization_spaces=False)
        pieces = [self._piece[t] for t in ids]
        ends, n = [], 0
        for p in pieces:
            n += len(p)
            ends.append(n)
        return "".join(pieces), ends

    def thinking_tokens(self, ids: list[int] | tuple[int, ...]) -> int:
        """Sampled tokens of a turn's thinking, markers included (``parse_ids``)."""
        return self.parse_ids(ids).thinking_tokens

    def tool_call_tokens(self, ids: list[int] | tuple[int, ...]) -> int:
        """Sampled tokens of a turn's call blocks, markers included (``parse_ids``)."""
        return self.parse_ids(ids).tool_call_tokens
