"""Hybrid code index: embedding vectors in an HNSW graph (hnswlib) fused with BM25.

Two layers, so many sandboxes forked from one repository snapshot share the expensive part:

- ``Store``: chunks + vectors + BM25 for a set of files, incremental by file hash (an edited file
  is re-chunked and re-embedded alone; a removed file's vectors are ``mark_deleted``), persisted to
  a directory. ``open_base`` keeps one Store per snapshot, keyed by a content hash of the files
  and the embedding model, on disk under ``$LOOPRL_HOME/search/`` and in memory per process.
- ``CodeIndex``: a view for one sandbox = the shared base + a small private overlay holding only
  the files the agent changed; base chunks of changed or deleted files are hidden.

    base = open_base(read_tree(repo_dir), embedder)        # built once, reused by every rollout
    idx = CodeIndex(base, embedder)
    idx.sync(workspace_files)                                # {path: bytes}; re-embeds edits only
    hits = idx.search("parse the header line", k=10, path_glob="src/**")
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import hnswlib
import numpy as np

from looprl import paths
from looprl.config import check_choice
from looprl.search.bm25 import BM25, Stats, term_counts, terms, top_n
from looprl.search.chunk import (
    CHUNKER_VERSION,
    Chunk,
    chunk_file,
    decode_text,
    is_indexable,
    path_matches,
)
from looprl.search.embed import Embedder

_xxhash: ModuleType | None
try:
    import xxhash as _xxhash  # installed with `datasets`
except ImportError:  # pragma: no cover - the fallback is only slower
    _xxhash = None

CHUNK_WORKERS = 2
"""Processes that chunk files during a build (0 = in this process). On this 2-core machine
chunking (~1/3 of a build's CPU) then overlaps embedding instead of preceding it."""
PARALLEL_MIN_FILES = 64  # below this (an edit, a small repo) forking costs more than it saves
CHUNK_BATCH_FILES = 48  # files per batch: small enough to start embedding early
HNSW_M = 16  # graph degree: the hnswlib default, good for 256-d vectors
HNSW_EF_CONSTRUCTION = 48
"""Build breadth. On 40k code chunks: 100 -> 99.5% of the exact top 10 found (at query ef 200),
9 s CPU; 40 -> 97.7%, 3.3 s. Fused with BM25 over 100 candidates the difference is noise."""
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "build", "dist"})


@dataclass(frozen=True)
class SearchConfig:
    """How retrieval and fusion work."""

    fusion: str = "zscore"
    """One of ``FUSIONS``: 'zscore' (scores shifted to their list's minimum and divided by its
    standard deviation, then summed), 'score' (min-max normalised sum), 'rrf' (reciprocal rank),
    'dense', 'bm25'. Chosen on ``evaluate.TUNE_PACKAGES`` (see ``bm25_weight``): recall@10 / MRR
    0.740 / 0.464 for 'zscore', 0.727 / 0.455 for 'score', 0.687 / 0.417 for 'rrf'."""
    rrf_k: float = 60.0
    """RRF damping: larger flattens the rank curve."""
    dense_weight: float = 1.0
    """Weight of the embedding ranking in the fusion."""
    bm25_weight: float = 1.5
    """Weight of the BM25 ranking in the fusion. Tuned on networkx + pygments
    (``evaluate.TUNE_PACKAGES``: never trained on, disjoint from the benchmark's quality
    packages), 300 queries: recall@10 of 'zscore' 0.673 / 0.713 / 0.740 / 0.723 / 0.707 at
    0.7 / 1.0 / 1.5 / 2.0 / 3.0 ('score': 0.637 / 0.693 / 0.713 / 0.723 / 0.727 / 0.720 / 0.700 at
    0.5 / 0.85 / 1.0 / 1.2 / 1.5 / 2.0 / 3.0; sympy agrees: best at 1.0-1.5).
    ``benchmarks/search.py --tune`` reruns the sweep."""
    candidates: int = 100
    """Hits taken from each retriever before fusing."""
    ef: int = 200
    """HNSW search breadth (recall vs speed)."""
    strip_docstrings: bool = False
    """Index code without docstrings (the benchmark does, since it queries with them)."""

    def __post_init__(self) -> None:
        check_choice("fusion", self.fusion, FUSIONS)


@dataclass(frozen=True)
class Hit:
    """One search result."""

    path: str
    start_line: int
    end_line: int
    kind: str
    name: str
    score: float
    text: str


