"""The agent behind an HTTP API for users, recording what they do with its edits.

    app = make_app({"A": engine_a, "B": engine_b}, tokenizer, FeedbackStore("fb.db"),
                   ServeConfig(token="s3cret", experiment="v7-vs-v8", split_b=0.1))
    uvicorn.run(app, port=8400)                     # or: looprl serve --model M --store fb.db

A session runs THE SAME harness training uses (``looprl.harness.agent.run_agent``, the default
tools, ``ChatFormat``) in a real sandbox (bubblewrap, copy-on-write over the repo directory, no
network): the user's repository is never written; the response carries the diff for the user's
editor to apply. The arm comes from a hash of (experiment, user) (``feedback.ab.assign_arm``).

Following a policies dir (``make_app(..., policies=DIR, candidate_b=True)``, ``ServeConfig.watch_s``;
``looprl serve --model DIR`` or ``--policies DIR``): a background task reloads every ``watch_s``
seconds, so what ``looprl feedback cycle`` (or ``feedback.loop``) writes goes live by itself:

- ``DIR/current.json`` (``cycle.promote``): arm A's weights are swapped in
  (``Engine.update_weights``); before the file exists arm A serves its own source (``--model``).
- ``DIR/candidate.json`` (``cycle.offer_candidate``: version, experiment, split_b): engine B (built
  at start-up on A's weights, no traffic until then) takes the candidate's weights, then users are
  split by the pointer's experiment and split_b; once it is withdrawn every new session is on A.
  A session keeps the arm, engine, version and experiment it started with, whatever a reload does
  meanwhile (a weight swap mid-session is recorded per token by the engine).
- A pointer that cannot be read (a half-written dir, bad JSON) is logged in one line and retried at
  the next tick; the server keeps serving what it served.

A fixed arm B (``engines["B"]`` with its own ``policy_sources["B"]``, ``--model-b``) is split by
``ServeConfig.experiment`` and ``split_b`` and ignores ``candidate.json``.

Routes (JSON, ``Authorization: Bearer <token>`` on all but /healthz):

- ``POST /v1/sessions`` {user, prompt, repo, venv?} -> {session_id, arm, policy_version, experiment, diff,
  files, stop_reason, messages (summary), turns, latency_s}
- ``POST /v1/sessions/{id}/feedback`` {event_id, kind: kept|reverted|partially_kept|follow_up,
  files?, text?, turn?, at?} -> {event_id, duplicate, replays, reward}. ``event_id`` is the client's id
  for the user's action (e.g. a uuid4 made when it happened), resent unchanged on retry: a replay
  is answered like the original and counted, never stored twice. ``at`` (unix seconds) is when the
  user acted; outcomes follow ``at``, not arrival (``feedback.signals``).
- ``GET /v1/sessions/{id}`` -> the session, its events and current reward
- ``GET /v1/stats`` -> {sessions, events, replays_ignored}
- ``GET /v1/ab`` -> per-arm metrics, B - A intervals and the promote/keep/rollback decision,
  over the live experiment's sessions served by the live arms' current policy versions
- ``POST /v1/reload`` -> what the watch does, now: re-read each arm's policy source (a policies
  dir: its ``current.json`` and ``candidate.json``) and swap newly promoted or offered weights into
  the running engines -> {A: {version, path, changed}, B: {...} (when B has a source or a
  candidate), arms, experiment, split_b, candidate}. Sessions record the version they started
  on; their tokens carry the exact version that sampled them.
- ``GET /healthz`` -> {ok, arms: live arm -> policy version, experiment, split_b, candidate
  (whether a candidate is on B), pid}

Errors: a bad request is 4xx with a message saying how to fix it (401 token, checked before the
body is read; 403 repo outside the allowed roots; 404 unknown session; 409 feedback on a failed
session or an ``event_id`` reused for another event; 413 body or text over its limit; 422 bad
field, NaN, invalid Unicode or unknown field). Infrastructure failures (sandbox, engine) are 503
with ``"infrastructure": true``; the session is stored with stop_reason ``infra_error`` so
operators see it, and it is never scored as the model's fault. A session whose client disconnects
is cancelled (stored as ``infra_error``). SIGTERM: queued sessions answer 503 at once, running ones
get ``drain_s`` seconds.

What this does NOT protect against: ``repo`` is a path on the server that the agent reads; any
token holder can run the agent over any directory under ``allowed_roots`` (default: looprl's home
only) and read the result. The token is one shared secret (no per-user auth, no quotas: one client
can occupy every session slot; no TLS). ``user`` is whatever the client says (arm assignment and
A/B metrics trust it). See ``looprl.asgi`` for the HTTP-level limits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from looprl import paths
from looprl.asgi import Drain, Guard, StrictBody, bearer, install_error_handlers, unless_gone
from looprl.chat import ChatFormat
from looprl.diffs import changed_files
from looprl.errors import ConfigError, LooprlError, PolicyError, SandboxError
from looprl.feedback.ab import ab_report, assign_arm
from looprl.feedback.follow_ups import SERVE_TEST_COMMAND
from looprl.feedback.signals import session_reward
from looprl.feedback.store import (
    EventConflictError,
    FailedSessionError,
    FeedbackStore,
    FeedbackTooLargeError,
    UnknownSessionError,
)
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.tools import DEFAULT_TOOLS, make_tools
from looprl.protocols import Engine, Sandbox
from looprl.types import Grader, Message, Task, Trajectory

if TYPE_CHECKING:
    from looprl.feedback.policies import PolicyRef

SandboxFactory = Callable[[str, str | None], Awaitable[Sandbox]]
log = logging.getLogger(__name__)


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
    test_command: str = SERVE_TEST_COMMAND
    """What the run_tests tool runs in the user's repo."""
    venv: str | None = None
    """Python environment made visible in sandboxes (None: the system's)."""
    allowed_roots: tuple[str, ...] = ()
    """Repo paths must lie under one of these (empty: looprl's home, ``LOOPRL_HOME``, only)."""
    drain_s: float = 60.0
    """On SIGTERM: how long running sessions may finish before they are cancelled."""
    max_concurrent: int = 2
    """Sessions running at once (sandboxes and decoding share the CPU)."""
    min_sessions: int = 100
    """Scored sessions per arm before /v1/ab decides anything but keep."""
    watch_s: float = 0.0
    """Re-read the policy sources (``Server.reload``) every this many seconds while serving, so a
    promotion or a candidate goes live by itself (0: only on ``POST /v1/reload``;
    ``looprl serve --watch`` defaults to 5)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.watch_s < float("inf"):
            raise ConfigError(f"watch_s must be >= 0 seconds (0 = off), got {self.watch_s}")


MAX_PROMPT_CHARS = 100_000
"""A session's prompt, in characters (a task description with pasted logs fits)."""
BODY_LIMITS = {"sessions": 1 << 20, "feedback": 256 << 10, "other": 64 << 10}
"""Request body bytes by route: a prompt of MAX_PROMPT_CHARS, a follow-up of
``store.MAX_TEXT_CHARS`` (JSON-escaped), and anything else."""


