from pathlib import Path

from looprl.search.index import CodeIndex, SearchConfig, Store, open_base, read_tree

from .conftest import CountingEmbedder


def test_fused_search_finds_the_right_function(repo, tiny_embedder, tmp_path):
    base = open_base(read_tree(repo), tiny_embedder, cache_dir=tmp_path)
    idx = CodeIndex(base, tiny_embedder)
    top = idx.search("parse an http header line", k=3)
    assert (top[0].path, top[0].name, top[0].start_line, top[0].end_line) == \
        ("net/http.py", "parse_http_header", 5, 8)
    assert idx.search("factorial of n", k=1)[0].name == "compute_factorial"
    only_text = idx.search("header", k=10, path_glob="text/**")
    assert only_text and all(h.path.startswith("text/") for h in only_text)


def test_edit_reembeds_only_the_edited_file(repo, tiny_embedder, tmp_path):
    spy = CountingEmbedder(tiny_embedder)
    files = read_tree(repo)
    base = open_base(files, spy, cache_dir=tmp_path)
    n_base = len(spy.code_texts)
    assert n_base == len(base) > 5
    assert open_base(dict(files), spy, cache_dir=tmp_path) is base  # shared, not rebuilt
    idx = CodeIndex(base, spy)
    assert idx.sync(files).chunks_embedded == 0 and len(spy.code_texts) == n_base

    edited = dict(files)
    edited["text/words.py"] = files["text/words.py"] + (
        b"\n\ndef shout_greeting(name):\n    return name.upper() + '!'\n")
    stats = idx.sync(edited)
    new_texts = spy.code_texts[n_base:]
    assert stats.files_embedded == 1 and len(new_texts) == 3
    assert all("words" in t or "vowel" in t or "shout" in t for t in new_texts)
    assert any(h.name == "shout_greeting" for h in idx.search("shout greeting name", k=3))

    # a second sandbox over the same base does not see the first one's edit
    other = CodeIndex(base, spy)
    other.sync(files)
    assert all(h.name != "shout_greeting" for h in other.search("shout greeting name", k=10))

    del edited["net/http.py"]
    stats = idx.sync(edited)
    assert stats.chunks_embedded == 0
    assert all(h.path != "net/http.py" for h in idx.search("parse http header", k=20))
    idx.sync(files)  # back to the base content: overlay emptied, nothing re-embedded
    assert len(idx.overlay) == 0 and not idx.hidden
    assert idx.search("parse an http header line", k=1)[0].path == "net/http.py"


def test_store_persists_and_removes_deleted_files(repo, tiny_embedder, tmp_path):
    files = read_tree(repo)
    store = Store(tiny_embedder.dim, tiny_embedder.model_id)
    store.sync(files, tiny_embedder)
    store.save(tmp_path / "ix")
    loaded = Store.load(tmp_path / "ix")
    a = CodeIndex(store, tiny_embedder).search("reverse the words", k=5)
    b = CodeIndex(loaded, tiny_embedder).search("reverse the words", k=5)
    assert a == b

    del files["text/words.py"]
    stats = loaded.sync(files, tiny_embedder)
    assert stats.files_removed == 1 and stats.chunks_embedded == 0
    assert "text/words.py" not in loaded.files
    assert loaded.hnsw.get_current_count() > len(loaded)  # tombstones: marked deleted in HNSW
    hits = CodeIndex(loaded, tiny_embedder, SearchConfig(fusion="dense")).search("words", k=20)
    assert hits and all(h.path != "text/words.py" for h in hits)


def test_fusions_are_selectable(repo, tiny_embedder):
    store = Store(tiny_embedder.dim, tiny_embedder.model_id)
    store.sync(read_tree(repo), tiny_embedder)
    for fusion in ("rrf", "score", "zscore", "dense", "bm25"):
        hits = CodeIndex(store, tiny_embedder, SearchConfig(fusion=fusion)).search("vowels", k=2)
        assert len(hits) == (1 if fusion == "bm25" else 2)  # BM25 only returns word matches
    bm = CodeIndex(store, tiny_embedder, SearchConfig(fusion="bm25")).search("count vowels", k=1)
    assert bm[0].name == "count_vowels"