@dataclass(frozen=True)
class SyncStats:
    """What a sync changed."""

    files_embedded: int
    chunks_embedded: int
    files_removed: int


def file_hash(data: bytes) -> str:
    """Content hash of a file (xxh3-128 when available: ~10x faster than blake2b)."""
    if _xxhash is not None:
        return _xxhash.xxh3_128_hexdigest(data)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def skip_path(path: str) -> bool:
    """Hidden and cache directories are never indexed (mirrors the sandbox walk)."""
    parts = path.split("/")
    return any(p.startswith(".") or p in SKIP_DIRS for p in parts[:-1]) or parts[-1].startswith(".")


def read_tree(root: str | Path) -> dict[str, bytes]:
    """Indexable files below ``root`` as {relative path: bytes}."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
        for f in filenames:
            p = Path(dirpath) / f
            rel = p.relative_to(root).as_posix()
            if not skip_path(rel) and p.is_file() and is_indexable(rel, p.stat().st_size):
                out[rel] = p.read_bytes()
    return dict(sorted(out.items()))


class Store:
    """Chunks of a set of files with their vectors (HNSW) and BM25 postings; incremental by hash."""

    def __init__(self, dim: int, model_id: str, strip_docstrings: bool = False) -> None:
        self.dim, self.model_id, self.strip = dim, model_id, strip_docstrings
        self.files: dict[str, str] = {}  # path -> hash
        self.file_ids: dict[str, list[int]] = {}
        self.chunks: dict[int, Chunk] = {}
        self.vecs_N_D = np.zeros((0, dim), dtype=np.float32)  # row = chunk id (deleted rows kept)
        self.bm25 = BM25()
        self.next_id = 0
        self.hnsw = self._new_hnsw(1024)
        self.lock = threading.Lock()
        self.timings: dict[str, float] = {}  # build seconds per stage, summed over syncs
        self.workers = CHUNK_WORKERS

    def _new_hnsw(self, capacity: int) -> hnswlib.Index:
        h = hnswlib.Index(space="ip", dim=self.dim)
        h.init_index(max_elements=capacity, ef_construction=HNSW_EF_CONSTRUCTION, M=HNSW_M,
                     random_seed=7)
        return h

    def __len__(self) -> int:
        return len(self.chunks)

    def add_files(self, texts: dict[str, tuple[str, str]], embedder: Embedder) -> int:
        """Add files given as {path: (hash, text)}; returns the number of chunks embedded.

        Files go in batches: chunking and BM25 term counting (pure Python) run in ``workers``
        forked processes while this one embeds and inserts the previous batches, in path order,
        so ids and results do not depend on ``workers``. Seconds this process spent per stage
        accumulate in ``self.timings``: 'chunk' is the wait for chunks (all of chunking when
        ``workers`` is 0), then embed, hnsw, bm25."""
        items = sorted(texts.items())
        for path, _ in items:
            self.remove_file(path)
        n = 0
        t = time.perf_counter()
        for batch in _chunk_batches(items, self.strip, self.workers):
            t = self._tick("chunk", t)
            n += self._insert(batch, embedder)
            t = time.perf_counter()
        return n

    def _insert(self, batch: list[Chunked], embedder: Embedder) -> int:
        t0 = time.perf_counter()
        new = [c for f in batch for c in f.chunks]
        if new:
            vecs = embedder.embed_code([embed_text(c) for c in new])
        t1 = self._tick("embed", t0)
        ids = np.arange(self.next_id, self.next_id + len(new))
        self.next_id += len(new)
        if new:
            self.vecs_N_D = np.concatenate([self.vecs_N_D, vecs])
            if self.hnsw.get_max_elements() < self.next_id:
                self.hnsw.resize_index(max(self.next_id * 2, 1024))
            self.hnsw.add_items(vecs, ids, num_threads=1)  # one thread: the same graph every build
        t2 = self._tick("hnsw", t1)
        it = iter(ids.tolist())
        for f in batch:
            self.files[f.path] = f.hash
            own = self.file_ids[f.path] = []
            for c, counts in zip(f.chunks, f.counts, strict=True):
                i = next(it)
                self.chunks[i] = c
                own.append(i)
                self.bm25.add(i, counts)
        self._tick("bm25", t2)
        return len(new)

    def _tick(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - since
        return now

    def remove_file(self, path: str) -> bool:
        if path not in self.files:
            return False
        for i in self.file_ids.pop(path):
            self.hnsw.mark_deleted(i)
            self.bm25.remove(i)
            del self.chunks[i]
        del self.files[path]
        return True

    def sync(self, files: dict[str, bytes], embedder: Embedder,
             hashes: dict[str, str] | None = None) -> SyncStats:
        """Make this store match ``files``: re-embed new/changed files, drop missing ones."""
        changed = _changed(files, self.files, hashes or {})
        removed = [p for p in self.files if p not in files]
        for p in removed:
            self.remove_file(p)
        n = self.add_files(changed, embedder)
        return SyncStats(len(changed), n, len(removed))

    def dense(self, q_D: np.ndarray, n: int, allow: Callable[[int], bool] | None,
              ef: int) -> dict[int, float]:
        if not self.chunks:
            return {}
        k = min(n, len(self.chunks))
        self.hnsw.set_ef(max(ef, k))
        try:
            labels, dist = self.hnsw.knn_query(q_D[None, :], k=k, num_threads=1, filter=allow)
        except RuntimeError:  # fewer than k allowed items reachable: exact search instead
            ids = [i for i in self.chunks if allow is None or allow(i)]
            sims = self.vecs_N_D[ids] @ q_D
            top = np.argsort(-sims, kind="stable")[:k]
            return {ids[t]: float(sims[t]) for t in top}
        return {int(i): float(1.0 - d) for i, d in zip(labels[0], dist[0], strict=True)}

    def save(self, out: Path) -> None:
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        ids = sorted(self.chunks)
        meta = {"model_id": self.model_id, "dim": self.dim, "strip": self.strip,
                "chunker": CHUNKER_VERSION, "files": self.files, "next_id": self.next_id,
                "chunks": [[i, asdict(self.chunks[i])] for i in ids]}
        (tmp / "meta.json").write_text(json.dumps(meta))
        np.save(tmp / "vectors.npy", self.vecs_N_D)
        self.hnsw.save_index(str(tmp / "hnsw.bin"))
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)

    @classmethod
    def load(cls, src: Path) -> Store:
        meta = json.loads((src / "meta.json").read_text())
        s = cls(meta["dim"], meta["model_id"], meta["strip"])
        s.files, s.next_id = meta["files"], meta["next_id"]
        s.vecs_N_D = np.load(src / "vectors.npy")
        s.hnsw = hnswlib.Index(space="ip", dim=s.dim)
        s.hnsw.load_index(str(src / "hnsw.bin"), max_elements=max(s.next_id, 1024))
        s.file_ids = {p: [] for p in s.files}
        for i, c in meta["chunks"]:
            chunk = Chunk(**c)
            s.chunks[i] = chunk
            s.file_ids[chunk.path].append(i)
            s.bm25.add(i, term_counts(chunk.name + " " + chunk.text))
        return s


@dataclass(frozen=True)
class Chunked:
    """One file's chunks with their BM25 term counts (what a chunking worker returns)."""

    path: str
    hash: str
    chunks: list[Chunk]
    counts: list[dict[str, int]]


