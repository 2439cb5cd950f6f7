"""The agent server following a policies dir by itself: promotions (``current.json``) and A/B
candidates (``candidate.json``) go live within a few watch ticks, with no ``POST /v1/reload``.

Real uvicorn on loopback, the real harness, real tiny HF checkpoints loaded on every swap; the
engines are scripted at the Engine seam (their ``update_weights`` records the version) except in
the CLI test, which runs ``looprl serve``'s own two TorchEngines and compares their weights."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import safetensors.torch
import torch

from looprl.feedback.ab import assign_arm
from looprl.feedback.policies import (
    CANDIDATE,
    POINTER,
    offer_candidate,
    promote,
    withdraw_candidate,
)
from looprl.feedback.store import FeedbackStore
from looprl.harness.agent import AgentConfig
from looprl.harness.policies import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.serve.api import ServeConfig, make_app
from tests.example_package import write_example_package
from tests.feedback.test_cycle import save_tiny, weights
from tests.serve.test_api_abuse import FINISH, GatedPolicy, dir_sandbox

from .conftest import running

TOKEN = "watch"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENT = AgentConfig(max_turns=2, max_new_tokens=1 << 16, max_total_new_tokens=1 << 20,
                    context_window=1 << 20)
TICK = 0.05


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(None)


def save_version(path: Path, k: int) -> Path:
    """A tiny HF checkpoint whose weights differ from every other ``k``'s."""
    save_tiny(path)
    shifted = {n: t + 0.01 * k for n, t in weights(path).items()}
    safetensors.torch.save_file(shifted, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Path:
    """Candidates v0001..v0003, saved once (each dir is a real HF checkpoint)."""
    root = tmp_path_factory.mktemp("versions")
    for v in (1, 2, 3):
        save_version(root / f"v{v:04d}", v)
    return root


@pytest.fixture()
def policies(tmp_path: Path, versions: Path) -> Path:
    """A policies dir holding v1..v3 (symlinks to the saved checkpoints), current: v1."""
    p = tmp_path / "policies"
    p.mkdir()
    for d in versions.iterdir():
        (p / d.name).symlink_to(d, target_is_directory=True)
    promote(p, 1)
    return p


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    return write_example_package(tmp_path / "repos" / "minicalc")


def app_on(policies: Path, tok, repo: Path, store: FeedbackStore, engines: dict[str, Any],
           candidate_b: bool = False, watch_s: float = TICK):
    cfg = ServeConfig(token=TOKEN, agent=AGENT, experiment="exp-cfg", split_b=0.5,
                      allowed_roots=(str(repo.parent),), watch_s=watch_s)
    return make_app(engines, tok, store, cfg, policy_versions={a: 1 for a in engines},
                    policy_sources={"A": str(policies)}, policies=str(policies),
                    candidate_b=candidate_b, sandbox_factory=dir_sandbox)


def health(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/healthz", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_health(url: str, ok: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0
                ) -> dict[str, Any]:
    """Poll /healthz until ``ok`` (the watch, not the test, reloads)."""
    deadline = time.monotonic() + timeout_s
    while not ok(h := health(url)):
        assert time.monotonic() < deadline, f"the server never got there: {h}"
        time.sleep(TICK)
    return h


def session(url: str, user: str, repo: Path) -> dict[str, Any]:
    r = httpx.post(url + "/v1/sessions", headers=AUTH, timeout=60,
                   json={"user": user, "prompt": "fix mean", "repo": str(repo)})
    assert r.status_code == 200, r.text
    return r.json()


def user_on(arm: str, experiment: str, split_b: float) -> str:
    return next(u for u in (f"user-{i}" for i in range(200))
                if assign_arm(u, experiment, split_b) == arm)


def test_a_promotion_goes_live_by_itself(tmp_path, tok, repo, policies):
    engine = ScriptedPolicy(tok, [FINISH])
    store = FeedbackStore(tmp_path / "fb.db")
    with running(app_on(policies, tok, repo, store, {"A": engine})) as srv:
        assert health(srv.url)["arms"] == {"A": 1}
        assert session(srv.url, "u", repo)["policy_version"] == 1
        promote(policies, 2)  # a cycle promoted v2 while serving; nobody calls /v1/reload
        h = wait_health(srv.url, lambda h: h["arms"] == {"A": 2})
        assert (h["experiment"], h["candidate"]) == ("exp-cfg", False)
        assert engine.policy_version == 2  # the engine took v2's weights
        s = session(srv.url, "u", repo)
        assert (s["arm"], s["policy_version"]) == ("A", 2)
        assert store.session(s["session_id"]).policy_version == 2
    store.close()


def test_a_candidate_pointer_splits_users_and_its_withdrawal_ends_the_split(
        tmp_path, tok, repo, policies):
    a, b = ScriptedPolicy(tok, [FINISH]), ScriptedPolicy(tok, [FINISH])
    store = FeedbackStore(tmp_path / "fb.db")
    app = app_on(policies, tok, repo, store, {"A": a, "B": b}, candidate_b=True)
    with running(app) as srv:
        # B is built but gets no traffic without a candidate: every user is on A
        assert health(srv.url)["arms"] == {"A": 1}
        for u in ("user-1", "user-2", "user-3"):
            s = session(srv.url, u, repo)
            assert (s["arm"], s["policy_version"], s["experiment"]) == ("A", 1, "exp-cfg")

        offer_candidate(policies, 2, "exp-all-b", 1.0)
        h = wait_health(srv.url, lambda h: "B" in h["arms"])
        assert (h["arms"], h["experiment"], h["split_b"]) == ({"A": 1, "B": 2}, "exp-all-b", 1.0)
        assert b.policy_version == 2  # engine B took the candidate's weights
        for u in ("user-1", "user-2", "user-3"):  # split_b=1.0: everyone on B
            s = session(srv.url, u, repo)
            assert (s["arm"], s["policy_version"], s["experiment"]) == ("B", 2, "exp-all-b")
            rec = store.session(s["session_id"])
            assert (rec.arm, rec.policy_version, rec.experiment) == ("B", 2, "exp-all-b")
        r = httpx.get(srv.url + "/v1/ab", headers=AUTH).json()
        assert (r["experiment"], r["policy_versions"]) == ("exp-all-b", {"A": 1, "B": 2})

        offer_candidate(policies, 3, "exp-half", 0.5)  # the next cycle's candidate
        wait_health(srv.url, lambda h: h["arms"] == {"A": 1, "B": 3})
        for arm, version in (("A", 1), ("B", 3)):
            s = session(srv.url, user_on(arm, "exp-half", 0.5), repo)
            assert (s["arm"], s["policy_version"], s["experiment"]) == (arm, version, "exp-half")

        withdraw_candidate(policies)
        h = wait_health(srv.url, lambda h: "B" not in h["arms"])
        assert (h["arms"], h["experiment"], h["candidate"]) == ({"A": 1}, "exp-cfg", False)
        s = session(srv.url, user_on("B", "exp-half", 0.5), repo)
        assert (s["arm"], s["policy_version"], s["experiment"]) == ("A", 1, "exp-cfg")
        r = httpx.get(srv.url + "/v1/ab", headers=AUTH).json()
        assert (r["experiment"], r["policy_versions"]) == ("exp-cfg", {"A": 1})
        assert sorted(r["arms"]) == ["A"]  # the B sessions were another experiment's
    store.close()


def test_a_session_started_on_b_stays_on_b_when_the_candidate_is_withdrawn(
        tmp_path, tok, repo, policies):
    b = GatedPolicy(tok, [FINISH])
    store = FeedbackStore(tmp_path / "fb.db")
    app = app_on(policies, tok, repo, store, {"A": ScriptedPolicy(tok, [FINISH]), "B": b},
                 candidate_b=True)
    with running(app) as srv, httpx.Client(headers=AUTH, timeout=60) as c:
        offer_candidate(policies, 2, "exp-b", 1.0)
        wait_health(srv.url, lambda h: h["arms"].get("B") == 2)
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running_b = pool.submit(c.post, srv.url + "/v1/sessions",
                                    json={"user": "u", "prompt": "p", "repo": str(repo)})
            assert b.started.wait(20), "the B session did not start"
            withdraw_candidate(policies)
            wait_health(srv.url, lambda h: "B" not in h["arms"])
            b.gate.set()  # the B session's engine answers only now, after the withdrawal
            s = running_b.result(timeout=60).json()
        assert (s["arm"], s["policy_version"], s["experiment"]) == ("B", 2, "exp-b")
        assert s["stop_reason"] == "finished"
        assert session(srv.url, "u", repo)["arm"] == "A"
    store.close()


def test_an_unreadable_pointer_is_logged_once_and_the_next_good_write_goes_live(
        tmp_path, tok, repo, policies, caplog):
    a, b = ScriptedPolicy(tok, [FINISH]), ScriptedPolicy(tok, [FINISH])
    store = FeedbackStore(tmp_path / "fb.db")
    app = app_on(policies, tok, repo, store, {"A": a, "B": b}, candidate_b=True)
    caplog.set_level(logging.WARNING, logger="looprl.serve.api")
    with running(app) as srv:
        (policies / POINTER).write_text('{"version": 2, "pa')  # half-written
        time.sleep(20 * TICK)
        h = health(srv.url)  # still serving what it served
        assert h["arms"] == {"A": 1}
        assert session(srv.url, "u", repo)["policy_version"] == 1
        failures = [r for r in caplog.records if "policy reload failed" in r.getMessage()]
        assert len(failures) == 1, failures  # one line, not one a tick
        assert "JSONDecodeError" in failures[0].getMessage()
        assert "\n" not in failures[0].getMessage()

        promote(policies, 2)  # the next good write: the watch is alive and picks it up
        wait_health(srv.url, lambda h: h["arms"] == {"A": 2})

        (policies / CANDIDATE).write_text('{"version": 9, "path": "v0009", "experiment": "e", '
                                          '"split_b": 1.0}')  # names a dir not written yet
        time.sleep(20 * TICK)
        assert health(srv.url)["arms"] == {"A": 2}  # no B without its weights
        assert session(srv.url, "u", repo)["arm"] == "A"
        offer_candidate(policies, 3, "e", 1.0)
        wait_health(srv.url, lambda h: h["arms"] == {"A": 2, "B": 3})
        assert session(srv.url, "u", repo)["arm"] == "B"
    store.close()


def test_the_cli_serves_a_model_until_its_policies_dir_has_a_current_policy(
        tmp_path, versions, monkeypatch):
    """``looprl serve --model M --policies P``: M (v0) until P/current.json appears, then P's
    policy; the candidate pointer drives a second TorchEngine. The blocking server is swapped for
    the test's threaded one (``looprl.asgi.run``); everything else is the command's own."""
    from typer.testing import CliRunner

    from looprl.commands.serve import app as serve_app

    model = save_tiny(tmp_path / "m")
    policies = tmp_path / "policies"  # does not exist yet: no cycle has run
    seen: dict[str, Any] = {}

    def drive(app_, **_: Any) -> None:
        srv_state = app_.state.server
        with running(app_) as srv:
            h = health(srv.url)
            assert (h["arms"], h["candidate"]) == ({"A": 0}, False)
            assert sorted(srv_state.engines) == ["A", "B"]  # B built, idle
            policies.mkdir()
            (policies / "v0003").symlink_to(versions / "v0001", target_is_directory=True)
            (policies / "v0004").symlink_to(versions / "v0002", target_is_directory=True)
            promote(policies, 3)
            wait_health(srv.url, lambda h: h["arms"] == {"A": 3}, timeout_s=60)
            offer_candidate(policies, 4, "exp-cli", 0.25)
            h = wait_health(srv.url, lambda h: h["arms"] == {"A": 3, "B": 4}, timeout_s=60)
            assert (h["experiment"], h["split_b"]) == ("exp-cli", 0.25)
            withdraw_candidate(policies)
            wait_health(srv.url, lambda h: h["arms"] == {"A": 3}, timeout_s=60)
            seen["engines"] = dict(srv_state.engines)
            seen["states"] = {arm: {k: v.clone() for k, v in e.model.state_dict().items()}
                              for arm, e in srv_state.engines.items()}

    monkeypatch.setattr("looprl.asgi.run", drive)
    r = CliRunner().invoke(serve_app, [
        "--model", str(model), "--policies", str(policies), "--store", str(tmp_path / "fb.db"),
        "--token", TOKEN, "--watch", str(TICK), "--max-turns", "1", "--max-new-tokens", "4",
        "-E", "max_slots=2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert f"following {policies}" in r.output
    for arm, src in (("A", "v0001"), ("B", "v0002")):  # the engines hold v3's and v4's weights
        # (v3 -> the saved v0001, v4 -> v0002; B keeps v4 after the withdrawal: no traffic)
        want = weights(versions / src)
        got = seen["states"][arm]
        assert all(torch.equal(got[k], want[k]) for k in want), arm
        assert seen["engines"][arm].policy_version == {"A": 3, "B": 4}[arm]
    assert not torch.equal(weights(versions / "v0001")["model.embed_tokens.weight"],
                           weights(versions / "v0002")["model.embed_tokens.weight"])


def test_the_cli_checks_where_the_policies_dir_comes_from(tmp_path, policies):
    from typer.testing import CliRunner

    from looprl.commands.serve import app as serve_app

    def error(*args: str) -> str:
        r = CliRunner().invoke(serve_app, [*args, "--store", str(tmp_path / "fb.db")])
        assert r.exit_code == 2, r.output
        return " ".join(r.output.replace("│", " ").split())  # unwrap the boxed message

    assert "has no current.json yet: pass --model DIR" in error("--policies", str(tmp_path / "n"))
    assert "is a policies dir already; drop --policies" in error(
        "--model", str(policies), "--policies", str(tmp_path / "other"))
