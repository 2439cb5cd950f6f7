"""looprl.bench."""
