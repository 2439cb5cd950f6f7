"""The agent server (``looprl serve``'s app, real uvicorn on loopback) against hostile and careless
clients: auth before the body (401, nothing read), 413 bodies and texts, 4xx for bad fields and
invalid Unicode (nothing stored), replayed and reordered feedback, clients that leave, and the
drain on shutdown with sessions queued."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from looprl.feedback.store import MAX_TEXT_CHARS, FeedbackStore
from looprl.harness.agent import AgentConfig
from looprl.harness.scripted import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.serve.api import ServeConfig, make_app
from tests.example_package import write_example_package
from tests.harness.dir_sandbox import DirSandbox
from tests.http_abuse import declared_but_unsent, stream_until_refused

from .conftest import running, stored_session

TOKEN = "abuse"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENT = AgentConfig(max_turns=2, max_new_tokens=1 << 16, max_total_new_tokens=1 << 20,
                    context_window=1 << 20)
FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call>'


class GatedPolicy(ScriptedPolicy):
    """ScriptedPolicy whose turns wait until ``gate`` is set: a session that is still running."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        super().__init__(tokenizer, turns)
        self.gate = threading.Event()
        self.started = threading.Event()

    async def generate(self, prompt_ids, params, *, session_id=None, group_id=None):
        self.started.set()
        while not self.gate.is_set():
            await asyncio.sleep(0.02)
        return await super().generate(prompt_ids, params, session_id=session_id, group_id=group_id)


async def dir_sandbox(repo_dir: str, venv: str | None) -> DirSandbox:
    return DirSandbox(Path(repo_dir))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(None)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    return write_example_package(tmp_path / "repos" / "minicalc")


def app_for(tmp_path: Path, tok, repo: Path, engine=None, **cfg):
    store = FeedbackStore(tmp_path / "fb.db")
    config = ServeConfig(token=TOKEN, agent=AGENT, allowed_roots=(str(repo.parent),), **cfg)
    app = make_app({"A": engine or ScriptedPolicy(tok, [FINISH] * 1000)}, tok, store, config,
                   sandbox_factory=dir_sandbox)
    return app, store


@pytest.fixture()
def api(tmp_path: Path, tok, repo: Path):
    app, store = app_for(tmp_path, tok, repo)
    with running(app) as srv:
        yield srv.url, store
    store.close()


def post(url: str, path: str, body: object, **kw) -> httpx.Response:
    return httpx.post(url + path, headers=AUTH, json=body, timeout=30, **kw)


def test_auth_is_checked_before_the_body_is_read(api):
    url, store = api
    for path in ("/v1/sessions", "/v1/sessions/x/feedback", "/v1/reload"):
        r = declared_but_unsent(url, path, 150 << 20)  # 150 MB declared, nothing sent
        assert r.status == 401 and "Bearer" in r.body["detail"] and r.wait_s < 2, (path, r)
    r = declared_but_unsent(url, "/v1/sessions", 150 << 20, {"Authorization": "Bearer nope"})
    assert r.status == 401
    assert store.stats() == {"sessions": 0, "events": 0, "replays_ignored": 0}


