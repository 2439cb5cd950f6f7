"""What every looprl HTTP server shares: checks made before a request body is read, strict request
bodies, and a shutdown that drains with a deadline.

    app.add_middleware(Guard, authorized=bearer("s3cret"), open_paths={"/healthz"},
                       max_body=lambda path: 1 << 20)
    class ExecReq(StrictBody): ...              # unknown fields, NaN/Infinity, lone surrogates: 422
    install_error_handlers(app)                 # 422 bodies carry one readable line
    result = await unless_gone(request, drain, pool.acquire(...), undo=release)
    run(app, host="127.0.0.1", port=8377, drain=drain, drain_s=30.0)  # SIGTERM: drain, then return

``Guard`` sits in front of the app (plain ASGI, no body buffering by Starlette): it answers 401 from
the headers alone, so an unauthenticated client cannot make the server read, buffer or parse a body;
413 from ``Content-Length`` before reading, or as soon as a chunked body passes the limit; 408 when
the body does not arrive within ``body_timeout_s``. The body is then handed to the app from memory
(at most the limit), and later ``receive`` calls reach the connection, so handlers can still see the
client disconnect (``unless_gone``).

What this does NOT protect against: many clients each sending up to the limit at once (memory is
``limit x concurrent requests``; put a proxy with connection limits in front), slow responses to
slow readers, floods of requests (no rate limiting), anyone who can read the traffic (no TLS: the
token travels in clear; bind to loopback or terminate TLS in front).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")
Authorized = Callable[[Scope], bool]


def bearer(token: str) -> Authorized:
    """A check that the request carries ``Authorization: Bearer <token>`` (constant-time)."""
    want = f"Bearer {token}".encode()

    def check(scope: Scope) -> bool:
        got = Headers(scope=scope).get("authorization", "")
        return hmac.compare_digest(got.encode("utf-8", "surrogateescape"), want)

    return check


def query_param(scope: Scope, name: str) -> str:
    """One query parameter of the request ("" when absent)."""
    return QueryParams(scope.get("query_string", b"")).get(name, "")


async def _reply(send: Send, status: int, error: str, message: str) -> None:
    """A JSON error that also closes the connection (its unread body is never read)."""
    body = json.dumps({"error": error, "message": message, "detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]
                + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: auth from the headers, then a bounded body read (see module docstring).

    ``authorized``: None = open server; ``open_paths`` skip it (health checks).
    ``max_body``: the byte limit of a path's body.
    """

    def __init__(self, app: ASGIApp, *, authorized: Authorized | None,
                 max_body: Callable[[str], int], open_paths: Iterable[str] = (),
                 body_timeout_s: float = 60.0, auth_hint: str = "send 'Authorization: Bearer "
                 "<token>' (the server's --token)") -> None:
        self.app, self.authorized, self.max_body = app, authorized, max_body
        self.open_paths = frozenset(open_paths)
        self.body_timeout_s = body_timeout_s
        self.auth_hint = auth_hint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if (self.authorized is not None and path not in self.open_paths
                and not self.authorized(scope)):
            await _reply(send, 401, "unauthorized", f"missing or wrong bearer token: {self.auth_hint}")
            return
        limit = self.max_body(path)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.isdigit():
                await _reply(send, 400, "bad_request", "Content-Length must be a byte count")
                return
            if int(declared) > limit:
                await _reply(send, 413, "too_large", f"request body of {int(declared)} bytes is "
                             f"over this route's limit of {limit} bytes")
                return
        try:
            body = await asyncio.wait_for(_read_body(receive, limit), self.body_timeout_s)
        except _TooLarge:
            await _reply(send, 413, "too_large", f"request body is over this route's limit of "
                         f"{limit} bytes")
            return
        except asyncio.TimeoutError:
            await _reply(send, 408, "timeout", f"the request body did not arrive within "
                         f"{self.body_timeout_s:g} s")
            return
        if body is None:  # the client left while sending
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: blocks until the client disconnects

        await self.app(scope, replay, send)


class _TooLarge(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body (None if the client disconnected), or ``_TooLarge`` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


# -- request bodies ---------------------------------------------------------------------------------

def _bad_text(value: Any, path: str) -> str | None:
    """The path of the first string holding a lone surrogate (not encodable as UTF-8), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            found = _bad_text(k, where) or _bad_text(v, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _bad_text(v, f"{path}[{i}]")
            if found:
                return found
    return None


class StrictBody(BaseModel):
    """A request body: unknown fields, NaN/Infinity and invalid Unicode are 422s naming the field
    (JSON parsers accept ``NaN`` and ``"\\ud800"``; neither can be stored or echoed back)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any, info: ValidationInfo) -> Any:
        where = _bad_text(value, info.field_name or "")
        if where is not None:
            raise ValueError(f"'{where}' holds invalid Unicode (a lone surrogate); send UTF-8 text")
        return value