def test_read_tree_skips_hidden_and_cache_dirs(repo: Path):
    (repo / ".git").mkdir()
    (repo / ".git" / "x.py").write_text("x = 1\n")
    (repo / "net" / "__pycache__").mkdir()
    (repo / "net" / "__pycache__" / "y.py").write_text("y = 1\n")
    (repo / "logo.png").write_bytes(b"\x89PNG\x00")
    assert sorted(read_tree(repo)) == ["README.md", "mathx/fact.py", "net/http.py", "text/words.py"]


def test_evaluate_compares_retrievers_on_the_same_chunks(repo, tiny_embedder):
    from looprl.search.evaluate import evaluate, grep_rank

    res = evaluate(tiny_embedder, n_queries=20, files=read_tree(repo))
    assert res.n_queries == 6  # documented functions/methods with >= 3-word first sentences
    # 10 chunks: the dense ranking lists them all, while BM25 cannot match "Swap rows and
    # columns." to the docstring-free `def transpose(self): return Matrix()`
    assert res.n_chunks == 10 and res.recall10 == 1.0 and res.recall10_bm25 < 1.0
    store = Store(tiny_embedder.dim, tiny_embedder.model_id)
    store.sync(read_tree(repo), tiny_embedder)
    chunks = [store.chunks[i] for i in sorted(store.chunks)]
    assert grep_rank(chunks, "count vowels", 1)[0].name == "count_vowels"


def test_build_in_worker_processes_equals_the_inline_build(repo, tiny_embedder, monkeypatch):
    import numpy as np

    import looprl.search.index as index_mod
    files = read_tree(repo)
    inline = Store(tiny_embedder.dim, tiny_embedder.model_id, strip_docstrings=True)
    inline.workers = 0
    inline.sync(files, tiny_embedder)
    monkeypatch.setattr(index_mod, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(index_mod, "CHUNK_BATCH_FILES", 2)  # several batches, in order
    forked = Store(tiny_embedder.dim, tiny_embedder.model_id, strip_docstrings=True)
    forked.workers = 2
    forked.sync(files, tiny_embedder)
    assert forked.chunks == inline.chunks and forked.file_ids == inline.file_ids
    assert forked.files == inline.files and forked.bm25.postings == inline.bm25.postings
    np.testing.assert_array_equal(forked.vecs_N_D, inline.vecs_N_D)
    assert set(forked.timings) == {"chunk", "embed", "hnsw", "bm25"}
    q = "reverse the words"
    assert CodeIndex(forked, tiny_embedder).search(q) == CodeIndex(inline, tiny_embedder).search(q)


def test_zscore_fusion_ignores_each_lists_scale_and_offset():
    from looprl.search.index import fuse_zscore
    cfg = SearchConfig(bm25_weight=1.5)
    dense = {(0, 1): 0.9, (0, 2): 0.5, (0, 3): 0.4}
    lex = {(0, 3): 30.0, (0, 4): 8.0, (0, 1): 2.0}
    fused = fuse_zscore(dense, lex, cfg)
    shifted = fuse_zscore({k: 7 * v - 3 for k, v in dense.items()},
                          {k: 0.1 * v + 5 for k, v in lex.items()}, cfg)
    assert fused.keys() == shifted.keys() == {(0, 1), (0, 2), (0, 3), (0, 4)}
    for k in fused:
        assert abs(fused[k] - shifted[k]) < 1e-9
    assert fused[(0, 1)] > 0 and fused[(0, 4)] > 0  # a list's lowest score adds nothing
    assert max(fused, key=fused.get) == (0, 3)  # BM25's clear winner, weighted 1.5