def test_oversized_bodies_and_texts_are_413_and_store_nothing(api):
    url, store = api
    sid = stored_session(store)
    r = declared_but_unsent(url, "/v1/sessions", 2 << 20, AUTH)
    assert r.status == 413 and "limit of 1048576 bytes" in r.body["message"]
    t0 = time.monotonic()  # a 20 MB follow-up, really sent: refused once past 256 KiB
    big = json.dumps({"event_id": "e1", "kind": "follow_up", "text": "x" * (20 << 20)}).encode()
    r = httpx.post(f"{url}/v1/sessions/{sid}/feedback", content=big, timeout=30,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and time.monotonic() - t0 < 5
    r = stream_until_refused(url, f"/v1/sessions/{sid}/feedback", 64 << 20, AUTH, chunked=True)
    assert r.status == 413 and r.sent < 64 << 20  # cut off: loopback buffers hold a few MB
    r = post(url, f"/v1/sessions/{sid}/feedback",  # under the body limit, over the text limit
             {"event_id": "e2", "kind": "follow_up", "text": "y" * (MAX_TEXT_CHARS + 1)})
    assert r.status_code == 413 and "over the limit of 20000" in r.json()["message"]
    assert store.events(sid) == []


@pytest.mark.parametrize("body, status, field", [
    (b'{"event_id": "e", "kind": "follow_up", "text": "still \\ud800 failing"}', 422, "text"),
    (b'{"event_id": "e", "kind": "follow_up", "text": "\xff\xfe broken"}', 400, "pars"),
    (b'{"event_id": "e", "kind": "kept", "at": NaN}', 422, "at"),
    (b'{"event_id": "e", "kind": "kept", "at": Infinity}', 422, "at"),
    (b'{"event_id": "e", "kind": "kept", "at": 1}', 422, "'at'"),
    (b'{"kind": "kept"}', 422, "event_id"),
    (b'{"event_id": "has space", "kind": "kept"}', 422, "event_id"),
    (b'{"event_id": "e", "kind": "kept", "files": "pkg/a.py"}', 422, "files"),
    (b'{"event_id": "e", "kind": "kept", "thumbs": 1}', 422, "thumbs"),
    (b'{"event_id": "e", "kind": 5}', 422, "kind"),
    (b'{"event_id": "e", "kind": "kept"', 422, "JSON"),
])
def test_bad_feedback_is_4xx_and_stores_nothing(api, body, status, field):
    url, store = api
    sid = stored_session(store)
    r = httpx.post(f"{url}/v1/sessions/{sid}/feedback", content=body, timeout=30,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == status and field in r.text, r.text
    assert store.events(sid) == []


@pytest.mark.parametrize("body, field", [
    ({"user": "u\ud800", "prompt": "p", "repo": "/r"}, "user"),
    ({"user": "u", "prompt": "p", "repo": "/r", "model": "gpt"}, "model"),
    ({"user": "u", "prompt": "p" * 100_001, "repo": "/r"}, "prompt"),
    ({"user": ["u"], "prompt": "p", "repo": "/r"}, "user"),
])
def test_bad_session_requests_are_422_and_run_nothing(api, body, field):
    url, store = api
    r = httpx.post(f"{url}/v1/sessions", content=json.dumps(body), timeout=30,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and field in r.json()["message"], r.text
    assert store.stats()["sessions"] == 0


def test_replays_are_answered_and_counted_never_stored_twice(api):
    url, store = api
    sid = stored_session(store)
    body = {"event_id": "e-1", "kind": "partially_kept", "files": ["pkg/a.py"]}
    replies = [post(url, f"/v1/sessions/{sid}/feedback", body).json() for _ in range(3)]
    assert [r["duplicate"] for r in replies] == [False, True, True]
    assert [r["replays"] for r in replies] == [0, 1, 2]
    assert {r["reward"]["total"] for r in replies} == {0.0}
    r = post(url, f"/v1/sessions/{sid}/feedback", {"event_id": "e-1", "kind": "reverted"})
    assert r.status_code == 409 and "already used" in r.json()["message"]
    assert httpx.get(f"{url}/v1/stats", headers=AUTH).json() == {
        "sessions": 1, "events": 1, "replays_ignored": 2}
    (ev,) = httpx.get(f"{url}/v1/sessions/{sid}", headers=AUTH).json()["events"]
    assert (ev["event_id"], ev["replays"]) == ("e-1", 2)


def test_outcomes_follow_when_the_user_acted_not_arrival(api):
    url, store = api
    t0 = time.time() - 3000
    sid = stored_session(store, created_at=t0)
    post(url, f"/v1/sessions/{sid}/feedback", {"event_id": "r", "kind": "reverted", "at": t0 + 2000})
    r = post(url, f"/v1/sessions/{sid}/feedback", {"event_id": "k", "kind": "kept", "at": t0 + 1000})
    assert r.json()["reward"]["total"] == pytest.approx(-1.0)  # arrival order would say +1
    got = httpx.get(f"{url}/v1/sessions/{sid}", headers=AUTH).json()
    assert [e["kind"] for e in got["events"]] == ["kept", "reverted"]


def test_a_session_whose_client_leaves_is_cancelled_and_frees_its_slot(tmp_path, tok, repo):
    engine = GatedPolicy(tok, [FINISH] * 10)
    app, store = app_for(tmp_path, tok, repo, engine, max_concurrent=1)
    with running(app) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/sessions", headers=AUTH, timeout=1.0,
                       json={"user": "u", "prompt": "p", "repo": str(repo)})
        deadline = time.time() + 10
        while store.stats()["sessions"] == 0:  # cancelled, stored unscored
            assert time.time() < deadline, "the session was not cancelled"
            time.sleep(0.05)
        (s,) = store.sessions()
        assert s.stop_reason == "infra_error"
        engine.gate.set()  # the slot is free: the next session runs
        r = post(srv.url, "/v1/sessions", {"user": "u", "prompt": "p", "repo": str(repo)})
        assert r.status_code == 200 and r.json()["stop_reason"] == "finished"
    store.close()


def test_shutdown_answers_queued_sessions_at_once_and_ends_within_the_drain(tmp_path, tok, repo):
    """One slot, one session running (its engine never answers), one queued: on the drain the
    queued one gets 503 at once, the running one a 503 just before the 2 s deadline (stored
    unscored), and the server stops."""
    engine = GatedPolicy(tok, [FINISH] * 10)
    app, store = app_for(tmp_path, tok, repo, engine, max_concurrent=1, drain_s=2.0)
    body = {"user": "u", "prompt": "p", "repo": str(repo)}

    async def go(url: str, begin) -> tuple[httpx.Response, float, httpx.Response, float]:
        async with httpx.AsyncClient(headers=AUTH, timeout=30) as c:
            first = asyncio.ensure_future(c.post(url + "/v1/sessions", json=body))
            await asyncio.to_thread(engine.started.wait, 10)
            second = asyncio.ensure_future(c.post(url + "/v1/sessions", json=body))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            begin()
            q = await second
            t_q = time.monotonic() - t0
            r = await first
            return q, t_q, r, time.monotonic() - t0

    with running(app, drain_s=2.0) as srv:
        q, t_q, r, t_r = asyncio.run(go(srv.url, srv.server.begin_drain))
        srv.thread.join(timeout=10)
        stopped = not srv.thread.is_alive()
    print(f"\nagent server drain: queued session {q.status_code} after {t_q:.2f} s, running "
          f"session {r.status_code} after {t_r:.2f} s, server stopped: {stopped}")
    assert q.status_code == 503 and "shutting down" in q.text and t_q < 0.5
    assert r.status_code == 503 and 1.0 < t_r < 2.5 and stopped
    (s,) = store.sessions()  # the cut session, stored unscored; the queued one never ran
    assert s.stop_reason == "infra_error"
    store.close()