def body_limit(path: str) -> int:
    if path == "/v1/sessions":
        return BODY_LIMITS["sessions"]
    return BODY_LIMITS["feedback" if path.endswith("/feedback") else "other"]


class SessionReq(StrictBody):
    user: str = Field(max_length=256)
    prompt: str = Field(max_length=MAX_PROMPT_CHARS)
    repo: str = Field(max_length=4096)
    venv: str | None = Field(None, max_length=4096)
    """The Python environment of the repo (a venv directory on the server, under the allowed
    roots) that the agent's tools run in; default: the server's ``--venv``."""


class FeedbackReq(StrictBody):
    event_id: str = Field(description="the client's id for this user action; resend it on retry")
    kind: str = Field(max_length=32)
    files: list[str] | None = Field(None, max_length=10_000)
    text: str | None = None
    at: float | None = None
    """When the user acted (unix seconds); default: when the event arrives."""
    turn: int | None = None
    """A follow-up's: the agent reply it answers (1-based, of the session's ``turns``);
    default: the last."""


class OutsideRootsError(ConfigError):
    """A repo path outside the server's allowed roots (403)."""


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


def check_repo(repo: str, allowed_roots: tuple[str, ...], field: str = "repo") -> str:
    """The directory ``repo`` (a request's ``field``) with symlinks resolved;
    ``OutsideRootsError`` when it lies outside the allowed roots (empty: looprl's home) or among
    the sandboxes' own workspaces, checked before whether it exists so that nothing outside is
    revealed; ``ConfigError`` for the rest."""
    from looprl.sandbox.workspace import sandbox_root

    if not repo.strip():
        raise ConfigError(f"'{field}' is empty: pass the absolute path of a directory on the server")
    if "\0" in repo or not os.path.isabs(repo):
        raise ConfigError(f"'{field}' {repo!r} must be an absolute path on the server")
    p = Path(os.path.realpath(repo))
    roots = [Path(os.path.realpath(r)) for r in allowed_roots or (str(paths.home()),)]
    workspaces = Path(os.path.realpath(sandbox_root()))
    if p.is_relative_to(workspaces) or not any(p.is_relative_to(r) for r in roots):
        raise OutsideRootsError(f"'{field}' {repo!r} is outside the allowed roots "
                                f"{[str(r) for r in roots]}; start the server with "
                                "--allowed-root DIR covering it")
    if not p.is_dir():
        raise ConfigError(f"'{field}' {str(p)!r} is not a directory on the server")
    return str(p)


