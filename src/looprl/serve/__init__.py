"""looprl.serve."""
