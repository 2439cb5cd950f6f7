"""looprl.dashboard."""
