"""The chat and tool-call format: messages rendered through a tokenizer's chat template and
generations parsed into content, thinking and tool calls, token-in/token-out.

The tool-call format is the model family's (``tool_formats``: Hermes/Qwen2.5 JSON, Qwen3-Coder
XML, Llama 3 JSON, Mistral's two forms, gpt-oss harmony), probed from the chat template.

It sits at the bottom of the package (it imports only ``looprl.types``) because the harness, the
OpenAI-compatible server, task building and the benchmarks all speak it.
"""

from looprl.chat.format import (
    MARKERS,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CLOSE,
    TOOL_OPEN,
    ChatFormat,
    ParsedTurn,
    TurnPiece,
    parse_turn,
    turn_pieces,
)
from looprl.chat.tool_formats import FORMATS, ToolFormat

__all__ = ["FORMATS", "MARKERS", "THINK_CLOSE", "THINK_OPEN", "TOOL_CLOSE", "TOOL_OPEN",
           "ChatFormat", "ParsedTurn", "ToolFormat", "TurnPiece", "parse_turn", "turn_pieces"]
