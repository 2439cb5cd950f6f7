"""looprl: train coding agents with RL inside the harness they serve in.

Public records live in ``looprl.types``; seams in ``looprl.protocols``; errors in ``looprl.errors``.
"""

from looprl.types import (
    Counters,
    ExecResult,
    Generation,
    Grader,
    Group,
    RewardBreakdown,
    SamplingParams,
    Segment,
    StopReason,
    Task,
    ToolCall,
    ToolResult,
    Trajectory,
)

__all__ = [
    "Counters", "ExecResult", "Generation", "Grader", "Group", "RewardBreakdown", "SamplingParams",
    "Segment", "StopReason", "Task", "ToolCall", "ToolResult", "Trajectory",
]
