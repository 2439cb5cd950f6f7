"""Sandbox uids are unique across the processes of a host, and given back within one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
