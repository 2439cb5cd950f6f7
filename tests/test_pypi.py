"""Pinned source distributions from PyPI: specs, and unpacking to the package's root."""

import tarfile

import pytest

from looprl import pypi
from looprl.errors import TaskError


def test_parse_spec():
    assert pypi.parse_spec("toolz==1.2.0") == ("toolz", "1.2.0")
    assert pypi.parse_spec("more-itertools") == ("more-itertools", None)
    with pytest.raises(TaskError, match="NAME==VERSION"):
        pypi.parse_spec("toolz>=1; rm -rf /")


def test_unpack_puts_the_single_top_folder_at_dest(tmp_path):
    src = tmp_path / "demo-1.0"
    (src / "demo").mkdir(parents=True)
    (src / "demo" / "__init__.py").write_text("x = 1\n")
    sdist = tmp_path / "demo-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.add(src, arcname="demo-1.0")
    root = pypi.unpack(sdist, tmp_path / "out")
    assert root == tmp_path / "out" and (root / "demo" / "__init__.py").read_text() == "x = 1\n"
