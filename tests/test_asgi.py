"""looprl.asgi's pieces at their seams: ``unless_gone`` with a request double whose client has
left (or not), ``StrictBody``'s refusals, and ``run`` returning after a signal (a real process).
The HTTP-level behaviour is tested against the real servers (tests/sandbox/test_server_abuse.py,
tests/serve/test_api_abuse.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import httpx
import pytest
from pydantic import ValidationError

from looprl.asgi import ClientGone, Drain, Draining, StrictBody, unless_gone
from looprl.sandbox.server import free_port


class RequestDouble:
    """TEST DOUBLE of a Starlette request: ``receive`` reports a disconnect once ``gone`` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_a_result_ready_after_the_client_left_is_undone():
    async def go():
        req, undone = RequestDouble(), []
        req.gone.set()  # the client left before its (instant) work was looked at

        async def work() -> str:
            return "lease-1"

        async def undo(x: str) -> None:
            undone.append(x)

        with pytest.raises(ClientGone):
            await unless_gone(req, None, work(), undo=undo)
        await asyncio.sleep(0.01)
        return undone

    assert asyncio.run(go()) == ["lease-1"]


def test_work_is_cancelled_when_the_client_leaves_and_kept_when_it_stays():
    async def go():
        req, cancelled = RequestDouble(), []

        async def slow() -> int:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return 1

        async def fast() -> int:
            await asyncio.sleep(0.01)
            return 2

        assert await unless_gone(req, None, fast()) == 2
        asyncio.get_running_loop().call_later(0.05, req.gone.set)
        with pytest.raises(ClientGone):
            await unless_gone(req, None, slow())
        await asyncio.sleep(0.01)
        return cancelled

    assert asyncio.run(go()) == [True]


def test_draining_gives_up_at_once_or_after_the_grace():
    async def go():
        drain = Drain()
        drain.bind(asyncio.get_running_loop())

        async def sleep(s: float) -> float:
            await asyncio.sleep(s)
            return s

        asyncio.get_running_loop().call_later(0.05, drain.start)
        with pytest.raises(Draining):  # queued work: no grace
            await unless_gone(RequestDouble(), drain, sleep(30))
        assert await unless_gone(RequestDouble(), drain, sleep(0.05), grace_s=1.0) == 0.05
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Draining):  # running work: cut when the grace ends
            await unless_gone(RequestDouble(), drain, sleep(30), grace_s=0.2)
        return loop.time() - t0

    assert 0.15 < asyncio.run(go()) < 1.0


class Body(StrictBody):
    name: str
    timeout_s: float = 1.0
    env: dict[str, str] | None = None


@pytest.mark.parametrize("data, field", [
    ({"name": "a", "timeout_s": float("nan")}, "timeout_s"),
    ({"name": "a", "timeout_s": float("inf")}, "timeout_s"),
    ({"name": "a\ud800"}, "name"),
    ({"name": "a", "env": {"K": "\udc80"}}, "env"),
    ({"name": "a", "extra": 1}, "extra"),
])
def test_strict_bodies_name_the_bad_field(data, field):
    with pytest.raises(ValidationError) as e:
        Body.model_validate(data)
    assert e.value.errors()[0]["loc"][0] == field


SERVED = """
import sys
from pathlib import Path
from fastapi import FastAPI
from looprl.asgi import run

app = FastAPI()
app.get("/healthz")(lambda: {"ok": True})
try:
    run(app, host="127.0.0.1", port=int(sys.argv[1]), drain_s=2)
finally:  # what `looprl serve` does here: close its engines
    Path(sys.argv[2]).write_text("closed")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_the_server_then_its_caller_cleans_up_and_exits_0(tmp_path, sig):
    """uvicorn re-raises the signal after its shutdown, which killed the process before the
    caller's ``finally`` ran (a vLLM worker outlived ``looprl serve``); ``run`` returns instead."""
    port, marker = free_port(), tmp_path / "closed"
    proc = subprocess.Popen([sys.executable, "-c", SERVED, str(port), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600  # importing fastapi takes minutes on a loaded machine
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, proc.stdout.read()
        assert marker.read_text() == "closed"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
