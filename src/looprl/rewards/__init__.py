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

from looprl.rewards.composite import TERMS, RewardConfig, compute_reward, reward_metrics
from looprl.rewards.hacking import DETECTORS, HackingConfig, MonitorStats, detect
from looprl.rewards.length import LengthConfig, effort, length_penalty, penalty_curve
from looprl.rewards.style import StyleConfig, diff_size_penalty, style_lint_penalty

__all__ = [
    "DETECTORS", "TERMS", "HackingConfig", "LengthConfig", "MonitorStats", "RewardConfig",
    "StyleConfig", "compute_reward", "detect", "diff_size_penalty", "effort", "length_penalty",
    "penalty_curve", "reward_metrics", "style_lint_penalty",
]
