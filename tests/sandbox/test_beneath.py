"""beneath.py: nothing outside the directory is ever opened or created, and no symlink is followed
(in either lookup mode: openat2, or the O_NOFOLLOW component walk)."""

from __future__ import annotations

import errno
import os
import stat
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


def test_inside_paths_open_and_no_link_is_followed(tree, mode: str) -> None:
    root, _ = tree
    assert _read(root, "pkg/a.py") == b"inside\n"
    with pytest.raises(OSError) as e:  # a link that stays inside is not followed either
        _read(root, "same")
    assert e.value.errno == errno.ELOOP


def test_root_sees_links_as_git_does(tree, mode: str) -> None:
    fd, _ = tree
    ws = beneath.Root(f"/proc/self/fd/{fd}")
    try:
        assert ws.blob("pkg/a.py") == (b"inside\n", 0o100644)
        assert ws.blob("same") == (b"pkg/a.py", 0o120000)      # the link, not its target
        assert ws.blob("esc") == (os.fsencode(os.readlink(f"/proc/self/fd/{fd}/esc")), 0o120000)
        for absent in ("esc/secret", "pkg/up/outside/secret", "nope", "pkg", "../outside/secret"):
            assert ws.blob(absent) is None, absent
            assert absent == "pkg" or ws.lstat(absent) is None
        assert stat.S_ISLNK(ws.lstat("abs").st_mode)
        assert sorted(ws.files()) == ["abs", "esc", "pkg/a.py", "pkg/up", "same"]
        walked = [d for d, _, _ in ws.walk()]
        assert walked == [".", "pkg"]                             # links are never entered
        for bad in ("esc", "same", "pkg/up"):
            with pytest.raises(OSError):
                next(ws.walk(bad))
        with pytest.raises(OSError) as e:
            ws.read("abs")
        assert e.value.errno == errno.ELOOP
        assert ws.link_on_path("esc/secret") == ("esc", os.readlink(f"/proc/self/fd/{fd}/esc"))
        assert ws.link_on_path("pkg/a.py") is None
    finally:
        ws.close()


def test_root_write_replaces_a_link_and_refuses_one_on_the_way(tree, mode: str) -> None:
    fd, out = tree
    ws = beneath.Root(f"/proc/self/fd/{fd}")
    try:
        ws.write("abs", b"mine\n")        # a link out: replaced by a file, its target untouched
        assert ws.blob("abs") == (b"mine\n", 0o100644)
        assert (out / "secret").read_text() == "SECRET\n"
        ws.write("same", b"also\n")
        assert ws.read("pkg/a.py") == b"inside\n" and ws.read("same") == b"also\n"
        for bad in ("esc/secret", "esc/new.py", "pkg/up/x"):
            with pytest.raises(OSError) as e:
                ws.write(bad, b"pwned")
            assert e.value.errno == errno.ELOOP, bad
        ws.write("new/deep/f.py", b"x")
        assert ws.read("new/deep/f.py") == b"x"
    finally:
        ws.close()
    assert sorted(p.name for p in out.iterdir()) == ["secret"]


def test_makedirs_creates_inside_only(tree, mode: str) -> None:
    root, out = tree
    os.close(beneath.makedirs_beneath(root, "new/deep/dir"))
    fd = beneath.open_beneath(root, "new/deep/dir", os.O_RDONLY | os.O_DIRECTORY)
    os.close(fd)
    with pytest.raises(OSError):
        beneath.makedirs_beneath(root, "esc/made")
    assert sorted(p.name for p in out.iterdir()) == ["secret"]
