"""The tool-call formats looprl reads and writes, one module per model family, by name:

    hermes        Hermes / Qwen2.5 / Qwen3 JSON   <tool_call>{"name": .., "arguments": {..}}</tool_call>
    qwen3_coder   Qwen3-Coder XML                 <tool_call><function=NAME><parameter=P>..</parameter></function></tool_call>
    llama3        Llama 3.1-3.3 JSON              <|python_tag|>{"name": .., "parameters": {..}} (or bare)
    mistral       Mistral pre-v11                 [TOOL_CALLS] [{"name": .., "arguments": {..}}]
    mistral_v11   Mistral v11+                    [TOOL_CALLS]NAME[ARGS]{..}
    harmony       gpt-oss                         <|channel|>commentary to=functions.NAME ..<|message|>{..}<|call|>

    fmt = ChatFormat(tok)                          # the format its chat template writes (probed)
    fmt = ChatFormat(tok, tool_format="llama3")    # named; refused if the template writes another

Which format a template writes is found by rendering one assistant message with a probe call
(``probe``) and asking each format whether the text is its own. A template that renders no
probe call (a base model's, or one without tool support) gets ``hermes``, today's behaviour.
Every format keeps the same guarantees: JSON only through the guarded decoder (never ``eval``),
every malformed call one broken call with a one-line reason, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from looprl.chat import harmony, hermes, llama3, mistral, qwen3_coder
from looprl.chat.spans import ParamTypes, Span

Blocks = Callable[[str, int, ParamTypes | None], list[Span]]


def _plain_id(prefix: str, k: int) -> str:
    return f"{prefix}_{k}"


@dataclass(frozen=True)
class ToolFormat:
    """How one family's model writes tool calls, and how looprl reads them."""

    name: str
    blocks: Blocks
    """Content, call and broken spans of ``text[start:]`` (after any ``<think>`` thinking)."""
    render: Callable[[list[tuple[str, dict[str, Any]]]], str]
    """The text a model writes for (name, arguments) calls: scripts, tests, fuzzing."""
    detect: Callable[[str], bool]
    """Whether a template's rendering of the probe call is in this format."""
    example: str
    """One valid call, quoted in error messages."""
    markers: tuple[str, ...]
    """The format's marker strings (a stream holds back a marker cut in half)."""
    opens: tuple[str, ...] = ()
    """Strings that open a call: one inside ``<think>`` that never closed is a broken call."""
    call_id: Callable[[str, int], str] = _plain_id
    """The id of a turn's k-th block, from the harness's prefix."""
    own_thinking: bool = False
    """The format marks thinking itself (harmony's analysis channel), not with ``<think>``."""
    end_of_turn: str | None = None
    """The end-of-turn token when the tokenizer does not say (harmony: ``<|call|>``)."""
    extra_ends: tuple[str, ...] = ()
    """Other tokens that end a turn (harmony: ``<|return|>``)."""
    call_before_result: bool = False
    """The template renders a tool result only after the call it answers (harmony names the
    tool from it): observations are cut after a dummy call instead of a dummy reply."""


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    ToolFormat("hermes", hermes.blocks, hermes.render, hermes.detect, hermes.EXAMPLE,
               (hermes.TOOL_OPEN, hermes.TOOL_CLOSE), (hermes.TOOL_OPEN,)),
    ToolFormat("qwen3_coder", qwen3_coder.blocks, qwen3_coder.render, qwen3_coder.detect,
               qwen3_coder.EXAMPLE, (qwen3_coder.TOOL_OPEN, qwen3_coder.TOOL_CLOSE),
               (qwen3_coder.TOOL_OPEN,)),
    ToolFormat("llama3", llama3.blocks, llama3.render, llama3.detect, llama3.EXAMPLE,
               (llama3.PYTHON_TAG,), (llama3.PYTHON_TAG,), end_of_turn="<|eot_id|>"),
    ToolFormat("mistral", mistral.blocks, mistral.render, mistral.detect, mistral.EXAMPLE,
               (mistral.TOOL_CALLS,), (mistral.TOOL_CALLS,), mistral.call_id, end_of_turn="</s>"),
    ToolFormat("mistral_v11", mistral.blocks_v11, mistral.render_v11, mistral.detect_v11,
               mistral.EXAMPLE_V11, (mistral.TOOL_CALLS, mistral.ARGS, mistral.CALL_ID),
               (mistral.TOOL_CALLS,), mistral.call_id, end_of_turn="</s>"),
    ToolFormat("harmony", harmony.blocks, harmony.render, harmony.detect, harmony.EXAMPLE,
               (harmony.START, harmony.CHANNEL, harmony.MESSAGE, harmony.CONSTRAIN, harmony.END,
                harmony.CALL, harmony.RETURN), own_thinking=True, end_of_turn=harmony.CALL,
               extra_ends=(harmony.RETURN,), call_before_result=True),
)}
DETECT_ORDER = ("harmony", "qwen3_coder", "mistral_v11", "mistral", "hermes", "llama3")
"""Most specific first: a Qwen3-Coder block also opens with <tool_call>."""
PROBE_ID = "a1b2c3d4e"  # nine alphanumerics: Mistral's templates refuse any other id


def probe_messages(arguments: dict[str, Any] | str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": PROBE_ID, "type": "function",
                "function": {"name": "looprl_probe", "arguments": arguments}}]}]


def probe(render: Callable[[list[dict[str, Any]]], str]) -> str | None:
    """The format a chat template writes tool calls in (``render`` renders messages without a
    generation prompt), or None when it renders no probe call."""
    for arguments in ({"looprl_arg": "v"}, '{"looprl_arg": "v"}'):  # HF's dict, OpenAI's string
        try:
            text = render(probe_messages(arguments))
        except Exception:  # noqa: BLE001 — a template that cannot render this shape: try the next
            continue
        for name in DETECT_ORDER:
            if FORMATS[name].detect(text):
                return name
    return None


def get(name: str) -> ToolFormat:
    """The format named ``name``; a one-line error listing the names otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool format {name!r}; use one of {', '.join(FORMATS)}")
    return FORMATS[name]
