import doctest

import looprl.search.bm25
import looprl.search.chunk
import looprl.search.embed
import looprl.search.pairs
from looprl.search.chunk import chunk_file, path_matches

SRC = '''"""Module doc."""
import os

X = 1


@decorator
def top(a):
    """Top doc."""
    def inner():
        return a
    return inner


class K(Base):
    """Class doc."""

    attr = 3

    def m(self):
        return 1

    class Inner:
        def deep(self):
            pass
'''


def test_python_chunks_have_syntax_spans():
    got = [(c.kind, c.name, c.start_line, c.end_line) for c in chunk_file("p/m.py", SRC)]
    assert got == [
        ("module", "p/m.py", 1, 4),
        ("function", "top", 7, 12),  # the decorator line belongs to the function
        ("class", "K", 15, 19),  # header: up to the first method
        ("method", "K.m", 20, 21),
        ("class", "K.Inner", 23, 23),
        ("method", "K.Inner.deep", 24, 25),
    ]
    lines = SRC.splitlines()
    for c in chunk_file("p/m.py", SRC):
        assert c.text == "\n".join(lines[c.start_line - 1:c.end_line])


def test_strip_docstrings_removes_only_docstring_lines():
    chunks = {c.name: c for c in chunk_file("m.py", SRC, strip_docstrings=True)}
    assert "Top doc" not in chunks["top"].text and "def inner" in chunks["top"].text
    assert chunks["top"].docstring == "Top doc."
    assert "Class doc" not in chunks["K"].text and "attr = 3" in chunks["K"].text
    assert "Module doc" not in chunks["m.py"].text
    assert (chunks["top"].start_line, chunks["top"].end_line) == (7, 12)


def test_non_python_and_broken_python_use_line_windows():
    text = "\n".join(f"line {i}" for i in range(1, 101))
    spans = [(c.kind, c.start_line, c.end_line) for c in chunk_file("notes.md", text)]
    assert spans == [("window", 1, 40), ("window", 41, 80), ("window", 81, 100)]
    broken = chunk_file("bad.py", "def f(:\n    pass\n")
    assert [(c.kind, c.start_line, c.end_line) for c in broken] == [("window", 1, 2)]
    assert chunk_file("empty.py", "\n\n") == []


def test_path_glob():
    assert path_matches("src/a/b.py", "src/**/*.py") and path_matches("b.py", "**/*.py")
    assert not path_matches("tests/b.py", "src/**")
    assert path_matches("x", None)


def test_doctests():
    for mod in (looprl.search.chunk, looprl.search.bm25, looprl.search.embed, looprl.search.pairs):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__


def test_span_text_matches_a_line_by_line_reference():
    import random

    from looprl.search.chunk import _text
    lines = [f"line {i}" for i in range(1, 31)]
    rng = random.Random(0)
    for _ in range(200):
        start = rng.randint(1, 30)
        end = rng.randint(start, 30)
        drop = [tuple(sorted((rng.randint(1, 30), rng.randint(1, 30))))
                for _ in range(rng.randint(0, 2))]
        drop = [d for n, d in enumerate(drop) if all(d[1] < e[0] or d[0] > e[1] for e in drop[:n])]
        want = "\n".join(lines[i - 1] for i in range(start, end + 1)
                         if not any(a <= i <= b for a, b in drop))
        assert _text(lines, start, end, drop) == want, (start, end, drop)


def test_parsing_leaves_the_garbage_collector_as_it_was():
    import gc

    from looprl.search.chunk import parse_python
    assert gc.isenabled()
    parse_python("x = 1\n")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_python("x = 1\n")
        assert not gc.isenabled()
    finally:
        gc.enable()
