"""The environment server over HTTP: a ``SandboxPool`` behind FastAPI, and its client.

``RemoteSandbox`` implements ``looprl.protocols.Sandbox`` against this server, so the harness
cannot tell a remote sandbox from a local one. Every route but ``/v1/health`` needs
``Authorization: Bearer <token>``. A model-actionable failure (bad path, missing file) comes back
as HTTP 422 ``{"error": "tool"}`` and is raised as ``ToolError`` (with ``"kind": "path_escape"``
as ``PathEscapeError``: a path that leaves the workspace or goes through a symlink); anything
else (the sandbox crashed, the lease was released, the server is gone or refused the request) is
raised as ``SandboxError`` — infrastructure, never the model's fault.

    looprl sandbox serve --port 8377 --token s3cret --allowed-root /data/repos
    sb = await RemoteSandbox.create("http://127.0.0.1:8377", "s3cret", "/data/repos/attrs")
    r = await sb.exec("python -m pytest -q")
    await sb.close()

Routes (JSON): POST /v1/sandboxes · POST /v1/sandboxes/{id}/{exec,read,write,walk,snapshot,
heartbeat} · GET /v1/sandboxes/{id}/diff · DELETE /v1/sandboxes/{id} ·
POST /v1/snapshots/{id}/release · GET /v1/metrics · GET /v1/health.

Safe by default (``EnvServerConfig``):

- ``base_dir`` and ``venv`` (and the interpreter prefix a venv's ``pyvenv.cfg`` names) must
  resolve, symlinks followed, under an allowed root: 403 otherwise. The default root is looprl's
  home (``LOOPRL_HOME``: fetched packages, built tasks); ``--allowed-root`` replaces it. The
  sandboxes' own directory (``sandbox_root()``) is never allowed, so one lease cannot mount
  another's workspace; a venv may also use the server's own interpreter (``sys.base_prefix``).
- The token is checked from the headers before any body is read (401), bodies are capped (413),
  every field is validated (422 naming it: bad base64, NaN/Infinity or out-of-range timeouts, lone
  surrogates, unknown fields); an unknown or released lease is 404.
- Leases die with their client: each request renews its lease, ``RemoteSandbox`` sends a heartbeat
  every ``idle_timeout_s / 4``, and a lease with no request in flight and none for
  ``idle_timeout_s`` is released (a crashed or killed client frees its slot within that time, not
  after the hour-long ``lease_timeout_s``). A create whose client disconnects while queued never
  takes a slot; a command whose client disconnects is killed.
- SIGTERM: queued creates answer 503 at once, running requests get ``drain_s`` seconds, then every
  sandbox is closed and the process exits.

What this does NOT protect against: a host user who can write under an allowed root (they can swap
a symlink between the check and the mount, or plant a venv); reads of anything under the allowed
roots by any token holder (all of it can be mounted read-only into a sandbox); a token holder
leasing every slot (one shared token, no per-client quotas); large responses (``read`` and ``diff``
return what the workspace holds, bounded only by the sandbox's disk limit); anyone who can read the
traffic (plain HTTP). See ``looprl.asgi`` for the HTTP-level limits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from looprl import faults, paths
from looprl.asgi import (
    Drain,
    Guard,
    StrictBody,
    bearer,
    install_error_handlers,
    make_server,
    unless_gone,
)
from looprl.errors import InfraKind, PathEscapeError, SandboxError, ToolError
from looprl.sandbox.mounts import venv_paths
from looprl.sandbox.pool import PooledSandbox, SandboxPool
from looprl.sandbox.workspace import Snapshot, sandbox_root
from looprl.types import ExecResult, FileEntry

MAX_WALK_ENTRIES = 100_000
"""A walk lists at most this many entries (the response is built in memory)."""
MAX_SNAPSHOTS = 1024
"""Snapshots held at once (each pins a frozen layer on the host until released)."""


@dataclass(frozen=True)
class EnvServerConfig:
    """Limits of one environment server (``looprl sandbox serve`` flags)."""

    allowed_roots: tuple[str, ...] = ()
    """``base_dir`` / ``venv`` must lie under one of these; empty: looprl's home only."""
    idle_timeout_s: float = 60.0
    """A lease with no request for this long (and none running) is released: its client is gone.
    60 s: well above the 15 s heartbeat, well below the hour a dead client held a slot before."""
    max_body_bytes: int = 16 << 20
    """Largest request body (a ``write`` of ~12 MB of file content, base64-encoded)."""
    drain_s: float = 30.0
    """On SIGTERM: how long running requests may finish before they are cancelled."""

    def __post_init__(self) -> None:
        if not (self.idle_timeout_s > 0 and self.drain_s > 0 and self.max_body_bytes > 0):
            raise ValueError("EnvServerConfig needs idle_timeout_s > 0, drain_s > 0 and "
                             "max_body_bytes > 0")

    def roots(self) -> tuple[Path, ...]:
        return tuple(Path(os.path.realpath(r)) for r in self.allowed_roots or (str(paths.home()),))


