"""``looprl serve`` as a user runs it: a real process on a free port, driven over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from looprl.sandbox.server import free_port
from tests.example_package import write_example_package
from tests.feedback.test_cycle import save_tiny

SERVE = "from looprl.commands.serve import app; app()"


@pytest.mark.slow
def test_serve_command_runs_sessions(tmp_path):
    model = save_tiny(tmp_path / "m", max_positions=16384)  # bytes tokenizer: long prompts
    repo = write_example_package(tmp_path / "minicalc")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "--model", str(model), "--store", str(tmp_path / "fb.db"),
         "--port", str(port), "--token", "tk", "--max-turns", "1", "--max-new-tokens", "8",
         "--context-window", "16384", "--allowed-root", str(tmp_path), "--drain", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _up(url, proc, "/healthz")
        assert httpx.get(url + "/healthz").json()["arms"] == {"A": 0}
        r = httpx.post(url + "/v1/sessions", headers={"Authorization": "Bearer tk"}, timeout=120,
                       json={"user": "u", "prompt": "fix mean", "repo": str(repo)})
        if r.status_code == 503:
            pytest.skip(f"no sandbox here: {r.json()['message']}")
        assert r.status_code == 200, r.text
        assert r.json()["turns"] == 1 and r.json()["policy_version"] == 0
        r = httpx.post(url + "/v1/sessions", headers={"Authorization": "Bearer tk"}, timeout=30,
                       json={"user": "u", "prompt": "fix mean", "repo": "/etc"})
        assert r.status_code == 403 and "--allowed-root" in r.json()["message"]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stdout.read()  # drained, engine closed, exit 0
        assert time.monotonic() - t0 < 2 + 5, "SIGTERM: the server outlived its 2 s drain"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_serve_rejects_a_path_that_is_no_model(tmp_path):
    from typer.testing import CliRunner

    from looprl.commands.serve import app

    r = CliRunner().invoke(app, ["--model", str(tmp_path), "--store", str(tmp_path / "fb.db")])
    assert r.exit_code != 0 and "neither a model directory" in str(r.exception)


def _up(url: str, proc: subprocess.Popen, path: str, timeout_s: float = 180.0) -> None:
    """Wait for the server's ``path`` to answer 200 (start-up imports torch: slow on a busy
    machine); fail if it exits or does not answer in ``timeout_s``."""
    deadline = time.time() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + path).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.time() < deadline, f"{url} did not come up"
        time.sleep(0.2)


@pytest.mark.slow
def test_serve_runs_sessions_on_a_remote_openai_engine(tmp_path):
    """``looprl serve --engine openai`` over ``looprl model serve``, both real processes: the
    agent's turns are sampled by the model server, and when that server is gone a session is an
    infrastructure failure (503, stored as infra_error), never the model's fault."""
    model = save_tiny(tmp_path / "m", max_positions=16384)
    repo = write_example_package(tmp_path / "minicalc")
    mport, port = free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    model_server = subprocess.Popen(
        [sys.executable, "-c", "from looprl.cli import app; app()", "model", "serve", str(model),
         "--port", str(mport), "--api-key", "mk", "--drain", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    agent_server = subprocess.Popen(
        [sys.executable, "-c", SERVE, "--engine", "openai",
         "--engine-url", f"http://127.0.0.1:{mport}/v1", "--engine-api-key", "mk",
         "--tokenizer", str(model), "--store", str(tmp_path / "fb.db"), "--port", str(port),
         "--token", "tk", "--max-turns", "1", "--max-new-tokens", "8", "--context-window", "16384",
         "--allowed-root", str(tmp_path), "--drain", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer tk"}
    try:
        _up(f"http://127.0.0.1:{mport}", model_server, "/health")
        _up(url, agent_server, "/healthz")
        r = httpx.post(url + "/v1/sessions", headers=auth, timeout=120,
                       json={"user": "u", "prompt": "fix mean", "repo": str(repo)})
        if r.status_code == 503 and "sandbox" in r.json()["message"]:
            pytest.skip(f"no sandbox here: {r.json()['message']}")
        assert r.status_code == 200, r.text
        assert r.json()["turns"] == 1
        model_server.terminate()
        model_server.wait(timeout=30)
        r = httpx.post(url + "/v1/sessions", headers=auth, timeout=120,
                       json={"user": "u", "prompt": "fix mean", "repo": str(repo)})
        assert r.status_code == 503 and r.json()["infrastructure"] is True, r.text
        assert "unreachable" in r.json()["message"]
        stored = httpx.get(f"{url}/v1/sessions/{r.json()['session_id']}", headers=auth).json()
        assert stored["stop_reason"] == "infra_error"
    finally:
        for proc in (agent_server, model_server):
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=30)


def test_serve_engine_options_are_checked_before_anything_starts(tmp_path):
    from typer.testing import CliRunner

    from looprl.cli import app

    model = save_tiny(tmp_path / "m")
    runner = CliRunner()
    for args, says in [
            (["--engine", "openai", "--tokenizer", str(model)], "--engine-url"),
            (["--engine", "openai", "--engine-url", "http://127.0.0.1:9/v1"], "--tokenizer"),
            (["--engine", "torch"], "--model DIR"),
            (["--model", str(model), "-E", "no-equals"], "KEY=VALUE"),
            (["--model", str(model), "-E", "bogus_option=1"], "bogus_option")]:
        r = runner.invoke(app, ["serve", "--store", str(tmp_path / "fb.db"), *args])
        assert r.exit_code == 2 and says in r.output, (args, r.output)
