"""Shared pieces of the harness tools: the run context, argument validation against a tool's JSON
schema, workspace-path checks, deterministic output truncation, and how the harness runs its own
commands in the agent's sandbox (``harness_command``).

Every tool is a small class (one file each) with ``name``, ``description``, ``parameters`` (a JSON
schema object), ``read_only`` and ``async run(args, ctx) -> str``. The agent validates arguments
with ``validate_args`` before ``run`` so a tool only ever sees well-typed arguments.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from looprl.errors import PathEscapeError, ToolCallError, ToolError
from looprl.protocols import Sandbox, Tool
from looprl.types import FileEntry

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,),
}

PATH_RULE = ("paths are relative to the workspace root (e.g. 'src/pkg/mod.py' or '.'); "
             "absolute paths, '..' and paths through a symlink are not allowed (file tools do "
             "not follow symlinks; terminal commands do)")
MAX_PATH_BYTES = 4096
"""Longest path a tool accepts (Linux's PATH_MAX); each name in it at most 255 bytes (NAME_MAX)."""


@dataclass
class ToolContext:
    """What tools may touch during one trajectory (mutable on purpose: it is the run's state)."""

    sandbox: Sandbox
    memory: list[str] = field(default_factory=list)
    """The agent's scratch notes (``memory`` tool); saved in the trajectory, not in the repo."""
    finished: bool = False
    """Set by ``finish``: the agent ends the episode after this turn's calls."""
    finish_summary: str = ""


def obj_schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    """A closed JSON-schema object (no extra properties)."""
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def signature(tool: Tool) -> str:
    """``read_file(path: string, offset?: integer, limit?: integer)`` — shown in argument errors."""
    props = tool.parameters.get("properties", {})
    required = set(tool.parameters.get("required", []))
    parts = []
    for name, spec in props.items():
        tp = spec.get("type", "any")
        if tp == "array":
            tp = f"array of {spec.get('items', {}).get('type', 'any')}"
        if "enum" in spec:
            tp = " | ".join(json.dumps(e) for e in spec["enum"])
        parts.append(f"{name}{'' if name in required else '?'}: {tp}")
    return f"{tool.name}({', '.join(parts)})"


def _type_ok(value: Any, spec: dict[str, Any]) -> bool:
    tp = spec.get("type")
    if tp is None:
        return True
    if isinstance(value, bool) and tp in ("integer", "number"):
        return False  # JSON true is not a number, although Python says bool is an int
    if tp == "integer" and isinstance(value, float) and value.is_integer():
        return True
    if not isinstance(value, _JSON_TYPES[tp]):
        return False
    if tp == "array" and "items" in spec:
        return all(_type_ok(v, spec["items"]) for v in value)
    return True


def validate_args(tool: Tool, args: Any) -> dict[str, Any]:
    """Check ``args`` against ``tool.parameters``; return them with integral floats made ints.

    Raises ``ToolCallError`` (a broken call) naming the expected signature.
    """
    sig = signature(tool)
    if not isinstance(args, dict):
        raise ToolCallError(f"arguments of {tool.name} must be a JSON object; expected {sig}")
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in args]
    if missing:
        raise ToolCallError(f"{tool.name}: missing required argument(s) {', '.join(missing)}; "
                            f"expected {sig}")
    extra = sorted(k for k in args if k not in props)
    if extra:
        raise ToolCallError(f"{tool.name}: unknown argument(s) {', '.join(extra)}; expected {sig}")
    out: dict[str, Any] = {}
    for key, value in args.items():
        spec = props[key]
        if not _type_ok(value, spec):
            raise ToolCallError(f"{tool.name}: argument {key} must be {spec.get('type')}, got "
                                f"{type(value).__name__} {_short(value)}; expected {sig}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolCallError(f"{tool.name}: argument {key} must be one of {spec['enum']}, got "
                                f"{_short(value)}; expected {sig}")
        if spec.get("minimum") is not None and value < spec["minimum"]:
            raise ToolCallError(f"{tool.name}: argument {key} must be >= {spec['minimum']}, got "
                                f"{value}; expected {sig}")
        out[key] = int(value) if spec.get("type") == "integer" else value
    return out


