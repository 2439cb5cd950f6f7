"""looprl.rewards: the reward of a trajectory, as named, explainable terms.

- ``length``: concave effort (length) penalty.
- ``hacking``: reward-hacking and behaviour monitors, their penalties, ``MonitorStats``.
- ``style``: new lint diagnostics and diff size against the gold patch.
- ``composite``: ``RewardConfig``, ``compute_reward`` (tests + terms -> ``RewardBreakdown``) and
  ``reward_metrics`` for the trainer's per-step logs.
- ``tests``: grading by the task's hidden tests (``GradeResult``).

    from looprl.rewards import RewardConfig, compute_reward
    breakdown = compute_reward(task, trajectory, grade, RewardConfig())
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "composite": ["RewardConfig", "TERMS", "compute_reward", "reward_metrics"],
    "hacking": ["DETECTORS", "HackingConfig", "MonitorStats", "detect"],
    "length": ["LengthConfig", "effort", "length_penalty", "penalty_curve"],
    "style": ["StyleConfig", "diff_size_penalty", "style_lint_penalty"],
})
