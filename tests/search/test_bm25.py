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
