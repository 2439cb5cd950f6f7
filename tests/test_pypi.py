"""Pinned source distributions from PyPI: specs, and unpacking to the package's root."""

import pytest

from looprl import pypi
from looprl.errors import TaskError
from tests.example_package import write_sdist


def test_parse_spec():
    assert pypi.parse_spec("toolz==1.2.0") == ("toolz", "1.2.0")
    assert pypi.parse_spec("more-itertools") == ("more-itertools", None)
    with pytest.raises(TaskError, match="NAME==VERSION"):
        pypi.parse_spec("toolz>=1; rm -rf /")


def test_unpack_puts_the_single_top_folder_at_dest(tmp_path):
    sdist = write_sdist(tmp_path, "demo", {"demo/__init__.py": "x = 1\n"})
    root = pypi.unpack(sdist, tmp_path / "out")
    assert root == tmp_path / "out" and (root / "demo" / "__init__.py").read_text() == "x = 1\n"


def test_download_keeps_only_an_sdist_whose_digest_matches(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    built = write_sdist(tmp_path / "built", "demo", {"setup.py": ""})
    record = {"filename": "demo-1.0.tar.gz", "url": built.as_uri(), "hashes": {"sha256": "0" * 64}}
    monkeypatch.setattr(pypi, "_sdist_files", lambda name: [("1.0", record)])
    with pytest.raises(TaskError, match="does not match"):
        pypi.download_sdist("demo", "1.0")
    sdists = tmp_path / "home" / "packages" / "sdists"
    assert list(sdists.iterdir()) == []  # nothing half-written is kept
    record["hashes"]["sha256"] = pypi.sha256(built)
    got = pypi.download_sdist("demo", None)  # no version: the latest final release
    assert got == sdists / "demo-1.0.tar.gz" and got.read_bytes() == built.read_bytes()
