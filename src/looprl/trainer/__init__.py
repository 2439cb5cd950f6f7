"""looprl.trainer."""
