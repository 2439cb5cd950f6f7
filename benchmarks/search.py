"""Semantic code search benchmark: recall against BM25 and grep, build / query / re-index speed.

    .venv/bin/python benchmarks/search.py [--model DIR] [--queries 400] [--build-files 2000]

Quality: on packages the embedder never trained on (``looprl.search.evaluate.EVAL_PACKAGES``),
query = a function's docstring first sentence, target = that function; docstrings are removed from
the index. Recall@10 of the fused index vs BM25 alone and grep on the query's words, in one run.
Speed: a fresh index over the first N files of held-out packages (networkx, sympy, pygments),
query latency p50 over 100 queries, and the re-index time of one edited file in a sandbox view.
The last line is the machine-readable summary.
"""

from __future__ import annotations

import argparse
import statistics
import time

from looprl.search.embed import load_embedder
from looprl.search.evaluate import evaluate, make_queries, package_tree
from looprl.search.index import CodeIndex, SearchConfig, Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="embedder dir (default: the trained one)")
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--build-files", type=int, default=2000)
    ap.add_argument("--fusion", default="score")
    args = ap.parse_args()
    emb = load_embedder(args.model)
    cfg = SearchConfig(fusion=args.fusion)

    res = evaluate(emb, n_queries=args.queries, cfg=cfg)
    print(f"quality: {res.n_queries} queries over {res.n_chunks} chunks; recall@10 fused "
          f"{res.recall10:.3f} dense {res.recall10_dense:.3f} bm25 {res.recall10_bm25:.3f} "
          f"grep {res.recall10_grep:.3f}; mrr fused {res.mrr:.3f} bm25 {res.mrr_bm25:.3f}")

    tree = package_tree(("networkx", "sympy", "pygments"))
    files = {p: tree[p] for p in sorted(tree)[: args.build_files]}
    t0 = time.perf_counter()
    store = Store(emb.dim, emb.model_id)
    store.sync(files, emb)
    build_s = time.perf_counter() - t0
    print(f"build: {len(files)} files ({sum(map(len, files.values())) / 1e6:.1f} MB), "
          f"{len(store)} chunks in {build_s:.1f} s")

    idx = CodeIndex(store, emb, cfg)
    qs = [q.query for q in make_queries(files, 100, seed=1)]
    lat = []
    for q in qs:
        t = time.perf_counter()
        idx.search(q, k=10)
        lat.append((time.perf_counter() - t) * 1000)
    bm = CodeIndex(store, emb, SearchConfig(fusion="bm25"))
    lat_bm = []
    for q in qs:
        t = time.perf_counter()
        bm.search(q, k=10)
        lat_bm.append((time.perf_counter() - t) * 1000)
    p50, p50_bm = statistics.median(lat), statistics.median(lat_bm)
    print(f"query: p50 {p50:.1f} ms fused vs {p50_bm:.1f} ms bm25-only ({p50 / p50_bm:.1f}x)")

    reindex = []
    for n, path in enumerate([p for p in sorted(files) if p.endswith(".py")][:5]):
        edited = dict(files)
        edited[path] = files[path] + f"\n\ndef added_{n}(x):\n    return x + {n}\n".encode()
        t = time.perf_counter()
        st = idx.sync(edited)
        reindex.append((time.perf_counter() - t) * 1000)
        assert st.files_embedded == 1, st
    reindex_ms = statistics.median(reindex)
    print(f"reindex: one edited file, median of 5: {reindex_ms:.0f} ms "
          f"(full build {build_s * 1000 / reindex_ms:.0f}x longer)")
    print(f"recall10={res.recall10:.3f} recall10_bm25={res.recall10_bm25:.3f} "
          f"recall10_grep={res.recall10_grep:.3f} mrr={res.mrr:.3f} build_s={build_s:.1f} "
          f"query_p50_ms={p50:.1f} reindex_ms={reindex_ms:.0f}")


if __name__ == "__main__":
    main()
