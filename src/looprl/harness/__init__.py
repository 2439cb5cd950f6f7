"""looprl.harness."""
