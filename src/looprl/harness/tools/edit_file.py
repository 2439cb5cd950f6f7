"""``edit_file``: replace an exact, unique snippet of a file (or every occurrence with
``replace_all``).

    edit_file(path="src/pkg/mod.py", old_string="return a - b", new_string="return a + b")
      ->  "Edited src/pkg/mod.py: replaced 1 occurrence (line 12)."

Zero or several matches are errors that say how many and on which lines, so the model can add
context. After editing a ``.py`` file the result is parsed with the harness's Python; a syntax
error does NOT undo the edit (multi-step edits pass through invalid states) but the result says
so, with the line, so the model can fix it.
"""

from __future__ import annotations

import warnings
from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import (
    ToolContext,
    check_path,
    decode_text,
    obj_schema,
    read_bytes,
    write_bytes,
)


def python_syntax_note(path: str, text: str) -> str:
    """'' when ``text`` parses as Python (or is not a .py file), else a warning line."""
    if not path.endswith(".py"):
        return ""
    try:
        # a full compile, not ast.parse: building AST objects for odd input can trip CPython
        # 3.11's "AST constructor recursion depth mismatch" and poison later ast.parse calls
        # the model's code may warn (SyntaxWarning: "is" with a literal, ...); in this process
        # that is noise on the trainer's console, not the model's output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        return (f"\nWarning: {path} no longer parses as Python: {e.msg} at line {e.lineno}. "
                "The edit was applied; fix the file before running it.")
    except ValueError as e:  # NUL bytes
        return f"\nWarning: {path} no longer parses as Python: {e}."
    except (RecursionError, MemoryError):  # CPython's limits: nesting too deep to compile
        return (f"\nWarning: {path} is nested too deeply for Python to compile it; the edit was "
                "applied.")
    return ""


def find_all(text: str, needle: str) -> list[int]:
    """Start offsets of every occurrence, overlapping ones included ('aa' is in 'aaa' twice: an
    edit of it would be ambiguous)."""
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + 1)
    return out


def _where(text: str, starts: list[int], limit: int = 10) -> str:
    lines = [str(text.count("\n", 0, i) + 1) for i in starts[:limit]]
    return ", ".join(lines) + (", ..." if len(starts) > limit else "")


class EditFile:
    name = "edit_file"
    description = ("Replace old_string with new_string in a file. old_string must match the file "
                   "exactly (whitespace included) and be unique unless replace_all is true; add "
                   "surrounding lines to make it unique.")
    parameters = obj_schema({
        "path": {"type": "string", "description": "workspace-relative file path"},
        "old_string": {"type": "string", "description": "exact text to replace"},
        "new_string": {"type": "string", "description": "replacement text"},
        "replace_all": {"type": "boolean", "description": "replace every occurrence"},
    }, ["path", "old_string", "new_string"])
    read_only = False

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args["path"])
        old, new = args["old_string"], args["new_string"]
        if old == "":
            raise ToolError("old_string is empty; to create or overwrite a file use write_file")
        if old == new:
            raise ToolError("old_string and new_string are identical; nothing to change")
        text = decode_text(await read_bytes(ctx.sandbox, path), path)
        starts = find_all(text, old)
        if not starts:
            hint = ""
            if old.strip() and text.count(old.strip()) > 0:
                hint = " (it matches after stripping leading/trailing whitespace: check indentation)"
            raise ToolError(f"old_string not found in {path}: 0 matches{hint}. Read the file and "
                            "copy the text exactly.")
        if len(starts) > 1 and not args.get("replace_all", False):
            raise ToolError(f"old_string matches {len(starts)} times in {path} (lines "
                            f"{_where(text, starts)}); add surrounding lines to make it unique, "
                            "or set replace_all=true.")
        count = text.count(old)  # replace_all replaces non-overlapping occurrences, left to right
        new_text = text.replace(old, new)
        await write_bytes(ctx.sandbox, path, new_text.encode("utf-8"))
        where = _where(text, starts)
        noun = "occurrence" if count == 1 else "occurrences"
        return (f"Edited {path}: replaced {count} {noun} (line{'s' if count > 1 else ''} {where})."
                + python_syntax_note(path, new_text))
