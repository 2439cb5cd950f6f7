"""The agent behind an HTTP API for users, recording what they do with its edits.

    app = make_app({"A": engine_a, "B": engine_b}, tokenizer, FeedbackStore("fb.db"),
                   ServeConfig(token="s3cret", experiment="v7-vs-v8", split_b=0.1))
    uvicorn.run(app, port=8400)                     # or: looprl serve --model M --store fb.db

A session runs THE SAME harness training uses (``looprl.harness.agent.run_agent``, the default
tools, ``ChatFormat``) in a real sandbox (bubblewrap, copy-on-write over the repo directory, no
network): the user's repository is never written; the response carries the diff for the user's
editor to apply. The arm comes from a hash of (experiment, user) (``feedback.ab.assign_arm``).

Routes (JSON, ``Authorization: Bearer <token>`` on all but /healthz):

- ``POST /v1/sessions`` {user, prompt, repo} -> {session_id, arm, policy_version, diff, files,
  stop_reason, messages (summary), turns, latency_s}
- ``POST /v1/sessions/{id}/feedback`` {kind: kept|reverted|partially_kept|follow_up, files?, text?}
  -> {event_id, reward}
- ``GET /v1/sessions/{id}`` -> the session, its events and current reward
- ``GET /v1/ab`` -> per-arm metrics, B - A intervals and the promote/keep/rollback decision,
  over this experiment's sessions served by the arms' current policy versions
- ``POST /v1/reload`` -> re-read each arm's policy source (a policies dir: its ``current.json``)
  and swap newly promoted weights into the running engine (``Engine.update_weights``): a cycle's
  promotion goes live without a restart. Sessions record the version they started on; their
  tokens carry the exact version that sampled them.
- ``GET /healthz``

Errors: a bad request is 4xx with a message saying how to fix it (401 token, 404 unknown session,
422 bad field or repo path, 409 feedback on a failed session). Infrastructure failures (sandbox,
engine) are 503 with ``"infrastructure": true``; the session is stored with stop_reason
``infra_error`` so operators see it, and it is never scored as the model's fault.

What this does NOT protect against: ``repo`` is a path on the server, readable by the sandbox;
restrict it with ``allowed_roots``. The token is one shared secret (no per-user auth, no TLS).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from looprl.errors import ConfigError, LooprlError, PolicyError, SandboxError
from looprl.feedback.ab import ab_report, assign_arm
from looprl.feedback.signals import session_reward
from looprl.feedback.store import (
    FailedSessionError,
    FeedbackStore,
    UnknownSessionError,
    diff_files,
)
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.format import ChatFormat
from looprl.harness.tools import DEFAULT_TOOLS, make_tools
from looprl.protocols import Engine, Sandbox
from looprl.types import Grader, Message, Task, Trajectory

SandboxFactory = Callable[[str, str | None], Awaitable[Sandbox]]


async def _bwrap_sandbox(repo: str, venv: str | None) -> Sandbox:
    from looprl.sandbox import create_sandbox

    return await create_sandbox(repo, venv)


@dataclass(frozen=True)
class ServeConfig:
    """How the API serves sessions."""

    token: str
    """Bearer token every request but /healthz must carry."""
    experiment: str = "default"
    """A/B experiment name: part of the arm hash, so a new experiment reshuffles users."""
    split_b: float = 0.5
    """Share of users on arm B (when two engines are served)."""
    signal: str = "edit_outcome"
    """Reward signal (``feedback.signals.SIGNALS``) for responses and /v1/ab."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    tools: tuple[str, ...] = DEFAULT_TOOLS
    test_command: str = "python -m pytest -q"
    """What the run_tests tool runs in the user's repo."""
    venv: str | None = None
    """Python environment made visible in sandboxes (None: the system's)."""
    allowed_roots: tuple[str, ...] = ()
    """Repo paths must lie under one of these (empty: any directory on the server)."""
    max_concurrent: int = 2
    """Sessions running at once (sandboxes and decoding share the CPU)."""
    min_sessions: int = 100
    """Scored sessions per arm before /v1/ab decides anything but keep."""