def validation_message(errors: Iterable[Any]) -> tuple[str, list[dict[str, Any]]]:
    """One line naming each bad field, and the errors without their (possibly huge) inputs."""
    clean, parts = [], []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        field = ".".join(loc) or "body"
        msg = str(e.get("msg", "invalid"))
        clean.append({"loc": list(e.get("loc", ())), "msg": msg, "type": e.get("type", "")})
        parts.append(f"'{field}': {msg}")
    return "; ".join(parts) or "invalid request body", clean


def install_error_handlers(app: FastAPI) -> None:
    """422 with ``{"error": "bad_request", "message": <one line>, "detail": [...]}`` for a bad
    body; 503 for work given up because the server drains or the client left."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        message, detail = validation_message(e.errors())
        return JSONResponse({"error": "bad_request", "message": message, "detail": detail},
                            status_code=422)

    @app.exception_handler(Draining)
    async def _draining(_: Request, e: Draining) -> JSONResponse:
        return draining_reply()

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, e: ClientGone) -> JSONResponse:  # nobody reads this reply
        return JSONResponse({"error": "client_gone", "message": "the client disconnected"},
                            status_code=503)


# -- disconnects and shutdown -----------------------------------------------------------------------

class Drain:
    """Set when the server begins shutting down: work still waiting (for a sandbox, a session slot)
    gives up at once with 503 instead of holding the shutdown up."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def start(self) -> None:
        """Safe from a signal handler or another thread."""
        self.started = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        await self._event.wait()


class ClientGone(Exception):
    """The client disconnected while its request was being served."""


class Draining(Exception):
    """The server began shutting down while this request waited."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


_background: set[asyncio.Future[Any]] = set()


def _abandon(task: asyncio.Future[T], undo: Callable[[T], Awaitable[None]] | None) -> None:
    """Cancel ``task``; should it finish anyway (it was past its last await), ``undo`` its result."""
    def done(t: asyncio.Future[T]) -> None:
        if undo is None or t.cancelled() or t.exception() is not None:
            return
        later = asyncio.ensure_future(undo(t.result()))
        _background.add(later)
        later.add_done_callback(_background.discard)

    task.cancel()
    task.add_done_callback(done)


async def unless_gone(request: Request, drain: Drain | None, work: Awaitable[T], *,
                      grace_s: float = 0.0,
                      undo: Callable[[T], Awaitable[None]] | None = None) -> T:
    """``await work``, cancelled when the client disconnects (``ClientGone``) or ``grace_s``
    seconds after the server begins draining (``Draining``, a 503 the client can read rather than
    a connection cut at the drain's deadline); ``undo`` releases a result that arrived too late."""
    if drain is not None and drain.started and not grace_s:
        raise Draining
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    draining = asyncio.ensure_future(drain.wait()) if drain is not None else None
    try:
        await asyncio.wait([task, gone, *([draining] if draining else [])],
                           return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not gone.done() and grace_s:
            await asyncio.wait([task, gone], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server's shutdown deadline passed
        _abandon(task, undo)
        raise
    finally:
        for w in (gone, draining):
            if w is not None:
                w.cancel()
    if gone.done() and not gone.cancelled():  # even if the work is done: nobody will read it
        _abandon(task, undo)
        raise ClientGone
    if task.done():
        return task.result()
    _abandon(task, undo)
    raise Draining


def draining_reply() -> JSONResponse:
    return JSONResponse({"error": "shutting_down", "message": "the server is shutting down; "
                         "retry against another server or after it restarts"}, status_code=503)


class Server(uvicorn.Server):
    """uvicorn that, on SIGTERM/SIGINT (or ``begin_drain``), sets ``drain`` at once; in-flight
    requests then get ``timeout_graceful_shutdown`` seconds before they are cancelled, and
    ``serve`` returns."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def serve(self, sockets: Any = None) -> None:
        self.drain.bind(asyncio.get_running_loop())
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self.drain.start()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, less its re-raising of the signal once the shutdown is done: that killed
        the process there (SIGTERM's default action), so the caller's ``finally`` (closing an
        engine and its worker process) never ran. The caller returns instead, and exits 0."""
        if threading.current_thread() is not threading.main_thread():  # signals: main thread only
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def begin_drain(self) -> None:
        """What a signal does, for a server run in a thread (tests, ``EnvServer``)."""
        self.drain.start()
        self.should_exit = True


def make_server(app: ASGIApp, *, host: str, port: int, drain_s: float, drain: Drain | None = None,
                log_level: str = "warning") -> Server:
    """``drain``: the app's, when it has work that waits (None: nothing to tell the app)."""
    if not drain_s > 0:
        raise ValueError(f"drain_s must be > 0 seconds, got {drain_s}")
    # uvicorn annotates the timeout as int; it only ever reaches asyncio.wait_for
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=drain_s)  # type: ignore[arg-type]
    return Server(config, drain or Drain())


def run(app: ASGIApp, *, host: str, port: int, drain_s: float, drain: Drain | None = None,
        log_level: str = "warning") -> None:
    """Serve until SIGTERM/SIGINT; then drain for at most ``drain_s`` seconds and return."""
    make_server(app, host=host, port=port, drain=drain, drain_s=drain_s, log_level=log_level).run()
