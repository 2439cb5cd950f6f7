"""looprl.rewards."""