def chunk_for_index(path: str, h: str, text: str, strip: bool) -> Chunked:
    chunks = chunk_file(path, text, strip_docstrings=strip)
    return Chunked(path, h, chunks, [term_counts(c.name + " " + c.text) for c in chunks])


def _chunk_batch(items: list[tuple[str, tuple[str, str]]], strip: bool) -> list[Chunked]:
    return [chunk_for_index(p, h, text, strip) for p, (h, text) in items]


def _chunk_batches(items: list[tuple[str, tuple[str, str]]], strip: bool,
                   workers: int) -> Iterator[list[Chunked]]:
    """Chunked files in order, in batches; in ``workers`` forked processes for big inputs."""
    if workers <= 0 or len(items) < PARALLEL_MIN_FILES or multiprocessing.current_process().daemon:
        # (a daemonic process, e.g. a multiprocessing pool worker, may not start children)
        for s in range(0, len(items), CHUNK_BATCH_FILES):
            yield _chunk_batch(items[s:s + CHUNK_BATCH_FILES], strip)
        return
    # fork: instant, no re-import of torch; the children run only ast/re code and return pickles
    ctx = multiprocessing.get_context("fork")
    batches = [items[s:s + CHUNK_BATCH_FILES] for s in range(0, len(items), CHUNK_BATCH_FILES)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        yield from pool.map(_chunk_batch, batches, [strip] * len(batches))


def embed_text(c: Chunk) -> str:
    """What the encoder sees for a chunk: its qualified name, then its code."""
    return f"{c.name}\n{c.text}" if c.kind in ("function", "method", "class") else c.text


def _changed(files: dict[str, bytes], known: dict[str, str],
             hashes: dict[str, str]) -> dict[str, tuple[str, str]]:
    out = {}
    for p, data in files.items():
        h = hashes.get(p) or file_hash(data)
        if known.get(p) != h:
            text = decode_text(data)
            out[p] = (h, text if text is not None else "")
    return out


# --- one shared base per snapshot -----------------------------------------------------------------

_BASES: dict[str, Store] = {}
_BASES_LOCK = threading.Lock()


def snapshot_key(files: dict[str, bytes], model_id: str, strip_docstrings: bool = False) -> str:
    h = hashlib.sha256(f"{model_id}|{CHUNKER_VERSION}|{strip_docstrings}\n".encode())
    for p in sorted(files):
        h.update(f"{p}\0{file_hash(files[p])}\n".encode())
    return h.hexdigest()[:24]


def open_base(files: dict[str, bytes], embedder: Embedder, *, strip_docstrings: bool = False,
              cache_dir: Path | None = None) -> Store:
    """The base Store of a snapshot: from memory, else disk, else built (and saved) once."""
    files = {p: d for p, d in files.items() if not skip_path(p) and is_indexable(p, len(d))}
    key = snapshot_key(files, embedder.model_id, strip_docstrings)
    where = (cache_dir or paths.sub("search")) / f"base-{key}"
    with _BASES_LOCK:
        if str(where) in _BASES:
            return _BASES[str(where)]
        if (where / "meta.json").exists():
            store = Store.load(where)
        else:
            store = Store(embedder.dim, embedder.model_id, strip_docstrings)
            store.sync(files, embedder)
            store.save(where)
        _BASES[str(where)] = store
        return store


# --- fusion ---------------------------------------------------------------------------------------

Ranked = dict[tuple[int, int], float]  # (part, chunk id) -> score


def _ranks(scores: Ranked) -> list[tuple[int, int]]:
    return sorted(scores, key=lambda k: -scores[k])


def fuse_rrf(dense: Ranked, lex: Ranked, cfg: SearchConfig) -> Ranked:
    out: Ranked = {}
    for w, part in ((cfg.dense_weight, dense), (cfg.bm25_weight, lex)):
        for r, key in enumerate(_ranks(part)):
            out[key] = out.get(key, 0.0) + w / (cfg.rrf_k + r + 1)
    return out


def fuse_score(dense: Ranked, lex: Ranked, cfg: SearchConfig) -> Ranked:
    out: Ranked = {}
    for w, part in ((cfg.dense_weight, dense), (cfg.bm25_weight, lex)):
        if not part:
            continue
        lo, hi = min(part.values()), max(part.values())
        for key, s in part.items():
            out[key] = out.get(key, 0.0) + w * ((s - lo) / (hi - lo) if hi > lo else 1.0)
    return out


def fuse_zscore(dense: Ranked, lex: Ranked, cfg: SearchConfig) -> Ranked:
    """Like 'score', but each list is scaled by its standard deviation instead of its range, so
    one outlier top score does not flatten the rest of its list."""
    out: Ranked = {}
    for w, part in ((cfg.dense_weight, dense), (cfg.bm25_weight, lex)):
        if not part:
            continue
        vals = np.fromiter(part.values(), dtype=np.float64, count=len(part))
        lo, sd = float(vals.min()), float(vals.std())
        for key, s in part.items():
            out[key] = out.get(key, 0.0) + w * ((s - lo) / sd if sd > 0 else 1.0)
    return out


FUSIONS: dict[str, Callable[[Ranked, Ranked, SearchConfig], Ranked]] = {
    "rrf": fuse_rrf,
    "score": fuse_score,
    "zscore": fuse_zscore,
    "dense": lambda dense, lex, cfg: dense,
    "bm25": lambda dense, lex, cfg: lex,
}


# --- a sandbox's view -----------------------------------------------------------------------------

class CodeIndex:
    """A shared base Store plus this sandbox's overlay of edited files."""

    def __init__(self, base: Store, embedder: Embedder, cfg: SearchConfig | None = None) -> None:
        if cfg is None:
            cfg = SearchConfig(strip_docstrings=base.strip)
        assert base.model_id == embedder.model_id, "base index was built with another model"
        self.base, self.embedder, self.cfg = base, embedder, cfg
        self.overlay = Store(embedder.dim, embedder.model_id, base.strip)
        self.hidden: set[str] = set()  # base files changed or deleted in this sandbox
        self._visible: Allow | None = None  # base chunk ids still visible (cache)
        self.lock = threading.Lock()

    def sync(self, files: dict[str, bytes]) -> SyncStats:
        """Match the workspace ``files`` ({path: bytes}); only files differing from both layers
        are chunked and embedded."""
        files = {p: d for p, d in files.items() if not skip_path(p) and is_indexable(p, len(d))}
        with self.lock:
            own: dict[str, bytes] = {}
            hashes = {p: file_hash(d) for p, d in files.items()}
            for p, data in files.items():
                if self.base.files.get(p) == hashes[p]:
                    self.overlay.remove_file(p)  # reverted to the base content
                else:
                    own[p] = data
            self.hidden = {p for p in self.base.files if p in own or p not in files}
            self._visible = None
            return self.overlay.sync(own, self.embedder, hashes)

    def search(self, query: str, k: int = 10,
               path_glob: str | Callable[[str], bool] | None = None) -> list[Hit]:
        """Top ``k`` chunks for ``query``; ``path_glob`` is a glob or a predicate on paths."""
        cfg = self.cfg
        with self.lock:
            q_D = self.embedder.embed_queries([query])[0]
            words = terms(query)
            parts = (self.base, self.overlay)
            allows = [self._allow(s, path_glob, hide=(s is self.base)) for s in parts]
            dense: Ranked = {}
            if cfg.fusion != "bm25":
                for n, (s, allow) in enumerate(zip(parts, allows, strict=True)):
                    pred = allow.contains if allow is not None else None
                    for i, sc in s.dense(q_D, cfg.candidates, pred, cfg.ef).items():
                        dense[(n, i)] = sc
            lex = self._lexical(words, allows, cfg.candidates) if cfg.fusion != "dense" else {}
            where = {}  # tie-break: path, then line
            for n, i in dense.keys() | lex.keys():
                c = parts[n].chunks[i]
                where[(n, i)] = (c.path, c.start_line)
            fused = FUSIONS[cfg.fusion](_top(dense, cfg.candidates, where),
                                        _top(lex, cfg.candidates, where), cfg)
            keys = _top(fused, k, where)
            return [_hit(parts[n].chunks[i], fused[(n, i)]) for n, i in keys]

    def _allow(self, store: Store, path_glob: str | Callable[[str], bool] | None,
               hide: bool) -> Allow | None:
        hidden = self.hidden if hide else set()
        if not hidden and not path_glob:
            return None
        if not path_glob and self._visible is not None:
            return self._visible  # cached until the next sync
        match = path_glob if callable(path_glob) else (lambda p: path_matches(p, path_glob))
        ok = [i for p, ids in store.file_ids.items() if p not in hidden and match(p) for i in ids]
        mask_N = np.zeros(store.next_id, dtype=bool)
        mask_N[ok] = True
        allow = Allow(set(ok).__contains__, mask_N)
        if not path_glob:
            self._visible = allow
        return allow

    def _lexical(self, words: list[str], allows: list[Allow | None], n: int) -> Ranked:
        b, o = self.base.bm25, self.overlay.bm25
        stats = Stats(len(b.doc_len) + len(o.doc_len),
                      (b.total_len + o.total_len) / max(1, len(b.doc_len) + len(o.doc_len)))
        df = {t: b.df(t) + o.df(t) for t in words}
        out: Ranked = {}
        for part, (bm, allow) in enumerate(zip((b, o), allows, strict=True)):
            ids, sc = bm.scores(words, stats, df)
            if allow is not None:
                keep = allow.mask_N[ids]
                ids, sc = ids[keep], sc[keep]
            for j in top_n(ids, sc, n).tolist():  # best n per part; ties by id
                out[(part, int(ids[j]))] = float(sc[j])
        return out


@dataclass(frozen=True)
class Allow:
    """Which chunk ids of a store a search may return: a predicate for the HNSW filter and the
    same set as a boolean mask over ids for vectorised BM25 filtering."""

    contains: Callable[[int], bool]
    mask_N: np.ndarray


def _top(scores: Ranked, n: int, where: dict[tuple[int, int], tuple[str, int]]) -> Ranked:
    """The ``n`` best of ``scores``, best first; equal scores (to 1e-9) ordered by path, line."""
    keys = sorted(scores, key=lambda key: (-round(scores[key], 9), where[key]))[:n]
    return {key: scores[key] for key in keys}


def _hit(c: Chunk, score: float) -> Hit:
    return Hit(c.path, c.start_line, c.end_line, c.kind, c.name, score, c.text)
