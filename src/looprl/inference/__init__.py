"""looprl.inference."""
