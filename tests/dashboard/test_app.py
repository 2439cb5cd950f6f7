"""The dashboard served by real uvicorn: training cards and charts from a real GRPOLoop run, the
fleet from a real env server, the A/B view from a real FeedbackStore; auth; broken inputs."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from looprl.dashboard.app import DashboardConfig, create_app
from looprl.dashboard.data import fmt
from looprl.sandbox.pool import SandboxPool
from looprl.sandbox.server import create_app as env_server_app

from .conftest import rows, serve

ENV_TOKEN = "env-secret"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def _card(page: str, label: str) -> str:
    m = re.search(rf'<div class="k">{re.escape(label)}</div><div class="v">([^<]*)</div>', page)
    assert m, f"no card {label!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def env_server():
    yield from serve(env_server_app(SandboxPool(max_running=3), ENV_TOKEN))


def test_overview_over_http(grpo_run: Path, run_copy: Path, feedback_db: Path, env_server: str):
    cfg = DashboardConfig(runs=(grpo_run, run_copy), store=feedback_db, env_server=env_server,
                          env_token=ENV_TOKEN, refresh_s=7, min_sessions=3)
    last = rows(grpo_run)[-1]
    for base in serve(create_app(cfg)):
        r = httpx.get(base + "/", timeout=60)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
        assert '<meta http-equiv="refresh" content="7">' in page
        # training: the last step's figures as cards, curves as inline PNGs
        assert _card(page, "step") == str(last["step"])
        assert _card(page, "reward") == fmt(last["reward/total_mean"])
        assert _card(page, "pass rate") == fmt(last["rollout/pass_rate"])
        assert _card(page, "train tok/s") == fmt(last["train/tokens_per_s"])
        pngs = _pngs(page)
        # 1 comparison + 2 runs x (training + throughput); all real, non-trivial PNGs
        assert len(pngs) == 5 and all(p.startswith(PNG_MAGIC) and len(p) > 5000 for p in pngs)
        assert "runs compared" in page and "runs/alpha" in page  # two runs named alpha: disambiguated
        # fleet: the env server's pool
        assert "sandbox fleet" in page and _card(page, "max running") == "3"
        assert _card(page, "queued") == "0"
        # A/B from the store
        assert "feedback and A/B" in page and 'class="decision' in page
        assert re.search(r"<td>B</td><td>6</td><td>6</td>", page)  # served 6, scored 6
        # the detail page of one run: report.md, evaluation table, throughput
        detail = httpx.get(base + "/run/0", timeout=60).text
        assert "report.md" in detail and "heldout_pass1_rl=0.4" in detail
        assert "<td>pass@1</td><td>0.2</td><td>0.4</td>" in detail
        assert "rollout and trainer throughput" in detail
        assert httpx.get(base + "/run/5").status_code == 404
        summary = httpx.get(base + "/api/summary").json()
        assert summary["runs"][0]["last"]["step"] == last["step"]
        assert summary["fleet"]["metrics"]["max_running"] == 3
        assert summary["feedback"]["report"]["arms"]["A"]["sessions"] == 6
        # a second sample of the pool draws the pool-over-time chart
        assert 'alt="pool over time"' in httpx.get(base + "/", timeout=60).text


def test_broken_inputs_are_messages_not_500s(grpo_run: Path, run_copy: Path, tmp_path: Path):
    text = (run_copy / "metrics.jsonl").read_text()
    (run_copy / "metrics.jsonl").write_text(text + "{not json}\n" + text.splitlines()[-1] + "\n")
    cfg = DashboardConfig(runs=(run_copy, tmp_path / "not-started"), store=tmp_path / "none.db",
                          env_server="http://127.0.0.1:9", refresh_s=0)
    client = TestClient(create_app(cfg))
    r = client.get("/")
    assert r.status_code == 200
    assert "metrics.jsonl line 4 is not valid JSON" in r.text
    assert "does not exist" in r.text  # the second run
    assert "is unreachable" in r.text and "no feedback store" in r.text
    assert "http-equiv" not in r.text  # refresh 0 = off
    assert _card(r.text, "step") == str(rows(grpo_run)[-1]["step"])  # good rows still shown


def test_wrong_env_token_is_explained(env_server: str, grpo_run: Path):
    cfg = DashboardConfig(runs=(grpo_run,), env_server=env_server, env_token="wrong")
    page = TestClient(create_app(cfg)).get("/").text
    assert "refused the bearer token" in page and "--env-token" in page


def test_token_guards_every_page_but_health(grpo_run: Path):
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run,), token="t0k")))
    assert client.get("/healthz").status_code == 200
    for path in ("/", "/run/0", "/api/summary"):
        assert client.get(path).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer t0k"}).status_code == 200
    # a browser: ?token= once sets a cookie, then plain requests (the meta refresh) pass
    assert client.get("/?token=t0k").status_code == 200
    assert client.get("/run/0").status_code == 200
