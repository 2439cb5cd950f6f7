"""Mine (natural language, code) training pairs from installed Python packages.

Each function or method becomes a pair when it has something that says what it does:
- its docstring's first sentence  <->  the body with the docstring removed ("doc" pairs);
- a leading ``#`` comment above or at the top of the body  <->  the body ("comment" pairs);
- its split identifier name ("parse header line")  <->  the body with the name masked ("name"
  pairs), so the model also learns from the many undocumented functions.

Packages listed in ``HELDOUT_PACKAGES`` are never mined: the search benchmark evaluates on them.

    pairs = mine_pairs(site_packages_dir(), max_pairs=50_000)
"""

from __future__ import annotations

import random
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from looprl.search.chunk import chunk_file

HELDOUT_PACKAGES = ("rich", "click", "jinja2", "httpx", "werkzeug", "markdown", "yaml", "networkx",
                    "sympy", "pygments")
"""Benchmark packages: never used for training the embedder."""

MIN_QUERY_WORDS = 3  # "Return self." style docstrings say nothing
MAX_QUERY_CHARS = 240
MAX_FILE_BYTES = 400_000

PairKind = Literal["doc", "comment", "name"]


@dataclass(frozen=True)
class Pair:
    """One training example: a description and the code it describes."""

    query: str
    code: str
    package: str
    kind: PairKind


def site_packages_dir() -> Path:
    """The running interpreter's site-packages (the venv's, when run from it)."""
    return Path(sysconfig.get_paths()["purelib"])


def first_sentence(doc: str) -> str:
    """The first paragraph of a docstring, cut at its first sentence end.

    >>> first_sentence("Return the sum of a and b.\\n\\nMore text.")
    'Return the sum of a and b.'
    >>> first_sentence("Split a header\\nline into parts. Then more.")
    'Split a header line into parts.'
    """
    para = doc.strip().split("\n\n")[0]
    para = " ".join(line.strip() for line in para.splitlines())
    m = re.search(r"(?<=[.!?])\s", para)
    return (para[:m.start()] if m else para)[:MAX_QUERY_CHARS].strip()


def split_identifier(name: str) -> str:
    """Words of an identifier.

    >>> split_identifier("_parseHTTPHeader_line2")
    'parse http header line2'
    """
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", s)
    return " ".join(s.replace("_", " ").lower().split())


def _leading_comment(lines: list[str], start: int, code: str) -> str | None:
    above: list[str] = []
    i = start - 2  # 0-based line just above the definition
    while i >= 0 and lines[i].strip().startswith("#"):
        above.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    if not above:
        body = code.splitlines()[1:]
        for line in body:
            if line.strip().startswith("#"):
                above.append(line.strip().lstrip("#").strip())
            else:
                break
    text = " ".join(a for a in above if a)
    return text[:MAX_QUERY_CHARS] if text else None


def _useful(query: str) -> bool:
    words = re.findall(r"[A-Za-z]+", query)
    return len(words) >= MIN_QUERY_WORDS and not query.lower().startswith(("todo", "noqa", "type:"))


def pairs_from_source(package: str, path: str, text: str) -> Iterator[Pair]:
    """Pairs from one Python source file (nothing if it does not parse)."""
    lines = text.splitlines()
    for c in chunk_file(path, text, strip_docstrings=True):
        if c.kind not in ("function", "method") or c.end_line - c.start_line < 2:
            continue
        if c.docstring and _useful(q := first_sentence(c.docstring)):
            yield Pair(q, c.text, package, "doc")
            continue
        comment = _leading_comment(lines, c.start_line, c.text)
        if comment and _useful(comment):
            yield Pair(comment, c.text, package, "comment")
            continue
        short = c.name.rsplit(".", 1)[-1]
        words = split_identifier(short)
        if len(words.split()) >= 2 and not short.startswith("__"):
            masked = re.sub(rf"\b{re.escape(short)}\b", "f", c.text)
            yield Pair(words, masked, package, "name")


def package_files(root: Path, exclude: tuple[str, ...] = HELDOUT_PACKAGES) -> list[tuple[str, Path]]:
    """(package, file) for every ``.py`` file under ``root``, sorted, held-out packages excluded."""
    out: list[tuple[str, Path]] = []
    for top in sorted(root.iterdir()):
        name = top.name.split("-")[0]
        if name in exclude or name.endswith((".dist-info", ".egg-info")) or name.startswith("__"):
            continue
        files = sorted(top.rglob("*.py")) if top.is_dir() else ([top] if top.suffix == ".py" else [])
        out.extend((name.removesuffix(".py"), f) for f in files)
    return out


def mine_pairs(root: Path, *, max_pairs: int = 60_000, max_name_fraction: float = 0.25,
               seed: int = 0, exclude: tuple[str, ...] = HELDOUT_PACKAGES) -> list[Pair]:
    """Up to ``max_pairs`` de-duplicated pairs from files sampled across all packages under ``root``."""
    files = package_files(root, exclude)
    random.Random(seed).shuffle(files)
    seen_q: set[str] = set()
    seen_code: set[int] = set()
    named: list[Pair] = []
    out: list[Pair] = []
    for package, f in files:
        if len(out) >= max_pairs:
            break
        try:
            if f.stat().st_size > MAX_FILE_BYTES:
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for p in pairs_from_source(package, str(f.relative_to(root)), text):
            key_q, key_c = p.query.lower(), hash(p.code)
            if key_q in seen_q or key_c in seen_code:
                continue  # duplicate descriptions ("Initialize self") would be false negatives
            seen_q.add(key_q)
            seen_code.add(key_c)
            (named if p.kind == "name" else out).append(p)
    n_named = int(len(out) * max_name_fraction / (1 - max_name_fraction))
    out = out[:max_pairs] + named[:n_named]
    random.Random(seed + 1).shuffle(out)
    if not out:
        print(f"no training pairs found under {root}", file=sys.stderr)
    return out
