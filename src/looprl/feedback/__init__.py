"""looprl.feedback: the real-time RL cycle driven by what users do with the agent's edits.

- ``store``: ``FeedbackStore`` — served sessions (token-exact trajectories) and append-only
  feedback events (kept / reverted / partially_kept / follow_up) in SQLite.
- ``signals``: events -> ``RewardBreakdown`` (``SIGNALS``); ``sentiment``: the follow-up classifier.
- ``ab``: ``assign_arm``, per-arm metrics with bootstrap CIs, promote / keep / rollback.
- ``cycle``: ``run_cycle`` — scored sessions -> one GRPO step -> bench gate -> promote.
- ``simulate``: ``simulate_users`` — simulated users over ``looprl serve``'s HTTP API, keeping or
  reverting edits by the tasks' hidden tests (with noise), following up.
- ``cli``: ``looprl feedback cycle|ab|promote|sessions|simulate``. The serving side is ``looprl.serve``.
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "ab": ["ABReport", "ab_report", "assign_arm"],
    "cycle": ["CycleConfig", "CycleResult", "promote", "read_policy", "run_cycle"],
    "sentiment": ["follow_up_sentiment", "is_dissatisfied"],
    "signals": ["SIGNALS", "session_reward"],
    "simulate": ["SimConfig", "SimSummary", "simulate_users"],
    "store": ["EVENT_KINDS", "Event", "FeedbackStore", "SessionRecord"],
})
