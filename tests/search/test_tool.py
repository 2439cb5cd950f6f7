import asyncio

import pytest

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext
from looprl.harness.tools.semantic_search import SemanticSearch
from looprl.protocols import Tool
from looprl.search.index import CodeIndex, open_base, read_tree

from .conftest import CountingEmbedder, DirSandbox


def _tool(repo, embedder, cache):
    return SemanticSearch(search_index=CodeIndex(open_base(read_tree(repo), embedder,
                                                           cache_dir=cache), embedder))


def test_output_is_deterministic_and_shows_spans(repo, tiny_embedder, tmp_path):
    tool = _tool(repo, tiny_embedder, tmp_path / "c1")
    assert isinstance(tool, Tool) and tool.read_only
    ctx = ToolContext(DirSandbox(repo, tmp_path))
    out = asyncio.run(tool.run({"query": "parse http header", "k": 3}, ctx))
    assert out.splitlines()[0] == "1. net/http.py:5-8 function parse_http_header"
    assert "     5  def parse_http_header(line):" in out
    # a second, independently built index (fresh cache dir, as on a serving host) says the same
    again = asyncio.run(_tool(repo, tiny_embedder, tmp_path / "c2").run(
        {"query": "parse http header", "k": 3}, ctx))
    assert again == out


def test_tool_sees_workspace_edits(repo, tiny_embedder, tmp_path):
    spy = CountingEmbedder(tiny_embedder)
    tool = _tool(repo, spy, tmp_path / "c")
    sb = DirSandbox(repo, tmp_path)
    ctx = ToolContext(sb)
    n0 = len(spy.code_texts)
    asyncio.run(tool.run({"query": "vowels"}, ctx))
    assert len(spy.code_texts) == n0  # unchanged workspace: nothing re-embedded
    asyncio.run(sb.write("net/retry.py", b"def backoff_delay(attempt):\n"
                                         b"    return min(60, 2 ** attempt)\n"))
    out = asyncio.run(tool.run({"query": "backoff delay attempt", "k": 1}, ctx))
    assert out.startswith("1. net/retry.py:1-2 function backoff_delay")
    assert len(spy.code_texts) == n0 + 1
    out = asyncio.run(tool.run({"query": "backoff", "k": 5, "path_glob": "mathx/**"}, ctx))
    assert "net/" not in out


def test_bad_queries_are_tool_errors(repo, tiny_embedder, tmp_path):
    ctx = ToolContext(DirSandbox(repo, tmp_path))
    with pytest.raises(ToolError, match="empty"):
        asyncio.run(_tool(repo, tiny_embedder, tmp_path / "c").run({"query": "  "}, ctx))
    with pytest.raises(ToolError, match="grep"):
        asyncio.run(SemanticSearch().run({"query": "x"}, ctx))
