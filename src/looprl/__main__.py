"""``python -m looprl``: the ``looprl`` command (how a process starts its own sub-commands with
the interpreter it runs on)."""

from looprl.cli import app

app()
