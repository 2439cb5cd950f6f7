"""``semantic_search``: find code by meaning, with the code-embedding index fused with BM25.

    semantic_search(query="where are HTTP headers parsed", k=5, path_glob="src/**")
    ->  1. src/pkg/http.py:10-25 function parse_headers
            10  def parse_headers(raw):
            ...

The tool receives a ``CodeIndex`` (``looprl.search.index``) as its ``search_index`` resource: the
repository snapshot's shared base plus an overlay private to this sandbox. Before every search it
lists and hashes the workspace files (``sandbox.walk`` + ``sandbox.read``), so files the agent
edited, created or deleted are re-indexed (only those) and stale hits never appear. Output holds
paths, line spans and snippets but no float scores, so it is byte-identical wherever the harness
runs (training and serving).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from looprl.errors import SandboxError, ToolError
from looprl.harness.tools.base import ToolContext, obj_schema
from looprl.harness.tools.glob_files import glob_regex
from looprl.search.chunk import is_indexable

if TYPE_CHECKING:  # the index loads numpy and the embedding model: only a search needs it
    from looprl.search.index import CodeIndex, Hit

READ_CONCURRENCY = 32


class SemanticSearch:
    name = "semantic_search"
    description = ("Search the codebase by meaning (e.g. 'where is the retry delay computed'). "
                   "Returns the best-matching functions, classes and file sections with their "
                   "path:start-end lines and a snippet. Use grep for exact strings.")
    parameters = obj_schema({
        "query": {"type": "string", "description": "what the code does, in words or identifiers"},
        "k": {"type": "integer", "minimum": 1, "description": "number of results (default 10, max 50)"},
        "path_glob": {"type": "string", "description": "only files matching this glob, e.g. 'src/**/*.py'"},
    }, ["query"])
    read_only = True

    def __init__(self, search_index: CodeIndex | None = None, snippet_lines: int = 12,
                 max_k: int = 50) -> None:
        self.index = search_index
        self.snippet_lines = snippet_lines
        self.max_k = max_k

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if self.index is None:
            raise ToolError("semantic_search has no index in this environment; use grep or glob")
        query = args["query"].strip()
        if not query:
            raise ToolError("query is empty; describe the code you are looking for")
        k = min(int(args.get("k", 10)), self.max_k)
        glob = (args.get("path_glob") or "").strip().removeprefix("./") or None
        files = await workspace_files(ctx)
        match = glob_regex(glob).match if glob else None
        index = self.index
        hits = await asyncio.to_thread(_sync_and_search, index, files, query, k, match)
        if not hits:
            where = f" in files matching {glob!r}" if glob else ""
            return f"No results for {query!r}{where}."
        return "\n".join(self._format(n, h) for n, h in enumerate(hits, 1))

    def _format(self, n: int, h: Hit) -> str:
        lines = h.text.splitlines()
        shown = lines[: self.snippet_lines]
        label = h.name if h.kind != "window" else "lines"
        out = [f"{n}. {h.path}:{h.start_line}-{h.end_line} {h.kind} {label}"]
        # docstring-stripped text has fewer lines than the span; number lines only when they match
        numbered = len(lines) == h.end_line - h.start_line + 1
        for i, line in enumerate(shown):
            prefix = f"{h.start_line + i:>6}  " if numbered else "        "
            out.append(prefix + line[:200])
        if len(lines) > len(shown):
            out.append(f"        [... {len(lines) - len(shown)} more lines]")
        return "\n".join(out)


def _sync_and_search(index: CodeIndex, files: dict[str, bytes], query: str, k: int,
                     match: Any) -> list[Hit]:
    index.sync(files)
    return index.search(query, k=k, path_glob=match)


async def workspace_files(ctx: ToolContext) -> dict[str, bytes]:
    """Every indexable workspace file's bytes (read with bounded concurrency)."""
    from looprl.search.index import skip_path

    try:
        entries = await ctx.sandbox.walk(".")
    except (OSError, ToolError) as e:
        raise SandboxError(f"semantic_search could not list the workspace: {e}") from e
    paths = [e.path for e in entries
             if e.kind == "file" and not skip_path(e.path) and is_indexable(e.path, e.size)]
    sem = asyncio.Semaphore(READ_CONCURRENCY)

    async def read(p: str) -> tuple[str, bytes | None]:
        async with sem:
            try:
                return p, await ctx.sandbox.read(p)
            except (OSError, ToolError):
                return p, None  # vanished between walk and read, or a link out: not indexed

    pairs = await asyncio.gather(*(read(p) for p in paths))
    return {p: d for p, d in pairs if d is not None}
