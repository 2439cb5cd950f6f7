"""Production beside the real-time loop: the ``looprl serve`` it starts and its simulated users.

    prod = start_production(cfg, run, RunDir(run).policies, RunDir(run).feedback_db)
    prod.wait_serving("A", 3)   # until the server's arm A serves v3 (it re-reads the pointers)
    prod.stop()                 # users first, then the server; in-flight sessions finish

Both run as their own processes and share only the policies directory and the feedback store
with the loop, as they would on separate machines. They end with the loop, even when it is
killed outright (``PR_SET_PDEATHSIG`` on Linux). The server's bearer token is random per run and
reaches the children through their environment, never their command line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.errors import ConfigError
from looprl.feedback.realtime_config import RealtimeConfig, users_tasks
from looprl.rundir import RunDir


def _looprl(*args: str) -> list[str]:
    return [sys.executable, "-m", "looprl", *args]


def _end_with_parent() -> None:
    """In a child (``Popen(preexec_fn=...)``): SIGTERM when the loop dies, even killed outright,
    so no server or users outlive it (Linux: ``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@dataclass
class Production:
    """The server (and simulated users) the loop runs beside."""

    url: str
    token: str
    serve: subprocess.Popen[bytes]
    users: subprocess.Popen[bytes] | None = None

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/healthz", timeout=10).json()

    def wait_serving(self, arm: str, version: int, timeout_s: float = 120.0) -> None:
        """Until the server's ``arm`` serves ``version`` (it re-reads the policies dir itself)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.serve.poll() is not None:
                raise ConfigError(f"the server exited ({self.serve.returncode}); see serve.log")
            arms = self.health().get("arms", {})
            if arms.get(arm) == version:
                return
            time.sleep(0.5)
        raise ConfigError(f"the server did not pick up v{version} on arm {arm} in {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 900.0) -> None:
        """Users first (they stop arriving; in-flight sessions finish), then the server."""
        for p in (self.users, self.serve):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def start_production(cfg: RealtimeConfig, run: Path, policies: Path, db: Path) -> Production:
    import httpx

    from looprl.sandbox.server import free_port

    token = os.urandom(12).hex()
    port = cfg.serve.port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LOOPRL_SERVE_TOKEN": token}
    serve = subprocess.Popen(
        _looprl("serve", "--model", str(policies), "--store", str(db), "--port", str(port),
                "--watch", str(cfg.serve.watch_s), "--max-concurrent", str(cfg.serve.max_concurrent),
                "--max-turns", str(cfg.serve.max_turns),
                "--max-new-tokens", str(cfg.serve.max_new_tokens),
                "--context-window", str(cfg.serve.context_window), "--min-sessions", "1",
                *_allowed_roots(cfg)),
        stdout=(run / "serve.log").open("ab"), stderr=subprocess.STDOUT, env=env,
        preexec_fn=_end_with_parent)
    prod = Production(url, token, serve)
    deadline = time.monotonic() + 300
    while True:
        if serve.poll() is not None:
            raise ConfigError(f"`looprl serve` exited with {serve.returncode}: see {run}/serve.log")
        try:
            prod.health()
            break
        except (httpx.HTTPError, ValueError):  # not listening yet, or not answering JSON yet
            pass
        if time.monotonic() > deadline:
            prod.stop(5)
            raise ConfigError(f"`looprl serve` did not answer in 300 s: see {run}/serve.log")
        time.sleep(1)
    if cfg.users.simulate:
        prod.users = subprocess.Popen(
            _looprl("feedback", "simulate", "--url", url,
                    "--tasks", str(_users_tasks(cfg, run)), *cfg.users.cli_args(),
                    "--out", str(RunDir(run).users_summary)),
            stdout=(run / "users.log").open("ab"), stderr=subprocess.STDOUT, env=env,
            preexec_fn=_end_with_parent)
    return prod


def _users_tasks(cfg: RealtimeConfig, run: Path) -> Path:
    """The users' task file (``RUN/users_tasks.jsonl`` when limited)."""
    from looprl.tasks.taskset import write_tasks

    if not cfg.users.limit:
        return Path(cfg.users.tasks).expanduser()
    out = RunDir(run).users_tasks
    write_tasks(users_tasks(cfg), out)
    return out


def _allowed_roots(cfg: RealtimeConfig) -> list[str]:
    """``--allowed-root`` for ``serve.allowed_roots`` and every directory holding a user task's
    repo or venv (users send both)."""
    from looprl.tasks.taskset import load_tasks

    roots = set(cfg.serve.allowed_roots)
    if cfg.users.tasks:
        for t in load_tasks(Path(cfg.users.tasks).expanduser()):
            roots |= {str(Path(d).parent) for d in (t.repo, t.venv) if d}
    return [a for r in sorted(roots) for a in ("--allowed-root", r)]