class SessionReq(BaseModel):
    user: str
    prompt: str
    repo: str


class FeedbackReq(BaseModel):
    kind: str
    files: list[str] | None = None
    text: str | None = None


class InfraFailure(LooprlError):
    """A session ended on an infrastructure failure (carries the stored session id)."""

    def __init__(self, message: str, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


def summarize_messages(messages: tuple[Message, ...] | list[Message], max_chars: int = 300
                       ) -> list[dict[str, Any]]:
    """The conversation, one short record a message (role, clipped content, tool names)."""
    out = []
    for m in messages:
        rec: dict[str, Any] = {"role": m.get("role"), "content": (m.get("content") or "")[:max_chars]}
        if m.get("tool_calls"):
            rec["tool_calls"] = [c["function"]["name"] for c in m["tool_calls"]]
        if m.get("name"):
            rec["name"] = m["name"]
        out.append(rec)
    return out


def check_repo(repo: str, allowed_roots: tuple[str, ...]) -> str:
    """The absolute repo directory, or ``ConfigError`` saying what a valid one is."""
    if not repo.strip():
        raise ConfigError("'repo' is empty: pass the absolute path of a directory on the server")
    p = Path(repo).expanduser()
    if not p.is_absolute():
        raise ConfigError(f"'repo' {repo!r} must be an absolute path on the server")
    p = p.resolve()
    if not p.is_dir():
        raise ConfigError(f"'repo' {str(p)!r} is not a directory on the server")
    if allowed_roots and not any(p.is_relative_to(Path(r).resolve()) for r in allowed_roots):
        raise ConfigError(f"'repo' {str(p)!r} is outside the allowed roots {list(allowed_roots)}")
    return str(p)


class Server:
    """The state behind the routes: engines per arm, their chat formats, the store, limits."""

    def __init__(self, engines: dict[str, Engine], tokenizer: Any, store: FeedbackStore,
                 cfg: ServeConfig, *, policy_versions: dict[str, int] | None = None,
                 policy_sources: dict[str, str] | None = None,
                 sandbox_factory: SandboxFactory | None = None) -> None:
        if not engines or set(engines) - {"A", "B"} or "A" not in engines:
            raise ConfigError(f"serve needs arm 'A' (and optionally 'B'), got {sorted(engines)}")
        if not cfg.token:
            raise ConfigError("serve needs a non-empty bearer token (--token or LOOPRL_SERVE_TOKEN)")
        self.engines, self.store, self.cfg = engines, store, cfg
        self.formats = {a: ChatFormat(getattr(e, "tokenizer", None) or tokenizer)
                        for a, e in engines.items()}
        self.policy_versions = dict(policy_versions or {})
        self.policy_sources = dict(policy_sources or {})
        self._reload_lock: asyncio.Lock | None = None
        self.sandbox_factory = sandbox_factory or _bwrap_sandbox
        self._slots: asyncio.Semaphore | None = None

    def arm_for(self, user: str) -> str:
        if "B" not in self.engines:
            return "A"
        return assign_arm(user, self.cfg.experiment, self.cfg.split_b)

    def version_of(self, arm: str) -> int:
        return self.policy_versions.get(arm, self.engines[arm].policy_version)

    async def run_session(self, req: SessionReq) -> dict[str, Any]:
        """Run the agent for one request and store the session (raises ``InfraFailure``)."""
        if not req.user.strip() or not req.prompt.strip():
            raise ConfigError("'user' and 'prompt' must be non-empty strings")
        repo = check_repo(req.repo, self.cfg.allowed_roots)
        arm, sid = self.arm_for(req.user), uuid.uuid4().hex
        version = self.version_of(arm)
        task = Task(id=f"serve-{sid}", repo=repo, prompt=req.prompt,
                    grader=Grader(self.cfg.test_command), venv=self.cfg.venv)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.cfg.max_concurrent)
        t0 = time.monotonic()
        traj: Trajectory | None = None
        try:
            async with self._slots:
                traj = await self._run_agent(task, arm, sid)
        finally:  # stored even when the sandbox never started (trajectory None = infra_error)
            await asyncio.to_thread(self.store.add_session, user=req.user, arm=arm,
                                    policy_version=version, prompt=req.prompt, repo=repo,
                                    trajectory=traj, latency_s=time.monotonic() - t0,
                                    session_id=sid, experiment=self.cfg.experiment)
        assert traj is not None  # _run_agent returned (it raises InfraFailure otherwise)
        latency = time.monotonic() - t0
        if traj.is_infra_error:
            raise InfraFailure(f"the agent run failed for infrastructure reasons: {traj.error}", sid)
        return {"session_id": sid, "arm": arm, "policy_version": version, "diff": traj.diff,
                "files": list(diff_files(traj.diff)),
                "stop_reason": traj.stop_reason.value, "turns": traj.counters.turns,
                "tool_calls": traj.counters.tool_calls, "latency_s": round(latency, 3),
                "final": traj.metadata.get("finish_summary") or "",
                "messages": summarize_messages(traj.messages)}

    async def _run_agent(self, task: Task, arm: str, sid: str) -> Trajectory:
        try:
            sandbox = await self.sandbox_factory(task.repo, task.venv)
        except SandboxError as e:
            raise InfraFailure(f"could not start a sandbox: {e}", sid) from None
        try:
            tools = make_tools(self.cfg.tools, test_command=self.cfg.test_command)
            return await run_agent(task, sandbox, self.engines[arm], self.formats[arm], tools,
                                   self.cfg.agent, group_id=sid, trajectory_id=sid)
        finally:
            try:
                await sandbox.close()
            except SandboxError:
                pass  # the run is already recorded; a leaked workspace is the janitor's

    async def reload(self) -> dict[str, Any]:
        """Swap in each arm's newly promoted weights; returns arm -> {version, changed}."""
        from looprl.feedback.cycle import read_policy
        from looprl.models.loading import load_model

        self._reload_lock = self._reload_lock or asyncio.Lock()
        out: dict[str, Any] = {}
        async with self._reload_lock:
            for arm, src in self.policy_sources.items():
                ref = read_policy(src)
                changed = ref.version != self.version_of(arm)
                if changed:
                    lm = await asyncio.to_thread(load_model, ref.path, "float32")
                    await self.engines[arm].update_weights(lm.model.state_dict(), ref.version)
                    self.policy_versions[arm] = ref.version
                out[arm] = {"version": ref.version, "path": str(ref.path), "changed": changed}
        return out

    def feedback(self, sid: str, req: FeedbackReq) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        if req.files is not None:
            payload["files"] = req.files
        if req.text is not None:
            payload["text"] = req.text
        ev = self.store.add_event(sid, req.kind, payload)
        return {"event_id": ev.id, "session_id": sid, "kind": ev.kind,
                "reward": self.reward_of(sid)}

    def reward_of(self, sid: str) -> dict[str, Any] | None:
        s = self.store.session(sid, with_trajectory=False)
        rb = session_reward(s, self.store.events(sid), self.cfg.signal)
        return None if rb is None else rb.to_dict()

    def describe(self, sid: str) -> dict[str, Any]:
        s = self.store.session(sid, with_trajectory=False)
        return {"session_id": s.id, "user": s.user, "arm": s.arm,
                "policy_version": s.policy_version, "prompt": s.prompt, "repo": s.repo,
                "diff": s.diff, "files": list(s.files), "stop_reason": s.stop_reason,
                "latency_s": s.latency_s, "created_at": s.created_at,
                "events": [{"id": e.id, "kind": e.kind, "payload": e.payload,
                            "created_at": e.created_at} for e in self.store.events(sid)],
                "reward": self.reward_of(sid)}

    def ab(self) -> dict[str, Any]:
        versions = {a: self.version_of(a) for a in self.engines}
        rep = ab_report(self.store, signal=self.cfg.signal, experiment=self.cfg.experiment,
                        policy_versions=versions, min_sessions=self.cfg.min_sessions)
        return {"experiment": self.cfg.experiment, "split_b": self.cfg.split_b,
                "policy_versions": versions, **rep.to_dict()}


