"""looprl.search: semantic code search on a code-embedding model looprl trains itself.

    emb = load_embedder()                                   # after `looprl embed train`
    index = CodeIndex(open_base(read_tree(repo_dir), emb), emb)
    index.sync(workspace_files); index.search("where is the retry delay computed", k=10)

``chunk`` (syntax-aware chunks) -> ``embed`` (the bi-encoder; ``pairs`` mines its training data)
-> ``index`` (HNSW + BM25 fused, incremental, one shared base per snapshot + per-sandbox overlay)
-> ``evaluate`` (recall against BM25 and grep on held-out packages). The harness tool is
``looprl.harness.tools.semantic_search``.
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "chunk": ["Chunk", "chunk_file"],
    "embed": ["EmbedTrainConfig", "Embedder", "load_embedder", "train"],
    "index": ["CodeIndex", "Hit", "SearchConfig", "Store", "open_base", "read_tree"],
})
