"""A command's cgroups: ``kill_all`` ends the whole tree with no step of it run after."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from looprl.sandbox import cgroups
from looprl.sandbox.cgroups import Cgroup


def test_kill_all_lets_no_shell_take_its_next_step(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Signals land children first, 50 ms apart (what a busy server thread can make of the
    killer's loop): a shell whose child died first must not go on to create its file."""
    cg = Cgroup(memory_mb=256, processes=64)
    if not cg.dirs:
        pytest.skip("no writable cgroup controller here")
    sh = subprocess.Popen(["sh", "-c", "read go; sleep 30; : > after"], stdin=subprocess.PIPE,
                          cwd=tmp_path)
    try:
        for f in cg.procs_files():
            Path(f).write_text(str(sh.pid))
        assert sh.stdin is not None
        sh.stdin.write(b"go\n")
        sh.stdin.flush()
        deadline = time.monotonic() + 5
        while len(cg.pids()) < 2:  # the shell and its sleep
            assert time.monotonic() < deadline, "sleep never started"
            time.sleep(0.01)
        real_signal = cgroups._signal

        def children_first(pids: set[int], sig: int) -> None:
            for pid in sorted(pids, reverse=True):
                real_signal({pid}, sig)
                time.sleep(0.05)

        monkeypatch.setattr(cgroups, "_signal", children_first)
        cg.kill_all()
        assert sh.wait(timeout=5) == -9
        time.sleep(0.2)
        assert not (tmp_path / "after").exists(), "the shell ran its next step after its child died"
        assert cg.pids() == set()
    finally:
        if sh.poll() is None:
            sh.kill()
        cg.close()
