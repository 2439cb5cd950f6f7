"""``finish``: end the episode, optionally with a summary of what was done.

    finish(summary="Fixed the off-by-one in parse_range.")  ->  "Finished."
"""

from __future__ import annotations

from typing import Any

from looprl.harness.tools.base import ToolContext, obj_schema


class Finish:
    name = "finish"
    description = "Call when the task is done. Ends the episode; summary says what you changed."
    parameters = obj_schema({
        "summary": {"type": "string", "description": "what you changed and why"},
    }, [])
    read_only = False  # ends the episode: runs after the turn's other calls, in order

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        ctx.finished = True
        ctx.finish_summary = args.get("summary", "")
        return "Finished."
