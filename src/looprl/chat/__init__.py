"""The chat and tool-call format: messages rendered through a tokenizer's chat template and
generations parsed into content, thinking and tool calls, token-in/token-out.

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

__all__ = ["MARKERS", "THINK_CLOSE", "THINK_OPEN", "TOOL_CLOSE", "TOOL_OPEN", "ChatFormat",
           "ParsedTurn", "TurnPiece", "parse_turn", "turn_pieces"]