def _short(value: Any, n: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def check_path(path: str) -> str:
    """Normalise a workspace-relative path; reject absolute paths and '..' escapes
    (``PathEscapeError``) and paths no file system takes (``ToolError``).

    Symlinks are refused by the sandbox itself (it knows the real tree; its host side follows
    none, ``sandbox/beneath.py``) with ``PathEscapeError``; tools wrap its refusal with the same
    rule (``PATH_RULE``).
    """
    raw = path.strip()
    if not raw:
        raise ToolError(f"empty path; {PATH_RULE}")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:
        raise ToolError(f"{ascii(path)[:100]} is not valid Unicode text; {PATH_RULE}") from None
    if size > MAX_PATH_BYTES or any(len(n.encode()) > 255 for n in raw.split("/")):
        raise ToolError(f"path of {size} bytes ({path[:60]!r}...) is too long: at most "
                        f"{MAX_PATH_BYTES} bytes, 255 per name")
    if raw.startswith(("/", "~")) or (len(raw) > 1 and raw[1] == ":"):
        raise PathEscapeError(f"{path!r} is absolute; {PATH_RULE}")
    if "\x00" in raw:
        raise ToolError(f"{path!r} contains a NUL byte; {PATH_RULE}")
    norm = posixpath.normpath(raw.replace("\\", "/"))
    if norm == ".." or norm.startswith("../"):
        raise PathEscapeError(f"{path!r} leaves the workspace; {PATH_RULE}")
    return norm


def outside_error(path: str, err: Exception) -> ToolError:
    """Re-word a sandbox refusal for the model: the sandbox's reason, then what is allowed (a
    ``PathEscapeError``) or how to look around (a missing file)."""
    msg = str(err).strip() or type(err).__name__
    if isinstance(err, PathEscapeError):
        return PathEscapeError(f"{path!r} is not accessible: {msg}; {PATH_RULE}")
    if "not found" in msg or "No such file" in msg:
        return ToolError(f"{path}: no such file (use list_dir or glob to find files)")
    return ToolError(f"{path}: {msg}")


def harness_command(cmd: str) -> str:
    """``cmd`` as the harness runs a program of its own in the agent's sandbox (the test tool's
    pytest): in a fresh, empty home (removed after) with Python's user site-packages off. The
    sandbox's home (/tmp) outlives each command, so without this a ``usercustomize.py`` the agent
    left under ``~/.local`` — or a ``~/.config`` file — would run in or steer the harness's run,
    and nothing of it would show in the diff. The agent's own commands keep their home: it is
    their machine. The workspace is the agent's either way: its ``conftest.py`` and
    ``sitecustomize.py`` reach a test run as they reach any run of those tests (the grader's run,
    in a fresh sandbox, restores them and flags the attempt)."""
    return ('h="$(mktemp -d)" || exit 125; export HOME="$h" PYTHONNOUSERSITE=1; '
            f'trap \'rm -rf "$h"\' EXIT; {cmd}')


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` (stable: depends only on the text and the cap)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def decode_text(data: bytes, path: str) -> str:
    """Decode a file for the model; binary files are refused with a clear error."""
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path} looks like a binary file ({len(data)} bytes); only text files "
                        "can be read or edited")
    return data.decode("utf-8", errors="replace")


async def walk_dir(sandbox: Sandbox, path: str, max_entries: int = 100_000) -> list[FileEntry] | None:
    """Entries below directory ``path``; ``None`` when ``path`` is a file. Missing paths and
    refused ones raise ``ToolError`` (whichever way the sandbox reports them)."""
    try:
        return await sandbox.walk(path, max_entries=max_entries)
    except PathEscapeError as e:
        raise outside_error(path, e) from None
    except (FileNotFoundError, NotADirectoryError, PermissionError, ToolError):
        pass
    try:
        await sandbox.read(path)
    except (OSError, ToolError):
        raise ToolError(f"{path}: no such file or directory (list_dir '.' shows the root)") from None
    return None


async def read_bytes(sandbox: Sandbox, path: str) -> bytes:
    """Read a workspace file, turning missing files and refused paths into ``ToolError``."""
    try:
        return await sandbox.read(path)
    except FileNotFoundError:
        raise ToolError(f"{path}: no such file (use list_dir or glob to find files)") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory; use list_dir to see its entries") from None
    except (NotADirectoryError, PermissionError, ToolError) as e:
        raise outside_error(path, e) from None


async def write_bytes(sandbox: Sandbox, path: str, data: bytes) -> None:
    """Write a workspace file, turning refused paths into ``ToolError``."""
    try:
        await sandbox.write(path, data)
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory; give a file path") from None
    except (FileNotFoundError, NotADirectoryError, PermissionError, ToolError) as e:
        raise outside_error(path, e) from None
