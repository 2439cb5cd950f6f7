"""The dashboard served by real uvicorn: training cards and charts from a real GRPOLoop run, the
fleet from a real env server, the A/B view from a real FeedbackStore; auth; broken inputs."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from looprl.dashboard.app import DashboardConfig, create_app
from looprl.dashboard.data import fmt
from looprl.sandbox.pool import SandboxPool
from looprl.sandbox.server import create_app as env_server_app

from .conftest import LOOP_CYCLES, SKIPPED_STEP, STEPS, rows, serve

ENV_TOKEN = "env-secret"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _card(page: str, label: str) -> str:
    m = re.search(rf'<div class="k">{re.escape(label)}</div><div class="v">([^<]*)</div>', page)
    assert m, f"no card {label!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def env_server():
    yield from serve(env_server_app(SandboxPool(max_running=3), ENV_TOKEN))


def _blocks(page: str) -> dict[str, dict]:
    out = {}
    for cid, body in re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page):
        out[cid] = json.loads(body)
    return out


def test_overview_over_http(grpo_run: Path, run_copy: Path, feedback_db: Path, env_server: str):
    cfg = DashboardConfig(runs=(grpo_run, run_copy), store=feedback_db, env_server=env_server,
                          env_token=ENV_TOKEN, refresh_s=7, min_sessions=3)
    a, b = f"{grpo_run.parent.name}-alpha", f"{run_copy.parent.name}-alpha"  # same name: told apart
    for base in serve(create_app(cfg)):
        r = httpx.get(base + "/", timeout=60)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        page = r.text
        assert 'data-refresh="7"' in page and '<script src="/static/dashboard.js">' in page
        # the runs list, with a form to compare them
        assert f'<a href="/runs/{a}">{a}</a>' in page and f'<a href="/runs/{b}">{b}</a>' in page
        assert '<form method="get" action="/compare">' in page
        # the main curves of both runs on shared axes
        curves = {d["title"]: d for d in _blocks(page).values()}
        assert [s["label"] for s in curves["mean reward"]["series"]] == [a, b]
        assert curves["loss"]["series"][0]["values"][SKIPPED_STEP - 1] is None
        # fleet: the env server's pool
        assert "sandbox fleet" in page and _card(page, "max running") == "3"
        assert _card(page, "queued") == "0"
        # A/B from the store
        assert "feedback and A/B" in page and 'class="decision' in page
        assert re.search(r"<td>B</td><td>6</td><td>6</td>", page)  # served 6, scored 6
        assert "small sample" in page
        summary = httpx.get(base + "/api/summary").json()
        assert summary["runs"][0]["last"]["step"] == rows(grpo_run)[-1]["step"]
        assert summary["runs"][0]["skipped_steps"] == [SKIPPED_STEP]
        assert summary["fleet"]["metrics"]["max_running"] == 3
        assert summary["feedback"]["report"]["arms"]["A"]["sessions"] == 6
        # a second sample of the pool draws the pool-over-time chart
        assert "sandbox pool over time" in httpx.get(base + "/", timeout=60).text
        assert httpx.get(base + "/static/uPlot.iife.min.js").text.startswith("/*! https://github.com/leeoniya/uPlot")
        assert httpx.get(base + "/static/style.css").status_code == 404  # inlined, not served


def test_run_page(grpo_run: Path):
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run,))))
    last = rows(grpo_run)[-1]
    page = client.get("/runs/alpha").text
    assert _card(page, "step") == str(last["step"])
    assert _card(page, "reward") == fmt(last["reward/total_mean"])
    titles = [d["title"] for d in _blocks(page).values()]
    assert "IS ratio trainer/engine" in titles and "throughput (tokens/s)" in titles
    # report.md rendered, its picture served from the run directory
    assert "<h1>looprl train — alpha</h1>" in page and "<strong>1</strong>" in page
    assert '<img alt="reward curve" src="/runs/alpha/files/reward_curve.png">' in page
    png = client.get("/runs/alpha/files/reward_curve.png")
    assert png.status_code == 200 and png.content.startswith(PNG_MAGIC)
    for bad in ("config.json", "..%2Fother.png", "nope.png", "metrics.jsonl"):
        assert client.get(f"/runs/alpha/files/{bad}").status_code == 404, bad
    # evaluation (linked to the task's trajectories), trajectory files, the resolved config
    assert "<td>pass@1</td><td>0.2</td><td>0.4</td>" in page
    assert 'href="/runs/alpha/trajectories/eval_rl?task=calc-1">0.4 (2/5)</a>' in page
    assert '<a href="/runs/alpha/trajectories/train">train</a> · 12 trajectories' in page
    assert "<td>loop.loggers</td><td>[&quot;tensorboard&quot;]</td>" in page
    assert client.get("/runs/beta").status_code == 404


def _ci(d: dict) -> str:
    return f"{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


def _cycle_rows(page: str) -> list[str]:
    table = re.search(r'<table class="cycles">(.*?)</table>', page)
    assert table, "no cycles table"
    return re.findall(r"<tr><td>(.*?)</tr>", table.group(1))


def test_loop_run_page(loop_run: Path):
    client = TestClient(create_app(DashboardConfig(runs=(loop_run,))))
    page = client.get("/runs/rt-test").text
    main = page.split("<main>")[1]
    assert "metrics.jsonl" not in main and 'class="problem"' not in main  # nothing is wrong
    assert "real-time RL loop — rt-test" in page
    cycles = [json.loads(line) for line in (loop_run / "cycles.jsonl").read_text().splitlines()]
    rows_ = _cycle_rows(page)
    assert len(rows_) == LOOP_CYCLES
    promoted, rolled, rejected = rows_
    assert '<span class="status promoted">promoted</span>' in promoted and "v0 → v1" in promoted
    assert '<span class="status rolled_back">rolled back</span>' in rolled and "(noise)" in rolled
    assert "reverts rose" in rolled  # the reason the loop gave
    assert '<span class="status rejected">rejected</span>' in rejected
    for row, c in zip(rows_, cycles, strict=True):
        if c["ab"]:  # A/B reward B − A with its interval, kept A → B
            assert f"<td>{_ci(c['ab']['diffs']['reward'])}</td>" in row
            arms = c["ab"]["arms"]
            assert f"<td>{arms['A']['kept']:.3f} → {arms['B']['kept']:.3f}</td>" in row
        g = c["gate"]
        assert f"{g['pass1_current']:.3f} → {g['pass1_candidate']:.3f}" in row
        assert f"diff CI [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] · 20 tasks" in row
    assert "<td>—</td><td>—</td></tr>" in rejected + "</tr>"  # the gate stopped it: no A/B
    # the final A/B: each arm's means, B − A with its interval for every metric
    final = json.loads((loop_run / "final_ab.json").read_text())
    table = re.search(r'<table class="final-ab">(.*?)</table>', page).group(1)
    assert re.search(r"<tr><td>B</td><td>v1</td><td>60</td><td>60</td>", table)
    diffs = final["diffs"]
    assert "".join(f"<td><strong>{_ci(diffs[m])}</strong></td>"
                   for m in ("reward", "resolved", "edited", "kept", "reverted", "dissatisfied", "latency")) in table
    # the result line's figures
    result = dict(kv.split("=") for kv in (loop_run / "result.txt").read_text().split())
    assert _card(page, "cycles") == str(LOOP_CYCLES) and _card(page, "sessions") == "300"
    assert _card(page, "kept B − A") == f"{float(result['kept_delta']):+.3f}"
    assert _card(page, "kept B − A 95% CI") == (f"[{float(result['kept_ci_low']):+.3f}, "
                                                 f"{float(result['kept_ci_high']):+.3f}]")
    assert _card(page, "rollback ok") == "yes"
    assert "B − A of the final A/B" in page
    assert "<h1>Real-time RL loop <code>rt-test</code></h1>" in page  # report.md still rendered
    assert client.get("/api/summary").json()["runs"][0]["loop"]["cycles"] == LOOP_CYCLES


def test_running_loop_page_and_overview(grpo_run: Path, loop_run: Path):
    lines = (loop_run / "cycles.jsonl").read_text().splitlines(keepends=True)
    (loop_run / "cycles.jsonl").write_text("".join(lines[:2]) + lines[2][:90])  # cycle 3 being written
    for f in ("result.txt", "final_ab.json", "report.md"):
        (loop_run / f).unlink()
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run, loop_run))))
    page = client.get("/runs/rt-test").text
    assert len(_cycle_rows(page)) == 2 and "running: cycle 3 is under way" in page
    assert "cycles.jsonl line 3 is incomplete" in page and "metrics.jsonl" not in page
    assert "final A/B" not in page and "kept B − A 95% CI" not in page
    overview = client.get("/").text
    assert '<span class="tag">real-time loop</span> 2 cycles · running' in overview
    assert "<td>finished</td>" in overview  # the GRPO run beside it (it has its report)
    (loop_run / "cycles.jsonl").write_text("".join(lines))
    (loop_run / "result.txt").write_text("cycles=3 sessions=300 kept_delta=0.2500 "
                                         "kept_ci_low=0.0667 kept_ci_high=0.4167 rollback_ok=1\n")
    overview = client.get("/").text
    assert ("<span class=\"tag\">real-time loop</span> 3 cycles · kept B − A "
            "+0.250 [+0.067, +0.417]") in overview


def test_trajectory_pages(grpo_run: Path):
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run,))))
    listing = client.get("/runs/alpha/trajectories/train").text
    assert "12 of 12 shown" in listing and listing.count('<span class="pass">pass</span>') == 4
    step2 = client.get(f"/runs/alpha/trajectories/train?step={SKIPPED_STEP}&passed=fail").text
    assert "4 of 12 shown" in step2
    assert "0 of 12" in client.get("/runs/alpha/trajectories/train?passed=pass&step=2").text
    assert client.get("/runs/alpha/trajectories/train?step=x").status_code == 422
    view = client.get("/runs/alpha/trajectories/train/5").text
    assert "train step <strong>2</strong>" in view and 'href="/runs/alpha/trajectories/train/4"' in view
    ev = client.get("/runs/alpha/trajectories/eval_rl/0").text
    assert "<strong>edit_file</strong>" in ev and "flags: <span" in ev
    assert client.get("/runs/alpha/trajectories/eval_rl/1").status_code == 404
    assert client.get("/runs/alpha/trajectories/secrets").status_code == 404


def test_compare_page(grpo_run: Path, run_copy: Path):
    lines = (run_copy / "metrics.jsonl").read_text().splitlines()[:2]  # a shorter run
    (run_copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cfg = json.loads((run_copy / "config.json").read_text())
    cfg["grpo"]["lr"] = 3e-4
    (run_copy / "config.json").write_text(json.dumps(cfg))
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run, run_copy))))
    a, b = f"{grpo_run.parent.name}-alpha", f"{run_copy.parent.name}-alpha"
    page = client.get(f"/compare?run={a}&run={b}").text
    charts = {d["title"]: d for d in _blocks(page).values()}
    reward = charts["mean reward"]
    assert reward["x"] == [float(s) for s in range(1, STEPS + 1)]
    assert reward["series"][1]["values"][STEPS - 1] is None  # the shorter run has no step 3
    assert f"<th>{a} · start</th><th>{a} · RL</th>" in page
    assert "config settings that differ (1 of" in page and "<td>grpo.lr</td>" in page
    assert client.get(f"/compare?run={a}").status_code == 400
    assert client.get(f"/compare?run={a}&run=zzz").status_code == 404


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
    assert 'data-refresh="0"' in r.text  # refresh 0 = off
    page = client.get("/runs/alpha").text
    assert "metrics.jsonl line 4 is not valid JSON" in page
    assert _card(page, "step") == str(rows(grpo_run)[-1]["step"])  # good rows still shown
    (run_copy / "trajectories" / "train.jsonl").write_text('{"task_id": 1}\n')
    listing = client.get("/runs/alpha/trajectories/train").text
    assert "train.jsonl line 1 is not a trajectory" in listing and "0 of 0 shown" in listing


def test_wrong_env_token_is_explained(env_server: str, grpo_run: Path):
    cfg = DashboardConfig(runs=(grpo_run,), env_server=env_server, env_token="wrong")
    page = TestClient(create_app(cfg)).get("/").text
    assert "refused the bearer token" in page and "--env-token" in page


def test_token_guards_every_page_but_health(grpo_run: Path):
    client = TestClient(create_app(DashboardConfig(runs=(grpo_run,), token="t0k")))
    assert client.get("/healthz").status_code == 200
    for path in ("/", "/runs/alpha", "/api/summary", "/static/dashboard.js"):
        assert client.get(path).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer t0k"}).status_code == 200
    # a browser: ?token= once sets a cookie, then plain requests (the meta refresh) pass
    assert client.get("/?token=t0k").status_code == 200
    assert client.get("/runs/alpha").status_code == 200


def test_auth_before_body_and_body_limits_over_http(grpo_run: Path):
    from tests.http_abuse import declared_but_unsent

    for base in serve(create_app(DashboardConfig(runs=(grpo_run,), token="t0k", refresh_s=0))):
        for path in ("/", "/api/summary", "/runs/alpha"):  # 150 MB declared, none sent: 401 at once
            r = declared_but_unsent(base, path, 150 << 20, method="GET")
            assert r.status == 401 and "?token=" in r.body["message"] and r.wait_s < 2
        r = declared_but_unsent(base, "/", 150 << 20, {"Authorization": "Bearer t0k"}, method="GET")
        assert r.status == 413
        assert httpx.get(base + "/healthz").status_code == 200
        assert httpx.get(base + "/runs/alpha/trajectories/train?page=-1",
                         headers={"Authorization": "Bearer t0k"}).status_code == 422
        assert httpx.get(base + "/", headers={"Authorization": "t0k"}).status_code == 401


def test_sigterm_stops_the_dashboard_process(tmp_path: Path):
    import signal
    import subprocess
    import time

    from looprl.sandbox.server import free_port
    from tests.http_abuse import start_process, stop_process

    port = free_port()
    (tmp_path / "run").mkdir()  # a run that has not written anything yet
    proc = start_process("from looprl.commands.dashboard import app; app()",
                         ["--run", str(tmp_path / "run"), "--port", str(port), "--drain", "2"],
                         f"http://127.0.0.1:{port}/healthz")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert time.monotonic() - t0 < 4 and proc.returncode in (0, -signal.SIGTERM)
    except subprocess.TimeoutExpired:
        raise AssertionError("the dashboard did not exit within 10 s of SIGTERM") from None
    finally:
        stop_process(proc)


def test_a_loop_runs_hinted_continuations_decode_with_its_start_models_tokenizer(loop_run: Path):
    """A real-time loop's config names its start policy as ``model`` (a path, not a section):
    the viewer of its ``hinted.jsonl`` decodes tokens with that model's tokenizer."""
    from looprl.models.tokenizer import build_tokenizer
    from tests.feedback.conftest import make_traj

    tok = build_tokenizer(None)
    tok.save_pretrained(loop_run.parent / "start")
    cfg = json.loads((loop_run / "config.json").read_text())
    (loop_run / "config.json").write_text(json.dumps({**cfg, "model": str(loop_run.parent / "start")}))
    (loop_run / "trajectories").mkdir(exist_ok=True)
    (loop_run / "trajectories" / "hinted.jsonl").write_text(make_traj().to_json() + "\n")
    r = TestClient(create_app(DashboardConfig(runs=(loop_run,)))).get(
        "/runs/rt-test/trajectories/hinted/0")
    assert r.status_code == 200, r.text[-500:]
    assert "no tokenizer found" not in r.text and "[5]" not in r.text
    assert html.escape(tok.decode([7])) in r.text
