"""A tiny self-contained Python package with a pytest suite, for smoke tests and offline demos of
the task pipeline (real tasks come from PyPI packages through ``sources.py``).

    repo = write_example_package(tmp_path / "minicalc")
    snap = asyncio.run(record_snapshot("minicalc", "0.1", "local", repo, Path(sys.prefix)))
"""

from __future__ import annotations

import tarfile
from pathlib import Path

CORE = '''"""Small numeric and text helpers."""


def clamp(x, lo, hi):
    """Limit x to the closed interval [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    if not values:
        raise ValueError("mean of empty sequence")
    total = 0
    for v in values:
        total += v
    return total / len(values)


def running_total(values, start=0):
    """Prefix sums of values, starting from start."""
    out = []
    acc = start
    for v in values:
        acc = acc + v
        out.append(acc)
    return out


def join_words(text, sep="-"):
    """Lower-cased words of text joined by sep."""
    parts = [p for p in text.lower().split() if p]
    return sep.join(parts)


def is_sorted(xs, reverse=False):
    """Whether xs is sorted (descending when reverse)."""
    for a, b in zip(xs, xs[1:]):
        if (a > b and not reverse) or (a < b and reverse):
            return False
    return True
'''

TESTS = '''from minicalc.core import clamp, is_sorted, join_words, mean, running_total
import pytest


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(42, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_running_total():
    assert running_total([1, 2, 3]) == [1, 3, 6]


def test_running_total_start():
    assert running_total([1, 1], start=10) == [11, 12]


def test_join_words():
    assert join_words("Hello  Big World") == "hello-big-world"


def test_join_words_sep():
    assert join_words("a b", sep="_") == "a_b"


@pytest.mark.parametrize("xs", [[], [1], [1, 2, 2, 3]])
def test_is_sorted(xs):
    assert is_sorted(xs)


def test_is_sorted_false():
    assert not is_sorted([3, 1, 2])


def test_is_sorted_reverse():
    assert is_sorted([3, 2, 1], reverse=True)
'''


def write_example_package(dest: str | Path) -> Path:
    """Write the ``minicalc`` package (src layout, 14 tests) under ``dest``; returns ``dest``."""
    root = Path(dest)
    (root / "src" / "minicalc").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "src" / "minicalc" / "__init__.py").write_text('"""minicalc."""\n')
    (root / "src" / "minicalc" / "core.py").write_text(CORE)
    (root / "tests" / "test_core.py").write_text(TESTS)
    (root / "pyproject.toml").write_text('[project]\nname = "minicalc"\nversion = "0.1"\n'
                                         'dependencies = []\n')
    for p in [root, *root.rglob("*")]:  # the sandbox user must read the base
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def write_sdist(folder: Path, name: str, files: dict[str, str]) -> Path:
    """``folder/NAME-1.0.tar.gz``: an sdist whose single top folder ``NAME-1.0`` holds ``files``
    (repo-relative path -> text)."""
    src = folder / "build" / f"{name}-1.0"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    out = folder / f"{name}-1.0.tar.gz"
    with tarfile.open(out, "w:gz") as t:
        t.add(src, arcname=src.name)
    return out
