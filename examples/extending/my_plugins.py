"""A custom tool and a custom reward term for looprl, found by name as ``my_plugins:...``
(``looprl.plugins``). See docs/extending.md."""

from __future__ import annotations

from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema
from looprl.types import Task, Trajectory


class CountLines:
    """``count_lines``: how many lines a workspace file has (a cheap look before reading it)."""

    name = "count_lines"
    description = "Count the lines of a file in the workspace."
    parameters = obj_schema({"path": {"type": "string", "description": "file to count"}}, ["path"])
    read_only = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args["path"])
        data = await ctx.sandbox.read(path)  # ToolError (the model's mistake) if it is missing
        if b"\x00" in data[:8192]:
            raise ToolError(f"{path} is a binary file")
        lines = len(data.decode("utf-8", errors="replace").splitlines())
        return f"{path}: {lines} lines"


def small_diff(task: Task, trajectory: Trajectory) -> float | None:
    """Reward term: -0.05 per changed line beyond 4 (fixes here are one-liners), at most -0.5.

    >>> from looprl.types import Counters, Grader, StopReason
    >>> t = Task("t", "/r", "p", Grader("pytest", fail_to_pass=("x",)))
    >>> diff = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-a\\n+b\\n"
    >>> small_diff(t, Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED, diff=diff))
    0.0
    """
    changed = sum(1 for line in trajectory.diff.splitlines()
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return max(-0.5, -0.05 * max(0, changed - 4))
