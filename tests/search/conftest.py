"""Fixtures for search tests: a small repository and a tiny embedder trained for a few steps."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from looprl.search.embed import EmbedTrainConfig, load_embedder, train
from looprl.search.pairs import pairs_from_source

REPO = {
    "net/http.py": '''
        """HTTP helpers."""
        import re


        def parse_http_header(line):
            """Split one HTTP header line into its name and value."""
            name, _, value = line.partition(":")
            return name.strip().lower(), value.strip()


        def build_url(host, port, path):
            """Join a host, a port and a path into a URL."""
            return f"http://{host}:{port}/{path.lstrip('/')}"
        ''',
    "mathx/fact.py": '''
        def compute_factorial(n):
            """Multiply all integers from one up to n."""
            result = 1
            for i in range(2, n + 1):
                result *= i
            return result


        class Matrix:
            """A dense matrix of floats."""

            size = 2

            def transpose(self):
                """Swap rows and columns."""
                return Matrix()

            @staticmethod
            def identity(n):
                return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        ''',
    "text/words.py": '''
        def reverse_words(sentence):
            """Reverse the order of the words in a sentence."""
            return " ".join(reversed(sentence.split()))


        def count_vowels(text):
            """Count how many vowels a text contains."""
            return sum(ch in "aeiou" for ch in text.lower())
        ''',
    "README.md": "# Demo\n\nA demo repository for search tests.\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for rel, text in REPO.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def _stdlib_pairs():
    """Training pairs from a few standard-library modules (fast and always present)."""
    import argparse
    import difflib
    import json.decoder
    import shlex
    import textwrap as tw
    out = []
    for mod in (tw, shlex, difflib, argparse, json.decoder):
        src = Path(mod.__file__).read_text()
        out.extend(pairs_from_source("stdlib", mod.__name__ + ".py", src))
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embed") / "tiny"
    cfg = EmbedTrainConfig(out=str(out), vocab_size=600, hidden=32, layers=1, heads=2,
                           batch_size=32, steps=25, time_budget_s=60, max_code_tokens=64,
                           progress=False, threads=1)
    train(cfg, pairs=_stdlib_pairs())
    return out


@pytest.fixture(scope="session")
def tiny_embedder(tiny_model_dir: Path):
    return load_embedder(tiny_model_dir)


class CountingEmbedder:
    """Wraps a real embedder and records how many code texts it embedded (a spy, not a fake)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_id, self.dim = inner.model_id, inner.dim
        self.code_texts: list[str] = []

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)

    def embed_code(self, texts):
        self.code_texts.extend(texts)
        return self.inner.embed_code(texts)


class DirSandbox:
    """TEST DOUBLE of the Sandbox seam (walk/read/write over a plain directory, no isolation)."""

    def __init__(self, src: Path, tmp: Path) -> None:
        self.root = tmp / "ws"
        shutil.copytree(src, self.root)

    async def read(self, path: str) -> bytes:
        return (self.root / path).read_bytes()

    async def write(self, path: str, data: bytes) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(data)

    async def walk(self, under: str = ".", *, max_entries: int = 100_000):
        from looprl.types import FileEntry
        return sorted((FileEntry(p.relative_to(self.root).as_posix(), "file", p.stat().st_size)
                       for p in (self.root / under).rglob("*") if p.is_file()),
                      key=lambda e: e.path)

