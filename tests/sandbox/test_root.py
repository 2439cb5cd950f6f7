"""Sandbox roots and blank sandboxes: a bwrap started before its workspace existed gets the
workspace and venv by mount propagation; mount points never run through symlinks."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from looprl.errors import SandboxError
from looprl.sandbox import SandboxPool
from looprl.sandbox.bwrap import make_blank, new_sandbox
from looprl.sandbox.root import SandboxRoot, rootable

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap  # (as root: roots are mounts)


def test_blank_gets_workspace_and_venv_after_its_bwrap_is_up(base_repo: Path, venv: str) -> None:
    async def go():
        blank = await make_blank()
        await asyncio.sleep(0.3)  # bwrap has built its namespaces and mounts by now
        assert blank.ready.usable()
        sb = await new_sandbox(base_repo, venv, blank=blank)
        try:
            assert sb._ready is blank.ready and sb.root is blank.root
            r = await sb.exec("pwd; cat pkg/calc.py; python -m pytest -q tests 2>&1 | tail -1; "
                              "echo made > new.txt")
            assert r.stdout.startswith(f"{base_repo}\ndef add(a, b):"), r
            assert "1 failed" in r.stdout, r  # the task's venv runs the task's own test
            assert "+made" in await sb.diff()
        finally:
            await sb.close()
        assert blank.root.closed and not blank.root.dir.exists()
    run(go())


def test_reset_gives_a_fresh_tmp_and_workspace(base_repo: Path) -> None:
    async def go():
        sb = await new_sandbox(base_repo)
        try:
            assert sb.root is not None
            assert (await sb.exec("echo x > /tmp/t; echo y > pkg/calc.py")).ok
            await sb.reset()
            r = await sb.exec("test -e /tmp/t || echo no-t; cat pkg/calc.py")
            assert r.stdout == "no-t\ndef add(a, b):\n    return a - b\n", r
        finally:
            await sb.close()
    run(go())


def test_pool_serves_any_base_from_a_blank(base_repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "f.txt").write_text("other base\n")

    async def go():
        pool = SandboxPool(max_running=2, warm=0, blank=1)
        try:
            await pool.prewarm_blank()
            assert pool.metrics().blank == 1
            async with pool.lease(other) as sb:
                assert (await sb.exec("cat f.txt")).stdout == "other base\n"
            for _ in range(300):  # refilled after the lease's first command
                if pool.metrics().blank == 1:
                    break
                await asyncio.sleep(0.01)
            async with pool.lease(base_repo) as sb:
                assert (await sb.exec("cat README.md")).stdout == "# repo\n"
            m = pool.metrics()
            assert m.blank_hits_total == 2 and m.warm_hits_total == 0, m
        finally:
            await pool.close()
    run(go())


def test_paths_bwrap_mounts_over_are_not_rootable() -> None:
    assert rootable(["/tmp/x/repo", "/root/venvs/a", "/data/libfoo"])
    for bad in (["/usr/lib/python3"], ["/etc/x"], ["/proc/1"], ["/"], ["rel/path"], ["/a/../b"]):
        assert not rootable(bad), bad


def test_base_under_a_system_dir_gets_a_sandbox_without_root() -> None:
    async def go():
        sb = await new_sandbox("/usr/share/doc")  # still works, bwrap builds the tree
        try:
            assert sb.root is None
            assert (await sb.exec("pwd")).stdout == "/usr/share/doc\n"
        finally:
            await sb.close()
    run(go())


def test_mount_point_never_runs_through_a_symlink(tmp_path: Path) -> None:
    root = SandboxRoot(tmp_mb=8)
    outside = tmp_path / "outside"
    outside.mkdir()
    try:
        os.symlink(outside, root.dir / "tmp" / "evil")
        with pytest.raises(SandboxError, match="symlink"):
            root.attach(tmp_path, "/tmp/evil/x", readonly=True)
        assert list(outside.iterdir()) == []  # nothing was created through the link
    finally:
        root.close()
    assert not root.dir.exists()


def test_a_dead_blank_is_closed_and_replaced(base_repo: Path) -> None:
    async def go():
        blank = await make_blank()
        blank.ready.discard()  # its bwrap is gone
        sb = await new_sandbox(base_repo, blank=blank)
        try:
            assert blank.root.closed and sb.root is not blank.root
            assert sb._ready is not None and sb._ready is not blank.ready
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        finally:
            await sb.close()
    run(go())


def _fake_venv(d: Path, real_venv: str) -> str:
    """A venv dir using the same interpreter as ``real_venv``, with a marker file."""
    d.mkdir(parents=True)
    cfg = (Path(real_venv) / "pyvenv.cfg").read_text()
    (d / "pyvenv.cfg").write_text(cfg)
    (d / "marker").write_text("fake venv\n")
    (d / "bin").mkdir()
    (d / "bin" / "python").symlink_to(os.path.realpath(Path(real_venv) / "bin" / "python"))
    return str(d)


@pytest.mark.parametrize("case", ["same_venv", "other_venv", "venv_inside_the_repo"])
def test_a_blank_with_a_venv_attached_serves_any_venv(base_repo: Path, venv: str, tmp_path: Path,
                                                      case: str) -> None:
    """A blank comes with the venv of the pool's last lease attached before any workspace; a
    lease with another venv, or one the workspace would cover, still sees exactly its own."""
    inside = _fake_venv(base_repo / ".venv", venv) if case == "venv_inside_the_repo" else None
    other = _fake_venv(tmp_path / "v2", venv) if case == "other_venv" else None
    blank_venv = inside or venv
    lease_venv = {"same_venv": venv, "other_venv": other, "venv_inside_the_repo": inside}[case]

    async def go():
        blank = await make_blank(venv=blank_venv)
        assert blank.venv == blank_venv and blank.staged is not None
        sb = await new_sandbox(base_repo, lease_venv, blank=blank)
        try:
            attached = sorted(str(p.relative_to(blank.root.dir)) for p in blank.root.attached)
            assert len(attached) == len(set(attached))  # nothing attached twice
            r = await sb.exec(f"test -e {venv}/pyvenv.cfg && echo v1; "
                              f"cat {lease_venv}/marker 2>/dev/null; "
                              f"touch {lease_venv}/pwned 2>/dev/null || echo read-only; "
                              "python -c 'print(1 + 1)'")
            want = {"same_venv": ["v1", "read-only", "2"],
                    "other_venv": ["fake venv", "read-only", "2"],
                    "venv_inside_the_repo": ["fake venv", "read-only", "2"]}[case]
            assert r.stdout.splitlines() == want, r
        finally:
            await sb.close()
    run(go())
