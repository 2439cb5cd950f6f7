"""looprl.models."""
