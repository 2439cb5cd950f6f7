"""The environment server against a hostile token holder or a careless client, over real HTTP:
paths outside the allowed roots (403), bodies before auth (401 with nothing read), oversized
bodies (413), bad fields (422), clients that go away (their lease is released), SIGTERM with
requests queued (drains, exits within the deadline)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from looprl.sandbox import RemoteSandbox, SandboxPool
from looprl.sandbox.server import EnvServer, EnvServerConfig, free_port
from looprl.sandbox.workspace import sandbox_root
from tests.http_abuse import (
    declared_but_unsent,
    memory_kb,
    start_process,
    stop_process,
    stream_until_refused,
)

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap
TOKEN = "abuse-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVE = "from looprl.commands.sandbox import app; app()"


def cfg(tmp_path: Path, **kw) -> EnvServerConfig:
    return EnvServerConfig(allowed_roots=(str(tmp_path / "roots"), sys.prefix), **kw)


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    """An allowed root holding one repo; the rest of tmp_path is outside it."""
    repo = tmp_path / "roots" / "repo"
    repo.mkdir(parents=True)
    (repo / "a.py").write_text("x = 1\n")
    return tmp_path / "roots"


@pytest.fixture()
def server(tmp_path: Path, roots: Path):
    with EnvServer(TOKEN, pool=SandboxPool(max_running=2),
                   cfg=cfg(tmp_path, max_body_bytes=1 << 20)) as srv:
        yield srv


def create(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/sandboxes", headers=AUTH, json=body, timeout=30)


def test_paths_outside_the_allowed_roots_are_403(server: EnvServer, roots: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (roots / "escape").symlink_to(outside)  # a symlink inside a root, pointing out of it
    fake = roots / "fakevenv"  # a venv whose pyvenv.cfg names a host directory as its interpreter
    (fake / "bin").mkdir(parents=True)
    (fake / "pyvenv.cfg").write_text(f"home = {outside}/bin\n")
    (outside / "bin").mkdir()
    cases = {
        "/etc": {"base_dir": "/etc"},
        "/root": {"base_dir": "/root"},
        "dotdot": {"base_dir": f"{roots}/repo/../../outside"},
        "symlink": {"base_dir": f"{roots}/escape"},
        "missing outside": {"base_dir": "/nonexistent/secret"},
        "sandbox dir": {"base_dir": str(sandbox_root())},
        "venv /usr": {"base_dir": f"{roots}/repo", "venv": "/usr"},
        "venv home": {"base_dir": f"{roots}/repo", "venv": str(fake)},
    }
    for name, body in cases.items():
        r = create(server.url, **body)
        assert r.status_code == 403, (name, r.status_code, r.text)
        assert "allowed roots" in r.json()["detail"] and "--allowed-root" in r.json()["detail"]
    assert server.pool.metrics().leases_total == 0  # nothing was mounted
    r = create(server.url, base_dir=f"{roots}/repo", venv=sys.prefix)  # inside: fine
    assert r.status_code == 200, r.text
    httpx.delete(f"{server.url}/v1/sandboxes/{r.json()['id']}", headers=AUTH)
    r = create(server.url, base_dir=f"{roots}/missing")
    assert r.status_code == 422 and "does not exist" in r.json()["detail"]


def test_auth_comes_before_the_body(server: EnvServer):
    # 150 MB declared, nothing sent: the 401 comes from the headers alone
    r = declared_but_unsent(server.url, "/v1/sandboxes", 150 << 20)
    assert r.status == 401 and "--token" in r.body["message"] and r.wait_s < 2
    r = declared_but_unsent(server.url, "/v1/sandboxes", 150 << 20,
                            {"Authorization": "Bearer wrong"})
    assert r.status == 401
    # authenticated but over the limit: 413 from Content-Length, nothing read
    r = declared_but_unsent(server.url, "/v1/sandboxes/x/write", 150 << 20, AUTH)
    assert r.status == 413 and "limit of 1048576 bytes" in r.body["message"]
    # a chunked body (no Content-Length) is cut off once past the limit
    r = stream_until_refused(server.url, "/v1/sandboxes/x/write", 64 << 20, AUTH, chunked=True)
    assert r.status == 413 and r.sent < 64 << 20  # cut off: loopback buffers hold a few MB
    assert httpx.get(f"{server.url}/v1/health").status_code == 200  # still serving


def test_bad_fields_are_4xx_naming_the_field(server: EnvServer, roots: Path):
    sid = create(server.url, base_dir=f"{roots}/repo").json()["id"]
    base = f"{server.url}/v1/sandboxes/{sid}"
    raw = {"Content-Type": "application/json", **AUTH}
    cases = [  # (route, raw JSON body, status, text the message must contain)
        ("/write", b'{"path": "a.py", "data_b64": "%%%not base64"}', 422, "data_b64"),
        ("/write", b'{"path": "a.py", "data_b64": "YQ"}', 422, "data_b64"),  # bad padding
        ("/exec", b'{"cmd": "true", "timeout_s": Infinity}', 422, "timeout_s"),
        ("/exec", b'{"cmd": "true", "timeout_s": NaN}', 422, "timeout_s"),
        ("/exec", b'{"cmd": "true", "timeout_s": -1}', 422, "timeout_s"),
        ("/exec", b'{"cmd": "true", "timeout_s": 0}', 422, "timeout_s"),
        ("/exec", b'{"cmd": "true", "timeout_s": 1e300}', 422, "lease timeout"),
        ("/exec", b'{"cmd": "true", "timeout_s": "soon"}', 422, "timeout_s"),
        ("/exec", b'{"cmd": 5}', 422, "cmd"),
        ("/exec", b'{"cmd": "echo \\ud800"}', 422, "invalid Unicode"),
        ("/exec", b'{"cmd": "true", "env": {"K": "\\udfff"}}', 422, "env.K"),
        ("/exec", b'{"cmd": "true", "shell": "zsh"}', 422, "shell"),
        ("/exec", b'{"cmd": "true"', 422, "JSON"),
        ("/exec", b'{"cmd": "\xff\xfe"}', 400, "pars"),
        ("/exec", b'[1, 2]', 422, "dict"),
        ("/walk", b'{"max_entries": 0}', 422, "max_entries"),
        ("/walk", b'{"max_entries": 1000000000000}', 422, "max_entries"),
        ("/read", b'{"path": "a.py\\u0000x"}', 422, "invalid path"),
    ]
    for route, body, status, text in cases:
        r = httpx.post(base + route, content=body, headers=raw)
        assert r.status_code == status, (route, body, r.status_code, r.text)
        assert text in r.text, (route, body, r.text)
    r = create(server.url, base_dir=f"{roots}/repo", timeout_s=-5)
    assert r.status_code == 422 and "timeout_s" in r.text
    r = httpx.post(f"{server.url}/v1/sandboxes", content=b'{"base_dir": "/x", "timeout_s": NaN}',
                   headers=raw)
    assert r.status_code == 422 and "timeout_s" in r.text
    assert httpx.post(base + "/exec", headers=AUTH, json={"cmd": "true"}).json()["exit_code"] == 0
    r = httpx.post(f"{server.url}/v1/sandboxes/nope/exec", headers=AUTH, json={"cmd": "true"})
    assert r.status_code == 404 and "no live sandbox lease" in r.text
    httpx.delete(base, headers=AUTH)


def test_a_lease_whose_client_went_away_is_released(tmp_path: Path, roots: Path):
    """max_running=2, idle timeout 1 s: one client leases and vanishes (no close, no heartbeat),
    another holds its lease through RemoteSandbox; a third gets the vanished one's slot within
    ~the idle timeout instead of the hour-long lease timeout. The live RemoteSandbox
    (heartbeating) keeps its lease through a pause of 2.5 idle timeouts."""
    with EnvServer(TOKEN, pool=SandboxPool(max_running=2),
                   cfg=cfg(tmp_path, idle_timeout_s=1.0)) as server:
        _released(server, roots)


def _released(server: EnvServer, roots: Path) -> None:
    async def go():
        live = await RemoteSandbox.create(server.url, TOKEN, f"{roots}/repo")
        dead = create(server.url, base_dir=f"{roots}/repo").json()["id"]  # then never heard from
        t0 = time.monotonic()
        r = await asyncio.to_thread(create, server.url, base_dir=f"{roots}/repo")  # queued
        waited = time.monotonic() - t0
        assert r.status_code == 200 and waited < 3.5, (r.text, waited)
        m = httpx.get(f"{server.url}/v1/metrics", headers=AUTH).json()
        assert (m["busy"], m["reaped_total"]) == (2, 1)
        gone = httpx.post(f"{server.url}/v1/sandboxes/{dead}/exec", headers=AUTH, json={"cmd": "true"})
        assert gone.status_code == 404 and "its client went away" in gone.text
        await asyncio.sleep(2.5)  # 2.5 idle timeouts: only the heartbeat keeps `live` leased
        assert (await live.exec("echo alive")).stdout == "alive\n"
        await live.close()
    run(go())


def test_a_client_that_gives_up_frees_its_place(server: EnvServer, roots: Path):
    """A queued create whose client times out never takes a slot; a command whose client
    disconnects is killed."""
    async def go():
        a = await RemoteSandbox.create(server.url, TOKEN, f"{roots}/repo")
        b = await RemoteSandbox.create(server.url, TOKEN, f"{roots}/repo")
        with pytest.raises(httpx.ReadTimeout):  # pool full: queued, then the client gives up
            httpx.post(f"{server.url}/v1/sandboxes", headers=AUTH, timeout=0.5,
                       json={"base_dir": f"{roots}/repo"})
        deadline = time.monotonic() + 5
        while httpx.get(f"{server.url}/v1/metrics", headers=AUTH).json()["queued"]:
            assert time.monotonic() < deadline, "the gone client's create is still queued"
            await asyncio.sleep(0.05)
        await b.close()  # a slot frees: nobody is waiting for it any more
        await asyncio.sleep(0.3)
        m = httpx.get(f"{server.url}/v1/metrics", headers=AUTH).json()
        assert (m["busy"], m["queued"], m["leases_total"]) == (1, 0, 2)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/sandboxes/{a.id}/exec", headers=AUTH, timeout=0.5,
                       json={"cmd": "sleep 2; echo late > late.txt"})
        await asyncio.sleep(2.5)  # it is killed as its client leaves, 0.5 s in
        try:  # killed when its client left
            late = await a.read("late.txt")
        except Exception as e:  # noqa: BLE001
            assert "not found" in str(e)
        else:
            pytest.fail(f"the command took its next step after its client left: late.txt={late!r}")
        await a.close()
    run(go())


def _serve(tmp_path: Path, port: int, *extra: str) -> subprocess.Popen:
    return start_process(SERVE, ["serve", "--port", str(port), "--token", TOKEN,
                                 "--allowed-root", str(tmp_path / "roots"), *extra],
                         f"http://127.0.0.1:{port}/v1/health")


def test_an_unauthenticated_150mb_body_costs_no_memory(tmp_path: Path, roots: Path):
    port = free_port()
    proc = _serve(tmp_path, port, "--max-body-mb", "4")
    url = f"http://127.0.0.1:{port}"
    try:
        httpx.get(f"{url}/v1/metrics", headers=AUTH)  # warm the routes
        before = memory_kb(proc.pid)
        r = stream_until_refused(url, "/v1/sandboxes", 150 << 20)
        assert r.status == 401
        r2 = stream_until_refused(url, "/v1/sandboxes", 150 << 20, AUTH)
        assert r2.status == 413
        r3 = stream_until_refused(url, "/v1/sandboxes", 150 << 20, AUTH, chunked=True)
        assert r3.status == 413
        after = memory_kb(proc.pid)
        grew_mb = (after["VmHWM"] - before["VmHWM"]) / 1024
        print(f"\nenv server peak RSS {before['VmHWM'] / 1024:.1f} -> {after['VmHWM'] / 1024:.1f} MiB "
              f"(+{grew_mb:.1f}) after 3 x 150 MB bodies; sent before refusal: {r.sent}, "
              f"{r2.sent}, {r3.sent} bytes")
        assert grew_mb < 16, f"peak memory grew {grew_mb:.1f} MiB"
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_sigterm_drains_and_exits_within_the_deadline(tmp_path: Path, roots: Path):
    """One slot, a 60 s command running in it and a create queued behind it: on SIGTERM the
    queued create gets 503 at once, the command is cut at the 2 s drain deadline, its sandbox is
    closed (the process is gone) and the server exits."""
    port = free_port()
    proc = _serve(tmp_path, port, "--max-running", "1", "--drain", "2")
    url = f"http://127.0.0.1:{port}"
    marker = "sleep 61.4242"

    async def go() -> tuple[float, float, httpx.Response | Exception, httpx.Response]:
        sid = create(url, base_dir=f"{roots}/repo").json()["id"]
        async with httpx.AsyncClient(headers=AUTH, timeout=30) as c:
            running = asyncio.ensure_future(c.post(f"{url}/v1/sandboxes/{sid}/exec",
                                                   json={"cmd": marker, "timeout_s": 90}))
            queued = asyncio.ensure_future(c.post(f"{url}/v1/sandboxes",
                                                  json={"base_dir": f"{roots}/repo"}))
            await asyncio.sleep(1.0)
            assert httpx.get(f"{url}/v1/metrics", headers=AUTH).json()["queued"] == 1
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            q = await queued
            t_queued = time.monotonic() - t0
            rc = await asyncio.to_thread(proc.wait, 30)
            t_exit = time.monotonic() - t0
            try:
                ran: httpx.Response | Exception = await running
            except httpx.HTTPError as e:
                ran = e
        assert rc is not None
        return t_queued, t_exit, ran, q

    try:
        t_queued, t_exit, ran, q = run(go())
    finally:
        stop_process(proc)
    print(f"\nSIGTERM: queued create answered {q.status_code} after {t_queued:.2f} s; "
          f"process exited (rc {proc.returncode}) after {t_exit:.2f} s; running exec: "
          f"{getattr(ran, 'status_code', type(ran).__name__)}")
    assert q.status_code == 503 and "shutting down" in q.text and t_queued < 1.0
    assert t_exit < 2 + 5, f"exit took {t_exit:.1f} s with a 2 s drain"
    assert proc.returncode in (0, -signal.SIGTERM)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps, "the command outlived the server"


def test_a_missing_allowed_root_is_refused(tmp_path: Path):
    """A typo in --allowed-root is an error, not a server that refuses every repo."""
    r = subprocess.run([sys.executable, "-c", SERVE, "serve", "--allowed-root",
                        str(tmp_path / "typo")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LOOPRL_SANDBOX_TOKEN": "x", "COLUMNS": "300"})
    assert r.returncode == 2 and "is not a directory" in r.stderr


@pytest.mark.slow
def test_no_generated_body_gets_a_5xx(tmp_path: Path, roots: Path):
    """~140 bodies built from hostile values on every route: each is a 2xx or a 4xx (a 503 would
    blame the infrastructure for a client's bad input)."""
    import random

    with EnvServer(TOKEN, pool=SandboxPool(max_running=2), cfg=cfg(tmp_path)) as server:
        _fuzz(server, roots, random.Random(0))


def _fuzz(server: EnvServer, roots: Path, rng) -> None:

    values = [None, True, 0, -1, 1e308, 10**30, "", "a", "\x00", "../x", "/etc", [], {}, [1],
              {"a": "b"}, {"a": 1}, "x" * 5000, 0.5, "echo hi"]
    fields = {"/exec": ["cmd", "timeout_s", "env"], "/read": ["path"],
              "/write": ["path", "data_b64"], "/walk": ["under", "max_entries"]}
    sid = create(server.url, base_dir=f"{roots}/repo").json()["id"]
    seen: dict[int, int] = {}
    for _ in range(80):
        route = rng.choice(list(fields))
        body = {f: rng.choice(values) for f in fields[route] if rng.random() < 0.8}
        r = httpx.post(f"{server.url}/v1/sandboxes/{sid}{route}", headers=AUTH, json=body,
                       timeout=60)
        assert r.status_code < 500, (route, body, r.status_code, r.text)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
    for field in ("base_dir", "venv", "snapshot_id", "timeout_s"):
        for v in values[:14]:
            body = {"base_dir": f"{roots}/repo", field: v}
            r = create(server.url, **body)
            assert r.status_code < 500, (body, r.status_code, r.text)
            if r.status_code == 200:
                httpx.delete(f"{server.url}/v1/sandboxes/{r.json()['id']}", headers=AUTH)
    assert seen.get(200) and seen.get(422), seen  # both kinds were exercised