@dataclass(frozen=True)
class Offer:
    """A candidate live on arm B (from the policies dir's ``candidate.json``)."""

    version: int
    experiment: str
    split_b: float


class Server:
    """The state behind the routes: engines per arm, their chat formats, the store, limits."""

    def __init__(self, engines: dict[str, Engine], tokenizer: Any, store: FeedbackStore,
                 cfg: ServeConfig, *, policy_versions: dict[str, int] | None = None,
                 policy_sources: dict[str, str] | None = None, policies: str | None = None,
                 candidate_b: bool = False, sandbox_factory: SandboxFactory | None = None) -> None:
        if not engines or set(engines) - {"A", "B"} or "A" not in engines:
            raise ConfigError(f"serve needs arm 'A' (and optionally 'B'), got {sorted(engines)}")
        if not cfg.token:
            raise ConfigError("serve needs a non-empty bearer token (--token or LOOPRL_SERVE_TOKEN)")
        if candidate_b and (policies is None or "B" not in engines
                            or "B" in (policy_sources or {})):
            raise ConfigError("candidate_b needs a policies dir and an engine B without a fixed "
                              "policy source (drop --model-b to A/B the dir's candidate.json)")
        self.engines, self.store, self.cfg = engines, store, cfg
        self.formats = {a: ChatFormat(getattr(e, "tokenizer", None) or tokenizer)
                        for a, e in engines.items()}
        self.policy_versions = dict(policy_versions or {})
        self.policy_sources = dict(policy_sources or {})
        self.policies = policies
        """Arm A follows this dir's ``current.json`` once it exists (before: its own source)."""
        self.candidate_b = candidate_b
        """Arm B serves the policies dir's ``candidate.json``, and gets no traffic without one."""
        self.offer: Offer | None = None
        self._reload_lock: asyncio.Lock | None = None
        self.sandbox_factory = sandbox_factory or _bwrap_sandbox
        self._slots: asyncio.Semaphore | None = None
        self.drain = Drain()
        """Set on SIGTERM by the server running the app (``looprl.asgi.make_server``)."""

    @property
    def live_arms(self) -> tuple[str, ...]:
        """The arms new sessions may land on."""
        return ("A", "B") if "B" in self.engines and (not self.candidate_b or self.offer) else ("A",)

    @property
    def experiment(self) -> str:
        """The live A/B experiment: the offered candidate's, else the configured one."""
        return self.offer.experiment if self.offer else self.cfg.experiment

    @property
    def split_b(self) -> float:
        """The live share of users on B: the offered candidate's, the configured one for a fixed
        B, 0 when only A is live."""
        if self.offer:
            return self.offer.split_b
        return self.cfg.split_b if "B" in self.live_arms else 0.0

    def arm_for(self, user: str) -> str:
        if "B" not in self.live_arms:
            return "A"
        return assign_arm(user, self.experiment, self.split_b)

    def version_of(self, arm: str) -> int:
        return self.policy_versions.get(arm, self.engines[arm].policy_version)

    def live(self) -> dict[str, Any]:
        """Which arms take new sessions, their versions, and the experiment they are split by."""
        return {"arms": {a: self.version_of(a) for a in self.live_arms},
                "experiment": self.experiment, "split_b": self.split_b,
                "candidate": self.offer is not None}

    async def run_session(self, req: SessionReq, request: Request) -> dict[str, Any]:
        """Run the agent for one request and store the session (raises ``InfraFailure``; gives
        up, unstored, while queued when ``request``'s client leaves or the server drains)."""
        if not req.user.strip() or not req.prompt.strip():
            raise ConfigError("'user' and 'prompt' must be non-empty strings")
        repo = check_repo(req.repo, self.cfg.allowed_roots)
        venv = self.cfg.venv
        if req.venv is not None:
            venv = check_repo(req.venv, self.cfg.allowed_roots, "venv")
            if not (Path(venv) / "bin").is_dir():
                raise ConfigError(f"'venv' {req.venv!r} has no bin/ directory: pass the root of "
                                  "a Python environment (the directory holding pyvenv.cfg)")
        # arm, version and experiment are read together (no await between): a reload cannot
        # split them; the session keeps its arm's engine even if the candidate is withdrawn
        arm, sid = self.arm_for(req.user), uuid.uuid4().hex
        version, experiment = self.version_of(arm), self.experiment
        task = Task(id=f"serve-{sid}", repo=repo, prompt=req.prompt,
                    grader=Grader(self.cfg.test_command), venv=venv)
        slots = self._slots = self._slots or asyncio.Semaphore(self.cfg.max_concurrent)

        async def give_back(_: bool) -> None:
            slots.release()

        await unless_gone(request, self.drain, slots.acquire(), undo=give_back)
        t0 = time.monotonic()
        traj: Trajectory | None = None
        try:  # a session cut by its client leaving or by the drain's deadline is stored unscored
            traj = await unless_gone(request, self.drain, self._run_agent(task, arm, sid),
                                     grace_s=max(0.1, self.cfg.drain_s - 0.5))
        finally:  # stored even when the sandbox never started (trajectory None = infra_error)
            slots.release()
            await asyncio.to_thread(self.store.add_session, user=req.user, arm=arm,
                                    policy_version=version, prompt=req.prompt, repo=repo,
                                    trajectory=traj, latency_s=time.monotonic() - t0,
                                    session_id=sid, experiment=experiment)
        assert traj is not None  # _run_agent returned (it raises InfraFailure otherwise)
        latency = time.monotonic() - t0
        if traj.is_infra_error:
            raise InfraFailure(f"the agent run failed for infrastructure reasons: {traj.error}", sid)
        return {"session_id": sid, "arm": arm, "policy_version": version,
                "experiment": experiment, "diff": traj.diff,
                "files": list(changed_files(traj.diff)),
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
        """Swap in each arm's newly promoted (or offered) weights; returns arm -> {version, path,
        changed} and ``live()``. Raises when a pointer cannot be read (nothing half-applied:
        an arm changes only once its engine holds the new weights)."""
        from looprl.feedback.policies import POINTER, read_candidate, read_policy

        self._reload_lock = self._reload_lock or asyncio.Lock()
        out: dict[str, Any] = {}
        async with self._reload_lock:
            sources = dict(self.policy_sources)
            if self.policies is not None and (Path(self.policies) / POINTER).is_file():
                sources["A"] = self.policies
            for arm, src in sources.items():
                out[arm] = await self._swap(arm, read_policy(src))
            if self.candidate_b:
                assert self.policies is not None
                offered = read_candidate(self.policies)
                if offered is None:
                    self.offer = None  # assignment stops; running B sessions keep B's engine
                else:
                    ref, experiment, split_b = offered
                    out["B"] = await self._swap("B", ref)
                    self.offer = Offer(ref.version, experiment, split_b)
        return {**out, **self.live()}

    async def _swap(self, arm: str, ref: PolicyRef) -> dict[str, Any]:
        from looprl.models.loading import load_model

        changed = ref.version != self.version_of(arm)
        if changed:
            lm = await asyncio.to_thread(load_model, ref.path, "float32")
            await self.engines[arm].update_weights(lm.model.state_dict(), ref.version)
            self.policy_versions[arm] = ref.version
        return {"version": ref.version, "path": str(ref.path), "changed": changed}

    async def watch(self, every_s: float) -> None:
        """``reload`` every ``every_s`` seconds until cancelled; a failure (a half-written dir, a
        bad pointer) is logged in one line and retried at the next tick."""
        last = ""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.reload()
                last = ""
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 -- whatever a pointer holds, keep serving
                msg = f"{type(e).__name__}: {e}".replace("\n", " ")
                if msg != last:  # once per distinct failure, not every tick
                    log.warning("policy reload failed (retrying every %g s): %s", every_s, msg)
                last = msg

    def feedback(self, sid: str, req: FeedbackReq) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        if req.files is not None:
            payload["files"] = req.files
        if req.text is not None:
            payload["text"] = req.text
        if req.turn is not None:
            payload["turn"] = req.turn
        rec = self.store.add_event(sid, req.kind, payload, event_id=req.event_id, at=req.at)
        ev = rec.event
        return {"event_id": ev.client_id, "duplicate": rec.duplicate, "replays": ev.replays,
                "session_id": sid, "kind": ev.kind, "at": ev.at, "reward": self.reward_of(sid)}

    def reward_of(self, sid: str) -> dict[str, Any] | None:
        s = self.store.session(sid, with_trajectory=False)
        rb = session_reward(s, self.store.events(sid), self.cfg.signal)
        return None if rb is None else rb.to_dict()

    def describe(self, sid: str) -> dict[str, Any]:
        s = self.store.session(sid, with_trajectory=False)
        return {"session_id": s.id, "user": s.user, "arm": s.arm,
                "policy_version": s.policy_version, "experiment": s.experiment,
                "prompt": s.prompt, "repo": s.repo,
                "diff": s.diff, "files": list(s.files), "stop_reason": s.stop_reason,
                "latency_s": s.latency_s, "created_at": s.created_at,
                "events": [{"event_id": e.client_id, "kind": e.kind, "payload": e.payload,
                            "at": e.at, "created_at": e.created_at, "sentiment": e.sentiment,
                            "replays": e.replays} for e in self.store.events(sid)],
                "reward": self.reward_of(sid)}

    def ab(self) -> dict[str, Any]:
        versions = {a: self.version_of(a) for a in self.live_arms}
        experiment = self.experiment
        rep = ab_report(self.store, signal=self.cfg.signal, experiment=experiment,
                        policy_versions=versions, min_sessions=self.cfg.min_sessions)
        return {"experiment": experiment, "split_b": self.split_b,
                "policy_versions": versions, **rep.to_dict()}


_SESSION_ERRORS: list[tuple[tuple[type[Exception], ...], int, str]] = [
    ((UnknownSessionError,), 404, "not_found"),
    ((FailedSessionError, EventConflictError), 409, "conflict"),
    ((FeedbackTooLargeError,), 413, "too_large"),
    ((OutsideRootsError,), 403, "forbidden"),
    ((ConfigError,), 422, "bad_request"),
]
"""(errors, HTTP status, error code) of what a request can get wrong; the most specific class
of an error's MRO picks its answer."""


def _answer(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"error": code, "message": str(e)}, status_code=status)
    return handler


