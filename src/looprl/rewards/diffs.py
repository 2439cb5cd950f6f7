"""Unified diffs, read and applied in pure Python (for the reward terms that look at an edit).

The sandbox reports a trajectory's edit as one unified diff (git style ``a/``/``b/`` paths, or
plain paths; ``/dev/null`` for created and deleted files). This module parses it into per-file
patches, says which paths it touches and which lines it adds, counts changed lines, and applies a
file's patch to the original text (the style term lints both sides).

>>> d = '''--- a/pkg/m.py
... +++ b/pkg/m.py
... @@ -1,2 +1,2 @@
...  def f(x):
... -    return x + 2
... +    return x + 1
... '''
>>> [p.path for p in parse_diff(d)]
['pkg/m.py']
>>> lines_changed(d)
2
>>> apply_patch("def f(x):\\n    return x + 2\\n", parse_diff(d)[0])
'def f(x):\\n    return x + 1\\n'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from looprl.errors import RewardError

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER_RE = re.compile(r"^diff --git (\S+) (\S+)$")


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block. ``lines`` keep their prefix: ' ' context, '-' removed, '+' added."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[str, ...]
    no_newline_old: bool = False
    """The old side's last line has no trailing newline ('\\ No newline at end of file')."""
    no_newline_new: bool = False


@dataclass(frozen=True)
class FilePatch:
    """The part of a diff about one file. ``old_path`` is None for a created file, ``new_path``
    None for a deleted one."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    binary: bool = False

    @property
    def path(self) -> str:
        """The file's path after the edit (before it, for a deletion)."""
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the patch touches (both names of a rename)."""
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p))

    @property
    def added_lines(self) -> tuple[str, ...]:
        return tuple(ln[1:] for h in self.hunks for ln in h.lines if ln.startswith("+"))

    @property
    def removed_lines(self) -> tuple[str, ...]:
        return tuple(ln[1:] for h in self.hunks for ln in h.lines if ln.startswith("-"))


def _clean_path(raw: str) -> str | None:
    """'a/pkg/m.py\\t2026-01-01 ...' -> 'pkg/m.py'; '/dev/null' -> None."""
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path.removeprefix("./")


def _read_hunk(lines: list[str], i: int, header: re.Match[str]) -> tuple[Hunk, int]:
    old_len = int(header.group(2)) if header.group(2) is not None else 1
    new_len = int(header.group(4)) if header.group(4) is not None else 1
    body: list[str] = []
    seen_old = seen_new = 0
    no_nl_old = no_nl_new = False
    while i < len(lines):
        ln = lines[i]
        if not ln.startswith("\\") and seen_old >= old_len and seen_new >= new_len:
            break
        if ln.startswith("\\"):  # "\ No newline at end of file" applies to the line before it
            if body and body[-1].startswith("-"):
                no_nl_old = True
            elif body and body[-1].startswith("+"):
                no_nl_new = True
            else:
                no_nl_old = no_nl_new = True
            i += 1
            continue
        tag = ln[:1] or " "  # some tools strip the space of an empty context line
        if tag not in " -+":
            break
        body.append(tag + ln[1:])
        seen_old += tag in " -"
        seen_new += tag in " +"
        i += 1
    if seen_old != old_len or seen_new != new_len:
        raise RewardError(f"malformed diff: hunk {header.group(0)!r} has {seen_old} old and "
                          f"{seen_new} new lines; the diff is truncated or was edited by hand")
    hunk = Hunk(int(header.group(1)), old_len, int(header.group(3)), new_len, tuple(body),
                no_nl_old, no_nl_new)
    return hunk, i


def parse_diff(text: str) -> tuple[FilePatch, ...]:
    """Split a unified diff into per-file patches. Raises ``RewardError`` on a malformed hunk."""
    lines = text.splitlines()
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = _GIT_HEADER_RE.match(ln)
        if m:
            old, new = _clean_path(m.group(1)), _clean_path(m.group(2))
            i += 1
            binary = False
            # extended header lines until '---' or the next file
            while i < len(lines) and not lines[i].startswith(("--- ", "diff --git ")):
                ext = lines[i]
                if ext.startswith("new file mode"):
                    old = None
                elif ext.startswith("deleted file mode"):
                    new = None
                elif ext.startswith("rename from "):
                    old = ext[len("rename from "):].strip()
                elif ext.startswith("rename to "):
                    new = ext[len("rename to "):].strip()
                elif ext.startswith(("Binary files ", "GIT binary patch")):
                    binary = True
                i += 1
            if i >= len(lines) or lines[i].startswith("diff --git "):
                patches.append(FilePatch(old, new, (), binary))  # mode change, rename, binary
            continue
        if ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _clean_path(ln[4:]), _clean_path(lines[i + 1][4:])
            i += 2
            hunks: list[Hunk] = []
            while i < len(lines):
                h = _HUNK_RE.match(lines[i])
                if not h:
                    break
                hunk, i = _read_hunk(lines, i + 1, h)
                hunks.append(hunk)
            patches.append(FilePatch(old, new, tuple(hunks)))
            continue
        i += 1
    return tuple(patches)


def touched_paths(text: str) -> tuple[str, ...]:
    """Every path a diff creates, edits, deletes or renames (both names of a rename)."""
    return tuple(dict.fromkeys(p for fp in parse_diff(text) for p in fp.paths))


def lines_changed(text: str) -> int:
    """Added plus removed lines of a diff (a modified line counts twice, as in ``git diff --stat``)."""
    return sum(len(fp.added_lines) + len(fp.removed_lines) for fp in parse_diff(text))


def _find(lines: list[str], needle: list[str], hint: int) -> int | None:
    """Index where ``needle`` occurs in ``lines``, searching outward from ``hint``."""
    if not needle:
        return min(max(hint, 0), len(lines))
    for delta in range(len(lines) + 1):
        for pos in (hint - delta, hint + delta) if delta else (hint,):
            if 0 <= pos <= len(lines) - len(needle) and lines[pos:pos + len(needle)] == needle:
                return pos
    return None


def apply_patch(original: str, patch: FilePatch) -> str:
    """Apply one file's hunks to its original text (context must match exactly; the hunk may
    have moved, as with ``patch``'s offset). Raises ``RewardError`` when a hunk does not apply."""
    if patch.binary:
        raise RewardError(f"cannot apply a binary patch to {patch.path}")
    lines = original.splitlines()
    had_final_newline = original.endswith("\n") or not original
    out: list[str] = []
    cursor = 0
    final_newline = had_final_newline
    for h in patch.hunks:
        old = [ln[1:] for ln in h.lines if ln[0] in " -"]
        new = [ln[1:] for ln in h.lines if ln[0] in " +"]
        hint = max(h.old_start - 1, 0) if h.old_len else h.old_start
        pos = _find(lines[cursor:], old, hint - cursor)
        if pos is None:
            raise RewardError(f"diff does not apply to {patch.path}: hunk at line {h.old_start} "
                              "does not match the task's base snapshot")
        pos += cursor
        out.extend(lines[cursor:pos])
        out.extend(new)
        cursor = pos + len(old)
        if cursor >= len(lines):  # this hunk reaches the end of the file
            # a pure deletion of the tail leaves an earlier line last, and it had a newline
            final_newline = not h.no_newline_new if h.new_len else True
    out.extend(lines[cursor:])
    if not out:
        return ""
    return "\n".join(out) + ("\n" if final_newline else "")
