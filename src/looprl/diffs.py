"""Git diffs: one module that writes, reads and applies them, with lines split as git splits them.

Every edit in looprl travels as one git-style unified diff: the sandbox reports a workspace's
changes as one (``blob_diff``, per path), tasks carry a gold patch and a hidden test patch as
one (``unified_diff``), the grader applies the agent's with real ``git apply``, the reward terms
and the oracle read them (``parse_diff``, ``apply_patch``), feedback records which files a served
edit changed (``changed_files``).

    d = unified_diff("pkg/m.py", "x = 1\\n", "x = 2\\n")      # '' when unchanged
    (fp,) = parse_diff(d)                                      # FilePatch: paths, modes, hunks
    apply_patch("x = 1\\n", fp) == "x = 2\\n"

A line ends at ``\\n`` and nowhere else (``split_lines``), as in git and ``patch``:
``str.splitlines()`` also breaks at ``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``,
``\\u2028`` and ``\\u2029``, so a diff written or read with it does not apply (a form feed is legal
Python source). What ``blob_diff`` writes, ``git apply`` reproduces byte for byte: paths that git
would quote are C-quoted; a type change (file <-> symlink) is a deletion and a creation of the
path, as git writes it; binary content (a NUL byte, or not UTF-8, which the diff's text cannot
hold) goes as a ``GIT binary patch`` with its full index line. What it does not carry: new
content over ``MAX_BLOB_BYTES`` (written as git's bare "Binary files ... differ", which
``FilePatch.carried`` says is False; a deletion is always carried), and anything but regular files and symlinks (directories
appear through their files; FIFOs, sockets and devices as absent), as in git.

Why not a library: ``whatthepatch`` splits with ``str.splitlines()`` (the bug this module
exists to avoid); ``patch-ng`` rewrites line ends (``\\r\\n``, ``\\r``) while applying; ``unidiff``
splits at ``\\n`` and parses well, but neither writes nor applies diffs, leaves git's quoted paths
quoted and ignores ``rename from``/``rename to``. The parser is the smaller part of this module;
applying to a real tree stays with ``git apply`` (``rewards.tests``).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
import zlib
from dataclasses import dataclass

from looprl.errors import DiffError

MAX_BLOB_BYTES = 4 << 20
"""Largest new content of a file a diff carries (larger, or an old side larger, is binary). A workspace's diff is kept in its
trajectory, saved and shown on the dashboard; source files this size do not occur, a generated
blob of hundreds of MB would swamp every one of those (and ``difflib`` takes minutes on it)."""

REGULAR, EXECUTABLE, SYMLINK = 0o100644, 0o100755, 0o120000
"""The git modes ``blob_diff`` writes."""
_NULL_SHA = "0" * 40

Blob = tuple[bytes, int]
"""A path's content and git mode (``REGULAR``, ``EXECUTABLE``, ``SYMLINK``: the link's target)."""

# ----------------------------------------------------------------------------- lines and paths


def split_lines(text: str) -> list[str]:
    r"""The lines of ``text`` as git counts them: each ends at ``\n`` (kept), the last may not.

    >>> split_lines("a\x0cb\r\nc")
    ['a\x0cb\r\n', 'c']
    >>> split_lines("") , split_lines("\n")
    ([], ['\n'])
    """
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


_ESCAPES = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}


def quote_path(path: str) -> str:
    r"""``path`` as git writes it in a diff: C-quoted when it holds a control character, a
    quote, a backslash or a non-ASCII byte (as with git's default ``core.quotePath``), so every
    name a file system allows fits on one line. A name the file system gave as bytes that are
    not UTF-8 (Python's surrogate escapes) keeps those bytes.

    >>> quote_path("pkg/m.py"), quote_path("a\nb"), quote_path("café")
    ('pkg/m.py', '"a\\nb"', '"caf\\303\\251"')
    """
    raw = path.encode("utf-8", "surrogateescape")
    if all(32 <= b < 127 and b not in (34, 92) for b in raw):
        return path
    return '"' + "".join(f"\\{_ESCAPES[b]}" if b in _ESCAPES else
                         chr(b) if 32 <= b < 127 else f"\\{b:03o}" for b in raw) + '"'


def unquote_path(text: str) -> str:
    r"""The inverse of ``quote_path`` (a name not in quotes is returned as it is).

    >>> unquote_path('"caf\\303\\251"'), unquote_path("plain name")
    ('café', 'plain name')
    """
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text
    out, i, body = bytearray(), 0, text[1:-1]
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
        elif body[i + 1:i + 4].isdigit() and len(body[i + 1:i + 4]) == 3:
            out.append(int(body[i + 1:i + 4], 8) & 0xFF)
            i += 4
        elif body[i + 1:i + 2] in _UNESCAPES:
            out.append(_UNESCAPES[body[i + 1]])
            i += 2
        else:
            raise DiffError(f"bad escape in quoted path {text!r}; quote paths as git does")
    return out.decode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------- writing


def _marked(text: str) -> list[str]:
    """``split_lines``, the last line given git's marker when it has no newline."""
    lines = split_lines(text)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _hunks(a: str, b: str, old: str, new: str) -> str:
    # git ends a name holding a space with a tab on these lines, or it reads only its first word
    a, b = (n + "\t" if " " in n and not n.startswith('"') else n for n in (a, b))
    return "".join(difflib.unified_diff(_marked(old), _marked(new), fromfile=a, tofile=b))


def unified_diff(path: str, old: str | None, new: str | None) -> str:
    """A git-style diff of one regular file from text ``old`` to ``new`` (None: the file is
    absent, i.e. created or deleted); '' when nothing changed."""
    def blob(text: str | None) -> Blob | None:
        return None if text is None else (text.encode("utf-8", "surrogateescape"), REGULAR)
    return blob_diff(path, blob(old), blob(new))


def _text(data: bytes) -> str | None:
    """``data`` as text a diff can carry, or None (binary): git's test (a NUL byte in the first
    8000), and UTF-8, since a diff here is a ``str``."""
    if b"\0" in data[:8000]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _sha(data: bytes | None) -> str:
    return _NULL_SHA if data is None else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _literal(data: bytes) -> str:
    """A ``GIT binary patch`` literal: zlib, then git's base85 in lines of up to 52 bytes, each
    led by its length ('A'-'Z' = 1-26, 'a'-'z' = 27-52)."""
    z = zlib.compress(data)
    rows = []
    for i in range(0, len(z), 52):
        chunk = z[i:i + 52]
        n = len(chunk)
        rows.append((chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27))
                    + base64.b85encode(chunk, pad=True).decode("ascii") + "\n")
    return f"literal {len(data)}\n" + "".join(rows) + "\n"


def blob_diff(path: str, old: Blob | None, new: Blob | None) -> str:
    """The git diff of one path from ``old`` to ``new`` (None: absent), which ``git apply``
    reproduces exactly; '' when nothing changed. A type change (file <-> symlink) is written as
    git writes it: the old deleted, then the new created."""
    if old == new:
        return ""
    if old is not None and new is not None and (old[1] == SYMLINK) != (new[1] == SYMLINK):
        return blob_diff(path, old, None) + blob_diff(path, None, new)
    head = f"diff --git {quote_path('a/' + path)} {quote_path('b/' + path)}\n"
    if old is None:
        head += f"new file mode {new[1]:o}\n"  # type: ignore[index]
    elif new is None:
        head += f"deleted file mode {old[1]:o}\n"
    elif old[1] != new[1]:
        head += f"old mode {old[1]:o}\nnew mode {new[1]:o}\n"
    old_data, new_data = (old[0] if old else None), (new[0] if new else None)
    if old_data == new_data:
        return head  # a mode change alone
    a = "/dev/null" if old is None else quote_path("a/" + path)
    b = "/dev/null" if new is None else quote_path("b/" + path)
    if len(new_data or b"") > MAX_BLOB_BYTES:
        return head + f"Binary files {a} and {b} differ\n"  # changed; the content is not carried
    # an old side over the limit goes as binary too: a binary patch needs only the new content
    small = len(old_data or b"") <= MAX_BLOB_BYTES
    old_text = (_text(old_data) if old_data is not None else "") if small else None
    new_text = _text(new_data) if new_data is not None else ""
    if old_text is None or new_text is None:
        index = f"index {_sha(old_data)}..{_sha(new_data)}\n"
        return head + index + "GIT binary patch\n" + _literal(new_data or b"")
    return head + _hunks(a, b, old_text, new_text)


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block. ``lines`` keep their tag (' ' context, '-' removed, '+' added) and drop
    their ``\\n``."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[str, ...]
    no_newline_old: bool = False
    """The old side's last line has no newline ('\\ No newline at end of file')."""
    no_newline_new: bool = False

    def _side(self, tags: str, no_newline: bool) -> tuple[str, ...]:
        out = [ln[1:] + "\n" for ln in self.lines if ln[0] in tags]
        if out and no_newline:
            out[-1] = out[-1][:-1]
        return tuple(out)

    @property
    def old_lines(self) -> tuple[str, ...]:
        """The old side's lines, each with its ``\\n`` (the last one without, if it had none)."""
        return self._side(" -", self.no_newline_old)

    @property
    def new_lines(self) -> tuple[str, ...]:
        return self._side(" +", self.no_newline_new)


@dataclass(frozen=True)
class FilePatch:
    """The part of a diff about one path. ``old_path`` is None for a created file, ``new_path``
    None for a deleted one; modes are git's (None: not stated)."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...] = ()
    binary: bool = False
    """A binary change: a ``GIT binary patch`` (``carried``) or a bare "Binary files differ"."""
    carried: bool = True
    """The diff holds the new content (False: a bare "Binary files ... differ" note, which no
    tool can apply)."""
    old_mode: int | None = None
    new_mode: int | None = None
    text: str = ""
    """This patch's own lines of the diff, exactly: joined, the patches of a diff give it back
    (less any lines before the first patch), so a diff can be filtered by path."""

    @property
    def path(self) -> str:
        """The path after the edit (before it, for a deletion)."""
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the patch touches (both names of a rename)."""
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p))

    @property
    def added_lines(self) -> tuple[str, ...]:
        return tuple(ln[1:] for h in self.hunks for ln in h.lines if ln[0] == "+")

    @property
    def removed_lines(self) -> tuple[str, ...]:
        return tuple(ln[1:] for h in self.hunks for ln in h.lines if ln[0] == "-")


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_RE = re.compile(r'^diff --git ("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)$')


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path.removeprefix("./")


