"""Incremental BM25 over code chunks: an inverted index that takes adds and removes.

``rank_bm25`` rescoring every document per query term is too slow for a 20,000-chunk repository
at a 20 ms query budget and cannot remove documents; this keeps postings per term, caches them as
numpy arrays, and scores only the documents that contain a query term.

    bm = BM25()
    bm.add(0, terms("def parse_header(line): ..."))
    bm.top(terms("parse a header"), n=10)      # [(doc_id, score), ...] best first
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

STOPWORDS = frozenset(
    "a an the of to in on for and or is are be as by with from this that it its at if not no "
    "into than then else when which who whom what how all any can will should may must do does "
    "given given".split())


def terms(text: str) -> list[str]:
    """Lower-cased words with identifiers split, stopwords dropped, a plural 's' stripped.

    >>> terms("def parseHTTPHeaders(raw_line): return the Headers")
    ['def', 'parse', 'http', 'header', 'raw', 'line', 'return', 'header']
    """
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", s).lower()
    out = []
    for w in re.findall(r"[a-z][a-z0-9]*", s):
        if len(w) < 2 or w in STOPWORDS:
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


@dataclass(frozen=True)
class Stats:
    """Corpus statistics IDF and length normalisation use (may span several BM25 parts)."""

    n_docs: int
    avg_len: float


class BM25:
    """Okapi BM25 with add/remove by integer document id."""

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.postings: dict[str, dict[int, int]] = {}
        self.doc_terms: dict[int, Counter[str]] = {}
        self.doc_len: dict[int, int] = {}
        self.total_len = 0
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, doc_id: int, words: list[str]) -> None:
        assert doc_id not in self.doc_terms, f"document {doc_id} already indexed"
        counts = Counter(words)
        self.doc_terms[doc_id] = counts
        self.doc_len[doc_id] = len(words)
        self.total_len += len(words)
        for t, c in counts.items():
            self.postings.setdefault(t, {})[doc_id] = c
            self._arrays.pop(t, None)

    def remove(self, doc_id: int) -> None:
        counts = self.doc_terms.pop(doc_id, None)
        if counts is None:
            return
        self.total_len -= self.doc_len.pop(doc_id)
        for t in counts:
            p = self.postings[t]
            del p[doc_id]
            if not p:
                del self.postings[t]
            self._arrays.pop(t, None)

    def stats(self) -> Stats:
        n = len(self.doc_len)
        return Stats(n, self.total_len / n if n else 1.0)

    def df(self, term: str) -> int:
        return len(self.postings.get(term, ()))

    def _posting(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        arr = self._arrays.get(term)
        if arr is None:
            p = self.postings[term]
            ids = np.fromiter(p.keys(), dtype=np.int64, count=len(p))
            tf = np.fromiter(p.values(), dtype=np.float32, count=len(p))
            dl = np.fromiter((self.doc_len[i] for i in p), dtype=np.float32, count=len(p))
            arr = self._arrays[term] = (ids, np.stack([tf, dl]))
        return arr

    def scores(self, query: list[str], stats: Stats | None = None,
               df: dict[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(doc ids, scores) of every document containing a query term; ``stats``/``df`` override
        the corpus's own (when several parts share one ranking)."""
        st = stats or self.stats()
        ids_all, sc_all = [], []
        for t in dict.fromkeys(query):
            if t not in self.postings:
                continue
            d = (df or {}).get(t, self.df(t))
            idf = math.log(1.0 + (st.n_docs - d + 0.5) / (d + 0.5))
            ids, tf_dl = self._posting(t)
            tf, dl = tf_dl
            norm = tf + self.k1 * (1 - self.b + self.b * dl / st.avg_len)
            ids_all.append(ids)
            sc_all.append(idf * tf * (self.k1 + 1) / norm)
        if not ids_all:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ids = np.concatenate(ids_all)
        sc = np.concatenate(sc_all).astype(np.float64)
        uniq, inv = np.unique(ids, return_inverse=True)
        total = np.zeros(len(uniq), dtype=np.float64)
        np.add.at(total, inv, sc)
        return uniq, total

    def top(self, query: list[str], n: int) -> list[tuple[int, float]]:
        """The ``n`` best (doc id, score), best first, ties by id."""
        ids, sc = self.scores(query)
        order = np.lexsort((ids, -sc))[:n]
        return [(int(ids[i]), float(sc[i])) for i in order]
