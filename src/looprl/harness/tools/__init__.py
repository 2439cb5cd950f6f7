"""looprl.harness.tools."""
