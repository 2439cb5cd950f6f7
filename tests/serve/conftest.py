"""Shared builders for the agent server's tests: the app served by real uvicorn (with the draining
shutdown ``looprl serve`` uses) on a free loopback port in a thread, and sessions stored directly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fastapi import FastAPI

from looprl.asgi import Server, make_server
from looprl.feedback.store import FeedbackStore
from looprl.sandbox.server import free_port
from tests.feedback.conftest import TWO_FILE_DIFF, make_traj


@dataclass
class Running:
    url: str
    server: Server
    thread: threading.Thread


@contextmanager
def running(app: FastAPI, drain_s: float = 5.0) -> Iterator[Running]:
    """``app`` (from ``make_app``) served until the block ends, then drained like SIGTERM does."""
    port = free_port()
    srv = make_server(app, host="127.0.0.1", port=port, drain=app.state.drain, drain_s=drain_s)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", srv, t)
    finally:
        srv.begin_drain()
        t.join(timeout=drain_s + 20)


def stored_session(store: FeedbackStore, user: str = "u", diff: str = TWO_FILE_DIFF,
                   created_at: float | None = None) -> str:
    """A finished session editing pkg/a.py and pkg/b.py, as ``looprl serve`` stores one."""
    return store.add_session(user=user, arm="A", policy_version=0, prompt="fix it", repo="/srv/r",
                             trajectory=make_traj(diff), latency_s=1.0, created_at=created_at)