def make_app(engines: dict[str, Engine], tokenizer: Any, store: FeedbackStore,
             cfg: ServeConfig, *, policy_versions: dict[str, int] | None = None,
             policy_sources: dict[str, str] | None = None,
             sandbox_factory: SandboxFactory | None = None) -> FastAPI:
    """The FastAPI app: ``engines`` by arm ("A", optionally "B"); ``tokenizer`` renders the chat
    format for engines that expose none; ``policy_versions`` labels each arm's sessions (default:
    the engine's own ``policy_version``); ``policy_sources`` (arm -> model or policies dir) is
    what ``POST /v1/reload`` re-reads."""
    srv = Server(engines, tokenizer, store, cfg, policy_versions=policy_versions,
                 policy_sources=policy_sources, sandbox_factory=sandbox_factory)
    app = FastAPI(title="looprl agent server")
    app.state.server = srv

    def auth(request: Request) -> None:
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {cfg.token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token: send "
                                     "'Authorization: Bearer <token>' (the server's --token)")

    @app.exception_handler(UnknownSessionError)
    async def _unknown(_: Request, e: UnknownSessionError) -> JSONResponse:
        return JSONResponse({"error": "not_found", "message": str(e)}, status_code=404)

    @app.exception_handler(FailedSessionError)
    async def _failed(_: Request, e: FailedSessionError) -> JSONResponse:
        return JSONResponse({"error": "conflict", "message": str(e)}, status_code=409)

    @app.exception_handler(ConfigError)
    async def _bad(_: Request, e: ConfigError) -> JSONResponse:
        return JSONResponse({"error": "bad_request", "message": str(e)}, status_code=422)

    @app.exception_handler(InfraFailure)
    async def _infra(_: Request, e: InfraFailure) -> JSONResponse:
        return JSONResponse({"error": "infrastructure", "infrastructure": True, "message": str(e),
                             "session_id": e.session_id}, status_code=503)

    @app.exception_handler(SandboxError)
    @app.exception_handler(PolicyError)
    async def _infra_raw(_: Request, e: LooprlError) -> JSONResponse:
        return JSONResponse({"error": "infrastructure", "infrastructure": True,
                             "message": f"{type(e).__name__}: {e}"}, status_code=503)

    guard = [Depends(auth)]

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "arms": {a: srv.version_of(a) for a in srv.engines},
                "pid": os.getpid()}

    @app.post("/v1/sessions", dependencies=guard)
    async def create_session(req: SessionReq) -> dict[str, Any]:
        return await srv.run_session(req)

    @app.post("/v1/sessions/{sid}/feedback", dependencies=guard)
    async def feedback(sid: str, req: FeedbackReq) -> dict[str, Any]:
        return await asyncio.to_thread(srv.feedback, sid, req)

    @app.get("/v1/sessions/{sid}", dependencies=guard)
    async def get_session(sid: str) -> dict[str, Any]:
        return await asyncio.to_thread(srv.describe, sid)

    @app.post("/v1/reload", dependencies=guard)
    async def reload() -> dict[str, Any]:
        return await srv.reload()

    @app.get("/v1/ab", dependencies=guard)
    async def ab() -> dict[str, Any]:
        return await asyncio.to_thread(srv.ab)

    return app
