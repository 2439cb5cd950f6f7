"""The environment server over HTTP: a ``SandboxPool`` behind FastAPI, and its client.

``RemoteSandbox`` implements ``looprl.protocols.Sandbox`` against this server, so the harness
cannot tell a remote sandbox from a local one. Every route but ``/v1/health`` needs
``Authorization: Bearer <token>``. A model-actionable failure (bad path, missing file) comes back
as HTTP 422 and is raised as ``ToolError``; anything else (the sandbox crashed, the lease expired,
the server is gone) is raised as ``SandboxError`` — infrastructure, never the model's fault.

    looprl sandbox serve --port 8377 --token s3cret            # or EnvServer(...) in-process
    sb = await RemoteSandbox.create("http://127.0.0.1:8377", "s3cret", "/data/repos/attrs")
    r = await sb.exec("python -m pytest -q")
    await sb.close()

Routes (JSON): POST /v1/sandboxes · POST /v1/sandboxes/{id}/{exec,read,write,walk,snapshot}
· GET /v1/sandboxes/{id}/diff · DELETE /v1/sandboxes/{id} · POST /v1/snapshots/{id}/release
· GET /v1/metrics · GET /v1/health.
"""

from __future__ import annotations

import base64
import hmac
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from looprl.errors import SandboxError, ToolError
from looprl.sandbox.pool import SandboxPool
from looprl.sandbox.workspace import Snapshot
from looprl.types import ExecResult, FileEntry


class CreateReq(BaseModel):
    base_dir: str
    venv: str | None = None
    timeout_s: float | None = None
    snapshot_id: str | None = None


class ExecReq(BaseModel):
    cmd: str
    timeout_s: float = 60.0
    env: dict[str, str] | None = None


class PathReq(BaseModel):
    path: str
    data_b64: str = ""


class WalkReq(BaseModel):
    under: str = "."
    max_entries: int = 100_000


def create_app(pool: SandboxPool, token: str) -> FastAPI:
    """A FastAPI app serving ``pool``; requests must carry ``Bearer <token>``."""
    if not token:
        raise ValueError("the environment server needs a non-empty bearer token")
    app = FastAPI(title="looprl environment server")
    snapshots: dict[str, Snapshot] = {}

    def auth(request: Request) -> None:
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token")

    @app.exception_handler(ToolError)
    async def _tool_error(_: Request, e: ToolError) -> JSONResponse:
        return JSONResponse({"error": "tool", "message": str(e)}, status_code=422)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, e: SandboxError) -> JSONResponse:
        return JSONResponse({"error": "sandbox", "message": str(e)}, status_code=503)

    guard = [Depends(auth)]

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        h = pool.health()
        return {"ok": h["ok"], "detail": h["detail"]}

    @app.get("/v1/metrics", dependencies=guard)
    async def metrics() -> dict[str, Any]:
        return pool.health()

    @app.post("/v1/sandboxes", dependencies=guard)
    async def create(req: CreateReq) -> dict[str, Any]:
        snap = None
        if req.snapshot_id is not None:
            snap = snapshots.get(req.snapshot_id)
            if snap is None:
                raise SandboxError(f"unknown snapshot {req.snapshot_id!r}")
        sb = await pool.acquire(req.base_dir, req.venv, snapshot=snap, timeout_s=req.timeout_s)
        return {"id": sb.id, "cow_backend": sb.inner.cow_backend, "tools_dir": sb.tools_dir}

    @app.post("/v1/sandboxes/{sid}/exec", dependencies=guard)
    async def exec_(sid: str, req: ExecReq) -> dict[str, Any]:
        r = await pool.get(sid).exec(req.cmd, timeout_s=req.timeout_s, env=req.env)
        return r.to_dict()

    @app.post("/v1/sandboxes/{sid}/read", dependencies=guard)
    async def read(sid: str, req: PathReq) -> dict[str, Any]:
        data = await pool.get(sid).read(req.path)
        return {"data_b64": base64.b64encode(data).decode()}

    @app.post("/v1/sandboxes/{sid}/write", dependencies=guard)
    async def write(sid: str, req: PathReq) -> dict[str, Any]:
        await pool.get(sid).write(req.path, base64.b64decode(req.data_b64))
        return {}

    @app.post("/v1/sandboxes/{sid}/walk", dependencies=guard)
    async def walk(sid: str, req: WalkReq) -> dict[str, Any]:
        entries = await pool.get(sid).walk(req.under, max_entries=req.max_entries)
        return {"entries": [e.to_dict() for e in entries]}

    @app.get("/v1/sandboxes/{sid}/diff", dependencies=guard)
    async def diff(sid: str) -> dict[str, Any]:
        return {"diff": await pool.get(sid).diff()}

    @app.post("/v1/sandboxes/{sid}/snapshot", dependencies=guard)
    async def snapshot(sid: str) -> dict[str, Any]:
        snap = await pool.get(sid).snapshot()
        snapshots[snap.id] = snap
        return {"snapshot_id": snap.id}

    @app.post("/v1/snapshots/{snap_id}/release", dependencies=guard)
    async def release_snapshot(snap_id: str) -> dict[str, Any]:
        snap = snapshots.pop(snap_id, None)
        if snap is not None:
            snap.release()
        return {}

    @app.delete("/v1/sandboxes/{sid}", dependencies=guard)
    async def close(sid: str) -> dict[str, Any]:
        await pool.get(sid).close()
        return {}

    @app.on_event("shutdown")
    async def _shutdown() -> None:
        await pool.close()
        for snap in snapshots.values():
            snap.release()

    return app