def _header_path(raw: str) -> str | None:
    """'a/pkg/m.py<TAB>2026-01-01 ...' -> 'pkg/m.py'; '/dev/null' -> None."""
    raw = raw.rstrip("\n")
    raw = raw if raw.startswith('"') else raw.split("\t", 1)[0]
    path = unquote_path(raw.strip())
    return None if path == "/dev/null" else _strip_prefix(path)


def _git_names(line: str) -> tuple[str, str]:
    """Both names of a ``diff --git`` line. Unquoted names holding spaces are split where the two
    halves name the same path (git's rule; a rename also names its paths on later lines)."""
    m = _GIT_RE.match(line.rstrip("\n"))
    if m:
        return _strip_prefix(unquote_path(m.group(1))), _strip_prefix(unquote_path(m.group(2)))
    body = line.rstrip("\n")[len("diff --git "):]
    half = (len(body) - 1) // 2
    if body[half:half + 3] == " b/" and body[2:half] == body[half + 3:]:
        return body[2:half], body[half + 3:]
    a, _, b = body.rpartition(" b/")
    return _strip_prefix(a), b


def _read_hunk(lines: list[str], i: int, m: re.Match[str]) -> tuple[Hunk, int]:
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    body: list[str] = []
    seen_old = seen_new = 0
    no_nl_old = no_nl_new = False
    while i < len(lines):
        ln = lines[i].removesuffix("\n")
        if ln.startswith("\\"):  # "\ No newline at end of file": about the line before it
            last = body[-1][0] if body else " "
            no_nl_old = no_nl_old or last in " -"
            no_nl_new = no_nl_new or last in " +"
            i += 1
            continue
        if seen_old >= old_len and seen_new >= new_len:
            break
        tag = ln[:1] or " "  # some tools strip the space of an empty context line
        if tag not in " -+":
            break
        body.append(tag + ln[1:])
        seen_old += tag in " -"
        seen_new += tag in " +"
        i += 1
    if seen_old != old_len or seen_new != new_len:
        raise DiffError(f"malformed diff: hunk {m.group(0)!r} has {seen_old} old and {seen_new} "
                        "new lines; the diff is truncated or was edited by hand")
    return Hunk(int(m.group(1)), old_len, int(m.group(3)), new_len, tuple(body),
                no_nl_old, no_nl_new), i


