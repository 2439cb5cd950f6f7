"""looprl.search."""
