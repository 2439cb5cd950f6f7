"""The pinned source corpus: sdists unpacked into one repository per import package, the same
text on any machine, and never a task package."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from looprl import pypi
from looprl.models import corpus
from looprl.models.tiny import python_sources
from looprl.pypi import normalize, parse_spec
from tests.example_package import write_sdist

CONFIGS = Path(__file__).parents[2] / "src" / "looprl" / "configs"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_corpus_is_pinned_sorted_and_never_a_task_package():
    names = [normalize(parse_spec(s)[0]) for s in corpus.CORPUS]
    assert all(parse_spec(s)[1] for s in corpus.CORPUS)  # every entry pins a version
    assert len(set(names)) == len(names)  # one release per package
    # packages with held-out tasks; train-only ones may be in the corpus: a run leaves every
    # task package out of pretraining and synthetic demos (train.stages.task_packages)
    for path in CONFIGS.glob("*.toml"):
        tasks = tomllib.loads(path.read_text()).get("tasks", {})
        for spec in tasks.get("train_packages", []) + tasks.get("heldout_packages", []):
            assert normalize(parse_spec(spec)[0]) not in names, (path.name, spec)


def test_repos_hold_library_packages_only(tmp_path, home, monkeypatch):
    sdists = {
        "srcpkg": write_sdist(tmp_path, "srcpkg", {"src/alpha/__init__.py": "A = 1\n",
                                                   "src/alpha/core.py": "def f():\n    return 1\n",
                                                   "tests/__init__.py": "", "docs/conf.py": "x = 1\n",
                                                   "setup.py": "import setuptools\n"}),
        "flat": write_sdist(tmp_path, "flat", {"beta/__init__.py": "", "gamma/__init__.py": "",
                                               "_private/__init__.py": "", "examples/__init__.py": ""}),
    }
    monkeypatch.setattr(corpus, "download_sdist", lambda name, version: sdists[name])
    repos = corpus.fetch_repos("srcpkg==1.0")
    assert [r.name for r in repos] == ["alpha"]
    assert sorted(p.name for p in (repos[0] / "alpha").iterdir()) == ["__init__.py", "core.py"]
    assert sorted(p.name for p in repos[0].iterdir()) == ["alpha"]
    specs = ("flat==1.0", "srcpkg==1.0")
    assert [r.name for r in corpus.corpus_repos(specs=specs)] == ["beta", "gamma", "alpha"]
    kept = corpus.corpus_repos(exclude=["gamma", "srcpkg"], specs=specs)
    assert [r.name for r in kept] == ["beta"]
    monkeypatch.setattr(corpus, "download_sdist", lambda name, version: pytest.fail("refetched"))
    assert corpus.fetch_repos("srcpkg==1.0") == repos  # made once, then read from the cache
    orders = {tuple(r.name for r in corpus.iter_corpus(seed, specs=specs)) for seed in range(8)}
    assert orders == {("beta", "gamma", "alpha"), ("alpha", "beta", "gamma")}  # seeded order
    text = list(python_sources(max_chars=10**6, repos=corpus.corpus_repos(specs=specs)))
    assert "def f():\n    return 1\n" in text and "x = 1\n" not in text


def test_download_checks_the_index_digest_and_is_cached(home, monkeypatch):
    sdist = pypi.download_sdist("idna", "3.20")  # a real sdist from PyPI (~200 kB)
    assert sdist.name == "idna-3.20.tar.gz" and sdist.parent == home / "packages" / "sdists"
    monkeypatch.setattr(pypi, "_sdist_files", lambda name: pytest.fail("asked the index again"))
    assert pypi.download_sdist("idna", "3.20") == sdist
    monkeypatch.undo()
    with pytest.raises(pypi.TaskError, match="no sdist of it"):
        pypi.download_sdist("idna", "0.0.1")
