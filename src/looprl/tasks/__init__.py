"""looprl.tasks."""
