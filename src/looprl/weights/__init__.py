"""looprl.weights."""
