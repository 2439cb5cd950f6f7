"""looprl: train coding agents with RL inside the harness they serve in.

The public API, for users who extend or drive looprl from Python (``docs/extending.md``):

- records (``looprl.types``): ``Task``, ``Trajectory``, ``Group``, ``RewardBreakdown``, ...;
- seams (``looprl.protocols``): ``Tool``, ``RewardFn``, ``Engine``, ``Sandbox``, ``WeightStore``;
- errors (``looprl.errors``): ``ConfigError``, ``ToolError``, ...;
- training: ``TrainConfig`` read by ``load_config``, run by ``looprl.train.run``;
- plugins found by name: ``find_plugin`` (``looprl.plugins.find``).

    from looprl import TrainConfig, load_config
    from looprl.train import run
    run(load_config(TrainConfig, "configs/train_cpu.toml", ["loop.max_minutes=5"]))

Importing ``looprl`` imports no torch: ``TrainConfig`` loads on first use.
"""

from looprl.config import load_config
from looprl.errors import ConfigError, LooprlError, PathEscapeError, ToolError
from looprl.lazy import lazy_exports
from looprl.plugins import find as find_plugin
from looprl.protocols import Engine, RewardFn, Sandbox, Tool, WeightStore
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

__getattr__, __dir__, _lazy = lazy_exports(__name__, {"train": ["TrainConfig"]})


__all__ = [
    "ConfigError", "Counters", "Engine", "ExecResult", "Generation", "Grader", "Group",
    "LooprlError", "PathEscapeError", "RewardBreakdown", "RewardFn", "SamplingParams", "Sandbox",
    "Segment", "StopReason", "Task", "Tool", "ToolCall", "ToolError", "ToolResult", "Trajectory",
    "WeightStore", "find_plugin", "load_config", *_lazy,
]