PositiveS = Annotated[float, Field(gt=0)]


class CreateReq(StrictBody):
    base_dir: str = Field(min_length=1, max_length=4096)
    venv: str | None = Field(None, min_length=1, max_length=4096)
    timeout_s: PositiveS | None = None
    """Lease lifetime; at most the server's ``lease_timeout_s``."""
    snapshot_id: str | None = Field(None, max_length=128)


class ExecReq(StrictBody):
    cmd: str = Field(max_length=1 << 20)
    timeout_s: PositiveS = 60.0
    """At most the server's ``lease_timeout_s``."""
    env: dict[str, str] | None = None


class PathReq(StrictBody):
    path: str = Field(max_length=4096)
    data_b64: str = ""


class WalkReq(StrictBody):
    under: str = Field(".", max_length=4096)
    max_entries: int = Field(MAX_WALK_ENTRIES, ge=1, le=MAX_WALK_ENTRIES)


def _forbidden(msg: str) -> HTTPException:
    return HTTPException(403, msg)


def _bad(msg: str) -> HTTPException:
    return HTTPException(422, msg)


def _under(p: Path, roots: tuple[Path, ...]) -> bool:
    return any(p == r or p.is_relative_to(r) for r in roots)


def check_dirs(base_dir: str, venv: str | None, roots: tuple[Path, ...]) -> tuple[str, str | None]:
    """``base_dir`` and ``venv`` resolved (symlinks followed), or 403 outside ``roots`` (or inside
    the sandboxes' own directory), 422 when not a usable directory. A venv's interpreter prefix
    (``pyvenv.cfg``'s ``home``) is mounted too, so it must pass the same check, or be this server's
    own interpreter."""
    hint = "start the server with --allowed-root DIR covering it"
    inner = Path(os.path.realpath(sandbox_root()))
    out: list[str | None] = []
    for field, value in (("base_dir", base_dir), ("venv", venv)):
        if value is None:
            out.append(None)
            continue
        if "\0" in value or not os.path.isabs(value):
            raise _bad(f"'{field}' {value!r} must be an absolute path on the server")
        real = Path(os.path.realpath(value))
        if _under(real, (inner,)) or not _under(real, roots):
            raise _forbidden(f"'{field}' {value!r} (resolved: {real}) is outside the server's "
                             f"allowed roots {[str(r) for r in roots]}; {hint}")
        if not real.is_dir():
            raise _bad(f"'{field}' {str(real)!r} does not exist or is not a directory")
        out.append(str(real))
    if out[1] is not None:
        try:
            mounted = venv_paths(out[1])
        except SandboxError as e:
            raise _bad(str(e)) from None
        own = Path(os.path.realpath(sys.base_prefix))
        for m in mounted[1:]:
            real = Path(os.path.realpath(m))
            if real != own and (_under(real, (inner,)) or not _under(real, roots)):
                raise _forbidden(f"venv {venv!r} uses the interpreter at {real}, outside the "
                                 f"server's allowed roots; {hint}")
    return out[0] or "", out[1]