def _read_hunks(lines: list[str], i: int) -> tuple[list[Hunk], int]:
    hunks = []
    while i < len(lines) and (m := _HUNK_RE.match(lines[i])):
        hunk, i = _read_hunk(lines, i + 1, m)
        hunks.append(hunk)
    return hunks, i


def _mode(text: str) -> int:
    try:
        return int(text, 8)
    except ValueError:
        raise DiffError(f"malformed diff: {text!r} is not a git file mode") from None


def _read_git(lines: list[str], i: int) -> tuple[FilePatch, int]:
    """One ``diff --git`` patch starting at ``lines[i]``."""
    start = i
    old_p: str | None
    new_p: str | None
    old_p, new_p = _git_names(lines[i])
    old_mode = new_mode = None
    binary, carried = False, True
    hunks: list[Hunk] = []
    i += 1
    while i < len(lines) and not lines[i].startswith(("diff --git ", "--- ", "@@ ")):
        ext = lines[i].removesuffix("\n")
        word = ext.split(" ", 1)[0]
        value = ext.rsplit(" ", 1)[-1]
        if ext.startswith("new file mode "):
            old_p, new_mode = None, _mode(value)
        elif ext.startswith("deleted file mode "):
            new_p, old_mode = None, _mode(value)
        elif ext.startswith("old mode "):
            old_mode = _mode(value)
        elif ext.startswith("new mode "):
            new_mode = _mode(value)
        elif ext.startswith(("rename from ", "copy from ")):
            old_p = unquote_path(ext.split(" ", 2)[2])
        elif ext.startswith(("rename to ", "copy to ")):
            new_p = unquote_path(ext.split(" ", 2)[2])
        elif ext.startswith("Binary files "):
            binary, carried = True, False
        elif ext == "GIT binary patch":
            binary = True
            i += 1
            for _ in range(2):  # the forward block, and the reverse one if written
                if i < len(lines) and lines[i].startswith(("literal ", "delta ")):
                    while i < len(lines) and lines[i] != "\n":
                        i += 1
                    i += 1  # the empty line that ends a block
            break
        elif word not in ("index", "similarity", "dissimilarity"):
            break  # not a header line: the patch ends here (trailing text)
        i += 1
    if not binary and i + 1 < len(lines) and lines[i].startswith("--- ") \
            and lines[i + 1].startswith("+++ "):
        old_p, new_p = _header_path(lines[i][4:]), _header_path(lines[i + 1][4:])
        hunks, i = _read_hunks(lines, i + 2)
    return FilePatch(old_p, new_p, tuple(hunks), binary, carried, old_mode, new_mode,
                     "".join(lines[start:i])), i


