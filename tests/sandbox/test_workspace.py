"""Copy-on-write workspaces: create, diff, snapshot/fork, reset, destroy, janitor."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from looprl.errors import SandboxError
from looprl.sandbox.workspace import (
    create_workspace,
    fork,
    janitor,
    mounts_under,
    realpath,
    sandbox_root,
)

from .conftest import tree_hash

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlay workspaces need root")
BACKENDS = ["overlay", "copy"]


def edit(ws_path: Path) -> None:
    (ws_path / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws_path / "pkg" / "new.py").write_text("X = 1\n")
    os.remove(ws_path / "README.md")
    shutil.rmtree(ws_path / "pkg" / "sub")
    (ws_path / "pkg" / "logo.bin").write_bytes(bytes(range(255, -1, -1)))
    (ws_path / "pkg" / "__pycache__").mkdir()
    (ws_path / "pkg" / "__pycache__" / "calc.cpython-311.pyc").write_bytes(b"\0junk")


@pytest.mark.parametrize("backend", BACKENDS)
def test_diff_covers_edit_new_delete_binary_and_applies(base_repo: Path, tmp_path: Path,
                                                         backend: str) -> None:
    before = tree_hash(base_repo)
    ws = create_workspace(base_repo, backend=backend)
    try:
        assert ws.cow_backend == backend
        edit(ws.path)
        d = ws.diff()
        assert "+    return a + b" in d and "-    return a - b" in d
        assert "new file mode 100644" in d and "+X = 1" in d
        assert "deleted file mode 100644" in d and "-# repo" in d
        assert "diff --git a/pkg/sub/data.txt" in d and "\\ No newline at end of file" in d
        assert "GIT binary patch" in d and "__pycache__" not in d and ".pyc" not in d
        # the whole diff, binary file included, applies with git to a pristine copy and
        # reproduces the workspace (less the caches it ignores)
        clone = tmp_path / "clone"
        shutil.copytree(base_repo, clone)
        assert _git_apply(clone, d).returncode == 0
        shutil.rmtree(ws.path / "pkg" / "__pycache__")
        assert files(clone) == files(ws.path)
    finally:
        ws.destroy()
    assert tree_hash(base_repo) == before, "the base must never change"


def files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every non-directory below ``root``: (mode, content or link target) — what git records."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(root))] = (st.st_mode, os.readlink(p).encode())
            elif p.is_file():
                out[str(p.relative_to(root))] = (st.st_mode, p.read_bytes())
    return out


def _git_apply(root: Path, diff: str) -> subprocess.CompletedProcess[str]:
    (root.parent / "p.diff").write_bytes(diff.encode())
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", str(root.parent / "p.diff")],
                       cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def shape(ws_path: Path) -> None:
    """What an agent can leave: a file swapped for a directory, a directory for a symlink, a
    file for a symlink, and lines git must not split (form feed, lone CR, vertical tab, U+2028,
    NEL), a NUL, text that is not UTF-8, names git quotes."""
    calc = ws_path / "pkg" / "calc.py"
    calc.write_text(calc.read_text() + "\x0c\n# a\rb\x0bc\u2028d\x85e\n")
    os.remove(ws_path / "tests" / "test_calc.py")
    (ws_path / "tests" / "test_calc.py").mkdir()
    (ws_path / "tests" / "test_calc.py" / "x.py").write_text("X = 1\n")
    shutil.rmtree(ws_path / "pkg" / "sub")
    os.symlink("fake", ws_path / "pkg" / "sub")
    os.remove(ws_path / "README.md")
    os.symlink("pkg/calc.py", ws_path / "README.md")
    (ws_path / "pkg" / "nul.py").write_bytes(b"x = 1\0\n")
    (ws_path / "pkg" / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n")
    (ws_path / "a b\tc\nd\"e\\f\u00e9.txt").write_text("odd name\n")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_shape_an_agent_leaves_reapplies_with_git(base_repo: Path, tmp_path: Path,
                                                       backend: str) -> None:
    ws = create_workspace(base_repo, backend=backend)
    try:
        shape(ws.path)
        d = ws.diff()
        clone = tmp_path / "clone"
        shutil.copytree(base_repo, clone)
        _git_apply(clone, d)
        assert files(clone) == files(ws.path)
        assert os.readlink(clone / "pkg" / "sub") == "fake"
        assert (clone / "pkg" / "calc.py").read_bytes() == (ws.path / "pkg" / "calc.py").read_bytes()
    finally:
        ws.destroy()


def test_unchanged_workspace_has_empty_diff(base_repo: Path) -> None:
    ws = create_workspace(base_repo)
    try:
        (ws.path / "pkg" / "calc.py").write_text((base_repo / "pkg" / "calc.py").read_text())
        assert ws.diff() == ""  # copied up but identical: no diff
    finally:
        ws.destroy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_snapshot_fork_children_are_independent(base_repo: Path, backend: str) -> None:
    ws = create_workspace(base_repo, backend=backend)
    edit(ws.path)
    snap = ws.snapshot()
    (ws.path / "after_snapshot.txt").write_text("parent only\n")
    kids = fork(snap, 3)
    try:
        for i, k in enumerate(kids):
            assert (k.path / "pkg" / "new.py").read_text() == "X = 1\n"
            assert not (k.path / "README.md").exists() and not (k.path / "pkg" / "sub").exists()
            assert not (k.path / "after_snapshot.txt").exists()
            (k.path / f"kid{i}.txt").write_text(str(i))
        assert not (kids[0].path / "kid1.txt").exists()
        assert "kid0.txt" in kids[0].diff() and "kid1.txt" not in kids[0].diff()
        assert "+X = 1" in kids[2].diff()  # diff is always against the base, through all layers
        # a forked child can itself be snapshotted mid-episode: layers stack
        snap2 = kids[0].snapshot()
        grand = fork(snap2, 1)[0]
        assert (grand.path / "kid0.txt").read_text() == "0"
        assert (grand.path / "pkg" / "new.py").exists() and not (grand.path / "README.md").exists()
        assert "-# repo" in grand.diff() and "kid0.txt" in grand.diff()
        grand.destroy()
        snap2.release()
    finally:
        for w in (ws, *kids):
            w.destroy()
        snap.release()
    assert not [p for p in sandbox_root().iterdir() if p.name.startswith(f"layer-{os.getpid()}-")]


def test_reset_returns_to_start_state(base_repo: Path) -> None:
    ws = create_workspace(base_repo)
    try:
        edit(ws.path)
        ws.reset()
        assert ws.diff() == ""
        assert (ws.path / "README.md").read_text() == "# repo\n"
    finally:
        ws.destroy()


def test_destroy_leaves_no_mount_or_dir(base_repo: Path) -> None:
    ws = create_workspace(base_repo)
    assert ws.cow_backend == "overlay"
    assert mounts_under(ws.dir), "overlay workspaces are mounts"
    ws.destroy()
    ws.destroy()  # idempotent
    assert not mounts_under(ws.dir) and not ws.dir.exists()
    with pytest.raises(SandboxError):
        ws.diff()


def test_missing_base_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="does not exist"):
        create_workspace(tmp_path / "nope")


def test_disk_quota_stops_a_disk_fill(base_repo: Path) -> None:
    ws = create_workspace(base_repo, disk_mb=8)
    try:
        with pytest.raises(OSError, match="No space left"):
            (ws.path / "big").write_bytes(b"\0" * (16 * 2**20))
    finally:
        ws.destroy()


def test_janitor_removes_what_a_killed_process_left(base_repo: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal
        from looprl.sandbox.workspace import create_workspace
        ws = create_workspace({str(base_repo)!r})
        snap = ws.snapshot()
        print(ws.dir, snap.layers[0], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    ws_dir, layer = (Path(x) for x in r.stdout.split())
    assert ws_dir.exists() and mounts_under(ws_dir) and layer.exists()  # leaked, as expected
    removed = janitor()
    assert ws_dir in removed and layer in removed
    assert not ws_dir.exists() and not layer.exists() and not mounts_under(ws_dir)


def test_realpath_agrees_with_os_path_realpath(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real" / "deep").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.symlink("real/deep", tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    for p in ("link/deep", "rel", "real/./deep/..", "link/../real", "missing/x", "link/missing"):
        assert realpath(tmp_path / p) == os.path.realpath(tmp_path / p), p
        assert realpath(p) == os.path.realpath(p), p  # relative to the working directory
