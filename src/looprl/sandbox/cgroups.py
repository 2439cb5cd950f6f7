"""Per-command cgroups (v1 memory + pids) for ``bwrap.py``, and their janitor.

Each command of a sandbox joins a fresh ``looprl-<pid>-<id>`` cgroup under this process's own
cgroup in each writable controller: a memory limit for the whole process tree (the OOM killer acts
inside it), a pid limit (the fork-bomb guard), and a list of every pid to SIGKILL on timeout.
Where the controllers are absent or read-only, nothing is created and the rlimits remain.

    cg = Cgroup(memory_mb=2048, processes=256)   # preexec: write the child pid to cg.procs_files()
    ...; cg.kill_all(); cg.close()
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path


def _own_cgroup(controller: str) -> Path | None:
    root = Path("/sys/fs/cgroup") / controller
    if not root.is_dir():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, rel = line.split(":", 2)
        if controller in ctrls.split(","):
            p = root / rel.lstrip("/")
            return p if os.access(p, os.W_OK) else None
    return None


class Cgroup:
    """A memory + pids cgroup (v1) for one command; missing controllers are skipped."""

    def __init__(self, memory_mb: int, processes: int, *, enabled: bool = True):
        self.dirs: list[Path] = []
        if not enabled:
            return
        name = f"looprl-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        settings = {"memory": {"memory.limit_in_bytes": memory_mb * 2**20,
                               "memory.swappiness": 0},
                    "pids": {"pids.max": processes}}
        for ctrl, values in settings.items():
            parent = _own_cgroup(ctrl)
            if parent is None:
                continue
            d = parent / name
            try:
                d.mkdir()
                for k, v in values.items():
                    try:
                        (d / k).write_text(str(v))
                    except OSError:
                        if k != "memory.swappiness":
                            raise
            except OSError:
                self._rmdir(d)
                continue
            self.dirs.append(d)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        for d in self.dirs:
            try:  # (read after every command: a raw read, not pathlib's text layers)
                fd = os.open(f"{d}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # not the memory cgroup
            try:
                text = os.read(fd, 4096).decode()
            finally:
                os.close(fd)
            stats = dict(line.split() for line in text.splitlines() if line.count(" ") == 1)
            if int(stats.get("oom_kill", 0)) > 0:
                return True
        return False

    def pids(self) -> set[int]:
        """Every process in the cgroups now."""
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return pids

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroups until none is left. Each is stopped first and
        none is killed while another still runs (for at most ~50 ms): killed one by one, a shell
        whose child dies first runs its next command ("sleep 9; rm -rf data") before its own
        SIGKILL lands."""
        stopped: set[int] = set()
        for attempt in range(100):
            pids = self.pids()
            if not pids:
                return
            fresh = pids - stopped
            _signal(fresh, signal.SIGSTOP)
            stopped |= fresh
            if not fresh and (attempt >= 50 or all(map(_halted, pids))):
                _signal(pids, signal.SIGKILL)
            time.sleep(0.001)

    def close(self) -> None:
        self.kill_all()
        for d in self.dirs:
            self._rmdir(d)

    @staticmethod
    def _rmdir(d: Path) -> None:
        for _ in range(500):
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.002)


def cgroup_janitor() -> int:
    """Remove looprl cgroups left by dead processes. Returns how many went."""
    n = 0
    for ctrl in ("memory", "pids"):
        parent = _own_cgroup(ctrl)
        if parent is None:
            continue
        for d in parent.glob("looprl-*"):
            pid = d.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                Cgroup._rmdir(d)
                n += 1
    return n


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _halted(pid: int) -> bool:
    """Stopped, dying or gone: it runs no more code of its own."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2:][:1] in (b"T", b"t", b"Z", b"X")
