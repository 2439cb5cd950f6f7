"""Semantic code search benchmark: recall against BM25 and grep, build / query / re-index speed.

    .venv/bin/python benchmarks/search.py [--model DIR] [--queries 400] [--build-files 2000]

Quality: on packages the embedder never trained on (``looprl.search.evaluate.EVAL_PACKAGES``),
query = a function's docstring first sentence, target = that function; docstrings are removed from
the index. Recall@10 of the fused index vs BM25 alone and grep on the query's words, in one run.
Speed: a fresh index over the first N files of held-out packages (networkx, sympy, pygments),
with its time split by stage (chunk = ast, embed = tokenize + encode, hnsw, bm25) and, as a
same-run baseline, the embed stage through the padded HF model forward that the 0-layer fast path
replaces (on 2,000 chunks, scaled); query latency p50 over 100 queries next to BM25-only;
the re-index time of one edited file in a sandbox view next to the full build.

Fusion weights (``SearchConfig.bm25_weight``) were tuned on networkx + pygments
(``evaluate.TUNE_PACKAGES``: held out from training and disjoint from the quality packages), never
on this benchmark's queries: ``--tune`` reruns that sweep. The last line is the machine-readable
summary.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from looprl.search.embed import load_embedder
from looprl.search.evaluate import evaluate, make_queries, package_tree, tune_bm25_weight
from looprl.search.index import CodeIndex, SearchConfig, Store, embed_text


def _cpu_s() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its finished child processes."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _embed_baseline(emb, store: Store, n: int = 2000) -> None:
    """Embed ``n`` chunks with the fast path and with the model forward it replaces."""
    if getattr(emb, "bag", None) is None:
        print("embed baseline: n/a (the model has layers: no fast path)")
        return
    texts = [embed_text(store.chunks[i]) for i in sorted(store.chunks)[:: max(1, len(store) // n)]]
    ids = emb.token_ids(texts, int(emb.meta["max_code_tokens"]))
    t0 = time.perf_counter()
    fast = emb.bag(ids)
    t1 = time.perf_counter()
    slow = emb.forward(ids)
    t2 = time.perf_counter()
    scale = len(store) / len(texts)
    print(f"embed baseline on {len(texts)} chunks (excl. tokenizing): bag-of-tokens {t1 - t0:.2f} s "
          f"vs HF forward {t2 - t1:.2f} s ({(t2 - t1) / (t1 - t0):.1f}x; ~{(t2 - t1) * scale:.0f} s "
          f"for the whole build); max |diff| {abs(fast - slow).max():.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="embedder dir (default: the trained one)")
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--build-files", type=int, default=2000)
    ap.add_argument("--fusion", default=SearchConfig().fusion)
    ap.add_argument("--tune", action="store_true",
                    help="only sweep bm25_weight on evaluate.TUNE_PACKAGES and print the table")
    args = ap.parse_args()
    emb = load_embedder(args.model)
    cfg = SearchConfig(fusion=args.fusion)
    if args.tune:
        for w, (rec, mrr) in tune_bm25_weight(emb, fusion=args.fusion).items():
            print(f"bm25_weight={w} recall10={rec:.3f} mrr={mrr:.3f}")
        return

    res = evaluate(emb, n_queries=args.queries, cfg=cfg)
    print(f"quality: {res.n_queries} queries over {res.n_chunks} chunks; recall@10 fused "
          f"{res.recall10:.3f} dense {res.recall10_dense:.3f} bm25 {res.recall10_bm25:.3f} "
          f"grep {res.recall10_grep:.3f}; mrr fused {res.mrr:.3f} bm25 {res.mrr_bm25:.3f}")

    tree = package_tree(("networkx", "sympy", "pygments"))
    files = {p: tree[p] for p in sorted(tree)[: args.build_files]}
    load0, cpu0 = os.getloadavg()[0], _cpu_s()
    t0 = time.perf_counter()
    store = Store(emb.dim, emb.model_id)
    store.sync(files, emb)
    build_s = time.perf_counter() - t0
    cpu = [b - a for a, b in zip(cpu0, _cpu_s(), strict=True)]
    print(f"build: load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"CPU {cpu[0]:.1f} s here + {cpu[1]:.1f} s in chunking workers")
    print(f"build: {len(files)} files ({sum(map(len, files.values())) / 1e6:.1f} MB), "
          f"{len(store)} chunks in {build_s:.1f} s; by stage (this process): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in store.timings.items())
          + f"; other {build_s - sum(store.timings.values()):.1f} s")
    _embed_baseline(emb, store)

    idx = CodeIndex(store, emb, cfg)
    qs = [q.query for q in make_queries(files, 100, seed=1)]
    lat, cpu_ms = [], []
    for q in qs:
        t, c = time.perf_counter(), time.process_time()
        idx.search(q, k=10)
        lat.append((time.perf_counter() - t) * 1000)
        cpu_ms.append((time.process_time() - c) * 1000)
    bm = CodeIndex(store, emb, SearchConfig(fusion="bm25"))
    lat_bm = []
    for q in qs:
        t = time.perf_counter()
        bm.search(q, k=10)
        lat_bm.append((time.perf_counter() - t) * 1000)
    p50, p50_bm = statistics.median(lat), statistics.median(lat_bm)
    print(f"query: p50 {p50:.1f} ms fused vs {p50_bm:.1f} ms bm25-only ({p50 / p50_bm:.1f}x); "
          f"fused CPU p50 {statistics.median(cpu_ms):.1f} ms (wall - CPU = waiting for a core)")

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