class RemoteSandbox:
    """``looprl.protocols.Sandbox`` over HTTP; build with ``await RemoteSandbox.create(...)``."""

    def __init__(self, url: str, token: str, sandbox_id: str, client: httpx.AsyncClient,
                 base_dir: str, venv: str | None, tools_dir: str):
        self.url, self.token, self.id = url.rstrip("/"), token, sandbox_id
        self.base_dir, self.venv = base_dir, venv
        self.tools_dir = tools_dir
        """The server's sandboxes' ``tools_dir`` (it says where, at the lease)."""
        self._client = client

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
        return cls(url, token, body["id"], client, str(base_dir), venv, body["tools_dir"])

    async def _req(self, method: str, route: str, body: dict[str, Any] | None = None,
                   timeout_s: float | None = None) -> dict[str, Any]:
        return await _call(self._client, method, f"{self.url}/v1/sandboxes/{self.id}{route}",
                           body, timeout_s)

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
        try:
            await self._req("DELETE", "")
        except SandboxError:
            pass  # already gone (expired, server restarted): nothing left to free
        finally:
            await self._client.aclose()


async def _call(client: httpx.AsyncClient, method: str, url: str,
                body: dict[str, Any] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    try:
        r = await client.request(method, url, json=body,
                                 timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
    except httpx.HTTPError as e:
        raise SandboxError(f"environment server unreachable at {url}: {e!r}") from e
    if r.status_code == 200:
        return r.json()
    try:
        payload = r.json()
    except ValueError:
        payload = {"message": r.text}
    msg = payload.get("message") or payload.get("detail") or r.text
    if r.status_code == 422 and payload.get("error") == "tool":
        raise ToolError(msg)
    if r.status_code == 401:
        raise SandboxError(f"environment server refused the token: {msg}; pass the server's "
                           "--token (or LOOPRL_SANDBOX_TOKEN)")
    raise SandboxError(f"environment server error {r.status_code}: {msg}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EnvServer:
    """Runs the environment server (uvicorn) in a background thread; a context manager.

        with EnvServer(token="t", max_running=8) as srv:
            sb = await RemoteSandbox.create(srv.url, "t", base)
    """

    def __init__(self, token: str, *, host: str = "127.0.0.1", port: int = 0,
                 pool: SandboxPool | None = None, max_running: int = 16):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.pool = pool or SandboxPool(max_running=max_running)
        config = uvicorn.Config(create_app(self.pool, token), host=host, port=self.port,
                                log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="env-server")

    def __enter__(self) -> EnvServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SandboxError(f"environment server failed to start on {self.url}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def default_token() -> str:
    """``LOOPRL_SANDBOX_TOKEN`` or a fresh random token."""
    return os.environ.get("LOOPRL_SANDBOX_TOKEN") or base64.urlsafe_b64encode(os.urandom(18)).decode()
