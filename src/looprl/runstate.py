"""Where a ``looprl train`` run stands, in ``runs/<name>/state.json``: written by the run, read
by the dashboard, ``looprl model serve`` and the next ``looprl train`` on the same name.

    mark(run_dir, "training")            # pid and host recorded: a reader can tell a dead one
    mark(run_dir, "failed", error="ConfigError: ...", stage="tasks")
    read(run_dir).status                 # "training" | "finished" | "stopped" | "failed" | "killed"

``killed`` is never written: it is what a reader on the same host sees when the state says
``training`` but that process is gone (``kill -9``, a machine that rebooted). A run directory
without ``state.json`` (older runs) reads as ``finished`` when it holds ``report.md``, else as
``unknown``. What this does not do: tell a dead process on another host from a live one (the
state then stays ``training``), or lock a run directory against two writers started in the same
instant.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import ConfigError
from looprl.rundir import RunDir

WRITTEN = ("training", "finished", "stopped", "failed")
"""States a run writes; ``killed`` and ``unknown`` are only read."""


@dataclass(frozen=True)
class RunState:
    status: str
    """One of ``WRITTEN``, ``killed`` or ``unknown``."""
    stage: str = ""
    """The stage it was in (tasks, model, SFT, eval_start, RL, eval_rl, report)."""
    error: str = ""
    """The one-line error a failed run ended with."""
    pid: int = 0
    host: str = ""
    updated: float = 0.0
    """Unix time of the write."""

    @property
    def alive(self) -> bool:
        return self.status == "training"


def _path(run_dir: Path) -> Path:
    return RunDir(run_dir).state


def mark(run_dir: Path, status: str, *, stage: str = "", error: str = "") -> None:
    """Record ``status`` (one of ``WRITTEN``) for the run in ``run_dir``, atomically."""
    assert status in WRITTEN, f"unknown run state {status!r}"
    path = _path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"status": status, "stage": stage, "error": error, "pid": os.getpid(),
            "host": socket.gethostname(), "updated": time.time()}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def read(run_dir: Path) -> RunState:
    """The run's state (``killed`` for a ``training`` one whose process on this host is gone)."""
    path = _path(run_dir)
    try:
        raw = json.loads(path.read_text())
        state = RunState(str(raw["status"]), str(raw.get("stage", "")), str(raw.get("error", "")),
                         int(raw.get("pid", 0)), str(raw.get("host", "")),
                         float(raw.get("updated", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return RunState("finished" if RunDir(run_dir).report.is_file() else "unknown")
    if (state.status == "training" and state.host == socket.gethostname() and state.pid
            and not _pid_alive(state.pid)):
        return RunState("killed", state.stage, state.error, state.pid, state.host, state.updated)
    return state


def refuse_live(run_dir: Path) -> None:
    """Raise when a live process on this host is training the run in ``run_dir``."""
    state = read(run_dir)
    if state.alive and state.host == socket.gethostname() and state.pid != os.getpid():
        raise ConfigError(f"{run_dir} is being trained right now (pid {state.pid}, stage "
                          f"{state.stage or '?'}); wait for it, stop it (Ctrl-C or kill "
                          f"{state.pid}), or pick another name (-o name=...)")
