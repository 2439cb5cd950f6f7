"""``glob``: workspace files matching a glob pattern ('**' crosses directories), sorted by path.

    glob(pattern="src/**/*.py")  ->  "src/pkg/__init__.py\nsrc/pkg/mod.py"
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, walk_dir


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob: '*' and '?' stay inside one path component, '**/' spans any number of
    directories, '[abc]' is a character class. A pattern without '/' matches at any depth.
    A pattern that cannot compile (a class like '[z-a]') is the model's ``ToolError``."""
    try:
        return _glob_regex(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        raise ToolError(f"invalid glob pattern {pattern[:200]!r}: {e}; e.g. '**/*.py' or "
                        "'src/[a-c]*.py'") from None


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    if "/" not in pattern:
        pattern = "**/" + pattern
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in pattern[i + 1:]:
            j = pattern.index("]", i + 1)
            body = pattern[i + 1: j].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


class Glob:
    name = "glob"
    description = ("Find workspace files whose path matches a glob pattern, e.g. '**/*.py' or "
                   "'tests/test_*.py'. A pattern without '/' matches file names at any depth.")
    parameters = obj_schema({
        "pattern": {"type": "string", "description": "glob pattern over workspace-relative paths"},
        "path": {"type": "string", "description": "directory to search under (default '.')"},
    }, ["pattern"])
    read_only = True

    def __init__(self, max_results: int = 200) -> None:
        self.max_results = max_results

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        under = check_path(args.get("path", "."))
        pattern = args["pattern"].strip().removeprefix("./")
        if not pattern:
            raise ToolError("empty glob pattern; try '**/*.py'")
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise ToolError(f"glob pattern {pattern!r} must be workspace-relative, without '..'")
        regex = glob_regex(pattern)
        entries = await walk_dir(ctx.sandbox, under)
        if entries is None:
            raise ToolError(f"glob searches under a directory; {under} is a file")
        prefix = "" if under == "." else under + "/"
        hits = sorted(e.path for e in entries if e.kind == "file" and (
            regex.match(e.path) or regex.match(e.path[len(prefix):])))
        if not hits:
            return f"No files match {pattern!r} under {under}."
        total = len(hits)
        if total > self.max_results:
            hits = hits[: self.max_results] + [
                f"[... {total - self.max_results} more; use a narrower pattern]"]
        return "\n".join(hits)
