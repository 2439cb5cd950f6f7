"""looprl.rollout."""
