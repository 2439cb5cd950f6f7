"""Sandbox uids are unique across the processes of a host, and given back within one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from looprl.errors import SandboxError
from looprl.sandbox.idmap import UidPool

FIRST = 260_000  # away from the range the suite's own sandboxes use


def test_two_processes_never_hand_out_the_same_uid(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(tmp_path / "locks"))
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from looprl.sandbox.idmap import UidPool
            pool = UidPool(first={FIRST}, size=10)
            print(*[pool.take() for _ in range(3)], flush=True)
            sys.stdin.read()  # hold them until the parent is done
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        theirs = {int(u) for u in child.stdout.readline().split()}
        ours = UidPool(first=FIRST, size=10)
        mine = {ours.take() for _ in range(3)}
        assert len(theirs) == 3 and len(mine) == 3 and not theirs & mine
    finally:
        child.communicate("")
    # the child has exited: its uids are free for a new process (here, a new pool)
    again = UidPool(first=FIRST, size=10)
    assert again.take() == FIRST


def test_uids_are_reused_in_process_and_the_range_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(tmp_path / "locks"))
    pool = UidPool(first=FIRST, size=2)
    a, b = pool.take(), pool.take()
    pool.give(a)
    assert pool.take() == a
    with pytest.raises(RuntimeError, match="uid range exhausted"):
        pool.take()
    assert b == FIRST + 1


def test_a_lock_dir_someone_else_controls_is_refused(tmp_path, monkeypatch):
    """The default lock dir sits in the world-writable temp dir: a symlink planted there, a
    directory of another user or one others can write is an error, and nothing is created."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(tmp_path / "link"))
    with pytest.raises(SandboxError, match="symlink or not a directory"):
        UidPool(first=FIRST, size=2).take()
    assert not list(target.iterdir())
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(loose))
    with pytest.raises(SandboxError, match="not writable by others"):
        UidPool(first=FIRST, size=2).take()
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 4242, 4242)
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(other))
    with pytest.raises(SandboxError, match="belongs to uid 4242"):
        UidPool(first=FIRST, size=2).take()
    # a planted symlink in our own lock dir is not followed either
    mine = tmp_path / "mine"
    monkeypatch.setenv("LOOPRL_UID_LOCKS", str(mine))
    mine.mkdir(mode=0o700)
    (mine / str(FIRST)).symlink_to(target / "victim")
    pool = UidPool(first=FIRST, size=2)
    assert pool.take() == FIRST + 1  # FIRST's lock file is a symlink: skipped, not followed
    assert not (target / "victim").exists()
