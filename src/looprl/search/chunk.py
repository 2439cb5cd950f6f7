"""Chunk source files by syntax for code search.

Python files are split with ``ast``: one chunk per top-level function, per method, per class header
(the class line, its docstring and attributes up to the first method) and per run of module-level
statements (imports, constants: the "module header"). Nested functions stay inside their parent.
Other text files fall back to fixed line windows. Every chunk carries its workspace-relative path
and a 1-based, inclusive line span, so a hit can be opened with any file viewer.

    >>> chunks = chunk_file("pkg/m.py", "import os\\n\\ndef f(x):\\n    '''Double x.'''\\n    return 2 * x\\n")
    >>> [(c.kind, c.name, c.start_line, c.end_line) for c in chunks]
    [('module', 'pkg/m.py', 1, 1), ('function', 'f', 3, 5)]
    >>> chunks[1].docstring
    'Double x.'
    >>> print(chunk_file("m.py", "def f(x):\\n    '''Double x.'''\\n    return 2 * x\\n", strip_docstrings=True)[0].text)
    def f(x):
        return 2 * x

``strip_docstrings`` removes docstring lines from chunk text (the search benchmark queries with
docstrings, so they must not be in the index); spans still cover the whole definition.
"""

from __future__ import annotations

import ast
import fnmatch
import gc
from dataclasses import dataclass
from typing import Literal

CHUNKER_VERSION = "1"
"""Bumped when chunking changes, so persisted indexes built by an older chunker are rebuilt."""

TEXT_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml",
                 ".json", ".js", ".ts", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java",
                 ".sh", ".html", ".css", ".sql")
MAX_FILE_BYTES = 512 * 1024  # larger files are usually generated data, not code worth searching
WINDOW_LINES = 40  # line-window size for non-Python files (and Python that does not parse)
MAX_MODULE_RUN = 60  # module-level statement runs longer than this are windowed

ChunkKind = Literal["module", "class", "function", "method", "window"]


@dataclass(frozen=True)
class Chunk:
    """One searchable span of a file. Lines are 1-based and inclusive."""

    path: str
    start_line: int
    end_line: int
    kind: ChunkKind
    name: str
    """Qualified name ('Class.method') for definitions; the path for module/window chunks."""
    text: str
    """Source of the span (docstring lines removed when chunked with ``strip_docstrings``)."""
    docstring: str | None = None
    """The definition's docstring, if any (kept even when stripped from ``text``)."""


def is_indexable(path: str, size: int) -> bool:
    """True for text-like files worth indexing (by suffix and size)."""
    return path.endswith(TEXT_SUFFIXES) and 0 < size <= MAX_FILE_BYTES


def decode_text(data: bytes) -> str | None:
    """The file as text, or None if it looks binary."""
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def path_matches(path: str, path_glob: str | None) -> bool:
    """Glob match on the workspace-relative path; ``**/`` also matches zero directories."""
    if not path_glob:
        return True
    if fnmatch.fnmatchcase(path, path_glob):
        return True
    return path_glob.startswith("**/") and fnmatch.fnmatchcase(path, path_glob[3:])


def chunk_file(path: str, text: str, *, strip_docstrings: bool = False) -> list[Chunk]:
    """Chunks of one file, ordered by start line."""
    if not text.strip():
        return []
    lines = text.splitlines()
    if path.endswith((".py", ".pyi")):
        try:
            tree = parse_python(text)
        except (SyntaxError, ValueError):
            return window_chunks(path, lines)
        return _python_chunks(path, lines, tree, strip_docstrings)
    return window_chunks(path, lines)


def parse_python(text: str) -> ast.Module:
    """``ast.parse`` with the cyclic GC paused: a parse allocates ~10^5 tracked nodes, and the
    collections they trigger scan everything else alive (an index under construction), which made
    parsing a 2,000-file repository ~1.7x slower. The nodes hold no cycles worth collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text)
    finally:
        if was_enabled:
            gc.enable()


def window_chunks(path: str, lines: list[str], size: int = WINDOW_LINES,
                  first_line: int = 1) -> list[Chunk]:
    """Fixed line windows over ``lines`` (which start at ``first_line``); blank windows dropped."""
    out = []
    for i in range(0, len(lines), size):
        part = lines[i:i + size]
        if any(line.strip() for line in part):
            start = first_line + i
            out.append(Chunk(path, start, start + len(part) - 1, "window", path, "\n".join(part)))
    return out


def _span(node: ast.stmt) -> tuple[int, int]:
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno] + [d.lineno for d in decorators])
    return start, node.end_lineno or node.lineno


def _docstring_span(node: ast.AST) -> tuple[int, int] | None:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].lineno, body[0].end_lineno or body[0].lineno
    return None


def _text(lines: list[str], start: int, end: int, drop: list[tuple[int, int]]) -> str:
    """Lines ``start..end`` (1-based, inclusive) without those inside the ``drop`` spans."""
    keep, i = [], start
    for a, b in sorted(drop):
        if b < i or a > end:
            continue
        keep.extend(lines[i - 1:a - 1])
        i = b + 1
    keep.extend(lines[i - 1:end])
    return "\n".join(keep)


def _definition(path: str, lines: list[str], node: ast.stmt, kind: ChunkKind, name: str,
                end: int | None, strip: bool) -> Chunk:
    start, node_end = _span(node)
    end = node_end if end is None else end
    doc = ast.get_docstring(node) if isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
    ds = _docstring_span(node)
    drop = [ds] if strip and ds is not None else []
    return Chunk(path, start, end, kind, name, _text(lines, start, end, drop), doc)


def _class_chunks(path: str, lines: list[str], node: ast.ClassDef, prefix: str,
                  strip: bool) -> list[Chunk]:
    qual = f"{prefix}{node.name}"
    inner = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                    ast.ClassDef))]
    header_end = (_span(inner[0])[0] - 1) if inner else None
    out = [_definition(path, lines, node, "class", qual, header_end, strip)]
    for child in inner:
        if isinstance(child, ast.ClassDef):
            out.extend(_class_chunks(path, lines, child, qual + ".", strip))
        else:
            out.append(_definition(path, lines, child, "method", f"{qual}.{child.name}", None, strip))
    return out


def _python_chunks(path: str, lines: list[str], tree: ast.Module, strip: bool) -> list[Chunk]:
    out: list[Chunk] = []
    run: list[ast.stmt] = []

    def flush() -> None:
        if not run:
            return
        start, end = _span(run[0])[0], _span(run[-1])[1]
        drop = []
        ds = _docstring_span(tree)
        if strip and ds is not None and start <= ds[0]:
            drop = [ds]
        text = _text(lines, start, end, drop)
        if end - start + 1 > MAX_MODULE_RUN:
            out.extend(window_chunks(path, lines[start - 1:end], first_line=start))
        elif text.strip():
            out.append(Chunk(path, start, end, "module", path, text,
                             ast.get_docstring(tree) if start == 1 else None))
        run.clear()

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            flush()
            out.append(_definition(path, lines, node, "function", node.name, None, strip))
        elif isinstance(node, ast.ClassDef):
            flush()
            out.extend(_class_chunks(path, lines, node, "", strip))
        else:
            run.append(node)
    flush()
    return sorted(out, key=lambda c: (c.start_line, c.end_line))
