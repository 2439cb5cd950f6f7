"""open_beneath / makedirs_beneath: nothing outside the directory is ever opened or created."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from looprl.sandbox import beneath


@pytest.fixture(params=["openat2", "component_walk"])
def mode(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2" and not beneath.has_openat2():
        pytest.skip("this kernel has no openat2")
    if request.param == "component_walk":
        monkeypatch.setattr(beneath, "has_openat2", lambda: False)
    return request.param


@pytest.fixture()
def tree(tmp_path: Path):
    ws, out = tmp_path / "ws", tmp_path / "outside"
    (ws / "pkg").mkdir(parents=True)
    out.mkdir()
    (ws / "pkg" / "a.py").write_text("inside\n")
    (out / "secret").write_text("SECRET\n")
    (ws / "esc").symlink_to(out)                   # a directory link out
    (ws / "pkg" / "up").symlink_to("../..")        # relative, climbs out
    (ws / "abs").symlink_to(out / "secret")        # a file link out
    (ws / "same").symlink_to("pkg/a.py")           # stays inside
    fd = os.open(ws, os.O_PATH | os.O_DIRECTORY)
    yield fd, out
    os.close(fd)


def _read(root: int, path: str) -> bytes:
    fd = beneath.open_beneath(root, path, os.O_RDONLY)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", ["esc/secret", "pkg/up/outside/secret", "abs", "../outside/secret",
                                  "pkg/../../outside/secret", "/etc/passwd"])
def test_every_way_out_is_refused(tree, mode: str, path: str) -> None:
    root, _ = tree
    with pytest.raises(OSError) as e:
        _read(root, path)
    assert e.value.errno in (errno.EXDEV, errno.ELOOP, errno.ENOTDIR)


def test_inside_paths_open(tree, mode: str) -> None:
    root, _ = tree
    assert _read(root, "pkg/a.py") == b"inside\n"
    if mode == "openat2":  # a link that stays inside is followed; the walk refuses every link
        assert _read(root, "same") == b"inside\n"
    else:
        with pytest.raises(OSError):
            _read(root, "same")


def test_makedirs_creates_inside_only(tree, mode: str) -> None:
    root, out = tree
    os.close(beneath.makedirs_beneath(root, "new/deep/dir"))
    fd = beneath.open_beneath(root, "new/deep/dir", os.O_RDONLY | os.O_DIRECTORY)
    os.close(fd)
    with pytest.raises(OSError):
        beneath.makedirs_beneath(root, "esc/made")
    assert sorted(p.name for p in out.iterdir()) == ["secret"]