async def _infra(_: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, InfraFailure)
    return JSONResponse({"error": "infrastructure", "infrastructure": True, "message": str(e),
                         "session_id": e.session_id}, status_code=503)


async def _infra_raw(_: Request, e: Exception) -> JSONResponse:
    return JSONResponse({"error": "infrastructure", "infrastructure": True,
                         "message": f"{type(e).__name__}: {e}"}, status_code=503)


def _install_session_errors(app: FastAPI) -> None:
    """Each error a session route raises, as its HTTP answer (infrastructure ones say so)."""
    for classes, status, code in _SESSION_ERRORS:
        for cls in classes:
            app.add_exception_handler(cls, _answer(status, code))
    app.add_exception_handler(InfraFailure, _infra)
    for cls in (SandboxError, PolicyError):
        app.add_exception_handler(cls, _infra_raw)


def make_app(engines: dict[str, Engine], tokenizer: Any, store: FeedbackStore,
             cfg: ServeConfig, *, policy_versions: dict[str, int] | None = None,
             policy_sources: dict[str, str] | None = None, policies: str | None = None,
             candidate_b: bool = False, sandbox_factory: SandboxFactory | None = None) -> FastAPI:
    """The FastAPI app: ``engines`` by arm ("A", optionally "B"); ``tokenizer`` renders the chat
    format for engines that expose none; ``policy_versions`` labels each arm's sessions (default:
    the engine's own ``policy_version``); ``policy_sources`` (arm -> model or policies dir) is
    what a reload re-reads; ``policies``: a policies dir arm A follows once its ``current.json``
    exists; ``candidate_b``: engine B serves that dir's ``candidate.json`` (no traffic without
    one). With ``cfg.watch_s`` a background task reloads while the app runs."""
    srv = Server(engines, tokenizer, store, cfg, policy_versions=policy_versions,
                 policy_sources=policy_sources, policies=policies, candidate_b=candidate_b,
                 sandbox_factory=sandbox_factory)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        follows = srv.policy_sources or srv.policies is not None
        task = asyncio.ensure_future(srv.watch(cfg.watch_s)) if cfg.watch_s and follows else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    app = FastAPI(title="looprl agent server", lifespan=lifespan)
    app.state.server = srv
    app.state.drain = srv.drain
    app.add_middleware(Guard, authorized=bearer(cfg.token), open_paths={"/healthz"},
                       max_body=body_limit)
    install_error_handlers(app)

    _install_session_errors(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, **srv.live(), "pid": os.getpid()}

    @app.post("/v1/sessions")
    async def create_session(req: SessionReq, request: Request) -> dict[str, Any]:
        return await srv.run_session(req, request)

    @app.post("/v1/sessions/{sid}/feedback")
    async def feedback(sid: str, req: FeedbackReq) -> dict[str, Any]:
        return await asyncio.to_thread(srv.feedback, sid, req)

    @app.get("/v1/sessions/{sid}")
    async def get_session(sid: str) -> dict[str, Any]:
        return await asyncio.to_thread(srv.describe, sid)

    @app.post("/v1/reload")
    async def reload() -> dict[str, Any]:
        return await srv.reload()

    @app.get("/v1/ab")
    async def ab() -> dict[str, Any]:
        return await asyncio.to_thread(srv.ab)

    @app.get("/v1/stats")
    async def stats() -> dict[str, int]:
        return await asyncio.to_thread(store.stats)

    return app
