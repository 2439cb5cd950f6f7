"""``memory``: the agent's scratch notes for this trajectory (add / list). Notes live in the
trajectory (``ToolContext.memory``, saved in ``Trajectory.metadata['memory']``), never in the repo.

    memory(action="add", note="tests live in tests/unit")  ->  "Saved note 1."
    memory(action="list")  ->  "1. tests live in tests/unit"
"""

from __future__ import annotations

from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, obj_schema


class Memory:
    name = "memory"
    description = ("Keep short notes for yourself during this task: action='add' with a note, or "
                   "action='list' to see all notes.")
    parameters = obj_schema({
        "action": {"type": "string", "enum": ["add", "list"]},
        "note": {"type": "string", "description": "the note to add (action='add')"},
    }, ["action"])
    read_only = False  # 'add' changes state: keep notes in call order

    def __init__(self, max_notes: int = 100, max_note_chars: int = 2000) -> None:
        self.max_notes = max_notes
        self.max_note_chars = max_note_chars

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if args["action"] == "list":
            if not ctx.memory:
                return "No notes yet."
            return "\n".join(f"{i}. {n}" for i, n in enumerate(ctx.memory, 1))
        note = args.get("note", "").strip()
        if not note:
            raise ToolError("memory action='add' needs a non-empty note")
        if len(note) > self.max_note_chars:
            raise ToolError(f"note is {len(note)} characters; keep notes under {self.max_note_chars}")
        if len(ctx.memory) >= self.max_notes:
            raise ToolError(f"memory is full ({self.max_notes} notes)")
        ctx.memory.append(note)
        return f"Saved note {len(ctx.memory)}."
