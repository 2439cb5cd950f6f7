"""looprl.feedback: the real-time RL cycle driven by what users do with the agent's edits.

- ``store``: ``FeedbackStore`` — served sessions (token-exact trajectories) and append-only
  feedback events (kept / reverted / partially_kept / follow_up) in SQLite.
- ``signals``: events -> ``RewardBreakdown`` (``SIGNALS``), the dissatisfied-follow-up classifier.
- ``ab``: ``assign_arm``, per-arm metrics with bootstrap CIs, promote / keep / rollback.
- ``cycle``: ``run_cycle`` — scored sessions -> one GRPO step -> bench gate -> promote.
- ``cli``: ``looprl feedback cycle|ab|promote|sessions``. The serving side is ``looprl.serve``.
"""

from looprl.feedback.ab import ABReport, ab_report, assign_arm
from looprl.feedback.cycle import CycleConfig, CycleResult, promote, read_policy, run_cycle
from looprl.feedback.signals import SIGNALS, follow_up_sentiment, is_dissatisfied, session_reward
from looprl.feedback.store import EVENT_KINDS, Event, FeedbackStore, SessionRecord

__all__ = ["ABReport", "CycleConfig", "CycleResult", "EVENT_KINDS", "Event", "FeedbackStore",
           "SIGNALS", "SessionRecord", "ab_report", "assign_arm", "follow_up_sentiment",
           "is_dissatisfied", "promote", "read_policy", "run_cycle", "session_reward"]
