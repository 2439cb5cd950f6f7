"""``looprl train``: RL of a coding agent on your own model, tasks, tools and hardware.

    from looprl.train import TrainConfig, run
    from looprl.config import load_config
    run(load_config(TrainConfig, "configs/train_cpu.toml", ["loop.max_minutes=5"]))

``looprl quickstart`` is this command with ``configs/quickstart.toml``. See ``run.py`` for the
stages and ``config.py`` for every field.
"""

from looprl.train.config import (
    DemosSection,
    EvalSection,
    ModelSection,
    TasksSection,
    TrainConfig,
)
from looprl.train.run import run

__all__ = ["DemosSection", "EvalSection", "ModelSection", "TasksSection", "TrainConfig", "run"]
