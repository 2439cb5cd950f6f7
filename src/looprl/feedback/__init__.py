"""looprl.feedback."""
