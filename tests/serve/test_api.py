"""The agent server end to end: a real uvicorn server, the real harness in real bubblewrap
sandboxes over a real package, scripted engines at the Engine seam, feedback into SQLite."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from looprl.errors import SandboxUnavailableError
from looprl.feedback.ab import assign_arm
from looprl.feedback.store import FeedbackStore
from looprl.harness.agent import AgentConfig
from looprl.harness.scripted import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.serve.api import ServeConfig, make_app
from tests.bwrap_support import needs_bwrap
from tests.example_package import write_example_package

TOKEN = "s3cret"
EXP = "exp-test"
# bytes-only tokenizer: a context holds a file's bytes, so budgets are large (as bench does)
AGENT = AgentConfig(max_turns=6, max_new_tokens=1 << 16, max_total_new_tokens=1 << 20,
                    context_window=1 << 20)


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


EDIT_SCRIPT = [
    "Looking at mean." + call("read_file", path="src/minicalc/core.py"),
    call("edit_file", path="src/minicalc/core.py", old_string="    total = 0\n",
         new_string="    total = 0.0\n")
    + call("write_file", path="src/minicalc/extra.py", content="X = 1\n"),
    call("finish", summary="mean now sums floats; added extra.py"),
]
FINISH_SCRIPT = [call("finish", summary="nothing to do")]


def with_bwrap(f):
    for mark in needs_bwrap:
        f = mark(f)
    return f


def user_on(arm: str) -> str:
    return next(u for u in (f"user-{i}" for i in range(100)) if assign_arm(u, EXP, 0.5) == arm)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(None)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return write_example_package(tmp_path_factory.mktemp("srv") / "minicalc")


@pytest.fixture(scope="module")
def server(tmp_path_factory, tok, repo):
    store = FeedbackStore(tmp_path_factory.mktemp("db") / "fb.db")
    engines = {"A": ScriptedPolicy(tok, EDIT_SCRIPT), "B": ScriptedPolicy(tok, FINISH_SCRIPT)}
    cfg = ServeConfig(token=TOKEN, experiment=EXP, split_b=0.5, agent=AGENT, min_sessions=1,
                      allowed_roots=(str(repo.parent),))
    app = make_app(engines, tok, store, cfg, policy_versions={"A": 4, "B": 5})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "server did not start"
        time.sleep(0.05)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}",
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    yield client, store
    client.close()
    srv.should_exit = True
    t.join(timeout=10)
    store.close()


def test_health_needs_no_token(server):
    client, _ = server
    r = httpx.get(str(client.base_url) + "/healthz")
    assert r.status_code == 200 and r.json()["arms"] == {"A": 4, "B": 5}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
def test_auth_is_required(server, repo, headers):
    client, _ = server
    r = httpx.post(str(client.base_url) + "/v1/sessions", headers=headers,
                   json={"user": "u", "prompt": "p", "repo": str(repo)})
    assert r.status_code == 401 and "Bearer" in r.json()["detail"]


@pytest.mark.parametrize("repo_arg, status, msg", [
    ("relative/path", 422, "must be an absolute path"),
    ("{root}/not/here", 422, "is not a directory"),
    ("/definitely/not/here", 403, "outside the allowed roots"),  # existence outside is not told
    ("/usr", 403, "outside the allowed roots"),
    ("{root}/../../etc", 403, "--allowed-root"),
    ("", 422, "is empty"),
])
def test_bad_repo_is_4xx_with_the_fix(server, repo, repo_arg, status, msg):
    client, store = server
    n = len(store.sessions())
    r = client.post("/v1/sessions", json={"user": "u", "prompt": "fix",
                                          "repo": repo_arg.format(root=repo.parent)})
    assert r.status_code == status and msg in r.json()["message"]
    assert len(store.sessions()) == n  # nothing ran, nothing stored


@pytest.mark.parametrize("venv_arg, status, msg", [
    ("/usr", 403, "'venv' '/usr' is outside the allowed roots"),
    ("{root}/no-venv", 422, "'venv'"),
    ("relative", 422, "'venv' 'relative' must be an absolute path"),
    ("{root}", 422, "has no bin/ directory"),
])
def test_bad_venv_is_4xx_with_the_fix(server, repo, venv_arg, status, msg):
    client, store = server
    n = len(store.sessions())
    r = client.post("/v1/sessions", json={"user": "u", "prompt": "fix", "repo": str(repo),
                                          "venv": venv_arg.format(root=repo.parent)})
    assert r.status_code == status and msg in r.json()["message"]
    assert len(store.sessions()) == n


@with_bwrap
def test_a_session_runs_in_the_venv_it_names(server, repo, monkeypatch):
    from looprl.serve.api import Server

    client, _ = server
    seen = []
    run_agent = Server._run_agent

    async def spy(self, task, arm, sid):
        seen.append(task.venv)
        return await run_agent(self, task, arm, sid)

    monkeypatch.setattr(Server, "_run_agent", spy)
    venv = repo.parent / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for body in ({}, {"venv": str(venv)}):
        r = client.post("/v1/sessions", json={"user": user_on("B"), "prompt": "fix",
                                              "repo": str(repo), **body})
        assert r.status_code == 200, r.text
    assert seen == [None, str(venv)]  # the server's --venv (none here), then the request's


def test_missing_field_is_422(server):
    client, _ = server
    r = client.post("/v1/sessions", json={"user": "u", "prompt": "fix"})
    assert r.status_code == 422 and "repo" in r.text


def test_unknown_session_is_404(server):
    client, _ = server
    r = client.post("/v1/sessions/nope/feedback", json={"event_id": "ev-1", "kind": "kept"})
    assert r.status_code == 404 and "unknown session" in r.json()["message"]


@with_bwrap
def test_sessions_feedback_and_ab_end_to_end(server, repo):
    client, store = server
    before = (repo / "src/minicalc/core.py").read_text()
    ua, ub = user_on("A"), user_on("B")
    r = client.post("/v1/sessions", json={"user": ua, "prompt": "mean() should use floats",
                                          "repo": str(repo)})
    assert r.status_code == 200, r.text
    s = r.json()
    assert (s["arm"], s["policy_version"], s["stop_reason"]) == ("A", 4, "finished")
    assert s["files"] == ["src/minicalc/core.py", "src/minicalc/extra.py"]
    assert "+    total = 0.0" in s["diff"] and "+X = 1" in s["diff"]
    assert [m["role"] for m in s["messages"]][:2] == ["user", "assistant"]
    assert s["messages"][1]["tool_calls"] == ["read_file"]
    assert (repo / "src/minicalc/core.py").read_text() == before  # the user's repo is untouched
    assert not (repo / "src/minicalc/extra.py").exists()

    # the stored trajectory is the harness's, token-exact
    rec = store.session(s["session_id"])
    assert rec.trajectory is not None and rec.trajectory.counters.turns == 3
    assert rec.experiment == EXP
    assert rec.trajectory.segments[0].num_model_tokens > 0

    sid = s["session_id"]
    r = client.post(f"/v1/sessions/{sid}/feedback", json={"event_id": "ev-2",
                                                          "kind": "partially_kept",
                                                          "files": ["src/minicalc/core.py"]})
    assert r.status_code == 200 and r.json()["reward"]["total"] == pytest.approx(0.0)
    r = client.post(f"/v1/sessions/{sid}/feedback", json={"event_id": "ev-3", "kind": "kept"})
    assert r.json()["reward"]["total"] == pytest.approx(1.0)
    r = client.post(f"/v1/sessions/{sid}/feedback", json={"event_id": "ev-4",
                                                          "kind": "partially_kept",
                                                          "files": ["setup.py"]})
    assert r.status_code == 422 and "not among the session's edited files" in r.json()["message"]
    r = client.post(f"/v1/sessions/{sid}/feedback", json={"event_id": "ev-5", "kind": "thumbs_up"})
    assert r.status_code == 422 and "use one of" in r.json()["message"]

    # arm B finishes without edits: no edit event applies, a complaint says the request failed
    r = client.post("/v1/sessions", json={"user": ub, "prompt": "mean() should use floats",
                                          "repo": str(repo)})
    assert r.status_code == 200, r.text
    b = r.json()
    assert (b["arm"], b["policy_version"], b["diff"], b["files"]) == ("B", 5, "", [])
    r = client.post(f"/v1/sessions/{b['session_id']}/feedback",
                    json={"event_id": "ev-6", "kind": "kept"})
    assert r.status_code == 422 and "follow_up" in r.json()["message"]
    r = client.post(f"/v1/sessions/{b['session_id']}/feedback",
                    json={"event_id": "ev-7", "kind": "follow_up",
                          "text": "that didn't work, mean is still wrong"})
    # no change, then a complaint: the request failed as a reverted edit does (-1); the
    # complaint itself adds nothing to a failure
    assert r.json()["reward"]["total"] == pytest.approx(-1.0)
    # a follow-up may name the agent reply it answers: one the session has
    for eid, turn, code in (("ev-8", b["turns"] + 1, 422), ("ev-9", 1, 200)):
        r = client.post(f"/v1/sessions/{b['session_id']}/feedback",
                        json={"event_id": eid, "kind": "follow_up", "turn": turn,
                              "text": "no, your first reply was already wrong"})
        assert r.status_code == code and (code == 200 or "'turn'" in r.json()["message"])
    assert r.json()["reward"]["total"] == pytest.approx(-1.0)  # one complaint counts, once

    got = client.get(f"/v1/sessions/{sid}").json()
    assert [e["kind"] for e in got["events"]] == ["partially_kept", "kept"]
    assert [e["event_id"] for e in got["events"]] == ["ev-2", "ev-3"]
    ab = client.get("/v1/ab").json()
    assert ab["arms"]["A"]["reward"] == pytest.approx(1.0)
    assert ab["arms"]["B"]["dissatisfied"] == pytest.approx(1.0)
    assert ab["diffs"]["reward"]["diff"] == pytest.approx(-2.0)
    assert ab["decision"]["action"] == "rollback"  # one session an arm, B's reward lower in all
    assert ab["policy_versions"] == {"A": 4, "B": 5}


def test_infra_failures_are_503_and_never_scored(tmp_path, tok, repo):
    store = FeedbackStore(tmp_path / "fb.db")
    cfg = ServeConfig(token=TOKEN, agent=AGENT, min_sessions=1, allowed_roots=(str(repo.parent),))
    broken = ScriptedPolicy(tok, [])  # raises PolicyError on its first turn, like a dead server

    async def no_sandbox(repo_dir, venv):
        raise SandboxUnavailableError("bubblewrap is not installed")

    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(make_app({"A": broken}, tok, store, cfg, sandbox_factory=no_sandbox)) as c:
        r = c.post("/v1/sessions", headers=auth, json={"user": "u", "prompt": "p", "repo": str(repo)})
        assert r.status_code == 503 and r.json()["infrastructure"] is True
        assert "bubblewrap" in r.json()["message"]
    (failed,) = store.sessions()  # recorded for operators, as an infrastructure failure
    assert failed.id == r.json()["session_id"] and failed.stop_reason == "infra_error"
    assert failed.trajectory is None

    from tests.harness.dir_sandbox import DirSandbox

    async def dir_sandbox(repo_dir, venv):
        return DirSandbox(Path(repo_dir))

    with TestClient(make_app({"A": broken}, tok, store, cfg, sandbox_factory=dir_sandbox)) as c:
        r = c.post("/v1/sessions", headers=auth, json={"user": "u", "prompt": "p", "repo": str(repo)})
        assert r.status_code == 503 and r.json()["infrastructure"] is True
        sid = r.json()["session_id"]
        assert store.session(sid).stop_reason == "infra_error" and store.session(sid).trajectory  # recorded for operators
        r = c.post(f"/v1/sessions/{sid}/feedback", headers=auth, json={"event_id": "ev-8",
                                                                       "kind": "follow_up",
                                                                       "text": "it broke"})
        assert r.status_code == 409 and "infrastructure" in r.json()["message"]
        ab = c.get("/v1/ab", headers=auth).json()
        assert ab["arms"] == {}  # an infra failure is no session of the arm
    store.close()


def test_reload_swaps_in_a_promoted_policy(tmp_path, tok, repo):
    from looprl.feedback.policies import promote
    from tests.feedback.test_cycle import save_tiny

    policies = tmp_path / "policies"
    for v in (1, 2):
        save_tiny(policies / f"v{v:04d}")
    promote(policies, 1)
    engine = ScriptedPolicy(tok, FINISH_SCRIPT)
    store = FeedbackStore(tmp_path / "fb.db")
    app = make_app({"A": engine}, tok, store, ServeConfig(token=TOKEN, agent=AGENT),
                   policy_versions={"A": 1}, policy_sources={"A": str(policies)})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app) as c:
        assert c.post("/v1/reload", headers=auth).json()["A"]["changed"] is False
        promote(policies, 2)  # a cycle promoted v2 while serving
        r = c.post("/v1/reload", headers=auth).json()
        assert r["A"]["version"] == 2 and r["A"]["changed"] is True
        assert engine.policy_version == 2  # the engine took the new weights
        assert c.get("/healthz").json()["arms"] == {"A": 2}
    store.close()
