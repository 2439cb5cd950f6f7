"""looprl.feedback: the real-time RL cycle driven by what users do with the agent's edits.

- ``store``: ``FeedbackStore`` — served sessions (token-exact trajectories) and append-only
  feedback events (kept / reverted / partially_kept / follow_up) in SQLite.
- ``signals``: events -> ``RewardBreakdown`` (``SIGNALS``); ``sentiment``: the follow-up classifier.
- ``follow_ups``: dissatisfied follow-ups as hints, continued by the serving policy and distilled
  in the window's training (``grpo.experimental.feedback.follow_ups``).
- ``ab``: ``assign_arm``, per-arm metrics with bootstrap CIs, promote / keep / rollback.
- The real-time cycle, one part per job: ``window`` (scored sessions -> trajectories -> groups),
  ``update`` (GRPO steps -> a saved candidate, continuing Adam), ``gate`` (bench gate, A/B
  decision), ``policies`` (versions and the pointers serve follows). ``cycle``: ``run_cycle``,
  one cycle on demand; ``loop``: ``run_loop``, cycles beside a server it starts
  (``realtime_config``, ``production``, ``loop_cycle``, ``accounting``, ``report``).
- ``simulate``: ``simulate_users`` — simulated users over ``looprl serve``'s HTTP API, keeping or
  reverting edits by the tasks' hidden tests (with noise), following up.
- ``looprl.commands.feedback``: ``looprl feedback loop|cycle|ab|promote|sessions|simulate``. The
  serving side is ``looprl.serve``.
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "ab": ["ABReport", "ab_report", "assign_arm"],
    "cycle": ["CycleConfig", "CycleResult", "run_cycle"],
    "policies": ["PolicyRef", "promote", "read_policy"],
    "sentiment": ["follow_up_sentiment", "is_dissatisfied"],
    "signals": ["SIGNALS", "session_reward"],
    "simulate": ["SimConfig", "SimSummary", "simulate_users"],
    "store": ["EVENT_KINDS", "Event", "FeedbackStore", "SessionRecord"],
})
