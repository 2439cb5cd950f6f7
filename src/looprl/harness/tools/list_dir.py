"""``list_dir``: the entries of a workspace directory (one level, or recursive up to a depth).

    list_dir(path="src")  ->  "src/pkg/\nsrc/pkg/__init__.py (120 B)\n..."
"""

from __future__ import annotations

from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, walk_dir


class ListDir:
    name = "list_dir"
    description = ("List a workspace directory: directories end with '/', files show their size. "
                   "depth=1 (default) lists direct entries; larger depths list deeper.")
    parameters = obj_schema({
        "path": {"type": "string", "description": "workspace-relative directory ('.' = root)"},
        "depth": {"type": "integer", "minimum": 1, "description": "levels to list (default 1)"},
    }, [])
    read_only = True

    def __init__(self, max_entries: int = 500) -> None:
        self.max_entries = max_entries

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args.get("path", "."))
        depth = min(args.get("depth", 1), 10)
        entries = await walk_dir(ctx.sandbox, path)
        if entries is None:
            raise ToolError(f"{path} is a file; use read_file to read it")
        prefix = "" if path == "." else path + "/"
        rows = []
        for e in sorted(entries, key=lambda e: e.path):
            rel = e.path[len(prefix):] if e.path.startswith(prefix) else e.path
            if not rel or rel.count("/") >= depth:
                continue
            suffix = {"dir": "/", "link": " -> (symlink)"}.get(e.kind, f" ({e.size} B)")
            rows.append(e.path + suffix)
        if not rows:
            return f"{path}/ is empty." if path != "." else "The workspace is empty."
        total = len(rows)
        if total > self.max_entries:
            rows = rows[: self.max_entries]
            rows.append(f"[... {total - self.max_entries} more entries; list a subdirectory]")
        return "\n".join(rows)
