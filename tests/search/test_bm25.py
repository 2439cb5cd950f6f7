from collections import Counter

from looprl.search.bm25 import BM25, terms


def test_bm25_ranks_matching_docs_and_forgets_removed_ones():
    bm = BM25()
    bm.add(0, terms("def parse_header(line): return line.split(':')"))
    bm.add(1, terms("def compute_factorial(n): return n * compute_factorial(n - 1)"))
    bm.add(2, terms("def header_size(headers): return len(headers)"))
    top = bm.top(terms("parse the header"), n=10)
    assert [i for i, _ in top] == [0, 2]  # doc 1 shares no word
    assert top[0][1] > top[1][1] > 0
    bm.remove(0)
    assert [i for i, _ in bm.top(terms("parse the header"), n=10)] == [2]
    assert bm.stats().n_docs == 2 and "parse" not in bm.postings


def _reference_scores(docs: dict[int, list[str]], query: list[str], k1=1.2, b=0.75):
    """Okapi BM25 written out per document, the way a textbook states it."""
    import math
    n = len(docs)
    avg = sum(map(len, docs.values())) / n
    out = {}
    for i, words in docs.items():
        s = 0.0
        for t in dict.fromkeys(query):
            tf = words.count(t)
            if tf == 0:
                continue
            df = sum(t in w for w in docs.values())
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(words) / avg))
        if s > 0:
            out[i] = s
    return out


def test_vectorised_scores_match_a_reference_implementation():
    import random

    import numpy as np
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(40)]
    docs = {i: [rng.choice(vocab[: 5 + i % 30]) for _ in range(rng.randint(1, 30))]
            for i in range(0, 300, 2)}  # sparse ids, as after removals
    bm = BM25()
    for i, words in docs.items():
        bm.add(i, words if i % 4 else dict(Counter(words)))
    for i in list(docs)[::7]:  # remove some: stats, postings and cached arrays must follow
        bm.top(["w1", "w3"], 5)
        bm.remove(i)
        del docs[i]
    for _ in range(30):
        query = [rng.choice(vocab) for _ in range(rng.randint(1, 6))]
        ref = _reference_scores(docs, query)
        ids, sc = bm.scores(query)
        assert set(ids.tolist()) == ref.keys()
        np.testing.assert_allclose(sc, [ref[i] for i in ids.tolist()], rtol=1e-5)
        want = sorted(ref, key=lambda i: (-round(ref[i], 4), i))[:10]
        got = [i for i, _ in bm.top(query, 10)]
        assert [round(ref[i], 4) for i in got] == [round(ref[i], 4) for i in want]


def test_top_n_equals_a_full_sort_including_ties():
    import numpy as np

    from looprl.search.bm25 import top_n
    rng = np.random.default_rng(0)
    for n in (1, 3, 10):
        ids = rng.permutation(500)
        sc = rng.integers(0, 6, 500).astype(np.float64)  # many ties at every cut
        assert top_n(ids, sc, n).tolist() == np.lexsort((ids, -sc))[:n].tolist()
    assert top_n(np.zeros(0, np.int64), np.zeros(0), 5).tolist() == []


def test_term_counts_equals_counting_terms():
    from looprl.search.bm25 import term_counts
    text = ("class HTTPServerError(Exception):\n    def getHeaders(self, raw_lines, the_class):\n"
            "        return [parse(l) for l in raw_lines if l]  # headers of headers\n")
    assert term_counts(text) == Counter(terms(text))
    assert term_counts("") == {}