class Leases:
    """Which leases still have a client: every request renews its lease; ``reap`` releases those
    idle past ``idle_timeout_s`` with no request running (see module docstring)."""

    def __init__(self, pool: SandboxPool, idle_timeout_s: float) -> None:
        self.pool, self.idle_timeout_s = pool, idle_timeout_s
        self.seen: dict[str, float] = {}
        self.running: dict[str, int] = {}
        self.gone: OrderedDict[str, str] = OrderedDict()
        """Recently ended leases -> why (the 404 says it), bounded."""
        self.reaped_total = 0
        self.on_reap: Callable[[str], None] = lambda sid: None
        """Called with a reaped lease's id (the app releases the snapshots it made)."""

    def add(self, leased: PooledSandbox) -> None:
        self.seen[leased.id] = time.monotonic()

    def get(self, sid: str) -> PooledSandbox:
        try:
            return self.pool.get(sid)
        except SandboxError as e:
            why = self.gone.get(sid)
            raise HTTPException(404, f"no live sandbox lease {sid!r}: {why}" if why else str(e)
                                ) from None

    @contextlib.contextmanager
    def using(self, sid: str) -> Iterator[PooledSandbox]:
        leased = self.get(sid)
        self.running[sid] = self.running.get(sid, 0) + 1
        try:
            yield leased
        finally:
            self.running[sid] -= 1
            if not self.running[sid]:
                del self.running[sid]
            if sid in self.seen:
                self.seen[sid] = time.monotonic()

    def forget(self, sid: str, why: str) -> None:
        self.seen.pop(sid, None)
        self.gone[sid] = why
        while len(self.gone) > 4096:
            self.gone.popitem(last=False)

    async def reap(self) -> None:
        """Release the leases whose client went away; runs until cancelled."""
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout_s / 4))
            now = time.monotonic()
            for sid, t in list(self.seen.items()):
                if now - t < self.idle_timeout_s or self.running.get(sid):
                    continue
                self.forget(sid, f"released after {self.idle_timeout_s:g} s without a request or "
                                 "heartbeat (its client went away)")
                try:
                    leased = self.pool.get(sid)
                except SandboxError:
                    continue  # already returned
                self.reaped_total += 1
                self.on_reap(sid)
                await self.pool.release(leased)


