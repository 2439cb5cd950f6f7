"""``looprl train``: RL of a coding agent on your own model, tasks, tools and hardware.

    from looprl.train import TrainConfig, run
    from looprl.config import load_config
    run(load_config(TrainConfig, "configs/train_cpu.toml", ["loop.max_minutes=5"]))

``looprl quickstart`` is this command with ``configs/quickstart.toml``. See ``run.py`` for the
stages and ``config.py`` for every field.
"""

from looprl.lazy import lazy_exports

# lazy: ``looprl train`` loads and checks the config (``train.config``, no torch) before it imports
# the composition root, so a config error appears in well under a second
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ["DemosSection", "EvalSection", "ModelSection", "TasksSection", "TrainConfig"],
    "run": ["run"],
})
