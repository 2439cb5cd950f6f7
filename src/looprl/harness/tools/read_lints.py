"""``read_lints``: ruff diagnostics for the files the agent changed (or the given paths), one
``path:line:col CODE message`` row each, sorted.

    read_lints()  ->  "pkg/calc.py:1:8 F401 `os` imported but unused\n1 diagnostic in 1 file."

File contents are read through the sandbox and linted by the harness's own ruff over stdin with
``--isolated`` (ruff's default rules: syntax errors, undefined names, unused imports, ...). So the
tool works in any sandbox, whether or not the task's environment has ruff, and its output does
not depend on the repository's lint config or on where the harness runs. Ruff only parses the
text; it never executes it. The ruff binary is a construction-time resource (``ruff_cmd``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, read_bytes, walk_dir


def changed_python_files(diff: str) -> list[str]:
    """Workspace paths of .py files added or modified in a unified diff (deleted ones excluded)."""
    paths = {m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff, re.MULTILINE)}
    return sorted(p for p in paths if p.endswith(".py"))


def default_ruff() -> str:
    """The ruff next to this Python (the venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "ruff"
    return str(local) if local.exists() else (shutil.which("ruff") or "ruff")


def ruff_diagnostics(ruff_cmd: str, path: str, data: bytes) -> list[tuple[str, int, int, str, str]]:
    """(path, line, col, code, message) for one file's text, linted from stdin."""
    try:
        proc = subprocess.run(
            [ruff_cmd, "check", "--isolated", "--no-cache", "--exit-zero", "--output-format=json",
             "--stdin-filename", path, "-"], input=data, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise ToolError(f"ruff is not installed for the harness ({ruff_cmd!r}); pip install ruff "
                        "or pass ruff_cmd= to make_tools") from None
    try:
        diags = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ToolError(f"ruff failed on {path}: {proc.stderr.decode(errors='replace')[:500]}") from None
    out = []
    for d in diags:
        loc = d.get("location") or {}
        out.append((path, int(loc.get("row", 0)), int(loc.get("column", 0)),
                    d.get("code") or "syntax-error", " ".join(str(d.get("message", "")).split())))
    return out


class ReadLints:
    name = "read_lints"
    description = ("Lint Python files with ruff. Without paths, lints the .py files you changed. "
                   "Returns path:line:col CODE message rows.")
    parameters = obj_schema({
        "paths": {"type": "array", "items": {"type": "string"},
                  "description": "files or directories to lint (default: changed .py files)"},
    }, [])
    read_only = True

    def __init__(self, ruff_cmd: str | None = None, max_files: int = 200, max_rows: int = 200) -> None:
        self.ruff_cmd = ruff_cmd or default_ruff()
        self.max_files = max_files
        self.max_rows = max_rows

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if "paths" in args:
            if not args["paths"]:
                raise ToolError("paths is empty; omit it to lint the files you changed")
            files = await self._expand(ctx, [check_path(p) for p in args["paths"]])
        else:
            files = changed_python_files(await ctx.sandbox.diff())
            if not files:
                return "No changed Python files to lint (pass paths to lint others)."
        if not files:
            return "No Python files in the given paths."
        keys: list[tuple[str, int, int, str, str]] = []
        for f in files[: self.max_files]:
            data = await read_bytes(ctx.sandbox, f)
            keys += await asyncio.to_thread(ruff_diagnostics, self.ruff_cmd, f, data)
        rows = [f"{p}:{line}:{col} {code} {msg}" for p, line, col, code, msg in sorted(set(keys))]
        skipped = (f" ({len(files) - self.max_files} more files not linted)"
                   if len(files) > self.max_files else "")
        if not rows:
            n = min(len(files), self.max_files)
            return f"No lint errors in {n} file{'s' if n != 1 else ''}.{skipped}"
        n_files = len({k[0] for k in keys})
        total = len(rows)
        summary = (f"{total} diagnostic{'s' if total != 1 else ''} in {n_files} "
                   f"file{'s' if n_files != 1 else ''}.{skipped}")
        if total > self.max_rows:
            rows = rows[: self.max_rows] + [f"[... {total - self.max_rows} more]"]
        return "\n".join(rows + [summary])

    async def _expand(self, ctx: ToolContext, paths: list[str]) -> list[str]:
        """Files as given; directories to the .py files below them."""
        out: set[str] = set()
        for p in paths:
            entries = await walk_dir(ctx.sandbox, p)
            if entries is None:
                out.add(p)
            else:
                out.update(e.path for e in entries if e.kind == "file" and e.path.endswith(".py"))
        return sorted(out)