class _EnvServer:
    """The routes' work over one pool: its leases, the snapshots they made, the drain flag."""

    def __init__(self, pool: SandboxPool, cfg: EnvServerConfig, drain: Drain | None) -> None:
        self.pool, self.cfg, self.drain = pool, cfg, drain
        self.roots = cfg.roots()
        # id -> (snapshot, the lease that made it): a reaped lease's snapshots go with it
        self.snapshots: dict[str, tuple[Snapshot, str]] = {}
        self.leases = Leases(pool, cfg.idle_timeout_s)
        self.leases.on_reap = self.drop_snapshots_of
        self.reaper: list[asyncio.Task[None]] = []

    def drop_snapshots_of(self, sid: str) -> None:
        for snap_id, (snap, owner) in list(self.snapshots.items()):
            if owner == sid:
                del self.snapshots[snap_id]
                snap.release()

    def max_s(self, field: str, value: float | None) -> None:
        if value is not None and value > self.pool.lease_timeout_s:
            raise _bad(f"'{field}' {value:g} s is over the server's lease timeout of "
                       f"{self.pool.lease_timeout_s:g} s")

    async def startup(self) -> None:
        self.reaper.append(asyncio.ensure_future(self.leases.reap()))

    async def shutdown(self) -> None:
        for task in self.reaper:
            task.cancel()
        await self.pool.close()
        for snap, _ in self.snapshots.values():
            snap.release()

    async def health(self) -> dict[str, Any]:
        h = self.pool.health()
        return {"ok": h["ok"], "detail": h["detail"]}

    async def metrics(self) -> dict[str, Any]:
        return {**self.pool.health(), "reaped_total": self.leases.reaped_total}

    async def create(self, req: CreateReq, request: Request) -> dict[str, Any]:
        self.max_s("timeout_s", req.timeout_s)
        base, venv = check_dirs(req.base_dir, req.venv, self.roots)
        snap = None
        if req.snapshot_id is not None:
            if req.snapshot_id not in self.snapshots:
                raise HTTPException(404, f"unknown snapshot {req.snapshot_id!r} (released, or made "
                                         "by a lease whose client went away)")
            snap = self.snapshots[req.snapshot_id][0]
        with faults.tagged(request.headers.get(faults.SCOPE_HEADER)):  # the attempt's faults
            sb = await unless_gone(request, self.drain,
                                   self.pool.acquire(base, venv, snapshot=snap,
                                                     timeout_s=req.timeout_s),
                                   undo=self.pool.release)
        self.leases.add(sb)
        return {"id": sb.id, "cow_backend": sb.inner.cow_backend, "tools_dir": sb.tools_dir,
                "idle_timeout_s": self.cfg.idle_timeout_s}

    async def heartbeat(self, sid: str) -> dict[str, Any]:
        with self.leases.using(sid):
            return {"idle_timeout_s": self.cfg.idle_timeout_s}

    async def exec_(self, sid: str, req: ExecReq, request: Request) -> dict[str, Any]:
        self.max_s("timeout_s", req.timeout_s)
        with self.leases.using(sid) as sb, faults.tagged(request.headers.get(faults.SCOPE_HEADER)):
            # a running command may finish during the drain; cut just before its deadline
            r = await unless_gone(request, self.drain,
                                  sb.exec(req.cmd, timeout_s=req.timeout_s, env=req.env),
                                  grace_s=max(0.1, self.cfg.drain_s - 0.5))
        return r.to_dict()

    async def read(self, sid: str, req: PathReq) -> dict[str, Any]:
        with self.leases.using(sid) as sb:
            data = await sb.read(req.path)
        return {"data_b64": base64.b64encode(data).decode()}

    async def write(self, sid: str, req: PathReq) -> dict[str, Any]:
        try:
            data = base64.b64decode(req.data_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("'data_b64' is not valid base64 (standard alphabet, padded)") from None
        with self.leases.using(sid) as sb:
            await sb.write(req.path, data)
        return {}

    async def walk(self, sid: str, req: WalkReq) -> dict[str, Any]:
        with self.leases.using(sid) as sb:
            entries = await sb.walk(req.under, max_entries=req.max_entries)
        return {"entries": [e.to_dict() for e in entries]}

    async def diff(self, sid: str) -> dict[str, Any]:
        with self.leases.using(sid) as sb:
            return {"diff": await sb.diff()}

    async def snapshot(self, sid: str) -> dict[str, Any]:
        if len(self.snapshots) >= MAX_SNAPSHOTS:
            raise HTTPException(409, f"the server holds {len(self.snapshots)} snapshots, its "
                                     "limit; release some (POST /v1/snapshots/{id}/release)")
        with self.leases.using(sid) as sb:
            snap = await sb.snapshot()
        self.snapshots[snap.id] = (snap, sid)
        return {"snapshot_id": snap.id}

    async def release_snapshot(self, snap_id: str) -> dict[str, Any]:
        if (held := self.snapshots.pop(snap_id, None)) is not None:
            held[0].release()
        return {}

    async def close(self, sid: str) -> dict[str, Any]:
        sb = self.leases.get(sid)
        self.leases.forget(sid, "closed by its client")
        await self.pool.release(sb)
        return {}


async def _tool_error(_: Request, e: ToolError) -> JSONResponse:
    escape = {"kind": "path_escape"} if isinstance(e, PathEscapeError) else {}
    return JSONResponse({"error": "tool", "message": str(e), **escape}, status_code=422)


async def _sandbox_error(_: Request, e: SandboxError) -> JSONResponse:
    return JSONResponse({"error": "sandbox", "message": str(e), "kind": e.kind.value},
                        status_code=503)


def create_app(pool: SandboxPool, token: str, cfg: EnvServerConfig | None = None,
               drain: Drain | None = None) -> FastAPI:
    """A FastAPI app serving ``pool``; requests must carry ``Bearer <token>``. ``drain``: set by
    the server on SIGTERM (``looprl.asgi.run``)."""
    if not token:
        raise ValueError("the environment server needs a non-empty bearer token")
    cfg = cfg or EnvServerConfig()
    server = _EnvServer(pool, cfg, drain)
    app = FastAPI(title="looprl environment server")
    app.add_middleware(Guard, authorized=bearer(token), open_paths={"/v1/health"},
                       max_body=lambda _path: cfg.max_body_bytes,
                       auth_hint="pass the server's --token (or LOOPRL_SANDBOX_TOKEN)")
    install_error_handlers(app)
    app.add_exception_handler(ToolError, _tool_error)  # type: ignore[arg-type]
    app.add_exception_handler(SandboxError, _sandbox_error)  # type: ignore[arg-type]
    app.state.leases = server.leases
    app.on_event("startup")(server.startup)
    app.on_event("shutdown")(server.shutdown)
    app.get("/v1/health")(server.health)
    app.get("/v1/metrics")(server.metrics)
    app.post("/v1/sandboxes")(server.create)
    app.post("/v1/sandboxes/{sid}/heartbeat")(server.heartbeat)
    app.post("/v1/sandboxes/{sid}/exec")(server.exec_)
    app.post("/v1/sandboxes/{sid}/read")(server.read)
    app.post("/v1/sandboxes/{sid}/write")(server.write)
    app.post("/v1/sandboxes/{sid}/walk")(server.walk)
    app.get("/v1/sandboxes/{sid}/diff")(server.diff)
    app.post("/v1/sandboxes/{sid}/snapshot")(server.snapshot)
    app.post("/v1/snapshots/{snap_id}/release")(server.release_snapshot)
    app.delete("/v1/sandboxes/{sid}")(server.close)
    return app


class RemoteSandbox:
    """``looprl.protocols.Sandbox`` over HTTP; build with ``await RemoteSandbox.create(...)``.

    While open it sends a heartbeat every ``idle_timeout_s / 4`` (the server says how long), so
    the server keeps its lease through long model turns and releases it soon after this client
    is gone (its process killed, its event loop closed, ``close`` never called)."""

    def __init__(self, url: str, token: str, sandbox_id: str, client: httpx.AsyncClient,
                 base_dir: str, venv: str | None, tools_dir: str):
        self.url, self.token, self.id = url.rstrip("/"), token, sandbox_id
        self.base_dir, self.venv = base_dir, venv
        self.tools_dir = tools_dir
        """The server's sandboxes' ``tools_dir`` (it says where, at the lease)."""
        self._client = client
        self._heartbeat: asyncio.Task[None] | None = None

    def _start_heartbeat(self, idle_timeout_s: float) -> None:
        self._heartbeat = asyncio.ensure_future(self._beat(max(0.05, idle_timeout_s / 4)))

    async def _beat(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._req("POST", "/heartbeat", timeout_s=max(every_s, 5.0), inject=False)
            except SandboxError:
                pass  # the next real call reports what happened to the lease

    @classmethod
    async def create(cls, url: str, token: str, base_dir: str, venv: str | None = None, *,
                     lease_timeout_s: float | None = None,
                     snapshot_id: str | None = None) -> RemoteSandbox:
        client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx.Timeout(60.0, connect=10.0))
        try:
            body = await _call(client, "POST", f"{url.rstrip('/')}/v1/sandboxes",
                               {"base_dir": str(base_dir), "venv": venv,
                                "timeout_s": lease_timeout_s, "snapshot_id": snapshot_id})
        except BaseException:
            await client.aclose()
            raise
        sb = cls(url, token, body["id"], client, str(base_dir), venv, body["tools_dir"])
        sb._start_heartbeat(float(body["idle_timeout_s"]))
        return sb

    async def _req(self, method: str, route: str, body: dict[str, Any] | None = None,
                   timeout_s: float | None = None, *, inject: bool = True) -> dict[str, Any]:
        return await _call(self._client, method, f"{self.url}/v1/sandboxes/{self.id}{route}",
                           body, timeout_s, inject=inject)

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        body = await self._req("POST", "/exec", {"cmd": cmd, "timeout_s": timeout_s,
                                                 "env": dict(env) if env else None},
                               timeout_s=timeout_s + 30.0)
        return ExecResult.from_dict(body)

    async def read(self, path: str) -> bytes:
        return base64.b64decode((await self._req("POST", "/read", {"path": path}))["data_b64"])

    async def write(self, path: str, data: bytes) -> None:
        await self._req("POST", "/write", {"path": path,
                                           "data_b64": base64.b64encode(data).decode()})

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        body = await self._req("POST", "/walk", {"under": under, "max_entries": max_entries})
        return [FileEntry.from_dict(e) for e in body["entries"]]

    async def diff(self) -> str:
        return (await self._req("GET", "/diff"))["diff"]

    async def snapshot(self) -> str:
        """Freeze the current state on the server; returns a snapshot id for ``create``."""
        return (await self._req("POST", "/snapshot"))["snapshot_id"]

    async def release_snapshot(self, snapshot_id: str) -> None:
        await _call(self._client, "POST", f"{self.url}/v1/snapshots/{snapshot_id}/release")

    async def fork(self, n: int) -> list[RemoteSandbox]:
        """``n`` remote sandboxes starting from this one's current state."""
        snap = await self.snapshot()
        try:
            return [await RemoteSandbox.create(self.url, self.token, self.base_dir, self.venv,
                                               snapshot_id=snap) for _ in range(n)]
        finally:
            await self.release_snapshot(snap)

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        try:
            await self._req("DELETE", "", inject=False)  # its failure is ignored: never injected
        except SandboxError:
            pass  # already gone (expired, server restarted): nothing left to free
        finally:
            await self._client.aclose()


async def _call(client: httpx.AsyncClient, method: str, url: str,
                body: dict[str, Any] | None = None, timeout_s: float | None = None, *,
                inject: bool = True) -> dict[str, Any]:
    scope = faults.current_scope()
    headers = {faults.SCOPE_HEADER: scope} if scope else None
    try:
        # Injected before the request is sent (a refused connection, a proxy's 503), so the
        # server never does work its client will not hear of; never into the calls whose
        # failure is ignored (heartbeat, close).
        if inject and faults.fires(InfraKind.CONNECTION_DROPPED):
            raise httpx.RemoteProtocolError(f"{faults.MARK} connection_dropped at {url}")
        if inject and faults.fires(InfraKind.ENV_SERVER_5XX):
            r = httpx.Response(503, json={"message": f"{faults.MARK} env_server_5xx at {url}"})
        else:
            r = await client.request(method, url, json=body, headers=headers, timeout=(
                timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT))
    except httpx.ReadTimeout as e:  # the server took the request and did not answer in time
        raise SandboxError(f"environment server did not answer {url} in time: {e!r}",
                           kind=InfraKind.EXEC_TIMEOUT) from e
    except httpx.HTTPError as e:
        raise SandboxError(f"environment server unreachable at {url}: {e!r}",
                           kind=InfraKind.CONNECTION_DROPPED) from e
    if r.status_code == 200:
        return r.json()
    try:
        payload = r.json()
    except ValueError:
        payload = {"message": r.text}
    msg = payload.get("message") or payload.get("detail") or r.text
    if r.status_code == 422 and payload.get("error") == "tool":
        raise PathEscapeError(msg) if payload.get("kind") == "path_escape" else ToolError(msg)
    if r.status_code == 401:
        raise SandboxError(f"environment server refused the token: {msg}; pass the server's "
                           "--token (or LOOPRL_SANDBOX_TOKEN)", kind=InfraKind.INTERNAL)
    raise SandboxError(f"environment server error {r.status_code}: {msg}", kind=_status_kind(
        r.status_code, payload.get("kind")))


def _status_kind(status: int, said: object) -> InfraKind:
    """The class of an error answer: what the server's own sandbox failure was (it says), any
    other server error an ``ENV_SERVER_5XX``, a lease it no longer holds ``SANDBOX_LOST``, and
    a request it refused a bug or a misconfiguration (``INTERNAL``)."""
    if status >= 500:
        known = {k.value for k in InfraKind}
        return InfraKind(said) if isinstance(said, str) and said in known else \
            InfraKind.ENV_SERVER_5XX
    return InfraKind.SANDBOX_LOST if status == 404 else InfraKind.INTERNAL


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EnvServer:
    """Runs the environment server (uvicorn) in a background thread; a context manager.

        with EnvServer(token="t", max_running=8, cfg=EnvServerConfig(allowed_roots=(repos,))) as srv:
            sb = await RemoteSandbox.create(srv.url, "t", base)

    Leaving it drains as SIGTERM does (``cfg.drain_s``), then closes every sandbox.
    """

    def __init__(self, token: str, *, host: str = "127.0.0.1", port: int = 0,
                 pool: SandboxPool | None = None, max_running: int = 16,
                 cfg: EnvServerConfig | None = None):
        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.pool = pool or SandboxPool(max_running=max_running)
        cfg = cfg or EnvServerConfig()
        drain = Drain()
        self.app = create_app(self.pool, token, cfg, drain)
        self.server = make_server(self.app, host=host, port=self.port, drain=drain,
                                  drain_s=cfg.drain_s)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="env-server")
        self._join_s = cfg.drain_s + 20

    def __enter__(self) -> EnvServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SandboxError(f"environment server failed to start on {self.url}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.begin_drain()
        self.thread.join(timeout=self._join_s)


def default_token() -> str:
    """``LOOPRL_SANDBOX_TOKEN`` or a fresh random token."""
    return os.environ.get("LOOPRL_SANDBOX_TOKEN") or base64.urlsafe_b64encode(os.urandom(18)).decode()