def parse_diff(text: str) -> tuple[FilePatch, ...]:
    """The per-path patches of a unified diff (git's, or plain ``diff -u``). Lines before and
    between patches that are neither (a commit message) are skipped. Raises ``DiffError`` on a
    malformed hunk or quoted path.

    >>> d = unified_diff("pkg/m.py", "def f(x):\\n    return x + 2\\n", "def f(x):\\n    return x + 1\\n")
    >>> [(p.path, p.removed_lines, p.added_lines) for p in parse_diff(d)]
    [('pkg/m.py', ('    return x + 2',), ('    return x + 1',))]
    """
    lines = split_lines(text)
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("diff --git "):
            fp, i = _read_git(lines, i)
            patches.append(fp)
        elif ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            start = i
            old, new = _header_path(ln[4:]), _header_path(lines[i + 1][4:])
            hunks, i = _read_hunks(lines, i + 2)
            patches.append(FilePatch(old, new, tuple(hunks), text="".join(lines[start:i])))
        else:
            i += 1
    return tuple(patches)


def touched_paths(text: str) -> tuple[str, ...]:
    """Every path a diff creates, edits, deletes or renames (both names of a rename), once each."""
    return tuple(dict.fromkeys(p for fp in parse_diff(text) for p in fp.paths))


def changed_files(text: str) -> tuple[str, ...]:
    """The path of each patch (the new one; the old one for a deletion), in diff order, once
    each: the files a user keeps or reverts.

    >>> changed_files(unified_diff("x.py", "a\\n", "b\\n") + unified_diff("y", "a\\n", None))
    ('x.py', 'y')
    """
    return tuple(dict.fromkeys(fp.path for fp in parse_diff(text)))


def lines_changed(text: str) -> int:
    """Added plus removed lines of a diff (a modified line counts twice, as in ``git diff --stat``)."""
    return sum(len(fp.added_lines) + len(fp.removed_lines) for fp in parse_diff(text))


# ----------------------------------------------------------------------------- applying


def _find(lines: list[str], needle: tuple[str, ...], hint: int, lo: int) -> int | None:
    """Where ``needle`` occurs in ``lines`` at or after ``lo``, nearest ``hint`` first."""
    n = len(needle)
    for delta in range(len(lines) + 1):
        for pos in (hint - delta, hint + delta) if delta else (hint,):
            if lo <= pos <= len(lines) - n and tuple(lines[pos:pos + n]) == needle:
                return pos
        if hint - delta < lo and hint + delta > len(lines) - n:
            break
    return None


def apply_patch(original: str, patch: FilePatch) -> str:
    """Apply one text patch to ``original`` as ``git apply`` does: context and removed lines must
    match exactly (final newline included); a hunk may have moved (an offset, searched outward
    from its line number). Raises ``DiffError`` when a hunk does not match or the patch is
    binary.

    >>> d = unified_diff("m.py", "a\\nb\\n", "a\\nc")
    >>> apply_patch("a\\nb\\n", parse_diff(d)[0])
    'a\\nc'
    """
    if patch.binary:
        raise DiffError(f"cannot apply a binary patch to {patch.path} as text")
    lines = split_lines(original)
    out: list[str] = []
    cursor = 0
    for h in patch.hunks:
        old = h.old_lines
        hint = h.old_start - 1 if h.old_len else h.old_start
        pos = _find(lines, old, max(hint, cursor), cursor)
        if pos is None:
            raise DiffError(f"patch does not apply to {patch.path}: the hunk at line "
                            f"{h.old_start} does not match the file")
        out += lines[cursor:pos]
        out += h.new_lines
        cursor = pos + len(old)
    return "".join(out + lines[cursor:])
